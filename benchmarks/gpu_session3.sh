#!/usr/bin/env bash
# Session 3's first GPU batch (2026-11-30): is the direct launch right and how much
# does it save; what do the decode rows cost on the GPU alone (graph timer); does
# tuning with the graph timer reproduce (gpt2_mlp_up at 4096 rows, three times).
# Usage (GPU machine, pydantic and black on PYTHONPATH): bash benchmarks/gpu_session3.sh OUT
set -u
out=${1:-session3}
mkdir -p "$out"
bash benchmarks/gpu_direct_launch.sh "$out/direct" >"$out/direct.txt" 2>&1
for timer in graph; do
    FUSEGEN_DIRECT_LAUNCH=1 timeout 150 python3 -m fusegen bench benchmarks/specs/anchors.yaml \
        --kernels anchor_gelu anchor_swiglu --shapes 1,4096,14336 7,4096,14336 16,4096,14336 \
        4096,1024,4096 1000,1000,1000 --compare cublaslt,eager --timer $timer \
        --out "$out/bench-$timer" >"$out/bench-$timer.txt" 2>"$out/bench-$timer.log"
done
for i in 1 2 3; do
    FUSEGEN_DIRECT_LAUNCH=1 timeout 60 python3 -m fusegen tune specs --kernels gpt2_mlp_up \
        --rows 4096 >>"$out/retune-graph.txt" 2>"$out/retune-graph-$i.log"
done
cat "$out/direct.txt" "$out/bench-graph.txt" "$out/retune-graph.txt"
