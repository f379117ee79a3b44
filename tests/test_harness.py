"""The generated chain tests' harness (fusegen/runtime/harness.py, equivalence.py): its
checks fail on wrong results, and the tests it makes follow the module's flags. The
generated modules and the zoo's mutants run it against real kernels (test_kernels.py);
here a made-up chain, y = x * b, with no kernel behind it."""

import os
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from fusegen.runtime import equivalence, harness  # noqa: E402

LAUNCH = {"fp32_matmul": "ieee", "fast_tanh": False, "config": {"BLOCK_N": 8}}


def reference(x, b, *, out_dtype=None):
    y = x * b
    return y.to(out_dtype) if out_dtype else y


def reference_and_bound(p_in, depth, fast_tanh, x, b):
    v = x * b
    return [(v, equivalence.U32 * v.abs())]


def namespace(**changes):
    """A generated test module's namespace for y = x * b over [M, N], N fixed at 8."""
    kernels = types.SimpleNamespace(interpreted=lambda: False)
    kernel = types.SimpleNamespace(
        DIMS={"M": None, "N": 8},
        OUT_DTYPE=None,
        CONFIGS=[{"BLOCK_M": 4, "BLOCK_N": 8}],
        TMA_CONFIGS=[{"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 3}],
        _KERNELS=kernels,
        reference=reference,
    )
    found = {
        "kernel": kernel,
        "LAUNCHER": reference,
        "DTYPES": [torch.float16, torch.float32],
        "ROW": "M",
        "COL": "N",
        "FAN_IN": None,
        "INPUTS": {"x": (("M", "N"), None, "normal", True), "b": (("N",), None, "normal", False)},
        "CASES": [{"M": 1}, {"M": 5}],
        "ALIGNED": {"M": 5},
        "HEAVY": False,
        "KINKED": False,
        "OUTPUTS": ["out"],
        "REDUCES": False,
        "SOURCE": "x",
        "MATMUL_OPERANDS": [],
        "SPECIAL_ROWS": False,
        "SOFTMAX_MASK": None,
        "TMA": False,
        "FAST_TANH": False,
        "ESTIMATED_DEFAULT": False,
        "NO_GPU": "reference",
        "NONFINITE": "off",
        "MM_CALLS": {"x": 0, "b": 0},
        "reference_and_bound": reference_and_bound,
    }
    return {**found, **changes}


@pytest.fixture
def chain():
    return equivalence.Chain(namespace())


def test_an_output_within_the_bound_passes_and_one_outside_fails(chain):
    inputs = chain.make_inputs({"M": 5, "N": 8}, torch.float16, seed=7)
    out = (inputs["x"].float() * inputs["b"].float()).half()  # fp32, then one rounding
    _, (expected,) = chain.check_outputs((out,), inputs, torch.float16, 7, LAUNCH)
    torch.testing.assert_close(expected, reference(**{n: t.double() for n, t in inputs.items()}))
    # One ulp of fp16 over the rounding the bound allows.
    wrong = out.clone()
    wrong[2, 3] = (expected[2, 3] * (1 + 2**-9)).half()
    with pytest.raises(pytest.fail.Exception, match=r"out: 1 of 40 elements are outside the bound"):
        chain.check_outputs((wrong,), inputs, torch.float16, 7, LAUNCH)
    with pytest.raises(pytest.fail.Exception, match=r"seed 7, torch.float16.*first at \(2, 3\)"):
        chain.check_outputs((wrong,), inputs, torch.float16, 7, LAUNCH)
    # The poison: an element the kernel did not write.
    unwritten = out.clone()
    unwritten[4, 7] = float("nan")
    with pytest.raises(pytest.fail.Exception, match=r"first at \(4, 7\): got nan"):
        chain.check_outputs((unwritten,), inputs, torch.float16, 7, LAUNCH)
    with pytest.raises(AssertionError):
        chain.check_outputs((out[:4],), inputs, torch.float16, 7, LAUNCH)


def test_an_infinity_passes_only_past_the_largest_finite_value(chain):
    # 300 * 300 = 90000 overflows fp16 (largest 65504): inf is the right answer there.
    x = torch.tensor([[300.0, 2.0] * 4], dtype=torch.float16)
    b = torch.tensor([300.0, -300.0] * 4, dtype=torch.float16)
    inputs = {"x": x, "b": b}
    out = torch.tensor([[float("inf"), -600.0] * 4], dtype=torch.float16)
    chain.check_outputs((out,), inputs, torch.float16, 0, LAUNCH)
    for wrong in (-float("inf"), float("nan")):
        flipped = out.clone()
        flipped[0, 0] = wrong
        with pytest.raises(pytest.fail.Exception, match="outside the bound"):
            chain.check_outputs((flipped,), inputs, torch.float16, 0, LAUNCH)
    finite_as_inf = out.clone()
    finite_as_inf[0, 1] = -float("inf")
    with pytest.raises(pytest.fail.Exception, match=r"first at \(0, 1\)"):
        chain.check_outputs((finite_as_inf,), inputs, torch.float16, 0, LAUNCH)


def test_a_wrong_gradient_fails(chain):
    inputs = chain.make_inputs({"M": 64, "N": 8}, torch.float32, seed=3)
    results, upstream, got = chain.grads_of(inputs, ["x", "b"], 3)
    chain.check_grads(got, inputs, upstream, ["x", "b"], torch.float32, 3)
    dx, db = got
    with pytest.raises(pytest.fail.Exception, match=r"db: norm-wise error .* seed 3"):
        chain.check_grads([dx, db * 1.01], inputs, upstream, ["x", "b"], torch.float32, 3)
    # Four elements of 512: past the 1/256 the element-wise bound leaves out, inside
    # the 1/32 the norm does.
    sparse = dx.clone()
    sparse[5, :4] += 10 * dx.abs().max()
    with pytest.raises(pytest.fail.Exception, match=r"dx: .*worst element"):
        chain.check_grads([sparse, db], inputs, upstream, ["x", "b"], torch.float32, 3)
    unwritten = dx.clone()
    unwritten[0, 0] = float("nan")
    with pytest.raises(pytest.fail.Exception, match="NaN: True"):
        chain.check_grads([unwritten, db], inputs, upstream, ["x", "b"], torch.float32, 3)


def test_a_zeroed_edge_column_of_a_bf16_gradient_fails_unless_the_chain_is_kinked():
    # b's last entry small: that column of dx zeroed is under the norm's bound and under
    # an eighth of the largest element (which KINKED keeps), not under four roundings.
    plain, kinked = (equivalence.Chain(namespace(KINKED=k)) for k in (False, True))
    inputs = plain.make_inputs({"M": 64, "N": 128}, torch.bfloat16, seed=3)
    inputs["b"] = torch.ones(128, dtype=torch.bfloat16)
    inputs["b"][-1] = 0.1
    _, upstream, (dx, db) = plain.grads_of(inputs, ["x", "b"], 3)
    edge = dx.clone()
    edge[:, -1] = 0
    kinked.check_grads([edge, db], inputs, upstream, ["x", "b"], torch.bfloat16, 3)
    plain.check_grads([dx, db], inputs, upstream, ["x", "b"], torch.bfloat16, 3)
    with pytest.raises(pytest.fail.Exception, match=r"dx: .*worst element"):
        plain.check_grads([edge, db], inputs, upstream, ["x", "b"], torch.bfloat16, 3)
    # The launcher is the reference, so eager's worst is dx's own.
    want = inputs["b"].double().expand(64, 128) * upstream[0].double()
    eager_worst = (dx.double() - want).abs().max().item()
    largest = want.abs().max().item()
    tiny = equivalence.OUT_TINY[torch.bfloat16]
    rounding = equivalence.OUT_ROUNDING[torch.bfloat16]
    for chain, slack in ((kinked, largest / 8), (plain, (4 * rounding + 32 * 2**-24) * largest)):
        with pytest.raises(pytest.fail.Exception) as failed:
            chain.check_grads([dx + largest, db], inputs, upstream, ["x", "b"], torch.bfloat16, 3)
        assert f"(allowed {8 * eager_worst + slack + tiny:.3g})" in str(failed.value)


def test_inputs_follow_the_seed_and_the_module(chain, monkeypatch):
    monkeypatch.setenv("FUSEGEN_TEST_SEED", "1234")
    assert equivalence.new_seed() == 1234
    monkeypatch.delenv("FUSEGEN_TEST_SEED")
    assert 0 <= equivalence.new_seed() < 2**31
    sizes = {"M": 6, "N": 8}
    first = chain.make_inputs(sizes, torch.bfloat16, seed=5)
    again = chain.make_inputs(sizes, torch.bfloat16, seed=5)
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert [t.dtype for t in first.values()] == [torch.bfloat16] * 2
    batched = chain.make_inputs(sizes, torch.float32, seed=5, lead=[2, 3])
    assert batched["x"].shape == (2, 3, 8) and batched["b"].shape == (8,)
    buffers = chain.output_buffers(sizes, torch.float16, lead=[2, 3])
    assert buffers["out"].shape == (2, 3, 8) and buffers["out"].isnan().all()
    rows = equivalence.Chain(namespace(SPECIAL_ROWS=True)).make_inputs(sizes, torch.float32, 5)
    assert (rows["x"][0] == 3.0).all()  # a constant row
    assert rows["x"][1].abs().max() > 1e3  # a row of large values


def test_the_tests_follow_the_module_flags():
    plain = harness.chain_tests(namespace())
    assert isinstance(plain["CHAIN"], equivalence.Chain)
    names = set(plain) - {"CHAIN"}
    assert "test_matches_reference" in names and "test_gradients_fall_back_without_gpu" in names
    for absent in ("test_tma_path", "test_fast_tanh_only_for_16_bit_outputs"):
        assert absent not in names
    assert "test_fp32_matmul_follows_torch_precision" not in names  # no matmul
    assert "test_nonfinite_output_falls_back" not in names
    flagged = harness.chain_tests(
        namespace(TMA=True, FAST_TANH=True, FAN_IN="N", NO_GPU="error", NONFINITE="reference")
    )
    added = set(flagged) - set(plain)
    assert added == {
        "test_tma_path",
        "test_tma_path_takes_column_major_operands",
        "test_pointer_path_on_aligned_shapes",
        "test_unaligned_rows_take_the_pointer_path",
        "test_every_tma_config",
        "test_estimate_ranks_tiles_for_the_shape",
        "test_fast_tanh_only_for_16_bit_outputs",
        "test_fp32_matmul_follows_torch_precision",
        "test_nonfinite_output_falls_back",
        "test_finite_output_with_an_overflowing_sum_is_kept",
    }
    assert set(plain) - set(flagged) == {"test_gradients_fall_back_without_gpu"}


def marks(test, name):
    return [m for m in getattr(test, "pytestmark", []) if m.name == name]


def test_each_module_gets_its_own_tests():
    """Marks live on the function: two modules' tests must be two functions, each with
    its own parametrization and skips."""
    light = harness.chain_tests(namespace())
    heavy = harness.chain_tests(namespace(HEAVY=True, CASES=[{"M": 19}]))
    assert light["test_matches_reference"] is not heavy["test_matches_reference"]
    (light_cases,) = [
        m for m in marks(light["test_matches_reference"], "parametrize") if m.args[0] == "case"
    ]
    (heavy_cases,) = [
        m for m in marks(heavy["test_matches_reference"], "parametrize") if m.args[0] == "case"
    ]
    assert light_cases.args[1] == [{"M": 1}, {"M": 5}] and heavy_cases.args[1] == [{"M": 19}]
    (dtypes,) = [
        m for m in marks(heavy["test_matches_reference"], "parametrize") if m.args[0] == "dtype"
    ]
    assert dtypes.args[1] == [torch.float32]  # HEAVY: the last dtype only
    (skip,) = marks(heavy["test_noncontiguous_inputs"], "skipif")
    assert skip.args == (True,)
    assert skip.kwargs["reason"] == "strides are tested on smaller kernels under the interpreter"
    assert [m.args for m in marks(light["test_noncontiguous_inputs"], "skipif")] == [(False,)]


def test_the_output_bound_is_held_to_its_size():
    # gpt2_mlp_up in fp32: gelu(x @ w + b), K = 768. Its bound is about K fp32 roundings of
    # |x| @ |w| (docs/tolerances.md), pinned here from outside the harness: a bound grown
    # 100x (a mutant of outside_bound) passed every other test.
    import importlib
    import sys

    from conftest import ROOT

    sys.path.insert(0, str(ROOT / "generated"))
    try:
        tests = importlib.import_module("test_gpt2_mlp_up")
    finally:
        sys.path.remove(str(ROOT / "generated"))
    chain = tests.CHAIN
    inputs = chain.make_inputs({**chain.sizes, **chain.cases[0]}, torch.float32, 5)
    out = chain.launcher(**inputs)
    launch = chain.kernel.last_launch()
    exact, (expected,) = chain.check_outputs((out,), inputs, torch.float32, 5, launch)
    depth = equivalence.reduction_depth(launch, out.shape[-1])
    ((_, raw),) = chain.reference_and_bound(0.0, depth, 0, **exact)
    _, bound = equivalence.outside_bound(out, expected, raw, 2.0**-24)
    scale = 768 * 2.0**-24 * (exact["x"].abs() @ exact["w"].abs() + exact["b"].abs())
    ratio = (bound / scale).max().item()
    assert 0.5 < ratio < 4, ratio


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's cast")
def test_the_interpreter_rounds_fp32_to_bf16_to_nearest_as_a_gpu_does():
    # Triton's interpreter truncates; the tests' (equivalence.py) rounds to nearest even,
    # bit for bit as torch does, NaN, infinities, subnormals and ties included, explicit
    # casts and the store's own.
    import triton
    import triton.language as tl

    @triton.jit
    def cast(x, y, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(y + offs, tl.load(x + offs).to(tl.bfloat16))

    @triton.jit
    def store(x, y, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(y + offs, tl.load(x + offs))

    torch.manual_seed(0)
    x = torch.randint(-(2**31), 2**31 - 1, (4096,), dtype=torch.int32).view(torch.float32)
    x[:9] = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.3895e38, -0.0, 1e-40,
                          0.9999993, 1 + 2**-8, 1 + 3 * 2**-8])  # fmt: skip
    want = x.bfloat16()
    for kernel in (cast, store):
        got = torch.empty(4096, dtype=torch.bfloat16)
        kernel[(1,)](x, got, N=4096)
        same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
        assert bool(same.all()), x[~same][:5]
    assert got[6] == 1.0  # truncated, 0.99609375
