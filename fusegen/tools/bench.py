"""`fusegen bench`: time generated kernels against what users would otherwise run.

For each kernel and shape: the fused kernel (after tuning, whose time is reported on its
own), eager PyTorch (the generated `reference`), torch.compile in its default and
max-autotune-no-cudagraphs modes (first-call time reported), and the cuBLASLt epilogue
where one exists. Inputs rotate over several buffer sets and triton's do_bench clears
L2 between repetitions, so no variant is flattered by a warm cache. Every variant's
output is checked against a float64 reference before it is timed.

torch and triton are imported here only, when the command runs; fusegen itself needs
neither.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fusegen import build, codegen, tables
from fusegen.writer import write_all
from fusegen.dtypes import QUANT_DTYPES
from fusegen.ir import Gate, Kernel, QuantChain

# Relative Frobenius error a variant may show against the float64 reference: rounding
# to the dtype, plus tf32 products for fp32.
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 5e-3}
DEFAULT_SHAPES = {
    "matmul": [(8192, 4096, 14336), (4096, 1024, 4096), (16, 4096, 14336)],
    "elementwise": [(16384, 8192)],
    "row": [(16384, 8192), (512, 262144), (131072, 1000)],
}
# Row counts for kernels whose spec fixes every other dim: a decode batch and a prefill
# (the ones `fusegen tune` tunes by default, so the committed tables serve them).
DEFAULT_ROWS = (16, 4096)
# How `--layout NAME=KIND` stores an input: the same values, in memory as a model may
# hold them. The launcher takes any strides; these are the ones worth measuring.
LAYOUTS = {
    "transposed": "stored with its first dim contiguous, as w.t() of a contiguous w",
    "sliced": "every other element of a twice-as-long last dim, as x[:, ::2]",
}
# Enough buffer sets that one pass over them is several times the 60 MB L2 of an H200.
ROTATION_BYTES = 512 << 20
MAX_SETS = 8


@dataclass
class Result:
    kernel: str
    shape: tuple
    dtype: str
    variant: str
    ms: float | None = None  # median time of one call
    rate: float | None = None  # TFLOP/s for matmul chains, GB/s for elementwise
    roofline: float | None = None  # fraction of the faster of the two ceilings' times
    first_call_s: float | None = None  # the first call: compilation and tuning
    error: float | None = None  # relative error against the float64 reference
    layout: str = ""  # the inputs not stored contiguously, as `--layout` gave them
    ok: bool = True
    note: str = ""
    speedup: float | None = field(default=None)  # fused only: over the best other variant


@dataclass(frozen=True)
class Ceilings:
    tflops: float  # a large bf16 matmul through torch (cuBLAS)
    gbs: float  # a large device-to-device copy, bytes read plus written


# -- the work of one shape ----------------------------------------------------------


def chain_of(kernel) -> Kernel:
    """The matmul chain a kernel computes: its own, or a quantized chain's."""
    return kernel.chain if isinstance(kernel, QuantChain) else kernel


def shape_dims(kernel, shape: tuple) -> dict:
    """{dim: size} for a kernel from an (M, K, N) or (M, N) shape; static dims must agree."""
    kernel = chain_of(kernel)
    names = (
        [kernel.matmul.m, kernel.matmul.k, kernel.matmul.n]
        if kernel.matmul
        else [kernel.row, kernel.col]
    )
    if len(shape) != len(names):
        raise ValueError(f"{kernel.name} takes shapes {','.join(names)}, got {shape}")
    sizes = dict(zip(names, shape, strict=True))
    for dim in kernel.dims:
        if dim.size is not None and sizes.get(dim.name, dim.size) != dim.size:
            raise ValueError(
                f"{kernel.name}: the spec fixes {dim.name} = {dim.size}, "
                f"the shape asks {sizes[dim.name]}"
            )
    return sizes


def usable_sizes(kernel: Kernel, shapes, progress):
    """(shape, {dim: size}) for each of `shapes` the kernel takes; the others are
    reported through `progress` and skipped."""
    for shape in shapes:
        try:
            yield shape, shape_dims(kernel, shape)
        except ValueError as exc:
            progress(f"  skipped: {exc}")


