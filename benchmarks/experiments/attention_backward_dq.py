"""The attention backward in one kernel, dq summed by atomics (FA2's and FA3's way), against
the generated backward's two kernels (dk/dv per key block, then dq per query block, which
computes the scores and d_probs a second time: seven GEMMs a tile pair against five).

Measured on an H200 (benchmarks/results/2026-12-03-h200-attention-backward-dq/): the
atomics lose everywhere. Causal 4 x 32 x 4096, d 128: two kernels 3.756 ms, the prototype
4.977 (TMA reductions, 64 x 128 tiles on 8 warps) and 8.795 (pointer atomics); the same
path in the generated kernels (atomic_dq_in_the_generated_kernels.patch there, since
reverted) 5.052 at its best config, 6.598 at the dk/dv default. cuDNN: 2.961.

One program takes BLOCK_N keys of one (batch, kv head), walks the query blocks that see
them (for each query head of the group), sums dk and dv in registers as the generated
kernel does, and adds each block's share of dq, dS @ K, into an fp32 dq through
atomics: TMA bulk reductions (`desc.atomic_add`, cp.reduce.async.bulk) or pointer
atomics (`tl.atomic_add`). dq is zeroed before and cast to the call dtype after; both
passes are in the timings. Not deterministic: the atomics' order varies between runs.

Timed: backward only (delta, the kernels, the casts), from the same forward's out and
lse, interleaved over rounds (do_bench medians per round; median, min and max printed),
beside cuDNN's backward (SDPA, autograd.grad with the graph kept). Each variant's
gradients are checked against fp32 math attention on the first batch entry and 8 heads.

    python3 benchmarks/experiments/attention_backward_dq.py --built FOLDER
        [--cases causal full gqa d64] [--rounds 3] [--out FILE.json]
    TRITON_INTERPRET=1 python3 benchmarks/experiments/attention_backward_dq.py --check
        (CPU: pointer atomics at small odd shapes against float64)

FOLDER: benchmarks/specs/attention_anchors.yaml built (`fusegen build ... --out FOLDER`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attention_anchors import build, load  # noqa: E402

CASES = {  # name: (module, B, H, KV heads, S, D, causal)
    "causal": ("anchor_attention_causal", 4, 32, 32, 4096, 128, True),
    "full": ("anchor_attention_full", 4, 32, 32, 4096, 128, False),
    "gqa": ("anchor_attention_gqa", 4, 32, 8, 4096, 128, True),
    "d64": ("anchor_attention_causal_d64", 16, 16, 16, 1024, 64, True),
}
# (BLOCK_M query rows, BLOCK_N keys, warps, stages) of the one-kernel backward.
FUSED_CONFIGS = [(64, 128, 8, 2), (32, 128, 4, 2)]
LOG2E = 1.4426950408889634


@triton.jit
def _step(
    # fmt: off
    d_k, d_v, k, v, keys, start, q_at, do_at, dq_at, lse_row, delta_row, SQ, SKV,
    stride_s, dq_stride_s, scale_log2, scale,
    BLOCK_M: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    TMA: tl.constexpr,
    # fmt: on
):
    rows = start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    if TMA:
        q = q_at.load([start, 0])
        d_out = do_at.load([start, 0])
    else:
        q = tl.load(
            q_at + rows[:, None] * stride_s + offs_d[None, :], mask=(rows < SQ)[:, None], other=0.0
        )
        d_out = tl.load(
            do_at + rows[:, None] * stride_s + offs_d[None, :], mask=(rows < SQ)[:, None], other=0.0
        )
    lse = tl.load(lse_row + rows, mask=rows < SQ, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_row + rows, mask=rows < SQ, other=0.0)
    scores = tl.dot(k, tl.trans(q)) * scale_log2  # [keys, rows], base 2
    probs = tl.exp2(scores - lse[None, :])
    if MASKED:
        seen = (keys < SKV)[:, None] & (rows < SQ)[None, :]
        if CAUSAL:
            seen = seen & (keys[:, None] <= rows[None, :] + (SKV - SQ))
        probs = tl.where(seen, probs, 0.0)
    d_v += tl.dot(probs.to(d_out.dtype), d_out)
    d_probs = tl.dot(v, tl.trans(d_out))
    d_scores = (probs * (d_probs - delta[None, :])).to(q.dtype)
    d_k += tl.dot(d_scores, q)
    d_q = tl.dot(tl.trans(d_scores), k) * scale  # [rows, D]: this key block's share
    if TMA:
        dq_at.atomic_add([start, 0], d_q)
    else:
        tl.atomic_add(
            dq_at + rows[:, None] * dq_stride_s + offs_d[None, :], d_q, mask=(rows < SQ)[:, None]
        )
    return d_k, d_v


@triton.jit
def fused_backward(
    # fmt: off
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_ptr, SQ, SKV,
    sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sdq_b, sdq_h, sdq_s, scale_log2, scale,
    H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
    # fmt: on
):
    """dk, dv for BLOCK_N keys of one (batch, kv head); dq's shares added atomically.
    q, d_out share strides (sq_*), k, v, dk, dv share theirs (sk_*)."""
    pid_n = tl.program_id(0)
    batch = tl.program_id(1) // KVH
    kv_head = tl.program_id(1) % KVH
    keys = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    kv_offs = batch.to(tl.int64) * sk_b + kv_head * sk_h + keys[:, None] * sk_s + offs_d[None, :]
    k = tl.load(k_ptr + kv_offs, mask=(keys < SKV)[:, None], other=0.0)
    v = tl.load(v_ptr + kv_offs, mask=(keys < SKV)[:, None], other=0.0)
    shift = SKV - SQ
    lo = 0
    full_lo = 0
    if CAUSAL:  # rows before lo see none of these keys; from full_lo on, all of them
        lo = tl.maximum(0, pid_n * BLOCK_N - shift) // BLOCK_M * BLOCK_M
        full_lo = tl.cdiv(tl.maximum(0, pid_n * BLOCK_N + BLOCK_N - 1 - shift), BLOCK_M) * BLOCK_M
        full_lo = tl.minimum(full_lo, SQ // BLOCK_M * BLOCK_M)
    full_hi = SQ // BLOCK_M * BLOCK_M
    if (pid_n + 1) * BLOCK_N > SKV:  # keys past the end: every block masked
        full_lo = full_hi
    full_lo = tl.maximum(full_lo, lo)
    d_k = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    d_v = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    for member in range(H // KVH):
        head = kv_head * (H // KVH) + member
        q_at = q_ptr + batch.to(tl.int64) * sq_b + head * sq_h
        do_at = do_ptr + batch.to(tl.int64) * sq_b + head * sq_h
        dq_at = dq_ptr + batch.to(tl.int64) * sdq_b + head * sdq_h
        if TMA:
            q_at = tl.make_tensor_descriptor(
                q_at, shape=[SQ, D], strides=[sq_s, 1], block_shape=[BLOCK_M, D]
            )
            do_at = tl.make_tensor_descriptor(
                do_at, shape=[SQ, D], strides=[sq_s, 1], block_shape=[BLOCK_M, D]
            )
            dq_at = tl.make_tensor_descriptor(
                dq_at, shape=[SQ, D], strides=[sdq_s, 1], block_shape=[BLOCK_M, D]
            )
        bh = (batch * H + head).to(tl.int64)
        lse_row, delta_row = lse_ptr + bh * SQ, delta_ptr + bh * SQ
        for start in range(lo, full_lo, BLOCK_M):
            d_k, d_v = _step(d_k, d_v, k, v, keys, start, q_at, do_at, dq_at, lse_row, delta_row,
                             SQ, SKV, sq_s, sdq_s, scale_log2, scale,
                             BLOCK_M, D, True, CAUSAL, TMA)  # fmt: skip
        for start in range(full_lo, full_hi, BLOCK_M):
            d_k, d_v = _step(d_k, d_v, k, v, keys, start, q_at, do_at, dq_at, lse_row, delta_row,
                             SQ, SKV, sq_s, sdq_s, scale_log2, scale,
                             BLOCK_M, D, False, CAUSAL, TMA)  # fmt: skip
        for start in range(full_hi, SQ, BLOCK_M):
            d_k, d_v = _step(d_k, d_v, k, v, keys, start, q_at, do_at, dq_at, lse_row, delta_row,
                             SQ, SKV, sq_s, sdq_s, scale_log2, scale,
                             BLOCK_M, D, True, CAUSAL, TMA)  # fmt: skip
    tl.store(
        dk_ptr + kv_offs, (d_k * scale).to(dk_ptr.dtype.element_ty), mask=(keys < SKV)[:, None]
    )
    tl.store(dv_ptr + kv_offs, d_v.to(dv_ptr.dtype.element_ty), mask=(keys < SKV)[:, None])


def fused(module, q, k, v, out, lse, d_out, config, tma, causal):
    """(dq, dk, dv) of a bhsd module's call by the one-kernel backward."""
    block_m, block_n, warps, stages = config
    batch, heads, sq, dim = q.shape
    kv_heads, skv = k.shape[1], k.shape[2]
    delta = (out.float() * d_out.float()).sum(-1) if not q.is_cuda else _delta(module, out, d_out)
    d_q = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    d_k, d_v = torch.empty_like(k), torch.empty_like(v)
    scale = 1.0 / math.sqrt(dim)
    fused_backward[(triton.cdiv(skv, block_n), batch * kv_heads)](
        q, k, v, d_out, lse, delta, d_k, d_v, d_q, sq, skv,
        *q.stride()[:3], *k.stride()[:3], *d_q.stride()[:3], scale * LOG2E, scale,
        H=heads, KVH=kv_heads, D=dim, CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, TMA=tma,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return d_q.to(q.dtype), d_k, d_v


def _delta(module, out, d_out):
    """delta = rowsum(out * d_out) in fp32, by the runtime's own kernel."""
    rt = module._rt
    batch, heads, sq, dv = out.shape
    delta = torch.empty((batch, heads, sq), dtype=torch.float32, device=out.device)
    rt.backward_delta[(triton.cdiv(sq, 64), batch * heads)](
        out, d_out, delta, sq, out.stride(0), out.stride(1), out.stride(2),
        d_out.stride(0), d_out.stride(1), d_out.stride(2),
        HEADS=heads, DV=dv, BLOCK_M=64, BLOCK_D=triton.next_power_of_2(dv),
    )  # fmt: skip
    return delta


def math_grads(q, k, v, d_out, causal):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    kk, vv = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in leaves[1:])
    scores = leaves[0] @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        sq, skv = scores.shape[-2:]
        keep = torch.ones(sq, skv, dtype=torch.bool, device=q.device).tril(skv - sq)
        scores = scores.masked_fill(~keep, float("-inf"))
    out = torch.softmax(scores, -1) @ vv
    return torch.autograd.grad(out, leaves, d_out.double())


