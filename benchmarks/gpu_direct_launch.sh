#!/usr/bin/env bash
# For the session that decides FUSEGEN_DIRECT_LAUNCH's default (written 2026-11-30, not
# yet run): the generated tests that call a signature repeatedly with and without it,
# the launcher's cost per call both ways, and the decode / small anchors both ways.
# Usage (GPU machine, pydantic and black on PYTHONPATH): bash benchmarks/gpu_direct_launch.sh OUT
set -u
out=${1:-direct-launch}
mkdir -p "$out"
timeout 200 python3 -m pytest generated -q -p no:cacheprovider -rfE -k "repeated or every_config" \
    >"$out/tests.txt" 2>&1
echo "tests exit $?" >>"$out/tests.txt"
python3 - >"$out/overhead.txt" 2>&1 <<'PY'
import os, sys, time, torch
sys.path.insert(0, "generated")
import gpt2_mlp_up as m
x = torch.randn(16, 768, device="cuda", dtype=torch.bfloat16)
w = torch.randn(768, 3072, device="cuda", dtype=torch.bfloat16) / 30
b = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
for direct in ("0", "1"):
    os.environ["FUSEGEN_DIRECT_LAUNCH"] = direct
    m._CALLS.clear()
    for _ in range(100):
        m.gpt2_mlp_up(x, w, b)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3000):
        m.gpt2_mlp_up(x, w, b)
    torch.cuda.synchronize()
    print(f"FUSEGEN_DIRECT_LAUNCH={direct}: {(time.perf_counter() - start) / 3000 * 1e6:.1f} us per call")
PY
for direct in 0 1; do
    FUSEGEN_DIRECT_LAUNCH=$direct timeout 120 python3 -m fusegen bench benchmarks/specs/anchors.yaml \
        --kernels anchor_gelu --shapes 16,4096,14336 7,4096,14336 4096,1024,4096 1000,1000,1000 \
        --compare cublaslt --out "$out/bench-direct$direct" >"$out/bench-direct$direct.txt" 2>/dev/null
done
cat "$out/overhead.txt"; tail -2 "$out/tests.txt"; cat "$out"/bench-direct*.txt
