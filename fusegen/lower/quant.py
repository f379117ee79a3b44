"""Quantized matmul operands (an input's dtype int8, int4, fp8_e4m3 or fp8_e5m2, with its
scales): checked against the chain they feed, and the chain lowered to a QuantChain.

A quantized input is a matmul operand stored [rows, K], K last (x as `x @ ...`, a weight
as nn.Linear's `x @ w.T`), so that groups, blocks and int4's packing all run along K.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from fusegen import configs, dtypes
from fusegen.ir import Config, Gate, Kernel, Quant, QuantChain, Quantizer
from fusegen.spec.models import KernelSpec, PerBlockScale, PerGroupScale

QUANT_NAMES = ", ".join(dtypes.QUANT_DTYPES)
SCALE_KINDS = "per_tensor, per_row (per_channel), {per_group: G}, {per_block: [R, G]}"
# The tensor cores' K step: a group of scales must hold whole steps.
K_STEP = 16


def is_quantized(spec: KernelSpec) -> bool:
    return any(inp.dtype in dtypes.QUANT_DTYPES for inp in spec.inputs.values())


def quant_fields_problems(spec: KernelSpec, err: Callable) -> None:
    """Errors for scale, zero_point and packing where they do not apply (any chain)."""
    for name, inp in spec.inputs.items():
        quant = dtypes.QUANT_DTYPES.get(inp.dtype or "")
        fields = inp.model_fields_set
        if quant is None:
            for field in ("scale", "zero_point", "packing"):
                if field in fields:
                    err(
                        ("inputs", name, field),
                        f"'{field}' applies to quantized inputs; '{name}' is "
                        f"{inp.dtype or 'unpinned'}",
                        f"quantized dtypes: {QUANT_NAMES}",
                        key=True,
                    )
            continue
        if inp.scale is None:
            err(
                ("inputs", name),
                f"input '{name}' is {quant.name} but has no `scale`",
                f"a quantized input names its scales: scale: {SCALE_KINDS}",
            )
        if inp.zero_point and not quant.integer:
            err(
                ("inputs", name, "zero_point"),
                f"{quant.name} takes no zero point",
                "zero points are for int8 and int4 (AWQ, GPTQ)",
                key=True,
            )
        if inp.packing is not None and quant.name != "int4":
            err(
                ("inputs", name, "packing"),
                f"'packing' is int4's (two values a byte); '{name}' is {quant.name}",
                key=True,
            )
        group = _scale(inp.scale)[1]
        if group is not None and group % K_STEP:
            where = "per_group" if isinstance(inp.scale, PerGroupScale) else "per_block"
            err(
                ("inputs", name, "scale", where),
                f"a group of {group} along K is not a multiple of {K_STEP}",
                f"groups along K hold whole tensor-core steps of {K_STEP}: 32, 64, 128, ...",
            )


def lower_quant(kernel: Kernel, spec: KernelSpec, err: Callable) -> QuantChain | None:
    """The QuantChain of a lowered matmul chain with quantized operands, or None (every
    problem sent to `err`, a path relative to the kernel)."""
    mm = kernel.matmul
    if mm is None:
        err(
            ("inputs",),
            "quantized inputs are matmul operands, and this chain has no matmul",
            "start the chain with `matmul: x @ w.T`",
        )
        return None
    # Each operand's side of the dot ("a" or "b"), for the matmul and a gate's.
    operands = {mm.a: "a", mm.b: "b"}
    transposed = {mm.a: mm.a_transposed, mm.b: mm.b_transposed}
    for g in kernel.steps:
        if isinstance(g, Gate):
            operands[g.matmul.b] = "b"
            transposed[g.matmul.b] = g.matmul.b_transposed
    quants = []
    for name, inp in spec.inputs.items():
        quant = dtypes.QUANT_DTYPES.get(inp.dtype or "")
        if quant is None or inp.scale is None:
            continue
        side = operands.get(name)
        if side is None:
            err(
                ("inputs", name, "dtype"),
                f"input '{name}' is quantized but is not a matmul operand",
                "quantized inputs are the matmul's (or a gate's) operands; the chain's other "
                "inputs take the call's dtype",
            )
            continue
        k = kernel.dim(mm.k)
        # K last in memory: x used as is, a weight through .T.
        k_last = inp.shape[-1] == mm.k and transposed[name] == (side == "b")
        if not k_last:
            use = f"{name} @ ..." if side == "a" else f"... @ {name}.T"
            err(
                ("inputs", name, "shape"),
                f"quantized input '{name}' must hold K ({mm.k}) as its last dim",
                f"groups and packing run along K: declare it [{'M' if side == 'a' else 'N'}, "
                f"{mm.k}] and use it as `{use}`",
            )
            continue
        scale, group, rows_per = _scale(inp.scale)
        if group is not None and k.size is not None and k.size % group:
            err(
                ("inputs", name, "scale"),
                f"a group of {group} does not divide {mm.k} = {k.size}",
                _groups_of(k.size),
            )
            continue
        if quant.name == "int4" and k.size is not None and k.size % 2:
            err(
                ("inputs", name, "dtype"),
                f"int4 packs two values a byte along {mm.k}, and {mm.k} = {k.size} is odd",
                "pad K to an even size",
            )
            continue
        packing = (inp.packing or "low_first") if quant.name == "int4" else None
        quants.append(Quant(name, quant.name, scale, group, rows_per, inp.zero_point, packing))
    _spec_problems(spec, err)
    names = {*spec.inputs, *spec.dims}
    for q in quants:
        for extra in (q.scale_name, q.zero_name):
            if extra and extra in names:
                err(
                    ("inputs", extra),
                    f"'{extra}' is the launcher's argument for {q.name}'s "
                    f"{'scales' if extra == q.scale_name else 'zero points'}",
                    "rename this input",
                    key=True,
                )
    if "dtypes" not in spec.model_fields_set:
        kernel = dataclasses.replace(kernel, dtypes=("bf16", "fp16"))
    elif "fp32" in spec.dtypes:
        err(
            ("dtypes", spec.dtypes.index("fp32")),
            "a quantized chain computes its dots in bf16 or fp16 (or fp8)",
            "list bf16 and/or fp16",
        )
    gated = kernel.gate is not None
    space = configs.QUANT_GATED_SPACE if gated else configs.QUANT_SPACE
    space += configs.QUANT_SPLIT_SPACE
    groups = [q.group for q in quants if q.k_varying]
    fp8_steps = bool(groups) and all(q.dtype in FP8_NAMES for q in quants if q.k_varying)
    default = configs.QUANT_FP8_STEP_DEFAULT if fp8_steps else configs.QUANT_DEFAULT
    qc = QuantChain(
        chain=kernel,
        quant=tuple(quants),
        configs=_fitted(space, groups),
        default_config=_fitted((default,), groups)[0],
        interpreter_config=_fitted((configs.QUANT_INTERPRETER,), groups)[0],
    )
    if not qc.gemv:
        return qc
    return dataclasses.replace(
        qc,
        configs=qc.configs + _whole_groups(configs.QUANT_GEMV_SPACE, groups),
        interpreter_gemv_config=_whole_groups((configs.QUANT_GEMV_INTERPRETER,), groups)[0],
    )


def _scale(scale) -> tuple[str, int | None, int | None]:
    """(kind, group along K, rows sharing a scale) of a spec's scale (None: not given)."""
    if isinstance(scale, PerGroupScale):
        return "group", scale.per_group, 1
    if isinstance(scale, PerBlockScale):
        return "block", scale.per_block[1], scale.per_block[0]
    if scale == "per_tensor":
        return "tensor", None, None
    return ("row", None, 1) if scale else (None, None, None)


