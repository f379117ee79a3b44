"""A quantized chain's module text: the kernel's mainloop (operands loaded as stored,
unpacked, zero points subtracted), where each scale is applied, and the launcher's facts.

Every operand reaches the tensor cores exact: integers and fp8 values are exact in
bf16, fp16 (and fp8 itself where both sides are fp8). Scales never touch an operand:
one constant along K multiplies the finished accumulator; one that changes along K (a
group, a block) multiplies each K step's partial sums, BLOCK_K dividing its group.
"""

from __future__ import annotations

import math
import textwrap

from fusegen import dtypes, ops
from fusegen.codegen import naming
from fusegen.codegen.chain_text import (
    dict_literal,
    dtype_literal,
    formula,
    tuple_literal,
    wrapped_doc,
)
from fusegen.codegen.kernel_text import epilogue, fast_tanh, helpers, weights
from fusegen.codegen.equivalence_text import bound_lines, bound_returns, dist, dynamic_cases
from fusegen.codegen.python_text import reference_lines
from fusegen.ir import Config, Gate, Quant, QuantChain, Step

SCALE_DOC = {
    "tensor": "one scale",
    "row": "one scale a row",
    "group": "one scale per {group} values along {k}, a row",
    "block": "one scale per [{rows}, {group}] block",
}


def launcher_tensors(qc: QuantChain) -> list[dict]:
    """The launcher's tensor arguments in order: each input, a quantized one followed by
    its scales and zero points. Per tensor: its name and dims (for strides; scales' are
    named rows / groups)."""
    out = []
    for t in qc.chain.inputs:
        q = qc.quant_of(t.name)
        out.append({"name": t.name, "dims": list(t.dims)})
        if q is None:
            continue
        dims = {
            "tensor": [],
            "row": ["rows"],
            "group": ["rows", "groups"],
            "block": ["rows", "groups"],
        }
        out.append({"name": q.scale_name, "dims": dims[q.scale]})
        if q.zero_point:
            out.append({"name": q.zero_name, "dims": dims[q.scale]})
    return out


def kernel_params(qc: QuantChain) -> list[dict]:
    chain = qc.chain
    tensors = launcher_tensors(qc)
    strides = [naming.stride(t["name"], d) for t in tensors for d in t["dims"]]
    strides += [naming.stride(naming.OUT, chain.row), naming.stride(naming.OUT, chain.col)]
    meta = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "INT64", "DOT_DTYPE"]
    if fast_tanh(chain):
        meta.append("FAST_TANH")
    return [
        {
            "comment": "the inputs (a quantized one with its scales, zero points), output,"
            " split-K scratch",
            "names": [naming.ptr(t["name"]) for t in tensors]
            + [naming.ptr(naming.OUT), "partials_ptr", "arrivals_ptr"],
        },
        {"comment": "dims", "names": [d.name for d in chain.dims]},
        {"comment": "strides, in elements", "names": strides},
        {"comment": "meta-parameters", "names": [f"{m}: tl.constexpr" for m in meta]},
    ]


def _rows(qc: QuantChain, name: str) -> str:
    """The dim along which an operand's rows run in the output tile: M for a, N for b."""
    mm = qc.chain.matmul
    return mm.m if name == mm.a else mm.n


def _scale_addr(q: Quant, s: str, rows: str, group_index: str) -> str:
    """The address of tensor `s` (q's scales or zero points) for the tile's rows."""
    offs = naming.offs(rows)
    if q.scale == "tensor":
        return naming.ptr(s)
    row_index = offs if q.rows_per == 1 else f"({offs} // {q.rows_per})"
    addr = f"{naming.ptr(s)} + {row_index} * {naming.stride(s, 'rows')}"
    if q.k_varying:
        addr += f" + {group_index} * {naming.stride(s, 'groups')}"
    return addr


def _vector_load(q: Quant, which: str, rows: str, group_index: str) -> str:
    """A [rows] load of a scale or zero point (a scalar per tensor), as fp32 / int32."""
    addr = _scale_addr(q, q.scale_name if which == "scale" else q.zero_name, rows, group_index)
    var = f"{q.name}_{which}_{'k' if q.k_varying else 'all'}"
    cast = "tl.float32" if which == "scale" else "tl.int32"
    if q.scale == "tensor":
        return f"{var} = tl.load({addr}).to({cast})"
    other = "1.0" if which == "scale" else "0"
    return f"{var} = tl.load({addr}, mask={naming.mask(rows)}, other={other}).to({cast})"


def _broadcast(var: str, side: str, q: Quant) -> str:
    if q.scale == "tensor":
        return var
    return f"{var}[:, None]" if side == "a" else f"{var}[None, :]"


