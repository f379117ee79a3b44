"""The Triton kernel's text: addresses, the mainloop, the chain's epilogue, helpers."""

from __future__ import annotations

import re

from fusegen import ops
from fusegen.codegen import naming
from fusegen.codegen.chain_text import lit, operand_ref, steps_in_order
from fusegen.ir import Emit, Gate, Kernel, RowStep, Step, Tensor


def tile_addr(tensor: Tensor, axes: tuple[str, str]) -> str:
    """Address of a [len(axes[0]), len(axes[1])] tile of a tensor, by dim name."""
    rows, cols = axes
    return (
        f"{naming.ptr(tensor.name)} + {naming.offs(rows)}[:, None]"
        f" * {naming.stride(tensor.name, rows)}"
        f" + {naming.offs(cols)}[None, :] * {naming.stride(tensor.name, cols)}"
    )


def operand_load(kernel: Kernel, tensor: Tensor, broadcast: str) -> str:
    if broadcast == "full":
        addr, mask = tile_addr(tensor, (kernel.row, kernel.col)), "in_bounds"
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
        if fast_tanh(kernel) and ops.ACTIVATIONS[step.op].fast:
            args += ", FAST_TANH"
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
    """The chain after the matmul or the loaded input (row kernels: see row_pieces)."""
    if kernel.row_step is not None:
        return []
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


def fast_tanh(kernel: Kernel) -> bool:
    """Whether the kernel takes FAST_TANH: its spec allows tanh.approx and one of its
    activations has a form on it. The launcher sets it per call (on NVIDIA GPUs, for
    bf16 and fp16 outputs)."""
    return kernel.fast_tanh and ops.fast_tanh_used(steps_in_order(kernel))


ROW_MAX_COMBINE = "_max_keeping_nan"
ROW_MAX = "_row_max_keeping_nan"


def row_max(value: str) -> str:
    """A row max of a 2-D block that keeps NaN, as torch.amax does."""
    return f"{ROW_MAX}({value})"


def helpers(kernel: Kernel) -> list[dict]:
    seen: list[str] = []
    for step in steps_in_order(kernel):
        if step.op in ops.ACTIVATIONS and step.op not in seen:
            seen.append(step.op)
    fast = fast_tanh(kernel)
    out = []
    for name in seen:
        act = ops.ACTIVATIONS[name]
        args = ["x"] + [p.helper_arg for p in act.params]
        out.append(
            {
                "name": naming.helper(name),
                "args": ", ".join(
                    args + (["FAST_TANH: tl.constexpr"] if fast and act.fast else [])
                ),
                "math": act.math,
                "why": act.why,
                "body": list(act.triton),
                "fast": list(act.fast) if fast else [],
                "fast_why": act.fast_why,
            }
        )
    if any(isinstance(item, RowStep) and item.op == "max" for item in kernel.steps):
        out += row_max_helpers()
    return out


def row_max_helpers() -> list[dict]:
    """row_max's helper and the combine of row maxes block by block, as `helpers` lists
    helpers."""
    plain = "tl.max would drop a NaN on the GPU (its combine is the plain max)"
    return [
        {
            "name": ROW_MAX_COMBINE,
            "args": "a, b",
            "math": "max(a, b), NaN where either is (torch.amax's)",
            "why": plain,
            "body": [f"return {ops.nan_max('a', 'b')}"],
            "fast": [],
            "fast_why": "",
        },
        {
            "name": ROW_MAX,
            "args": "x",
            "math": "each row's max (x's axis 1), NaN where the row has one (torch.amax's)",
            "why": f"{plain}; a tl.reduce with a NaN-keeping combine runs element by"
            " element on the interpreter",
            "body": [
                "nan_in_row = tl.max((x != x).to(tl.int32), axis=1) > 0",
                'return tl.where(nan_in_row, float("nan"), tl.max(x, axis=1))',
            ],
            "fast": [],
            "fast_why": "",
        },
    ]


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


def tma_operands(kernel: Kernel) -> list[Tensor]:
    """The matmul operands the TMA kernel reads through descriptors: a, then each weight."""
    mm = kernel.matmul
    return [kernel.tensor(mm.a)] + [kernel.tensor(b) for _, b in weights(kernel)]


