"""The attention targets (issues 16 and 29) on one GPU: the generated attention kernels
(benchmarks/specs/attention_anchors.yaml, built into a temporary folder or taken from
--built) against F.scaled_dot_product_attention on each backend (flash, cuDNN, efficient)
and compiled FlexAttention with the same mask, bias and score mod. Each variant's output
(and, for a backward case, dq, dk and dv) is checked against fp32 math attention on the
first batch entry and 8 heads (norm-wise relative error; fusegen more than 2x the best
anchor's + 1e-2 off fails the run). Then every variant of a case is timed in interleaved
rounds, each round in a rotated order (do_bench medians; the row prints the median of the
rounds, their spread and TFLOP/s), so that a clock drift between calls cannot flip a verdict.

    python3 benchmarks/attention_anchors.py [--cases causal full ...] [--rounds 3]
        [--built FOLDER] [--profile] [--host] [--anchors sdpa flex tl summed]
        [--out FILE.json]
    TRITON_INTERPRET=1 python3 benchmarks/attention_anchors.py --check [--cases ...]
        (CPU: each case's inputs, checks and reference at small shapes, fusegen alone)

--profile: each variant's kernels in one call (torch.profiler), to see where a row's
time goes. --host: each variant's host time per step against its wall time per step (the
host runs ahead of the GPU unless something waits for it), and the CPU ops and Python
functions that took the most host time.

Cases (B, H[/KV heads], Sq, Skv, D[/Dv]); "+ backward": forward + backward:
    causal               4, 32, 4096, 4096, 128, causal
    full                 the same, no mask
    softcap              the same, causal + softcap 30 (SDPA has none)
    causal-backward      causal, + backward
    causal-d64           16, 16, 1024, 1024, 64, causal
    full-d64             the same, no mask
    gqa-d64              4, 32/8, 4096, 4096, 64, causal (LLaMA-3.2-1B's heads)
    gqa-d64-backward     the same, + backward (no target: LLaMA-3.2-1B's training step)
    gqa, gqa-backward    4, 28/4, 4096, 4096, 128, causal (Qwen2-7B's heads)
    d96, d96-backward    4, 32, 4096, 4096, 96, causal (Phi-3-mini's head dim)
    mla, mla-backward    4, 16, 4096, 4096, 192/128, causal (DeepSeek-V2-Lite: q, k 192, v 128)
    alibi                4, 32, 4096, 4096, 128, causal + ALiBi (SDPA: none)
    window               4, 32/8, 4096, 4096, 128, causal, a 1024-key window (SDPA: none)
    padding-bias, padding-bias-backward
                         32, 12, 512, 512, 64, fp16, BERT's padding mask as an additive bias
                         [32, 1, 1, 512] (finfo.min past each sequence's length)
    learned-bias-backward
                         32, 8, 512, 512, 64, unscaled, T5's learned bias [1, 8, 512, 512]
                         with its gradient, + backward
    bias, bias-backward  2, 32, 2048, 2048, 128, a bf16 bias [1, 32, 2048, 2048]; its
                         gradient in the backward case (fusegen, Flex)
    decode               1, 32, 1, 16384, 128, one query against a long cache (split keys)
    decode-batch         16, 32, 1, 4096, 128, sixteen sequences (enough programs unsplit)
    decode-gqa           16, 32/8, 1, 4096, 128, LLaMA-3's grouped heads (packed decode)
The decode cases are also replayed from a CUDA graph (graph_ms: the GPU's time alone).
FLOPs: 2 * (D + Dv) per visible (query, key) pair in the forward, 2.5 times that in the
backward (its five matmuls), as FlashAttention counts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
BF16, FP16 = torch.bfloat16, torch.float16
CASES = {  # name: (module, (B, H, Sq, Skv, D), backward, bias kind or None, dtype)
    "causal": ("anchor_attention_causal", (4, 32, 4096, 4096, 128), False, None, BF16),
    "full": ("anchor_attention_full", (4, 32, 4096, 4096, 128), False, None, BF16),
    "softcap": ("anchor_attention_softcap", (4, 32, 4096, 4096, 128), False, None, BF16),
    "causal-backward": ("anchor_attention_causal", (4, 32, 4096, 4096, 128), True, None, BF16),
    "causal-d64": ("anchor_attention_causal_d64", (16, 16, 1024, 1024, 64), False, None, BF16),
    "full-d64": ("anchor_attention_full_d64", (16, 16, 1024, 1024, 64), False, None, BF16),
    "gqa-d64": ("anchor_attention_gqa_d64", (4, 32, 4096, 4096, 64), False, None, BF16),
    "gqa-d64-backward": ("anchor_attention_gqa_d64", (4, 32, 4096, 4096, 64), True, None, BF16),
    "gqa": ("anchor_attention_gqa28", (4, 28, 4096, 4096, 128), False, None, BF16),
    "gqa-backward": ("anchor_attention_gqa28", (4, 28, 4096, 4096, 128), True, None, BF16),
    "d96": ("anchor_attention_d96", (4, 32, 4096, 4096, 96), False, None, BF16),
    "d96-backward": ("anchor_attention_d96", (4, 32, 4096, 4096, 96), True, None, BF16),
    "mla": ("anchor_attention_mla", (4, 16, 4096, 4096, 192), False, None, BF16),
    "mla-backward": ("anchor_attention_mla", (4, 16, 4096, 4096, 192), True, None, BF16),
    "alibi": ("anchor_attention_alibi", (4, 32, 4096, 4096, 128), False, None, BF16),
    "window": ("anchor_attention_window", (4, 32, 4096, 4096, 128), False, None, BF16),
    "padding-bias": ("anchor_attention_bert", (32, 12, 512, 512, 64), False, "padding", FP16),
    "padding-bias-backward": (
        "anchor_attention_bert", (32, 12, 512, 512, 64), True, "padding", FP16
    ),
    "learned-bias-backward": (
        "anchor_attention_t5", (32, 8, 512, 512, 64), True, "learned", BF16
    ),
    "bias": ("anchor_attention_bias", (2, 32, 2048, 2048, 128), False, "heads", BF16),
    "bias-backward": ("anchor_attention_bias", (2, 32, 2048, 2048, 128), True, "learned", BF16),
    "decode": ("anchor_attention_full", (1, 32, 1, 16384, 128), False, None, BF16),
    "decode-batch": ("anchor_attention_full", (16, 32, 1, 4096, 128), False, None, BF16),
    "decode-gqa": ("anchor_attention_gqa", (16, 32, 1, 4096, 128), False, None, BF16),
}  # fmt: skip
# Issue 29's targets: case -> (the anchors the row is held against: the best SDPA backend
# (cuDNN where it runs) and/or compiled Flex, the ratio fusegen must reach against each).
TARGETS = {
    **{case: (("sdpa",), 1.0) for case in (
        "causal", "full", "causal-d64", "full-d64", "gqa", "gqa-d64", "causal-backward",
        "gqa-backward")},
    **{case: (("sdpa",), 0.95) for case in ("d96", "d96-backward", "mla", "mla-backward")},
    **{case: (("sdpa", "flex"), 1.0) for case in (
        "padding-bias", "padding-bias-backward", "learned-bias-backward")},
    **{case: (("flex",), 1.5) for case in ("softcap", "alibi", "window")},
}  # fmt: skip
DEVICE = "cuda"  # --check: "cpu", under the interpreter
CAUSAL_MODULES = {
    "anchor_attention_causal", "anchor_attention_softcap", "anchor_attention_causal_d64",
    "anchor_attention_gqa", "anchor_attention_gqa28", "anchor_attention_gqa_d64",
    "anchor_attention_d96",
    "anchor_attention_mla", "anchor_attention_alibi", "anchor_attention_window",
}  # fmt: skip


SPEC = ROOT / "benchmarks" / "specs" / "attention_anchors.yaml"


def build(folder: Path, spec: Path = SPEC) -> None:
    command = [sys.executable, "-m", "fusegen", "build", str(spec), "--out", str(folder)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")


def load(folder: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Mods:
    """What a case adds to plain attention, read off its module: the scale, softcap,
    causal mask, window, ALiBi slopes; the bias is passed with the call."""

    def __init__(self, module):
        self.scale = module.SCALE
        self.softcap = getattr(module, "SOFTCAP", None)
        self.causal = module.__name__ in CAUSAL_MODULES
        self.window = getattr(module, "WINDOW", None)
        slopes = getattr(module, "ALIBI_SLOPES", None)
        self.slopes = torch.tensor(slopes) if slopes else None

    def sdpa_can(self) -> bool:
        return self.softcap is None and self.window is None and self.slopes is None


def variants(module, mods: Mods, anchors=("sdpa", "flex")):
    """name -> f(q, k, v[, bias]) -> out, for every anchor that has this case."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = {"fusegen": getattr(module, module.__name__)}
    if DEVICE == "cpu":  # --check: the cases' own checks, no anchors
        return out
    if "tl" in anchors and module._ATTENTION.hopper:
        # The same module without its Hopper (Gluon) path: the `tl` kernels it runs
        # elsewhere, to see what the Gluon kernels gain in the same rounds.
        twin = load(Path(module.__file__).parent, module.__name__)
        twin._ATTENTION.hopper = None
        out["fusegen tl"] = getattr(twin, module.__name__)
    if "summed" in anchors and module._ATTENTION.bias:
        # The same module with a shared bias's gradient summed over the batch by the dq
        # kernel (fp32 [batch / chunk, heads, q_len, k_len]), where it runs by default
        # only past Attention.bias_grad_buffer_cap.
        twin = load(Path(module.__file__).parent, module.__name__)
        twin._ATTENTION.bias_grad_buffer_cap = 0
        out["fusegen summed"] = getattr(twin, module.__name__)
    if mods.sdpa_can() and "sdpa" in anchors:
        for name, backend in (
            ("sdpa flash", SDPBackend.FLASH_ATTENTION),
            ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
            ("sdpa efficient", SDPBackend.EFFICIENT_ATTENTION),
        ):

            def sdpa(q, k, v, *bias, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(
                        q,
                        k,
                        v,
                        attn_mask=bias[0] if bias else None,
                        # SDPA's causal mask is top-left; at one query (decode) the
                        # query is the last position and sees every key.
                        is_causal=mods.causal and q.shape[2] > 1,
                        scale=mods.scale,
                        enable_gqa=q.shape[1] != k.shape[1],
                    )

            out[name] = sdpa
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return out
    if "flex" not in anchors:
        return out
    flex = torch.compile(flex_attention)
    masks = {}

    def mask_of(offset):
        """Query i at key i + offset (Skv - Sq: bottom-right, as the modules count)."""

        def mask_mod(b, h, i, j):
            keep = i + offset >= j
            if mods.window:
                keep = keep & (i + offset - j < mods.window)
            return keep

        return mask_mod

    def flex_call(q, k, v, *bias):
        key = (q.shape[0], q.shape[2], k.shape[2])
        if mods.causal and key not in masks:
            masks[key] = create_block_mask(
                mask_of(k.shape[2] - q.shape[2]), None, None, q.shape[2], k.shape[2],
                device=q.device,
            )  # fmt: skip
        score_mod = None
        if mods.softcap is not None:

            def score_mod(score, b, h, i, j):
                return mods.softcap * torch.tanh(score / mods.softcap)

        elif mods.slopes is not None:
            slopes = mods.slopes.to(q.device)

            def score_mod(score, b, h, i, j):
                return score + slopes[h] * (j - i)

        elif bias and bias[0].shape[1] == 1:  # a padding mask: [B, 1, 1, Skv]

            def score_mod(score, b, h, i, j):
                return score + bias[0][b, 0, 0, j]

        elif bias:

            def score_mod(score, b, h, i, j):
                return score + bias[0][0, h, i, j]

        gqa = q.shape[1] != k.shape[1]
        return flex(
            q, k, v, score_mod=score_mod, block_mask=masks.get(key), scale=mods.scale,
            enable_gqa=gqa,
        )  # fmt: skip

    out["flex (compiled)"] = flex_call
    return out


def math_reference(q, k, v, mods: Mods, bias=None):
    """fp32 math attention with the case's mods (query i at key i + Skv - Sq)."""
    q, k, v = (t.float() for t in (q, k, v))
    k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) * mods.scale
    if mods.softcap is not None:
        scores = mods.softcap * torch.tanh(scores / mods.softcap)
    sq, skv = scores.shape[-2:]
    rows = torch.arange(sq, device=q.device)[:, None] + (skv - sq)
    keys = torch.arange(skv, device=q.device)[None, :]
    if mods.slopes is not None:
        slopes = mods.slopes[: q.shape[1]].to(q.device)[:, None, None]
        scores = scores + slopes * (keys - rows)
    if bias is not None:
        scores = scores + bias.float()
    keep = torch.ones_like(keys - rows, dtype=torch.bool)
    if mods.causal:
        keep = keep & (keys <= rows)
    if mods.window:
        keep = keep & (keys > rows - mods.window)
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, -1) @ v


