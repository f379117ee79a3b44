"""The block-scaled fp8 SwiGLU (DeepSeek-V3's recipe, generated/deepseek_mlp_fp8.py) with
its per-K-step scales applied in one multiply-add an element, as generated, against two.

Triton 3.6 keeps a dot synchronous when another op of the loop reads its result, so the
tensor cores wait while a K step's scales multiply the step's dot. Where BLOCK_N divides
the weights' 128-row scale blocks, a tile's columns share one weight scale a K step: the
generated kernel forms `s = x_scale * w_scale` as a [BLOCK_M] vector, and `acc += dot *
s[:, None]` is one FMA an element ("one-fma"). "two-multiply" is the same module with
that branch turned off: `acc += dot * (x_scale[:, None] * w_scale[None, :])`, a scale a
column, as the generator wrote it before. Each variant runs at a few explicit configs,
in alternating rounds (GPU time of a CUDA graph of 20 calls), each checked against
float64 on 128 rows, beside torch's block-wise `scaled_mm` (cuBLASLt) with the scales
laid out as it asks ([M, K/128] column-major for x, [K/128, N/128] for w).

    python3 benchmarks/experiments/fp8_block_scale_fma.py --built FOLDER [--rounds 3]

FOLDER: `fusegen build specs/quantized.yaml --out FOLDER`.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quantized_chains import graph_ms, load, max_error  # noqa: E402

CONFIGS = [
    (128, 128, 128, 8, 3),
    (64, 128, 128, 4, 2),  # QUANT_FP8_STEP_DEFAULT
    (128, 64, 128, 4, 4),
    (64, 64, 128, 4, 3),
]
M, K, N = 4096, 7168, 18432


def two_multiply_source(text: str) -> str:
    """The generated module with the one-scale-a-tile branch turned off."""
    branch = "if 128 % BLOCK_N == 0:"
    assert text.count(branch) == 2, "not the block-scaled SwiGLU as generated"
    return text.replace(branch, "if False:")


def module_from(text: str, name: str, folder: Path):
    path = folder / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--built", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = load(args.built, "deepseek_mlp_fp8")
    text = (args.built / "deepseek_mlp_fp8.py").read_text()
    edited = module_from(
        two_multiply_source(text),
        "deepseek_mlp_fp8_two_multiply",
        Path(tempfile.mkdtemp(dir=args.built)),
    )
    dev = "cuda"
    torch.manual_seed(0)
    x8 = torch.randn(M, K, device=dev).to(torch.float8_e4m3fn)
    xs = torch.rand(M, K // 128, device=dev) + 0.5
    wg8 = torch.randn(N, K, device=dev).to(torch.float8_e4m3fn)
    wu8 = torch.randn(N, K, device=dev).to(torch.float8_e4m3fn)
    wgs = (torch.rand(N // 128, K // 128, device=dev) + 0.5) / K**0.5
    wus = (torch.rand(N // 128, K // 128, device=dev) + 0.5) / K**0.5
    rows = slice(0, 128)
    want = base.reference(
        x8[rows], xs[rows].double(), wg8, wgs.double(), wu8, wus.double(), out_dtype=torch.float64
    )
    variants = {}
    for cfg in CONFIGS:
        bm, bn, bk, warps, stages = cfg
        config = {
            "BLOCK_M": bm,
            "BLOCK_N": bn,
            "BLOCK_K": bk,
            "GROUP_M": 8,
            "num_warps": warps,
            "num_stages": stages,
        }
        label = f"{bm}x{bn}x{bk} w{warps} s{stages}"
        for name, mod in (("one-fma", base), ("two-multiply", edited)):
            fn = mod.deepseek_mlp_fp8

            def call(i, fn=fn, config=config):
                return fn(x8, xs, wg8, wgs, wu8, wus, config=config)

            try:
                got = call(0)
                got = got[rows]
                error = max_error(got, want)
            except Exception as exc:  # noqa: BLE001 - a config the GPU refuses is listed
                print(f"{name} {label}: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            variants[f"{name} {label}"] = (call, error)
    try:
        from torch.nn.functional import ScalingType, scaled_mm

        xs_cols = xs.t().contiguous().t()  # [M, K/128] with strides (1, M), as cuBLASLt asks

        def blockwise(w8, ws):
            ws = ws.t()  # [K/128, N/128]: the orientation of w8.t()
            return scaled_mm(
                x8,
                w8.t(),
                xs_cols,
                ScalingType.BlockWise1x128,
                ws,
                ScalingType.BlockWise128x128,
                output_dtype=torch.bfloat16,
            )

        def cublas(i):
            return F.silu(blockwise(wg8, wgs)) * blockwise(wu8, wus)

        variants["scaled_mm block-wise + eager"] = (cublas, max_error(cublas(0)[rows], want))
    except Exception as exc:  # noqa: BLE001 - recorded: why the anchor does not run
        print(f"block-wise scaled_mm: {type(exc).__name__}: {str(exc)[:300]}")
    times = {name: [] for name in variants}
    for r in range(args.rounds):
        names = list(variants)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            times[name].append(graph_ms(variants[name][0]))
    flop = 4 * M * K * N
    print(f"fp8 block-scaled SwiGLU {M}x{K}->{N}, GPU ms (median [min-max] of {args.rounds})")
    for name, ms in times.items():
        med = statistics.median(ms)
        print(
            f"  {name:32s} {med:.4f} [{min(ms):.4f}-{max(ms):.4f}]"
            f" {flop / med / 1e9:6.0f} TFLOP/s  err {variants[name][1]:.2e}"
        )


if __name__ == "__main__":
    main()