def _spec_problems(spec: KernelSpec, err: Callable) -> None:
    """The kernel fields a quantized chain does not take (its chain's own lowering
    refuses row ops and extra outputs after a matmul)."""
    given = spec.model_fields_set
    for field, why in (
        ("backward", "quantized chains are inference-only: their weights do not train"),
        (
            "autotune",
            "quantized chains tune their built-in space at run time, or take the table "
            "`fusegen tune` writes",
        ),
        ("fp32_matmul", "it sets fp32 calls' matmul; a quantized chain's calls are bf16/fp16"),
    ):
        if field in given:
            err((field,), f"'{field}' does not apply to a quantized chain", why, key=True)
    if spec.fallback.nonfinite != "off":
        err(
            ("fallback", "nonfinite"),
            "a quantized chain has no inf/NaN fallback to the reference",
            "leave `nonfinite` out (no_gpu applies)",
        )
    if spec.target != "nvidia":
        err(
            ("target",),
            f"quantized chains are generated for nvidia GPUs, not {spec.target}",
            "leave target out",
        )


def _fitted(space: tuple[Config, ...], groups: list[int]) -> tuple[Config, ...]:
    """The space with each BLOCK_K cut to the largest power of two dividing every group
    (a K step then never straddles two scales), duplicates dropped."""
    out: list[Config] = []
    for cfg in space:
        block_k = cfg.BLOCK_K
        while any(g % block_k for g in groups):
            block_k //= 2
        fitted = dataclasses.replace(cfg, BLOCK_K=max(block_k, K_STEP))
        if fitted not in out:
            out.append(fitted)
    return tuple(out)


