"""Issue 16's attention targets on one GPU, bf16: the generated attention kernels
(benchmarks/specs/attention_anchors.yaml, built into a temporary folder) against
F.scaled_dot_product_attention on each backend (flash, cuDNN, efficient) and compiled
FlexAttention with the same mask and score mod. Forward, and forward + backward for the
causal case. Each variant's output is checked against SDPA's math backend in fp32
(norm-wise relative error; a variant more than 2x fusegen's-or-1e-2 off is flagged).

    python3 benchmarks/attention_anchors.py [--cases causal full ...] [--out FILE.json]

Cases (B, H, Sq, Skv, D):
    causal           4, 32, 4096, 4096, 128, causal, forward
    full             4, 32, 4096, 4096, 128, no mask, forward
    softcap          4, 32, 4096, 4096, 128, causal + softcap 30, forward (SDPA has no softcap)
    causal-backward  4, 32, 4096, 4096, 128, causal, forward + backward
    causal-d64       16, 16, 1024, 1024, 64, causal, forward
    decode           1, 32, 1, 16384, 128, one query against a long cache (the split-KV path)
    decode-batch     16, 32, 1, 4096, 128, sixteen sequences (enough programs unsplit)
    decode-gqa       16, 32 (8 kv heads), 1, 4096, 128, LLaMA-3's grouped heads: the packed
                     decode path (SDPA with enable_gqa)
    bias             2, 32, 2048, 2048, 128, an additive bf16 bias [1, 32, 2048, 2048] (T5's
                     relative positions: SDPA's attn_mask, FlexAttention's score_mod), forward
    bias-backward    the same, forward + backward with the bias's gradient (fusegen, Flex)
Times: triton.testing.do_bench medians (ms); the decode cases also replayed from a CUDA
graph (do_bench_cudagraph: the GPU's time without the host's launches).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # name: (module, (B, H, Sq, Skv, D), backward)
    "causal": ("anchor_attention_causal", (4, 32, 4096, 4096, 128), False),
    "full": ("anchor_attention_full", (4, 32, 4096, 4096, 128), False),
    "softcap": ("anchor_attention_softcap", (4, 32, 4096, 4096, 128), False),
    "causal-backward": ("anchor_attention_causal", (4, 32, 4096, 4096, 128), True),
    "causal-d64": ("anchor_attention_causal_d64", (16, 16, 1024, 1024, 64), False),
    "decode": ("anchor_attention_full", (1, 32, 1, 16384, 128), False),
    "decode-batch": ("anchor_attention_full", (16, 32, 1, 4096, 128), False),
    "decode-gqa": ("anchor_attention_gqa", (16, 32, 1, 4096, 128), False),
    "bias": ("anchor_attention_bias", (2, 32, 2048, 2048, 128), False),
    "bias-backward": ("anchor_attention_bias", (2, 32, 2048, 2048, 128), True),
}
SOFTCAP = 30.0


def build(folder: Path) -> None:
    spec = ROOT / "benchmarks" / "specs" / "attention_anchors.yaml"
    command = [sys.executable, "-m", "fusegen", "build", str(spec), "--out", str(folder)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")


def load(folder: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def variants(module, causal: bool, softcap: float | None):
    """name -> f(q, k, v[, bias]) -> out, for every anchor that has this case."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = {"fusegen": getattr(module, module.__name__)}
    if softcap is None:
        for name, backend in (
            ("sdpa flash", SDPBackend.FLASH_ATTENTION),
            ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
            ("sdpa efficient", SDPBackend.EFFICIENT_ATTENTION),
        ):

            def sdpa(q, k, v, *bias, backend=backend):
                with sdpa_kernel(backend):
                    mask = bias[0] if bias else None
                    return F.scaled_dot_product_attention(
                        q,
                        k,
                        v,
                        attn_mask=mask,
                        is_causal=causal,
                        enable_gqa=q.shape[1] != k.shape[1],
                    )

            out[name] = sdpa
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return out
    flex = torch.compile(flex_attention)
    masks = {}

    def flex_call(q, k, v, *bias):
        key = (q.shape[0], q.shape[2], k.shape[2])
        if causal and key not in masks:
            masks[key] = create_block_mask(
                lambda b, h, i, j: i >= j, None, None, q.shape[2], k.shape[2], device=q.device
            )
        score_mod = None
        if softcap is not None:

            def score_mod(score, b, h, i, j):
                return softcap * torch.tanh(score / softcap)

        elif bias:

            def score_mod(score, b, h, i, j):
                return score + bias[0][0, h, i, j]

        gqa = q.shape[1] != k.shape[1]
        return flex(q, k, v, score_mod=score_mod, block_mask=masks.get(key), enable_gqa=gqa)

    out["flex (compiled)"] = flex_call
    return out