def operand_lines(qc: QuantChain, name: str, k: str) -> list[str]:
    """The K step's lines that make `<name>_tile`, [rows, BLOCK_K], from memory."""
    q = qc.quant_of(name)
    rows = _rows(qc, name)
    offs_r, mask_r = naming.offs(rows), naming.mask(rows)
    tile = naming.tile(name)
    stride_r, stride_k = naming.stride(name, rows), naming.stride(name, k)
    offs_k, mask_k = naming.offs(k), naming.mask(k)
    if q is None or q.dtype != "int4":
        addr = (
            f"{naming.ptr(name)} + {offs_r}[:, None] * {stride_r} + {offs_k}[None, :] * {stride_k}"
        )
        other = "0" if q is not None and dtypes.QUANT_DTYPES[q.dtype].integer else "0.0"
        mask = f"{mask_r}[:, None] & {mask_k}[None, :]"
        lines = [f"{tile} = tl.load({addr}, mask={mask}, other={other})"]
        if q is not None and q.zero_point:
            lines.append(f"{tile} = {tile}.to(tl.int32)")
    else:
        return _int4_lines(qc, name, k)
    if q is not None and q.zero_point:
        lines += _zero_lines(q, rows)
        zero = f"{q.name}_zero_{'k' if q.k_varying else 'all'}"
        lines.append(f"{tile} = {tile} - {_broadcast(zero, 'a', q)}")
    if not qc.fp8_dot:
        lines.append(f"{tile} = {tile}.to(DOT_DTYPE)")
    return lines


def _zero_lines(q: Quant, rows: str) -> list[str]:
    if not q.k_varying:
        return []  # loaded once, before the loop
    return [_vector_load(q, "zero", rows, f"(k * BLOCK_K) // {q.group}")]


def _int4_lines(qc: QuantChain, name: str, k: str) -> list[str]:
    """The K step's lines that unpack an int4 operand's bytes into `<name>_tile`: as
    integers less the zero point, converted; in a transposed tile (SWAP_AB) as
    _nibble_floats, whose offsets come off after the dot (_swapped_step)."""
    q = qc.quant_of(name)
    rows = _rows(qc, name)
    tile, block = naming.tile(name), f"BLOCK_{_block(qc, rows)}"
    addr = (
        f"{naming.ptr(name)} + {naming.offs(rows)}[:, None] * {naming.stride(name, rows)}"
        f" + offs_packed[None, :] * {naming.stride(name, k)}"
    )
    mask = f"{naming.mask(rows)}[:, None] & mask_packed[None, :]"
    low, high = f"{name}_bytes & 15", f"{name}_bytes >> 4"
    first, second = (low, high) if q.packing == "low_first" else (high, low)
    lines = [f"{name}_bytes = tl.load({addr}, mask={mask}, other=0)"]
    if q.zero_point:
        lines += _zero_lines(q, rows)
    plain = [
        f"# Two values a byte along {k}, the even index in the "
        f"{'low' if q.packing == 'low_first' else 'high'} nibble.",
        f"{tile} = tl.reshape(tl.join({first}, {second}), ({block}, BLOCK_K))",
        f"{tile} = {tile}.to(tl.int32)",
    ]
    if q.zero_point:
        zero = f"{q.name}_zero_{'k' if q.k_varying else 'all'}"
        plain.append(f"{tile} = {tile} - {_broadcast(zero, 'a', q)}")
    else:
        plain.append(f"{tile} = ({tile} ^ 8) - 8  # two's complement nibbles")
    plain.append(f"{tile} = {tile}.to(DOT_DTYPE)")
    if not swaps(qc):
        return lines + plain
    low_first, signed = q.packing == "low_first", not q.zero_point
    floats = f"_nibble_floats({name}_bytes, {block}, BLOCK_K, {low_first}, {signed}, DOT_DTYPE)"
    return lines + ["if SWAP_AB:", f"    {tile} = {floats}", "else:"] + ["    " + x for x in plain]


def _swapped_step(qc: QuantChain, acc: str, b_name: str, factors: list[str]) -> list[str]:
    """A transposed tile's K step (SWAP_AB): out.T's sums, w @ x.T, less what an int4
    weight's nibbles carry beyond their values (NIBBLE_BASE and the zero point, or 8
    for signed nibbles), one product an accumulator element: (offset) * sum(x)."""
    mm = qc.chain.matmul
    b = qc.quant_of(b_name)
    a_tile, b_tile = naming.tile(mm.a), naming.tile(b_name)
    turned = [f.replace("[None, :]", "[:, None]") for f in factors]
    if b.dtype != "int4":
        return _dot_step(acc, f"tl.dot({b_tile}, {a_tile}.T", turned)
    if b.zero_point:
        zero = f"{b.name}_zero_{'k' if b.k_varying else 'all'}"
        offset = f"(NIBBLE_BASE + {zero}.to(tl.float32))"
        offset += "" if b.scale == "tensor" else "[:, None]"
    else:
        offset = "(NIBBLE_BASE + 8.0)"
    less = f"{offset} * x_sum[None, :]"
    if turned:
        return [f"{acc} += (tl.dot({b_tile}, {a_tile}.T) - {less}) * {' * '.join(turned)}"]
    return [f"{acc} = tl.dot({b_tile}, {a_tile}.T, {acc}) - {less}"]


