"""Attention's backward written in Gluon, the forward's schedule carried over
(benchmarks/experiments/attention_gluon_hopper.py, fusegen/runtime/attention_hopper.py):
two consumer warpgroups of 64 keys each, ping-ponging on the tensor cores, a one-warp
producer streaming each query block's q and d_out through two shared-memory stages with
TMA, programs ordered head by head. Keys-major (FA2/FA3's dk/dv): for each query block,

    S^T = K q^T, P^T = exp2(S^T * scale * log2(e) - lse * log2(e)), dP^T = V d_out^T,
    dS^T = P^T * (dP^T - delta), dV += P^T d_out, dK += dS^T q (times scale at the end)

with lse and delta ([batch, heads, seq] fp32) read by pointer; and a dq kernel of its own
(queries-major, 64 rows a consumer, key blocks of 64 streamed: S = q K^T, dP = d_out V^T,
dS, dq += dS K), so both stay deterministic (no atomics). Written on the CPU (both compile
for sm_90 there: --compile) after the forward's last GPU call: not yet checked or timed
on a GPU. The timing compares the kernels alone (delta given) with the generated
module's backward kernels, which also compute delta (a small row-sum kernel).

    python3 benchmarks/experiments/attention_gluon_backward.py [--built FOLDER]
        [--cases causal full] [--rounds 5]
        (on an H100/H200: dq, dk and dv against float64, then timed against the
        generated module's backward kernels, FOLDER: benchmarks/specs/attention_anchors.yaml
        built)
    python3 benchmarks/experiments/attention_gluon_backward.py --compile
        (CPU: compiled for sm_90; registers, spills and shared memory)

bhsd, one kv head per query head, seq a multiple of 128, bf16.
"""

from __future__ import annotations

import argparse
import math
import statistics
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

LOG2E = 1.4426950408889634
BLOCK_M, BLOCK_N = 64, 64  # query rows a step; keys a consumer (two consumers a program)


# fmt: off
@gluon.jit
def _load(desc, smem, bar, row):
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [row, 0], bar, smem)


