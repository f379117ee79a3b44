"""One call each of the quantized decode kernels, after their tuning, between
cudaProfilerStart and cudaProfilerStop, for Nsight Compute to read their counters:

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section Occupancy --section LaunchStats \
        python3 benchmarks/experiments/profile_quant_decode.py --built FOLDER

FOLDER: `fusegen build specs/quantized.yaml`. Calls: llama_mlp_int4 at 1 and 16 rows,
linear_int8 at 16 rows (the shapes of benchmarks/quantized_chains.py's decode rows);
each prints the path and config the runtime chose (at 16 rows the int4 call takes the
Gluon kernel, int4_hopper, unless --as-tuned forces a `tl` config). Tuning under the
profiler picks other configs than without it (each kernel is serialized and replayed):
--as-tuned runs each call at the config the tuning chose in a normal run (AS_TUNED)
instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quantized_chains import int4_pack, load  # noqa: E402

K, N, GROUP = 4096, 14336, 128
# What the launchers' tuning chose without a profiler, on an H200
# (results/2026-12-03-h200-int4-gemv-words/quantized_decode_words.txt).
AS_TUNED = {
    "llama_mlp_int4 1 rows": {"BLOCK_M": 1, "BLOCK_N": 8, "BLOCK_K": 1024, "GROUP_M": 1,
                              "num_warps": 2, "num_stages": 1},
    "llama_mlp_int4 16 rows": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 1,
                               "num_warps": 4, "num_stages": 4, "SPLIT_K": 2},
    "linear_int8 16 rows": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256, "GROUP_M": 1,
                            "num_warps": 4, "num_stages": 3},
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--built", required=True, type=Path)
    parser.add_argument("--as-tuned", action="store_true", help="each call at AS_TUNED's config")
    args = parser.parse_args()
    sys.path.insert(0, str(args.built))
    int4, int8 = load(args.built, "llama_mlp_int4"), load(args.built, "linear_int8")
    dev = "cuda"

    def int4_weight():
        q = torch.randint(0, 16, (N, K), device=dev)
        scale = ((torch.rand(N, K // GROUP, device=dev) + 0.5) / (6 * K**0.5)).bfloat16()
        zero = torch.randint(0, 16, (N, K // GROUP), device=dev, dtype=torch.uint8)
        return int4_pack(q), scale, zero

    gate, up = int4_weight(), int4_weight()
    w8 = torch.randint(-128, 128, (N, K), device=dev, dtype=torch.int8)
    s8 = (torch.rand(N, device=dev) + 0.5) / (74 * K**0.5)
    b = torch.randn(N, device=dev, dtype=torch.bfloat16)
    calls = []

    def config(name):
        return {"config": AS_TUNED[name]} if args.as_tuned else {}

    for rows in (1, 16):
        x = torch.randn(rows, K, device=dev, dtype=torch.bfloat16)
        name = f"llama_mlp_int4 {rows} rows"
        forced = config(name)
        calls.append((name, int4, lambda x=x, c=forced: int4.llama_mlp_int4(x, *gate, *up, **c)))
    x16 = torch.randn(16, K, device=dev, dtype=torch.bfloat16)
    c8 = config("linear_int8 16 rows")
    calls.append(("linear_int8 16 rows", int8, lambda: int8.linear_int8(x16, w8, s8, b, **c8)))
    with torch.no_grad():
        for name, module, call in calls:
            call()  # tunes
            call()
            launched = module.last_launch()
            print(name, launched.get("path") or "tl", launched["config"], flush=True)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for _, _, call in calls:
            call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
