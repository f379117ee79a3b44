"""int4 weight-only SwiGLU at decode (4096 -> 14336, group 128, zero points): kernel
variants checked against float64 and timed on GPU time before the generator takes one.

    python3 benchmarks/experiments/int4_decode_variants.py --built FOLDER [--rows 1 16]
        [--rounds 3] [--out FILE.json]

FOLDER: `fusegen build specs/quantized.yaml benchmarks/specs/anchors.yaml`. Variants:
- generated: llama_mlp_int4 as its launcher tunes it, and over a wider grid of its own
  configs (config=, no tuning): tiles, warps and stages outside its CONFIGS;
- gemv (one row): no tensor cores; each program owns BLOCK_N weight rows and walks K
  BLOCK_K values a step: the low and high nibbles of each byte times x's even and odd
  elements, summed per group of 128, the zero point taken off as z * sum(x) of the group
  (one product a group, not one a weight), the scale applied per group. The nibbles made
  floats by `.to(float32)` (I2F, a quarter-rate instruction) or by OR-ing them into the
  mantissa of 2**23 and subtracting it (MAGIC: two full-rate instructions, exact);
- tinygemm (torch._weight_int4pack_mm) x 2 + silu * mul, fusegen's bf16 chain.
GPU time from CUDA-graph replays of 20 calls, each on its own weight copy (more than L2),
variants alternated over --rounds rounds; median [min-max] and GB/s of the int4 bytes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quantized_chains import (  # noqa: E402
    copies_for,
    graph_ms,
    int4_weights,
    load,
    max_error,
    tinygemm_weight,
)

K, N, GROUP = 4096, 14336, 128


@triton.jit
def _nibble_floats(b, MAGIC: tl.constexpr):
    """The low and high nibbles of uint8 `b` as exact fp32 values 0..15."""
    lo = (b & 15).to(tl.int32)
    hi = (b >> 4).to(tl.int32)
    if MAGIC:
        # 2**23 + n has n as its mantissa's last bits: OR, bitcast, subtract (exact).
        lo = (lo | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        hi = (hi | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        return lo, hi
    return lo.to(tl.float32), hi.to(tl.float32)


@triton.jit
def _group_sums(w_ptr, s_ptr, z_ptr, offs_n, mask_n, offs_b, xe, xo, xsum, k0,
                K: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, MAGIC: tl.constexpr):  # fmt: skip
    """sum over this step's K of (q - z) * s * x for BLOCK_N weight rows: [BLOCK_N]."""
    b = tl.load(w_ptr + offs_n[:, None] * (K // 2) + offs_b[None, :], mask=mask_n[:, None], other=0)
    lo, hi = _nibble_floats(b, MAGIC)
    part = lo * xe[None, :] + hi * xo[None, :]  # [BLOCK_N, BLOCK_K // 2]
    part = tl.sum(tl.reshape(part, (BLOCK_N, BLOCK_K // GROUP, GROUP // 2)), axis=2)
    offs_g = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
    at = offs_n[:, None] * (K // GROUP) + offs_g[None, :]
    z = tl.load(z_ptr + at, mask=mask_n[:, None], other=0).to(tl.float32)
    s = tl.load(s_ptr + at, mask=mask_n[:, None], other=0.0).to(tl.float32)
    return tl.sum((part - z * xsum[None, :]) * s, axis=1)


@triton.jit
def _swiglu_int4_gemv(x_ptr, wg_ptr, sg_ptr, zg_ptr, wu_ptr, su_ptr, zu_ptr, out_ptr, N,
                      K: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, MAGIC: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    acc_g = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        xe = tl.load(x_ptr + 2 * offs_b).to(tl.float32)
        xo = tl.load(x_ptr + 2 * offs_b + 1).to(tl.float32)
        xsum = tl.sum(tl.reshape(xe + xo, (BLOCK_K // GROUP, GROUP // 2)), axis=1)
        acc_g += _group_sums(wg_ptr, sg_ptr, zg_ptr, offs_n, mask_n, offs_b, xe, xo, xsum, k0,
                             K, GROUP, BLOCK_N, BLOCK_K, MAGIC)  # fmt: skip
        acc_u += _group_sums(wu_ptr, su_ptr, zu_ptr, offs_n, mask_n, offs_b, xe, xo, xsum, k0,
                             K, GROUP, BLOCK_N, BLOCK_K, MAGIC)  # fmt: skip
    y = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(out_ptr + offs_n, y.to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _gemv3_weight(w_ptr, s_ptr, z_ptr, offs_n, mask_n, offs_b, offs_g, xe, xo, xsum, acc3, accz,
                  K: tl.constexpr, GROUP: tl.constexpr, DEFER: tl.constexpr):  # fmt: skip
    """One weight's share of a K step, its bytes loaded [BLOCK_N, GROUPS, GROUP // 2] (no
    reshape); DEFER: the products kept per element and reduced after the loop."""
    b = tl.load(w_ptr + offs_n[:, None, None] * (K // 2) + offs_b[None, :, :],
                mask=mask_n[:, None, None], other=0)  # fmt: skip
    lo = (b & 15).to(tl.float32)
    hi = (b >> 4).to(tl.float32)
    part = lo * xe[None, :, :] + hi * xo[None, :, :]
    at = offs_n[:, None] * (K // GROUP) + offs_g[None, :]
    z = tl.load(z_ptr + at, mask=mask_n[:, None], other=0).to(tl.float32)
    s = tl.load(s_ptr + at, mask=mask_n[:, None], other=0.0).to(tl.float32)
    if DEFER:
        acc3 += part * s[:, :, None]
        accz += z * s * xsum[None, :]
    else:
        accz += (tl.sum(part, axis=2) - z * xsum[None, :]) * s
    return acc3, accz


@triton.jit
def _swiglu_int4_gemv3(x_ptr, wg_ptr, sg_ptr, zg_ptr, wu_ptr, su_ptr, zu_ptr, out_ptr, N,
                       K: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                       GROUPS: tl.constexpr, DEFER: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    g = tl.arange(0, GROUPS)
    j = tl.arange(0, GROUP // 2)
    shape3: tl.constexpr = (BLOCK_N, GROUPS, GROUP // 2) if DEFER else (1, 1, 1)
    acc3_g = tl.zeros(shape3, dtype=tl.float32)
    acc3_u = tl.zeros(shape3, dtype=tl.float32)
    accz_g = tl.zeros((BLOCK_N, GROUPS), dtype=tl.float32)
    accz_u = tl.zeros((BLOCK_N, GROUPS), dtype=tl.float32)
    for g0 in range(0, K // GROUP, GROUPS):
        offs_g = g0 + g
        offs_b = offs_g[:, None] * (GROUP // 2) + j[None, :]
        xe = tl.load(x_ptr + 2 * offs_b).to(tl.float32)
        xo = tl.load(x_ptr + 2 * offs_b + 1).to(tl.float32)
        xsum = tl.sum(xe + xo, axis=1)
        acc3_g, accz_g = _gemv3_weight(wg_ptr, sg_ptr, zg_ptr, offs_n, mask_n, offs_b, offs_g,
                                       xe, xo, xsum, acc3_g, accz_g, K, GROUP, DEFER)  # fmt: skip
        acc3_u, accz_u = _gemv3_weight(wu_ptr, su_ptr, zu_ptr, offs_n, mask_n, offs_b, offs_g,
                                       xe, xo, xsum, acc3_u, accz_u, K, GROUP, DEFER)  # fmt: skip
    if DEFER:
        acc_g = tl.sum(tl.sum(acc3_g, axis=2), axis=1) - tl.sum(accz_g, axis=1)
        acc_u = tl.sum(tl.sum(acc3_u, axis=2), axis=1) - tl.sum(accz_u, axis=1)
    else:
        acc_g = tl.sum(accz_g, axis=1)
        acc_u = tl.sum(accz_u, axis=1)
    y = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(out_ptr + offs_n, y.to(out_ptr.dtype.element_ty), mask=mask_n)


def gemv3(x, pg, sg, zg, pu, su, zu, block_n, groups, warps, defer, stages):
    out = torch.empty(1, N, device=x.device, dtype=x.dtype)
    _swiglu_int4_gemv3[(triton.cdiv(N, block_n),)](
        x, pg, sg, zg, pu, su, zu, out, N, K=K, GROUP=GROUP, BLOCK_N=block_n,
        GROUPS=groups, DEFER=defer, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def gemv(x, pg, sg, zg, pu, su, zu, block_n, block_k, warps, magic):
    out = torch.empty(1, N, device=x.device, dtype=x.dtype)
    _swiglu_int4_gemv[(triton.cdiv(N, block_n),)](
        x, pg, sg, zg, pu, su, zu, out, N, K=K, GROUP=GROUP, BLOCK_N=block_n,
        BLOCK_K=block_k, MAGIC=magic, num_warps=warps,
    )  # fmt: skip
    return out


GEMV_GRID = [
    dict(block_n=bn, block_k=bk, warps=w, magic=mg)
    for bn, bk, w, mg in itertools.product((8, 16, 32), (256, 512, 1024), (4, 8), (0, 1))
    if bn * bk // 2 <= 16384
]
GEMV3_GRID = [
    dict(block_n=bn, groups=gs, warps=w, defer=d, stages=st)
    for bn, gs, w, d, st in itertools.product((4, 8, 16), (4, 8), (4, 8), (0, 1), (1, 3))
    if not (d and bn * gs > 64)
]
DOT_GRID = [
    {"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "num_warps": w, "num_stages": s}
    for bn, bk, w, s in itertools.product((16, 32, 64), (64, 128), (4, 8), (2, 3, 5))
]


def sweep(name, fns: dict, copies) -> dict:
    """GPU ms of each variant once (for a first cut), failures noted."""
    out = {}
    for key, fn in fns.items():
        try:
            out[key] = graph_ms(fn)
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is data
            out[key] = f"{type(exc).__name__}: {str(exc)[:120]}"
    ranked = sorted((v, k) for k, v in out.items() if isinstance(v, float))
    print(f"{name}: {len(ranked)} of {len(out)} ran; fastest:", flush=True)
    for ms, key in ranked[:8]:
        print(f"  {ms * 1e3:7.1f} us  {key}", flush=True)
    return out


def row(built: Path, m: int, rounds: int) -> dict:
    mod = load(built, "llama_mlp_int4")
    bf16 = load(built, "anchor_swiglu")
    dev = "cuda"
    int4_bytes = 2 * (N * K // 2 + 2 * N * (K // GROUP) * 2 + N * (K // GROUP))
    copies = copies_for(int4_bytes)

    sets = [int4_weights(N, K, GROUP, dev) + int4_weights(N, K, GROUP, dev) for _ in range(copies)]
    x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
    s0 = sets[0]
    want = mod.reference(
        x.double(), s0[1], s0[2].double(), s0[3], s0[5], s0[6].double(), s0[7],
        out_dtype=torch.float64,
    )  # fmt: skip

    def packed(i):
        s = sets[i % copies]
        return s[1], s[2], s[3], s[5], s[6], s[7]

    candidates = {"generated (tuned)": lambda i: mod.llama_mlp_int4(x, *packed(i))}
    candidates["generated (tuned)"](0)
    print("generated (tuned) chose", mod.last_launch()["config"], flush=True)
    swept = {}
    dot = {
        json.dumps(c): (lambda i, c=c: mod.llama_mlp_int4(x, *packed(i), config=c))
        for c in DOT_GRID
    }
    swept["generated"] = sweep(f"generated kernel, {m} rows", dot, copies)
    if m == 1:
        errors = {}
        fns = {}
        for c in GEMV_GRID:
            key = json.dumps(c)
            try:
                errors[key] = max_error(gemv(x, *packed(0), **c), want)
            except Exception as exc:  # noqa: BLE001
                errors[key] = f"{type(exc).__name__}: {str(exc)[:120]}"
                continue
            fns[key] = lambda i, c=c: gemv(x, *packed(i), **c)
        bad = {k: e for k, e in errors.items() if not isinstance(e, float) or e > 1e-2}
        print(f"gemv: {len(errors) - len(bad)} of {len(errors)} configs within 1e-2 of float64",
              flush=True)  # fmt: skip
        for k, e in list(bad.items())[:5]:
            print(f"  wrong or failed: {k}: {e}")
        swept["gemv"] = sweep("gemv, 1 row", fns, copies)
        best = min((v, k) for k, v in swept["gemv"].items() if isinstance(v, float))[1]
        chosen = json.loads(best)
        candidates[f"gemv {best}"] = lambda i, c=chosen: gemv(x, *packed(i), **c)
        swept["gemv_errors"] = errors
        fns = {}
        for c in GEMV3_GRID:
            key = json.dumps(c)
            try:
                errors[key] = max_error(gemv3(x, *packed(0), **c), want)
            except Exception as exc:  # noqa: BLE001
                errors[key] = f"{type(exc).__name__}: {str(exc)[:120]}"
                print(f"  gemv3 failed: {key}: {errors[key]}", flush=True)
                continue
            if errors[key] > 1e-2:
                print(f"  gemv3 wrong: {key}: {errors[key]}", flush=True)
            fns[key] = lambda i, c=c: gemv3(x, *packed(i), **c)
        swept["gemv3"] = sweep("gemv3 (3-D loads), 1 row", fns, copies)
        ranked3 = [(v, k) for k, v in swept["gemv3"].items() if isinstance(v, float)]
        if ranked3:
            best = min(ranked3)[1]
            chosen3 = json.loads(best)
            candidates[f"gemv3 {best}"] = lambda i, c=chosen3: gemv3(x, *packed(i), **c)
    ranked = [(v, k) for k, v in swept["generated"].items() if isinstance(v, float)]
    if ranked:
        swept_best = json.loads(min(ranked)[1])
        candidates[f"generated {min(ranked)[1]}"] = lambda i, c=swept_best: mod.llama_mlp_int4(
            x, *packed(i), config=c
        )

    # Anchors: tinygemm in its own layout; fusegen's bf16 chain.
    tiny = [[tinygemm_weight(q, scale) for q, scale in ((s[0], s[2]), (s[4], s[6]))] for s in sets]
    bf16_copies = copies_for(2 * N * K * 2)
    dense = [
        tuple(torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(2))
        for _ in range(bf16_copies)
    ]

    def tinygemm(i):
        (wg, szg), (wu, szu) = tiny[i % copies]
        return F.silu(torch._weight_int4pack_mm(x, wg, GROUP, szg)) * torch._weight_int4pack_mm(
            x, wu, GROUP, szu
        )

    candidates["tinygemm"] = tinygemm
    candidates["fusegen bf16"] = lambda i: bf16.anchor_swiglu(x, *dense[i % bf16_copies])
    errors = {}
    for key, fn in candidates.items():
        if key.startswith(("generated", "gemv")):
            errors[key] = max_error(fn(0), want)
    times = {key: [] for key in candidates}
    order = list(candidates)
    for r in range(rounds):
        for key in order[r % len(order) :] + order[: r % len(order)]:
            times[key].append(graph_ms(candidates[key]))
    print(f"\n{m} x {K} -> {N} x2, int4 group {GROUP} + zero points (GPU us per call)")
    for key, t in times.items():
        med = statistics.median(t)
        bw = f"{int4_bytes / med / 1e6:6.0f} GB/s" if key != "fusegen bf16" else ""
        err = f"  error {errors[key]:.1e}" if key in errors else ""
        print(f"  {med * 1e3:7.1f} [{min(t) * 1e3:.1f}-{max(t) * 1e3:.1f}] {bw}  {key}{err}")
    return {"rows": m, "times_ms": times, "errors": errors, "swept": swept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--built", required=True, type=Path)
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    sys.path.insert(0, str(args.built))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    results = []
    with torch.no_grad():
        for m in args.rows:
            results.append(row(args.built, m, args.rounds))
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
