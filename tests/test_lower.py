"""Spec -> IR: names resolved, defaults filled, meaning checked."""

import re

import pytest

from conftest import ROOT
from fusegen import build, configs
from fusegen.spec import source
from fusegen.errors import SpecErrors
from fusegen.ir import Gate, RowStep, Step
from fusegen.lower.kernels import lower_file

MLP = """
kernels:
  - name: k
    dims: {{M: dynamic, K: 64, N: 128}}
    inputs: {{{inputs}}}
    chain:
{steps}
"""
SHAPES = {
    "x": "[M, K]",
    "x2": "[M, K]",
    "w": "[N, K]",
    "bv": "[N]",
    "res": "[M, N]",
    "cv": "[M]",
    "w2": "[N, K]",
}


def lower(write_spec, text):
    return lower_file(source.load(write_spec(text)))


def errors(write_spec, text):
    with pytest.raises(SpecErrors) as exc:
        lower(write_spec, text)
    return [e.message for e in exc.value.errors]


def mlp(steps):
    """The text of a kernel whose chain is `steps`, declaring just the inputs they use."""
    text = "\n".join(f"      - {s}" for s in steps)
    used = [name for name in SHAPES if re.search(rf"\b{name}\b", text)]
    return MLP.format(inputs=", ".join(f"{n}: {SHAPES[n]}" for n in used), steps=text)


def chain(write_spec, *steps):
    """Lower a kernel whose chain is x @ w.T followed by `steps`."""
    return lower(write_spec, mlp(["matmul: {a: x, b: w.T}", *steps]))[0]


def test_examples_lower():
    loaded = build.load(build.collect([str(ROOT / "specs")]))
    names = [k.name for k in loaded.kernels]
    assert names == [
        "masked_softmax",
        "bert_intermediate",
        "bert_add_layernorm",
        "bias_gelu_residual",
        "llama3_attention",
        "llama32_1b_attention",
        "mistral_sliding_window",
        "gemma2_attention",
        "gpt2_mlp_up",
        "gpt2_attn_out",
        "llama_mlp_gate_up",
        "llama_add_rmsnorm",
        "llama_rmsnorm",
        "llama3_lm_head_loss",
        "gemma2_lm_head_loss",
        "scaled_lm_head_loss",
        "llama_mlp_int4",
        "linear_int8",
        "gelu_fp8_rowwise",
        "deepseek_mlp_fp8",
        "quantize_fp8_rowwise",
        "quantize_fp8_groups",
    ]
    by_name = {k.name: k for k in loaded.kernels}
    llama = by_name["llama_mlp_gate_up"]
    assert llama.kind == "matmul" and isinstance(llama.steps[-1], Gate)
    assert (llama.matmul.m, llama.matmul.k, llama.matmul.n) == ("M", "K", "N")
    assert llama.matmul.b_transposed and not llama.matmul.a_transposed
    assert [d.size for d in llama.dims] == [None, 4096, 14336]
    assert (
        llama.configs == configs.GATED_SPACE and llama.default_config == configs.DEFAULTS["gated"]
    )
    gpt2 = by_name["gpt2_mlp_up"]
    assert not gpt2.matmul.b_transposed  # Conv1D weights are [K, N]
    assert [t.batched for t in gpt2.inputs] == [True, False, False]
    assert by_name["bert_intermediate"].fallback_nonfinite == "reference"
    gemma = by_name["gemma2_attention"]
    assert (gemma.kind, gemma.group, gemma.softcap, gemma.scale) == ("attention", 2, 50.0, 0.0625)
    assert by_name["llama3_attention"].scale == 1 / 128**0.5


@pytest.mark.parametrize(
    "step, op, params",
    [
        ("gelu", "gelu", ()),
        ("gelu: tanh", "gelu_tanh", ()),
        ("gelu: {approximate: tanh}", "gelu_tanh", ()),
        ("gelu: {approximate: none}", "gelu", ()),
        ("gelu_tanh", "gelu_tanh", ()),
        ("gelu_new", "gelu_tanh", ()),
        ("swish", "silu", ()),
        ("leaky_relu", "leaky_relu", (("alpha", 0.01),)),
        ("leaky_relu: 0.2", "leaky_relu", (("alpha", 0.2),)),
        ("leaky_relu: {alpha: 0.2}", "leaky_relu", (("alpha", 0.2),)),
        ("softplus: {threshold: 10}", "softplus", (("beta", 1.0), ("threshold", 10.0))),
        ("clamp: {min: -1, max: 2}", "clamp", (("min", -1.0), ("max", 2.0))),
    ],
)
def test_activation_forms(write_spec, step, op, params):
    k = chain(write_spec, step)
    assert k.steps[0] == Step(op, params=params)


