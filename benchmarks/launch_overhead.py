"""The launcher's own Python time per call, on the CPU: the module on the Triton
interpreter with its launch stubbed out, so what is timed is the checks, the plan lookup
and the output's allocation (a decode-sized call on a GPU pays this on top of the kernel).

    python3 benchmarks/launch_overhead.py [MODULE.py ...]   # default: generated/gpt2_mlp_up.py
    python3 benchmarks/launch_overhead.py OLD/gpt2_mlp_up.py generated/gpt2_mlp_up.py

Each MODULE.py is a copy of gpt2_mlp_up (specs/gpt2.yaml), called at 16 rows in bf16. With
several, their repeats are interleaved (one repeat of each module in turn, the order
rotated each round), so drift in the machine's speed hits them alike and two builds of a
module compare in one process. Prints one line per module: its best repeat's time per
call. A module of either layout is taken: one whose launch support is its own
(`_launch`), or one that loads `_fusegen_runtime/` beside it (`_KERNELS.launch`).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import timeit
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def load(path: str, index: int):
    """Import a module file under a name of its own, its launch stubbed out."""
    spec = importlib.util.spec_from_file_location(f"overhead_{index}_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "_KERNELS"):  # launch support in _fusegen_runtime/
        module._KERNELS.launch = lambda *args: None
    elif hasattr(module, "_launch"):  # launch support copied into the module
        module._launch = lambda *args: None
    else:
        raise SystemExit(f"{path}: neither _KERNELS.launch nor _launch to stub out")
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=[str(ROOT / "generated" / "gpt2_mlp_up.py")])
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per module")
    parser.add_argument("--number", type=int, default=2000, help="calls per repeat")
    args = parser.parse_args()
    x = torch.randn(16, 768, dtype=torch.bfloat16)
    w = torch.randn(768, 3072, dtype=torch.bfloat16)
    b = torch.randn(3072, dtype=torch.bfloat16)
    launchers = []
    for index, path in enumerate(args.modules):
        launcher = load(path, index).gpt2_mlp_up
        launcher(x, w, b)  # plans the call
        launchers.append(launcher)
    best = [float("inf")] * len(launchers)
    with torch.no_grad():
        for repeat in range(args.repeats):
            start = repeat % len(launchers)
            for index in [*range(start, len(launchers)), *range(start)]:
                call = functools.partial(launchers[index], x, w, b)
                seconds = timeit.timeit(call, number=args.number)
                best[index] = min(best[index], seconds / args.number)
    for path, seconds in zip(args.modules, best, strict=True):
        print(f"{path}: {seconds * 1e6:.2f} us per call (best of {args.repeats} x {args.number})")


if __name__ == "__main__":
    main()
