"""DeepSeek-V3's block-scaled fp8 SwiGLU (silu(x @ w_gate.T) * (x @ w_up.T), x scaled per
1 x 128 group along K, the weights per 128 x 128 block) as a Gluon kernel that schedules
its own wgmma waits, against the generated `tl` kernel and cuBLASLt's block-wise
`scaled_mm` + an eager SwiGLU.

Why Gluon: a block-scaled K step's dot must be multiplied by that step's scales before it
joins the sum, and Triton 3.6 then keeps every dot synchronous (dot_waits.py): the tensor
cores wait on each step's scale multiply, and the generated kernel runs at 700 TFLOP/s
against cuBLASLt's 1,030 (fp8_block_scale_fma.py). DeepGEMM's schedule, written here:
  - persistent programs, one an SM, each taking [CONSUMERS x 64, BLOCK_N] output tiles
    in turn (grouped by GROUP_M row tiles, so that those running at once share weight
    columns in L2);
  - a one-warp producer streams x's [64, 128] tiles (one a consumer) and both weights'
    [BLOCK_N, 128] tiles through a ring of STAGES slots with TMA, across tile boundaries
    (the next tile's loads overlap this tile's epilogue);
  - consumer warpgroups take 64 rows each. A K step is asynchronous wgmma (gate and up)
    into fresh fp32 registers, then, once they are done, one multiply-add an element
    into the sums (x's row scale times the weight block's, a tile's columns sharing one
    weight block where BLOCK_N divides 128). The consumers drift apart, so one's scale
    multiply runs while another's dots use the tensor cores.
Variants (constexprs):
  A_REGS     x's tile read into registers once a step and fed to both dots as wgmma's
             register operand (shared memory reads x once, not twice); else both
             operands from shared memory
  JOINT      one dot a step against the gate's and the up's tiles as one operand of 2 x
             BLOCK_N rows (they lie one above the other in a slot): an m64n128 wgmma
             reads x's tile once where two m64n64 read it twice. Its product's halves
             are the gate's and the up's with no data moved (compiled: no layout
             conversion)
  STAGES     the ring's slots (32 KB each with two consumers at BLOCK_N 64): 4, or 3
  CONSUMERS  2, or 3 at 160 registers a thread (192-row tiles)
  BLOCK_N    64, or 128 with SERIAL (a consumer's gate dot retired before its up dot is
             issued: one product's registers). A 128-row tile reads 5.9 bytes of L2 a
             kFLOP at 128 columns, 7.8 at 64: at 1,500 TFLOP/s, 8.8 TB/s against 11.7
Not built: a consumer issuing the next step's dots before this step's multiply (two sets
of product registers, in turn). Compiled for sm_90 it spills (about 900 bytes) and ptxas
serializes every wgmma of the kernel (C7515: the next set's zeroed accumulator registers
are defined while the other set's wgmma is in flight). DeepGEMM leaves the overlap to
the other warpgroup too.
Each variant is checked against float64 on fresh random inputs (the output poisoned
first), then timed beside the generated kernel and cuBLASLt in alternating rounds (GPU
time of CUDA-graph replays).

    python3 benchmarks/experiments/fp8_block_gluon.py --built FOLDER [--rounds 5]
    python3 benchmarks/experiments/fp8_block_gluon.py --compile
        (no GPU: each variant compiled for sm_90; ptxas's registers and spills, shared
        memory, and the PTX's wgmma waits)

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
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gluon_pieces import compile_lines, descriptor  # noqa: E402

# A consumer's rows, x's K step (the scale group).
ROWS, BLOCK_K = 64, 128
M, K, N = 4096, 7168, 18432
# name -> the variant's BLOCK_N (a tile's output columns; both weights' tiles are BLOCK_N
# rows) and constexprs. At BLOCK_N 64 gate and up take 2 x 32 fp32 registers a thread
# for the sums and 2 x 32 for a step's products; at 128 (SERIAL) 2 x 64 and 64.
PLAIN = {"BLOCK_N": 64, "A_REGS": False, "JOINT": False, "SERIAL": False, "STAGES": 4}
TWO = {"CONSUMERS": 2, "REGISTERS": 232}
VARIANTS = {
    "smem": {**PLAIN, **TWO},
    "a-regs": {**PLAIN, **TWO, "A_REGS": True},
    "joint": {**PLAIN, **TWO, "JOINT": True},
    "joint a-regs": {**PLAIN, **TWO, "JOINT": True, "A_REGS": True},
    "joint s3": {**PLAIN, **TWO, "JOINT": True, "STAGES": 3},
    "joint c3": {**PLAIN, "JOINT": True, "CONSUMERS": 3, "REGISTERS": 160},
    # x from registers: from shared memory, a consumer spills in its loop (at 232
    # registers, or the first at 248 where the second takes 240).
    "wide a-regs": {**PLAIN, "BLOCK_N": 128, "SERIAL": True, "STAGES": 3, "A_REGS": True}
    | {"CONSUMERS": 2, "REGISTERS": 240},
}


# fmt: off
@gluon.jit
def _tile_place(tile, n_m, n_n, GROUP_M: gl.constexpr):
    """(row tile, column tile) of output tile `tile`: GROUP_M row tiles sweep the columns
    together."""
    in_group = GROUP_M * n_n
    first_m = tile // in_group * GROUP_M
    size_m = gl.minimum(n_m - first_m, GROUP_M)
    return first_m + tile % in_group % size_m, tile % in_group // size_m


@gluon.jit
def _produce(descs, bufs, bars, scales, M, N, K, GROUP_M: gl.constexpr,
             CONSUMERS: gl.constexpr, A_REGS: gl.constexpr, JOINT: gl.constexpr,
             SERIAL: gl.constexpr, PART: gl.constexpr,
             num_warps: gl.constexpr):
    """The producer warp: every tile's K steps into the ring, a slot once every consumer
    has released it (a fresh mbarrier counts as having completed the phase before 0)."""
    x_desc, wg_desc, wu_desc, o_desc = descs
    x_bufs, w_bufs, o_bufs = bufs
    ready, empty = bars
    R: gl.constexpr = x_desc.block_type.shape[0]
    BM: gl.constexpr = CONSUMERS * R
    BK: gl.constexpr = x_desc.block_type.shape[1]
    BN: gl.constexpr = wg_desc.block_type.shape[0]
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    nbytes: gl.constexpr = (CONSUMERS * x_desc.block_type.nbytes + wg_desc.block_type.nbytes
                            + wu_desc.block_type.nbytes)
    n_m = gl.cdiv(M, BM)
    n_n = gl.cdiv(N, BN)
    steps = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), n_m * n_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_place(tile, n_m, n_n, GROUP_M)
        for kk in range(steps):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), nbytes)
            for c in gl.static_range(CONSUMERS):  # a consumer's rows a tile
                tma.async_copy_global_to_shared(x_desc, [pid_m * BM + c * R, kk * BK],
                                                ready.index(s), x_bufs.index(s * CONSUMERS + c))
            w = w_bufs.index(s)
            tma.async_copy_global_to_shared(wg_desc, [pid_n * BN, kk * BK], ready.index(s),
                                            w.slice(0, BN))
            tma.async_copy_global_to_shared(wu_desc, [pid_n * BN, kk * BK], ready.index(s),
                                            w.slice(BN, BN))
            it += 1


@gluon.jit
def _operand(x_bufs, w_bufs, ready, it, zero, A_REGS: gl.constexpr, PART: gl.constexpr):
    """Once the ring's step `it` has landed: this consumer's 64 rows of x (shared memory,
    or A_REGS registers in wgmma's operand layout) and the slot's weights (the gate's
    BLOCK_N rows, then the up's). (x's fp8 registers cannot be a wait's dependency:
    Triton 3.6's lowering of the wait takes 16- and 32-bit values only. The PTX keeps
    them as virtual registers that nothing writes again, and ptxas holds a wgmma's
    register operands until its wait.)"""
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    CONSUMERS: gl.constexpr = x_bufs.type.shape[0] // STAGES
    s = it % STAGES
    mbarrier.wait(ready.index(s), (it // STAGES) & 1)
    a = x_bufs.index(s * CONSUMERS + PART)
    if A_REGS:
        layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=zero.type.layout,
                                                   k_width=4)
        a = a.load(layout)
    return a, w_bufs.index(s)


@gluon.jit
def _dot(a, w, first: gl.constexpr, rows: gl.constexpr, zero):
    """a @ w[first:first + rows].T as asynchronous wgmma into fresh registers: its token."""
    return warpgroup_mma(a, w.slice(first, rows).permute((1, 0)), zero, use_acc=False,
                         is_async=True)


@gluon.jit
def _issue(x_bufs, w_bufs, ready, it, zero, A_REGS: gl.constexpr, JOINT: gl.constexpr,
           PART: gl.constexpr):
    """Step `it`'s dots, both in flight: their tokens, (gate, up), or (JOINT) one dot
    against both tiles as one operand of twice the width, its columns the gate's then
    the up's."""
    a, w = _operand(x_bufs, w_bufs, ready, it, zero, A_REGS, PART)
    BN: gl.constexpr = w.type.shape[0] // 2
    if JOINT:
        dots = (_dot(a, w, 0, 2 * BN, zero),)
    else:
        dots = (_dot(a, w, 0, BN, zero), _dot(a, w, BN, BN, zero))
    return dots


@gluon.jit
def _retire(dots, acc_g, acc_u, sg, su, empty, it):
    """Step `it`'s dots waited for, its ring slot released, its products scaled into the
    sums (one FFMA an element). A joint dot's [64, 2 BLOCK_N] product is cut into the
    gate's and the up's halves (its column bit BLOCK_N is a register bit of wgmma's
    layout: no data moves)."""
    if len(dots) == 1:
        gate, up = _halves(warpgroup_mma_wait(0, deps=dots))
    else:
        gate, up = warpgroup_mma_wait(0, deps=dots)
    mbarrier.arrive(empty.index(it % empty.type.shape[0]))
    return acc_g + gate * sg[:, None], acc_u + up * su[:, None]


@gluon.jit
def _halves(both):
    """A [rows, 2 w] tensor's first w columns and its last w."""
    R: gl.constexpr = both.type.shape[0]
    W: gl.constexpr = both.type.shape[1] // 2
    return gl.split(gl.permute(gl.reshape(both, [R, 2, W]), (0, 2, 1)))


@gluon.jit
def _step_scales(xs_ptrs, row_ok, wg_s, wu_s, kk, steps, stride_xs_k, stride_wgs_k,
                 stride_wus_k):
    """Step kk's row factors of the gate's and the up's products (x's row scale times
    the weight block's); kk past the last step reads the last (a prefetch's)."""
    kk = gl.minimum(kk, steps - 1)
    xs = gl.load(xs_ptrs + kk * stride_xs_k, mask=row_ok, other=0.0)
    return xs * gl.load(wg_s + kk * stride_wgs_k), xs * gl.load(wu_s + kk * stride_wus_k)


@gluon.jit
def _tile_scales(tile, scales, M, N, K, row_layout: gl.constexpr, R: gl.constexpr,
                 BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
                 PART: gl.constexpr):
    """Output tile `tile`'s place (row tile, column tile), consumer PART's rows in M, the
    pointers to its scales and its first K step's row factors."""
    (xs_ptr, wgs_ptr, wus_ptr, stride_xs_m, stride_xs_k, stride_wgs_n, stride_wgs_k,
     stride_wus_n, stride_wus_k) = scales
    pid_m, pid_n = _tile_place(tile, gl.cdiv(M, BM), gl.cdiv(N, BN), GROUP_M)
    rows = pid_m * BM + PART * R + gl.arange(0, R, layout=row_layout)
    row_ok = rows < M
    xs_ptrs = xs_ptr + rows.to(gl.int64) * stride_xs_m
    block_n = pid_n * BN // 128  # the weights' scale block of the tile's columns
    wg_s = wgs_ptr + block_n * stride_wgs_n
    wu_s = wus_ptr + block_n * stride_wus_n
    sg, su = _step_scales(xs_ptrs, row_ok, wg_s, wu_s, 0, gl.cdiv(K, BK), stride_xs_k,
                          stride_wgs_k, stride_wus_k)
    return pid_m, pid_n, row_ok, xs_ptrs, wg_s, wu_s, sg, su


@gluon.jit
def _consume(descs, bufs, bars, scales, M, N, K, GROUP_M: gl.constexpr,
             CONSUMERS: gl.constexpr, A_REGS: gl.constexpr, JOINT: gl.constexpr,
             SERIAL: gl.constexpr, PART: gl.constexpr,
             num_warps: gl.constexpr):
    """Consumer PART: rows PART * 64 on of each tile, every K step, then its rows of the
    output through shared memory and a TMA store (rows and columns past the ends are
    clipped by the store; loads past them read zeros)."""
    x_desc, wg_desc, wu_desc, o_desc = descs
    x_bufs, w_bufs, o_bufs = bufs
    ready, empty = bars
    (xs_ptr, wgs_ptr, wus_ptr, stride_xs_m, stride_xs_k, stride_wgs_n, stride_wgs_k,
     stride_wus_n, stride_wus_k) = scales
    R: gl.constexpr = x_desc.block_type.shape[0]
    BM: gl.constexpr = CONSUMERS * R
    BK: gl.constexpr = x_desc.block_type.shape[1]
    BN: gl.constexpr = wg_desc.block_type.shape[0]
    W: gl.constexpr = 2 * BN if JOINT else BN  # a dot's width
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, W, 32])
    zero = gl.zeros([R, W], gl.float32, layout=acc_layout)
    if JOINT:
        zero_g, zero_u = _halves(zero)
    else:
        zero_g = zero
        zero_u = zero
    row_layout: gl.constexpr = gl.SliceLayout(1, zero_g.type.layout)
    n_m = gl.cdiv(M, BM)
    n_n = gl.cdiv(N, BN)
    steps = gl.cdiv(K, BK)
    o_buf = o_bufs.index(PART)
    it = 0
    # (A program's first tile exists: the grid is at most the tiles.)
    here = _tile_scales(gl.program_id(0), scales, M, N, K, row_layout, R, BM, BN, BK, GROUP_M,
                        PART)
    for tile in range(gl.program_id(0), n_m * n_n, gl.num_programs(0)):
        pid_m, pid_n, row_ok, xs_ptrs, wg_s, wu_s, sg, su = here
        acc_g = zero_g
        acc_u = zero_u
        for kk in range(steps):
            if SERIAL:  # one product's registers: the gate's dot retired before the up's
                a, w = _operand(x_bufs, w_bufs, ready, it, zero, A_REGS, PART)
                gate = _dot(a, w, 0, BN, zero)
                sg_n, su_n = _step_scales(xs_ptrs, row_ok, wg_s, wu_s, kk + 1, steps,
                                          stride_xs_k, stride_wgs_k, stride_wus_k)
                gate = warpgroup_mma_wait(0, deps=(gate,))
                acc_g = acc_g + gate * sg[:, None]
                up = warpgroup_mma_wait(0, deps=(_dot(a, w, BN, BN, zero),))
                mbarrier.arrive(empty.index(it % empty.type.shape[0]))
                acc_u = acc_u + up * su[:, None]
            else:
                dots = _issue(x_bufs, w_bufs, ready, it, zero, A_REGS, JOINT, PART)
                # The next step's scales load while this step's dots run.
                sg_n, su_n = _step_scales(xs_ptrs, row_ok, wg_s, wu_s, kk + 1, steps,
                                          stride_xs_k, stride_wgs_k, stride_wus_k)
                acc_g, acc_u = _retire(dots, acc_g, acc_u, sg, su, empty, it)
            sg, su = sg_n, su_n
            it += 1
        # The next tile's first scales load under this tile's epilogue (the last tile's
        # "next" is itself again).
        after = gl.minimum(tile + gl.num_programs(0), n_m * n_n - 1)
        here = _tile_scales(after, scales, M, N, K, row_layout, R, BM, BN, BK, GROUP_M, PART)
        out = acc_g / (1.0 + gl.exp2(-1.4426950408889634 * acc_g)) * acc_u  # silu(gate) * up
        tma.store_wait(pendings=0)  # the last tile's store has read o_buf
        o_buf.store(out.to(o_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [pid_m * BM + PART * R, pid_n * BN], o_buf)
    tma.store_wait(pendings=0)


@gluon.jit
def fp8_block_swiglu_kernel(x_desc, wg_desc, wu_desc, o_desc, xs_ptr, wgs_ptr, wus_ptr,
                            M, N, K, stride_xs_m, stride_xs_k, stride_wgs_n, stride_wgs_k,
                            stride_wus_n, stride_wus_k, GROUP_M: gl.constexpr,
                            CONSUMERS: gl.constexpr, STAGES: gl.constexpr, A_REGS: gl.constexpr,
                            JOINT: gl.constexpr, SERIAL: gl.constexpr, REGISTERS: gl.constexpr,
                            num_warps: gl.constexpr):
    """Persistent programs over the [M, N] output's CONSUMERS x 64 by BLOCK_N tiles (the
    module docstring's schedule). x [M, K] and the weights [N, K] fp8, their descriptors'
    tiles [64, 128] and [BLOCK_N, 128]; out [M, N] in tiles of [64, BLOCK_N]; x's scales [M,
    ceil(K / 128)], the weights' [ceil(N / 128), ceil(K / 128)] fp32, any strides.
    A tile's rows are CONSUMERS (2 or 3) consumers' 64 each. REGISTERS: the registers a thread of
    each consumer but the first (the producer's: 24)."""
    # Slot s's x tiles are CONSUMERS * s on, one a consumer.
    x_bufs = gl.allocate_shared_memory(x_desc.dtype,
                                       [STAGES * CONSUMERS] + x_desc.block_type.shape,
                                       x_desc.layout)
    # The gate's tile and the up's, one above the other in a slot.
    w_bufs = gl.allocate_shared_memory(wg_desc.dtype, [STAGES, 2 * wg_desc.block_type.shape[0],
                                                       wg_desc.block_type.shape[1]],
                                       wg_desc.layout)
    o_bufs = gl.allocate_shared_memory(o_desc.dtype, [CONSUMERS] + o_desc.block_type.shape,
                                       o_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONSUMERS)
    descs = (x_desc, wg_desc, wu_desc, o_desc)
    bufs = (x_bufs, w_bufs, o_bufs)
    bars = (ready, empty)
    scales = (xs_ptr, wgs_ptr, wus_ptr, stride_xs_m, stride_xs_k, stride_wgs_n, stride_wgs_k,
              stride_wus_n, stride_wus_k)
    # (Constexprs keep their kind only written out in each partition's tuple.)
    if CONSUMERS == 3:
        gl.warp_specialize([
            (_consume, (descs, bufs, bars, scales, M, N, K, GROUP_M, CONSUMERS, A_REGS,
                        JOINT, SERIAL, 0,
                        num_warps)),
            (_consume, (descs, bufs, bars, scales, M, N, K, GROUP_M, CONSUMERS, A_REGS,
                        JOINT, SERIAL, 1,
                        num_warps)),
            (_consume, (descs, bufs, bars, scales, M, N, K, GROUP_M, CONSUMERS, A_REGS,
                        JOINT, SERIAL, 2,
                        num_warps)),
            (_produce, (descs, bufs, bars, scales, M, N, K, GROUP_M, CONSUMERS, A_REGS,
                        JOINT, SERIAL, 0,
                        num_warps)),
        ], [num_warps, num_warps, 1], [REGISTERS, REGISTERS, 24])
    else:
        gl.warp_specialize([
            (_consume, (descs, bufs, bars, scales, M, N, K, GROUP_M, CONSUMERS, A_REGS,
                        JOINT, SERIAL, 0,
                        num_warps)),
            (_consume, (descs, bufs, bars, scales, M, N, K, GROUP_M, CONSUMERS, A_REGS,
                        JOINT, SERIAL, 1,
                        num_warps)),
            (_produce, (descs, bufs, bars, scales, M, N, K, GROUP_M, CONSUMERS, A_REGS,
                        JOINT, SERIAL, 0,
                        num_warps)),
        ], [num_warps, 1], [REGISTERS, 24])
# fmt: on


def descriptors(x8, wg8, wu8, out, block_n):
    """The kernel's four tile descriptors (contiguous row-major x, weights and out)."""
    return (
        descriptor(x8, [ROWS, BLOCK_K]),
        descriptor(wg8, [block_n, BLOCK_K]),
        descriptor(wu8, [block_n, BLOCK_K]),
        descriptor(out, [ROWS, block_n]),
    )


def fp8_block_swiglu(x8, xs, wg8, wgs, wu8, wus, out=None, variant="a-regs", sms=None):
    """silu(x @ w_gate.T) * (x @ w_up.T) in bf16, x and the weights dequantized by their
    block scales (fp8_block_inputs' layout), by the Gluon kernel."""
    m, k = x8.shape
    n = wg8.shape[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x8.device) if out is None else out
    sms = sms or torch.cuda.get_device_properties(x8.device).multi_processor_count
    meta = dict(VARIANTS[variant])
    block_n = meta.pop("BLOCK_N")
    tiles = triton.cdiv(m, meta["CONSUMERS"] * ROWS) * triton.cdiv(n, block_n)
    fp8_block_swiglu_kernel[(min(sms, tiles),)](
        *descriptors(x8, wg8, wu8, out, block_n),
        xs,
        wgs,
        wus,
        m,
        n,
        k,
        *xs.stride(),
        *wgs.stride(),
        *wus.stride(),
        GROUP_M=8,
        num_warps=4,
        **meta,
    )
    return out


def compile_report() -> None:
    """Each variant compiled for sm_90 (no GPU): ptxas's registers and spills, shared
    memory, its wgmma and their waits (every K step's dots waited for in full: pendings
    0) in the PTX, the SASS's most frequent instructions."""
    x8 = torch.empty(256, BLOCK_K * 2, dtype=torch.float8_e4m3fn)
    out = torch.empty(256, 256, dtype=torch.bfloat16)
    pointers = {n: "*fp32" for n in ("xs_ptr", "wgs_ptr", "wus_ptr")}
    probes = ["wgmma.mma_async", "wgmma.wait_group.sync.aligned 0;", "wait_group.sync.aligned"]
    for variant, meta in VARIANTS.items():
        meta = {"GROUP_M": 8, "num_warps": 4, **meta}
        descs = descriptors(x8, x8, x8, out, meta.pop("BLOCK_N"))
        settings = {variant: (meta, {"num_warps": 4}, probes)}
        for line in compile_lines(fp8_block_swiglu_kernel, descs, pointers, settings):
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
    from quantized_chains import (
        blockwise_swiglu,
        fp8_block_inputs,
        load,
        max_error,
        table,
        timed,
    )

    mod = load(args.built, "deepseek_mlp_fp8")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    errors, notes, variants = {}, [], {}
    # Correctness first, at odd shapes (ragged M, N and K, K's last group partial; TMA
    # wants rows of 16-byte multiples), each
    # variant's output poisoned before its launch, against float64.
    for m, k, n in ((300, 1008, 200), (128, 384, 192), (1, 256, 64)):
        torch.manual_seed(m + k + n)
        x8, xs, wg8, wu8, wgs, wus = fp8_block_inputs(m, -(-k // 128) * 128, n + 128)
        x8, wg8, wu8 = x8[:, :k].contiguous(), wg8[:n, :k].contiguous(), wu8[:n, :k].contiguous()
        wgs, wus = wgs[: -(-n // 128)], wus[: -(-n // 128)]
        want = mod.reference(
            x8, xs.double(), wg8, wgs.double(), wu8, wus.double(), out_dtype=torch.float64
        )
        for name in VARIANTS:
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            try:
                fp8_block_swiglu(x8, xs, wg8, wgs, wu8, wus, out=out, variant=name)
                torch.cuda.synchronize()
                errors[f"{name} {m}x{k}->{n}"] = max_error(out, want)
            except Exception as exc:  # noqa: BLE001 - a variant the GPU refuses is listed
                notes.append(f"{name} {m}x{k}->{n}: {type(exc).__name__}: {str(exc)[:200]}")
    torch.manual_seed(0)
    x8, xs, wg8, wu8, wgs, wus = fp8_block_inputs(M, K, N)
    rows = slice(0, 256)
    want = mod.reference(
        x8[rows], xs[rows].double(), wg8, wgs.double(), wu8, wus.double(), out_dtype=torch.float64
    )
    for name in VARIANTS:
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")

        def call(i, name=name, out=out):
            return fp8_block_swiglu(x8, xs, wg8, wgs, wu8, wus, out=out, variant=name)

        try:
            errors[f"fusegen gluon {name}"] = max_error(call(0)[rows], want)
            variants[f"fusegen gluon {name}"] = call
        except Exception as exc:  # noqa: BLE001 - a variant the GPU refuses is listed
            notes.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
    generated = mod.deepseek_mlp_fp8
    variants["fusegen generated"] = lambda i: generated(x8, xs, wg8, wgs, wu8, wus)
    errors["fusegen generated"] = max_error(variants["fusegen generated"](0)[rows], want)
    try:
        cublas = blockwise_swiglu(x8, xs, wg8, wgs, wu8, wus)
        errors["scaled_mm block-wise + eager"] = max_error(cublas(0)[rows], want)
        variants["scaled_mm block-wise + eager"] = cublas
    except Exception as exc:  # noqa: BLE001 - recorded: why the anchor does not run
        notes.append(f"block-wise scaled_mm: {type(exc).__name__}: {str(exc)[:300]}")
    facts = {"flop": 4 * M * K * N, "shape": f"{M}x{K}->{N}", "errors": errors, "notes": notes}
    print(table({"row": "fp8 block-scaled SwiGLU", **timed(variants, facts, args.rounds)}))


if __name__ == "__main__":
    main()
