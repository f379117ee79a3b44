"""Run one generated kernel against its reference and say how close and how fast it is."""

import os
import sys
from pathlib import Path

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "generated"))
import gpt2_mlp_up as kernel  # noqa: E402


def main() -> None:
    device = "cuda" if ON_GPU else "cpu"
    rows = 4096 if ON_GPU else 37
    dtype = torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(rows, 768, device=device, dtype=dtype)
    w = (torch.randn(768, 3072, device=device) / 768**0.5).to(dtype)
    b = torch.randn(3072, device=device, dtype=dtype)

    y = kernel.gpt2_mlp_up(x, w, b)
    launch = kernel.last_launch()
    exact = kernel.reference(x.double(), w.double(), b.double(), out_dtype=torch.float64)
    eager = kernel.reference(x, w, b)
    rel = lambda t: ((t.double() - exact).norm() / exact.norm()).item()  # noqa: E731

    mode = torch.cuda.get_device_name() if ON_GPU else "the Triton interpreter (no GPU)"
    print(f"gpt2_mlp_up: y = gelu_tanh(x @ w + b), x [{rows}, 768] bf16, on {mode}")
    print(f"  config: {launch['config']} ({launch['source']})")
    print(
        f"  relative error vs float64 reference: fused {rel(y):.2e}, eager PyTorch {rel(eager):.2e}"
    )
    if ON_GPU:
        from triton.testing import do_bench

        fused = do_bench(lambda: kernel.gpt2_mlp_up(x, w, b), return_mode="median")
        unfused = do_bench(lambda: kernel.reference(x, w, b), return_mode="median")
        print(f"  time: fused {fused * 1e3:.1f} us, eager {unfused * 1e3:.1f} us")
    assert rel(y) < 1e-2, "the fused kernel disagrees with its reference"
    print("ok")


if __name__ == "__main__":
    main()