def _error(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def _inputs(batch, heads, kv_heads, seq, dim, device, dtype):
    torch.manual_seed(0)
    q = torch.randn(batch, heads, seq, dim, device=device, dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, seq, dim, device=device, dtype=dtype) for _ in "kv")
    return q, k, v, torch.randn_like(q)


def check() -> int:
    """Interpreter: pointer atomics at odd shapes, causal and not, MHA and GQA, fp16 (the
    interpreter's bf16 dot is wrong), against float64 math attention; the generated
    backward's error beside it."""
    import tempfile

    failed = False
    with tempfile.TemporaryDirectory() as folder:
        build(Path(folder))
        for name, heads, kv_heads, seq, causal in (
            ("anchor_attention_causal", 32, 32, 45, True),
            ("anchor_attention_full", 32, 32, 37, False),
            ("anchor_attention_gqa", 32, 8, 50, True),
        ):
            module = load(Path(folder), name)
            q, k, v, d_out = _inputs(1, heads, kv_heads, seq, 128, "cpu", torch.float16)
            out, lse = getattr(module, name)(q, k, v, return_lse=True)
            want = math_grads(q, k, v, d_out, causal)
            base = module._ATTENTION.backward((q, k, v), out, lse, d_out, (True,) * 3)
            got = fused(module, q, k, v, out, lse, d_out, (16, 32, 4, 1), False, causal)
            errors = [_error(g, w) for g, w in zip(got, want, strict=True)]
            base_errors = [_error(g, w) for g, w in zip(base, want, strict=True)]
            bad = max(errors) > 2 * max(base_errors) + 1e-3
            failed |= bad
            print(
                f"{name} S={seq}: fused {errors} generated {base_errors} {'BAD' if bad else 'ok'}"
            )
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


