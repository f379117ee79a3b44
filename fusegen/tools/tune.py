"""`fusegen tune`: measure each kernel's config space on this GPU, once, and write the
choices to the tuned table beside the generated module (see fusegen.tables).

For each shape every config that fits the GPU runs once against the float64
reference (a config whose output disagrees is rejected, with the reason), then is
timed; the fastest few are timed again with more repetitions and the fastest of those
is kept, so that two tuning runs agree. Where the TMA kernel can run, both kernels are
measured and the table records the best of each (a call whose tensors rule out the TMA
kernel then still finds a choice).

torch and triton are imported only when the command runs.
"""

from __future__ import annotations

import datetime
import itertools
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fusegen import build, codegen, tables
from fusegen.tools import bench
from fusegen.ir import Kernel, QuantChain
from fusegen.writer import Planned, differences, write_all

FINALISTS = 3  # configs re-timed with more repetitions before one is chosen


class TuneError(Exception):
    """Something the user must fix before tuning (the message says what)."""


@dataclass
class Measured:
    path: str
    config: dict
    ms: float | None = None
    error: float | None = None
    problem: str = ""  # why it was rejected or skipped; "" when it ran and agreed


@dataclass
class ShapeResult:
    kernel: str
    shape: tuple
    dtype: str
    entry: dict | None
    measured: list[Measured] = field(default_factory=list)
    seconds: float = 0.0


def load_generated(kernel: Kernel, out_dir: Path):
    """Import the committed module from out_dir; it must be what the spec generates now
    (a table records the hash of the kernel source it measured)."""
    path = out_dir / f"{kernel.name}.py"
    expected = codegen.render(kernel)[0].text
    out = f" --out {out_dir}" if out_dir != Path("generated") else ""
    first = f"run `fusegen build {kernel.spec_display}{out}` first"
    if not path.exists():
        raise TuneError(f"{path}: missing; {first}")
    if path.read_bytes() != expected.encode("utf-8"):
        raise TuneError(f"{path}: differs from what {kernel.spec_display} generates; {first}")
    for runtime_path, _ in differences(build.runtime_files(out_dir)):
        raise TuneError(f"{runtime_path}: missing or not what this fusegen writes; {first}")
    return bench.import_file(path, f"fusegen_tune_{kernel.name}")


@contextmanager
def _env(**values):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def tune_shape(
    torch, timer, module, kernel, sizes, dtype_name, progress, device="cuda", final_timer=None
) -> ShapeResult:
    """Measure the space for one shape; the table entry of the best configs (None when
    no config agreed with the reference)."""
    started = time.perf_counter()
    sets, exact = bench.input_sets(torch, module, kernel, sizes, dtype_name, device)
    fn = getattr(module, kernel.name)
    with _env(FUSEGEN_AUTOTUNE="0"):
        fn(**sets[0])  # which kernels these tensors allow: the plan's path
        # (not the path that ran: untuned, the estimate may pick the pointer kernel)
        plan = module._CALLS[module._signature(*sets[0].values())]
    paths = ["tma", "pointer"] if plan.path == "tma" else ["pointer"]
    dtype = bench.torch_dtype(torch, dtype_name)
    element = torch.empty((), dtype=dtype).element_size()
    fit = {"BLOCK_M": sizes[kernel.row], "BLOCK_N": sizes[kernel.col]}
    if kernel.matmul:
        fit["BLOCK_K"] = sizes[kernel.matmul.k]
    shape = tuple(sizes.values())
    result = ShapeResult(kernel.name, shape, dtype_name, None)
    label = f"{kernel.name} {'x'.join(map(str, shape))} {dtype_name}"
    for path in paths:
        space = [module._KERNELS.complete(path, c) for c in module._KERNELS.paths[path][1]]
        with _env(FUSEGEN_TMA="1" if path == "tma" else "0"):
            for i, config in enumerate(space, 1):
                m = Measured(path, config)
                result.measured.append(m)
                if not module._KERNELS.fits(
                    config, path == "tma", fit, element, torch.device(device)
                ):
                    m.problem = "skipped: over shared memory, or blocks far larger than the shape"
                else:
                    _measure(torch, timer, fn, sets, exact, dtype_name, m, device)
                shown = f"{m.ms:.4f} ms" if m.ms is not None else m.problem
                progress(f"  {label}: {path} [{i}/{len(space)}] {_short(config)}: {shown}")
    kernels = module._KERNELS
    gpu = kernels.device_identity(sets[0][next(iter(sets[0]))].device)
    # The launcher's key for this shape: row bucket, the other dims, dtypes.
    # The key ends with the layout, which has no name: zip stops before it.
    names, values = kernels.key_names, kernels.last_run["key"]
    key = {n: module._rt.plain(v) for n, v in zip(names, values, strict=False)}
    timer = final_timer or timer
    result.entry = _entry(torch, module, fn, sets, result, timer, progress, label, gpu, key)
    return _timed(result, started)


