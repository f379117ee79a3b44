"""A LLaMA prefill with only its attention swapped (issue 29's "done when"): transformers'
LlamaModel (LLaMA-3-8B dims, or LLaMA-3.2-1B's with --model 3.2-1b: head dim 64; random
init, bf16, no LM head: the decoder layers are what the attention is part of) on SDPA, on
each SDPA backend forced, and with generated/llama3_attention (llama32_1b_attention)
through its use_in_transformers (no padding: no mask, so the calls take the Hopper
forward on an H100/H200 where they fit).

One unpadded batch of PROMPT tokens per sequence. The variants' last hidden states (of
the first 8192 tokens) are checked against an fp32 SDPA run (max error over the largest
value, beside SDPA bf16's own), then timed in rounds that alternate them (the order
rotated each round), median and spread, the ratio to each SDPA variant printed. --train
times a training step's forward and backward instead (the backward from a fixed random
gradient of the last hidden state), checking the first layer's q_proj gradient against
fp32 likewise: the Hopper backward where the forward took the Hopper kernel. --compile
runs each model under torch.compile: SDPA, fusegen (its traced calls through the
module's opaque Hopper ops), and "fusegen tl", a copy on a second instance of the module
whose ops have names of their own and no opaque Hopper ops (the `tl` kernels, which
Inductor launches).

    python3 benchmarks/llama_prefill_attention.py [--model 3-8b|3.2-1b] [--batch 2]
        [--prompt 8192] [--layers 4] [--rounds 7] [--train] [--compile] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import statistics
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "generated"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_training_step import build_model  # noqa: E402
from padded_generate import timed  # noqa: E402

# --model: the generated attention module and the model's dims (build_model's defaults
# otherwise: LLaMA-3-8B's).
MODELS = {
    "3-8b": ("llama3_attention", {}),
    "3.2-1b": (
        "llama32_1b_attention",
        {"hidden": 2048, "intermediate": 8192, "heads": 32, "kv_heads": 8},
    ),
}
MODULE = "llama3_attention"  # the one --model names (main sets it)


def attention_module():
    return importlib.import_module(MODULE)


def build(args):
    """(SDPA's decoder, the same weights with the generated attention): the models of
    llama_training_step.build_model (the --model's dims) without their LM head."""
    dims = MODELS[args.model][1]
    shape = argparse.Namespace(
        layers=args.layers, vocab=32000, seq=args.prompt, device="cuda", **dims
    )
    sdpa = build_model(shape).eval()
    sdpa.set_attn_implementation("sdpa")
    fused = copy.deepcopy(sdpa)
    fused.set_attn_implementation(attention_module().use_in_transformers())
    return sdpa.model, fused.model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=list(MODELS), default="3-8b")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--train", action="store_true", help="forward + backward")
    parser.add_argument("--compile", action="store_true", help="every model compiled")
    parser.add_argument("--out")
    args = parser.parse_args()
    global MODULE
    MODULE = MODELS[args.model][0]
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name()}")  # fmt: skip
    sdpa, fused = build(args)
    ids = torch.randint(3, 32000, (args.batch, args.prompt), device="cuda")

    # The check runs fp32 SDPA, which with GQA takes the math backend: its scores are
    # [batch, heads, prompt, prompt] in fp32. --train checks one sequence of at most 2048
    # tokens (the saved probabilities at 2 x 8192 do not fit), a prefill at most 8192
    # tokens of each (1 x 16384 ran out of an H100's 80 GB).
    checked = ids[:1, :2048] if args.train else ids[:, :8192]
    shape = (args.batch, args.prompt, sdpa.config.hidden_size)
    d_hidden = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def prefill(model, backend=None, tokens=ids):
        """The last hidden state (--train: the first layer's q_proj gradient after the
        backward)."""
        context = sdpa_kernel(backend) if backend is not None else nullcontext()
        grad_mode = torch.enable_grad() if args.train else torch.no_grad()
        with grad_mode, context:
            hidden = model(input_ids=tokens, use_cache=False).last_hidden_state
            if not args.train:
                return hidden
            hidden.backward(d_hidden[: tokens.shape[0], : tokens.shape[1]].to(hidden.dtype))
        weight = model.layers[0].self_attn.q_proj.weight
        grad, weight.grad = weight.grad, None
        model.zero_grad(set_to_none=True)
        return grad

    if args.compile:
        backends = {
            "sdpa": (torch.compile(sdpa), None),
            "fusegen": (torch.compile(fused), None),
            "fusegen tl": (torch.compile(tl_copy(fused)), None),
        }
    else:
        backends = {
            "sdpa": (sdpa, None),
            "sdpa cudnn": (sdpa, SDPBackend.CUDNN_ATTENTION),
            "sdpa flash": (sdpa, SDPBackend.FLASH_ATTENTION),
            "fusegen": (fused, None),
        }
    variants = {
        key: (lambda model=model, backend=backend: prefill(model, backend))
        for key, (model, backend) in backends.items()
    }
    outputs = {key: prefill(*pair, tokens=checked) for key, pair in backends.items()}
    for fn in variants.values():  # warm-up: compiles
        fn()
    plans = attention_plans()
    print(f"  fusegen's attention calls: {plans}")
    if args.train:
        compiled = attention_module()._ATTENTION.last_compiled
        backward = sorted(k for k in compiled if "hopper_d" in k)
        print(f"  fusegen's Hopper backward kernels: {backward or 'none (the tl kernels)'}")

    fp32 = copy.deepcopy(sdpa).float()
    want = prefill(fp32, tokens=checked)
    del fp32
    what = "q_proj gradient of layer 0" if args.train else "hidden"
    scale = want.abs().max().item()
    result = {"args": vars(args), "plans": plans, "error": {}, "ms": {}}
    for key, out in outputs.items():
        result["error"][key] = (out.float() - want).abs().max().item() / scale
        print(f"  {key}: max error / max |{what}| vs fp32 SDPA {result['error'][key]:.2e}")

    times = {key: [] for key in variants}
    keys = list(variants)
    for r in range(args.rounds):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            times[key].append(timed(variants[key])[0])
    step = ("forward + backward" if args.train else "prefill") + (", compiled" * args.compile)
    print(f"\n{step}, {args.batch} x {args.prompt} tokens, {args.layers} layers; ms, median "
          f"[min-max] of {args.rounds} rounds")  # fmt: skip
    medians = {key: statistics.median(ms) for key, ms in times.items()}
    for key in keys:
        ms = times[key]
        result["ms"][key] = ms
        ratios = ", ".join(
            f"{other} / this {medians[other] / medians[key]:.3f}" for other in keys if other != key
        )
        print(f"  {key:12s} {medians[key]:9.2f} [{min(ms):.2f}-{max(ms):.2f}]  {ratios}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def tl_copy(fused):
    """A copy of the fusegen model whose attention is a second instance of the generated
    module with ops of their own (another name: no compiled graph or cache of the first
    is reused) and no opaque Hopper ops: traced, its calls run the `tl` kernels."""
    import importlib.util

    original = attention_module()
    spec = importlib.util.spec_from_file_location(f"{MODULE}_tl", original.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Dynamo imports the attention function's module
    spec.loader.exec_module(module)
    attention = module._ATTENTION
    attention.op = attention.register(name=f"{attention.op_name}_tl")
    attention.hopper_ops = None
    model = copy.deepcopy(fused)
    model.set_attn_implementation(module.use_in_transformers("fusegen_tl"))
    return model


def attention_plans():
    """{launch kind: calls planned} of the generated attention: whether the Hopper forward
    served the prefill (_HopperLaunch) or the `tl` forward did (_Launch)."""
    kinds = {}
    for plan in attention_module()._ATTENTION.plans.values():
        kind = type(plan.forward).__name__
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


if __name__ == "__main__":
    sys.exit(main())
