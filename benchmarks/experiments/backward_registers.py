"""Registers and spills of a generated row chain's backward kernel per launch config, by
ptxas -v on Triton's PTX for sm_90a, compiled ahead of time: no GPU needed (triton's
wheel carries ptxas). What the kernel's whole-row registers cost before any device time:
the LayerNorm backward at 8192 columns spilled at every config the runtime may pick.

    python3 benchmarks/experiments/backward_registers.py MODULE.py [--block-n 8192]
        [--configs 1x8 2x8 1x16 1x32]

MODULE.py: a generated row chain module (generated/llama_add_rmsnorm.py, or a module of
benchmarks/specs/training.yaml built with `fusegen build ... --out FOLDER`). A config is
BLOCK_Mxnum_warps; every NEED_* flag is on; pointers are bf16 but for the fp32 partial
sums of [cols] gradients. Prints one line per config: registers, stack, spill bytes.
ptxas runs with its defaults, which the driver's JIT of the same PTX may not share: the
figures are leads to measure (benchmarks/backward_configs.py), not timings.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def backward_kernel(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, f"_{path.stem}_kernel_backward"), module._KERNELS


def signature(kernel, kernels) -> dict[str, str]:
    partials = {f"d_{name}_ptr" for name, _, kind in kernels.grads if kind == "row"}
    types = {}
    for name in kernel.arg_names:
        if name.endswith("_ptr"):
            types[name] = "*fp32" if name in partials else "*bf16"
        elif name in ("BLOCK_M", "BLOCK_N", "INT64") or name.startswith("NEED_"):
            types[name] = "constexpr"
        else:
            types[name] = "i32"
    return types


def ptxas_report(ptx: str) -> str:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        Path(source).write_text(ptx)
        command = [str(ptxas), "-v", "--gpu-name=sm_90a", source, "-o", source + ".cubin"]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    lines = (done.stderr + done.stdout).splitlines()
    return " | ".join(
        line.split(":", 1)[-1].strip() for line in lines if "registers" in line or "spill" in line
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", type=Path)
    parser.add_argument("--block-n", type=int, default=8192)
    parser.add_argument("--configs", nargs="+", default=["1x4", "2x4", "1x8", "2x8", "1x16"])
    args = parser.parse_args()
    kernel, kernels = backward_kernel(args.module)
    types = signature(kernel, kernels)
    names = kernel.arg_names
    for config in args.configs:
        block_m, warps = (int(v) for v in config.split("x"))
        values = {n: True for n in names if n.startswith("NEED_")}
        values.update(BLOCK_M=block_m, BLOCK_N=args.block_n, INT64=False)
        constexprs = {(names.index(n),): v for n, v in values.items()}
        source = ASTSource(fn=kernel, signature=types, constexprs=constexprs)
        compiled = triton.compile(
            source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}
        )
        print(
            f"{args.module.stem} BLOCK_N {args.block_n} BLOCK_M {block_m} warps {warps}: "
            f"{ptxas_report(compiled.asm['ptx'])}",
            flush=True,
        )


if __name__ == "__main__":
    main()