def test_broadcasts_and_constants(write_spec):
    k = chain(
        write_spec,
        "bias: bv",
        "add: res",
        "mul: cv",
        "sub: 1.5",
        "div: bv",
        "scale: 0.25",
        "gate: {matmul: {a: x, b: w2.T}}",
    )
    assert k.steps[:6] == (
        Step("bias", operand="bv", broadcast="row"),
        Step("add", operand="res", broadcast="full"),
        Step("mul", operand="cv", broadcast="col"),
        Step("sub", constant=1.5),
        Step("div", operand="bv", broadcast="row"),
        Step("scale", constant=0.25),
    )
    assert {t.name: t.batched for t in k.inputs} == {
        "x": True,
        "w": False,
        "bv": False,
        "res": True,
        "cv": True,
        "w2": False,
    }


def test_gate_with_bias_and_activation(write_spec):
    k = chain(
        write_spec, "silu", "gate: {matmul: {a: x, b: w2.T}, bias: bv, activation: {gelu: tanh}}"
    )
    gate = k.steps[1]
    assert gate.matmul.b == "w2"
    assert gate.steps == (Step("bias", operand="bv", broadcast="row"), Step("gelu_tanh"))


def test_cast_sets_the_output_dtype(write_spec):
    assert chain(write_spec, "relu", "cast: float32").out_dtype == "fp32"


def test_transposed_a_is_not_batched(write_spec):
    (k,) = lower(
        write_spec,
        """
        kernels:
          - name: k
            dims: {M: dynamic, K: 64, N: 32}
            inputs: {xt: [K, M], w: [K, N]}
            chain: [{matmul: {a: xt.T, b: w}}, relu]
        """,
    )
    assert k.matmul.a_transposed and (k.row, k.col) == ("M", "N")
    assert not k.inputs[0].batched


def test_dtype_aliases_and_pins(write_spec):
    (k,) = lower(
        write_spec,
        """
        kernels:
          - name: k
            dims: {M: dynamic, N: 32}
            dtypes: [bfloat16, half]
            inputs: {x: [M, N], b: {shape: [N], dtype: float32}}
            chain: [{input: x}, {bias: b}]
        """,
    )
    assert k.dtypes == ("bf16", "fp16")
    assert k.inputs[1].dtype == "fp32"


def test_partial_default_config_keeps_builtin_values(write_spec):
    (k,) = lower(
        write_spec,
        """
        kernels:
          - name: k
            dims: {M: dynamic, N: 1000}
            inputs: {x: [M, N]}
            chain: [{input: x}, relu]
            autotune:
              configs: [{BLOCK_M: 2, BLOCK_N: 512, num_warps: 4}]
              default: {BLOCK_N: 256}
        """,
    )
    assert [c.items() for c in k.configs] == [[("BLOCK_M", 2), ("BLOCK_N", 512), ("num_warps", 4)]]
    assert k.default_config.BLOCK_N == 256
    assert k.default_config.BLOCK_M == configs.DEFAULTS["elementwise"].BLOCK_M


def test_profiles_pick_from_the_builtin_space_and_static_dims_prune_it(write_spec):
    text = """
        kernels:
          - name: k
            dims: {M: dynamic, K: KSIZE, N: 4096}
            inputs: {x: [M, K], w: [N, K]}
            chain: [{matmul: {a: x, b: w.T}}, relu]
            autotune: {profile: PROFILE}
        """
    (training,) = lower(write_spec, text.replace("PROFILE", "training").replace("KSIZE", "4096"))
    (inference,) = lower(write_spec, text.replace("PROFILE", "inference").replace("KSIZE", "4096"))
    (general,) = lower(write_spec, text.replace("PROFILE", "general").replace("KSIZE", "4096"))
    assert training.configs and all(c.BLOCK_M >= 64 for c in training.configs)
    assert inference.configs and all(c.BLOCK_M <= 64 for c in inference.configs)
    assert max(c.num_stages for c in inference.configs) > max(c.num_stages for c in general.configs)
    assert inference.default_config.BLOCK_M < general.default_config.BLOCK_M
    assert set(general.configs) == set(configs.MATMUL_SPACE)
    (short_k,) = lower(write_spec, text.replace("PROFILE", "general").replace("KSIZE", "40"))
    assert short_k.configs and all(c.BLOCK_K <= 64 for c in short_k.configs)
    assert all(c.BLOCK_K <= 64 for c in short_k.tma_configs)


