"""Spec -> IR: resolve names, check meaning, fill defaults. Every problem found is
collected with its location; a kernel with errors yields no IR.
"""

from __future__ import annotations

import dataclasses
import difflib
import keyword
import sys
from typing import Any

import pydantic

from fusegen import configs, dtypes
from fusegen.spec import limits
from fusegen.errors import SpecError, SpecErrors, did_you_mean
from fusegen.ir import (
    Attention,
    Config,
    Dim,
    Gate,
    Kernel,
    LossHead,
    Matmul,
    QuantChain,
    RowStep,
    Tensor,
)
from fusegen.lower.chain import ChainLowering
from fusegen.lower.quant import (
    ends_in_quantize,
    is_quantized,
    lower_quant,
    quant_fields_problems,
    quantize_args,
    quantizer,
)
from fusegen.spec.source import SpecSource
from fusegen.lower.attention import lower_attention
from fusegen.lower.loss import ends_in_loss, lower_loss_head
from fusegen.spec.models import AttentionKernelSpec, ConfigSpec, KernelSpec, TOP_LEVEL_KEYS

# Local and module-level names of the generated kernel, launcher, reference and tests;
# an input or dim of the same name would shadow them.
RESERVED_NAMES = frozenset(
    {
        # kernel
        "acc",
        "acc_gate",
        "value",
        "in_bounds",
        "pid",
        "k",
        "tl",
        "triton",
        "torch",
        "F",
        "range",
        "min",
        "max",
        "split",
        "tile_id",
        "partials",
        "arrivals",
        # the backward's and the training forward's buffers: the incoming gradient, a
        # matmul chain's accumulators, a norm's row statistics
        "grad",
        "pre",
        "pre_gate",
        "stats",
        "arrived",
        "last",
        "json",
        "time",
        "inspect",
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
        "depth",
        "fast_tanh",
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
# A generated module of one of these names would shadow what it or its tests import
# (the folder on sys.path: `inspect.py` there breaks `import torch`), or a name the
# module defines.
RESERVED_MODULES = frozenset(
    {
        *sys.stdlib_module_names,
        "torch",
        "triton",
        "numpy",
        "pytest",
        "conftest",
        "jinja2",
        "yaml",
        "pydantic",
        "transformers",
        "kernels",
        "reference",
        "last_launch",
    }
)


def lower_file(source: SpecSource) -> list[Kernel | Attention | LossHead | QuantChain]:
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
    if len(kernels_raw) > limits.MAX_KERNELS_PER_FILE:
        errors.append(
            source.error(
                ("kernels",),
                f"{len(kernels_raw):,} kernels in one file",
                f"a spec file holds at most {limits.MAX_KERNELS_PER_FILE} kernels; split it",
            )
        )
        raise SpecErrors(errors)
    kernels: list[Kernel | Attention | LossHead | QuantChain] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(kernels_raw):
        path = ("kernels", i)
        if not isinstance(raw, dict):
            errors.append(source.error(path, f"a kernel is a mapping, not a {type(raw).__name__}"))
            continue
        too_many = _over_limits(source, path, raw)
        if too_many:
            errors.extend(too_many)
            continue
        model = AttentionKernelSpec if _is_attention(raw) else KernelSpec
        try:
            spec = model.model_validate(raw)
        except pydantic.ValidationError as exc:
            errors.extend(_pydantic_errors(source, path, raw, exc, model))
            continue
        key = spec.name.lower()  # one module file on macOS and Windows
        if key in seen:
            errors.append(
                source.error(
                    path + ("name",),
                    f"kernel name '{spec.name}' is used twice in this file"
                    f" (also kernels[{seen[key]}])",
                    "each kernel names its own generated module (names that differ only "
                    "in case are one file on macOS and Windows); rename one",
                )
            )
        seen.setdefault(key, i)
        if model is AttentionKernelSpec:
            attention, found = lower_attention(source, path, spec, kernel_name_problem)
            errors.extend(found)
            if attention is not None:
                kernels.append(attention)
            continue
        lowerer = _KernelLowerer(source, path, spec)
        kernel = lowerer.lower_loss() if ends_in_loss(spec.chain) else lowerer.lower()
        errors.extend(lowerer.errors)
        if kernel is not None:
            kernels.append(kernel)
    if errors:
        raise SpecErrors(errors)
    return kernels


# (where in a kernel, the most it may hold, what it counts); see fusegen.spec.limits.
_COUNTED = (
    (("dims",), limits.MAX_DIMS, "dims"),
    (("inputs",), limits.MAX_INPUTS, "inputs"),
    (("chain",), limits.MAX_CHAIN_STEPS, "chain steps"),
    (("autotune", "configs"), limits.MAX_CONFIGS, "configs"),
)


def _over_limits(source: SpecSource, base: tuple, raw: dict) -> list[SpecError]:
    """Errors for the lists and mappings of a kernel that hold more than fusegen.spec.limits
    allows; checked before anything else reads them."""
    out = []
    for rel, most, what in _COUNTED:
        value: Any = raw
        for part in rel:
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, (list, dict)) and len(value) > most:
            out.append(
                source.error(
                    base + rel,
                    f"{len(value):,} {what}",
                    f"a kernel has at most {most} {what}",
                )
            )
    return out


def _pydantic_errors(
    source: SpecSource, base: tuple, raw: Any, exc: pydantic.ValidationError, model=KernelSpec
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
            allowed = _allowed_fields(err["loc"], model)
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
        if err["type"] in ("bool_type", "bool_parsing"):
            message = f"a flag, got {err['input']!r}"
            hint = "true or false (YAML 1.2: `yes`, `on`, `off` are text)"
        out.append(source.error(tuple(path), message, hint))
    return out


def _is_attention(raw: dict) -> bool:
    """A kernel with `attention:`, or with a key close to it and no chain (a misspelled
    attention kernel: its errors should be the attention kernel's, not "missing chain")."""
    if "attention" in raw:
        return True
    return "chain" not in raw and any(
        isinstance(k, str) and difflib.get_close_matches(k, ["attention"], cutoff=0.75) for k in raw
    )


def _allowed_fields(loc: tuple, root: type[pydantic.BaseModel] = KernelSpec) -> list[str]:
    """The fields pydantic would have accepted at `loc` (for extra_forbidden errors)."""
    from fusegen.spec import models as spec_models

    parents = [p for p in loc[:-1] if isinstance(p, str)]
    model: type[pydantic.BaseModel] = root
    for name in parents:
        nested = {
            "fallback": spec_models.FallbackSpec,
            "autotune": spec_models.AutotuneSpec,
            "configs": spec_models.ConfigSpec,
            "default": spec_models.ConfigSpec,
            "attention": spec_models.AttentionSpec,
        }
        if name in nested:
            model = nested[name]
        elif model is spec_models.KernelSpec and name == "inputs":
            model = spec_models.InputSpec
    return list(model.model_fields)


def kernel_name_problem(name: str) -> tuple[str, str] | None:
    """(message, hint) where `name` cannot name a kernel's module, else None."""
    if len(name) > limits.MAX_NAME_CHARS:
        return f"kernel name {_too_long(name)}", "it names a module and files"
    if keyword.iskeyword(name):
        return f"kernel name '{name}' is a Python keyword", "it names a module: another word"
    if not name.isascii() or not name.isidentifier():
        return (
            f"kernel name '{name}' is not a Python identifier"
            + ("" if name.isascii() else " of ASCII letters, digits and _"),
            "it names a module: letters, digits, _",
        )
    if name in RESERVED_MODULES or name.startswith(("test", "_")) or name.isupper():
        library = " (a module of Python's standard library)" * (name in sys.stdlib_module_names)
        return (
            f"kernel name '{name}' would clash with a module{library} or be collected as " "a test",
            "reserved: names starting with 'test' or '_', all-capital names, the standard "
            "library's modules, and "
            + ", ".join(sorted(RESERVED_MODULES - set(sys.stdlib_module_names))),
        )
    return None


def _too_long(name: str) -> str:
    return (
        f"'{name[:20]}...' is {len(name):,} characters; a name has at most "
        f"{limits.MAX_NAME_CHARS}"
    )


def _check_name(name: str, renames: tuple[str, ...] = ("{}_in", "in_{}")) -> tuple[str, str] | None:
    """(why `name` cannot name an input, dim or output, what can), or None. renames: the
    forms of the rename a reserved name's hint suggests, the first one free."""
    if len(name) > limits.MAX_NAME_CHARS:
        return _too_long(name), ""
    if not name.isascii():
        # Python reads identifiers in NFKC form: `ｘ` is `x`, and `𝔞b.py` imports as `ab`.
        return f"'{name}' is not a Python identifier of ASCII letters, digits and _", ""
    if keyword.iskeyword(name):
        return f"'{name}' is a Python keyword", f"e.g. {name}_in"
    if not name.isidentifier():
        return f"'{name}' is not a Python identifier", ""
    if _reserved(name):
        forms = [form.format(name) for form in renames]
        free = next((n for n in forms if not _reserved(n)), forms[0])
        return (
            f"'{name}' is reserved: the generated kernel uses it",
            f"rename it (e.g. '{free}'); {RESERVED}",
        )
    return None


def _reserved(name: str) -> bool:
    return (
        name in RESERVED_NAMES
        or name.startswith(RESERVED_PREFIXES)
        or name.endswith(RESERVED_SUFFIXES)
    )


RESERVED = (
    "reserved: "
    + ", ".join(sorted(RESERVED_NAMES, key=str.lower))
    + "; names starting "
    + ", ".join(RESERVED_PREFIXES)
    + " or ending "
    + ", ".join(RESERVED_SUFFIXES)
)


LOSS_HEAD_FIELDS = frozenset({"name", "doc", "dims", "dtypes", "inputs", "chain"})


class _KernelLowerer:
    def __init__(self, source: SpecSource, path: tuple, spec: KernelSpec):
        self.source = source
        self.path = path
        self.spec = spec
        self.errors: list[SpecError] = []

    def err(self, rel: tuple, message: str, hint: str = "", *, key: bool = False) -> None:
        self.errors.append(self.source.error(self.path + rel, message, hint, key=key))

    # -- names, dims, inputs ---------------------------------------------------------

    def lower_loss(self) -> LossHead | None:
        """A chain ending in cross_entropy: an LM head (fusegen.lower.loss)."""
        spec = self.spec
        self._check_kernel_name()
        dims = self._dims()
        inputs = self._inputs(dims, labels=True)
        if self.errors:
            return None
        base = self._identity()
        for field in sorted(spec.model_fields_set - LOSS_HEAD_FIELDS):
            self.err(
                (field,),
                f"'{field}' does not apply to a loss head",
                "a loss head takes " + ", ".join(sorted(LOSS_HEAD_FIELDS)) + "; its GEMMs "
                "are cuBLAS's and its kernels' configs fixed",
                key=True,
            )
        self._check_dtypes()
        head = lower_loss_head(spec, dims, inputs, self.err, base)
        if head is not None:
            used = {head.x, head.weight, head.labels, *(s.operand for s in head.steps)}
            self._check_used(inputs, dims, used)
        return None if self.errors else head

    def _identity(self) -> dict:
        """The fields every kernel kind's IR takes from the spec as they are."""
        spec = self.spec
        return dict(
            name=spec.name,
            doc=spec.doc.strip(),
            spec_display=self.source.display,
            spec_sha256=self.source.sha256,
            dtypes=tuple(spec.dtypes),
        )

    def _check_dtypes(self) -> None:
        for j, name in enumerate(self.spec.dtypes):
            if name in self.spec.dtypes[:j]:
                self.err(
                    ("dtypes", j),
                    f"dtype {name} is listed twice",
                    "list each dtype once: " + ", ".join(dtypes.DTYPES),
                )

    def _check_used(self, inputs: dict[str, Tensor], dims: dict[str, Dim], used: set) -> None:
        """An error for each input the chain does not read and each dim no input has."""
        for t in inputs.values():
            if t.name not in used:
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

    def lower(self) -> Kernel | QuantChain | None:
        if ends_in_quantize(self.spec.chain):
            return self._lower_quantizer()
        kernel = self._lower_chain()
        if not is_quantized(self.spec) or kernel is None:
            return kernel
        quant = lower_quant(kernel, self.spec, self.err)
        return None if self.errors else quant

    def _lower_quantizer(self):
        """A chain ending in `quantize`: the elementwise chain before it, then fp8."""
        spec = self.spec
        last = len(spec.chain) - 1
        path = ("chain", last, "quantize")
        args = quantize_args(spec.chain[last]["quantize"], path, self.err)
        for field in ("backward", "autotune"):
            if field in spec.model_fields_set:
                self.err(
                    (field,),
                    f"'{field}' does not apply to a quantize chain",
                    "it runs without tuning, inference-only",
                    key=True,
                )
        if spec.fallback.nonfinite != "off":
            self.err(
                ("fallback", "nonfinite"),
                "a quantize chain has no inf/NaN fallback to the reference",
                "leave `nonfinite` out (no_gpu applies)",
            )
        if spec.target != "nvidia":
            self.err(
                ("target",),
                f"quantize chains are generated for nvidia GPUs, not {spec.target}",
                "leave target out",
            )
        if last == 1:
            kernel = self._bare_source()
        else:
            # The chain before the quantize, lowered as an elementwise chain.
            kernel = self._lower_chain(spec.chain[:-1])
        if kernel is None or args is None or self.errors:
            return None
        return quantizer(kernel, *args, self.err, path)

    def _bare_source(self) -> Kernel | None:
        """`input: x` then `quantize`: x's Kernel with no steps."""
        spec = self.spec
        self._check_kernel_name()
        self._check_dtypes()
        dims = self._dims()
        inputs = self._inputs(dims)
        if self.errors:
            return None
        steps_of = ChainLowering(spec.chain[:1], spec.dims, self.err, _check_name)
        first = spec.chain[0]
        if not (isinstance(first, dict) and list(first) == ["input"]):
            self.err(("chain", 0), "a quantize chain starts with `input: x`")
            return None
        source = steps_of._source(("chain", 0, "input"), first["input"], inputs)
        if source is None:
            return None
        self._check_used(inputs, dims, {source})
        row, col = inputs[source].dims
        return Kernel(
            **self._identity(),
            dims=tuple(dims.values()),
            inputs=tuple(dataclasses.replace(t, batched=t.dims[0] == row) for t in inputs.values()),
            matmul=None,
            source=source,
            row=row,
            col=col,
            steps=(),
            out_dtype=None,
            fp32_matmul=None,
            fallback_no_gpu=spec.fallback.no_gpu,
            fallback_nonfinite="off",
            configs=(),
            tma_configs=(),
            default_config=Config(),
            tma_default_config=None,
            default_given=False,
            interpreter_config=Config(),
        )

    def _lower_chain(self, chain: list | None = None) -> Kernel | None:
        """The spec's chain (or `chain`, a part of it) as a Kernel."""
        spec = self.spec
        self._check_kernel_name()
        self._check_dtypes()
        quant_fields_problems(spec, self.err)
        if spec.target == "amd" and spec.fp32_matmul in ("tf32", "tf32x3"):
            self.err(
                ("fp32_matmul",),
                f"fp32_matmul '{spec.fp32_matmul}' is for target nvidia; Triton's AMD backend "
                "runs fp32 dots in full fp32",
                "use fp32_matmul: ieee, or leave it out",
            )
        dims = self._dims()
        inputs = self._inputs(dims)
        if self.errors:
            return None
        steps_of = ChainLowering(chain or spec.chain, spec.dims, self.err, _check_name)
        chain = steps_of.lower(inputs, dims)
        if chain is None or self.errors:
            return None
        matmul, source, row, col, steps, out_dtype = chain
        self._check_used(inputs, dims, steps_of.used_inputs)
        gated = any(isinstance(s, Gate) for s in steps)
        rowwise = any(isinstance(s, RowStep) for s in steps)
        kind = "gated" if gated else "matmul" if matmul else "row" if rowwise else "elementwise"
        full = any(getattr(s, "broadcast", None) == "full" for s in steps)
        sizes = {"BLOCK_M": dims[row].size, "BLOCK_N": dims[col].size}
        if matmul is not None:
            sizes["BLOCK_K"] = dims[matmul.k].size
        cfgs = self._configs(kind, matmul is not None, gated, full, sizes)
        save = spec.backward.save or ("accumulators" if matmul is not None else "inputs")
        if save == "accumulators" and matmul is None:
            self.err(
                ("backward", "save"),
                "'accumulators' needs a matmul chain (there are none to keep)",
                "row and elementwise chains keep their inputs: leave backward.save out",
            )
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
            **self._identity(),
            dims=tuple(dims.values()),
            inputs=batched_inputs,
            matmul=matmul,
            source=source,
            row=row,
            col=col,
            steps=tuple(steps),
            out_dtype=out_dtype,
            fp32_matmul=self._fp32_matmul(),
            fallback_no_gpu=spec.fallback.no_gpu,
            fallback_nonfinite=spec.fallback.nonfinite,
            configs=space,
            tma_configs=tma_space,
            default_config=default,
            tma_default_config=tma_default,
            default_given=bool(spec.autotune and spec.autotune.default is not None),
            interpreter_config=configs.INTERPRETER[kind],
            deterministic=spec.deterministic,
            target=spec.target,
            fast_tanh=spec.fast_tanh and spec.target == "nvidia",
            backward_save=save,
        )

    def _fp32_matmul(self) -> str | None:
        """What the spec fixes; else on nvidia None (the launcher follows PyTorch's
        setting at each call), on amd ieee, as its Triton backend has no tf32 dot (an
        explicit tf32 there is an error: see lower)."""
        given = self.spec.fp32_matmul
        return given or ("ieee" if self.spec.target == "amd" else None)

    @staticmethod
    def _transposed(matmul: Matmul | None, name: str) -> bool:
        if matmul is None:
            return False
        return (matmul.a == name and matmul.a_transposed) or (
            matmul.b == name and matmul.b_transposed
        )

    def _check_kernel_name(self) -> None:
        problem = kernel_name_problem(self.spec.name)
        if problem:
            self.err(("name",), *problem)

    def _dims(self) -> dict[str, Dim]:
        dims: dict[str, Dim] = {}
        lowered: dict[str, str] = {}
        for name, size in self.spec.dims.items():
            problem = _check_name(name)
            if problem:
                self.err(("dims", name), f"dim {problem[0]}", problem[1], key=True)
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
            if size != "dynamic" and size > limits.MAX_DIM_SIZE:
                self.err(
                    ("dims", name),
                    f"dim {name} = {size:,} is too large",
                    f"a fixed dim is at most 2**31 - 1 ({limits.MAX_DIM_SIZE:,}); "
                    "use `dynamic` for sizes known at call time",
                )
                continue
            dims[name] = Dim(name, None if size == "dynamic" else size)
        return dims

    def _inputs(self, dims: dict[str, Dim], *, labels: bool = False) -> dict[str, Tensor]:
        """The inputs; integer ones only where `labels` (a loss head's)."""
        inputs: dict[str, Tensor] = {}
        for name, inp in self.spec.inputs.items():
            problem = _check_name(name)
            if problem:
                self.err(("inputs", name), f"input {problem[0]}", problem[1], key=True)
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
            if inp.dtype in dtypes.QUANT_DTYPES and labels:
                ok = False
                self.err(
                    ("inputs", name, "dtype"),
                    f"input '{name}' is {inp.dtype}: a loss head takes no quantized inputs",
                    "quantized operands are for matmul chains (bias, activation, gate)",
                )
            if inp.dtype in dtypes.INDEX_DTYPES and not labels:
                ok = False
                self.err(
                    ("inputs", name, "dtype"),
                    f"input '{name}' is {inp.dtype}: integer inputs are a cross_entropy step's "
                    "labels",
                    "a chain computes on " + ", ".join(dtypes.DTYPES) + " inputs; end the "
                    "chain in `cross_entropy: {labels: NAME}` to use integer labels",
                )
            if ok:
                inputs[name] = Tensor(
                    name, tuple(inp.shape), inp.dtype, inp.doc.strip(), batched=False
                )
        return inputs

    # -- configs -----------------------------------------------------------------------

    def _configs(
        self,
        kind: str,
        is_matmul: bool,
        gated: bool,
        full_operand: bool,
        sizes: dict[str, int | None],
    ) -> tuple[tuple[Config, ...], tuple[Config, ...], Config, Config | None] | None:
        """The pointer kernel's space, the TMA kernel's and their default configs. A
        space the spec gives serves both kernels; a built-in one loses the configs whose
        blocks are far larger than the static dims in `sizes`."""
        tune = self.spec.autotune
        family = "matmul" if is_matmul else "elementwise"
        operand_bytes = min(dtypes.DTYPES[d].bytes for d in self.spec.dtypes)
        weights = 2 if gated else 1
        profile = tune.profile if tune else "general"
        target = self.spec.target
        space, tma_space, default, tma_default = configs.profile_spaces(kind, profile, target)
        space = _fitting(space, sizes)
        tma_space = _fitting(tma_space, sizes)
        ok = True

        def check(cfg: Config, rel: tuple) -> bool:
            huge = [(k, v) for k, v in cfg.items() if abs(v) > limits.MAX_CONFIG_VALUE]
            for key, value in huge:
                self.err(
                    ("autotune",) + rel + (key,),
                    f"bad config: {key} = {value:,} is too large",
                    f"config values are at most 2**20 ({limits.MAX_CONFIG_VALUE:,})",
                )
            if huge:
                return False
            found = configs.problems(
                cfg,
                family,
                weights=weights,
                operand_bytes=operand_bytes,
                full_operand=full_operand,
                target=target,
            )
            if not found and rel[0] == "configs":
                found = configs.oversized(cfg, sizes)
            for problem in found:
                self.err(("autotune",) + rel, f"bad config: {problem}")
            return not found

        if tune and tune.configs is not None and profile != "general":
            self.err(
                ("autotune", "profile"),
                f"profile '{profile}' picks from the built-in space, but autotune.configs "
                "replaces that space",
                "keep one of the two",
            )
            ok = False
        if tune and tune.configs is not None:
            space = tuple(_config(c) for c in tune.configs)
            # The TMA kernel does not split K: it takes the space's other configs.
            unsplit = tuple(c for c in space if (c.SPLIT_K or 1) == 1)
            tma_space = (unsplit or space) if is_matmul and target == "nvidia" else ()
            for j, cfg in enumerate(space):
                ok &= check(cfg, ("configs", j))
        if tune and tune.default is not None:
            given = dict(_config(tune.default).items())
            # Fields left out keep the built-in default's values.
            merged = Config(**{**dict(default.items()), **given})
            ok &= check(merged, ("default",))
            default = Config(**{k: v for k, v in merged.items() if k not in configs.TMA_SWITCHES})
            if tma_default is not None:
                given.pop("SPLIT_K", None)  # the TMA kernel does not split K
                tma_default = Config(**{**dict(tma_default.items()), **given})
        return (space, tma_space, default, tma_default) if ok else None


def _config(spec: ConfigSpec) -> Config:
    return Config(**spec.model_dump())


def _fitting(space: tuple[Config, ...], sizes: dict[str, int | None]) -> tuple[Config, ...]:
    """The configs of a built-in space whose blocks fit the static dims; where none does
    (a tiny problem), the one of fewest elements per tile cut down to them: its blocks to
    cover the dims (16 at least), one pipeline stage where one K step covers K. A 16 x
    32 x 256 tile at 4 stages took 10-14 us of GPU time for 9 x 13 -> 5 on an H200,
    eager's three kernels 3.4 (benchmarks/call_cost.py)."""
    kept = tuple(c for c in space if not configs.oversized(c, sizes))
    if kept or not space:
        return kept
    smallest = min(space, key=lambda c: c.BLOCK_M * c.BLOCK_N * (c.BLOCK_K or 1))
    cut = {
        block: min(getattr(smallest, block), max(16, 1 << max(size - 1, 0).bit_length()))
        for block, size in sizes.items()
        if size is not None and getattr(smallest, block, None) is not None
    }
    if "BLOCK_K" in cut and sizes["BLOCK_K"] <= cut["BLOCK_K"]:
        cut["num_stages"] = 1
    return (dataclasses.replace(smallest, **cut),)