def _block(qc: QuantChain, rows: str) -> str:
    return "M" if rows == qc.chain.matmul.m else "N"


def mainloop(qc: QuantChain) -> dict:
    """Lines before the K loop (scales and zero points that K does not change), in it,
    and after it (the scales applied to the accumulators)."""
    chain = qc.chain
    mm = chain.matmul
    k = mm.k
    before, loop = [], []
    loop += [
        f"{naming.offs(k)} = k * BLOCK_K + tl.arange(0, BLOCK_K)",
        f"{naming.mask(k)} = {naming.offs(k)} < {k}",
    ]
    if any(q.dtype == "int4" for q in qc.quant):
        loop += [
            "offs_packed = k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)",
            f"mask_packed = offs_packed < {k} // 2",
        ]
    swap = swaps(qc)
    names = [mm.a] + [b for _, b in weights(chain)]
    for name in names:
        q = qc.quant_of(name)
        rows = _rows(qc, name)
        if q is not None and q.zero_point and not q.k_varying:
            before.append(_vector_load(q, "zero", rows, ""))
        loop += operand_lines(qc, name, k)
    a = qc.quant_of(mm.a)
    if a is not None and a.k_varying:
        loop.append(_vector_load(a, "scale", mm.m, f"(k * BLOCK_K) // {a.group}"))
    if swap and nibbles(qc):
        x_sum = f"x_sum = tl.sum({naming.tile(mm.a)}.to(tl.float32), axis=1)"
        loop += [
            "if SWAP_AB:  # x's row sums: what a nibble's offset adds to each dot",
            f"    {x_sum}",
        ]
    for acc, b_name in weights(chain):
        b = qc.quant_of(b_name)
        dot = f"tl.dot({naming.tile(mm.a)}, {naming.tile(b_name)}.T"
        if b is not None and b.k_varying and b.rows_per > 1:
            loop += _block_scale_lines(a, b, mm.n, acc, dot)
            continue
        if b is not None and b.k_varying:
            loop.append(_vector_load(b, "scale", mm.n, f"(k * BLOCK_K) // {b.group}"))
        factors = [
            _broadcast(f"{q.name}_scale_k", side, q)
            for q, side in ((a, "a"), (b, "b"))
            if q is not None and q.k_varying
        ]
        step = _dot_step(acc, dot, factors)
        if swap:
            swapped = ["    " + line for line in _swapped_step(qc, acc, b_name, factors)]
            step = ["if SWAP_AB:", *swapped, "else:"] + ["    " + line for line in step]
        loop += step
    after = [f"{acc} = {acc}.T" for acc, _ in weights(chain)]
    after = ["if SWAP_AB:", *("    " + line for line in after)] if swap else []
    return {
        "before": before,
        "loop": loop,
        "after": after + constant_scales(qc),
        "swap": swap,
        "nibbles": swap and nibbles(qc),
    }


def swaps(qc: QuantChain) -> bool:
    """Whether the kernel may compute a decode tile transposed (SWAP_AB): for weights
    that are dequantized in registers (the activations not quantized) and scaled along
    rows or not at all, never per block of rows."""
    if qc.quant_of(qc.chain.matmul.a) is not None:
        return False
    found = [qc.quant_of(b) for _, b in weights(qc.chain)]
    return all(b is not None and not (b.k_varying and b.rows_per > 1) for b in found)


def nibbles(qc: QuantChain) -> bool:
    """Whether any weight is int4 (the kernel then has _nibble_floats)."""
    return any(
        qc.quant_of(b) is not None and qc.quant_of(b).dtype == "int4" for _, b in weights(qc.chain)
    )


def _dot_step(acc: str, dot: str, factors: list[str]) -> list[str]:
    if factors:
        return [f"{acc} += {dot}) * {' * '.join(factors)}"]
    return [f"{acc} = {dot}, {acc})"]


