"""The LM head's loss, forward + backward, on one GPU: time and memory of
cross_entropy(x @ W.T, labels) run six ways, and a LLaMA's training step with its loss
through a generated head.

    python benchmarks/lm_head_loss.py --built FOLDER [--rows ...] [--rounds 5]
        [--variants ...] [--model] [--baseline FOLDER] [--profile] [--out FILE.json]

Rows (bf16; labels uniform over the vocabulary, 10% of them -100):
    llama3       8,192 tokens x 4,096 -> 128,256 (LLaMA-3)
    llama3-32k   32,768 tokens, the same head
    qwen2        4,096 tokens x 3,584 -> 152,064 (Qwen2-7B)
    qwen2-zloss  the same with z_loss 1e-4 and label_smoothing 0.1 (CCE has neither)

Variants:
    eager        F.cross_entropy((x @ W.T).float(), y), as transformers' loss upcasts
    compile      torch.compile of eager (default mode)
    liger        Liger-Kernel's LigerFusedLinearCrossEntropyLoss (gradients in the forward)
    cce          cut-cross-entropy's linear_cross_entropy (impl "cce", its default
                 filter_eps "high": gradients below bf16's resolution skipped)
    fusegen      the generated head (FOLDER/<row's module>.py) as built: the backward makes
                 the logits again (four GEMMs), blocks of at most 64 MiB
    fusegen-before   --baseline FOLDER's build of the same module (a change against
                 the commit before it, in the same rounds)
    fusegen-recompute-MiB   the backward's way with blocks of 64 or 256 MiB
    fusegen-forward-MiB     the gradients made in the forward (three GEMMs: blocks of
                 whole vocabulary rows, dW summed over them), blocks of 256 or 1024 MiB

Each step: the loss, then torch.autograd.grad for x and W (an upstream gradient of 1).
"ms" is the step's wall time between CUDA events (each step runs 10-50 ms of GPU work,
so the host's share is small); the variants run in turn, in a rotated order, over
--rounds rounds; a row reports each variant's median and spread (min-max). "MB": the
step's peak allocation beyond what was allocated before it, less the gradients it
returns (dx and dW): what the loss itself costs in memory. Every variant's loss, dx and
dW are checked first against float64 on a slice of the shape (loss to 1e-3 relative,
gradients to 2e-2 norm-wise), so a fast but wrong variant shows.

--model: transformers' LlamaForCausalLM from a config (2 layers, LLaMA-3-8B's dims,
random init, no download), one training step on 4 x 2,048 tokens: its own loss
(logits in memory) against hidden states through the generated llama3 head; time,
peak memory, and every parameter's gradient error against a float64 copy of the model,
next to eager bf16's own error.

The modules: `fusegen build benchmarks/specs/lm_head.yaml --out FOLDER` (the GPU image
has no black: build on a machine with fusegen and carry the folder).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

IGNORE = -100


@dataclass(frozen=True)
class Row:
    name: str
    tokens: int
    hidden: int
    vocab: int
    module: str  # in --built
    z_loss: float = 0.0
    smoothing: float = 0.0


ROWS = {
    r.name: r
    for r in [
        Row("llama3", 8192, 4096, 128256, "llama3_lm_head"),
        Row("llama3-32k", 32768, 4096, 128256, "llama3_lm_head"),
        Row("qwen2", 4096, 3584, 152064, "qwen2_lm_head"),
        Row("qwen2-zloss", 4096, 3584, 152064, "qwen2_lm_head_zloss", 1e-4, 0.1),
    ]
}
VARIANTS = (
    "eager",
    "compile",
    "liger",
    "cce",
    "fusegen",
    "fusegen-before",
    "fusegen-recompute-64",
    "fusegen-recompute-256",
    "fusegen-forward-256",
    "fusegen-forward-1024",
)


BASELINE: Path | None = None  # --baseline


def load(folder: Path, name: str, as_name: str | None = None):
    as_name = as_name or name
    if as_name in sys.modules:
        return sys.modules[as_name]
    spec = importlib.util.spec_from_file_location(as_name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[as_name] = module
    spec.loader.exec_module(module)
    return module


def eager_loss(row: Row):
    def loss(x, w, y):
        logits = (x @ w.T).float()
        out = F.cross_entropy(logits, y, ignore_index=IGNORE, label_smoothing=row.smoothing)
        if row.z_loss:
            lse = torch.logsumexp(logits, -1)
            kept = y != IGNORE
            out = out + row.z_loss * (lse[kept] ** 2).sum() / kept.sum()
        return out

    return loss


def variant(name: str, row: Row, folder: Path):
    """The loss function of one variant (x, W, y) -> scalar, or a reason it cannot run."""
    if name == "eager":
        return eager_loss(row)
    if name == "compile":
        return torch.compile(eager_loss(row))
    if name == "liger":
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        except ImportError as exc:
            return f"no liger_kernel ({exc})"
        # Its lse_square_scale is this z-loss (z * lse**2 a token, over the counted ones).
        module = LigerFusedLinearCrossEntropyLoss(
            ignore_index=IGNORE, lse_square_scale=row.z_loss, label_smoothing=row.smoothing
        )
        return lambda x, w, y: module(w, x, y)
    if name == "cce":
        if row.z_loss or row.smoothing:
            return "CCE has no z-loss or smoothing"
        try:
            from cut_cross_entropy import linear_cross_entropy
        except ImportError as exc:
            return f"no cut_cross_entropy ({exc})"
        return lambda x, w, y: linear_cross_entropy(x, w, y, ignore_index=IGNORE)
    if name == "fusegen-before":  # --baseline's build of the same spec
        if BASELINE is None:
            return "no --baseline"
        module = load(BASELINE, row.module, as_name=f"{row.module}_before")
        return getattr(module, row.module)
    module = load(folder, row.module)
    launcher = getattr(module, row.module)
    if name == "fusegen":
        return launcher
    _, how, mib = name.split("-")  # fusegen-recompute-256, fusegen-forward-1024

    def configured(x, w, y):
        saved = module.GRADIENTS_IN_FORWARD, module.BLOCK_BYTES, module.FORWARD_GRADS_BLOCK_BYTES
        module.GRADIENTS_IN_FORWARD = how == "forward"
        module.BLOCK_BYTES = module.FORWARD_GRADS_BLOCK_BYTES = int(mib) << 20
        try:
            return launcher(x, w, y)
        finally:
            module.GRADIENTS_IN_FORWARD, module.BLOCK_BYTES, module.FORWARD_GRADS_BLOCK_BYTES = (
                saved
            )

    return configured


def inputs(row: Row, tokens: int | None = None, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = tokens or row.tokens
    x = torch.randn(t, row.hidden, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(row.vocab, row.hidden, device="cuda", generator=g, dtype=torch.bfloat16)
    w = w * row.hidden**-0.5
    y = torch.randint(0, row.vocab, (t,), device="cuda", generator=g)
    y[torch.rand(t, device="cuda", generator=g) < 0.1] = IGNORE
    return x, w, y


def step(fn, x, w, y):
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    loss = fn(xr, wr, y)
    loss = loss[0] if isinstance(loss, tuple) else loss
    dx, dw = torch.autograd.grad(loss, (xr, wr))
    return loss, dx, dw


def check(name, fn, row: Row) -> str:
    """Loss and gradients on 2,048 tokens against float64: each error and its ratio to
    eager bf16's."""
    x, w, y = inputs(row, tokens=2048, seed=1)
    ref = step(eager_loss(row), x.double(), w.double(), y)
    got = step(fn, x, w, y)
    eager = step(eager_loss(row), x, w, y)

    def error(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    errors = [error(g, r) for g, r in zip(got, ref, strict=True)]
    ratios = [e / max(error(g, r), 1e-30) for e, g, r in zip(errors, eager, ref, strict=True)]
    bad = errors[0] > 1e-3 or errors[1] > 2e-2 or errors[2] > 2e-2
    text = ", ".join(
        f"{k} {e:.1e} ({q:.2f}x eager)"
        for k, e, q in zip(("loss", "dx", "dW"), errors, ratios, strict=True)
    )
    return ("WRONG " if bad else "") + text


def timed(fn, x, w, y) -> tuple[float, float]:
    """(ms, MB beyond what was allocated and the returned gradients) of one step."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    loss, dx, dw = step(fn, x, w, y)
    end.record()
    torch.cuda.synchronize()
    grads = dx.numel() * dx.element_size() + dw.numel() * dw.element_size()
    peak = torch.cuda.max_memory_allocated() - base - grads
    del loss, dx, dw
    return start.elapsed_time(end), peak / 2**20


def run_row(row: Row, names, folder: Path, rounds: int) -> dict:
    fns, results = {}, {}
    for name in names:
        fn = variant(name, row, folder)
        if isinstance(fn, str):
            results[name] = {"skipped": fn}
            continue
        try:
            results[name] = {"check": check(name, fn, row)}
            fns[name] = fn
        except torch.OutOfMemoryError as exc:
            results[name] = {"skipped": f"out of memory in the check: {exc}"[:120]}
        torch.cuda.empty_cache()
    x, w, y = inputs(row)
    for name, fn in list(fns.items()):  # warm: compile, autotune, allocator
        try:
            timed(fn, x, w, y)
        except torch.OutOfMemoryError:
            results[name]["skipped"] = "out of memory"
            del fns[name]
        torch.cuda.empty_cache()
    order = list(fns)
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)] if order else []:
            ms, mb = timed(fns[name], x, w, y)
            results[name].setdefault("ms", []).append(ms)
            results[name]["MB"] = max(results[name].get("MB", 0.0), mb)
            torch.cuda.empty_cache()
    return results


def table(row: Row, results: dict) -> str:
    lines = [
        f"\n{row.name}: {row.tokens} x {row.hidden} -> {row.vocab}"
        + (f", z_loss {row.z_loss}, smoothing {row.smoothing}" if row.z_loss else ""),
        "| variant | ms (median) | spread | MB beyond inputs and grads | check vs float64 |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        if "ms" not in r:
            lines.append(f"| {name} | – | – | – | {r.get('skipped', '')} {r.get('check', '')} |")
            continue
        ms = r["ms"]
        lines.append(
            f"| {name} | {statistics.median(ms):.2f} | {min(ms):.2f}-{max(ms):.2f} | "
            f"{r['MB']:,.0f} | {r['check']} |"
        )
    return "\n".join(lines)


def profile(row: Row, names, folder: Path) -> str:
    """Each fusegen variant's kernels in one step (torch.profiler): the ten longest."""
    x, w, y = inputs(row)
    lines = []
    for name in names:
        fn = variant(name, row, folder)
        if isinstance(fn, str) or not name.startswith("fusegen"):
            continue
        step(fn, x, w, y)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step(fn, x, w, y)
            torch.cuda.synchronize()
        table_text = prof.key_averages().table(sort_by="cuda_time_total", row_limit=10)
        lines += [f"\nprofile: {name}", table_text]
    return "\n".join(lines)


def model_step(folder: Path, rounds: int) -> str:
    """A 2-layer LLaMA-3-8B-shaped model: its own loss against the generated head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    head = load(folder, "llama3_lm_head")
    config = LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=4096, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialised on the GPU: seconds, not a minute on the host
        model64 = LlamaForCausalLM(config).double()
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.load_state_dict(model64.state_dict())
    ids = torch.randint(0, config.vocab_size, (4, 2048), device="cuda")
    labels = ids.clone()
    labels[:, :100] = IGNORE  # a prompt without loss

    def hf_loss(m):
        return m(input_ids=ids, labels=labels).loss

    def ours_loss(m):
        hidden = m.model(input_ids=ids).last_hidden_state[:, :-1]
        shifted = labels[:, 1:]
        return head.llama3_lm_head(
            hidden.reshape(-1, hidden.shape[-1]), m.lm_head.weight, shifted.reshape(-1)
        )

    def grads(m, loss_fn):
        m.zero_grad(set_to_none=True)
        loss = loss_fn(m)
        loss.backward()
        return loss.detach(), {n: p.grad.detach().clone() for n, p in m.named_parameters()}

    ref_loss, ref = grads(model64, hf_loss)
    lines = ["\nmodel: LlamaForCausalLM, 2 layers, LLaMA-3-8B dims, 4 x 2048 tokens, bf16"]
    errors = {}
    for name, fn in (("transformers", hf_loss), ("fusegen head", ours_loss)):
        loss, got = grads(model, fn)
        errors[name] = {
            n: ((g.double() - ref[n]).norm() / ref[n].norm()).item() for n, g in got.items()
        }
        lines.append(f"{name}: loss {loss.item():.6f} (float64 {ref_loss.item():.6f})")
    ratio = max(errors["fusegen head"][n] / max(errors["transformers"][n], 1e-30) for n in ref)
    worst = max(
        ref, key=lambda n: errors["fusegen head"][n] / max(errors["transformers"][n], 1e-30)
    )
    lines.append(
        "gradient error vs float64, fusegen / transformers, worst parameter: "
        f"{ratio:.2f}x ({worst})"
    )
    del model64, ref
    torch.cuda.empty_cache()
    times = {"transformers": [], "fusegen head": []}
    peaks = {}
    for r in range(rounds + 1):
        for name, fn in (("transformers", hf_loss), ("fusegen head", ours_loss))[
            :: 1 if r % 2 else -1
        ]:
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(model).backward()
            end.record()
            torch.cuda.synchronize()
            if r:
                times[name].append(start.elapsed_time(end))
            peaks[name] = (torch.cuda.max_memory_allocated() - base) / 2**20
    for name, ms in times.items():
        lines.append(
            f"{name}: step {statistics.median(ms):.2f} ms ({min(ms):.2f}-{max(ms):.2f}), "
            f"peak {peaks[name]:,.0f} MB beyond the model"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--built", type=Path, required=True)
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--baseline", type=Path, help="another build: variant fusegen-before")
    parser.add_argument("--profile", action="store_true", help="each variant's kernels")
    args = parser.parse_args()
    global BASELINE
    BASELINE = args.baseline
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    everything = {}
    for name in args.rows:
        row = ROWS[name]
        results = run_row(row, args.variants, args.built, args.rounds)
        everything[name] = results
        print(table(row, results), flush=True)
        if args.profile:
            print(profile(row, args.variants, args.built), flush=True)
    if args.model:
        print(model_step(args.built, args.rounds), flush=True)
    if args.out:
        args.out.write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
