"""An attention kernel's spec -> ir.Attention: the checks pydantic's field types cannot
make (how the heads divide, which head dims the kernels tile, which masks combine)."""

from __future__ import annotations

import math

from fusegen import dtypes
from fusegen.errors import SpecError
from fusegen.ir import Attention
from fusegen.spec.source import SpecSource
from fusegen.spec.models import AttentionKernelSpec

MAX_HEAD_DIM = 256  # one BLOCK_D tile per row in registers


def lower_attention(
    source: SpecSource, path: tuple, spec: AttentionKernelSpec, name_problem
) -> tuple[Attention | None, list[SpecError]]:
    """The kernel, or None, and the errors found (each naming its spec path)."""
    errors: list[SpecError] = []

    def err(rel: tuple, message: str, hint: str = "") -> None:
        errors.append(source.error(path + rel, message, hint))

    problem = name_problem(spec.name)
    if problem:
        err(("name",), *problem)
    for j, name in enumerate(spec.dtypes):
        if name in spec.dtypes[:j]:
            err(("dtypes", j), f"dtype {name} is listed twice", "list each dtype once")
    a = spec.attention
    kv_heads = a.kv_heads or a.heads
    if a.heads % kv_heads:
        err(
            ("attention", "kv_heads"),
            f"kv_heads {kv_heads} does not divide heads {a.heads}",
            "each key/value head serves the same number of query heads: "
            f"kv_heads is one of {', '.join(str(d) for d in _divisors(a.heads))}",
        )
    if a.head_dim % 16 or not 16 <= a.head_dim <= MAX_HEAD_DIM:
        err(
            ("attention", "head_dim"),
            f"head_dim {a.head_dim} is not a multiple of 16 from 16 to {MAX_HEAD_DIM}",
            "tensor-core tiles take 16 elements at a time: 64, 96, 128 and 256 are common",
        )
    if a.v_head_dim is not None and (a.v_head_dim % 16 or not 16 <= a.v_head_dim <= MAX_HEAD_DIM):
        err(
            ("attention", "v_head_dim"),
            f"v_head_dim {a.v_head_dim} is not a multiple of 16 from 16 to {MAX_HEAD_DIM}",
            "tensor-core tiles take 16 elements at a time (MLA: 128 against q and k's 192); "
            "leave it out where v's dim is head_dim",
        )
    if a.window is not None and not a.causal:
        err(
            ("attention", "window"),
            "a sliding window needs causal: true",
            "the window holds a query's most recent keys, its own included (Mistral)",
        )
    if a.alibi and not a.causal:
        err(
            ("attention", "alibi"),
            "ALiBi needs causal: true",
            "its bias, slope * (key - query position), is the distance to past keys",
        )
    if errors:
        return None, errors
    return (
        Attention(
            name=spec.name,
            doc=spec.doc,
            spec_display=source.display,
            spec_sha256=source.sha256,
            dtypes=tuple(dtypes.canonical(d) for d in spec.dtypes),
            layout=a.layout,
            heads=a.heads,
            kv_heads=kv_heads,
            head_dim=a.head_dim,
            scale=a.scale if a.scale is not None else 1 / math.sqrt(a.head_dim),
            scale_given=a.scale is not None,
            softcap=a.softcap,
            causal=a.causal,
            window=a.window,
            alibi=a.alibi,
            bias=a.bias,
            v_head_dim=0 if a.v_head_dim in (None, a.head_dim) else a.v_head_dim,
        ),
        errors,
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
