"""Training cost of fused chains on one GPU, bf16: forward and forward + backward time,
the activation memory autograd keeps for the backward, and (memory-bound rows) the share of
the copy bandwidth reached, for each chain run four ways: eager PyTorch (one op at a time),
torch.compile of that eager function (default mode), Liger-Kernel where Liger has the
chain, and fusegen's generated kernels (the launchers' own autograd).

    python benchmarks/training_chains.py [--rows swiglu-4096 ...] [--rounds 5]
        [--profile] [--baseline FOLDER] [--out FILE.json] [--no-compile] [--quick]

Rows (default all; Liger's benchmark shapes where Liger has the chain):
    swiglu-4096        silu(x @ Wg.T) * (x @ Wu.T), x 4096x4096, Wg/Wu 14336x4096
    swiglu-16384       the same, x 16384x4096
    geglu-4096         gelu_tanh(x @ Wg.T) * (x @ Wu.T), x 4096x4096, Wg/Wu 14336x4096
    gelu-4096          gelu_tanh(x @ W.T + b), x 4096x4096, W 14336x4096, b 14336
    add-rmsnorm-16384  h = x + r; y = rmsnorm(h) * w (eps 1e-5), returns (y, h), 16384x4096
    gemma-rmsnorm      y = rmsnorm(x) * (1 + w) (eps 1e-6), 16384x3072
    layernorm          y = layernorm(x) * w + b (eps 1e-5), 4096x8192
    softmax            y = softmax(x), 4096x8192

Every input requires grad; the fwd+bwd step runs the forward, then torch.autograd.grad
with fixed random upstream gradients (every output gets one). "fwd" is the forward alone,
grad mode on (the saves included). Times: "fwd" and "fwd+bwd" are GPU time, replays of a CUDA
graph of the calls (fusegen.tools.timing.graph_ms), which is what a training step pays when
the host runs ahead of the GPU; "launched" is the step called from Python (a do_bench
median), the host's cost included where it outlasts the GPU's (row chains at these sizes
are host-bound that way for every variant on a slow host: the earlier "add + RMSNorm 0.61
ms" and "0.73-0.88 ms" were the host's speed). The variants are timed in turn, in a
rotated order, over --rounds rounds; a row reports the median of its rounds and their
spread (min-max), so clock drift between rounds hits every variant alike. "saved MB": the
distinct storages the forward saves for the backward (saved-tensor hooks), the inputs' own
left out. "peak MB": max_memory_allocated over one step, beyond
what was allocated before it. Each variant's outputs and gradients are checked against
eager first (norm-wise relative error < 2e-2), so a fast but wrong variant shows.

Floors: a memory-bound row's fewest bytes (each tensor read or written once per pass:
the forward reads its inputs and writes its outputs; the backward reads the upstream
gradients and what the derivative needs, and writes the gradients) over the copy bandwidth
measured in the same run (a 1 GiB device-to-device copy, read + write bytes); a GEMM row's
TFLOP/s. --profile: each variant's kernels in one step (torch.profiler), to see where a
step's time goes.

fusegen's modules: generated/llama_mlp_gate_up.py and generated/llama_add_rmsnorm.py, and
benchmarks/specs/training.yaml built into a temporary folder by `python -m fusegen build`
(a subprocess: of fusegen only its timer is imported here). Liger is optional: where
`import liger_kernel` fails its column reads "–".

--quick: small shapes for a smoke run; without a GPU it runs on the CPU with
TRITON_INTERPRET=1, where targets are not compared.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fusegen.tools.timing import graph_ms  # noqa: E402  (torch-free until called)

TOLERANCE = 2e-2  # norm-wise relative error against eager, in bf16
DTYPE = torch.bfloat16
QUICK_ROWS = {"cuda": 64, "cpu": 16}  # the interpreter's cost grows with the programs run
QUICK_COLS = 256  # the dynamic modules' K, N shrink too (llama_* fix theirs)
MB = 1e6


@dataclass
class Row:
    name: str
    kind: str  # a key of EAGER
    chain: str
    m: int
    k: int  # a matmul chain's K (0: a row chain)
    n: int
    target_ms: float | None = None  # issue 28's fwd+bwd target, where it set one

    def shape(self) -> str:
        if self.kind in ("swiglu", "geglu"):
            return f"x {self.m}x{self.k}, Wg/Wu {self.n}x{self.k}"
        if self.kind == "gelu":
            return f"x {self.m}x{self.k}, W {self.n}x{self.k}, b {self.n}"
        return f"{self.m}x{self.n}"

    def flops(self) -> float:
        """A matmul row's fwd+bwd floating-point operations (0 for a row chain): three
        GEMMs per weight (the forward's, dx's share and dW)."""
        weights = {"swiglu": 2, "geglu": 2, "gelu": 1}.get(self.kind, 0)
        return 3 * weights * 2.0 * self.m * self.k * self.n

    def floor_bytes(self) -> float:
        """A row chain's fewest fwd+bwd bytes (0 for a matmul row): [M, N] tensors moved,
        two bytes each. add + RMSNorm: x, r in, y, h out; dy, dh, h in, one dx (= dr) out.
        One input: x in, y out; dy and x (softmax: y) in, dx out."""
        tensors = {"add_rmsnorm": 8, "gemma_rmsnorm": 5, "layernorm": 5, "softmax": 5}
        return tensors.get(self.kind, 0) * self.m * self.n * DTYPE.itemsize


SWIGLU = "silu(x@Wg.T) * (x@Wu.T)"
ROWS = {
    row.name: row
    for row in (
        Row("swiglu-4096", "swiglu", SWIGLU, 4096, 4096, 14336, 4.1),
        Row("swiglu-16384", "swiglu", SWIGLU, 16384, 4096, 14336, 16.0),
        Row("geglu-4096", "geglu", "gelu_tanh(x@Wg.T) * (x@Wu.T)", 4096, 4096, 14336),
        Row("gelu-4096", "gelu", "gelu_tanh(x@W.T + b)", 4096, 4096, 14336, 2.0),
        Row("add-rmsnorm-16384", "add_rmsnorm", "rmsnorm(x + r) * w, x + r", 16384, 0, 4096, 0.35),
        Row("gemma-rmsnorm", "gemma_rmsnorm", "rmsnorm(x) * (1 + w)", 16384, 0, 3072),
        Row("layernorm", "layernorm", "layernorm(x) * w + b", 4096, 0, 8192),
        Row("softmax", "softmax", "softmax(x)", 4096, 0, 8192),
    )
}
INPUT_NAMES = {
    "swiglu": ("x", "w_gate", "w_up"),
    "geglu": ("x", "w_gate", "w_up"),
    "gelu": ("x", "w", "b"),
    "add_rmsnorm": ("x", "residual", "weight"),
    "gemma_rmsnorm": ("x", "weight"),
    "layernorm": ("x", "weight", "bias"),
    "softmax": ("x",),
}
OUTPUT_NAMES = {"add_rmsnorm": ("y", "h")}
# kind: (module file, launcher); a None file: built from benchmarks/specs/training.yaml.
FUSEGEN_MODULES = {
    "swiglu": (ROOT / "generated" / "llama_mlp_gate_up.py", "llama_mlp_gate_up"),
    "geglu": (None, "train_geglu"),
    "gelu": (None, "train_gelu_bias"),
    "add_rmsnorm": (ROOT / "generated" / "llama_add_rmsnorm.py", "llama_add_rmsnorm"),
    "gemma_rmsnorm": (None, "train_gemma_rmsnorm"),
    "layernorm": (None, "train_layernorm"),
    "softmax": (None, "train_softmax"),
}


# The eager chains, one op at a time (module-level functions: torch.compile wraps these).


def eager_swiglu(x, w_gate, w_up):
    return F.silu(x @ w_gate.T) * (x @ w_up.T)


def eager_geglu(x, w_gate, w_up):
    return F.gelu(x @ w_gate.T, approximate="tanh") * (x @ w_up.T)


def eager_gelu(x, w, b):
    return F.gelu(x @ w.T + b, approximate="tanh")


def eager_gelu_linear(x, w, b):
    # What nn.Linear runs: the bias in cuBLAS's epilogue (addmm), a stronger eager anchor.
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def eager_add_rmsnorm(x, residual, weight):
    # HF LlamaRMSNorm: the statistics in fp32, the weight applied in the input dtype.
    h = x + residual
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5)
    return weight * normed.to(h.dtype), h


def eager_gemma_rmsnorm(x, weight):
    # HF GemmaRMSNorm: everything in fp32, (1 + w) included, then the input dtype.
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (normed * (1.0 + weight.float())).to(x.dtype)


def eager_layernorm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5)


def eager_softmax(x):
    return torch.softmax(x, dim=-1)


EAGER = {
    "swiglu": eager_swiglu,
    "geglu": eager_geglu,
    "gelu": eager_gelu,
    "add_rmsnorm": eager_add_rmsnorm,
    "gemma_rmsnorm": eager_gemma_rmsnorm,
    "layernorm": eager_layernorm,
    "softmax": eager_softmax,
}


@dataclass
class Variant:
    name: str
    fn: object = None  # callable(*inputs) -> output or tuple of outputs; None: unavailable
    note: str = ""
    result: dict = field(default_factory=dict)


def as_tuple(outputs):
    return outputs if isinstance(outputs, tuple) else (outputs,)


def load_module(path: Path, name: str):
    """A generated module by file path (its runtime is found beside it)."""
    spec = importlib.util.spec_from_file_location(f"training_chains_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_specs(folder: Path) -> None:
    """training.yaml rendered into `folder` by the CLI, in a subprocess so this script does
    not import fusegen (the modules it writes need only torch, triton and their runtime)."""
    spec = ROOT / "benchmarks" / "specs" / "training.yaml"
    command = [sys.executable, "-m", "fusegen", "build", str(spec), "--out", str(folder)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")


def liger_import():
    """(liger_kernel's version, None) or (None, why it cannot be used)."""
    try:
        import liger_kernel  # noqa: F401
    except Exception as error:  # ImportError, or an import-time failure of its own
        return None, f"import liger_kernel failed: {type(error).__name__}: {error}"
    try:
        return importlib.metadata.version("liger-kernel"), None
    except importlib.metadata.PackageNotFoundError:
        return "unknown", None


def bound_apply(function, tensor_count: int, named: dict):
    """function.apply(*tensors, ...) with its non-tensor arguments matched by name to its
    forward's signature (they differ across Liger versions; apply takes no keywords), the
    ones not named left at their defaults."""
    params = list(inspect.signature(function.forward).parameters.values())[1 + tensor_count :]
    extra = []
    for param in params:
        if param.name in named:
            extra.append(named[param.name])
        elif param.default is not inspect.Parameter.empty:
            extra.append(param.default)
        else:
            raise TypeError(f"{function.__name__}.forward: no value for {param.name!r}")
    unused = set(named) - {p.name for p in params}
    if unused - {"in_place"}:  # in_place is only passed where it exists
        raise TypeError(f"{function.__name__}.forward takes no {sorted(unused)}")

    def apply(*tensors):
        return function.apply(*tensors, *extra)

    return apply, [p.name for p in params]


def liger_function(kind: str):
    """(callable, note) for Liger's kernel of this chain; raises where it has none."""
    if kind == "gelu":
        raise LookupError("Liger has no gelu + bias kernel")
    if kind in ("swiglu", "geglu"):
        from liger_kernel.ops.geglu import LigerGELUMulFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        function = LigerSiLUMulFunction if kind == "swiglu" else LigerGELUMulFunction
        act_mul, _ = bound_apply(function, 2, {})

        def liger_glu(x, w_gate, w_up):
            return act_mul(x @ w_gate.T, x @ w_up.T)  # cuBLAS, then Liger's kernel

        return liger_glu, f"cuBLAS matmuls + {function.__name__}"
    if kind == "layernorm":
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction

        apply, params = bound_apply(LigerLayerNormFunction, 3, {"eps": 1e-5})
        return apply, f"LigerLayerNormFunction(x, w, b, {', '.join(params)})"
    if kind == "softmax":
        from liger_kernel.ops.softmax import LigerSoftmaxFunction

        return LigerSoftmaxFunction.apply, "LigerSoftmaxFunction"
    # in_place=False: in place, Liger's backward writes dX over the incoming gradient, the
    # fixed upstream gradient this script reuses every step.
    if kind == "gemma_rmsnorm":
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        named = {"eps": 1e-6, "offset": 1.0, "casting_mode": "gemma", "in_place": False}
        apply, params = bound_apply(LigerRMSNormFunction, 2, named)
        return apply, f"LigerRMSNormFunction(x, w, {', '.join(params)})"
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

    named = {"eps": 1e-5, "offset": 0.0, "casting_mode": "llama", "in_place": False}
    apply, params = bound_apply(LigerFusedAddRMSNormFunction, 3, named)
    return apply, f"LigerFusedAddRMSNormFunction(x, r, w, {', '.join(params)})"


def liger_variant(kind: str, liger_error: str | None) -> Variant:
    if liger_error:
        return Variant("Liger", note=liger_error)
    try:
        fn, note = liger_function(kind)
    except Exception as error:
        return Variant("Liger", note=f"{type(error).__name__}: {error}")
    return Variant("Liger", fn, note)


def fusegen_variant(kind: str, built: Path | None, folder: Path | None = None) -> Variant:
    """fusegen's launcher for the chain; `folder`: the same module from another build (a
    folder holding specs/llama.yaml's and training.yaml's modules), as "fusegen (folder)"."""
    path, name = FUSEGEN_MODULES[kind]
    label = f"fusegen ({folder.name})" if folder else "fusegen"
    try:
        if folder is not None:
            path = folder / f"{name}.py"
        elif path is None:
            if built is None:
                raise RuntimeError("training.yaml was not built")
            path = built / f"{name}.py"
        launcher = getattr(load_module(path, f"{name}_{abs(hash(str(path)))}"), name)
    except Exception as error:
        return Variant(label, note=f"{type(error).__name__}: {error}")
    return Variant(label, launcher, str(path.relative_to(ROOT) if ROOT in path.parents else path))


def make_inputs(row: Row, device: str):
    """The row's inputs (all requiring grad) and the fixed upstream gradients, scaled so
    every value is O(1)."""
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(DTYPE)

    m, k, n = row.m, row.k, row.n
    out_shapes = [(m, n)]
    if row.kind in ("swiglu", "geglu"):
        inputs = (randn(m, k), randn(n, k, scale=k**-0.5), randn(n, k, scale=k**-0.5))
    elif row.kind == "gelu":
        inputs = (randn(m, k), randn(n, k, scale=k**-0.5), randn(n))
    elif row.kind == "add_rmsnorm":
        inputs = (randn(m, n), randn(m, n), 1 + randn(n, scale=0.1))
        out_shapes = [(m, n), (m, n)]
    elif row.kind == "gemma_rmsnorm":
        inputs = (randn(m, n), randn(n, scale=0.1))
    elif row.kind == "layernorm":
        inputs = (randn(m, n), 1 + randn(n, scale=0.1), randn(n, scale=0.1))
    else:
        inputs = (randn(m, n, scale=4.0),)
    for tensor in inputs:
        tensor.requires_grad_(True)
    grads = tuple(randn(*shape) for shape in out_shapes)
    return inputs, grads


def probe(fn, inputs, grads):
    """One fwd+bwd step under saved-tensor hooks: (outputs, gradients, saved bytes, of those
    the bytes of storages that are also outputs). Autograd's own saves and custom ops'
    ctx.save_for_backward (Liger's, fusegen's, torch.compile's) all pass the pack hook."""
    inputs_storages = {t.untyped_storage().data_ptr() for t in inputs}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in inputs_storages:  # each storage once
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor  # kept as is: the backward runs on it

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        outputs = as_tuple(fn(*inputs))
    output_storages = {t.untyped_storage().data_ptr() for t in outputs}
    found = torch.autograd.grad(outputs, inputs, grads)
    saved_bytes = sum(saved.values())
    saved_outputs = sum(b for ptr, b in saved.items() if ptr in output_storages)
    return [t.detach() for t in outputs], list(found), saved_bytes, saved_outputs


def rel_err(value: torch.Tensor, reference: torch.Tensor) -> float:
    reference = reference.float()
    return float((value.float() - reference).norm() / reference.norm().clamp_min(1e-30))


def fingerprint(tensors) -> list[float]:
    """Norms of tensors a variant must not write to (the inputs, the upstream gradients)."""
    with torch.no_grad():
        return [float(t.float().norm()) for t in tensors]


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device: str, quick: bool) -> float:
    """One timing: a do_bench median on a GPU (a window of ~10 calls at least), else a
    wall-clock median (the interpreter)."""
    if device != "cuda":
        times = []
        for _ in range(1 if quick else 2):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3
    from triton.testing import do_bench

    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    estimate = (time.perf_counter() - start) * 1e3
    warmup, rep = max(10, int(2 * estimate)), max(40, int(10 * estimate))
    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def gpu_ms(fn, device: str, calls: int) -> float | None:
    """The GPU's time per call, with no host cost: replays of a CUDA graph of `calls`
    calls (tools.timing.graph_ms); None on the CPU or where fn cannot be captured."""
    if device != "cuda":
        return None
    return graph_ms(fn, calls=calls, replays=10)


