"""Attention's forward written in Gluon (Triton's lower-level language, shipped with
Triton 3.6): the Hopper schedule that Triton's own compiler will not arrange (issue 29).
In `tl`, Triton 3.6 waits on the QK dot at once and keeps the PV dot in flight only into
the next step's wait (benchmarks/experiments/dot_waits.py), so the softmax runs while the
tensor cores idle. Gluon issues each wgmma asynchronously and waits where the kernel says.

Every variant: a one-warp producer partition (gl.warp_specialize) streams K and V
through a ring of shared-memory stages with TMA; a consumer issues block j's QK and
block j - 1's PV as asynchronous wgmma and runs block j's softmax while PV is in flight.
    ws          one consumer of 8 warps, 128 query rows
    pingpong    two consumers of 4 warps, 64 rows each, drifting apart on the tensor cores
    -persistent one program an SM, each over tiles in steps of the grid
    -pairs      two key blocks a trip, the probabilities in alternating variables
    -heads      a head's tiles one after another (else every head's last query block first)
NAME:BLOCK_N:STAGES sets the key block and the ring's depth (128 and 2 by default).
"runtime" (always timed) is the product's kernel, fusegen/runtime/attention_hopper.py,
which took pingpong-heads, and the same on a persistent grid in two tile orders
(RUNTIME_PERSISTENT; `--variants` with no names times only these, cuDNN and the
generated kernel); at head dim 64 (--shape B H S 64) also with its knobs (RUNTIME_D64),
for issue 29's d 64 rows, where it was slower than the `tl` forward. The
variants measured and dropped on the way (all waits at once, the loads issued by the
consumers, FA3's explicit turns, the probabilities through shared memory, O rescaled
during QK, V released a step late; in the runtime kernel, chained tiles on the persistent
grid, commit 9528355) are in this file's git history and in benchmarks/RESULTS.md with
their logs. The window case (causal, a window of WINDOW keys; --kv-heads 8 for the
anchors' module) times the runtime kernel alone, against its grid of every tile: SDPA's
cuDNN backend has no window. --knobs NAME... times only those of the runtime's knobs.

Timed in interleaved rounds with cuDNN and the generated kernel
(benchmarks/specs/attention_anchors.yaml). Causal or no mask; [batch, heads, seq, dim]
contiguous, seq a multiple of the tiles; bf16; the softmax in base 2.

    python3 benchmarks/experiments/attention_gluon_hopper.py [--built FOLDER]
        [--cases causal full window] [--variants pingpong-heads ws] [--shape B H S D]
        [--rounds 5] [--kv-heads N] [--knobs "runtime persistent" ...] [--out FILE.json]
    ncu --profile-from-start off ... python3 benchmarks/experiments/attention_gluon_hopper.py
        --profile --variants pingpong (one call of each variant and cuDNN, profiled)
    python3 benchmarks/experiments/attention_gluon_hopper.py --compile
        (CPU: each variant compiled for sm_90; registers, spills and shared memory)
"""

from __future__ import annotations

import argparse
import json
import statistics
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

LOG2E = 1.4426950408889634


