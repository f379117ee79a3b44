"""The spec's shape, as pydantic models: what fields exist and what type each holds.

Nothing here knows about kernels or output. Meaning (which tensors exist, whether a
matmul's dims agree, which ops are known) is checked when the spec is lowered to the IR
(`fusegen.lower.kernels`); chain steps are kept as raw YAML values here for that reason.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag

from fusegen import dtypes
from fusegen.errors import did_you_mean


def _dtype_name(value: Any) -> str:
    name = dtypes.canonical(value) if isinstance(value, str) else None
    if name is None:
        valid = ", ".join(dtypes.DTYPES)
        raise ValueError(f"unknown dtype {value!r}; valid: {valid}")
    return name


def _input_dtype_name(value: Any) -> str:
    if isinstance(value, str):
        for canonical in (dtypes.canonical_index, dtypes.canonical_quant, dtypes.canonical):
            name = canonical(value)
            if name is not None:
                return name
    valid = ", ".join(dtypes.DTYPES)
    labels = ", ".join(dtypes.INDEX_DTYPES)
    quant = ", ".join(dtypes.QUANT_DTYPES)
    raise ValueError(
        f"unknown dtype {value!r}; valid: {valid} ({labels}: labels; {quant}: quantized, "
        "with a scale)"
    )


def _dim_size(value: Any) -> Any:
    if value == "dynamic" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ValueError(f"a dim is a positive integer or 'dynamic', not {value!r}")


def _input_shorthand(value: Any) -> Any:
    # `x: [M, K]` is short for `x: {shape: [M, K]}`.
    return {"shape": value} if isinstance(value, list) else value


DTypeName = Annotated[
    Literal["fp32", "fp16", "bf16"],
    BeforeValidator(_dtype_name),
]
# An input may also hold integers (a cross_entropy step's labels) or quantized values
# (a matmul operand with its scales).
InputDTypeName = Annotated[
    Literal["fp32", "fp16", "bf16", "int64", "int32", "int8", "int4", "fp8_e4m3", "fp8_e5m2"],
    BeforeValidator(_input_dtype_name),
]
DimSize = Annotated[Union[Literal["dynamic"], int], BeforeValidator(_dim_size)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PerGroupScale(_Strict):
    per_group: int = Field(
        gt=0,
        le=2**20,
        description="one scale for each run of this many values along K, per row (a "
        "multiple of 16)",
        strict=True,
    )


BlockSide = Annotated[int, Field(gt=0, le=2**20)]


def _block_sides(value: Any) -> Any:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"per_block is [rows, K], two numbers (e.g. [128, 128]); got {value!r}")
    return value


class PerBlockScale(_Strict):
    per_block: Annotated[tuple[BlockSide, BlockSide], BeforeValidator(_block_sides)] = Field(
        description="one scale for each [rows, K] block (DeepSeek-V3's [128, 128]; K's a "
        "multiple of 16)"
    )


SCALE_NAMES = ("per_tensor", "per_row", "per_channel")
SCALE_FORMS = "per_tensor, per_row, per_channel, {per_group: G}, {per_block: [R, G]}"


def _scale_form(value: Any) -> Any:
    """One error for a scale of no known form (a union would give one per member)."""
    if isinstance(value, str) and value not in SCALE_NAMES:
        raise ValueError(
            f"unknown scale '{value}'{did_you_mean(value, SCALE_NAMES)} (valid: {SCALE_FORMS})"
        )
    kinds = ("per_group", "per_block")
    if isinstance(value, dict) and (len(value) != 1 or set(value) - set(kinds)):
        keys = ", ".join(map(str, value)) or "none"
        near = "".join(did_you_mean(str(k), kinds) for k in value if k not in kinds)
        raise ValueError(f"a scale mapping has one key, per_group or per_block; got {keys}{near}")
    if not isinstance(value, (str, dict)):
        raise ValueError(f"a scale is one of {SCALE_FORMS}; got {value!r}")
    return value


def _scale_tag(value: Any) -> str:
    """Which form validates the scale (after _scale_form): only that form's errors show."""
    return "name" if isinstance(value, str) else next(iter(value))