def tma_mainloop(kernel: Kernel) -> dict:
    """The TMA kernel's descriptors and tile loads, as lines. A descriptor covers its
    tensor as memory holds it, its unit-stride dim last: the declared dims, or reversed
    where the operand arrives column-major (its constexpr *_COLUMN_MAJOR, as cuBLAS takes
    transA/transB). A tile the dot needs the other way round is transposed after the
    load, which wgmma reads from shared memory at no cost."""
    mm = kernel.matmul
    block = {mm.m: "BLOCK_M", mm.k: "BLOCK_K", mm.n: "BLOCK_N"}
    coord = {mm.m: "pid_m * BLOCK_M", mm.k: "k * BLOCK_K", mm.n: "pid_n * BLOCK_N"}

    def make(t: Tensor, dims: tuple[str, ...], block_text: str | None = None) -> str:
        # Positional: (base, shape, strides, block_shape).
        return (
            f"{t.name}_desc = tl.make_tensor_descriptor({naming.ptr(t.name)}, "
            f"[{', '.join(dims)}], [{naming.stride(t.name, dims[0])}, 1], "
            f"[{block_text or ', '.join(block[d] for d in dims)}])"
        )

    def load(t: Tensor, dims: tuple[str, ...], needed: tuple[str, str]) -> str:
        expr = f"{t.name}_desc.load([{', '.join(coord[d] for d in dims)}])"
        return f"{naming.tile(t.name)} = {expr}{'.T' if dims != needed else ''}"

    def both(flag: str, column_major: str, row_major: str) -> list[str]:
        return [f"if {flag}:", f"    {column_major}", "else:", f"    {row_major}"]

    descriptors, loads = [], []
    operands = tma_operands(kernel)
    needs = [(mm.m, mm.k)] + [(mm.k, mm.n)] * (len(operands) - 1)
    for t, needed in zip(operands, needs, strict=True):
        flag, flipped = naming.column_major(t.name), tuple(reversed(t.dims))
        descriptors += both(flag, make(t, flipped), make(t, t.dims))
        loads += both(flag, load(t, flipped, needed), load(t, t.dims, needed))
    out = Tensor(naming.OUT, (kernel.row, kernel.col), None, "", False)
    # A subtiled epilogue stores half tiles.
    descriptors.append(
        make(out, out.dims, "BLOCK_M, BLOCK_N // 2 if EPILOGUE_SUBTILE else BLOCK_N")
    )
    return {
        "descriptors": descriptors,
        "epilogue_bounds": epilogue_bounds(kernel),
        "save_bounds": save_bounds(kernel),
        "loads": loads,
        "tiles": [naming.tile(t.name) for t in operands],
        "out_desc": f"{naming.OUT}_desc",
    }


def epilogue_bounds(kernel: Kernel) -> list[str]:
    """The TMA kernel's tile offsets and masks, as far as its chain reads them (a bias
    needs the column mask, a full-tile operand both): its store clips at the edges."""
    rows, cols = kernel.row, kernel.col
    offs_r, offs_c = naming.offs(rows), naming.offs(cols)
    mask_r, mask_c = naming.mask(rows), naming.mask(cols)
    chain = " ".join(epilogue(kernel, "acc"))
    used = {name for name in (offs_r, offs_c, mask_r, mask_c, "in_bounds") if name in chain}
    if "in_bounds" in used:
        used |= {mask_r, mask_c}
    if mask_r in used:
        used.add(offs_r)
    if mask_c in used:
        used.add(offs_c)
    offsets = [
        (offs_r, f"{offs_r} = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)"),
        (offs_c, f"{offs_c} = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)"),
    ]
    lines = [line for name, line in offsets if name in used]
    widened = [f"    {name} = {name}.to(tl.int64)" for name, _ in offsets if name in used]
    if widened:
        lines += [
            "if INT64:",
            "    # Offset times stride would overflow int32 past 2**31 elements.",
        ]
        lines += widened
    bounds = ((mask_r, offs_r, rows), (mask_c, offs_c, cols))
    lines += [f"{m} = {o} < {d}" for m, o, d in bounds if m in used]
    if "in_bounds" in used:
        lines.append(f"in_bounds = {mask_r}[:, None] & {mask_c}[None, :]")
    return lines


