"""An attention kernel (ir.Attention) -> what its module and test module say: the score
lines each kernel runs between its two dots, the mask, the docs. The templates print."""

from __future__ import annotations

import textwrap

from fusegen.chain_text import docstring_safe, dtype_literal
from fusegen.ir import Attention

LOG2E = 1.4426950408889634

# (BLOCK_M, BLOCK_N, num_warps, num_stages) by head dim, as Triton's fused-attention
# tutorial tiles them; not yet tuned on a GPU.
CONFIGS = {64: (128, 64, 4, 3), 128: (128, 64, 8, 3), 256: (64, 32, 8, 2)}


def config(att: Attention) -> tuple[int, int, int, int]:
    return next(c for d, c in sorted(CONFIGS.items()) if att.head_dim <= d)


def score_formula(att: Attention) -> str:
    text = f"{_number(att.scale)} * q @ k.T" if att.scale_given else "q @ k.T / sqrt(head_dim)"
    if att.softcap:
        c = _number(att.softcap)
        text = f"{c} * tanh(({text}) / {c})"
    return text


def masks(att: Attention) -> str:
    """The masks in words, '' for none."""
    out = []
    if att.causal:
        out.append("causal")
    if att.window:
        out.append(f"a window of {att.window} keys")
    return ", ".join(out)


def seen(att: Attention, backward: bool) -> str:
    """Which (row, key) pairs a block's scores keep: keys past the end are never seen."""
    parts = ["(keys < SKV)[None, :]"]
    if backward:
        parts.append("(rows < SQ)[:, None]")
    if att.causal:
        parts.append("(keys[None, :] <= rows[:, None] + shift)")
    if att.window:
        parts.append(f"(keys[None, :] > rows[:, None] + shift - {att.window})")
    return " & ".join(parts)


def reference_seen(att: Attention) -> str:
    parts = []
    if att.causal:
        parts.append("(keys <= rows)")
    if att.window:
        parts.append(f"(keys > rows - {att.window})")
    return " & ".join(parts)


def forward_score_lines(att: Attention) -> list[str]:
    """The forward's scores in base 2 (its online softmax runs on exp2)."""
    if not att.softcap:
        return [f"scores = tl.dot(q, k) * {_number(att.scale * LOG2E)}  # the scale, in base 2"]
    return [
        f"scores = tl.dot(q, k) * {_number(att.scale / att.softcap)}",
        f"scores = {_number(att.softcap * LOG2E)} * _tanh(scores)  # softcapped, in base 2",
    ]


def backward_score_lines(att: Attention) -> list[str]:
    """The backward's scores in natural log units (lse is), keeping tanh for its derivative."""
    if not att.softcap:
        return [f"scores = tl.dot(q, tl.trans(k)) * {_number(att.scale)}"]
    return [
        f"capped = _tanh(tl.dot(q, tl.trans(k)) * {_number(att.scale / att.softcap)})",
        f"scores = {_number(att.softcap)} * capped",
    ]


def d_softcap(att: Attention) -> str:
    """The softcap's derivative as a factor of d_scores ('' without one)."""
    return " * (1.0 - capped * capped)" if att.softcap else ""


def _number(value: float) -> str:
    return repr(float(value))


def module_context(att: Attention, header: list[str], op_name: str, doc_width: int) -> dict:
    doc_lines = [
        wrapped
        for line in (att.doc.splitlines() if att.doc else [])
        for wrapped in (textwrap.wrap(docstring_safe(line), doc_width) or [""])
    ]
    seq_dims = "batch, seq, {h}, " if att.layout == "bshd" else "batch, {h}, seq, "
    return {
        "header": header,
        "name": att.name,
        "doc_lines": doc_lines,
        "layout": att.layout,
        "layout_doc": (seq_dims + "dim").format(h="heads"),
        "layout_doc_q": (seq_dims + "{d}").format(h=att.heads, d=att.head_dim),
        "layout_doc_kv": (seq_dims + "{d}").format(h=att.kv_heads, d=att.head_dim),
        "heads": att.heads,
        "kv_heads": att.kv_heads,
        "group": att.group,
        "head_dim": att.head_dim,
        "scale": _number(att.scale),
        "scale_default": not att.scale_given,
        "softcap": _number(att.softcap) if att.softcap else None,
        "causal": att.causal,
        "window": att.window,
        "masks": masks(att),
        "score_formula": score_formula(att),
        "dtypes_doc": ", ".join(att.dtypes),
        "dtypes_tuple": "("
        + ", ".join(dtype_literal(d) for d in att.dtypes)
        + ("," if len(att.dtypes) == 1 else "")
        + ")",
        "config": config(att),
        "score_lines": forward_score_lines(att),
        "score_lines_bwd": backward_score_lines(att),
        "seen": seen(att, backward=False),
        "seen_bwd": seen(att, backward=True),
        "reference_seen": reference_seen(att),
        "d_softcap": d_softcap(att),
        "op_name": op_name,
        "lse": True,
    }
