"""The op registry: each activation's PyTorch form against an independent formula, and
the derivative bounds the tests' tolerance relies on against the real derivatives."""

import math
import re

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from fusegen import ops  # noqa: E402

# Written from the definitions, not from the registry: x is a float64 tensor.
INDEPENDENT = {
    "relu": lambda x, p: torch.where(x > 0, x, 0.0),
    "leaky_relu": lambda x, p: torch.where(x >= 0, x, p["alpha"] * x),
    "gelu": lambda x, p: 0.5 * x * (1 + torch.special.erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x, p: 0.5
    * x
    * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x, p: x / (1 + torch.exp(-x)),
    "sigmoid": lambda x, p: 1 / (1 + torch.exp(-x)),
    "tanh": lambda x, p: (torch.exp(2 * x) - 1) / (torch.exp(2 * x) + 1),
    "quick_gelu": lambda x, p: x / (1 + torch.exp(-1.702 * x)),
    "softplus": lambda x, p: torch.where(
        p["beta"] * x > p["threshold"], x, torch.log1p(torch.exp(p["beta"] * x)) / p["beta"]
    ),
    "mish": lambda x, p: x * torch.tanh(torch.log1p(torch.exp(x))),
    "elu": lambda x, p: torch.where(x > 0, x, p["alpha"] * (torch.exp(x) - 1)),
    "hardsigmoid": lambda x, p: torch.clamp(x + 3, 0, 6) / 6,
    "hardswish": lambda x, p: x * torch.clamp(x + 3, 0, 6) / 6,
    "relu_squared": lambda x, p: torch.where(x > 0, x * x, 0.0),
    "square": lambda x, p: x * x,
    "abs": lambda x, p: torch.where(x < 0, -x, x),
    "neg": lambda x, p: 0 - x,
    "exp": lambda x, p: math.e**x,
    "clamp": lambda x, p: torch.minimum(
        torch.maximum(x, torch.tensor(p["min"])), torch.tensor(p["max"])
    ),
}
PARAMS = {
    "leaky_relu": {"alpha": 0.2},
    "softplus": {"beta": 2.0, "threshold": 15.0},
    "elu": {"alpha": 0.7},
    "clamp": {"min": -1.5, "max": 2.5},
}


def test_every_activation_has_an_independent_check():
    assert set(INDEPENDENT) == set(ops.ACTIVATIONS)


def torch_form(act, x, params):
    expr = act.torch.format(v="x", **{k: repr(float(v)) for k, v in params.items()})
    return eval(expr, {"torch": torch, "F": F, "x": x})  # noqa: S307 - the registry's own text


@pytest.mark.parametrize("name", sorted(ops.ACTIVATIONS))
def test_reference_form_matches_the_definition(name):
    act = ops.ACTIVATIONS[name]
    params = {p.name: PARAMS.get(name, {}).get(p.name, p.default) for p in act.params}
    x = torch.linspace(-12, 12, 4801, dtype=torch.float64)
    got = torch_form(act, x, params)
    expected = INDEPENDENT[name](x, params)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(ops.ACTIVATIONS))
def test_lipschitz_bound_holds(name):
    """|f(v + d) - f(v)| <= L(v, e) * |d| for every |d| <= e: the tolerance's premise."""
    act = ops.ACTIVATIONS[name]
    params = {p.name: PARAMS.get(name, {}).get(p.name, p.default) for p in act.params}
    literal = {k: repr(float(v)) for k, v in params.items()}
    v = torch.linspace(-10, 10, 2001, dtype=torch.float64)
    for e in (1e-3, 1e-1):
        bound = eval(
            act.lipschitz.format(v="v", e="e", **literal),
            {"torch": torch, "v": v, "e": e, "abs": abs, "max": max},
        )  # noqa: S307
        for d in torch.linspace(-e, e, 9, dtype=torch.float64):
            change = (torch_form(act, v + d, params) - torch_form(act, v, params)).abs()
            assert (change <= bound * abs(d) * (1 + 1e-9) + 1e-15).all(), (name, e, float(d))


