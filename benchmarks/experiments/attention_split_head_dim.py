"""Head dims that are not powers of two (96; MLA's 192 for q and k, 128 for v): the
generated attention pads them to the next power of two (96 -> 128, 192 -> 256), a third
more matmul work than the dim needs, since a Triton tile's dims are powers of two. This
prototype splits the dim instead: q and k as [64 | 32] (or [128 | 64]) column parts, the
scores as the sum of one dot per part, v and out likewise, so every MMA is as wide as the
data. The same kernel with one part of the padded width is the control.

A causal forward (bshd, one kv head per query head: the split is what is measured), the
online softmax in base 2 as the generated kernel does, the key blocks every row sees
run without masks and the diagonal's with. Not measured yet: written on the CPU, to be
timed on an H200 before the generated template takes it (issue 29).

    python3 benchmarks/experiments/attention_split_head_dim.py [--dims 96 192/128]
        [--batch 4] [--heads 32] [--seq 4096] [--rounds 5] [--out FILE.json]
    TRITON_INTERPRET=1 python3 benchmarks/experiments/attention_split_head_dim.py --check
        (CPU: both variants at small odd shapes against float64)

Timed per dim, interleaved over rounds (do_bench medians per round; median, min and max
printed), with TFLOP/s at the true dims: split, padded, and SDPA (cuDNN where it runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

# fmt: off
@triton.jit
def _part_dot(acc, a_ptr, b_ptr, rows, cols, stride_a, stride_b, a_ok, b_ok,
              WIDTH: tl.constexpr, OFFSET: tl.constexpr, DIM: tl.constexpr):
    """acc += a[:, OFFSET:OFFSET+WIDTH] @ b[:, OFFSET:OFFSET+WIDTH].T, the columns past
    DIM read as 0 (the padded control's last part)."""
    d = OFFSET + tl.arange(0, WIDTH)
    a = tl.load(a_ptr + rows[:, None] * stride_a + d[None, :],
                mask=a_ok[:, None] & (d < DIM)[None, :], other=0.0)
    b = tl.load(b_ptr + cols[None, :] * stride_b + d[:, None],
                mask=b_ok[None, :] & (d < DIM)[:, None], other=0.0)
    return tl.dot(a, b, acc)


@triton.jit
def _part_pv(acc, probs, rescale, v_base, keys, stride_v, key_ok,
             WIDTH: tl.constexpr, OFFSET: tl.constexpr, DIM: tl.constexpr):
    """acc * rescale + probs @ v[:, OFFSET:OFFSET+WIDTH], the columns past DIM as 0."""
    d = OFFSET + tl.arange(0, WIDTH)
    v = tl.load(v_base + keys[:, None] * stride_v + d[None, :],
                mask=key_ok[:, None] & (d < DIM)[None, :], other=0.0)
    return tl.dot(probs.to(v.dtype), v, acc * rescale[:, None])


@triton.jit
def _store_part(o_base, acc, row_sum, rows, stride_o, row_ok,
                WIDTH: tl.constexpr, OFFSET: tl.constexpr, DIM: tl.constexpr):
    d = OFFSET + tl.arange(0, WIDTH)
    tl.store(o_base + rows[:, None] * stride_o + d[None, :],
             (acc / row_sum[:, None]).to(o_base.dtype.element_ty),
             mask=row_ok[:, None] & (d < DIM)[None, :])


@triton.jit
def _step(q_base, k_base, v_base, o_acc0, o_acc1, row_sum, row_max, rows, start, SEQ,
          stride_s, stride_v, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          QK0: tl.constexpr, QK1: tl.constexpr, QK_DIM: tl.constexpr,
          V0: tl.constexpr, V1: tl.constexpr, V_DIM: tl.constexpr, MASKED: tl.constexpr):
    """BLOCK_N keys from `start` into the online softmax (base 2); MASKED: the diagonal."""
    keys = start + tl.arange(0, BLOCK_N)
    row_ok = rows < SEQ
    key_ok = keys < SEQ
    scores = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    scores = _part_dot(scores, q_base, k_base, rows, keys, stride_s, stride_s, row_ok, key_ok,
                       QK0, 0, QK_DIM)
    if QK1 > 0:
        scores = _part_dot(scores, q_base, k_base, rows, keys, stride_s, stride_s, row_ok,
                           key_ok, QK1, QK0, QK_DIM)
    scores = scores * scale
    if MASKED:
        scores = tl.where(key_ok[None, :] & (keys[None, :] <= rows[:, None]), scores, -1.0e30)
    new_max = tl.maximum(row_max, tl.max(scores, axis=1))
    probs = tl.exp2(scores - new_max[:, None])
    rescale = tl.exp2(row_max - new_max)
    row_sum = row_sum * rescale + tl.sum(probs, axis=1)
    o_acc0 = _part_pv(o_acc0, probs, rescale, v_base, keys, stride_v, key_ok, V0, 0, V_DIM)
    if V1 > 0:
        o_acc1 = _part_pv(o_acc1, probs, rescale, v_base, keys, stride_v, key_ok, V1, V0, V_DIM)
    return o_acc0, o_acc1, row_sum, new_max


@triton.jit
def _forward(q_ptr, k_ptr, v_ptr, o_ptr, SEQ, HEADS, stride_qb, stride_kb, stride_vb, stride_ob,
             stride_qs, stride_ks, stride_vs, stride_os, scale,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             QK0: tl.constexpr, QK1: tl.constexpr, QK_DIM: tl.constexpr,
             V0: tl.constexpr, V1: tl.constexpr, V_DIM: tl.constexpr):
    """BLOCK_M query rows of one (batch, head); q/k's dim in parts QK0 + QK1, v's in V0 +
    V1 (a part of 0: none). q, k, v, o: [batch, seq, heads, dim] with unit last stride."""
    pid_m = tl.program_id(0)
    batch = tl.program_id(1) // HEADS
    head = tl.program_id(1) % HEADS
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q_base = q_ptr + batch.to(tl.int64) * stride_qb + head * QK_DIM
    k_base = k_ptr + batch.to(tl.int64) * stride_kb + head * QK_DIM
    v_base = v_ptr + batch.to(tl.int64) * stride_vb + head * V_DIM
    o_acc0 = tl.zeros([BLOCK_M, V0], dtype=tl.float32)
    o_acc1 = tl.zeros([BLOCK_M, V1 if V1 > 0 else 16], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    full_hi = pid_m * BLOCK_M // BLOCK_N * BLOCK_N  # key blocks every row sees whole
    hi = tl.minimum(SEQ, (pid_m + 1) * BLOCK_M)
    for start in range(0, full_hi, BLOCK_N):
        o_acc0, o_acc1, row_sum, row_max = _step(
            q_base, k_base, v_base, o_acc0, o_acc1, row_sum, row_max, rows, start, SEQ,
            stride_qs, stride_vs, scale, BLOCK_M, BLOCK_N, QK0, QK1, QK_DIM, V0, V1, V_DIM,
            False)
    for start in range(full_hi, hi, BLOCK_N):
        o_acc0, o_acc1, row_sum, row_max = _step(
            q_base, k_base, v_base, o_acc0, o_acc1, row_sum, row_max, rows, start, SEQ,
            stride_qs, stride_vs, scale, BLOCK_M, BLOCK_N, QK0, QK1, QK_DIM, V0, V1, V_DIM,
            True)
    o_base = o_ptr + batch.to(tl.int64) * stride_ob + head * V_DIM
    row_ok = rows < SEQ
    _store_part(o_base, o_acc0, row_sum, rows, stride_os, row_ok, V0, 0, V_DIM)
    if V1 > 0:
        _store_part(o_base, o_acc1, row_sum, rows, stride_os, row_ok, V1, V0, V_DIM)
# fmt: on


def parts(dim: int, split: bool) -> tuple[int, int]:
    """(first, second) widths: the dim as a power of two and the rest (split), or the
    next power of two and nothing (padded)."""
    padded = triton.next_power_of_2(dim)
    if not split or padded == dim:
        return padded, 0
    first = padded // 2
    rest = dim - first
    if rest != triton.next_power_of_2(rest):
        raise ValueError(f"head dim {dim}: not a power of two plus half of one")
    return first, rest


def attention(q, k, v, split: bool, block_m=128, block_n=64, warps=8, stages=2):
    """Causal attention of q, k [B, S, H, D] and v [B, S, H, Dv] (contiguous)."""
    batch, seq, heads, dim = q.shape
    v_dim = v.shape[-1]
    qk0, qk1 = parts(dim, split)
    v0, v1 = parts(v_dim, split)
    out = torch.empty(batch, seq, heads, v_dim, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(seq, block_m), batch * heads)
    _forward[grid](
        q,
        k,
        v,
        out,
        seq,
        heads,
        q.stride(0),
        k.stride(0),
        v.stride(0),
        out.stride(0),
        q.stride(1),
        k.stride(1),
        v.stride(1),
        out.stride(1),
        dim**-0.5 * 1.4426950408889634,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        QK0=qk0,
        QK1=qk1,
        QK_DIM=dim,
        V0=v0,
        V1=v1,
        V_DIM=v_dim,
        num_warps=warps,
        num_stages=stages,
    )
    return out


def reference(q, k, v):
    qt, kt, vt = (t.transpose(1, 2).double() for t in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(
        1, 2
    )


def check() -> int:
    """Both variants at small odd shapes, fp32, against float64 (the interpreter)."""
    torch.manual_seed(0)
    bad = 0
    for dim, v_dim, seq in ((96, 96, 45), (48, 32, 70), (192, 128, 33)):
        q, k = (torch.randn(2, seq, 3, dim) for _ in range(2))
        v = torch.randn(2, seq, 3, v_dim)
        want = reference(q, k, v)
        for split in (True, False):
            got = attention(q, k, v, split, block_m=32, block_n=16, warps=4, stages=1)
            error = (got.double() - want).abs().max().item()
            ok = error < 1e-4
            bad += not ok
            name = "split" if split else "padded"
            print(
                f"d {dim}/{v_dim} seq {seq} {name}: max error {error:.2e} {'ok' if ok else 'FAIL'}"
            )
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--dims", nargs="+", default=["96", "192/128"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.check:
        return check()
    results = {}
    for spec in args.dims:
        dim, v_dim = (int(x) for x in (spec.split("/") + [spec])[:2])
        shape = (args.batch, args.seq, args.heads)
        q, k = (torch.randn(*shape, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(*shape, v_dim, device="cuda", dtype=torch.bfloat16)
        want = reference(q[:1, :, :4].float(), k[:1, :, :4].float(), v[:1, :, :4].float())
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        variants = {
            "split": lambda q=q, k=k, v=v: attention(q, k, v, True),
            "padded": lambda q=q, k=k, v=v: attention(q, k, v, False),
            "sdpa": lambda q=qt, k=kt, v=vt: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True
            ),
        }
        for name in ("split", "padded"):
            got = variants[name]()[:1, :, :4].double()
            print(f"d {spec} {name}: max error vs fp32 math {(got - want).abs().max().item():.3e}")
        flops = 2 * args.batch * args.heads * args.seq * args.seq * (dim + v_dim) / 2  # causal
        times = {name: [] for name in variants}
        for r in range(args.rounds):
            names = list(variants)
            for name in names[r % 3 :] + names[: r % 3]:
                times[name].append(triton.testing.do_bench(variants[name]))
        results[spec] = times
        for name, ms in times.items():
            median = statistics.median(ms)
            print(
                f"d {spec:8s} {name:7s} {median:7.3f} ms [{min(ms):.3f}-{max(ms):.3f}] "
                f"{flops / median / 1e9:6.0f} TFLOP/s"
            )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
