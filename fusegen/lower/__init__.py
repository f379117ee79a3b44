"""Spec -> IR: names resolved, meaning checked, defaults filled, every problem collected
with its location. `lower_file` is the entry point."""

from fusegen.lower.kernels import lower_file

__all__ = ["lower_file"]