def _block_scale_lines(a: Quant | None, b: Quant, n: str, acc: str, dot: str) -> list[str]:
    """A K step of weights scaled per block of rows: where BLOCK_N divides the block, the
    tile's columns share one scale, and the step's factor is a [BLOCK_M] vector, so the
    scales cost one multiply-add an accumulator element, not two (the tensor cores wait
    on them: a block-scaled fp8 SwiGLU ran 2.3x faster so at 128 x 64 tiles, 1% at the
    tuned 128 x 128, and 3.06 ms at its fastest tile against the two multiplies' best
    3.33; benchmarks/experiments/fp8_block_scale_fma.py). Else a scale a column,
    multiplied in turn: a [BLOCK_M, BLOCK_N] product of the two scales formed first ran
    2.5x slower (its layout is not the dot's)."""
    group_index = f"(k * BLOCK_K) // {b.group}"
    scale = f"{b.name}_scale_k"
    row_scale = f"{a.name}_scale_k" if a is not None and a.k_varying else None
    ptr, rows, groups = (
        naming.ptr(b.scale_name),
        naming.stride(b.scale_name, "rows"),
        naming.stride(b.scale_name, "groups"),
    )
    one = f"tl.load({ptr} + (pid_n * BLOCK_N // {b.rows_per}) * {rows} + {group_index} * {groups})"
    shared = f"({row_scale} * {scale})[:, None]" if row_scale else scale
    columns = f"{row_scale}[:, None] * {scale}[None, :]" if row_scale else f"{scale}[None, :]"
    return [
        f"if {b.rows_per} % BLOCK_N == 0:  # the tile's columns share one scale a step",
        f"    {scale} = {one}.to(tl.float32)",
        f"    {acc} += {dot}) * {shared}",
        "else:",
        f"    {_vector_load(b, 'scale', n, group_index)}",
        f"    {acc} += {dot}) * {columns}",
    ]


def constant_scales(qc: QuantChain) -> list[str]:
    """The lines after the K loop that multiply each accumulator by the scales constant
    along K (per tensor, per row), each loaded once."""
    mm = qc.chain.matmul
    a = qc.quant_of(mm.a)
    after: list[str] = []
    for acc, b_name in weights(qc.chain):
        b = qc.quant_of(b_name)
        constant = [
            (q, side, rows)
            for q, side, rows in ((a, "a", mm.m), (b, "b", mm.n))
            if q is not None and not q.k_varying
        ]
        for q, _, rows in constant:
            load = _vector_load(q, "scale", rows, "")
            if load not in after:
                after.append(load)
        if constant:
            product = " * ".join(
                _broadcast(f"{q.name}_scale_all", side, q) for q, side, _ in constant
            )
            after.append(f"{acc} = {acc} * {product}")
    return after


def _group_load(q: Quant, which: str) -> str:
    """A [BLOCK_N, groups in the step] load of q's scales or zero points, as fp32."""
    s = q.scale_name if which == "scale" else q.zero_name
    other = "1.0" if which == "scale" else "0"
    return (
        f"{q.name}_{which}_k = tl.load({s}_rows + offs_groups_{q.group}[None, :] * "
        f"{naming.stride(s, 'groups')}, mask=mask_groups_{q.group}, other={other})"
        ".to(tl.float32)"
    )


def word_offset(q: Quant) -> float:
    """What the GEMV path's floats hold beyond a stored integer's value: 2**bits (the
    float the integer is OR-ed into), plus half of that range where the integers are
    signed (their sign bit flipped)."""
    bits = dtypes.QUANT_DTYPES[q.dtype].bits
    return float(2**bits + (0 if q.zero_point else 2 ** (bits - 1)))


def byte_pairs(qc: QuantChain) -> bool:
    """Whether the GEMV path takes an int4 word's bytes whole (_byte_nibbles): int4
    weights, packed alike."""
    found = [qc.quant_of(name) for _, name in weights(qc.chain)]
    return found[0].dtype == "int4" and len({q.packing for q in found}) == 1


# What a low nibble's float holds beyond word_offset's 2**bits in the byte-pair path:
# _byte_nibbles makes it 128 + n / 2, which meets 2 x: 256 x + n x, not 16 x + n x.
LOW_NIBBLE_EXTRA = 240.0


