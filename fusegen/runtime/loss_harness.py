"""The generated loss-head tests: `loss_head_tests` makes them from a test module's
namespace, which keeps its CASES and its kernel module; the options (bias, reduction,
lse) are read off the module. The loss, lse and every gradient are checked against the
same math in float64 (the module's reference on float64 copies of the inputs).

The bound (fusegen's docs/tolerances.md, "Loss heads"): norm-wise at most twice the
error of the reference run in the call's dtype (eager), plus four roundings and an fp32
sum's rounding over the terms; element-wise 8x eager's worst plus four roundings of the
largest value. Only the generated tests import this.
"""

import pytest
import torch

from .attention_harness import ROUNDING, check_bound
from .equivalence import DEVICE, ON_GPU, new_seed
from .harness import poisoned_empty

needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")


class Suite:
    """One loss-head module as its tests see it."""

    def __init__(self, namespace):
        kernel = self.kernel = namespace["kernel"]
        head = kernel._HEAD
        self.runtime = kernel._rt
        self.name, self.launcher = head.name, getattr(kernel, head.name)
        self.cases = namespace["CASES"]
        self.dtypes = kernel.DTYPES
        self.bias = len(kernel.INPUT_NAMES) == 4  # x, weight, labels and a bias
        self.grad_names = ("dx", "dweight", "dbias") if self.bias else ("dx", "dweight")

    def sizes(self, case):
        tokens, hidden, vocab = case
        k = self.kernel
        return (k.TOKENS or tokens, k.HIDDEN or hidden, k.VOCAB or vocab)

    def make_inputs(self, case, dtype, seed, ignored=0.2):
        """x, weight, labels (and bias): labels at 0 and vocab - 1, a share ignored."""
        tokens, hidden, vocab = self.sizes(case)
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(tokens, hidden, generator=g)
        w_shape = (vocab, hidden) if self.kernel.WEIGHT_TRANSPOSED else (hidden, vocab)
        weight = torch.randn(w_shape, generator=g) * hidden**-0.5 * 4  # logits ~ N(0, 16)
        labels = torch.randint(0, vocab, (tokens,), generator=g)
        labels[0] = vocab - 1
        if tokens > 1:
            labels[1] = 0
        drop = torch.rand(tokens, generator=g) < ignored
        drop[:2] = False
        labels[drop] = self.kernel.IGNORE_INDEX
        inputs = [x.to(dtype), weight.to(dtype), labels]
        if self.bias:
            inputs.append(torch.randn(vocab, generator=g).to(dtype))
        return [t.to(DEVICE) for t in inputs]

    def outputs(self, call, inputs):
        out = call(*inputs)
        return out if isinstance(out, tuple) else (out,)

    def check(self, what, got, want, eager, seed, dtype, terms):
        assert got.shape == want.shape, (what, got.shape, want.shape)
        rounding = ROUNDING[dtype]
        summed = 4 * 2.0**-24 * terms**0.5
        where = f"seed {seed}, {dtype}"
        check_bound(what, got, want, eager, rounding, summed, where, element_sum=True)

    def upstream(self, outs, seed):
        g = torch.Generator().manual_seed(seed + 1)
        return [torch.randn(o.shape, generator=g, dtype=torch.float64).to(DEVICE) for o in outs]

    def grads(self, call, inputs, upstream, asked=None):
        floats = [i for i, t in enumerate(inputs) if t.is_floating_point()]
        asked = floats if asked is None else asked
        leaves = [t.detach().requires_grad_(i in asked) for i, t in enumerate(inputs)]
        outs = self.outputs(call, leaves)
        ups = [u.to(o.dtype) for u, o in zip(upstream, outs, strict=True)]
        return torch.autograd.grad(outs, [leaves[i] for i in asked], ups)


def force_blocks(monkeypatch, suite, dtype, rows=8):
    """Blocks of `rows` tokens and 128 columns, fewer than a case's, so the loops run over
    several of each and the last ones are partial."""
    monkeypatch.setattr(suite.runtime, "MIN_COLS", 128)
    monkeypatch.setattr(suite.runtime, "ALIGN", 128)
    monkeypatch.setattr(suite.kernel, "BLOCK_BYTES", rows * 128 * dtype.itemsize)


