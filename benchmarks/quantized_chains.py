"""Quantized matmul chains on one GPU: the generated kernels of specs/quantized.yaml
against what users run for the same chain, GPU time per call from CUDA graph replays.

    fusegen build specs/quantized.yaml benchmarks/specs/anchors.yaml --out FOLDER
    python3 benchmarks/quantized_chains.py --built FOLDER [--rows ...] [--rounds 5]
        [--out FILE.json]

Rows (bf16 outputs):
    fp8-gelu       8192 x 4096 -> 14336, gelu_tanh(x @ w.T + b), fp8 e4m3 x and w with
                   row-wise scales: fusegen; torch._scaled_mm (cuBLASLt, row-wise scales)
                   then the eager epilogue; the same under torch.compile; fusegen's bf16
                   chain (anchor_gelu) on the dequantized values; and from bf16
                   activations, x quantized first: fusegen's quantize_fp8_rowwise then
                   its fp8 chain, against torch's quantizing then _scaled_mm (eager,
                   compiled)
    fp8-block      4096 x 7168 -> 18432, SwiGLU, DeepSeek-V3's recipe (x per 1 x 128,
                   weights per 128 x 128 block): fusegen; bf16 F.linear x 2 + silu * mul on
                   pre-dequantized weights (eager and compiled); torch._scaled_mm's
                   block-wise scales where this torch takes them; from bf16 activations,
                   fusegen's quantize_fp8_groups then its fp8 chain
    int4-decode-1, int4-decode-16
                   1 and 16 rows x 4096 -> 14336, SwiGLU, int4 weights group 128 with
                   zero points: fusegen; fusegen's bf16 chain (anchor_swiglu); tinygemm
                   (torch._weight_int4pack_mm, torchao's int4 kernel) x 2 + silu * mul;
                   gemlite's GemLiteLinear x 2 + silu * mul, where it runs (its wheel
                   and tqdm's carried: `pip download gemlite` gives its source, `pip
                   wheel --no-deps` a wheel; else the row says why not); bf16 F.linear x
                   2 + silu * mul
    int8-decode    16 x 4096 -> 14336, x @ w.T + b, int8 weights per channel: fusegen;
                   torch._weight_int8pack_mm + bias; bf16 F.linear

Each variant is captured in a CUDA graph of CALLS calls, each on its own copy of the
weights (copies enough to exceed the L2 cache, so every call streams its weights from
memory), and replayed; a round times every variant once, in an order rotated each
round; a row prints each variant's median and min-max over --rounds rounds, TFLOP/s
(prefill) or GB/s of the bytes that must move (decode), and each fusegen result's
largest error against float64 (relative to the output's largest magnitude).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

CALLS = 20
L2_BYTES = 60 * 2**20  # more than an H200's 50 MiB


def load(folder: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def copies_for(weight_bytes: int) -> int:
    return max(1, -(-2 * L2_BYTES // max(weight_bytes, 1)))


def graph_ms(fn, calls: int = CALLS) -> float:
    """GPU ms per call of fn(i) for i in 0..calls-1, from one replay of their graph."""
    for i in range(calls):  # tuning and compiling outside the capture
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def int4_pack(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 -> [N, K // 2] uint8, the even index in the low nibble."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def int4_weights(n: int, k: int, group: int, dev: str = "cuda") -> tuple:
    """AWQ-style int4 weights drawn at random: values 0..15 [n, k], their packing, bf16
    scales a group (outputs O(1) for x of O(1)), uint8 zero points."""
    q = torch.randint(0, 16, (n, k), device=dev)
    scale = ((torch.rand(n, k // group, device=dev) + 0.5) / (6 * k**0.5)).bfloat16()
    zero = torch.randint(0, 16, (n, k // group), device=dev, dtype=torch.uint8)
    return q, int4_pack(q), scale, zero


def tinygemm_weight(q: torch.Tensor, scale: torch.Tensor) -> tuple:
    """[N, K] values 0..15 and [N, K / group] scales in tinygemm's own layout: its int4
    pack and [K / group, N, 2] scales and zeros (its zero is a float offset: w = (q - 8)
    * scale + zero; timing only)."""
    q8 = (q[:, 0::2] << 4 | q[:, 1::2]).to(torch.uint8)
    sz = torch.stack((scale.t(), torch.zeros_like(scale.t())), dim=-1).contiguous()
    return torch._convert_weight_to_int4pack(q8, 8), sz


# -- rows ---------------------------------------------------------------------------


def fp8_gelu(built: Path) -> tuple[dict, dict]:
    m, k, n = 8192, 4096, 14336
    mod = load(built, "gelu_fp8_rowwise")
    bf16 = load(built, "anchor_gelu")
    dev = "cuda"
    x8 = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
    xs = torch.rand(m, device=dev) + 0.5
    w8 = (torch.randn(n, k, device=dev)).to(torch.float8_e4m3fn)
    ws = (torch.rand(n, device=dev) + 0.5) / k**0.5
    b = torch.randn(n, device=dev, dtype=torch.bfloat16)
    x = (x8.float() * xs[:, None]).bfloat16()
    w = (w8.float() * ws[:, None]).bfloat16()

    def scaled(x8, xs, w8, ws, b):
        y = torch._scaled_mm(
            x8, w8.t(), scale_a=xs[:, None], scale_b=ws[None, :], out_dtype=torch.bfloat16
        )
        return F.gelu(y + b, approximate="tanh")

    def quantize_rows(x):
        scale = x.abs().amax(dim=1).float().clamp_min(1e-12) / 448.0
        return (x.float() / scale[:, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale

    def from_bf16(x, w8, ws, b):
        x8, xs = quantize_rows(x)
        return scaled(x8, xs, w8, ws, b)

    quantizer = load(built, "quantize_fp8_rowwise")

    def fusegen_from_bf16(i):
        x8_, xs_ = quantizer.quantize_fp8_rowwise(x)
        return mod.gelu_fp8_rowwise(x8_, xs_, w8, ws, b)

    compiled = torch.compile(scaled)
    compiled_from_bf16 = torch.compile(from_bf16)
    variants = {
        "fusegen-fp8": lambda i: mod.gelu_fp8_rowwise(x8, xs, w8, ws, b),
        "scaled_mm+eager": lambda i: scaled(x8, xs, w8, ws, b),
        "scaled_mm+compile": lambda i: compiled(x8, xs, w8, ws, b),
        "fusegen-bf16": lambda i: bf16.anchor_gelu(x, w, b),
        # From bf16 activations: quantizing x is part of the work.
        "fusegen-quantize+fp8": fusegen_from_bf16,
        "quantize+scaled_mm+eager": lambda i: from_bf16(x, w8, ws, b),
        "quantize+scaled_mm+compile": lambda i: compiled_from_bf16(x, w8, ws, b),
    }
    rows_check = slice(0, 256)
    want = mod.reference(
        x8[rows_check],
        xs[rows_check].double(),
        w8,
        ws.double(),
        b.double(),
        out_dtype=torch.float64,
    )
    errors = {
        "fusegen-fp8": max_error(mod.gelu_fp8_rowwise(x8, xs, w8, ws, b)[rows_check], want),
        "scaled_mm+eager": max_error(scaled(x8, xs, w8, ws, b)[rows_check], want),
    }
    facts = {"flop": 2 * m * k * n, "shape": f"{m}x{k}->{n}", "errors": errors}
    return variants, facts


def fp8_block_inputs(m: int, k: int, n: int, dev: str = "cuda") -> tuple:
    """(x8, x_scale, w_gate8, w_up8, w_gate_scale, w_up_scale): DeepSeek-V3's layout, x
    scaled per 1 x 128 group, the weights per 128 x 128 block (row-major scales)."""
    x8 = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
    xs = torch.rand(m, k // 128, device=dev) + 0.5
    wg8 = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
    wu8 = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
    wgs = (torch.rand(n // 128, k // 128, device=dev) + 0.5) / k**0.5
    wus = (torch.rand(n // 128, k // 128, device=dev) + 0.5) / k**0.5
    return x8, xs, wg8, wu8, wgs, wus


def blockwise_swiglu(x8, xs, wg8, wgs, wu8, wus):
    """f(i) -> silu(x @ wg.T) * (x @ wu.T) by torch's block-wise `scaled_mm` (cuBLASLt)
    and an eager epilogue, on fp8_block_inputs' tensors; raises where this torch lacks it.
    cuBLASLt takes the activation scales column-major ([M, K/128] with strides (1, M))
    and the weights' as [K/128, N/128], the orientation of w.t(): laid out so once,
    outside the timing, as a user's quantizer would write them."""
    from torch.nn.functional import ScalingType, scaled_mm

    xs_cols = xs.t().contiguous().t()

    def blockwise(w8, ws):
        return scaled_mm(
            x8,
            w8.t(),
            xs_cols,
            ScalingType.BlockWise1x128,
            ws.t(),
            ScalingType.BlockWise128x128,
            output_dtype=torch.bfloat16,
        )

    blockwise(wg8, wgs)  # raises here, not in the timing, where it cannot run
    return lambda i: F.silu(blockwise(wg8, wgs)) * blockwise(wu8, wus)


