"""The block-scaled fp8 SwiGLU on Hopper (compute capability 9.0), written in Gluon:
silu(x @ w_gate.T) * (x @ w_up.T), x fp8 e4m3 scaled per 1 x 128 group along K, the
weights fp8 e4m3 per 128 x 128 block (DeepSeek-V3's recipe).

Why Gluon: each K step's dot must be multiplied by that step's scales before it joins the
sum, and Triton 3.6 then keeps every `tl` dot synchronous: the tensor cores wait on each
step's multiply. The generated `tl` kernel ran 3.16 ms at 4096 x 7168 -> 18432 on an H200
against cuBLASLt's block-wise scaled_mm + an eager SwiGLU at 2.13; this kernel 2.13
(benchmarks/experiments/fp8_block_gluon.py, its "wide a-regs" variant). DeepGEMM's
schedule:
  - persistent programs, one an SM, each taking [128, 128] output tiles in turn (grouped
    by GROUP_M row tiles, so that those running at once share weight columns in L2);
  - a one-warp producer streams x's [64, 128] tiles (one a consumer) and both weights'
    [128, 128] tiles through a ring of STAGES slots with TMA, across tile boundaries (the
    next tile's loads overlap this tile's epilogue);
  - two consumer warpgroups take 64 rows each. A K step reads x's tile into registers
    once (wgmma's register operand), issues the gate's dot, waits for it and multiplies
    it into the gate's sums by the step's scales (x's row scale times the weight block's:
    a tile's 128 columns share one block), then the up's likewise. The consumers drift
    apart, so one's multiply runs while the other's dots use the tensor cores.

What it takes (QuantChain.hopper_fits checks): a module whose chain is this one (its
HOPPER = "swiglu"), x [M, K] and the weights [N, K] row-major, contiguous and 16-byte
aligned (K a multiple of 16), out [M, N] bf16 or fp16, contiguous (N a multiple of 8),
fp32 scales of any strides. K need not be a multiple of 128: TMA reads zeros past the
end. Without Gluon (an older Triton) AVAILABLE is False and the `tl` kernel runs.
"""

import torch
import triton

from . import launch
from .gluon_hopper import AVAILABLE

