"""A matmul chain's input gradient with the activation's derivative applied on the GEMM's
loads (a prologue), against the runtime's way: an elementwise pass writing d_pre, then
cuBLAS. Issue 28 asks for the first where it wins, and for the figure where cuBLAS does.

    python3 benchmarks/experiments/dgrad_prologue.py [--rounds 3] [--out FILE.json]
    TRITON_INTERPRET=1 python3 benchmarks/experiments/dgrad_prologue.py --check

Two chains at issue 28's shape, bf16, x [4096, 4096] and weights [14336, 4096]:
- gelu: y = gelu_tanh(acc + b), acc = x @ W.T; d_pre = dy * gelu_tanh'(acc + b) and
  dx = d_pre @ W;
- swiglu: y = silu(g) * u, g = x @ Wg.T, u = x @ Wu.T; dg = dy * u * silu'(g),
  du = dy * silu(g) and dx = dg @ Wg + du @ Wu.
The weight gradients (d_pre.T @ x) need d_pre in memory either way, so the derivative
prologue stores it too, from the programs of the first output-column block. Timed (GPU
time, CUDA graph replays, every variant in turn over the rounds), over a few tiles each:
the pass + cuBLAS (the runtime's); the derivative prologue (each of the K / BLOCK_K
column blocks computes the derivative of the same elements again); a product prologue
(the forward keeps the derivative's factors instead of the accumulators, same bytes,
and the GEMM multiplies them by dy); a plain Triton GEMM on d_pre (Triton's rate on
this GEMM); and cuBLAS's GEMM alone (what the dgrad costs when nothing else runs). Each
checked against float64 first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

GELU_C = tl.constexpr(1.5957691216057308)  # 2 * sqrt(2 / pi)


@triton.jit
def _gelu_grad(x):
    s = tl.sigmoid(GELU_C * (x + 0.044715 * x * x * x))
    return s + x * s * (1.0 - s) * GELU_C * (1.0 + 0.134145 * x * x)


@triton.jit
def _grads(dy, a, u, b_row, SWIGLU: tl.constexpr):
    """(the first operand's gradient, the second's) from fp32 tiles; gelu: (d_pre, 0)."""
    if SWIGLU:
        s = tl.sigmoid(a)
        return dy * u * (s + a * s * (1.0 - s)), dy * a * s
    else:
        return dy * _gelu_grad(a + b_row[None, :]), dy


@triton.jit
def _pass(dy_ptr, a_ptr, u_ptr, b_ptr, d1_ptr, d2_ptr, M, N, SWIGLU: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The runtime's way: d_pre (and du) written by a pass of their own."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    flat = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    dy = tl.load(dy_ptr + flat, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + flat, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + flat, mask=mask, other=0.0).to(tl.float32) if SWIGLU else a
    b = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    d1, d2 = _grads(dy, a, u, b, SWIGLU)
    tl.store(d1_ptr + flat, d1.to(d1_ptr.dtype.element_ty), mask=mask)
    if SWIGLU:
        tl.store(d2_ptr + flat, d2.to(d2_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _prologue(dy_ptr, a_ptr, u_ptr, b_ptr, w1_ptr, w2_ptr, dx_ptr, d1_ptr, d2_ptr, M, N, K,
              SWIGLU: tl.constexpr, MODE: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    """dx [M, K] = d1 @ w1 (+ d2 @ w2), d1 and d2 made as each [BLOCK_M, BLOCK_R] step is
    loaded. MODE 0: from dy, a (and u), the derivative computed here, and stored by the
    first column block's programs; 1: a (and u) are factors the forward kept (gelu'(pre);
    u * silu'(g) and silu(g)), one multiply by dy; 2: a (and u) are d1 (and d2): a plain
    GEMM, Triton's rate here."""
    pid = tl.program_id(0)
    blocks_m, blocks_k = tl.cdiv(M, BLOCK_M), tl.cdiv(K, BLOCK_K)
    group = pid // (GROUP_M * blocks_k)
    first = group * GROUP_M
    size = min(blocks_m - first, GROUP_M)
    pid_m = first + (pid % (GROUP_M * blocks_k)) % size
    pid_k = (pid % (GROUP_M * blocks_k)) // size
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    acc = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for r in range(0, N, BLOCK_R):
        offs_r = r + tl.arange(0, BLOCK_R)
        mask = mask_m[:, None] & (offs_r < N)[None, :]
        flat = offs_m[:, None].to(tl.int64) * N + offs_r[None, :]
        a = tl.load(a_ptr + flat, mask=mask, other=0.0)
        u = tl.load(u_ptr + flat, mask=mask, other=0.0) if SWIGLU else a
        if MODE == 2:
            d1, d2 = a, u
        else:
            dy = tl.load(dy_ptr + flat, mask=mask, other=0.0).to(tl.float32)
            if MODE == 1:
                d1, d2 = dy * a.to(tl.float32), dy * u.to(tl.float32)
            else:
                b = tl.load(b_ptr + offs_r, mask=offs_r < N, other=0.0).to(tl.float32)
                d1, d2 = _grads(dy, a.to(tl.float32), u.to(tl.float32), b, SWIGLU)
            d1, d2 = d1.to(dy_ptr.dtype.element_ty), d2.to(dy_ptr.dtype.element_ty)
        w_at = offs_r[:, None].to(tl.int64) * K + offs_k[None, :]
        w_mask = (offs_r < N)[:, None] & (offs_k < K)[None, :]
        acc = tl.dot(d1, tl.load(w1_ptr + w_at, mask=w_mask, other=0.0), acc)
        if MODE == 0 and pid_k == 0:
            tl.store(d1_ptr + flat, d1, mask=mask)
        if SWIGLU:
            acc = tl.dot(d2, tl.load(w2_ptr + w_at, mask=w_mask, other=0.0), acc)
            if MODE == 0 and pid_k == 0:
                tl.store(d2_ptr + flat, d2, mask=mask)
    out = offs_m[:, None].to(tl.int64) * K + offs_k[None, :]
    tl.store(
        dx_ptr + out, acc.to(dx_ptr.dtype.element_ty), mask=mask_m[:, None] & (offs_k < K)[None, :]
    )


