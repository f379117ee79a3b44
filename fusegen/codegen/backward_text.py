"""The backward kernel's text: reverse mode over a chain's steps.

The kernel recomputes the chain's forward values in fp32 from what the forward saved (a
matmul chain's accumulators before the epilogue) or from the inputs (elementwise and row
chains, which are memory-bound: reading the inputs again costs less than storing and
reading back intermediates). It then carries the incoming gradient back step by step,
each op's derivative taken from fusegen.ops, and writes:

- `d_pre` (and `d_pre_gate`): the gradient at a matmul's output, which the launcher's
  backward multiplies into the operands' gradients (cuBLAS);
- each input's gradient: a [rows, cols] tensor where the input is one ("full"), else
  fp32 partial sums that the launcher adds up in a fixed order (deterministic, no
  atomics): per row block for a [cols] vector ("row"), per column block for a [rows]
  vector ("col").

Tile kernels (matmul and elementwise chains) run one program per [BLOCK_M, BLOCK_N] tile.
Row kernels hold a whole row in BLOCK_N and loop over row blocks, so that a [cols]
gradient (a norm's weight) is summed in registers and stored once per program.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fusegen import ops
from fusegen.codegen import naming
from fusegen.codegen.chain_text import lit, operand_ref, steps_in_order
from fusegen.ir import Emit, Gate, Kernel, RowStep, Step
from fusegen.codegen.kernel_text import (
    fast_tanh,
    operand_load,
    row_max,
    row_stats,
    stat_addr,
    tile_addr,
)

GRAD = "grad"  # the incoming gradient, then the running one
FLAT = "flat"  # offsets into the contiguous [rows, cols] buffers the backward allocates


@dataclass(frozen=True)
class GradOut:
    """A gradient the backward kernel writes: `name` is an input's name, or pre/pre_gate.
    `same`: another input whose full gradient is this one's value (x and r of `x + r`):
    the kernel stores it once, and the launcher returns that tensor for both."""

    name: str
    kind: str  # "full", "row" (a [cols] input) or "col" (a [rows] input)
    same: str | None = None

    @property
    def fact(self) -> str:
        """Its kind in the launcher's `backward` facts: "=<name>" for a `same` one."""
        return f"={self.same}" if self.same else self.kind

    @property
    def ptr(self) -> str:
        return naming.ptr(f"d_{self.name}")

    @property
    def need(self) -> str:
        return f"NEED_{self.name.upper()}"


def helper_grads(kernel: Kernel) -> list[dict]:
    """The derivative helpers `_<op>_grad(x, *params)` the backward kernel calls."""
    seen: list[str] = []
    for item in steps_in_order(kernel):
        if item.op in ops.ACTIVATIONS and item.op not in seen:
            seen.append(item.op)
    out = []
    for name in seen:
        act = ops.ACTIVATIONS[name]
        out.append(
            {
                "name": f"{naming.helper(name)}_grad",
                "args": ", ".join(["x"] + [p.helper_arg for p in act.params]),
                "math": f"d/dx {act.math}",
                "body": list(act.grad),
            }
        )
    return out


