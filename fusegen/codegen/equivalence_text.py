"""The generated tests' text: the error bound beside each step, sizes and input distributions."""

from __future__ import annotations

from fusegen import ops
from fusegen.codegen.chain_text import lit, operand_ref, steps_in_order
from fusegen.codegen.kernel_text import fast_tanh
from fusegen.ir import Emit, Gate, Kernel, RowStep, Step, Tensor

# Weights larger than this make interpreter launches take seconds each (about 0.1 us
# per weight element per row tile), so the CPU tests keep such kernels to one row tile.
LARGE_WEIGHT = 1 << 22


def bound_step(step: Step, v: str, e: str, fast: bool = False) -> list[str]:
    """Lines that advance value `v` and bound `e` through one step (docs/tolerances.md).
    fast: the kernel may run this activation's tanh.approx form (when the launch says
    `fast_tanh`, the test's flag of that name is 1)."""
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
        if fast and act.fast:
            impl += f" + fast_tanh * TANH_APPROX * {act.fast_error.format(v=v)}"
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
    fast = fast_tanh(kernel)
    if kernel.matmul:
        mm = kernel.matmul
        a = f"{mm.a}.T" if mm.a_transposed else mm.a
        b = f"{mm.b}.T" if mm.b_transposed else mm.b
        lines = [f"v = {a} @ {b}", f"e = dot_error({a}, {b}, p_in) + p_acc * v.abs()"]
    else:
        lines = [f"v = {kernel.source}", "e = torch.zeros_like(v)"]
    for item in kernel.steps:
        if isinstance(item, Gate):
            mm = item.matmul
            a = f"{mm.a}.T" if mm.a_transposed else mm.a
            b = f"{mm.b}.T" if mm.b_transposed else mm.b
            lines += [
                f"v_gate = {a} @ {b}",
                f"e_gate = dot_error({a}, {b}, p_in) + p_acc * v_gate.abs()",
            ]
            for step in item.steps:
                lines += bound_step(step, "v_gate", "e_gate", fast)
            lines += [
                "y = v * v_gate",
                "e = v.abs() * e_gate + v_gate.abs() * e + e * e_gate + U32 * y.abs()",
                "v = y",
            ]
        elif isinstance(item, Emit):
            lines.append(f"v_{item.name}, e_{item.name} = v, e")
        elif isinstance(item, RowStep):
            lines += bound_row(item)
        else:
            lines += bound_step(item, "v", "e", fast)
    return lines


def bound_returns(kernel: Kernel) -> str:
    return "[" + ", ".join(["(v, e)"] + [f"(v_{n}, e_{n})" for n in kernel.emits]) + "]"


# A reciprocal square root of x(1 - d) is off by at most (1 - d)**-0.5 - 1 relative:
# exact for the bound, not first-order, so it holds when a row is nearly constant.
_RSQRT_REL = "torch.rsqrt((1 - {err} / ({x})).clamp_min(1e-12)) - 1 + 4 * U32"