@gluon.jit
def _consume(descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, place, seq, qk_scale,
             scale, CAUSAL: gl.constexpr, PART: gl.constexpr, num_warps: gl.constexpr):
    """Consumer PART: its 64 keys over every query block the producer streams; then its
    rows of dk and dv."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_bufs, do_bufs, k_bufs, v_bufs = bufs
    kv_ready, ready, empty = bars
    key0, first_block, n_blocks, bh, bh_row = place
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    dtype: gl.constexpr = q_desc.dtype
    key0 = key0 + PART * BN
    k_smem = k_bufs.index(PART)
    v_smem = v_bufs.index(PART)
    s_zero = gl.zeros([BN, BM], gl.float32, layout=s_layout)
    dk = gl.zeros([BN, HEAD_DIM], gl.float32, layout=acc_layout)
    dv = gl.zeros([BN, HEAD_DIM], gl.float32, layout=acc_layout)
    keys = key0 + gl.arange(0, BN, layout=gl.SliceLayout(1, s_layout))
    mbarrier.wait(kv_ready.index(PART), 0)
    for i in range(n_blocks):
        stage = i % STAGES
        q_smem = q_bufs.index(stage)
        do_smem = do_bufs.index(stage)
        row0 = (first_block + i) * BM
        rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(0, s_layout))
        lse = gl.load(lse_ptr + bh_row + rows) * 1.4426950408889634  # in base 2
        delta = gl.load(delta_ptr + bh_row + rows)
        mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
        # S^T [keys, queries], then P^T; dV's dot runs while dP^T's is issued.
        s = warpgroup_mma(k_smem, q_smem.permute((1, 0)), s_zero, use_acc=False)
        p = gl.exp2(s * qk_scale - lse[None, :])
        if CAUSAL:
            if row0 < key0 + BN:  # a block on the diagonal: queries before a key see none
                p = gl.where(keys[:, None] <= rows[None, :], p, 0.0)
        p_a = gl.convert_layout(p.to(dtype), a_layout)
        dv_tok = warpgroup_mma(p_a, do_smem, dv, is_async=True)
        dp_tok = warpgroup_mma(v_smem, do_smem.permute((1, 0)), s_zero, use_acc=False,
                               is_async=True)
        dp = warpgroup_mma_wait(0, deps=(dp_tok,))
        dv = warpgroup_mma_wait(0, deps=(dv_tok,))
        ds_a = gl.convert_layout((p * (dp - delta[None, :])).to(dtype), a_layout)
        dk = warpgroup_mma(ds_a, q_smem, dk)
        mbarrier.arrive(empty.index(stage))

    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    out_rows = bh_row + key0 + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_layout))
    offsets = out_rows.to(gl.int64)[:, None] * HEAD_DIM + cols[None, :]
    gl.store(dk_ptr + offsets, (dk * scale).to(dtype))
    gl.store(dv_ptr + offsets, dv.to(dtype))


@gluon.jit
def _produce(descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, place, seq, qk_scale,
             scale, CAUSAL: gl.constexpr, PART: gl.constexpr, num_warps: gl.constexpr):
    """The producer warp: both consumers' K and V, then each query block's q and d_out
    into the ring once both consumers have released its stage (a fresh mbarrier counts
    as having completed the phase before 0)."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_bufs, do_bufs, k_bufs, v_bufs = bufs
    kv_ready, ready, empty = bars
    key0, first_block, n_blocks, bh, bh_row = place
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    for part in gl.static_range(2):
        bar = kv_ready.index(part)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [bh_row + key0 + part * BN, 0], bar,
                                        k_bufs.index(part))
        tma.async_copy_global_to_shared(v_desc, [bh_row + key0 + part * BN, 0], bar,
                                        v_bufs.index(part))
    for i in range(n_blocks):
        stage = i % STAGES
        mbarrier.wait(empty.index(stage), ((i // STAGES) & 1) ^ 1)
        bar = ready.index(stage)
        row = bh_row + (first_block + i) * BM
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [row, 0], bar, q_bufs.index(stage))
        tma.async_copy_global_to_shared(do_desc, [row, 0], bar, do_bufs.index(stage))


@gluon.jit
def _attention_dkdv(q_desc, k_desc, v_desc, do_desc, dk_ptr, dv_ptr, lse_ptr, delta_ptr,
                    seq, heads, qk_scale, scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                    num_warps: gl.constexpr):
    """One program: 2 x BLOCK_N keys of one (batch, head), programs head by head."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    k_blocks = gl.cdiv(seq, 2 * BN)
    pid = gl.program_id(0)
    bh = pid // k_blocks
    key0 = (k_blocks - 1 - pid % k_blocks) * (2 * BN)  # the longest (causal: first) last
    if CAUSAL:
        first_block = key0 // BM  # the query blocks at or after the first key
    else:
        first_block = 0
    n_blocks = gl.cdiv(seq, BM) - first_block
    bh_row = bh * seq

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape,
                                       q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape,
                                        do_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape,
                                       k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [2] + v_desc.block_type.shape,
                                       v_desc.layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(kv_ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    descs = (q_desc, k_desc, v_desc, do_desc)
    bufs = (q_bufs, do_bufs, k_bufs, v_bufs)
    bars = (kv_ready, ready, empty)
    place = (key0, first_block, n_blocks, bh, bh_row)
    # (Constexprs keep their kind only written out in each partition's tuple.)
    gl.warp_specialize([
        (_consume, (descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, place, seq,
                    qk_scale, scale, CAUSAL, 0, num_warps)),
        (_consume, (descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, place, seq,
                    qk_scale, scale, CAUSAL, 1, num_warps)),
        (_produce, (descs, bufs, bars, dk_ptr, dv_ptr, lse_ptr, delta_ptr, place, seq,
                    qk_scale, scale, CAUSAL, 0, num_warps)),
    ], [num_warps, 1], [240, 24])

@gluon.jit
def _dq_consume(descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, place, seq, qk_scale, scale,
                CAUSAL: gl.constexpr, PART: gl.constexpr, num_warps: gl.constexpr):
    """Consumer PART of the dq kernel: its 64 query rows over every key block the
    producer streams (S = q K^T, P, dP = d_out V^T, dS, dq += dS K); then its dq."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_bufs, do_bufs, k_bufs, v_bufs = bufs
    qdo_ready, ready, empty = bars
    row0, n_blocks, bh, bh_row = place
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    dtype: gl.constexpr = q_desc.dtype
    row0 = row0 + PART * BM
    q_smem = q_bufs.index(PART)
    do_smem = do_bufs.index(PART)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    dq = gl.zeros([BM, HEAD_DIM], gl.float32, layout=acc_layout)
    rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    lse = gl.load(lse_ptr + bh_row + rows) * 1.4426950408889634  # in base 2
    delta = gl.load(delta_ptr + bh_row + rows)
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
        if CAUSAL:
            if key0 + BN > row0:  # a block on the diagonal: keys after a query unseen
                keys = key0 + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
                p = gl.where(keys[None, :] <= rows[:, None], p, 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp_tok,))
        ds_a = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), a_layout)
        dq = warpgroup_mma(ds_a, k_smem, dq)
        mbarrier.arrive(empty.index(stage))

    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    out_rows = bh_row + row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, acc_layout))
    offsets = out_rows.to(gl.int64)[:, None] * HEAD_DIM + cols[None, :]
    gl.store(dq_ptr + offsets, (dq * scale).to(dtype))