def row_shapes(kernel, rows: list[int]) -> list[tuple]:
    """Shapes at these row counts, the other dims at the spec's static sizes."""
    kernel = chain_of(kernel)
    names = (
        [kernel.matmul.m, kernel.matmul.k, kernel.matmul.n]
        if kernel.matmul
        else [kernel.row, kernel.col]
    )
    dynamic = [n for n in names[1:] if kernel.dim(n).size is None]
    if dynamic:
        raise ValueError(
            f"{kernel.name}: {'dims' if len(dynamic) > 1 else 'dim'} {', '.join(dynamic)} "
            f"{'are' if len(dynamic) > 1 else 'is'} dynamic; give full shapes with "
            f"--shapes {','.join(names)}"
        )
    return [(r, *(kernel.dim(n).size for n in names[1:])) for r in rows]


def kernel_shapes(kernel, shapes=None, rows=None) -> list[tuple]:
    """What to bench a kernel at: the given full shapes of its kind; else the given row
    counts at the spec's sizes; else, where the spec fixes every dim but the rows,
    DEFAULT_ROWS at its sizes (the anchor shapes would not fit it), and the anchor shapes
    of its kind otherwise (a quantized chain's: its matmul's). Raises ValueError for rows
    on a spec that leaves dims dynamic."""
    kernel = chain_of(kernel)
    if shapes is not None:
        return [s for s in shapes if len(s) == (3 if kernel.matmul else 2)]
    if rows is not None:
        return row_shapes(kernel, rows)
    try:
        return row_shapes(kernel, DEFAULT_ROWS)
    except ValueError:
        return DEFAULT_SHAPES[kernel.kind]


def work(kernel, sizes: dict, element_bytes: int) -> tuple[float, float]:
    """(floating-point operations, bytes that must move) for one call; a quantized
    input's bytes are its storage's (int4 half a byte a value), its scales' and zero
    points' (quantized_bytes)."""
    quantized = quantized_bytes(kernel, sizes, element_bytes)
    kernel = chain_of(kernel)
    rows, cols = sizes[kernel.row], sizes[kernel.col]
    flops = 0.0
    if kernel.matmul:
        products = 1 + sum(isinstance(s, Gate) for s in kernel.steps)
        flops = 2.0 * rows * cols * sizes[kernel.matmul.k] * products
    moved = sum(quantized.values())
    for t in kernel.inputs:
        if t.name in quantized:
            continue
        numel = 1
        for d in t.dims:
            numel *= sizes[d]
        moved += numel * (4 if t.dtype == "fp32" else element_bytes)
    out_bytes = 4 if kernel.out_dtype == "fp32" else element_bytes
    out_numel = rows if kernel.reduces else rows * cols
    extras = len(kernel.emits) * rows * cols * element_bytes
    return flops, moved + out_numel * out_bytes + extras


