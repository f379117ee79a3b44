#!/usr/bin/env bash
# Decode-sized matmul chains on the GPU: split-K correctness under repetition (bitwise
# determinism and the float64 reference), then the anchors at M = 1, 7, 16.
# Usage: bash benchmarks/decode_check.sh OUT_DIR
set -u
out=${1:-decode-check}
mkdir -p "$out"
python3 - <<'PY' 2>&1 | tee "$out/split_check.txt"
import sys, torch
sys.path.insert(0, "generated")
import gpt2_mlp_up as g, llama_mlp_gate_up as l
torch.manual_seed(0)
for mod, name, shapes in ((g, "gpt2_mlp_up", [(16, 768, 3072), (7, 768, 3072)]),
                          (l, "llama_mlp_gate_up", [(16, 4096, 14336), (1, 4096, 14336)])):
    fn = getattr(mod, name)
    for m, k, n in shapes:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        if name == "gpt2_mlp_up":  # w is [K, N] (Conv1D), then a bias
            args = [x, torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k**0.5,
                    torch.randn(n, device="cuda", dtype=torch.bfloat16)]
        else:  # w1, w3 are [N, K]
            args = [x] + [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
                          for _ in range(2)]
        exact = mod.reference(*[a.double() for a in args], out_dtype=torch.float64)
        for cfg in [c for c in mod.CONFIGS if c.get("SPLIT_K", 1) > 1]:
            first = fn(*args, config=cfg).clone()
            same = all(torch.equal(fn(*args, config=cfg), first) for _ in range(200))
            err = ((first.double() - exact).norm() / exact.norm()).item()
            print(f"{name} {m}x{k}x{n} {cfg}: rel err {err:.2e}, bitwise same over 200 runs: {same}")
PY
python3 -m fusegen bench benchmarks/specs/anchors.yaml --kernels anchor_gelu anchor_swiglu \
    --shapes 16,4096,14336 7,4096,14336 1,4096,14336 --compare eager,cublaslt \
    --out "$out/bench" >"$out/bench.txt" 2>"$out/bench.log"
echo "bench exit $?"