ScaleKind = Annotated[
    Union[
        Annotated[Literal["per_tensor", "per_row", "per_channel"], Tag("name")],
        Annotated[PerGroupScale, Tag("per_group")],
        Annotated[PerBlockScale, Tag("per_block")],
    ],
    Discriminator(_scale_tag),
    BeforeValidator(_scale_form),
]


class InputSpec(_Strict):
    """One input tensor. `x: [M, K]` is short for `x: {shape: [M, K]}`."""

    shape: list[str] = Field(min_length=1, max_length=2, description="dim names, outermost first")
    dtype: InputDTypeName | None = Field(
        None,
        description="pin this input's dtype; unpinned inputs take the call's dtype "
        "(int64 / int32: a cross_entropy step's labels; int8, int4, fp8_e4m3, fp8_e5m2: a "
        "quantized matmul operand, with `scale`)",
    )
    scale: ScaleKind | None = Field(
        None,
        description="a quantized input's scales, the launcher's `<name>_scale` argument: "
        "per_tensor (one), per_row (one per row: per_channel of a [N, K] weight), "
        "{per_group: G} (one per G values along K, per row), {per_block: [R, G]}",
    )
    zero_point: bool = Field(
        False,
        description="int8 / int4: the values are unsigned, and a `<name>_zero` argument "
        "(uint8, the scales' shape) holds what is subtracted before scaling (AWQ, GPTQ)",
        strict=True,
    )
    packing: Literal["low_first", "high_first"] | None = Field(
        None,
        description="int4: which nibble of a byte holds the even K index (default "
        "low_first: bits 0-3)",
    )
    doc: str = ""


class FallbackSpec(_Strict):
    """When the launcher runs the PyTorch reference instead of the Triton kernel."""

    no_gpu: Literal["reference", "error"] = Field(
        "reference",
        description="inputs not on a CUDA device and the Triton interpreter off: "
        "run the reference (with one log line) or raise",
    )
    nonfinite: Literal["off", "reference"] = Field(
        "off",
        description="'reference': after each launch, check the output for inf/NaN and, where "
        "the stepwise reference is finite there, return the reference (costs a check per call; "
        "skipped while a CUDA graph is captured, which cannot wait for it)",
    )


class ConfigSpec(_Strict):
    """One kernel configuration: block sizes and launch options."""

    BLOCK_M: int | None = None
    BLOCK_N: int | None = None
    BLOCK_K: int | None = None
    GROUP_M: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    FLATTEN: int | None = Field(None, description="TMA kernel: one pipeline over tiles and K (0/1)")
    WARP_SPECIALIZE: int | None = Field(None, description="TMA kernel: warp-specialize (0/1)")
    EPILOGUE_SUBTILE: int | None = Field(
        None, description="TMA kernel: store the output tile in two halves (0/1)"
    )
    matrix_instr_nonkdim: int | None = Field(
        None, description="amd: the MFMA instruction's M/N size, 16 or 32 (0: the compiler picks)"
    )
    waves_per_eu: int | None = Field(
        None, description="amd: wavefronts per execution unit to aim for, 0 (no hint) to 8"
    )
    kpack: int | None = Field(None, description="amd: K elements packed per MFMA operand, 1 or 2")
    SPLIT_K: int | None = Field(
        None,
        description="pointer kernel: programs that share one output tile, each summing a slice "
        "of K, added in a fixed order (a power of two, 1 to 16; for small M)",
    )


