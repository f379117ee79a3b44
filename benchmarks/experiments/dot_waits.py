"""Which of a generated kernel's dots Triton leaves in flight on Hopper: the kernel
compiled for sm_90 ahead of time (no GPU), each `ttng.warp_group_dot` of its TTGIR with
the wait that follows it. A dot waited on right after its issue ("waited at once") keeps
the tensor cores idle while the code after it runs; one whose wait comes later ("in
flight") overlaps what comes between.

Triton 3.6's WGMMAPipeline leaves a dot in flight only where, until the loop's first
`wait {pendings = 0}`, its result feeds other dots alone (or ops under an `if`, which
then wait for every dot). So a block-scaled fp8 K step (`acc += dot * scales`) waits at
once; attention's PV dot stays in flight into the next step, until its QK dot's wait.

    python3 benchmarks/experiments/dot_waits.py attention FOLDER MODULE [--variant V]
        [--kernel forward|kv|q] [--config BLOCK_M,BLOCK_N,WARPS,STAGES ...]
    python3 benchmarks/experiments/dot_waits.py quantized MODULE.py [--config ...]

Each compiled kernel's lines end with ptxas's registers and spills (sm_90a) and the
programs an SM holds by registers.

attention: FOLDER holds benchmarks/specs/attention_anchors.yaml built, MODULE one of its
modules, V an attention_variants.py variant (the forward, or the backward's dk/dv or dq
kernel; bf16, TMA loads);
quantized: a generated quantized chain (its tile kernel at each CONFIGS entry with
BLOCK_M > 1, or --config BLOCK_M,BLOCK_N,BLOCK_K,WARPS,STAGES).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quant_registers import compile_config, compile_sm90, load, register_line  # noqa: E402

DOT = re.compile(r"(%[\w.]+) = ttng\.warp_group_dot (?!_wait)")
WAIT = re.compile(r"ttng\.warp_group_dot_wait ([^{]*)\{pendings = (\d+)")


def dot_waits(ttgir: str) -> list[str]:
    """One line per dot: "waited at once" when the next op waits for it with no dot
    left pending, else "in flight"; and the pendings of the first wait naming it."""
    lines = ttgir.splitlines()
    out = []
    for i, line in enumerate(lines):
        found = DOT.search(line)
        if not found:
            continue
        result = found[1]
        kind = "in flight"
        for later in lines[i + 1 :]:
            wait = WAIT.search(later)
            if wait and re.search(rf"{re.escape(result)}\b", wait[1]):
                at_once = later is lines[i + 1] and wait[2] == "0"
                kind = (
                    f"{'waited at once' if at_once else 'in flight'} (its wait: pendings {wait[2]})"
                )
                break
        operand = "registers" if "dot_op<" in line.split("*")[0] else "shared memory"
        out.append(f"dot {len(out) + 1} (A from {operand}): {kind}")
    return out


KERNELS = {"forward": "forward", "kv": "backward_kv", "q": "backward_q"}


def attention(folder: Path, name: str, variant: str, config: tuple[int, ...], kind: str):
    """The attention kernel `kind` of module `name` (as `variant` edits it) compiled."""
    from attention_variants import variant_module

    module = variant_module(folder, name, variant)
    kernel = getattr(module, f"_{name}_{KERNELS[kind]}")
    block_m, block_n, warps, stages = config
    meta = {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_D": triton.next_power_of_2(module.HEAD_DIM),
        "BLOCK_DV": triton.next_power_of_2(module.V_HEAD_DIM),
        "DOT_UPCAST": False,
        "PRECISION": "tf32",
        "LENGTHS": False,
        "RANGES": False,
        "SPLIT": False,
        "INT64": False,
        "BIAS_GRAD": False,
        "BATCH_CHUNK": 1,
        "TMA": bool(getattr(module, "TMA_LOADS", False)),
        "PACKED": False,
        "BIAS_ROW": False,
        "FAST_TANH": True,
    }
    floats = {"lse_ptr", "part_ptr", "part_lse_ptr", "delta_ptr"}
    types, constexprs, hints = {}, {}, {}
    for i, p in enumerate(kernel.params):
        if p.is_constexpr:
            types[p.name] = "constexpr"
            constexprs[(i,)] = meta[p.name]
            continue
        if p.name.endswith("_ptr"):
            pointee = "fp32" if p.name in floats else "i32" if "lengths" in p.name else "bf16"
            types[p.name] = f"*{pointee}"
        else:
            types[p.name] = "i32"
        # As a call at the bench's shapes specializes it: every pointer, length and
        # stride a multiple of 16 (without, loads lose their vector width).
        hints[(i,)] = [["tt.divisibility", 16]]
    options = {"num_warps": warps, "num_stages": stages}
    return compile_sm90(kernel, types, constexprs, options, hints)


def quantized(path: Path, config: dict):
    """The quantized chain's tile kernel compiled at `config`."""
    module = load(path)
    kernel = getattr(module, f"_{path.stem}_kernel")
    return compile_config(module, kernel, config, 4096)


def report(compiled, warps: int) -> list[str]:
    """The dots' waits, then ptxas's registers and spills."""
    lines = dot_waits(compiled.asm["ttgir"])
    return [*lines, register_line(compiled, warps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["attention", "quantized"])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--variant", default="base")
    parser.add_argument("--kernel", choices=list(KERNELS), default="forward", help="attention's")
    parser.add_argument("--config", nargs="+", help="one or more, comma-separated")
    args = parser.parse_args()
    given = [tuple(int(x) for x in c.split(",")) for c in args.config or []]
    if args.kind == "attention":
        folder, name = args.paths[0], str(args.paths[1])
        for config in given or [(128, 128, 8, 3)]:
            print(f"{name} {args.variant} {args.kernel} at {config}:")
            try:
                compiled = attention(folder, name, args.variant, config, args.kernel)
            except Exception as exc:  # noqa: BLE001 - a config the compiler refuses is a result
                print(f"  does not compile: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                continue
            for line in report(compiled, config[2]):
                print(f"  {line}")
        return
    module = load(args.paths[0])
    settings = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
    configs = [dict(zip(settings, c, strict=True), GROUP_M=8) for c in given] or [
        c for c in module.CONFIGS if c["BLOCK_M"] > 1 and c.get("SPLIT_K", 1) == 1
    ]
    for config in configs:
        print(f"{args.paths[0].stem} at {config}:")
        for line in report(quantized(args.paths[0], config), config["num_warps"]):
            print(f"  {line}")


if __name__ == "__main__":
    main()