def gemv_mainloop(qc: QuantChain) -> dict:
    """The one-row path (BLOCK_M == 1), without tensor cores: lines before the K loop,
    in it, and after it. The weights are read as 32-bit words (8 int4 or 4 int8 values
    each); each value becomes the exact float 2**bits + its integer by a shift and a
    masked OR (no int-to-float) and meets its x in an FMA. What the floats hold beyond the
    weights' values (word_offset, plus the zero point) comes off once a group, as
    (offset + zero) * (the group's sum of x), and the group's scale multiplies its sum;
    offsets and scales constant along K come off and multiply once, after the loop.
    int4 (byte_pairs): one shift a byte for both its nibbles (_byte_nibbles), the low one
    meeting 2 x and the high one x / 8 (exact), whose extra 240 x comes off with the
    offset (LOW_NIBBLE_EXTRA): 4-8% fewer instructions in the configs compiled for sm_90;
    in benchmarks/experiments/int4_unpack_variants.py's kernel 27.4 us, not 28.1, for
    int4 SwiGLU at one row on an H200 (benchmarks/RESULTS.md)."""
    mm = qc.chain.matmul
    k, n, a = mm.k, mm.n, mm.a
    offs_n, mask_n = naming.offs(n), naming.mask(n)
    found = [(acc, qc.quant_of(name)) for acc, name in weights(qc.chain)]
    bits = dtypes.QUANT_DTYPES[found[0][1].dtype].bits  # QuantChain.gemv: weights alike
    per = 32 // bits
    pairs = byte_pairs(qc)
    groups = sorted({q.group for _, q in found if q.k_varying})
    before = [
        f"x_row = {naming.ptr(a)} + {naming.offs(mm.m)} * {naming.stride(a, mm.m)}",
        # 2**bits's bits plus a 0 the compiler cannot fold (N >> 31), so they stay in a
        # register and the mask and OR of _word_value are one LOP3 (a LOP3 takes one
        # immediate): 1,664 -> 1,416 instructions at 8 rows a program; int4 SwiGLU at one
        # row (4096 -> 14336) 34.2 -> 31.0 us on an H200 (benchmarks/RESULTS.md).
        (
            f"word_base = ((127 + {bits}) << 23) + ({n} >> 31)  # {2**bits}.0's bits, held"
            if not pairs
            else f"word_base = (134 << 23) + ({n} >> 31)  # 128.0's bits, held"
        ),
    ]
    for _, q in found:
        rows = offs_n if q.rows_per == 1 else f"({offs_n} // {q.rows_per})"
        before.append(
            f"{q.name}_rows = {naming.ptr(q.name)}.to(tl.pointer_type(tl.int32))"
            f" + {offs_n}[:, None] * ({naming.stride(q.name, n)} // 4)"
        )
        for s in (q.scale_name, q.zero_name) if q.k_varying else ():
            if s:
                before.append(
                    f"{s}_rows = {naming.ptr(s)} + {rows}[:, None] * {naming.stride(s, 'rows')}"
                )
    loop = [
        f"offs_words = k * (BLOCK_K // {per}) + tl.arange(0, BLOCK_K // {per})",
        f"mask_words = offs_words < {k} // {per}",
        f"mask_step = {mask_n}[:, None] & mask_words[None, :]",
    ]
    for _, q in found:
        loop += [
            f"{q.name}_words = tl.load({q.name}_rows + offs_words[None, :], mask=mask_step,"
            " other=0)",
            f"{q.name}_part = tl.zeros((BLOCK_N, BLOCK_K // {per}), dtype=tl.float32)",
        ]
    loop.append(f"x_words = tl.zeros((BLOCK_K // {per},), dtype=tl.float32)")
    loop += _pair_lines(found, a, k) if pairs else _value_lines(found, a, k, bits)
    for g in groups:
        loop += [
            f"offs_groups_{g} = k * (BLOCK_K // {g}) + tl.arange(0, BLOCK_K // {g})",
            f"mask_groups_{g} = {mask_n}[:, None] & (offs_groups_{g} < {k} // {g})[None, :]",
            f"x_sums_{g} = tl.sum(tl.reshape(x_words, (BLOCK_K // {g}, {g // per})), axis=1)",
        ]
        if pairs:
            loop.append(
                f"x_lows_{g} = tl.sum(tl.reshape(x_lows, (BLOCK_K // {g}, {g // per})), axis=1)"
            )
    after = []
    if any(not q.k_varying for _, q in found):
        before.append("x_total = tl.zeros((1,), dtype=tl.float32)")
        loop.append("x_total += tl.sum(x_words, axis=0)")
        if pairs:
            before.append("x_lows_total = tl.zeros((1,), dtype=tl.float32)")
            loop.append("x_lows_total += tl.sum(x_lows, axis=0)")
    for acc, q in found:
        name, offset = q.name, word_offset(q)
        if not q.k_varying:
            loop.append(f"{acc} += tl.sum({name}_part, axis=1)[None, :]")
            base = f"{offset}"
            if q.zero_point:
                load = _vector_load(q, "zero", n, "")
                if load not in after:
                    after.append(load)
                base = f"({offset} + {_broadcast(f'{name}_zero_all', 'b', q)})"
            extra = f" + {LOW_NIBBLE_EXTRA} * x_lows_total" if pairs else ""
            after.append(f"{acc} -= {base} * x_total{extra}")
            continue
        g = q.group
        shape = f"(BLOCK_N, BLOCK_K // {g}, {g // per})"
        loop.append(f"{name}_part = tl.sum(tl.reshape({name}_part, {shape}), axis=2)")
        base = f"{offset}"
        if q.zero_point:
            loop.append(_group_load(q, "zero"))
            base = f"({offset} + {name}_zero_k)"
        loop.append(f"{name}_part -= {base} * x_sums_{g}[None, :]")
        if pairs:
            loop.append(f"{name}_part -= {LOW_NIBBLE_EXTRA} * x_lows_{g}[None, :]")
        loop += [
            _group_load(q, "scale"),
            f"{acc} += tl.sum({name}_part * {name}_scale_k, axis=1)[None, :]",
        ]
    after += constant_scales(qc)
    return {"before": before, "loop": loop, "after": after}