def _whole_groups(space: tuple[Config, ...], groups: list[int]) -> tuple[Config, ...]:
    """The GEMV space with each BLOCK_K raised to hold whole groups (powers of two, as
    QuantChain.gemv requires), duplicates dropped."""
    out: list[Config] = []
    for cfg in space:
        fitted = dataclasses.replace(cfg, BLOCK_K=max([cfg.BLOCK_K, *groups]))
        if fitted not in out:
            out.append(fitted)
    return tuple(out)


FP8_NAMES = ("fp8_e4m3", "fp8_e5m2")


def _groups_of(size: int) -> str:
    """What a group along a dim of `size` may be: its divisors that are multiples of 16."""
    groups = [g for g in range(16, size + 1, 16) if size % g == 0]
    if not groups:
        return f"no multiple of 16 divides {size}: use per_row scales, or pad the dim"
    return f"a multiple of 16 that divides {size}: " + ", ".join(map(str, groups[:8]))


def ends_in_quantize(chain: list) -> bool:
    last = chain[-1] if chain else None
    return isinstance(last, dict) and len(last) == 1 and next(iter(last)) == "quantize"


def quantize_args(args, path: tuple, err: Callable) -> tuple[str, int | None] | None:
    """(dtype, group or None) of a `quantize:` step, or None (the problem sent to err)."""
    form = "quantize: {dtype: fp8_e4m3, scale: per_row} (or scale: {per_group: 128})"
    if not isinstance(args, dict) or set(args) - {"dtype", "scale"} or "dtype" not in args:
        err(path, f"quantize takes a dtype and a scale, got {args!r}", form)
        return None
    dtype = dtypes.canonical_quant(str(args["dtype"]))
    if dtype not in FP8_NAMES:
        err(
            path + ("dtype",),
            f"quantize makes fp8 values, not {args['dtype']!r}",
            "dtype: fp8_e4m3 or fp8_e5m2",
        )
        return None
    scale = args.get("scale", "per_row")
    if scale == "per_row":
        return dtype, None
    group = scale.get("per_group") if isinstance(scale, dict) and len(scale) == 1 else None
    if not isinstance(group, int) or isinstance(group, bool) or group < K_STEP or group % K_STEP:
        err(
            path + ("scale",),
            f"quantize's scale is per_row or {{per_group: G}} (G a multiple of {K_STEP}), "
            f"got {scale!r}",
            form,
        )
        return None
    return dtype, group


def quantizer(kernel: Kernel, dtype: str, group: int | None, err: Callable, path: tuple):
    """The Quantizer of an elementwise chain (checked: no row op, no extra output, no
    cast: the output is the fp8 values and their scales)."""
    if kernel.matmul is not None or kernel.row_step is not None or kernel.emits:
        err(
            path,
            "quantize ends an elementwise chain (`input: x`, then elementwise ops)",
            "quantize a matmul's or a norm's output in a chain of its own",
        )
        return None
    if kernel.out_dtype is not None:
        err(path, "a cast before quantize has no effect: the output is fp8", "remove the cast")
        return None
    col = kernel.dim(kernel.col)
    if group is not None and col.size is not None and col.size % group:
        err(
            path + ("scale",),
            f"a group of {group} does not divide {col.name} = {col.size}",
            _groups_of(col.size),
        )
        return None
    return Quantizer(chain=kernel, dtype=dtype, group=group)