def flops(shape, dv, mods: Mods, backward: bool) -> float:
    """2 (D + Dv) per visible (query, key) pair; times 3.5 with the backward."""
    batch, heads, sq, skv, dim = shape
    rows = torch.arange(sq)[:, None] + (skv - sq)
    keys = torch.arange(skv)[None, :]
    keep = torch.ones(sq, skv, dtype=torch.bool)
    if mods.causal:
        keep &= keys <= rows
    if mods.window:
        keep &= keys > rows - mods.window
    return 2.0 * (dim + dv) * batch * heads * keep.sum().item() * (3.5 if backward else 1.0)


def graph_ms(call) -> float | None:
    """The call's time replayed from a CUDA graph (None where it cannot be captured)."""
    from triton.testing import do_bench_cudagraph

    try:
        with torch.no_grad():
            return do_bench_cudagraph(call)
    except Exception as exc:  # a variant that cannot be captured is a result too
        print(f"  no CUDA graph: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
        return None


def host_report(step, steps=30) -> None:
    """A step's host time (enqueueing `steps` steps, no wait) beside its wall time (until
    the GPU is done): a host time near the wall time is a host-bound step; then the CPU
    ops by their own time (a cudaStreamSynchronize or a device-to-host copy is a wait for
    the GPU inside the step) and the Python functions by theirs."""
    import cProfile
    import pstats
    import time

    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    host = (time.perf_counter() - start) / steps
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / steps
    print(f"  host {host * 1e6:.0f} us/step, wall {wall * 1e6:.0f} us/step", flush=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
        torch.cuda.synchronize()
    ops = sorted(prof.key_averages(), key=lambda op: -op.self_cpu_time_total)[:10]
    for op in ops:
        print(f"  {op.self_cpu_time_total:9.1f} {op.count:3d}  {op.key[:100]}", flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:12]  # own time
    for (file, line, function), (_, calls, own, total, _) in rows:
        where = f"{Path(file).name}:{line} {function}"
        print(
            f"  py {own / steps * 1e6:7.1f} us own {total / steps * 1e6:7.1f} us total "
            f"{calls // steps:3d}x  {where[:90]}",
            flush=True,
        )


def make_bias(kind, shape, dtype):
    """The case's bias: T5-style per-head [1, H, Sq, Skv] (learned: with grad), or BERT's
    padding mask [B, 1, 1, Skv], finfo.min past a length drawn in [Skv / 2, Skv]."""
    batch, heads, sq, skv, _ = shape
    if kind == "padding":
        lengths = torch.randint(skv // 2, skv + 1, (batch,), device=DEVICE)
        keys = torch.arange(skv, device=DEVICE)
        pad = (keys[None, :] >= lengths[:, None])[:, None, None, :]
        return torch.zeros(batch, 1, 1, skv, device=DEVICE, dtype=dtype).masked_fill(
            pad, torch.finfo(dtype).min
        )
    bias = torch.randn(1, heads, sq, skv, device=DEVICE, dtype=dtype)
    return bias.requires_grad_() if kind == "learned" else bias


def _error(got, want):
    return ((got.float() - want).norm() / want.norm()).item()


def check_case(name, module, shape, backward, bias_kind, dtype, anchors=("sdpa", "flex")):
    """(callables by variant, their errors, FLOPs): each variant's out (backward: dq, dk,
    dv) against fp32 math attention on the first batch entry and 8 heads; a learned
    bias's gradient (shared by the batch: summed over it) on those heads' every entry."""
    batch, heads, sq, skv, dim = shape
    mods = Mods(module)
    torch.manual_seed(0)
    kv_heads, dv = module.KV_HEADS, module.V_HEAD_DIM
    q = torch.randn(batch, heads, sq, dim, device=DEVICE, dtype=dtype)
    k = torch.randn(batch, kv_heads, skv, dim, device=DEVICE, dtype=dtype)
    v = torch.randn(batch, kv_heads, skv, dv, device=DEVICE, dtype=dtype)
    bias = [make_bias(bias_kind, shape, dtype)] if bias_kind else []
    group = heads // kv_heads
    few_kv = max(1, 8 // group)  # the first 8 query heads or so, whole groups
    few_q = few_kv * group
    few = [q[:1, :few_q].detach()] + [t[:1, :few_kv].detach() for t in (k, v)]
    few_bias = [b[:1, :few_q].detach() for b in bias]
    d_out = torch.randn(batch, heads, sq, dv, device=DEVICE, dtype=dtype)
    if backward:
        leaves32 = [t.float().requires_grad_() for t in few]
        want = torch.autograd.grad(
            math_reference(*leaves32, mods, *few_bias), leaves32, d_out[:1, :few_q].float()
        )
        if bias_kind == "learned":
            heads32 = [q[:, :few_q].float()] + [t[:, :few_kv].float() for t in (k, v)]
            bias32 = bias[0][:, :few_q].detach().float().requires_grad_()
            out32 = math_reference(*heads32, mods, bias32)
            want = (*want, *torch.autograd.grad(out32, bias32, d_out[:, :few_q].float()))
    else:
        want = (math_reference(*few, mods, *few_bias),)
    calls, errors = {}, {}
    for variant, call in variants(module, mods, anchors).items():
        try:
            if backward:
                inputs = [t.detach().requires_grad_() for t in (q, k, v)] + bias
                leaves = [t for t in inputs if t.requires_grad]  # a padding mask takes none
                got = torch.autograd.grad(call(*inputs), leaves, d_out)

                def step(call=call, inputs=inputs, leaves=leaves):
                    torch.autograd.grad(call(*inputs), leaves, d_out)

                errors[variant] = max(
                    _error(g[:1, : w.shape[1]], w) for g, w in zip(got, want, strict=False)
                )
            else:
                detached = [b.detach() for b in bias]
                with torch.no_grad():
                    got = call(q, k, v, *detached)

                def step(call=call, detached=detached):
                    with torch.no_grad():
                        call(q, k, v, *detached)

                errors[variant] = _error(got[:1, :few_q], want[0])
            calls[variant] = step
        except Exception as exc:  # a backend without this case is a result to report
            errors[variant] = f"{type(exc).__name__}: {str(exc)[:200]}"
        print(f"{name} {variant}: error {errors[variant]}", flush=True)
    return calls, errors, flops(shape, dv, mods, backward)


def run_case(
    name, module, shape, backward, bias_kind, dtype, rounds, profile=False,
    anchors=("sdpa", "flex"), host=False,
):  # fmt: skip
    calls, errors, work = check_case(name, module, shape, backward, bias_kind, dtype, anchors)
    if DEVICE == "cpu":
        return {"errors": errors}
    if profile:
        from training_chains import kernel_profile

        for variant, step in calls.items():
            print(f"{name} {variant}: its kernels in one call (us, calls)", flush=True)
            for kernel, us, count in kernel_profile(step, DEVICE)[:8]:
                print(f"  {us:9.1f} {count:3d}  {kernel[:110]}", flush=True)
    if host:
        for variant, step in calls.items():
            print(f"{name} {variant}: host and wall time per step", flush=True)
            host_report(step)
    from triton.testing import do_bench

    times = {variant: [] for variant in calls}
    order = list(calls)
    for r in range(rounds):
        for variant in order[r % len(order) :] + order[: r % len(order)]:
            times[variant].append(do_bench(calls[variant]))
    row = {}
    for variant, error in errors.items():
        if variant not in calls:
            row[variant] = {"error_text": error}
            continue
        ms = statistics.median(times[variant])
        row[variant] = {
            "ms": ms, "rounds": times[variant], "error": error, "tflops": work / ms * 1e-9,
        }  # fmt: skip
        if name.startswith("decode"):
            # A decode call is launch-bound: its time from a CUDA graph of it (the
            # GPU's alone) beside do_bench's, which moves with the host between runs.
            row[variant]["graph_ms"] = graph_ms(calls[variant])
        print(
            f"{name} {variant}: {ms:.3f} ms [{min(times[variant]):.3f}-"
            f"{max(times[variant]):.3f}] {work / ms * 1e-9:.0f} TFLOP/s",
            flush=True,
        )
    return row


def verdict(case, mine, sdpa, flex) -> str:
    """The row's issue 29 target and whether fusegen's median meets it against each of
    its anchors' medians (timed entries: {"ms": ...}, or None where it did not run)."""
    if case not in TARGETS:
        return "-"
    anchors, ratio = TARGETS[case]
    target = f">= {ratio:.2f}x {' and '.join(anchors)}"
    others = [{"sdpa": sdpa, "flex": flex}[anchor] for anchor in anchors]
    if mine is None or any(other is None for other in others):
        return f"{target}: not measured"
    met = min(other["ms"] / mine["ms"] for other in others) >= ratio
    return f"{target}: {'met' if met else 'missed'}"


def anchors_of(row):
    """(fusegen's timed entry, the fastest SDPA backend's name, its entry, Flex's entry,
    {variant: error} of the variants left out): only variants whose output is right
    (within 2x the best error + 1e-2) are anchors: a fast, wrong answer is no one to beat
    (the decode-gqa row once timed SDPA's and Flex's top-left causal mask at one query,
    which sees one key)."""
    timed = {k: v for k, v in row.items() if isinstance(v, dict) and "ms" in v}
    best = min((v["error"] for v in timed.values()), default=1)
    right = {k: v for k, v in timed.items() if v["error"] <= 2 * best + 1e-2}
    wrong = {k: v["error"] for k, v in timed.items() if k not in right}
    sdpa = min((k for k in right if k.startswith("sdpa")), key=lambda k: right[k]["ms"],
               default=None)  # fmt: skip
    return timed.get("fusegen"), sdpa, right.get(sdpa), right.get("flex (compiled)"), wrong


def _cell(entry):
    if not entry or "ms" not in entry:
        return "-"
    spread = f"{min(entry['rounds']):.3f}-{max(entry['rounds']):.3f}"
    return f"{entry['ms']:.3f} ({spread}, {entry['tflops']:.0f})"


def check(cases) -> int:
    """The cases' setup, checks and reference at small odd shapes on the CPU (fp16: the
    interpreter's bf16 dot is wrong), fusegen within 2e-2 of fp32 math attention."""
    global DEVICE
    DEVICE = "cpu"
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        build(Path(folder))
        for case in cases:
            module_name, (batch, heads, _, _, dim), backward, bias_kind, _ = CASES[case]
            seq = 1 if case.startswith("decode") else 37
            shape = (min(batch, 2), heads, seq, 45 if seq == 1 else seq, dim)
            module = load(Path(folder), module_name)
            errors = run_case(case, module, shape, backward, bias_kind, FP16, 0)["errors"]
            failed |= not isinstance(errors.get("fusegen"), float) or errors["fusegen"] > 2e-2
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--built", help="the anchors' modules already built here")
    parser.add_argument("--out", help="write every number here as JSON")
    parser.add_argument("--check", action="store_true", help="CPU, interpreter: small shapes")
    parser.add_argument("--profile", action="store_true", help="each variant's kernels")
    parser.add_argument("--host", action="store_true", help="each variant's host time per step")
    parser.add_argument(
        "--anchors", nargs="*", default=["sdpa", "flex"],
        choices=["sdpa", "flex", "tl", "summed"],
        help="the anchors to run (FlexAttention's compiles take most of a run's time; tl:"
        " the module's `tl` kernels where it has a Hopper path; summed: a shared bias's"
        " gradient summed over the batch by the dq kernel)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.check:
        return check(args.cases)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": {}}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.built) if args.built else Path(scratch)
        if not args.built:
            build(folder)
        for case in args.cases:
            module_name, shape, backward, bias_kind, dtype = CASES[case]
            module = load(folder, module_name)
            row = run_case(
                case, module, shape, backward, bias_kind, dtype, args.rounds, args.profile,
                args.anchors, args.host,
            )  # fmt: skip
            report["cases"][case] = {"shape": shape, **row}
            torch.compiler.reset()  # Flex's compiles of one case do not count toward the next's
    print(
        "\n| case | B, H, Sq, Skv, D | fusegen | best SDPA | flex (compiled) | vs SDPA | vs flex "
        "| issue 29 target |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"
    )
    print("ms (the rounds' spread, TFLOP/s)")
    failed, left_out = False, []
    for case, row in report["cases"].items():
        mine, sdpa_name, sdpa, flex, wrong = anchors_of(row)
        ratios = [
            f"{other['ms'] / mine['ms']:.2f}x" if mine and other else "-" for other in (
                sdpa, flex)
        ]  # fmt: skip
        cells = [_cell(mine), _cell(sdpa) + (f" {sdpa_name[5:]}" if sdpa_name else ""),
                 _cell(flex), *ratios, verdict(case, mine, sdpa, flex)]  # fmt: skip
        print(f"| {case} | {', '.join(map(str, row['shape']))} | " + " | ".join(cells) + " |")
        failed |= mine is None or "fusegen" in wrong
        left_out += [f"{case}: {variant} (error {error:.3g})" for variant, error in wrong.items()]
    if left_out:
        print("\nNot anchors, their output wrong: " + "; ".join(left_out))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"\n{'FAIL' if failed else 'PASS'}: fusegen ran every case, within 2x the best error + 1e-2"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
