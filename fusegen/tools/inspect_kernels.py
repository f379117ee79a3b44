"""`fusegen inspect`: what the compiled kernels a launcher chooses cost the GPU.

For each kernel and shape, one call through the committed module (tuned table first,
else tuning), then from the compiled kernel's metadata: registers per thread, spilled
registers, shared memory, warps and stages. With counters, Nsight Compute (`ncu`)
profiles one launch in a child process for L1/L2 hit rates and DRAM bandwidth.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fusegen.ir import QuantChain
from fusegen.tools import bench
from fusegen.tools.tune import load_generated

# Nsight Compute metrics: L1 and L2 hit rates, DRAM bytes per second.
COUNTERS = {
    "l1tex__t_sector_hit_rate.pct": "L1 hit %",
    "lts__t_sector_hit_rate.pct": "L2 hit %",
    "dram__bytes.sum.per_second": "DRAM bytes/s",
}
CHILD = "FUSEGEN_INSPECT_CHILD"


@dataclass
class Inspected:
    kernel: str
    shape: tuple
    dtype: str
    path: str
    source: str
    config: dict
    registers: int | None
    spills: int | None
    shared: int | None
    warps: int | None
    stages: int | None
    counters: dict | None = None

    def row(self) -> str:
        return (
            f"| {self.kernel} | {'x'.join(map(str, self.shape))} | {self.dtype} | {self.path} "
            f"({self.source}) | {self.registers} | {self.spills} | {self.shared} | {self.warps} "
            f"| {self.stages} | {' '.join(f'{k}={v}' for k, v in self.config.items())} |"
        )


HEADER = (
    "| kernel | shape | dtype | path (config from) | registers/thread | spills | shared bytes "
    "| warps | stages | config |\n|---|---|---|---|---|---|---|---|---|---|"
)


def inspect_shape(torch, module, kernel, sizes, dtype_name, device="cuda") -> Inspected:
    sets, _ = bench.input_sets(torch, module, kernel, sizes, dtype_name, device)
    getattr(module, kernel.name)(**sets[0])
    if device == "cuda":
        torch.cuda.synchronize()
    launch = module.last_launch()
    if isinstance(kernel, QuantChain):  # its launch names the dot's dtype, or the Gluon path
        compiled = module._CHAIN.last_compiled
        path, source = launch.get("path") or f"{launch['dot']} dot", launch["config_from"]
    else:
        compiled = module._KERNELS.last_run["kernel"]
        path, source = launch["path"], launch["source"]
    meta = getattr(compiled, "metadata", None)
    return Inspected(
        kernel.name,
        tuple(sizes.values()),
        dtype_name,
        path,
        source,
        launch["config"],
        getattr(compiled, "n_regs", None),
        getattr(compiled, "n_spills", None),
        getattr(meta, "shared", None),
        getattr(meta, "num_warps", None),
        getattr(meta, "num_stages", None),
    )


def counters(kernel_name: str, argv: list[str]) -> dict | str:
    """One launch of `kernel_name` profiled by ncu in a child `fusegen inspect`; the
    counters by label, or why there are none."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return "Nsight Compute (ncu) is not on PATH"
    command = [
        ncu,
        "--target-processes",
        "all",
        "--kernel-name",
        f"regex:_{kernel_name}_kernel",
        "--launch-skip",
        "0",
        "--launch-count",
        "1",
        "--metrics",
        ",".join(COUNTERS),
        sys.executable,
        "-m",
        "fusegen",
        *argv,
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, CHILD: "1"}, check=False
    )
    found = {}
    for metric, label in COUNTERS.items():
        match = re.search(rf"{re.escape(metric)}\s+(\S+)\s+([\d.,]+)", done.stdout)
        if match:
            found[label] = f"{match.group(2)} {match.group(1)}"
    if not found:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return "ncu gave no counters: " + " / ".join(tail)
    return found


