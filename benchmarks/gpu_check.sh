#!/usr/bin/env bash
# One GPU session's checks: launcher overhead, the generated equivalence tests, and the
# decode / odd-shape / fp32 anchor rows. Usage: bash benchmarks/gpu_check.sh OUT_DIR
set -u
out=${1:-gpu-check}
mkdir -p "$out"
[ -f scratch/overhead.py ] && timeout 60 python3 scratch/overhead.py >"$out/overhead.txt" 2>&1
timeout "${TESTS_S:-300}" python3 -m pytest generated -q -p no:cacheprovider -rfE -x >"$out/generated-tests.txt" 2>&1
echo "generated tests exit $?" | tee -a "$out/generated-tests.txt"
tail -3 "$out/generated-tests.txt"
timeout 200 python3 -m fusegen bench benchmarks/specs/anchors.yaml --kernels anchor_gelu anchor_swiglu \
    --shapes 16,4096,14336 7,4096,14336 1,4096,14336 4096,1024,4096 1000,1000,1000 --compare eager,cublaslt \
    --out "$out/bf16-decode" >"$out/bf16-decode.txt" 2>"$out/bf16-decode.log"
timeout 150 python3 -m fusegen bench benchmarks/specs/anchors.yaml --dtype fp32 \
    --shapes 4096,1024,4096 16,4096,14336 16384,8192 --compare eager,compile,cublaslt \
    --out "$out/fp32" >"$out/fp32.txt" 2>"$out/fp32.log"
cat "$out/bf16-decode.txt" "$out/fp32.txt"