def test_config_spaces_are_checked_against_static_dims_and_profiles(write_spec):
    found = errors(
        write_spec,
        """
        kernels:
          - name: k
            dims: {M: dynamic, K: 64, N: 4096}
            inputs: {x: [M, K], w: [N, K]}
            chain: [{matmul: {a: x, b: w.T}}, relu]
            autotune:
              profile: inference
              configs:
                - {BLOCK_M: 64, BLOCK_N: 64, BLOCK_K: 256, GROUP_M: 8, num_warps: 4, num_stages: 2}
        """,
    )
    assert any("profile 'inference' picks from the built-in space" in m for m in found), found
    assert any(
        "BLOCK_K = 256 is far larger than the dim it tiles (64); a block of 64 covers it" in m
        for m in found
    ), found


def test_matmul_shorthand_is_the_long_form(write_spec):
    long, short = (
        lower(write_spec, mlp([step, "bias: bv", "relu"]))[0]
        for step in ("matmul: {a: x, b: w.T}", "matmul: x @ w.T")
    )
    assert long.matmul == short.matmul and long.steps == short.steps
    gated = [
        lower(write_spec, mlp(["matmul: x @ w.T", "silu", step]))[0]
        for step in ("gate: {matmul: {a: x, b: w2.T}}", "gate: x @ w2.T")
    ]
    assert gated[0].steps == gated[1].steps


BAD = [
    (["matmul: {a: x, b: w.T, c: w}"], "matmul takes A @ B or {a: A, b: B}"),
    (["matmul: x * w.T"], "matmul takes A @ B or {a: A, b: B}"),
    (["matmul: x @ w"], "mismatched matmul dims"),
    (["matmul: {a: x, b: x}"], "mismatched matmul dims"),
    (["matmul: {a: x, b: w.T}", "gate: {matmul: {a: x, b: w.T}}"], "same weight 'w'"),
    (["matmul: x @ w.T", "gate: x2 @ w2.T"], "must read the same `a`"),
    (["input: res", "gate: {matmul: {a: x, b: w.T}}"], "`gate` needs a matmul chain"),
    (["matmul: {a: x, b: w.T}", "matmul: {a: x, b: w.T}"], "can only be the first step"),
    (["matmul: {a: x, b: w.T}", "scale: .inf"], "scale takes a number"),
    (["matmul: {a: x, b: w.T}", "bias: bv.T"], "only a matmul operand can be read transposed"),
    (["matmul: {a: x, b: w.T}", "relu: 3"], "relu takes no arguments"),
    (["matmul: {a: x, b: w.T}", "clamp: {min: 2, max: 1}"], "min (2.0) is above its max (1.0)"),
    (["matmul: {a: x, b: w.T}", "[relu]"], "a chain step is an op name or a one-key mapping"),
    (["input: bv", "relu"], "runs over a 2-D input"),
    (["input: res", "cast: fp16"], "needs at least one op after `input`"),
    (["matmul: {a: x, b: w.T}", "cast: fp16", "relu"], "`cast` must be the last step"),
]


@pytest.mark.parametrize("steps, message", BAD, ids=[m for _, m in BAD])
def test_bad_chains(write_spec, steps, message):
    found = errors(write_spec, mlp(steps))
    assert any(message in m for m in found), found


def test_a_square_weight_needs_two_dim_names(write_spec):
    found = errors(
        write_spec,
        """
        kernels:
          - name: k
            dims: {M: dynamic, D: 64}
            inputs: {x: [M, D], w: [D, D]}
            chain: [{matmul: {a: x, b: w}}]
        """,
    )
    assert any("names dim 'D' twice" in m for m in found)


def test_matmul_operands_cannot_pin_dtypes(write_spec):
    found = errors(
        write_spec,
        """
        kernels:
          - name: k
            dims: {M: dynamic, K: 64, N: 32}
            inputs: {x: [M, K], w: {shape: [K, N], dtype: fp32}}
            chain: [{matmul: {a: x, b: w}}]
        """,
    )
    assert any("cannot pin a dtype" in m for m in found)


