"""int4 weight-only SwiGLU at 16 rows (4096 -> 14336 x2, group 128, zero points): the
tensor-core tile path's dequantization, variant by variant, checked against float64 and
timed on GPU time before the generator takes one.

    python3 benchmarks/experiments/int4_tile_variants.py --built FOLDER [--rows 16]
        [--rounds 3] [--out FILE.json]
    python3 benchmarks/experiments/int4_tile_variants.py --registers   # sm_90, no GPU

FOLDER: `fusegen build specs/quantized.yaml benchmarks/specs/anchors.yaml`. The generated
tile path spends most of a weight's instructions before the dot: the nibble widened to
int32, its group's zero point subtracted, an int-to-float conversion (I2F, quarter rate),
then bf16. Variants of one kernel, flags as constexprs:
- int: that (the generated kernel's arithmetic);
- zero-out: the zero point taken off after the dot, as z * sum(x) over the step (BLOCK_K
  lies within one group), one product an output a step, not one a weight;
- magic: zero-out, and each nibble made a bf16 by OR-ing it into 128.0's bits (0x4300:
  128 + q exactly, no conversion instruction), the 128 joining the zero point;
- swap-split: swap with the bytes' low and high nibbles not interleaved: two dots of
  BLOCK_K / 2, against x's even and odd columns (split in registers);
- swap-words: swap with the weights read as 32-bit words, two nibbles (j and j + 4 of a
  word) made bf16 by one AND-OR of the shifted word, eight dots of K 16 a step against
  x's columns in that order (x padded to 16 rows: the timing runs 16);
- swap (with magic; swap-int, swap-zero-out with those): out.T = w @ x.T, the
  dequantized weight tile the dot's first operand, which Hopper's wgmma reads from
  registers (no shared-memory round trip) at M = BLOCK_N; at 16 rows the plain order is
  an mma.sync of M 16.
Against: the generated kernel as it tunes itself and at transposed tiles (it has SWAP_AB
and _nibble_floats), fusegen's bf16 chain and bf16 eager.
GPU time from CUDA-graph replays of 20 calls, each on its own weight copy (more than L2),
variants alternated over --rounds rounds; median [min-max] and GB/s of the int4 bytes.
--registers compiles each variant's configs for sm_90 on the CPU: registers, spills,
and whether the dot became a wgmma.
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

K, N, GROUP = 4096, 14336, 128
VARIANTS = {  # name: (ZERO_OUT, MAGIC, SWAP)
    "int": (0, 0, 0),
    "zero-out": (1, 0, 0),
    "magic": (1, 1, 0),
    "swap": (1, 1, 1),
    "swap-int": (0, 0, 1),
    "swap-zero-out": (1, 0, 1),
    "swap-split": (1, 1, 2),
    "swap-words": (1, 1, 3),
}


@triton.jit
def _bf16_halves(v):
    """An int32 tensor's two 16-bit halves as bf16 (register moves, no arithmetic)."""
    return tl.inline_asm_elementwise(
        "mov.b32 {$0, $1}, $2;", "=h,=h,r", [v], dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _words_step(acc, x_sum, x_row_ptr, w_ptr, s_ptr, z_ptr, offs_n, mask_n, k,
                K: tl.constexpr, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """swap-words: the weights read as 32-bit words of 8 nibbles (K index 8w + i at bit
    4i); one AND-OR (LOP3) of a shifted word makes two bf16 128 + q at once, nibbles j
    and j + 4; eight dots of K 16 a step meet them with x's matching columns."""
    offs_w = k * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
    words = tl.load(w_ptr.to(tl.pointer_type(tl.int32)) + offs_n[:, None] * (K // 8)
                    + offs_w[None, :], mask=mask_n[:, None], other=0)  # fmt: skip
    at = offs_n * (K // GROUP) + (k * BLOCK_K) // GROUP
    z = tl.load(z_ptr + at, mask=mask_n, other=0).to(tl.float32) + 128.0
    s = tl.load(s_ptr + at, mask=mask_n, other=0.0).to(tl.float32)
    d = tl.zeros(acc.shape, dtype=tl.float32)
    for j in tl.static_range(4):
        low, high = _bf16_halves(((words >> (4 * j)) & 0x000F000F) | 0x43004300)
        x_low = tl.load(x_row_ptr + 8 * offs_w[None, :] + j)
        x_high = tl.load(x_row_ptr + 8 * offs_w[None, :] + j + 4)
        d = tl.dot(low, tl.trans(x_low), d)
        d = tl.dot(high, tl.trans(x_high), d)
    acc += (d - z[:, None] * x_sum[None, :]) * s[:, None]
    return acc


@triton.jit
def _weight_step(acc, x, x_sum, x_row_ptr, w_ptr, s_ptr, z_ptr, offs_n, mask_n, k,
                 K: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, ZERO_OUT: tl.constexpr, MAGIC: tl.constexpr,
                 SWAP: tl.constexpr):  # fmt: skip
    """acc plus one K step of x @ w.T, w = (q - z) * s for this step's group."""
    if SWAP == 3:
        return _words_step(acc, x_sum, x_row_ptr, w_ptr, s_ptr, z_ptr, offs_n, mask_n, k,
                           K, GROUP, BLOCK_K)  # fmt: skip
    offs_b = k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    b = tl.load(w_ptr + offs_n[:, None] * (K // 2) + offs_b[None, :], mask=mask_n[:, None], other=0)
    at = offs_n * (K // GROUP) + (k * BLOCK_K) // GROUP
    z = tl.load(z_ptr + at, mask=mask_n, other=0)
    s = tl.load(s_ptr + at, mask=mask_n, other=0.0).to(tl.float32)
    if MAGIC:
        b16 = b.to(tl.int16)
        w = tl.reshape(tl.join((b16 & 15) | 0x4300, (b16 >> 4) | 0x4300), (BLOCK_N, BLOCK_K))
        w = w.to(tl.bfloat16, bitcast=True)  # 128 + q, exact
        z_f = z.to(tl.float32) + 128.0
    else:
        w = tl.reshape(tl.join(b & 15, b >> 4), (BLOCK_N, BLOCK_K)).to(tl.int32)
        if not ZERO_OUT:
            w = w - z.to(tl.int32)[:, None]
        w = w.to(tl.bfloat16)
        z_f = z.to(tl.float32)
    if SWAP == 2:  # no interleave: the low nibbles meet x's even columns, the high its odd
        low = ((b.to(tl.int16) & 15) | 0x4300).to(tl.bfloat16, bitcast=True)
        high = ((b.to(tl.int16) >> 4) | 0x4300).to(tl.bfloat16, bitcast=True)
        x_pairs = tl.reshape(x, (x.shape[0], BLOCK_K // 2, 2))
        x_even, x_odd = tl.split(x_pairs)
        d = tl.dot(low, tl.trans(x_even))
        d = tl.dot(high, tl.trans(x_odd), d)
        d = d - z_f[:, None] * x_sum[None, :]
        acc += d * s[:, None]
    elif SWAP:
        d = tl.dot(w, tl.trans(x))  # [BLOCK_N, BLOCK_M]
        if ZERO_OUT:
            d = d - z_f[:, None] * x_sum[None, :]
        acc += d * s[:, None]
    else:
        d = tl.dot(x, tl.trans(w))  # [BLOCK_M, BLOCK_N]
        if ZERO_OUT:
            d = d - x_sum[:, None] * z_f[None, :]
        acc += d * s[None, :]
    return acc


@triton.jit
def _swiglu_int4_tile(x_ptr, wg_ptr, sg_ptr, zg_ptr, wu_ptr, su_ptr, zu_ptr, out_ptr,
                      partials_ptr, arrivals_ptr, M, N,
                      K: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                      ZERO_OUT: tl.constexpr, MAGIC: tl.constexpr, SWAP: tl.constexpr):  # fmt: skip
    tile = tl.program_id(0) // SPLIT_K
    split = tl.program_id(0) % SPLIT_K
    offs_m = tl.arange(0, BLOCK_M)  # every row in one tile: decode
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    shape: tl.constexpr = (BLOCK_N, BLOCK_M) if SWAP else (BLOCK_M, BLOCK_N)
    x_row_ptr = x_ptr + offs_m[:, None] * K  # rows past M: x is padded to BLOCK_M rows
    acc_g = tl.zeros(shape, dtype=tl.float32)
    acc_u = tl.zeros(shape, dtype=tl.float32)
    steps: tl.constexpr = K // BLOCK_K // SPLIT_K
    for k in range(split * steps, (split + 1) * steps):
        offs_k = k * BLOCK_K + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask_m[:, None], other=0.0)
        x_sum = tl.sum(x.to(tl.float32), axis=1)
        acc_g = _weight_step(acc_g, x, x_sum, x_row_ptr, wg_ptr, sg_ptr, zg_ptr, offs_n, mask_n, k,
                             K, GROUP, BLOCK_N, BLOCK_K, ZERO_OUT, MAGIC, SWAP)  # fmt: skip
        acc_u = _weight_step(acc_u, x, x_sum, x_row_ptr, wu_ptr, su_ptr, zu_ptr, offs_n, mask_n, k,
                             K, GROUP, BLOCK_N, BLOCK_K, ZERO_OUT, MAGIC, SWAP)  # fmt: skip
    if SWAP:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    in_bounds = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K > 1:  # the last program of a tile to arrive sums the partials in order
        rows = offs_m[:, None] * N + offs_n[None, :]
        tl.store(partials_ptr + split * 2 * M * N + rows, acc_g, mask=in_bounds)
        tl.store(partials_ptr + (split * 2 + 1) * M * N + rows, acc_u, mask=in_bounds)
        tl.debug_barrier()
        arrived = tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel", scope="gpu")
        last = arrived == SPLIT_K - 1
        tl.atomic_xchg(arrivals_ptr + tile, 0, mask=last, sem="relaxed", scope="gpu")
        in_bounds = in_bounds & last
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            at = partials_ptr + s * 2 * M * N + rows
            acc_g += tl.load(at, mask=in_bounds, other=0.0, cache_modifier=".cg")
            acc_u += tl.load(at + M * N, mask=in_bounds, other=0.0, cache_modifier=".cg")
    y = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], y.to(tl.bfloat16), mask=in_bounds)


CONFIGS = [
    dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=st)
    for bn, bk, sk, w, st in itertools.product((32, 64, 128), (64, 128), (1, 2, 4), (4,), (3, 4))
]


# The generated kernel at transposed decode tiles (SWAP_AB), beside its tuned choice.
GENERATED_CONFIGS = [
    {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4,
     "num_stages": st, "SPLIT_K": sk}
    for st, sk in ((3, 4), (4, 4), (4, 1))
]  # fmt: skip


def usable(variant: str, config: dict) -> bool:
    # wgmma's M is 64 a warpgroup: the swapped dot needs BLOCK_N 64 and up; swap-words'
    # dots take an eighth of BLOCK_K, 16 at least.
    if variant == "swap-words" and config["BLOCK_K"] < 128:
        return False
    return not variant.startswith("swap") or config["BLOCK_N"] >= 64


class Tile:
    """One variant at one config, with its split-K scratch."""

    def __init__(self, variant: str, config: dict, m: int, device: str):
        self.flags = dict(zip(("ZERO_OUT", "MAGIC", "SWAP"), VARIANTS[variant], strict=True))
        self.config = dict(config)
        self.m = m
        split = config["SPLIT_K"]
        self.partials = torch.empty(split * 2 * m * N, device=device, dtype=torch.float32)
        self.arrivals = torch.zeros(triton.cdiv(N, config["BLOCK_N"]), device=device,
                                    dtype=torch.int32)  # fmt: skip

    def __call__(self, x, pg, sg, zg, pu, su, zu):
        c = self.config
        out = torch.empty(self.m, N, device=x.device, dtype=torch.bfloat16)
        grid = (triton.cdiv(N, c["BLOCK_N"]) * c["SPLIT_K"],)
        _swiglu_int4_tile[grid](
            x, pg, sg, zg, pu, su, zu, out, self.partials, self.arrivals, self.m, N,
            K=K, GROUP=GROUP, BLOCK_M=16, **self.flags, **c,
        )  # fmt: skip
        return out


def registers() -> None:
    """Each variant compiled for sm_90 at each config: ptxas's report, wgmma or not."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quant_registers import compile_sm90, register_line

    types = {n: "*bf16" for n in ("x_ptr", "out_ptr")}
    types.update({n: "*u8" for n in ("wg_ptr", "zg_ptr", "wu_ptr", "zu_ptr")})
    types.update({"sg_ptr": "*bf16", "su_ptr": "*bf16", "partials_ptr": "*fp32"})
    types.update({"arrivals_ptr": "*i32", "M": "i32", "N": "i32"})
    names = [p.name for p in _swiglu_int4_tile.params]
    types = {n: types.get(n, "constexpr") for n in names}
    hints = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr")}
    for variant, config in itertools.product(VARIANTS, CONFIGS):
        if not usable(variant, config) or config["num_stages"] != 3:
            continue
        flags = dict(zip(("ZERO_OUT", "MAGIC", "SWAP"), VARIANTS[variant], strict=True))
        meta = {"K": K, "GROUP": GROUP, "BLOCK_M": 16, **flags}
        meta.update({k: v for k, v in config.items() if k.isupper()})
        options = {k: v for k, v in config.items() if not k.isupper()}
        constexprs = {(names.index(n),): v for n, v in meta.items()}
        try:
            compiled = compile_sm90(_swiglu_int4_tile, types, constexprs, options, hints)
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is data
            print(f"{variant:9s} {config}: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
            continue
        mma = "wgmma" if "wgmma" in compiled.asm["ptx"] else "mma.sync"
        line = register_line(compiled, config["num_warps"])
        print(f"{variant:9s} {config}: {mma}; {line}", flush=True)


def row(built: Path, m: int, rounds: int, variants: list[str]) -> dict:
    from quantized_chains import copies_for, graph_ms, int4_weights, load, max_error, timed

    mod = load(built, "llama_mlp_int4")
    bf16 = load(built, "anchor_swiglu")
    dev = "cuda"
    int4_bytes = 2 * (N * K // 2 + 2 * N * (K // GROUP) * 2 + N * (K // GROUP))
    copies = copies_for(int4_bytes)

    sets = [int4_weights(N, K, GROUP, dev)[1:] + int4_weights(N, K, GROUP, dev)[1:]
            for _ in range(copies)]  # fmt: skip
    x = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
    want = mod.reference(x.double(), sets[0][0], sets[0][1].double(), sets[0][2], sets[0][3],
                         sets[0][4].double(), sets[0][5], out_dtype=torch.float64)  # fmt: skip

    def of(fn):
        return lambda i: fn(x, *sets[i % copies])

    swept, errors = {}, {}
    for variant, config in itertools.product(variants, CONFIGS):
        if not usable(variant, config):
            continue
        key = f"{variant} {json.dumps(config)}"
        try:
            tile = Tile(variant, config, m, dev)
            errors[key] = max_error(tile(x, *sets[0]), want)
            swept[key] = graph_ms(of(tile))
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is data
            swept[key] = f"{type(exc).__name__}: {str(exc)[:120]}"
    wrong = {k: e for k, e in errors.items() if e > 1e-2}
    print(f"{m} rows: {len(swept)} swept, {len(wrong)} wrong", flush=True)
    for k, e in list(wrong.items())[:5]:
        print(f"  wrong: {k}: {e:.2e}")
    candidates = {"generated (tuned)": of(mod.llama_mlp_int4)}
    candidates["generated (tuned)"](0)
    print("generated (tuned) chose", mod.last_launch()["config"], flush=True)
    for config in GENERATED_CONFIGS:
        key = f"generated {json.dumps(config)}"
        errors[key] = max_error(mod.llama_mlp_int4(x, *sets[0], config=config), want)
        candidates[key] = of(lambda *a, c=config: mod.llama_mlp_int4(*a, config=c))
    for variant in variants:
        ranked = sorted(
            (t, k) for k, t in swept.items() if k.startswith(variant + " ") and k not in wrong
            and isinstance(t, float)
        )  # fmt: skip
        print(
            f"  {variant}: "
            + "; ".join(f"{t * 1e3:.1f} us {k[len(variant):]}" for t, k in ranked[:4])
        )
        if ranked:
            name, config = ranked[0][1].split(" ", 1)
            candidates[ranked[0][1]] = of(Tile(name, json.loads(config), m, dev))
    bf16_copies = copies_for(2 * N * K * 2)
    dense = [tuple(torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(2))
             for _ in range(bf16_copies)]  # fmt: skip
    candidates["fusegen bf16"] = lambda i: bf16.anchor_swiglu(x, *dense[i % bf16_copies])
    candidates["bf16 eager"] = lambda i: F.silu(F.linear(x, dense[i % bf16_copies][0])) * F.linear(
        x, dense[i % bf16_copies][1]
    )
    times = timed(candidates, {}, rounds)["ms"]
    print(f"\n{m} x {K} -> {N} x2, int4 group {GROUP} + zero points (GPU us per call)")
    for key, t in times.items():
        med = statistics.median(t)
        bw = "" if "bf16" in key else f"{int4_bytes / med / 1e6:6.0f} GB/s"
        err = f"  error {errors[key]:.1e}" if key in errors else ""
        print(f"  {med * 1e3:7.1f} [{min(t) * 1e3:.1f}-{max(t) * 1e3:.1f}] {bw}  {key}{err}")
    return {"rows": m, "times_ms": times, "errors": errors, "swept": swept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--built", type=Path)
    parser.add_argument("--rows", nargs="+", type=int, default=[16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--registers", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.registers:
        registers()
        return
    sys.path.insert(0, str(args.built))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    results = []
    with torch.no_grad():
        for m in args.rows:
            results.append(row(args.built, m, args.rounds, args.variants))
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
