"""An attention kernel (ir.Attention) -> what its module and test module say: the score
lines each kernel runs between its two dots, the mask, the docs. The templates print."""

from __future__ import annotations


from fusegen.codegen.chain_text import dtype_literal, wrapped_doc
from fusegen.ir import Attention

LOG2E = 1.4426950408889634
# A bias entry at or below it masks its key as the masks do: -inf, and bf16's or fp32's
# finfo.min (transformers' additive masks), which times log2 e would overflow fp32. A
# power of two (about -1e28), so fp32 and float64 compare against the same number.
BIAS_FLOOR = -(2.0**93)
# What a masked score becomes in the forward: finite, so a row that sees none of a block's
# keys gets no inf - inf, and a power of two, so that times the base-2 factor it is exact.
# The probabilities take exp2(scores * factor - max) as one fused multiply-add, whose
# exact product minus the rounded max is 0 only then: -1e30 left the rounding error,
# +8e20 at head dim 64 (exp2 of it inf, out NaN; 80, 112, 192 and 256 too), -1.5e21 at
# 96 and 128 (probabilities 0, which hid it).
MASKED_SCORE = -(2.0**100)

# (BLOCK_M, BLOCK_N, num_warps, num_stages) by head dim, of the forward and of the
# backward's dk/dv and dq kernels, as Triton's fused-attention tutorial tiles them.
# Head dims 64 and 128: the fastest of benchmarks/attention_configs.py's grid on an H200
# (bf16; issue 16's shapes). Head dim 128 takes 128 x 128 tiles with its TMA loads (causal
# 1.166 ms, unmasked 2.063, against 1.202 and 2.261 on 64 x 64), but a softcap (the tanh's
# registers) or a bias tile (shared memory) keeps 64 x 64. Head dim 256: the fastest of
# `fusegen tune` on specs/fused_attention.yaml's gemma2_attention (softcap, causal; H200,
# bf16) at 4 x 4096: forward 1.24 ms against 3.43 on the untuned 64 x 32 x 8 warps, dq 2.1
# against 2.5 (benchmarks/results/2026-12-02-h200-attention-tables); dk/dv 6.45 against
# 9.14 on 3 stages, in the tune of the backward's own space
# (2026-12-02-h200-attention-backward-tune).
# Its forward tiles take 2 stages: 3 need 256 KB of shared memory (the H200 has 227), which
# the launcher's estimate would cut anyway (as Inductor, compiling after a trace, must).
CONFIGS = {64: (64, 64, 4, 3), 128: (64, 64, 4, 3), 256: (128, 64, 8, 2)}
LARGE_TILE_CONFIGS = {128: (128, 128, 8, 3)}
BACKWARD_CONFIGS = {
    64: {"kv": (64, 64, 4, 2), "q": (64, 64, 4, 2)},
    128: {"kv": (64, 64, 4, 2), "q": (64, 64, 4, 2)},
    256: {"kv": (64, 32, 4, 2), "q": (64, 32, 4, 3)},
}
# fp32 calls (4-byte tiles): head dims up to 128 on the 64 x 64 tiles the zoo's fp32 tests
# ran on an H200 (128 x 128 forward tiles would need 192 KB at one stage); 256 on 32 x 32,
# since its 16-bit tiles would need 256 KB at one stage in fp32, over the H200's 227 KB.
# Safe, not tuned: an fp32 table entry (`fusegen tune --dtypes fp32`) takes over.
FP32_CONFIGS = {
    64: {"forward": (64, 64, 4, 3), "kv": (64, 64, 4, 2), "q": (64, 64, 4, 2)},
    128: {"forward": (64, 64, 4, 3), "kv": (64, 64, 4, 2), "q": (64, 64, 4, 2)},
    256: {"forward": (32, 32, 4, 2), "kv": (32, 32, 4, 2), "q": (32, 32, 4, 2)},
}
# Decode (up to 16 queries): 16 query rows a program; the keys split among up to
# SPLIT_PROGRAMS_PER_SM programs per multiprocessor where the query blocks fill under half.
# Head dim 128: the fastest of attention_configs.py's decode grid on an H200 at both decode
# cases (1 x 32 heads x 16384 keys, split; 16 x 32 x 4096, unsplit); 256: gemma2's tune
# (16 x 1 x 4096: 0.134 ms against 0.244 on 16 x 32 x 2 stages); 64 untuned.
DECODE_CONFIGS = {64: (16, 64, 4, 3), 128: (16, 128, 4, 3), 256: (16, 64, 4, 3)}
SPLIT_PROGRAMS_PER_SM = 2
# Where query heads share kv heads, decode packs a group's into one block: fewer, longer
# programs, which ran fastest on 64-key steps on 2 warps, one split program per
# multiprocessor (benchmarks/experiments/decode_split.py, H200, GQA 28/4 at head dim 128:
# 16 x 2048 keys 25.1 us against the MHA defaults' 29.3, 16 x 8192 70.7 against 80.2,
# 64 x 1024 36.8 against 41.0; 1 x 8192, 32 splits either way, within 2%).
PACKED_DECODE_CONFIGS = {**DECODE_CONFIGS, 128: (16, 64, 2, 3)}
PACKED_SPLIT_PROGRAMS_PER_SM = {64: SPLIT_PROGRAMS_PER_SM, 128: 1, 256: SPLIT_PROGRAMS_PER_SM}
# Head dims whose kernels load their per-step tiles (the forward's and dq's K and V, dk/dv's
# q and d_out) through tensor descriptors on Hopper and newer: 128 ran 4-7% faster so on
# an H200 (benchmarks/experiments/attention_variants.py), 64 ran 14% slower; 256 is
# unmeasured.
TMA_HEAD_DIMS = (128,)
TMA_SOURCE = (
    "4-7% faster at head dim 128 on an H200\n"
    "# (fusegen's benchmarks/experiments/attention_variants.py)."
)
CONFIG_SOURCE = (
    "Measured on an H200\n"
    "# (fusegen's benchmarks/attention_configs.py; head dim 256: `fusegen tune`)."
)


