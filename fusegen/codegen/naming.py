"""Names of things in generated code, in one place so kernel, launcher and tests agree."""

from __future__ import annotations


def ptr(tensor: str) -> str:
    return f"{tensor}_ptr"


def stride(tensor: str, dim: str) -> str:
    return f"stride_{tensor}_{dim.lower()}"


def offs(dim: str) -> str:
    return f"offs_{dim.lower()}"


def mask(dim: str) -> str:
    return f"mask_{dim.lower()}"


def tile(tensor: str) -> str:
    """The mainloop's loaded tile of a matmul operand."""
    return f"{tensor}_tile"


def column_major(tensor: str) -> str:
    """The TMA kernel's constexpr saying a matmul operand arrived column-major: its unit
    stride along its first dim, as a transposed view (`w.t()`) holds it."""
    return f"{tensor.upper()}_COLUMN_MAJOR"


def view2d(tensor: str) -> str:
    """The launcher's flattened view of an input."""
    return f"{tensor}_2d"


def helper(activation: str) -> str:
    return f"_{activation}"


def kernel_fn(kernel: str) -> str:
    return f"_{kernel}_kernel"


OUT = "out"
ROWS_BUCKET = "ROWS_BUCKET"
# The pointer kernel's split-K scratch (see the kernel's SPLIT_K): partial sums, and
# how many of a tile's programs have stored theirs.
PARTIALS = "partials_ptr"
ARRIVALS = "arrivals_ptr"