def params(kernel: Kernel, *, tma: bool = False) -> list[dict]:
    if kernel.matmul:
        meta = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"] + ([] if tma else ["SPLIT_K", "EVEN_K"])
        meta += ["INT64", "DOT_UPCAST", "INPUT_PRECISION", "SAVE_PRE"]
        if tma:
            meta += ["NUM_SMS", "FLATTEN", "WARP_SPECIALIZE", "EPILOGUE_SUBTILE"]
            meta += [naming.column_major(t.name) for t in tma_operands(kernel)]
    elif kernel.row_step:
        meta = ["BLOCK_M", "BLOCK_N", "INT64", "SINGLE_PASS", "ALIGN"]
        meta += ["SAVE_STATS"] if row_stats(kernel) else []
    else:
        meta = ["BLOCK_M", "BLOCK_N", "INT64", "ALIGN"]
    if fast_tanh(kernel):
        meta.append("FAST_TANH")
    out_dims = (kernel.row,) if kernel.reduces else (kernel.row, kernel.col)
    strides = [naming.stride(t.name, d) for t in kernel.inputs for d in t.dims]
    strides += [naming.stride(naming.OUT, d) for d in out_dims]
    strides += [naming.stride(e, d) for e in kernel.emits for d in (kernel.row, kernel.col)]
    pointers = [naming.ptr(t.name) for t in kernel.inputs] + [naming.ptr(naming.OUT)]
    pointers += [naming.ptr(e) for e in kernel.emits]
    comment = "the inputs, then the outputs"
    if kernel.matmul:
        pointers += [save["ptr"] for save in saved(kernel)]
        comment += " (and the accumulators, SAVE_PRE)"
    if row_stats(kernel):
        pointers.append(STATS_PTR)
        comment += " (and the rows' statistics, SAVE_STATS)"
    groups = [
        {"comment": comment, "names": pointers},
        {"comment": "dims", "names": [d.name for d in kernel.dims] + [naming.ROWS_BUCKET]},
        {"comment": "strides, in elements", "names": strides},
    ]
    if kernel.matmul:
        groups.append(
            {
                "comment": (
                    "split-K scratch (unused: both kernels take the same arguments)"
                    if tma
                    else "split-K scratch: fp32 partial sums, per-tile arrival counts"
                ),
                "names": [naming.PARTIALS, naming.ARRIVALS],
            }
        )
    groups.append({"comment": "meta-parameters", "names": [f"{m}: tl.constexpr" for m in meta]})
    return groups


def aligned_ints(kernel: Kernel) -> list[str]:
    """The integer arguments that decide whether a row or elementwise kernel's loads and
    stores along a row can be vectors: the row length and every 2-D tensor's row stride.
    Triton learns by itself only which integers divide by 16 (a 1000-column row tells it
    nothing), so a heuristic computes ALIGN at each launch, the power of two up to 16
    dividing them all, and the kernel restates them as multiples of it. None for matmul
    kernels, whose tiles are loaded by descriptors or along K."""
    if kernel.matmul:
        return []
    rows = [naming.stride(t.name, t.dims[0]) for t in kernel.inputs if len(t.dims) == 2]
    if not kernel.reduces:
        rows.append(naming.stride(naming.OUT, kernel.row))
    rows += [naming.stride(e, kernel.row) for e in kernel.emits]
    return [kernel.col, *rows]


def align_heuristic(kernel: Kernel) -> str:
    """The @triton.heuristics entry that computes ALIGN from the launch's arguments."""
    names = ", ".join(f'args["{n}"]' for n in aligned_ints(kernel))
    return f'"ALIGN": lambda args: _align({names})'


# -- row kernels: a norm, softmax or reduction over each row -------------------------


def _row_operand(kernel: Kernel, step: RowStep, role: str) -> str | None:
    return dict(step.operands).get(role)


STATS_PTR = "stats_ptr"


def row_stats(kernel: Kernel) -> tuple[tuple[str, str], ...]:
    """What a norm's training forward stores per row for its backward (SAVE_STATS, fp32,
    [rows, len] contiguous), as (the backward's name, the forward's value): layernorm's
    mean and rstd, rmsnorm's rstd. The backward then
    skips the reductions that recompute them (measured on an H200, forward + backward:
    LayerNorm 4096 x 8192 0.151 -> 0.136 ms, Gemma RMSNorm 16384 x 3072 0.165 -> 0.144;
    benchmarks/RESULTS.md)."""
    step = kernel.row_step
    if kernel.matmul is not None or step is None:
        return ()
    rstd = ("row_rstd", "row_rstd")
    return {"layernorm": (("row_mean", "row_shift + row_mean"), rstd), "rmsnorm": (rstd,)}.get(
        step.op, ()
    )


