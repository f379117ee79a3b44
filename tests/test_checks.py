"""fusegen/runtime/checks.py at its boundaries: which views need 64-bit offsets, which
buffers overlap (an output sharing one element with an input is refused), and what a
call's signature (the key of its kept plan) tells apart."""

import pytest

torch = pytest.importorskip("torch")

from fusegen.runtime.checks import needs_int64, shares_memory, signature  # noqa: E402


def view(last_offset):
    """A meta view of two rows whose last element sits at `last_offset`."""
    return torch.empty(0, device="meta").new_empty((2**40,)).as_strided((2, 1), (last_offset, 1))


def test_int64_from_the_last_offset_that_int32_cannot_hold():
    assert not needs_int64(view(2**31 - 1))  # int32's largest
    assert needs_int64(view(2**31))
    assert not needs_int64(torch.empty(2**16, 2**15 - 1, device="meta"))
    assert needs_int64(torch.empty(2**16, 2**15 + 1, device="meta"))


def test_overlap_by_a_single_element_is_sharing():
    buffer = torch.zeros(20)
    assert shares_memory(buffer[:10], buffer[9:15])  # element 9 in both
    assert not shares_memory(buffer[:10], buffer[10:15])
    assert shares_memory(buffer[4:5], buffer[:10])  # one element inside
    assert shares_memory(buffer[::2], buffer[8:9])  # a strided view's element
    assert not shares_memory(buffer[:0], buffer)


def test_a_signature_tells_apart_each_thing_a_plan_depends_on(monkeypatch):
    """A call finding another's signature reuses that call's plan unchecked: one input's
    shape, strides, dtype, device or 16-byte alignment, an input's place, or a setting
    that differs must give another signature."""
    monkeypatch.delenv("FUSEGEN_TMA", raising=False)
    monkeypatch.delenv("FUSEGEN_AUTOTUNE", raising=False)
    x, w = torch.zeros(4, 8), torch.zeros(8)
    first = signature(x, w)
    assert signature(x.clone(), w.clone()) == first  # other tensors, the same plan
    others = [
        signature(torch.zeros(2, 8), w),  # shape
        signature(torch.zeros(8, 4).t(), w),  # strides
        signature(x.double(), w),  # dtype
        signature(x.to("meta"), w),  # device
        signature(torch.zeros(33)[1:].view(4, 8), w),  # 4 bytes past 16-byte alignment
        signature(w, x),  # the inputs' places
        signature(x, w, w),  # arity
    ]
    monkeypatch.setenv("FUSEGEN_TMA", "0")
    others.append(signature(x, w))
    monkeypatch.setenv("FUSEGEN_AUTOTUNE", "0")
    others.append(signature(x, w))
    assert len({first, *others}) == len(others) + 1
    assert signature(x, [1.0] * 8) is None  # not a tensor: the checks say what is wrong
