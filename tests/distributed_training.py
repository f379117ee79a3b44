"""One process of tests/test_distributed.py: a small decoder (embedding, two blocks of
generated RMSNorm, attention and gated-MLP kernels, a head) trains one step on a fixed
batch, under each of MODES, and writes its loss and every parameter's full gradient to
OUT/MODE.rank{rank}.pt. Started by torch.distributed.run (world size 1 or 2, gloo, the
CPU; the kernels on the Triton interpreter) or on a GPU (nccl, one process is enough).

    python -m torch.distributed.run --nproc_per_node N distributed_training.py GEN OUT MODES

MODES, comma-separated: single (no wrapper, the whole batch), checkpoint (each block
under torch.utils.checkpoint, non-reentrant), ddp, fsdp2 (fully_shard per block and at
the root), fsdp2_checkpoint. A wrapped run's rank takes its share of the batch."""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

GEN, OUT, MODES = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(",")
sys.path.insert(0, str(GEN))

import dist_attention  # noqa: E402
import dist_mlp_gate_up  # noqa: E402
import dist_rmsnorm  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 64, 4, 2, 16, 128, 96
BATCH, SEQ = 4, 24
CALLS = {"attention": 0}  # forward launches, counted to see checkpointing recompute


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = nn.Parameter(1 + 0.1 * torch.randn(HIDDEN))
        self.qkv = nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.o = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.mlp_norm = nn.Parameter(1 + 0.1 * torch.randn(HIDDEN))
        self.gate = nn.Linear(HIDDEN, FFN, bias=False)
        self.up = nn.Linear(HIDDEN, FFN, bias=False)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x, key_ranges):
        b, s, _ = x.shape
        h = dist_rmsnorm.dist_rmsnorm(x, self.attn_norm)
        q, k, v = self.qkv(h).split([HEADS * HEAD_DIM, *[KV_HEADS * HEAD_DIM] * 2], dim=-1)
        shape = (b, s, -1, HEAD_DIM)
        CALLS["attention"] += 1
        a = dist_attention.dist_attention(
            q.reshape(shape), k.reshape(shape), v.reshape(shape), key_ranges=key_ranges
        )
        x = x + self.o(a.reshape(b, s, -1))
        h = dist_rmsnorm.dist_rmsnorm(x, self.mlp_norm)
        return x + self.down(dist_mlp_gate_up.dist_mlp_gate_up(h, self.gate.weight, self.up.weight))


class Decoder(nn.Module):
    def __init__(self, checkpoint=False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.norm = nn.Parameter(1 + 0.1 * torch.randn(HIDDEN))
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.checkpoint = checkpoint

    def forward(self, ids, key_ranges, labels):
        x = self.embed(ids)
        for block in self.blocks:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(block, x, key_ranges, use_reentrant=False)
            else:
                x = block(x, key_ranges)
        logits = self.head(dist_rmsnorm.dist_rmsnorm(x, self.norm))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def data(device):
    """The batch: left-padded (ranges start past 0), labels -100 on the pads."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    starts = torch.tensor([0, 5, 2, 3])  # each half of the batch: 5 pads
    ranges = torch.stack([starts, torch.full_like(starts, SEQ)], dim=1).to(torch.int32)
    labels = ids.roll(-1, dims=1)
    labels[torch.arange(SEQ)[None, :] < starts[:, None]] = -100
    return ids.to(device), ranges.to(device), labels.to(device)


def step(mode, rank, world, device):
    torch.manual_seed(0)
    model = Decoder(checkpoint=mode.endswith("checkpoint")).to(device)
    ids, ranges, labels = data(device)
    if mode != "single" and mode != "checkpoint":  # this rank's share of the batch
        share = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        ids, ranges, labels = ids[share], ranges[share], labels[share]
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif mode.startswith("fsdp2"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    CALLS["attention"] = 0
    loss = model(ids, ranges, labels)
    forward_calls = CALLS["attention"]
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[name.replace("module.", "")] = g.detach().cpu()
    if mode in ("ddp",) or mode.startswith("fsdp2"):  # the whole batch's mean loss
        loss = loss.detach().clone()
        dist.all_reduce(loss)
        loss = loss / world
    calls = {"forward": forward_calls, "with_backward": CALLS["attention"]}
    return {"loss": loss.item(), "grads": grads, "attention_calls": calls}


def main():
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    if torch.cuda.is_available():
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        for mode in MODES:
            torch.save(step(mode, rank, world, device), OUT / f"{mode}.rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    # Every result is saved. The process's own teardown then aborts now and then in
    # torch's threads ("terminate called without an active exception", exit -6: 2 of 12
    # torchrun launches on a CPU machine, the results all written, with fusegen's kernels
    # or without): skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
