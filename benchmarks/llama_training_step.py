"""A training step of transformers' LlamaForCausalLM (LLaMA-3-8B dims, random init, bf16)
with its MLP gate/up projection and its RMSNorms swapped for the generated kernels
(llama_mlp_gate_up, llama_add_rmsnorm, llama_rmsnorm in generated/), against the model as
transformers runs it: the generated modules used the way a real client would use them.
--attention swaps its attention too (llama3_attention), --loss its LM head and loss
(llama3_lm_head_loss: the loss from the final norm's output, no logits kept); --all both.

Gradients: one step (forward, cross-entropy on random labels, backward) on the same weights
and tokens, unpatched in bf16, patched in bf16 and unpatched in float64. Each parameter's
gradient error is ||g - g64|| / ||g64||; the patched model passes where its error is at
most 2x the unpatched bf16 model's (+ 1e-6 for gradients of about 0). Exit status 1 if any
parameter fails, lacks a gradient, or the patch did not run the kernels.
Time: a step (forward + loss + backward) and an inference forward of both models, eager
and under torch.compile (a failing compile is reported, not raised): the models alternate
over --rounds rounds, a round's figure is the median of --steps calls, and the table gives
the median round with the fastest and slowest (GPU clocks drift between rounds).

    python3 benchmarks/llama_training_step.py [--batch 4] [--seq 1024] [--layers 2]
        [--steps 10] [--rounds 3] [--attention] [--loss] [--all] [--no-compile]
        [--profile] [--out FILE.json]

Needs torch, triton and transformers; --device cpu --vocab 512 with TRITON_INTERPRET=1 is a
slow smoke test without a GPU.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import re
import statistics
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "generated"))

EPS = 1e-5  # the generated kernels' eps (specs/llama.yaml)
FLOOR = 1e-6  # slack for gradients of about 0, whose relative errors are noise
WARMUP = 3


def load_kernels(attention: bool = False, loss: bool = False) -> dict:
    """The generated modules patch() swaps in; attention: llama3_attention too; loss:
    llama3_lm_head_loss too."""
    import llama_add_rmsnorm
    import llama_mlp_gate_up
    import llama_rmsnorm

    modules = [llama_mlp_gate_up, llama_add_rmsnorm, llama_rmsnorm]
    if attention:
        import llama3_attention

        modules.append(llama3_attention)
    if loss:
        import llama3_lm_head_loss

        modules.append(llama3_lm_head_loss)
    return {m.__name__: m for m in modules}


def build_model(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    # LLaMA-3-8B's dims unless args says others (llama_prefill_attention's --model).
    config = LlamaConfig(
        hidden_size=getattr(args, "hidden", 4096),
        intermediate_size=getattr(args, "intermediate", 14336),
        num_attention_heads=getattr(args, "heads", 32),
        num_key_value_heads=getattr(args, "kv_heads", 8),
        num_hidden_layers=args.layers,
        vocab_size=args.vocab,
        rms_norm_eps=EPS,
        max_position_embeddings=max(8192, args.seq),
        mlp_bias=False,
        hidden_act="silu",
    )
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():  # not all ones, so that a norm dropping its weight shows
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
    return model.train()


def layer_returns_tuple() -> bool:
    """Decoder layers return (hidden_states, ...) before transformers 4.54, the tensor since."""
    import transformers

    return tuple(int(p) for p in re.findall(r"\d+", transformers.__version__)[:2]) < (4, 54)


def counted(name, launcher, counts):
    def call(*args, **kwargs):
        if not torch.compiler.is_compiling():  # counts eager calls, not traces
            counts[name] += 1
        return launcher(*args, **kwargs)

    return call


def patch(model, launchers: dict) -> None:
    """Swap, on this model's instances only, HF's LlamaMLP gate/up, its RMSNorms and the
    residual adds for the generated kernels; with a "llama3_attention" launcher, its
    attention too (this model's config only); with a "llama3_lm_head_loss" launcher, the
    loss (loss_of) from the final norm's output and lm_head's weight, without logits.
    Every residual add but none joins the norm after it (llama_add_rmsnorm): a layer
    returns its residual and MLP output unsummed,
    (h, mlp_out), and the next layer's input norm, or the final norm, adds them. Under
    torch.compile that matters: Inductor fuses HF's add into its norm kernel, but cannot
    fuse an add into a generated kernel, so an add left outside costs a launch."""
    config = model.config
    if getattr(config, "mlp_bias", False) or config.hidden_act != "silu":
        raise ValueError("llama_mlp_gate_up is silu(x @ w_gate.T) * (x @ w_up.T), no bias")
    rmsnorm, add_rmsnorm = launchers["llama_rmsnorm"], launchers["llama_add_rmsnorm"]
    gate_up = launchers["llama_mlp_gate_up"]
    returns_tuple = layer_returns_tuple()

    def check_eps(norm):
        if norm.variance_epsilon != EPS:
            raise ValueError(f"eps {norm.variance_epsilon}: the kernels' is {EPS}")

    def normed(norm, x):
        """(norm(x), x): x a tensor, or a layer's unsummed (residual, mlp_out)."""
        if isinstance(x, tuple):
            return add_rmsnorm(x[1], x[0], norm.weight)
        return rmsnorm(x, norm.weight), x

    def patch_mlp(mlp):
        mlp.forward = lambda x: mlp.down_proj(gate_up(x, mlp.gate_proj.weight, mlp.up_proj.weight))

    def patch_layer(layer):
        # The layer hands its arguments to self_attn by the same names in every version
        # (past_key_value, past_key_values or cache...), so pass on whatever it is given.
        params = inspect.signature(layer.forward).parameters.values()
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        names = [p.name for p in params if p.kind in kinds][1:]  # after hidden_states
        check_eps(layer.input_layernorm)
        check_eps(layer.post_attention_layernorm)

        def forward(hidden_states, *args, **kwargs):
            kwargs.update(zip(names, args, strict=False))
            x, residual = normed(layer.input_layernorm, hidden_states)
            attention = layer.self_attn(hidden_states=x, **kwargs)
            x, h = add_rmsnorm(attention[0], residual, layer.post_attention_layernorm.weight)
            out = (h, layer.mlp(x))  # summed by the next norm
            if not returns_tuple:
                return out
            return (out, attention[1]) if kwargs.get("output_attentions") else (out,)

        layer.forward = forward

    final = model.model.norm
    check_eps(final)
    final.forward = lambda x: normed(final, x)[0]
    for layer in model.model.layers:
        patch_layer(layer)
        patch_mlp(layer.mlp)
    if "llama3_attention" in launchers:  # its attention and mask functions (key ranges)
        import llama3_attention

        launcher = launchers["llama3_attention"]
        model.set_attn_implementation(llama3_attention.use_in_transformers(launcher=launcher))
    if "llama3_lm_head_loss" in launchers:
        model.fusegen_loss = launchers["llama3_lm_head_loss"]


def loss_of(model, ids, labels):
    head = getattr(model, "fusegen_loss", None)
    if head is not None:  # the generated head: the same mean over every token
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        return head(hidden.flatten(0, 1), model.lm_head.weight, labels.flatten())
    logits = model(input_ids=ids, use_cache=False).logits.flatten(0, 1)
    # bf16 logits upcast to fp32 as HF's own loss does; float64 ones stay float64
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits, labels.flatten())