@pytest.mark.parametrize(
    "name, dims, message",
    [
        ("2fast", "{M: dynamic, N: 8}", "not a Python identifier"),
        ("class", "{M: dynamic, N: 8}", "kernel name 'class' is a Python keyword"),
        ("ok", "{M: dynamic, N: 8, lambda: 4}", "dim 'lambda' is a Python keyword"),
        ("torch", "{M: dynamic, N: 8}", "would clash"),
        ("ok", "{M: dynamic, m: 8}", "differ only in case"),
        ("ok", "{M: dynamic, N: 8, offs_x: 4}", "reserved"),
    ],
)
def test_bad_names(write_spec, name, dims, message):
    text = f"""
kernels:
  - name: {name}
    dims: {dims}
    inputs: {{x: [M, N]}}
    chain: [{{input: x}}, relu]
"""
    assert any(message in m for m in errors(write_spec, text))


def test_unknown_version(write_spec):
    assert any(
        "unknown spec version" in m
        for m in errors(write_spec, "version: 2\nkernels: [{name: k}]\n")
    )


def test_all_kernels_of_a_file_are_checked(write_spec):
    # An error in the first kernel does not hide one in the second.
    found = errors(
        write_spec,
        """
        kernels:
          - name: a
            dims: {M: dynamic, N: 8}
            inputs: {x: [M, N]}
            chain: [{input: x}, gleu]
          - name: b
            dims: {M: dynamic, N: 8}
            inputs: {x: [M, N]}
            chain: [{input: x}, {add: y}]
        """,
    )
    assert len(found) == 2


ROWS = """
kernels:
  - name: k
    dims: {{M: dynamic, N: dynamic, K: 8}}
    inputs: {{x: [M, N], r: [M, N], w: [N], c: [M], wrong: [K], wk: [N, K]}}
    chain:
{steps}
"""


def rows(steps):
    text = "\n".join(f"      - {s}" for s in steps)
    used = {"x", *re.findall(r"\b(r|w|c|wrong|wk)\b", text)}
    spec = ROWS.format(steps=text)
    shapes = {"x": "[M, N]", "r": "[M, N]", "w": "[N]", "c": "[M]", "wrong": "[K]", "wk": "[N, K]"}
    inputs = ", ".join(f"{n}: {shapes[n]}" for n in shapes if n in used)
    spec = re.sub(r"inputs: \{.*\}", "inputs: {" + inputs + "}", spec)
    if "wrong" not in used and "wk" not in used:
        spec = spec.replace(", K: 8", "")
    return spec


def test_row_ops_lower(write_spec):
    (k,) = lower(
        write_spec, rows(["input: x", "add: r", "output: h", "rmsnorm: {weight: w, offset: 1}"])
    )
    assert k.kind == "row" and k.emits == ("h",) and not k.reduces
    assert k.row_step == RowStep("rmsnorm", (("eps", 1e-6), ("offset", 1.0)), (("weight", "w"),))
    (k,) = lower(write_spec, rows(["input: x", "softmax: {scale: 0.5, mask: w}"]))
    assert k.row_step.mask_broadcast == "row"
    (k,) = lower(write_spec, rows(["input: x", "layer_norm", "scale: 2.0", "cast: fp32"]))
    assert k.row_step.op == "layernorm" and k.out_dtype == "fp32"
    (k,) = lower(write_spec, rows(["input: x", "max", "silu", "scale: 0.5"]))
    assert k.reduces and [s.op for s in k.steps[1:]] == ["silu", "scale"]
    assert k.default_config == configs.DEFAULTS["row"]


ROW_ERRORS = [
    (["input: x", "softmax", "layernorm"], "only one row op"),
    (["input: x", "output: h"], "`output` needs a row op after it"),
    (["input: x", "sum", "output: h"], "must come before the row op"),
    (["input: x", "output: x", "sum"], "has the name of an input"),
    (["input: x", "output: offs_q", "sum"], "reserved"),
    (["input: x", "sum", "add: c"], "one number per row"),
    (["input: x", "softmax: {mask: c}"], "a softmax mask is [M, N] or [N]"),
    (["input: x", "rmsnorm: {weight: wrong}"], "a rmsnorm weight is [N]"),
    (["input: x", "layernorm: {gamma: w}"], "has no field 'gamma'"),
    (["input: x", "rmsnorm: {eps: -1}"], "eps must not be negative"),
    (["input: x", "softmax: 0.5"], "softmax takes a mapping"),
    (["matmul: {a: x, b: wk.T}", "softmax"], "works on an elementwise chain"),
]