class AutotuneSpec(_Strict):
    profile: Literal["general", "training", "inference"] = Field(
        "general",
        description="biases the built-in space: 'training' keeps large tiles (throughput), "
        "'inference' small row tiles and deeper pipelines (latency, decode-sized M); "
        "'general' keeps both",
    )
    configs: list[ConfigSpec] | None = Field(
        None, min_length=1, description="replace the default config space"
    )
    default: ConfigSpec | None = Field(
        None, description="the config used where tuning cannot run (missing fields: built-in)"
    )


# Chain steps are checked against the op registry when lowering; the JSON Schema
# describes them from the registry too (fusegen.spec.schema).
ChainStep = Any


class BackwardSpec(_Strict):
    """What a training call's forward keeps for the backward."""

    save: Literal["accumulators", "inputs"] | None = Field(
        None,
        description="'accumulators' (matmul chains' default): the kernel also stores each "
        "matmul's output before the epilogue (one [rows, cols] store per matmul, no "
        "recompute); 'inputs': keep only the inputs and recompute the matmuls in the backward "
        "(cuBLAS: no extra memory, one more matmul per weight). Row and elementwise chains "
        "always keep their inputs (their backward reads them again)",
    )


class CrossEntropySpec(_Strict):
    """A loss head's last step: cross-entropy over the matmul's columns (the vocabulary)."""

    labels: str = Field(description="the input holding one class index a token ([T], int64/int32)")
    ignore_index: int = Field(
        -100,
        description="tokens with this label add no loss and no gradient (padding)",
        strict=True,
    )
    reduction: Literal["mean", "sum", "none"] = Field(
        "mean",
        description="'mean' over the tokens not ignored (as F.cross_entropy), 'sum', or "
        "'none': one loss a token (0 where ignored)",
    )
    label_smoothing: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="the target mixes 1 - label_smoothing of the label with label_smoothing "
        "spread over the vocabulary (F.cross_entropy's)",
        strict=True,
    )
    z_loss: float = Field(
        0.0,
        ge=0.0,
        description="adds z_loss * lse**2 a token (PaLM's z-loss; 1e-4 is common)",
        strict=True,
        allow_inf_nan=False,
    )
    lse: bool = Field(
        False,
        description="also return each token's log-sum-exp of the logits ([T], fp32)",
        strict=True,
    )


class KernelSpec(_Strict):
    """One fused kernel: its dims, inputs and the chain of ops that makes its output."""

    name: str = Field(description="a Python identifier; names the generated module and launcher")
    doc: str = ""
    dims: dict[str, DimSize] = Field(min_length=1)
    dtypes: list[DTypeName] = Field(default=["bf16", "fp16", "fp32"], min_length=1)
    inputs: dict[str, Annotated[InputSpec, BeforeValidator(_input_shorthand)]] = Field(min_length=1)
    chain: list[ChainStep] = Field(min_length=1)
    target: Literal["nvidia", "amd"] = Field(
        "nvidia",
        description="the GPUs to generate for: 'nvidia' (a TMA kernel for Hopper and newer "
        "beside the portable one) or 'amd' (ROCm configs: matrix_instr_nonkdim, waves_per_eu, "
        "kpack; no TMA kernel)",
    )
    fp32_matmul: Literal["tf32", "tf32x3", "ieee"] | None = Field(
        None,
        description="how a matmul on fp32 inputs runs: tf32 tensor cores (fast, 1e-4 to 1e-3 "
        "relative error), tf32x3 (three tf32 products of split operands: fp32-level error at "
        "tensor-core speed) or fp32 FMAs (ieee). Default on nvidia: PyTorch's own setting at "
        "each call (torch.set_float32_matmul_precision 'highest' -> tf32x3, 'high' or "
        "'medium' -> tf32), as torch.compile does; on amd: ieee",
    )
    fallback: FallbackSpec = FallbackSpec()
    backward: BackwardSpec = BackwardSpec()
    autotune: AutotuneSpec | None = None
    fast_tanh: bool = Field(
        True,
        description="on NVIDIA GPUs, where every output is bf16 or fp16, run the "
        "activations built on tanh or sigmoid (gelu_tanh, silu, sigmoid, tanh, quick_gelu, "
        "mish) on the GPU's tanh.approx instruction: half the special-function work of the "
        "exp-based form, an error under 2**-10 of tanh's value. false: the exp-based form "
        "always (fp32 outputs, AMD GPUs and the interpreter always use it)",
        strict=True,
    )
    deterministic: bool = Field(
        False,
        description="never tune at run time: launch the tuned table's config (see `fusegen "
        "tune`) or the default, so every run of a shape takes the same accumulation order",
        strict=True,
    )