def by_pass(t, swiglu):
    dy, a, u, b, w1, w2 = t
    m, n = dy.shape
    d1, d2 = torch.empty_like(dy), torch.empty_like(dy) if swiglu else dy
    _pass[(triton.cdiv(m, 64), triton.cdiv(n, 128))](
        dy, a, u, b, d1, d2, m, n, SWIGLU=swiglu, BLOCK_M=64, BLOCK_N=128, num_warps=4
    )
    dx = torch.mm(d1, w1)
    if swiglu:  # the gate's share added in cuBLAS's epilogue, as the runtime does
        dx = torch.addmm(dx, d2, w2, out=dx)
    return dx, d1, d2


def by_prologue(t, swiglu, cfg, mode=0):
    dy, a, u, b, w1, w2 = t
    m, n = dy.shape
    k = w1.shape[1]
    dx = torch.empty(m, k, device=dy.device, dtype=dy.dtype)
    d1, d2 = torch.empty_like(dy), torch.empty_like(dy) if swiglu else dy
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(k, cfg["BLOCK_K"]),)
    _prologue[grid](dy, a, u, b, w1, w2, dx, d1, d2, m, n, k, SWIGLU=swiglu, MODE=mode, **cfg)
    return dx, d1, d2


def for_mode(t, swiglu, mode):
    """Mode 0's inputs turned into what modes 1 and 2 read (see _prologue), rounded to
    the call's dtype as a forward that stored them would have."""
    if mode == 0:
        return t
    dy, a, u, b, w1, w2 = (v.double() for v in t)
    if swiglu:
        s = torch.sigmoid(a)
        f1, f2 = u * (s + a * s * (1 - s)), a * s
    else:
        x = a + b
        s = torch.sigmoid(1.5957691216057308 * (x + 0.044715 * x**3))
        f1 = s + x * s * (1 - s) * 1.5957691216057308 * (1 + 0.134145 * x * x)
        f2 = f1
    if mode == 2:
        f1, f2 = dy * f1, dy * f2
    dtype = t[0].dtype
    return t[0], f1.to(dtype), f2.to(dtype), t[3], t[4], t[5]


def reference(t, swiglu):
    dy, a, u, b, w1, w2 = (v.double() for v in t)
    if swiglu:
        s = torch.sigmoid(a)
        d1, d2 = dy * u * (s + a * s * (1 - s)), dy * a * s
        return d1 @ w1 + d2 @ w2, d1, d2
    x = a + b
    s = torch.sigmoid(1.5957691216057308 * (x + 0.044715 * x**3))
    d1 = dy * (s + x * s * (1 - s) * 1.5957691216057308 * (1 + 0.134145 * x * x))
    return d1 @ w1, d1, dy