if AVAILABLE:  # else (a Triton without Gluon) the `tl` kernel runs
    from .gluon_hopper import (
        TensorDescriptor,
        fence_async_shared,
        gl,
        gluon,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

# A consumer's rows, the output tile's columns (one weight scale block), x's K step (one
# scale group), the ring's slots (48 KB each), the row tiles that sweep the columns
# together, a consumer's registers a thread (the producer's: 24).
ROWS, BLOCK_N, BLOCK_K, STAGES, GROUP_M, REGISTERS = 64, 128, 128, 3, 8, 240
CONSUMERS = 2
# What `fusegen inspect` and last_launch show as the kernel's config.
CONFIG = {
    "BLOCK_M": CONSUMERS * ROWS,
    "BLOCK_N": BLOCK_N,
    "BLOCK_K": BLOCK_K,
    "GROUP_M": GROUP_M,
    "num_warps": 4 * CONSUMERS + 1,
    "num_stages": STAGES,
}

if AVAILABLE:
    # fmt: off
    @gluon.jit
    def _tile_place(tile, n_m, n_n, GROUP_M: gl.constexpr):
        """(row tile, column tile) of output tile `tile`: GROUP_M row tiles sweep the
        columns together."""
        in_group = GROUP_M * n_n
        first_m = tile // in_group * GROUP_M
        size_m = gl.minimum(n_m - first_m, GROUP_M)
        return first_m + tile % in_group % size_m, tile % in_group // size_m

    @gluon.jit
    def _produce(descs, bufs, bars, scales, M, N, K, GROUP_M: gl.constexpr,
                 num_warps: gl.constexpr):
        """The producer warp: every tile's K steps into the ring, a slot once both
        consumers have released it (a fresh mbarrier counts as having completed the
        phase before 0)."""
        x_desc, wg_desc, wu_desc, o_desc = descs
        x_bufs, w_bufs, o_bufs = bufs
        ready, empty = bars
        R: gl.constexpr = x_desc.block_type.shape[0]
        BK: gl.constexpr = x_desc.block_type.shape[1]
        BN: gl.constexpr = wg_desc.block_type.shape[0]
        STAGES: gl.constexpr = w_bufs.type.shape[0]
        CONSUMERS: gl.constexpr = x_bufs.type.shape[0] // STAGES
        BM: gl.constexpr = CONSUMERS * R
        nbytes: gl.constexpr = (CONSUMERS * x_desc.block_type.nbytes
                                + wg_desc.block_type.nbytes + wu_desc.block_type.nbytes)
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
                for c in gl.static_range(CONSUMERS):  # a consumer's rows of the tile
                    tma.async_copy_global_to_shared(x_desc, [pid_m * BM + c * R, kk * BK],
                                                    ready.index(s),
                                                    x_bufs.index(s * CONSUMERS + c))
                w = w_bufs.index(s)  # the gate's tile, then the up's
                tma.async_copy_global_to_shared(wg_desc, [pid_n * BN, kk * BK],
                                                ready.index(s), w.slice(0, BN))
                tma.async_copy_global_to_shared(wu_desc, [pid_n * BN, kk * BK],
                                                ready.index(s), w.slice(BN, BN))
                it += 1

    @gluon.jit
    def _dot(a, w, first: gl.constexpr, rows: gl.constexpr, zero):
        """a @ w[first:first + rows].T as an asynchronous wgmma into fresh registers: its
        token."""
        return warpgroup_mma(a, w.slice(first, rows).permute((1, 0)), zero, use_acc=False,
                             is_async=True)

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
                     BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                     GROUP_M: gl.constexpr, PART: gl.constexpr):
        """Output tile `tile`'s place (row tile, column tile), consumer PART's rows in M,
        the pointers to its scales and its first K step's row factors."""
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
                 PART: gl.constexpr, num_warps: gl.constexpr):
        """Consumer PART: rows PART * 64 on of each tile, every K step, then its rows of
        the output through shared memory and a TMA store (rows and columns past the ends
        are clipped by the store; loads past them read zeros)."""
        x_desc, wg_desc, wu_desc, o_desc = descs
        x_bufs, w_bufs, o_bufs = bufs
        ready, empty = bars
        (xs_ptr, wgs_ptr, wus_ptr, stride_xs_m, stride_xs_k, stride_wgs_n, stride_wgs_k,
         stride_wus_n, stride_wus_k) = scales
        R: gl.constexpr = x_desc.block_type.shape[0]
        BK: gl.constexpr = x_desc.block_type.shape[1]
        BN: gl.constexpr = wg_desc.block_type.shape[0]
        STAGES: gl.constexpr = w_bufs.type.shape[0]
        CONSUMERS: gl.constexpr = x_bufs.type.shape[0] // STAGES
        BM: gl.constexpr = CONSUMERS * R
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN, 32])
        zero = gl.zeros([R, BN], gl.float32, layout=acc_layout)
        # x's tile as wgmma's register operand: shared memory reads it once, not twice.
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout,
                                                     k_width=4)
        row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
        n_m = gl.cdiv(M, BM)
        n_n = gl.cdiv(N, BN)
        steps = gl.cdiv(K, BK)
        o_buf = o_bufs.index(PART)
        it = 0
        # (A program's first tile exists: the grid is at most the tiles.)
        here = _tile_scales(gl.program_id(0), scales, M, N, K, row_layout, R, BM, BN, BK,
                            GROUP_M, PART)
        for tile in range(gl.program_id(0), n_m * n_n, gl.num_programs(0)):
            pid_m, pid_n, row_ok, xs_ptrs, wg_s, wu_s, sg, su = here
            acc_g = zero
            acc_u = zero
            for kk in range(steps):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                a = x_bufs.index(s * CONSUMERS + PART).load(a_layout)
                w = w_bufs.index(s)
                # One product's registers: the gate's dot retired before the up's is
                # issued. The next step's scales load while the gate's dot runs.
                gate = _dot(a, w, 0, BN, zero)
                sg_n, su_n = _step_scales(xs_ptrs, row_ok, wg_s, wu_s, kk + 1, steps,
                                          stride_xs_k, stride_wgs_k, stride_wus_k)
                gate = warpgroup_mma_wait(0, deps=(gate,))
                acc_g = acc_g + gate * sg[:, None]
                up = warpgroup_mma_wait(0, deps=(_dot(a, w, BN, BN, zero),))
                mbarrier.arrive(empty.index(s))
                acc_u = acc_u + up * su[:, None]
                sg, su = sg_n, su_n
                it += 1
            # The next tile's first scales load under this tile's epilogue (the last
            # tile's "next" is itself again).
            after = gl.minimum(tile + gl.num_programs(0), n_m * n_n - 1)
            here = _tile_scales(after, scales, M, N, K, row_layout, R, BM, BN, BK, GROUP_M,
                                PART)
            out = acc_g / (1.0 + gl.exp2(-1.4426950408889634 * acc_g)) * acc_u  # silu * up
            tma.store_wait(pendings=0)  # the last tile's store has read o_buf
            o_buf.store(out.to(o_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [pid_m * BM + PART * R, pid_n * BN],
                                            o_buf)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _fp8_block_swiglu(x_desc, wg_desc, wu_desc, o_desc, xs_ptr, wgs_ptr, wus_ptr, M, N,
                          K, stride_xs_m, stride_xs_k, stride_wgs_n, stride_wgs_k,
                          stride_wus_n, stride_wus_k, GROUP_M: gl.constexpr,
                          STAGES: gl.constexpr, REGISTERS: gl.constexpr,
                          num_warps: gl.constexpr):
        """Persistent programs over the [M, N] output's 128 x 128 tiles (the module
        docstring's schedule). x [M, K] and the weights [N, K] fp8, their descriptors'
        tiles [64, 128] and [128, 128]; out [M, N] in tiles of [64, 128]; x's scales [M,
        ceil(K / 128)], the weights' [ceil(N / 128), ceil(K / 128)] fp32, any strides."""
        # Slot s's x tiles are 2 s and 2 s + 1, one a consumer.
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES * 2] + x_desc.block_type.shape,
                                           x_desc.layout)
        # The gate's tile and the up's, one above the other in a slot.
        w_bufs = gl.allocate_shared_memory(
            wg_desc.dtype, [STAGES, 2 * wg_desc.block_type.shape[0],
                            wg_desc.block_type.shape[1]], wg_desc.layout)
        o_bufs = gl.allocate_shared_memory(o_desc.dtype, [2] + o_desc.block_type.shape,
                                           o_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
        descs = (x_desc, wg_desc, wu_desc, o_desc)
        bufs = (x_bufs, w_bufs, o_bufs)
        bars = (ready, empty)
        scales = (xs_ptr, wgs_ptr, wus_ptr, stride_xs_m, stride_xs_k, stride_wgs_n,
                  stride_wgs_k, stride_wus_n, stride_wus_k)
        # (Constexprs keep their kind only written out in each partition's tuple.)
        gl.warp_specialize([
            (_consume, (descs, bufs, bars, scales, M, N, K, GROUP_M, 0, num_warps)),
            (_consume, (descs, bufs, bars, scales, M, N, K, GROUP_M, 1, num_warps)),
            (_produce, (descs, bufs, bars, scales, M, N, K, GROUP_M, num_warps)),
        ], [num_warps, 1], [REGISTERS, 24])
    # fmt: on

    _GL_DTYPES = {
        torch.uint8: gl.uint8,  # int4_hopper's packed weights
        torch.float8_e4m3fn: gl.float8e4nv,
        torch.bfloat16: gl.bfloat16,
        torch.float16: gl.float16,
    }


def descriptor(t, block):
    """A TMA descriptor over the 2-D tensor t in tiles of `block`, shared memory in the
    default NVMMA layout for its dtype."""
    layout = gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[t.dtype])
    return TensorDescriptor.from_tensor(t, block, layout)


