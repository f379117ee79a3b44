"""Time a row kernel's launcher at configs outside (and inside) its tuning space, each
checked against the float64 reference, to see whether the space misses a faster one.
Not part of fusegen: an experiment bench.

Usage (GPU, repo root, pydantic and black on PYTHONPATH):
    python3 benchmarks/row_configs.py SPEC KERNEL ROWS,COLS [dtype [VARIANT ...]]

VARIANT: a kernel-source change to time beside the generated source (see VARIANTS).
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fusegen import bench, build, codegen, timing  # noqa: E402

# (BLOCK_M, num_warps) at BLOCK_N = the next power of two of the columns.
TRIES = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (2, 8), (4, 4), (4, 8), (8, 8), (8, 16)]
WIDE_TRIES = [(1, 4), (1, 8), (1, 16), (1, 32), (2, 16), (2, 32)]


def no_shift(text: str) -> str:
    """LayerNorm without the row shift (the row's first element, found by a reduction,
    subtracted before the mean): how much that reduction costs."""
    single = "row_shift = tl.sum(tl.where(offs_n[None, :] == 0, value, 0.0), axis=1)"
    multi = "row_shift += tl.sum(tl.where(offs_n[None, :] == 0, value, 0.0), axis=1)"
    assert single in text and multi in text
    text = text.replace(single, "row_shift = tl.zeros([BLOCK_M], dtype=tl.float32)")
    return text.replace(multi, "row_shift += 0.0")


VARIANTS = {"noshift": no_shift}


def main():
    spec, name, shape = sys.argv[1], sys.argv[2], tuple(int(v) for v in sys.argv[3].split(","))
    dtype = sys.argv[4] if len(sys.argv) > 4 else "bf16"
    variants = sys.argv[5:]
    (kernel,) = [k for k in build.load([Path(spec)]).kernels if k.name == name]
    sizes = bench.shape_dims(kernel, shape)
    block_n = 1 << (shape[1] - 1).bit_length()
    with tempfile.TemporaryDirectory() as tmp:
        module = bench.load_module(kernel, Path(tmp), None)
        sets, exact = bench.input_sets(torch, module, kernel, sizes, dtype, "cuda")
        for variant in ["generated", *variants]:
            if variant != "generated":
                path = Path(tmp) / f"{name}_{variant}.py"
                path.write_text(VARIANTS[variant](codegen.render(kernel)[0].text))
                module = bench.import_file(path, f"row_configs_{variant}")
            print(f"-- {variant}", flush=True)
            time_configs(module, name, shape, block_n, sets, exact)


def time_configs(module, name, shape, block_n, sets, exact):
    """The launcher's own choice, then each of TRIES (WIDE_TRIES for long rows)."""
    launcher = getattr(module, name)
    cycle = itertools.cycle(sets)
    tries = WIDE_TRIES if block_n >= 4096 else TRIES
    rows = [("autotune", None)] + [
        (
            f"BLOCK_M {m} BLOCK_N {block_n} warps {w}",
            {"BLOCK_M": m, "BLOCK_N": block_n, "num_warps": w},
        )
        for m, w in tries
    ]
    for label, config in rows:
        try:
            out = launcher(**sets[0], config=config)
            error = bench.relative_error(torch, out, exact)
            ms = timing.do_bench_timer(lambda: launcher(**next(cycle), config=config))
            graph = timing.graph_ms(lambda: launcher(**next(cycle), config=config))
            ran = module.last_launch()["config"]
            print(
                f"{name} {shape} {label:36} call {ms:.4f} graph {graph and round(graph, 4)} "
                f"err {error:.1e} ran {ran}",
                flush=True,
            )
        except Exception as exc:  # noqa: BLE001 - an experiment: report and go on
            print(f"{name} {shape} {label:36} failed: {str(exc).splitlines()[0][:120]}", flush=True)


if __name__ == "__main__":
    main()