def _for_dim(table: dict, att: Attention):
    """The entry of the smallest head dim in `table` that holds the tiles: q and k's
    head dim, or v's where wider."""
    return next(c for d, c in sorted(table.items()) if max(att.head_dim, att.dv) <= d)


def config(att: Attention) -> tuple[int, int, int, int]:
    large = not (att.softcap or att.bias)
    table = {**CONFIGS, **LARGE_TILE_CONFIGS} if large else CONFIGS
    return _for_dim(table, att)


def tma_loads(att: Attention) -> bool:
    """Whether the module's kernels can read their tiles through tensor descriptors (not
    with a v head dim of its own: its tiles are unmeasured)."""
    return att.head_dim in TMA_HEAD_DIMS and att.dv == att.head_dim


# (q and k's head dim, v's) the Hopper forward (runtime/attention_hopper.py) takes: 128,
# where it ran 1.16-1.20x the `tl` forward on an H200, and 96 and 192/128 (MLA), as two
# tiles of the head dim each; 64 on its persistent grid, where the runtime measured it
# faster (runtime/attention.py's hopper_grid: no mask, and causal from 4096 queries).
HOPPER_HEAD_DIMS = ((128, 128), (96, 96), (192, 128), (64, 64))


def hopper_mask(att: Attention) -> str | None:
    """The mask the runtime's Hopper forward runs this module's calls with ("causal" or
    "none"), with ALiBi or a window where the module has them, or None where the
    attention is more than that forward does: a softcap or bias, or head dims it does not
    take (HOPPER_HEAD_DIMS)."""
    if att.softcap or att.bias:
        return None
    if (att.head_dim, att.dv) not in HOPPER_HEAD_DIMS:
        return None
    return "causal" if att.causal else "none"


def decode_config(att: Attention) -> tuple[int, int, int, int]:
    return _for_dim(PACKED_DECODE_CONFIGS if _packs(att) else DECODE_CONFIGS, att)


def split_programs_per_sm(att: Attention) -> int:
    return _for_dim(PACKED_SPLIT_PROGRAMS_PER_SM, att) if _packs(att) else SPLIT_PROGRAMS_PER_SM


def _packs(att: Attention) -> bool:
    """Whether a decode call packs the group's query heads into one block."""
    return att.heads > att.kv_heads


def backward_configs(att: Attention) -> dict[str, tuple[int, int, int, int]]:
    return _for_dim(BACKWARD_CONFIGS, att)


def fp32_configs(att: Attention) -> dict[str, tuple[int, int, int, int]]:
    return _for_dim(FP32_CONFIGS, att)


def score_formula(att: Attention) -> str:
    text = f"{_number(att.scale)} * q @ k.T" if att.scale_given else "q @ k.T / sqrt(head_dim)"
    if att.softcap:
        c = _number(att.softcap)
        text = f"{c} * tanh(({text}) / {c})"
    return text + (" + alibi" if att.alibi else "") + (" + bias" if att.bias else "")


