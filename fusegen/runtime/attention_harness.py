"""The generated attention tests: `attention_tests` makes them from a test module's
namespace, which keeps its cases (CASES, FORWARD_CASES, SMALL) and its kernel module;
what the spec changes (a bias input, TMA loads, v's own head dim) is read off the
module's runtime `Attention`. The fused attention and its gradients are checked against
the same math in float64 (the module's reference on float64 copies of the inputs).

The bound (fusegen's docs/tolerances.md, "Attention"): norm-wise at most twice the error
of the same math one PyTorch op at a time in the call's dtype (eager), plus four
roundings of the result; element-wise 8x eager's worst plus four roundings of the
largest value. Only the generated tests import this.
"""

import math
import random

import pytest
import torch

from . import attention
from .equivalence import DEVICE, ON_GPU, new_seed
from .harness import poisoned_empty

needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
# Unit roundoff of the outputs; the interpreter rounds fp32 to bf16 toward zero (2**-7).
ROUNDING = {
    torch.bfloat16: 2.0**-8 if ON_GPU else 2.0**-7,
    torch.float16: 2.0**-11,
    torch.float32: 2.0**-24,
}


class Suite:
    """One attention module as its tests see it: the kernel module, its launcher, the
    spec's shapes and flags, and the checks."""

    def __init__(self, namespace):
        kernel = self.kernel = namespace["kernel"]
        attention = kernel._ATTENTION
        self.name, self.launcher = attention.name, getattr(kernel, attention.name)
        self.bias, self.tma, self.split_v = attention.bias, attention.tma, attention.split_v
        self.cases, self.forward_cases = namespace["CASES"], namespace["FORWARD_CASES"]
        self.small = namespace["SMALL"]
        self.dtypes = kernel.DTYPES
        self.grads = ("dq", "dk", "dv", "d bias") if self.bias else ("dq", "dk", "dv")
        # Paths the interpreter runs slowly on many heads (a minute a module on 2 cores):
        # on the CPU the small specs of fusegen's tests/test_kernels.py zoo take them; a
        # GPU runs them everywhere.
        self.heavy = pytest.mark.skipif(
            not ON_GPU and kernel.HEADS * kernel.HEAD_DIM > 1024,
            reason="the interpreter runs this many heads slowly; the zoo's small specs cover it",
        )

    def shape(self, batch, seq, heads, dim=None):
        kernel = self.kernel
        dim = kernel.HEAD_DIM if dim is None else dim
        return (batch, seq, heads, dim) if kernel.LAYOUT == "bshd" else (batch, heads, seq, dim)

    def out_shape(self, q):
        """out's (and its gradient's) shape for q: v's head dim."""
        return (*q.shape[:3], self.kernel.V_HEAD_DIM)

    def make_inputs(self, case, dtype, seed):
        """q, k, v (and a bias [batch, heads, q_len, k_len]): the launcher's inputs."""
        kernel = self.kernel
        batch, sq, skv = case
        generator = torch.Generator().manual_seed(seed)
        sizes = [
            self.shape(batch, sq, kernel.HEADS),
            self.shape(batch, skv, kernel.KV_HEADS),
            self.shape(batch, skv, kernel.KV_HEADS, kernel.V_HEAD_DIM),
        ]
        if self.bias:
            sizes.append((batch, kernel.HEADS, sq, skv))
        return [torch.randn(s, generator=generator).to(dtype).to(DEVICE) for s in sizes]

    def upstream(self, q, dtype, seed):
        generator = torch.Generator().manual_seed(seed + 1)
        return torch.randn(self.out_shape(q), generator=generator).to(dtype).to(DEVICE)

    def check(self, what, got, want, eager, seed, dtype, case):
        assert got.shape == want.shape and got.dtype == dtype, (what, got.shape, got.dtype)
        rounding = ROUNDING[dtype]
        # An fp32 sum's rounding grows as sqrt(terms), and eager's order can get lucky: no
        # element of out or a gradient sums more than batch * heads * max(q_len, k_len)
        # terms. Each element is itself such a sum, so the element-wise bound takes it too
        # (seed 598621936 of the zoo's att_gqa_causal, fp32 dv with key lengths: 7.6e-6
        # against 6.2e-6 allowed without it, norm-wise 5.9e-7 against 6.8e-6).
        batch, sq, skv = case
        summed = 4 * 2.0**-24 * (batch * self.kernel.HEADS * max(sq, skv)) ** 0.5
        where = f"seed {seed}, {dtype}"
        check_bound(what, got, want, eager, rounding, summed, where, element_sum=True)

    def check_grads(self, call, inputs, upstream, seed, case):
        """Every gradient of `call(launcher)` against `call(reference)`'s (`call` wraps
        them alike: as_is, or with key lengths), each in its input's dtype."""
        doubles = [t.double() for t in inputs]
        got = grads_of(call(self.launcher), inputs, upstream)
        wanted = grads_of(call(self.kernel.reference), doubles, upstream.double())
        eager = grads_of(call(self.kernel.reference), inputs, upstream)
        for what, mine, want, theirs, t in zip(self.grads, got, wanted, eager, inputs, strict=True):
            self.check(what, mine, want, theirs, seed, t.dtype, case)
        return got

    def rows_of(self, unseen):
        """lse's [batch, heads, q_len] mask as a mask of out's rows (in the layout)."""
        rows = unseen.transpose(1, 2) if self.kernel.LAYOUT == "bshd" else unseen
        return rows[..., None].expand(*rows.shape, self.kernel.V_HEAD_DIM)


