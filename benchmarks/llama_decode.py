"""Decode-sized forwards (16 sequences x 1 token, and 16 x 8) of transformers'
LlamaForCausalLM (LLaMA-3-8B dims, 2 layers, random init, bf16), HF against the model with
the generated kernels patched in (benchmarks/llama_training_step.py's patch), timed so
that the two can be compared: both in one process, in alternating rounds.

Why: such a call is launch-bound, and its time moves by up to 40% between processes on
the same machine (GPU clocks, the CPU core the process lands on). A ratio taken within a
round (HF and fusegen back to back, the order swapped each round) cancels what the
process shares; the median over rounds drops the odd round. Run it in several processes
(run_suite.sh's llama-decode step alternates the two op kinds, FUSEGEN_TRITON_OP=1/0) to
see the spread left between processes.

Per mode (eager, compiled, reduce-overhead): each round times CALLS calls in a row with
one synchronize at the end (so the host's launch rate shows, as in a generation loop).
Then a profile of 20 calls gives the GPU's own busy time per call (the kernels alone):
the wall time above it is launch overhead; the same profile counts the kernels and the
host's launch calls per call, and dynamo's graph breaks are counted at the compile. The
fusegen logits are checked against HF's (bf16 noise), and a mismatch fails the run (exit 1).

    python3 benchmarks/llama_decode.py [--modes eager,compiled,reduce-overhead]
        [--rounds 9] [--calls 50] [--out FILE.json]
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
from llama_compiled import logits_error  # noqa: E402
from llama_training_step import build_model, load_kernels, patch  # noqa: E402

SHAPES = {"16x1": (16, 1), "16x8": (16, 8)}


def per_call_ms(fn, calls: int) -> float:
    """Wall time per call over `calls` calls in a row, one synchronize at the end."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e3


def gpu_ms(fn, calls: int = 20) -> dict:
    """The GPU's busy time per call (the sum of the kernels' durations in a profile), the
    kernels per call, and the host's launch API calls per call with their time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    # The GPU's own events (kernels, copies) only: with CPU activity on, the CPU ops that
    # launched them carry their device time too, which would count it twice.
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    launches = [e for e in events if "LaunchKernel" in e.key]
    return {
        "busy_ms": sum(e.self_device_time_total for e in kernels) / calls / 1e3,
        "kernels": sum(e.count for e in kernels) / calls,
        "launch_calls": sum(e.count for e in launches) / calls,
        "launch_ms": sum(e.self_cpu_time_total for e in launches) / calls / 1e3,
    }


def compiled(fn, mode):
    if mode == "eager":
        return fn
    return torch.compile(fn, mode=None if mode == "compiled" else mode)


def run(args) -> dict:
    args.layers, args.vocab, args.seq, args.device = 2, 128256, 1024, "cuda"
    modules = load_kernels(args.attention)
    hf = build_model(args).eval()
    hf.config.use_cache = False  # no KV cache: every call the same work
    fused = copy.deepcopy(hf)
    patch(fused, {name: getattr(m, name) for name, m in modules.items()})
    hf32 = copy.deepcopy(hf).float()
    report = {"setup": {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "FUSEGEN_TRITON_OP": os.environ.get("FUSEGEN_TRITON_OP"),
        # Inductor launches user kernels through triton's Python launcher unless this is 1.
        "static_launch_user_kernels": os.environ.get(
            "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS"
        ),
        "rounds": args.rounds, "calls": args.calls,
    }, "results": {}}  # fmt: skip
    print(report["setup"], flush=True)
    ok = True
    torch.manual_seed(1)
    for shape, (batch, seq) in SHAPES.items():
        ids = torch.randint(0, args.vocab, (batch, seq), device="cuda")
        with torch.no_grad():
            want32 = hf32(input_ids=ids).logits
        for mode in args.modes:
            torch._dynamo.reset()
            row = report["results"].setdefault(shape, {}).setdefault(mode, {})
            try:
                with torch.no_grad():
                    calls = {
                        name: compiled(lambda m=model, t=ids: m(input_ids=t).logits, mode)
                        for name, model in (("hf", hf), ("fusegen", fused))
                    }
                    logits = {}
                    for name, call in calls.items():
                        breaks = torch._dynamo.utils.counters["graph_break"]
                        before = sum(breaks.values())
                        start = time.perf_counter()
                        for _ in range(3):  # the compile, then the CUDA graphs' recording
                            call()
                        torch.cuda.synchronize()
                        row.setdefault("graph_breaks", {})[name] = sum(breaks.values()) - before
                        row.setdefault("first_s", {})[name] = time.perf_counter() - start
                        logits[name] = call().clone()
                    rounds = {"hf": [], "fusegen": []}
                    for r in range(args.rounds):
                        for name in ("hf", "fusegen") if r % 2 == 0 else ("fusegen", "hf"):
                            rounds[name].append(per_call_ms(calls[name], args.calls))
                    row["ms"] = {n: statistics.median(t) for n, t in rounds.items()}
                    row["rounds_ms"] = rounds
                    ratios = [h / f for h, f in zip(rounds["hf"], rounds["fusegen"], strict=True)]
                    row["speedup"] = statistics.median(ratios)
                    row["speedup_range"] = [min(ratios), max(ratios)]
                    profiles = {n: gpu_ms(c) for n, c in calls.items()}
                    row["gpu_ms"] = {n: p["busy_ms"] for n, p in profiles.items()}
                    row["profile"] = profiles
                mine, theirs = logits_error(logits["fusegen"], logits["hf"], want32)
                row["logits_error"] = {"fusegen": mine, "hf": theirs}
                ok &= mine <= 2 * theirs + 1e-3
            except Exception as exc:  # a failing mode is a result to report
                traceback.print_exc()
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                ok = False
            print(shape, mode, {k: v for k, v in row.items() if k != "rounds_ms"}, flush=True)
    report["ok"] = ok
    return report


def print_table(report):
    kind = report["setup"]["FUSEGEN_TRITON_OP"]
    print(f"\nFUSEGEN_TRITON_OP={kind}: median of {report['setup']['rounds']} rounds")
    print(
        "| shape | mode | HF ms | fusegen ms | speedup (range) | GPU busy ms HF, fusegen "
        "| kernels per call HF, fusegen |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for shape, modes in report["results"].items():
        for mode, row in modes.items():
            if "error" in row:
                print(f"| {shape} | {mode} | {row['error']} | | | | |")
                continue
            low, high = row["speedup_range"]
            print(
                f"| {shape} | {mode} | {row['ms']['hf']:.3f} | {row['ms']['fusegen']:.3f} "
                f"| {row['speedup']:.3f}x ({low:.2f}-{high:.2f}) "
                f"| {row['gpu_ms']['hf']:.3f}, {row['gpu_ms']['fusegen']:.3f} "
                f"| {row['profile']['hf']['kernels']:.0f}, "
                f"{row['profile']['fusegen']['kernels']:.0f} |"
            )
    print(f"\n{'PASS' if report['ok'] else 'FAIL'}: every mode ran, logits within bf16 noise")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="eager,compiled,reduce-overhead")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument(
        "--attention", action="store_true", help="swap in generated/llama3_attention too"
    )
    parser.add_argument("--out", help="write every number here as JSON")
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    report = run(args)
    print_table(report)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