def _value_lines(found, a: str, k: str, bits: int) -> list[str]:
    """The GEMV step's inner loop over a word's values: each from its own shift
    (_word_value) into an FMA with its x."""
    per = 32 // bits
    lines = [
        f"for j in tl.static_range({per}):  # the word's values, in K order",
        f"    x_j = tl.load(x_row + ({per} * offs_words + j) * {naming.stride(a, k)},"
        " mask=mask_words, other=0.0).to(tl.float32)",
        "    x_words += x_j",
    ]
    for _, q in found:
        # Little-endian words: K's value j sits at bit bits * j, but for int4 packed
        # high_first, where a byte's even index is its high nibble.
        at = "4 * (j ^ 1)" if q.packing == "high_first" else f"{bits} * j"
        lines.append(
            f"    {q.name}_part += _word_value({q.name}_words, {at}, {bits},"
            f" {not q.zero_point}, word_base) * x_j[None, :]"
        )
    return lines


def _pair_lines(found, a: str, k: str) -> list[str]:
    """The int4 GEMV step's inner loop over a word's bytes: both nibbles of a byte from
    one shift (_byte_nibbles), the low one's float meeting 2 x, the high one's x / 8
    (x_lows: the x the low nibbles meet, for LOW_NIBBLE_EXTRA)."""
    stride = naming.stride(a, k)
    # A byte holds K's values 2b and 2b + 1: the even one low (low_first) or high.
    low, high = ("x_even", "x_odd") if found[0][1].packing == "low_first" else ("x_odd", "x_even")
    lines = [
        "x_lows = tl.zeros((BLOCK_K // 8,), dtype=tl.float32)",
        "for b in tl.static_range(4):  # the word's bytes, in K order",
        f"    x_even = tl.load(x_row + (8 * offs_words + 2 * b) * {stride}, mask=mask_words,"
        " other=0.0).to(tl.float32)",
        f"    x_odd = tl.load(x_row + (8 * offs_words + 2 * b + 1) * {stride}, mask=mask_words,"
        " other=0.0).to(tl.float32)",
        "    x_words += x_even + x_odd",
        f"    x_lows += {low}",
        f"    x_low, x_high = 2.0 * {low}, 0.125 * {high}",
    ]
    for _, q in found:
        lines += [
            f"    {q.name}_low, {q.name}_high = _byte_nibbles({q.name}_words, b,"
            f" {not q.zero_point}, word_base)",
            f"    {q.name}_part += {q.name}_low * x_low[None, :]",
            f"    {q.name}_part += {q.name}_high * x_high[None, :]",
        ]
    return lines


def split_lines(qc: QuantChain) -> tuple[list[str], list[str]]:
    """Split-K's lines: each accumulator's partial sums stored, and (in the last program
    of a tile) summed again in split order."""
    chain = qc.chain
    rows, cols, m, n = naming.offs(chain.row), naming.offs(chain.col), chain.row, chain.col
    accs = [acc for acc, _ in weights(chain)]

    def at(index: int, split: str) -> str:
        # Rows first: a dim of 1 is a constant in the compiled kernel, not a tensor.
        which = f"({index} * SPLIT_K + {split})" if index else split
        return f"partials_ptr + (partial_rows + {which} * {m}) * {n} + {cols}[None, :]"

    store = [f"partial_rows = {rows}.to(tl.int64)[:, None]"]
    store += [f"tl.store({at(i, 'split')}, {acc}, mask=in_bounds)" for i, acc in enumerate(accs)]
    total = [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)" for acc in accs]
    total.append("for s in tl.static_range(SPLIT_K):  # .cg: through L2, where the others stored")
    total += [
        f"    {acc} += tl.load({at(i, 's')}, mask=in_bounds, other=0.0, cache_modifier=\".cg\")"
        for i, acc in enumerate(accs)
    ]
    return store, total