def peak_bytes(step, device: str) -> int | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def copy_bandwidth(device: str) -> float | None:
    """A 1 GiB device-to-device copy's bytes (read + written) per second: the ceiling a
    memory-bound row's floor is taken against."""
    if device != "cuda":
        return None
    from triton.testing import do_bench

    source = torch.randn(2**28, device=device)
    target = torch.empty_like(source)
    ms = do_bench(lambda: target.copy_(source), warmup=25, rep=200, return_mode="median")
    return 2 * source.numel() * source.element_size() / (ms * 1e-3)


def kernel_profile(step, device: str) -> list[tuple[str, float, int]]:
    """(kernel name, its total GPU us, calls) in one fwd+bwd step, largest first."""
    if device != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    totals: dict[str, list] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals.setdefault(event.name, [0.0, 0])
            entry[0] += event.device_time
            entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])
    return [(name, us, calls) for name, (us, calls) in ranked]


def check_variants(row: Row, variants: list[Variant], inputs, grads) -> None:
    """Each variant's outputs and gradients against eager's (the first variant)."""
    names = OUTPUT_NAMES.get(row.kind, ("y",)) + tuple(f"d{n}" for n in INPUT_NAMES[row.kind])
    untouched = fingerprint((*inputs, *grads))
    reference = None
    for variant in variants:
        result = variant.result
        result.update(note=variant.note)
        if variant.fn is None:
            result["error"] = variant.note
            print(f"  {variant.name}: – ({variant.note})")
            continue
        try:
            outputs, found, saved, saved_outputs = probe(variant.fn, inputs, grads)
        except Exception as error:
            result["error"] = f"{type(error).__name__}: {error}"
            print(f"  {variant.name}: failed: {result['error']}")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            continue
        result.update(saved_bytes=saved, saved_output_bytes=saved_outputs)
        if variant.name == "eager":  # what the others are held to
            reference = outputs + found
        if reference is None:
            result.update(ok=False, error="not checked: eager failed")
            verdict = result["error"]
        else:
            errors = {
                n: rel_err(v, r) for n, v, r in zip(names, outputs + found, reference, strict=True)
            }
            worst = max(errors.values())
            result.update(rel_err=errors, max_rel_err=worst, ok=worst < TOLERANCE)
            detail = ", ".join(f"{n} {e:.1e}" for n, e in errors.items())
            verdict = f"max rel err {worst:.1e} ({detail}) "
            verdict += "ok" if result["ok"] else f"WRONG (tolerance {TOLERANCE})"
        if fingerprint((*inputs, *grads)) != untouched:
            result.update(ok=False, error="it wrote to its inputs or the upstream gradients")
            verdict += "; " + result["error"]
        print(f"  {variant.name}: {verdict}; saved {mb(saved)} MB")


