"""The decode rows of quantized_chains.py over configs outside the tuning space: tile
widths and split-K counts that put more programs on the GPU (int8 at 16 rows tunes to
448 programs, 0.57 waves, by Nsight Compute), each config's output checked against the
tuned call's (itself checked against float64) and timed on GPU time. int4's BLOCK_K
256 configs are refused by the launcher (a K step over two groups of 128: the first run
of this script found them returning wrong values) and are listed as such.

    python3 benchmarks/experiments/quant_decode_configs.py --built FOLDER
        [--rows int8-decode int4-decode-16] [--out FILE.json]

FOLDER: `fusegen build specs/quantized.yaml benchmarks/specs/anchors.yaml`.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantized_chains import ROWS, graph_ms  # noqa: E402

GRIDS = {
    "int8-decode": [
        dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=1, num_warps=w, num_stages=st, SPLIT_K=sp)
        for bn, bk, w, st, sp in itertools.product(
            (16, 32, 64), (128, 256, 512), (2, 4), (3, 4), (1, 2, 4)
        )
        if not (bn == 64 and w == 2)
    ],
    "int4-decode-16": [
        dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=1, num_warps=4, num_stages=st, SPLIT_K=sp)
        for bn, bk, st, sp in itertools.product((16, 32, 64), (128, 256), (2, 3, 4), (1, 2, 4))
    ],
}
FUNCTIONS = {"int8-decode": "linear_int8", "int4-decode-16": "llama_mlp_int4"}


def sweep(built: Path, row: str) -> dict:
    variants, facts = ROWS[row](built)
    module = sys.modules[FUNCTIONS[row]]
    name = FUNCTIONS[row]
    tuned_fn = getattr(module, name)
    key = next(k for k in variants if k.startswith("fusegen"))
    want = variants[key](0).double()
    print(f"{row}: tuned config {facts['config']}, error {facts['errors'][key]:.1e}", flush=True)
    results = {"tuned": graph_ms(variants[key]), "tuned_config": facts["config"], "configs": {}}
    for config in GRIDS[row]:
        label = json.dumps(config)
        setattr(module, name, functools.partial(tuned_fn, config=config))
        try:
            got = variants[key](0).double()
            diff = ((got - want).abs().max() / want.abs().max()).item()
            if diff > 1e-2:
                results["configs"][label] = f"differs from the tuned call by {diff:.1e}"
                continue
            results["configs"][label] = graph_ms(variants[key])
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is data
            results["configs"][label] = f"{type(exc).__name__}: {str(exc)[:120]}"
    setattr(module, name, tuned_fn)
    ranked = sorted((v, k) for k, v in results["configs"].items() if isinstance(v, float))
    failed = [k for k, v in results["configs"].items() if not isinstance(v, float)]
    print(f"  tuned: {results['tuned'] * 1e3:.1f} us; {len(ranked)} configs ran,"
          f" {len(failed)} failed or differed; fastest:")  # fmt: skip
    for ms, label in ranked[:8]:
        print(f"    {ms * 1e3:7.1f} us  {label}", flush=True)
    for label in failed[:3]:
        print("    failed:", label, results["configs"][label])
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--built", required=True, type=Path)
    parser.add_argument("--rows", nargs="+", default=list(GRIDS), choices=list(GRIDS))
    parser.add_argument("--out")
    args = parser.parse_args()
    sys.path.insert(0, str(args.built))
    out = {}
    with torch.no_grad():
        for row in args.rows:
            out[row] = sweep(args.built, row)
            if args.out:
                Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
