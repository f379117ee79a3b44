"""The generated tests' text: the error bound beside each step, sizes and input distributions."""

from __future__ import annotations

from fusegen import ops
from fusegen.chain_text import lit, operand_ref, steps_in_order
from fusegen.ir import Gate, Kernel, Step, Tensor

# Weights larger than this make interpreter launches take seconds each (about 0.1 us
# per weight element per row tile), so the CPU tests keep such kernels to one row tile.
LARGE_WEIGHT = 1 << 22


def bound_step(step: Step, v: str, e: str) -> list[str]:
    """Lines that advance value `v` and bound `e` through one step (docs/tolerances.md)."""
    if step.op in ops.ACTIVATIONS:
        act = ops.ACTIVATIONS[step.op]
        params = {k: lit(val) for k, val in step.params}
        expr = act.torch.format(v=v, **params)
        lip = act.lipschitz.format(v=v, e=e, **params)
        try:
            lip_term = f"{float(eval(lip, {'abs': abs, 'max': max}))!r} * {e}"  # noqa: S307 - our own constants
        except NameError:
            lip_term = f"({lip}) * {e}"
        impl = (
            f"16 * U32 * (1 + {v}.abs() + y.abs())"
            if act.transcendental
            else f"4 * U32 * ({v}.abs() + y.abs())"
        )
        return [f"y = {expr}", f"{e} = {lip_term} + {impl}", f"{v} = y"]
    if step.op == "scale":
        return [
            f"y = {v} * {lit(step.constant)}",
            f"{e} = {e} * {abs(step.constant)!r} + 2 * U32 * y.abs()",
            f"{v} = y",
        ]
    binary = ops.BINARY["add" if step.op == "bias" else step.op]
    if step.constant is not None:
        y = f"{v} {binary.symbol} {lit(step.constant)}"
        bound = binary.bound_constant.format(e=e, y="y", c=lit(step.constant))
    else:
        ref = operand_ref(step, step.operand, "torch")
        y = f"{v} {binary.symbol} {ref}"
        bound = binary.bound_tensor.format(e=e, y="y", r=ref)
    return [f"y = {y}", f"{e} = {bound}", f"{v} = y"]


def bound_lines(kernel: Kernel) -> list[str]:
    if kernel.matmul:
        mm = kernel.matmul
        a = f"{mm.a}.T" if mm.a_transposed else mm.a
        b = f"{mm.b}.T" if mm.b_transposed else mm.b
        lines = [f"v = {a} @ {b}", f"e = dot_error({a}, {b}, p_in)"]
    else:
        lines = [f"v = {kernel.source}", "e = torch.zeros_like(v)"]
    for item in kernel.steps:
        if isinstance(item, Gate):
            mm = item.matmul
            a = f"{mm.a}.T" if mm.a_transposed else mm.a
            b = f"{mm.b}.T" if mm.b_transposed else mm.b
            lines += [f"v_gate = {a} @ {b}", f"e_gate = dot_error({a}, {b}, p_in)"]
            for step in item.steps:
                lines += bound_step(step, "v_gate", "e_gate")
            lines += [
                "y = v * v_gate",
                "e = v.abs() * e_gate + v_gate.abs() * e + e * e_gate + U32 * y.abs()",
                "v = y",
            ]
        else:
            lines += bound_step(item, "v", "e")
    return lines


def heavy(kernel: Kernel) -> bool:
    """Whether the spec fixes weights so large that each interpreter launch takes seconds."""
    mm = kernel.matmul
    if not mm:
        return False
    return (kernel.dim(mm.k).size or 1) * (kernel.dim(mm.n).size or 1) > LARGE_WEIGHT


def cases(kernel: Kernel) -> tuple[list[dict], list[dict]]:
    """Sizes for the dynamic dims: (CPU cases, GPU cases)."""
    mm = kernel.matmul
    k = mm.k if mm else None
    cpu_rows = [19] if heavy(kernel) else [1, 37]
    # Per role: CPU values step past the interpreter's blocks (256 for matmul N and K,
    # 1024 for elementwise columns); GPU values are odd and large.
    cpu = {"row": cpu_rows, "col": [70, 300] if mm else [70, 1100], "k": [70, 300]}
    gpu = {
        "row": [1, 77, 3000],
        "col": [50, 1000, 4097] if mm else [50, 1000, 8195],
        "k": [70, 1000, 4099],
    }

    def role(name: str) -> str:
        return "row" if name == kernel.row else "k" if name == k else "col"

    def build(table: dict) -> list[dict]:
        count = len(table["row"])
        cases = []
        for i in range(count):
            case = {d.name: table[role(d.name)][-count:][i] for d in kernel.dims if d.size is None}
            if case not in cases:
                cases.append(case)
        return cases

    return build(cpu), build(gpu)


def aligned_cases(kernel: Kernel) -> tuple[dict, dict]:
    """Sizes whose rows are whole 16-byte multiples in every dtype (multiples of 8
    elements) but not of the block sizes: (CPU, GPU). The row count is a row length
    only when `a` is read transposed."""
    transposed = kernel.matmul is not None and kernel.matmul.a_transposed
    cpu = {"row": 40 if transposed else 19 if heavy(kernel) else 37, "col": 264, "k": 264}
    gpu = {"row": 304 if transposed else 300, "col": 1032, "k": 1048}
    k = kernel.matmul.k if kernel.matmul else None

    def role(name: str) -> str:
        return "row" if name == kernel.row else "k" if name == k else "col"

    def build(table: dict) -> dict:
        return {d.name: table[role(d.name)] for d in kernel.dims if d.size is None}

    return build(cpu), build(gpu)


def dist(kernel: Kernel, t: Tensor) -> str:
    mm = kernel.matmul
    weights = {mm.b} | {g.matmul.b for g in kernel.steps if isinstance(g, Gate)} if mm else set()
    if t.name in weights:
        return "weight"
    if any(s.op == "div" and s.operand == t.name for s in steps_in_order(kernel)):
        return "nonzero"
    return "normal"
