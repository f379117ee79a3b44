"""Attention's forward on Hopper (compute capability 9.0), written in Gluon, Triton's
lower-level language: the schedule Triton's compiler does not arrange from `tl` code.

Each program takes 128 query rows of one (batch, head) as two tiles of 64, one per
consumer warpgroup (4 warps); a one-warp producer streams the key and value blocks (128
keys) through two shared-memory stages with TMA. A consumer issues block j's QK and block
j - 1's PV as asynchronous wgmma and runs block j's softmax while PV is in flight; the two
consumers drift apart, so one's softmax runs while the other's dots use the tensor cores
(FA3's ping-pong, left to the warp schedulers). Programs are ordered head by head, last
query block first, so that those running at once share a few heads' keys in L2.

forward's `persistent` runs one program an SM over the tiles in turn, the query tiles
double-buffered and out stored through tiles of its own, so that a tile's loads run
under the one before's epilogue: the experiments' form of it ran head dim 64's no-mask
row at 0.98x cuDNN, where this grid runs 0.76x (16 x 16 x 1024; RESULTS.md, 2026-12-05).
Not yet measured in this kernel, so no module launches it (`attention-persistent` in
benchmarks/run_suite.sh measures it against the grid of every tile).

Measured against cuDNN and the `tl` kernels on an H200 by
benchmarks/experiments/attention_gluon_hopper.py (the variants that led here).

ALiBi adds slope * (key - the consumer's first row) to the scores and takes each row's
own part off its lse (1.68x compiled FlexAttention, causal 4 x 32 x 4096; the `tl`
kernel: 1.40x); a sliding window starts each program's stream at its first row's window
start (1.41x; the `tl` kernel: 1.06x).

A head dim that is not a power of two is two tiles (parts: 96 = 64 + 32, MLA's 192 =
128 + 64), their dots chained: TMA and Gluon tiles are powers of two, and padding 96 to
128 would cost a third more dots. At 96 and MLA's 192/128 it ran 1.15x and 1.09x cuDNN.

What it takes (Attention.hopper_forward_fits checks): q, k, v and out contiguous in the
module's layout (a [rows, dim] view of each), 16-byte aligned, bf16 or fp16, (q's head
dim, v's) in HEAD_DIMS (modules take 128, 96, 192/128 and, on the persistent grid, 64,
where it was measured faster than the `tl` forward: runtime/attention.py's hopper_grid),
no key lengths, and, when causal, as many queries as keys. It writes the same out and
log-sum-exp (natural log) as the `tl` forward, rounded its own way. Without Gluon (an
older Triton) AVAILABLE is False and the `tl` kernels run.
"""

import torch
import triton

from . import launch
from .gluon_hopper import AVAILABLE

if AVAILABLE:  # else (a Triton without Gluon) the `tl` kernels run
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

LOG2E = 1.4426950408889634
# (q and k's head dim, v's) the kernel is written for: v's parts of the dim are q's first
# ones, so that out goes through q's tiles, and the tiles fit an SM's shared memory.
HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 128))

# A consumer's query rows, the keys of a block, the ring's stages (the kernels read them
# off their descriptors and buffers).
BLOCK_M, BLOCK_N, STAGES = 64, 128, 2

