"""fp32 matmul chains at each tl.dot input precision Triton offers on NVIDIA: their time
and error against eager fp32 at torch.set_float32_matmul_precision("highest") (cuBLAS
SGEMM), to choose what a "highest" fp32 call should run.

    fusegen build benchmarks/specs/call_cost.yaml --out BUILD
    python3 benchmarks/experiments/fp32_precision.py BUILD [--rounds 5]

Per chain and precision: the relative error (norm-wise, against float64) over eager's,
and the GPU time (triton.testing.do_bench, median), the precisions alternated over
rounds (median and min-max). ieee runs fp32 FMAs on the CUDA cores; tf32 one tensor-core
product of operands cut to 10 bits; tf32x3 and bf16x3 three products of split operands
(the small one's square dropped), bf16x6 six.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

PRECISIONS = ["ieee", "tf32x3", "bf16x3", "bf16x6", "tf32"]


def load(folder: Path, name: str, tag: str):
    """A copy of the module of its own (its own plans and tuned configs)."""
    spec = importlib.util.spec_from_file_location(f"{name}_{tag}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def cases():
    fp32 = {"device": "cuda", "dtype": torch.float32}
    x, w, b = (torch.randn(1536, 768, **fp32), torch.randn(3072, 768, **fp32) / 28,
               torch.randn(3072, **fp32))  # fmt: skip
    yield "bert_intermediate_fp32", (x, w, b), lambda x, w, b: F.gelu(F.linear(x, w, b))
    x, a, c = (torch.randn(4096, 512, **fp32), torch.randn(1024, 512, **fp32) / 23,
               torch.randn(1024, 512, **fp32) / 23)  # fmt: skip
    yield "t5_geglu_fp32", (x, a, c), lambda x, a, c: (
        F.gelu(F.linear(x, a), approximate="tanh") * F.linear(x, c)
    )


def error(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def main() -> int:
    from triton.testing import do_bench

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("highest")
    header = ("chain", "variant", "error", "/eager", "ms (min-max)", "vs eager")
    print("{:24} {:8} {:>9} {:>7} {:>24} {:>9}".format(*header))
    with torch.no_grad():
        for name, inputs, eager in cases():
            want = eager(*[t.double() for t in inputs])
            eager_error = error(eager(*inputs), want)
            calls = {"eager": lambda eager=eager, inputs=inputs: eager(*inputs)}
            errors = {"eager": eager_error}
            for precision in PRECISIONS:  # compile, tune, check each once
                module = load(args.folder, name, precision)
                module.FP32_MATMUL = precision
                launcher = getattr(module, name)
                try:
                    errors[precision] = error(launcher(*inputs), want)
                    calls[precision] = lambda launcher=launcher, inputs=inputs: launcher(*inputs)
                except Exception as exc:  # a precision this triton refuses: a result
                    errors[precision] = f"{type(exc).__name__}: {str(exc)[:80]}"
            times = {variant: [] for variant in calls}
            for round_ in range(args.rounds):
                order = list(calls)
                order = order[round_ % len(order) :] + order[: round_ % len(order)]
                for variant in order:
                    times[variant].append(do_bench(calls[variant]))
            base = statistics.median(times["eager"])
            for variant, found in errors.items():
                if isinstance(found, str):
                    print(f"{name:24} {variant:8} {found}")
                    continue
                t = times[variant]
                print(
                    f"{name:24} {variant:8} {found:9.2e} {found / eager_error:7.2f} "
                    f"{statistics.median(t):9.4f} ({min(t):.4f}-{max(t):.4f})"
                    f" {base / statistics.median(t):8.2f}x"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
