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