def test_params_and_aliases_are_consistent():
    for act in ops.ACTIVATIONS.values():
        helper_args = [p.helper_arg for p in act.params]
        assert len(set(helper_args)) == len(helper_args)
        body = "\n".join(act.triton)
        for arg in helper_args:
            assert arg in body, (act.name, arg)
    for alias, target in ops.ALIASES.items():
        assert target in ops.ACTIVATIONS and alias not in ops.ALL_OPS


def test_binary_bounds_name_their_operands():
    for b in ops.BINARY.values():
        assert "{r}" in b.bound_tensor or b.name in ("add", "sub")
        assert "{c}" in b.bound_constant


class _Tl:
    """The few triton.language functions the fast forms use, on float64 torch tensors."""

    where = staticmethod(torch.where)
    log = staticmethod(torch.log)
    exp = staticmethod(torch.exp)

    class PropagateNan:
        ALL = "all"

    @staticmethod
    def minimum(a, b, propagate_nan=None):
        return torch.clamp(a, max=b)  # torch.clamp keeps NaN, as propagate_nan=ALL


def fast_form(act, tanh):
    """The activation's tanh.approx form as a Python function, with `tanh` standing in
    for the GPU instruction."""
    source = "def f(x):\n" + "".join(f"    {line}\n" for line in act.fast)
    namespace = {"tl": _Tl, "_tanh_approx": tanh}
    exec(source, namespace)  # noqa: S102 - the registry's own text
    return namespace["f"]


FAST = sorted(name for name, act in ops.ACTIVATIONS.items() if act.fast)


def test_activations_keep_nan_through_min_and_max():
    """Every tl.minimum / tl.maximum in an activation's forward, fast form or derivative
    keeps a NaN (the GPU's plain min/max returns the other operand: relu(NaN) would be 0,
    softplus(NaN) 20). The interpreter's min/max keep NaN either way, so only the text
    can show it."""
    calls = 0
    for act in ops.ACTIVATIONS.values():
        for line in (*act.triton, *act.fast, *act.grad):
            for call in re.finditer(r"tl\.(minimum|maximum)\(", line):
                calls += 1
                rest = line[call.end() :]
                depth, end = 1, 0
                while depth:
                    depth += {"(": 1, ")": -1}.get(rest[end], 0)
                    end += 1
                assert "propagate_nan=tl.PropagateNan.ALL" in rest[:end], (act.name, line)
    assert calls >= 10


def test_the_tanh_and_sigmoid_activations_have_fast_forms():
    assert FAST == ["gelu_tanh", "mish", "quick_gelu", "sigmoid", "silu", "tanh"]
    assert all(bool(act.fast) == bool(act.fast_error) for act in ops.ACTIVATIONS.values())