def check_bound(what, got, want, eager, rounding, summed, where, element_sum=False):
    """Fail unless `got` is within the bound of want (float64): norm-wise twice eager's
    error plus four roundings and `summed` (an fp32 sum's rounding); element-wise 8x
    eager's worst plus four roundings of the largest value (plus `summed` of it where
    element_sum: elements that are themselves long sums)."""
    scale = want.norm().item() + 1e-30
    error = (got.double() - want).norm().item() / scale
    eager_error = (eager.double() - want).norm().item() / scale
    largest = want.abs().max().item() if want.numel() else 0.0
    worst = (got.double() - want).abs().max().item() if want.numel() else 0.0
    eager_worst = (eager.double() - want).abs().max().item() if want.numel() else 0.0
    allowed = 8 * eager_worst + 4 * rounding * largest + (summed * largest if element_sum else 0)
    bound = 2 * eager_error + 4 * rounding + summed
    if not (error <= bound and worst <= allowed + 1e-30):
        pytest.fail(
            f"{what}: norm-wise error {error:.3g} (allowed {bound:.3g}, eager "
            f"{eager_error:.3g}), worst element {worst:.3g} (allowed {allowed:.3g}); {where}"
        )


def grads_of(call, inputs, upstream, asked=None):
    """The gradients of call's output against upstream for the inputs `asked` (all)."""
    asked = range(len(inputs)) if asked is None else asked
    leaves = [t.detach().requires_grad_(i in asked) for i, t in enumerate(inputs)]
    out = call(*leaves)
    return torch.autograd.grad(out, [leaves[i] for i in asked], upstream)


def as_is(call):
    return call


def attention_tests(namespace):
    """The tests of a generated attention test module, by name, made from its namespace
    (see Suite); `SUITE` is the Suite they check with."""
    suite = Suite(namespace)
    tests = [*value_tests(suite), *layout_tests(suite), *compile_tests(suite)]
    return {"SUITE": suite, **{test.__name__: test for test in tests}}