def stat_addr(kernel: Kernel, ptr: str, index: int) -> str:
    """The address of row statistic `index` of each of the block's rows."""
    count, offs = len(row_stats(kernel)), naming.offs(kernel.row)
    row = f"{offs} * {count}" if count > 1 else offs
    return f"{ptr} + {row}" + (f" + {index}" if index else "")


def stats_store(kernel: Kernel) -> list[str]:
    """The forward's store of row_stats, where they are final."""
    stats, mask = row_stats(kernel), naming.mask(kernel.row)
    lines = ["if SAVE_STATS:  # a training forward: 4 bytes a row and statistic"]
    for i, (_, value) in enumerate(stats):
        lines.append(f"    tl.store({stat_addr(kernel, STATS_PTR, i)}, {value}, mask={mask})")
    return lines if stats else []


def first_column(kernel: Kernel) -> list[str]:
    """Lines setting row_shift to the chain's value at each row's first column, computed
    alone, one value a row: the chain's lines before the row op with the column offset
    and the broadcasts dropped, the variables renamed. A load beside the row's, where
    picking the element out of the row took a reduction (measured on an H200, LayerNorm
    4096 x 8192 forward: 44.0 -> 38.1 us; benchmarks/RESULTS.md). The same ops on the
    same inputs give the same value, so a constant row's deviations stay exactly 0."""
    offs_col, mask_col = naming.offs(kernel.col), naming.mask(kernel.col)
    before, _ = row_chain(kernel, emits=False)
    source = tile_addr(kernel.tensor(kernel.source), (kernel.row, kernel.col))
    lines = [f"value = tl.load({source}, mask=in_bounds, other=0.0).to(tl.float32)", *before]
    column = re.compile(rf" \+ {offs_col}\[None, :\] \* \w+|\[:, None\]|\[None, :\]")
    lines = [column.sub("", line) for line in lines]
    # Every input's name: those the chain loads before the row op appear in the lines.
    rename = {name: f"first_{name}" for name in (offs_col, *(t.name for t in kernel.inputs))}
    rename |= {"value": "row_shift", "in_bounds": naming.mask(kernel.row)}
    rename[mask_col] = f"(first_{offs_col} < {kernel.col})"
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(rename))) + r")\b")
    lines = [pattern.sub(lambda m: rename[m.group(1)], line) for line in lines]
    if any(f"first_{offs_col}" in line for line in lines):  # a [cols] operand's load
        lines.insert(0, f"first_{offs_col} = tl.zeros([1], dtype=tl.int32)")
    return lines


