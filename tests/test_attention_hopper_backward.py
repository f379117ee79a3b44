"""The runtime's Hopper attention backward (fusegen/runtime/attention_hopper_backward.py):
compiled for sm_90 on any machine (no GPU needed), its dq, dk and dv checked against
float64 on an H100/H200, and taken by a generated module's backward."""

import pytest
import torch

from fusegen.runtime import attention_hopper_backward
from test_attention_hopper import (
    bound_launches,
    compiled_for_sm90,
    needs_gluon,
    on_hopper,
    reference,
    shapes,
)


@needs_gluon
@pytest.mark.parametrize(
    "kernel, dim, dv, causal, group, masks",
    [
        ("_attention_dkdv", 128, 128, True, 4, {}),
        ("_attention_dq", 128, 128, False, 1, {}),
        ("_attention_dkdv", 96, 96, True, 1, {}),  # two tiles of the head dim: 64 + 32
        ("_attention_dq", 96, 96, True, 2, {}),
        ("_attention_dkdv", 192, 128, True, 1, {}),  # MLA: 32-row query blocks
        ("_attention_dq", 192, 128, False, 1, {}),
        # ALiBi (the slopes of 12 heads: 8 below), Mistral's window, both.
        ("_attention_dkdv", 128, 128, True, 1, {"ALIBI": 8}),
        ("_attention_dq", 128, 128, False, 1, {"ALIBI": 8}),
        ("_attention_dkdv", 128, 128, True, 4, {"WINDOW": 4096}),
        ("_attention_dq", 128, 128, True, 4, {"WINDOW": 4096}),
        ("_attention_dkdv", 96, 96, True, 1, {"ALIBI": 4, "WINDOW": 300}),
        ("_attention_dq", 96, 96, True, 1, {"ALIBI": 4, "WINDOW": 300}),
        # delta from the dq kernel's own d_out tiles, one tile of v's head dim or two.
        ("_attention_dq", 128, 128, True, 4, {"DELTA": True}),
        ("_attention_dq", 96, 96, False, 1, {"DELTA": True}),
        ("_attention_dq", 192, 128, True, 1, {"DELTA": True, "ALIBI": 8}),
        # lse and delta loaded by the consumers (q_len not a multiple of 4).
        ("_attention_dkdv", 128, 128, True, 4, {"ROW_TMA": False}),
        # Head dim 64 (LLaMA-3.2-1B's GQA 32/8), with a window.
        ("_attention_dkdv", 64, 64, True, 4, {"WINDOW": 1024}),
        ("_attention_dq", 64, 64, True, 4, {"DELTA": True}),
    ],
)
def test_the_kernels_compile_for_sm90_within_shared_memory(kernel, dim, dv, causal, group, masks):
    meta = {"GROUP": group, "CAUSAL": causal, "STAGES": 2, "ALIBI": 0, "WINDOW": 0}
    meta["HEAD_MAJOR"] = attention_hopper_backward.HEAD_MAJOR if causal else 4
    rows = 64
    if kernel == "_attention_dkdv":
        rows = attention_hopper_backward.dkdv_rows(dim)
        meta |= {"PAIRED_DOTS": True, "Q_ROWS": rows}
        meta["ROW_TMA"] = attention_hopper_backward.ROW_TMA
    else:
        meta["DELTA"] = False
    meta |= masks
    shared, wgmma = compiled_for_sm90(
        "attention_hopper_backward", kernel, dim, "float16", meta, dv=dv
    )
    # Two streamed stages of a tile of q and one of d_out (or of K and V), and the two
    # consumers' own pair of tiles, + barriers; ROW_TMA: two stages of the rows' lse and
    # delta.
    tiles = 2 * rows * (dim + dv) * 2 + 2 * 64 * (dim + dv) * 2
    tiles += 2 * 2 * rows * 4 if meta.get("ROW_TMA") else 0
    assert tiles <= shared < tiles + 1024
    assert wgmma


