"""The Triton kernel's text: addresses, the mainloop, the chain's epilogue, helpers."""

from __future__ import annotations

from fusegen import naming, ops
from fusegen.chain_text import lit, operand_ref, steps_in_order
from fusegen.ir import Gate, Kernel, Step, Tensor


def tile_addr(tensor: Tensor, axes: tuple[str, str]) -> str:
    """Address of a [len(axes[0]), len(axes[1])] tile of a tensor, by dim name."""
    rows, cols = axes
    return (
        f"{naming.ptr(tensor.name)} + {naming.offs(rows)}[:, None] * {naming.stride(tensor.name, rows)}"
        f" + {naming.offs(cols)}[None, :] * {naming.stride(tensor.name, cols)}"
    )


def operand_load(kernel: Kernel, tensor: Tensor, broadcast: str) -> str:
    if broadcast == "full":
        addr, mask = tile_addr(tensor, (kernel.row, kernel.col)), "mask"
    else:
        dim = tensor.dims[0]
        addr = f"{naming.ptr(tensor.name)} + {naming.offs(dim)} * {naming.stride(tensor.name, dim)}"
        mask = naming.mask(dim)
    return f"{tensor.name} = tl.load({addr}, mask={mask}, other=0.0).to(tl.float32)"


def triton_step(kernel: Kernel, step: Step, var: str, loaded: set[str]) -> list[str]:
    lines = []
    if step.operand and step.operand not in loaded:
        loaded.add(step.operand)
        lines.append(operand_load(kernel, kernel.tensor(step.operand), step.broadcast))
    if step.op in ops.ACTIVATIONS:
        args = "".join(f", {lit(v)}" for _, v in step.params)
        lines.append(f"{var} = {naming.helper(step.op)}({var}{args})")
        return lines
    symbol = "*" if step.op == "scale" else "+" if step.op == "bias" else ops.BINARY[step.op].symbol
    right = (
        lit(step.constant)
        if step.constant is not None
        else operand_ref(step, step.operand, "triton")
    )
    lines.append(f"{var} = {var} {symbol} {right}")
    return lines


def epilogue(kernel: Kernel, value: str) -> list[str]:
    lines: list[str] = []
    loaded: set[str] = set()
    for item in kernel.steps:
        if isinstance(item, Gate):
            for step in item.steps:
                lines += triton_step(kernel, step, "acc_gate", loaded)
            lines.append(f"{value} = {value} * acc_gate")
        else:
            lines += triton_step(kernel, item, value, loaded)
    return lines


def helpers(kernel: Kernel) -> list[dict]:
    seen: list[str] = []
    for step in steps_in_order(kernel):
        if step.op in ops.ACTIVATIONS and step.op not in seen:
            seen.append(step.op)
    out = []
    for name in seen:
        act = ops.ACTIVATIONS[name]
        out.append(
            {
                "name": naming.helper(name),
                "args": ", ".join(["x"] + [p.helper_arg for p in act.params]),
                "math": act.math,
                "why": act.why,
                "body": list(act.triton),
            }
        )
    return out


def mainloop(kernel: Kernel) -> tuple[list[dict], list[dict]]:
    mm = kernel.matmul
    k = mm.k
    a = kernel.tensor(mm.a)
    operands = [
        {
            "tile": naming.tile(a.name),
            "ptrs": f"{a.name}_ptrs",
            "ptrs_init": tile_addr(a, (mm.m, k)),
            "mask_even": f"{naming.mask(mm.m)}[:, None]",
            "mask_tail": f"{naming.mask(mm.m)}[:, None] & {naming.mask(k)}[None, :]",
            "stride_k": naming.stride(a.name, k),
        }
    ]
    dots = []
    for acc, b_name in weights(kernel):
        b = kernel.tensor(b_name)
        operands.append(
            {
                "tile": naming.tile(b.name),
                "ptrs": f"{b.name}_ptrs",
                "ptrs_init": tile_addr(b, (k, mm.n)),
                "mask_even": f"{naming.mask(mm.n)}[None, :]",
                "mask_tail": f"{naming.mask(k)}[:, None] & {naming.mask(mm.n)}[None, :]",
                "stride_k": naming.stride(b.name, k),
            }
        )
        dots.append({"acc": acc, "a": naming.tile(a.name), "b": naming.tile(b.name)})
    return operands, dots