def row_pieces(kernel: Kernel) -> dict:
    """The row kernel's lines, by phase. One pass when a row fits in BLOCK_N; otherwise
    pass 1 loops over the row's blocks gathering statistics (`init`, `accumulate`,
    `finalize`) and pass 2 loops again applying them (`apply`). `prep` runs on every
    block before either."""
    step = kernel.row_step
    params = dict(step.params)
    n = kernel.col
    mask_col = naming.mask(kernel.col)
    loads: list[str] = []

    def vector(role: str) -> str | None:
        name = _row_operand(kernel, step, role)
        if name is None:
            return None
        tensor = kernel.tensor(name)
        loads.append(operand_load(kernel, tensor, "row"))
        return f"{name}[None, :]"

    pieces = {"prep": [], "single": [], "init": [], "accumulate": [], "finalize": [], "apply": []}
    pieces["first"] = []  # before either pass
    if step.op in ("softmax", "log_softmax"):
        prep = pieces["prep"]
        if params["scale"] != 1.0:
            prep.append(f"value = value * {lit(params['scale'])}")
        mask_name = _row_operand(kernel, step, "mask")
        if mask_name:
            prep.append(operand_load(kernel, kernel.tensor(mask_name), step.mask_broadcast))
            ref = f"{mask_name}[None, :]" if step.mask_broadcast == "row" else mask_name
            prep.append(f"value = value + {ref}")
        prep.append('value = tl.where(in_bounds, value, float("-inf"))')
        if step.op == "softmax":
            result = "tl.exp(value - row_safe_max[:, None]) / row_den[:, None]"
        else:
            result = "value - row_safe_max[:, None] - tl.log(row_den)[:, None]"
        pieces["single"] = [
            "row_max = tl.max(value, axis=1)",
            "# A row of only -inf (all masked) has no max to subtract; 0 keeps exp finite.",
            'row_safe_max = tl.where(row_max == float("-inf"), 0.0, row_max)',
            "row_den = tl.sum(tl.exp(value - row_safe_max[:, None]), axis=1)",
            f"value = {result}",
        ]
        pieces["init"] = [
            'row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)',
            "row_den = tl.zeros([BLOCK_M], dtype=tl.float32)",
        ]
        pieces["accumulate"] = [
            "# Online softmax: rescale the running sum whenever the running max grows.",
            "row_block_max = tl.maximum(row_max, tl.max(value, axis=1))",
            'row_safe_max = tl.where(row_block_max == float("-inf"), 0.0, row_block_max)',
            "row_den = row_den * tl.exp(row_max - row_safe_max) + tl.sum(",
            "    tl.exp(value - row_safe_max[:, None]), axis=1",
            ")",
            "row_max = row_block_max",
        ]
        pieces["finalize"] = ['row_safe_max = tl.where(row_max == float("-inf"), 0.0, row_max)']
        pieces["apply"] = [f"value = {result}"]
    elif step.op == "rmsnorm":
        pieces["prep"] = ["value = tl.where(in_bounds, value, 0.0)"]
        eps = lit(params["eps"])
        weight = vector("weight")
        scale = []
        if weight:
            gain = f"({lit(params['offset'])} + {weight})" if params["offset"] else weight
            scale = [f"value = value * {gain}"]
        apply = ["value = value * row_rstd[:, None]", *loads, *scale]
        pieces["single"] = [
            f"row_rstd = tl.rsqrt(tl.sum(value * value, axis=1) / {n} + {eps})",
            *apply,
        ]
        pieces["init"] = ["row_sq = tl.zeros([BLOCK_M], dtype=tl.float32)"]
        pieces["accumulate"] = ["row_sq += tl.sum(value * value, axis=1)"]
        pieces["finalize"] = [f"row_rstd = tl.rsqrt(row_sq / {n} + {eps})"]
        pieces["apply"] = apply
    elif step.op == "layernorm":
        eps = lit(params["eps"])
        weight, bias = vector("weight"), vector("bias")
        affine = [*loads] + ([f"value = value * {weight}"] if weight else [])
        affine += [f"value = value + {bias}"] if bias else []
        pieces["first"] = [
            "# Deviations from the row's first element, then from their mean: a constant",
            "# row gives exact zeros, and large values near each other lose no precision.",
            *first_column(kernel),
        ]
        pieces["single"] = [
            "row_dev = tl.where(in_bounds, value - row_shift[:, None], 0.0)",
            f"row_mean = tl.sum(row_dev, axis=1) / {n}",
            "row_dev = tl.where(in_bounds, row_dev - row_mean[:, None], 0.0)",
            f"row_rstd = tl.rsqrt(tl.sum(row_dev * row_dev, axis=1) / {n} + {eps})",
            "value = row_dev * row_rstd[:, None]",
            *affine,
        ]
        pieces["init"] = [
            "row_count = tl.zeros([BLOCK_M], dtype=tl.float32)",
            "row_mean = tl.zeros([BLOCK_M], dtype=tl.float32)",
            "row_m2 = tl.zeros([BLOCK_M], dtype=tl.float32)",
        ]
        pieces["accumulate"] = [
            "# Mean and squared deviations per block, merged into the running ones",
            "# (Chan et al.), around the row's first element as in the one-pass case.",
            "row_dev = tl.where(in_bounds, value - row_shift[:, None], 0.0)",
            "row_block_count = tl.zeros([BLOCK_M], dtype=tl.float32)"
            f" + tl.sum({mask_col}.to(tl.float32), axis=0)",
            "row_block_mean = tl.sum(row_dev, axis=1) / row_block_count",
            "row_centered = tl.where(in_bounds, row_dev - row_block_mean[:, None], 0.0)",
            "row_block_m2 = tl.sum(row_centered * row_centered, axis=1)",
            "row_new_count = row_count + row_block_count",
            "row_delta = row_block_mean - row_mean",
            "row_mean += row_delta * (row_block_count / row_new_count)",
            "row_m2 += row_block_m2 + row_delta * row_delta"
            " * (row_count * row_block_count / row_new_count)",
            "row_count = row_new_count",
        ]
        pieces["finalize"] = [f"row_rstd = tl.rsqrt(row_m2 / {n} + {eps})"]
        pieces["apply"] = [
            "value = (value - row_shift[:, None] - row_mean[:, None]) * row_rstd[:, None]",
            *affine,
        ]
    else:  # sum, mean, max
        is_max = step.op == "max"
        fill = 'float("-inf")' if is_max else "0.0"
        pieces["prep"] = [f"value = tl.where(in_bounds, value, {fill})"]
        reduce = row_max("value") if is_max else "tl.sum(value, axis=1)"
        mean = f" / {n}" if step.op == "mean" else ""
        pieces["single"] = [f"value = {reduce}{mean}"]
        init = (
            f"tl.full([BLOCK_M], {fill}, tl.float32)"
            if is_max
            else "tl.zeros([BLOCK_M], dtype=tl.float32)"
        )
        pieces["init"] = [f"row_total = {init}"]
        pieces["accumulate"] = [
            (
                f"row_total = {ROW_MAX_COMBINE}(row_total, {row_max('value')})"
                if is_max
                else "row_total += tl.sum(value, axis=1)"
            )
        ]
        pieces["finalize"] = [f"value = row_total{mean}"]
    pieces["single"] += stats_store(kernel)
    pieces["finalize"] += stats_store(kernel)
    return pieces