def context(
    qc: QuantChain, header: list[str], runtime_hash: str, doc_width: int, param_lines
) -> dict:
    chain = qc.chain
    mm = chain.matmul
    tensors = launcher_tensors(qc)
    names = [t["name"] for t in tensors]
    quant = dict_literal(
        [
            (
                q.name,
                f'_rt.Quant("{q.dtype}", "{q.scale}", {q.group}, {q.rows_per}, '
                f"{q.zero_point}, {repr(q.packing)})",
            )
            for q in qc.quant
        ]
    )
    inputs = tuple_literal(
        [
            f'("{t.name}", {tuple_literal([repr(d) for d in t.dims])}, {t.batched})'
            for t in chain.inputs
        ]
    )
    ref = reference_lines(chain)
    doc_lines = wrapped_doc(chain.doc, doc_width)
    return {
        "header": header,
        "name": chain.name,
        "runtime_hash": runtime_hash,
        "doc_lines": doc_lines,
        "formula": formula(chain),
        "args_doc": args_doc(qc, doc_width),
        "uses_functional": any("F." in line for line in ref),
        "dims_literal": dict_literal([(d.name, str(d.size)) for d in chain.dims]),
        "dtypes_literal": tuple_literal([dtype_literal(d) for d in chain.dtypes]),
        "default_dtype": dtype_literal(chain.dtypes[0]),
        "out_dtype_literal": dtype_literal(chain.out_dtype) if chain.out_dtype else "None",
        "quant_literal": quant,
        "inputs_literal": inputs,
        "configs": [config_literal(c) for c in qc.configs],
        "default_config": config_literal(qc.default_config),
        "interpreter_config": config_literal(qc.interpreter_config),
        "fp8_dot": qc.fp8_dot,
        "fast_tanh": fast_tanh(chain),
        "helpers": helpers(chain),
        "kernel_fn": naming.kernel_fn(chain.name),
        "params": param_lines(kernel_params(qc)),
        "zero_points": {q.name: q.zero_point for q in qc.quant},
        "no_gpu": chain.fallback_no_gpu,
        "deterministic": chain.deterministic,
        "row": chain.row,
        "col": chain.col,
        "k": mm.k,
        "offs_row": naming.offs(chain.row),
        "offs_col": naming.offs(chain.col),
        "mask_row": naming.mask(chain.row),
        "mask_col": naming.mask(chain.col),
        "accumulators": [acc for acc, _ in weights(chain)],
        "mainloop": mainloop(qc),
        "split_store": split_lines(qc)[0],
        "split_sum": split_lines(qc)[1],
        "gemv": gemv_mainloop(qc) if qc.gemv else None,
        "byte_pairs": qc.gemv and byte_pairs(qc),
        "checkpoint_packing": checkpoint_packing(qc),
        "hopper": hopper_chain(qc),
        "interpreter_gemv_config": (
            config_literal(qc.interpreter_gemv_config) if qc.gemv else None
        ),
        "epilogue": epilogue(chain, "acc"),
        "out_addr": (
            f"{naming.ptr(naming.OUT)} + {naming.offs(chain.row)}[:, None] * "
            f"{naming.stride(naming.OUT, chain.row)} + {naming.offs(chain.col)}[None, :] * "
            f"{naming.stride(naming.OUT, chain.col)}"
        ),
        "launcher_args": names,
        "dequantized": [q.name for q in qc.quant],
        "plain_inputs": [t.name for t in chain.inputs if t.dtype is None],
        "reference_lines": ref,
    }


def hopper_chain(qc: QuantChain) -> tuple[str, tuple[str, str, str]] | None:
    """(its name, (x, the gate's weight, the up's)) where the chain is one a Gluon kernel
    of the runtime computes on Hopper: silu(x @ w_gate.T) * (x @ w_up.T), nothing else in
    the chain, and
      - "swiglu" (quant_hopper): x fp8 e4m3 scaled per 1 x 128 group along K, both
        weights fp8 e4m3 per 128 x 128 block, no zero points;
      - "int4_swiglu" (int4_hopper): x unquantized, both weights int4 as AWQ stores them
        (the even K index in the low nibble, one scale and zero point per 128 along K);
    else None (the `tl` kernel only)."""
    chain = qc.chain
    if len(chain.steps) != 2:
        return None
    act, gate = chain.steps
    if not (isinstance(act, Step) and act.op == "silu" and not act.params):
        return None
    if not (isinstance(gate, Gate) and not gate.steps):
        return None
    mm, mm2 = chain.matmul, gate.matmul
    if mm2.a != mm.a or mm.a_transposed or mm2.a_transposed:
        return None
    if not (mm.b_transposed and mm2.b_transposed):
        return None

    def quantized(name: str, *kind) -> bool:
        q = qc.quant_of(name)
        return q is not None and (q.dtype, q.scale, q.group, q.rows_per, q.zero_point) == kind

    weights = (mm.b, mm2.b)
    if quantized(mm.a, "fp8_e4m3", "group", 128, 1, False) and all(
        quantized(b, "fp8_e4m3", "block", 128, 128, False) for b in weights
    ):
        return "swiglu", (mm.a, mm.b, mm2.b)
    if qc.quant_of(mm.a) is None and all(
        quantized(b, "int4", "group", 128, 1, True) and qc.quant_of(b).packing == "low_first"
        for b in weights
    ):
        return "int4_swiglu", (mm.a, mm.b, mm2.b)
    return None


def checkpoint_packing(qc: QuantChain) -> str | None:
    """The nibble order of the int4 inputs an AWQ or GPTQ checkpoint fills (per-group
    scales, zero points), where the chain has such inputs and they share one order."""
    found = {
        q.packing for q in qc.quant if q.dtype == "int4" and q.zero_point and q.scale == "group"
    }
    return found.pop() if len(found) == 1 else None


def config_literal(cfg: Config) -> str:
    """The config as a dict literal; past 95 characters, its launch options on a second
    line (the CONFIGS list is printed with formatting off)."""
    items = [f'"{k}": {v}' for k, v in cfg.items()]
    text = "{" + ", ".join(items) + "}"
    if len(text) <= 95:
        return text
    cut = next(i for i, (k, _) in enumerate(cfg.items()) if k == "num_stages")
    return "{" + ", ".join(items[:cut]) + ",\n     " + ", ".join(items[cut:]) + "}"