# fmt: off
@gluon.jit
def _scores_to_probs(s, m_i, l_i, key0, row0, qk_scale, CAUSAL: gl.constexpr,
                     s_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """One key block into the online softmax (base 2): probabilities, new max and sum,
    and the factor the accumulator is rescaled by. Masks only blocks that cross the
    diagonal."""
    if CAUSAL:
        if key0 + BLOCK_N > row0:
            rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            keys = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            s = gl.where(keys[None, :] <= rows[:, None], s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _tile(t, heads, seq, CAUSAL: gl.constexpr, HEAD_MAJOR: gl.constexpr, TILE_M: gl.constexpr,
          BLOCK_N: gl.constexpr):
    """Tile t: its first query row within its head, its key blocks, and the rows of its
    queries and of its head's keys in the [batch * heads * seq, dim] views. HEAD_MAJOR:
    a head's query blocks one after another (last first), so the programs running at
    once share a few heads' keys in L2; else every head's last query block first, then
    the ones before (longest first over all heads; the keys of as many heads as there
    are programs in flight)."""
    if HEAD_MAJOR:
        m_blocks = gl.cdiv(seq, TILE_M)
        row0 = (m_blocks - 1 - t % m_blocks) * TILE_M
        head = t // m_blocks
    else:
        row0 = (gl.cdiv(seq, TILE_M) - 1 - t // heads) * TILE_M
        head = t % heads
    if CAUSAL:
        n_blocks = gl.cdiv(row0 + TILE_M, BLOCK_N)
    else:
        n_blocks = gl.cdiv(seq, BLOCK_N)
    return row0, n_blocks, head * seq + row0, head * seq


@gluon.jit
def _load(desc, smem, bar, row):
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [row, 0], bar, smem)


@gluon.jit
def _step(bufs, bars, q_smem, s_zero, acc, p, m_i, l_i, j, ring, row0, qk_scale,
          CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """Key block j (the ring's block `ring`): its QK and block j - 1's PV issued together,
    the softmax of block j while PV runs (p: block j - 1's probabilities)."""
    q_bufs, k_bufs, v_bufs, o_bufs = bufs
    q_ready, q_empty, k_ready, v_ready, k_empty, v_empty = bars
    BLOCK_M: gl.constexpr = q_smem.type.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.type.shape[1]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    stage = ring % STAGES
    prev = (ring - 1) % STAGES
    mbarrier.wait(k_ready.index(stage), (ring // STAGES) & 1)
    s_tok = warpgroup_mma(q_smem, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
    mbarrier.wait(v_ready.index(prev), ((ring - 1) // STAGES) & 1)
    acc_tok = warpgroup_mma(p, v_bufs.index(prev), acc, is_async=True)
    s = warpgroup_mma_wait(1, deps=(s_tok,))
    mbarrier.arrive(k_empty.index(stage))
    p_next, m_i, l_i, alpha = _scores_to_probs(s, m_i, l_i, j * BLOCK_N, row0, qk_scale, CAUSAL,
                                               s_layout, BLOCK_M, BLOCK_N)
    acc, p = warpgroup_mma_wait(0, deps=(acc_tok, p))
    mbarrier.arrive(v_empty.index(prev))
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p = gl.convert_layout(p_next.to(q_smem.dtype), p_layout)
    return acc, p, m_i, l_i


@gluon.jit
def _consume(descs, bufs, bars, seq, heads, qk_scale, CAUSAL: gl.constexpr,
             PAIRS: gl.constexpr, HEAD_MAJOR: gl.constexpr, PARTS: gl.constexpr,
             PART: gl.constexpr,
             num_warps: gl.constexpr):
    """Consumer PART (of PARTS): for each of this program's tiles, its BLOCK_M query rows
    over the key blocks the producer streams through the ring, then its rows of the
    output (through its own buffer, stored while the next tile runs)."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_bufs, k_bufs, v_bufs, o_bufs = bufs
    q_ready, q_empty, k_ready, v_ready, k_empty, v_empty = bars
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    dtype: gl.constexpr = q_desc.dtype
    o_smem = o_bufs.index(PART)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    n_tiles = gl.cdiv(seq, PARTS * BLOCK_M) * heads
    ring = 0
    count = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        row0, n_blocks, q_row, kv_row = _tile(t, heads, seq, CAUSAL, HEAD_MAJOR, PARTS * BLOCK_M,
                                                 BLOCK_N)
        row0 = row0 + PART * BLOCK_M
        q_index = PART * 2 + count % 2
        q_smem = q_bufs.index(q_index)
        m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
        mbarrier.wait(q_ready.index(q_index), (count // 2) & 1)

        # Block 0's scores and probabilities: the loop starts one block ahead.
        stage = ring % STAGES
        mbarrier.wait(k_ready.index(stage), (ring // STAGES) & 1)
        s = warpgroup_mma(q_smem, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False)
        mbarrier.arrive(k_empty.index(stage))
        p, m_i, l_i, alpha = _scores_to_probs(s, m_i, l_i, 0, row0, qk_scale, CAUSAL, s_layout,
                                              BLOCK_M, BLOCK_N)
        p = gl.convert_layout(p.to(dtype), p_layout)
        if PAIRS:
            # Two blocks a trip, the probabilities alternating between two variables: the
            # ones a step packs never share registers with the ones its PV dot still
            # reads, so ptxas need not wait for that dot before the softmax.
            for j in range(1, n_blocks - 1, 2):
                acc, p_b, m_i, l_i = _step(bufs, bars, q_smem, s_zero, acc, p, m_i, l_i, j,
                                           ring + j, row0, qk_scale, CAUSAL, num_warps)
                acc, p, m_i, l_i = _step(bufs, bars, q_smem, s_zero, acc, p_b, m_i, l_i, j + 1,
                                         ring + j + 1, row0, qk_scale, CAUSAL, num_warps)
            if n_blocks % 2 == 0:
                acc, p, m_i, l_i = _step(bufs, bars, q_smem, s_zero, acc, p, m_i, l_i,
                                         n_blocks - 1, ring + n_blocks - 1, row0, qk_scale,
                                         CAUSAL, num_warps)
        else:
            for j in range(1, n_blocks):
                acc, p, m_i, l_i = _step(bufs, bars, q_smem, s_zero, acc, p, m_i, l_i, j,
                                         ring + j, row0, qk_scale, CAUSAL, num_warps)
        mbarrier.arrive(q_empty.index(q_index))
        last = ring + n_blocks - 1
        mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
        acc = warpgroup_mma(p, v_bufs.index(last % STAGES), acc)
        mbarrier.arrive(v_empty.index(last % STAGES))

        # The last tile's store has read the output buffer by now, or is waited for.
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
        tma.store_wait(pendings=0)
        o_smem.store((acc / l_o[:, None]).to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [q_row + PART * BLOCK_M, 0], o_smem)
        ring += n_blocks
        count += 1
    tma.store_wait(pendings=0)


@gluon.jit
def _produce(descs, bufs, bars, seq, heads, qk_scale, CAUSAL: gl.constexpr,
             PAIRS: gl.constexpr, HEAD_MAJOR: gl.constexpr, PARTS: gl.constexpr,
             PART: gl.constexpr,
             num_warps: gl.constexpr):
    """The producer partition (one warp): for each tile, its query rows into a free query
    buffer, then each key block's K and V into the ring, each into its stage once every
    consumer has released it (a fresh mbarrier counts as having completed the phase
    before 0, so the first pass does not wait)."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_bufs, k_bufs, v_bufs, o_bufs = bufs
    q_ready, q_empty, k_ready, v_ready, k_empty, v_empty = bars
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    n_tiles = gl.cdiv(seq, PARTS * BLOCK_M) * heads
    ring = 0
    count = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        row0, n_blocks, q_row, kv_row = _tile(t, heads, seq, CAUSAL, HEAD_MAJOR, PARTS * BLOCK_M,
                                                 BLOCK_N)
        for part in gl.static_range(PARTS):
            q_index = part * 2 + count % 2
            mbarrier.wait(q_empty.index(q_index), ((count // 2) & 1) ^ 1)
            _load(q_desc, q_bufs.index(q_index), q_ready.index(q_index), q_row + part * BLOCK_M)
        for j in range(n_blocks):
            stage = (ring + j) % STAGES
            empty_phase = (((ring + j) // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(stage), empty_phase)
            _load(k_desc, k_bufs.index(stage), k_ready.index(stage), kv_row + j * BLOCK_N)
            mbarrier.wait(v_empty.index(stage), empty_phase)
            _load(v_desc, v_bufs.index(stage), v_ready.index(stage), kv_row + j * BLOCK_N)
        ring += n_blocks
        count += 1


@gluon.jit
def _attention_forward(q_desc, k_desc, v_desc, o_desc, seq, heads, qk_scale,
                       CAUSAL: gl.constexpr, PAIRS: gl.constexpr, HEAD_MAJOR: gl.constexpr,
                       PARTS: gl.constexpr,
                       STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Tiles of PARTS * BLOCK_M query rows (q_desc's block rows), the program's tiles
    from its id in steps of the grid (a grid of every tile, or one program an SM:
    persistent). PARTS consumers of num_warps warps (2: ping-pong) and a producer warp."""
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [2 * PARTS] + q_desc.block_type.shape,
                                       q_desc.layout)
    o_bufs = gl.allocate_shared_memory(o_desc.dtype, [PARTS] + o_desc.block_type.shape,
                                       o_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape,
                                       k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape,
                                       v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2 * PARTS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2 * PARTS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2 * PARTS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=PARTS)
        mbarrier.init(v_empty.index(i), count=PARTS)
    descs = (q_desc, k_desc, v_desc, o_desc)
    bufs = (q_bufs, k_bufs, v_bufs, o_bufs)
    bars = (q_ready, q_empty, k_ready, v_ready, k_empty, v_empty)
    # (Constexprs keep their kind only when written out in each tuple, not concatenated.)
    if PARTS == 2:
        gl.warp_specialize([
            (_consume, (descs, bufs, bars, seq, heads, qk_scale,
                        CAUSAL, PAIRS, HEAD_MAJOR, PARTS, 0, num_warps)),
            (_consume, (descs, bufs, bars, seq, heads, qk_scale,
                        CAUSAL, PAIRS, HEAD_MAJOR, PARTS, 1, num_warps)),
            (_produce, (descs, bufs, bars, seq, heads, qk_scale,
                        CAUSAL, PAIRS, HEAD_MAJOR, PARTS, 0, num_warps)),
        ], [num_warps, 1], [240, 24])
    else:
        gl.warp_specialize([
            (_consume, (descs, bufs, bars, seq, heads, qk_scale,
                        CAUSAL, PAIRS, HEAD_MAJOR, PARTS, 0, num_warps)),
            (_produce, (descs, bufs, bars, seq, heads, qk_scale,
                        CAUSAL, PAIRS, HEAD_MAJOR, PARTS, 0, num_warps)),
        ], [1], [24])
# fmt: on


VARIANTS = {  # name: (consumers, persistent, pairs, head-major tile order)
    "ws": (1, False, False, False),
    "pingpong": (2, False, False, False),
    "ws-persistent": (1, True, False, False),
    "pingpong-persistent": (2, True, False, False),
    "pingpong-pairs": (2, False, True, False),
    "pingpong-heads": (2, False, False, True),
    "pingpong-persistent-heads": (2, True, False, True),
    "pingpong-pairs-heads": (2, False, True, True),
    "ws-heads": (1, False, False, True),
}


def descriptors(q, k, v, out, block_m, block_n):
    """TMA descriptors over [batch * heads * seq, dim] views (the runtime's)."""
    from fusegen.runtime.attention_hopper import _descriptor

    rows = q.numel() // q.shape[-1]
    return tuple(
        _descriptor(t, rows, block)
        for t, block in ((q, block_m), (k, block_n), (v, block_n), (out, block_m))
    )


def plan(variant: str, causal: bool) -> tuple[int, int, bool, dict]:
    """'NAME[:BLOCK_N[:STAGES]]' (128 keys and 2 stages by default) -> (query rows a
    consumer, keys a block, persistent, the kernel's constexprs and warps). One consumer:
    128 rows on 8 warps; ping-pong: two of 64 rows on 4 warps each."""
    name, *rest = variant.split(":")
    if name not in VARIANTS:
        raise ValueError(f"variant {name!r}: one of {', '.join(VARIANTS)}")
    block_n, stages = [int(x) for x in rest] + [128, 2][len(rest) :]
    parts, persistent, pairs, head_major = VARIANTS[name]
    meta = {"CAUSAL": causal, "PAIRS": pairs, "HEAD_MAJOR": head_major, "PARTS": parts,
            "STAGES": stages,
            "num_warps": 8 // parts}  # fmt: skip
    return 128 // parts, block_n, persistent, meta


# (variant, q's shape, causal) -> its launch.Described: from the second call the variants
# launch as the runtime's kernel does, without triton's dispatch, whose host time exceeds
# a small call's kernel (16 x 16 x 1024 at head dim 64) and would be what do_bench times.
_VARIANT_LAUNCHES = {}


def attention(q, k, v, causal, variant, out=None):
    """softmax(q @ k.T / sqrt(d)) @ v for q, k, v [batch, heads, seq, dim] contiguous."""
    from fusegen.runtime import launch

    block_m, block_n, persistent, meta = plan(variant, causal)
    batch, heads, seq, dim = q.shape
    if seq % 128 or seq % block_n:
        raise ValueError(f"seq {seq}: a multiple of 128 and {block_n} only")
    out = torch.empty_like(q) if out is None else out

    def first():
        tiles = seq // 128 * batch * heads
        if persistent:
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            tiles = min(tiles, sms)
        descs = descriptors(q, k, v, out, block_m, block_n)
        return _attention_forward, (tiles,), descs, (seq, batch * heads, dim**-0.5 * LOG2E), meta

    launches = _VARIANT_LAUNCHES.setdefault((variant, q.shape, causal), launch.Described())
    launches((q, k, v, out), (), first)
    return out


def compile_sm90(variant, causal=True, dim=128):
    """The kernel compiled for sm_90 on the CPU (no GPU needed)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import quant_registers

    block_m, block_n, _, meta = plan(variant, causal)
    q = torch.empty(1, 1, 256, dim, dtype=torch.bfloat16)
    names = [p.name for p in _attention_forward.params]
    descs = descriptors(q, q, q, q, block_m, block_n)
    types = dict(zip(names[:4], map(triton.runtime.jit.mangle_type, descs), strict=True))
    types |= {"seq": "i32", "heads": "i32", "qk_scale": "fp32"}
    types |= {n: "constexpr" for n in meta}
    constexprs = {(names.index(n),): v for n, v in meta.items() if n in names}
    options = {"num_warps": meta["num_warps"]}
    return quant_registers.compile_sm90(_attention_forward, types, constexprs, options)


def compile_report(variants, causal=True):
    """Each variant's registers, spills and shared memory (ptxas, on the CPU)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quant_registers import ptxas_report

    for variant in variants:
        compiled = compile_sm90(variant, causal)
        print(
            f"{variant}: {ptxas_report(compiled.asm['ptx'])} | shared "
            f"{compiled.metadata.shared} bytes",
            flush=True,
        )


# The runtime kernel's knobs timed beside it at head dim 64, where its defaults (128-key
# blocks, 240 registers a consumer: one program an SM) ran slower than the `tl` forward:
# 64-key blocks, and those in 120 / 112 registers (two programs an SM; no spills, 49 KB of
# shared memory, compiled for sm_90).
RUNTIME_D64 = {
    "runtime 64-key": {"block_n": 64},
    "runtime 64-key 2/SM": {"block_n": 64, "registers": (120, 112)},
}
# The runtime kernel's persistent grid (forward's persistent, longest_first), at every
# head dim: the experiments' pingpong-persistent-heads in the product's kernel, and the
# order that takes every head's last query block first (causal: the longest tiles first).
RUNTIME_PERSISTENT = {
    "runtime persistent": {"persistent": True},
    "runtime persistent longest-first": {"persistent": True, "longest_first": True},
}
# The window case's keys a query sees (the anchors' Mistral-style module's).
WINDOW = 1024


# (q's shape, causal, knobs) -> the runtime forward's launch.Described: launched as the
# runtime launches it, without triton's dispatch from the second call (which alone costs
# more host time than the kernel at head dim 64's 16 x 16 x 1024).
_DESCRIBED = {}


def runtime_forward(q, k, v, causal, **knobs):
    from fusegen.runtime import attention_hopper, launch

    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device)
    launches = _DESCRIBED.setdefault((q.shape, causal, str(knobs)), launch.Described())
    attention_hopper.forward(
        q, k, v, out, lse, layout="bhsd", causal=causal, scale=q.shape[-1] ** -0.5,
        launches=launches, **knobs,
    )  # fmt: skip
    return out


def reference(q, k, v, causal, window=0):
    """float64 attention; window: (causal) a query sees its `window` latest keys."""
    q, k, v = q.double(), k.double(), v.double()
    if not window:
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=True
        )
    rows = torch.arange(q.shape[2], device=q.device)[:, None]
    keys = torch.arange(k.shape[2], device=q.device)[None, :]
    seen = (keys <= rows) & (keys > rows - window)
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=seen, enable_gqa=True
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument(
        "--profile", action="store_true", help="one call of each, under the CUDA profiler only"
    )
    parser.add_argument("--built", help="benchmarks/specs/attention_anchors.yaml built here")
    parser.add_argument("--cases", nargs="+", default=["causal", "full"])
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--shape", type=int, nargs=4, default=[4, 32, 4096, 128])
    parser.add_argument(
        "--kv-heads", type=int, help="GQA: k and v's heads (the runtime's kernels, causal)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--knobs", nargs="*", help="only these of the runtime's knob sets (default: every one)"
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.compile:
        for causal in (True, False):
            print(f"causal={causal}")
            compile_report(args.variants, causal=causal)
        return 0

    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import attention_anchors

    batch, heads, seq, dim = args.shape
    kv_heads = args.kv_heads or heads
    if kv_heads != heads:  # the experiments' own kernels take as many k and v heads as q's
        args.variants = []
    generated = {}
    if args.built:
        for case in args.cases:
            # At head dim 64 the d 64 anchors (16 heads: --shape B 16 S 64; GQA: 32/8).
            name = "anchor_attention_" + ("gqa" if kv_heads != heads else case)
            name += "_d64" if dim == 64 else ""
            if case == "window":  # its module: 32/8 heads of 128 (--kv-heads 8)
                name = "anchor_attention_window"
            generated[case] = getattr(attention_anchors.load(Path(args.built), name), name)
    torch.manual_seed(0)
    results, failed = {}, 0
    for case in args.cases:
        causal = case in ("causal", "window")
        window = WINDOW if case == "window" else 0
        q, k, v = (
            torch.randn(batch, n, seq, dim, device="cuda", dtype=torch.bfloat16)
            for n in (heads, kv_heads, kv_heads)
        )

        def cudnn(q=q, k=k, v=v, causal=causal):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, enable_gqa=kv_heads != heads
                )

        calls = {
            name: (lambda q=q, k=k, v=v, c=causal, name=name: attention(q, k, v, c, name))
            for name in (args.variants if not window else ())  # the variants take no window
        }
        if not window:  # SDPA's cuDNN backend has no sliding window
            calls["cudnn"] = cudnn
        # The product's kernel (fusegen/runtime/attention_hopper.py), what generated
        # modules launch on an H100/H200.
        calls["runtime"] = lambda q=q, k=k, v=v, c=causal, w=window: runtime_forward(
            q, k, v, c, window=w
        )
        knobs_tried = {**(RUNTIME_D64 if dim == 64 else {}), **RUNTIME_PERSISTENT}
        for name, knobs in knobs_tried.items():
            if args.knobs is not None and name not in args.knobs:
                continue
            calls[name] = lambda q=q, k=k, v=v, c=causal, w=window, kn=knobs: runtime_forward(
                q, k, v, c, window=w, **kn
            )
        if case in generated:
            calls["fusegen"] = lambda q=q, k=k, v=v, f=generated[case]: f(q, k, v)
        # Checked on the first batch entry and 4 heads against float64, the output
        # poisoned before each call.
        kv = max(1, 4 * kv_heads // heads)  # the k and v heads of q's first 4
        want = reference(q[:1, :4], k[:1, :kv], v[:1, :kv], causal, window)
        scale = want.abs().max().item()
        for name, call in calls.items():
            if name in VARIANTS:
                out = torch.full_like(q, float("nan"))
                got = attention(q, k, v, causal, name, out=out)
            else:
                got = call()
            error = (got[:1, :4].double() - want).abs().max().item() / scale
            ok = error < 2e-2
            failed += not ok
            print(f"{case} {name}: max error {error:.2e} of max |out| {'ok' if ok else 'FAIL'}")
        pairs = seq * seq / 2 if causal else seq * seq
        if window:  # each query's keys: its window, or every one before it
            pairs = window * (seq - window) + window * (window + 1) / 2
        flops = 4 * batch * heads * pairs * dim
        if args.profile:  # ncu --profile-from-start off: these calls alone
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            for call in calls.values():
                call()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            continue
        times = {name: [] for name in calls}
        names = list(calls)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times[name].append(triton.testing.do_bench(calls[name]))
        results[case] = times
        against = "cudnn" if "cudnn" in times else "runtime"
        base = statistics.median(times[against])
        for name, ms in times.items():
            median = statistics.median(ms)
            print(
                f"{case:7s} {name:8s} {median:7.3f} ms [{min(ms):.3f}-{max(ms):.3f}] "
                f"{flops / median / 1e9:5.0f} TFLOP/s  {base / median:.2f}x {against}",
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
