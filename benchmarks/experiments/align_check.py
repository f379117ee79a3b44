"""Does a row stride that is not a multiple of 16 elements cost a row kernel its vector
loads? Triton specializes integer arguments divisible by 16, so a 1000-column row stride
tells it nothing about alignment. Times masked_softmax (specs/attention.yaml) as
generated and with `tl.multiple_of` hints on its row strides, at 1000, 1008 and 1024
columns, each checked against the float64 reference. Not part of fusegen: an experiment.

Usage (GPU, repo root, pydantic and black on PYTHONPATH):
    python3 benchmarks/experiments/align_check.py
"""

from __future__ import annotations

import itertools
import re
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fusegen import build, codegen  # noqa: E402
from fusegen.tools import bench, timing  # noqa: E402
from fusegen.writer import write_all  # noqa: E402

SPEC = Path(__file__).resolve().parents[2] / "specs" / "attention.yaml"


def hinted(
    text: str, multiple: int, names=("stride_scores_q", "stride_mask_q", "stride_out_q"), how="hint"
) -> str:
    """The kernel with these integer arguments declared multiples of `multiple`."""
    strides = list(names)
    hints = "".join(
        (
            f"    {s} = tl.multiple_of({s}, {multiple})\n"
            if how == "hint"
            else f"    {s} = ({s} // {multiple}) * {multiple}\n"
        )
        for s in strides
    )
    return re.sub(
        r"(\n    pid = tl\.program_id\(0\)\n)",
        "\n" + hints + r"    pid = tl.program_id(0)\n",
        text,
        count=1,
    )


def main():
    (kernel,) = [k for k in build.load([SPEC]).kernels if k.name == "masked_softmax"]
    base = codegen.render(kernel)[0].text
    with tempfile.TemporaryDirectory() as tmp:
        write_all(build.runtime_files(Path(tmp)))  # the launch support the modules load
        modules = {}
        variants = (
            ("generated", base),
            ("hint8", hinted(base, 8)),
            ("hint8+S", hinted(base, 8, ("stride_scores_q", "stride_mask_q", "stride_out_q", "S"))),
            ("hintS", hinted(base, 8, ("S",))),
            (
                "mul8",
                hinted(base, 8, ("stride_scores_q", "stride_mask_q", "stride_out_q", "S"), "mul"),
            ),
            ("mul8S", hinted(base, 8, ("S",), "mul")),
        )
        for name, text in variants:
            path = Path(tmp) / f"{name}.py"
            path.write_text(text)
            modules[name] = bench.import_file(path, f"align_{name}")
            modules[name]._KERNELS.table["entries"] = []
        for cols in (1000, 1008):
            sizes = bench.shape_dims(kernel, (131072, cols))
            sets, exact = bench.input_sets(
                torch, modules["generated"], kernel, sizes, "bf16", "cuda"
            )
            compiled = torch.compile(modules["generated"].reference)
            rows = [("torch.compile", compiled)] + [
                (name, m.masked_softmax)
                for name, m in modules.items()
                if name == "generated" or cols % 16
            ]
            for name, fn in rows:
                for config in (
                    [None]
                    if name == "torch.compile"
                    else [None, {"BLOCK_M": 1, "BLOCK_N": 1024, "num_warps": 4}]
                ):
                    kwargs = {} if config is None else {"config": config}
                    out = fn(**sets[0], **kwargs)
                    error = bench.relative_error(torch, out, exact)
                    cycle = itertools.cycle(sets)
                    ms = timing.do_bench_timer(
                        lambda fn=fn, cycle=cycle, kwargs=kwargs: fn(**next(cycle), **kwargs)
                    )
                    print(
                        f"131072x{cols} {name:14} {str(config):60} {ms:.4f} ms err {error:.1e}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
