"""Small pieces of generated text shared by the kernel, the reference and the tests."""

from __future__ import annotations

import textwrap

from fusegen import ops
from fusegen.dtypes import DTYPES
from fusegen.ir import Emit, Gate, Kernel, Matmul, RowStep, Step


def lit(value: float) -> str:
    return repr(float(value))


def tuple_literal(items: list[str]) -> str:
    """Python source for a tuple, without a trailing comma that black would explode."""
    return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"


def dtype_literal(name: str) -> str:
    return f"torch.{DTYPES[name].torch}"


def dict_literal(pairs: list[tuple[str, str]]) -> str:
    return "{" + ", ".join(f'"{k}": {v}' for k, v in pairs) + "}"


def docstring_safe(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def wrapped_doc(doc: str, width: int) -> list[str]:
    """A spec's `doc`, made safe inside a docstring and wrapped at `width` (its blank
    lines kept)."""
    return [
        wrapped
        for line in (doc.splitlines() if doc else [])
        for wrapped in (textwrap.wrap(docstring_safe(line), width) or [""])
    ]


def operand_ref(step: Step, name: str, style: str) -> str:
    """How an operand broadcasts against the [rows, cols] value, in Triton or torch."""
    if step.broadcast == "row":
        return f"{name}[None, :]" if style == "triton" else name
    if step.broadcast == "col":
        return f"{name}[:, None]" if style == "triton" else f"{name}[..., None]"
    return name


def matmul_text(mm: Matmul) -> str:
    return f"{mm.a}{'.T' if mm.a_transposed else ''} @ {mm.b}{'.T' if mm.b_transposed else ''}"


def steps_in_order(kernel: Kernel) -> list[Step]:
    """The elementwise steps, a gate's included (not row ops or extra outputs)."""
    out: list[Step] = []
    for item in kernel.steps:
        if isinstance(item, Gate):
            out.extend(item.steps)
        elif isinstance(item, Step):
            out.append(item)
    return out


def row_text(step: RowStep, operand: str) -> str:
    """rmsnorm(h, weight=w, eps=1e-05), softmax(x * 0.125 + mask), sum(x)."""
    params = dict(step.params)
    if step.op in ("softmax", "log_softmax"):
        inner = operand if params["scale"] == 1.0 else f"{operand} * {params['scale']:g}"
        mask = dict(step.operands).get("mask")
        return f"{step.op}({inner}{' + ' + mask if mask else ''})"
    args = [f"{role}={name}" for role, name in step.operands]
    args += [f"{k}={v:g}" for k, v in step.params if not (k == "offset" and v == 0.0)]
    return f"{step.op}({', '.join([operand, *args])})"


# Precedence levels: 0 an atom or call, 1 a product, 2 a sum.
_LEVEL = {"+": 2, "-": 2, "*": 1, "/": 1}


def _apply(expr: tuple[str, int], step: Step) -> tuple[str, int]:
    text, level = expr
    if step.op in ops.ACTIVATIONS:
        params = "".join(f", {k}={v:g}" for k, v in step.params)
        return f"{step.op}({text}{params})", 0
    symbol = "*" if step.op == "scale" else "+" if step.op == "bias" else ops.BINARY[step.op].symbol
    right = (
        f"{step.constant:g}"
        if step.constant is not None
        else operand_ref(step, step.operand, "torch")
    )
    if level > _LEVEL[symbol]:
        text = f"({text})"
    return f"{text} {symbol} {right}", _LEVEL[symbol]


def formula(kernel: Kernel) -> str:
    expr = (matmul_text(kernel.matmul), 1) if kernel.matmul else (kernel.source, 0)
    named = []
    for item in kernel.steps:
        if isinstance(item, Gate):
            gate = (matmul_text(item.matmul), 1)
            for step in item.steps:
                gate = _apply(gate, step)
            left = f"({expr[0]})" if expr[1] > 1 else expr[0]
            right = f"({gate[0]})" if gate[1] > 0 else gate[0]
            expr = (f"{left} * {right}", 1)
        elif isinstance(item, Emit):
            named.append(f"{item.name} = {expr[0]}")
            expr = (item.name, 0)
        elif isinstance(item, RowStep):
            expr = (row_text(item, expr[0]), 0)
        else:
            expr = _apply(expr, item)
    text = "; ".join(named + [f"y = {expr[0]}"])
    return f"{text}, as {kernel.out_dtype}" if kernel.out_dtype else text
