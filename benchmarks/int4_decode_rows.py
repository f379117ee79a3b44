"""The int4 SwiGLU at decode (specs/quantized.yaml's llama_mlp_int4, AWQ-style weights)
at several row counts: its call on the runtime's Gluon kernel (int4_hopper, at every row
count it takes: this script sets FUSEGEN_QUANT_HOPPER=1 and HOPPER_INT4_MIN_ROWS to 1)
against the same call on the generated `tl` kernel (its tuned config: the GEMV at one
row, tiles past a few) and fusegen's bf16 chain on the dequantized weights; GPU time of
CUDA-graph replays in alternating rounds, each call on its own weight copy where they
would otherwise sit in L2. The Gluon kernel runs as the runtime has it and in the variants
of --variants, each int4_hopper's knobs by name (AHEAD=3,STAGES=4,REGISTERS=80). Where the
Gluon kernel starts winning sets the runtime's HOPPER_INT4_MIN_ROWS, and which variant
wins its knobs.

    python3 -m fusegen build specs/quantized.yaml benchmarks/specs/anchors.yaml --out FOLDER
    python3 benchmarks/int4_decode_rows.py --built FOLDER [--rows 1 2 4 8 16] [--k 4096]
        [--n 14336] [--dtype bf16|fp16] [--variants PERMUTE_ROWS=4 X_ROWS=8]
        [--rounds 5]

--dtype: x's, the output's and the bf16 chain's (fp16: AWQ's own, the scales too).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from quantized_chains import copies_for, int4_weights, load, max_error, table, timed

GROUP = 128
# int4_hopper's knobs this script varies.
KNOBS = ("AHEAD", "STAGES", "REGISTERS", "PERMUTE_ROWS", "X_ROWS")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--built", type=Path, required=True)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--n", type=int, default=14336)
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument(
        "--variants",
        nargs="*",
        default=["PERMUTE_ROWS=4", "X_ROWS=8", "PERMUTE_ROWS=4,X_ROWS=8"],
        help="KNOB=VALUE,... (int4_hopper's knobs: " + ", ".join(KNOBS) + ")",
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ["FUSEGEN_QUANT_HOPPER"] = "1"
    module = load(args.built, "llama_mlp_int4")
    bf16 = load(args.built, "anchor_swiglu")
    chain = module._CHAIN
    runtime = sys.modules[type(chain).__module__]
    runtime.HOPPER_INT4_MIN_ROWS = 1
    kernel = sys.modules[runtime.__name__.rsplit(".", 1)[0] + ".int4_hopper"]
    shipped = {name: getattr(kernel, name) for name in KNOBS}
    knobs = [shipped] + [shipped | parsed(v) for v in args.variants]
    gluon_operands = chain.hopper
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    k, n = args.k, args.n
    int4_bytes = 2 * (n * k // 2 + n * (k // GROUP) * 3)  # packed weights, scales, zeros
    copies = copies_for(int4_bytes)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]

    def weights():
        q, packed, scale, zero = int4_weights(n, k, GROUP)
        return q, packed, scale.to(dtype), zero

    sets = [(*weights(), *weights()) for _ in range(copies)]

    def dequant(q, scale, zero):
        s = scale.float().repeat_interleave(GROUP, 1)
        return ((q.float() - zero.float().repeat_interleave(GROUP, 1)) * s).to(dtype)

    bf16_copies = copies_for(2 * n * k * 2)
    dense = [
        (dequant(s[0], s[2], s[3]), dequant(s[4], s[6], s[7]))
        for s in (sets * bf16_copies)[:bf16_copies]
    ]
    for m in args.rows:
        torch.manual_seed(m)
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        _, pg, sg, zg, _, pu, su, zu = sets[0]
        want = module.reference(
            x.double(), pg, sg.double(), zg, pu, su.double(), zu, out_dtype=torch.float64
        )

        def on(operands, knob=shipped, x=x):
            def call(i):
                chain.hopper, chain.plans = operands, {}
                for name, value in knob.items():
                    setattr(kernel, name, value)
                _, pg, sg, zg, _, pu, su, zu = sets[i % copies]
                return module.llama_mlp_int4(x, pg, sg, zg, pu, su, zu)

            return call

        errors, variants = {}, {}
        runs = [(f"fusegen gluon {described(knob)}", on(gluon_operands, knob)) for knob in knobs]
        for name, fn in runs + [("fusegen tl", on(None))]:
            errors[name] = max_error(fn(0), want)
            path = module.last_launch().get("path") or "tl"
            config = module.last_launch()["config"]
            # Each variant's plan is made again at its first call in a round (the path is
            # chosen there): replays keep the kernel it chose.
            variants[f"{name} ({path}, BLOCK_M {config['BLOCK_M']})"] = fn
        variants["bf16 chain"] = lambda i, x=x: bf16.anchor_swiglu(x, *dense[i % bf16_copies])
        nbytes = {v: int4_bytes for v in variants} | {"bf16 chain": 4 * n * k}
        facts = {"shape": f"{m}x{k}->{n} x2, {args.dtype}", "bytes": nbytes, "errors": errors}
        print(table({"row": "int4 SwiGLU at decode", **timed(variants, facts, args.rounds)}))
    chain.hopper, chain.plans = gluon_operands, {}
    for name, value in shipped.items():
        setattr(kernel, name, value)


def parsed(variant: str) -> dict:
    """A --variants entry ("AHEAD=3,STAGES=4") as int4_hopper's knobs."""
    knob = {}
    for part in variant.split(","):
        name, _, value = part.partition("=")
        if name not in KNOBS or not value.isdigit():
            raise SystemExit(f"--variants {variant!r}: KNOB=VALUE,... with KNOB one of {KNOBS}")
        knob[name] = int(value)
    return knob


def described(knob: dict) -> str:
    return (
        f"ahead {knob['AHEAD']} s{knob['STAGES']} r{knob['REGISTERS']}"
        f" permute {knob['PERMUTE_ROWS']} x {knob['X_ROWS']}"
    )


if __name__ == "__main__":
    main()
