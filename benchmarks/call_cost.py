"""What one call of a generated launcher costs on a GPU, against the PyTorch op it
replaces, at the sizes where the launcher's host time decides (decode, short prompts'
attention), and where fp32 and tiny problems did: the rows of issue 27's table.

    fusegen build benchmarks/specs/call_cost.yaml --out BUILD
    python3 benchmarks/call_cost.py BUILD [OLD_BUILD] [--rounds 7] [--calls 1000] [--out FILE.json]

Per row and variant: the wall time per call of CALLS calls in a row with one synchronize
at the end (what a decoding model's host loop sees), and the GPU time per call, from
replaying a CUDA graph of the same calls; the host cost is the wall time over the GPU
time. Rounds alternate the variants (the order rotated each round), and the table gives
each variant's median over rounds with the spread (min-max), and its ratio to the
PyTorch op taken within each round (median, min-max). A second build folder (an older
fusegen's) is timed in the same rounds. The fp32 rows run at
torch.set_float32_matmul_precision("highest") and report each variant's relative error
against float64 too; the tiny rows say which path the launcher took (last_launch).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fusegen.tools.timing import graph_ms  # noqa: E402  (torch-free until it runs)

DEVICE = "cuda"


def load(folder: Path, name: str, tag: str):
    path = folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{tag}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return getattr(module, name), module


def rms_norm(x, weight, eps=1e-6):
    """transformers' Qwen2RMSNorm, op by op."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def sdpa(q, k, v):
    """transformers' SDPA path for a [batch, seq, heads, dim] cache: one query per
    sequence (decode) is not causal there."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True
    )
    return out.transpose(1, 2)


def sdpa_causal(q, k, v):
    """transformers' SDPA path for a prompt: causal, [batch, seq, heads, dim] in and out."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    return out.transpose(1, 2)


def rows(args):
    """(row name, kernel name, inputs, PyTorch op, fp32) per row."""
    bf16 = {"device": DEVICE, "dtype": torch.bfloat16}
    fp32 = {"device": DEVICE, "dtype": torch.float32}
    out = []
    for keys in (1, 2048):
        q = torch.randn(16, 1, 28, 128, **bf16)
        k, v = (torch.randn(16, keys, 4, 128, **bf16) for _ in "kv")
        out.append((f"attention 16x1, {keys} key(s)", "qwen2_attention", (q, k, v), sdpa, False))
    for seq in (1024, 4096):  # prompts: the Gluon forward on an H100/H200 (hopper_fits)
        q = torch.randn(1, seq, 28, 128, **bf16)
        k, v = (torch.randn(1, seq, 4, 128, **bf16) for _ in "kv")
        out.append((f"attention prompt 1x{seq}", "qwen2_attention", (q, k, v), sdpa_causal, False))
    x = torch.randn(16, 3584, **bf16)
    w = [torch.randn(18944, 3584, **bf16) / 60 for _ in "gu"]
    out.append(("gate/up 16x3584->18944", "qwen2_gate_up", (x, *w),
                lambda x, g, u: F.silu(F.linear(x, g)) * F.linear(x, u), False))  # fmt: skip
    weight = 1 + 0.1 * torch.randn(3584, **bf16)
    out.append(("rmsnorm 16x3584", "qwen2_rmsnorm", (x, weight), rms_norm, False))
    x = torch.randn(1536, 768, **fp32)
    w, b = torch.randn(3072, 768, **fp32) / 28, torch.randn(3072, **fp32)
    out.append(("bert fp32 1536x768->3072", "bert_intermediate_fp32", (x, w, b),
                lambda x, w, b: F.gelu(F.linear(x, w, b)), True))  # fmt: skip
    x = torch.randn(4096, 512, **fp32)
    w = [torch.randn(1024, 512, **fp32) / 23 for _ in "01"]
    out.append(("t5 geglu fp32 4096x512->1024", "t5_geglu_fp32", (x, *w),
                lambda x, a, b: F.gelu(F.linear(x, a), approximate="tanh") * F.linear(x, b),
                True))  # fmt: skip
    w, b = torch.randn(5, 13, **fp32), torch.randn(5, **fp32)
    for m in (1, 9, 17):
        x = torch.randn(m, 13, **fp32)
        out.append((f"tiny fp32 {m}x13->5", "tiny_fp32", (x, w, b),
                    lambda x, w, b: F.relu(F.linear(x, w, b)), True))  # fmt: skip
    return out