class AttentionSpec(_Strict):
    """What an attention kernel computes: softmax(scale * q @ k.T, softcapped, masked) @ v."""

    layout: Literal["bshd", "bhsd"] = Field(
        description="q, k, v and out as [batch, seq, heads, head_dim] (transformers, "
        "flash-attn) or [batch, heads, seq, head_dim] (F.scaled_dot_product_attention)"
    )
    heads: int = Field(gt=0, le=1024, description="query heads", strict=True)
    kv_heads: int | None = Field(
        None,
        gt=0,
        le=1024,
        description="key/value heads, dividing `heads` (grouped-query attention; 1: "
        "multi-query); default: `heads`",
        strict=True,
    )
    head_dim: int = Field(
        description="q, k and v's last dim: a multiple of 16, up to 256", strict=True
    )
    v_head_dim: int | None = Field(
        None,
        description="v's and out's last dim where it differs from q and k's (MLA: 192 for "
        "q and k, 128 for v); a multiple of 16, up to 256; default: head_dim",
        strict=True,
    )
    scale: float | None = Field(
        None,
        description="the scores' factor, default 1 / sqrt(head_dim)",
        strict=True,
        allow_inf_nan=False,
        ge=1e-6,
        le=1e6,
    )
    softcap: float | None = Field(
        None,
        gt=0,
        description="scores -> softcap * tanh(scores / softcap), after the scale (Gemma 2)",
        strict=True,
        allow_inf_nan=False,
        le=1e6,
    )
    causal: bool = Field(
        False,
        description="a query sees the keys up to its own position; with fewer queries than "
        "keys, the last query stands at the last key (a KV cache)",
        strict=True,
    )
    window: int | None = Field(
        None,
        gt=0,
        description="sliding window (Mistral): a query sees only its `window` most recent "
        "keys, its own included; with causal",
        strict=True,
        lt=2**30,
    )
    alibi: bool = Field(
        False,
        description="ALiBi (BLOOM, MPT): each head's scores get slope * (key - query "
        "position), the slopes 2**(-8 * (h + 1) / heads) (BLOOM's rule for heads not a "
        "power of two); with causal",
        strict=True,
    )
    bias: bool = Field(
        False,
        description="an additive bias input, added to the scores after the scale and "
        "softcap: [batch, heads, q_len, k_len] or any shape that broadcasts to it (T5's "
        "relative positions, transformers' additive masks); an entry at or below -2**93 "
        "(about -1e28: -inf, bf16's or fp32's finfo.min) masks its key; its gradient when "
        "it requires grad",
        strict=True,
    )


class AttentionKernelSpec(_Strict):
    """A fused attention kernel (flash-style: the scores never reach memory)."""

    name: str = Field(description="a Python identifier; names the generated module and launcher")
    doc: str = ""
    dtypes: list[DTypeName] = Field(default=["bf16", "fp16"], min_length=1)
    attention: AttentionSpec


class SpecFile(_Strict):
    """A spec file: one or more kernels."""

    version: Literal[1] = 1
    # A kernel with an `attention:` field is an attention kernel (lower.lower_file).
    kernels: list[Union[AttentionKernelSpec, KernelSpec]] = Field(min_length=1)


TOP_LEVEL_KEYS = tuple(SpecFile.model_fields)