def math_reference(q, k, v, causal, softcap, bias=None):
    q, k, v = (t.float() for t in (q, k, v))
    k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.float()
    if causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, -1) @ v


def graph_ms(call) -> float | None:
    """The call's time replayed from a CUDA graph (None where it cannot be captured)."""
    from triton.testing import do_bench_cudagraph

    try:
        with torch.no_grad():
            return do_bench_cudagraph(call)
    except Exception as exc:  # a variant that cannot be captured is a result too
        print(f"  no CUDA graph: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
        return None


def run_case(name, module, shape, backward):
    from triton.testing import do_bench

    batch, heads, sq, skv, dim = shape
    causal = "causal" in name or name == "softcap"
    softcap = SOFTCAP if name == "softcap" else None
    torch.manual_seed(0)
    q = torch.randn(batch, heads, sq, dim, device="cuda", dtype=torch.bfloat16)
    kv_heads = module.KV_HEADS
    k, v = (
        torch.randn(batch, kv_heads, skv, dim, device="cuda", dtype=torch.bfloat16) for _ in "kv"
    )
    bias = []
    if name.startswith("bias"):
        bias = [torch.randn(1, heads, sq, skv, device="cuda", dtype=torch.bfloat16)]
    # The error check on one batch and 8 heads: the fp32 scores of the whole case are 8 GB.
    few_kv = 8 * kv_heads // heads  # the kv heads of the first 8 query heads
    want = math_reference(
        q[:1, :8], k[:1, :few_kv], v[:1, :few_kv], causal, softcap, *[b[:, :8] for b in bias]
    )
    grad = torch.randn_like(q)
    row = {}
    for variant, call in variants(module, causal, softcap).items():
        if backward and bias and variant.startswith("sdpa"):
            continue  # SDPA's attn_mask takes no gradient on every backend
        try:
            with torch.no_grad():
                got = call(q, k, v, *bias)
            error = ((got[:1, :8].float() - want).norm() / want.norm()).item()
            if backward:
                leaves = [t.detach().requires_grad_() for t in (q, k, v, *bias)]

                def step(call=call, leaves=leaves):
                    torch.autograd.grad(call(*leaves), leaves, grad)

                ms = do_bench(step)
            else:
                with torch.no_grad():
                    ms = do_bench(lambda call=call: call(q, k, v, *bias))
            row[variant] = {"ms": ms, "error": error}
            if name.startswith("decode"):
                # A decode call is launch-bound: its time from a CUDA graph of it (the
                # GPU's alone) beside do_bench's, which moves with the host between runs.
                row[variant]["graph_ms"] = graph_ms(lambda call=call: call(q, k, v, *bias))
        except Exception as exc:  # a backend without this case is a result to report
            row[variant] = {"error_text": f"{type(exc).__name__}: {str(exc)[:200]}"}
        print(f"{name} {variant}: {row[variant]}", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", help="write every number here as JSON")
    args = parser.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": {}}
    with tempfile.TemporaryDirectory() as folder:
        build(Path(folder))
        for case in args.cases:
            module_name, shape, backward = CASES[case]
            module = load(Path(folder), module_name)
            report["cases"][case] = {"shape": shape, **run_case(case, module, shape, backward)}
    print(
        "\n| case | B, H, Sq, Skv, D | "
        + " | ".join(["fusegen", "best SDPA", "flex (compiled)"])
        + " |"
    )
    print("| --- | --- | ---: | ---: | ---: |")
    failed = False
    for case, row in report["cases"].items():
        timed = {k: v for k, v in row.items() if isinstance(v, dict) and "ms" in v}
        sdpa = [v["ms"] for k, v in timed.items() if k.startswith("sdpa")]
        cells = [
            f"{timed['fusegen']['ms']:.3f}" if "fusegen" in timed else "failed",
            f"{min(sdpa):.3f}" if sdpa else "-",
            f"{timed['flex (compiled)']['ms']:.3f}" if "flex (compiled)" in timed else "-",
        ]
        print(f"| {case} | {', '.join(map(str, row['shape']))} | " + " | ".join(cells) + " |")
        mine = timed.get("fusegen", {}).get("error")
        failed |= (
            mine is None or mine > 2 * min((v["error"] for v in timed.values()), default=1) + 1e-2
        )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"\n{'FAIL' if failed else 'PASS'}: fusegen ran every case, within 2x the best error + 1e-2"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
