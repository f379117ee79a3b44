"""The runtime's Hopper attention forward (fusegen/runtime/attention_hopper.py): compiled
for sm_90 on any machine (no GPU needed), checked against float64 on an H100/H200, and
which modules and calls take it."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fusegen.codegen.attention_text import alibi_slopes, hopper_mask
from fusegen.ir import Attention as AttentionIR
from fusegen.runtime import attention_hopper

ROOT = Path(__file__).resolve().parents[1]
needs_gluon = pytest.mark.skipif(not attention_hopper.AVAILABLE, reason="Triton without Gluon")
on_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a GPU of compute capability 9.0 (H100, H200)",
)


# Compiled in a process of its own: the tests' Triton runs the interpreter without a GPU,
# and an interpreted function cannot be compiled. Arguments: the runtime module and
# kernel, q's head dim and v's, dtype, the constexprs (JSON; Q_ROWS: q's tile rows, if
# not BLOCK_M); descriptors first (q, k, v, then out or d_out, two of each: the head
# dim's first and last part), pointers to the dtype but lse and delta (fp32), scalars i32
# but the scales (fp32).
SM90_COMPILE = """
import importlib, json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from fusegen.runtime import attention_hopper as ah

module = importlib.import_module("fusegen.runtime." + sys.argv[1])
kernel = getattr(module, sys.argv[2])
dim, dv, dtype, meta = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], json.loads(sys.argv[6])
q, v = (torch.empty(256, d, dtype=getattr(torch, dtype)) for d in (dim, dv))
q_rows = meta.pop("Q_ROWS", module.BLOCK_M)
options = {"num_warps": 4, **({"maxnreg": meta.pop("maxnreg")} if "maxnreg" in meta else {})}
descs, split = ah.tile_args(q, q, v, v, (256, 256), q_rows, meta.pop("KV_ROWS", module.BLOCK_N))
meta |= split
names = [p.name for p in kernel.params]
if "lse_desc" in names:  # the dk/dv kernel's lse and delta, 1-D in blocks of q's tile rows
    rows = torch.empty(256, dtype=torch.float32)
    descs += [module.row_descriptor(rows, q_rows)] * 2
types = {name: "i32" for name in names}
for name, desc in zip(names, descs):
    types[name] = triton.runtime.jit.mangle_type(desc)
pointer = "*bf16" if dtype == "bfloat16" else "*fp16"
types |= {n: pointer for n in names if n.endswith("_ptr")}
types |= {n: "*fp32" for n in ("lse_ptr", "delta_ptr") if n in names}
types |= {n: "fp32" for n in ("qk_scale", "scale") if n in names}
types |= {name: "constexpr" for name in meta}
constants = {(names.index(name),): value for name, value in meta.items()}
source = GluonASTSource(kernel, types, constants)
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
print(json.dumps({"shared": compiled.metadata.shared,
                  "wgmma": "wgmma.mma_async" in compiled.asm["ptx"]}))