class _Reverse:
    """Forward lines with a name per value (fwd_0, fwd_1, ...), then the reverse pass."""

    def __init__(self, kernel: Kernel, loaded: set[str]):
        self.kernel = kernel
        self.loaded = loaded
        self.forward: list[str] = []
        self.grads: dict[str, str] = {}  # input -> broadcast kind, in first-use order
        self.started: set[str] = set()
        self.counter = 0

    def fresh(self, stem: str = "fwd") -> str:
        self.counter += 1
        return f"{stem}_{self.counter}"

    def load(self, step: Step) -> None:
        if step.operand and step.operand not in self.loaded:
            self.loaded.add(step.operand)
            self.forward.append(
                operand_load(self.kernel, self.kernel.tensor(step.operand), step.broadcast)
            )

    def step_forward(self, step: Step, value: str) -> str:
        """The line computing `step` on `value` into a new name; returns the name."""
        self.load(step)
        out = self.fresh()
        if step.op in ops.ACTIVATIONS:
            args = "".join(f", {lit(v)}" for _, v in step.params)
            if fast_tanh(self.kernel) and ops.ACTIVATIONS[step.op].fast:
                args += ", False"  # the accurate form: a gradient is not rounded to bf16
            self.forward.append(f"{out} = {naming.helper(step.op)}({value}{args})")
            return out
        symbol = (
            "*" if step.op == "scale" else "+" if step.op == "bias" else ops.BINARY[step.op].symbol
        )
        self.forward.append(f"{out} = {value} {symbol} {self.right(step)}")
        return out

    def right(self, step: Step) -> str:
        if step.constant is not None:
            return lit(step.constant)
        return operand_ref(step, step.operand, "triton")

    def contribute(self, name: str, kind: str, expr: str, lines: list[str]) -> None:
        self.grads.setdefault(name, kind)
        var = f"d_{name}"
        if var in self.started:
            lines.append(f"{var} = {var} + {expr}")
        else:
            self.started.add(var)
            lines.append(f"{var} = {expr}")

    def step_backward(self, step: Step, value: str, grad: str, lines: list[str]) -> None:
        """Carry `grad` back over `step`, whose input was `value` (in place on `grad`)."""
        if step.op in ops.ACTIVATIONS:
            args = "".join(f", {lit(v)}" for _, v in step.params)
            lines.append(f"{grad} = {grad} * {naming.helper(step.op)}_grad({value}{args})")
            return
        binary = ops.BINARY[
            "mul" if step.op == "scale" else "add" if step.op == "bias" else step.op
        ]
        names = {"g": grad, "v": value, "r": self.right(step)}

        def text(expr: str) -> str:
            return re.sub(r"\b[gvr]\b", lambda m: names[m.group(0)], expr)

        if step.operand is not None:
            kind = "full" if step.broadcast == "full" else step.broadcast
            self.contribute(step.operand, kind, text(binary.grad_operand), lines)
        if binary.grad_value != "g":
            lines.append(f"{grad} = {text(binary.grad_value)}")


def _tile_forward(kernel: Kernel) -> tuple[_Reverse, list[str], list, str]:
    """A tile kernel's forward in fp32, from the accumulators (a matmul chain) or the
    source input: (its reverse pass so far, the loads, each step with its input value,
    the chain's value)."""
    rev = _Reverse(kernel, set())
    mm = kernel.matmul
    loads = []
    if mm:
        loads.append(f"fwd_0 = tl.load(pre_ptr + {FLAT}, mask=in_bounds, other=0.0).to(tl.float32)")
    else:
        src = kernel.tensor(kernel.source)
        loads.append(
            f"fwd_0 = tl.load({tile_addr(src, (kernel.row, kernel.col))}, mask=in_bounds,"
            " other=0.0).to(tl.float32)"
        )
    # Forward, remembering each step's input value.
    trail: list[tuple[object, str, list]] = []
    value = "fwd_0"
    for item in kernel.steps:
        if isinstance(item, Gate):
            rev.forward.append(
                f"gate_0 = tl.load(pre_gate_ptr + {FLAT}, mask=in_bounds, other=0.0)"
                ".to(tl.float32)"
            )
            gate_value, gate_trail = "gate_0", []
            for step in item.steps:
                gate_trail.append((step, gate_value))
                gate_value = rev.step_forward(step, gate_value)
            out = rev.fresh()
            rev.forward.append(f"{out} = {value} * {gate_value}")
            trail.append((item, value, [gate_value, gate_trail]))
            value = out
        else:
            trail.append((item, value, []))
            value = rev.step_forward(item, value)
    return rev, loads, trail, value