def masks(att: Attention) -> str:
    """The masks in words, '' for none."""
    out = []
    if att.causal:
        out.append("causal")
    if att.window:
        out.append(f"a window of {att.window} keys")
    return ", ".join(out)


def seen(att: Attention, backward: bool, keys_by_rows: bool = False) -> str:
    """Which (row, key) pairs a block's scores keep: keys past the end are never seen
    (nor, in the backward, rows past the end). keys_by_rows: for the dk/dv kernel's
    [keys, rows] blocks, else [rows, keys]."""
    k, r = ("[:, None]", "[None, :]") if keys_by_rows else ("[None, :]", "[:, None]")
    parts = [f"(keys < SKV){k}", f"(keys >= first){k}"]
    if backward:
        parts.append(f"(rows < SQ){r}")
    if att.causal:
        parts.append(f"(keys{k} <= rows{r} + shift)")
    if att.window:
        parts.append(f"(keys{k} > rows{r} + shift - {att.window})")
    return " & ".join(parts)


def reference_seen(att: Attention) -> str:
    parts = []
    if att.causal:
        parts.append("(keys <= rows)")
    if att.window:
        parts.append(f"(keys > rows - {att.window})")
    return " & ".join(parts)


def forward_score_lines(att: Attention) -> list[str]:
    """The forward's scores before `score_factor`: that factor brings them to base 2 (the
    online softmax runs on exp2) inside one fused multiply-add with the row max."""
    if att.softcap:
        lines = [
            "scores = tl.dot(q, k, input_precision=PRECISION)"
            f" * {_number(att.scale / att.softcap)}",
            f"scores = {_number(att.softcap * LOG2E)} * _tanh(scores, FAST_TANH)"
            "  # softcapped, base 2",
        ]
    elif att.alibi or att.bias:
        lines = [
            "scores = tl.dot(q, k, input_precision=PRECISION)"
            f" * {_number(att.scale * LOG2E)}  # in base 2"
        ]
    else:
        return ["scores = tl.dot(q, k, input_precision=PRECISION)"]
    # The forward's slope is per row (a packed block holds several heads).
    return lines + _added_lines(att, "keys[None, :] - rows[:, None]", "alibi_slope[:, None]")


def score_factor(att: Attention) -> str:
    """What the forward's scores are multiplied by to be in base 2: the scale with no
    softcap, ALiBi or bias, else nothing left (their lines applied it)."""
    return "" if att.softcap or att.alibi or att.bias else f" * {_number(att.scale * LOG2E)}"


def _added_lines(att: Attention, distance: str, slope: str = "alibi_slope") -> list[str]:
    """ALiBi's and the bias's terms, in base 2 (the bias tile is loaded as `bias`)."""
    lines = []
    if att.alibi:
        lines.append(f"scores += {slope} * ({distance} - shift)  # ALiBi, in base 2")
    if att.bias:
        lines.append(
            f"scores = tl.where(bias > {_number(BIAS_FLOOR)}, scores + bias * {_number(LOG2E)},"
            f" {_number(MASKED_SCORE)})  # the bias, in base 2; at or below BIAS_FLOOR it masks"
        )
    return lines


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's slope per head: 2**(-8 * (h + 1) / heads) for a power of two; otherwise
    BLOOM's rule: those of the power of two below, then every other one of twice it."""
    below = 1 << (heads.bit_length() - 1)
    slopes = [2.0 ** (-8 * (h + 1) / below) for h in range(below)]
    return slopes + [2.0 ** (-4 * (2 * i + 1) / below) for i in range(heads - below)]


def alibi_slope_expression(att: Attention) -> str:
    """The slope of query head `head` in base 2, as the kernels compute it."""
    below = 1 << (att.heads.bit_length() - 1)
    first = f"tl.exp2(-8.0 * (head + 1) / {below})"
    if below == att.heads:
        return f"{first} * {_number(LOG2E)}"
    rest = f"tl.exp2(-4.0 * (2 * (head - {below}) + 1) / {below})"
    return f"tl.where(head < {below}, {first}, {rest}) * {_number(LOG2E)}"


def backward_score_lines(att: Attention) -> list[str]:
    """The backward's scores in base 2, as the lse it loads (times log2 e), keeping tanh
    for the softcap's derivative."""
    if not att.softcap:
        lines = [
            f"scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)"
            f" * {_number(att.scale * LOG2E)}  # in base 2"
        ]
    else:
        lines = [
            "capped = _tanh(tl.dot(q, tl.trans(k), input_precision=PRECISION)"
            f" * {_number(att.scale / att.softcap)}, FAST_TANH)",
            f"scores = {_number(att.softcap * LOG2E)} * capped  # in base 2",
        ]
    return lines + _added_lines(att, "keys[None, :] - rows[:, None]")