def fp8_block_swiglu(x, xs, wg, wgs, wu, wus, out, launches=None, sms=None):
    """out = silu(x @ wg.T) * (x @ wu.T), x [M, K] and the weights [N, K] fp8 e4m3
    dequantized by their scales (xs [M, ceil(K / 128)], wgs and wus [ceil(N / 128),
    ceil(K / 128)], fp32); out [M, N] bf16 or fp16. launches: the launch.Described its
    caller keeps for calls like this one. Returns the compiled kernel."""

    def first():
        m, k = x.shape
        n = wg.shape[0]
        count = sms or torch.cuda.get_device_properties(x.device).multi_processor_count
        tiles = triton.cdiv(m, CONSUMERS * ROWS) * triton.cdiv(n, BLOCK_N)
        descs = (
            descriptor(x, [ROWS, BLOCK_K]),
            descriptor(wg, [BLOCK_N, BLOCK_K]),
            descriptor(wu, [BLOCK_N, BLOCK_K]),
            descriptor(out, [ROWS, BLOCK_N]),
        )
        scalars = (m, n, k, *xs.stride(), *wgs.stride(), *wus.stride())
        meta = {"GROUP_M": GROUP_M, "STAGES": STAGES, "REGISTERS": REGISTERS, "num_warps": 4}
        return _fp8_block_swiglu, (min(count, tiles),), descs, scalars, meta

    launches = launches or launch.Described()
    return launches((x, wg, wu, out), (xs, wgs, wus), first)
