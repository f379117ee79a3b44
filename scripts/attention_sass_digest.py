"""Compile a generated attention module's three kernels (forward, dk/dv, dq; pointer and
TMA loads) for sm_90 on any machine, no GPU needed, and print a digest of each one's
SASS. Where two versions of a module print the same digests, the kernels a GPU runs are
unchanged, and their tuned table can be carried over to the new KERNEL_HASH instead of
tuned again (the digests leave out line numbers, so comments and moved code do not
count). A config ptxas cannot compile prints "failed" for both versions alike.

    python scripts/attention_sass_digest.py generated/llama3_attention.py

With `--hopper`, the same for the runtime's Gluon forward (fusegen/runtime/
attention_hopper.py) at the head dims and masks its modules launch it with:

    python scripts/attention_sass_digest.py --hopper
"""

import contextlib
import hashlib
import io
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

# The constexprs of a typical prefill launch; the 64-bit and other optional paths off.
META = {
    "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_D": 128, "BLOCK_DV": 128, "DOT_UPCAST": False,
    "PRECISION": "tf32", "LENGTHS": False, "RANGES": False, "SPLIT": False, "PACKED": False,
    "FAST_TANH": False, "BIAS_ROW": False, "BIAS_GRAD": False, "INT64": False,
}  # fmt: skip
FP32_POINTERS = ("lse_ptr", "delta_ptr", "part_ptr", "part_lse_ptr", "d_bias_ptr")


def sass_digest(cubin_bytes):
    """Instruction count and a hash of the SASS's instructions (no addresses)."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as folder:
        cubin = os.path.join(folder, "kernel.cubin")
        Path(cubin).write_bytes(cubin_bytes)
        sass = subprocess.run(
            [str(cuobjdump), "-sass", cubin], capture_output=True, text=True, check=True
        ).stdout
    lines = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    ops = [re.sub(r"/\*[0-9a-f]+\*/", "", line).split(";")[0].strip() for line in lines]
    text = "\n".join(ops)
    return f"{len(ops)} instructions, {hashlib.sha256(text.encode()).hexdigest()[:16]}"


def digest(kernel, tma):
    names = [p.name for p in kernel.params]
    meta = {**META, "TMA": tma}
    types, constants = {}, {}
    for i, name in enumerate(names):
        if name in meta:
            types[name], constants[(i,)] = "constexpr", meta[name]
        elif name.endswith("_ptr"):
            types[name] = "*fp32" if name in FP32_POINTERS else "*bf16"
            types[name] = "*i32" if name == "lengths_ptr" else types[name]
        else:
            types[name] = "i32"
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr")}
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # a failure prints all the PTX
            compiled = triton.compile(
                ASTSource(kernel, types, constants, aligned),
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": 4, "num_stages": 3},
            )
    except Exception as exc:  # noqa: BLE001 - ptxas 12.8 crashes on some configs
        return f"failed ({type(exc).__name__})"
    return sass_digest(compiled.asm["cubin"])


# The Gluon forward's launches: (q's head dim, v's, constexprs besides the defaults').
HOPPER_CASES = (
    (128, 128, {"CAUSAL": True, "GROUP": 4}),
    (128, 128, {"CAUSAL": False}),
    (96, 96, {"CAUSAL": True}),
    (192, 128, {"CAUSAL": True}),
    (128, 128, {"CAUSAL": True, "ALIBI": 16}),
    (128, 128, {"CAUSAL": True, "GROUP": 4, "WINDOW": 1024}),
    (64, 64, {"CAUSAL": False, "PERSISTENT": True}),
    (64, 64, {"CAUSAL": True, "GROUP": 4, "PERSISTENT": True, "LONGEST_FIRST": True}),
)
HOPPER_META = {
    "GROUP": 1, "ALIBI": 0, "WINDOW": 0, "PERSISTENT": False, "LONGEST_FIRST": False,
    "REGISTERS": 240, "num_warps": 4,
}  # fmt: skip


def hopper_digest(dim, dv, meta):
    """The runtime's Gluon forward compiled for sm_90 as the runtime launches it."""
    import torch
    from triton.experimental.gluon._runtime import GluonASTSource

    from fusegen.runtime import attention_hopper as ah

    kernel = ah._attention_forward
    q, v = (torch.empty(256, d, dtype=torch.bfloat16) for d in (dim, dv))
    descs, split = ah.tile_args(q, q, v, v, (256, 256), ah.BLOCK_M, ah.BLOCK_N)
    meta = {**HOPPER_META, **meta, **split}
    names = [p.name for p in kernel.params]
    types = {name: "i32" for name in names}
    for name, desc in zip(names, descs, strict=False):  # descriptors first
        types[name] = triton.runtime.jit.mangle_type(desc)
    types |= {n: "*bf16" for n in names if n.endswith("_ptr")}
    types |= {"lse_ptr": "*fp32", "qk_scale": "fp32"}
    types |= {name: "constexpr" for name in meta}
    constants = {(names.index(name),): value for name, value in meta.items()}
    compiled = triton.compile(
        GluonASTSource(kernel, types, constants),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 4},
    )
    return sass_digest(compiled.asm["cubin"])


def main():
    if sys.argv[1] == "--hopper":
        os.environ.pop("TRITON_INTERPRET", None)
        for dim, dv, meta in HOPPER_CASES:
            shown = " ".join(f"{k}={v}" for k, v in meta.items())
            print(f"forward {dim}/{dv} {shown:40} {hopper_digest(dim, dv, meta)}", flush=True)
        return
    path = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for kind in ("forward", "backward_kv", "backward_q"):
        kernel = getattr(module, f"_{path.stem}_{kind}")
        for tma in (False, True):
            print(f"{kind:12} {'tma' if tma else 'pointers':8} {digest(kernel, tma)}", flush=True)


if __name__ == "__main__":
    main()