def run_row(row: Row, variants: list[Variant], device: str, args) -> None:
    inputs, grads = make_inputs(row, device)
    print(f"\n## {row.name}: {row.chain}, {row.shape()}, bf16 on {device}")
    check_variants(row, variants, inputs, grads)
    inputs, grads = make_inputs(row, device)  # fresh: a variant may have written to them
    timed = [v for v in variants if v.fn is not None and "saved_bytes" in v.result]
    steps, forwards = {}, {}
    for variant in timed:

        def forward(fn=variant.fn, inputs=inputs):
            fn(*inputs)  # grad mode on: the saves made, then dropped with the outputs

        def step(fn=variant.fn, inputs=inputs, grads=grads):
            torch.autograd.grad(as_tuple(fn(*inputs)), inputs, grads)

        forwards[variant.name], steps[variant.name] = forward, step
        variant.result.update(fwd_rounds=[], fwd_bwd_rounds=[], launched_rounds=[])
    rounds = 1 if args.quick else args.rounds
    calls = 2 if row.flops() else 10  # per captured graph: a matmul row's steps take GBs
    for index in range(rounds):
        order = timed[index % len(timed) :] + timed[: index % len(timed)] if timed else []
        for variant in order:
            result = variant.result
            if "timing_error" in result:
                continue
            try:
                forward, step = forwards[variant.name], steps[variant.name]
                launched = time_ms(step, device, args.quick)
                fwd = gpu_ms(forward, device, calls)
                fwd_bwd = gpu_ms(step, device, calls)
                if fwd_bwd is None:  # the CPU, or not capturable: as launched
                    fwd, fwd_bwd = time_ms(forward, device, args.quick), launched
                    result["not_captured"] = device == "cuda"
                result["fwd_rounds"].append(fwd)
                result["fwd_bwd_rounds"].append(fwd_bwd)
                result["launched_rounds"].append(launched)
            except Exception as error:
                result["timing_error"] = f"{type(error).__name__}: {error}"
                result["error"] = "timing failed: " + result["timing_error"]
    for variant in timed:
        result = variant.result
        if result["fwd_bwd_rounds"]:
            for key in ("fwd", "fwd_bwd", "launched"):
                result[f"{key}_ms"] = statistics.median(result[f"{key}_rounds"])
            result["peak_bytes"] = peak_bytes(steps[variant.name], device)
            spread = result["fwd_bwd_rounds"]
            print(
                f"  {variant.name}: fwd {result['fwd_ms']:.3f} ms, fwd+bwd "
                f"{result['fwd_bwd_ms']:.3f} ms (rounds {min(spread):.3f}-{max(spread):.3f}), "
                f"launched {result['launched_ms']:.3f} ms"
            )
        if args.profile and "fwd_bwd_ms" in result:
            result["kernels"] = kernel_profile(steps[variant.name], device)
            total = sum(us for _, us, _ in result["kernels"])
            print(f"  {variant.name} kernels in one step: {total:.0f} us of GPU time")
            for name, us, calls in result["kernels"][:8]:
                print(f"    {us:9.1f} us  x{calls}  {name[:100]}")
    del inputs, grads
    if device == "cuda":
        torch.cuda.empty_cache()


