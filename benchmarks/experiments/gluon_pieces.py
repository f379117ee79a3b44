"""What the Gluon experiments share: host TMA descriptors, a program's split of K, the
split-K finish by atomics, and their sm_90 compile report (no GPU).

Used by fp8_block_gluon.py, int8_decode_gluon.py and int4_decode_gluon.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

GL_DTYPES = {
    torch.int8: gl.int8,
    torch.uint8: gl.uint8,
    torch.float8_e4m3fn: gl.float8e4nv,
    torch.bfloat16: gl.bfloat16,
    torch.float16: gl.float16,
}


def descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A TMA descriptor over t in tiles of `block`, shared memory in the default
    NVMMA layout for t's dtype."""
    layout = gl.NVMMASharedLayout.get_default_for(block, GL_DTYPES[t.dtype])
    return TensorDescriptor.from_tensor(t, block, layout)


@gluon.jit
def k_split(K, BK: gl.constexpr):
    """(first K step, steps) of this program's split of K: program_id(1) of
    num_programs(1) splits."""
    total = gl.cdiv(K, BK)
    per_split = gl.cdiv(total, gl.num_programs(1))
    first = gl.program_id(1) * per_split
    return first, gl.maximum(gl.minimum(per_split, total - first), 0)


@gluon.jit
def add_partials(partials_ptr, places, acc, keep):
    """This program's fp32 partial sums added into the zeroed buffer (atomics: the order
    of the adds varies, an experiment's shortcut)."""
    gl.atomic_add(partials_ptr + places, acc, mask=keep, sem="relaxed")


@gluon.jit
def arrive_last(arrivals_ptr, keep):
    """keep, where this program is the last of its tile's splits to arrive (its counter
    left zeroed for the next call), else nothing. Every thread's adds are issued first."""
    gl.thread_barrier()
    arrived = gl.atomic_add(arrivals_ptr + gl.program_id(0), 1, sem="acq_rel")
    last = arrived == gl.num_programs(1) - 1
    gl.store(arrivals_ptr + gl.program_id(0), 0, mask=last)
    return keep & last


@gluon.jit
def take_sums(partials_ptr, places, keep):
    """The splits' sums at places (through L2), the buffer left zeroed for the next call."""
    sums = gl.load(partials_ptr + places, mask=keep, other=0.0, cache_modifier=".cg")
    gl.store(partials_ptr + places, gl.zeros_like(sums), mask=keep)
    return sums


def compile_lines(kernel, descriptors: tuple, pointers: dict, variants: dict) -> list[str]:
    """Each variant of a Gluon kernel compiled for sm_90 (no GPU): "NAME: ptxas's
    registers and spills | shared memory | counts of `probes` in the PTX | the SASS's
    most frequent instructions". variants: name -> (constexprs, options, probes); the
    kernel's first parameters take `descriptors`, those in `pointers` their types, the
    rest i32."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quant_registers import compile_sm90, instruction_mix, ptxas_report

    names = [p.name for p in kernel.params]
    types = {name: "i32" for name in names}
    for name, desc in zip(names, descriptors, strict=False):
        types[name] = triton.runtime.jit.mangle_type(desc)
    types |= pointers
    lines = []
    for variant, (constexprs, options, probes) in variants.items():
        constants = {(names.index(n),): v for n, v in constexprs.items()}
        compiled = compile_sm90(
            kernel, types | {n: "constexpr" for n in constexprs}, constants, options
        )
        ptx = compiled.asm["ptx"]
        counted = " | ".join(f"{probe} {ptx.count(probe)}" for probe in probes)
        lines.append(
            f"{variant}: {ptxas_report(ptx)} | shared {compiled.metadata.shared} bytes | "
            f"{counted + ' | ' if counted else ''}{instruction_mix(compiled.asm['cubin'], 6)}"
        )
    return lines
