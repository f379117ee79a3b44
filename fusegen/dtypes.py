"""The element types a spec can name, and what codegen needs to know about each."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # the spec's spelling
    torch: str  # attribute of the torch module
    bytes: int
    # Unit roundoff (half an ulp at 1.0) of a value rounded to this type: 2**-precision.
    unit_roundoff: str


DTYPES = {
    "fp32": DType("fp32", "float32", 4, "2.0**-24"),
    "fp16": DType("fp16", "float16", 2, "2.0**-11"),
    "bf16": DType("bf16", "bfloat16", 2, "2.0**-8"),
}

ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "bfloat16": "bf16",
}


def canonical(name: str) -> str | None:
    """The spec name for `name` (accepting torch's spellings), or None if unknown."""
    if name in DTYPES:
        return name
    return ALIASES.get(name)


# Integer inputs: a loss head's labels (class indices), never computed on.
INDEX_DTYPES = {"int64": "int64", "int32": "int32"}
INDEX_ALIASES = {"long": "int64", "int": "int32", "i64": "int64", "i32": "int32"}


def canonical_index(name: str) -> str | None:
    """The spec name of an integer dtype `name`, or None."""
    return INDEX_DTYPES.get(name) or INDEX_ALIASES.get(name)


@dataclass(frozen=True)
class QuantDType:
    """A quantized input's storage: what its tensor holds, and the values it stands for."""

    name: str  # the spec's spelling
    torch: str  # attribute of the torch module: the stored tensor's dtype
    bits: int
    integer: bool
    # The stored values' range: signed without a zero point, unsigned with one.
    signed_range: tuple[int, int] | None
    unsigned_range: tuple[int, int] | None
    unsigned_torch: str | None = None  # the stored dtype with a zero point, where it differs


QUANT_DTYPES = {
    "int8": QuantDType("int8", "int8", 8, True, (-128, 127), (0, 255), "uint8"),
    # Two a byte along K; signed nibbles in two's complement, or unsigned with a zero point.
    "int4": QuantDType("int4", "uint8", 4, True, (-8, 7), (0, 15)),
    "fp8_e4m3": QuantDType("fp8_e4m3", "float8_e4m3fn", 8, False, None, None),
    "fp8_e5m2": QuantDType("fp8_e5m2", "float8_e5m2", 8, False, None, None),
}
QUANT_ALIASES = {
    "float8_e4m3fn": "fp8_e4m3",
    "e4m3": "fp8_e4m3",
    "fp8": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "e5m2": "fp8_e5m2",
}


def canonical_quant(name: str) -> str | None:
    """The spec name of a quantized storage dtype `name`, or None."""
    return name if name in QUANT_DTYPES else QUANT_ALIASES.get(name)