def bound_row(step: RowStep) -> list[str]:
    """Lines advancing (v, e) through a row op; `depth` bounds how many roundings a
    reduction's sum passes through (a tree over BLOCK_N, then one per block)."""
    params = dict(step.params)
    operands = dict(step.operands)
    if step.op in ("softmax", "log_softmax"):
        scale = params["scale"]
        lines = [
            f"z = v * {lit(scale)}",
            f"ez = e * {abs(scale)!r} + 2 * U32 * z.abs()",
        ]
        if "mask" in operands:
            lines += [f"z = z + {operands['mask']}", "ez = ez + U32 * z.abs()"]
        lines += [
            "zmax = z.amax(-1, keepdim=True)",
            "emax = ez.amax(-1, keepdim=True)",
            "# exp(z - max) for each term, off by its argument's error, relatively",
            "rel = torch.expm1(ez + emax + U32 * (z - zmax).abs()) + 4 * U32",
            "rel_sum = rel.amax(-1, keepdim=True) + depth * U_ACC",
        ]
        if step.op == "softmax":
            lines += ["y = torch.softmax(z, dim=-1)", "e = y * (rel + rel_sum + 4 * U32)"]
        else:
            lines += [
                "y = torch.log_softmax(z, dim=-1)",
                "log_sum = torch.log(torch.exp(z - zmax).sum(-1, keepdim=True))",
                "e = ez + emax + U32 * (z - zmax).abs() + rel_sum"
                " + 4 * U32 * (log_sum.abs() + y.abs())",
            ]
        return lines + ["v = y"]
    if step.op == "rmsnorm":
        eps = lit(params["eps"])
        lines = [
            "ms = v.square().mean(-1, keepdim=True)",
            "e_ms = (2 * v.abs() * e + e * e).mean(-1, keepdim=True) + (depth + 2) * U_ACC * ms",
            f"rstd = torch.rsqrt(ms + {eps})",
            "rel = " + _RSQRT_REL.format(err="e_ms", x=f"ms + {eps}"),
            "y = v * rstd",
            "e = e * rstd + y.abs() * rel + U32 * y.abs()",
        ]
        if "weight" in operands:
            gain = operands["weight"]
            if params["offset"]:
                gain = f"({lit(params['offset'])} + {gain})"
            lines += [f"y2 = y * {gain}", f"e = e * {gain}.abs() + 3 * U32 * y2.abs()", "y = y2"]
        return lines + ["v = y"]
    if step.op == "layernorm":
        eps = lit(params["eps"])
        lines = [
            "dev = v - v.mean(-1, keepdim=True)",
            "# The kernel works on deviations from the row's first element.",
            "spread = dev.abs() + dev[..., :1].abs()",
            "e_dev = e + e.mean(-1, keepdim=True)"
            " + (depth + 4) * U_ACC * (spread + spread.mean(-1, keepdim=True))",
            "var = dev.square().mean(-1, keepdim=True)",
            "e_var = (2 * dev.abs() * e_dev + e_dev * e_dev).mean(-1, keepdim=True)"
            " + (depth + 4) * U_ACC * var",
            f"rstd = torch.rsqrt(var + {eps})",
            "rel = " + _RSQRT_REL.format(err="e_var", x=f"var + {eps}"),
            "y = dev * rstd",
            "e = e_dev * rstd + y.abs() * rel + U32 * y.abs()",
        ]
        if "weight" in operands:
            w = operands["weight"]
            lines += [f"y2 = y * {w}", f"e = e * {w}.abs() + U32 * y2.abs()", "y = y2"]
        if "bias" in operands:
            b = operands["bias"]
            lines += [f"y2 = y + {b}", "e = e + U32 * y2.abs()", "y = y2"]
        return lines + ["v = y"]
    if step.op == "max":
        return ["y = v.amax(-1)", "e = e.amax(-1)", "v = y"]
    lines = ["y = v.sum(-1)", "e = e.sum(-1) + depth * U_ACC * v.abs().sum(-1)"]
    if step.op == "mean":
        lines += ["y = y / v.shape[-1]", "e = e / v.shape[-1] + 2 * U32 * y.abs()"]
    return lines + ["v = y"]


def kinked(kernel: Kernel) -> bool:
    """Whether an op of the chain has a derivative that jumps (ops.KINKED): only then may
    a few elements of a gradient miss the bound (runtime/equivalence.py)."""
    row = kernel.row_step
    return any(s.op in ops.KINKED for s in steps_in_order(kernel)) or (
        row is not None and row.op in ops.KINKED
    )


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

    return dynamic_cases(kernel, cpu, role), dynamic_cases(kernel, gpu, role)


def dynamic_cases(kernel: Kernel, table: dict, role) -> list[dict]:
    """One case per size in table["row"]: each dynamic dim takes the same place in its
    role's list (`role(dim name)`: a key of table; the lists' last entries, as many as
    there are rows), repeats dropped."""
    count = len(table["row"])
    cases = []
    for i in range(count):
        case = {d.name: table[role(d.name)][-count:][i] for d in kernel.dims if d.size is None}
        if case not in cases:
            cases.append(case)
    return cases


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