def quantized_bytes(kernel, sizes: dict, element_bytes: int) -> dict[str, float]:
    """A quantized chain's quantized inputs -> the bytes each call reads of them: the
    stored values, and the scales and zero points of their kind (as `make_inputs` draws
    them: int scales in the call's dtype, fp8 ones in fp32). {} for other kernels."""
    if not isinstance(kernel, QuantChain):
        return {}
    found = {}
    for q in kernel.quant:
        (t,) = [t for t in kernel.chain.inputs if t.name == q.name]
        rows = 1
        for d in t.dims[:-1]:
            rows *= sizes[d]
        k = sizes[t.dims[-1]]
        stored = rows * k * QUANT_DTYPES[q.dtype].bits / 8
        factors = {
            "tensor": 1,
            "row": rows,
            "group": rows * -(-k // q.group) if q.group else rows,
            "block": -(-rows // (q.rows_per or rows)) * -(-k // (q.group or k)),
        }[q.scale]
        scale_bytes = 4 if q.dtype.startswith("fp8") else element_bytes
        found[q.name] = stored + factors * (scale_bytes + (1 if q.zero_point else 0))
    return found


def check_layouts(kernels, layouts: dict[str, str]) -> None:
    """ValueError unless each `--layout` names a layout of LAYOUTS and an input that some
    kernel has (a transposed one with two dims)."""
    for name, kind in layouts.items():
        if kind not in LAYOUTS:
            raise ValueError(
                f"--layout {name}={kind}: no layout '{kind}'; valid: {', '.join(LAYOUTS)}"
            )
        if any(isinstance(k, QuantChain) and k.quant_of(name) for k in kernels):
            raise ValueError(
                f"--layout {name}={kind}: '{name}' is quantized; its storage is read as the"
                " spec packs it (give layouts for its plain inputs)"
            )
        found = [t for k in kernels for t in chain_of(k).inputs if t.name == name]
        if not found:
            have = sorted({t.name for k in kernels for t in chain_of(k).inputs})
            raise ValueError(
                f"--layout {name}={kind}: no input '{name}'; inputs: {', '.join(have)}"
            )
        if kind == "transposed" and all(len(t.dims) < 2 for t in found):
            raise ValueError(f"--layout {name}=transposed: '{name}' has one dim")


def stored_as(torch, values, kind: str):
    """`values` in the memory layout `kind` (see LAYOUTS)."""
    if kind == "transposed" and values.dim() == 2:
        return values.T.contiguous().T
    if kind == "sliced":
        wide = torch.empty(
            (*values.shape[:-1], 2 * values.shape[-1]), dtype=values.dtype, device=values.device
        )
        wide[..., ::2] = values
        return wide[..., ::2]
    return values


def layout_text(kernel, layouts: dict[str, str]) -> str:
    names = {t.name for t in chain_of(kernel).inputs}
    return ", ".join(f"{n} {kind}" for n, kind in layouts.items() if n in names)


def make_inputs(
    torch, kernel, sizes: dict, dtype, device, seed: int, layouts: dict | None = None
) -> dict:
    if isinstance(kernel, QuantChain):
        return quantized_inputs(torch, kernel, sizes, dtype, device, seed, layouts)
    generator = torch.Generator(device=device).manual_seed(seed)
    weights = (
        {kernel.matmul.b} | {g.matmul.b for g in kernel.steps if isinstance(g, Gate)}
        if kernel.matmul
        else set()
    )
    tensors = {}
    for t in kernel.inputs:
        shape = [sizes[d] for d in t.dims]
        values = torch.randn(shape, generator=generator, device=device)
        if t.name in weights:
            values *= sizes[kernel.matmul.k] ** -0.5
        if any(
            getattr(s, "op", None) == "div" and getattr(s, "operand", None) == t.name
            for s in kernel.steps
        ):
            values = values.sign() * (0.5 + values.abs())
        pinned = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(t.dtype)
        tensors[t.name] = stored_as(torch, values.to(pinned or dtype), (layouts or {}).get(t.name))
    return tensors


def quantized_inputs(torch, kernel, sizes, dtype, device, seed, layouts=None) -> dict:
    """A quantized chain's call: each quantized input's storage with its scales (and
    zero points), drawn as the generated tests draw them (int scales in the call's
    dtype, as AWQ and GPTQ checkpoints keep them; fp8 ones in fp32, as _scaled_mm takes
    them); the plain inputs as make_inputs draws them."""
    from fusegen.runtime.quant import draw_quantized

    chain = kernel.chain
    plain = make_inputs(torch, chain, sizes, dtype, device, seed, layouts)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for t in chain.inputs:
        q = kernel.quant_of(t.name)
        if q is None:
            tensors[t.name] = plain[t.name]
            continue
        fan = sizes[chain.matmul.k] ** -0.5 if t.name in kernel.weights else 1.0
        scale_dtype = torch.float32 if q.dtype.startswith("fp8") else dtype
        shape = [sizes[d] for d in t.dims]
        drawn = draw_quantized(t.name, q, shape, fan, generator, scale_dtype)
        tensors.update({n: v.to(device) for n, v in drawn.items()})
    return tensors


def exact_inputs(kernel, inputs: dict) -> dict:
    """A call's inputs for the float64 reference: the plain ones and the scales in
    float64, a quantized input's storage and zero points as they are."""
    kept = set()
    if isinstance(kernel, QuantChain):
        kept = {q.name for q in kernel.quant} | {q.zero_name for q in kernel.quant}
    return {n: v if n in kept else v.double() for n, v in inputs.items()}


# -- variants -----------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    name: str
    applies: Callable[[Kernel], bool]
    # (torch, module, kernel) -> a function of the inputs, or a reason it cannot run
    make: Callable
    # (torch, module, kernel, sets, dtype) -> the input sets this variant takes, made
    # before any timing; None: the call's own
    prepare: Callable | None = None


def _fused(torch, module, kernel):
    return getattr(module, kernel.name)


def _eager(torch, module, kernel):
    return module.reference


def _compiled(mode):
    def make(torch, module, kernel):
        torch._dynamo.reset()
        return torch.compile(module.reference, mode=mode, dynamic=False)

    return make


def cublaslt_form(kernel: Kernel) -> str | None:
    """'relu' or 'gelu' when the chain is exactly a cuBLASLt epilogue (matmul, bias, then
    relu or the tanh GELU), else None."""
    if not isinstance(kernel, Kernel):
        return None
    steps = kernel.steps
    if not kernel.matmul or kernel.matmul.a_transposed or len(steps) != 2 or kernel.out_dtype:
        return None
    bias, act = steps
    if getattr(bias, "op", None) != "bias" or kernel.tensor(bias.operand).dtype is not None:
        return None
    return {"relu": "relu", "gelu_tanh": "gelu"}.get(getattr(act, "op", None))


def _cublaslt(torch, module, kernel):
    form = cublaslt_form(kernel)
    mm = kernel.matmul
    bias = kernel.steps[0].operand

    def run(**t):
        b = t[mm.b].T if mm.b_transposed else t[mm.b]
        x = t[mm.a].reshape(-1, t[mm.a].shape[-1])
        return torch._addmm_activation(t[bias], x, b, use_gelu=form == "gelu")

    return run


def _dense_module(module, kernel):
    """The module of a quantized chain's matmul chain on plain weights (fusegen's own
    kernel for the call's dtype, and its reference), rendered once beside the quantized
    module (load_module's folder, which the run removes), in a folder of its own."""
    dense = getattr(module, "_bench_dequantized", None)
    if dense is None:
        chain = kernel.chain
        inputs = tuple(
            dataclasses.replace(t, dtype=None) if kernel.quant_of(t.name) else t
            for t in chain.inputs
        )
        folder = Path(module.__file__).parent / "dequantized"
        folder.mkdir(exist_ok=True)
        dense = load_module(dataclasses.replace(chain, inputs=inputs), folder)
        module._bench_dequantized = dense
    return dense


def _dequantized_sets(torch, module, kernel, sets, dtype) -> list[dict]:
    """Each input set with its quantized inputs dequantized into the call's dtype (their
    scales and zero points dropped): what the model held before quantization."""
    out = []
    for inputs in sets:
        dense = {}
        for t in kernel.chain.inputs:
            q = kernel.quant_of(t.name)
            if q is None:
                dense[t.name] = inputs[t.name]
                continue
            zero = inputs.get(q.zero_name) if q.zero_name else None
            stored, scale = inputs[t.name], inputs[q.scale_name]
            dense[t.name] = module._rt.dequantize(stored, scale, zero, module.QUANT[t.name], dtype)
        out.append(dense)
    return out


def _quantized(kernel) -> bool:
    return isinstance(kernel, QuantChain)


VARIANTS = [
    Variant("fusegen", lambda k: True, _fused),
    Variant("eager", lambda k: True, _eager),
    Variant("torch.compile", lambda k: True, _compiled("default")),
    Variant("torch.compile max-autotune", lambda k: True, _compiled("max-autotune-no-cudagraphs")),
    Variant("cuBLASLt epilogue", lambda k: cublaslt_form(k) is not None, _cublaslt),
    # A quantized chain against the same chain on the weights it replaces: fusegen's own
    # kernel, and eager PyTorch (cuBLAS), the weights dequantized before any timing.
    Variant(
        "fusegen, dequantized weights",
        _quantized,
        lambda torch, module, kernel: getattr(_dense_module(module, kernel), kernel.name),
        _dequantized_sets,
    ),
    Variant(
        "eager, dequantized weights",
        _quantized,
        lambda torch, module, kernel: _dense_module(module, kernel).reference,
        _dequantized_sets,
    ),
]
VARIANT_NAMES = {
    "fusegen": "fusegen",
    "eager": "eager",
    "compile": "torch.compile",
    "max-autotune": "torch.compile max-autotune",
    "cublaslt": "cuBLASLt epilogue",
    # Quantized chains' (the others have no quantized weights to dequantize).
    "dequantized": "fusegen, dequantized weights",
    "dequantized-eager": "eager, dequantized weights",
    # Attention kernels' (fusegen/bench_attention.py): no chain variant has these names.
    "sdpa": "SDPA",
    "flex": "FlexAttention (compiled)",
}


# -- running --------------------------------------------------------------------------


def load_module(kernel: Kernel, folder: Path, tables_dir: Path | None = None):
    """Render the kernel's module into `folder` and import it under a private name,
    with its tuned table from `tables_dir` beside it where there is one (the launcher
    then takes the table's configs, as the committed module would; entries tuned for
    other kernel source are ignored by the launcher, and logged)."""
    text = codegen.render(kernel)[0].text
    path = folder / f"{kernel.name}.py"
    path.write_text(text)
    write_all(build.runtime_files(folder))
    table = tables.path_for(tables_dir, kernel.name) if tables_dir else None
    if table and table.is_file():
        shutil.copyfile(table, tables.path_for(folder, kernel.name))
    return import_file(path, f"fusegen_bench_{kernel.name}")


def import_file(path: Path, name: str):
    """Import a generated module from its file under a private name (not in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_dtype(torch, dtype_name: str):
    return getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype_name])


def input_sets(
    torch, module, kernel, sizes, dtype_name, device, layouts=None
) -> tuple[list[dict], object]:
    """Buffer sets to rotate over (enough that one pass is several times the L2) and the
    float64 reference of the first."""
    dtype = torch_dtype(torch, dtype_name)
    _, moved = work(kernel, sizes, torch.empty((), dtype=dtype).element_size())
    count = min(MAX_SETS, max(2, ROTATION_BYTES // max(moved, 1)))
    sets = [
        make_inputs(torch, kernel, sizes, dtype, device, seed, layouts) for seed in range(count)
    ]
    exact = module.reference(**exact_inputs(kernel, sets[0]), out_dtype=torch.float64)
    return sets, exact


def relative_error(torch, out, exact) -> float:
    """Of the chain's result (the first output, where there are several)."""
    if isinstance(exact, tuple):
        out, exact = out[0], exact[0]
    out = out.double().reshape(exact.shape)
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - exact).norm() / exact.norm().clamp_min(1e-30))