def weights(kernel: Kernel) -> list[tuple[str, str]]:
    """(accumulator, weight) for the chain's matmul and a gate's."""
    return [("acc", kernel.matmul.b)] + [
        ("acc_gate", g.matmul.b) for g in kernel.steps if isinstance(g, Gate)
    ]


def tma_mainloop(kernel: Kernel) -> dict:
    """The TMA kernel's descriptors and tile loads. Each descriptor covers its tensor in
    the layout the spec declares (last dim contiguous); a tile the dot needs the other
    way round is loaded as declared and transposed in registers, which wgmma reads from
    shared memory at no cost."""
    mm = kernel.matmul
    block = {mm.m: "BLOCK_M", mm.k: "BLOCK_K", mm.n: "BLOCK_N"}
    coord = {mm.m: "pid_m * BLOCK_M", mm.k: "k * BLOCK_K", mm.n: "pid_n * BLOCK_N"}

    def descriptor(t: Tensor) -> dict:
        return {
            "name": f"{t.name}_desc",
            "ptr": naming.ptr(t.name),
            "shape": ", ".join(t.dims),
            "strides": f"{naming.stride(t.name, t.dims[0])}, 1",
            "block": ", ".join(block[d] for d in t.dims),
        }

    def load(t: Tensor, needed: tuple[str, str]) -> dict:
        expr = f"{t.name}_desc.load([{', '.join(coord[d] for d in t.dims)}])"
        return {"tile": naming.tile(t.name), "expr": expr + (".T" if t.dims != needed else "")}

    a = kernel.tensor(mm.a)
    bs = [kernel.tensor(b) for _, b in weights(kernel)]
    out = descriptor(Tensor(naming.OUT, (kernel.row, kernel.col), None, "", False))
    # A subtiled epilogue stores half tiles.
    out["block"] = "BLOCK_M, BLOCK_N // 2 if EPILOGUE_SUBTILE else BLOCK_N"
    return {
        "descriptors": [descriptor(t) for t in [a, *bs]] + [out],
        "loads": [load(a, (mm.m, mm.k))] + [load(b, (mm.k, mm.n)) for b in bs],
        "out_desc": f"{naming.OUT}_desc",
    }


def params(kernel: Kernel, *, tma: bool = False) -> list[dict]:
    meta = (
        ["BLOCK_M", "BLOCK_N"]
        + (["BLOCK_K", "GROUP_M"] + ([] if tma else ["EVEN_K"]) if kernel.matmul else [])
        + ["INT64"]
    )
    if kernel.matmul:
        meta.append("DOT_UPCAST")
    if tma:
        meta += ["NUM_SMS", "FLATTEN", "WARP_SPECIALIZE", "EPILOGUE_SUBTILE"]
    strides = [naming.stride(t.name, d) for t in kernel.inputs for d in t.dims]
    strides += [naming.stride(naming.OUT, kernel.row), naming.stride(naming.OUT, kernel.col)]
    return [
        {
            "comment": "Pointers to the inputs and the output",
            "names": [naming.ptr(t.name) for t in kernel.inputs] + [naming.ptr(naming.OUT)],
        },
        {"comment": "Dims", "names": [d.name for d in kernel.dims] + [naming.ROWS_BUCKET]},
        {"comment": "Strides: elements to step for one index along each dim", "names": strides},
        {"comment": "Meta-parameters", "names": [f"{m}: tl.constexpr" for m in meta]},
    ]
