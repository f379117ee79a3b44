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
retune)  # the tables whose kernels changed (tanh.approx), then every generated test
    python3 benchmarks/tanh_approx_error.py >"$out/tanh.txt" 2>&1
    for kernel in gpt2_mlp_up llama_mlp_gate_up; do
        timeout 200 python3 -m fusegen tune specs --kernels $kernel --rows 16,4096 >>"$out/tune.txt" 2>&1
        echo "$kernel tune exit $?" >>"$out/tune.txt"
    done
    timeout 100 python3 -m fusegen tune specs --kernels bias_gelu_residual --shapes 16384,8192 >>"$out/tune.txt" 2>&1
    echo "bias_gelu_residual tune exit $?" >>"$out/tune.txt"
    tar cf "$out/tables.tar" generated/*.tuned.json
    timeout 300 python3 -m pytest generated -q -x -p no:cacheprovider >"$out/tests.txt" 2>&1
    echo "tests exit $?" >>"$out/tests.txt"
    cat "$out/tanh.txt"; grep exit "$out/tune.txt"; tail -3 "$out/tests.txt" ;;
sweep)
    timeout 580 python3 benchmarks/sweep.py "$out/sweep.jsonl" "$@" 2>"$out/sweep.log" | tee "$out/sweep.txt" ;;
esac
