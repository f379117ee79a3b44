"""A training step of transformers' LlamaForCausalLM (LLaMA-3-8B dims, random init, bf16)
wrapped as FSDP2 users wrap it (each decoder layer compiled and `fully_shard`ed, then the
model sharded), with the generated kernels (benchmarks/llama_training_step.py's patch: gate/up,
add + RMSNorm, RMSNorm, and with --attention llama3_attention through its
use_in_transformers) against the same model without them.

Each variant: forward, cross-entropy on random labels, backward, an AdamW step. The
variants alternate over rounds (the order rotated each round); per round the median of
STEPS steps; printed: each variant's median over rounds and its spread, the ratio, and
the first steps' losses of both (the same weights and tokens: they agree to bf16's noise).

    python3 -m torch.distributed.run --nproc_per_node N benchmarks/fsdp2_training_step.py
        [--batch 4] [--seq 1024] [--layers 2] [--rounds 5] [--steps 5] [--attention]
        [--no-compile] [--out FILE.json]

Any number of GPUs (one process each, nccl); the batch is per process.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_training_step import build_model, load_kernels, patch  # noqa: E402


def wrapped(model, compiled):
    """docs/integration.md's FSDP2 setup: each layer compiled (a compiled root would
    trace FSDP's hooks), then sharded; the root sharded."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        if compiled:
            layer.compile()
        fully_shard(layer)
    fully_shard(model)
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--attention", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    args.device = "cuda"
    rank = int(os.environ.get("RANK", 0))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    base = build_model(args)
    fused = copy.deepcopy(base)
    modules = load_kernels(attention=args.attention)
    patch(fused, {name: getattr(m, name) for name, m in modules.items()})
    models = {"transformers": base, "fusegen": fused}
    torch.manual_seed(1 + rank)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    labels = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    steps, losses = {}, {}
    for name, model in models.items():
        model = wrapped(model, not args.no_compile)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)

        def step(model=model, optimizer=optimizer):
            logits = model(input_ids=ids, use_cache=False).logits
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        losses[name] = [step().item() for _ in range(3)]  # compiles; the first steps' losses
        steps[name] = step
    times = {name: [] for name in steps}
    names = list(steps)
    for r in range(args.rounds):
        for name in names[r % 2 :] + names[: r % 2]:
            per_step = []
            for _ in range(args.steps):
                torch.cuda.synchronize()
                start = time.perf_counter()
                steps[name]()
                torch.cuda.synchronize()
                per_step.append((time.perf_counter() - start) * 1e3)
            times[name].append(statistics.median(per_step))
    if rank == 0:
        world = dist.get_world_size()
        mode = "compiled" if not args.no_compile else "eager"
        print(f"FSDP2 ({world} process(es)), {mode}, {args.layers} layers, {args.batch}x{args.seq}"
              f" tokens a process{', attention too' if args.attention else ''}; "
              f"ms a step (AdamW included), median [min-max] of {args.rounds} rounds")  # fmt: skip
        for name in names:
            ms = times[name]
            print(f"  {name:13s} {statistics.median(ms):8.2f} [{min(ms):.2f}-{max(ms):.2f}]"
                  f"  first losses {', '.join(f'{x:.4f}' for x in losses[name])}")  # fmt: skip
        ratio = statistics.median(times["transformers"]) / statistics.median(times["fusegen"])
        print(f"  transformers / fusegen: {ratio:.3f}")
        if args.out:
            Path(args.out).write_text(
                json.dumps({"args": vars(args), "ms": times, "losses": losses})
            )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
