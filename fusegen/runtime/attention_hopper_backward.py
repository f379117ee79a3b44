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

ALiBi and sliding windows as in the forward: ALiBi's slope * (key - query - (k_len -
q_len)) split into a key's part on the scores and a query's on lse, both measured from
the consumer's first key or row (not from position 0: small terms, kept exact); a
window's dk/dv program streams only the query blocks that see its keys (its edge blocks
masked in a loop of their own), and a dq program the key blocks from its first row's
window start.

Head dims that are not powers of two are two tiles, as in the forward (96 = 64 + 32,
MLA's 192 = 128 + 64 with v 128); at MLA's dims the dk/dv kernel takes query blocks of 32
rows (dkdv_rows: 64 spilled). Forward + backward there: 1.05x cuDNN at 96, 0.99x at MLA.

What it takes (Attention.hopper_backward_fits): what the forward takes (head dims in
HEAD_DIMS), q, k, v, d_out contiguous in the module's layout; at head dim 64 also the
calls whose forward was the `tl` one (the same lse): there it ran 1.906 ms against the
`tl` backward's 2.375 at 4 x 32/8 x 4096 causal (H100).
"""

import torch
import triton

from . import attention_hopper, launch

LOG2E = attention_hopper.LOG2E
# Query rows a step, keys a consumer (two consumers a program), the ring's stages;
# whether dk/dv's unmasked blocks issue S^T with dP^T and dV with dK (else dV with dP^T;
# the masked blocks do, where the pairing spilled 292 bytes; 2: the masked ones too, 52
# bytes with ROW_TMA, untimed); the quarters of a kv head's key blocks
# whose dk/dv programs run kv head by kv head, the rest keys-major (_attention_dkdv), under
# a causal mask with grouped heads and no window, where a program runs a whole group of
# query heads and the heads-major grid ended on the last kv heads' longest ones: at 4 x
# 28/4 x 4096 dk/dv took 1.686 ms against 1.919 all head by head, at 1 x 32/8 x 8192 1.795
# against 1.995 (H100). Elsewhere head by head (4): MHA's programs are a seventh as long
# and share a head's queries in L2 that way (unmeasured keys-major), windows' weigh the
# same. The same for the dq kernel's query blocks (unmeasured, so head by head). The
# experiment varies the last four.
BLOCK_M, BLOCK_N, STAGES, PAIRED_DOTS, HEAD_MAJOR, DQ_HEAD_MAJOR = 64, 64, 2, True, 2, 4
# Whether a backward that wants dq leaves delta = rowsum(d_out * out) to the dq kernel
# (from the d_out tiles it holds and out, one extra read of out) instead of a row-sum
# kernel of its own (reads out and d_out: about 2% of the backward at 4 x 32 x 4096,
# d 128); the dq kernel then runs first. Causal 4 x 32 x 4096, d 128, H100: dq + dk/dv
# 3.490 ms [3.446-3.540] against 3.531 [3.492-3.566] after the row-sum kernel, and one
# launch fewer.
DELTA_IN_DQ = True
# Whether the dk/dv kernel's producer streams each query block's lse and delta with its q
# and d_out (TMA into the ring) instead of each consumer loading them from memory at the
# block's start and holding them across the block's waits: spills 200 -> 40 bytes at d 128,
# the dk/dv kernel 2.074 -> 1.901 ms causal at 4 x 32 x 4096, 1.736 -> 1.530 at GQA 28/4
# (H100). Taken where q_len is a multiple of 4 (row_tma_fits): a 1-D TMA box must start
# 16-byte aligned (at 257 queries the kernel died of an illegal instruction). The
# experiment varies it.
ROW_TMA = True
# (q and k's head dim, v's) the kernels are written for: the forward's, each a tile or two
# (attention_hopper.parts); a module of other dims runs the `tl` backward.
HEAD_DIMS = attention_hopper.HEAD_DIMS

if attention_hopper.AVAILABLE:
    from .gluon_hopper import gl, gluon, mbarrier, tma, warpgroup_mma_wait

    from .attention_hopper import (
        _accumulators,
        _alibi_slope,
        _first_key,
        _copy,
        _dot_into,
        _dot_t,
        _nbytes,
        _operands,
        _parts_of,
        _ring,
        _slots,
        _store_rows,
    )

    # fmt: off
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
    def _row_terms(lse_ptr, delta_ptr, row_base, rows, sq, READ_DELTA: gl.constexpr = True):
        """lse in base 2 and delta of the rows (zeros unless READ_DELTA); rows past the
        queries get lse = inf (P = 0 there: their q and d_out are another head's or batch
        entry's)."""
        inside = rows < sq
        lse = gl.load(lse_ptr + row_base + rows, mask=inside, other=float("inf"))
        if READ_DELTA:
            delta = gl.load(delta_ptr + row_base + rows, mask=inside, other=0.0)
        else:
            delta = gl.zeros_like(lse)
        return lse * 1.4426950408889634, delta

    @gluon.jit
    def _staged_row_terms(row_bufs, stage, rows, sq):
        """_row_terms from the ring's stage, where the producer put the block's lse and
        delta with its q and d_out (rows past the queries hold the next head's: lse = inf
        there)."""
        lse_bufs, delta_bufs = row_bufs
        layout: gl.constexpr = rows.type.layout
        lse = lse_bufs.index(stage).load(layout)
        delta = delta_bufs.index(stage).load(layout)
        return gl.where(rows < sq, lse * 1.4426950408889634, float("inf")), delta

    @gluon.jit
    def _out_part(out_ptr, base, rows, sq, stride_s, col0, WIDTH: gl.constexpr):
        """out's [rows, WIDTH] tile from column col0, in the layout rows slice (rows past
        sq read as 0)."""
        layout: gl.constexpr = rows.type.layout.parent
        cols = col0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
        offsets = base + rows.to(gl.int64)[:, None] * stride_s + cols[None, :]
        return gl.load(out_ptr + offsets, mask=(rows < sq)[:, None], other=0.0)

    @gluon.jit
    def _out_tiles(do_smems, out_ptr, base, rows, sq, stride_s):
        """out's tiles of the rows, one a part of v's head dim (as d_out's tiles)."""
        W0: gl.constexpr = do_smems[0].type.shape[1]
        tiles = (_out_part(out_ptr, base, rows, sq, stride_s, 0, W0),)
        if len(do_smems) == 2:
            W1: gl.constexpr = do_smems[1].type.shape[1]
            tiles = tiles + (_out_part(out_ptr, base, rows, sq, stride_s, W0, W1),)
        return tiles

    @gluon.constexpr_function
    def _out_layout(num_warps):
        """The layout the dq kernel's consumers (and _attention_delta) hold out's rows in."""
        return gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])

    @gluon.jit
    def _part_sum(out, d_out):
        """rowsum(d_out * out) of one part of the head dim, in fp32: the dq kernel's and
        _attention_delta's one arithmetic, in one layout (the same bits either way)."""
        return gl.sum(out.to(gl.float32) * d_out.to(gl.float32), 1)

    @gluon.jit
    def _delta(do_smems, outs, delta_ptr, row_base, rows, sq, row_layout: gl.constexpr):
        """delta = rowsum(d_out * out) of the rows (d_out from the consumer's tiles in
        shared memory), stored for the dk/dv kernel (launched after this one) and returned
        in row_layout."""
        layout: gl.constexpr = rows.type.layout.parent
        delta = _part_sum(outs[0], do_smems[0].load(layout))
        if len(outs) == 2:
            delta += _part_sum(outs[1], do_smems[1].load(layout))
        gl.store(delta_ptr + row_base + rows, delta, mask=rows < sq)
        return gl.convert_layout(delta, row_layout)

    @gluon.jit
    def _attention_delta(out_ptr, d_out_ptr, delta_ptr, sq, heads, stride_o_b, stride_o_h,
                         stride_o_s, stride_d_b, stride_d_h, stride_d_s, W0: gl.constexpr,
                         W1: gl.constexpr, ROWS: gl.constexpr, num_warps: gl.constexpr):
        """delta of ROWS query rows of one (batch, head), program_id(1), for a backward
        whose dq kernel does not write it (no dq wanted): in the dq kernel's layout and
        arithmetic, so that dk's bits do not depend on whether dq was asked for too. W0,
        W1: the parts of v's head dim (W1 0: one)."""
        layout: gl.constexpr = _out_layout(num_warps)
        pair = gl.program_id(1)
        rows = gl.program_id(0) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        o_base = (pair // heads).to(gl.int64) * stride_o_b + (pair % heads) * stride_o_h
        d_base = (pair // heads).to(gl.int64) * stride_d_b + (pair % heads) * stride_d_h
        delta = _part_sum(_out_part(out_ptr, o_base, rows, sq, stride_o_s, 0, W0),
                          _out_part(d_out_ptr, d_base, rows, sq, stride_d_s, 0, W0))
        if W1:
            delta += _part_sum(_out_part(out_ptr, o_base, rows, sq, stride_o_s, W0, W1),
                               _out_part(d_out_ptr, d_base, rows, sq, stride_d_s, W0, W1))
        gl.store(delta_ptr + pair.to(gl.int64) * sq + rows, delta, mask=rows < sq)

    @gluon.jit
    def _store_parts(ptr, accs, factor, row0, n_rows, base, stride_s, dtype: gl.constexpr):
        """Each part's accumulator, times factor, into its columns of the rows."""
        _store_rows(ptr, (accs[0] * factor).to(dtype), row0, n_rows, base, stride_s, 0)
        if len(accs) == 2:
            _store_rows(ptr, (accs[1] * factor).to(dtype), row0, n_rows, base, stride_s,
                        accs[0].type.shape[1])

    @gluon.jit
    def _kv_step(q_smems, do_smems, k_smems, v_smems, dk, dv, lse, delta, keys, rows, skv,
                 qk_scale, bias, CAUSAL: gl.constexpr, ALIBI: gl.constexpr,
                 WINDOW: gl.constexpr, MASKED: gl.constexpr, PAIRED: gl.constexpr,
                 num_warps: gl.constexpr):
        """One query block into a consumer's dK and dV (tuples, one a part of the head
        dim). PAIRED: S^T issued with dP^T, then dV with dK (two waits a block); else dV
        with dP^T (three). ALIBI: the scores get bias (a key's part of ALiBi's term; the
        row's is in lse: _kv_blocks) added."""
        BN: gl.constexpr = k_smems[0].type.shape[0]
        BM: gl.constexpr = q_smems[0].type.shape[0]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 16])
        dtype: gl.constexpr = q_smems[0].dtype
        s_zero = gl.zeros([BN, BM], gl.float32, layout=s_layout)
        if PAIRED:
            s_tok = _dot_t(k_smems, q_smems, s_zero)
            dp_tok = _dot_t(v_smems, do_smems, s_zero)
            s = warpgroup_mma_wait(len(v_smems), deps=(s_tok,))
        else:
            s = warpgroup_mma_wait(0, deps=(_dot_t(k_smems, q_smems, s_zero),))
        if ALIBI:
            p = gl.exp2(s * qk_scale + bias[:, None] - lse[None, :])
        else:
            p = gl.exp2(s * qk_scale - lse[None, :])
        if MASKED:  # the diagonal (queries before a key see none of it), the last key
            seen = keys[:, None] < skv
            if CAUSAL:
                seen = seen & (keys[:, None] <= rows[None, :])
            if WINDOW:  # a query sees its WINDOW latest keys
                seen = seen & (keys[:, None] > rows[None, :] - WINDOW)
            p = gl.where(seen, p, 0.0)
        p_ops = _operands(p.to(dtype), dv)
        if PAIRED:
            dp = warpgroup_mma_wait(0, deps=(dp_tok,))
            ds_ops = _operands((p * (dp - delta[None, :])).to(dtype), dk)
            toks = _dot_into(p_ops, do_smems, dv) + _dot_into(ds_ops, q_smems, dk)
            done = warpgroup_mma_wait(0, deps=toks + p_ops + ds_ops)
            dv = done[:len(dv)]
            dk = done[len(dv):len(dv) + len(dk)]
        else:
            dv_toks = _dot_into(p_ops, do_smems, dv)
            dp_tok = _dot_t(v_smems, do_smems, s_zero)
            dp = warpgroup_mma_wait(0, deps=(dp_tok,))
            dv = warpgroup_mma_wait(0, deps=dv_toks + p_ops)[:len(dv)]
            ds_ops = _operands((p * (dp - delta[None, :])).to(dtype), dk)
            dk = warpgroup_mma_wait(0, deps=_dot_into(ds_ops, q_smems, dk) + ds_ops)[:len(dk)]
        return dk, dv

    @gluon.jit
    def _kv_blocks(bufs, bars, dk, dv, lse_ptr, delta_ptr, row_base, keys, i, row0, end,
                   sq, skv, qk_scale, slope, key0, row_bufs, CAUSAL: gl.constexpr,
                   ALIBI: gl.constexpr, WINDOW: gl.constexpr, MASKED: gl.constexpr,
                   PAIRED: gl.constexpr, ROW_TMA: gl.constexpr, num_warps: gl.constexpr):
        """Query blocks from row0 to end (one head's) into dK and dV, i: the ring's count
        so far; returns dk, dv and the count. ALIBI: slope * (key - key0), key0 the
        consumer's first key, goes on the scores, and slope * (row - key0 + skv - sq) on
        lse: ALiBi's slope * (key - row - (skv - sq)), the scores' part under a block.
        ROW_TMA: each block's lse and delta from the ring (row_bufs), not from memory."""
        q_bufs, do_bufs, k_smems, v_smems = bufs
        ready, empty = bars
        BM: gl.constexpr = q_bufs[0].type.shape[1]
        STAGES: gl.constexpr = q_bufs[0].type.shape[0]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 16])
        bias = slope
        if ALIBI:
            bias = slope * (keys - key0).to(gl.float32)
        for start in range(row0, end, BM):
            stage = i % STAGES
            rows = start + gl.arange(0, BM, layout=gl.SliceLayout(0, s_layout))
            if ROW_TMA:
                mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
                lse, delta = _staged_row_terms(row_bufs, stage, rows, sq)
            else:
                lse, delta = _row_terms(lse_ptr, delta_ptr, row_base, rows, sq)
            if ALIBI:
                lse = lse + slope * (rows - key0 + skv - sq).to(gl.float32)
            if not ROW_TMA:
                mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
            dk, dv = _kv_step(_slots(q_bufs, stage), _slots(do_bufs, stage), k_smems,
                              v_smems, dk, dv, lse, delta, keys, rows, skv, qk_scale, bias,
                              CAUSAL, ALIBI, WINDOW, MASKED, PAIRED == 2 or (PAIRED and not MASKED),
                              num_warps)
            mbarrier.arrive(empty.index(stage))
            i += 1
        return dk, dv, i

    @gluon.jit
    def _kv_consume(descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, at, sq, skv,
                    heads, qk_scale, scale, strides, rows_at, GROUP: gl.constexpr,
                    CAUSAL: gl.constexpr, ALIBI: gl.constexpr, WINDOW: gl.constexpr,
                    PAIRED_DOTS: gl.constexpr, ROW_TMA: gl.constexpr, PART: gl.constexpr,
                    num_warps: gl.constexpr):
        """Consumer PART: its 64 keys over every query block the producer streams (each
        query head of the kv head in turn): a head's blocks that need a mask (causal: those
        that cross the diagonal; all, where the keys run past the last; WINDOW: those
        from the first row past its first key's window) by a loop of their own, the rest
        by another without the mask's code; then its rows of dk and dv. rows_at: the
        ring's lse and delta (ROW_TMA) and their descriptors."""
        q_descs, k_descs, v_descs, do_descs = descs
        row_bufs = (rows_at[0], rows_at[1])
        q_bufs, do_bufs, k_bufs, v_bufs = bufs
        kv_ready, ready, empty = bars
        batch, kv_head, key0, first_block, n_blocks, kv_row, kv_col, v_col = at
        BM: gl.constexpr = q_descs[0].block_type.shape[0]
        BN: gl.constexpr = k_descs[0].block_type.shape[0]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 16])
        dtype: gl.constexpr = q_descs[0].dtype
        key0 = key0 + PART * BN
        dk = _accumulators(k_descs, num_warps)
        dv = _accumulators(v_descs, num_warps)
        keys = key0 + gl.arange(0, BN, layout=gl.SliceLayout(1, s_layout))
        row0 = first_block * BM
        end = (first_block + n_blocks) * BM
        if key0 + BN > skv:
            split = end
        elif CAUSAL:  # the blocks that start before this consumer's last key
            split = gl.minimum(gl.cdiv(key0 + BN, BM) * BM, end)
        else:
            split = row0
        tail = end
        if WINDOW:  # the blocks from the first that has a row past key0's window
            tail = gl.minimum(gl.maximum((key0 + WINDOW) // BM * BM, split), end)
        step_bufs = (q_bufs, do_bufs, _slots(k_bufs, PART), _slots(v_bufs, PART))
        step_bars = (ready, empty)
        mbarrier.wait(kv_ready.index(PART), 0)
        i = 0
        for h in range(GROUP):
            head = kv_head * GROUP + h
            row_base = (batch * heads + head).to(gl.int64) * sq
            slope = 0.0
            if ALIBI:
                slope = _alibi_slope(head, ALIBI)
            dk, dv, i = _kv_blocks(step_bufs, step_bars, dk, dv, lse_ptr, delta_ptr, row_base,
                                   keys, i, row0, split, sq, skv, qk_scale, slope, key0,
                                   row_bufs, CAUSAL, ALIBI, WINDOW, True, PAIRED_DOTS, ROW_TMA,
                                   num_warps)
            dk, dv, i = _kv_blocks(step_bufs, step_bars, dk, dv, lse_ptr, delta_ptr, row_base,
                                   keys, i, split, tail, sq, skv, qk_scale, slope, key0,
                                   row_bufs, CAUSAL, ALIBI, WINDOW, False, PAIRED_DOTS, ROW_TMA,
                                   num_warps)
            if WINDOW:
                dk, dv, i = _kv_blocks(step_bufs, step_bars, dk, dv, lse_ptr, delta_ptr,
                                       row_base, keys, i, tail, end, sq, skv, qk_scale, slope,
                                       key0, row_bufs, CAUSAL, ALIBI, WINDOW, True, PAIRED_DOTS,
                                       ROW_TMA, num_warps)

        dk_strides, dv_strides = strides
        base = batch.to(gl.int64) * dk_strides[0] + kv_head * dk_strides[1]
        _store_parts(dk_ptr, dk, scale, key0, skv, base, dk_strides[2], dtype)
        base = batch.to(gl.int64) * dv_strides[0] + kv_head * dv_strides[1]
        _store_parts(dv_ptr, dv, 1.0, key0, skv, base, dv_strides[2], dtype)

    @gluon.jit
    def _kv_produce(descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, at, sq, skv,
                    heads, qk_scale, scale, q_place, rows_at, GROUP: gl.constexpr,
                    CAUSAL: gl.constexpr, ALIBI: gl.constexpr, WINDOW: gl.constexpr,
                    PAIRED_DOTS: gl.constexpr, ROW_TMA: gl.constexpr, PART: gl.constexpr,
                    num_warps: gl.constexpr):
        """The producer warp: both consumers' K and V, then each query block's q and
        d_out (ROW_TMA: and its lse and delta) into the ring once both consumers have
        released its stage (a fresh mbarrier counts as having completed the phase before
        0)."""
        lse_bufs, delta_bufs, lse_desc, delta_desc = rows_at
        q_descs, k_descs, v_descs, do_descs = descs
        q_bufs, do_bufs, k_bufs, v_bufs = bufs
        kv_ready, ready, empty = bars
        batch, kv_head, key0, first_block, n_blocks, kv_row, kv_col, v_col = at
        q_rows_b, q_rows_h, q_cols_h, v_cols_h = q_place
        BM: gl.constexpr = q_descs[0].block_type.shape[0]
        BN: gl.constexpr = k_descs[0].block_type.shape[0]
        STAGES: gl.constexpr = q_bufs[0].type.shape[0]
        for part in gl.static_range(2):
            bar = kv_ready.index(part)
            mbarrier.expect(bar, _nbytes(k_descs) + _nbytes(v_descs))
            row = kv_row + key0 + part * BN
            _copy(k_descs, k_bufs, part, bar, row, kv_col)
            _copy(v_descs, v_bufs, part, bar, row, v_col)
        for i in range(GROUP * n_blocks):
            stage = i % STAGES
            head = kv_head * GROUP + i // n_blocks
            row = batch * q_rows_b + head * q_rows_h + (first_block + i % n_blocks) * BM
            mbarrier.wait(empty.index(stage), ((i // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            if ROW_TMA:
                mbarrier.expect(bar, _nbytes(q_descs) + _nbytes(do_descs)
                                + _nbytes((lse_desc, delta_desc)))
                flat = (batch * heads + head) * sq + (first_block + i % n_blocks) * BM
                tma.async_copy_global_to_shared(lse_desc, [flat], bar, lse_bufs.index(stage))
                tma.async_copy_global_to_shared(delta_desc, [flat], bar,
                                                delta_bufs.index(stage))
            else:
                mbarrier.expect(bar, _nbytes(q_descs) + _nbytes(do_descs))
            _copy(q_descs, q_bufs, stage, bar, row, head * q_cols_h)
            _copy(do_descs, do_bufs, stage, bar, row, head * v_cols_h)

    @gluon.jit
    def _grid_place(blocks, HEAD_MAJOR: gl.constexpr):
        """(pair, rank) of this program in a grid of `blocks` programs a (batch, head)
        pair: the first HEAD_MAJOR quarters of each pair's ranks pair by pair, then the
        rest rank-major (every pair's next rank before any one's after)."""
        pid = gl.program_id(0)
        ranks = blocks * HEAD_MAJOR // 4
        pairs = gl.num_programs(0) // blocks
        if pid < pairs * ranks:
            pair = pid // gl.maximum(ranks, 1)
            rank = pid % gl.maximum(ranks, 1)
        else:
            pair = (pid - pairs * ranks) % pairs
            rank = ranks + (pid - pairs * ranks) // pairs
        return pair, rank

    @gluon.jit
    def _attention_dkdv(q_desc, q_rest, k_desc, k_rest, v_desc, v_rest, do_desc, do_rest,
                        lse_desc, delta_desc, dk_ptr, dv_ptr, lse_ptr, delta_ptr, sq, skv,
                        heads, qk_scale, scale, q_rows_b, q_rows_h, q_cols_h, kv_rows_b,
                        kv_rows_h, kv_cols_h, v_cols_h, stride_dk_b, stride_dk_h,
                        stride_dk_s, stride_dv_b, stride_dv_h, stride_dv_s,
                        GROUP: gl.constexpr, CAUSAL: gl.constexpr, ALIBI: gl.constexpr,
                        WINDOW: gl.constexpr, STAGES: gl.constexpr,
                        PAIRED_DOTS: gl.constexpr, HEAD_MAJOR: gl.constexpr,
                        SPLIT_QK: gl.constexpr, SPLIT_V: gl.constexpr,
                        ROW_TMA: gl.constexpr, num_warps: gl.constexpr):
        """One program: 2 x 64 keys of one (batch, kv head). The programs of a kv head's
        first HEAD_MAJOR quarters of key blocks run kv head by kv head, its first keys
        (causal: the most query blocks) first; then the rest keys-major: every kv head's
        next keys, and so on, so that (causal) the grid ends on short programs. Tiles'
        places and the parts of the head dims (*_rest, SPLIT_*), ALIBI and WINDOW as in
        attention_hopper's forward (a window's program streams the query blocks that see
        its keys). ROW_TMA: the producer streams each block's lse and delta (lse_desc,
        delta_desc: 1-D over [batch * heads * q_len]) with its q and d_out."""
        q_descs = _parts_of(q_desc, q_rest, SPLIT_QK)
        k_descs = _parts_of(k_desc, k_rest, SPLIT_QK)
        v_descs = _parts_of(v_desc, v_rest, SPLIT_V)
        do_descs = _parts_of(do_desc, do_rest, SPLIT_V)
        BM: gl.constexpr = q_desc.block_type.shape[0]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        kv_heads = heads // GROUP
        pair, rank = _grid_place(gl.cdiv(skv, 2 * BN), HEAD_MAJOR)  # pair: (batch, kv head)
        batch = pair // kv_heads
        kv_head = pair % kv_heads
        key0 = rank * (2 * BN)
        if CAUSAL:
            first_block = key0 // BM  # the query blocks at or after the first key
        else:
            first_block = 0
        last_block = gl.cdiv(sq, BM)
        if WINDOW:  # the last query that sees the program's last key: key + WINDOW - 1
            last_block = gl.minimum(last_block, gl.cdiv(key0 + 2 * BN - 1 + WINDOW, BM))
        n_blocks = last_block - first_block
        kv_row = batch * kv_rows_b + kv_head * kv_rows_h

        bufs = (_ring(q_descs, STAGES), _ring(do_descs, STAGES), _ring(k_descs, 2),
                _ring(v_descs, 2))
        bars = _barriers(STAGES)
        descs = (q_descs, k_descs, v_descs, do_descs)
        at = (batch, kv_head, key0, first_block, n_blocks, kv_row, kv_head * kv_cols_h,
              kv_head * v_cols_h)
        out_strides = ((stride_dk_b, stride_dk_h, stride_dk_s),
                       (stride_dv_b, stride_dv_h, stride_dv_s))
        q_place = (q_rows_b, q_rows_h, q_cols_h, v_cols_h)
        if ROW_TMA:
            rows_at = (_ring((lse_desc,), STAGES)[0], _ring((delta_desc,), STAGES)[0],
                       lse_desc, delta_desc)
        else:  # unused
            rows_at = (bufs[0][0], bufs[0][0], lse_desc, delta_desc)
        # (Constexprs keep their kind only written out in each partition's tuple.)
        gl.warp_specialize([
            (_kv_consume, (descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, at, sq, skv,
                           heads, qk_scale, scale, out_strides, rows_at, GROUP, CAUSAL, ALIBI,
                           WINDOW, PAIRED_DOTS, ROW_TMA, 0, num_warps)),
            (_kv_consume, (descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, at, sq, skv,
                           heads, qk_scale, scale, out_strides, rows_at, GROUP, CAUSAL, ALIBI,
                           WINDOW, PAIRED_DOTS, ROW_TMA, 1, num_warps)),
            (_kv_produce, (descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, at, sq, skv,
                           heads, qk_scale, scale, q_place, rows_at, GROUP, CAUSAL, ALIBI,
                           WINDOW, PAIRED_DOTS, ROW_TMA, 0, num_warps)),
        ], [num_warps, 1], [240, 24])

    @gluon.jit
    def _q_consume(descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, out_ptr, at, sq, skv,
                   heads, qk_scale, scale, strides, CAUSAL: gl.constexpr,
                   ALIBI: gl.constexpr, WINDOW: gl.constexpr, DELTA: gl.constexpr,
                   PART: gl.constexpr, num_warps: gl.constexpr):
        """Consumer PART of the dq kernel: its 64 query rows over every key block the
        producer streams; then its rows of dq. ALIBI: slope * (key - row0) on the scores,
        slope * (row - row0 + skv - sq) on lse (ALiBi's term, as the forward splits it).
        DELTA: the rows' delta is this kernel's to compute (from its d_out tile and out)
        and store, not to read."""
        q_descs, k_descs, v_descs, do_descs = descs
        q_bufs, do_bufs, k_bufs, v_bufs = bufs
        qdo_ready, ready, empty = bars
        batch, head, row0, n_blocks, first_key, q_row, q_col, do_col, kv_row, kv_col, v_col = at
        BM: gl.constexpr = q_descs[0].block_type.shape[0]
        BN: gl.constexpr = k_descs[0].block_type.shape[0]
        STAGES: gl.constexpr = k_bufs[0].type.shape[0]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN, 16])
        dtype: gl.constexpr = q_descs[0].dtype
        row0 = row0 + PART * BM
        q_smems = _slots(q_bufs, PART)
        do_smems = _slots(do_bufs, PART)
        s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
        dq = _accumulators(q_descs, num_warps)
        rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
        row_base = (batch * heads + head).to(gl.int64) * sq
        lse, delta = _row_terms(lse_ptr, delta_ptr, row_base, rows, sq, not DELTA)
        slope = 0.0
        if ALIBI:
            slope = _alibi_slope(head, ALIBI)
            lse = lse + slope * (rows - row0 + skv - sq).to(gl.float32)
        stride_b, stride_h, stride_s, stride_o_b, stride_o_h, stride_o_s = strides
        if DELTA:  # out's loads in flight while q and d_out's tiles arrive
            o_layout: gl.constexpr = _out_layout(num_warps)
            o_rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
            outs = _out_tiles(do_smems, out_ptr,
                              batch.to(gl.int64) * stride_o_b + head * stride_o_h, o_rows, sq,
                              stride_o_s)
        mbarrier.wait(qdo_ready.index(PART), 0)
        if DELTA:
            delta = _delta(do_smems, outs, delta_ptr, row_base, o_rows, sq,
                           gl.SliceLayout(1, s_layout))
        for j in range(n_blocks):
            stage = j % STAGES
            k_smems = _slots(k_bufs, stage)
            key0 = first_key + j * BN
            mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
            s_tok = _dot_t(q_smems, k_smems, s_zero)
            dp_tok = _dot_t(do_smems, _slots(v_bufs, stage), s_zero)
            s = warpgroup_mma_wait(len(do_smems), deps=(s_tok,))
            if ALIBI:
                keys = key0 - row0 + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
                s = s * qk_scale + (slope * keys.to(gl.float32))[None, :]
                p = gl.exp2(s - lse[:, None])
            else:
                p = gl.exp2(s * qk_scale - lse[:, None])
            if ((CAUSAL and key0 + BN > row0) or key0 + BN > skv
                    or (WINDOW and key0 + WINDOW <= row0 + BM - 1)):
                keys = key0 + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
                seen = keys[None, :] < skv
                if CAUSAL:
                    seen = seen & (keys[None, :] <= rows[:, None])
                if WINDOW:  # a query sees its WINDOW latest keys
                    seen = seen & (keys[None, :] > rows[:, None] - WINDOW)
                p = gl.where(seen, p, 0.0)
            dp = warpgroup_mma_wait(0, deps=(dp_tok,))
            ds_ops = _operands((p * (dp - delta[:, None])).to(dtype), dq)
            dq = warpgroup_mma_wait(0, deps=_dot_into(ds_ops, k_smems, dq) + ds_ops)[:len(dq)]
            mbarrier.arrive(empty.index(stage))

        base = batch.to(gl.int64) * stride_b + head * stride_h
        _store_parts(dq_ptr, dq, scale, row0, sq, base, stride_s, dtype)

    @gluon.jit
    def _q_produce(descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, out_ptr, at, sq, skv,
                   heads, qk_scale, scale, strides, CAUSAL: gl.constexpr,
                   ALIBI: gl.constexpr, WINDOW: gl.constexpr, DELTA: gl.constexpr,
                   PART: gl.constexpr, num_warps: gl.constexpr):
        """The dq kernel's producer warp: both consumers' q and d_out, then each key
        block's K and V into the ring once both consumers have released its stage."""
        q_descs, k_descs, v_descs, do_descs = descs
        q_bufs, do_bufs, k_bufs, v_bufs = bufs
        qdo_ready, ready, empty = bars
        batch, head, row0, n_blocks, first_key, q_row, q_col, do_col, kv_row, kv_col, v_col = at
        BM: gl.constexpr = q_descs[0].block_type.shape[0]
        BN: gl.constexpr = k_descs[0].block_type.shape[0]
        STAGES: gl.constexpr = k_bufs[0].type.shape[0]
        for part in gl.static_range(2):
            bar = qdo_ready.index(part)
            mbarrier.expect(bar, _nbytes(q_descs) + _nbytes(do_descs))
            row = q_row + part * BM
            _copy(q_descs, q_bufs, part, bar, row, q_col)
            _copy(do_descs, do_bufs, part, bar, row, do_col)
        for j in range(n_blocks):
            stage = j % STAGES
            mbarrier.wait(empty.index(stage), ((j // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, _nbytes(k_descs) + _nbytes(v_descs))
            row = kv_row + first_key + j * BN
            _copy(k_descs, k_bufs, stage, bar, row, kv_col)
            _copy(v_descs, v_bufs, stage, bar, row, v_col)

    @gluon.jit
    def _attention_dq(q_desc, q_rest, k_desc, k_rest, v_desc, v_rest, do_desc, do_rest,
                      dq_ptr, lse_ptr, delta_ptr, out_ptr, sq, skv, heads, qk_scale, scale,
                      q_rows_b, q_rows_h, q_cols_h, kv_rows_b, kv_rows_h, kv_cols_h,
                      v_cols_h, stride_q_b, stride_q_h, stride_q_s, stride_o_b, stride_o_h,
                      stride_o_s,
                      GROUP: gl.constexpr, CAUSAL: gl.constexpr, ALIBI: gl.constexpr,
                      WINDOW: gl.constexpr, STAGES: gl.constexpr, HEAD_MAJOR: gl.constexpr,
                      DELTA: gl.constexpr, SPLIT_QK: gl.constexpr, SPLIT_V: gl.constexpr,
                      num_warps: gl.constexpr):
        """One program: 2 x 64 query rows of one (batch, head), programs head by head
        for a head's first HEAD_MAJOR quarters of query blocks (then the rest blocks-major,
        as _grid_place orders them), the last query block (causal: the longest) first;
        WINDOW: the key blocks from its first row's window start."""
        q_descs = _parts_of(q_desc, q_rest, SPLIT_QK)
        k_descs = _parts_of(k_desc, k_rest, SPLIT_QK)
        v_descs = _parts_of(v_desc, v_rest, SPLIT_V)
        do_descs = _parts_of(do_desc, do_rest, SPLIT_V)
        BM: gl.constexpr = q_desc.block_type.shape[0]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        m_blocks = gl.cdiv(sq, 2 * BM)
        pair, rank = _grid_place(m_blocks, HEAD_MAJOR)  # pair: (batch, head)
        batch = pair // heads
        head = pair % heads
        kv_head = head // GROUP
        row0 = (m_blocks - 1 - rank) * (2 * BM)
        if CAUSAL:
            n_blocks = gl.cdiv(gl.minimum(row0 + 2 * BM, skv), BN)
        else:
            n_blocks = gl.cdiv(skv, BN)
        first_key = _first_key(row0, WINDOW, BN)
        n_blocks -= first_key // BN

        bufs = (_ring(q_descs, 2), _ring(do_descs, 2), _ring(k_descs, STAGES),
                _ring(v_descs, STAGES))
        bars = _barriers(STAGES)
        descs = (q_descs, k_descs, v_descs, do_descs)
        at = (batch, head, row0, n_blocks, first_key, batch * q_rows_b + head * q_rows_h + row0,
              head * q_cols_h, head * v_cols_h, batch * kv_rows_b + kv_head * kv_rows_h,
              kv_head * kv_cols_h, kv_head * v_cols_h)
        strides = (stride_q_b, stride_q_h, stride_q_s, stride_o_b, stride_o_h, stride_o_s)
        gl.warp_specialize([
            (_q_consume, (descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, out_ptr, at, sq, skv,
                          heads, qk_scale, scale, strides, CAUSAL, ALIBI, WINDOW, DELTA, 0,
                          num_warps)),
            (_q_consume, (descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, out_ptr, at, sq, skv,
                          heads, qk_scale, scale, strides, CAUSAL, ALIBI, WINDOW, DELTA, 1,
                          num_warps)),
            (_q_produce, (descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, out_ptr, at, sq, skv,
                          heads, qk_scale, scale, strides, CAUSAL, ALIBI, WINDOW, DELTA, 0,
                          num_warps)),
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
    "hopper_delta": {"BLOCK_M": BLOCK_M, "num_warps": 4},  # without dq: delta's rows
}


def delta_launch(out, d_out, layout):
    """_attention_delta's first launch (launch.Described's first()) for out and d_out
    (contiguous, [batch, heads, q_len] in the layout)."""
    batch, heads, _, sq = attention_hopper.places(out, out, layout)[:4]
    widths = attention_hopper.parts(out.shape[-1])
    grid = (triton.cdiv(sq, BLOCK_M), batch * heads)
    scalars = (sq, heads, *attention_hopper.strides(out, layout),
               *attention_hopper.strides(d_out, layout))  # fmt: skip
    meta = {"W0": widths[0], "W1": sum(widths[1:]), "ROWS": BLOCK_M, "num_warps": 4}
    return _attention_delta, grid, [], scalars, meta


def dkdv_rows(dim):
    """Query rows of the dk/dv kernel's blocks at q's head dim: 32 past 128 (MLA's 192:
    dk's and dv's accumulators, 192 + 128 columns, leave 64-row blocks' S^T and dP^T
    1.2 KB of spills; 32 rows, 36 bytes), else BLOCK_M."""
    return 32 if dim > 128 else BLOCK_M


def row_tma_fits(sq):
    """Whether a call of q_len sq can stream lse and delta by TMA: each head's rows start
    16-byte aligned in the flat [batch * heads * q_len] fp32 view."""
    return sq % 4 == 0


def row_descriptor(t, block):
    """A TMA descriptor over the fp32 [batch, heads, q_len] t (lse or delta) as one row,
    in blocks of `block` rows."""
    layout = gl.NVMMASharedLayout.get_default_for([block], gl.float32)
    return attention_hopper.TensorDescriptor.from_tensor(t.view(-1), [block], layout)


def dkdv_order(q, k, layout, causal, window):
    """The dk/dv grid's HEAD_MAJOR for a call: keys-major past half where causal with
    grouped heads and no window (the long programs the order was measured on), else head
    by head."""
    heads, kv_heads = attention_hopper.places(q, k, layout)[1:3]
    return HEAD_MAJOR if causal and heads != kv_heads and not window else 4


def backward(
    q, k, v, d_out, lse, delta, needs, *, layout, causal, scale,
    alibi=False, window=0, stages=STAGES, paired_dots=PAIRED_DOTS, rows_dkdv=None,
    keys_dq=BLOCK_N, head_major=None, dq_head_major=DQ_HEAD_MAJOR, launches=None, out=None,
    row_tma=ROW_TMA,
):  # fmt: skip
    """(dq, dk, dv), each None where needs says it is not wanted, of attention over q, k, v
    (contiguous, 16-byte aligned, bf16 or fp16, head dims in HEAD_DIMS) given d_out
    (out's shape and layout, contiguous), the forward's lse and delta = rowsum(d_out *
    out), both [batch, heads, q_len] fp32; and the compiled kernels by name (`fusegen
    inspect`). stages, paired_dots, rows_dkdv (dkdv_rows by default), keys_dq (the dq
    kernel's key blocks), head_major (the dk/dv kernel's program order; HEAD_MAJOR where
    causal GQA or MQA without a window, else 4) and dq_head_major (the dq kernel's): what
    benchmarks/experiments/attention_gluon_backward.py varies. launches: a dict its
    caller keeps for calls like this one (the same shapes but the tensors), where each
    kernel's launch.Described is kept (launched without triton's dispatch). out (the
    forward's): delta is not read but written before the dk/dv kernel reads it, by the
    dq kernel from its d_out tiles and out (DELTA_IN_DQ) or, without dq wanted, by
    _attention_delta in the dq kernel's arithmetic (dk's bits the same either way).
    row_tma: the dk/dv kernel's ROW_TMA where row_tma_fits."""
    launches = {} if launches is None else launches
    if head_major is None:
        head_major = dkdv_order(q, k, layout, causal, window)
    sources = (q, q, k, k, v, v, d_out, d_out)

    def first(kernel, programs, q_rows, kv_rows, outs, extra):
        """A kernel's first launch (launch.Described): programs(batch, heads, kv_heads,
        sq, skv) its grid, q_rows and kv_rows its descriptors' tiles, outs its outputs."""
        batch, heads, kv_heads, sq, skv, rows, q_place, kv_place = attention_hopper.places(
            q, k, layout
        )
        descs = attention_hopper.tile_args(q, k, v, d_out, rows, q_rows, kv_rows)[0]
        if kernel is _attention_dkdv:  # lse's and delta's, 1-D in blocks of q_rows
            descs += [row_descriptor(t, q_rows) for t in (lse, delta)]
        grid = (programs(batch, heads, kv_heads, sq, skv),)
        v_cols = v.shape[-1] if layout == "bshd" else 0  # a head's columns in v and d_out
        scalars = (sq, skv, heads, scale * LOG2E, scale, *q_place, *kv_place, v_cols)
        out_strides = [s for t in outs for s in attention_hopper.strides(t, layout)]
        meta = {"GROUP": heads // kv_heads, "CAUSAL": causal, "STAGES": stages, **extra}
        meta["ALIBI"] = 1 << (heads.bit_length() - 1) if alibi else 0
        meta["WINDOW"] = window or 0
        meta.update(attention_hopper.splits(q, v), num_warps=4)
        return kernel, grid, descs, (*scalars, *out_strides), meta

    def key_blocks(batch, heads, kv_heads, sq, skv):  # dk/dv: a program's 2 key blocks
        return triton.cdiv(skv, 2 * BLOCK_N) * batch * kv_heads

    def query_blocks(batch, heads, kv_heads, sq, skv):  # dq: a program's 2 query blocks
        return triton.cdiv(sq, 2 * BLOCK_M) * batch * heads

    d_q = d_k = d_v = None
    compiled = {}
    if out is not None and not needs[0] and (needs[1] or needs[2]):
        compiled["hopper_delta"] = launches.setdefault("delta", launch.Described())(
            (), (out, d_out, delta), lambda: delta_launch(out, d_out, layout)
        )
    if needs[0]:  # first: with out given, it writes the delta the dk/dv kernel reads
        d_q = torch.empty_like(q)
        o = d_q if out is None else out  # DELTA off: an unread pointer and strides
        kept = launches.setdefault("dq" if out is None else "dq, delta", launch.Described())
        compiled["hopper_dq"] = kept(
            sources, (d_q, lse, delta, o),
            lambda: first(
                _attention_dq, query_blocks, BLOCK_M, keys_dq, (d_q, o),
                {"HEAD_MAJOR": dq_head_major, "DELTA": out is not None},
            ),
        )  # fmt: skip
    if needs[1] or needs[2]:
        d_k, d_v = torch.empty_like(k), torch.empty_like(v)
        compiled["hopper_dkdv"] = launches.setdefault("dkdv", launch.Described())(
            (*sources, lse, delta), (d_k, d_v, lse, delta), lambda: first(
                _attention_dkdv, key_blocks, rows_dkdv or dkdv_rows(q.shape[-1]), BLOCK_N,
                (d_k, d_v),
                {"PAIRED_DOTS": paired_dots, "HEAD_MAJOR": head_major,
                 "ROW_TMA": row_tma and row_tma_fits(lse.shape[-1])},
            ),
        )  # fmt: skip
    return (d_q, d_k if needs[1] else None, d_v if needs[2] else None), compiled
