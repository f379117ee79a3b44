"""The launcher's docs and the PyTorch reference's text."""

from __future__ import annotations

from fusegen import ops
from fusegen.codegen.chain_text import docstring_safe, lit, matmul_text, operand_ref
from fusegen.ir import Emit, Gate, Kernel, RowStep, Step, Tensor


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
    # The doc lands in the launcher's docstring: a """ in it must not close it.
    return f"{text} {docstring_safe(t.doc)}" if t.doc else text


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


def row_torch(step: RowStep) -> list[str]:
    """A row op in PyTorch, in at least fp32 (as model code upcasts for norms)."""
    params = dict(step.params)
    operands = dict(step.operands)
    lines = ["y = y.to(torch.promote_types(y.dtype, torch.float32))"]
    if step.op in ("softmax", "log_softmax"):
        z = "y" if params["scale"] == 1.0 else f"y * {lit(params['scale'])}"
        if "mask" in operands:
            z += f" + {operands['mask']}"
        lines.append(f"y = torch.{step.op}({z}, dim=-1)")
    elif step.op == "rmsnorm":
        lines.append(
            f"y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + {lit(params['eps'])})"
        )
        if "weight" in operands:
            gain = operands["weight"]
            if params["offset"]:
                gain = f"({lit(params['offset'])} + {gain})"
            lines.append(f"y = y * {gain}")
    elif step.op == "layernorm":
        lines.append("y = y - y.mean(-1, keepdim=True)")
        lines.append(
            f"y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + {lit(params['eps'])})"
        )
        if "weight" in operands:
            lines.append(f"y = y * {operands['weight']}")
        if "bias" in operands:
            lines.append(f"y = y + {operands['bias']}")
    else:
        lines.append(f"y = y.{'amax' if step.op == 'max' else step.op}(-1)")
    return lines


def reference_lines(kernel: Kernel) -> list[str]:
    lines = [f"y = {matmul_text(kernel.matmul)}" if kernel.matmul else f"y = {kernel.source}"]
    for item in kernel.steps:
        if isinstance(item, Gate):
            lines.append(f"y_gate = {matmul_text(item.matmul)}")
            lines += [torch_step(s, "y_gate") for s in item.steps]
            lines.append("y = y * y_gate")
        elif isinstance(item, Emit):
            lines.append(f"{item.name} = y")
        elif isinstance(item, RowStep):
            lines += row_torch(item)
        else:
            lines.append(torch_step(item, "y"))
    return lines


def reference_return(kernel: Kernel, first_unpinned: str) -> str:
    main = f"y.to(out_dtype or OUT_DTYPE or {first_unpinned}.dtype)"
    extras = [f"{e}.to(out_dtype or {first_unpinned}.dtype)" for e in kernel.emits]
    return ", ".join([main, *extras])