def args_doc(qc: QuantChain, width: int) -> list[str]:
    """One entry per launcher argument: its shape, dtype and meaning."""
    chain = qc.chain
    lines = []
    for t in chain.inputs:
        q = qc.quant_of(t.name)
        lead = (
            "[..., " + ", ".join(t.dims[1:]) + "]" if t.batched else "[" + ", ".join(t.dims) + "]"
        )
        if q is None:
            dtype = t.dtype or "the call's dtype (" + " or ".join(chain.dtypes) + ")"
            lines.append(f"{t.name}: {lead}; {dtype}.")
            continue
        info = dtypes.QUANT_DTYPES[q.dtype]
        k = t.dims[-1]
        if q.dtype == "int4":
            stored = f"[{t.dims[0]}, {k} // 2] uint8, two values a byte along {k}, the even " + (
                "index in the low nibble"
                if q.packing == "low_first"
                else "index in the high nibble"
            )
        else:
            torch_name = info.unsigned_torch if q.zero_point and info.unsigned_torch else info.torch
            stored = f"{lead} {torch_name}"
        values = (
            f"unsigned {info.unsigned_range}"
            if q.zero_point and info.integer
            else f"signed {info.signed_range}" if info.integer else q.dtype
        )
        lines.append(f"{t.name}: {stored}; values {values}.")
        rows = t.dims[0]
        shapes = {
            "tensor": "[1] (or a 0-d tensor)",
            "row": f"[{rows}]" if not t.batched else f"the leading dims of {t.name}",
            "group": f"[{rows}, {k} // {q.group}]",
            "block": f"[cdiv({rows}, {q.rows_per}), {k} // {q.group}]",
        }
        what = SCALE_DOC[q.scale].format(group=q.group, k=k, rows=q.rows_per)
        lines.append(f"{q.scale_name}: {shapes[q.scale]}, fp32, bf16 or fp16: {what}.")
        if q.zero_point:
            lines.append(
                f"{q.zero_name}: {shapes[q.scale]}, uint8: subtracted from {t.name}'s values "
                "before the scale."
            )
    return [w for line in lines for w in textwrap.wrap(line, width, subsequent_indent="    ")]


def cases(qc: QuantChain) -> tuple[list[dict], list[dict]]:
    """Sizes for the dynamic dims: (CPU cases, GPU cases). K is a multiple of every
    group (and even for int4), past the interpreter's BLOCK_K and not a multiple of the
    GPU's largest."""
    chain = qc.chain
    mm = chain.matmul
    unit = math.lcm(
        *[q.group for q in qc.quant if q.group], *[2 for q in qc.quant if q.dtype == "int4"], 1
    )
    if unit == 1:
        k_cpu, k_gpu = [70, 300], [70, 1000, 4099]
    else:
        k_cpu = [unit * m for m in (2, 5)]
        k_gpu = [unit * m for m in (1, 9, 33)]
        k_cpu = [k if k > 16 else k * 8 for k in k_cpu]
    table_cpu = {"row": [1, 37], "col": [70, 300], "k": k_cpu}
    table_gpu = {"row": [1, 77, 3000], "col": [50, 1000, 4097], "k": k_gpu}

    def role(name: str) -> str:
        return "row" if name == chain.row else "k" if name == mm.k else "col"

    return dynamic_cases(chain, table_cpu, role), dynamic_cases(chain, table_gpu, role)


def test_context(qc: QuantChain, header: list[str]) -> dict:
    chain = qc.chain
    mm = chain.matmul
    cpu, gpu = cases(qc)
    bounds = bound_lines(chain)
    roles = {mm.a: "a", mm.b: "b", **{b: "b" for _, b in weights(chain)}}
    return {
        "header": header,
        "name": chain.name,
        "formula": formula(chain),
        "uses_functional": any("F." in line for line in bounds),
        "fast_tanh": fast_tanh(chain),
        "tanh_approx": f"2.0**{ops.TANH_APPROX_EXPONENT}",
        "dtypes_literal": "[" + ", ".join(dtype_literal(d) for d in chain.dtypes) + "]",
        "row": chain.row,
        "col": chain.col,
        "k": mm.k,
        "cases_cpu": repr(cpu),
        "cases_gpu": repr(gpu),
        "test_inputs": [
            {
                "name": t.name,
                "dist": "quantized" if qc.quant_of(t.name) else dist(chain, t),
                "dtype": dtype_literal(t.dtype) if t.dtype in dtypes.DTYPES else "None",
            }
            for t in chain.inputs
        ],
        "roles": repr(roles),
        "ref_args": ", ".join(t.name for t in chain.inputs),
        "bound_lines": bounds,
        "bound_returns": bound_returns(chain),
    }
