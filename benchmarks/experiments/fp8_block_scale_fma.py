"""The block-scaled fp8 SwiGLU (DeepSeek-V3's recipe, generated/deepseek_mlp_fp8.py) with
its per-K-step scales applied in one multiply-add an element, as generated, against two;
and with its tiles loaded through tensor descriptors (TMA).

Triton 3.6 keeps a dot synchronous when another op of the loop reads its result
(dot_waits.py), so the tensor cores wait while a K step's scales multiply the step's
dot; only another program on the same SM can use them meanwhile. Variants:
  one-fma       the module as generated: where BLOCK_N divides the weights' 128-row
                scale blocks, a tile's columns share one weight scale a K step, `s =
                x_scale * w_scale` is a [BLOCK_M] vector and `acc += dot * s[:, None]`
                one FMA an element
  two-multiply  that branch turned off: `acc += dot * x_scale[:, None] * w_scale[None,
                :]`, as the generator wrote it before
  one-fma+tma   one-fma with x's and the weights' tiles loaded through tensor descriptors
                made in the kernel: no pointer tiles in registers (at 64 x 64 x 128 on 4
                warps, 129 registers against 190: three programs an SM, not two)
Each runs at a few explicit configs, in alternating rounds (GPU time of a CUDA graph of
20 calls), each checked against float64 on 128 rows, beside torch's block-wise
`scaled_mm` (cuBLASLt) with the scales laid out as it asks ([M, K/128] column-major for
x, [K/128, N/128] for w); quantized_chains.py times them and prints the table.

    python3 benchmarks/experiments/fp8_block_scale_fma.py --built FOLDER [--rounds 3]
    python3 benchmarks/experiments/fp8_block_scale_fma.py --built FOLDER --registers
        (no GPU: each variant and config compiled for sm_90, ptxas's registers and spills)

FOLDER: `fusegen build specs/quantized.yaml --out FOLDER`.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantized_chains import (  # noqa: E402
    blockwise_swiglu,
    fp8_block_inputs,
    load,
    max_error,
    table,
    timed,
)

CONFIGS = [
    (128, 128, 128, 8, 3),
    (64, 128, 128, 4, 2),
    (128, 64, 128, 4, 4),
    (64, 64, 128, 4, 3),  # QUANT_FP8_STEP_DEFAULT
]
M, K, N = 4096, 7168, 18432


def two_multiply_source(text: str) -> str:
    """The generated module with the one-scale-a-tile branch turned off."""
    branch = "if 128 % BLOCK_N == 0:"
    assert text.count(branch) == 2, "not the block-scaled SwiGLU as generated"
    return text.replace(branch, "if False:")


TILE_LOAD = re.compile(
    r"        (\w+)_tile = tl\.load\(\n"
    r"            \1_ptr \+ offs_(\w)\[:, None\] \* (stride_\w+)"
    r" \+ offs_k\[None, :\] \* stride_\w+,\n"
    r"            mask=[^\n]+,\n"
    r"            other=0\.0,\n"
    r"        \)\n"
)


def tma_source(text: str) -> str:
    """The generated module with x's and the weights' tiles loaded through tensor
    descriptors (TMA) made in the kernel: no pointer tiles in registers, rows past the
    ends read as zeros. Contiguous operands only (the experiment's)."""
    descriptors = []

    def load(match: re.Match) -> str:
        name, dim, stride = match[1], match[2], match[3]
        rows = "M" if dim == "m" else "N"
        descriptors.append(
            f"    {name}_desc = tl.make_tensor_descriptor({name}_ptr, shape=[{rows}, K],"
            f" strides=[{stride}, 1], block_shape=[BLOCK_{rows}, BLOCK_K])\n"
        )
        return f"        {name}_tile = {name}_desc.load([pid_{dim} * BLOCK_{rows}, k * BLOCK_K])\n"

    text, count = TILE_LOAD.subn(load, text)
    assert count == 3, count
    loop = "    for k in range(k_first, k_last):\n"
    assert text.count(loop) == 1
    return text.replace(loop, "".join(descriptors) + loop)


def module_from(text: str, name: str, folder: Path):
    (folder / f"{name}.py").write_text(text)
    return load(folder, name)


def variant_modules(built: Path) -> dict:
    """name -> module: the module as generated ("one-fma") and its edits."""
    text = (built / "deepseek_mlp_fp8.py").read_text()
    folder = Path(tempfile.mkdtemp(dir=built))
    return {
        "one-fma": load(built, "deepseek_mlp_fp8"),
        "two-multiply": module_from(two_multiply_source(text), "deepseek_mlp_fp8_two", folder),
        "one-fma+tma": module_from(tma_source(text), "deepseek_mlp_fp8_tma", folder),
    }


def config_of(cfg: tuple) -> dict:
    block_m, block_n, block_k, warps, stages = cfg
    tiles = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": 8}
    return {**tiles, "num_warps": warps, "num_stages": stages}


def registers(built: Path) -> None:
    """Each variant at each config compiled for sm_90 (no GPU): ptxas's registers and
    spills, and the programs an SM holds by registers."""
    from quant_registers import compile_config, register_line

    for name, module in variant_modules(built).items():
        for cfg in CONFIGS:
            config = config_of(cfg)
            compiled = compile_config(module, module._deepseek_mlp_fp8_kernel, config, M)
            print(f"{name:14s} {cfg}: {register_line(compiled, config['num_warps'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--built", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--registers", action="store_true", help="ptxas's, no GPU")
    args = parser.parse_args()
    if args.registers:
        registers(args.built)
        return
    import triton

    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )
    modules = variant_modules(args.built)
    torch.manual_seed(0)
    x8, xs, wg8, wu8, wgs, wus = fp8_block_inputs(M, K, N)
    rows = slice(0, 128)
    want = modules["one-fma"].reference(
        x8[rows], xs[rows].double(), wg8, wgs.double(), wu8, wus.double(), out_dtype=torch.float64
    )
    variants, errors, notes = {}, {}, []
    for cfg in CONFIGS:
        config = config_of(cfg)
        for name, mod in modules.items():
            # "fusegen ...": table() sets these against the variants that are not ours.
            label = "fusegen {} {}x{}x{} w{} s{}".format(name, *cfg)

            def call(i, fn=mod.deepseek_mlp_fp8, config=config):
                return fn(x8, xs, wg8, wgs, wu8, wus, config=config)

            try:
                errors[label] = max_error(call(0)[rows], want)
            except Exception as exc:  # noqa: BLE001 - a config the GPU refuses is listed
                notes.append(f"{label}: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            variants[label] = call
    try:
        cublas = blockwise_swiglu(x8, xs, wg8, wgs, wu8, wus)
        errors["scaled_mm block-wise + eager"] = max_error(cublas(0)[rows], want)
        variants["scaled_mm block-wise + eager"] = cublas
    except Exception as exc:  # noqa: BLE001 - recorded: why the anchor does not run
        notes.append(f"block-wise scaled_mm: {type(exc).__name__}: {str(exc)[:300]}")
    facts = {"flop": 4 * M * K * N, "shape": f"{M}x{K}->{N}", "errors": errors, "notes": notes}
    print(table({"row": "fp8 block-scaled SwiGLU", **timed(variants, facts, args.rounds)}))


if __name__ == "__main__":
    main()
