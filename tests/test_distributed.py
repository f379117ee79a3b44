"""Generated chain and attention kernels under DDP and FSDP2 (fully_shard), and through
activation checkpointing: one training step of tests/distributed_training.py's small
decoder gives one process's loss and gradients. Two CPU processes (gloo) with the
kernels on the Triton interpreter; on a GPU machine, as many processes as GPUs (nccl)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from fusegen.cli import main  # noqa: E402

HERE = Path(__file__).resolve().parent
SPECS = """\
version: 1
kernels:
  - name: dist_rmsnorm
    dims: {M: dynamic, N: 64}
    dtypes: [fp32]
    inputs: {x: [M, N], weight: [N]}
    chain:
      - input: x
      - rmsnorm: {weight: weight, eps: 1.0e-6}
  - name: dist_mlp_gate_up
    dims: {M: dynamic, K: 64, N: 128}
    dtypes: [fp32]
    inputs: {x: [M, K], w_gate: [N, K], w_up: [N, K]}
    chain:
      - matmul: x @ w_gate.T
      - silu
      - gate: x @ w_up.T
  - name: dist_attention
    dtypes: [fp32]
    attention: {layout: bshd, heads: 4, kv_heads: 2, head_dim: 16, causal: true}
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each mode's results: {mode: [rank 0's, rank 1's, ...]}. Two launches: one process
    (single, checkpoint) and WORLD processes (ddp, fsdp2, fsdp2_checkpoint)."""
    root = tmp_path_factory.mktemp("distributed")
    (root / "specs.yaml").write_text(SPECS)
    assert main(["build", str(root / "specs.yaml"), "--out", str(root / "gen")]) == 0
    world = max(2, torch.cuda.device_count()) if torch.cuda.is_available() else 2
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        world = 1  # the mechanics; the comparison is then with itself sharded by one
    results = {}
    for procs, modes in ((1, "single,checkpoint"), (world, "ddp,fsdp2,fsdp2_checkpoint")):
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={procs}", str(HERE / "distributed_training.py"),
            str(root / "gen"), str(root), modes,
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
        for mode in modes.split(","):
            results[mode] = [
                torch.load(root / f"{mode}.rank{r}.pt", weights_only=False) for r in range(procs)
            ]
    return results


def assert_same_step(got, want, mode):
    assert abs(got["loss"] - want["loss"]) <= 1e-5 * abs(want["loss"]), mode
    assert sorted(got["grads"]) == sorted(want["grads"]), mode
    for name, g in want["grads"].items():
        error = (got["grads"][name] - g).abs().max().item()
        assert error <= 1e-5 * max(1e-3, g.abs().max().item()), f"{mode}: {name} off by {error}"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["checkpoint", "ddp", "fsdp2", "fsdp2_checkpoint"])
def test_a_step_matches_one_process(runs, mode):
    want = runs["single"][0]
    for rank_result in runs[mode]:
        assert_same_step(rank_result, want, mode)


@pytest.mark.slow
def test_checkpointing_recomputes_through_the_kernels(runs):
    """Without checkpointing, the attention launcher runs once a block; with it, again in
    the backward's recompute."""
    plain, recomputed = runs["single"][0], runs["checkpoint"][0]
    assert plain["attention_calls"] == {"forward": 2, "with_backward": 2}
    assert recomputed["attention_calls"] == {"forward": 2, "with_backward": 4}
    assert runs["fsdp2_checkpoint"][0]["attention_calls"]["with_backward"] == 4
