"""The launcher's docs and the PyTorch reference's text."""

from __future__ import annotations

from fusegen import ops
from fusegen.chain_text import lit, matmul_text, operand_ref
from fusegen.ir import Gate, Kernel, Step, Tensor


def input_doc(kernel: Kernel, t: Tensor) -> str:
    dims = ", ".join(t.dims)
    shape = f"[..., {', '.join(t.dims[1:])}]" if t.batched and len(t.dims) > 1 else f"[{dims}]"
    if t.batched:
        shape += (
            f" ([{dims}], leading dims flattened into {t.dims[0]})"
            if len(t.dims) > 1
            else f" (any shape: {t.dims[0]} = its numel)"
        )
    sizes = [kernel.dim(d).size for d in t.dims]
    if all(s is not None for s in sizes):
        shape += " = [" + ", ".join(map(str, sizes)) + "]"
    dtype = t.dtype or "the call's dtype (" + " or ".join(kernel.dtypes) + ")"
    text = f"{shape}; {dtype}."
    return f"{text} {t.doc}" if t.doc else text


def out_doc(kernel: Kernel) -> str:
    first = next((t for t in kernel.inputs if t.batched), None)
    if first is None:
        shape = f"[{kernel.row}, {kernel.col}]"
    elif len(first.dims) > 1:
        shape = f"[..., {kernel.col}] (the leading dims of {first.name})"
    else:
        shape = f"[..., {kernel.col}] (the shape of {first.name})"
    return f"{shape}, {kernel.out_dtype or 'in the call dtype'}"


def torch_step(step: Step, var: str) -> str:
    if step.op in ops.ACTIVATIONS:
        act = ops.ACTIVATIONS[step.op]
        return f"{var} = " + act.torch.format(v=var, **{k: lit(v) for k, v in step.params})
    symbol = "*" if step.op == "scale" else "+" if step.op == "bias" else ops.BINARY[step.op].symbol
    right = (
        lit(step.constant)
        if step.constant is not None
        else operand_ref(step, step.operand, "torch")
    )
    return f"{var} = {var} {symbol} {right}"


def reference_lines(kernel: Kernel) -> list[str]:
    lines = [f"y = {matmul_text(kernel.matmul)}" if kernel.matmul else f"y = {kernel.source}"]
    for item in kernel.steps:
        if isinstance(item, Gate):
            lines.append(f"y_gate = {matmul_text(item.matmul)}")
            lines += [torch_step(s, "y_gate") for s in item.steps]
            lines.append("y = y * y_gate")
        else:
            lines.append(torch_step(item, "y"))
    return lines
