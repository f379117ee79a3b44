"""Spec -> IR: resolve names, check meaning, fill defaults. Every problem found is
collected with its location; a kernel with errors yields no IR.
"""

from __future__ import annotations

import keyword
import math
from typing import Any

import pydantic

from fusegen import configs, dtypes, ops
from fusegen.errors import SpecError, SpecErrors, did_you_mean
from fusegen.ir import Config, Dim, Gate, Kernel, Matmul, Step, Tensor
from fusegen.source import SpecSource
from fusegen.spec import ConfigSpec, KernelSpec, TOP_LEVEL_KEYS

# Local and module-level names of the generated kernel, launcher, reference and tests;
# an input or dim of the same name would shadow them.
RESERVED_NAMES = frozenset(
    {
        # kernel
        "acc",
        "acc_gate",
        "value",
        "mask",
        "pid",
        "k",
        "tl",
        "triton",
        "torch",
        "F",
        "range",
        "min",
        "max",
        # launcher and module
        "out",
        "config",
        "shapes",
        "dtype",
        "device",
        "out_dtype",
        "out_shape",
        "grid",
        "args",
        "consts",
        "bad",
        "expected",
        "os",
        "logging",
        "reference",
        "last_launch",
        # reference and tests
        "y",
        "y_gate",
        "v",
        "e",
        "v_gate",
        "e_gate",
        "p_in",
        "kernel",
    }
)
RESERVED_PREFIXES = (
    "offs_",
    "mask_",
    "stride_",
    "num_pid",
    "num_tiles",
    "group_",
    "first_pid",
    "pid_",
    "acc_",
    "_",
)
RESERVED_SUFFIXES = ("_ptr", "_ptrs", "_tile", "_2d")
# A generated module of one of these names would shadow what it or its tests import,
# or a name the module defines.
RESERVED_MODULES = frozenset(
    {
        "torch",
        "triton",
        "numpy",
        "pytest",
        "conftest",
        "typing",
        "logging",
        "os",
        "math",
        "random",
        "reference",
        "last_launch",
    }
)

OP_FORMS = (
    "a step is an op name (`silu`) or a one-key mapping (`gelu: tanh`, `add: r`); "
    "ops: " + ", ".join(ops.ALL_OPS)
)


def lower_file(source: SpecSource) -> list[Kernel]:
    """All kernels of one parsed spec file. Raises SpecErrors with every problem found."""
    data = source.data
    errors: list[SpecError] = []
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            errors.append(
                source.error(
                    (key,),
                    f"unknown top-level key '{key}'{did_you_mean(key, TOP_LEVEL_KEYS)}",
                    "top-level keys: " + ", ".join(TOP_LEVEL_KEYS),
                    key=True,
                )
            )
    if "version" in data and data["version"] != 1:
        errors.append(
            source.error(
                ("version",), f"unknown spec version {data['version']!r}", "the only version is 1"
            )
        )
    kernels_raw = data.get("kernels")
    if not isinstance(kernels_raw, list) or not kernels_raw:
        errors.append(
            source.error(
                ("kernels",),
                (
                    "`kernels` must be a non-empty list of kernels"
                    if "kernels" in data
                    else "the spec has no `kernels:` list"
                ),
                "see docs/spec.md for a complete example",
            )
        )
        raise SpecErrors(errors)
    kernels: list[Kernel] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(kernels_raw):
        path = ("kernels", i)
        if not isinstance(raw, dict):
            errors.append(source.error(path, f"a kernel is a mapping, not a {type(raw).__name__}"))
            continue
        try:
            spec = KernelSpec.model_validate(raw)
        except pydantic.ValidationError as exc:
            errors.extend(_pydantic_errors(source, path, raw, exc))
            continue
        if spec.name in seen:
            errors.append(
                source.error(
                    path + ("name",),
                    f"kernel name '{spec.name}' is used twice in this file (also kernels[{seen[spec.name]}])",
                    "each kernel names its own generated module; rename one",
                )
            )
        seen.setdefault(spec.name, i)
        lowerer = _KernelLowerer(source, path, spec, raw)
        kernel = lowerer.lower()
        errors.extend(lowerer.errors)
        if kernel is not None:
            kernels.append(kernel)
    if errors:
        raise SpecErrors(errors)
    return kernels