def kv_score_lines(att: Attention) -> list[str]:
    """The backward's scores keys by rows ([BLOCK_N, BLOCK_M]), for dk and dv."""
    return [
        line.replace("tl.dot(q, tl.trans(k),", "tl.dot(k, tl.trans(q),").replace(
            "keys[None, :] - rows[:, None]", "keys[:, None] - rows[None, :]"
        )
        for line in backward_score_lines(att)
    ]


def d_softcap(att: Attention) -> str:
    """The softcap's derivative as a factor of d_scores ('' without one)."""
    return " * (1.0 - capped * capped)" if att.softcap else ""


def _number(value: float) -> str:
    return repr(float(value))


def module_context(att: Attention, header: list[str], op_name: str, doc_width: int) -> dict:
    doc_lines = wrapped_doc(att.doc, doc_width)
    seq_dims = "batch, seq, {h}, " if att.layout == "bshd" else "batch, {h}, seq, "
    return {
        "header": header,
        "name": att.name,
        "doc_lines": doc_lines,
        "layout": att.layout,
        "layout_doc": (seq_dims + "dim").format(h="heads"),
        "layout_doc_q": (seq_dims + "{d}").format(h=att.heads, d=att.head_dim),
        "layout_doc_kv": (seq_dims + "{d}").format(h=att.kv_heads, d=att.head_dim),
        "layout_doc_v": (seq_dims + "{d}").format(h=att.kv_heads, d=att.dv),
        "layout_doc_out": (seq_dims + "{d}").format(h=att.heads, d=att.dv),
        "heads": att.heads,
        "kv_heads": att.kv_heads,
        "group": att.group,
        "head_dim": att.head_dim,
        # v's and out's head dim; the names of its tile, offsets and mask in the kernels
        # (q and k's own where the dims agree, so those kernels read as before).
        "v_head_dim": att.dv,
        "split_v": att.dv != att.head_dim,
        "dv_block": "BLOCK_DV" if att.dv != att.head_dim else "BLOCK_D",
        "dv_offs": "offs_dv" if att.dv != att.head_dim else "offs_d",
        "dv_mask": "mask_dv" if att.dv != att.head_dim else "mask_d",
        "do_mask": "mask_do" if att.dv != att.head_dim else "mask_q",  # d_out's rows
        "v_mask": "mask_v" if att.dv != att.head_dim else "mask_kv",  # v's rows
        "padded_dv": att.dv & (att.dv - 1) != 0,
        "scale": _number(att.scale),
        "scale_default": not att.scale_given,
        "softcap": _number(att.softcap) if att.softcap else None,
        "causal": att.causal,
        "window": att.window,
        "masks": masks(att),
        "score_formula": score_formula(att),
        "alibi": att.alibi,
        "alibi_slopes": "(" + ", ".join(_number(x) for x in alibi_slopes(att.heads)) + ")",
        "alibi_slope": alibi_slope_expression(att) if att.alibi else None,
        "bias": att.bias,
        "bias_arg": ", bias" if att.bias else "",
        "bias_floor": _number(BIAS_FLOOR),
        "masked_score": _number(MASKED_SCORE),
        "dtypes_doc": ", ".join(att.dtypes),
        "dtypes_tuple": "("
        + ", ".join(dtype_literal(d) for d in att.dtypes)
        + ("," if len(att.dtypes) == 1 else "")
        + ")",
        "config": config(att),
        "backward_configs": backward_configs(att),
        "decode_config": decode_config(att),
        "fp32_configs": fp32_configs(att),
        "split_programs_per_sm": split_programs_per_sm(att),
        "config_source": CONFIG_SOURCE,
        "tma": tma_loads(att),
        "hopper": hopper_mask(att),
        "tma_source": TMA_SOURCE,
        "log2e": _number(LOG2E),
        "score_lines": forward_score_lines(att),
        "score_factor": score_factor(att),
        "padded_d": att.head_dim & (att.head_dim - 1) != 0,
        "score_lines_bwd": backward_score_lines(att),
        "seen": seen(att, backward=False),
        "seen_bwd": seen(att, backward=True),
        "seen_kv": seen(att, backward=True, keys_by_rows=True),
        "score_lines_kv": kv_score_lines(att),
        "reference_seen": reference_seen(att),
        "d_softcap": d_softcap(att),
        "op_name": op_name,
        "lse": True,
    }
