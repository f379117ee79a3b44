"""fusegen/runtime/checks.py at its boundaries: which views need 64-bit offsets, and
which buffers overlap (an output sharing one element with an input is refused)."""

import pytest

torch = pytest.importorskip("torch")

from fusegen.runtime.checks import needs_int64, shares_memory  # noqa: E402


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
