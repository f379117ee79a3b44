#!/usr/bin/env bash
# Issue 4's GPU figures: first calls with and without the tuned tables, inspect output,
# tuning twice for reproducibility; and the rest of the generated tests.
# Usage: bash benchmarks/gpu_check2.sh OUT_DIR
set -u
out=${1:-gpu-check2}
mkdir -p "$out"
timeout 150 python3 -m pytest generated/test_llama_mlp_gate_up.py generated/test_masked_softmax.py \
    -q -p no:cacheprovider -rfE >"$out/generated-tests-rest.txt" 2>&1
echo "generated tests (rest) exit $?" >>"$out/generated-tests-rest.txt"
timeout 100 python3 benchmarks/first_call.py 4096 >"$out/first-call-table.txt" 2>&1
timeout 60 python3 benchmarks/first_call.py 4096 --no-table >"$out/first-call-no-table.txt" 2>&1
timeout 60 python3 -m fusegen inspect specs --kernels gpt2_mlp_up llama_mlp_gate_up --rows 16,4096 \
    >"$out/inspect.txt" 2>"$out/inspect.log"
timeout 90 python3 -m fusegen inspect specs --kernels gpt2_mlp_up --rows 4096 --counters \
    >"$out/inspect-counters.txt" 2>"$out/inspect-counters.log"
cp -r generated "$out/gen-copy" 2>/dev/null
for i in 1 2; do
    timeout 60 python3 -m fusegen tune specs --kernels gpt2_mlp_up --rows 4096 --out "$out/gen-copy" \
        >>"$out/retune.txt" 2>/dev/null
done
rm -rf "$out/gen-copy"
[ -f scratch/overhead.py ] && timeout 60 python3 scratch/overhead.py 2>&1 | grep -E "us/call|us$" >"$out/overhead.txt"