def tile_epilogue(kernel: Kernel) -> dict:
    """A matmul chain's epilogue as a kernel of its own, for training forwards that take
    the accumulators from cuBLAS (which it must save anyway): its lines and parameters.
    The activations' accurate forms, as the backward's."""
    rev, loads, _, value = _tile_forward(kernel)
    store = f"tl.store(out_ptr + {FLAT}, {value}.to(out_ptr.dtype.element_ty), mask=in_bounds)"
    passed = backward_inputs(kernel)
    pointers = ["pre_ptr"] + (["pre_gate_ptr"] if kernel.gate else [])
    pointers += [naming.ptr(t) for t in passed] + ["out_ptr"]
    strides = [naming.stride(t, d) for t in passed for d in kernel.tensor(t).dims]
    params = [
        {"comment": "accumulators, inputs, then the output", "names": pointers},
        {"comment": "dims", "names": [kernel.row, kernel.col]},
        {"comment": "strides, in elements", "names": strides},
        {
            "comment": "meta-parameters",
            "names": [f"{m}: tl.constexpr" for m in ("BLOCK_M", "BLOCK_N", "INT64")],
        },
    ]
    return {"lines": _live(loads + rev.forward, [store]) + [store], "params": params}


def tile_backward(kernel: Kernel) -> dict:
    """The tile kernel's body after its offsets and masks: (loads and forward lines,
    reverse lines, stores), and the gradients it writes."""
    rev, loads, trail, _ = _tile_forward(kernel)
    mm = kernel.matmul
    offs_r, offs_c = naming.offs(kernel.row), naming.offs(kernel.col)
    grad_addr = (
        f"{naming.ptr(GRAD)} + {offs_r}[:, None] * {naming.stride(GRAD, kernel.row)}"
        f" + {offs_c}[None, :] * {naming.stride(GRAD, kernel.col)}"
    )
    backward = [f"{GRAD} = tl.load({grad_addr}, mask=in_bounds, other=0.0).to(tl.float32)"]
    for item, before, extra in reversed(trail):
        if isinstance(item, Gate):
            gate_value, gate_trail = extra
            backward.append(f"grad_gate = {GRAD} * {before}")
            backward.append(f"{GRAD} = {GRAD} * {gate_value}")
            for step, gate_before in reversed(gate_trail):
                rev.step_backward(step, gate_before, "grad_gate", backward)
        else:
            rev.step_backward(item, before, GRAD, backward)
    outs: list[GradOut] = []
    stores: list[str] = []
    if mm:
        outs.append(GradOut("pre", "full"))
        stores.append(_store_full(GradOut("pre", "full"), GRAD))
        if kernel.gate:
            outs.append(GradOut("pre_gate", "full"))
            stores.append(_store_full(GradOut("pre_gate", "full"), "grad_gate"))
    else:
        rev.contribute(kernel.source, "full", GRAD, backward)
    same = _same_grads(kernel, backward, rev.grads)
    for name, kind in rev.grads.items():
        out = GradOut(name, kind, same.get(name))
        outs.append(out)
        if out.same is None:
            stores.append(f"if {out.need}:")
            stores.append("    " + _store_tile(kernel, out, f"d_{name}"))
    forward = _live(loads + rev.forward, backward + stores)
    return {
        "loads": forward,
        "backward": backward,
        "stores": stores,
        "grads": outs,
        "inputs": backward_inputs(kernel),
    }


def _same_grads(kernel: Kernel, backward: list[str], grads: dict[str, str]) -> dict[str, str]:
    """{input: the input whose gradient it equals} for full gradients of one dtype assigned
    once, as the running gradient, at the same point of the reverse pass (x and r of
    `x + r`): the first of each such group is stored, the others are the same tensor (their
    assignments are dropped from `backward`)."""
    version, at, more = 0, {}, set()
    for line in backward:
        if line.startswith(f"{GRAD} = "):
            version += 1
        match = re.match(r"^d_(\w+) = (.*)$", line)
        if match and match.group(1) in grads:
            if match.group(2) == GRAD and match.group(1) not in at:
                at[match.group(1)] = version
            else:
                more.add(match.group(1))
    first: dict[int, str] = {}
    same = {}
    for name, kind in grads.items():
        if kind != "full" or name not in at or name in more:
            continue
        key = (at[name], kernel.tensor(name).dtype)
        if key in first:
            same[name] = first[key]
        else:
            first[key] = name
    dropped = {f"d_{name} = {GRAD}" for name in same}
    backward[:] = [line for line in backward if line not in dropped]
    return same