def fp8_block(built: Path) -> tuple[dict, dict]:
    m, k, n = 4096, 7168, 18432
    mod = load(built, "deepseek_mlp_fp8")
    dev = "cuda"
    x8, xs, wg8, wu8, wgs, wus = fp8_block_inputs(m, k, n, dev)

    def deq_block(w8, s):
        return (w8.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)).bfloat16()

    x = (x8.float() * xs.repeat_interleave(128, 1)).bfloat16()
    wg, wu = deq_block(wg8, wgs), deq_block(wu8, wus)

    def swiglu(x, wg, wu):
        return F.silu(F.linear(x, wg)) * F.linear(x, wu)

    compiled = torch.compile(swiglu)
    quantizer = load(built, "quantize_fp8_groups")

    def fusegen_from_bf16(i):
        x8_, xs_ = quantizer.quantize_fp8_groups(x)
        return mod.deepseek_mlp_fp8(x8_, xs_, wg8, wgs, wu8, wus)

    variants = {
        "fusegen-fp8": lambda i: mod.deepseek_mlp_fp8(x8, xs, wg8, wgs, wu8, wus),
        "fusegen-quantize+fp8": fusegen_from_bf16,
        "bf16-eager": lambda i: swiglu(x, wg, wu),
        "bf16-compile": lambda i: compiled(x, wg, wu),
    }
    notes = []
    try:
        variants["scaled_mm-block+eager"] = blockwise_swiglu(x8, xs, wg8, wgs, wu8, wus)
    except Exception as exc:  # noqa: BLE001 - recorded: which torch lacks it, and why
        notes.append(f"block-wise scaled_mm does not run here: {type(exc).__name__}: {exc}"[:300])
    rows_check = slice(0, 128)
    want = mod.reference(
        x8[rows_check],
        xs[rows_check].double(),
        wg8,
        wgs.double(),
        wu8,
        wus.double(),
        out_dtype=torch.float64,
    )
    errors = {
        name: max_error(variants[name](0)[rows_check], want)
        for name in ("fusegen-fp8", "scaled_mm-block+eager")
        if name in variants
    }
    facts = {"flop": 4 * m * k * n, "shape": f"{m}x{k}->{n}", "errors": errors, "notes": notes}
    return variants, facts


