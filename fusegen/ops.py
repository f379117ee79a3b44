"""The op registry: every chain op, in one place.

An elementwise op says how it reads in the spec (its parameters), how it is computed
in Triton (fp32, inside the kernel's epilogue), how the PyTorch reference computes it,
and how an error already in its input grows through it (for the tests' derived
tolerance, docs/tolerances.md). Adding an activation is one `Activation(...)` entry
below plus its row in tests/test_ops.py.

The structural ops (`input`, `matmul`, `gate`) shape the kernel rather than compute a
value elementwise; they are named here so that "unknown op" errors and the JSON Schema
know them, and lowered by `fusegen.lower.kernels`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegen import dtypes


@dataclass(frozen=True)
class Param:
    name: str  # as the spec writes it
    default: float | None  # None: required
    arg: str = ""  # the Triton helper's argument, where `name` would shadow a builtin

    @property
    def helper_arg(self) -> str:
        return self.arg or self.name


@dataclass(frozen=True)
class Activation:
    """f(x), applied elementwise in fp32."""

    name: str
    math: str  # for docstrings, in x
    triton: tuple[str, ...]  # body lines of a @triton.jit helper `_<name>(x, *params)`
    # Reference expression in `v` (torch, F = torch.nn.functional); `{param}` is replaced
    # by the parameter's value.
    torch: str
    # A bound on |f'| over [v - e, v + e]: a number, or an expression in v and e ({param}
    # as above).
    lipschitz: str
    params: tuple[Param, ...] = ()
    # Error of the fp32 implementation: transcendental functions (exp, erf) are good to
    # a few ulp; piecewise-linear ones are exact up to one rounding.
    transcendental: bool = True
    why: str = ""  # a comment for the Triton helper, when its form is not the obvious one
    # The form on the GPU's tanh.approx instruction (`_tanh_approx`), for kernels whose
    # spec keeps `fast_tanh` (see fast_tanh_used): body lines, and a bound on how far its
    # tanh's error (under TANH_APPROX of tanh's value) moves the result, as a multiple of
    # TANH_APPROX, in v (the input) and y (the exact result).
    fast: tuple[str, ...] = ()
    fast_error: str = ""
    fast_why: str = ""
    # The derivative f'(x): body lines of a @triton.jit helper `_<name>_grad(x, *params)`,
    # and the same in torch, in `v` (as `torch`). The backward kernels multiply the
    # incoming gradient by it; tests/test_ops.py checks both against autograd. Where f is
    # not differentiable (relu at 0, clamp at its bounds) they take PyTorch's side.
    grad: tuple[str, ...] = ()
    grad_torch: str = ""


# NaN in, NaN out, as in PyTorch: the GPU's plain max and min return the other operand,
# which would hide a diverged value (and give softplus(NaN) = 20 through its overflow guard).
KEEPS_NAN = "propagate_nan: a NaN stays NaN, as in PyTorch"


def nan_max(a: str, b: str) -> str:
    return f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


def nan_min(a: str, b: str) -> str:
    return f"tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


ACTIVATIONS: dict[str, Activation] = {
    a.name: a
    for a in [
        Activation(
            "relu",
            "max(x, 0)",
            (f"return {nan_max('x', '0.0')}",),
            "torch.relu({v})",
            "1.0",
            transcendental=False,
            why=KEEPS_NAN,
            grad=("return tl.where(x > 0.0, 1.0, 0.0)",),
            grad_torch="({v} > 0).to({v}.dtype)",
        ),
        Activation(
            "leaky_relu",
            "x if x >= 0 else alpha * x",
            ("return tl.where(x >= 0.0, x, x * alpha)",),
            "F.leaky_relu({v}, {alpha})",
            "max(1.0, abs({alpha}))",
            params=(Param("alpha", 0.01),),
            transcendental=False,
            grad=("return tl.where(x > 0.0, 1.0, alpha)",),
            grad_torch="torch.where({v} > 0, {v}.new_tensor(1.0), {v}.new_tensor({alpha}))",
        ),
        Activation(
            "gelu",
            "0.5 * x * (1 + erf(x / sqrt(2)))",
            ("return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))",),
            "F.gelu({v})",
            "1.13",
            grad=(
                (
                    "return 0.5 * (1.0 + tl.erf(x * 0.7071067811865476)) + x * "
                    "0.3989422804014327 * tl.exp(-0.5 * x * x)"
                ),
            ),
            grad_torch=(
                "0.5 * (1 + torch.erf({v} * 0.7071067811865476)) + {v} * "
                "0.3989422804014327 * torch.exp(-0.5 * {v} * {v})"
            ),
        ),
        Activation(
            "gelu_tanh",
            "0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))",
            ("return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))",),
            'F.gelu({v}, approximate="tanh")',
            "1.13",
            why="0.5 * (1 + tanh(z)) == sigmoid(2 * z): one exp, and no tanh, which Triton lacks",
            fast=(
                "h = 0.5 * x",
                "return h + h * _tanh_approx(0.7978845608028654 * (x + 0.044715 * x * x * x))",
            ),
            fast_error="0.5 * {v}.abs()",
            fast_why="h * (1 + tanh(z)), h = x / 2: one instruction where sigmoid takes two",
            grad=(
                "s = tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))",
                "return s + x * s * (1.0 - s) * 1.5957691216057308 * (1.0 + 0.134145 * x * x)",
            ),
            grad_torch=(
                "(lambda s: s + {v} * s * (1 - s) * 1.5957691216057308 * (1 + 0.134145 "
                "* {v} * {v}))(torch.sigmoid(1.5957691216057308 * ({v} + 0.044715 * "
                "{v} ** 3)))"
            ),
        ),
        Activation(
            "silu",
            "x * sigmoid(x)",
            ("return x * tl.sigmoid(x)",),
            "F.silu({v})",
            "1.1",
            fast=("h = 0.5 * x", "return h + h * _tanh_approx(h)"),
            fast_error="0.5 * {v}.abs()",
            fast_why="x * sigmoid(x) == h * (1 + tanh(h)), h = x / 2",
            grad=("s = tl.sigmoid(x)", "return s * (1.0 + x * (1.0 - s))"),
            grad_torch="torch.sigmoid({v}) * (1 + {v} * (1 - torch.sigmoid({v})))",
        ),
        Activation(
            "sigmoid",
            "1 / (1 + exp(-x))",
            ("return tl.sigmoid(x)",),
            "torch.sigmoid({v})",
            "0.25",
            fast=("return 0.5 + 0.5 * _tanh_approx(0.5 * x)",),
            fast_error="0.5",
            fast_why="sigmoid(x) == (1 + tanh(x / 2)) / 2",
            grad=("s = tl.sigmoid(x)", "return s * (1.0 - s)"),
            grad_torch="torch.sigmoid({v}) * (1 - torch.sigmoid({v}))",
        ),
        Activation(
            "tanh",
            "tanh(x)",
            ("return 2.0 * tl.sigmoid(2.0 * x) - 1.0",),
            "torch.tanh({v})",
            "1.0",
            why="tanh(x) == 2 * sigmoid(2 * x) - 1; Triton has no portable tanh",
            fast=("return _tanh_approx(x)",),
            fast_error="y.abs()",
            grad=("t = 2.0 * tl.sigmoid(2.0 * x) - 1.0", "return 1.0 - t * t"),
            grad_torch="1 - torch.tanh({v}) ** 2",
        ),
        Activation(
            "quick_gelu",
            "x * sigmoid(1.702 * x)",
            ("return x * tl.sigmoid(1.702 * x)",),
            "{v} * torch.sigmoid(1.702 * {v})",
            "1.1",
            fast=("h = 0.5 * x", "return h + h * _tanh_approx(0.851 * x)"),
            fast_error="0.5 * {v}.abs()",
            fast_why="x * sigmoid(1.702 * x) == h * (1 + tanh(0.851 * x)), h = x / 2",
            grad=("s = tl.sigmoid(1.702 * x)", "return s + 1.702 * x * s * (1.0 - s)"),
            grad_torch=(
                "torch.sigmoid(1.702 * {v}) * (1 + 1.702 * {v} * (1 - "
                "torch.sigmoid(1.702 * {v})))"
            ),
        ),
        Activation(
            "softplus",
            "log(1 + exp(beta * x)) / beta, or x where beta * x > threshold",
            (
                "z = x * beta",
                "return tl.where("
                f"z > threshold, x, tl.log(1.0 + tl.exp({nan_min('z', 'threshold')})) / beta)",
            ),
            "F.softplus({v}, {beta}, {threshold})",
            "1.0",
            params=(Param("beta", 1.0), Param("threshold", 20.0)),
            why="exp is clamped at the threshold so that the branch not taken cannot overflow",
            grad=("z = x * beta", "return tl.where(z > threshold, 1.0, tl.sigmoid(z))"),
            grad_torch=(
                "torch.where({v} * {beta} > {threshold}, 1.0, torch.sigmoid({v} * "
                "{beta})).to({v}.dtype)"
            ),
        ),
        Activation(
            "mish",
            "x * tanh(softplus(x))",
            (
                f"softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp({nan_min('x', '20.0')})))",
                "return x * (2.0 * tl.sigmoid(2.0 * softplus) - 1.0)",
            ),
            "F.mish({v})",
            "1.1",
            why="tanh(s) == 2 * sigmoid(2 * s) - 1; exp is clamped as in softplus",
            fast=(
                f"softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp({nan_min('x', '20.0')})))",
                "return x * _tanh_approx(softplus)",
            ),
            fast_error="{v}.abs()",
            grad=(
                f"softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp({nan_min('x', '20.0')})))",
                "t = 2.0 * tl.sigmoid(2.0 * softplus) - 1.0",
                "return t + x * (1.0 - t * t) * tl.sigmoid(x)",
            ),
            grad_torch=(
                "torch.tanh(F.softplus({v})) + {v} * (1 - torch.tanh(F.softplus({v})) "
                "** 2) * torch.sigmoid({v})"
            ),
        ),
        Activation(
            "elu",
            "x if x > 0 else alpha * (exp(x) - 1)",
            (f"return tl.where(x > 0.0, x, alpha * (tl.exp({nan_min('x', '0.0')}) - 1.0))",),
            "F.elu({v}, {alpha})",
            "max(1.0, abs({alpha}))",
            params=(Param("alpha", 1.0),),
            grad=(f"return tl.where(x > 0.0, 1.0, alpha * tl.exp({nan_min('x', '0.0')}))",),
            grad_torch=(
                "torch.where({v} > 0, 1.0, {alpha} * " "torch.exp({v}.clamp(max=0))).to({v}.dtype)"
            ),
        ),
        Activation(
            "hardsigmoid",
            "clamp(x / 6 + 0.5, 0, 1)",
            (
                f"h = {nan_max('x / 6.0 + 0.5', '0.0')}",
                f"return {nan_min('h', '1.0')}",
            ),
            "F.hardsigmoid({v})",
            "1.0 / 6.0",
            transcendental=False,
            why=KEEPS_NAN,
            grad=("return tl.where((x > -3.0) & (x < 3.0), 1.0 / 6.0, 0.0)",),
            grad_torch="(({v} > -3) & ({v} < 3)).to({v}.dtype) / 6",
        ),
        Activation(
            "hardswish",
            "x * clamp(x / 6 + 0.5, 0, 1)",
            (
                f"h = {nan_max('x / 6.0 + 0.5', '0.0')}",
                f"return x * {nan_min('h', '1.0')}",
            ),
            "F.hardswish({v})",
            "1.5",
            transcendental=False,
            why=KEEPS_NAN,
            grad=("return tl.where(x <= -3.0, 0.0, tl.where(x < 3.0, x / 3.0 + 0.5, 1.0))",),
            grad_torch=(
                "torch.where({v} <= -3, 0.0, torch.where({v} < 3, {v} / 3 + 0.5, "
                "1.0)).to({v}.dtype)"
            ),
        ),
        Activation(
            "relu_squared",
            "max(x, 0) ** 2",
            (f"r = {nan_max('x', '0.0')}", "return r * r"),
            "torch.relu({v}).square()",
            "2.0 * ({v}.abs() + {e})",
            transcendental=False,
            why=KEEPS_NAN,
            grad=(f"return 2.0 * {nan_max('x', '0.0')}",),
            grad_torch="2 * torch.relu({v})",
        ),
        Activation(
            "square",
            "x * x",
            ("return x * x",),
            "{v}.square()",
            "2.0 * ({v}.abs() + {e})",
            transcendental=False,
            grad=("return 2.0 * x",),
            grad_torch="2 * {v}",
        ),
        Activation(
            "abs",
            "|x|",
            ("return tl.abs(x)",),
            "{v}.abs()",
            "1.0",
            transcendental=False,
            grad=("return tl.where(x > 0.0, 1.0, tl.where(x < 0.0, -1.0, 0.0))",),
            grad_torch="torch.sign({v})",
        ),
        Activation(
            "neg",
            "-x",
            ("return -x",),
            "-{v}",
            "1.0",
            transcendental=False,
            grad=("return tl.full(x.shape, -1.0, tl.float32)",),
            grad_torch="-torch.ones_like({v})",
        ),
        Activation(
            "exp",
            "exp(x)",
            ("return tl.exp(x)",),
            "torch.exp({v})",
            "torch.exp({v} + {e})",
            grad=("return tl.exp(x)",),
            grad_torch="torch.exp({v})",
        ),
        Activation(
            "clamp",
            "min(max(x, min), max)",
            (f"return {nan_min(nan_max('x', 'lo'), 'hi')}",),
            "{v}.clamp({min}, {max})",
            "1.0",
            params=(Param("min", None, "lo"), Param("max", None, "hi")),
            transcendental=False,
            why=KEEPS_NAN,
            grad=("return tl.where((x >= lo) & (x <= hi), 1.0, 0.0)",),
            grad_torch="(({v} >= {min}) & ({v} <= {max})).to({v}.dtype)",
        ),
    ]
}

# Relative error of the GPU's tanh.approx.f32, as the fast forms' tolerance allows it:
# twice the PTX ISA's 2**-10.987 (measured on an H200: see docs/tolerances.md).
TANH_APPROX_EXPONENT = -10
TANH_APPROX = 2.0**TANH_APPROX_EXPONENT


def fast_tanh_used(steps) -> bool:
    """Whether any of these steps has a form on tanh.approx."""
    return any(getattr(s, "op", None) in ACTIVATIONS and ACTIVATIONS[s.op].fast for s in steps)


# Other names for the same activations (Hugging Face configs use several of these).
# The ops whose derivative jumps (relu at 0, clamp at its bounds, a row's max where its
# largest two swap): there the rounding of a saved value can flip an element to the other
# side, and the gradient tests let a few elements miss (runtime/equivalence.py). Every
# other chain's gradient is checked at every element. tests/test_ops.py finds the jumps
# numerically and checks this set against them.
KINKED = frozenset({"relu", "leaky_relu", "elu", "hardsigmoid", "hardswish", "abs", "clamp", "max"})

ALIASES = {
    "swish": "silu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu2": "relu_squared",
    "hard_swish": "hardswish",
    "hard_sigmoid": "hardsigmoid",
}

# `gelu: tanh` and `gelu: {approximate: tanh}` select the tanh form, as in PyTorch.
GELU_APPROXIMATE = {"none": "gelu", "tanh": "gelu_tanh"}


@dataclass(frozen=True)
class Binary:
    """v (op) operand, where the operand is an input tensor (broadcast over the value's
    rows, columns or neither) or a constant."""

    name: str
    symbol: str
    summary: str
    # Error bound after the op, in {e} (the bound before), {y} (the value after) and the
    # operand: {r} a tensor (exact: inputs are exact in fp32), or {c} a constant (which
    # the kernel rounds to fp32).
    bound_tensor: str
    bound_constant: str
    # The derivatives, in g (the incoming gradient), v (the value before the op) and r
    # (the operand, a tensor or the constant), as Triton and torch write them alike: the
    # gradient passed on to the value, and the operand's (a tensor's: summed over what it
    # broadcasts along).
    grad_value: str = "g"
    grad_operand: str = "g"


BINARY: dict[str, Binary] = {
    b.name: b
    for b in [
        Binary(
            "add",
            "+",
            "add a tensor (a residual, say) or a constant",
            "{e} + U32 * {y}.abs()",
            "{e} + U32 * ({y}.abs() + abs({c}))",
        ),
        Binary(
            "sub",
            "-",
            "subtract a tensor or a constant",
            "{e} + U32 * {y}.abs()",
            "{e} + U32 * ({y}.abs() + abs({c}))",
            grad_operand="-g",
        ),
        Binary(
            "mul",
            "*",
            "multiply by a tensor or a constant",
            "{e} * {r}.abs() + U32 * {y}.abs()",
            "{e} * abs({c}) + 2 * U32 * {y}.abs()",
            grad_value="g * r",
            grad_operand="g * v",
        ),
        Binary(
            "div",
            "/",
            "divide by a tensor or a constant",
            "{e} / {r}.abs() + 4 * U32 * {y}.abs()",
            "{e} / abs({c}) + 4 * U32 * {y}.abs()",
            grad_value="g / r",
            grad_operand="-g * v / (r * r)",
        ),
    ]
}


@dataclass(frozen=True)
class RowOp:
    """An op over each row of the value (its last dim): a normalization, a softmax, or a
    reduction that turns the [rows, cols] value into one number per row."""

    name: str
    summary: str
    params: tuple[Param, ...]  # numbers
    operands: tuple[str, ...]  # roles of optional input tensors: "mask", "weight", "bias"
    reduces: bool  # the value becomes [rows]


ROW_OPS: dict[str, RowOp] = {
    r.name: r
    for r in [
        RowOp(
            "softmax",
            "softmax over each row of x * scale + mask "
            "(mask: an additive [rows, cols] or [cols] input)",
            (Param("scale", 1.0),),
            ("mask",),
            False,
        ),
        RowOp(
            "log_softmax",
            "log of the softmax over each row of x * scale + mask",
            (Param("scale", 1.0),),
            ("mask",),
            False,
        ),
        RowOp(
            "rmsnorm",
            "x / sqrt(mean(x^2) + eps) * (offset + weight), per row (Gemma: offset 1)",
            (Param("eps", 1e-6), Param("offset", 0.0)),
            ("weight",),
            False,
        ),
        RowOp(
            "layernorm",
            "(x - mean) / sqrt(var + eps) * weight + bias, per row",
            (Param("eps", 1e-5),),
            ("weight", "bias"),
            False,
        ),
        RowOp("sum", "the sum of each row", (), (), True),
        RowOp("mean", "the mean of each row", (), (), True),
        RowOp("max", "the largest value of each row", (), (), True),
    ]
}


@dataclass(frozen=True)
class Structural:
    name: str
    summary: str


STRUCTURAL: dict[str, Structural] = {
    s.name: s
    for s in [
        Structural("input", "start an elementwise chain from an input tensor"),
        Structural(
            "matmul", "start the chain with a @ b (b may be NAME.T for an nn.Linear weight)"
        ),
        Structural(
            "gate",
            "multiply the chain by a second matmul on the same `a` (a GLU): "
            "one pass over a, two accumulators",
        ),
        Structural("bias", "add a row vector over the output's columns"),
        Structural("scale", "multiply by a constant"),
        Structural("cast", "the output's dtype (last step only; the chain computes in fp32)"),
        Structural(
            "output", "also return the value at this point as an extra output (before a row op)"
        ),
        Structural(
            "softcap",
            "c * tanh(value / c), a loss head's logits before its loss (Gemma 2: 30.0)",
        ),
        Structural(
            "quantize",
            "end an elementwise chain in fp8 values with a scale per row or group "
            "(last step only)",
        ),
        Structural(
            "cross_entropy",
            "end the chain in a loss over the matmul's columns (an LM head): labels, "
            "ignore_index, reduction, label_smoothing, z_loss, lse",
        ),
    ]
}

ALL_OPS: tuple[str, ...] = tuple(sorted({*ACTIVATIONS, *BINARY, *STRUCTURAL, *ROW_OPS}))
KNOWN_NAMES: tuple[str, ...] = tuple(sorted({*ALL_OPS, *ALIASES}))
ROW_ALIASES = {"rms_norm": "rmsnorm", "layer_norm": "layernorm", "amax": "max"}


def dtype_names() -> str:
    return ", ".join(dtypes.DTYPES)


# `matmul: x @ w.T`, the short form of `matmul: {a: x, b: w.T}`.
MATMUL_SHORTHAND = r"^\s*[A-Za-z_][A-Za-z0-9_]*(\.T)?\s*@\s*[A-Za-z_][A-Za-z0-9_]*(\.T)?\s*$"