"""


def compiled_for_sm90(module, kernel, dim, dtype, meta, dv=None):
    """(shared memory bytes, whether the PTX has wgmma) of a runtime Gluon kernel compiled
    for sm_90 as a call with these constexprs launches it (v's head dim dv, else dim)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    meta = json.dumps({**meta, "num_warps": 4})
    args = [module, kernel, str(dim), str(dv or dim), dtype, meta]
    result = subprocess.run(
        [sys.executable, "-c", SM90_COMPILE, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    return facts["shared"], facts["wgmma"]


@needs_gluon
@pytest.mark.parametrize(
    "dim, dv, causal, group, dtype, masks",
    [
        (128, 128, True, 4, "bfloat16", {}),
        (64, 64, False, 1, "float16", {}),
        (96, 96, True, 1, "bfloat16", {}),  # two tiles of the head dim: 64 + 32
        (192, 128, True, 1, "bfloat16", {}),  # MLA: q and k 128 + 64, v 128
        (128, 128, True, 1, "bfloat16", {"ALIBI": 8}),  # the slopes of 12 heads (8 below)
        (128, 128, True, 4, "bfloat16", {"WINDOW": 4096}),  # Mistral's
        # 64-key blocks in 120 and 112 registers: two programs an SM (an experiment's).
        (64, 64, True, 1, "bfloat16", {"KV_ROWS": 64, "REGISTERS": 120, "maxnreg": 112}),
        # A persistent grid: the query tiles double-buffered, out's tiles of their own.
        (64, 64, False, 1, "bfloat16", {"PERSISTENT": True}),
        (64, 64, True, 4, "float16", {"PERSISTENT": True, "LONGEST_FIRST": True}),
        (96, 96, True, 1, "bfloat16", {"PERSISTENT": True, "WINDOW": 256}),
        (128, 128, True, 4, "bfloat16", {"PERSISTENT": True, "ALIBI": 8}),
    ],
)
def test_the_kernel_compiles_for_sm90_within_shared_memory(dim, dv, causal, group, dtype, masks):
    meta = {
        "GROUP": group, "CAUSAL": causal, "ALIBI": 0, "WINDOW": 0, "PERSISTENT": False,
        "LONGEST_FIRST": False, "REGISTERS": 240,
    }  # fmt: skip
    shared, wgmma = compiled_for_sm90(
        "attention_hopper", "_attention_forward", dim, dtype, {**meta, **masks}, dv=dv
    )
    # Two query tiles of 64 rows (persistent: four, and two of out) and two stages of K
    # and V tiles of 128 keys (or the case's), + barriers.
    keys = masks.get("KV_ROWS", 128)
    tiles = 2 * 64 * dim * 2 + 2 * keys * (dim + dv) * 2
    if masks.get("PERSISTENT"):
        tiles += 2 * 64 * dim * 2 + 2 * 64 * dv * 2
    assert tiles <= shared < tiles + 1024
    assert shared <= 232_448 // (2 if "maxnreg" in masks else 1)  # an H100's / H200's
    assert wgmma


def bound_launches(monkeypatch):
    """{kernel name: its arguments by parameter name} of each launch.Described launch made
    after this call, bound on the CPU instead of launched (the Gluon kernels do not run
    there): a launch whose arguments do not match its kernel's parameters fails."""
    launched = {}

    def bind(self, sources, tensors, first):
        kernel, grid, descriptors, scalars, meta = first()
        names = [p.name for p in kernel.params]
        args = (*descriptors, *tensors, *scalars)
        assert len(args) + len(meta) - ("maxnreg" in meta) == len(names), kernel.__name__
        assert not set(meta) & set(names[: len(args)]), kernel.__name__
        launched[kernel.__name__] = dict(zip(names, args, strict=False)) | meta

    monkeypatch.setattr(attention_hopper.launch.Described, "__call__", bind)
    return launched


@needs_gluon
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("dim, dv, masks", [(128, 128, {}), (96, 96, {"alibi": True}),
                                            (192, 128, {"window": 256})])  # fmt: skip
def test_the_forward_launch_binds_every_kernel_parameter(monkeypatch, layout, dim, dv, masks):
    """The Gluon kernel does not run on the CPU: what forward() would launch it with is
    bound to the kernel's parameters here, so that a parameter added to the kernel and not
    to its launch (or the reverse) fails without a GPU."""
    launched = bound_launches(monkeypatch)
    q_shape, k_shape = shapes(layout, 2, 8, 2, 300, 300, dim)
    q, k = torch.randn(q_shape, dtype=torch.bfloat16), torch.randn(k_shape, dtype=torch.bfloat16)
    v = torch.randn(k_shape[:3] + (dv,), dtype=torch.bfloat16)
    out, lse = torch.empty(q_shape[:3] + (dv,), dtype=torch.bfloat16), torch.empty(2, 8, 300)
    attention_hopper.forward(q, k, v, out, lse, layout=layout, causal=True, scale=0.1, **masks)
    launched = launched["_attention_forward"]
    assert launched["out_ptr"] is out and launched["lse_ptr"] is lse
    assert launched["GROUP"] == 4 and launched["SPLIT_QK"] is (dim != 128)
    assert launched["ALIBI"] == (8 if masks.get("alibi") else 0)
    assert launched["WINDOW"] == masks.get("window", 0)


def test_a_head_dim_is_cut_into_tiles_of_powers_of_two():
    assert attention_hopper.parts(128) == (128,)
    assert attention_hopper.parts(96) == (64, 32)
    assert attention_hopper.parts(192) == (128, 64)
    for dim, dv in attention_hopper.HEAD_DIMS:
        # v's tiles are q's first ones: out is stored through q's tiles.
        q_parts, v_parts = attention_hopper.parts(dim), attention_hopper.parts(dv)
        assert q_parts[: len(v_parts)] == v_parts


def _attention(*, causal=True, window=None, softcap=None, alibi=False, bias=False, dv=0,
               head_dim=128):  # fmt: skip
    return AttentionIR(
        name="a", doc="", spec_display="s", spec_sha256="0" * 64, dtypes=("bf16",),
        layout="bshd", heads=8, kv_heads=2, head_dim=head_dim, scale=head_dim**-0.5,
        scale_given=False, softcap=softcap, causal=causal, window=window, alibi=alibi,
        bias=bias, v_head_dim=dv,
    )  # fmt: skip


def test_only_plain_attention_at_head_dims_it_takes_runs_the_hopper_forward():
    assert hopper_mask(_attention()) == "causal"
    assert hopper_mask(_attention(causal=False)) == "none"
    assert hopper_mask(_attention(head_dim=96)) == "causal"
    assert hopper_mask(_attention(head_dim=192, dv=128)) == "causal"
    assert hopper_mask(_attention(alibi=True)) == "causal"  # the runtime reads ALIBI_SLOPES
    assert hopper_mask(_attention(window=1024)) == "causal"  # and WINDOW
    assert hopper_mask(_attention(head_dim=64)) == "causal"  # the runtime's hopper_grid decides
    for other in (
        _attention(softcap=50.0),
        _attention(bias=True),
        _attention(dv=64),
        _attention(head_dim=256),
        _attention(head_dim=192, dv=192),
    ):
        assert hopper_mask(other) is None


def test_the_grid_and_the_backward_by_head_dim_and_mask():
    """What runtime/attention.py took from the persistent grid's measurements: persistent
    without a mask at 64 and 128, longest first causal at 64 (from 4096 queries) and with
    a window at 128 (at any length), the grid of every tile elsewhere; the Gluon backward
    at every head dim it takes, 64 included."""
    from fusegen.runtime import attention as runtime

    assert runtime.hopper_grid(64, "none") == (True, False)
    assert runtime.hopper_grid(128, "none") == (True, False)
    assert runtime.hopper_grid(64, "causal") == (True, True)
    assert runtime.hopper_grid(128, "causal") == (False, False)
    assert runtime.hopper_grid(96, "none") == (False, False)
    assert runtime.hopper_grid(192, "causal") == (False, False)
    assert runtime.hopper_grid(128, "causal", 1024) == (True, True)  # a window
    assert runtime.hopper_grid(64, "causal", 1024) == (False, False)
    assert {(64, 64), (96, 96), (128, 128), (192, 128)} <= set(runtime.HOPPER_BACKWARD_HEAD_DIMS)
    fits = runtime.Attention.persistent_fits
    unmasked, causal_64 = (SimpleNamespace(hopper_grid=runtime.hopper_grid(64, mask), window=None)
                           for mask in ("none", "causal"))  # fmt: skip
    assert fits(unmasked, 1024, 1024) and not fits(unmasked, 1024, 1500)  # cross-attention
    assert fits(causal_64, 4096, 4096) and not fits(causal_64, 4095, 4095)
    assert not fits(SimpleNamespace(hopper_grid=runtime.hopper_grid(128, "causal")), 8192, 8192)
    window = SimpleNamespace(hopper_grid=runtime.hopper_grid(128, "causal", 1024), window=1024)
    assert fits(window, 1024, 1024) and not fits(window, 1024, 2048)


def test_a_generated_module_names_its_mask_to_the_runtime():
    text = (ROOT / "generated" / "llama3_attention.py").read_text()
    assert 'hopper="causal",' in text
    text = (ROOT / "generated" / "gemma2_attention.py").read_text()
    assert "hopper=" not in text  # a softcap


def shapes(layout, batch, heads, kv_heads, sq, skv, dim):
    """q's and k's shapes in the layout."""
    if layout == "bshd":
        return (batch, sq, heads, dim), (batch, skv, kv_heads, dim)
    return (batch, heads, sq, dim), (batch, kv_heads, skv, dim)


def reference(q, k, v, causal, layout, alibi=False, window=0):
    """float64 attention of [batch, seq, heads, dim] or [batch, heads, seq, dim] inputs;
    alibi: plus slope * (key - query position - (k_len - q_len)), the codegen's slopes;
    window (causal, as many keys as queries): a query sees its `window` latest keys."""
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(group, 1), v.double()
    v = v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    sq, skv = scores.shape[-2:]
    if alibi:
        slopes = torch.tensor(alibi_slopes(q.shape[1]), dtype=torch.float64, device=q.device)
        keys, rows = (torch.arange(n, device=q.device) for n in (skv, sq))
        scores = scores + slopes[:, None, None] * (keys[None, :] - rows[:, None] - (skv - sq))
    if causal:
        keys, rows = torch.arange(skv, device=q.device), torch.arange(sq, device=q.device)
        seen = keys[None] <= rows[:, None]
        if window:
            seen &= keys[None] > rows[:, None] - window
        scores = scores.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    out = torch.softmax(scores, -1) @ v
    return (out.transpose(1, 2) if layout == "bshd" else out), lse


@on_hopper
@needs_gluon
@pytest.mark.parametrize(
    "layout, causal, batch, heads, kv_heads, sq, skv, dim, dv, dtype, alibi, window",
    [
        ("bhsd", True, 2, 4, 4, 512, 512, 128, 128, torch.bfloat16, False, 0),
        # GQA, a ragged last tile; MQA, more keys than queries.
        ("bshd", True, 2, 8, 2, 300, 300, 128, 128, torch.bfloat16, False, 0),
        ("bshd", False, 1, 4, 1, 200, 333, 64, 64, torch.float16, False, 0),
        ("bhsd", False, 3, 2, 2, 129, 130, 64, 64, torch.bfloat16, False, 0),
        ("bshd", True, 1, 2, 2, 1024, 1024, 64, 64, torch.float16, False, 0),
        # Head dims in two tiles: 96 = 64 + 32, MLA's q and k 192 = 128 + 64 with v 128.
        ("bshd", True, 2, 4, 2, 300, 300, 96, 96, torch.bfloat16, False, 0),
        ("bhsd", False, 1, 3, 3, 257, 400, 96, 96, torch.float16, False, 0),
        ("bshd", True, 1, 4, 4, 384, 384, 192, 128, torch.bfloat16, False, 0),
        ("bhsd", True, 2, 2, 1, 200, 200, 192, 128, torch.float16, False, 0),
        # ALiBi: 8 heads (a power of two), 12 (BLOOM's slopes past 8), 6 with a dim of 96.
        ("bhsd", True, 2, 8, 8, 512, 512, 128, 128, torch.bfloat16, True, 0),
        ("bshd", False, 1, 12, 4, 200, 333, 64, 64, torch.float16, True, 0),
        ("bshd", True, 1, 6, 3, 300, 300, 96, 96, torch.bfloat16, True, 0),
        # Windows: of whole key blocks, of a part of one with d 96, with ALiBi, of fewer
        # keys than a block (a consumer sees none of its program's first block).
        ("bhsd", True, 2, 8, 2, 1024, 1024, 128, 128, torch.bfloat16, False, 256),
        ("bhsd", True, 1, 4, 4, 384, 384, 128, 128, torch.float16, False, 100),
        ("bshd", True, 1, 4, 4, 700, 700, 96, 96, torch.float16, False, 300),
        ("bshd", True, 1, 8, 8, 640, 640, 128, 128, torch.bfloat16, True, 200),
        # Windows at head dims 64 and 192, whose scale times the masked score rounds up
        # (a masked score of -1e30 gave NaN rows there: attention_text.MASKED_SCORE).
        ("bshd", True, 3, 16, 4, 900, 900, 64, 64, torch.float16, False, 40),
        ("bhsd", True, 1, 4, 4, 640, 640, 192, 128, torch.bfloat16, False, 100),
    ],
)
def test_out_and_lse_match_float64(
    layout, causal, batch, heads, kv_heads, sq, skv, dim, dv, dtype, alibi, window
):
    torch.manual_seed(sq + skv + dim)
    q_shape, k_shape = shapes(layout, batch, heads, kv_heads, sq, skv, dim)
    q = torch.randn(q_shape, device="cuda", dtype=dtype)
    k = torch.randn(k_shape, device="cuda", dtype=dtype)
    v = torch.randn(k_shape[:3] + (dv,), device="cuda", dtype=dtype)
    out = torch.full(q_shape[:3] + (dv,), float("nan"), device="cuda", dtype=dtype)  # poisoned
    lse = torch.full((batch, heads, sq), float("nan"), device="cuda")
    attention_hopper.forward(
        q, k, v, out, lse, layout=layout, causal=causal, scale=dim**-0.5, alibi=alibi,
        window=window,
    )  # fmt: skip
    want, want_lse = reference(q, k, v, causal, layout, alibi, window)
    # bf16/fp16 probabilities and output, fp32 sums: a few units of the output's rounding.
    unit = 2**-8 if dtype == torch.bfloat16 else 2**-11
    assert (out.double() - want).abs().max().item() <= 4 * unit * want.abs().max().item()
    assert (lse.double() - want_lse).abs().max().item() < 1e-3


@on_hopper
@needs_gluon
@pytest.mark.parametrize("causal", [True, False])
def test_64_key_blocks_two_programs_an_sm_match_float64(causal):
    """The experiments' d 64 knobs (forward's block_n and registers) give the same out and
    lse as float64, in a ragged last tile too."""
    torch.manual_seed(11)
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, 4, 300), float("nan"), device="cuda")
    attention_hopper.forward(
        q, k, v, out, lse, layout="bhsd", causal=causal, scale=0.125, block_n=64,
        registers=(120, 112),
    )  # fmt: skip
    want, want_lse = reference(q, k, v, causal, "bhsd")
    assert (out.double() - want).abs().max().item() <= 4 * 2**-8 * want.abs().max().item()
    assert (lse.double() - want_lse).abs().max().item() < 1e-3


@on_hopper
@needs_gluon
@pytest.mark.parametrize(
    "layout, causal, batch, heads, kv_heads, sq, dim, dtype, alibi, window, longest_first",
    [
        # More tiles than SMs (each program takes several, the ring and the query slots
        # carried from one to the next), a ragged last tile in some.
        ("bhsd", False, 4, 16, 16, 1024, 64, torch.bfloat16, False, 0, False),
        ("bshd", False, 3, 12, 4, 1000, 64, torch.float16, False, 0, False),
        ("bhsd", True, 2, 32, 8, 777, 64, torch.bfloat16, False, 0, True),
        ("bshd", True, 2, 32, 8, 777, 64, torch.bfloat16, False, 0, False),
        ("bhsd", True, 3, 16, 16, 1024, 128, torch.bfloat16, True, 0, True),
        ("bshd", True, 3, 16, 4, 900, 96, torch.float16, False, 256, True),
        ("bhsd", True, 2, 32, 8, 1024, 128, torch.bfloat16, False, 300, True),  # the modules'
    ],
)
def test_a_persistent_grid_matches_float64(
    layout, causal, batch, heads, kv_heads, sq, dim, dtype, alibi, window, longest_first
):
    """forward's persistent grid (one program an SM over tiles in turn) in both tile
    orders gives the same out and lse as float64, at shapes of several tiles a program."""
    torch.manual_seed(sq + heads)
    q_shape, k_shape = shapes(layout, batch, heads, kv_heads, sq, sq, dim)
    assert (sq + 127) // 128 * batch * heads > 2 * torch.cuda.get_device_properties(
        0
    ).multi_processor_count
    q = torch.randn(q_shape, device="cuda", dtype=dtype)
    k, v = (torch.randn(k_shape, device="cuda", dtype=dtype) for _ in "kv")
    out = torch.full_like(q, float("nan"))
    lse = torch.full((batch, heads, sq), float("nan"), device="cuda")
    attention_hopper.forward(
        q, k, v, out, lse, layout=layout, causal=causal, scale=dim**-0.5, alibi=alibi,
        window=window, persistent=True, longest_first=longest_first,
    )  # fmt: skip
    want, want_lse = reference(q, k, v, causal, layout, alibi, window)
    unit = 2**-8 if dtype == torch.bfloat16 else 2**-11
    assert (out.double() - want).abs().max().item() <= 4 * unit * want.abs().max().item()
    assert (lse.double() - want_lse).abs().max().item() < 1e-3


