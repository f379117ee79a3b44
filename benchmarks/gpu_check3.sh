#!/usr/bin/env bash
# After a launcher change: its overhead, two modules' generated tests, decode anchors.
set -u
out=${1:-gpu-check3}
mkdir -p "$out"
[ -f scratch/overhead.py ] && timeout 40 python3 scratch/overhead.py 2>&1 | grep -E "us/call|us$" >"$out/overhead.txt"
timeout 150 python3 -m pytest generated/test_gpt2_mlp_up.py generated/test_llama_add_rmsnorm.py \
    -q -p no:cacheprovider -rfE -x >"$out/tests.txt" 2>&1
echo "tests exit $?" >>"$out/tests.txt"
timeout 75 python3 -m fusegen bench benchmarks/specs/anchors.yaml --kernels anchor_gelu \
    --shapes 16,4096,14336 7,4096,14336 4096,1024,4096 --compare cublaslt \
    --out "$out/bench" >"$out/bench.txt" 2>"$out/bench.log"
cat "$out/overhead.txt"; tail -4 "$out/tests.txt"; cat "$out/bench.txt"
