#!/usr/bin/env bash
# Session 3's recorded run (2026-11-30): the anchor rows of issue 3 plus odd shapes,
# against cuBLASLt, eager and torch.compile; then torch.compile max-autotune-no-cudagraphs
# on the rows where it could matter (small and decode). Launcher tuning at first call,
# no tuned tables (the anchor specs have dynamic dims).
# Usage (GPU machine, pydantic and black on PYTHONPATH): bash benchmarks/gpu_session3_final.sh OUT
set -u
out=${1:-session3-final}
mkdir -p "$out"
timeout 300 python3 -m fusegen bench benchmarks/specs/anchors.yaml \
    --shapes 8192,4096,14336 4096,1024,4096 16,4096,14336 7,4096,14336 1,4096,14336 \
    1000,1000,1000 16384,8192 --compare cublaslt,eager,compile \
    --out "$out/bench" >"$out/bench.txt" 2>"$out/bench.log"
echo "bench exit $?" >>"$out/bench.txt"
timeout 250 python3 -m fusegen bench benchmarks/specs/anchors.yaml --kernels anchor_gelu anchor_swiglu \
    --shapes 4096,1024,4096 16,4096,14336 --compare max-autotune \
    --out "$out/max-autotune" >"$out/max-autotune.txt" 2>"$out/max-autotune.log"
echo "max-autotune exit $?" >>"$out/max-autotune.txt"
cat "$out/bench.txt" "$out/max-autotune.txt"
