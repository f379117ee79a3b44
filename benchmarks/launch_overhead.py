"""The launchers' own Python time per call, on the CPU: the modules on the Triton
interpreter with the kernel launch itself stubbed out, so what is timed is what a GPU
call pays on the host besides the launch: the checks or the plan lookup, the outputs'
allocation, the launch's arguments (benchmarks/call_cost.py times the whole call on a
GPU).

    fusegen build benchmarks/specs/call_cost.yaml --out BUILD
    python3 benchmarks/launch_overhead.py BUILD [OLD_BUILD] [--repeats 7] [--number 2000]

The calls are the decode-sized rows of call_cost.py (bf16): RMSNorm and the gate/up chain
at 16 rows, attention at 16 sequences x 1 query against 1 and 2048 keys (the latter
split), and the tiny fp32 chain at 9 rows; then training steps (forward, then
torch.autograd.grad of every input) of the attention at 2 x 64 tokens, of T5's with its
learned bias's gradient, and of RMSNorm at 16 rows: what a training call pays on the
host besides its launches (a no-op autograd.Function's step costs about 25 us of it on
the CPU, the same for any op).
In a build of this fusegen the runtime's direct launch (launch.Direct) is stubbed
whole, as made on a GPU from a signature's second call: its own work (the hook check,
the current stream, the arguments handed to the compiled launcher) reads CUDA state and
is not timed here; in an older build (`_fusegen_runtime.py`, or attention modules of
their own) the module's launch function is stubbed. Folders' repeats are interleaved
(one repeat of each in turn), so drift in the machine's speed hits them alike; each line
is the best repeat's time per call.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import timeit
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402


def calls():
    """(row, module name, inputs) per timed call."""
    bf16 = {"dtype": torch.bfloat16}
    x = torch.randn(16, 3584, **bf16)
    out = [
        ("rmsnorm 16x3584", "qwen2_rmsnorm", (x, torch.randn(3584, **bf16))),
        ("gate/up 16x3584->18944", "qwen2_gate_up",
         (x, torch.randn(18944, 3584, **bf16), torch.randn(18944, 3584, **bf16))),
        ("tiny fp32 9x13->5", "tiny_fp32",
         (torch.randn(9, 13), torch.randn(5, 13), torch.randn(5))),
    ]  # fmt: skip
    for keys in (1, 2048):
        q = torch.randn(16, 1, 28, 128, **bf16)
        k, v = (torch.randn(16, keys, 4, 128, **bf16) for _ in "kv")
        out.append((f"attention 16x1, {keys} key(s)", "qwen2_attention", (q, k, v)))
    return out


def training_calls():
    """(row, module name, inputs) per timed training step (inputs: leaves with grad, then
    the gradient of out)."""
    bf16 = {"dtype": torch.bfloat16}
    q = torch.randn(2, 64, 28, 128, **bf16).requires_grad_()
    k, v = (torch.randn(2, 64, 4, 128, **bf16).requires_grad_() for _ in "kv")
    x = torch.randn(16, 3584, **bf16).requires_grad_()
    weight = torch.randn(3584, **bf16).requires_grad_()
    q5, k5, v5 = (torch.randn(2, 8, 64, 64, **bf16).requires_grad_() for _ in "qkv")
    bias = torch.randn(1, 8, 64, 64, **bf16).requires_grad_()
    return [
        ("attention fwd+bwd 2x64", "qwen2_attention", (q, k, v, torch.randn_like(q))),
        ("T5 attention + d bias 2x64", "t5_attention", (q5, k5, v5, bias, torch.randn_like(q5))),
        ("rmsnorm fwd+bwd 16x3584", "qwen2_rmsnorm", (x, weight, torch.randn_like(x))),
    ]


def step_of(launcher):
    """A training step of launcher: forward, then the gradients of its inputs."""

    def step(*inputs):
        *leaves, d_out = inputs
        torch.autograd.grad(launcher(*leaves), leaves, d_out)

    return step


def load(folder: Path, name: str, tag: str):
    """The module's launcher, its launch stubbed (see the docstring)."""
    spec = importlib.util.spec_from_file_location(f"{tag}_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    package = getattr(getattr(module, "_rt", None), "__package__", None)
    if package and (folder / "_fusegen_runtime").is_dir():
        launch = importlib.import_module(f"{package}.launch")
        launch.enabled = lambda interpreted: True
        launch.direct = lambda *args, **kwargs: (lambda *launched: None)
        if hasattr(module, "_ATTENTION"):
            attention = importlib.import_module(f"{package}.attention")
            attention.launch.direct = launch.direct
            # Decode on the H200's 132 multiprocessors: the 2048 keys split.
            module._ATTENTION.sm_count = lambda device: 132
            module._ATTENTION.runs_triton = lambda device: True
    elif hasattr(module, "_KERNELS"):
        module._KERNELS.launch = lambda *args: None
    else:  # an attention module of its own
        module._launch = lambda *args, **kwargs: None
        module._sm_count = lambda device: 132
        for attr in dir(module):
            if attr.endswith("_combine"):
                setattr(module, attr, _NoLaunch())
    return getattr(module, name)


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per folder")
    parser.add_argument("--number", type=int, default=2000, help="calls per repeat")
    args = parser.parse_args()
    tags = ["new", "old"][: len(args.folders)]
    for row, name, inputs, training in [
        *((*call, False) for call in calls()),
        *((*call, True) for call in training_calls()),
    ]:
        missing = [f for f in args.folders if not (f / f"{name}.py").is_file()]
        if missing:  # a build of an older call_cost.yaml
            print(f"{row}: skipped, no {name}.py in {', '.join(map(str, missing))}")
            continue
        with torch.set_grad_enabled(training):
            launchers = [load(f, name, t) for f, t in zip(args.folders, tags, strict=True)]
            if training:
                launchers = [step_of(launcher) for launcher in launchers]
            for launcher in launchers:
                for _ in range(3):  # plans the call, compiles (interpreter), then direct
                    launcher(*inputs)
            best = [float("inf")] * len(launchers)
            for _ in range(args.repeats):
                for i, launcher in enumerate(launchers):
                    seconds = timeit.timeit(
                        lambda launcher=launcher, inputs=inputs: launcher(*inputs),
                        number=args.number,
                    )
                    best[i] = min(best[i], seconds / args.number * 1e6)
            for tag, us in zip(tags, best, strict=True):
                print(f"{row:28} {tag:4} {us:6.1f} us per call")


if __name__ == "__main__":
    main()