def bench_shape(
    torch,
    timer,
    module,
    kernel,
    sizes,
    dtype_name,
    variants,
    ceilings,
    progress,
    device="cuda",
    layouts=None,
) -> list[Result]:
    sets, exact = input_sets(torch, module, kernel, sizes, dtype_name, device, layouts)
    layout = layout_text(kernel, layouts or {})
    element = torch.empty((), dtype=torch_dtype(torch, dtype_name)).element_size()
    flops, moved = work(kernel, sizes, element)
    shape = tuple(sizes.values())
    floor_s = max(flops / (ceilings.tflops * 1e12), moved / (ceilings.gbs * 1e9))
    results = []
    for variant in variants:
        if not variant.applies(kernel):
            continue
        row = Result(kernel.name, shape, dtype_name, variant.name, layout=layout)
        stored = f" ({layout})" if layout else ""
        progress(
            f"  {kernel.name} {'x'.join(map(str, shape))}{stored} {dtype_name}: {variant.name} ..."
        )
        try:
            dtype = torch_dtype(torch, dtype_name)
            own = variant.prepare(torch, module, kernel, sets, dtype) if variant.prepare else sets
            fn = variant.make(torch, module, kernel)
            start = time.perf_counter()
            out = fn(**own[0])
            if device == "cuda":
                torch.cuda.synchronize()
            row.first_call_s = time.perf_counter() - start
            row.error = relative_error(torch, out, exact)
            row.ok = row.error <= TOLERANCE[dtype_name]
            if variant.name == "fusegen":
                launch = module.last_launch()
                fast = ", tanh.approx" if launch.get("fast_tanh") else ""
                # The spec's `nonfinite: reference` reads the output back on every call.
                nonfinite = chain_of(kernel).fallback_nonfinite == "reference"
                check = ", inf/NaN check" if nonfinite else ""
                # A quantized chain's launch names its dot's dtype, not a path.
                path = launch.get("path") or f"{launch.get('dot')} dot"
                row.note = f"{path} ({launch['source']}{fast}{check}) {launch['config']}"
            cycle = itertools.cycle(own)
            row.ms = timer(lambda fn=fn, cycle=cycle: fn(**next(cycle)))
            row.rate = flops / row.ms / 1e9 if flops else moved / row.ms / 1e6
            row.roofline = floor_s / (row.ms / 1e3)
        except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, not fatal
            row.ok, row.note = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        results.append(row)
    return with_speedup(results)