def _pydantic_errors(
    source: SpecSource, base: tuple, raw: Any, exc: pydantic.ValidationError
) -> list[SpecError]:
    out = []
    for err in exc.errors(include_url=False):
        # Keep only the parts of pydantic's location that exist in the data; the rest
        # are names of union members and validators.
        path, node = list(base), raw
        for part in err["loc"]:
            if isinstance(node, dict) and part in node:
                path.append(part)
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                path.append(part)
                node = node[part]
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        hint = ""
        if err["type"] == "extra_forbidden":
            field = err["loc"][-1]
            allowed = _allowed_fields(err["loc"])
            message = f"unknown field '{field}'{did_you_mean(field, allowed)}"
            hint = "fields here: " + ", ".join(allowed) if allowed else ""
            out.append(
                source.error(
                    tuple(path) + ((field,) if field not in path else ()), message, hint, key=True
                )
            )
            continue
        if err["type"] == "missing":
            message = f"missing required field '{err['loc'][-1]}'"
        out.append(source.error(tuple(path), message, hint))
    return out


def _allowed_fields(loc: tuple) -> list[str]:
    """The fields pydantic would have accepted at `loc` (for extra_forbidden errors)."""
    from fusegen import spec as spec_models

    parents = [p for p in loc[:-1] if isinstance(p, str)]
    model: type[pydantic.BaseModel] = spec_models.KernelSpec
    for name in parents:
        nested = {
            "fallback": spec_models.FallbackSpec,
            "autotune": spec_models.AutotuneSpec,
            "configs": spec_models.ConfigSpec,
            "default": spec_models.ConfigSpec,
        }
        if name in nested:
            model = nested[name]
        elif model is spec_models.KernelSpec and name == "inputs":
            model = spec_models.InputSpec
    return list(model.model_fields)


def _check_name(name: str) -> str | None:
    """Why `name` cannot name an input or dim, or None."""
    if not name.isidentifier() or keyword.iskeyword(name):
        return f"'{name}' is not a Python identifier"
    if (
        name in RESERVED_NAMES
        or name.startswith(RESERVED_PREFIXES)
        or name.endswith(RESERVED_SUFFIXES)
    ):
        return f"'{name}' is reserved: the generated kernel uses it"
    return None