def logits_of(model, ids):
    return model(input_ids=ids, use_cache=False).logits


def gradient_step(model, ids, labels) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    loss = loss_of(model, ids, labels)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


def relative_error(grad, grad64) -> float:
    error, reference = (grad.double() - grad64).norm().item(), grad64.norm().item()
    return error / reference if reference else error


def compare_gradients(eager, fused, ids, labels, counts, modules, layers) -> dict:
    """One step of each model and of a float64 copy of the unpatched one; each parameter's
    gradient errors, the losses, and how often the patched step called each launcher."""
    reference = copy.deepcopy(eager).double()
    loss64, grads64 = gradient_step(reference, ids, labels)
    loss_eager, grads_eager = gradient_step(eager, ids, labels)
    counts.clear()
    loss_fused, grads_fused = gradient_step(fused, ids, labels)
    expected = {
        "llama_rmsnorm": 1,  # the first layer's input; every other norm adds a residual
        "llama_add_rmsnorm": 2 * layers,
        "llama_mlp_gate_up": layers,
    }
    for whole in ("llama3_attention", "llama3_lm_head_loss"):
        if whole in modules:
            expected[whole] = layers if whole == "llama3_attention" else 1
    rows, missing = [], []
    for name, grad64 in grads64.items():
        grad_eager, grad_fused = grads_eager[name], grads_fused[name]
        if grad64 is None or grad_eager is None or grad_fused is None:
            missing.append(name)
            continue
        err_eager = relative_error(grad_eager, grad64)
        err_fused = relative_error(grad_fused, grad64)
        ok = err_fused <= 2 * err_eager + FLOOR
        ratio = err_fused / max(err_eager, FLOOR)
        rows.append(
            {"param": name, "eager": err_eager, "fused": err_fused, "ratio": ratio, "ok": ok}
        )
    del reference, grads64
    eager.zero_grad(set_to_none=True)
    fused.zero_grad(set_to_none=True)
    return {
        "loss": {"float64": loss64, "eager_bf16": loss_eager, "fused_bf16": loss_fused},
        "params": rows,
        "missing_grad": missing,
        "launcher_calls": dict(counts),
        "expected_calls": expected,
        "last_launch": {
            name: module.last_launch()
            for name, module in modules.items()
            if hasattr(module, "last_launch")  # not the attention module
        },
        "ok": not missing and all(r["ok"] for r in rows) and dict(counts) == expected,
    }