@pytest.mark.parametrize("steps, message", ROW_ERRORS, ids=[m for _, m in ROW_ERRORS])
def test_row_op_errors(write_spec, steps, message):
    text = rows(steps)
    if steps[0].startswith("matmul"):
        text = text.replace("x: [M, N]", "x: [M, K]")
    found = errors(write_spec, text)
    assert any(message in m for m in found), found


def test_backward_save_policy(write_spec):
    """A matmul chain keeps its accumulators unless the spec says inputs; a chain with no
    matmul has none to keep, and asking for them is an error naming the field."""
    (kernel,) = lower(write_spec, rows(["input: x", "rmsnorm"]))
    assert kernel.backward_save == "inputs"
    (kernel,) = lower(write_spec, mlp(["matmul: x @ w.T", "silu"]))
    assert kernel.backward_save == "accumulators"
    found = errors(
        write_spec, rows(["input: x", "rmsnorm"]) + "    backward: {save: accumulators}\n"
    )
    assert any("'accumulators' needs a matmul chain" in m for m in found), found


def attention(**fields):
    body = {"layout": "bshd", "heads": 32, "kv_heads": 8, "head_dim": 128, **fields}
    spec = ", ".join(f"{k}: {v}" for k, v in body.items() if v is not None)
    return f"kernels:\n  - name: att\n    attention: {{{spec}}}\n"


def test_attention_lowers_with_defaults(write_spec):
    (att,) = lower(write_spec, attention(kv_heads=None))
    assert (att.kind, att.heads, att.kv_heads, att.group) == ("attention", 32, 32, 1)
    assert att.scale == 1 / 128**0.5 and not att.scale_given and att.dtypes == ("bf16", "fp16")
    assert (att.causal, att.window, att.softcap) == (False, None, None)
    assert att.dv == 128 and att.v_head_dim == 0  # v's head dim: head_dim's
    (mla,) = lower(write_spec, attention(head_dim=192, v_head_dim=128))
    assert (mla.head_dim, mla.dv) == (192, 128)
    (same,) = lower(write_spec, attention(v_head_dim=128))
    assert same.v_head_dim == 0  # given as head_dim: the kernel of a spec without it


@pytest.mark.parametrize(
    "fields, where, message",
    [
        ({"kv_heads": 5}, "attention.kv_heads", "kv_heads 5 does not divide heads 32"),
        ({"head_dim": 100}, "attention.head_dim", "head_dim 100 is not a multiple of 16"),
        ({"head_dim": 512}, "attention.head_dim", "from 16 to 256"),
        ({"v_head_dim": 72}, "attention.v_head_dim", "v_head_dim 72 is not a multiple of 16"),
        ({"v_head_dim": 0}, "attention.v_head_dim", "from 16 to 256"),
        ({"window": 128}, "attention.window", "a sliding window needs causal: true"),
        ({"alibi": True}, "attention.alibi", "ALiBi needs causal: true"),
        ({"layout": "sbhd"}, "attention.layout", "'bshd' or 'bhsd'"),
        ({"softcap": -1}, "attention.softcap", "greater than 0"),
        # Taken as they stand, not converted: `softcap: true` is not a softcap of 1.
        ({"softcap": "true"}, "attention.softcap", "a valid number"),
        ({"heads": '"32"'}, "attention.heads", "a valid integer"),
        ({"head_dim": "128.0"}, "attention.head_dim", "a valid integer"),
        ({"causal": '"yes"'}, "attention.causal", "a flag, got 'yes'"),
        ({"bias": 1}, "attention.bias", "a flag, got 1"),
        # Within what fp32 scores and int32 positions hold.
        ({"scale": ".inf"}, "attention.scale", "a finite number"),
        ({"scale": "1e-300"}, "attention.scale", "greater than or equal to 0.000001"),
        ({"softcap": "1e300"}, "attention.softcap", "less than or equal to 1000000"),
        ({"causal": "true", "window": 2**31}, "attention.window", "less than 1073741824"),
        (
            {"causual": "true"},
            "attention.causual",
            "unknown field 'causual'; did you mean 'causal'?",
        ),
    ],
)
def test_attention_errors_name_the_field(write_spec, fields, where, message):
    with pytest.raises(SpecErrors) as exc:
        lower(write_spec, attention(**fields))
    (error,) = exc.value.errors
    text = error.format()
    assert "spec.yaml:3:" in text and f"kernels[0].{where}: " in text and message in text, text