def gemlite_layers(sets: list, n: int, k: int, group: int) -> tuple[list | None, str | None]:
    """Per weight copy, gemlite's (gate, up) GemLiteLinear layers of 4-bit weights, group
    `group`, zero points (its HQQ convention, (q - zero) * scale, is this module's), bf16
    in and out; or None and why gemlite does not run here (it is not on the machine:
    carry its wheel and tqdm's, `pip wheel --no-deps gemlite`; or it fails on this
    torch and triton)."""
    try:
        from gemlite import DType, GemLiteLinear

        layers = []
        for s in sets:
            pair = []
            for q, scale, zero in ((s[0], s[2], s[3]), (s[4], s[6], s[7])):
                layer = GemLiteLinear(
                    4, group_size=group, in_features=k, out_features=n,
                    input_dtype=DType.BF16, output_dtype=DType.BF16,
                )  # fmt: skip
                layer.pack(q.to(torch.uint8), scale.to(torch.bfloat16), zero.to(torch.bfloat16))
                pair.append(layer)
            layers.append(pair)
        return layers, None
    except Exception as exc:  # noqa: BLE001 (what failed is the row's finding)
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"


def int4_decode(built: Path, m: int) -> tuple[dict, dict]:
    k, n, group = 4096, 14336, 128
    mod = load(built, "llama_mlp_int4")
    bf16 = load(built, "anchor_swiglu")
    dev = "cuda"
    int4_bytes = 2 * (n * k // 2 + 2 * n * (k // group) * 2 + n * (k // group))
    copies = copies_for(int4_bytes)

    sets = []
    for _ in range(copies):
        qg, pg, sg, zg = int4_weights(n, k, group, dev)
        qu, pu, su, zu = int4_weights(n, k, group, dev)
        sets.append((qg, pg, sg, zg, qu, pu, su, zu))
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)

    def dequant(q, scale, zero):
        s = scale.float().repeat_interleave(group, 1)
        z = zero.float().repeat_interleave(group, 1)
        return ((q.float() - z) * s).bfloat16()

    bf16_copies = copies_for(2 * n * k * 2)
    dense = [
        (dequant(s[0], s[2], s[3]), dequant(s[4], s[6], s[7]))
        for s in (sets * bf16_copies)[:bf16_copies]
    ]
    tiny = [[tinygemm_weight(q, scale) for q, scale in ((s[0], s[2]), (s[4], s[6]))] for s in sets]

    def fusegen_int4(i):
        _, pg, sg, zg, _, pu, su, zu = sets[i % copies]
        return mod.llama_mlp_int4(x, pg, sg, zg, pu, su, zu)

    def tinygemm(i):
        (wg, szg), (wu, szu) = tiny[i % copies]
        gate = torch._weight_int4pack_mm(x, wg, group, szg)
        up = torch._weight_int4pack_mm(x, wu, group, szu)
        return F.silu(gate) * up

    variants = {
        "fusegen-int4": fusegen_int4,
        "fusegen-bf16": lambda i: bf16.anchor_swiglu(x, *dense[i % bf16_copies]),
        "tinygemm-int4": tinygemm,
        "bf16-eager": lambda i: F.silu(F.linear(x, dense[i % bf16_copies][0]))
        * F.linear(x, dense[i % bf16_copies][1]),
    }
    s = sets[0]
    want = mod.reference(
        x.double(), s[1], s[2].double(), s[3], s[5], s[6].double(), s[7], out_dtype=torch.float64
    )
    facts = {
        "bytes": {
            "fusegen-int4": int4_bytes,
            "tinygemm-int4": int4_bytes,
            "fusegen-bf16": 4 * n * k,
            "bf16-eager": 4 * n * k,
        },
        "shape": f"{m}x{k}->{n} x2",
        "errors": {"fusegen-int4": max_error(fusegen_int4(0), want)},
        "config": mod.last_launch()["config"],
        "weight_copies": copies,
    }
    lite, why = gemlite_layers(sets, n, k, group)

    def gemlite(i):
        gate, up = lite[i % copies]
        return F.silu(gate(x)) * up(x)

    if lite is not None:
        try:  # its first calls tune it
            facts["errors"]["gemlite-int4"] = max_error(gemlite(0), want)
            variants["gemlite-int4"] = gemlite
            facts["bytes"]["gemlite-int4"] = int4_bytes
        except Exception as exc:  # noqa: BLE001 (what failed is the row's finding)
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
    if why is not None:
        facts["gemlite"] = why
        print(f"  gemlite does not run here: {why}", flush=True)
    return variants, facts


