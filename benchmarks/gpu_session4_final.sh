#!/usr/bin/env bash
# Session 4's recorded run (2026-11-30): every generated test on the GPU, then issue 3's
# anchor rows plus odd shapes against cuBLASLt, eager and torch.compile (bf16; launcher
# tuning at first call: the anchor specs have dynamic dims, so no tuned tables).
# Usage (GPU machine, pydantic and black on PYTHONPATH): bash benchmarks/gpu_session4_final.sh OUT
set -u
out=${1:-session4-final}
mkdir -p "$out"
timeout 220 python3 -m pytest generated -q -p no:cacheprovider >"$out/tests.txt" 2>&1
echo "tests exit $?" >>"$out/tests.txt"
tail -2 "$out/tests.txt"
timeout 340 python3 -m fusegen bench benchmarks/specs/anchors.yaml \
    --shapes 8192,4096,14336 4096,1024,4096 16,4096,14336 7,4096,14336 1,4096,14336 \
    1000,1000,1000 16384,8192 --compare cublaslt,eager,compile \
    --out "$out/bench" >"$out/bench.txt" 2>"$out/bench.log"
echo "bench exit $?" >>"$out/bench.txt"
cat "$out/bench.txt"
