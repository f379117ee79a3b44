"""The generated launcher's time per call on a GPU: gpt2_mlp_up (specs/gpt2.yaml) at 16
rows, bf16, 3000 calls after 100 warm-up calls. The kernel takes a few microseconds, so
what is timed is the launcher's Python and the launch. Run it once per launch path, each
in a fresh process (FUSEGEN_DIRECT_LAUNCH is read when the module plans a call):

    python3 benchmarks/call_time.py                           # the kernel launched directly
    FUSEGEN_DIRECT_LAUNCH=0 python3 benchmarks/call_time.py   # through triton's dispatch

benchmarks/launch_overhead.py measures the same launcher's Python alone, on the CPU.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "generated"))
import gpt2_mlp_up  # noqa: E402

WARMUP, CALLS = 100, 3000


def main() -> None:
    x = torch.randn(16, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(768, 3072, device="cuda", dtype=torch.bfloat16) / 30
    b = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
    for _ in range(WARMUP):
        gpt2_mlp_up.gpt2_mlp_up(x, w, b)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        gpt2_mlp_up.gpt2_mlp_up(x, w, b)
    torch.cuda.synchronize()
    per_call_us = (time.perf_counter() - start) / CALLS * 1e6
    setting = os.environ.get("FUSEGEN_DIRECT_LAUNCH", "1 (default)")
    print(
        f"{torch.cuda.get_device_name()}: gpt2_mlp_up 16x768x3072 bf16, "
        f"FUSEGEN_DIRECT_LAUNCH={setting}: {per_call_us:.1f} us per call"
    )


if __name__ == "__main__":
    main()
