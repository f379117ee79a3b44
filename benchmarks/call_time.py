"""The generated launchers' time per call on a GPU at decode size (16 rows, bf16): the
kernel takes a few microseconds, so what is timed is the launcher's Python and the launch.
Each module folder given (default: generated/) is loaded by file path, and their calls are
timed in alternating rounds in one process, so two builds (an older folder beside the
current one) are compared under the same clocks. Per kernel and folder: the best round's
microseconds per call (CALLS calls, after WARMUP).

    python3 benchmarks/call_time.py [FOLDER ...]
    FUSEGEN_DIRECT_LAUNCH=0 python3 benchmarks/call_time.py   # through triton's dispatch

benchmarks/launch_overhead.py measures the launcher's Python alone, on the CPU.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
WARMUP, CALLS, ROUNDS = 100, 2000, 7
ROWS = 16


def inputs(name):
    """Inputs of each timed kernel at ROWS rows (weights scaled to keep outputs O(1))."""
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    if name == "gpt2_mlp_up":
        return (torch.randn(ROWS, 768, **bf16), torch.randn(768, 3072, **bf16) / 30,
                torch.randn(3072, **bf16))  # fmt: skip
    if name == "llama_mlp_gate_up":
        w = [torch.randn(14336, 4096, **bf16) / 64 for _ in range(2)]
        return (torch.randn(ROWS, 4096, **bf16), *w)
    if name == "llama_add_rmsnorm":
        return (torch.randn(ROWS, 4096, **bf16), torch.randn(ROWS, 4096, **bf16),
                torch.randn(4096, **bf16))  # fmt: skip
    raise ValueError(name)


def load(folder: Path, name: str, tag: int):
    spec = importlib.util.spec_from_file_location(f"call_time_{tag}_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def per_call_us(launcher, args) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        launcher(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    folders = [Path(f) for f in sys.argv[1:]] or [ROOT / "generated"]
    setting = os.environ.get("FUSEGEN_DIRECT_LAUNCH", "1 (default)")
    print(f"FUSEGEN_DIRECT_LAUNCH={setting}, {ROWS} rows, bf16, best of {ROUNDS} x {CALLS} calls")
    with torch.no_grad():
        for name in ("gpt2_mlp_up", "llama_mlp_gate_up", "llama_add_rmsnorm"):
            args = inputs(name)
            launchers = [load(folder, name, i) for i, folder in enumerate(folders)]
            for launcher in launchers:
                for _ in range(WARMUP):
                    launcher(*args)
            best = [float("inf")] * len(launchers)
            for round_ in range(ROUNDS):
                order = list(range(len(launchers)))
                if round_ % 2:
                    order.reverse()  # neither folder always goes first
                for i in order:
                    best[i] = min(best[i], per_call_us(launchers[i], args))
            for folder, us in zip(folders, best, strict=True):
                print(f"{name:20s} {str(folder):40s} {us:7.2f} us per call")


if __name__ == "__main__":
    main()