def int8_decode(built: Path) -> tuple[dict, dict]:
    m, k, n = 16, 4096, 14336
    mod = load(built, "linear_int8")
    dev = "cuda"
    copies = copies_for(n * k)
    ws = [torch.randint(-128, 128, (n, k), device=dev, dtype=torch.int8) for _ in range(copies)]
    scale = (torch.rand(n, device=dev) + 0.5) / (74 * k**0.5)
    b = torch.randn(n, device=dev, dtype=torch.bfloat16)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    bf16_copies = copies_for(2 * n * k)
    dense = [(w.float() * scale[:, None]).bfloat16() for w in (ws * bf16_copies)[:bf16_copies]]
    scale16 = scale.bfloat16()
    variants = {
        "fusegen-int8": lambda i: mod.linear_int8(x, ws[i % copies], scale, b),
        "int8pack_mm": lambda i: torch._weight_int8pack_mm(x, ws[i % copies], scale16) + b,
        "bf16-linear": lambda i: F.linear(x, dense[i % bf16_copies], b),
    }
    want = mod.reference(x.double(), ws[0], scale.double(), b.double(), out_dtype=torch.float64)
    facts = {
        "bytes": {"fusegen-int8": n * k, "int8pack_mm": n * k, "bf16-linear": 2 * n * k},
        "shape": f"{m}x{k}->{n}",
        "errors": {"fusegen-int8": max_error(mod.linear_int8(x, ws[0], scale, b), want)},
        "config": mod.last_launch()["config"],
        "weight_copies": copies,
    }
    return variants, facts


