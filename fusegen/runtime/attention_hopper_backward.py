"""Attention's backward on Hopper (compute capability 9.0), written in Gluon: the
forward's schedule (attention_hopper) carried over to the backward's two kernels.

dk and dv, keys-major (FA2/FA3's split): a program takes 128 keys of one (batch, kv head)
as two tiles of 64, one per consumer warpgroup (4 warps); a one-warp producer streams the
query blocks (64 rows) of the kv head's query heads, q and d_out, through two
shared-memory stages with TMA. For each block a consumer computes

    S^T = K q^T, P^T = exp2(S^T * scale * log2(e) - lse * log2(e)), dP^T = V d_out^T,
    dS^T = P^T * (dP^T - delta), dV += P^T d_out, dK += dS^T q (times scale at the end)

with S^T's and dP^T's dots in flight together, then dV's and dK's (a block that needs the
causal or last-key mask, in a loop of its own: dV's with dP^T's, where pairing spilled);
the two consumers ping-pong on the tensor cores as the forward's do. dq has a kernel of
its own (queries-major: 64 rows a consumer,
key blocks of 64 streamed, S = q K^T and dP = d_out V^T in flight together, dq += dS K),
so neither kernel needs atomics and both stay deterministic. lse (natural log, the
forward's) and delta = rowsum(d_out * out) are [batch, heads, q_len] fp32.

Measured against the `tl` backward and cuDNN on an H200 by
benchmarks/experiments/attention_gluon_backward.py: 12-14% faster than the `tl` kernels;
forward + backward 0.91x cuDNN, whose fused kernel does 5 dots to these 7 (fp32 atomics
to fuse dq ran 50% slower: benchmarks/RESULTS.md).

What it takes (Attention.hopper_fits): what the forward takes, q, k, v, d_out
contiguous in the module's layout, one head dim (64 or 128) for q, k and v.
"""

import torch
import triton

from . import attention_hopper

LOG2E = attention_hopper.LOG2E
# Query rows a step, keys a consumer (two consumers a program), the ring's stages;
# whether dk/dv's unmasked blocks issue S^T with dP^T and dV with dK (else dV with dP^T;
# the masked blocks do, where the pairing spilled). The experiment varies the last two.
BLOCK_M, BLOCK_N, STAGES, PAIRED_DOTS = 64, 64, 2, True

