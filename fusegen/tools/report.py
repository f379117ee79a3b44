"""`fusegen bench` results as a terminal table, Markdown, JSON and a PNG chart."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from fusegen.tools.bench import Ceilings, Result


def _cells(r: Result) -> list[str]:
    unit = "TFLOP/s" if _is_matmul(r) else "GB/s"
    return [
        r.kernel,
        "x".join(map(str, r.shape)) + (f" ({r.layout})" if r.layout else ""),
        r.dtype,
        r.variant,
        f"{r.ms:.4f}" if r.ms is not None else "-",
        f"{r.rate:.0f} {unit}" if r.rate is not None else "-",
        f"{100 * r.roofline:.0f}%" if r.roofline is not None else "-",
        f"{r.first_call_s:.2f}" if r.first_call_s is not None else "-",
        f"{r.error:.1e}" if r.error is not None else "-",
        ("ok" if r.ms is not None else "n/a") if r.ok else "FAIL",
        f"{r.speedup:.2f}x" if r.speedup is not None else "",
        r.note,
    ]


def _is_matmul(r: Result) -> bool:
    return len(r.shape) == 3


HEADER = [
    "kernel",
    "shape",
    "dtype",
    "variant",
    "ms",
    "rate",
    "roofline",
    "first call s",
    "error",
    "check",
    "vs best other",
    "note",
]


def table(results: list[Result]) -> str:
    rows = [HEADER] + [_cells(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER) - 1)]
    lines = []
    for row in rows:
        padded = zip(row, widths, strict=False)  # all but the last cell, which is not padded
        lines.append("  ".join(cell.ljust(w) for cell, w in padded) + "  " + row[-1])
    return "\n".join(lines)


TIMER_WORDS = {
    "call": "Times: do_bench median per Python call, L2 cleared before each.",
    "graph": "Times: GPU time per call replayed from a CUDA graph (no launch cost).",
}


def markdown(results: list[Result], ceilings: Ceilings, meta: dict) -> str:
    lines = [
        f"Ceilings measured in this run: {ceilings.tflops:.0f} TFLOP/s (bf16 matmul 8192^3), "
        f"{ceilings.gbs:.0f} GB/s (device copy, read + write). Roofline: the larger of "
        "flops / matmul ceiling and bytes / copy ceiling, over the measured time.",
        "",
        f"{meta.get('gpu')}, torch {meta.get('torch')}, triton {meta.get('triton')}. "
        + TIMER_WORDS.get(meta.get("timer", "call"), ""),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    for r in results:
        cells = [c.replace("|", "\\|") for c in _cells(r)]
        if r.variant == "fusegen":
            cells[3] = "**fusegen**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_json(results: list[Result], ceilings: Ceilings, meta: dict) -> str:
    return json.dumps(
        {"meta": meta, "ceilings": asdict(ceilings), "results": [asdict(r) for r in results]},
        indent=2,
        sort_keys=True,
    )


def chart(results: list[Result], path: Path) -> bool:
    """A bar chart of each shape's times, fusegen first. False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups: dict[str, list[Result]] = {}
    for r in results:
        if r.ms is not None:
            stored = f" ({r.layout})" if r.layout else ""
            groups.setdefault(
                f"{r.kernel}\n{'x'.join(map(str, r.shape))}{stored} {r.dtype}", []
            ).append(r)
    variants = sorted({r.variant for r in results}, key=lambda v: (v != "fusegen", v))
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(groups)), 4.5))
    width = 0.8 / max(1, len(variants))
    for j, variant in enumerate(variants):
        xs, ys = [], []
        for i, rows in enumerate(groups.values()):
            best = min(r.ms for r in rows)
            for r in rows:
                if r.variant == variant:
                    xs.append(i + j * width)
                    ys.append(r.ms / best)
        ax.bar(xs, ys, width, label=variant)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
    ax.set_xticklabels(list(groups), fontsize=7)
    ax.set_ylabel("time / fastest (lower is better)")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write(out_dir: Path, results: list[Result], ceilings: Ceilings, meta: dict) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "bench.json", out_dir / "bench.md"]
    paths[0].write_text(to_json(results, ceilings, meta) + "\n")
    paths[1].write_text(markdown(results, ceilings, meta))
    if chart(results, out_dir / "bench.png"):
        paths.append(out_dir / "bench.png")
    return paths