def _live(forward: list[str], rest: list[str]) -> list[str]:
    """`forward` without the assignments no later line reads (a chain's last values, an
    output the gradient does not need): the compiler drops them too, but a reader and
    the linters should not see them."""
    lines = list(forward)
    while True:
        kept = []
        for i, line in enumerate(lines):
            target = re.match(r"^(\w+) = ", line)
            later = lines[i + 1 :] + rest
            used = target and any(re.search(rf"\b{target.group(1)}\b", x) for x in later)
            if target is None or used:
                kept.append(line)
        if len(kept) == len(lines):
            return kept
        lines = kept


def _store_full(out: GradOut, var: str) -> str:
    return f"tl.store({out.ptr} + {FLAT}, {var}.to({out.ptr}.dtype.element_ty), mask=in_bounds)"


def _store_tile(kernel: Kernel, out: GradOut, var: str) -> str:
    """A tile kernel's store of one input's gradient: the tile, or its partial sums."""
    offs_r, offs_c = naming.offs(kernel.row), naming.offs(kernel.col)
    mask_r, mask_c = naming.mask(kernel.row), naming.mask(kernel.col)
    if out.kind == "full":
        return _store_full(out, var)
    if out.kind == "row":
        total = f"tl.sum(tl.where(in_bounds, {var}, 0.0), axis=0)"
        return f"tl.store({out.ptr} + pid_m * {kernel.col} + {offs_c}, {total}, mask={mask_c})"
    total = f"tl.sum(tl.where(in_bounds, {var}, 0.0), axis=1)"
    return f"tl.store({out.ptr} + pid_n * {kernel.row} + {offs_r}, {total}, mask={mask_r})"


# -- row kernels ------------------------------------------------------------------------


def _row_vector(kernel: Kernel, step: RowStep, role: str, rev: _Reverse) -> str | None:
    name = dict(step.operands).get(role)
    if name is None:
        return None
    if name not in rev.loaded:
        rev.loaded.add(name)
        rev.forward.append(operand_load(kernel, kernel.tensor(name), "row"))
    return f"{name}[None, :]"


def _softmax_forward(kernel: Kernel, step: RowStep, u: str, rev: _Reverse) -> None:
    """A softmax's forward on `u` again (into rev.forward): row_probs, and for a
    log_softmax row_log_probs."""
    params, fwd, s = dict(step.params), rev.forward, "row_scores"
    fwd.append(f"{s} = {u} * {lit(params['scale'])}" if params["scale"] != 1.0 else f"{s} = {u}")
    mask = dict(step.operands).get("mask")
    if mask:
        if mask not in rev.loaded:
            rev.loaded.add(mask)
            fwd.append(operand_load(kernel, kernel.tensor(mask), step.mask_broadcast))
        ref = f"{mask}[None, :]" if step.mask_broadcast == "row" else mask
        fwd.append(f"{s} = {s} + {ref}")
    fwd += [
        f'{s} = tl.where(in_bounds, {s}, float("-inf"))',
        f"row_max = tl.max({s}, axis=1)",
        'row_max = tl.where(row_max == float("-inf"), 0.0, row_max)',
        f"row_exp = tl.exp({s} - row_max[:, None])",
        "row_den = tl.sum(row_exp, axis=1)",
        "row_probs = row_exp / row_den[:, None]",
    ]
    if step.op == "log_softmax":
        fwd.append(f"row_log_probs = {s} - row_max[:, None] - tl.log(row_den)[:, None]")


