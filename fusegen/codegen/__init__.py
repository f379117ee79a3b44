"""IR -> the text of the generated files: kernel modules, their tests, the folder's runtime.

`files` renders and formats whole files; the `*_text` modules write the lines each part
of a kernel needs; the Jinja templates in templates/ only loop and print.
"""

from fusegen.codegen.files import (
    BLACK_MODE,
    RUNTIME_DIR,
    RUNTIME_HASH_PLACEHOLDER,
    kernel_source_hash,
    module_kernel_hash,
    render,
    render_hub,
    render_runtime,
    runtime_digest,
)

__all__ = [
    "BLACK_MODE",
    "RUNTIME_DIR",
    "RUNTIME_HASH_PLACEHOLDER",
    "kernel_source_hash",
    "module_kernel_hash",
    "render",
    "render_hub",
    "render_runtime",
    "runtime_digest",
]