ROWS = {
    "fp8-gelu": fp8_gelu,
    "fp8-block": fp8_block,
    "int4-decode-1": lambda built: int4_decode(built, 1),
    "int4-decode-16": lambda built: int4_decode(built, 16),
    "int8-decode": int8_decode,
}


def run_row(name: str, built: Path, rounds: int) -> dict:
    with torch.no_grad():
        variants, facts = ROWS[name](built)
    return {"row": name, **timed(variants, facts, rounds)}


def timed(variants: dict, facts: dict, rounds: int) -> dict:
    """facts with "ms": each variant's GPU times over `rounds` rounds in a rotated order
    (a variant that cannot run is noted instead)."""
    with torch.no_grad():
        usable, times = {}, {}
        for v, fn in variants.items():
            try:
                graph_ms(fn)
                usable[v] = fn
            except Exception as exc:  # noqa: BLE001 - a variant that cannot run is reported
                facts.setdefault("notes", []).append(
                    f"{v} does not run: {type(exc).__name__}: {exc}"[:300]
                )
        order = list(usable)
        for r in range(rounds):
            for v in order[r % len(order) :] + order[: r % len(order)]:
                times.setdefault(v, []).append(graph_ms(usable[v]))
    return {**facts, "ms": times}


def table(result: dict) -> str:
    lines = [f"{result['row']} ({result['shape']})"]
    med = {v: statistics.median(t) for v, t in result["ms"].items()}
    fastest_other = min((t for v, t in med.items() if not v.startswith("fusegen")), default=None)
    for v, t in result["ms"].items():
        rate = ""
        if "flop" in result:
            rate = f"{result['flop'] / med[v] / 1e9:7.0f} TFLOP/s"
        elif v in result.get("bytes", {}):
            rate = f"{result['bytes'][v] / med[v] / 1e6:7.0f} GB/s"
        vs = f"  {fastest_other / med[v]:.2f}x the best non-fusegen" if fastest_other else ""
        lines.append(f"  {v:22s} {med[v]:8.4f} ms [{min(t):.4f}-{max(t):.4f}] {rate}{vs}")
    for v, e in result.get("errors", {}).items():
        lines.append(f"  max error vs float64 / max |out|: {v} {e:.2e}")
    if "config" in result:
        lines.append(f"  fusegen's tuned config: {result['config']}")
    for note in result.get("notes", []):
        lines.append(f"  note: {note}")
    if "gemlite" in result:
        lines.append(f"  gemlite did not run: {result['gemlite']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--built", required=True, type=Path)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    sys.path.insert(0, str(args.built))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    results = []
    for name in args.rows:
        result = run_row(name, args.built, args.rounds)
        results.append(result)
        print(table(result), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
