"""The attention launcher (fusegen/runtime/attention.py): where an offset inside one
batch entry reaches 2**31 (a long sequence, a strided view, d bias's [q_len, k_len]) the
kernels take positions times strides in 64 bits (INT64); the batch's own offset always
is, so a large batch alone keeps the 32-bit code."""

import importlib
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from conftest import ROOT  # noqa: E402
from fusegen.runtime.attention import batch_chunk, summed_to, wide_offsets  # noqa: E402


def meta(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16, device="meta")


def test_wide_offsets_count_one_batch_entry():
    assert not wide_offsets([meta(64, 8192, 32, 128)])  # 2**31 elements, 2**25 an entry
    assert not wide_offsets([meta(1, 524288, 32, 128)])  # its last offset: 2**31 - 1
    assert wide_offsets([meta(1, 524289, 32, 128)])
    assert wide_offsets([meta(1, 3, 2**20, 1024)[..., :128]])  # a view: rows 2**30 apart
    assert wide_offsets([], shapes=[(1, 524289, 32, 128)])  # the out the call makes
    assert wide_offsets([], bias_grad=46341 * 46341)  # one head's d bias
    assert not wide_offsets([], bias_grad=46340 * 46340)


def test_batch_chunks_leave_four_programs_a_multiprocessor():
    # 2 x 32 heads x 32 query blocks of a shared [1, 32, 2048, 2048] bias on 132 SMs
    assert batch_chunk(2, 2 * 32 * 32, 132) == 2
    assert batch_chunk(32, 32 * 8 * 8, 132) == 2  # 1024 programs; 4 would leave 512
    assert batch_chunk(7, 7 * 256, 132) == 1  # a prime batch: 7 would leave 256
    assert batch_chunk(6, 6 * 4, 0) == 6  # the interpreter: four programs in all


def test_summed_to_sums_the_chunks_and_broadcast_dims():
    d_scores = torch.randn(4, 3, 5, 6, dtype=torch.float64)  # 4 chunks of the batch
    assert torch.equal(summed_to(d_scores, torch.empty(3, 5, 6)), d_scores.sum(0).float())
    rows = summed_to(d_scores, torch.empty(4, 1, 1, 6, dtype=torch.bfloat16))
    assert torch.equal(rows, d_scores.sum((1, 2), keepdim=True).bfloat16())
    one = d_scores[:1]  # a single chunk: reshaped and cast, no sum
    assert torch.equal(summed_to(one, torch.empty(1, 3, 5, 6)), one.float())


def test_64_bit_offsets_give_the_same_attention_and_gradients(monkeypatch):
    # The INT64 kernels on inputs that do not need them: the same arithmetic, so the same
    # out, lse and gradients, bit for bit (on the interpreter here, or the GPU).
    sys.path.insert(0, str(ROOT / "generated"))
    try:
        module = importlib.import_module("llama3_attention")
    finally:
        sys.path.remove(str(ROOT / "generated"))
    runtime = sys.modules[type(module._ATTENTION).__module__]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 37, heads, 128, generator=gen).to(device, torch.float16).requires_grad_()
        for heads in (32, 8, 8)
    )
    d_out = torch.randn(2, 37, 32, 128, generator=gen).to(device, torch.float16)
    results = []
    for wide in (False, True):
        monkeypatch.setattr(runtime, "wide_offsets", lambda *a, wide=wide, **k: wide)
        module._ATTENTION.plans.clear()
        module._ATTENTION.backward_plans.clear()
        out, lse = module.llama3_attention(q, k, v, return_lse=True)
        grads = torch.autograd.grad(out, (q, k, v), d_out)
        (plan,) = module._ATTENTION.plans.values()
        assert plan.forward.kwargs["INT64"] is wide
        results.append((out, lse, *grads))
    for plain, wide in zip(*results, strict=True):
        assert torch.equal(plain, wide)
