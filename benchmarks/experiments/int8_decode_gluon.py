"""Decode's weight-only int8 linear (x @ w.T * scale + b: x [16, 4096] bf16, w [14336,
4096] int8, one scale per output channel) as a Gluon kernel whose loads a producer warp
keeps in flight, against the generated `tl` kernel and bf16 `F.linear`.

Why: the generated kernel moves the weights at 2.76 TB/s (21.3 µs; issue 31 asks for
1.8x bf16's 31-33 µs, about 17.5), and Nsight Compute found the quantized decode kernels
latency-bound (issue slots half idle, occupancy 11-19%: few loads in flight), not bound
by bandwidth or by the conversion. Here the bytes in flight do not depend on the
consumers' registers:
  - a program takes BLOCK_N = 64 weight rows and its K range (SPLIT_K programs a
    tile: 0 < split < SPLIT_K);
  - a one-warp producer streams the weights' [64, BLOCK_K] int8 tiles and x's [16,
    BLOCK_K] bf16 tiles through a ring of STAGES slots with TMA;
  - one consumer warpgroup reads a weight tile from shared memory in wgmma's
    register-operand layout, converts it to bf16 in registers, and multiplies it by x's
    tile transposed (out.T = w @ x.T: the weights are wgmma's M of 64, x's 16 rows its
    N). A step's wgmma is waited for within the step: one kept in flight across the
    loop's back edge makes ptxas serialize them (C7515), and the producer, not the
    consumer, keeps the bytes in flight;
  - the epilogue scales each weight row, adds the bias and stores out's [16, 64]
    columns; with SPLIT_K > 1 each program adds its fp32 partial sums into a zeroed
    fp32 buffer by atomics and the last to arrive writes the output (an experiment's
    shortcut: the order of the adds varies).
Variants: BLOCK_K (128, 256), STAGES (4, 6), SPLIT_K (1, 2), registers (two or three
programs an SM; shared memory: 24 or 40 KB a slot). Each is checked against
float64 on fresh inputs (odd shapes first), then timed beside the generated kernel and
bf16 `F.linear` in alternating rounds (GPU time of CUDA-graph replays, each call on its
own weight copy where they would otherwise sit in L2).

    python3 benchmarks/experiments/int8_decode_gluon.py --built FOLDER [--rounds 5]
    python3 benchmarks/experiments/int8_decode_gluon.py --compile
        (no GPU: each variant compiled for sm_90; registers, spills, shared memory)

FOLDER: `fusegen build specs/quantized.yaml --out FOLDER` (the generated kernel and its
float64 reference).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gluon_pieces import (  # noqa: E402
    add_partials,
    arrive_last,
    compile_lines,
    descriptor,
    k_split,
    take_sums,
)

# Weight rows a program (wgmma's M), x's rows at most (its N).
BLOCK_N, ROWS = 64, 16
M, K, N = 16, 4096, 14336
# name: (BLOCK_K, STAGES, SPLIT_K, the kernel's registers a thread: ptxas's maxnreg). Its
# 5 warps take 256 threads' registers: 128 a thread fits two programs an SM, 80 three.
VARIANTS = {
    "k256 s4": (256, 4, 1, 128),
    "k128 s6": (128, 6, 1, 128),
    "k128 s4 r80": (128, 4, 1, 80),
    "k256 s4 split2": (256, 4, 2, 128),
    "k128 s4 r80 split2": (128, 4, 2, 80),
}


# fmt: off
@gluon.jit
def _produce(descs, bufs, bars, ptrs, M, N, K, num_warps: gl.constexpr):
    """The producer warp: this program's K steps of the weights' and x's tiles into the
    ring, a slot once the consumer has released it (a fresh mbarrier counts as having
    completed the phase before 0)."""
    w_desc, x_desc = descs
    w_bufs, x_bufs = bufs
    ready, empty = bars
    BN: gl.constexpr = w_desc.block_type.shape[0]
    BK: gl.constexpr = w_desc.block_type.shape[1]
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    nbytes: gl.constexpr = w_desc.block_type.nbytes + x_desc.block_type.nbytes
    first, steps = k_split(K, BK)
    n0 = gl.program_id(0) * BN
    for i in range(steps):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), nbytes)
        k = (first + i) * BK
        tma.async_copy_global_to_shared(w_desc, [n0, k], ready.index(s), w_bufs.index(s))
        tma.async_copy_global_to_shared(x_desc, [0, k], ready.index(s), x_bufs.index(s))


@gluon.jit
def _consume(descs, bufs, bars, ptrs, M, N, K, num_warps: gl.constexpr):
    """The consumer warpgroup: each step's weight tile into registers (wgmma's A
    layout), to bf16, times x's tile transposed. Then the epilogue (the module
    docstring's)."""
    w_desc, x_desc = descs
    w_bufs, x_bufs = bufs
    ready, empty = bars
    scale_ptr, b_ptr, out_ptr, partials_ptr, arrivals_ptr, stride_out_m = ptrs
    BN: gl.constexpr = w_desc.block_type.shape[0]
    BK: gl.constexpr = w_desc.block_type.shape[1]
    R: gl.constexpr = x_desc.block_type.shape[0]
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, R, 16])  # one warpgroup
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    first, steps = k_split(K, BK)
    acc = gl.zeros([BN, R], gl.float32, layout=acc_layout)
    for i in range(steps):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        a = w_bufs.index(s).load(a_layout).to(gl.bfloat16)
        acc = warpgroup_mma(a, x_bufs.index(s).permute((1, 0)), acc, is_async=True)
        acc, a = warpgroup_mma_wait(0, deps=(acc, a))
        mbarrier.arrive(empty.index(s))

    n0 = gl.program_id(0) * BN
    cols = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_layout))  # out's columns
    rows = gl.arange(0, R, layout=gl.SliceLayout(0, acc_layout))  # x's rows
    keep = (cols < N)[:, None] & (rows < M)[None, :]
    places = rows[None, :] * N + cols[:, None]  # [N-major] fp32 partials: out.T's places
    if gl.num_programs(1) > 1:
        add_partials(partials_ptr, places, acc, keep)
        keep = arrive_last(arrivals_ptr, keep)
        acc = take_sums(partials_ptr, places, keep)
    scale = gl.load(scale_ptr + cols, mask=cols < N, other=0.0)
    bias = gl.load(b_ptr + cols, mask=cols < N, other=0.0).to(gl.float32)
    out = acc * scale[:, None] + bias[:, None]
    gl.store(out_ptr + rows[None, :] * stride_out_m + cols[:, None],
             out.to(out_ptr.dtype.element_ty), mask=keep)