def run(
    kernels, shapes_for, dtype_name, out_dir: Path, progress, device="cuda", load=load_generated
) -> list[Inspected]:
    import torch

    out = []
    for kernel in kernels:
        module = load(kernel, out_dir)
        for shape, sizes in bench.usable_sizes(kernel, shapes_for(kernel), progress):
            progress(f"  {kernel.name} {'x'.join(map(str, shape))} {dtype_name} ...")
            out.append(inspect_shape(torch, module, kernel, sizes, dtype_name, device))
    return out


def inspect_attention(torch, module, att, shape, dtype_name, device="cuda") -> list[Inspected]:
    """One forward and one backward of an attention kernel at (batch, q_len, k_len): a
    row per Triton kernel the module's launcher ran (forward, dk/dv, dq),
    from its compiled metadata (None under the interpreter, which compiles nothing)."""
    from fusegen.tools import bench_attention

    batch, sq, skv = shape
    dtype = bench.torch_dtype(torch, dtype_name)
    inputs = bench_attention.make_inputs(torch, att, batch, sq, skv, dtype, device, seed=0)
    attention = module._ATTENTION
    attention.last_compiled.clear()
    attention.plans.clear()  # a call of a known signature launches directly, unrecorded
    leaves = [t.requires_grad_() for t in inputs]
    out = getattr(module, att.name)(*leaves)
    torch.autograd.grad(out, leaves, torch.randn_like(out))
    if device == "cuda":
        torch.cuda.synchronize()
    rows = []
    for name, compiled in attention.last_compiled.items():
        meta = getattr(compiled, "metadata", None)
        part = name.removeprefix(f"_{att.name}_")
        kernel = part.removeprefix("backward_")  # the launcher's names: forward, kv, q
        source, config = attention_config(torch, module, kernel, sq, skv, dtype, device)
        rows.append(
            Inspected(
                f"{att.name} {part}",
                shape,
                dtype_name,
                "attention",
                source,
                config,
                getattr(compiled, "n_regs", None),
                getattr(compiled, "n_spills", None),
                getattr(meta, "shared", None),
                getattr(meta, "num_warps", None),
                getattr(meta, "num_stages", None),
            )
        )
    return rows


def attention_config(torch, module, kernel, sq, skv, dtype, device) -> tuple[str, dict]:
    """(where the launcher's config came from, the config) for one kernel of a call, as
    the launcher's `config` picks it: forced, table, default or interpreter; "hopper" for
    the runtime's Gluon kernels on an H100/H200. A decode
    call's forward is asked at its own q_len; the stages are those asked (the compiled
    kernel's own column shows fewer where shared memory did not fit them)."""
    dev = torch.device(device)
    attention = module._ATTENTION
    if kernel.startswith("hopper_"):  # the runtime's Gluon kernels: one config each
        from fusegen.runtime import attention_hopper, attention_hopper_backward

        configs = {"hopper_forward": attention_hopper.CONFIG, **attention_hopper_backward.CONFIGS}
        return "hopper", dict(configs[kernel])
    chosen = attention.config(dev, kernel, sq, skv, dtype)
    if kernel in module.FORCED:
        source = "forced"
    elif dev.type != "cuda":
        source = "interpreter"
    else:
        key = str(dtype).removeprefix("torch.")
        tuned = attention.tuned_config(attention.identity(dev), kernel, key, sq, skv)
        source = "table" if tuned is not None else "default"
    names = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
    return source, dict(zip(names, chosen, strict=True))


def run_attention(
    kernels, shapes, dtype_name, out_dir: Path, progress, device="cuda", load=load_generated
):
    """inspect_attention for every attention kernel (the committed module) and shape."""
    import torch

    from fusegen.tools import bench_attention

    out = []
    for att in kernels:
        module = load(att, out_dir)
        dtype = bench_attention.call_dtype(att, dtype_name, progress)
        for shape in shapes:
            progress(f"  {att.name} {'x'.join(map(str, shape))} {dtype} ...")
            out.extend(inspect_attention(torch, module, att, shape, dtype, device))
    return out