if attention_hopper.AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    # fmt: off
    @gluon.jit
    def _tiles(desc, count: gl.constexpr):
        """Shared memory for count of desc's tiles."""
        return gl.allocate_shared_memory(desc.dtype, [count] + desc.block_type.shape,
                                         desc.layout)

    @gluon.jit
    def _barriers(STAGES: gl.constexpr):
        """A kernel's mbarriers: one for each consumer's tiles it holds (the producer's
        one arrival), and the ring's ready (the producer's) and empty (both consumers')."""
        held = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(held.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
        return held, ready, empty

    @gluon.jit
    def _row_terms(lse_ptr, delta_ptr, row_base, rows, sq):
        """lse in base 2 and delta of the rows; rows past the queries get lse = inf (P = 0
        there: their q and d_out are another head's or batch entry's)."""
        inside = rows < sq
        lse = gl.load(lse_ptr + row_base + rows, mask=inside, other=float("inf"))
        delta = gl.load(delta_ptr + row_base + rows, mask=inside, other=0.0)
        return lse * 1.4426950408889634, delta

    @gluon.jit
    def _store_rows(ptr, tile, rows, n_rows, base, stride_s, layout: gl.constexpr):
        """A [rows, dim] tile into the rows before n_rows of a [seq, dim] slice at base."""
        DIM: gl.constexpr = tile.type.shape[1]
        cols = gl.arange(0, DIM, layout=gl.SliceLayout(0, layout))
        offsets = base + rows.to(gl.int64)[:, None] * stride_s + cols[None, :]
        gl.store(ptr + offsets, tile, mask=(rows < n_rows)[:, None])

    @gluon.jit
    def _kv_step(q_smem, do_smem, k_smem, v_smem, dk, dv, lse, delta, keys, rows, skv,
                 qk_scale, CAUSAL: gl.constexpr, MASKED: gl.constexpr, PAIRED: gl.constexpr,
                 num_warps: gl.constexpr):
        """One query block into a consumer's dK and dV. PAIRED: S^T issued with dP^T,
        then dV with dK (two waits a block); else dV with dP^T (three)."""
        BN: gl.constexpr = k_smem.type.shape[0]
        BM: gl.constexpr = q_smem.type.shape[0]
        DIM: gl.constexpr = q_smem.type.shape[1]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, DIM, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout,
                                                     k_width=2)
        dtype: gl.constexpr = q_smem.dtype
        s_zero = gl.zeros([BN, BM], gl.float32, layout=s_layout)
        if PAIRED:
            s_tok = warpgroup_mma(k_smem, q_smem.permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            dp_tok = warpgroup_mma(v_smem, do_smem.permute((1, 0)), s_zero, use_acc=False,
                                   is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok,))
        else:
            s = warpgroup_mma(k_smem, q_smem.permute((1, 0)), s_zero, use_acc=False)
        p = gl.exp2(s * qk_scale - lse[None, :])
        if MASKED:  # the diagonal (queries before a key see none of it), the last key
            seen = keys[:, None] < skv
            if CAUSAL:
                seen = seen & (keys[:, None] <= rows[None, :])
            p = gl.where(seen, p, 0.0)
        p_a = gl.convert_layout(p.to(dtype), a_layout)
        if PAIRED:
            dp = warpgroup_mma_wait(0, deps=(dp_tok,))
            ds_a = gl.convert_layout((p * (dp - delta[None, :])).to(dtype), a_layout)
            dv_tok = warpgroup_mma(p_a, do_smem, dv, is_async=True)
            dk_tok = warpgroup_mma(ds_a, q_smem, dk, is_async=True)
            dv, dk, p_a, ds_a = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, p_a, ds_a))
        else:
            dv_tok = warpgroup_mma(p_a, do_smem, dv, is_async=True)
            dp_tok = warpgroup_mma(v_smem, do_smem.permute((1, 0)), s_zero, use_acc=False,
                                   is_async=True)
            dp = warpgroup_mma_wait(0, deps=(dp_tok,))
            dv = warpgroup_mma_wait(0, deps=(dv_tok,))
            ds_a = gl.convert_layout((p * (dp - delta[None, :])).to(dtype), a_layout)
            dk = warpgroup_mma(ds_a, q_smem, dk)
        return dk, dv

    @gluon.jit
    def _kv_blocks(bufs, bars, dk, dv, lse_ptr, delta_ptr, row_base, keys, i, row0, end,
                   sq, skv, qk_scale, CAUSAL: gl.constexpr, MASKED: gl.constexpr,
                   PAIRED: gl.constexpr, num_warps: gl.constexpr):
        """Query blocks from row0 to end (one head's) into dK and dV, i: the ring's count
        so far; returns dk, dv and the count."""
        q_bufs, do_bufs, k_smem, v_smem = bufs
        ready, empty = bars
        BM: gl.constexpr = q_bufs.type.shape[1]
        STAGES: gl.constexpr = q_bufs.type.shape[0]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 16])
        for start in range(row0, end, BM):
            stage = i % STAGES
            rows = start + gl.arange(0, BM, layout=gl.SliceLayout(0, s_layout))
            lse, delta = _row_terms(lse_ptr, delta_ptr, row_base, rows, sq)
            mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
            dk, dv = _kv_step(q_bufs.index(stage), do_bufs.index(stage), k_smem, v_smem, dk,
                              dv, lse, delta, keys, rows, skv, qk_scale, CAUSAL, MASKED,
                              PAIRED and not MASKED, num_warps)
            mbarrier.arrive(empty.index(stage))
            i += 1
        return dk, dv, i

    @gluon.jit
    def _kv_consume(descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, at, sq, skv,
                    heads, qk_scale, scale, strides, GROUP: gl.constexpr,
                    CAUSAL: gl.constexpr, PAIRED_DOTS: gl.constexpr, PART: gl.constexpr,
                    num_warps: gl.constexpr):
        """Consumer PART: its 64 keys over every query block the producer streams (each
        query head of the kv head in turn): a head's blocks that need a mask (causal: those
        that cross the diagonal; all, where the keys run past the last) by one loop, the
        rest by another without the mask's code; then its rows of dk and dv."""
        q_desc, k_desc, v_desc, do_desc = descs
        q_bufs, do_bufs, k_bufs, v_bufs = bufs
        kv_ready, ready, empty = bars
        batch, kv_head, key0, first_block, n_blocks, kv_row, kv_col = at
        BM: gl.constexpr = q_desc.block_type.shape[0]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        DIM: gl.constexpr = q_desc.block_type.shape[1]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, DIM, 16])
        dtype: gl.constexpr = q_desc.dtype
        key0 = key0 + PART * BN
        dk = gl.zeros([BN, DIM], gl.float32, layout=acc_layout)
        dv = gl.zeros([BN, DIM], gl.float32, layout=acc_layout)
        keys = key0 + gl.arange(0, BN, layout=gl.SliceLayout(1, s_layout))
        row0 = first_block * BM
        end = (first_block + n_blocks) * BM
        if key0 + BN > skv:
            split = end
        elif CAUSAL:  # the blocks that start before this consumer's last key
            split = gl.minimum(gl.cdiv(key0 + BN, BM) * BM, end)
        else:
            split = row0
        step_bufs = (q_bufs, do_bufs, k_bufs.index(PART), v_bufs.index(PART))
        step_bars = (ready, empty)
        mbarrier.wait(kv_ready.index(PART), 0)
        i = 0
        for h in range(GROUP):
            row_base = (batch * heads + kv_head * GROUP + h).to(gl.int64) * sq
            dk, dv, i = _kv_blocks(step_bufs, step_bars, dk, dv, lse_ptr, delta_ptr, row_base,
                                   keys, i, row0, split, sq, skv, qk_scale, CAUSAL, True,
                                   PAIRED_DOTS, num_warps)
            dk, dv, i = _kv_blocks(step_bufs, step_bars, dk, dv, lse_ptr, delta_ptr, row_base,
                                   keys, i, split, end, sq, skv, qk_scale, CAUSAL, False,
                                   PAIRED_DOTS, num_warps)

        stride_b, stride_h, stride_s = strides
        base = batch.to(gl.int64) * stride_b + kv_head * stride_h
        out_keys = key0 + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_layout))
        _store_rows(dk_ptr, (dk * scale).to(dtype), out_keys, skv, base, stride_s, acc_layout)
        _store_rows(dv_ptr, dv.to(dtype), out_keys, skv, base, stride_s, acc_layout)

    @gluon.jit
    def _kv_produce(descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, at, sq, skv,
                    heads, qk_scale, scale, q_place, GROUP: gl.constexpr,
                    CAUSAL: gl.constexpr, PAIRED_DOTS: gl.constexpr, PART: gl.constexpr,
                    num_warps: gl.constexpr):
        """The producer warp: both consumers' K and V, then each query block's q and
        d_out into the ring once both consumers have released its stage (a fresh
        mbarrier counts as having completed the phase before 0)."""
        q_desc, k_desc, v_desc, do_desc = descs
        q_bufs, do_bufs, k_bufs, v_bufs = bufs
        kv_ready, ready, empty = bars
        batch, kv_head, key0, first_block, n_blocks, kv_row, kv_col = at
        q_rows_b, q_rows_h, q_cols_h = q_place
        BM: gl.constexpr = q_desc.block_type.shape[0]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        STAGES: gl.constexpr = q_bufs.type.shape[0]
        for part in gl.static_range(2):
            bar = kv_ready.index(part)
            mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            row = kv_row + key0 + part * BN
            tma.async_copy_global_to_shared(k_desc, [row, kv_col], bar, k_bufs.index(part))
            tma.async_copy_global_to_shared(v_desc, [row, kv_col], bar, v_bufs.index(part))
        for i in range(GROUP * n_blocks):
            stage = i % STAGES
            head = kv_head * GROUP + i // n_blocks
            row = batch * q_rows_b + head * q_rows_h + (first_block + i % n_blocks) * BM
            mbarrier.wait(empty.index(stage), ((i // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [row, head * q_cols_h], bar,
                                            q_bufs.index(stage))
            tma.async_copy_global_to_shared(do_desc, [row, head * q_cols_h], bar,
                                            do_bufs.index(stage))

    @gluon.jit
    def _attention_dkdv(q_desc, k_desc, v_desc, do_desc, dk_ptr, dv_ptr, lse_ptr, delta_ptr,
                        sq, skv, heads, qk_scale, scale,
                        q_rows_b, q_rows_h, q_cols_h, kv_rows_b, kv_rows_h, kv_cols_h,
                        stride_kv_b, stride_kv_h, stride_kv_s,
                        GROUP: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                        PAIRED_DOTS: gl.constexpr, num_warps: gl.constexpr):
        """One program: 2 x 64 keys of one (batch, kv head), programs kv head by kv head,
        the first keys (causal: the most query blocks) first. A tile's place in the
        [rows, dim] views as in attention_hopper's forward."""
        BM: gl.constexpr = q_desc.block_type.shape[0]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        k_blocks = gl.cdiv(skv, 2 * BN)
        pid = gl.program_id(0)
        kv_heads = heads // GROUP
        batch = pid // k_blocks // kv_heads
        kv_head = pid // k_blocks % kv_heads
        key0 = pid % k_blocks * (2 * BN)
        if CAUSAL:
            first_block = key0 // BM  # the query blocks at or after the first key
        else:
            first_block = 0
        n_blocks = gl.cdiv(sq, BM) - first_block
        kv_row = batch * kv_rows_b + kv_head * kv_rows_h

        bufs = (_tiles(q_desc, STAGES), _tiles(do_desc, STAGES), _tiles(k_desc, 2),
                _tiles(v_desc, 2))
        bars = _barriers(STAGES)
        descs = (q_desc, k_desc, v_desc, do_desc)
        at = (batch, kv_head, key0, first_block, n_blocks, kv_row, kv_head * kv_cols_h)
        out_strides = (stride_kv_b, stride_kv_h, stride_kv_s)
        q_place = (q_rows_b, q_rows_h, q_cols_h)
        # (Constexprs keep their kind only written out in each partition's tuple.)
        gl.warp_specialize([
            (_kv_consume, (descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, at, sq, skv,
                           heads, qk_scale, scale, out_strides, GROUP, CAUSAL, PAIRED_DOTS, 0,
                           num_warps)),
            (_kv_consume, (descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, at, sq, skv,
                           heads, qk_scale, scale, out_strides, GROUP, CAUSAL, PAIRED_DOTS, 1,
                           num_warps)),
            (_kv_produce, (descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, at, sq, skv,
                           heads, qk_scale, scale, q_place, GROUP, CAUSAL, PAIRED_DOTS, 0,
                           num_warps)),
        ], [num_warps, 1], [240, 24])

    @gluon.jit
    def _q_consume(descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, at, sq, skv, heads,
                   qk_scale, scale, strides, CAUSAL: gl.constexpr, PART: gl.constexpr,
                   num_warps: gl.constexpr):
        """Consumer PART of the dq kernel: its 64 query rows over every key block the
        producer streams; then its rows of dq."""
        q_desc, k_desc, v_desc, do_desc = descs
        q_bufs, do_bufs, k_bufs, v_bufs = bufs
        qdo_ready, ready, empty = bars
        batch, head, row0, n_blocks, q_row, q_col, kv_row, kv_col = at
        BM: gl.constexpr = q_desc.block_type.shape[0]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        DIM: gl.constexpr = q_desc.block_type.shape[1]
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, DIM, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout,
                                                     k_width=2)
        dtype: gl.constexpr = q_desc.dtype
        row0 = row0 + PART * BM
        q_smem = q_bufs.index(PART)
        do_smem = do_bufs.index(PART)
        s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
        dq = gl.zeros([BM, DIM], gl.float32, layout=acc_layout)
        rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
        lse, delta = _row_terms(lse_ptr, delta_ptr, (batch * heads + head).to(gl.int64) * sq,
                                rows, sq)
        mbarrier.wait(qdo_ready.index(PART), 0)
        for j in range(n_blocks):
            stage = j % STAGES
            k_smem = k_bufs.index(stage)
            v_smem = v_bufs.index(stage)
            key0 = j * BN
            mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            dp_tok = warpgroup_mma(do_smem, v_smem.permute((1, 0)), s_zero, use_acc=False,
                                   is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok,))
            p = gl.exp2(s * qk_scale - lse[:, None])
            if (CAUSAL and key0 + BN > row0) or key0 + BN > skv:
                keys = key0 + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
                seen = keys[None, :] < skv
                if CAUSAL:
                    seen = seen & (keys[None, :] <= rows[:, None])
                p = gl.where(seen, p, 0.0)
            dp = warpgroup_mma_wait(0, deps=(dp_tok,))
            ds_a = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), a_layout)
            dq = warpgroup_mma(ds_a, k_smem, dq)
            mbarrier.arrive(empty.index(stage))

        stride_b, stride_h, stride_s = strides
        base = batch.to(gl.int64) * stride_b + head * stride_h
        out_rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, acc_layout))
        _store_rows(dq_ptr, (dq * scale).to(dtype), out_rows, sq, base, stride_s, acc_layout)

    @gluon.jit
    def _q_produce(descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, at, sq, skv, heads,
                   qk_scale, scale, strides, CAUSAL: gl.constexpr, PART: gl.constexpr,
                   num_warps: gl.constexpr):
        """The dq kernel's producer warp: both consumers' q and d_out, then each key
        block's K and V into the ring once both consumers have released its stage."""
        q_desc, k_desc, v_desc, do_desc = descs
        q_bufs, do_bufs, k_bufs, v_bufs = bufs
        qdo_ready, ready, empty = bars
        batch, head, row0, n_blocks, q_row, q_col, kv_row, kv_col = at
        BM: gl.constexpr = q_desc.block_type.shape[0]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        for part in gl.static_range(2):
            bar = qdo_ready.index(part)
            mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            row = q_row + part * BM
            tma.async_copy_global_to_shared(q_desc, [row, q_col], bar, q_bufs.index(part))
            tma.async_copy_global_to_shared(do_desc, [row, q_col], bar, do_bufs.index(part))
        for j in range(n_blocks):
            stage = j % STAGES
            mbarrier.wait(empty.index(stage), ((j // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            row = kv_row + j * BN
            tma.async_copy_global_to_shared(k_desc, [row, kv_col], bar, k_bufs.index(stage))
            tma.async_copy_global_to_shared(v_desc, [row, kv_col], bar, v_bufs.index(stage))

    @gluon.jit
    def _attention_dq(q_desc, k_desc, v_desc, do_desc, dq_ptr, lse_ptr, delta_ptr,
                      sq, skv, heads, qk_scale, scale,
                      q_rows_b, q_rows_h, q_cols_h, kv_rows_b, kv_rows_h, kv_cols_h,
                      stride_q_b, stride_q_h, stride_q_s,
                      GROUP: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                      num_warps: gl.constexpr):
        """One program: 2 x 64 query rows of one (batch, head), programs head by head,
        the last query block (causal: the longest) first."""
        BM: gl.constexpr = q_desc.block_type.shape[0]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        m_blocks = gl.cdiv(sq, 2 * BM)
        pid = gl.program_id(0)
        batch = pid // m_blocks // heads
        head = pid // m_blocks % heads
        kv_head = head // GROUP
        row0 = (m_blocks - 1 - pid % m_blocks) * (2 * BM)
        if CAUSAL:
            n_blocks = gl.cdiv(gl.minimum(row0 + 2 * BM, skv), BN)
        else:
            n_blocks = gl.cdiv(skv, BN)

        bufs = (_tiles(q_desc, 2), _tiles(do_desc, 2), _tiles(k_desc, STAGES),
                _tiles(v_desc, STAGES))
        bars = _barriers(STAGES)
        descs = (q_desc, k_desc, v_desc, do_desc)
        at = (batch, head, row0, n_blocks, batch * q_rows_b + head * q_rows_h + row0,
              head * q_cols_h, batch * kv_rows_b + kv_head * kv_rows_h, kv_head * kv_cols_h)
        out_strides = (stride_q_b, stride_q_h, stride_q_s)
        gl.warp_specialize([
            (_q_consume, (descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, at, sq, skv, heads,
                          qk_scale, scale, out_strides, CAUSAL, 0, num_warps)),
            (_q_consume, (descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, at, sq, skv, heads,
                          qk_scale, scale, out_strides, CAUSAL, 1, num_warps)),
            (_q_produce, (descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, at, sq, skv, heads,
                          qk_scale, scale, out_strides, CAUSAL, 0, num_warps)),
        ], [num_warps, 1], [240, 24])
    # fmt: on


# What `fusegen inspect` shows as each kernel's config: a program's query rows and keys
# (a step's, for the one streamed), warps (two consumers of 4 and the producer's 1),
# stages.
CONFIGS = {
    "hopper_dkdv": {
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": 2 * BLOCK_N,
        "num_warps": 9,
        "num_stages": STAGES,
    },
    "hopper_dq": {"BLOCK_M": 2 * BLOCK_M, "BLOCK_N": BLOCK_N, "num_warps": 9, "num_stages": STAGES},
}


def backward(
    q, k, v, d_out, lse, delta, needs, *, layout, causal, scale,
    stages=STAGES, paired_dots=PAIRED_DOTS,
):  # fmt: skip
    """(dq, dk, dv), each None where needs says it is not wanted, of attention over q, k,
    v (contiguous, 16-byte aligned, bf16 or fp16, one head dim) given d_out (q's shape
    and layout, contiguous), the forward's lse and delta = rowsum(d_out * out), both
    [batch, heads, q_len] fp32; and the compiled kernels by name (`fusegen inspect`).
    stages and paired_dots: what benchmarks/experiments/attention_gluon_backward.py
    varies."""
    batch, heads, kv_heads, sq, skv, rows, q_place, kv_place = attention_hopper.places(q, k, layout)
    descriptor = attention_hopper._descriptor
    q_desc, do_desc = (descriptor(t, rows[0], BLOCK_M) for t in (q, d_out))
    k_desc, v_desc = (descriptor(t, rows[1], BLOCK_N) for t in (k, v))
    common = (lse, delta, sq, skv, heads, scale * LOG2E, scale, *q_place, *kv_place)
    meta = {"GROUP": heads // kv_heads, "CAUSAL": causal, "STAGES": stages, "num_warps": 4}
    d_q = d_k = d_v = None
    compiled = {}
    with torch.cuda.device(q.device):  # Triton launches on the current device
        if needs[1] or needs[2]:
            d_k, d_v = torch.empty_like(k), torch.empty_like(v)
            grid = (triton.cdiv(skv, 2 * BLOCK_N) * batch * kv_heads,)
            compiled["hopper_dkdv"] = _attention_dkdv[grid](
                q_desc, k_desc, v_desc, do_desc, d_k, d_v, *common,
                *attention_hopper.strides(d_k, layout), PAIRED_DOTS=paired_dots, **meta,
            )  # fmt: skip
        if needs[0]:
            d_q = torch.empty_like(q)
            grid = (triton.cdiv(sq, 2 * BLOCK_M) * batch * heads,)
            compiled["hopper_dq"] = _attention_dq[grid](
                q_desc, k_desc, v_desc, do_desc, d_q, *common,
                *attention_hopper.strides(d_q, layout), **meta,
            )  # fmt: skip
    return (d_q, d_k if needs[1] else None, d_v if needs[2] else None), compiled
