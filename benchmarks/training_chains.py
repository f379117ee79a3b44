"""Training cost of the chains in issue 14's targets table on one GPU, bf16: the forward
and the forward + backward time, and the activation memory autograd keeps for the backward,
of each chain run four ways: eager PyTorch (one op at a time), torch.compile of that eager
function (default mode), Liger-Kernel where Liger has the chain, and fusegen's generated
kernels (the launchers' own autograd: the backward kernel, then cuBLAS for the operands).

    python benchmarks/training_chains.py [--rows swiglu-4096 gelu-4096 ...] [--out FILE.json]
                                         [--no-compile] [--quick]

Rows (default all):
    swiglu-4096        silu(x @ Wg.T) * (x @ Wu.T), x 4096x4096, Wg/Wu 14336x4096
    swiglu-16384       the same, x 16384x4096
    gelu-4096          gelu_tanh(x @ W.T + b), x 4096x4096, W 14336x4096, b 14336
    add-rmsnorm-16384  h = x + r; y = rmsnorm(h) * w (eps 1e-5), returns (y, h), x/r 16384x4096

Every input (x, weights, bias, residual) requires grad; the fwd+bwd step runs the forward,
then torch.autograd.grad(outputs, inputs, fixed random upstream gradients), every output
getting one. "fwd" is the forward alone with grad mode on (what a training step pays: the
saved tensors included), its outputs dropped. Times: triton.testing.do_bench medians.
"saved MB": the bytes (1e6) of the distinct storages autograd's saved-tensor hooks see the
forward save, the inputs' own storages left out: what the forward adds for the backward.
"peak MB": torch.cuda.max_memory_allocated during one fwd+bwd step, minus what was
allocated before it. Each variant's outputs and gradients are first checked against eager
(norm-wise relative error, < 2e-2 passes), so a fast but wrong variant shows.

fusegen's modules: generated/llama_mlp_gate_up.py and generated/llama_add_rmsnorm.py;
anchor_gelu is built from benchmarks/specs/anchors.yaml into a temporary folder by
`python -m fusegen build` (a subprocess: fusegen is not imported here). Liger is optional:
where `import liger_kernel` fails its column reads "–".

--quick: small shapes (the rows shrunk: the generated modules fix K and N) for a smoke run;
without a GPU it runs on the CPU with TRITON_INTERPRET=1 (slow: llama_mlp_gate_up takes
about two minutes per fwd+bwd there), where targets are not compared.
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
EPS = 1e-5
TOLERANCE = 2e-2  # norm-wise relative error against eager, in bf16
DTYPE = torch.bfloat16
QUICK_ROWS = {"cuda": 64, "cpu": 16}  # the interpreter's cost grows with the programs run
QUICK_GELU_KN = (256, 1024)  # anchor_gelu is fully dynamic: its K and N shrink too
MB = 1e6


@dataclass
class Row:
    name: str
    kind: str  # swiglu, gelu or add_rmsnorm
    chain: str
    m: int
    k: int
    n: int
    target_ms: float  # issue 14's fwd+bwd target

    def shape(self) -> str:
        if self.kind == "swiglu":
            return f"x {self.m}x{self.k}, Wg/Wu {self.n}x{self.k}"
        if self.kind == "gelu":
            return f"x {self.m}x{self.k}, W {self.n}x{self.k}, b {self.n}"
        return f"x/r {self.m}x{self.n}, w {self.n}"


ROWS = {
    row.name: row
    for row in (
        Row("swiglu-4096", "swiglu", "silu(x@Wg.T) * (x@Wu.T)", 4096, 4096, 14336, 4.1),
        Row("swiglu-16384", "swiglu", "silu(x@Wg.T) * (x@Wu.T)", 16384, 4096, 14336, 16.0),
        Row("gelu-4096", "gelu", "gelu_tanh(x@W.T + b)", 4096, 4096, 14336, 2.0),
        Row(
            "add-rmsnorm-16384", "add_rmsnorm", "rmsnorm(x + r) * w, x + r", 16384, 4096, 4096, 0.35
        ),
    )
}
INPUT_NAMES = {
    "swiglu": ("x", "w_gate", "w_up"),
    "gelu": ("x", "w", "b"),
    "add_rmsnorm": ("x", "residual", "weight"),
}
OUTPUT_NAMES = {"swiglu": ("y",), "gelu": ("y",), "add_rmsnorm": ("y", "h")}
FUSEGEN_MODULES = {  # kind: (module file, launcher); None: built from anchors.yaml
    "swiglu": (ROOT / "generated" / "llama_mlp_gate_up.py", "llama_mlp_gate_up"),
    "gelu": (None, "anchor_gelu"),
    "add_rmsnorm": (ROOT / "generated" / "llama_add_rmsnorm.py", "llama_add_rmsnorm"),
}


# The eager chains, one op at a time (module-level functions: torch.compile wraps these).


def eager_swiglu(x, w_gate, w_up):
    return F.silu(x @ w_gate.T) * (x @ w_up.T)


def eager_gelu(x, w, b):
    return F.gelu(x @ w.T + b, approximate="tanh")


def eager_gelu_linear(x, w, b):
    # What nn.Linear runs: the bias in cuBLAS's epilogue (addmm), a stronger eager anchor.
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def eager_add_rmsnorm(x, residual, weight):
    # HF LlamaRMSNorm: the statistics in fp32, the weight applied in the input dtype.
    h = x + residual
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS)
    return weight * normed.to(h.dtype), h


EAGER = {"swiglu": eager_swiglu, "gelu": eager_gelu, "add_rmsnorm": eager_add_rmsnorm}


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


def build_anchors(folder: Path) -> None:
    """anchors.yaml rendered into `folder` by the CLI, in a subprocess so this script does not
    import fusegen (the modules it writes need only torch, triton and their runtime)."""
    spec = ROOT / "benchmarks" / "specs" / "anchors.yaml"
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


def liger_variant(kind: str, liger_error: str | None) -> Variant:
    if liger_error:
        return Variant("Liger", note=liger_error)
    if kind == "gelu":
        return Variant("Liger", note="Liger has no gelu + bias kernel")
    try:
        if kind == "swiglu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            silu_mul, _ = bound_apply(LigerSiLUMulFunction, 2, {})

            def liger_swiglu(x, w_gate, w_up):
                return silu_mul(x @ w_gate.T, x @ w_up.T)  # cuBLAS, then Liger's kernel

            return Variant("Liger", liger_swiglu, "cuBLAS matmuls + LigerSiLUMulFunction")
        # in_place=False: in place, Liger's backward writes dX over the incoming gradient,
        # the fixed upstream gradient this script reuses every step.
        named = {"eps": EPS, "offset": 0.0, "casting_mode": "llama", "in_place": False}
        try:
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        except ImportError:
            LigerFusedAddRMSNormFunction = None
        if LigerFusedAddRMSNormFunction is not None:
            fused, params = bound_apply(LigerFusedAddRMSNormFunction, 3, named)
            return Variant(
                "Liger", fused, f"LigerFusedAddRMSNormFunction(x, r, w, {', '.join(params)})"
            )
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        rms_norm, params = bound_apply(LigerRMSNormFunction, 2, named)

        def liger_add_rmsnorm(x, residual, weight):
            h = x + residual
            return rms_norm(h, weight), h

        return Variant("Liger", liger_add_rmsnorm, "x + r, then LigerRMSNormFunction")
    except Exception as error:
        return Variant("Liger", note=f"{type(error).__name__}: {error}")


def fusegen_variant(kind: str, anchors: Path | None) -> Variant:
    path, name = FUSEGEN_MODULES[kind]
    try:
        if path is None:
            if anchors is None:
                raise RuntimeError("anchors.yaml was not built")
            path = anchors / f"{name}.py"
        launcher = getattr(load_module(path, name), name)
    except Exception as error:
        return Variant("fusegen", note=f"{type(error).__name__}: {error}")
    return Variant(
        "fusegen", launcher, str(path.relative_to(ROOT) if ROOT in path.parents else name)
    )


def make_inputs(row: Row, device: str):
    """The row's inputs (all requiring grad) and the fixed upstream gradients, scaled so
    every value is O(1)."""
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(DTYPE)

    m, k, n = row.m, row.k, row.n
    if row.kind == "swiglu":
        inputs = (randn(m, k), randn(n, k, scale=k**-0.5), randn(n, k, scale=k**-0.5))
        out_shapes = [(m, n)]
    elif row.kind == "gelu":
        inputs = (randn(m, k), randn(n, k, scale=k**-0.5), randn(n))
        out_shapes = [(m, n)]
    else:
        inputs = (randn(m, n), randn(m, n), 1 + randn(n, scale=0.1))
        out_shapes = [(m, n), (m, n)]
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
    if device != "cuda":  # the interpreter: a wall-clock median (after the probe's warm-up)
        times = []
        for _ in range(1 if quick else 3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3
    from triton.testing import do_bench

    # do_bench times rep ms worth of calls: a long step would get only a few, so the
    # window grows to ~20 calls (and the warm-up with it).
    synchronize(device)
    start = time.perf_counter()
    for _ in range(3):
        fn()
    synchronize(device)
    estimate = (time.perf_counter() - start) / 3 * 1e3
    warmup, rep = max(25, int(5 * estimate)), max(100, int(20 * estimate))
    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def peak_bytes(step, device: str) -> int | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def run_row(row: Row, variants: list[Variant], device: str, quick: bool) -> None:
    inputs, grads = make_inputs(row, device)
    names = OUTPUT_NAMES[row.kind] + tuple(f"d{n}" for n in INPUT_NAMES[row.kind])
    untouched = fingerprint((*inputs, *grads))
    reference = None
    print(f"\n## {row.name}: {row.chain}, {row.shape()}, bf16 on {device}")
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
            if device == "cuda":
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
            inputs, grads = make_inputs(row, device)  # fresh ones for the variants after
        print(f"  {variant.name}: {verdict}; saved {mb(saved)} MB")
        del outputs, found
    del reference

    for variant in variants:
        result = variant.result
        if variant.fn is None or "saved_bytes" not in result:
            continue

        def forward(fn=variant.fn, inputs=inputs):
            fn(*inputs)  # grad mode on: the saves made, then dropped with the outputs

        def step(fn=variant.fn, inputs=inputs, grads=grads):
            torch.autograd.grad(as_tuple(fn(*inputs)), inputs, grads)

        try:
            result["fwd_ms"] = time_ms(forward, device, quick)
            result["fwd_bwd_ms"] = time_ms(step, device, quick)
            result["peak_bytes"] = peak_bytes(step, device)
        except Exception as error:
            result["error"] = f"timing failed: {type(error).__name__}: {error}"
        print(
            f"  {variant.name}: fwd {result.get('fwd_ms', float('nan')):.3f} ms, "
            f"fwd+bwd {result.get('fwd_bwd_ms', float('nan')):.3f} ms"
        )
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


def row_table(row: Row, variants: list[Variant]) -> str:
    timed = {v.name: v.result["fwd_bwd_ms"] for v in variants if "fwd_bwd_ms" in v.result}
    lines = [
        f"### {row.name}: {row.chain}, {row.shape()}",
        "",
        "| variant | fwd ms | fwd+bwd ms | saved MB | peak MB | max rel err | vs best other |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for variant in variants:
        result = variant.result
        saved = result.get("saved_bytes")
        saved_cell = mb(saved)
        if result.get("saved_output_bytes"):
            saved_cell += f" ({mb(result['saved_output_bytes'])} outputs)"
        peak = result.get("peak_bytes")
        err = result.get("max_rel_err")
        err_cell = "–" if err is None else f"{err:.1e}" + ("" if result.get("ok") else " WRONG")
        others = [ms for name, ms in timed.items() if name != variant.name]
        versus = "–"
        if variant.name in timed and others:
            versus = f"{min(others) / timed[variant.name]:.2f}x"
        lines.append(
            f"| {variant.name} | {cell(result.get('fwd_ms'))} | {cell(result.get('fwd_bwd_ms'))} "
            f"| {saved_cell} | {mb(peak)} "
            f"| {err_cell} | {versus} |"
        )
    lines.append("")
    lines.append(
        "vs best other: the fastest other variant's fwd+bwd over this one's (> 1: faster "
        "than all of them). saved MB in parentheses: the part that is also an output."
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
        anchors = {n: t for n, t in ms.items() if n != "fusegen" and t is not None}
        fusegen = ms.get("fusegen")
        target = f"≤ {row.target_ms} ms"
        if quick:
            target += " (not these shapes)"
        elif fusegen is not None:
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
    lines.append("fwd+bwd ms, bf16. Best anchor: the fastest of every non-fusegen variant run.")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--quick", action="store_true", help="small shapes: a smoke run")
    args = parser.parse_args()
    device = pick_device(args.quick)
    rows = [ROWS[name] for name in args.rows]
    if args.quick:
        rows = [
            Row(
                r.name,
                r.kind,
                r.chain,
                QUICK_ROWS[device],
                *(QUICK_GELU_KN if r.kind == "gelu" else (r.k, r.n)),
                r.target_ms,
            )
            for r in rows
        ]
    import triton  # after pick_device: TRITON_INTERPRET must be set before triton is used

    liger_version, liger_error = liger_import()
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu (TRITON_INTERPRET=1)"
    print(
        f"device {gpu}; torch {torch.__version__}, triton {triton.__version__}, "
        f"liger-kernel {liger_version or '– (' + liger_error + ')'}"
        f"{'; quick shapes' if args.quick else ''}{'; no torch.compile' if args.no_compile else ''}"
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="training_chains_") as folder:
        anchors = None
        if any(r.kind == "gelu" for r in rows):
            try:
                build_anchors(Path(folder))
                anchors = Path(folder)
            except Exception as error:
                print(f"anchors.yaml not built: {error}")
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
            variants.append(fusegen_variant(row.kind, anchors))
            run_row(row, variants, device, args.quick)
            results[row.name] = variants
            print()
            print(row_table(row, variants))
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
                    "variants": [{"name": v.name, **v.result} for v in results[row.name]],
                }
                for row in rows
            ],
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
