"""The runtime's Hopper attention backward (fusegen/runtime/attention_hopper_backward.py):
compiled for sm_90 on any machine (no GPU needed), its dq, dk and dv checked against
float64 on an H100/H200, and taken by a generated module's backward."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fusegen.runtime import attention_hopper, attention_hopper_backward

ROOT = Path(__file__).resolve().parents[1]
needs_gluon = pytest.mark.skipif(not attention_hopper.AVAILABLE, reason="Triton without Gluon")
on_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a GPU of compute capability 9.0 (H100, H200)",
)

# Compiled in a process of its own: the tests' Triton runs the interpreter without a GPU,
# and an interpreted function cannot be compiled.
SM90_COMPILE = """
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from fusegen.runtime import attention_hopper as ah, attention_hopper_backward as hb

kernel = getattr(hb, sys.argv[1])
dim, causal, group = int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
flat = torch.empty(256, dim, dtype=torch.float16)
q_desc = ah._descriptor(flat, 256, hb.BLOCK_M, ah.gl.float16)
kv_desc = ah._descriptor(flat, 256, hb.BLOCK_N, ah.gl.float16)
names = [p.name for p in kernel.params]
meta = {"GROUP": group, "CAUSAL": causal, "STAGES": 2, "num_warps": 4}
if "LONGEST_FIRST" in names:
    meta |= {"LONGEST_FIRST": True, "PAIRED_DOTS": True}
types = {name: "i32" for name in names}
for name, desc in zip(names[:4], (q_desc, kv_desc, kv_desc, q_desc)):
    types[name] = triton.runtime.jit.mangle_type(desc)
types |= {n: "*fp16" for n in ("dq_ptr", "dk_ptr", "dv_ptr") if n in names}
types |= {"lse_ptr": "*fp32", "delta_ptr": "*fp32", "qk_scale": "fp32", "scale": "fp32"}
types |= {name: "constexpr" for name in meta}
constants = {(names.index(name),): value for name, value in meta.items()}
source = GluonASTSource(kernel, types, constants)
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print(json.dumps({"shared": compiled.metadata.shared,
                  "wgmma": "wgmma.mma_async" in compiled.asm["ptx"]}))
"""


@needs_gluon
@pytest.mark.parametrize(
    "kernel, dim, causal, group",
    [("_attention_dkdv", 128, True, 4), ("_attention_dq", 128, False, 1)],
)
def test_the_kernels_compile_for_sm90_within_shared_memory(kernel, dim, causal, group):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", SM90_COMPILE, kernel, str(dim), str(int(causal)), str(group)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    # Two streamed stages of two 64-row tiles (q and d_out, or K and V) and the two
    # consumers' own pair of tiles, + barriers.
    tiles = 2 * 2 * 64 * dim * 2 + 2 * 2 * 64 * dim * 2
    assert tiles <= facts["shared"] < tiles + 1024
    assert facts["wgmma"]


def _reference_grads(q, k, v, d_out, causal, layout):
    """float64 (dq, dk, dv) of attention over [batch, seq, heads, dim] or [batch, heads,
    seq, dim] inputs (k, v with kv heads)."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    q64, k64, v64 = (t.transpose(1, 2) if layout == "bshd" else t for t in leaves)
    group = q64.shape[1] // k64.shape[1]
    k64, v64 = (t.repeat_interleave(group, 1) for t in (k64, v64))
    scores = q64 @ k64.transpose(-1, -2) / math.sqrt(q64.shape[-1])
    if causal:
        sq, skv = scores.shape[-2:]
        seen = torch.ones(sq, skv, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    out = torch.softmax(scores, -1) @ v64
    out = out.transpose(1, 2) if layout == "bshd" else out
    out.backward(d_out.double())
    return out.detach(), lse.detach(), [t.grad for t in leaves]


def _poison_cached_blocks(*shapes, dtype):
    """Blocks of the caching allocator filled with NaN and freed, so that the kernel's own
    torch.empty outputs reuse them: an element the kernel leaves unwritten fails."""
    blocks = [torch.full(shape, float("nan"), device="cuda", dtype=dtype) for shape in shapes]
    del blocks


@on_hopper
@needs_gluon
@pytest.mark.parametrize(
    "layout, causal, batch, heads, kv_heads, sq, skv, dim, dtype",
    [
        ("bhsd", True, 2, 4, 4, 512, 512, 128, torch.bfloat16),
        ("bshd", True, 2, 8, 2, 300, 300, 128, torch.bfloat16),  # GQA, a ragged last block
        ("bshd", False, 1, 4, 1, 200, 333, 128, torch.float16),  # MQA, more keys than queries
        ("bhsd", False, 3, 2, 2, 129, 130, 64, torch.bfloat16),
        ("bshd", True, 1, 2, 2, 1000, 1000, 64, torch.float16),
    ],
)
def test_dq_dk_dv_match_float64(layout, causal, batch, heads, kv_heads, sq, skv, dim, dtype):
    torch.manual_seed(sq * 7 + skv)
    if layout == "bshd":
        shapes = ((batch, sq, heads, dim), (batch, skv, kv_heads, dim))
    else:
        shapes = ((batch, heads, sq, dim), (batch, kv_heads, skv, dim))
    q, d_out = (torch.randn(shapes[0], device="cuda", dtype=dtype) for _ in range(2))
    k, v = (torch.randn(shapes[1], device="cuda", dtype=dtype) for _ in range(2))
    out, lse, wants = _reference_grads(q, k, v, d_out, causal, layout)
    delta = (out * d_out.double()).sum(-1)
    delta = (delta.transpose(1, 2) if layout == "bshd" else delta).float().contiguous()
    _poison_cached_blocks(shapes[0], shapes[1], shapes[1], dtype=dtype)
    grads, compiled = attention_hopper_backward.backward(
        q, k, v, d_out, lse.float(), delta, (True, True, True),
        layout=layout, causal=causal, scale=dim**-0.5,
    )  # fmt: skip
    assert set(compiled) == {"hopper_dkdv", "hopper_dq"}
    # bf16/fp16 probabilities and dS into the dots, fp32 accumulators: a few units of the
    # operands' rounding of the largest gradient.
    unit = 2**-8 if dtype == torch.bfloat16 else 2**-11
    for name, got, want in zip(("dq", "dk", "dv"), grads, wants, strict=True):
        error = (got.double() - want).abs().max().item()
        assert error <= 8 * unit * want.abs().max().item(), (name, error)


@on_hopper
@needs_gluon
def test_needs_picks_the_kernels():
    q, d_out = (torch.randn(1, 4, 256, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 4, 256, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lse = torch.zeros(1, 4, 256, device="cuda") + 8.0
    delta = torch.zeros(1, 4, 256, device="cuda")
    call = dict(layout="bhsd", causal=True, scale=128**-0.5)
    (d_q, d_k, d_v), compiled = attention_hopper_backward.backward(
        q, k, v, d_out, lse, delta, (True, False, False), **call
    )
    assert d_k is None and d_v is None and set(compiled) == {"hopper_dq"}
    (d_q, d_k, d_v), compiled = attention_hopper_backward.backward(
        q, k, v, d_out, lse, delta, (False, False, True), **call
    )
    assert d_q is None and d_k is None and d_v is not None and set(compiled) == {"hopper_dkdv"}