if AVAILABLE:
    # fmt: off
    @gluon.jit
    def _probabilities(s, m_i, l_i, key0, row0, skv, qk_scale, slope, CAUSAL: gl.constexpr,
                       ALIBI: gl.constexpr, WINDOW: gl.constexpr, s_layout: gl.constexpr):
        """One key block into the online softmax (base 2): probabilities, the new max
        and sum, and the factor the accumulator is rescaled by. Only a block that crosses
        the diagonal, the last key or (WINDOW) a row's window start is masked. ALIBI: the
        scores have slope * (key - row0) added, one FFMA each; slope * (row - row0 + skv -
        sq), a row's own, comes off its lse (_consume), since a softmax's rows do not
        change by a constant."""
        BM: gl.constexpr = s.type.shape[0]
        BN: gl.constexpr = s.type.shape[1]
        # A window's first block may hide every key from a row: a finite mask then gives it
        # probabilities that the next block's rescale (exp2 of about -2e29) zeroes. A power
        # of two: times qk_scale it is exact, so p's fused multiply-add gives exp2(0), where
        # -1e30 left the product's rounding error (exp2(+8e20) = inf at head dim 64 and 192).
        MASKED: gl.constexpr = -1.2676506002282294e30 if WINDOW else -float("inf")  # -2**100
        if ((CAUSAL and key0 + BN > row0) or key0 + BN > skv
                or (WINDOW and key0 + WINDOW <= row0 + BM - 1)):
            rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
            keys = key0 + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
            seen = keys[None, :] < skv
            if CAUSAL:
                seen = seen & (keys[None, :] <= rows[:, None])
            if WINDOW:  # a row sees its WINDOW most recent keys, its own included
                seen = seen & (keys[None, :] > rows[:, None] - WINDOW)
            s = gl.where(seen, s, MASKED)
        if ALIBI:
            keys = key0 - row0 + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
            s = s * qk_scale + (slope * keys.to(gl.float32))[None, :]
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            p = gl.exp2(s - m_new[:, None])
        else:
            m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
            p = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        return p, m_new, l_i * alpha + gl.sum(p, axis=1), alpha

    @gluon.jit
    def _alibi_slope(head, BELOW: gl.constexpr):
        """ALiBi's slope of query head `head` in base 2, as the `tl` kernels compute it:
        2**(-8 (head + 1) / BELOW) for the first BELOW heads (a power of two, the heads'
        or the one below them), then BLOOM's every other one of twice BELOW."""
        if head < BELOW:
            slope = gl.exp2(-8.0 * (head + 1) / BELOW)
        else:
            slope = gl.exp2(-4.0 * (2 * (head - BELOW) + 1) / BELOW)
        return slope * 1.4426950408889634

    @gluon.jit
    def _first_key(row0, WINDOW: gl.constexpr, BLOCK_N: gl.constexpr):
        """The first key of the first block a program of query rows from row0 on streams:
        0, or (WINDOW) the block of row0's window start."""
        first = 0
        if WINDOW:
            first = gl.maximum(row0 - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
        return first

    @gluon.constexpr_function
    def _nbytes(descs):
        """The bytes of one tile of each descriptor (what a barrier expects)."""
        return sum(d.block_type.nbytes for d in descs)

    @gluon.jit
    def _parts_of(first, rest, SPLIT: gl.constexpr):
        """A tensor's descriptors as a tuple, one a part of its head dim: (first, rest)
        where SPLIT, else (first,). (Triton 3.6's launcher takes no descriptors inside
        tuples: kernels take the parts as arguments of their own.)"""
        if SPLIT:
            parts = (first, rest)
        else:
            parts = (first,)
        return parts

    @gluon.jit
    def _ring(descs, depth: gl.constexpr):
        """Shared memory for `depth` tiles of each part of the head dim, a tuple."""
        d = descs[0]
        bufs = (gl.allocate_shared_memory(d.dtype, [depth] + d.block_type.shape, d.layout),)
        if len(descs) == 2:
            d = descs[1]
            bufs = bufs + (gl.allocate_shared_memory(d.dtype, [depth] + d.block_type.shape,
                                                     d.layout),)
        return bufs

    @gluon.jit
    def _copy(descs, bufs, index, bar, row, col):
        """Every part's tile at [row, col] into bufs' slot `index`, arriving on bar."""
        for i in gl.static_range(len(descs)):
            tma.async_copy_global_to_shared(descs[i], [row, col], bar, bufs[i].index(index))

    @gluon.jit
    def _load(descs, bufs, index, bar, row, col):
        """_copy on a barrier that expects these tiles alone."""
        mbarrier.expect(bar, _nbytes(descs))
        _copy(descs, bufs, index, bar, row, col)

    @gluon.jit
    def _slots(bufs, index):
        """Slot `index` of each part's ring."""
        slots = (bufs[0].index(index),)
        if len(bufs) == 2:
            slots = slots + (bufs[1].index(index),)
        return slots

    @gluon.jit
    def _dot_t(a_smems, b_smems, zero):
        """sum over the parts of a_i b_i^T (shared memory both), as chained asynchronous
        wgmma, one group a part."""
        acc = warpgroup_mma(a_smems[0], b_smems[0].permute((1, 0)), zero, use_acc=False,
                            is_async=True)
        for i in gl.static_range(1, len(a_smems)):
            acc = warpgroup_mma(a_smems[i], b_smems[i].permute((1, 0)), acc, is_async=True)
        return acc

    @gluon.jit
    def _accumulators(descs, num_warps: gl.constexpr):
        """fp32 zeros of each part's tile (one a part of the head dim), in wgmma's
        accumulator layout."""
        ROWS: gl.constexpr = descs[0].block_type.shape[0]
        W0: gl.constexpr = descs[0].block_type.shape[1]
        layout0: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, W0, 16])
        accs = (gl.zeros([ROWS, W0], gl.float32, layout=layout0),)
        if len(descs) == 2:
            W1: gl.constexpr = descs[1].block_type.shape[1]
            layout1: gl.constexpr = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, W1, 16])
            accs = accs + (gl.zeros([ROWS, W1], gl.float32, layout=layout1),)
        return accs

    @gluon.jit
    def _operands(a, accs):
        """a (registers) in the A-operand layout of each accumulator's dot."""
        layout0: gl.constexpr = gl.DotOperandLayout(operand_index=0,
                                                    parent=accs[0].type.layout, k_width=2)
        ops = (gl.convert_layout(a, layout0),)
        if len(accs) == 2:
            layout1: gl.constexpr = gl.DotOperandLayout(operand_index=0,
                                                        parent=accs[1].type.layout, k_width=2)
            ops = ops + (gl.convert_layout(a, layout1),)
        return ops

    @gluon.jit
    def _dot_into(ops, b_smems, accs):
        """accs[i] += ops[i] b_i as asynchronous wgmma, one group a part: the tokens."""
        toks = (warpgroup_mma(ops[0], b_smems[0], accs[0], is_async=True),)
        if len(accs) == 2:
            toks = toks + (warpgroup_mma(ops[1], b_smems[1], accs[1], is_async=True),)
        return toks

    @gluon.jit
    def _rescaled(accs, alpha):
        """Each accumulator's rows times alpha (one factor a row)."""
        accs0 = accs[0] * gl.convert_layout(alpha, gl.SliceLayout(1, accs[0].type.layout))[:, None]
        scaled = (accs0,)
        if len(accs) == 2:
            layout1: gl.constexpr = gl.SliceLayout(1, accs[1].type.layout)
            scaled = scaled + (accs[1] * gl.convert_layout(alpha, layout1)[:, None],)
        return scaled

    @gluon.jit
    def _store_rows(ptr, tile, row0, n_rows, base, stride_s, col0):
        """A [rows, width] tile at rows row0 on (those before n_rows) and columns col0 on
        of a [seq, dim] slice at base."""
        ROWS: gl.constexpr = tile.type.shape[0]
        WIDTH: gl.constexpr = tile.type.shape[1]
        layout: gl.constexpr = tile.type.layout
        rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        cols = col0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
        offsets = base + rows.to(gl.int64)[:, None] * stride_s + cols[None, :]
        gl.store(ptr + offsets, tile, mask=(rows < n_rows)[:, None])

    @gluon.jit
    def _place(t, shape, sq, skv, GROUP: gl.constexpr, CAUSAL: gl.constexpr,
               WINDOW: gl.constexpr, LONGEST_FIRST: gl.constexpr, descs):
        """Tile t's place (_consume_tile's `place`) and its number of key blocks. A tile
        is 2 * BLOCK_M query rows of one (batch, head), for shape's (query blocks a head,
        (batch, head) pairs, heads, and the [rows, dim] views' places of _attention_forward):
        head by head, each head's last query block first, so that the programs running at
        once share a few heads' keys in L2; LONGEST_FIRST: every head's last block, then
        every head's one before, and so on (causal: the longest tiles first)."""
        m_blocks, pairs, heads, q_rows_b, q_rows_h, q_cols_h = shape[:6]
        kv_rows_b, kv_rows_h, kv_cols_h, v_cols_h = shape[6:]
        BLOCK_M: gl.constexpr = descs[0][0].block_type.shape[0]
        BLOCK_N: gl.constexpr = descs[1][0].block_type.shape[0]
        if LONGEST_FIRST:
            row0 = (m_blocks - 1 - t // pairs) * (2 * BLOCK_M)
            pair = t % pairs
        else:
            row0 = (m_blocks - 1 - t % m_blocks) * (2 * BLOCK_M)  # last query block first
            pair = t // m_blocks
        batch = pair // heads
        head = pair % heads
        kv_head = head // GROUP
        key0 = _first_key(row0, WINDOW, BLOCK_N)
        if CAUSAL:
            n_blocks = gl.cdiv(gl.minimum(row0 + 2 * BLOCK_M, skv), BLOCK_N) - key0 // BLOCK_N
        else:
            n_blocks = gl.cdiv(skv, BLOCK_N)
        q_row = batch * q_rows_b + head * q_rows_h + row0
        kv_row = batch * kv_rows_b + kv_head * kv_rows_h + key0
        place = (batch, head, heads, row0, q_row, head * q_cols_h, kv_row, kv_head * kv_cols_h,
                 kv_head * v_cols_h, head * v_cols_h)
        return place, n_blocks

    @gluon.jit
    def _consume(descs, bufs, bars, out_ptr, lse_ptr, work, sq, skv, qk_scale,
                 stride_o_b, stride_o_h, stride_o_s,
                 CAUSAL: gl.constexpr, ALIBI: gl.constexpr, WINDOW: gl.constexpr,
                 GROUP: gl.constexpr, PERSISTENT: gl.constexpr, LONGEST_FIRST: gl.constexpr,
                 PART: gl.constexpr, num_warps: gl.constexpr):
        """Consumer PART: its 64 query rows of the program's tile (work: its place and
        key blocks) or, PERSISTENT, of each of its tiles in turn (work: the shape _place
        reads), their query tiles double-buffered and the ring's stages taken on across
        tiles."""
        if PERSISTENT:
            ring = 0
            count = 0
            for t in range(gl.program_id(0), work[0] * work[1], gl.num_programs(0)):
                place, n_blocks = _place(t, work, sq, skv, GROUP, CAUSAL, WINDOW,
                                         LONGEST_FIRST, descs)
                _consume_tile(descs, bufs, bars, out_ptr, lse_ptr, place, sq, skv, n_blocks,
                              qk_scale, stride_o_b, stride_o_h, stride_o_s, ring,
                              PART * 2 + count % 2, (count // 2) & 1, CAUSAL, ALIBI, WINDOW,
                              PERSISTENT, PART, num_warps)
                ring += n_blocks
                count += 1
            tma.store_wait(pendings=0)
        else:
            place, n_blocks = work
            _consume_tile(descs, bufs, bars, out_ptr, lse_ptr, place, sq, skv, n_blocks,
                          qk_scale, stride_o_b, stride_o_h, stride_o_s, 0, PART, 0, CAUSAL,
                          ALIBI, WINDOW, PERSISTENT, PART, num_warps)

    @gluon.jit
    def _consume_tile(descs, bufs, bars, out_ptr, lse_ptr, place, sq, skv, n_blocks, qk_scale,
                      stride_o_b, stride_o_h, stride_o_s, ring, q_slot, q_phase,
                      CAUSAL: gl.constexpr, ALIBI: gl.constexpr, WINDOW: gl.constexpr,
                      PERSISTENT: gl.constexpr, PART: gl.constexpr, num_warps: gl.constexpr):
        """Consumer PART's 64 query rows of one tile (in q's slot q_slot) over every key
        block the producer streams (the ring's blocks from `ring` on), then its rows of out
        and lse. v's parts of the head dim are q's first ones (128 of 192, or 64 + 32 of
        96): out goes through q's tiles, or (PERSISTENT: the producer reloads q's slot
        for a later tile) through out's own, whose store the next tile's waits for."""
        q_descs, k_descs, v_descs, o_descs = descs
        q_bufs = bufs[0]
        k_bufs = bufs[1]
        v_bufs = bufs[2]
        q_ready = bars[0]
        k_ready = bars[1]
        v_ready = bars[2]
        k_empty = bars[3]
        v_empty = bars[4]
        batch, head, heads, row0, q_row, q_col, kv_row, kv_col, v_col, o_col = place
        BLOCK_M: gl.constexpr = q_descs[0].block_type.shape[0]
        BLOCK_N: gl.constexpr = k_descs[0].block_type.shape[0]
        STAGES: gl.constexpr = k_bufs[0].type.shape[0]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
        dtype: gl.constexpr = q_descs[0].dtype
        key0 = _first_key(row0, WINDOW, BLOCK_N)  # the producer's first block
        row0 = row0 + PART * BLOCK_M
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = _accumulators(o_descs, num_warps)  # one a part of v's head dim
        slope = 0.0
        if ALIBI:
            slope = _alibi_slope(head, ALIBI)
        mbarrier.wait(q_ready.index(q_slot), q_phase)

        # Block 0's probabilities: the loop runs one block ahead of its PV.
        first = ring % STAGES
        mbarrier.wait(k_ready.index(first), (ring // STAGES) & 1)
        q_smems = _slots(q_bufs, q_slot)
        s = _dot_t(q_smems, _slots(k_bufs, first), s_zero)
        s = warpgroup_mma_wait(0, deps=(s,))
        mbarrier.arrive(k_empty.index(first))
        p, m_i, l_i, alpha = _probabilities(s, m_i, l_i, key0, row0, skv, qk_scale, slope,
                                            CAUSAL, ALIBI, WINDOW, s_layout)
        p_ops = _operands(p.to(dtype), acc)
        for j in range(1, n_blocks):
            stage = (ring + j) % STAGES
            prev = (ring + j - 1) % STAGES
            mbarrier.wait(k_ready.index(stage), ((ring + j) // STAGES) & 1)
            s_tok = _dot_t(q_smems, _slots(k_bufs, stage), s_zero)  # S = Q K^T
            mbarrier.wait(v_ready.index(prev), ((ring + j - 1) // STAGES) & 1)
            pv_toks = _dot_into(p_ops, _slots(v_bufs, prev), acc)  # O += P V, a block behind
            s = warpgroup_mma_wait(len(acc), deps=(s_tok,))
            mbarrier.arrive(k_empty.index(stage))
            p_next, m_i, l_i, alpha = _probabilities(s, m_i, l_i, key0 + j * BLOCK_N, row0,
                                                     skv, qk_scale, slope, CAUSAL, ALIBI,
                                                     WINDOW, s_layout)
            acc = warpgroup_mma_wait(0, deps=pv_toks + p_ops)[:len(acc)]
            mbarrier.arrive(v_empty.index(prev))
            acc = _rescaled(acc, alpha)
            p_ops = _operands(p_next.to(dtype), acc)
        if PERSISTENT:  # every QK of the tile is issued and waited for
            mbarrier.arrive(bars[5].index(q_slot))
        last = (ring + n_blocks - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((ring + n_blocks - 1) // STAGES) & 1)
        pv_toks = _dot_into(p_ops, _slots(v_bufs, last), acc)
        acc = warpgroup_mma_wait(0, deps=pv_toks + p_ops)[:len(acc)]
        mbarrier.arrive(v_empty.index(last))

        if PERSISTENT:
            o_smems = _slots(bufs[3], PART)
        else:
            o_smems = q_smems
        _store_out(acc[0], l_i, o_smems[0], o_descs[0], out_ptr, place, sq,
                   stride_o_b, stride_o_h, stride_o_s, 0, PERSISTENT, PART)
        if len(acc) == 2:
            _store_out(acc[1], l_i, o_smems[1], o_descs[1], out_ptr, place, sq,
                       stride_o_b, stride_o_h, stride_o_s, acc[0].type.shape[1], PERSISTENT,
                       PART)
        lse_rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        lse = m_i + gl.log2(l_i)
        if ALIBI:
            lse -= slope * (lse_rows - row0 + skv - sq).to(gl.float32)
        lse = lse * 0.6931471805599453  # natural log
        gl.store(lse_ptr + (batch * heads + head).to(gl.int64) * sq + lse_rows, lse,
                 mask=lse_rows < sq)

    @gluon.jit
    def _store_out(acc, l_i, smem, o_desc, out_ptr, place, sq, stride_o_b, stride_o_h,
                   stride_o_s, col0: gl.constexpr, PERSISTENT: gl.constexpr,
                   PART: gl.constexpr):
        """One part of the head dim of consumer PART's out rows (acc / l), columns col0
        on. PERSISTENT: smem is out's own, whose last store is waited for before it is
        written, and this one's by the next tile (or the consumer's end)."""
        batch, head, heads, row0, q_row, q_col, kv_row, kv_col, v_col, o_col = place
        BLOCK_M: gl.constexpr = acc.type.shape[0]
        o_layout: gl.constexpr = acc.type.layout
        row0 = row0 + PART * BLOCK_M
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
        out = (acc / l_o[:, None]).to(o_desc.dtype)
        if row0 + BLOCK_M <= sq:
            # A whole tile: through shared memory (the query tile's, every QK being
            # done, or out's own) and a TMA store.
            if PERSISTENT:
                tma.store_wait(pendings=0)
            smem.store(out)
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [q_row + PART * BLOCK_M, o_col], smem)
            if not PERSISTENT:
                tma.store_wait(pendings=0)
        else:
            # The last tile's rows past the queries are computed on what the view holds
            # there (another head's or batch entry's rows), and not stored.
            base = batch.to(gl.int64) * stride_o_b + head * stride_o_h
            _store_rows(out_ptr, out, row0, sq, base, stride_o_s, col0)

    @gluon.jit
    def _produce(descs, bufs, bars, out_ptr, lse_ptr, work, sq, skv, qk_scale,
                 stride_o_b, stride_o_h, stride_o_s,
                 CAUSAL: gl.constexpr, ALIBI: gl.constexpr, WINDOW: gl.constexpr,
                 GROUP: gl.constexpr, PERSISTENT: gl.constexpr, LONGEST_FIRST: gl.constexpr,
                 PART: gl.constexpr, num_warps: gl.constexpr):
        """The producer warp, for the program's tile or (PERSISTENT) each of its tiles in
        turn, as _consume takes them."""
        if PERSISTENT:
            ring = 0
            count = 0
            for t in range(gl.program_id(0), work[0] * work[1], gl.num_programs(0)):
                place, n_blocks = _place(t, work, sq, skv, GROUP, CAUSAL, WINDOW,
                                         LONGEST_FIRST, descs)
                _produce_tile(descs, bufs, bars, place, n_blocks, ring, count, PERSISTENT)
                ring += n_blocks
                count += 1
        else:
            place, n_blocks = work
            _produce_tile(descs, bufs, bars, place, n_blocks, 0, 0, PERSISTENT)

    @gluon.jit
    def _produce_tile(descs, bufs, bars, place, n_blocks, ring, count, PERSISTENT: gl.constexpr):
        """A tile's two query tiles (PERSISTENT: into the slots of the program's tile
        `count`, once their consumers have released them), then each key block's K and V
        into the ring (from its block `ring` on), each into its stage once both consumers
        have released it (a fresh mbarrier counts as having completed the phase before 0:
        the first pass does not wait)."""
        q_descs, k_descs, v_descs, o_descs = descs
        q_bufs = bufs[0]
        k_bufs = bufs[1]
        v_bufs = bufs[2]
        q_ready = bars[0]
        k_ready = bars[1]
        v_ready = bars[2]
        k_empty = bars[3]
        v_empty = bars[4]
        batch, head, heads, row0, q_row, q_col, kv_row, kv_col, v_col, o_col = place
        BLOCK_M: gl.constexpr = q_descs[0].block_type.shape[0]
        BLOCK_N: gl.constexpr = k_descs[0].block_type.shape[0]
        STAGES: gl.constexpr = k_bufs[0].type.shape[0]
        for part in gl.static_range(2):
            if PERSISTENT:
                slot = part * 2 + count % 2
                mbarrier.wait(bars[5].index(slot), ((count // 2) & 1) ^ 1)
                _load(q_descs, q_bufs, slot, q_ready.index(slot), q_row + part * BLOCK_M,
                      q_col)
            else:
                _load(q_descs, q_bufs, part, q_ready.index(part), q_row + part * BLOCK_M,
                      q_col)
        for j in range(n_blocks):
            stage = (ring + j) % STAGES
            empty_phase = (((ring + j) // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(stage), empty_phase)
            _load(k_descs, k_bufs, stage, k_ready.index(stage), kv_row + j * BLOCK_N, kv_col)
            mbarrier.wait(v_empty.index(stage), empty_phase)
            _load(v_descs, v_bufs, stage, v_ready.index(stage), kv_row + j * BLOCK_N, v_col)

    @gluon.jit
    def _attention_forward(q_desc, q_rest, k_desc, k_rest, v_desc, v_rest, o_desc, o_rest,
                           out_ptr, lse_ptr, sq, skv, heads, qk_scale,
                           q_rows_b, q_rows_h, q_cols_h, kv_rows_b, kv_rows_h, kv_cols_h,
                           v_cols_h, stride_o_b, stride_o_h, stride_o_s, pairs,
                           GROUP: gl.constexpr, CAUSAL: gl.constexpr, ALIBI: gl.constexpr,
                           WINDOW: gl.constexpr, SPLIT_QK: gl.constexpr,
                           SPLIT_V: gl.constexpr, PERSISTENT: gl.constexpr,
                           LONGEST_FIRST: gl.constexpr, REGISTERS: gl.constexpr,
                           num_warps: gl.constexpr):
        """One program: 128 query rows of one (batch, head). A tile's place in the [rows,
        dim] views: row batch * rows_b + head * rows_h + position, column head * cols_h
        (bshd: rows_b = seq, rows_h = 0, cols_h = dim; bhsd: rows_b = heads * seq, rows_h
        = seq, cols_h = 0; v's and out's cols_h: v's dim or 0), k and v by kv head =
        head // GROUP. A head dim in two tiles (SPLIT_QK for q and k, SPLIT_V for v and
        out) has the second's descriptor in *_rest (else the first again, unread). ALIBI:
        0, or ALiBi's scores with _alibi_slope's BELOW. WINDOW: 0, or (causal) each row
        sees its WINDOW most recent keys, and a program streams the blocks from its first
        row's window start (_first_key) on. PERSISTENT: a program an SM, over the tiles
        from its id on in steps of the grid (in _place's order, LONGEST_FIRST its other
        one), so that a tile's loads run under the one before's epilogue. REGISTERS: the
        second consumer's registers a thread (setmaxnreg; the producer's: 24)."""
        q_descs = _parts_of(q_desc, q_rest, SPLIT_QK)
        k_descs = _parts_of(k_desc, k_rest, SPLIT_QK)
        v_descs = _parts_of(v_desc, v_rest, SPLIT_V)
        o_descs = _parts_of(o_desc, o_rest, SPLIT_V)
        BLOCK_M: gl.constexpr = q_descs[0].block_type.shape[0]
        STAGES: gl.constexpr = 2
        descs = (q_descs, k_descs, v_descs, o_descs)
        shape = (gl.cdiv(sq, 2 * BLOCK_M), pairs, heads, q_rows_b, q_rows_h, q_cols_h,
                 kv_rows_b, kv_rows_h, kv_cols_h, v_cols_h)
        if PERSISTENT:  # a query tile's two slots, out's own tiles (_consume_tile)
            q_bufs = _ring(q_descs, 4)
        else:
            q_bufs = _ring(q_descs, 2)
        k_bufs = _ring(k_descs, STAGES)
        v_bufs = _ring(v_descs, STAGES)
        Q_SLOTS: gl.constexpr = q_bufs[0].type.shape[0]
        q_ready = gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(Q_SLOTS):
            mbarrier.init(q_ready.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)
            mbarrier.init(v_empty.index(i), count=2)
        if PERSISTENT:
            q_empty = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(4):
                mbarrier.init(q_empty.index(i), count=1)
            bufs = (q_bufs, k_bufs, v_bufs, _ring(o_descs, 2))
            bars = (q_ready, k_ready, v_ready, k_empty, v_empty, q_empty)
            work = shape
        else:
            bufs = (q_bufs, k_bufs, v_bufs)
            bars = (q_ready, k_ready, v_ready, k_empty, v_empty)
            work = _place(gl.program_id(0), shape, sq, skv, GROUP, CAUSAL, WINDOW, False, descs)
        # (Constexprs keep their kind only written out in each partition's tuple.)
        gl.warp_specialize([
            (_consume, (descs, bufs, bars, out_ptr, lse_ptr, work, sq, skv, qk_scale,
                        stride_o_b, stride_o_h, stride_o_s, CAUSAL, ALIBI, WINDOW, GROUP,
                        PERSISTENT, LONGEST_FIRST, 0, num_warps)),
            (_consume, (descs, bufs, bars, out_ptr, lse_ptr, work, sq, skv, qk_scale,
                        stride_o_b, stride_o_h, stride_o_s, CAUSAL, ALIBI, WINDOW, GROUP,
                        PERSISTENT, LONGEST_FIRST, 1, num_warps)),
            (_produce, (descs, bufs, bars, out_ptr, lse_ptr, work, sq, skv, qk_scale,
                        stride_o_b, stride_o_h, stride_o_s, CAUSAL, ALIBI, WINDOW, GROUP,
                        PERSISTENT, LONGEST_FIRST, 0, num_warps)),
        ], [num_warps, 1], [REGISTERS, 24])
    # fmt: on


def parts(dim):
    """A head dim's parts, a tile each: the dim where it is a power of two, else the
    largest power of two under it and the rest (96 = 64 + 32, 192 = 128 + 64): TMA and
    Gluon tiles are powers of two, and padding to the next one would cost a third more
    dots at 96."""
    high = 1 << (dim.bit_length() - 1)
    return (dim,) if high == dim else (high, dim - high)


def _descriptor(t, rows, block_rows, col=0, width=None):
    """A TMA descriptor over t (bf16 or fp16) viewed as [rows, t.numel() // rows], tiles
    of block_rows rows and `width` columns (one head's dim) from column col of a head."""
    width = width or t.shape[-1]
    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    view = t.view(rows, t.numel() // rows)[:, col:]
    layout = gl.NVMMASharedLayout.get_default_for([block_rows, width], dtype)
    return TensorDescriptor.from_tensor(view, [block_rows, width], layout)


def _descriptors(t, rows, block_rows):
    """One descriptor a part of t's head dim (parts), as a tuple."""
    widths = parts(t.shape[-1])
    cols = (0, *widths[:-1])
    return tuple(_descriptor(t, rows, block_rows, c, w) for c, w in zip(cols, widths, strict=True))


def tile_args(q, k, v, o, rows, q_rows, kv_rows):
    """The kernels' descriptor arguments and split constexprs: for q, k, v and o (out or
    d_out) viewed as [rows[0] or rows[1], ...] in tiles of q_rows or kv_rows rows, each
    tensor's first and last part of the head dim (the first twice where it is one tile:
    Triton 3.6's launcher takes no descriptors inside tuples), and SPLIT_QK, SPLIT_V."""
    parts = [
        _descriptors(q, rows[0], q_rows),
        _descriptors(k, rows[1], kv_rows),
        _descriptors(v, rows[1], kv_rows),
        _descriptors(o, rows[0], q_rows),
    ]
    return [d for tiles in parts for d in (tiles[0], tiles[-1])], splits(q, v)


def splits(q, v):
    """The kernels' SPLIT_QK and SPLIT_V: whether q's and v's head dims are two tiles."""
    return {"SPLIT_QK": len(parts(q.shape[-1])) == 2, "SPLIT_V": len(parts(v.shape[-1])) == 2}


def places(q, k, layout):
    """(batch, heads, kv_heads, sq, skv, the row counts of q's and k's [rows, dim] views,
    q's and k's tile places in them: rows a batch entry, rows a head, columns a head).
    bshd views are [batch * seq, heads * dim], bhsd ones [batch * heads * seq, dim]."""
    if layout == "bshd":
        batch, sq, heads, dim = q.shape
        skv, kv_heads = k.shape[1], k.shape[2]
        rows = (batch * sq, batch * skv)
        return batch, heads, kv_heads, sq, skv, rows, (sq, 0, dim), (skv, 0, dim)
    batch, heads, sq, dim = q.shape
    kv_heads, skv = k.shape[1], k.shape[2]
    rows = (batch * heads * sq, batch * kv_heads * skv)
    return batch, heads, kv_heads, sq, skv, rows, (heads * sq, sq, 0), (kv_heads * skv, skv, 0)


def strides(t, layout):
    """t's strides along (batch, head, position)."""
    return tuple(t.stride(axis) for axis in ((0, 2, 1) if layout == "bshd" else (0, 1, 2)))


# What `fusegen inspect` shows as the kernel's config: query rows and keys a program's
# step, warps (two consumers of 4 and the producer's 1), stages.
CONFIG = {"BLOCK_M": 2 * BLOCK_M, "BLOCK_N": BLOCK_N, "num_warps": 9, "num_stages": STAGES}


def forward(
    q,
    k,
    v,
    out,
    lse,
    *,
    layout,
    causal,
    scale,
    alibi=False,
    window=0,
    block_n=BLOCK_N,
    registers=(240, None),
    persistent=False,
    longest_first=False,
    launches=None,
):
    """out and lse of attention over q, k, v: [batch, seq, heads, dim] ("bshd") or [batch,
    heads, seq, dim] ("bhsd"), contiguous, 16-byte aligned, bf16 or fp16, (q's dim, v's)
    in HEAD_DIMS; out likewise; lse [batch, heads, q_len] fp32; alibi: scores plus ALiBi's
    slope * (key - query position - (k_len - q_len)); window (causal): a query sees its
    `window` most recent keys. block_n, registers (a consumer's registers a thread, and
    the kernel's most, ptxas's maxnreg, or None): knobs of the experiments' (at head dim
    64, 64-key blocks in 120 and 112 registers compile without spills in 49 KB of shared
    memory: two programs an SM, not one). persistent: one program an SM, each over tiles
    in turn (longest_first: in the order that takes every head's last query block first;
    else head by head, as the grid of every tile). launches: the launch.Described its caller keeps
    for calls like this one (the same shapes and arguments but the tensors), which
    launches them without triton's dispatch. Returns the compiled kernel (`fusegen
    inspect` reads its registers and shared memory)."""

    def first():
        batch, heads, kv_heads, sq, skv, rows, q_place, kv_place = places(q, k, layout)
        tiles = triton.cdiv(sq, 2 * BLOCK_M) * batch * heads
        if persistent:
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            tiles = min(tiles, sms)
        grid = (tiles,)
        v_cols = v.shape[-1] if layout == "bshd" else 0  # a head's columns in v and out
        descs, split = tile_args(q, k, v, out, rows, BLOCK_M, block_n)
        scalars = (sq, skv, heads, scale * LOG2E, *q_place, *kv_place, v_cols)
        meta = {
            "GROUP": heads // kv_heads,
            "CAUSAL": causal,
            "ALIBI": 1 << (heads.bit_length() - 1) if alibi else 0,
            "WINDOW": window or 0,
            **split,
            "PERSISTENT": persistent,
            "LONGEST_FIRST": longest_first,
            "REGISTERS": registers[0],
            "num_warps": 4,
            **({} if registers[1] is None else {"maxnreg": registers[1]}),
        }
        scalars = (*scalars, *strides(out, layout), batch * heads)
        return _attention_forward, grid, descs, scalars, meta

    launches = launches or launch.Described()
    return launches((q, q, k, k, v, v, out, out), (out, lse), first)
