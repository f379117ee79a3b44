"""The block-scaled fp8 SwiGLU (specs/quantized.yaml's deepseek_mlp_fp8) at several row
counts: its call on the runtime's Gluon kernel (quant_hopper, at every shape: this script
sets its HOPPER_MIN_ROWS and HOPPER_MIN_WAVES to none) against the same call on the `tl`
kernel (its tuned config) and cuBLASLt's block-wise scaled_mm + an eager SwiGLU; GPU time
of CUDA-graph replays in alternating rounds. Where the Gluon kernel stops winning sets the
runtime's HOPPER_MIN_ROWS (--n 2048, a DeepSeek-V3 expert's columns: HOPPER_MIN_WAVES).

    python3 -m fusegen build specs/quantized.yaml --out FOLDER
    python3 benchmarks/fp8_block_rows.py --built FOLDER [--rows 16 128 512 2048 4096]
        [--k 7168] [--n 18432] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from quantized_chains import blockwise_swiglu, fp8_block_inputs, load, max_error, table, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--built", type=Path, required=True)
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 128, 512, 2048, 4096])
    parser.add_argument("--k", type=int, default=7168)
    parser.add_argument("--n", type=int, default=18432)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.pop("FUSEGEN_QUANT_HOPPER", None)
    module = load(args.built, "deepseek_mlp_fp8")
    chain = module._CHAIN
    runtime = sys.modules[type(chain).__module__]
    runtime.HOPPER_MIN_ROWS, runtime.HOPPER_MIN_WAVES = 1, 0
    gluon_operands = chain.hopper
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for m in args.rows:
        torch.manual_seed(m)
        x8, xs, wg8, wu8, wgs, wus = fp8_block_inputs(m, args.k, args.n)
        rows = slice(0, min(m, 256))
        want = module.reference(
            x8[rows], xs[rows].double(), wg8, wgs.double(), wu8, wus.double(),
            out_dtype=torch.float64,
        )  # fmt: skip

        tensors = (x8, xs, wg8, wgs, wu8, wus)

        def on(operands, tensors=tensors):
            def call(i):
                chain.hopper, chain.plans = operands, {}
                return module.deepseek_mlp_fp8(*tensors)

            return call

        gluon, tl = on(gluon_operands), on(None)
        errors, variants = {}, {}
        for name, fn in (("fusegen gluon", gluon), ("fusegen tl", tl)):
            errors[name] = max_error(fn(0)[rows], want)
            path = module.last_launch().get("path") or "tl"
            # Each variant's plan is made again at its first call in a round (the path is
            # chosen there): replays keep the kernel it chose.
            variants[f"{name} ({path})"] = fn
        cublas = blockwise_swiglu(x8, xs, wg8, wgs, wu8, wus)
        errors["scaled_mm block-wise + eager"] = max_error(cublas(0)[rows], want)
        variants["scaled_mm block-wise + eager"] = cublas
        facts = {"flop": 4 * m * args.k * args.n, "shape": f"{m}x{args.k}->{args.n}"}
        print(table({"row": "fp8 block-scaled SwiGLU", **timed(variants, facts, args.rounds)}))
        for name, error in errors.items():
            print(f"  max error vs float64 / max |out|: {name} {error:.2e}")
    chain.hopper, chain.plans = gluon_operands, {}


if __name__ == "__main__":
    main()
