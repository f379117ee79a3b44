"""`fusegen tune` of attention kernels: each of the module's three kernels (the forward,
the backward's dk/dv and dq kernels) over its config space at each (batch, q_len, k_len)
and dtype, on this GPU; the fastest config whose result agrees with the float64
reference goes into the tuned table beside the module (fusegen.tables' format), which
the launcher reads by GPU, kernel, dtype and length buckets (`_config` in the module).

A config is forced through the module's FORCED; the check compares the first batch
entry's output (or gradients) with the module's reference in float64. The default
config is timed beside, and an entry records both: `best` is "default" where no config
beat it.

torch and triton are imported only when the command runs.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path

from fusegen import tables
from fusegen.tools import bench, bench_attention
from fusegen.ir import Attention
from fusegen.tools.tune import Measured, ShapeResult, load_generated
from fusegen.writer import Planned, write_all

# (BLOCK_M, BLOCK_N, num_warps, num_stages) tried per kernel; the forward of a call of up
# to DECODE_ROWS queries tries DECODE. The dk/dv kernel's 64 x 64 tiles on 4 warps spill
# at head dims 96 and up (448 bytes at 96, compiled for sm_90), yet run faster than the
# same tiles on 8 warps, which do not spill but hold one program an SM: head dim 96 on
# an H200, 2.76 ms against 4.66 (32 x 64: 2.54 against 5.90), so those are not tried
# (benchmarks/results/2026-12-04-h200-attention-d96-and-rescale/tune_d96.log). A config
# that does not fit (shared memory, a head dim too wide for it) is rejected with the
# reason, not timed.
SPACES = {
    "forward": [(64, 64, 4, 3), (64, 64, 4, 4), (128, 64, 8, 3), (128, 128, 8, 3),
                (128, 128, 8, 2), (64, 128, 4, 2), (64, 32, 4, 3)],
    "decode": [(16, 64, 4, 3), (16, 128, 4, 3), (16, 64, 4, 4), (16, 128, 8, 3),
               (64, 64, 4, 3)],
    "kv": [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (64, 128, 8, 2), (32, 64, 4, 2),
           (64, 32, 4, 2)],
    "q": [(64, 64, 4, 2), (128, 64, 8, 3), (128, 64, 8, 2), (64, 32, 4, 2), (128, 32, 4, 3)],
}  # fmt: skip
KERNELS = ("forward", "kv", "q")
SEED = 0


def about(kernel_name: str, spec_display: str) -> str:
    return (
        f"Configs `fusegen tune` chose for {kernel_name}'s kernels (forward, kv: dk and dv, "
        f"q: dq). The launcher in {kernel_name}.py uses an entry when its GPU name, "
        "capability and kernel_hash match, from the entry of the call's dtype and q_len "
        "and k_len buckets or one next to them; else its default config. Regenerate with "
        f"`fusegen tune {spec_display} --attention-shapes B,SQ,SKV ...` on the GPU."
    )


def run(
    kernels: list[Attention],
    shapes,
    dtype_names,
    out_dir: Path,
    timer,
    progress,
    device="cuda",
    load=load_generated,
    identity=None,
    spaces=SPACES,
):
    """Tune every attention kernel at `shapes` (batch, q_len, k_len) and its dtypes among
    dtype_names; merge the entries into each kernel's table. Returns (results, paths
    written). The tests pass a fake timer, the CPU as device, a GPU identity and small
    spaces."""
    import torch

    results: list[ShapeResult] = []
    written = []
    for att in kernels:
        module = load(att, out_dir)
        module._ATTENTION.table = {}  # its own table must not steer the defaults measured
        gpu = identity or (
            torch.cuda.get_device_name(device),
            list(torch.cuda.get_device_capability(device)),
        )
        entries = []
        for shape in shapes:
            for dtype_name in dtype_names:
                if dtype_name not in att.dtypes:
                    progress(f"  skipped: {att.name} does not take {dtype_name}")
                    continue
                for result in tune_shape(
                    torch, timer, module, att, shape, dtype_name, progress, device, spaces
                ):
                    results.append(result)
                    if result.entry:
                        entries.append({**result.entry, "gpu": gpu[0], "capability": gpu[1]})
        module.FORCED.clear()
        if entries:
            path = tables.path_for(out_dir, att.name)
            old = tables.read(path)["entries"] if path.exists() else []
            text = tables.render(
                att.name,
                att.spec_display,
                tables.merge(old, entries),
                about=about(att.name, att.spec_display),
            )
            written += write_all([Planned(path, text)])
    return results, written


def tune_shape(torch, timer, module, att, shape, dtype_name, progress, device, spaces):
    """One ShapeResult per kernel (forward, kv, q) at this shape and dtype; the forward
    only at a decode shape (up to DECODE_ROWS queries), which no training step has."""
    batch, sq, skv = shape
    dtype = bench.torch_dtype(torch, dtype_name)
    inputs = bench_attention.make_inputs(torch, att, batch, sq, skv, dtype, device, SEED)
    exact = [t[:1].double() for t in inputs]
    want = module.reference(*exact)
    out_shape = (*inputs[0].shape[:3], att.dv)  # v's head dim
    d_out = torch.randn(out_shape, generator=torch.Generator().manual_seed(SEED + 1))
    d_out = d_out.to(dtype).to(device)
    leaves = [t.detach().requires_grad_() for t in exact]
    want_grads = torch.autograd.grad(module.reference(*leaves), leaves, d_out[:1].double())
    module.FORCED.clear()
    with torch.no_grad():
        out, lse = module._ATTENTION.forward(inputs, True)
    grads = {  # backward kernel -> the inputs whose gradients it computes
        "kv": (1, 2),
        "q": (0, 3) if att.bias else (0,),
    }
    found = []
    for kernel in KERNELS if sq > module.DECODE_ROWS else ("forward",):
        start = time.perf_counter()
        if kernel == "forward":
            space = spaces["decode" if sq <= module.DECODE_ROWS else "forward"]

            def call():
                with torch.no_grad():
                    return module._ATTENTION.forward(inputs, False)[0]

            def errors(got):
                return [bench.relative_error(torch, got[:1], want)]

        else:
            space = spaces[kernel]
            asked = grads[kernel]
            needs = tuple(i in asked for i in range(len(inputs)))

            def call(needs=needs):
                return module._ATTENTION.backward(inputs, out, lse, d_out, needs)

            def errors(got, asked=asked):
                return [bench.relative_error(torch, got[i][:1], want_grads[i]) for i in asked]

        result = ShapeResult(
            kernel=f"{att.name} {kernel}", shape=shape, dtype=dtype_name, entry=None
        )
        tolerance = bench.TOLERANCE[dtype_name]
        timed = {}
        for config in [None, *space]:
            label = "default" if config is None else config
            module.FORCED.clear()
            if config is not None:
                module.FORCED[kernel] = config
            m = Measured(path="default" if config is None else "tuned", config=label)
            try:
                m.error = max(errors(call()))
                if config is not None:
                    label = m.config = ran_as(module, att, kernel, config, dtype)
                if not m.error <= tolerance:
                    m.problem = f"relative error {m.error:.3g} over {tolerance}"
                elif label in timed:
                    m.problem = f"ran as {label}, timed already"
                else:
                    m.ms = timer(call)
                    timed[label] = m.ms
            except Exception as exc:  # a config this GPU cannot run is a result
                m.problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            result.measured.append(m)
            progress(f"  {att.name} {kernel} {shape} {dtype_name} {label}: "
                     f"{m.problem or f'{m.ms:.4f} ms'}")  # fmt: skip
        module.FORCED.clear()
        result.seconds = time.perf_counter() - start
        tuned = {c: ms for c, ms in timed.items() if c != "default"}
        if tuned and "default" in timed:
            best = min(tuned, key=tuned.get)
            result.entry = {
                "kernel_hash": module.KERNEL_HASH,
                "key": {
                    "kernel": kernel,
                    "dtype": str(dtype).removeprefix("torch."),
                    "q_bucket": bucket(sq),
                    "k_bucket": bucket(skv),
                },
                "best": "tuned" if tuned[best] < timed["default"] else "default",
                "choices": {
                    "tuned": {"config": list(best), "ms": round(tuned[best], 5)},
                    "default": {
                        "config": list(module._ATTENTION.default_config(kernel, sq, dtype)),
                        "ms": round(timed["default"], 5),
                    },
                },
                "tuned": {
                    "shape": list(shape),
                    "torch": torch.__version__,
                    "date": datetime.date.today().isoformat(),
                },
            }
        found.append(result)
    return found


def bucket(n: int) -> int:
    """The power of two at or above n: a table entry's length bucket, as the launcher's."""
    return 1 << (max(1, n) - 1).bit_length()


def ran_as(module, att, kernel: str, config: tuple, dtype) -> tuple:
    """`config` as its last launch ran: with the pipeline stages the launcher cut it to
    where the asked ones overflow shared memory (its stages), so that a table records
    what was timed and configs that ran the same are timed once."""
    block_m, block_n, warps, stages = config
    ran = [
        cut
        for (kind, dtypes, m, n, _precision, asked), cut in module._ATTENTION.stages.items()
        if kind == kernel and dtypes[0] == dtype and (m, n, asked) == (block_m, block_n, stages)
    ]
    return (block_m, block_n, warps, min(ran)) if ran else tuple(config)