def inputs(m, n, k, dev, dtype, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    dy, a, u = (torch.randn(m, n, device=dev, generator=g).to(dtype) for _ in range(3))
    b = torch.randn(n, device=dev, generator=g).to(dtype)
    w1, w2 = (torch.randn(n, k, device=dev, generator=g).mul(k**-0.5).to(dtype) for _ in range(2))
    return dy, a, u, b, w1, w2


def error(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def errors(got, want, swiglu):
    return max(error(g, w) for g, w in list(zip(got, want, strict=True))[: 3 if swiglu else 2])


MODES = ("derivative prologue", "product prologue", "plain Triton GEMM")
CONFIGS = [
    dict(BLOCK_M=bm, BLOCK_K=bk, BLOCK_R=br, GROUP_M=8, num_warps=w, num_stages=s)
    for bm, bk, br, w, s in (
        (128, 128, 64, 8, 3),
        (128, 128, 64, 8, 4),
        (128, 256, 64, 8, 3),
        (128, 128, 32, 8, 4),
        (64, 256, 64, 4, 3),
        (128, 64, 64, 4, 4),
    )
]


def check() -> None:
    cfg = dict(BLOCK_M=16, BLOCK_K=16, BLOCK_R=16, GROUP_M=2)
    for swiglu in (False, True):
        t = inputs(37, 70, 40, "cpu", torch.float16)  # ragged against every block
        want = reference(t, swiglu)
        e_pass = errors(by_pass(t, swiglu), want, swiglu)
        e_pro = [
            error(by_prologue(for_mode(t, swiglu, mode), swiglu, cfg, mode)[0], want[0])
            for mode in (0, 1, 2)
        ]
        print(f"swiglu={swiglu}: pass {e_pass:.1e}, prologue modes 0-2 {e_pro}")
        assert max(e_pass, *e_pro) < 2e-2, (e_pass, e_pro)


def chain_row(name, swiglu, shape, rounds):
    """Every variant checked against float64, then timed in turn over the rounds."""
    from quantized_chains import graph_ms

    m, n, k = shape
    t = inputs(m, n, k, "cuda", torch.bfloat16)
    want = reference(t, swiglu)
    variants = {"pass + cuBLAS": lambda i: by_pass(t, swiglu)}
    errs = {"pass + cuBLAS": errors(by_pass(t, swiglu), want, swiglu)}
    modes_in = {}
    for mode, cfg in [(mode, cfg) for mode in (0, 1, 2) for cfg in CONFIGS]:
        key = f"{MODES[mode]} " + json.dumps(cfg)
        if mode not in modes_in:
            modes_in[mode] = for_mode(t, swiglu, mode)
        given = modes_in[mode]
        try:
            got = by_prologue(given, swiglu, cfg, mode)
            errs[key] = errors(got, want, swiglu) if mode == 0 else error(got[0], want[0])
        except Exception as exc:  # noqa: BLE001  (a tile out of shared memory)
            print(f"  {name} {key}: {type(exc).__name__}")
            continue
        variants[key] = lambda i, cfg=cfg, mode=mode, given=given: by_prologue(
            given, swiglu, cfg, mode
        )
    if swiglu:
        variants["cuBLAS GEMMs alone"] = lambda i: torch.addmm(torch.mm(t[0], t[4]), t[1], t[5])
    else:
        variants["cuBLAS GEMM alone"] = lambda i: torch.mm(t[0], t[4])
    del want
    times = {key: [] for key in variants}
    order = list(variants)
    for r in range(rounds):
        for key in order[r % len(order) :] + order[: r % len(order)]:
            times[key].append(graph_ms(variants[key], calls=5))
    print(f"{name} {m}x{n}x{k}: input gradient, GPU ms, {rounds} rounds interleaved")
    for key, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
        err = errs.get(key)
        note = f"  err {err:.1e}" if err is not None else ""
        print(f"  {statistics.median(ts):.3f} [{min(ts):.3f}-{max(ts):.3f}]  {key}{note}")
    return {"times": times, "errors": errs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shape", default="4096x14336x4096", help="M x N x K")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.check:
        if os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("--check runs under TRITON_INTERPRET=1")
        check()
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    m, n, k = (int(v) for v in args.shape.split("x"))
    results = {}
    for swiglu in (False, True):
        name = "swiglu" if swiglu else "gelu"
        results[name] = chain_row(name, swiglu, (m, n, k), args.rounds)
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
