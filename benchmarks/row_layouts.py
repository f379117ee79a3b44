"""Should a row or elementwise kernel copy a strided input to contiguous memory before
launching, or read it as it is? Times the example row and elementwise kernels with their
first input stored sliced (every other column, x[:, ::2]) and transposed (column-major),
read as they are and copied first (the launcher's plan copying it at each launch, as
it copies a strided matmul operand), against eager PyTorch and torch.compile on the same
tensors; each checked against float64. Not part of fusegen: the measurement behind the
rule of `copies` in fusegen/runtime/checks.py (a row or elementwise kernel copies no
input).

Usage (GPU, repo root, pydantic and black on PYTHONPATH):
    python3 benchmarks/row_layouts.py
    TRITON_INTERPRET=1 python3 benchmarks/row_layouts.py --dry   # small, on the CPU, untimed
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fusegen import build  # noqa: E402
from fusegen.tools import bench  # noqa: E402


def copying(module, index):
    """The module's _plan, planning input `index` as a contiguous copy that each launch
    makes first (plan.copies): strides, alignment and layout are the copy's."""
    plan_as_is = module._plan

    def plan(*inputs):
        copied = list(inputs)
        copied[index] = inputs[index].contiguous()
        made = plan_as_is(*copied)
        module._CALLS.pop(module._signature(*copied), None)
        made.copies = (index,)
        module._CALLS[module._signature(*inputs)] = made
        return made

    return plan


CASES = [  # kernel, rows, cols, the input stored strided
    ("bias_gelu_residual", 16384, 8192, "x"),
    ("llama_add_rmsnorm", 16384, 4096, "x"),
    ("masked_softmax", 32768, 2048, "scores"),
]


def main() -> None:
    dry = "--dry" in sys.argv
    device = "cpu" if dry else "cuda"
    timer = (lambda fn, **_: (fn(), 0.0)[1]) if dry else do_bench
    kernels = {k.name: k for k in build.load(build.collect([str(ROOT / "specs")])).kernels}
    print(f"{torch.cuda.get_device_name() if not dry else 'cpu'} torch {torch.__version__}")
    for name, rows, cols, strided in CASES:
        if dry:
            rows, cols = 5, kernels[name].dim(kernels[name].col).size or 48
        kernel = kernels[name]
        module = bench.import_file(ROOT / "generated" / f"{name}.py", f"row_layouts_{name}")
        launcher = getattr(module, name)
        index = module._KERNELS.inputs.index(strided)  # its place in the launch arguments
        planners = {"as is": module._plan, "copy first": copying(module, index)}
        sizes = {kernel.row: rows, kernel.col: cols}
        for layout in ("contiguous", "sliced", "transposed"):
            layouts = {} if layout == "contiguous" else {strided: layout}
            sets, exact = bench.input_sets(torch, module, kernel, sizes, "bf16", device, layouts)
            compiled = module.reference if dry else torch.compile(module.reference, dynamic=False)
            variants = {"fusegen": launcher, "eager": module.reference, "torch.compile": compiled}
            for label, fn in variants.items():
                for rule, planner in planners.items() if label == "fusegen" else [("", None)]:
                    if planner is not None:
                        module._plan = planner
                        module._CALLS.clear()
                    error = bench.relative_error(torch, fn(**sets[0]), exact)
                    cycle = itertools.cycle(sets)
                    ms = timer(lambda fn=fn, cycle=cycle: fn(**next(cycle)), warmup=25, rep=100)
                    print(
                        f"{name:20s} {rows}x{cols} {strided} {layout:10s} {label:13s} "
                        f"{rule:10s} {ms:.4f} ms  err {error:.1e}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