def with_speedup(results: list[Result]) -> list[Result]:
    """One shape's results, fusegen's speedup over the fastest other variant that passed set."""
    fused = next((r for r in results if r.variant == "fusegen" and r.ms), None)
    others = [r.ms for r in results if r.variant != "fusegen" and r.ms and r.ok]
    if fused and others:
        fused.speedup = min(others) / fused.ms
    return results


def measure_ceilings(torch, timer) -> Ceilings:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = timer(lambda: a @ b)
    src = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy_ms = timer(lambda: dst.copy_(src))
    return Ceilings(tflops=2 * 8192**3 / ms / 1e9, gbs=2 * src.numel() / copy_ms / 1e6)


def run(
    kernels,
    shapes,
    dtype_name,
    variants,
    timer,
    progress,
    ceilings=None,
    device="cuda",
    tables_dir: Path | None = None,
    layouts: dict | None = None,
) -> tuple[Ceilings, list[Result]]:
    """Bench every kernel at its shapes (`shapes(kernel)`, see kernel_shapes), with the
    tuned tables found in tables_dir (None: the launcher tunes at the first call of each
    shape) and inputs stored as `layouts` says (input name -> a LAYOUTS kind; the others
    contiguous). `timer(fn) -> ms` and `ceilings` can be given (the tests run this on the
    CPU with a fake timer)."""
    import torch

    ceilings = ceilings or measure_ceilings(torch, timer)
    progress(
        f"ceilings: {ceilings.tflops:.0f} TFLOP/s (bf16 matmul), {ceilings.gbs:.0f} GB/s (copy)"
    )
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kernel in kernels:
            if dtype_name not in kernel.dtypes:
                progress(f"  skipped: {kernel.name} does not take {dtype_name} (--dtype)")
                continue
            module = load_module(kernel, Path(tmp), tables_dir)
            for _, sizes in usable_sizes(kernel, shapes(kernel), progress):
                results += bench_shape(
                    torch,
                    timer,
                    module,
                    kernel,
                    sizes,
                    dtype_name,
                    variants,
                    ceilings,
                    progress,
                    device,
                    layouts,
                )
    return ceilings, results


def versions() -> dict:
    import torch
    import triton

    return {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "python": sys.version.split()[0],
    }