@pytest.mark.parametrize("name", FAST)
def test_fast_form_matches_the_definition(name):
    act = ops.ACTIVATIONS[name]
    x = torch.linspace(-30, 30, 12001, dtype=torch.float64)
    got = fast_form(act, torch.tanh)(x)
    torch.testing.assert_close(got, INDEPENDENT[name](x, {}), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", FAST)
def test_fast_error_bound_holds(name):
    """A tanh off by up to TANH_APPROX of its value moves the result by at most
    TANH_APPROX * fast_error: the generated tests' allowance for it."""
    act = ops.ACTIVATIONS[name]
    v = torch.linspace(-30, 30, 12001, dtype=torch.float64)
    y = fast_form(act, torch.tanh)(v)  # the exact value (see the test above)
    allowed = ops.TANH_APPROX * eval(act.fast_error.format(v="v"), {"v": v, "y": y})  # noqa: S307
    for rel in (-ops.TANH_APPROX, ops.TANH_APPROX):
        moved = fast_form(act, lambda z, rel=rel: torch.tanh(z) * (1 + rel))(v)
        assert ((moved - y).abs() <= allowed * (1 + 1e-9) + 1e-300).all()


class _TlGrad(_Tl):
    """More of triton.language, for the derivative helpers (float64 torch tensors)."""

    erf = staticmethod(torch.special.erf)
    sigmoid = staticmethod(torch.sigmoid)
    float32 = torch.float64

    @staticmethod
    def maximum(a, b, propagate_nan=None):
        return torch.clamp(a, min=b)

    @staticmethod
    def full(shape, value, dtype):
        return torch.full(shape, value, dtype=dtype)

    @staticmethod
    def where(cond, a, b):
        # Python numbers as float64 (torch.where would take them as float32).
        return torch.where(cond, *(torch.as_tensor(v, dtype=torch.float64) for v in (a, b)))


def grad_form(act, params):
    """The activation's Triton derivative helper as a Python function on float64."""
    names = ["x"] + [p.helper_arg for p in act.params]
    source = f"def f({', '.join(names)}):\n" + "".join(f"    {line}\n" for line in act.grad)
    namespace = {"tl": _TlGrad}
    exec(source, namespace)  # noqa: S102 - the registry's own text
    values = [params.get(p.name, p.default) for p in act.params]
    return lambda x: namespace["f"](x, *values)


@pytest.mark.parametrize("name", sorted(ops.ACTIVATIONS))
def test_derivatives_match_autograd(name):
    """Both derivative forms (the Triton helper's and torch's) equal autograd's derivative
    of the independent definition, away from kinks, and PyTorch's own backward at them
    (relu at 0, clamp at its bounds, hardswish at +-3), which the tests compare against."""
    act = ops.ACTIVATIONS[name]
    params = PARAMS.get(name, {})
    x = torch.linspace(-8, 8, 16001, dtype=torch.float64)
    x = torch.cat([x, torch.tensor([-3.0, 0.0, 3.0, -1.5, 2.5], dtype=torch.float64)])
    leaf = x.clone().requires_grad_()
    (independent,) = torch.autograd.grad(INDEPENDENT[name](leaf, params).sum(), [leaf])
    leaf = x.clone().requires_grad_()
    (pytorch,) = torch.autograd.grad(torch_form(act, leaf, params).sum(), [leaf])
    expr = act.grad_torch.format(v="x", **{k: repr(float(v)) for k, v in params.items()})
    registry_torch = eval(expr, {"torch": torch, "F": F, "x": x})  # noqa: S307
    registry_triton = grad_form(act, params)(x)
    kinks = {0.0, -3.0, 3.0, params.get("min"), params.get("max")}
    smooth = ~torch.isin(x, torch.tensor([k for k in kinks if k is not None], dtype=x.dtype))
    for form in (registry_torch, registry_triton):
        form = torch.as_tensor(form, dtype=torch.float64).expand_as(x)
        torch.testing.assert_close(form[smooth], independent[smooth], rtol=1e-9, atol=1e-9)
        # PyTorch's float64 backwards hold some constants in fp32 (hardsigmoid's 1/6).
        torch.testing.assert_close(form, pytorch, rtol=1e-7, atol=1e-9)


def test_kinked_names_the_activations_whose_derivative_jumps():
    # A jump between neighbours 1e-4 apart: a smooth derivative moves by far less, for
    # its size (exp's by 1e-4 of itself). softplus's jump at its threshold (1 -
    # sigmoid(20), 2e-9) is not one; elu's is where alpha is not 1.
    x = torch.linspace(-8, 8, 160001, dtype=torch.float64)
    jumps = set()
    for name, act in ops.ACTIVATIONS.items():
        params = {**PARAMS.get(name, {}), **({"alpha": 0.5} if name == "elu" else {})}
        grad = torch.as_tensor(grad_form(act, params)(x), dtype=torch.float64).expand_as(x)
        if (grad.diff().abs() > 1e-2 * (1 + grad[1:].abs())).any():
            jumps.add(name)
    assert jumps == ops.KINKED & set(ops.ACTIVATIONS)
    assert ops.KINKED - set(ops.ACTIVATIONS) == {"max"}  # the row op: its argmax swaps


def test_binary_derivatives():
    """add, sub, mul, div: the value's and the operand's gradient, against autograd."""
    generator = torch.Generator().manual_seed(0)
    v, r, g = (torch.randn(50, generator=generator, dtype=torch.float64) for _ in range(3))
    r = r.sign() * (0.5 + r.abs())
    for b in ops.BINARY.values():
        leaves = [v.clone().requires_grad_(), r.clone().requires_grad_()]
        forward = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
        dv, dr = torch.autograd.grad(forward[b.name](*leaves), leaves, g)
        scope = {"g": g, "v": v, "r": r}
        torch.testing.assert_close(eval(b.grad_value, scope), dv)  # noqa: S307
        torch.testing.assert_close(eval(b.grad_operand, scope), dr)  # noqa: S307