def row_op(
    kernel: Kernel, step: RowStep, u: str, rev: _Reverse, probs: bool = False
) -> tuple[str, list[str]]:
    """The row op on `u` (forward lines go to rev.forward): (its output, the reverse lines
    taking GRAD from its output to `u`). probs: a softmax's probabilities are read from
    the forward's output (saved_out) instead."""
    params = dict(step.params)
    n = kernel.col
    fwd, back = rev.forward, []
    g = GRAD
    if step.op in ("softmax", "log_softmax"):
        mask = dict(step.operands).get("mask")
        out = "row_probs" if step.op == "softmax" else "row_log_probs"
        if probs:
            other = "0.0" if step.op == "softmax" else 'float("-inf")'
            fwd.append(
                f"{out} = tl.load({naming.ptr('saved_out')} + {FLAT}, mask=in_bounds,"
                f" other={other}).to(tl.float32)"
            )
            if step.op == "log_softmax":
                fwd.append(f"row_probs = tl.exp({out})")
        else:
            _softmax_forward(kernel, step, u, rev)
        if step.op == "softmax":
            back.append(f"{g} = row_probs * ({g} - tl.sum({g} * row_probs, axis=1)[:, None])")
        else:
            back.append(f"{g} = {g} - row_probs * tl.sum({g}, axis=1)[:, None]")
        if mask:
            kind = "full" if step.mask_broadcast == "full" else "row"
            rev.contribute(mask, kind, g, back)
        if params["scale"] != 1.0:
            back.append(f"{g} = {g} * {lit(params['scale'])}")
        return out, back
    if step.op in ("rmsnorm", "layernorm"):
        fwd.append(f"row_x = tl.where(in_bounds, {u}, 0.0)")
        # A norm's forward keeps its row statistics (row ops never follow a matmul, the one
        # kind of chain row_stats leaves out): no reductions to recompute them.
        ptr, mask = naming.ptr("saved_stats"), naming.mask(kernel.row)
        for i, (name, _) in enumerate(row_stats(kernel)):
            fwd.append(f"{name} = tl.load({stat_addr(kernel, ptr, i)}, mask={mask}, other=0.0)")
        centred = "row_x - row_mean[:, None]" if step.op == "layernorm" else "row_x"
        fwd.append(f"row_xhat = tl.where(in_bounds, ({centred}) * row_rstd[:, None], 0.0)")
        weight = _row_vector(kernel, step, "weight", rev)
        bias = _row_vector(kernel, step, "bias", rev)
        gain = weight
        if weight and params.get("offset"):
            gain = f"({lit(params['offset'])} + {weight})"
        out = "row_y"
        fwd.append(
            f"{out} = row_xhat" + (f" * {gain}" if gain else "") + (f" + {bias}" if bias else "")
        )
        operands = dict(step.operands)
        if bias:
            rev.contribute(operands["bias"], "row", g, back)
        if weight:
            rev.contribute(operands["weight"], "row", f"{g} * row_xhat", back)
            back.append(f"row_gw = {g} * {gain}")
        else:
            back.append(f"row_gw = {g}")
        back.append("row_gw = tl.where(in_bounds, row_gw, 0.0)")
        dot = f"(tl.sum(row_gw * row_xhat, axis=1) / {n})[:, None]"
        if step.op == "rmsnorm":
            back.append(f"{g} = row_rstd[:, None] * (row_gw - row_xhat * {dot})")
        else:
            mean = f"(tl.sum(row_gw, axis=1) / {n})[:, None]"
            back.append(f"{g} = row_rstd[:, None] * (row_gw - {mean} - row_xhat * {dot})")
        return out, back
    # sum, mean, max: the value becomes one number per row; GRAD arrives per row.
    if step.op == "max":
        fwd += [
            f'row_x = tl.where(in_bounds, {u}, float("-inf"))',
            f"row_y = {row_max('row_x')}",
        ]
        back += [
            "# As torch.amax: shared evenly between the elements equal to the max.",
            "row_hit = (row_x == row_y[:, None]) & in_bounds",
            "row_ties = tl.sum(row_hit.to(tl.float32), axis=1)",
            f"{g} = tl.where(row_hit, ({g} / row_ties)[:, None], 0.0)",
        ]
        return "row_y", back
    scale = f" / {n}" if step.op == "mean" else ""
    fwd.append(f"row_y = tl.sum(tl.where(in_bounds, {u}, 0.0), axis=1){scale}")
    back.append(f"{g} = tl.where(in_bounds, ({g}{scale})[:, None], 0.0)")
    return "row_y", back


