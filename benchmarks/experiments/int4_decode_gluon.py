"""Decode's int4 SwiGLU (silu(x @ w_gate.T) * (x @ w_up.T), AWQ-style weights: two a byte,
the even K index in the low nibble, one bf16 scale and one uint8 zero point per 128
values along K) as a Gluon kernel whose loads a producer warp keeps in flight, against
the generated `tl` kernel and fusegen's bf16 chain.

Why: at 16 rows the generated kernel moves the weights at 1.43 TB/s (44.4 µs) and at one
row its GEMV at 2.19 TB/s (28.9 µs), where issue 31 asks for 3x fusegen's bf16 chain (58
and 55 µs: about 19 µs, 3.1 TB/s). Nsight Compute found the quantized decode kernels
latency-bound (few loads in flight, issue slots half idle). Here:
  - a program takes 64 rows of both weights (N) and its split of K; a one-warp producer
    streams each 128-value K step (one scale group) of both weights' packed tiles ([64,
    64] bytes) and x's [16, 128] tile through a ring of STAGES slots with TMA;
  - one consumer warpgroup reads a packed tile from shared memory in a layout whose
    bytes are, nibble for nibble, wgmma's register operand (a byte's two nibbles are the
    operand's K pair 2b, 2b + 1, and a thread holds the bytes its K pairs need), makes
    each nibble the float 128 + q by its bits (OR-ed into bf16's 128.0: no conversion
    instruction), and multiplies it by x's tile transposed (out.T = w @ x.T: the weights
    are wgmma's M of 64, x's rows its N of 16);
  - a third dot, of ones against x's tile, gives each row's sum of x over the group,
    and the group's sums are scale * (P - (128 + zero) * sum(x)): one FFMA or two an
    element of the [64, 16] sums, not a subtraction a weight;
  - the epilogue takes silu(gate) * up and stores out's [16, 64] columns; with SPLIT_K >
    1 each program adds its fp32 partial sums into zeroed fp32 buffers by atomics and
    the last to arrive finishes (an experiment's shortcut: the order of the adds varies).
  - "words" variants read the packed tile as 32-bit words instead (ldmatrix, not a
    one-byte load a byte): a thread's word for each 32 of K holds nibbles K 8t .. 8t + 7,
    and one shift and one LOP3 (& 0x000F000F | 0x43004300) make an operand register of
    nibbles j and j + 4. That pairs K values wgmma's order does not, so K is permuted
    within each 32 (a permutation of its index's bits) for the weights and, through a
    second shared buffer a step, for x: the dots' sums do not change. Compiled, the
    loop is 366 instructions a step against 515.
Variants: STAGES, SPLIT_K, registers (maxnreg: programs an SM), words. Each is checked against
float64 on fresh inputs (odd shapes first, one and 16 rows), then timed beside the
generated kernel and fusegen's bf16 chain in alternating rounds (GPU time of CUDA-graph
replays, each call on its own weight copy where they would otherwise sit in L2).

    python3 benchmarks/experiments/int4_decode_gluon.py --built FOLDER [--rows 16] [--rounds 5]
    python3 benchmarks/experiments/int4_decode_gluon.py --compile
        (no GPU: each variant compiled for sm_90; registers, spills, shared memory, the
        SASS's most frequent instructions, and whether the nibbles reach wgmma without a
        layout conversion through shared memory)

FOLDER: `fusegen build specs/quantized.yaml benchmarks/specs/anchors.yaml --out FOLDER`
(the generated kernel, its float64 reference, and the bf16 chain anchor_swiglu).
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
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# The words variant's pieces are the runtime's kernel's (fusegen/runtime/int4_hopper.py).
from fusegen.runtime.int4_hopper import (  # noqa: E402
    _permuted_x,
    _row_quant,
    _word_floats,
    _word_layout,
)
from gluon_pieces import (  # noqa: E402
    add_partials,
    arrive_last,
    compile_lines,
    descriptor,
    k_split,
    take_sums,
)

# Weight rows a program (wgmma's M), x's rows at most (its N), K a step (the group).
BLOCK_N, ROWS, GROUP = 64, 16, 128
K, N = 4096, 14336
# name: (STAGES, SPLIT_K, the kernel's registers a thread: ptxas's maxnreg, WORDS: 0 the
# bytes, 1 the words, 2 the words with the ones-dot's operand from shared memory, not 32
# registers a thread; AHEAD: the K steps ahead of its use a group's scales and zero points
# are loaded, where one step may be shorter than the loads' latency). Its 5 warps take 256
# threads' registers: 128 a thread fits two programs an SM, 80 three. A slot is 12 KB.
VARIANTS = {
    "s6": (6, 1, 128, False, 1),
    "s8": (8, 1, 128, False, 1),
    "s6 r80": (6, 1, 80, False, 1),
    "s6 split2": (6, 2, 128, False, 1),
    "s6 r80 split2": (6, 2, 80, False, 1),
    "words s6": (6, 1, 128, True, 1),
    "words s8": (8, 1, 128, True, 1),
    "words s6 r80": (6, 1, 80, True, 1),
    "words s6 split2": (6, 2, 128, True, 1),
    "words s6 ones-smem": (6, 1, 128, 2, 1),
    "words s6 ones-smem r96": (6, 1, 96, 2, 1),
    "words s6 ahead3": (6, 1, 128, True, 3),
    "words s6 ones-smem ahead3": (6, 1, 128, 2, 3),
    "words s6 ones-smem ahead3 r96": (6, 1, 96, 2, 3),
}


# fmt: off
@gluon.jit
def _produce(descs, bufs, bars, ptrs, M, N, K, WORDS: gl.constexpr, AHEAD: gl.constexpr,
             num_warps: gl.constexpr):
    """The producer warp: this program's K steps of both weights' packed tiles and x's
    tile into the ring, a slot once the consumer has released it (a fresh mbarrier counts
    as having completed the phase before 0)."""
    wg_desc, wu_desc, x_desc = descs
    wg_bufs, wu_bufs, x_bufs, xp_smem, _ = bufs
    ready, empty = bars
    BN: gl.constexpr = wg_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    nbytes: gl.constexpr = (wg_desc.block_type.nbytes + wu_desc.block_type.nbytes
                            + x_desc.block_type.nbytes)
    first, steps = k_split(K, BK)
    n0 = gl.program_id(0) * BN
    for i in range(steps):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), nbytes)
        k = (first + i) * BK
        tma.async_copy_global_to_shared(wg_desc, [n0, k // 2], ready.index(s), wg_bufs.index(s))
        tma.async_copy_global_to_shared(wu_desc, [n0, k // 2], ready.index(s), wu_bufs.index(s))
        tma.async_copy_global_to_shared(x_desc, [0, k], ready.index(s), x_bufs.index(s))


@gluon.jit
def _nibble_floats(packed, a_layout: gl.constexpr):
    """A [rows, K / 2] tile of bytes (byte b: K index 2b in its low nibble, 2b + 1 in its
    high) as [rows, K] bf16 128 + q in wgmma's register-operand layout: each nibble OR-ed
    into the bits of 128.0 (0x4300; bf16's 7 mantissa bits hold 0..15 exactly)."""
    R: gl.constexpr = packed.type.shape[0]
    KB: gl.constexpr = packed.type.shape[1]
    v = packed.to(gl.int16)
    lo = ((v & 15) | 0x4300).to(gl.bfloat16, bitcast=True)
    hi = ((v >> 4) | 0x4300).to(gl.bfloat16, bitcast=True)
    # A register permutation at most: the bytes' layout gives each thread the K pairs
    # wgmma's layout wants of it (checked by --compile: no shared memory round trip).
    return gl.convert_layout(gl.reshape(gl.join(lo, hi), [R, 2 * KB]), a_layout)


@gluon.jit
def _group_sums(p, ones_p, scale, zero, BASE: gl.constexpr):
    """A group's part of the sums: scale * (sum (BASE + q) x - (BASE + zero) sum x), per
    weight row (scale, zero: [rows] in the sums' row layout)."""
    return scale[:, None] * (p - (BASE + zero.to(gl.float32))[:, None] * ones_p)


@gluon.jit
def _consume(descs, bufs, bars, ptrs, M, N, K, WORDS: gl.constexpr, AHEAD: gl.constexpr,
             num_warps: gl.constexpr):
    """The consumer warpgroup: each step's packed tiles into registers as wgmma's
    operand, three dots (gate, up, ones) against x's tile transposed, the group's scales
    and zero points applied to the sums. Then the epilogue (the module docstring's)."""
    wg_desc, wu_desc, x_desc = descs
    wg_bufs, wu_bufs, x_bufs, xp_smem, ones_smem = bufs
    ready, empty = bars
    (sg_ptr, zg_ptr, su_ptr, zu_ptr, out_ptr, partials_ptr, arrivals_ptr, stride_s_n,
     stride_z_n, stride_out_m) = ptrs
    BN: gl.constexpr = wg_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    R: gl.constexpr = x_desc.block_type.shape[0]
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, R, 16])  # one warpgroup
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    # wgmma's register operand, [64, 128]: registers hold K 1, 8, 16, 32, 64 and row 8;
    # lanes K 2, 4 and rows 1, 2, 4; warps rows 16, 32. A byte holds K 2b and 2b + 1, so
    # the bytes' layout, [64, 64]: registers row 8 and bytes 4, 8, 16, 32; lanes bytes
    # 1, 2 and rows 1, 2, 4; warps rows 16, 32.
    byte_layout: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[8, 0], [0, 4], [0, 8], [0, 16], [0, 32]],
        lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[BN, BK // 2])
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    if WORDS == 2:  # filled once, by every thread, before the first dot reads it
        fill: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        ones_smem.store(gl.full([BN, BK], 1.0, gl.bfloat16, layout=fill))
        fence_async_shared()
        gl.thread_barrier()
        ones = ones_smem
    else:
        ones = gl.full([BN, BK], 1.0, gl.bfloat16, layout=a_layout)
    zero_acc = gl.zeros([BN, R], gl.float32, layout=acc_layout)
    first, steps = k_split(K, BK)
    n0 = gl.program_id(0) * BN
    rows = n0 + gl.arange(0, BN, layout=row_layout)  # weight rows: out's columns
    row_ok = rows < N
    where = (rows, rows, N, stride_s_n, stride_z_n)
    base_bits = 0x4300 * 0x00010001  # bf16's 128 in both halves: see _nibble_base
    # The runtime's words are q - zero: with 128 + 0 subtracted they are q, and the
    # ones-dot takes the zero points (the words variants as measured had no subtraction).
    word_rows: gl.constexpr = gl.SliceLayout(1, _word_layout(BN, BK // 8))
    no_zero = gl.full([BN], base_bits, gl.int32, layout=word_rows)
    acc_g = zero_acc
    acc_u = zero_acc
    last = first + steps - 1
    qg = _row_quant(sg_ptr, zg_ptr, where, first)
    qu = _row_quant(su_ptr, zu_ptr, where, first)
    if AHEAD == 3:  # the next two groups' too
        qg1 = _row_quant(sg_ptr, zg_ptr, where, gl.minimum(first + 1, last))
        qu1 = _row_quant(su_ptr, zu_ptr, where, gl.minimum(first + 1, last))
        qg2 = _row_quant(sg_ptr, zg_ptr, where, gl.minimum(first + 2, last))
        qu2 = _row_quant(su_ptr, zu_ptr, where, gl.minimum(first + 2, last))
    for i in range(steps):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        if WORDS:
            a_g = _word_floats(wg_bufs.index(s), base_bits, no_zero, a_layout, gl.bfloat16)
            a_u = _word_floats(wu_bufs.index(s), base_bits, no_zero, a_layout, gl.bfloat16)
            _permuted_x(x_bufs.index(s), xp_smem, 2)
            mbarrier.arrive(empty.index(s))  # the slot is in registers and xp_smem now
            xt = xp_smem.permute((1, 0))
        else:
            xt = x_bufs.index(s).permute((1, 0))
            a_g = _nibble_floats(wg_bufs.index(s).load(byte_layout), a_layout)
            a_u = _nibble_floats(wu_bufs.index(s).load(byte_layout), a_layout)
        p_g = warpgroup_mma(a_g, xt, zero_acc, use_acc=False, is_async=True)
        p_u = warpgroup_mma(a_u, xt, zero_acc, use_acc=False, is_async=True)
        p_1 = warpgroup_mma(ones, xt, zero_acc, use_acc=False, is_async=True)
        # Group i + AHEAD's scales and zero points load while the dots run.
        group = gl.minimum(first + i + AHEAD, last)
        qg_n = _row_quant(sg_ptr, zg_ptr, where, group)
        qu_n = _row_quant(su_ptr, zu_ptr, where, group)
        p_g, p_u, p_1, a_g, a_u = warpgroup_mma_wait(0, deps=(p_g, p_u, p_1, a_g, a_u))
        if not WORDS:
            mbarrier.arrive(empty.index(s))
        if WORDS:  # operands q
            acc_g += _group_sums(p_g, p_1, qg[0], qg[1], 0.0)
            acc_u += _group_sums(p_u, p_1, qu[0], qu[1], 0.0)
        else:  # operands 128 + q
            acc_g += _group_sums(p_g, p_1, qg[0], qg[1], 128.0)
            acc_u += _group_sums(p_u, p_1, qu[0], qu[1], 128.0)
        if AHEAD == 3:
            qg = qg1
            qu = qu1
            qg1 = qg2
            qu1 = qu2
            qg2 = qg_n
            qu2 = qu_n
        else:
            qg = qg_n
            qu = qu_n

    cols = gl.arange(0, R, layout=gl.SliceLayout(0, acc_layout))  # x's rows
    keep = row_ok[:, None] & (cols < M)[None, :]
    places = cols[None, :] * N + rows[:, None]  # fp32 partials [16, N]: out's places
    if gl.num_programs(1) > 1:
        add_partials(partials_ptr, places, acc_g, keep)
        add_partials(partials_ptr + R * N, places, acc_u, keep)
        keep = arrive_last(arrivals_ptr, keep)
        acc_g = take_sums(partials_ptr, places, keep)
        acc_u = take_sums(partials_ptr + R * N, places, keep)
    out = acc_g / (1.0 + gl.exp2(-1.4426950408889634 * acc_g)) * acc_u
    gl.store(out_ptr + cols[None, :] * stride_out_m + rows[:, None],
             out.to(out_ptr.dtype.element_ty), mask=keep)


@gluon.jit
def int4_swiglu_kernel(wg_desc, wu_desc, x_desc, sg_ptr, zg_ptr, su_ptr, zu_ptr, out_ptr,
                       partials_ptr, arrivals_ptr, M, N, K, stride_s_n, stride_z_n,
                       stride_out_m, STAGES: gl.constexpr, WORDS: gl.constexpr,
                       AHEAD: gl.constexpr, num_warps: gl.constexpr):
    """out [M, N] = silu(x @ w_gate.T) * (x @ w_up.T) for M <= 16, the weights packed
    [N, K / 2] (K a multiple of 128), their scales [N, K / 128] bf16 and zero points
    [N, K / 128] uint8 (both weights' with the same strides): a program's 64 weight rows
    over its split of K (grid: (ceil(N / 64), SPLIT_K)). partials [2, 16, N] fp32 zeros
    and arrivals [ceil(N / 64)] int32 zeros where SPLIT_K > 1 (left zeroed)."""
    wg_bufs = gl.allocate_shared_memory(wg_desc.dtype, [STAGES] + wg_desc.block_type.shape,
                                        wg_desc.layout)
    wu_bufs = gl.allocate_shared_memory(wu_desc.dtype, [STAGES] + wu_desc.block_type.shape,
                                        wu_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape,
                                       x_desc.layout)
    # WORDS: x's tile with K permuted as the weights' words give it (one a step).
    xp_smem = gl.allocate_shared_memory(x_desc.dtype, x_desc.block_type.shape, x_desc.layout)
    # WORDS == 2: the ones-dot's operand, [64, 128] bf16 (wgmma's A from shared memory).
    ones_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                     rank=2)
    ones_smem = gl.allocate_shared_memory(gl.bfloat16, [wg_desc.block_type.shape[0],
                                                        x_desc.block_type.shape[1]], ones_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    descs = (wg_desc, wu_desc, x_desc)
    bufs = (wg_bufs, wu_bufs, x_bufs, xp_smem, ones_smem)
    bars = (ready, empty)
    ptrs = (sg_ptr, zg_ptr, su_ptr, zu_ptr, out_ptr, partials_ptr, arrivals_ptr, stride_s_n,
            stride_z_n, stride_out_m)
    gl.warp_specialize([
        (_consume, (descs, bufs, bars, ptrs, M, N, K, WORDS, AHEAD, num_warps)),
        (_produce, (descs, bufs, bars, ptrs, M, N, K, WORDS, AHEAD, num_warps)),
    ], [1], [24])
# fmt: on


class Int4SwiGLU:
    """silu(x @ w_gate.T) * (x @ w_up.T) by the Gluon kernel at one variant, with its
    split-K scratch (zeroed once; the kernel leaves it zeroed)."""

    def __init__(self, variant: str, n: int, device="cuda"):
        self.stages, self.split_k, self.maxnreg, self.words, self.ahead = VARIANTS[variant]
        self.partials = torch.zeros(2, ROWS, n, dtype=torch.float32, device=device)
        self.arrivals = torch.zeros(triton.cdiv(n, BLOCK_N), dtype=torch.int32, device=device)

    def __call__(self, x, wg, sg, zg, wu, su, zu, out=None):
        m, k = x.shape
        n = wg.shape[0]
        if m > ROWS or k % GROUP:
            raise ValueError(f"x {tuple(x.shape)}: up to {ROWS} rows, K a multiple of {GROUP}")
        if sg.stride() != su.stride() or zg.stride() != zu.stride() or sg.stride(1) != 1:
            raise ValueError(
                "the gate's and the up's scales (and zero points) share strides, groups"
                " contiguous"
            )
        out = torch.empty(m, n, dtype=x.dtype, device=x.device) if out is None else out
        int4_swiglu_kernel[(triton.cdiv(n, BLOCK_N), self.split_k)](
            descriptor(wg, [BLOCK_N, GROUP // 2]),
            descriptor(wu, [BLOCK_N, GROUP // 2]),
            descriptor(x, [ROWS, GROUP]),
            sg,
            zg,
            su,
            zu,
            out,
            self.partials,
            self.arrivals,
            m,
            n,
            k,
            sg.stride(0),
            zg.stride(0),
            out.stride(0),
            STAGES=self.stages,
            WORDS=self.words,
            AHEAD=self.ahead,
            num_warps=4,
            maxnreg=self.maxnreg,
        )
        return out


def compile_report() -> None:
    """Each variant compiled for sm_90 (no GPU): ptxas's registers and spills, shared
    memory, the shared-memory stores in the PTX (a layout conversion of the nibbles
    through shared memory would add dozens; the kernel has three), the SASS's most
    frequent instructions."""
    w = torch.empty(256, 256, dtype=torch.uint8)
    x = torch.empty(16, 512, dtype=torch.bfloat16)
    descs = (
        descriptor(w, [BLOCK_N, GROUP // 2]),
        descriptor(w, [BLOCK_N, GROUP // 2]),
        descriptor(x, [ROWS, GROUP]),
    )
    pointers = {"sg_ptr": "*bf16", "su_ptr": "*bf16", "zg_ptr": "*u8", "zu_ptr": "*u8"}
    pointers |= {"out_ptr": "*bf16", "partials_ptr": "*fp32", "arrivals_ptr": "*i32"}
    settings = {
        name: (
            {"STAGES": stages, "WORDS": words, "AHEAD": ahead},
            {"num_warps": 4, "maxnreg": regs},
            ["st.shared"],
        )
        for name, (stages, _, regs, words, ahead) in VARIANTS.items()
    }
    for line in compile_lines(int4_swiglu_kernel, descs, pointers, settings):
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--built", type=Path)
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 1])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="sm_90 compiles, no GPU")
    args = parser.parse_args()
    if args.compile:
        compile_report()
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from quantized_chains import copies_for, int4_weights, load, max_error, table, timed

    mod = load(args.built, "llama_mlp_int4")
    bf16 = load(args.built, "anchor_swiglu")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)

    def dequant(q, scale, zero):
        s = scale.float().repeat_interleave(GROUP, 1)
        return ((q.float() - zero.float().repeat_interleave(GROUP, 1)) * s).bfloat16()

    # Correctness first at odd shapes (N not a multiple of 64, short K), the output
    # poisoned before each call, and a second call (the split-K scratch left zeroed).
    for m, k, n in ((1, 4096, 14336), (5, 384, 200), (16, 256, 64)):
        torch.manual_seed(m + k + n)
        qg, pg, sg, zg = int4_weights(n, k, GROUP)
        qu, pu, su, zu = int4_weights(n, k, GROUP)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = mod.reference(
            x.double(), pg, sg.double(), zg, pu, su.double(), zu, out_dtype=torch.float64
        )
        errors, notes = {}, []
        for name in VARIANTS:
            swiglu = Int4SwiGLU(name, n)
            try:
                for call in ("", " (2nd call)"):
                    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                    swiglu(x, pg, sg, zg, pu, su, zu, out=out)
                    torch.cuda.synchronize()
                    errors[f"{name}{call}"] = max_error(out, want)
            except Exception as exc:  # noqa: BLE001 - a variant the GPU refuses is listed
                notes.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
        print(f"{m}x{k}->{n} x2, max error vs float64 / max |out|:", flush=True)
        for name, error in errors.items():
            print(f"  {name}: {error:.2e}")
        for note in notes:
            print(f"  note: {note}")

    group_bytes = 2 * (N * K // 2 + N * (K // GROUP) * 3)  # packed weights, scales, zeros
    copies = copies_for(group_bytes)
    sets = []
    for _ in range(copies):
        sets.append((*int4_weights(N, K, GROUP), *int4_weights(N, K, GROUP)))
    bf16_copies = copies_for(2 * N * K * 2)
    dense = [
        (dequant(s[0], s[2], s[3]), dequant(s[4], s[6], s[7]))
        for s in (sets * bf16_copies)[:bf16_copies]
    ]
    for m in args.rows:
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        s = sets[0]
        want = mod.reference(
            x.double(), s[1], s[2].double(), s[3], s[5], s[6].double(), s[7],
            out_dtype=torch.float64,
        )  # fmt: skip
        errors, notes, variants = {}, [], {}
        for name in VARIANTS:
            swiglu = Int4SwiGLU(name, N)
            out = torch.full((m, N), float("nan"), dtype=torch.bfloat16, device="cuda")

            def call(i, swiglu=swiglu, out=out, x=x):
                _, pg, sg, zg, _, pu, su, zu = sets[i % copies]
                return swiglu(x, pg, sg, zg, pu, su, zu, out=out)

            try:
                errors[f"fusegen gluon {name}"] = max_error(call(0), want)
                variants[f"fusegen gluon {name}"] = call
            except Exception as exc:  # noqa: BLE001 - a variant the GPU refuses is listed
                notes.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")

        def generated(i, x=x):
            _, pg, sg, zg, _, pu, su, zu = sets[i % copies]
            return mod.llama_mlp_int4(x, pg, sg, zg, pu, su, zu)

        variants["fusegen generated"] = generated
        errors["fusegen generated"] = max_error(generated(0), want)
        variants["bf16 chain"] = lambda i, x=x: bf16.anchor_swiglu(x, *dense[i % bf16_copies])
        nbytes = {v: group_bytes for v in variants} | {"bf16 chain": 4 * N * K}
        facts = {"shape": f"{m}x{K}->{N} x2", "bytes": nbytes, "errors": errors, "notes": notes}
        print(table({"row": f"int4 SwiGLU, {m} rows", **timed(variants, facts, args.rounds)}))


if __name__ == "__main__":
    main()
