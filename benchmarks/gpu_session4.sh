#!/usr/bin/env bash
# Session 4 (2026-11-30) GPU steps. Usage (GPU machine, repo root, pydantic and black on
# PYTHONPATH): bash benchmarks/gpu_session4.sh OUT STEP
#   tests: the generated tests new since the last GPU run (torch.compile, CUDA graphs)
#   sweep CASE...: benchmarks/sweep.py for the named cases (see CASES there)
set -u
out=$1; step=$2; shift 2
mkdir -p "$out"
case $step in
tests)
    timeout 280 python3 -m pytest generated -q -x -p no:cacheprovider \
        -k "torch_compile or cuda_graph or repeated_calls" >"$out/tests.txt" 2>&1
    echo "tests exit $?" >>"$out/tests.txt"
    tail -5 "$out/tests.txt" ;;
sweep)
    timeout 580 python3 benchmarks/sweep.py "$out/sweep.jsonl" "$@" 2>"$out/sweep.log" | tee "$out/sweep.txt" ;;
esac