def value_tests(suite):
    """Out, lse and every gradient against float64: the cases, key lengths, a bias,
    the decode split."""
    kernel, launcher, dtypes, check = suite.kernel, suite.launcher, suite.dtypes, suite.check
    tests = []

    @pytest.mark.parametrize("dtype", dtypes)
    @pytest.mark.parametrize("case", suite.forward_cases)
    def test_matches_reference(monkeypatch, dtype, case):
        poisoned_empty(monkeypatch)
        seed = new_seed()
        inputs = suite.make_inputs(case, dtype, seed)
        out, lse = launcher(*inputs, return_lse=True)
        want, want_lse = kernel.reference(*[t.double() for t in inputs], return_lse=True)
        check("out", out, want, kernel.reference(*inputs), seed, dtype, case)
        # A row that sees no key: out 0 and lse -inf (as FlexAttention; SDPA gives NaN).
        unseen = torch.isinf(want_lse)
        assert torch.equal(torch.isinf(lse), unseen), seed
        rows = suite.rows_of(unseen)
        assert torch.equal(out.double()[rows], want[rows]), seed
        seen = ~unseen
        error = (lse.double()[seen] - want_lse[seen]).abs()
        assert lse.dtype == torch.float32, lse.dtype
        assert bool((error <= 2.0**-16 * (1 + want_lse[seen].abs())).all()), seed

    @pytest.mark.parametrize("dtype", dtypes if ON_GPU else dtypes[-1:])
    @pytest.mark.parametrize("case", suite.cases if ON_GPU else [(1, 19, 83)])
    def test_gradients_match_reference(monkeypatch, dtype, case):
        poisoned_empty(monkeypatch)
        seed = new_seed()
        inputs = suite.make_inputs(case, dtype, seed)
        upstream = suite.upstream(inputs[0], dtype, seed)
        got = suite.check_grads(as_is, inputs, upstream, seed, case)
        # One input at a time: only its gradient is computed.
        for i in range(len(suite.grads)) if ON_GPU else (1,):
            (alone,) = grads_of(launcher, inputs, upstream, asked=(i,))
            torch.testing.assert_close(alone, got[i], rtol=0, atol=0)

    def check_keys_limited(inputs, seed, dtype, case, **keys):
        """Out, lse's -inf rows and the gradients of a call limited to some keys (keys:
        key_lengths= or key_ranges=) against the reference's; returns out."""
        out, lse = launcher(*inputs, **keys, return_lse=True)
        doubles = [t.double() for t in inputs]
        want, want_lse = kernel.reference(*doubles, **keys, return_lse=True)
        check("out", out, want, kernel.reference(*inputs, **keys), seed, dtype, case)
        assert torch.equal(torch.isinf(lse), torch.isinf(want_lse)), seed

        def limited(call):
            return lambda *tensors: call(*tensors, **keys)

        suite.check_grads(limited, inputs, suite.upstream(inputs[0], dtype, seed), seed, case)
        return out

    @suite.heavy
    @pytest.mark.parametrize("dtype", dtypes if ON_GPU else dtypes[-1:])
    def test_key_lengths(monkeypatch, dtype):
        # Padding: batch entry b sees only its first key_lengths[b] keys. One entry has
        # none (every row unseen: out 0, lse -inf), one some, one more than k_len
        # (clamped).
        poisoned_empty(monkeypatch)
        seed = new_seed()
        case = (3, 70, 300) if ON_GPU else (3, 5, 40)
        inputs = suite.make_inputs(case, dtype, seed)
        lengths = [0, random.Random(seed).randrange(1, case[2]), case[2] + 5]
        lengths = torch.tensor(lengths, device=DEVICE)
        check_keys_limited(inputs, seed, dtype, case, key_lengths=lengths)

    @suite.heavy
    @pytest.mark.parametrize("dtype", dtypes if ON_GPU else dtypes[-1:])
    def test_key_ranges(monkeypatch, dtype):
        # Left padding and caches: batch entry b sees keys start <= key < end. One entry
        # starts inside an early block and ends in the last (so that whole blocks lie
        # between), one is clamped to [0, k_len], one has start >= end (no keys: out 0,
        # lse -inf). Rows before a start see no key either.
        poisoned_empty(monkeypatch)
        seed = new_seed()
        case = (3, 70, 300) if ON_GPU else (3, 37, 40)
        skv = case[2]
        inputs = suite.make_inputs(case, dtype, seed)
        rng = random.Random(seed)
        start = rng.randrange(1, skv // 2)
        ranges = [[start, skv - rng.randrange(0, 4)], [-3, skv + 5], [skv // 2] * 2]
        ranges = torch.tensor(ranges, device=DEVICE)
        out = check_keys_limited(inputs, seed, dtype, case, key_ranges=ranges)
        # The same ranges from a padding mask, as transformers holds one (1: a real key).
        keys = torch.arange(skv, device=DEVICE)
        mask = (keys >= ranges[:, :1]) & (keys < ranges[:, 1:])
        want_ranges = torch.tensor([ranges[0].tolist(), [0, skv], [skv, 0]], device=DEVICE)
        got_ranges = kernel.key_ranges_from_mask(mask.long())
        assert torch.equal(got_ranges.long(), want_ranges), (got_ranges, want_ranges)
        out_from_mask = launcher(*inputs, key_ranges=got_ranges)
        assert torch.equal(out_from_mask, out), seed
        mask[0, ranges[0, 0] + 1 :: 2] = False
        with pytest.raises(ValueError, match="row 0 has a hole"):
            kernel.key_ranges_from_mask(mask)
        with pytest.raises(ValueError, match="key_lengths or key_ranges, not both"):
            launcher(*inputs, key_ranges=ranges, key_lengths=ranges[:, 1])
        with pytest.raises(ValueError, match=r"key_ranges must be a \[batch, 2\]"):
            launcher(*inputs, key_ranges=ranges[:, 1])
        with pytest.raises(ValueError, match=r"key_lengths must have shape \[3\]"):
            launcher(*inputs, key_lengths=ranges)

    tests += [
        test_matches_reference, test_gradients_match_reference, test_key_lengths, test_key_ranges
    ]  # fmt: skip

    @pytest.mark.parametrize("dtype", dtypes if ON_GPU else dtypes[-1:])
    def test_bias_broadcasts_and_masks(monkeypatch, dtype):
        # A bias the batch shares ([heads, q_len, k_len]: T5's relative positions) and an
        # fp32 row a batch entry ([batch, 1, 1, k_len], read as a row): random values
        # (a mask's 0 and -inf alone would pass a row read in the wrong base), -inf past
        # a random length of at least half the keys, fp32's finfo.min on one key, every
        # key of the second entry masked (out 0, lse -inf). Out, lse and every gradient,
        # d bias summed to the bias's own shape. (Shorter lengths can leave each row one
        # key or none under a window, which makes every gradient exactly 0, where a
        # kernel's rounding is all its error: seed 926466071.) The shared bias's gradient
        # both ways: each entry's in the bias's dtype, summed after, and summed over both
        # entries by each dq program, as at a large batch at a large head dim.
        poisoned_empty(monkeypatch)
        monkeypatch.setattr(attention, "batch_chunk", lambda batch, programs, sms: batch)
        seed = new_seed()
        batch, sq, skv = case = (2, 70, 45) if ON_GPU else (2, 19, 33)
        q, k, v, _ = suite.make_inputs(case, dtype, seed)
        generator = torch.Generator().manual_seed(seed + 2)
        shared = torch.randn((kernel.HEADS, sq, skv), generator=generator)
        shared = shared.to(dtype).to(DEVICE)
        padding = torch.randn((batch, 1, 1, skv), generator=generator)
        padding[0, ..., random.Random(seed).randrange(skv // 2, skv) :] = float("-inf")
        padding[0, ..., 1] = torch.finfo(torch.float32).min
        padding[1] = float("-inf")
        upstream = torch.randn(suite.out_shape(q), generator=generator).to(dtype).to(DEVICE)
        for bias, summed_in_kernel in ((shared, False), (shared, True), (padding, False)):
            monkeypatch.setattr(
                kernel._ATTENTION, "bias_grad_buffer_cap", 0 if summed_in_kernel else math.inf
            )
            monkeypatch.setattr(kernel._ATTENTION, "backward_plans", {})
            inputs = [q, k, v, bias.to(DEVICE)]
            doubles = [t.double() for t in inputs]
            out, lse = launcher(*inputs, return_lse=True)
            want, want_lse = kernel.reference(*doubles, return_lse=True)
            check("out", out, want, kernel.reference(*inputs), seed, dtype, case)
            assert torch.equal(torch.isinf(lse), torch.isinf(want_lse)), seed
            suite.check_grads(as_is, inputs, upstream, seed, case)

    if suite.bias:
        tests.append(test_bias_broadcasts_and_masks)

    @suite.heavy
    def test_split_keys(monkeypatch):
        # Decode (a few queries against many keys) shares the keys among programs, so
        # that the GPU fills: forced here with small splits, against the reference with
        # the causal alignment and key lengths (an entry with none, one ending inside a
        # split).
        monkeypatch.setattr(kernel._ATTENTION, "sm_count", lambda device: 10_000)
        monkeypatch.setattr(kernel, "SPLIT_MIN_KEYS", 16)
        monkeypatch.setattr(kernel._ATTENTION, "plans", {})  # none planned without the split
        monkeypatch.setattr(kernel._ATTENTION, "backward_plans", {})  # nor for this GPU size
        poisoned_empty(monkeypatch)
        seed, dtype = new_seed(), dtypes[-1]
        for case in [(2, 1, 150), (1, 5, 97)] if not ON_GPU else [(2, 1, 4000), (1, 16, 3001)]:
            assert kernel._ATTENTION.forward_plan(torch.device(DEVICE), *case, dtype)[2] > 1
            inputs = suite.make_inputs(case, dtype, seed)
            lengths = None if case[0] == 1 else torch.tensor([0, case[2] - 40], device=DEVICE)
            out, lse = launcher(*inputs, key_lengths=lengths, return_lse=True)
            doubles = [t.double() for t in inputs]
            want, want_lse = kernel.reference(*doubles, key_lengths=lengths, return_lse=True)
            eager = kernel.reference(*inputs, key_lengths=lengths)
            check("out", out, want, eager, seed, dtype, case)
            seen = ~torch.isinf(want_lse)
            assert torch.equal(torch.isinf(lse), ~seen), seed
            error = (lse.double()[seen] - want_lse[seen]).abs()
            assert bool((error <= 2.0**-16 * (1 + want_lse[seen].abs())).all()), seed

    @needs_gpu
    def test_repeated_decode_calls_agree():
        # A decode call keeps the buffers it returns none of (lse not asked for, the
        # split's partial results) for the next call on its stream: calls with and
        # without lse, split or not, give the same bits as the first.
        seed, dtype = new_seed(), dtypes[0]
        for case in [(16, 1, 37), (2, 1, 4000)]:
            inputs = suite.make_inputs(case, dtype, seed)
            first, first_lse = (t.clone() for t in launcher(*inputs, return_lse=True))
            for _ in range(3):
                torch.testing.assert_close(launcher(*inputs), first, rtol=0, atol=0)
                out, lse = launcher(*inputs, return_lse=True)
                torch.testing.assert_close(out, first, rtol=0, atol=0)
                torch.testing.assert_close(lse, first_lse, rtol=0, atol=0)

    return [*tests, test_split_keys, test_repeated_decode_calls_agree]


def layout_tests(suite):
    """Inputs in other layouts, the checks' refusals, no queries, no GPU."""
    kernel, launcher, dtypes, small = suite.kernel, suite.launcher, suite.dtypes, suite.small
    tests = []

    def test_strided_inputs_read_in_place():
        # q, k and v sliced from one packed projection (as a fused QKV linear gives them),
        # and a transposed copy of the other layout: the same output as contiguous inputs.
        seed, dtype = new_seed(), dtypes[0]
        q, k, v, *rest = suite.make_inputs(small, dtype, seed)
        heads = {"q": kernel.HEADS, "kv": kernel.KV_HEADS}
        axis = 2 if kernel.LAYOUT == "bshd" else 1
        if suite.split_v:  # v's head dim is its own: a slice of a wider v
            packed = torch.cat([q, k], dim=axis)
            wider = torch.cat([v, v], dim=axis).narrow(axis, 0, heads["kv"])
            views = (*packed.split([heads["q"], heads["kv"]], dim=axis), wider)
        else:
            packed = torch.cat([q, k, v], dim=axis)
            views = packed.split([heads["q"], heads["kv"], heads["kv"]], dim=axis)
        assert views[0].stride() != q.stride()
        expected = launcher(q, k, v, *rest)
        torch.testing.assert_close(launcher(*views, *rest), expected, rtol=0, atol=0)
        other = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, *rest)]
        torch.testing.assert_close(launcher(*other), expected, rtol=0, atol=0)

    tests.append(test_strided_inputs_read_in_place)

    def test_pointer_loads_where_descriptors_cannot(monkeypatch):
        # K and V one element into their buffers start off 16 bytes, where the bulk copy
        # cannot read: the kernels take them through pointer loads, as right.
        poisoned_empty(monkeypatch)
        seed, dtype = new_seed(), dtypes[0]
        q, k, v, *rest = suite.make_inputs(small, dtype, seed)

        def unaligned(t):
            view = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape)
            return view.copy_(t)

        shifted = [unaligned(t) for t in (k, v)]
        if ON_GPU:
            descriptors = torch.cuda.get_device_capability()[0] >= 9 and not torch.version.hip
        else:
            descriptors = kernel._ATTENTION.interpreted()
        assert kernel._ATTENTION.tma_loads(k, v) == descriptors
        assert not kernel._ATTENTION.tma_loads(*shifted)
        want = kernel.reference(*[t.double() for t in (q, k, v, *rest)])
        eager = kernel.reference(q, k, v, *rest)
        suite.check("out", launcher(q, *shifted, *rest), want, eager, seed, dtype, small)
        # The backward: the dq kernel reads these K and V through pointers, the dk/dv
        # kernel q and d_out through descriptors.
        inputs = [q, *shifted, *rest]
        suite.check_grads(as_is, inputs, suite.upstream(q, dtype, seed), seed, small)

    if suite.tma:
        tests.append(test_pointer_loads_where_descriptors_cannot)

    def test_rejects_bad_inputs():
        q, k, v, *rest = suite.make_inputs(small, dtypes[0], new_seed())
        heads_axis = 2 if kernel.LAYOUT == "bshd" else 1
        seq_axis = 1 if kernel.LAYOUT == "bshd" else 2
        wide = torch.cat([v, v], dim=heads_axis)
        as_f64 = [t.to(torch.float64) for t in (q, k, v)]
        cases = [
            ((q[0], k, v), ValueError, r"q must be 4-D"),
            ((q, torch.cat([k, k], dim=3), v), ValueError, r"k.shape\[3\] \(dim\)"),
            ((q, k, wide), ValueError, rf"v.shape\[{heads_axis}\] \(heads\)"),
            ((q, k, torch.cat([v, v], dim=3)), ValueError, r"v.shape\[3\] \(dim\)"),
            ((q, k, v.narrow(seq_axis, 0, v.shape[seq_axis] - 1)), ValueError, r"v.shape.*k's"),
            ((q, k, v.to(torch.float64)), TypeError, r"v is torch.float64 but q"),
            (as_f64, TypeError, r"q is torch.float64"),
            ((q, torch.cat([k, k]), torch.cat([v, v])), ValueError, r"share the batch dim"),
            ((q, "k", v), TypeError, r"k must be a torch.Tensor"),
        ]
        if suite.bias:
            bias = rest[0]
            broadcast = r"bias has shape .* does not broadcast to the scores'"
            cases += [
                ((q, k, v, bias[..., :1, :2]), ValueError, broadcast),
                ((q, k, v, bias[None]), ValueError, r"bias has shape"),
                ((q, k, v, bias.to(torch.float64)), TypeError, r"bias is torch.float64; it must"),
                ((q, k, v, 1.0), TypeError, r"bias must be a torch.Tensor"),
            ]
            cases = [(a if len(a) == 4 else (*a, bias), e, p) for a, e, p in cases]
        for args, error, pattern in cases:
            with pytest.raises(error, match=pattern):
                launcher(*args)
        batch = q.shape[0]
        for lengths, error, pattern in [
            (torch.ones(batch, device=DEVICE), TypeError, r"key_lengths must be an integer"),
            ([3] * batch, TypeError, r"an integer torch.Tensor \[batch\], got list"),
            (
                torch.ones(batch + 1, dtype=torch.int64, device=DEVICE),
                ValueError,
                r"shape \[\d+\] \(batch\)",
            ),
        ]:
            with pytest.raises(error, match=pattern):
                launcher(q, k, v, *rest, key_lengths=lengths)

    def test_no_queries():
        q, k, v, *rest = suite.make_inputs((1, 0, 23), dtypes[0], new_seed())
        out, lse = launcher(q, k, v, *rest, return_lse=True)
        assert out.shape == suite.out_shape(q) and lse.shape == (1, kernel.HEADS, 0)

    def grads_are_the_references(inputs, dtype):
        upstream = torch.randn(suite.out_shape(inputs[0])).to(dtype).to(DEVICE)
        for mine, theirs in zip(
            grads_of(launcher, inputs, upstream),
            grads_of(kernel.reference, inputs, upstream),
            strict=True,
        ):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)

    def test_no_keys(monkeypatch):
        # k_len 0: each query sees no key, so its row is 0 and its lse -inf; q's gradient
        # is 0. Every float buffer torch.empty gives is NaN: nothing may go unwritten.
        poisoned_empty(monkeypatch)
        dtype = dtypes[0]
        inputs = suite.make_inputs((2, 5, 0), dtype, new_seed())
        out, lse = launcher(*inputs, return_lse=True)
        assert (out == 0).all() and (lse == float("-inf")).all()
        grads_are_the_references(inputs, dtype)

    def test_falls_back_without_gpu(monkeypatch):
        # Not on a GPU and the interpreter off: the reference, forward and backward.
        monkeypatch.setattr(kernel._ATTENTION, "runs_triton", lambda device: False)
        # Plans are kept per call signature; runs_triton is read when one is made.
        monkeypatch.setattr(kernel._ATTENTION, "plans", {})
        monkeypatch.setattr(kernel._ATTENTION, "backward_plans", {})
        dtype, seed = dtypes[-1], new_seed()
        inputs = suite.make_inputs(small, dtype, seed)
        expected = kernel.reference(*inputs)
        torch.testing.assert_close(launcher(*inputs), expected, rtol=0, atol=0)
        grads_are_the_references(inputs, dtype)

    return [
        *tests,
        test_rejects_bad_inputs,
        test_no_queries,
        test_no_keys,
        test_falls_back_without_gpu,
    ]


def compile_tests(suite):
    """Inside torch.compile (aot_eager, Inductor, CUDA graphs) and torch.export."""
    kernel, launcher, dtypes, small, name = (
        suite.kernel, suite.launcher, suite.dtypes, suite.small, suite.name,
    )  # fmt: skip

    @suite.heavy
    def test_inside_torch_compile(monkeypatch):
        # One op forward, one backward: fullgraph=True holds, the same bits as eager.
        if suite.tma:
            # A triton op's traced body reads by pointer (a traced tensor has no address
            # for a descriptor): eager reads so too, the same kernel code on both sides.
            monkeypatch.setattr(kernel, "TMA_LOADS", False)
        torch._dynamo.reset()
        dtype, seed = dtypes[-1], new_seed()
        inputs = suite.make_inputs(small, dtype, seed)
        upstream = torch.randn(suite.out_shape(inputs[0])).to(dtype).to(DEVICE)
        compiled = torch.compile(launcher, backend="aot_eager", fullgraph=True)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*inputs), launcher(*inputs), rtol=0, atol=0)
        for mine, theirs in zip(
            grads_of(compiled, inputs, upstream), grads_of(launcher, inputs, upstream), strict=True
        ):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
        torch._dynamo.reset()

    @needs_gpu
    def test_inductor_launches_the_kernels(monkeypatch):
        # The triton ops (the default, FUSEGEN_TRITON_OP=0 opts out; registered here under
        # a name of their own): torch.compile traces into the launcher, and Inductor's
        # wrapper launches the forward and, in training, the backward kernels itself.
        if not hasattr(torch.library, "triton_op"):
            pytest.skip("this torch has no torch.library.triton_op")
        from torch._inductor.utils import run_and_get_code

        torch._dynamo.reset()
        op = kernel._ATTENTION.register(f"{name}_inductor_test", traced=True)
        monkeypatch.setattr(kernel._ATTENTION, "op", op)
        dtype, seed = dtypes[0], new_seed()
        inputs = suite.make_inputs(small, dtype, seed)
        doubles = [t.double() for t in inputs]
        compiled = torch.compile(launcher, fullgraph=True)
        with torch.no_grad():
            out, (code,) = run_and_get_code(compiled, *inputs)
        assert f"_{name}_forward" in code and "torch.ops.fusegen" not in code
        suite.check("out", out, kernel.reference(*doubles), kernel.reference(*inputs),
                    seed, dtype, small)  # fmt: skip
        upstream = suite.upstream(inputs[0], dtype, seed)
        got, codes = run_and_get_code(grads_of, compiled, inputs, upstream)
        assert any(
            f"_{name}_backward_kv" in c for c in codes
        ), "the backward kernels are Inductor's"
        wanted = grads_of(kernel.reference, doubles, upstream.double())
        eager = grads_of(kernel.reference, inputs, upstream)
        for what, mine, want, theirs in zip(suite.grads, got, wanted, eager, strict=True):
            suite.check(what, mine, want, theirs, seed, dtype, small)
        torch._dynamo.reset()

    @needs_gpu
    def test_cuda_graphs_and_export():
        # mode="reduce-overhead" replays the kernels from a CUDA graph; torch.export keeps
        # the op in the exported program, which runs it.
        torch._dynamo.reset()
        dtype, seed = dtypes[0], new_seed()
        inputs = suite.make_inputs(small, dtype, seed)
        want, eager = kernel.reference(*[t.double() for t in inputs]), kernel.reference(*inputs)

        class Model(torch.nn.Module):
            def forward(self, *tensors):
                return launcher(*tensors)

        graphed = torch.compile(Model(), mode="reduce-overhead", fullgraph=True)
        with torch.no_grad():
            for _ in range(3):  # the warm-up, the recording, a replay
                suite.check("out", graphed(*inputs).clone(), want, eager, seed, dtype, small)
            exported = torch.export.export(Model(), tuple(inputs))
            out = exported.module()(*inputs)
        suite.check("out", out, want, eager, seed, dtype, small)
        torch._dynamo.reset()

    return [
        test_inside_torch_compile,
        test_inductor_launches_the_kernels,
        test_cuda_graphs_and_export,
    ]