def loss_head_tests(namespace):
    """The tests of a generated loss-head test module, by name; `SUITE` is their Suite."""
    suite = Suite(namespace)
    tests = [*value_tests(suite), *edge_tests(suite)]
    return {"SUITE": suite, **{test.__name__: test for test in tests}}


def value_tests(suite):
    kernel, launcher, tests = suite.kernel, suite.launcher, []
    # The interpreter runs each program's ops one by one: there the first case for the
    # gradients and the blocks; a GPU runs every case.
    grad_cases = suite.cases if ON_GPU else suite.cases[:1]

    def doubles(inputs):
        return [t.double() if t.is_floating_point() else t for t in inputs]

    def check_values(monkeypatch, dtype, case, blocked):
        poisoned_empty(monkeypatch)
        if blocked:
            force_blocks(monkeypatch, suite, dtype)
        seed = new_seed()
        inputs = suite.make_inputs(case, dtype, seed)
        got = suite.outputs(launcher, inputs)
        want = suite.outputs(kernel.reference, doubles(inputs))
        eager = suite.outputs(kernel.reference, inputs)
        tokens, _, vocab = suite.sizes(case)
        for what, g, w, e in zip(("loss", "lse")[: len(got)], got, want, eager, strict=True):
            assert g.dtype == torch.float32, (what, g.dtype)
            suite.check(what, g, w, e, seed, dtype, tokens * vocab)
        if blocked:
            assert kernel._HEAD.last["blocks"] > 1, kernel._HEAD.last

    def check_grads(monkeypatch, dtype, case, blocked):
        poisoned_empty(monkeypatch)
        if blocked:
            force_blocks(monkeypatch, suite, dtype)
        seed = new_seed()
        inputs = suite.make_inputs(case, dtype, seed)
        upstream = suite.upstream(suite.outputs(kernel.reference, doubles(inputs)), seed)
        got = suite.grads(launcher, inputs, upstream)
        want = suite.grads(kernel.reference, doubles(inputs), upstream)
        eager = suite.grads(kernel.reference, inputs, upstream)
        tokens, _, vocab = suite.sizes(case)
        for what, g, w, e in zip(suite.grad_names, got, want, eager, strict=True):
            assert g.dtype == dtype, (what, g.dtype)
            suite.check(what, g, w, e, seed, dtype, max(tokens, vocab))
        return inputs, upstream, got

    @pytest.mark.parametrize("dtype", suite.dtypes)
    @pytest.mark.parametrize("case", suite.cases)
    def test_matches_reference(monkeypatch, dtype, case):
        check_values(monkeypatch, dtype, case, blocked=False)

    @pytest.mark.parametrize("dtype", suite.dtypes)
    @pytest.mark.parametrize("case", grad_cases)
    def test_gradients_match_reference(monkeypatch, dtype, case):
        inputs, upstream, got = check_grads(monkeypatch, dtype, case, blocked=False)
        # One input at a time: the same values (the weight's alone on the interpreter).
        for i, name in enumerate(suite.grad_names):
            if ON_GPU or name == "dweight":
                index = {"dx": 0, "dweight": 1, "dbias": 3}[name]
                (alone,) = suite.grads(launcher, inputs, upstream, asked=(index,))
                torch.testing.assert_close(alone, got[i], rtol=0, atol=0)

    @pytest.mark.parametrize("dtype", suite.dtypes if ON_GPU else suite.dtypes[:1])
    def test_blocks_match_reference(monkeypatch, dtype):
        # Many blocks of tokens and columns, the last ones partial: the running max and
        # sums merged across blocks, dweight's rows summed over token blocks.
        check_values(monkeypatch, dtype, suite.cases[0], blocked=True)
        check_grads(monkeypatch, dtype, suite.cases[0], blocked=True)

    @pytest.mark.skipif(kernel.REDUCTION == "none", reason="a loss a token: no scalar")
    @pytest.mark.parametrize("blocked", [False, True])
    @pytest.mark.parametrize("dtype", suite.dtypes if ON_GPU else suite.dtypes[:1])
    def test_gradients_made_in_the_forward(monkeypatch, dtype, blocked):
        # The gradients of a scalar loss made in the forward, scaled by d_loss (and lse's
        # share added by the blocks) in the backward; blocked: 8 tokens a block, dweight
        # summed over them.
        monkeypatch.setattr(kernel, "GRADIENTS_IN_FORWARD", True)
        if blocked:
            rows = 8 * suite.sizes(suite.cases[0])[2] * dtype.itemsize
            monkeypatch.setattr(kernel, "FORWARD_GRADS_BLOCK_BYTES", rows)
        check_grads(monkeypatch, dtype, suite.cases[0], blocked=False)
        if dtype == torch.float16:  # an upstream 1's gradients underflow: made in the backward
            assert kernel._HEAD.last["path"] == "blocks", kernel._HEAD.last
            return
        assert kernel._HEAD.last["path"] == "gradients in the forward", kernel._HEAD.last
        assert (kernel._HEAD.last["blocks"] > 1) == blocked, kernel._HEAD.last

    @pytest.mark.skipif(kernel.REDUCTION == "none", reason="a loss a token: no scalar")
    def test_a_second_backward_recomputes(monkeypatch):
        # retain_graph: the gradients made in the forward were scaled in place by the
        # first backward; the second makes them again from the blocks.
        monkeypatch.setattr(kernel, "GRADIENTS_IN_FORWARD", True)
        inputs = suite.make_inputs(suite.cases[0], suite.dtypes[-1], new_seed())
        leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
        loss = suite.outputs(launcher, leaves)[0]
        first = torch.autograd.grad(loss * 2, leaves[:2], retain_graph=True)
        second = torch.autograd.grad(loss * 2, leaves[:2])
        for a, b in zip(first, second, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    tests += [test_matches_reference, test_gradients_match_reference, test_blocks_match_reference]
    tests += [test_gradients_made_in_the_forward, test_a_second_backward_recomputes]
    return tests


def edge_tests(suite):
    kernel, launcher, tests = suite.kernel, suite.launcher, []
    case = suite.cases[0]

    @pytest.mark.parametrize("dtype", suite.dtypes[-1:])
    def test_every_token_ignored(dtype):
        seed = new_seed()
        inputs = suite.make_inputs(case, dtype, seed)
        inputs[2] = torch.full_like(inputs[2], kernel.IGNORE_INDEX)
        want = suite.outputs(
            kernel.reference, [t.double() if t.is_floating_point() else t for t in inputs]
        )
        got = suite.outputs(launcher, inputs)
        # mean: 0 / 0 = NaN, as F.cross_entropy; sum: 0; none: zeros. lse is still each token's.
        assert torch.equal(torch.isnan(got[0]), torch.isnan(want[0])), (got[0], want[0])
        assert torch.equal(got[0].nan_to_num(), want[0].nan_to_num().float()), seed
        leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
        out = suite.outputs(launcher, leaves)[0]
        out.sum().backward()
        for t in leaves:
            if t.is_floating_point():
                assert not t.grad.isnan().any() and not t.grad.any(), seed

    @pytest.mark.parametrize("dtype", suite.dtypes)
    def test_label_out_of_range_gives_nan(dtype):
        # Its loss is NaN, and so are the gradients it reaches (a loss scaler's check
        # skips the step, as for the loss); each dtype, as bf16 makes its gradients in the
        # forward and fp16 in the backward.
        seed = new_seed()
        inputs = suite.make_inputs(case, dtype, seed, ignored=0.0)
        vocab = suite.sizes(case)[2]
        inputs[2][0] = vocab  # one past the end: F.cross_entropy would raise
        leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
        losses = suite.outputs(launcher, leaves)[0]
        assert torch.isnan(losses).any(), losses
        losses.sum().backward()
        for t in leaves:
            if t.is_floating_point():
                assert t.grad.isnan().any(), seed

    def test_leading_dims_and_int32_labels():
        seed = new_seed()
        dtype = suite.dtypes[-1]
        inputs = suite.make_inputs(case, dtype, seed)
        tokens = inputs[0].shape[0]
        if tokens % 2:
            inputs = [inputs[0][:-1], inputs[1], inputs[2][:-1], *inputs[3:]]
            tokens -= 1
        flat = suite.outputs(launcher, inputs)
        shaped = [
            inputs[0].view(2, tokens // 2, -1),
            inputs[1],
            inputs[2].view(2, -1).int(),
            *inputs[3:],
        ]
        got = suite.outputs(launcher, shaped)
        for f, g in zip(flat, got, strict=True):
            assert g.shape == (f.shape if f.dim() == 0 else (2, tokens // 2)), g.shape
            torch.testing.assert_close(g.flatten(), f.flatten(), rtol=0, atol=0)
        # The reference (the fallback without a GPU) takes them too: F.cross_entropy
        # wants int64 labels.
        plain = suite.outputs(kernel.reference, inputs)
        for f, g in zip(plain, suite.outputs(kernel.reference, shaped), strict=True):
            torch.testing.assert_close(g.flatten(), f.flatten(), rtol=0, atol=0)

    def test_strided_labels_and_bias():
        # Every other token of a longer batch: the labels (and bias) strided views.
        dtype = suite.dtypes[-1]
        seed = new_seed()
        inputs = suite.make_inputs(case, dtype, seed)
        tokens = inputs[0].shape[0]
        wide = suite.make_inputs((2 * tokens, *case[1:]), dtype, seed + 7)
        wide[2][::2] = inputs[2]
        strided = [inputs[0], inputs[1], wide[2][::2]]
        if suite.bias:
            spread = torch.zeros(2 * inputs[3].shape[0], dtype=dtype, device=DEVICE)
            spread[::2] = inputs[3]
            strided.append(spread[::2])
        for g, w in zip(
            suite.outputs(launcher, strided), suite.outputs(launcher, inputs), strict=True
        ):
            torch.testing.assert_close(g, w, rtol=0, atol=0)

    def test_rejects_bad_inputs():
        dtype = suite.dtypes[-1]
        x, weight, labels, *rest = suite.make_inputs(case, dtype, new_seed())
        n_x, n_w, n_y, *n_b = kernel.INPUT_NAMES
        narrower = weight[:, :-1] if kernel.WEIGHT_TRANSPOSED else weight[:-1]
        bad = [
            ((x, weight, labels.float(), *rest), TypeError, n_y),
            ((x, narrower, labels, *rest), ValueError, n_w),
            ((x, weight, labels[:-1], *rest), ValueError, n_y),
            ((x, weight.double(), labels, *rest), TypeError, n_w),
            ((x.double(), weight.double(), labels, *[r.double() for r in rest]), TypeError, n_x),
        ]
        if suite.bias:
            bad.append(((x, weight, labels, rest[0][:-1]), ValueError, n_b[0]))
        for args, error, named in bad:
            with pytest.raises(error, match=f"^{named} "):
                launcher(*args)

    def test_no_tokens():
        # Zero tokens: the mean is 0 / 0 (NaN, as F.cross_entropy), every gradient 0.
        dtype = suite.dtypes[-1]
        x, weight, labels, *rest = suite.make_inputs(case, dtype, new_seed())
        inputs = [x[:0], weight, labels[:0], *rest]
        want = suite.outputs(kernel.reference, inputs)
        leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
        got = suite.outputs(launcher, leaves)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and torch.equal(g.isnan(), w.isnan()), (g, w)
        (got[0].nan_to_num().sum() + sum(o.sum() for o in got[1:])).backward()
        assert all(not t.grad.any() for t in leaves if t.is_floating_point())

    def test_inside_torch_compile():
        # The launcher is a graph break: the model around it compiles, the head runs
        # eagerly between the graphs, gradients flow through.
        torch._dynamo.reset()
        dtype = suite.dtypes[-1]
        inputs = suite.make_inputs(case, dtype, new_seed())
        leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]

        def step(x, *rest):
            out = suite.outputs(launcher, [x * 2.0, *rest])
            return sum(o.float().sum() for o in out) * 0.5

        want = step(*leaves)
        got = torch.compile(step, backend="eager")(*leaves)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        (grad,) = torch.autograd.grad(got, leaves[:1])
        (eager_grad,) = torch.autograd.grad(step(*leaves), leaves[:1])
        torch.testing.assert_close(grad, eager_grad, rtol=0, atol=0)

    tests += [
        test_every_token_ignored,
        test_label_out_of_range_gives_nan,
        test_inside_torch_compile,
    ]
    tests += [
        test_leading_dims_and_int32_labels,
        test_strided_labels_and_bias,
        test_rejects_bad_inputs,
        test_no_tokens,
    ]
    return tests