def median_ms(fn, steps: int, device) -> float:
    """The median ms of `steps` calls, each timed alone (synchronized before and after)."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def step_functions(model, ids, labels, compiled: bool) -> dict:
    """{"train": a training step (forward, loss, backward), "infer": a forward}."""
    train_loss = torch.compile(loss_of) if compiled else loss_of
    forward = torch.compile(logits_of) if compiled else logits_of

    def train():
        train_loss(model, ids, labels).backward()
        model.zero_grad(set_to_none=True)

    def infer():
        with torch.no_grad():
            forward(model, ids)

    return {"train": train, "infer": infer}


def profile_step(model, ids, labels, rows: int = 40) -> str:
    """One eager training step's ops and kernels by their own GPU time (torch.profiler):
    the PyTorch ops (aten::mul_, ...) beside the kernels they launch, full names."""
    from torch.profiler import ProfilerActivity, profile

    train = step_functions(model, ids, labels, compiled=False)["train"]
    train()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        train()
        torch.cuda.synchronize()
    return prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=90,
        max_shapes_column_width=60,
    )  # fmt: skip


def time_models(models: dict, ids, labels, args, compiled: bool) -> dict:
    """Per variant, ms per training step and per inference forward: the median over
    args.rounds rounds that alternate the variants (each round's figure the median of
    args.steps calls), the fastest and slowest round, and the first call's seconds (a
    compile); a failure's message instead."""
    if compiled:
        torch._dynamo.reset()  # each variant compiles from scratch
    functions = {v: step_functions(m, ids, labels, compiled) for v, m in models.items()}
    result = {v: {} for v in models}
    for key in ("train", "infer"):
        rounds = {}
        for variant, fns in functions.items():
            try:
                start = time.perf_counter()
                fns[key]()
                torch.cuda.synchronize() if ids.device.type == "cuda" else None
                result[variant][f"{key}_first_s"] = time.perf_counter() - start
                for _ in range(args.warmup):
                    fns[key]()
                rounds[variant] = []
            except Exception as exc:  # a compile failure is a result to report
                traceback.print_exc()
                result[variant][f"{key}_ms"] = None
                result[variant][f"{key}_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                models[variant].zero_grad(set_to_none=True)
        order = list(rounds)
        for r in range(args.rounds):
            for variant in order[r % len(order) :] + order[: r % len(order)]:
                rounds[variant].append(median_ms(functions[variant][key], args.steps, ids.device))
        for variant, times in rounds.items():
            result[variant][f"{key}_ms"] = statistics.median(times)
            result[variant][f"{key}_range"] = [min(times), max(times)]
            result[variant][f"{key}_rounds"] = times
    return result


def print_gradients(check: dict) -> None:
    print("\n## Gradient error vs float64 (||g - g64|| / ||g64||)\n")
    print("| parameter | eager bf16 | fusegen bf16 | ratio | |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in check["params"]:
        mark = "ok" if r["ok"] else "FAIL"
        print(f"| {r['param']} | {r['eager']:.3e} | {r['fused']:.3e} | {r['ratio']:.2f} | {mark} |")
    worst = max(check["params"], key=lambda r: r["ratio"], default=None)
    if worst:
        print(f"\nworst ratio {worst['ratio']:.3f} ({worst['param']}); pass: fusegen <= 2 x eager")
    if check["missing_grad"]:
        print("parameters without a gradient:", ", ".join(check["missing_grad"]))
    loss = check["loss"]
    print(f"loss: float64 {loss['float64']:.6f}, eager bf16 {loss['eager_bf16']:.6f} "
          f"({loss['eager_bf16'] - loss['float64']:+.2e}), fusegen bf16 "
          f"{loss['fused_bf16']:.6f} ({loss['fused_bf16'] - loss['float64']:+.2e})")  # fmt: skip
    print(f"launcher calls in the patched step: {check['launcher_calls']} "
          f"(expected {check['expected_calls']})")  # fmt: skip
    for name, launch in check["last_launch"].items():
        print(f"  {name}: last launch {launch}")
    print(f"{'PASS' if check['ok'] else 'FAIL'}: gradients and launcher calls", flush=True)


def print_timing(timing: dict) -> None:
    print("\n## Time (ms: median round [fastest-slowest]; first call in s: compiling)\n")
    print("| mode | HF | fusegen | speedup | first call HF, fusegen |")
    print("| --- | ---: | ---: | ---: | ---: |")

    def cell(result, key):
        if result.get(f"{key}_ms") is None:
            return "failed"
        low, high = result[f"{key}_range"]
        return f"{result[f'{key}_ms']:.2f} [{low:.2f}-{high:.2f}]"

    for mode, variants in timing.items():
        for key in ("train", "infer"):
            hf, fusegen = variants["hf"], variants["fusegen"]
            base, fused = hf.get(f"{key}_ms"), fusegen.get(f"{key}_ms")
            cells = [cell(hf, key), cell(fusegen, key)]
            speedup = f"{base / fused:.3f}x" if base and fused else "-"
            first = [
                f"{r[key + '_first_s']:.1f}" if r.get(f"{key}_ms") else "-" for r in (hf, fusegen)
            ]
            label = "train step" if key == "train" else "inference forward"
            print(f"| {mode} {label} | {cells[0]} | {cells[1]} | {speedup} | {', '.join(first)} |")
    for mode, variants in timing.items():
        for variant, result in variants.items():
            for key in ("train", "infer"):
                if f"{key}_error" in result:
                    print(f"\n{mode} {variant} {key} failed: {result[f'{key}_error']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed calls a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds alternating the models")
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--attention", action="store_true", help="swap in generated/llama3_attention too"
    )
    parser.add_argument(
        "--loss", action="store_true", help="swap in generated/llama3_lm_head_loss too"
    )
    parser.add_argument("--all", action="store_true", help="--attention and --loss")
    parser.add_argument(
        "--profile", action="store_true", help="print each model's kernels in one eager step"
    )
    parser.add_argument("--out", help="write every number here as JSON")
    args = parser.parse_args()
    if args.all:
        args.attention = args.loss = True

    import transformers
    import triton

    modules = load_kernels(args.attention, args.loss)
    counts = Counter()
    launchers = {name: counted(name, getattr(m, name), counts) for name, m in modules.items()}
    eager = build_model(args)
    fused = copy.deepcopy(eager)  # the same weights
    patch(fused, launchers)
    torch.manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device)
    labels = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device)
    device = ids.device
    setup = {
        "batch": args.batch, "seq": args.seq, "rows": args.batch * args.seq,
        "layers": args.layers, "vocab": args.vocab, "steps": args.steps, "rounds": args.rounds,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "torch": torch.__version__, "triton": triton.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": getattr(eager.config, "_attn_implementation", None),
        "swapped": sorted(modules),
    }  # fmt: skip
    print("# LlamaForCausalLM training step, fusegen kernels vs eager HF\n")
    print(", ".join(f"{k} {v}" for k, v in setup.items()), flush=True)
    report = {"setup": setup}

    def save():  # after each stage, so that a run cut short keeps what it measured
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")

    report["gradients"] = check = compare_gradients(
        eager, fused, ids, labels, counts, modules, args.layers
    )
    print_gradients(check)
    save()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the float64 copy's memory
    if args.profile and device.type == "cuda":
        for variant, model in (("hf", eager), ("fusegen", fused)):
            print(
                f"\n## Kernels of one eager step: {variant}\n\n{profile_step(model, ids, labels)}"
            )
    report["timing"] = timing = {}
    for mode in ("eager",) + (() if args.no_compile else ("compiled",)):
        models = {"hf": eager, "fusegen": fused}
        timing[mode] = time_models(models, ids, labels, args, mode == "compiled")
        print(f"{mode}: {timing[mode]}", flush=True)
        save()
    print_timing(timing)
    return 0 if check["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
