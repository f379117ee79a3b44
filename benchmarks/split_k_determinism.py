"""Split-K on a GPU: every SPLIT_K > 1 config of the decode-sized matmul kernels, checked
against the float64 reference and for bitwise-identical output over 200 repeated calls
(split-K sums partial products in a fixed order, so it must not vary run to run).
gpt2_mlp_up at 16 and 7 rows, llama_mlp_gate_up at 16 and 1 (generated/, bf16).

    python3 benchmarks/split_k_determinism.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "generated"))
import gpt2_mlp_up  # noqa: E402
import llama_mlp_gate_up  # noqa: E402

REPEATS = 200
CASES = [  # module, rows x K x N
    (gpt2_mlp_up, [(16, 768, 3072), (7, 768, 3072)]),
    (llama_mlp_gate_up, [(16, 4096, 14336), (1, 4096, 14336)]),
]


def inputs(module, m, k, n):
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, **bf16)
    if module is gpt2_mlp_up:  # w is [K, N] (Conv1D), then a bias
        return [x, torch.randn(k, n, **bf16) / k**0.5, torch.randn(n, **bf16)]
    return [x] + [torch.randn(n, k, **bf16) / k**0.5 for _ in range(2)]  # w1, w3: [N, K]


def main() -> None:
    torch.manual_seed(0)
    for module, shapes in CASES:
        name = module.__name__
        launcher = getattr(module, name)
        for m, k, n in shapes:
            args = inputs(module, m, k, n)
            exact = module.reference(*[a.double() for a in args], out_dtype=torch.float64)
            for config in [c for c in module.CONFIGS if c.get("SPLIT_K", 1) > 1]:
                first = launcher(*args, config=config).clone()
                same = all(
                    torch.equal(launcher(*args, config=config), first) for _ in range(REPEATS)
                )
                error = ((first.double() - exact).norm() / exact.norm()).item()
                print(
                    f"{name} {m}x{k}x{n} {config}: rel err {error:.2e}, "
                    f"bitwise same over {REPEATS} runs: {same}"
                )


if __name__ == "__main__":
    main()