@gluon.jit
def int8_linear_kernel(w_desc, x_desc, scale_ptr, b_ptr, out_ptr, partials_ptr,
                       arrivals_ptr, M, N, K, stride_out_m, STAGES: gl.constexpr,
                       num_warps: gl.constexpr):
    """out [M, N] = x @ w.T * scale + b for M <= 16: a program's 64 weight rows over its
    split of K (grid: (ceil(N / 64), SPLIT_K)). partials [M, N] fp32 zeros and arrivals
    [ceil(N / 64)] int32 zeros where SPLIT_K > 1 (left zeroed)."""
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape,
                                       w_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape,
                                       x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    descs = (w_desc, x_desc)
    bufs = (w_bufs, x_bufs)
    bars = (ready, empty)
    ptrs = (scale_ptr, b_ptr, out_ptr, partials_ptr, arrivals_ptr, stride_out_m)
    gl.warp_specialize([
        (_consume, (descs, bufs, bars, ptrs, M, N, K, num_warps)),
        (_produce, (descs, bufs, bars, ptrs, M, N, K, num_warps)),
    ], [1], [24])
# fmt: on


class Int8Linear:
    """x @ w.T * scale + b by the Gluon kernel at one variant, with its split-K scratch
    (zeroed once; the kernel leaves it zeroed)."""

    def __init__(self, variant: str, n: int, device="cuda"):
        self.block_k, self.stages, self.split_k, self.maxnreg = VARIANTS[variant]
        self.partials = torch.zeros(ROWS, n, dtype=torch.float32, device=device)
        self.arrivals = torch.zeros(triton.cdiv(n, BLOCK_N), dtype=torch.int32, device=device)

    def __call__(self, x, w, scale, b, out=None):
        m, _ = x.shape
        n, k = w.shape
        if m > ROWS:
            raise ValueError(f"{m} rows: the kernel takes up to {ROWS}")
        out = torch.empty(m, n, dtype=x.dtype, device=x.device) if out is None else out
        int8_linear_kernel[(triton.cdiv(n, BLOCK_N), self.split_k)](
            descriptor(w, [BLOCK_N, self.block_k]),
            descriptor(x, [ROWS, self.block_k]),
            scale,
            b,
            out,
            self.partials,
            self.arrivals,
            m,
            n,
            k,
            out.stride(0),
            STAGES=self.stages,
            num_warps=4,
            maxnreg=self.maxnreg,
        )
        return out


