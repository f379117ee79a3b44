"""The generated attention kernels over a grid of launch configs, on one GPU, bf16: the
forward at each of issue 16's cases (benchmarks/attention_anchors.py's CASES but the
bias and GQA ones), the decode cases over DECODE_CONFIG and the key split's programs per
multiprocessor, and the backward's dk/dv and dq kernels at the causal training case.
Each config's output is checked against fp32 math attention first (a config that
computes wrongly is dropped, not timed), and SDPA's cuDNN and flash backends are timed
beside as the bar. What it
finds goes into fusegen/attention_text.py's CONFIGS, DECODE_CONFIGS,
SPLIT_PROGRAMS_PER_SM and BACKWARD_CONFIGS.

    python3 benchmarks/attention_configs.py [--cases causal full ...] [--out FILE.json]

Times: triton.testing.do_bench medians (ms).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_anchors import CASES, SOFTCAP, build, load, math_reference  # noqa: E402

# (BLOCK_M, BLOCK_N, num_warps, num_stages)
FORWARD = {
    64: [(64, 64, 4, 3), (64, 64, 4, 4), (128, 64, 8, 3), (64, 32, 4, 3), (64, 128, 4, 3),
         (128, 64, 4, 3)],
    128: [(64, 64, 4, 3), (128, 128, 8, 3), (128, 128, 8, 2), (128, 128, 8, 4), (128, 64, 8, 3),
          (64, 128, 4, 2), (256, 128, 16, 2), (128, 64, 8, 4)],
}  # fmt: skip
KV = [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (64, 128, 8, 2), (64, 32, 4, 2),
      (128, 128, 8, 2), (32, 128, 4, 2), (64, 64, 8, 2)]  # fmt: skip
Q = [(64, 64, 4, 2), (128, 64, 8, 3), (128, 64, 8, 2), (64, 32, 4, 2), (128, 32, 4, 3),
     (128, 128, 8, 2)]  # fmt: skip
DECODE = [(16, 64, 4, 3), (16, 128, 4, 3), (16, 64, 4, 4), (16, 128, 8, 3), (64, 64, 4, 3)]
SPLITS_PER_SM = [1, 2, 4, 8]
# The cases of one kv head per query head and no bias input (what inputs() makes).
SWEPT = [case for case in CASES if not case.startswith("bias") and "gqa" not in case]


def inputs(shape, seed=0):
    """q [B, H, Sq, D], k and v [B, H, Skv, D] from shape (B, H, Sq, Skv, D)."""
    batch, heads, sq, skv, dim = shape
    torch.manual_seed(seed)
    sizes = [(batch, heads, sq, dim), (batch, heads, skv, dim), (batch, heads, skv, dim)]
    return [torch.randn(size, device="cuda", dtype=torch.bfloat16) for size in sizes]


def error(got, want):
    return ((got[:1, :8].float() - want).norm() / want.norm()).item()


def forward_sweep(case, module, shape):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    causal = "causal" in case or case == "softcap"
    softcap = SOFTCAP if case == "softcap" else None
    q, k, v = inputs(shape)
    want = math_reference(q[:1, :8], k[:1, :8], v[:1, :8], causal, softcap)
    rows = []
    if softcap is None:
        for name, backend in (("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa flash", SDPBackend.FLASH_ATTENTION)):  # fmt: skip
            with sdpa_kernel(backend), torch.no_grad():

                def call():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                rows.append({"variant": name, "error": error(call(), want), "ms": do_bench(call)})
            print(case, rows[-1], flush=True)
    decode = case.startswith("decode")
    defaults = (module.CONFIG, module.DECODE_CONFIG, module.SPLIT_PROGRAMS_PER_SM)
    # Programs per multiprocessor matter only where the keys split.
    splits = (
        decode
        and module._ATTENTION.forward_plan(q.device, shape[0], shape[2], shape[3], q.dtype)[2] > 1
    )
    per_sm = SPLITS_PER_SM if splits else [module.SPLIT_PROGRAMS_PER_SM]
    grid = [(c, p) for c in DECODE for p in per_sm] if decode else FORWARD[shape[-1]]
    for choice in grid:
        if decode:
            module.DECODE_CONFIG, module.SPLIT_PROGRAMS_PER_SM = choice
        else:
            module.CONFIG = choice
        module._ATTENTION.plans.clear()  # plans were made with the constants before
        row = {"variant": "fusegen", "config": choice}
        try:
            with torch.no_grad():
                row["error"] = error(module._ATTENTION.forward((q, k, v), False)[0], want)
                if row["error"] < 2e-2:
                    row["ms"] = do_bench(lambda: module._ATTENTION.forward((q, k, v), False))
        except Exception as exc:  # too much shared memory, say: a result
            row["error_text"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        rows.append(row)
        print(case, row, flush=True)
    module.CONFIG, module.DECODE_CONFIG, module.SPLIT_PROGRAMS_PER_SM = defaults
    module._ATTENTION.plans.clear()
    if getattr(module, "TMA_LOADS", False):  # the default config on pointer loads, beside
        module.TMA_LOADS = False
        with torch.no_grad():
            ms = do_bench(lambda: module._ATTENTION.forward((q, k, v), False))
        rows.append({"variant": "fusegen, pointer loads", "config": "default", "ms": ms})
        print(case, rows[-1], flush=True)
        module.TMA_LOADS = True
    return rows


def backward_sweep(module, shape):
    """dk/dv and dq kernels apart (the other's config held at the default), then the
    whole forward + backward with each kernel's best, against cuDNN's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    q, k, v = inputs(shape)
    d_out = torch.randn_like(q)
    with torch.no_grad():
        out, lse = module._ATTENTION.forward((q, k, v), True)
    leaves = [t.detach().float().requires_grad_() for t in (q[:1, :8], k[:1, :8], v[:1, :8])]
    want = torch.autograd.grad(math_reference(*leaves, True, None), leaves, d_out[:1, :8].float())
    rows, best = [], {}
    for kernel, space, needs in (("kv", KV, (False, True, True)), ("q", Q, (True, False, False))):
        default = dict(module.BACKWARD_CONFIGS)
        for config in space:
            module.BACKWARD_CONFIGS = {**default, kernel: config}
            row = {"variant": f"fusegen {kernel}", "config": config}
            try:
                grads = module._ATTENTION.backward((q, k, v), out, lse, d_out, needs)
                row["error"] = max(
                    error(g, w) for g, w, n in zip(grads, want, needs, strict=True) if n
                )
                if row["error"] < 2e-2:
                    row["ms"] = do_bench(
                        lambda needs=needs: module._ATTENTION.backward(
                            (q, k, v), out, lse, d_out, needs
                        )
                    )
                    if row["ms"] < best.get(kernel, (None, float("inf")))[1]:
                        best[kernel] = (config, row["ms"])
            except Exception as exc:
                row["error_text"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            rows.append(row)
            print("backward", row, flush=True)
        module.BACKWARD_CONFIGS = default
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    tuned = {**module.BACKWARD_CONFIGS, **{n: c for n, (c, _) in best.items()}}
    for name, configs in (("fusegen default", module.BACKWARD_CONFIGS), ("fusegen best", tuned)):
        module.BACKWARD_CONFIGS = configs
        call = getattr(module, module.__name__)
        ms = do_bench(lambda call=call: torch.autograd.grad(call(*leaves), leaves, d_out))
        rows.append({"variant": name, "configs": configs, "ms": ms})
        print("forward + backward", rows[-1], flush=True)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        step = lambda: torch.autograd.grad(  # noqa: E731
            F.scaled_dot_product_attention(*leaves, is_causal=True), leaves, d_out
        )
        rows.append({"variant": "sdpa cudnn", "ms": do_bench(step)})
    print("forward + backward", rows[-1], flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=SWEPT, choices=SWEPT)
    parser.add_argument("--out", help="write every number here as JSON")
    args = parser.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": {}}
    with tempfile.TemporaryDirectory() as folder:
        build(Path(folder))
        for case in args.cases:
            module_name, shape, backward = CASES[case]
            module = load(Path(folder), module_name)
            sweep = (
                backward_sweep(module, shape) if backward else forward_sweep(case, module, shape)
            )
            report["cases"][case] = {"shape": shape, "rows": sweep}
            if args.out:  # after each case: a run cut short keeps what it measured
                Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for case, entry in report["cases"].items():
        timed = [r for r in entry["rows"] if "ms" in r]
        mine = [r for r in timed if r["variant"].startswith("fusegen")]
        theirs = [r for r in timed if not r["variant"].startswith("fusegen")]
        for row in sorted(mine, key=lambda r: r["ms"])[:3] + theirs:
            print(f"{case}: {row['variant']} {row.get('config', '')} {row['ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