def wall_us(fn, calls):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def gpu_us(fn):
    """GPU time per call (us) from replaying a CUDA graph of the calls: bench's graph timer."""
    ms = graph_ms(fn)
    return float("nan") if ms is None else ms * 1e3  # NaN: the call cannot be captured


def relative_error(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="builds of call_cost.yaml")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("highest")
    tags = ["new", "old"][: len(args.folders)]
    report = []
    with torch.no_grad():
        table = rows(args)
        variants = {}  # row -> {variant: fn}
        for name, kernel, inputs, op, _ in table:
            fns = {"torch": lambda op=op, inputs=inputs: op(*inputs)}
            for tag, folder in zip(tags, args.folders, strict=True):
                launcher, module = load(folder, kernel, tag)
                fns[f"fusegen {tag}"] = lambda launcher=launcher, inputs=inputs: launcher(*inputs)
                fns[f"fusegen {tag}"].module = module
            variants[name] = fns
        for name, _, inputs, op, fp32 in table:  # compile, tune, check
            want = op(*[t.double() for t in inputs]) if fp32 else op(*inputs).double()
            entry = {"row": name, "errors": {}, "paths": {}}
            for variant, fn in variants[name].items():
                got = fn()
                entry["errors"][variant] = relative_error(got, want)
                module = getattr(fn, "module", None)
                if module is not None and hasattr(module, "last_launch"):
                    launch = module.last_launch()
                    precision = launch.get("fp32_matmul") or ""
                    config = launch.get("config") or {}
                    tiles = "x".join(str(config[k]) for k in ("BLOCK_M", "BLOCK_N") if k in config)
                    split = config.get("SPLIT_K", 1)
                    entry["paths"][
                        variant
                    ] = f"{launch['source']} {launch.get('path')} {tiles} split {split} {precision}"
            report.append(entry)
        walls = {name: {v: [] for v in fns} for name, fns in variants.items()}
        ratios = {name: {v: [] for v in fns if v != "torch"} for name, fns in variants.items()}
        for round_ in range(args.rounds):
            for name, fns in variants.items():
                order = list(fns)
                order = order[round_ % len(order) :] + order[: round_ % len(order)]
                times = {}
                for variant in order:
                    fns[variant]()  # warm: this variant's buffers and caches
                    times[variant] = wall_us(fns[variant], args.calls)
                    walls[name][variant].append(times[variant])
                for variant in ratios[name]:
                    ratios[name][variant].append(times["torch"] / times[variant])
        for entry in report:
            name = entry["row"]
            entry["wall_us"] = {v: spread(t) for v, t in walls[name].items()}
            entry["speedup"] = {v: spread(r) for v, r in ratios[name].items()}
            entry["gpu_us"] = {v: gpu_us(fn) for v, fn in variants[name].items()}
    print(f"{'row':32} {'variant':12} {'wall us (min-max)':>24} {'gpu us':>8} {'host us':>8} "
          f"{'vs torch (min-max)':>20} {'error':>9}  path")  # fmt: skip
    for entry in report:
        for variant, wall in entry["wall_us"].items():
            gpu = entry["gpu_us"][variant]
            speed = entry["speedup"].get(variant)
            speed_text = (
                f"{speed['median']:.2f}x ({speed['min']:.2f}-{speed['max']:.2f})" if speed else ""
            )
            print(
                f"{entry['row']:32} {variant:12} "
                f"{wall['median']:9.1f} ({wall['min']:.1f}-{wall['max']:.1f})".ljust(70)
                + f" {gpu:8.1f} {max(wall['median'] - gpu, 0):8.1f} {speed_text:>20} "
                f"{entry['errors'][variant]:9.2e}  {entry['paths'].get(variant, '')}"
            )
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
