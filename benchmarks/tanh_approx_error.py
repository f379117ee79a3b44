"""The GPU's tanh.approx.f32 against float64 tanh: its largest relative and absolute
error over every fp32 value in [2**-30, 16] (both signs) and a dense grid beyond; the
generated tests allow TANH_APPROX (fusegen.ops) of relative error.
Usage (GPU): python3 benchmarks/tanh_approx_error.py"""

import torch
import triton
import triton.language as tl


@triton.jit
def _tanh_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    t = tl.inline_asm_elementwise(
        "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
    )
    tl.store(out_ptr + offs, t, mask=offs < n)


def main():
    lo = torch.tensor(2.0**-30, dtype=torch.float32).view(torch.int32).item()
    hi = torch.tensor(16.0, dtype=torch.float32).view(torch.int32).item()
    worst_rel = worst_abs = 0.0
    chunk = 1 << 26
    for start in range(lo, hi, chunk):
        bits = torch.arange(start, min(start + chunk, hi), device="cuda", dtype=torch.int32)
        for x in (bits.view(torch.float32), -bits.view(torch.float32)):
            out = torch.empty_like(x)
            _tanh_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
            exact = torch.tanh(x.double())
            err = (out.double() - exact).abs()
            worst_rel = max(worst_rel, (err / exact.abs()).max().item())
            worst_abs = max(worst_abs, err.max().item())
    x = torch.linspace(16, 1e4, 1 << 24, device="cuda")
    out = torch.empty_like(x)
    _tanh_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    beyond = (out.double() - 1).abs().max().item()
    print(
        f"tanh.approx.f32 on [2**-30, 16] (every fp32, both signs): max relative error "
        f"{worst_rel:.3e} = 2**{torch.log2(torch.tensor(worst_rel)).item():.3f}, "
        f"max absolute {worst_abs:.3e}; on [16, 1e4]: max |t - 1| {beyond:.3e}"
    )


if __name__ == "__main__":
    main()
