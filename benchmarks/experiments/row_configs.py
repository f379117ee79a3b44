"""Time a row kernel's launcher at configs outside (and inside) its tuning space, each
checked against the float64 reference, to see whether the space misses a faster one.
Not part of fusegen: an experiment bench.

Usage (GPU, repo root, pydantic and black on PYTHONPATH):
    python3 benchmarks/experiments/row_configs.py SPEC KERNEL ROWS,COLS [dtype [VARIANT ...]]

VARIANT: a kernel-source change to time beside the generated source (see VARIANTS), e.g.
    python3 benchmarks/experiments/row_configs.py benchmarks/specs/rows.yaml bench_layernorm \\
        16384,8192 bf16 noshift welford
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


WELFORD_COMBINE = """

@triton.jit
def _welford_combine(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    n = n_a + n_b
    frac = tl.where(n == 0.0, 0.0, n_b / tl.where(n == 0.0, 1.0, n))
    delta = mean_b - mean_a
    return mean_a + delta * frac, m2_a + m2_b + delta * delta * n_a * frac, n
"""


def welford(text: str) -> str:
    """The one-pass LayerNorm's statistics in one reduction (Welford's merge of
    (mean, M2, count) through tl.reduce) instead of three (shift, mean, variance). A
    constant row still gives exact zeros: every merge sees delta = 0."""
    single = re.search(
        r"( +)row_shift = tl\.sum\(tl\.where\(offs_n\[None, :\] == 0, value, 0\.0\), axis=1\)\n"
        r".*?row_rstd = tl\.rsqrt\(tl\.sum\(row_dev \* row_dev, axis=1\) / (\w+)"
        r" \+ ([0-9.e+-]+)\)\n",
        text,
        flags=re.S,
    )
    assert single, "no one-pass LayerNorm statistics"
    pad, cols, eps = single.group(1), single.group(2), single.group(3)
    new = (
        f"{pad}row_mean, row_m2, _ = tl.reduce(\n"
        f"{pad}    (tl.where(in_bounds, value, 0.0), tl.zeros_like(value),"
        " in_bounds.to(tl.float32)),\n"
        f"{pad}    1,\n"
        f"{pad}    _welford_combine,\n"
        f"{pad})\n"
        f"{pad}row_dev = tl.where(in_bounds, value - row_mean[:, None], 0.0)\n"
        f"{pad}row_rstd = tl.rsqrt(row_m2 / {cols} + {eps})\n"
    )
    text = text.replace(single.group(0), new)
    kernel = re.search(r"\n(@triton\.heuristics)", text)
    return text[: kernel.start()] + WELFORD_COMBINE + "\n" + text[kernel.start() :]


VARIANTS = {"noshift": no_shift, "welford": welford}


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
            ms = timing.do_bench_timer(lambda config=config: launcher(**next(cycle), config=config))
            graph = timing.graph_ms(lambda config=config: launcher(**next(cycle), config=config))
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
