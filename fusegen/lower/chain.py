"""Chain steps -> IR steps: the ops of a kernel's chain, checked against its inputs.

`ChainLowering` reads one kernel's `chain:` list for the kernel lowerer
(fusegen.lower.kernels), which gives it the kernel's inputs and dims and where to report
errors, and reads back the steps and which inputs the chain used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from fusegen import dtypes, ops
from fusegen.errors import did_you_mean
from fusegen.ir import Dim, Emit, Gate, Matmul, RowStep, Step, Tensor

OP_FORMS = (
    "a step is an op name (`silu`) or a one-key mapping (`gelu: tanh`, `add: r`); "
    "ops: " + ", ".join(ops.ALL_OPS)
)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def op_name(raw: Any) -> Any:
    return next(iter(raw)) if isinstance(raw, dict) and raw else raw


class ChainLowering:
    """One kernel's chain: `lower(inputs, dims)` gives (matmul, source, row, col, steps,
    out_dtype), or None where a step is wrong; every problem goes to `err` (a path
    relative to the kernel, a message, a hint), and `used_inputs` collects the inputs
    the steps read."""

    def __init__(
        self,
        chain: list,
        dim_names: Iterable[str],
        err: Callable[..., None],
        name_problem: Callable[..., tuple[str, str] | None],
    ):
        self.chain = chain
        self.dim_names = set(dim_names)
        self.err = err
        self.name_problem = name_problem
        self.used_inputs: set[str] = set()

    def _split_step(self, i: int, raw: Any) -> tuple[str, Any] | None:
        aliases = {**ops.ALIASES, **ops.ROW_ALIASES}
        if isinstance(raw, str):
            return aliases.get(raw, raw), None
        if isinstance(raw, dict) and len(raw) == 1:
            ((name, args),) = raw.items()
            return aliases.get(str(name), str(name)), args
        self.err(
            ("chain", i), f"a chain step is an op name or a one-key mapping, got {raw!r}", OP_FORMS
        )
        return None

    def lower(self, inputs: dict[str, Tensor], dims: dict[str, Dim]):
        chain = self.chain
        first = self._split_step(0, chain[0])
        if first is None:
            return None
        op, args = first
        matmul = None
        source = None
        # When the first step is wrong, the later steps are still checked (every error
        # in one run), but without the value's shape to check broadcasts against.
        row = col = None
        starts_matmul = op == "matmul"
        if op == "matmul":
            matmul = self._matmul(("chain", 0, "matmul"), args, inputs)
            if matmul is not None:
                row, col = matmul.m, matmul.n
        elif op == "input":
            source = self._source(("chain", 0, "input"), args, inputs)
            if source is not None:
                row, col = inputs[source].dims
        else:
            hint = (
                "an elementwise chain starts with `input: x`; "
                "a matmul chain with `matmul: {a: x, b: w.T}`"
            )
            if op in ops.ALL_OPS:
                self.err(
                    ("chain", 0), f"the chain must start with `matmul` or `input`, not `{op}`", hint
                )
            else:
                self.err(
                    ("chain", 0), f"unknown op '{op}'{did_you_mean(op, ops.KNOWN_NAMES)}", hint
                )
        steps: list = []
        out_dtype = None
        for i in range(1, len(chain)):
            split = self._split_step(i, chain[i])
            if split is None:
                continue
            op, args = split
            path = ("chain", i, op) if isinstance(chain[i], dict) else ("chain", i)
            if op == "quantize":  # last, it makes the chain a quantizer (lower.quant)
                self.err(
                    ("chain", i),
                    "`quantize` must be the chain's last step",
                    "quantize: {dtype: fp8_e4m3, scale: per_row} ends an elementwise chain",
                )
            elif op in ("matmul", "input"):
                self.err(
                    ("chain", i),
                    f"`{op}` can only be the first step",
                    "use `gate` for a second matmul on the same input",
                )
            elif op == "gate":
                if matmul is None and not starts_matmul:
                    self.err(
                        path,
                        "`gate` needs a matmul chain",
                        "a gate multiplies by a second matmul on the chain's `a`",
                    )
                elif matmul is None:
                    continue  # the chain's own matmul is wrong; it was reported
                elif any(isinstance(s, Gate) for s in steps):
                    self.err(path, "a chain can have only one `gate`")
                else:
                    gate = self._gate(path, args, inputs, matmul)
                    if gate:
                        steps.append(gate)
            elif op == "cast":
                out_dtype = self._cast(path, args)
                if i < len(chain) - 1:
                    after = len(chain) - 1 - i
                    self.err(
                        ("chain", i),
                        "`cast` must be the last step; "
                        + ("1 step follows it" if after == 1 else f"{after} steps follow it"),
                        "the chain computes in fp32; cast sets the output dtype: move it last",
                    )
            elif op == "output":
                emit = self._emit(path, args, inputs, steps)
                if emit:
                    steps.append(emit)
            elif op in ops.ROW_OPS:
                if starts_matmul or first[0] != "input":
                    self.err(
                        path,
                        f"`{op}` works on an elementwise chain (one starting with `input`)",
                        "run the matmul chain, then a row chain on its output",
                    )
                elif any(isinstance(s, RowStep) for s in steps):
                    self.err(
                        path, "a chain can have only one row op (softmax, a norm, a reduction)"
                    )
                else:
                    step = self._row_op(path, ops.ROW_OPS[op], args, inputs, row, col)
                    if step:
                        steps.append(step)
            else:
                reduced = any(isinstance(s, RowStep) and s.reduces for s in steps)
                step = self._elementwise(path, op, args, inputs, row, col)
                if step and reduced and step.operand is not None:
                    self.err(
                        path,
                        f"after `{next(s.op for s in steps if isinstance(s, RowStep))}` "
                        "the value is one number per row: ops with an input tensor cannot follow",
                        "activations, scale, cast and ops with a constant can",
                    )
                elif step:
                    steps.append(step)
        if any(isinstance(s, Emit) for s in steps) and not any(
            isinstance(s, RowStep) for s in steps
        ):
            self.err(
                ("chain",),
                "`output` needs a row op after it (an extra output is the value before a norm, "
                "softmax or reduction)",
            )
        self._backward_names(inputs, [s.name for s in steps if isinstance(s, Emit)])
        if first[0] == "input" and all(op_name(s) == "cast" for s in chain[1:]):
            self.err(
                ("chain",),
                "an elementwise chain needs at least one op after `input` (a cast alone is a copy)",
            )
        return matmul, source, row, col, steps, out_dtype

    def _backward_names(self, inputs: dict[str, Tensor], outputs: list[str]) -> None:
        """The backward kernel names an input's gradient d_<input>, an output's incoming
        gradient grad_<output> and its saved value saved_<output>: an input or output
        named so would be a second argument of the same name."""
        made = {f"d_{n}": f"{n}'s gradient" for n in inputs}
        made |= {f"grad_{n}": f"the gradient arriving at {n}" for n in outputs}
        made |= {f"saved_{n}": f"the saved {n}" for n in outputs}
        steps = {
            raw["output"]: ("chain", i, "output")
            for i, raw in enumerate(self.chain)
            if isinstance(raw, dict) and op_name(raw) == "output"
        }
        for kind, names in (("input", list(inputs)), ("output", outputs)):
            for name in names:
                if name in made:
                    self.err(
                        ("inputs", name) if kind == "input" else steps[name],
                        f"{kind} '{name}' has the name the backward kernel gives {made[name]}",
                        f"rename the {kind}",
                    )

    def _tensor_ref(
        self, path: tuple, ref: Any, inputs: dict[str, Tensor], *, allow_t: bool
    ) -> tuple[str, bool] | None:
        if not isinstance(ref, str):
            self.err(
                path, f"expected the name of an input, got {ref!r}", "inputs: " + ", ".join(inputs)
            )
            return None
        name, transposed = ref, False
        if ref.endswith(".T"):
            name, transposed = ref[:-2], True
            if not allow_t:
                self.err(path, f"'{ref}': only a matmul operand can be read transposed")
                return None
        if name not in inputs:
            bad = name if name.isidentifier() else ref
            self.err(
                path,
                f"'{bad}' is not an input{did_you_mean(name, inputs)}",
                "inputs: " + ", ".join(inputs) + ("; write NAME or NAME.T" if allow_t else ""),
            )
            return None
        self.used_inputs.add(name)
        return name, transposed

    def _matmul(
        self, path: tuple, args: Any, inputs: dict[str, Tensor], *, main: Matmul | None = None
    ) -> Matmul | None:
        if isinstance(args, str) and re.match(ops.MATMUL_SHORTHAND, args):
            a_ref, b_ref = (part.strip() for part in args.split("@"))
            args = {"a": a_ref, "b": b_ref}
        if not isinstance(args, dict) or set(args) - {"a", "b"} or not {"a", "b"} <= set(args):
            self.err(
                path,
                f"matmul takes A @ B or {{a: A, b: B}}, each an input or INPUT.T; got {args!r}",
                "e.g. matmul: x @ w.T",
            )
            return None
        a = self._tensor_ref(path + ("a",), args["a"], inputs, allow_t=True)
        b = self._tensor_ref(path + ("b",), args["b"], inputs, allow_t=True)
        if a is None or b is None:
            return None
        ta, tb = inputs[a[0]], inputs[b[0]]
        bad = False
        for which, t in (("a", ta), ("b", tb)):
            if len(t.dims) != 2:
                self.err(
                    path + (which,), f"matmul operand '{t.name}' must be 2-D, it is {list(t.dims)}"
                )
                bad = True
            if t.dtype is not None and t.dtype not in dtypes.QUANT_DTYPES:
                self.err(
                    ("inputs", t.name, "dtype"),
                    f"matmul operand '{t.name}' cannot pin a dtype",
                    "matmul operands take the call's dtype (tl.dot needs both sides alike), "
                    "or a quantized one with its scale: " + ", ".join(dtypes.QUANT_DTYPES),
                )
                bad = True
        if bad:
            return None
        a_dims = ta.dims[::-1] if a[1] else ta.dims
        b_dims = tb.dims[::-1] if b[1] else tb.dims
        if a_dims[1] != b_dims[0]:
            hint = ""
            if b_dims[1] == a_dims[1]:
                hint = f"did you mean b: {b[0] + ('' if b[1] else '.T')}?"
            self.err(
                path,
                f"mismatched matmul dims: a ({args['a']}) is {list(a_dims)}, "
                f"b ({args['b']}) is {list(b_dims)}; "
                f"a's columns must be b's rows",
                hint or "an nn.Linear weight [N, K] is read as w.T",
            )
            return None
        m, k, n = a_dims[0], a_dims[1], b_dims[1]
        if len({m, k, n}) != 3:
            self.err(
                path,
                f"the matmul's dims must be three different names, got [{m}, {k}] @ [{k}, {n}]",
                "declare separate dims even when sizes are equal (K: 768, N: 768)",
            )
            return None
        mm = Matmul(a[0], b[0], a[1], b[1], m, k, n)
        if main is not None and mm.b == main.b:
            self.err(
                path + ("b",),
                f"the gate reads the same weight '{mm.b}' as the chain's matmul",
                "a gate multiplies by a second, different weight",
            )
            return None
        if main is not None and (mm.a, mm.a_transposed, mm.m, mm.k, mm.n) != (
            main.a,
            main.a_transposed,
            main.m,
            main.k,
            main.n,
        ):
            self.err(
                path,
                f"a gate's matmul must read the same `a` "
                f"({main.a}{'.T' if main.a_transposed else ''}) and give the "
                f"same [{main.m}, {main.n}] output as the chain's; "
                f"got a = {args['a']} -> [{m}, {n}]",
                "the point of a gate is one pass over a with two accumulators",
            )
            return None
        return mm

    def _source(self, path: tuple, args: Any, inputs: dict[str, Tensor]) -> str | None:
        ref = self._tensor_ref(path, args, inputs, allow_t=False)
        if ref is None:
            return None
        t = inputs[ref[0]]
        if len(t.dims) != 2:
            self.err(
                path,
                "an elementwise chain runs over a 2-D input [rows, cols]; "
                f"'{t.name}' is {list(t.dims)}",
            )
            return None
        if t.dtype is not None:
            self.err(
                ("inputs", t.name, "dtype"),
                f"the chain's input '{t.name}' cannot pin a dtype",
                "it sets the call's dtype",
            )
            return None
        return t.name

    def _cast(self, path: tuple, args: Any) -> str | None:
        name = dtypes.canonical(args) if isinstance(args, str) else None
        if name is None:
            self.err(
                path,
                f"unknown dtype {args!r}{did_you_mean(str(args), dtypes.DTYPES)}",
                f"valid: {ops.dtype_names()}",
            )
        return name

    def _gate(self, path: tuple, args: Any, inputs: dict[str, Tensor], main: Matmul) -> Gate | None:
        allowed = {"matmul", "bias", "activation"}
        matmul_path = path + ("matmul",)
        if isinstance(args, str):  # gate: x @ w_up.T, short for gate: {matmul: x @ w_up.T}
            args, matmul_path = {"matmul": args}, path
        if not isinstance(args, dict) or "matmul" not in args:
            self.err(
                path,
                "gate takes A @ B or {matmul: A @ B, bias?: INPUT, activation?: ACTIVATION}",
                "e.g. gate: x @ w_up.T",
            )
            return None
        for key in args:
            if key not in allowed:
                self.err(
                    path + (key,),
                    f"unknown gate field '{key}'{did_you_mean(key, allowed)}",
                    "fields: " + ", ".join(sorted(allowed)),
                    key=True,
                )
        mm = self._matmul(matmul_path, args["matmul"], inputs, main=main)
        steps: list[Step] = []
        if "bias" in args:
            step = self._elementwise(path + ("bias",), "bias", args["bias"], inputs, main.m, main.n)
            if step:
                steps.append(step)
        if "activation" in args:
            act = args["activation"]
            split = (
                (act, None)
                if isinstance(act, str)
                else (next(iter(act.items())) if isinstance(act, dict) and len(act) == 1 else None)
            )
            if split is not None:
                split = (ops.ALIASES.get(str(split[0]), str(split[0])), split[1])
            if split is None:
                self.err(
                    path + ("activation",),
                    f"expected an activation (`silu`, `gelu: tanh`), got {act!r}",
                )
            elif split[0] not in ops.ACTIVATIONS and split[0] != "gelu":
                self.err(
                    path + ("activation",),
                    f"unknown activation '{split[0]}'"
                    f"{did_you_mean(split[0], [*ops.ACTIVATIONS, *ops.ALIASES])}",
                    "activations: " + ", ".join(ops.ACTIVATIONS),
                )
            else:
                step = self._elementwise(
                    path + ("activation",), split[0], split[1], inputs, main.m, main.n
                )
                if step:
                    steps.append(step)
        return Gate(mm, tuple(steps)) if mm else None

    def _elementwise(
        self, path: tuple, op: str, args: Any, inputs: dict[str, Tensor], row: str, col: str
    ) -> Step | None:
        if op == "gelu":
            return self._gelu(path, args)
        if op in ops.ACTIVATIONS:
            return self._activation(path, ops.ACTIVATIONS[op], args)
        if op == "bias":
            ref = self._tensor_ref(path, args, inputs, allow_t=False)
            if ref is None:
                return None
            t = inputs[ref[0]]
            if col is None:
                return None
            if t.dims != (col,):
                self.err(
                    path,
                    f"a bias is a row vector [{col}] over the output's columns; "
                    f"'{t.name}' is {list(t.dims)}",
                    f"for other broadcasts use `add: {t.name}`",
                )
                return None
            return Step("bias", operand=t.name, broadcast="row")
        if op == "scale":
            if not is_number(args):
                self.err(path, f"scale takes a number, got {args!r}", "e.g. scale: 0.5")
                return None
            return Step("scale", constant=float(args))
        if op in ops.BINARY:
            if is_number(args):
                if op == "div" and args == 0:
                    self.err(path, "div: 0 divides by zero", "a nonzero number or an input's name")
                    return None
                return Step(op, constant=float(args))
            if isinstance(args, (int, float)) and not isinstance(args, bool):
                self.err(
                    path,
                    f"{op} takes a finite number or an input's name, got {args!r}",
                    "inputs: " + ", ".join(inputs),
                )
                return None
            ref = self._tensor_ref(path, args, inputs, allow_t=False)
            if ref is None:
                return None
            t = inputs[ref[0]]
            if row is None:
                return None
            broadcast = self._broadcast(path, t, row, col)
            return Step(op, operand=t.name, broadcast=broadcast) if broadcast else None
        if op == "softcap":
            self.err(
                path[:3] if len(path) > 2 else path,
                "softcap is a loss head's step, between its matmul and cross_entropy",
                "in a chain, write tanh with scale steps: scale: 0.0333, tanh, scale: 30.0",
            )
            return None
        self.err(
            path[:3] if len(path) > 2 else path,
            f"unknown op '{op}'{did_you_mean(op, ops.KNOWN_NAMES)}",
            OP_FORMS,
        )
        return None

    def _broadcast(self, path: tuple, t: Tensor, row: str, col: str) -> str | None:
        shapes = {(row, col): "full", (col,): "row", (row,): "col"}
        if t.dims in shapes:
            return shapes[t.dims]
        self.err(
            path,
            f"operand '{t.name}' is {list(t.dims)}; it must be [{row}, {col}] (full), "
            f"[{col}] (one row, "
            f"broadcast down the rows) or [{row}] (one column, broadcast across)",
        )
        return None

    def _gelu(self, path: tuple, args: Any) -> Step | None:
        choices = ops.GELU_APPROXIMATE
        if isinstance(args, dict):
            extra = set(args) - {"approximate"}
            if extra:
                self.err(
                    path,
                    f"gelu takes only `approximate`, got {sorted(extra)}",
                    "gelu: {approximate: tanh}",
                )
                return None
            args = args.get("approximate", "none")
        if args is None:
            args = "none"
        if args not in choices:
            close = did_you_mean(args, list(choices)) if isinstance(args, str) else ""
            self.err(
                path, f"gelu's approximate is 'none' (exact, erf) or 'tanh', got {args!r}{close}"
            )
            return None
        return Step(choices[args])

    def _activation(self, path: tuple, act: ops.Activation, args: Any) -> Step | None:
        names = [p.name for p in act.params]
        if args is None:
            given: dict = {}
        elif isinstance(args, dict):
            given = args
        elif act.params and (is_number(args)):
            given = {names[0]: args}  # `leaky_relu: 0.2` sets the first parameter
        else:
            form = f"{act.name}: {{{', '.join(names)}}}" if names else act.name
            self.err(
                path,
                f"{act.name} takes {'no arguments' if not names else 'numbers'}, got {args!r}",
                f"write `{form}`",
            )
            return None
        params = []
        ok = True
        for key in given:
            if key not in names:
                ok = False
                self.err(
                    path + (key,),
                    f"{act.name} has no parameter '{key}'{did_you_mean(key, names)}",
                    "parameters: " + (", ".join(names) or "none"),
                    key=True,
                )
        for p in act.params:
            value = given.get(p.name, p.default)
            if value is None:
                ok = False
                self.err(
                    path,
                    f"{act.name} needs `{p.name}`",
                    f"e.g. {act.name}: {{{', '.join(f'{n}: ...' for n in names)}}}",
                )
            elif not is_number(value):
                ok = False
                self.err(path + (p.name,), f"{act.name}'s {p.name} must be a number, got {value!r}")
            elif p.name == "beta" and value == 0:  # softplus divides by it
                ok = False
                self.err(path + (p.name,), f"{act.name}'s beta must not be 0 (it divides by it)")
            else:
                params.append((p.name, float(value)))
        if ok and act.name == "clamp" and params[0][1] > params[1][1]:
            self.err(path, f"clamp's min ({params[0][1]}) is above its max ({params[1][1]})")
            return None
        return Step(act.name, params=tuple(params)) if ok else None

    def _emit(self, path: tuple, args: Any, inputs: dict, steps: list):
        if not isinstance(args, str) or not args.isidentifier():
            self.err(
                path, f"output takes a name for the extra output, got {args!r}", "e.g. output: h"
            )
            return None
        problem = self.name_problem(args, ("{}_out", "out_{}"))
        if problem:
            self.err(path, f"output {problem[0]}", problem[1])
            return None
        taken = set(inputs) | {s.name for s in steps if isinstance(s, Emit)} | self.dim_names
        if args in taken:
            self.err(path, f"output '{args}' has the name of an input, a dim or another output")
            return None
        if any(isinstance(s, RowStep) for s in steps):
            self.err(path, "`output` must come before the row op")
            return None
        return Emit(args)

    def _row_op(self, path: tuple, op: ops.RowOp, args: Any, inputs: dict, row, col):
        names = [p.name for p in op.params]
        if args is None:
            args = {}
        if not isinstance(args, dict):
            fields = ", ".join([*names, *op.operands]) or "nothing"
            self.err(path, f"{op.name} takes a mapping of {fields}, got {args!r}")
            return None
        ok = True
        allowed = [*names, *op.operands]
        for key in args:
            if key not in allowed:
                ok = False
                self.err(
                    path + (key,),
                    f"{op.name} has no field '{key}'{did_you_mean(key, allowed)}",
                    "fields: " + (", ".join(allowed) or "none"),
                    key=True,
                )
        params = []
        for p in op.params:
            value = args.get(p.name, p.default)
            if not is_number(value):
                ok = False
                self.err(path + (p.name,), f"{op.name}'s {p.name} must be a number, got {value!r}")
            else:
                params.append((p.name, float(value)))
        if dict(params).get("eps", 1.0) < 0:
            ok = False
            self.err(path + ("eps",), f"{op.name}'s eps must not be negative")
        if dict(params).get("offset") and "weight" not in args:
            ok = False
            self.err(
                path + ("offset",),
                f"{op.name}'s offset adds to its weight ((offset + weight), Gemma's), and it "
                "has none",
                "give `weight: <input>`, or drop the offset",
            )
        operands = []
        mask_broadcast = None
        for role in op.operands:
            if role not in args:
                continue
            ref = self._tensor_ref(path + (role,), args[role], inputs, allow_t=False)
            if ref is None or col is None:
                ok = False
                continue
            t = inputs[ref[0]]
            if role == "mask":
                shapes = {(row, col): "full", (col,): "row"}
                mask_broadcast = shapes.get(t.dims)
                if mask_broadcast is None:
                    ok = False
                    self.err(
                        path + (role,),
                        f"a softmax mask is [{row}, {col}] or [{col}]; "
                        f"'{t.name}' is {list(t.dims)}",
                    )
            elif t.dims != (col,):
                ok = False
                self.err(
                    path + (role,),
                    f"a {op.name} {role} is [{col}], one value per column; "
                    f"'{t.name}' is {list(t.dims)}",
                )
            operands.append((role, t.name))
        if not ok:
            return None
        return RowStep(op.name, tuple(params), tuple(operands), mask_broadcast, op.reduces)