def cell(value, digits=3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def mb(count: int | None) -> str:
    """Bytes as MB: one decimal, or three where that would read 0.0 (--quick's sizes)."""
    if count is None:
        return "–"
    return f"{count / MB:.1f}" if count >= MB or count == 0 else f"{count / MB:.3f}"


def spread(result: dict) -> str:
    rounds = result.get("fwd_bwd_rounds") or []
    return f"{min(rounds):.3f}-{max(rounds):.3f}" if len(rounds) > 1 else "–"


def speed(row: Row, ms: float | None, bandwidth: float | None) -> str:
    """TFLOP/s (a matmul row) or the floor's share of the copy bandwidth (a row chain)."""
    if ms is None:
        return "–"
    if row.flops():
        return f"{row.flops() / (ms * 1e-3) / 1e12:.0f} TFLOP/s"
    if bandwidth:
        return f"{row.floor_bytes() / (ms * 1e-3) / bandwidth:.0%} of copy"
    return "–"


def row_table(row: Row, variants: list[Variant], bandwidth: float | None) -> str:
    timed = {v.name: v.result["fwd_bwd_ms"] for v in variants if "fwd_bwd_ms" in v.result}
    lines = [
        f"### {row.name}: {row.chain}, {row.shape()}",
        "",
        "| variant | fwd ms | fwd+bwd ms | rounds | speed | launched ms | saved MB | peak MB "
        "| max rel err | vs best other |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for variant in variants:
        result = variant.result
        saved_cell = mb(result.get("saved_bytes"))
        if result.get("saved_output_bytes"):
            saved_cell += f" ({mb(result['saved_output_bytes'])} outputs)"
        err = result.get("max_rel_err")
        err_cell = "–" if err is None else f"{err:.1e}" + ("" if result.get("ok") else " WRONG")
        others = [ms for name, ms in timed.items() if name != variant.name]
        versus = "–"
        if variant.name in timed and others:
            versus = f"{min(others) / timed[variant.name]:.2f}x"
        lines.append(
            f"| {variant.name} | {cell(result.get('fwd_ms'))} | {cell(result.get('fwd_bwd_ms'))} "
            f"| {spread(result)} | {speed(row, result.get('fwd_bwd_ms'), bandwidth)} "
            f"| {cell(result.get('launched_ms'))} | {saved_cell} | {mb(result.get('peak_bytes'))} "
            f"| {err_cell} | {versus} |"
        )
    lines.append("")
    lines.append(
        "fwd, fwd+bwd: GPU time (CUDA graph replays). launched: the step called from Python "
        "as a user does (do_bench), the host's cost included where it outlasts the GPU's. "
        "vs best other: the fastest other variant's fwd+bwd over this one's (> 1: faster "
        "than all of them). rounds: the fastest and slowest round. saved MB in parentheses: "
        "the part that is also an output."
    )
    for variant in variants:
        if variant.result.get("error") or variant.note:
            lines.append(f"- {variant.name}: {variant.result.get('error') or variant.note}")
    return "\n".join(lines)


def summary_table(rows: list[Row], results: dict, quick: bool) -> str:
    lines = [
        "| chain | shape | eager | torch.compile | Liger | fusegen | target | "
        "beats best anchor? |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        variants = results[row.name]
        ms = {v.name: v.result.get("fwd_bwd_ms") for v in variants}
        ok = {v.name: v.result.get("ok", False) for v in variants}
        anchors = {n: t for n, t in ms.items() if not n.startswith("fusegen") and t is not None}
        fusegen = ms.get("fusegen")
        target = "≥ 1.10x Liger and compile" if row.target_ms is None else f"≤ {row.target_ms} ms"
        if quick:
            target += " (not these shapes)"
        elif fusegen is not None and row.target_ms is not None:
            target += ": met" if fusegen <= row.target_ms else ": missed"
        beats = "–"
        if fusegen is not None and anchors:
            best = min(anchors, key=anchors.get)
            ratio = anchors[best] / fusegen
            beats = f"{'yes' if ratio > 1 else 'no'}, {ratio:.2f}x vs {best}"
            if not ok.get("fusegen"):
                beats += " (fusegen WRONG)"
        lines.append(
            f"| {row.name}: {row.chain} | {row.shape()} | {cell(ms.get('eager'))} "
            f"| {cell(ms.get('torch.compile'))} | {cell(ms.get('Liger'))} | {cell(fusegen)} "
            f"| {target} | {beats} |"
        )
    lines.append("")
    lines.append(
        "fwd+bwd ms of GPU time (CUDA graph replays), bf16, each the median of its rounds. "
        "Best anchor: the fastest of every non-fusegen variant run."
    )
    return "\n".join(lines)


def pick_device(quick: bool) -> str:
    if torch.cuda.is_available():
        if os.environ.get("TRITON_INTERPRET") == "1":
            print("warning: TRITON_INTERPRET=1 with a GPU: the Triton kernels are interpreted")
        return "cuda"
    if not quick:
        sys.exit(
            "training_chains.py: no CUDA GPU; this benchmark is for a GPU (an H200 for the "
            "targets). --quick runs a small smoke run on the CPU under TRITON_INTERPRET=1."
        )
    # Read when each @triton.jit kernel is defined: set before any module holding one loads.
    os.environ["TRITON_INTERPRET"] = "1"
    return "cpu"


def quick_row(row: Row, device: str) -> Row:
    fixed = FUSEGEN_MODULES[row.kind][0] is not None  # llama_*: K and N fixed by the spec
    k = row.k if fixed or not row.k else QUICK_COLS
    n = row.n if fixed else QUICK_COLS
    return Row(row.name, row.kind, row.chain, QUICK_ROWS[device], k, n, row.target_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds per variant")
    parser.add_argument("--profile", action="store_true", help="each variant's kernels")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--quick", action="store_true", help="small shapes: a smoke run")
    parser.add_argument(
        "--built",
        type=Path,
        help="training.yaml's modules already built here (where fusegen's build cannot run: "
        "a machine without black or pydantic)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        action="append",
        default=[],
        help="a folder built by another fusegen version (its llama.yaml and training.yaml "
        "modules), timed as one more variant: a change's gain, interleaved (build it under "
        "build/, which git ignores, and carry it to the GPU machine)",
    )
    args = parser.parse_args()
    device = pick_device(args.quick)
    rows = [ROWS[name] for name in args.rows]
    if args.quick:
        rows = [quick_row(r, device) for r in rows]
    import triton  # after pick_device: TRITON_INTERPRET must be set before triton is used

    liger_version, liger_error = liger_import()
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu (TRITON_INTERPRET=1)"
    print(
        f"device {gpu}; torch {torch.__version__}, triton {triton.__version__}, "
        f"liger-kernel {liger_version or '– (' + liger_error + ')'}"
        f"{'; quick shapes' if args.quick else ''}{'; no torch.compile' if args.no_compile else ''}"
    )
    bandwidth = copy_bandwidth(device)
    if bandwidth:
        print(f"copy bandwidth (1 GiB device-to-device, read + write): {bandwidth / 1e12:.2f} TB/s")
    results = {}
    with tempfile.TemporaryDirectory(prefix="training_chains_") as folder:
        built = args.built
        if built is None and any(FUSEGEN_MODULES[r.kind][0] is None for r in rows):
            try:
                build_specs(Path(folder))
                built = Path(folder)
            except Exception as error:
                print(f"training.yaml not built: {error}")
        for row in rows:
            variants = [Variant("eager", EAGER[row.kind], "one PyTorch op at a time")]
            if row.kind == "gelu":
                variants.append(Variant("eager, F.linear", eager_gelu_linear, "bias in addmm"))
            if not args.no_compile:
                # A fresh static-shape compile per row: with dynamic=None the second shape
                # of one function would be recompiled with a symbolic M.
                compiled = torch.compile(EAGER[row.kind], dynamic=False)
                variants.append(Variant("torch.compile", compiled, "default mode, dynamic=False"))
            variants.append(liger_variant(row.kind, liger_error))
            variants += [fusegen_variant(row.kind, built, folder) for folder in args.baseline]
            variants.append(fusegen_variant(row.kind, built))
            run_row(row, variants, device, args)
            results[row.name] = variants
            print()
            print(row_table(row, variants, bandwidth))
    print("\n## Summary (fwd+bwd)\n")
    print(summary_table(rows, results, args.quick))
    if args.out:
        report = {
            "device": gpu,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "liger_kernel": liger_version,
            "liger_error": liger_error,
            "quick": args.quick,
            "compile": not args.no_compile,
            "rounds": args.rounds,
            "copy_bandwidth": bandwidth,
            "tolerance": TOLERANCE,
            "rows": [
                {
                    "row": row.name,
                    "chain": row.chain,
                    "shape": row.shape(),
                    "m": row.m,
                    "k": row.k,
                    "n": row.n,
                    "target_ms": row.target_ms,
                    "floor_bytes": row.floor_bytes(),
                    "flops": row.flops(),
                    "variants": [{"name": v.name, **v.result} for v in results[row.name]],
                }
                for row in rows
            ],
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