def compile_report() -> None:
    """Each variant compiled for sm_90 (no GPU): ptxas's registers and spills, shared
    memory, the SASS's most frequent instructions."""
    w = torch.empty(256, 512, dtype=torch.int8)
    x = torch.empty(16, 512, dtype=torch.bfloat16)
    pointers = {"scale_ptr": "*fp32", "b_ptr": "*bf16", "out_ptr": "*bf16"}
    pointers |= {"partials_ptr": "*fp32", "arrivals_ptr": "*i32"}
    for variant, (block_k, stages, _, maxnreg) in VARIANTS.items():
        descs = (descriptor(w, [BLOCK_N, block_k]), descriptor(x, [ROWS, block_k]))
        settings = {variant: ({"STAGES": stages}, {"num_warps": 4, "maxnreg": maxnreg}, ())}
        for line in compile_lines(int8_linear_kernel, descs, pointers, settings):
            print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--built", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="sm_90 compiles, no GPU")
    args = parser.parse_args()
    if args.compile:
        compile_report()
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from quantized_chains import copies_for, load, max_error, table, timed

    mod = load(args.built, "linear_int8")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    errors, notes, variants = {}, [], {}
    # Correctness first at odd shapes (rows 1 and 5, N not a multiple of 64, K not of the
    # K step; TMA wants rows of 16-byte multiples), the output poisoned before each call.
    for m, k, n in ((1, 4096, 14336), (5, 1040, 200), (16, 512, 64)):
        torch.manual_seed(m + k + n)
        w = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8)
        scale = (torch.rand(n, device="cuda") + 0.5) / (74 * k**0.5)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = mod.reference(x.double(), w, scale.double(), b.double(), out_dtype=torch.float64)
        for name in VARIANTS:
            linear = Int8Linear(name, n)
            try:
                for call in ("", " (2nd call)"):  # the second: the split-K scratch left zeroed
                    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                    linear(x, w, scale, b, out=out)
                    torch.cuda.synchronize()
                    errors[f"{name} {m}x{k}->{n}{call}"] = max_error(out, want)
            except Exception as exc:  # noqa: BLE001 - a variant the GPU refuses is listed
                notes.append(f"{name} {m}x{k}->{n}: {type(exc).__name__}: {str(exc)[:200]}")
    torch.manual_seed(0)
    copies = copies_for(N * K)
    ws = [torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8) for _ in range(copies)]
    scale = (torch.rand(N, device="cuda") + 0.5) / (74 * K**0.5)
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    want = mod.reference(x.double(), ws[0], scale.double(), b.double(), out_dtype=torch.float64)
    for name in VARIANTS:
        linear = Int8Linear(name, N)
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")

        def call(i, linear=linear, out=out):
            return linear(x, ws[i % copies], scale, b, out=out)

        try:
            errors[f"fusegen gluon {name}"] = max_error(call(0), want)
            call(1)  # again: the split-K scratch is zeroed by the call before
            errors[f"fusegen gluon {name} (2nd call)"] = max_error(call(2), want)
            variants[f"fusegen gluon {name}"] = call
        except Exception as exc:  # noqa: BLE001 - a variant the GPU refuses is listed
            notes.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
    variants["fusegen generated"] = lambda i: mod.linear_int8(x, ws[i % copies], scale, b)
    errors["fusegen generated"] = max_error(variants["fusegen generated"](0), want)
    bf16_copies = copies_for(2 * N * K)
    dense = [(w.float() * scale[:, None]).bfloat16() for w in (ws * bf16_copies)[:bf16_copies]]
    variants["bf16 F.linear"] = lambda i: torch.nn.functional.linear(x, dense[i % bf16_copies], b)
    nbytes = {v: N * K for v in variants} | {"bf16 F.linear": 2 * N * K}
    facts = {"shape": f"{M}x{K}->{N}", "bytes": nbytes, "errors": errors, "notes": notes}
    print(table({"row": "int8 per channel, x@w.T+b", **timed(variants, facts, args.rounds)}))


if __name__ == "__main__":
    main()