def row_backward(kernel: Kernel) -> dict:
    """The row kernel's loop body (loads and forward, reverse, per-block stores), its
    stores after the loop, the gradients it writes, and the outputs it reads
    ("saved_outputs": "out", or an `output:` step's name). The forward's values are
    recomputed from the inputs, or taken from the forward's outputs (kept for the
    backward): an `output:` step's where that reads fewer [rows, cols] tensors (h of
    `h = x + r; rmsnorm(h)` is one read, x and r two), and a final softmax's probabilities
    always (one reduction over the row where recomputing them takes three)."""
    recomputed = _row_backward(kernel, read_outputs=False)
    if not kernel.emits and not _reads_probs(kernel):
        return recomputed
    read = _row_backward(kernel, read_outputs=True)
    if _reads_probs(kernel):
        return read
    return read if _full_loads(read) < _full_loads(recomputed) else recomputed


def _reads_probs(kernel: Kernel) -> bool:
    """Whether the chain ends in its softmax (or log_softmax): its output is the
    probabilities (their logarithms), which the backward can read back."""
    last = kernel.steps[-1]
    return isinstance(last, RowStep) and last.op in ("softmax", "log_softmax")


def _full_loads(pieces: dict) -> int:
    """How many [rows, cols] tensors a backward kernel's body loads."""
    lines = pieces["loads"] + pieces["backward"]
    return sum("tl.load(" in line and "mask=in_bounds" in line for line in lines)


def _row_backward(kernel: Kernel, read_outputs: bool) -> dict:
    rev = _Reverse(kernel, set())
    src = kernel.tensor(kernel.source)
    rows, cols = kernel.row, kernel.col
    rev.forward.append(
        f"fwd_0 = tl.load({tile_addr(src, (rows, cols))}, mask=in_bounds, other=0.0)"
        ".to(tl.float32)"
    )
    trail: list[tuple[object, str]] = []
    value = "fwd_0"
    row_back: list[str] = []
    saved_outputs = []
    for item in kernel.steps:
        if isinstance(item, Emit):
            trail.append((item, value))
            if read_outputs:
                # The stored value (rounded to the output's dtype): the forward's own
                # within that rounding, which the gradient's bound allows for.
                saved_outputs.append(item.name)
                value = rev.fresh()
                rev.forward.append(
                    f"{value} = tl.load({naming.ptr('saved_' + item.name)} + {FLAT},"
                    " mask=in_bounds, other=0.0).to(tl.float32)"
                )
        elif isinstance(item, RowStep):
            probs = read_outputs and item is kernel.steps[-1] and _reads_probs(kernel)
            if probs:
                saved_outputs.append("out")
            value, row_back = row_op(kernel, item, value, rev, probs)
            trail.append((item, value))
        else:
            trail.append((item, value))
            value = rev.step_forward(item, value)
    offs_r, offs_c = naming.offs(rows), naming.offs(cols)
    if kernel.reduces:
        grad_addr = f"{naming.ptr(GRAD)} + {offs_r} * {naming.stride(GRAD, rows)}"
        grad_mask = naming.mask(rows)
    else:
        grad_addr = (
            f"{naming.ptr(GRAD)} + {offs_r}[:, None] * {naming.stride(GRAD, rows)}"
            f" + {offs_c}[None, :] * {naming.stride(GRAD, cols)}"
        )
        grad_mask = "in_bounds"
    backward = [f"{GRAD} = tl.load({grad_addr}, mask={grad_mask}, other=0.0).to(tl.float32)"]
    for item, before in reversed(trail):
        if isinstance(item, Emit):
            ptr = naming.ptr(f"{GRAD}_{item.name}")
            addr = (
                f"{ptr} + {offs_r}[:, None] * {naming.stride(f'{GRAD}_{item.name}', rows)}"
                f" + {offs_c}[None, :] * {naming.stride(f'{GRAD}_{item.name}', cols)}"
            )
            backward.append(
                f"{GRAD} = {GRAD} + tl.load({addr}, mask=in_bounds, other=0.0).to(tl.float32)"
            )
        elif isinstance(item, RowStep):
            backward += row_back
        else:
            rev.step_backward(item, before, GRAD, backward)
    rev.contribute(kernel.source, "full", GRAD, backward)
    same = _same_grads(kernel, backward, rev.grads)
    outs, stores, totals, final = [], [], [], []
    for name, kind in rev.grads.items():
        out = GradOut(name, kind, same.get(name))
        outs.append(out)
        var = f"d_{name}"
        if out.same:
            continue
        if kind == "full":
            store = _store_full(out, var)
        elif kind == "col":
            total = f"tl.sum(tl.where(in_bounds, {var}, 0.0), axis=1)"
            store = f"tl.store({out.ptr} + {offs_r}, {total}, mask={naming.mask(rows)})"
        else:
            totals.append(f"{var}_total = tl.zeros([BLOCK_N], dtype=tl.float32)")
            store = f"{var}_total += tl.sum(tl.where(in_bounds, {var}, 0.0), axis=0)"
            final += [
                f"if {out.need}:",
                f"    tl.store({out.ptr} + pid * {cols} + {offs_c}, {var}_total,"
                f" mask={naming.mask(cols)})",
            ]
        stores += [f"if {out.need}:", f"    {store}"]
    pieces = {
        "totals": totals,
        "loads": _live(rev.forward, backward + stores + final),
        "backward": backward,
        "stores": stores,
        "final": final,
        "grads": outs,
        "saved_outputs": saved_outputs,
    }
    pieces["inputs"] = backward_inputs(kernel)
    if saved_outputs:  # the inputs the reads replace are no longer passed
        text = "\n".join(pieces["loads"] + pieces["backward"])
        pieces["inputs"] = [n for n in pieces["inputs"] if re.search(rf"\b{naming.ptr(n)}\b", text)]
    return pieces


