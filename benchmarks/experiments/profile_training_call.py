"""Where a generated module's training call spends its time, on a GPU: torch.profiler's
table of one forward + backward (the launcher under autograd), kernels and CPU ops.

    python benchmarks/experiments/profile_training_call.py MODULE SHAPE [SHAPE ...]

MODULE is a module in generated/ (llama_add_rmsnorm), each SHAPE an input's, comma
separated (16384,4096 16384,4096 4096), in the launcher's argument order; bf16.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "generated"))


def main() -> int:
    if len(sys.argv) < 3 or not torch.cuda.is_available():
        print(__doc__, file=sys.stderr)
        return 2
    module = __import__(sys.argv[1])
    launcher = getattr(module, sys.argv[1])
    shapes = [tuple(int(n) for n in s.split(",")) for s in sys.argv[2:]]
    inputs = [
        (torch.randn(s, device="cuda", dtype=torch.bfloat16) * 0.5).requires_grad_() for s in shapes
    ]

    def step():
        outputs = launcher(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        torch.autograd.grad(outputs, inputs, [torch.ones_like(o) for o in outputs])

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(profile.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    print(profile.key_averages().table(sort_by="cpu_time_total", row_limit=15))
    return 0


if __name__ == "__main__":
    sys.exit(main())
