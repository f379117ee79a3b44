"""Time a row kernel's launcher at configs outside (and inside) its tuning space, each
checked against the float64 reference, to see whether the space misses a faster one.
Not part of fusegen: an experiment bench.

Usage (GPU, repo root, pydantic and black on PYTHONPATH):
    python3 benchmarks/row_configs.py SPEC KERNEL ROWS,COLS [dtype]
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fusegen import bench, build, timing  # noqa: E402

# (BLOCK_M, num_warps) at BLOCK_N = the next power of two of the columns.
TRIES = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (2, 8), (4, 4), (4, 8), (8, 8), (8, 16)]


def main():
    spec, name, shape = sys.argv[1], sys.argv[2], tuple(int(v) for v in sys.argv[3].split(","))
    dtype = sys.argv[4] if len(sys.argv) > 4 else "bf16"
    (kernel,) = [k for k in build.load([Path(spec)]).kernels if k.name == name]
    sizes = bench.shape_dims(kernel, shape)
    block_n = 1 << (shape[1] - 1).bit_length()
    with tempfile.TemporaryDirectory() as tmp:
        module = bench.load_module(kernel, Path(tmp), None)
        sets, exact = bench.input_sets(torch, module, kernel, sizes, dtype, "cuda")
        launcher = getattr(module, name)
        cycle = itertools.cycle(sets)
        rows = [("autotune", None)] + [
            (
                f"BLOCK_M {m} BLOCK_N {block_n} warps {w}",
                {"BLOCK_M": m, "BLOCK_N": block_n, "num_warps": w},
            )
            for m, w in TRIES
        ]
        for label, config in rows:
            try:
                out = launcher(**sets[0], config=config)
                error = bench.relative_error(torch, out, exact)
                ms = timing.do_bench_timer(lambda: launcher(**next(cycle), config=config))
                graph = timing.graph_ms(lambda: launcher(**next(cycle), config=config))
                ran = module.last_launch()["config"]
                print(
                    f"{name} {shape} {label:36} call {ms:.4f} graph {graph and round(graph, 4)} err {error:.1e} ran {ran}",
                    flush=True,
                )
            except Exception as exc:  # noqa: BLE001 - an experiment: report and go on
                print(
                    f"{name} {shape} {label:36} failed: {str(exc).splitlines()[0][:120]}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
