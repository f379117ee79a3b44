"""The launcher's own Python time per call, on the CPU: the module on the Triton
interpreter with its launch stubbed out, so what is timed is the checks, the plan lookup
and the output's allocation (a decode-sized call on a GPU pays this on top of the kernel).

    python3 benchmarks/launch_overhead.py [MODULE.py ...]   # default: generated/gpt2_mlp_up.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
import timeit
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    paths = sys.argv[1:] or [str(ROOT / "generated" / "gpt2_mlp_up.py")]
    for path in paths:
        spec = importlib.util.spec_from_file_location(f"overhead_{Path(path).stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module._launch = lambda *args: None
        x = torch.randn(16, 768, dtype=torch.bfloat16)
        w = torch.randn(768, 3072, dtype=torch.bfloat16)
        b = torch.randn(3072, dtype=torch.bfloat16)
        launcher = module.gpt2_mlp_up
        launcher(x, w, b)
        with torch.no_grad():
            best = min(timeit.repeat(lambda: launcher(x, w, b), number=2000, repeat=7)) / 2000
        print(f"{path}: {best * 1e6:.2f} us per call")


if __name__ == "__main__":
    main()
