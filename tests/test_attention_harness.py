"""The generated attention tests' harness (fusegen/runtime/attention_harness.py): its
check fails on a wrong output and passes a right one, and the tests it makes follow what
the module's runtime Attention says the spec has. The generated modules and the zoo run
it against real kernels (test_kernels.py); here a made-up module with no kernel behind
it."""

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from fusegen.runtime import attention_harness  # noqa: E402


def reference(q, k, v, *rest, key_lengths=None, return_lse=False):
    scores = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)
    out = (torch.softmax(scores, dim=-1) @ v.transpose(1, 2)).transpose(1, 2)
    return (out, torch.logsumexp(scores, dim=-1)) if return_lse else out


def namespace(**flags):
    attention = types.SimpleNamespace(
        name="made_up",
        bias=flags.get("bias", False),
        tma=flags.get("tma", False),
        split_v=flags.get("split_v", False),
    )
    kernel = types.SimpleNamespace(
        _ATTENTION=attention,
        made_up=reference,
        reference=reference,
        DTYPES=(torch.float32,),
        HEADS=2,
        KV_HEADS=2,
        HEAD_DIM=16,
        V_HEAD_DIM=16,
        LAYOUT="bshd",
    )
    return {
        "kernel": kernel,
        "CASES": [(2, 5, 7)],
        "FORWARD_CASES": [(2, 5, 7)],
        "SMALL": (1, 5, 7),
    }


def test_the_check_fails_outside_the_bound_and_passes_inside():
    suite = attention_harness.Suite(namespace())
    case, seed = (2, 5, 7), 1234
    q, k, v = suite.make_inputs(case, torch.float32, seed)
    want = reference(q.double(), k.double(), v.double())
    eager = reference(q, k, v)
    suite.check("out", eager.clone(), want, eager, seed, torch.float32, case)
    wrong = eager.clone()
    wrong[0, 0, 0, 0] += 1e-3
    with pytest.raises(pytest.fail.Exception, match="out: norm-wise error"):
        suite.check("out", wrong, want, eager, seed, torch.float32, case)
    with pytest.raises(AssertionError):  # the output's dtype is the call's
        suite.check("out", eager.double(), want, eager, seed, torch.float32, case)


def test_inputs_follow_the_seed_and_the_spec():
    plain = attention_harness.Suite(namespace())
    biased = attention_harness.Suite(namespace(bias=True))
    first = plain.make_inputs((2, 5, 7), torch.float32, 7)
    again = plain.make_inputs((2, 5, 7), torch.float32, 7)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert [t.shape for t in first] == [(2, 5, 2, 16), (2, 7, 2, 16), (2, 7, 2, 16)]
    assert biased.make_inputs((2, 5, 7), torch.float32, 7)[3].shape == (2, 2, 5, 7)
    assert biased.grads == ("dq", "dk", "dv", "d bias") and plain.grads == ("dq", "dk", "dv")


def test_the_tests_follow_the_spec():
    def names(**flags):
        return set(attention_harness.attention_tests(namespace(**flags))) - {"SUITE"}

    plain = names()
    assert "test_bias_broadcasts_and_masks" not in plain
    assert "test_pointer_loads_where_descriptors_cannot" not in plain
    assert names(bias=True) - plain == {"test_bias_broadcasts_and_masks"}
    assert names(tma=True) - plain == {"test_pointer_loads_where_descriptors_cannot"}
    assert {"test_matches_reference", "test_split_keys", "test_falls_back_without_gpu"} <= plain
