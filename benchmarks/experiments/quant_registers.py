"""Registers and spills of a generated quantized chain's kernel per config, by ptxas -v on
Triton's PTX for sm_90a, compiled ahead of time: no GPU needed. Registers bound how many
programs an SM holds (65,536 a SM): Nsight Compute put the int4 decode kernels at 122-128
registers and 25% theoretical occupancy (benchmarks/RESULTS.md, "What bounds the decode
kernels now"); this shows a kernel change's effect on them before any device time.

    python3 benchmarks/experiments/quant_registers.py MODULE.py [--rows 1]
        [--gemv-only] [--mix]

MODULE.py: a generated quantized chain module (generated/llama_mlp_int4.py,
generated/linear_int8.py). Every config of its CONFIGS (--gemv-only: those with BLOCK_M
1) is compiled as a launch on contiguous tensors specializes it: each tensor's last
stride and a one-row call's rows are the constant 1 (Triton compiles an int argument of
1 as a constant), every pointer and other int divisible by 16 (the bench shapes'), bf16
activations, fp32 scales. Without those hints the kernel loses its vector loads and
ptxas reports 40-60 registers more than Nsight Compute read on the H200. One line per
config: registers, stack, spills, and the programs an SM holds by registers; --mix adds
the kernel's instruction mix (nvdisasm's SASS, the most frequent opcodes; the K loop is
most of it): how many instructions a change saves, and of which kind (I2F, the
int-to-float conversion, issues at a quarter of the FMA rate). As backward_registers.py
says: ptxas defaults, leads to measure, not timings.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backward_registers import ptxas_report  # noqa: E402

STORED = {"int8": ("i8", "u8"), "int4": ("u8", "u8"), "fp8_e4m3": ("fp8e4nv",) * 2}


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def last_strides(names: list[str]) -> set[str]:
    """Each tensor's last stride parameter (1 for contiguous tensors): a kernel lists a
    tensor's strides together, `stride_<tensor>_<dim>`."""
    strides = [n for n in names if n.startswith("stride_")]
    tensors = [n.rsplit("_", 1)[0] for n in strides]
    return {
        s for i, s in enumerate(strides) if i + 1 == len(strides) or tensors[i + 1] != tensors[i]
    }


def signature(module, kernel, row: str, rows: int) -> tuple[dict, dict, dict]:
    """Per parameter its Triton type ("constexpr" for meta-parameters, each tensor's last
    stride and a one-row call's rows), the values of the fixed constexprs, and the
    divisibility hints of the rest."""
    stored = {}
    for name, q in module.QUANT.items():
        stored[f"{name}_ptr"] = STORED[q.dtype][int(q.zero_point)]
        stored.update({f"{name}_scale_ptr": "fp32", f"{name}_zero_ptr": "u8"})
    stored.update(partials_ptr="fp32", arrivals_ptr="i32")
    fixed = {"INT64": False, "DOT_DTYPE": tl.bfloat16, "FAST_TANH": True}
    names = [p.name for p in kernel.params]
    fixed.update({n: 1 for n in last_strides(names)})
    if rows == 1:
        fixed[row] = 1
    types, hints = {}, {}
    for i, p in enumerate(kernel.params):
        if p.is_constexpr or p.name in fixed:
            types[p.name] = "constexpr"
            continue
        types[p.name] = "*" + stored.get(p.name, "bf16") if p.name.endswith("_ptr") else "i32"
        hints[(i,)] = [["tt.divisibility", 16]]
    return types, fixed, hints


def instruction_mix(cubin: bytes, most: int = 10) -> str:
    """The most frequent SASS opcodes of a compiled kernel, with their counts."""
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        Path(path).write_bytes(cubin)
        sass = subprocess.run([str(nvdisasm), "-c", path], capture_output=True, text=True)
    ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T] )?([A-Z0-9]+)", sass.stdout, re.M)
    common = collections.Counter(ops).most_common(most)
    return f"{len(ops)} instructions: " + ", ".join(f"{n} {op}" for op, n in common)


def compile_sm90(kernel, types: dict, constexprs: dict, options: dict, attrs=None):
    """A @triton.jit or @gluon.jit kernel compiled ahead of time for sm_90 (no GPU
    needed)."""
    source_type = ASTSource
    if type(kernel).__name__ == "GluonJITFunction":
        from triton.experimental.gluon._runtime import GluonASTSource as source_type
    source = source_type(kernel, types, constexprs, attrs or {})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def compile_config(module, kernel, config: dict, rows: int):
    """The kernel compiled for sm_90 at `config` (the launch of a contiguous call of
    `rows` rows, as signature() says)."""
    types, fixed, hints = signature(module, kernel, module.ROW, rows)
    names = [p.name for p in kernel.params]
    meta = {"SPLIT_K": 1, **{k: v for k, v in config.items() if k.isupper()}, **fixed}
    options = {k: v for k, v in config.items() if not k.isupper()}
    constexprs = {(names.index(n),): v for n, v in meta.items() if n in names}
    return compile_sm90(kernel, types, constexprs, options, hints)


def register_line(compiled, warps: int) -> str:
    """ptxas's report of a compiled kernel and the programs an SM holds by registers."""
    report = ptxas_report(compiled.asm["ptx"])
    registers = int(report.split("Used ")[1].split(" registers")[0])
    # Registers are allocated per warp in units of 256 (8 a thread), 65,536 a SM.
    per_program = -(-registers // 8) * 8 * 32 * warps
    return f"{report} | {65536 // per_program} programs an SM by registers"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", type=Path)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--gemv-only", action="store_true")
    parser.add_argument("--mix", action="store_true", help="the SASS instruction mix too")
    args = parser.parse_args()
    module = load(args.module)
    kernel = getattr(module, f"_{args.module.stem}_kernel")
    for config in module.CONFIGS:
        if args.gemv_only and config["BLOCK_M"] != 1:
            continue
        compiled = compile_config(module, kernel, config, args.rows)
        print(f"{config}: {register_line(compiled, config['num_warps'])}", flush=True)
        if args.mix:
            print(f"    {instruction_mix(compiled.asm['cubin'])}", flush=True)


if __name__ == "__main__":
    main()