@gluon.jit
def _dq_produce(descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, place, seq, qk_scale, scale,
                CAUSAL: gl.constexpr, PART: gl.constexpr, num_warps: gl.constexpr):
    """The dq kernel's producer warp: both consumers' q and d_out, then each key block's
    K and V into the ring once both consumers have released its stage."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_bufs, do_bufs, k_bufs, v_bufs = bufs
    qdo_ready, ready, empty = bars
    row0, n_blocks, bh, bh_row = place
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    for part in gl.static_range(2):
        bar = qdo_ready.index(part)
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bh_row + row0 + part * BM, 0], bar,
                                        q_bufs.index(part))
        tma.async_copy_global_to_shared(do_desc, [bh_row + row0 + part * BM, 0], bar,
                                        do_bufs.index(part))
    for j in range(n_blocks):
        stage = j % STAGES
        mbarrier.wait(empty.index(stage), ((j // STAGES) & 1) ^ 1)
        bar = ready.index(stage)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [bh_row + j * BN, 0], bar, k_bufs.index(stage))
        tma.async_copy_global_to_shared(v_desc, [bh_row + j * BN, 0], bar, v_bufs.index(stage))


@gluon.jit
def _attention_dq(q_desc, k_desc, v_desc, do_desc, dq_ptr, lse_ptr, delta_ptr, seq, heads,
                  qk_scale, scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                  num_warps: gl.constexpr):
    """One program: 2 x BLOCK_M query rows of one (batch, head), programs head by head,
    the last query block (causal: the longest) first."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    m_blocks = gl.cdiv(seq, 2 * BM)
    pid = gl.program_id(0)
    bh = pid // m_blocks
    row0 = (m_blocks - 1 - pid % m_blocks) * (2 * BM)
    if CAUSAL:
        n_blocks = gl.cdiv(row0 + 2 * BM, BN)
    else:
        n_blocks = gl.cdiv(seq, BN)
    bh_row = bh * seq

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape,
                                       q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [2] + do_desc.block_type.shape,
                                        do_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape,
                                       k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape,
                                       v_desc.layout)
    qdo_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(qdo_ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    descs = (q_desc, k_desc, v_desc, do_desc)
    bufs = (q_bufs, do_bufs, k_bufs, v_bufs)
    bars = (qdo_ready, ready, empty)
    place = (row0, n_blocks, bh, bh_row)
    gl.warp_specialize([
        (_dq_consume, (descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, place, seq, qk_scale,
                       scale, CAUSAL, 0, num_warps)),
        (_dq_consume, (descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, place, seq, qk_scale,
                       scale, CAUSAL, 1, num_warps)),
        (_dq_produce, (descs, bufs, bars, dq_ptr, lse_ptr, delta_ptr, place, seq, qk_scale,
                       scale, CAUSAL, 0, num_warps)),
    ], [num_warps, 1], [240, 24])
# fmt: on


def _descriptor(t, block_rows):
    """The runtime's descriptor over t as [batch * heads * seq, dim]."""
    from fusegen.runtime import attention_hopper

    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    return attention_hopper._descriptor(t, t.numel() // t.shape[-1], block_rows, dtype)


def dk_dv(q, k, v, d_out, lse, delta, causal, stages=2):
    """(dk, dv) of attention over q, k, v [batch, heads, seq, dim] (contiguous, one kv
    head per query head), lse (natural log) and delta = rowsum(d_out * out), [batch,
    heads, seq] fp32."""
    batch, heads, seq, dim = q.shape
    if seq % (2 * BLOCK_N) or seq % BLOCK_M:
        raise ValueError(f"seq {seq}: a multiple of {2 * BLOCK_N} only")
    d_k, d_v = torch.empty_like(k), torch.empty_like(v)
    scale = dim**-0.5
    grid = (seq // (2 * BLOCK_N) * batch * heads,)
    _attention_dkdv[grid](
        _descriptor(q, BLOCK_M),
        _descriptor(k, BLOCK_N),
        _descriptor(v, BLOCK_N),
        _descriptor(d_out, BLOCK_M),
        d_k,
        d_v,
        lse,
        delta,
        seq,
        heads,
        scale * LOG2E,
        scale,
        CAUSAL=causal,
        STAGES=stages,
        num_warps=4,
    )
    return d_k, d_v


def dq(q, k, v, d_out, lse, delta, causal, stages=2):
    """dq of the same attention (BLOCK_M query rows a consumer, two a program, key blocks
    of BLOCK_N)."""
    batch, heads, seq, dim = q.shape
    d_q = torch.empty_like(q)
    scale = dim**-0.5
    grid = (seq // (2 * BLOCK_M) * batch * heads,)
    _attention_dq[grid](
        _descriptor(q, BLOCK_M),
        _descriptor(k, BLOCK_N),
        _descriptor(v, BLOCK_N),
        _descriptor(d_out, BLOCK_M),
        d_q,
        lse,
        delta,
        seq,
        heads,
        scale * LOG2E,
        scale,
        CAUSAL=causal,
        STAGES=stages,
        num_warps=4,
    )
    return d_q


def compile_report(causal=True, dim=128):
    """Registers, spills and shared memory of the kernel compiled for sm_90 (CPU)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quant_registers import compile_sm90, ptxas_report

    t = torch.empty(1, 1, 256, dim, dtype=torch.bfloat16)
    descs = (_descriptor(t, BLOCK_M), _descriptor(t, BLOCK_N), _descriptor(t, BLOCK_N),
             _descriptor(t, BLOCK_M))  # fmt: skip
    for kernel in (_attention_dkdv, _attention_dq):
        names = [p.name for p in kernel.params]
        types = {name: "i32" for name in names}
        for name, desc in zip(names[:4], descs, strict=True):
            types[name] = triton.runtime.jit.mangle_type(desc)
        types |= {n: "*bf16" for n in ("dk_ptr", "dv_ptr", "dq_ptr") if n in names}
        types |= {"lse_ptr": "*fp32", "delta_ptr": "*fp32", "qk_scale": "fp32", "scale": "fp32"}
        meta = {"CAUSAL": causal, "STAGES": 2, "num_warps": 4}
        types |= {name: "constexpr" for name in meta}
        constants = {(names.index(name),): value for name, value in meta.items()}
        compiled = compile_sm90(kernel, types, constants, {"num_warps": 4})
        print(f"{kernel.__name__} causal={causal}: {ptxas_report(compiled.asm['ptx'])} | "
              f"shared {compiled.metadata.shared} bytes", flush=True)  # fmt: skip


def reference_grads(q, k, v, d_out, causal):
    """(dq, dk, dv) in float64."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        seq = q.shape[-2]
        seen = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~seen, float("-inf"))
    out = torch.softmax(scores, -1) @ v
    out.backward(d_out.double())
    return q.grad, k.grad, v.grad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--built", help="benchmarks/specs/attention_anchors.yaml built here")
    parser.add_argument("--cases", nargs="+", default=["causal", "full"])
    parser.add_argument("--shape", type=int, nargs=4, default=[4, 32, 4096, 128])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.compile:
        for causal in (True, False):
            compile_report(causal)
        return 0

    failed = sum(run_case(case, args.shape, args.rounds, args.built) for case in args.cases)
    return 1 if failed else 0


def run_case(case, shape, rounds, built) -> int:
    """dk and dv of one case against float64, then timed; the number of failed checks."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import attention_anchors

    causal = case == "causal"
    torch.manual_seed(0)
    q, k, v, d_out = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2]
    delta = (out.float() * d_out.float()).sum(-1)
    got_k, got_v = dk_dv(q, k, v, d_out, lse, delta, causal)
    got_q = dq(q, k, v, d_out, lse, delta, causal)
    small = (slice(0, 1), slice(0, 2))
    wants = reference_grads(*(t[small] for t in (q, k, v, d_out)), causal)
    failed = 0
    for name, got, want in zip(("dq", "dk", "dv"), (got_q, got_k, got_v), wants, strict=True):
        got = got[small]
        error = (got.double() - want).abs().max().item() / want.abs().max().item()
        ok = error < 2e-2
        failed += not ok
        print(f"{case} {name}: max error {error:.2e} of max |grad| {'ok' if ok else 'FAIL'}")
    calls = {
        "gluon dk/dv": lambda: dk_dv(q, k, v, d_out, lse, delta, causal),
        "gluon dq": lambda: dq(q, k, v, d_out, lse, delta, causal),
        "gluon dk/dv + dq": lambda: (
            dk_dv(q, k, v, d_out, lse, delta, causal),
            dq(q, k, v, d_out, lse, delta, causal),
        ),
    }
    if built:
        name = f"anchor_attention_{case}"
        module = attention_anchors.load(Path(built), name)
        bshd = module.LAYOUT == "bshd"
        inputs = tuple(t.transpose(1, 2) if bshd else t for t in (q, k, v))
        grad = d_out.transpose(1, 2) if bshd else d_out
        o = out.transpose(1, 2) if bshd else out
        calls["tl dk/dv (with delta)"] = lambda: module._ATTENTION.backward(
            inputs, o, lse, grad, (False, True, True)
        )
        calls["tl backward (with delta)"] = lambda: module._ATTENTION.backward(
            inputs, o, lse, grad, (True, True, True)
        )
    times = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(triton.testing.do_bench(calls[name]))
    for name, ms in times.items():
        print(f"{case:7s} {name:24s} {statistics.median(ms):7.3f} ms "
              f"[{min(ms):.3f}-{max(ms):.3f}]", flush=True)  # fmt: skip
    return failed


if __name__ == "__main__":
    sys.exit(main())