def _load(path, name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trains_like_float64(module, function, q, k, v, hopper_backward, hopper_forward=True):
    """A module's eager call takes the Hopper forward where hopper_forward (its plan says
    so; else the `tl` one) and the Hopper backward where hopper_backward (its compiled
    kernels say so), and its out and gradients match float64."""
    module._ATTENTION.last_compiled.clear()
    out = function(q, k, v)
    plans = list(module._ATTENTION.plans.values())
    took = any(type(plan.forward).__name__ == "_HopperLaunch" for plan in plans)
    assert took == hopper_forward
    d_out = torch.randn_like(out)
    out.backward(d_out)
    taken = {"hopper_dkdv", "hopper_dq"} <= set(module._ATTENTION.last_compiled)
    assert taken == hopper_backward
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = module.reference(*leaves)
    want.backward(d_out.double())
    unit = 2**-8
    assert (out.double() - want).abs().max() <= 4 * unit * want.abs().max()
    for got, ref in zip((q.grad, k.grad, v.grad), leaves, strict=True):
        assert (got.double() - ref.grad).abs().max() <= 16 * unit * ref.grad.abs().max()


@on_hopper
@needs_gluon
def test_a_causal_module_call_runs_it_and_training_still_differentiates():
    module = _load(ROOT / "generated" / "llama3_attention.py", "llama3_attention_hopper_test")
    torch.manual_seed(0)
    # 2 x 4 query blocks x 32 heads: 256 programs, over a wave of an H100's / H200's
    # 132 multiprocessors (a smaller call runs the `tl` forward: hopper_fits).
    q = torch.randn(2, 512, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (
        torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(2)
    )
    _trains_like_float64(module, module.llama3_attention, q, k, v, hopper_backward=True)


@on_hopper
@needs_gluon
def test_later_calls_launch_directly_with_descriptors_at_their_own_addresses():
    """From a call signature's second call the Gluon kernels launch without triton's
    dispatch (launch.Described), their descriptors made at the call's addresses: three
    calls on fresh tensors (the earlier ones kept, so no address repeats) each train like
    float64, and the forward's and both backward kernels' direct launches are in place."""
    module = _load(ROOT / "generated" / "llama3_attention.py", "llama3_attention_direct_test")
    kept = []
    for seed in range(3):
        torch.manual_seed(seed)
        q = torch.randn(2, 512, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (
            torch.randn(2, 512, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2)
        )
        kept.append((q, k, v))
        _trains_like_float64(module, module.llama3_attention, q, k, v, hopper_backward=True)
    attention = module._ATTENTION
    (plan,) = attention.plans.values()
    assert plan.forward.launches.direct is not None
    (launches,) = [plan.hopper for plan in attention.backward_plans.values()]
    assert sorted(launches) == ["dkdv", "dq, delta"]  # the dq kernel writes delta from out
    assert all(described.direct is not None for described in launches.values())


@on_hopper
@needs_gluon
@pytest.mark.parametrize(
    "name, seq, dim, opaque_forward",
    [
        ("llama3_attention", 512, 128, True),
        # At head dim 64 a causal call under 4096 queries runs the `tl` forward (Inductor
        # launches it), then the Gluon backward through the opaque op.
        ("llama32_1b_attention", 1024, 64, False),
    ],
)
def test_a_compiled_call_runs_it_as_an_opaque_op_with_the_eager_bits(
    name, seq, dim, opaque_forward
):
    """Inductor cannot launch the Gluon kernels: a traced call that fits them goes through
    the module's opaque Hopper ops, whose eager bodies run them, so compiled and eager
    give the same bits, forward and backward."""
    from torch._inductor.utils import run_and_get_code

    module = _load(ROOT / "generated" / f"{name}.py", f"{name}_compiled_test")
    function = getattr(module, name)
    torch.manual_seed(3)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16, "requires_grad": True}
    q, k, v = (torch.randn(4, seq, h, dim, **bf16) for h in (32, 8, 8))
    d_out = torch.randn(4, seq, 32, dim, device="cuda", dtype=torch.bfloat16)

    def step(attention):
        out = attention(q, k, v)
        out.backward(d_out)
        grads = [t.grad for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        return out.detach(), grads

    eager, eager_grads = step(function)
    (out, grads), sources = run_and_get_code(step, torch.compile(function, fullgraph=True))
    source = "\n".join(sources)
    op = module._ATTENTION.op_name  # the ops' names carry the spec's hash
    assert (f"{op}_hopper.default(" in source) == opaque_forward
    assert f"{op}_hopper_backward.default(" in source
    assert torch.equal(out, eager)
    for got, want in zip(grads, eager_grads, strict=True):
        assert torch.equal(got, want)


HOPPER_MODULE_SPECS = """
version: 1
kernels:
  - name: phi3_attention
    attention: {layout: bshd, heads: 32, kv_heads: 8, head_dim: 96, causal: true}
  - name: mla_attention
    attention: {layout: bhsd, heads: 16, head_dim: 192, v_head_dim: 128, causal: true}
  - name: bloom_attention
    attention: {layout: bshd, heads: 12, head_dim: 128, causal: true, alibi: true}
  - name: mistral_attention
    attention: {layout: bshd, heads: 32, kv_heads: 8, head_dim: 128, causal: true, window: 256}
  - name: vit_attention
    attention: {layout: bshd, heads: 16, head_dim: 64}
  - name: bert_attention
    attention: {layout: bhsd, heads: 16, head_dim: 128}
  - name: llama32_attention
    attention: {layout: bshd, heads: 32, kv_heads: 8, head_dim: 64, causal: true}
"""


@on_hopper
@needs_gluon
@pytest.mark.parametrize(
    "name", ["phi3_attention", "mla_attention", "bloom_attention", "mistral_attention"]
)
def test_modules_of_head_dims_in_two_tiles_alibi_or_a_window_run_it(name, tmp_path):
    """The Hopper forward and backward, trained against float64."""
    from fusegen.cli import main

    (tmp_path / "specs.yaml").write_text(HOPPER_MODULE_SPECS)
    assert main(["build", str(tmp_path / "specs.yaml"), "--out", str(tmp_path / "gen")]) == 0
    module = _load(tmp_path / "gen" / f"{name}.py", f"{name}_hopper_test")
    torch.manual_seed(1)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16, "requires_grad": True}
    if name == "phi3_attention":  # 2 x 4 query blocks x 32 heads: 256 programs
        q, k, v = (torch.randn(2, 512, h, 96, **bf16) for h in (32, 8, 8))
    elif name == "mla_attention":  # 2 x 8 query blocks x 16 heads
        q, k = (torch.randn(2, 16, 1024, 192, **bf16) for _ in range(2))
        v = torch.randn(2, 16, 1024, 128, **bf16)
    elif name == "bloom_attention":  # 2 x 8 query blocks x 12 heads
        q, k, v = (torch.randn(2, 1024, 12, 128, **bf16) for _ in range(3))
    else:  # 2 x 4 query blocks x 32 heads, a window of 256 keys
        q, k, v = (torch.randn(2, 512, h, 128, **bf16) for h in (32, 8, 8))
    _trains_like_float64(module, getattr(module, name), q, k, v, hopper_backward=True)


@on_hopper
@needs_gluon
@pytest.mark.parametrize(
    "name, shapes, grid, hopper_backward",
    [
        ("vit_attention", [(2, 1024, 16, 64)] * 3, (True, False), True),
        ("bert_attention", [(2, 16, 1024, 128)] * 3, (True, False), True),
        ("llama32_attention", [(1, 4096, h, 64) for h in (32, 8, 8)], (True, True), True),
    ],
)
def test_modules_on_the_persistent_grid_train_like_float64(
    name, shapes, grid, hopper_backward, tmp_path
):
    """No mask at head dims 64 and 128 and causal at 64 from 4096 queries: the Gluon
    forward on its persistent grid (in the order hopper_grid gives), then the Gluon
    backward; at 64 a causal call with fewer queries and a cross-attention call run the
    `tl` forward, and the causal one trains through the Gluon backward from its lse."""
    from fusegen.cli import main

    (tmp_path / "specs.yaml").write_text(HOPPER_MODULE_SPECS)
    assert main(["build", str(tmp_path / "specs.yaml"), "--out", str(tmp_path / "gen")]) == 0
    module = _load(tmp_path / "gen" / f"{name}.py", f"{name}_persistent_test")
    torch.manual_seed(2)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16, "requires_grad": True}
    q, k, v = (torch.randn(*shape, **bf16) for shape in shapes)
    _trains_like_float64(module, getattr(module, name), q, k, v, hopper_backward)
    (plan,) = module._ATTENTION.plans.values()
    assert (plan.forward.persistent, plan.forward.longest_first) == grid
    if name == "llama32_attention":  # a causal call under 4096 queries, 4 x 1024
        module._ATTENTION.plans.clear()
        short = [torch.randn(4, 1024, h, 64, **bf16) for h in (32, 8, 8)]
        _trains_like_float64(module, getattr(module, name), *short, True, hopper_forward=False)
    if name == "vit_attention":  # cross-attention: fewer queries than keys (a wave of them)
        module._ATTENTION.plans.clear()
        getattr(module, name)(q[:, :768].detach().contiguous(), k.detach(), v.detach())
        (plan,) = module._ATTENTION.plans.values()
        assert type(plan.forward).__name__ != "_HopperLaunch"