def backward_params(kernel: Kernel, pieces: dict) -> list[dict]:
    """The backward kernel's parameters, in groups as the forward's, from its pieces
    (row_backward's or tile_backward's)."""
    grads, saved_outputs = pieces["grads"], pieces.get("saved_outputs", ())
    rows, cols = kernel.row, kernel.col
    incoming = [GRAD] + [f"{GRAD}_{e}" for e in kernel.emits]
    pointers = [naming.ptr(g) for g in incoming]
    passed = pieces["inputs"]
    pointers += [naming.ptr(t) for t in passed]
    if kernel.matmul:
        pointers += ["pre_ptr"] + (["pre_gate_ptr"] if kernel.gate else [])
    if row_stats(kernel):
        pointers.append(naming.ptr("saved_stats"))
    pointers += [naming.ptr(f"saved_{e}") for e in saved_outputs]
    stored = [g for g in grads if g.same is None]
    pointers += [g.ptr for g in stored]
    strides = []
    for g in incoming:
        strides += [
            naming.stride(g, d) for d in ((rows,) if kernel.reduces and g == GRAD else (rows, cols))
        ]
    for t in passed:
        strides += [naming.stride(t, d) for d in kernel.tensor(t).dims]
    meta = ["BLOCK_M", "BLOCK_N", "INT64"] + (["LOOP_STAGES"] if kernel.row_step else [])
    meta += [g.need for g in stored if g.name not in ("pre", "pre_gate")]
    return [
        {"comment": "incoming gradients, inputs, saved values, then gradients", "names": pointers},
        {"comment": "dims", "names": [rows, cols]},
        {"comment": "strides, in elements", "names": strides},
        {"comment": "meta-parameters", "names": [f"{m}: tl.constexpr" for m in meta]},
    ]


def backward_inputs(kernel: Kernel) -> list[str]:
    """The inputs a backward kernel that recomputes its forward reads: all but a matmul's
    operands, in spec order (row_backward's pieces["inputs"] may pass fewer)."""
    skip = set()
    if kernel.matmul:
        skip = {kernel.matmul.a, kernel.matmul.b} | (
            {kernel.gate.matmul.b} if kernel.gate else set()
        )
    return [t.name for t in kernel.inputs if t.name not in skip]


def backward_facts(kernel: Kernel, grads: list[GradOut]) -> str:
    """The Kernels object's `backward` facts: the gradients the kernel writes, by input."""
    names = [t.name for t in kernel.inputs]
    items = [
        f'("{g.name}", {names.index(g.name) if g.name in names else -1}, "{g.fact}")' for g in grads
    ]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