def row_chain(kernel: Kernel, *, emits: bool) -> tuple[list[str], list[str]]:
    """(lines before the row op, lines after it) for one block. The first pass writes the
    extra outputs; the second recomputes the value without writing them again."""
    before, after = [], []
    loaded_before: set[str] = set()
    loaded_after: set[str] = set()
    seen_row = False
    for item in kernel.steps:
        if isinstance(item, RowStep):
            seen_row = True
        elif isinstance(item, Emit):
            if emits:
                addr = tile_addr(
                    Tensor(item.name, (kernel.row, kernel.col), None, "", False),
                    (kernel.row, kernel.col),
                )
                before.append(
                    f"tl.store({addr}, value.to({naming.ptr(item.name)}.dtype.element_ty),"
                    " mask=in_bounds)"
                )
        elif seen_row:
            after += triton_step(kernel, item, "value", loaded_after)
        else:
            before += triton_step(kernel, item, "value", loaded_before)
    return before, after


def saved(kernel: Kernel) -> list[dict]:
    """What a matmul chain's training forward stores for the backward (SAVE_PRE): each
    accumulator before the epilogue, at the output's strides, from either kernel."""
    out = []
    for acc, ptr in (("acc", "pre_ptr"), ("acc_gate", "pre_gate_ptr"))[: 1 + bool(kernel.gate)]:
        rows = f"{naming.stride(naming.OUT, kernel.row)}"
        cols = f"{naming.stride(naming.OUT, kernel.col)}"
        offs_r, offs_c = naming.offs(kernel.row), naming.offs(kernel.col)
        out.append(
            {
                "acc": acc,
                "ptr": ptr,
                "addr": f"{ptr} + {offs_r}[:, None] * {rows} + {offs_c}[None, :] * {cols}",
                "tma_addr": f"{ptr} + pre_rows[:, None] * {rows} + pre_cols[None, :] * {cols}",
            }
        )
    return out


def save_bounds(kernel: Kernel) -> list[str]:
    """The TMA kernel's offsets and mask for the SAVE_PRE stores (its output goes through
    a descriptor, which clips by itself)."""
    return [
        "pre_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "pre_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "if INT64:",
        "    pre_rows = pre_rows.to(tl.int64)",
        f"pre_bounds = (pre_rows < {kernel.row})[:, None] & (pre_cols < {kernel.col})[None, :]",
    ]