def _reference_grads(q, k, v, d_out, causal, layout, alibi=False, window=0):
    """float64 out, lse and (dq, dk, dv) of attention over [batch, seq, heads, dim] or
    [batch, heads, seq, dim] inputs (k, v with kv heads), with ALiBi or a window."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, lse = reference(*leaves, causal, layout, alibi, window)
    out.backward(d_out.double())
    return out.detach(), lse.detach(), [t.grad for t in leaves]


def _inputs(layout, batch, heads, kv_heads, sq, skv, dim, dv, dtype):
    """Random q, k, v and d_out on the GPU in the layout (v and d_out of head dim dv)."""
    q_shape, k_shape = shapes(layout, batch, heads, kv_heads, sq, skv, dim)
    v_shape, out_shape = k_shape[:3] + (dv,), q_shape[:3] + (dv,)
    return tuple(
        torch.randn(shape, device="cuda", dtype=dtype)
        for shape in (q_shape, k_shape, v_shape, out_shape)
    )


def _poison_cached_blocks(*shapes, dtype):
    """Blocks of the caching allocator filled with NaN and freed, so that the kernel's own
    torch.empty outputs reuse them: an element the kernel leaves unwritten fails."""
    blocks = [torch.full(shape, float("nan"), device="cuda", dtype=dtype) for shape in shapes]
    del blocks


@on_hopper
@needs_gluon
@pytest.mark.parametrize("knobs", [{}, {"row_tma": False}, {"paired_dots": 2}])
@pytest.mark.parametrize(
    "layout, causal, batch, heads, kv_heads, sq, skv, dim, dv, dtype, masks",
    [
        ("bhsd", True, 2, 4, 4, 512, 512, 128, 128, torch.bfloat16, {}),
        # GQA, a ragged last block; MQA, more keys than queries.
        ("bshd", True, 2, 8, 2, 300, 300, 128, 128, torch.bfloat16, {}),
        ("bshd", False, 1, 4, 1, 200, 333, 128, 128, torch.float16, {}),
        ("bhsd", False, 3, 2, 2, 129, 130, 64, 64, torch.bfloat16, {}),
        ("bshd", True, 1, 2, 2, 1000, 1000, 64, 64, torch.float16, {}),
        # Head dims in two tiles: 96 = 64 + 32, MLA's q and k 192 = 128 + 64 with v 128.
        ("bshd", True, 2, 8, 2, 300, 300, 96, 96, torch.bfloat16, {}),
        ("bhsd", False, 1, 3, 3, 257, 400, 96, 96, torch.float16, {}),
        ("bshd", True, 1, 4, 4, 384, 384, 192, 128, torch.bfloat16, {}),
        ("bhsd", False, 2, 2, 1, 200, 333, 192, 128, torch.float16, {}),
        # ALiBi: 8 heads, 12 (BLOOM's slopes past 8) with more keys than queries, 6 at d 96.
        ("bhsd", True, 2, 8, 8, 512, 512, 128, 128, torch.bfloat16, {"alibi": True}),
        ("bshd", False, 1, 12, 4, 200, 333, 64, 64, torch.float16, {"alibi": True}),
        ("bshd", True, 1, 6, 3, 300, 300, 96, 96, torch.bfloat16, {"alibi": True}),
        # Windows: of whole blocks (GQA), of a part of one at d 96, with ALiBi, of fewer
        # keys than a block, at d 64 (GQA; its forward is the `tl` one there).
        ("bhsd", True, 2, 8, 2, 1024, 1024, 128, 128, torch.bfloat16, {"window": 256}),
        ("bshd", True, 1, 4, 4, 700, 700, 96, 96, torch.float16, {"window": 300}),
        ("bshd", True, 1, 8, 8, 640, 640, 128, 128, torch.bfloat16, {"alibi": True, "window": 200}),
        ("bhsd", True, 1, 4, 4, 384, 384, 128, 128, torch.float16, {"window": 100}),
        ("bshd", True, 2, 8, 2, 600, 600, 64, 64, torch.bfloat16, {"window": 160}),
    ],
)
def test_dq_dk_dv_match_float64(
    knobs, layout, causal, batch, heads, kv_heads, sq, skv, dim, dv, dtype, masks
):
    """The runtime's kernels and two knobs. By default the dk/dv kernel's producer streams
    each block's lse and delta where q_len % 4 == 0 (rows past the queries, the next head's
    in the flat view, see no key), the consumers load them otherwise (a 1-D TMA box that
    starts off 16 bytes, as a head's rows at 257 queries do, is an illegal instruction);
    row_tma=False: always loaded. paired_dots=2: the masked blocks pair their dots too."""
    torch.manual_seed(sq * 7 + skv + dim)
    q, k, v, d_out = _inputs(layout, batch, heads, kv_heads, sq, skv, dim, dv, dtype)
    out, lse, wants = _reference_grads(q, k, v, d_out, causal, layout, **masks)
    delta = (out * d_out.double()).sum(-1)
    delta = (delta.transpose(1, 2) if layout == "bshd" else delta).float().contiguous()
    _poison_cached_blocks(q.shape, k.shape, v.shape, dtype=dtype)
    grads, compiled = attention_hopper_backward.backward(
        q, k, v, d_out, lse.float(), delta, (True, True, True),
        layout=layout, causal=causal, scale=dim**-0.5, **knobs, **masks,
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
@pytest.mark.parametrize(
    "layout, causal, batch, heads, kv_heads, seq, dim, dv, dtype",
    [
        ("bhsd", True, 2, 4, 4, 512, 128, 128, torch.bfloat16),
        ("bshd", True, 2, 8, 2, 300, 128, 128, torch.float16),  # GQA, a ragged last block
        ("bshd", False, 1, 4, 4, 257, 96, 96, torch.bfloat16),  # v's head dim in two tiles
        ("bhsd", True, 1, 4, 4, 384, 192, 128, torch.float16),  # MLA
    ],
)
def test_the_dq_kernel_writes_the_delta_the_dkdv_kernel_reads(
    layout, causal, batch, heads, kv_heads, seq, dim, dv, dtype
):
    """Given out, the dq kernel computes delta = rowsum(d_out * out) from its d_out tiles,
    stores it (every row: the buffer starts as NaN), and the dk/dv kernel after it reads it:
    delta to fp32's rounding, every gradient as with a given delta."""
    torch.manual_seed(seq + dim)
    q, k, v, d_out = _inputs(layout, batch, heads, kv_heads, seq, seq, dim, dv, dtype)
    out, lse, wants = _reference_grads(q, k, v, d_out, causal, layout)
    out = out.to(dtype)
    delta = (out.double() * d_out.double()).sum(-1)
    delta = delta.transpose(1, 2) if layout == "bshd" else delta
    written = torch.full(delta.shape, float("nan"), device="cuda")
    _poison_cached_blocks(q.shape, k.shape, v.shape, dtype=dtype)
    grads, compiled = attention_hopper_backward.backward(
        q, k, v, d_out, lse.float(), written, (True, True, True),
        layout=layout, causal=causal, scale=dim**-0.5, out=out,
    )  # fmt: skip
    assert set(compiled) == {"hopper_dkdv", "hopper_dq"}
    error = (written.double() - delta).abs().max().item()
    assert error <= 1e-5 * delta.abs().max().item(), error
    unit = 2**-8 if dtype == torch.bfloat16 else 2**-11
    for name, got, want in zip(("dq", "dk", "dv"), grads, wants, strict=True):
        error = (got.double() - want).abs().max().item()
        assert error <= 8 * unit * want.abs().max().item(), (name, error)


@needs_gluon
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("delta_in_dq", [False, True])
def test_each_launch_binds_every_kernel_parameter(monkeypatch, layout, delta_in_dq):
    """The Gluon kernels do not run on the CPU: what backward() would launch each with
    (descriptors, tensors, scalars, constexprs) is bound to the kernel's parameters here,
    so that a parameter added to a kernel and not to its launch fails without a GPU."""
    launched = bound_launches(monkeypatch)
    q_shape, k_shape = shapes(layout, 2, 8, 2, 300, 300, 128)
    q, d_out, out = (torch.randn(q_shape, dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(k_shape, dtype=torch.bfloat16) for _ in range(2))
    lse, delta = torch.zeros(2, 8, 300), torch.zeros(2, 8, 300)
    attention_hopper_backward.backward(
        q, k, v, d_out, lse, delta, (True, True, True), layout=layout, causal=True,
        scale=0.1, out=out if delta_in_dq else None,
    )  # fmt: skip
    dq, dkdv = launched["_attention_dq"], launched["_attention_dkdv"]
    assert list(launched) == ["_attention_dq", "_attention_dkdv"]  # delta written first
    assert dq["DELTA"] is delta_in_dq and dq["delta_ptr"] is delta and dkdv["delta_ptr"] is delta
    assert dq["out_ptr"] is (out if delta_in_dq else dq["dq_ptr"])
    assert (dq["stride_o_b"], dq["stride_o_h"], dq["stride_o_s"]) == (
        attention_hopper_backward.attention_hopper.strides(out, layout)
    )


@needs_gluon
@pytest.mark.parametrize("layout, dim", [("bhsd", 128), ("bshd", 96), ("bhsd", 192)])
def test_without_dq_the_delta_kernel_writes_delta_first(monkeypatch, layout, dim):
    """Without dq wanted, out given: _attention_delta (the dq kernel's arithmetic) writes
    delta before the dk/dv kernel reads it, over v's parts of the head dim."""
    launched = bound_launches(monkeypatch)
    q_shape, k_shape = shapes(layout, 2, 8, 2, 300, 300, dim)
    dv = 128 if dim == 192 else dim
    q = torch.randn(q_shape, dtype=torch.bfloat16)
    d_out, out = (torch.randn(q_shape[:3] + (dv,), dtype=torch.bfloat16) for _ in range(2))
    k = torch.randn(k_shape, dtype=torch.bfloat16)
    v = torch.randn(k_shape[:3] + (dv,), dtype=torch.bfloat16)
    lse, delta = torch.zeros(2, 8, 300), torch.zeros(2, 8, 300)
    (d_q, d_k, d_v), compiled = attention_hopper_backward.backward(
        q, k, v, d_out, lse, delta, (False, True, False), layout=layout, causal=True,
        scale=0.1, out=out,
    )  # fmt: skip
    assert list(launched) == ["_attention_delta", "_attention_dkdv"]
    assert d_q is None and d_v is None and "hopper_dq" not in compiled
    rows = launched["_attention_delta"]
    assert rows["out_ptr"] is out and rows["d_out_ptr"] is d_out and rows["delta_ptr"] is delta
    assert launched["_attention_dkdv"]["delta_ptr"] is delta
    assert (rows["W0"], rows["W1"]) == {128: (128, 0), 96: (64, 32), 192: (128, 0)}[dim]
    strides = attention_hopper_backward.attention_hopper.strides
    assert (rows["stride_o_b"], rows["stride_o_h"], rows["stride_o_s"]) == strides(out, layout)
    assert (rows["stride_d_b"], rows["stride_d_h"], rows["stride_d_s"]) == strides(d_out, layout)
    assert (rows["sq"], rows["heads"]) == (300, 8)


@needs_gluon
@pytest.mark.parametrize("sq, streamed", [(300, True), (257, False), (1, False), (4096, True)])
def test_lse_and_delta_are_streamed_where_each_heads_rows_start_aligned(monkeypatch, sq, streamed):
    launched = bound_launches(monkeypatch)
    q_shape, k_shape = shapes("bhsd", 1, 4, 2, sq, 300, 128)
    q, d_out = (torch.randn(q_shape, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(k_shape, dtype=torch.bfloat16) for _ in range(2))
    lse, delta = torch.zeros(1, 4, sq), torch.zeros(1, 4, sq)
    attention_hopper_backward.backward(
        q, k, v, d_out, lse, delta, (False, True, True), layout="bhsd", causal=True, scale=0.1
    )
    dkdv = launched["_attention_dkdv"]
    assert dkdv["ROW_TMA"] is streamed
    assert dkdv["lse_desc"].base.data_ptr() == lse.data_ptr()
    assert list(dkdv["delta_desc"].block_shape) == [64]


@pytest.mark.parametrize(
    "layout, heads, kv_heads, causal, window, order",
    [
        ("bhsd", 28, 4, True, 0, attention_hopper_backward.HEAD_MAJOR),  # GQA: keys-major
        ("bshd", 8, 1, True, 0, attention_hopper_backward.HEAD_MAJOR),  # MQA
        ("bshd", 8, 8, True, 0, 4),  # MHA: head by head
        ("bhsd", 32, 8, True, 1024, 4),  # a window's programs weigh the same
        ("bhsd", 32, 8, False, 0, 4),  # so do unmasked ones
    ],
)
def test_the_dkdv_grid_goes_keys_major_only_for_causal_grouped_heads(
    layout, heads, kv_heads, causal, window, order
):
    q_shape, k_shape = shapes(layout, 1, heads, kv_heads, 256, 256, 128)
    q, k = torch.empty(q_shape), torch.empty(k_shape)
    assert attention_hopper_backward.dkdv_order(q, k, layout, causal, window) == order


@on_hopper
@needs_gluon
@pytest.mark.parametrize("head_major", [0, 1, 2, 3])
@pytest.mark.parametrize("batch, heads, kv_heads, seq", [(2, 8, 2, 300), (3, 4, 4, 1000)])
def test_every_program_order_gives_the_same_gradients(head_major, batch, heads, kv_heads, seq):
    """Each program computes its keys (dk/dv) or queries (dq) alone, so HEAD_MAJOR (the
    grids' order) must not change a bit of dq, dk or dv: a program that skipped or repeated
    a block would leave poison or a double."""
    torch.manual_seed(seq + head_major)
    q_shape, k_shape = shapes("bshd", batch, heads, kv_heads, seq, seq, 128)
    q, d_out = (torch.randn(q_shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(k_shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(batch, heads, seq, device="cuda") + 8.0
    delta = torch.randn(batch, heads, seq, device="cuda")
    call = dict(layout="bshd", causal=True, scale=128**-0.5)
    needs = (True, True, True)
    wants = attention_hopper_backward.backward(q, k, v, d_out, lse, delta, needs, **call)[0]
    _poison_cached_blocks(q_shape, k_shape, k_shape, dtype=torch.bfloat16)
    grads = attention_hopper_backward.backward(
        q,
        k,
        v,
        d_out,
        lse,
        delta,
        needs,
        head_major=head_major,
        dq_head_major=head_major,
        **call,
    )[0]
    for name, got, want in zip(("dq", "dk", "dv"), grads, wants, strict=True):
        assert torch.equal(got, want), name


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