def test_a_misspelled_attention_key_is_read_as_an_attention_kernel(write_spec):
    text = attention().replace("attention:", "attenton:")
    found = errors(write_spec, text)
    assert any("unknown field 'attenton'; did you mean 'attention'?" in e for e in found), found
    assert not any("'chain'" in e or "'dims'" in e for e in found), found


LOSS_HEAD = """
kernels:
  - name: head
    dims: {{T: dynamic, K: 64, V: 1000}}
    inputs:
      x: [T, K]
      weight: {weight}
      labels: {{shape: [T], dtype: {labels}}}
      b: {bias}
    chain:
      - matmul: {matmul}
{steps}
      - cross_entropy: {loss}
"""


def loss_head(
    write_spec,
    steps=("bias: b",),
    loss="labels",
    weight="[V, K]",
    matmul="x @ weight.T",
    labels="int64",
):
    text = LOSS_HEAD.format(
        weight=weight,
        matmul=matmul,
        labels=labels,
        steps="\n".join(f"      - {s}" for s in steps),
        loss=loss,
        bias="[V]",
    )
    return lower(write_spec, text)[0]


def test_loss_head_lowers_its_steps_and_options(write_spec):
    head = loss_head(
        write_spec,
        steps=("bias: b", "scale: 0.5", "softcap: 30"),
        loss="{labels: labels, reduction: sum, label_smoothing: 0.1, z_loss: 1.0e-4, lse: true}",
    )
    assert head.kind == "loss" and head.weight_transposed
    assert [(s.op, s.operand, s.constant) for s in head.steps] == [
        ("bias", "b", None),
        ("scale", None, 0.5),
        ("softcap", None, 30.0),
    ]
    assert (head.tokens.name, head.hidden.size, head.vocab.size) == ("T", 64, 1000)
    assert (head.reduction, head.label_smoothing, head.z_loss, head.return_lse) == (
        "sum",
        0.1,
        1e-4,
        True,
    )
    assert head.ignore_index == -100 and head.labels_dtype == "int64" and head.bias == "b"


def test_loss_head_defaults_and_untransposed_weight(write_spec):
    head = loss_head(
        write_spec, steps=("bias: b",), weight="[K, V]", matmul="x @ weight", labels="int"
    )
    assert not head.weight_transposed and head.vocab.name == "V"
    assert (head.reduction, head.label_smoothing, head.z_loss, head.return_lse) == (
        "mean",
        0.0,
        0.0,
        False,
    )
    assert head.labels_dtype == "int32"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"matmul": "x @ weight"}, "does not contract"),
        ({"matmul": "x.T @ weight.T"}, "not x.T"),
        ({"steps": ("bias: b", "bias: b")}, "bias appears twice"),
        ({"steps": ("bias: b", "scale: nan")}, "scale takes a finite number"),
        ({"steps": ("bias: b", "relu")}, "'relu' cannot come between"),
        ({"steps": ("softcap: 30", "bias: b")}, "a bias after softcap"),
        ({"bias": "{shape: [V], dtype: fp32}"}, "a loss head's input 'b' cannot pin a dtype"),
        ({"steps": ("bias: b", "scale: 0")}, "scale 0 makes every logit 0"),
        ({"labels": "fp32"}, "must be integers"),
        ({"loss": "{labels: labels, z_loss: -1}"}, "z_loss -1: Input should be greater"),
        ({"loss": "{labels: x}"}, "the labels 'x' must be integers"),
        ({"steps": ()}, "input 'b' is never used"),
    ],
)
def test_loss_head_errors(write_spec, kwargs, message):
    found = errors(write_spec, LOSS_HEAD_TEXT(kwargs))
    assert any(message in e for e in found), found


def LOSS_HEAD_TEXT(kwargs):
    values = {
        "steps": ("bias: b",),
        "loss": "labels",
        "weight": "[V, K]",
        "matmul": "x @ weight.T",
        "labels": "int64",
        "bias": "[V]",
        **kwargs,
    }
    values["steps"] = "\n".join(f"      - {s}" for s in values["steps"])
    return LOSS_HEAD.format(**values)


def test_integer_inputs_only_for_labels(write_spec):
    found = errors(
        write_spec,
        """
        kernels:
          - name: k
            dims: {M: dynamic, N: 8}
            inputs: {x: [M, N], i: {shape: [M], dtype: int32}}
            chain: [{input: x}, relu]
        """,
    )
    assert any("integer inputs are a cross_entropy step's labels" in e for e in found), found