class _KernelLowerer:
    def __init__(self, source: SpecSource, path: tuple, spec: KernelSpec, raw: dict):
        self.source = source
        self.path = path
        self.spec = spec
        self.raw = raw
        self.errors: list[SpecError] = []
        self.used_inputs: set[str] = set()

    def err(self, rel: tuple, message: str, hint: str = "", *, key: bool = False) -> None:
        self.errors.append(self.source.error(self.path + rel, message, hint, key=key))

    # -- names, dims, inputs ---------------------------------------------------------

    def lower(self) -> Kernel | None:
        spec = self.spec
        self._check_kernel_name()
        dims = self._dims()
        inputs = self._inputs(dims)
        if self.errors:
            return None
        chain = self._chain(inputs, dims)
        if chain is None or self.errors:
            return None
        matmul, source, row, col, steps, out_dtype = chain
        for t in inputs.values():
            if t.name not in self.used_inputs:
                self.err(
                    ("inputs", t.name),
                    f"input '{t.name}' is never used by the chain",
                    "use it or remove it",
                    key=True,
                )
        used_dims = {d for t in inputs.values() for d in t.dims}
        for d in dims.values():
            if d.name not in used_dims:
                self.err(
                    ("dims", d.name), f"dim '{d.name}' is declared but no input uses it", key=True
                )
        gated = any(isinstance(s, Gate) for s in steps)
        kind = "gated" if gated else ("matmul" if matmul else "elementwise")
        full = any(getattr(s, "broadcast", None) == "full" for s in steps)
        cfgs = self._configs(kind, matmul is not None, gated, full)
        if self.errors or cfgs is None:
            return None
        space, tma_space, default, tma_default = cfgs
        # Inputs that are batched carry the row dim first and are not read transposed.
        batched_inputs = tuple(
            Tensor(
                t.name,
                t.dims,
                t.dtype,
                t.doc,
                batched=(t.dims[0] == row and not self._transposed(matmul, t.name)),
            )
            for t in inputs.values()
        )
        return Kernel(
            name=spec.name,
            doc=spec.doc.strip(),
            spec_display=self.source.display,
            spec_sha256=self.source.sha256,
            dims=tuple(dims.values()),
            dtypes=tuple(spec.dtypes),
            inputs=batched_inputs,
            matmul=matmul,
            source=source,
            row=row,
            col=col,
            steps=tuple(steps),
            out_dtype=out_dtype,
            fp32_matmul=spec.fp32_matmul,
            fallback_no_gpu=spec.fallback.no_gpu,
            fallback_nonfinite=spec.fallback.nonfinite,
            configs=space,
            tma_configs=tma_space,
            default_config=default,
            tma_default_config=tma_default,
            interpreter_config=configs.INTERPRETER[kind],
        )

    @staticmethod
    def _transposed(matmul: Matmul | None, name: str) -> bool:
        if matmul is None:
            return False
        return (matmul.a == name and matmul.a_transposed) or (
            matmul.b == name and matmul.b_transposed
        )

    def _check_kernel_name(self) -> None:
        name = self.spec.name
        if not name.isidentifier() or keyword.iskeyword(name):
            self.err(
                ("name",),
                f"kernel name '{name}' is not a Python identifier",
                "it names a module: letters, digits, _",
            )
        elif name in RESERVED_MODULES or name.startswith(("test", "_")) or name.isupper():
            self.err(
                ("name",),
                f"kernel name '{name}' would clash with a module or be collected as a test",
                "reserved: names starting with 'test' or '_', all-capital names, and "
                + ", ".join(sorted(RESERVED_MODULES)),
            )

    def _dims(self) -> dict[str, Dim]:
        dims: dict[str, Dim] = {}
        lowered: dict[str, str] = {}
        for name, size in self.spec.dims.items():
            problem = _check_name(name)
            if problem:
                self.err(("dims", name), f"dim {problem}", key=True)
                continue
            if name.lower() in lowered:
                self.err(
                    ("dims", name),
                    f"dims '{lowered[name.lower()]}' and '{name}' differ only in case",
                    "kernel variables are named after dims in lower case (offs_m); rename one",
                    key=True,
                )
                continue
            lowered[name.lower()] = name
            dims[name] = Dim(name, None if size == "dynamic" else size)
        return dims

    def _inputs(self, dims: dict[str, Dim]) -> dict[str, Tensor]:
        inputs: dict[str, Tensor] = {}
        for name, inp in self.spec.inputs.items():
            problem = _check_name(name)
            if problem:
                self.err(("inputs", name), f"input {problem}", key=True)
                continue
            if name in self.spec.dims:
                self.err(
                    ("inputs", name),
                    f"input '{name}' has the name of a dim",
                    "rename one",
                    key=True,
                )
                continue
            ok = True
            for j, d in enumerate(inp.shape):
                if d not in dims:
                    ok = False
                    if d in self.spec.dims:
                        continue  # the dim itself is invalid and already reported
                    self.err(
                        ("inputs", name, "shape", j),
                        f"unknown dim '{d}'{did_you_mean(d, dims)}",
                        "declared dims: " + ", ".join(dims),
                    )
            if len(set(inp.shape)) != len(inp.shape):
                ok = False
                self.err(
                    ("inputs", name, "shape"),
                    f"input '{name}' names dim '{inp.shape[0]}' twice",
                    "give each axis its own dim, even when sizes are equal (K: 768, N: 768)",
                )
            if ok:
                inputs[name] = Tensor(
                    name, tuple(inp.shape), inp.dtype, inp.doc.strip(), batched=False
                )
        return inputs

    # -- the chain ---------------------------------------------------------------------

    def _split_step(self, i: int, raw: Any) -> tuple[str, Any] | None:
        if isinstance(raw, str):
            return ops.ALIASES.get(raw, raw), None
        if isinstance(raw, dict) and len(raw) == 1:
            ((name, args),) = raw.items()
            return ops.ALIASES.get(str(name), str(name)), args
        self.err(
            ("chain", i), f"a chain step is an op name or a one-key mapping, got {raw!r}", OP_FORMS
        )
        return None

    def _chain(self, inputs: dict[str, Tensor], dims: dict[str, Dim]):
        chain = self.spec.chain
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
            hint = "an elementwise chain starts with `input: x`; a matmul chain with `matmul: {a: x, b: w.T}`"
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
            if out_dtype is not None:
                self.err(
                    ("chain", i),
                    "`cast` must be the last step",
                    "the chain computes in fp32; cast sets the output dtype",
                )
            if op in ("matmul", "input"):
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
            else:
                step = self._elementwise(path, op, args, inputs, row, col)
                if step:
                    steps.append(step)
        if first[0] == "input" and all(_op_name(s) == "cast" for s in chain[1:]):
            self.err(
                ("chain",),
                "an elementwise chain needs at least one op after `input` (a cast alone is a copy)",
            )
        return matmul, source, row, col, steps, out_dtype

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
        if not isinstance(args, dict) or set(args) - {"a", "b"} or not {"a", "b"} <= set(args):
            self.err(
                path,
                f"matmul takes {{a: INPUT, b: INPUT or INPUT.T}}, got {args!r}",
                "e.g. matmul: {a: x, b: w.T}",
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
            if t.dtype is not None:
                self.err(
                    ("inputs", t.name, "dtype"),
                    f"matmul operand '{t.name}' cannot pin a dtype",
                    "matmul operands take the call's dtype (tl.dot needs both sides alike)",
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
                f"mismatched matmul dims: a ({args['a']}) is {list(a_dims)}, b ({args['b']}) is {list(b_dims)}; "
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
                f"a gate's matmul must read the same `a` ({main.a}{'.T' if main.a_transposed else ''}) and give the "
                f"same [{main.m}, {main.n}] output as the chain's; got a = {args['a']} -> [{m}, {n}]",
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
                f"an elementwise chain runs over a 2-D input [rows, cols]; '{t.name}' is {list(t.dims)}",
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
        if not isinstance(args, dict) or "matmul" not in args:
            self.err(
                path,
                "gate takes {matmul: {a, b}, bias?: INPUT, activation?: ACTIVATION}",
                "e.g. gate: {matmul: {a: x, b: w_up.T}}",
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
        mm = self._matmul(path + ("matmul",), args["matmul"], inputs, main=main)
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
                    f"unknown activation '{split[0]}'{did_you_mean(split[0], [*ops.ACTIVATIONS, *ops.ALIASES])}",
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
                    f"a bias is a row vector [{col}] over the output's columns; '{t.name}' is {list(t.dims)}",
                    f"for other broadcasts use `add: {t.name}`",
                )
                return None
            return Step("bias", operand=t.name, broadcast="row")
        if op == "scale":
            if not _is_number(args):
                self.err(path, f"scale takes a number, got {args!r}", "e.g. scale: 0.5")
                return None
            return Step("scale", constant=float(args))
        if op in ops.BINARY:
            if _is_number(args):
                return Step(op, constant=float(args))
            ref = self._tensor_ref(path, args, inputs, allow_t=False)
            if ref is None:
                return None
            t = inputs[ref[0]]
            if row is None:
                return None
            broadcast = self._broadcast(path, t, row, col)
            return Step(op, operand=t.name, broadcast=broadcast) if broadcast else None
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
            f"operand '{t.name}' is {list(t.dims)}; it must be [{row}, {col}] (full), [{col}] (one row, "
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
            self.err(path, f"gelu's approximate is 'none' (exact, erf) or 'tanh', got {args!r}")
            return None
        return Step(choices[args])

    def _activation(self, path: tuple, act: ops.Activation, args: Any) -> Step | None:
        names = [p.name for p in act.params]
        if args is None:
            given: dict = {}
        elif isinstance(args, dict):
            given = args
        elif act.params and (_is_number(args)):
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
            elif not _is_number(value):
                ok = False
                self.err(path + (p.name,), f"{act.name}'s {p.name} must be a number, got {value!r}")
            else:
                params.append((p.name, float(value)))
        if ok and act.name == "clamp" and params[0][1] > params[1][1]:
            self.err(path, f"clamp's min ({params[0][1]}) is above its max ({params[1][1]})")
            return None
        return Step(act.name, params=tuple(params)) if ok else None

    # -- configs -----------------------------------------------------------------------

    def _configs(
        self, kind: str, is_matmul: bool, gated: bool, full_operand: bool
    ) -> tuple[tuple[Config, ...], tuple[Config, ...], Config] | None:
        """The pointer kernel's space, the TMA kernel's and the default config. A space
        the spec gives serves both kernels."""
        tune = self.spec.autotune
        family = "matmul" if is_matmul else "elementwise"
        operand_bytes = min(dtypes.DTYPES[d].bytes for d in self.spec.dtypes)
        weights = 2 if gated else 1
        space = configs.SPACES[kind]
        tma_space = configs.TMA_SPACES[kind]
        default = configs.DEFAULTS[kind]
        tma_default = configs.TMA_DEFAULTS.get(kind)
        ok = True

        def check(cfg: Config, rel: tuple) -> bool:
            found = configs.problems(
                cfg, family, weights=weights, operand_bytes=operand_bytes, full_operand=full_operand
            )
            for problem in found:
                self.err(("autotune",) + rel, f"bad config: {problem}")
            return not found

        if tune and tune.configs is not None:
            space = tuple(_config(c) for c in tune.configs)
            tma_space = space if is_matmul else ()
            for j, cfg in enumerate(space):
                ok &= check(cfg, ("configs", j))
        if tune and tune.default is not None:
            given = dict(_config(tune.default).items())
            # Fields left out keep the built-in default's values.
            merged = Config(**{**dict(default.items()), **given})
            ok &= check(merged, ("default",))
            default = Config(**{k: v for k, v in merged.items() if k not in configs.TMA_SWITCHES})
            if tma_default is not None:
                tma_default = Config(**{**dict(tma_default.items()), **given})
        return (space, tma_space, default, tma_default) if ok else None


def _op_name(raw: Any) -> Any:
    return next(iter(raw)) if isinstance(raw, dict) and raw else raw


def _config(spec: ConfigSpec) -> Config:
    return Config(**spec.model_dump())


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
