"""An attention launcher's own Python time per call, on the CPU: generated/llama3_attention
with its kernel launches stubbed out and the GPU's facts (132 multiprocessors) faked, so
what is timed is the checks, the plan (packing, key split), the allocations and the
arguments' assembly: what a decode call on a GPU pays on top of its kernels and
triton's dispatch.

    python3 benchmarks/experiments/attention_launch_cost.py [MODULE.py]  # llama3_attention

Prints, per shape (batch, q_len, k_len; bshd, LLaMA-3's 32/8 heads, bf16), the best of
five repeats of 2000 calls each.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [(1, 1, 16384), (16, 1, 4096), (4, 8, 4096)]


def stubbed(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._runs_triton = lambda device: True
    module._sm_count = lambda device: 132
    module._identity = lambda device: ("no GPU", [0, 0])  # no tuned entry: the defaults

    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    module._launch = lambda *args, **kwargs: None
    for name in dir(module):
        if name.endswith("_combine") and name.startswith("_"):
            setattr(module, name, NoLaunch())
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", nargs="?", default=ROOT / "generated" / "llama3_attention.py")
    args = parser.parse_args()
    path = Path(args.module)
    module = stubbed(path)
    launcher = getattr(module, path.stem)
    for batch, sq, skv in SHAPES:
        q = torch.randn(batch, sq, module.HEADS, module.HEAD_DIM, dtype=torch.bfloat16)
        k, v = (
            torch.randn(batch, skv, module.KV_HEADS, module.HEAD_DIM, dtype=torch.bfloat16)
            for _ in "kv"
        )
        times = []
        with torch.no_grad():
            for _ in range(100):
                launcher(q, k, v)
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(2000):
                    launcher(q, k, v)
                times.append((time.perf_counter() - start) / 2000 * 1e6)
        plan = module._forward_plan(torch.device("cuda"), batch, sq, skv, torch.bfloat16)
        print(f"{(batch, sq, skv)}: {min(times):.1f} us per call (plan {plan})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
