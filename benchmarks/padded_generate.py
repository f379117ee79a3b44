"""Left-padded generation with transformers' LlamaForCausalLM (LLaMA-3-8B dims, 2
layers, random init, bf16): SDPA against generated/llama3_attention through its
use_in_transformers (key ranges from the padding mask, no 4D mask), each with a dynamic
cache (eager) and a static cache (which generate compiles: fullgraph, CUDA graphs).

A batch of BATCH prompts whose lengths run from a quarter of PROMPT to PROMPT tokens,
padded on the left as a tokenizer pads for generate. Per variant: the padded prefill
(one forward of the batch, no cache) and a whole generate of TOKENS new tokens, timed in
rounds that alternate the variants (the order rotated each round), median and spread.
The tokens of each are compared with an fp32 SDPA run's (bf16 noise flips near-ties of a
random model's logits, SDPA bf16's own included, so the share of equal tokens is printed
for both), and the prefill's logits error against fp32 SDPA beside SDPA bf16's own.

    python3 benchmarks/padded_generate.py [--batch 16] [--prompt 512] [--tokens 64]
        [--rounds 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "generated"))


def build(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
        num_key_value_heads=8, num_hidden_layers=2, vocab_size=32000, rms_norm_eps=1e-5,
        max_position_embeddings=8192,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    sdpa = LlamaForCausalLM(copy.deepcopy(config)).to("cuda", torch.bfloat16).eval()
    fused = LlamaForCausalLM(copy.deepcopy(config)).to("cuda", torch.bfloat16).eval()
    fused.load_state_dict(sdpa.state_dict())
    import llama3_attention

    fused.set_attn_implementation(llama3_attention.use_in_transformers())
    return sdpa, fused


def batch(args):
    """Left-padded ids and mask: prompt lengths from PROMPT / 4 to PROMPT."""
    lengths = torch.linspace(args.prompt // 4, args.prompt, args.batch).long()
    ids = torch.randint(3, 32000, (args.batch, args.prompt), device="cuda")
    mask = torch.zeros(args.batch, args.prompt, dtype=torch.long, device="cuda")
    for row, n in enumerate(lengths.tolist()):
        mask[row, args.prompt - n :] = 1
    return ids.masked_fill(mask == 0, 0), mask


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name()}")  # fmt: skip
    sdpa, fused = build(args)
    ids, mask = batch(args)
    models = {"sdpa": sdpa, "fusegen": fused}

    def generate(model, cache):
        return model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=args.tokens,
            min_new_tokens=args.tokens, do_sample=False, cache_implementation=cache,
            pad_token_id=0,
        )  # fmt: skip

    def prefill(model):
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask, use_cache=False).logits

    variants = {}
    for name, model in models.items():
        variants[f"{name} prefill"] = lambda m=model: prefill(m)
        for cache in ("dynamic", "static"):
            variants[f"{name} generate {cache}"] = lambda m=model, c=cache: generate(m, c)
    outputs = {key: fn() for key, fn in variants.items()}  # warm-up: compiles, tunes
    outputs = {key: fn() for key, fn in variants.items()}  # compiled graphs settled

    real = mask.bool()
    fp32 = copy.deepcopy(sdpa).float()
    with torch.no_grad():
        want = fp32(input_ids=ids, attention_mask=mask, use_cache=False).logits[real]
    want_tokens = generate(fp32, "dynamic")[:, args.prompt :]
    del fp32
    scale = want.abs().max().item()
    result = {"args": vars(args), "accuracy": {}, "ms": {}}
    for name in models:
        got = outputs[f"{name} prefill"][real].float()
        error = (got - want).abs().max().item() / scale
        result["accuracy"][f"{name} prefill logits, max error / max |logit| vs fp32"] = error
    for name in models:  # a random model's near-ties flip under bf16 noise: SDPA's own too
        for cache in ("dynamic", "static"):
            tokens = outputs[f"{name} generate {cache}"][:, args.prompt :]
            same = (tokens == want_tokens).float()
            key = f"{name} generate {cache}: tokens equal to fp32 SDPA's, first / all"
            result["accuracy"][key] = (same[:, 0].mean().item(), same.mean().item())
    for key, value in result["accuracy"].items():
        print(f"  {key}: {value}")

    times = {key: [] for key in variants}
    keys = list(variants)
    for r in range(args.rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for key in order:
            times[key].append(timed(variants[key])[0])
    print(f"\n{args.batch} prompts of {args.prompt // 4}-{args.prompt} tokens (left padded), "
          f"{args.tokens} new tokens; ms, median [min-max] of {args.rounds} rounds")  # fmt: skip
    for key in keys:
        ms = times[key]
        result["ms"][key] = ms
        base = statistics.median(times[key.replace("fusegen", "sdpa")])
        ratio = base / statistics.median(ms)
        print(f"  {key:28s} {statistics.median(ms):9.2f} [{min(ms):.2f}-{max(ms):.2f}]"
              f"  sdpa / this {ratio:.3f}")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