def tune_quant_shape(
    torch, timer, module, kernel, sizes, dtype_name, progress, device="cuda", final_timer=None
) -> ShapeResult:
    """A quantized chain's space for one shape, as its launcher's own tuning would try
    it (the GEMV configs for a few rows whose weights it reads as words, split-K for
    decode-sized calls), each checked against the float64 reference, then timed; the
    table entry of the best (one path, "quant")."""
    started = time.perf_counter()
    sets, exact = bench.input_sets(torch, module, kernel, sizes, dtype_name, device)
    fn = getattr(module, kernel.name)
    chain = module._CHAIN
    fn(**sets[0], config=module.DEFAULT_CONFIG)  # the call's plan: rows, words, dtypes
    rows = sizes[kernel.chain.row]
    plan = next(p for p in reversed(chain.plans.values()) if p["rows"] == rows)
    shape = tuple(sizes.values())
    result = ShapeResult(kernel.name, shape, dtype_name, None)
    label = f"{kernel.name} {'x'.join(map(str, shape))} {dtype_name}"
    space = module.CONFIGS
    for i, config in enumerate(space, 1):
        m = Measured("quant", dict(config))
        result.measured.append(m)
        if not chain.may_run(config, plan):
            m.problem = "skipped: the launcher's tuning does not try it at these rows"
        else:
            _measure(torch, timer, fn, sets, exact, dtype_name, m, device)
        shown = f"{m.ms:.4f} ms" if m.ms is not None else m.problem
        progress(f"  {label}: [{i}/{len(space)}] {_short(config)}: {shown}")
    gpu = chain.device_identity(sets[0][next(iter(sets[0]))].device)
    timer, key = final_timer or timer, chain.table_key(plan)
    result.entry = _entry(torch, module, fn, sets, result, timer, progress, label, gpu, key)
    return _timed(result, started)


def _timed(result, started):
    """result with the seconds its shape took, in its entry too."""
    result.seconds = time.perf_counter() - started
    if result.entry:
        result.entry["tuned"]["seconds"] = round(result.seconds, 1)
    return result


def _measure(torch, timer, fn, sets, exact, dtype_name, m: Measured, device) -> None:
    try:
        out = fn(**sets[0], config=m.config)
        if device == "cuda":
            torch.cuda.synchronize()
        m.error = bench.relative_error(torch, out, exact)
        if not m.error <= bench.TOLERANCE[dtype_name]:
            m.problem = f"rejected: relative error {m.error:.3g} against the float64 reference"
            return
        m.ms = _time(timer, fn, sets, m.config)
    except Exception as exc:  # noqa: BLE001 - a config that fails is reported and skipped
        m.problem = f"rejected: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"


def _time(timer, fn, sets, config) -> float:
    """The timer's ms for one launch with `config`, each on the next buffer set."""
    cycle = itertools.cycle(sets)
    return timer(lambda: fn(**next(cycle), config=config))


def _entry(
    torch, module, fn, sets, result: ShapeResult, timer, progress, label, gpu, key
) -> dict | None:
    """The table entry of a shape's measurements: each path's finalists timed again, the
    fastest kept; gpu: (name, capability), key: the launcher's key for the shape."""
    import triton

    choices = {}
    for path in dict.fromkeys(m.path for m in result.measured):
        ran = sorted((m for m in result.measured if m.path == path and m.ms), key=lambda m: m.ms)
        if not ran:
            continue
        with _env(FUSEGEN_TMA="1" if path == "tma" else "0"):
            for m in ran[:FINALISTS]:
                m.ms = _time(timer, fn, sets, m.config)
        best = min(ran[:FINALISTS], key=lambda m: m.ms)
        choices[path] = {"config": best.config, "ms": round(best.ms, 5)}
        progress(f"  {label}: {path}: chose {_short(best.config)}: {best.ms:.4f} ms")
    if not choices:
        return None
    name, capability = gpu
    return {
        "gpu": name,
        "capability": capability,
        "kernel_hash": module.KERNEL_HASH,
        "key": key,
        "best": min(choices, key=lambda p: choices[p]["ms"]),
        "choices": choices,
        "tuned": {
            "shape": list(result.shape),
            "triton": triton.__version__,
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "configs_timed": sum(m.ms is not None for m in result.measured),
            "rejected": sorted({m.problem for m in result.measured if m.problem.startswith("rej")}),
        },
    }


def _short(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def run(
    kernels,
    shapes_for,
    dtype_names,
    out_dir: Path,
    timer,
    progress,
    final_timer=None,
    device="cuda",
    load=load_generated,
):
    """Tune every kernel at its shapes (`shapes_for(kernel)`) and dtypes; merge the
    entries into each kernel's table. Returns (results, paths written). The tests pass
    a fake timer, the CPU as device and a loader that fakes a GPU identity."""
    import torch

    results: list[ShapeResult] = []
    modules = {k.name: load(k, out_dir) for k in kernels}
    for module in modules.values():
        # Tuning measures; the module's own table must not steer it (an entry whose best
        # was the pointer kernel would hide the TMA one from every re-tune).
        launcher = getattr(module, "_KERNELS", None) or module._CHAIN
        launcher.table["entries"] = []
    written = []
    for kernel in kernels:
        module = modules[kernel.name]
        entries = []
        for _, sizes in bench.usable_sizes(kernel, shapes_for(kernel), progress):
            for dtype_name in dtype_names:
                if dtype_name not in kernel.dtypes:
                    progress(f"  skipped: {kernel.name} does not take {dtype_name}")
                    continue
                tuner = tune_quant_shape if isinstance(kernel, QuantChain) else tune_shape
                found = tuner(
                    torch, timer, module, kernel, sizes, dtype_name, progress, device, final_timer
                )
                results.append(found)
                if found.entry:
                    entries.append(found.entry)
                progress(f"  {kernel.name}: tuned in {found.seconds:.1f} s")
        if entries:
            path = tables.path_for(out_dir, kernel.name)
            old = tables.read(path)["entries"] if path.exists() else []
            text = tables.render(kernel.name, kernel.spec_display, tables.merge(old, entries))
            written += write_all([Planned(path, text)])
    return results, written
