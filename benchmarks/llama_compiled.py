"""transformers' LlamaForCausalLM (LLaMA-3-8B dims, 2 layers, random init, bf16) with and
without the generated kernels (MLP gate/up, RMSNorms, residual add + norm: the patch of
benchmarks/llama_training_step.py), eager and under torch.compile: decode (16 sequences
x 1 token) and prefill (4 x 1024 tokens) forwards, and a training step.

Modes: eager; compiled (torch.compile, default mode); reduce-overhead (CUDA graphs);
max-autotune-no-cudagraphs (--autotune). Each compiled variant starts from a reset, and
its first call's seconds (the compile) are reported beside the median. Every fusegen
variant's logits are checked against the HF model's (bf16 noise: relative error under
2x HF-bf16-vs-float32's + 1e-3), so a broken compiled path fails loudly (exit 1).
Which path the ops take under torch.compile: by default triton ops, which Inductor traces
into and launches the kernels of itself; FUSEGEN_TRITON_OP=0 makes them the opaque custom
ops (the Python launcher at each call of the compiled graph). Run both.

    python3 benchmarks/llama_compiled.py [--modes eager,compiled,reduce-overhead]
        [--steps 20] [--no-train] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_training_step import build_model, load_kernels, loss_of, patch  # noqa: E402

SHAPES = {"decode": (16, 1), "prefill": (4, 1024)}


def median_ms(fn, steps, warmup=3):
    times = []
    for _ in range(warmup + steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:]) * 1e3, times[0]


def compiled(fn, mode):
    torch._dynamo.reset()
    if mode == "eager":
        return fn
    return torch.compile(fn, mode=None if mode == "compiled" else mode)


def logits_error(got, want, want32):
    """(fusegen's error vs float32 HF, HF bf16's), norm-wise."""
    ref = want32.float()
    scale = ref.norm().item()
    return (got.float() - ref).norm().item() / scale, (want.float() - ref).norm().item() / scale


def run(args) -> dict:
    args.layers, args.vocab, args.seq, args.device = 2, 128256, 1024, "cuda"
    modules = load_kernels(args.attention)
    hf = build_model(args).eval()
    fused = copy.deepcopy(hf)
    patch(fused, {name: getattr(m, name) for name, m in modules.items()})
    hf32 = copy.deepcopy(hf).float()
    torch.manual_seed(1)
    report = {"setup": {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton_ops": {
            n: (m._KERNELS if hasattr(m, "_KERNELS") else m._ATTENTION).triton_ops()
            for n, m in modules.items()
        },
        "FUSEGEN_TRITON_OP": os.environ.get("FUSEGEN_TRITON_OP"),
    }, "forward": {}, "train": {}}  # fmt: skip
    print(report["setup"], flush=True)
    ok = True
    for shape, (batch, seq) in SHAPES.items():
        ids = torch.randint(0, args.vocab, (batch, seq), device="cuda")
        with torch.no_grad():
            want32 = hf32(input_ids=ids, use_cache=False).logits
        for mode in args.modes:
            row = report["forward"].setdefault(shape, {}).setdefault(mode, {})
            for variant, model in (("hf", hf), ("fusegen", fused)):
                call = lambda m=model, t=ids: m(input_ids=t, use_cache=False).logits  # noqa: E731
                forward = compiled(call, mode)
                try:
                    with torch.no_grad():
                        ms, first = median_ms(forward, args.steps)
                        logits = forward().clone()
                    row[variant] = {"ms": ms, "first_s": first}
                    row.setdefault("logits", {})[variant] = logits
                except Exception as exc:  # a failing mode is a result to report
                    traceback.print_exc()
                    row[variant] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                    ok = False
            logits = row.pop("logits", {})
            if len(logits) == 2:
                mine, theirs = logits_error(logits["fusegen"], logits["hf"], want32)
                row["logits_error"] = {"fusegen": mine, "hf": theirs}
                ok &= mine <= 2 * theirs + 1e-3
            print(shape, mode, row, flush=True)
        del want32
    if not args.no_train:
        batch, seq = SHAPES["prefill"]
        ids = torch.randint(0, args.vocab, (batch, seq), device="cuda")
        labels = torch.randint(0, args.vocab, (batch, seq), device="cuda")
        for mode in [m for m in args.modes if m != "reduce-overhead"]:
            row = report["train"].setdefault(mode, {})
            for variant, model in (("hf", hf), ("fusegen", fused)):
                model.train()
                loss = compiled(lambda m=model, t=ids, y=labels: loss_of(m, t, y), mode)

                def step(loss=loss, model=model):
                    loss().backward()
                    model.zero_grad(set_to_none=True)

                try:
                    ms, first = median_ms(step, max(5, args.steps // 2))
                    row[variant] = {"ms": ms, "first_s": first}
                except Exception as exc:
                    traceback.print_exc()
                    row[variant] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                    ok = False
                model.eval()
            print("train", mode, row, flush=True)
    report["ok"] = ok
    return report


def print_table(report):
    print("\n| step | mode | HF ms | fusegen ms | speedup | first call s HF, fusegen |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    rows = [(s, m, r) for s, modes in report["forward"].items() for m, r in modes.items()]
    rows += [("train step", m, r) for m, r in report["train"].items()]
    for step, mode, row in rows:
        hf, mine = row.get("hf", {}), row.get("fusegen", {})
        if "ms" not in hf or "ms" not in mine:
            print(f"| {step} | {mode} | {hf.get('error', '')} | {mine.get('error', '')} | | |")
            continue
        print(
            f"| {step} | {mode} | {hf['ms']:.3f} | {mine['ms']:.3f} | {hf['ms'] / mine['ms']:.3f}x "
            f"| {hf['first_s']:.1f}, {mine['first_s']:.1f} |"
        )
    print(f"\n{'PASS' if report['ok'] else 'FAIL'}: every variant ran, logits within bf16 noise")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="eager,compiled,reduce-overhead")
    parser.add_argument("--autotune", action="store_true", help="add max-autotune-no-cudagraphs")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-train", action="store_true")
    parser.add_argument(
        "--attention", action="store_true", help="swap in generated/llama3_attention too"
    )
    parser.add_argument("--out", help="write every number here as JSON")
    args = parser.parse_args()
    args.modes = args.modes.split(",") + (["max-autotune-no-cudagraphs"] if args.autotune else [])
    report = run(args)
    print_table(report)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
