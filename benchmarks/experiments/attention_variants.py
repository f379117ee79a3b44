"""Code variants of the generated attention kernels, measured before the generator
changes: each is a small text edit of a module built from
benchmarks/specs/attention_anchors.yaml, imported as its own module, checked against fp32
math attention, then timed (do_bench median, ms) over a few launch configs, beside SDPA's
cuDNN backend in the same process.

Variants (combinations are joined with "+"):
  base           the module as generated (TMA loads in the forward at head dim 128)
  pointer        the same with TMA_LOADS = False: the forward's pointer loads
  heavy-first    the forward and dq kernels take their query blocks last-first: under a
                 causal mask the last blocks see the most keys, so the long programs start
                 first and the short ones fill the tail
  tma            a module without TMA loads (head dim 64) given them: the forward loads
                 K and V tiles through tensor descriptors made in the kernel
  tma-backward   the dq kernel loads K and V, the dk/dv kernel q and d_out, through
                 tensor descriptors (the forward as generated: TMA at head dim 128)
  ws             the forward's unmasked key loop asks for warp specialization
                 (tl.range(..., warp_specialize=True); triton 3.6 documents it for
                 Blackwell, Hopper has its own pass: does it take this loop?)

    python3 benchmarks/experiments/attention_variants.py [--cases causal full ...]
        [--variants base heavy-first ...] [--out FILE.json]
    TRITON_INTERPRET=1 python3 benchmarks/experiments/attention_variants.py --check
        (CPU: every variant's module imports and computes right at a small shape)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attention_anchors import CASES, build, math_reference  # noqa: E402

CONFIGS = {  # case -> forward configs (BLOCK_M, BLOCK_N, warps, stages) to time
    "causal": [(128, 128, 8, 3), (64, 64, 4, 3)],
    "full": [(128, 128, 8, 3)],
    "causal-d64": [(64, 64, 4, 3), (128, 64, 8, 3)],
    "causal-backward": [None],  # the module's own configs
}
VARIANTS = ["base", "pointer", "heavy-first", "tma", "tma-backward", "ws"]
WORTH = {  # case -> the variants that can differ there (no mask: all blocks weigh the same)
    "causal": ["base", "pointer", "heavy-first", "ws"],
    "full": ["base", "pointer", "ws"],
    "causal-d64": ["base", "tma"],
    "causal-backward": ["base", "tma-backward"],
}


def _section(src: str, start: str, end: str) -> tuple[int, int]:
    first = src.index(start)
    return first, src.index(end, first)


def _edit(src: str, start: str, end: str, old: str, new: str) -> str:
    """Replace `old` (which must occur) by `new` between the markers start and end."""
    lo, hi = _section(src, start, end)
    part = src[lo:hi]
    if old not in part:
        raise ValueError(f"variant edit: {old!r} not in {start!r}")
    return src[:lo] + part.replace(old, new) + src[hi:]


def heavy_first(src: str, name: str) -> str:
    reversed_m = "pid_m = tl.num_programs(0) - 1 - tl.program_id(0)"
    for kernel in ("forward", "backward_q"):
        src = _edit(
            src, f"def _{name}_{kernel}(\n", "\n\n\n", "pid_m = tl.program_id(0)", reversed_m
        )
    return src


def tma(src: str, name: str) -> str:
    step = f"def _{name}_forward_step(\n"
    loads_masked = (
        "        k = tl.load(k_base + k_offs, mask=(keys < SKV)[None, :], other=0.0)\n"
        "        v = tl.load(v_base + v_offs, mask=(keys < SKV)[:, None], other=0.0)\n"
    )
    loads_whole = "        k = tl.load(k_base + k_offs)\n        v = tl.load(v_base + v_offs)\n"
    # Tiles past the descriptor's rows read as zeros; the MASKED scores mask those keys.
    src = _edit(src, step, "\n\n\n", loads_masked, "        k = k_base.load([start, 0]).T\n"
                "        v = v_base.load([start, 0])\n")  # fmt: skip
    src = _edit(src, step, "\n\n\n", loads_whole, "        k = k_base.load([start, 0]).T\n"
                "        v = v_base.load([start, 0])\n")  # fmt: skip
    kernel = f"def _{name}_forward(\n"
    descriptors = (
        "    kv_len = _key_count(lengths_ptr, batch, SKV, LENGTHS)\n"
        "    k_base = tl.make_tensor_descriptor(k_base, shape=[kv_len, BLOCK_D],"
        " strides=[stride_k_s, 1], block_shape=[BLOCK_N, BLOCK_D])\n"
        "    v_base = tl.make_tensor_descriptor(v_base, shape=[kv_len, BLOCK_D],"
        " strides=[stride_v_s, 1], block_shape=[BLOCK_N, BLOCK_D])\n"
    )
    return _edit(
        src, kernel, "\n\n\n", "    kv_len = _key_count(lengths_ptr, batch, SKV, LENGTHS)\n",
        descriptors,
    )  # fmt: skip


def tma_backward(src: str, name: str) -> str:
    q_step, kv_step = f"def _{name}_backward_q_step(\n", f"def _{name}_backward_kv_step(\n"
    for old, new in (
        ("k = tl.load(k_base + kv_offs, mask=mask_kv, other=0.0)", "k = k_base.load([start, 0])"),
        ("v = tl.load(v_base + keys[:, None] * stride_v_s + offs_d[None, :], mask=mask_kv, "
         "other=0.0)", "v = v_base.load([start, 0])"),
        ("k = tl.load(k_base + kv_offs)", "k = k_base.load([start, 0])"),
        ("v = tl.load(v_base + keys[:, None] * stride_v_s + offs_d[None, :])",
         "v = v_base.load([start, 0])"),
    ):  # fmt: skip
        src = _edit(src, q_step, "\n\n\n", old, new)
    for old, new in (
        ("q = tl.load(q_base + q_offs, mask=mask_q, other=0.0)", "q = q_base.load([start, 0])"),
        ("d_out = tl.load(do_base + do_offs, mask=mask_q, other=0.0)",
         "d_out = do_base.load([start, 0])"),
        ("q = tl.load(q_base + q_offs)", "q = q_base.load([start, 0])"),
        ("d_out = tl.load(do_base + do_offs)", "d_out = do_base.load([start, 0])"),
    ):  # fmt: skip
        src = _edit(src, kv_step, "\n\n\n", old, new)
    line = "    kv_len = _key_count(lengths_ptr, batch, SKV, LENGTHS)\n"
    src = _edit(src, f"def _{name}_backward_q(\n", "\n\n\n", line, line + (
        "    k_base = tl.make_tensor_descriptor(k_base, shape=[kv_len, BLOCK_D],"
        " strides=[stride_k_s, 1], block_shape=[BLOCK_N, BLOCK_D])\n"
        "    v_base = tl.make_tensor_descriptor(v_base, shape=[kv_len, BLOCK_D],"
        " strides=[stride_v_s, 1], block_shape=[BLOCK_N, BLOCK_D])\n"
    ))  # fmt: skip
    # The backward runs on autograd's thread, whose context has no allocator yet.
    line = "    delta = torch.empty((batch, HEADS, sq), dtype=torch.float32, device=q.device)\n"
    src = _edit(src, "def _backward(", "\n\n\n", line, "    _ensure_allocator(q.device)\n" + line)
    line = "        do_base = d_out_ptr + batch.to(tl.int64) * stride_do_b + head * stride_do_h\n"
    return _edit(src, f"def _{name}_backward_kv(\n", "\n\n\n", line, line + (
        "        q_base = tl.make_tensor_descriptor(q_base, shape=[SQ, BLOCK_D],"
        " strides=[stride_q_s, 1], block_shape=[BLOCK_M, BLOCK_D])\n"
        "        do_base = tl.make_tensor_descriptor(do_base, shape=[SQ, BLOCK_D],"
        " strides=[stride_do_s, 1], block_shape=[BLOCK_M, BLOCK_D])\n"
    ))  # fmt: skip


def warp_specialized(src: str, name: str) -> str:
    return _edit(
        src,
        f"def _{name}_forward(\n",
        "\n\n\n",
        "for start in range(full_lo, full_hi, BLOCK_N):",
        "for start in tl.range(full_lo, full_hi, BLOCK_N, warp_specialize=True):",
    )


EDITS = {
    "heavy-first": heavy_first,
    "tma": tma,
    "tma-backward": tma_backward,
    "ws": warp_specialized,
}


def variant_module(folder: Path, name: str, variant: str):
    src = (folder / f"{name}.py").read_text()
    for part in variant.split("+"):
        if part in EDITS:
            src = EDITS[part](src, name)
    tag = variant.replace("+", "_").replace("-", "_")
    path = folder / f"{name}__{tag}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"{name}__{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.__dict__["_public"] = getattr(module, name)
    if "pointer" in variant.split("+"):
        module.TMA_LOADS = False
    return module


def _allocator(device):
    import triton

    def scratch(size, alignment, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(scratch)


def _error(got, want):
    return ((got.float() - want).norm() / want.norm()).item()


def run_case(case, folder, variants, device="cuda"):
    from triton.testing import do_bench

    name, (batch, heads, sq, skv, dim), backward = CASES[case]
    torch.manual_seed(0)
    q = torch.randn(batch, heads, sq, dim, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, heads, skv, dim, device=device, dtype=torch.bfloat16) for _ in "kv")
    causal = "causal" in case
    few = slice(0, min(heads, 8))
    want = math_reference(q[:1, few], k[:1, few], v[:1, few], causal, None)
    rows = []
    if backward:
        d_out = torch.randn_like(q)
        leaves32 = [t[:1, few].detach().float().requires_grad_() for t in (q, k, v)]
        want_grads = torch.autograd.grad(
            math_reference(*leaves32, causal, None), leaves32, d_out[:1, few].float()
        )
    for variant in variants:
        try:
            module = variant_module(folder, name, variant)
        except Exception as exc:
            rows.append({"variant": variant, "error_text": f"{type(exc).__name__}: {exc}"})
            print(case, rows[-1], flush=True)
            continue
        call = module._public
        for config in CONFIGS[case]:
            if config is not None:
                module.CONFIG = config
            row = {"variant": variant, "config": config}
            try:
                if backward:
                    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                    grads = torch.autograd.grad(call(*leaves), leaves, d_out)
                    row["error"] = max(
                        _error(g[:1, few], w) for g, w in zip(grads, want_grads, strict=True)
                    )

                    def step(leaves=leaves, call=call):
                        torch.autograd.grad(call(*leaves), leaves, d_out)

                else:
                    with torch.no_grad():
                        row["error"] = _error(call(q, k, v)[:1, few], want)

                    def step(call=call):
                        with torch.no_grad():
                            call(q, k, v)

                if row["error"] < 2e-2 and device == "cuda":
                    row["ms"] = do_bench(step)
            except Exception as exc:  # a variant the compiler refuses is a result
                row["error_text"] = f"{type(exc).__name__}: {str(exc)[:240]}"
            rows.append(row)
            print(case, row, flush=True)
    if device == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            if backward:
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                ms = do_bench(
                    lambda: torch.autograd.grad(sdpa(*leaves, is_causal=causal), leaves, d_out)
                )
            else:
                with torch.no_grad():
                    ms = do_bench(lambda: sdpa(q, k, v, is_causal=causal))
        rows.append({"variant": "sdpa cudnn", "ms": ms})
        print(case, rows[-1], flush=True)
    return rows


def check() -> int:
    """CPU, interpreter: every variant's edits apply and compute right at a small shape."""
    global CASES
    CASES = {  # small shapes, the same modules (odd lengths: partial blocks)
        "causal": ("anchor_attention_causal", (1, 32, 70, 70, 128), False),
        "causal-backward": ("anchor_attention_causal", (1, 32, 40, 40, 128), True),
        "causal-d64": ("anchor_attention_causal_d64", (1, 16, 70, 70, 64), False),
    }
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        build(Path(folder))
        for case in CASES:
            CONFIGS[case] = [None]
            variants = WORTH[case]
            for row in run_case(case, Path(folder), variants, device="cpu"):
                # The interpreter has no TMA or warp specialization: only the edits'
                # arithmetic is checked, where it runs.
                bad = row.get("error", 0) > 2e-2
                failed |= bad
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--variants", nargs="*", default=VARIANTS)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.check:
        return check()
    _allocator("cuda")
    report = {"device": torch.cuda.get_device_name(), "cases": {}}
    with tempfile.TemporaryDirectory() as folder:
        build(Path(folder))
        for case in args.cases:
            variants = [v for v in args.variants if v in WORTH[case]]
            report["cases"][case] = run_case(case, Path(folder), variants)
    for case, rows in report["cases"].items():
        print(f"\n{case}:")
        for row in sorted((r for r in rows if "ms" in r), key=lambda r: r["ms"]):
            print(f"  {row['ms']:.3f} ms  {row['variant']}  {row.get('config')}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_PRINT_AUTOTUNING", "0")
    sys.exit(main())