def run_case(case, args):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    from triton.testing import do_bench

    name, batch, heads, kv_heads, seq, dim, causal = CASES[case]
    module = load(Path(args.built), name)
    q, k, v, d_out = _inputs(batch, heads, kv_heads, seq, dim, "cuda", torch.bfloat16)
    out, lse = getattr(module, name)(q, k, v, return_lse=True)
    few = (slice(0, 1), slice(0, 8))
    few_kv = (slice(0, 1), slice(0, 8 * kv_heads // heads))
    want = math_grads(q[few].float(), k[few_kv].float(), v[few_kv].float(), d_out[few], causal)

    def errors(grads):
        return max(
            _error(g[s].float(), w)
            for g, w, s in zip(grads, want, (few, few_kv, few_kv), strict=True)
        )

    def generated():
        return module._ATTENTION.backward((q, k, v), out, lse, d_out, (True,) * 3)

    calls = {"generated, dq kernel": generated}
    for config in FUSED_CONFIGS[: args.configs]:
        for tma in (True, False):
            label = f"prototype {'tma' if tma else 'pointer'} {config}"
            calls[label] = lambda c=config, t=tma: fused(
                module, q, k, v, out, lse, d_out, c, t, causal
            )
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = sdpa(*leaves, is_causal=causal, enable_gqa=heads != kv_heads)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(ref, leaves, d_out, retain_graph=True)

    calls["cudnn"] = cudnn
    rows = {}
    for label, call in list(calls.items()):
        try:
            rows[label] = {"error": errors(call()), "ms": []}
        except Exception as exc:  # a variant the compiler refuses is a result
            rows[label] = {"error_text": f"{type(exc).__name__}: {str(exc)[:300]}"}
            calls.pop(label)
        print(case, label, rows[label], flush=True)
    labels = list(calls)
    for r in range(args.rounds):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            rows[label]["ms"].append(do_bench(calls[label]))
    print(f"\n{case} ({batch}, {heads}/{kv_heads}, {seq}, {dim}, causal={causal}), backward ms:")
    for label in sorted(labels, key=lambda x: statistics.median(rows[x]["ms"])):
        ms = rows[label]["ms"]
        spread = f"[{min(ms):.3f}-{max(ms):.3f}]"
        print(f"  {statistics.median(ms):.3f} {spread} err {rows[label]['error']:.2e} {label}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--built")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", type=int, default=len(FUSED_CONFIGS))
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.check:
        return check()
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )
    report = {"device": torch.cuda.get_device_name(), "cases": {}}
    for case in args.cases:
        report["cases"][case] = run_case(case, args)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
