"""Quantized chains: the spec's quantized inputs, their checks, the lowered QuantChain,
the generated module's text, and the runtime's dequantization. The generated kernels
themselves are tested by their own modules (generated/test_*.py, specs/quantized.yaml)."""

import importlib
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from fusegen import build, configs
from fusegen.cli import main
from fusegen.codegen import files
from fusegen.errors import SpecErrors
from fusegen.ir import QuantChain
from fusegen.lower.kernels import lower_file
from fusegen.runtime import quant
from fusegen.spec import source

SPEC = """
kernels:
  - name: q
    dims: {{M: dynamic, K: {k}, N: dynamic}}
{extra}    inputs:
      x: {x}
      w: {w}
      b: [N]
    chain:
      - matmul: {matmul}
      - bias: b
{steps}"""


def spec(
    k="dynamic",
    x="[M, K]",
    w="{shape: [N, K], dtype: int4, scale: {per_group: 32}}",
    matmul="x @ w.T",
    steps="",
    extra="",
):
    return SPEC.format(k=k, x=x, w=w, matmul=matmul, steps=steps, extra=extra)


def lower(write_spec, text):
    return lower_file(source.load(write_spec(text)))


def problems(write_spec, text):
    """(path, message) of each error in the spec."""
    with pytest.raises(SpecErrors) as exc:
        lower(write_spec, text)
    return [(e.path, e.message, e.line) for e in exc.value.errors]


def test_examples_lower_to_quantized_chains():
    loaded = build.load(build.collect([str(ROOT / "specs" / "quantized.yaml")]))
    by_name = {k.name: k for k in loaded.kernels}
    assert [k.kind for k in by_name.values()] == ["quant"] * 4 + ["quantize"] * 2
    assert all(isinstance(k, QuantChain) for k in list(by_name.values())[:4])
    rows, groups = by_name["quantize_fp8_rowwise"], by_name["quantize_fp8_groups"]
    assert (rows.dtype, rows.group, groups.group) == ("fp8_e4m3", None, 128)
    int4 = by_name["llama_mlp_int4"]
    assert [(q.name, q.dtype, q.scale, q.group, q.zero_point, q.packing) for q in int4.quant] == [
        ("w_gate", "int4", "group", 128, True, "low_first"),
        ("w_up", "int4", "group", 128, True, "low_first"),
    ]
    # The tiles' BLOCK_K divides the group, the one-row (GEMV) configs' holds whole
    # groups; the gated space keeps two accumulators in registers.
    tiles = [c for c in int4.configs if c.BLOCK_M > 1]
    gemv = [c for c in int4.configs if c.BLOCK_M == 1]
    assert int4.gemv and gemv and int4.interpreter_gemv_config.BLOCK_M == 1
    assert all(128 % c.BLOCK_K == 0 for c in tiles)
    assert all(c.BLOCK_K % 128 == 0 for c in gemv + [int4.interpreter_gemv_config])
    assert all(c.BLOCK_M * c.BLOCK_N <= 128 * 128 for c in int4.configs)
    assert not int4.fp8_dot
    fp8 = by_name["gelu_fp8_rowwise"]
    assert fp8.fp8_dot and not fp8.gemv and [q.scale for q in fp8.quant] == ["row", "row"]
    # No group: BLOCK_K as built in; split-K's decode tiles after the others.
    assert fp8.configs == configs.QUANT_SPACE + configs.QUANT_SPLIT_SPACE
    block = by_name["deepseek_mlp_fp8"]
    assert [(q.scale, q.group, q.rows_per) for q in block.quant] == [
        ("group", 128, 1),
        ("block", 128, 128),
        ("block", 128, 128),
    ]
    assert by_name["linear_int8"].chain.dtypes == ("bf16", "fp16")


def test_dtypes_default_to_16_bits(write_spec):
    (qc,) = lower(write_spec, spec())
    assert qc.chain.dtypes == ("bf16", "fp16")  # not fp32: the dot runs in 16 bits


@pytest.mark.parametrize(
    "changes, path, message",
    [
        ({"w": "{shape: [N, K], dtype: int4}"}, ("inputs", "w"), "has no `scale`"),
        (
            {"x": "{shape: [M, K], scale: per_row}"},
            ("inputs", "x", "scale"),
            "'scale' applies to quantized inputs",
        ),
        (
            {"w": "{shape: [N, K], dtype: fp8_e4m3, scale: per_row, zero_point: true}"},
            ("inputs", "w", "zero_point"),
            "fp8_e4m3 takes no zero point",
        ),
        (
            {"w": "{shape: [N, K], dtype: int8, scale: per_row, packing: high_first}"},
            ("inputs", "w", "packing"),
            "'packing' is int4's",
        ),
        (
            {"w": "{shape: [N, K], dtype: int8, scale: {per_group: 40}}"},
            ("inputs", "w", "scale", "per_group"),
            "a group of 40 along K is not a multiple of 16",
        ),
        (
            {"k": "4000", "w": "{shape: [N, K], dtype: int8, scale: {per_group: 128}}"},
            ("inputs", "w", "scale"),
            "a group of 128 does not divide K = 4000",
        ),
        (
            {"k": "63", "w": "{shape: [N, K], dtype: int4, scale: per_row}"},
            ("inputs", "w", "dtype"),
            "K = 63 is odd",
        ),
        (
            {"w": "{shape: [K, N], dtype: int8, scale: per_row}", "matmul": "x @ w"},
            ("inputs", "w", "shape"),
            "must hold K (K) as its last dim",
        ),
        (
            {"extra": "    backward: {save: inputs}\n"},
            ("backward",),
            "'backward' does not apply to a quantized chain",
        ),
        (
            {"extra": "    dtypes: [bf16, fp32]\n"},
            ("dtypes", 1),
            "computes its dots in bf16 or fp16",
        ),
        (
            {"extra": "    fp32_matmul: ieee\n"},
            ("fp32_matmul",),
            "'fp32_matmul' does not apply to a quantized chain",
        ),
        (
            {"extra": "    fallback: {nonfinite: reference}\n"},
            ("fallback", "nonfinite"),
            "has no inf/NaN fallback to the reference",
        ),
        (
            {"w": "{shape: [N, K], dtype: int5, scale: per_row}"},
            ("inputs", "w", "dtype"),
            "unknown dtype 'int5'",
        ),
        (
            {"w": "{shape: [N, K], dtype: int8, scale: {per_block: [128]}}"},
            ("inputs", "w", "scale", "per_block"),
            "per_block is [rows, K], two numbers",
        ),
        (
            {"w": "{shape: [N, K], dtype: int8, scale: per_chanel}"},
            ("inputs", "w", "scale"),
            "unknown scale 'per_chanel'; did you mean 'per_channel'?",
        ),
        (
            {"w": "{shape: [N, K], dtype: int8, scale: {per_grup: 128}}"},
            ("inputs", "w", "scale"),
            "got per_grup; did you mean 'per_group'?",
        ),
        (
            {"w": "{shape: [N, K], dtype: int8, scale: {per_group: 0}}"},
            ("inputs", "w", "scale", "per_group"),
            "greater than 0",
        ),
    ],
)
def test_spec_errors_name_the_place(write_spec, changes, path, message):
    found = problems(write_spec, spec(**changes))
    where = ("kernels", 0, *path)
    assert any(
        p[: len(where)] == where and message in m and line > 0 for p, m, line in found
    ), found
    if "scale" in path:  # one error for one mistake, not one per form a scale can take
        assert len(found) == 1, found


def test_a_quantized_bias_is_refused(write_spec):
    text = spec().replace("b: [N]", "b: {shape: [N], dtype: int8, scale: per_tensor}")
    found = problems(write_spec, text)
    assert any("is quantized but is not a matmul operand" in m for _, m, _ in found), found


def test_argument_names_must_be_free(write_spec):
    text = spec().replace("b: [N]", "w_scale: [N]").replace("bias: b", "bias: w_scale")
    found = problems(write_spec, text)
    assert any("is the launcher's argument for w's scales" in m for _, m, _ in found), found


def test_build_refuses_and_writes_nothing(write_spec, run_cli, tmp_path):
    path = write_spec(spec(w="{shape: [N, K], dtype: int4}"))
    out = tmp_path / "out"
    code, _, err = run_cli("build", str(path), "--out", str(out))
    assert code != 0 and "has no `scale`" in err and "spec.yaml:" in err
    assert not out.exists() or not any(out.iterdir())


def test_module_text_is_deterministic_and_standalone(write_spec):
    (qc,) = lower(write_spec, spec())
    first, again = files.render(qc), files.render(qc)
    assert [r.text for r in first] == [r.text for r in again]
    module = first[0].text
    assert "import fusegen" not in module and "from fusegen" not in module
    # The int4 operand is unpacked in the kernel (two values a byte along K), its scales
    # applied to each K step's partial sums.
    assert "tl.join(w_bytes & 15, w_bytes >> 4)" in module
    assert "acc += tl.dot(x_tile, w_tile.T) * w_scale_k[None, :]" in module
    # Decode tiles run transposed (SWAP_AB), the nibbles' offsets off after the dot.
    assert "acc += (\n" in module and "tl.dot(w_tile, x_tile.T)" in module
    assert "- (NIBBLE_BASE + 8.0) * x_sum[None, :]" in module  # signed nibbles


def test_fp8_chains_dot_as_stored(write_spec):
    text = spec(
        x="{shape: [M, K], dtype: fp8_e4m3, scale: per_row}",
        w="{shape: [N, K], dtype: fp8_e5m2, scale: per_tensor}",
    )
    (qc,) = lower(write_spec, text)
    module = files.render(qc)[0].text
    assert qc.fp8_dot and ".to(DOT_DTYPE)" not in module
    assert "acc = acc * x_scale_all[:, None] * w_scale_all" in module


def _words(nibbles):
    """[..., 8] values 0..15 -> [...] int32, value i in bits 4i to 4i + 3 (a test's own
    packing, written from the formats' documentation, not from the runtime's unpacking)."""
    word = torch.zeros(nibbles.shape[:-1], dtype=torch.int64)
    for i in range(8):
        word |= nibbles[..., i].to(torch.int64) << (4 * i)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def _checkpoint(seed=0, n=24, k=64, group=16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen)
    zero = torch.randint(0, 16, (n, k // group), generator=gen)
    scale = (torch.rand(n, k // group, generator=gen) + 0.5).half()
    want = (q - zero.repeat_interleave(group, 1)) * scale.double().repeat_interleave(group, 1)
    return q, zero, scale, want


@pytest.mark.parametrize("packing", ["low_first", "high_first"])
def test_awq_checkpoints_convert_to_the_int4_layout(packing):
    q, zero, scale, want = _checkpoint()
    n, k = q.shape
    # AWQ: [K, N // 8] words packed along N, nibble i holding column 8c + (0, 2, 4, 6, 1,
    # 3, 5, 7)[i]; zeros the same way; scales [K // G, N].
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    qweight = _words(q.T.reshape(k, n // 8, 8)[..., order])
    qzeros = _words(zero.T.reshape(-1, n // 8, 8)[..., order])
    w, w_scale, w_zero = quant.from_awq(qweight, qzeros, scale.T.contiguous(), packing)
    assert torch.equal(w, quant.pack_int4(q, packing)) and w_zero.dtype == torch.uint8
    assert torch.equal(w_scale, scale) and torch.equal(w_zero, zero.to(torch.uint8))
    q_ = quant.Quant("int4", "group", 16, 1, True, packing)
    assert torch.equal(quant.dequantize(w, w_scale, w_zero, q_, torch.float64), want)
    with pytest.raises(ValueError, match=r"AWQ: qweight must be int32 \[K, N // 8\]"):
        quant.from_awq(qweight.T.contiguous(), qzeros, scale.T.contiguous())
    with pytest.raises(ValueError, match=r"AWQ: qzeros must be int32 \[G, N // 8\]"):
        quant.from_awq(qweight, qzeros.to(torch.int64), scale.T.contiguous())


def generated(name):
    """A module of the committed generated/ folder, imported."""
    sys.path.insert(0, str(ROOT / "generated"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "generated"))


def test_a_generated_module_runs_an_awq_checkpoint():
    # llama_mlp_int4's own from_awq, its tensors through the launcher's checks and kernel
    # (the interpreter here), against the chain on the AWQ weights in float64.
    module = generated("llama_mlp_int4")
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    args, weights = [], []
    for seed in (2, 3):
        q, zero, scale, want = _checkpoint(seed, n=24, k=256, group=128)
        n, k = q.shape
        qweight = _words(q.T.reshape(k, n // 8, 8)[..., order])
        qzeros = _words(zero.T.reshape(-1, n // 8, 8)[..., order])
        args += module.from_awq(qweight, qzeros, scale.T.contiguous())
        weights.append(want)
    # x small enough that silu's exp stays finite (the weights are (q - zero) * O(1)).
    x = (torch.randn(3, 256, generator=torch.Generator().manual_seed(4)) / 64).to(torch.bfloat16)
    got = module.llama_mlp_int4(x, *args, out_dtype=torch.float32)
    gate, up = (x.double() @ w.T for w in weights)
    want = torch.nn.functional.silu(gate) * up
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("name", ["quantize_fp8_rowwise", "quantize_fp8_groups"])
def test_a_quantizer_keeps_nan_and_inf_in_its_scales(name):
    """A NaN in a row (or group) makes its scale NaN and an inf makes it inf, as the
    reference's amax does, not a finite scale from the other values (tl.max's combine
    drops a NaN on the GPU). The interpreter's fp32 -> fp8 conversion turns NaN into
    384, so q is compared where the reference's q is not NaN, within e4m3's rounding."""
    module = generated(name)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    x[1, 5], x[2, 200] = float("nan"), float("inf")
    q, scale = getattr(module, name)(x)
    want_q, want_scale = module.reference(x, out_dtype=torch.float64)
    assert scale.isnan().any() and scale.isinf().any()
    torch.testing.assert_close(scale, want_scale, equal_nan=True, rtol=0, atol=0)
    kept = ~want_q.isnan()
    error = (q.double() - want_q)[kept].abs()
    assert (error <= want_q[kept].abs() * 2**-4 + 2**-10).all()


def test_call_errors_name_the_kernel_and_a_checkpoints_layout():
    module = generated("llama_mlp_int4")
    x = torch.randn(2, 256).to(torch.bfloat16)
    q, zero, scale, _ = _checkpoint(2, n=24, k=256, group=128)
    w, zero, scale = quant.pack_int4(q), zero.to(torch.uint8), scale.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^llama_mlp_int4: w_gate_scale must hold .*from_awq"):
        module.llama_mlp_int4(x, w, scale.T, zero, w, scale, zero)  # AWQ's [K / 128, N]


def test_quantized_launchers_check_their_buffers_and_dtypes():
    """out sharing memory with x, an integer output dtype, a quantizer's scale buffer
    expanded from one value, an empty batch, None for x: each was accepted (a wrong
    result) or crashed inside torch."""
    linear, quantizer = generated("linear_int8"), generated("quantize_fp8_rowwise")
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(40, 64, generator=gen).to(torch.bfloat16)
    w = torch.randint(-5, 5, (32, 64), dtype=torch.int8, generator=gen)
    s, b = torch.rand(32).to(torch.bfloat16), torch.randn(32).to(torch.bfloat16)
    with pytest.raises(ValueError, match="linear_int8: out shares memory with x"):
        linear.linear_int8(x, w, s, b, out=x.view(-1)[: 40 * 32].view(40, 32))
    with pytest.raises(TypeError, match="output's dtype .* is torch.int32"):
        linear.linear_int8(x[:1], w, s, b, out_dtype=torch.int32)
    assert linear.linear_int8(x[:0], w, s, b).shape == (0, 32)
    with pytest.raises(ValueError, match="linear_int8: bad config"):  # no rows: still checked
        linear.linear_int8(x[:0], w, s, b, config={**linear.DEFAULT_CONFIG, "BLOCK_N": 48})
    with pytest.raises(TypeError, match=r"x, b \(the unquantized inputs\) are torch.float32"):
        linear.linear_int8(x.float(), w, s, b.float())
    with pytest.raises(TypeError, match="one dtype, got x torch.bfloat16, b torch.float16"):
        linear.linear_int8(x, w, s, b.half())
    # float64 is the reference's: the launcher names the inputs (a KeyError inside before).
    with pytest.raises(TypeError, match=r"x, b \(the unquantized inputs\) are torch.float64"):
        linear.linear_int8(x.double(), w, s, b.double(), out_dtype=torch.float32)
    with pytest.raises(TypeError, match=r"x \(the unquantized inputs\) are torch.float64"):
        quantizer.quantize_fp8_rowwise(x.double())
    rows = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    with pytest.raises(ValueError, match="scale must be contiguous"):
        quantizer.quantize_fp8_rowwise(rows, scale=torch.zeros(1).expand(5))
    q, scale = quantizer.quantize_fp8_rowwise(rows[:0])
    assert q.shape == (0, 64) and scale.shape == (0,)
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got NoneType"):
        quantizer.quantize_fp8_rowwise(None)


def test_gptq_checkpoints_convert_to_the_int4_layout():
    q, zero, scale, want = _checkpoint(seed=1)
    n, k = q.shape
    # GPTQ: [K // 8, N] words packed along K, nibble i holding row 8r + i; zeros [K // G,
    # N // 8] packed along N, each stored one less (v1); scales [K // G, N].
    qweight = _words(q.reshape(n, k // 8, 8)).T.contiguous()
    qzeros = _words((zero - 1).T.reshape(-1, n // 8, 8) & 15)
    g_idx = torch.arange(k) // 16
    w, w_scale, w_zero = quant.from_gptq(qweight, qzeros, scale.T.contiguous(), g_idx)
    q_ = quant.Quant("int4", "group", 16, 1, True, "low_first")
    # A zero of 0 is stored as 15 (-1 in four bits) and read back as 16: the same
    # weights only where no zero is 0, as in GPTQ itself.
    ok = (zero > 0).repeat_interleave(16, 1)
    got = quant.dequantize(w, w_scale, w_zero, q_, torch.float64)
    assert torch.equal(got[ok], want[ok]) and torch.equal(w, quant.pack_int4(q))
    v2 = quant.from_gptq(qweight, _words(zero.T.reshape(-1, n // 8, 8)), scale.T, zero_offset=0)
    assert torch.equal(quant.dequantize(*v2, q_, torch.float64), want)
    act_order = g_idx[torch.randperm(k, generator=torch.Generator().manual_seed(0))]
    with pytest.raises(ValueError, match="act-order"):
        quant.from_gptq(qweight, qzeros, scale.T.contiguous(), act_order)


def test_int4_modules_offer_the_converters_in_their_nibble_order(write_spec):
    (qc,) = lower(write_spec, spec(w="{shape: [N, K], dtype: int4, scale: {per_group: 32}, "
                                     "zero_point: true, packing: high_first}"))  # fmt: skip
    module = files.render(qc)[0].text
    assert 'from_awq, from_gptq = _rt.checkpoint_converters("high_first")' in module
    (plain,) = lower(write_spec, spec())  # signed int4: no zero points, no checkpoint
    assert "checkpoint_converters" not in files.render(plain)[0].text


def test_pack_and_dequantize_round_trip():
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(-8, 8, (5, 12), generator=gen)
    for packing in ("low_first", "high_first"):
        packed = quant.pack_int4(values, packing)
        assert packed.shape == (5, 6) and packed.dtype == torch.uint8
        assert torch.equal(quant.unpack_int4(packed, packing, signed=True), values)
    low = quant.pack_int4(values)
    assert torch.equal(low[:, 0] & 15, (values[:, 0] & 15).to(torch.uint8))
    scale = torch.rand(5, 3, generator=gen) + 0.5
    zero = torch.randint(0, 16, (5, 3), generator=gen, dtype=torch.uint8)
    unsigned = values + 8
    q = quant.Quant("int4", "group", 4, 1, True, "low_first")
    got = quant.dequantize(quant.pack_int4(unsigned), scale, zero, q, torch.float64)
    want = (unsigned - zero.repeat_interleave(4, 1)) * scale.double().repeat_interleave(4, 1)
    assert torch.equal(got, want)
    block = quant.Quant("int8", "block", 4, 2, False, None)
    s = torch.rand(3, 3, generator=gen)
    got = quant.dequantize(values.to(torch.int8), s, None, block, torch.float64)
    want = values * s.double().repeat_interleave(2, 0)[:5].repeat_interleave(4, 1)
    assert torch.equal(got, want)


RARE_KINDS = """
kernels:
  - name: rare_kinds
    dims: {M: dynamic, K: dynamic, N: dynamic}
    inputs:
      x: {shape: [M, K], dtype: int8, scale: per_row, zero_point: true}
      w: {shape: [N, K], dtype: int4, scale: per_tensor, zero_point: true, packing: high_first}
      w2: {shape: [N, K], dtype: fp8_e5m2, scale: {per_block: [64, 32]}}
      b: [N]
    chain:
      - matmul: x @ w.T
      - bias: b
      - gelu
      - gate: x @ w2.T
  - name: gemv_int4_kinds
    dims: {M: dynamic, K: dynamic, N: dynamic}
    inputs:
      x: [M, K]
      w: {shape: [N, K], dtype: int4, scale: {per_block: [32, 64]}, packing: high_first}
      w2: {shape: [N, K], dtype: int4, scale: per_row, zero_point: true}
    chain:
      - matmul: x @ w.T
      - silu
      - gate: x @ w2.T
  - name: gemv_int4_pairs
    dims: {M: dynamic, K: dynamic, N: dynamic}
    inputs:
      x: [M, K]
      w: {shape: [N, K], dtype: int4, scale: {per_group: 32}, packing: high_first}
      w2: {shape: [N, K], dtype: int4, scale: per_row, zero_point: true, packing: high_first}
    chain:
      - matmul: x @ w.T
      - silu
      - gate: x @ w2.T
  - name: swap_int4_kinds
    dims: {M: dynamic, K: dynamic, N: dynamic}
    inputs:
      x: [M, K]
      w: {shape: [N, K], dtype: int4, scale: per_row, packing: high_first}
      w2: {shape: [N, K], dtype: int4, scale: per_tensor, zero_point: true}
    chain:
      - matmul: x @ w.T
      - silu
      - gate: x @ w2.T
  - name: gemv_int8_kinds
    dims: {M: dynamic, K: dynamic, N: dynamic}
    inputs:
      x: [M, K]
      w: {shape: [N, K], dtype: int8, scale: {per_group: 32}, zero_point: true}
      w2: {shape: [N, K], dtype: int8, scale: per_tensor, zero_point: true}
    chain:
      - matmul: x @ w.T
      - gate: x @ w2.T
  - name: fp8_only_two_dtypes
    dims: {M: dynamic, K: dynamic, N: dynamic}
    dtypes: [bf16, fp16]
    inputs:
      x: {shape: [M, K], dtype: fp8_e4m3, scale: per_row}
      w: {shape: [N, K], dtype: fp8_e5m2, scale: per_channel}
    chain:
      - matmul: x @ w.T
  - name: fp8_only_cast
    dims: {M: dynamic, K: dynamic, N: dynamic}
    dtypes: [bf16, fp16]
    inputs:
      x: {shape: [M, K], dtype: fp8_e4m3, scale: {per_group: 128}}
      w: {shape: [N, K], dtype: fp8_e4m3, scale: {per_block: [128, 128]}}
    chain:
      - matmul: x @ w.T
      - cast: fp32
  - name: int8_per_tensor_no_gpu_error
    dims: {M: dynamic, K: dynamic, N: dynamic}
    fallback: {no_gpu: error}
    inputs:
      x: [M, K]
      w: {shape: [N, K], dtype: int8, scale: per_tensor}
    chain:
      - matmul: x @ w.T
      - scale: 0.5
  - name: quantize_no_gpu_error
    dims: {M: dynamic, K: dynamic}
    fallback: {no_gpu: error}
    inputs:
      x: [M, K]
    chain:
      - input: x
      - quantize: {dtype: fp8_e4m3, scale: per_row}
"""


def test_the_kinds_the_examples_lack_pass_their_generated_tests(write_spec, tmp_path):
    # The examples (specs/quantized.yaml) run per-row, per-group and per-block scales,
    # unsigned int4 and fp8 e4m3; this kernel runs the rest: int8 activations with zero
    # points, a per-tensor scale and zero point, high_first nibbles, fp8 e5m2 weights
    # converted for a bf16/fp16 dot beside an int4 one; and on the one-row (GEMV) path,
    # signed high_first int4 with block scales, zero points constant along K (per row,
    # per tensor), int8 groups with zero points; gemv_int4_pairs, weights packed alike, a
    # byte's nibbles from one shift: high_first, signed with group scales, a zero point
    # with a scale constant along K. rare_kinds' w2 blocks of 64 rows hold
    # the interpreter's 64-column tiles (one scale a K step); gemv_int4_kinds' w blocks of
    # 32 rows do not (a scale a column). swap_int4_kinds runs the transposed tiles'
    # (SWAP_AB: the interpreter's 32 x 64) offsets that are not a group's zero point:
    # signed nibbles' 8, a per-tensor zero point, with scales constant along K. Chains
    # whose operands are all fp8 take the call's dtype from out_dtype= or out= (two
    # dtypes), or end in a cast (the cast's dtype is the output's, not the dot's); an int8
    # weight with one scale (no zero point: the scales dropped is its mutation); and
    # `fallback: {no_gpu: error}` on a chain and a quantizer.
    out = tmp_path / "out"
    assert main(["build", str(write_spec(RARE_KINDS)), "--out", str(out)]) == 0
    assert "SWAP_AB" in (out / "swap_int4_kinds.py").read_text()
    assert "SWAP_AB" not in (out / "gemv_int4_kinds.py").read_text()  # block scales
    assert "_word_value(" in (out / "gemv_int4_kinds.py").read_text()  # packed unlike
    assert "_byte_nibbles(" in (out / "gemv_int4_pairs.py").read_text()
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_rare_kinds.py"]
        + ["test_gemv_int4_kinds.py", "test_gemv_int8_kinds.py", "test_swap_int4_kinds.py"]
        + ["test_gemv_int4_pairs.py", "test_fp8_only_two_dtypes.py", "test_fp8_only_cast.py"]
        + ["test_int8_per_tensor_no_gpu_error.py", "test_quantize_no_gpu_error.py"],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    names = ["gemv_int4_kinds", "gemv_int8_kinds", "swap_int4_kinds", "gemv_int4_pairs"]
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run(
        [sys.executable, "-c", SM90_COMPILE, str(out), *names],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_launchers_run_inside_torch_compile(tmp_path):
    # What the generated modules' own compile tests check on a GPU (on the CPU they
    # skip): a quantized chain and a quantizer traced whole, through their custom ops.
    text = RARE_KINDS + """
  - name: quantize_groups
    dims: {M: dynamic, K: dynamic}
    inputs: {x: [M, K]}
    chain: [{input: x}, {quantize: {dtype: fp8_e4m3, scale: {per_group: 32}}}]
"""
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(text)
    out = tmp_path / "out"
    assert main(["build", str(spec_path), "--out", str(out)]) == 0
    sys.path.insert(0, str(out))
    try:
        chain = importlib.import_module("rare_kinds")
        quantizer = importlib.import_module("quantize_groups")
    finally:
        sys.path.remove(str(out))
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (5, 64), generator=gen, dtype=torch.uint8)
    inputs = dict(
        x=x,
        x_scale=torch.rand(5, generator=gen) + 0.5,
        x_zero=torch.randint(0, 256, (5,), generator=gen, dtype=torch.uint8),
        w=torch.randint(0, 256, (40, 32), generator=gen, dtype=torch.uint8),
        w_scale=torch.rand(1, generator=gen),
        w_zero=torch.randint(0, 16, (1,), generator=gen, dtype=torch.uint8),
        w2=torch.randn(40, 64, generator=gen).to(torch.float8_e5m2),
        w2_scale=torch.rand(1, 2, generator=gen),  # [64, 32] blocks of [40, 64]
        b=torch.randn(40, generator=gen, dtype=torch.bfloat16),
    )
    compiled = torch.compile(lambda **t: chain.rare_kinds(**t), fullgraph=True, backend="eager")
    assert torch.equal(compiled(**inputs), chain.rare_kinds(**inputs))
    a = torch.randn(3, 7, 64, generator=gen, dtype=torch.bfloat16)
    compiled = torch.compile(quantizer.quantize_groups, fullgraph=True, backend="eager")
    (q, scale), (want_q, want_scale) = compiled(a), quantizer.quantize_groups(a)
    assert q.shape == (3, 7, 64) and scale.shape == (3, 7, 2)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale, want_scale)


# Run in a process without the interpreter: the examples' kernels compiled for sm_90
# with their default configs (the GPU's frontend refuses what the interpreter lets
# through, such as a kernel reading a module global that is not a constexpr).
SM90_COMPILE = """
import importlib, sys
import torch, triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

folder = sys.argv[1]
sys.path.insert(0, folder)
for name in sys.argv[2:]:
    module = importlib.import_module(name)
    kernel = getattr(module, f"_{name}_kernel")
    item = {torch.bfloat16: "bf16", torch.float16: "fp16"}[module.DTYPES[0]]
    stored = {}
    for n, q in module.QUANT.items():
        storage = {"int8": "u8" if q.zero_point else "i8", "int4": "u8", "fp8_e4m3": "fp8e4nv",
                   "fp8_e5m2": "fp8e5"}
        stored[f"{n}_ptr"] = storage[q.dtype]
        stored.update({f"{n}_scale_ptr": "fp32", f"{n}_zero_ptr": "u8"})
    if hasattr(module, "GROUP"):  # a quantizer
        width = triton.next_power_of_2(module.GROUP or 4096)
        stored.update(out_ptr={torch.float8_e4m3fn: "fp8e4nv"}.get(module.OUT_DTYPE, "fp8e5"),
                      scale_ptr="fp32")
        configs = [{"BLOCK_M": 1, "BLOCK_N": width, "ROUND_BY_HAND": False, "num_warps": 8}]
    else:  # the tile path, split-K's, and the GEMV path where there is one
        split = [c for c in module.CONFIGS if c.get("SPLIT_K", 1) > 1][:1]
        stored.update(partials_ptr="fp32", arrivals_ptr="i32")
        gemv = [c for c in module.CONFIGS if c["BLOCK_M"] == 1][:1]
        configs = [module.DEFAULT_CONFIG] + split + gemv
    # An int argument of 1 is compiled as a constant: the one-row call's rows too.
    one_row = getattr(module, "ROW", None)
    for config in configs + [dict(c, **{one_row: 1}) for c in configs if one_row]:
        meta = {"SPLIT_K": 1, **{k: v for k, v in config.items() if k.isupper() or k == one_row}}
        meta["DOT_DTYPE"] = {"bf16": tl.bfloat16, "fp16": tl.float16}[item]
        options = {k: v for k, v in config.items() if not k.isupper() and k != one_row}
        meta.update(INT64=False, FAST_TANH=True)
        signature, constants = {}, {}
        for i, p in enumerate(kernel.params):
            if p.is_constexpr or (p.name == one_row and one_row in meta):
                signature[p.name] = "constexpr"
                constants[(i,)] = meta[p.name]
            else:
                ptr = p.name.endswith("_ptr")
                signature[p.name] = "*" + stored.get(p.name, item) if ptr else "i32"
        triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32),
                       options=options)
    print(name, "compiled")
"""


def test_example_kernels_compile_for_sm90():
    names = [
        "llama_mlp_int4",
        "linear_int8",
        "gelu_fp8_rowwise",
        "deepseek_mlp_fp8",
        "quantize_fp8_rowwise",
        "quantize_fp8_groups",
    ]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", SM90_COMPILE, str(ROOT / "generated"), *names],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [w for n in names for w in (n, "compiled")]


QUANTIZE = """
kernels:
  - name: qz
    dims: {{M: dynamic, K: {k}, N: 32}}
    inputs: {{x: [M, K], w: [K, N]}}
    chain:
{steps}
"""


@pytest.mark.parametrize(
    "steps, k, path, message",
    [
        (
            ["input: x", "quantize: {dtype: int8}"],
            "dynamic",
            (1, "quantize", "dtype"),
            "fp8 values",
        ),
        (
            ["input: x", "quantize: {dtype: fp8_e4m3, scale: per_tensor}"],
            "dynamic",
            (1, "quantize", "scale"),
            "quantize's scale is per_row or {per_group: G}",
        ),
        (
            ["input: x", "quantize: {dtype: fp8_e4m3, scale: {per_group: 64}}"],
            "96",
            (1, "quantize", "scale"),
            "a group of 64 does not divide K = 96",
        ),
        (
            ["matmul: x @ w", "quantize: {dtype: fp8_e4m3}"],
            "dynamic",
            (0,),
            "a quantize chain starts with `input: x`",
        ),
        (
            ["matmul: x @ w", "gelu", "quantize: {dtype: fp8_e4m3}"],
            "dynamic",
            (2, "quantize"),
            "quantize ends an elementwise chain",
        ),
    ],
)
def test_quantize_errors_name_the_place(write_spec, steps, k, path, message):
    text = QUANTIZE.format(k=k, steps="\n".join(f"      - {s}" for s in steps))
    if "w" not in " ".join(steps):
        text = text.replace(", w: [K, N]", "").replace(", N: 32", "")
    found = problems(write_spec, text)
    where = ("kernels", 0, "chain", *path)
    assert any(
        p[: len(where)] == where and message in m and line > 0 for p, m, line in found
    ), found


@pytest.mark.parametrize(
    "field, path, message",
    [
        ("fallback: {nonfinite: reference}", ("fallback", "nonfinite"), "no inf/NaN fallback"),
        ("target: amd", ("target",), "generated for nvidia GPUs, not amd"),
    ],
)
def test_a_quantize_chain_refuses_what_it_would_ignore(write_spec, field, path, message):
    text = QUANTIZE.format(
        k="dynamic", steps="      - input: x\n      - quantize: {dtype: fp8_e4m3}"
    )
    text = text.replace(", w: [K, N]", "").replace(", N: 32", "")
    text = text.replace("    inputs:", f"    {field}\n    inputs:")
    found = problems(write_spec, text)
    where = ("kernels", 0, *path)
    assert any(p[: len(where)] == where and message in m for p, m, _ in found), found


def test_transposed_int4_tiles_bound_what_their_sums_carry():
    # On a GPU a transposed decode tile (SWAP_AB) sums x * (NIBBLE_BASE + q) in fp32, the
    # offset and zero point off after: the bound's p_in covers those magnitudes (42 times
    # |q - z|'s at most here in bf16, 293 in fp16), for such launches only.
    tests = generated("test_llama_mlp_int4")
    suite = tests.harness.Suite(vars(tests))
    sizes = {"M": 16, "K": 256, "N": 64}
    inputs = suite.make_inputs(sizes, torch.bfloat16, 5)
    exact = suite.logical(inputs)
    tile = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1}
    unit = 2 * (tile["BLOCK_K"] + 1) * tests.U_ACC  # one K step's sums carry them

    def extra(config, dot):
        launch = {"nibble_base": tests.kernel._CHAIN.nibble_base(config, dot), "config": config}
        return suite.carried_error(inputs, exact, launch) / unit

    assert 15 < extra(tile, "bfloat16") < 60
    assert 150 < extra(tile, "float16") < 400
    assert extra(tile, "fp32") == 0  # the interpreter's dot: the values converted
    assert extra({**tile, "BLOCK_M": 64}, "bfloat16") == 0
    assert extra({**tile, "BLOCK_N": 32}, "bfloat16") == 0
    assert extra({**tile, "BLOCK_M": 1}, "bfloat16") == 0  # the GEMV path


def test_a_transposed_tile_at_a_large_k_still_catches_scales_on_the_wrong_rows(monkeypatch):
    # On an H100 a transposed tile at K = 4224 passed the mutation test with w_gate's
    # scales flipped: its element-wise bound, K u_acc of the carried 128 + q, was 28x the
    # outputs. One K step's sums carry them (0.55x), and a 16-bit output must also be
    # within twice eager's error norm-wise, which the mutant is 25x over.
    tests = generated("test_llama_mlp_int4")
    suite = tests.harness.Suite(vars(tests))
    sizes, rows = {"M": 16, "K": 4224, "N": 64}, (16, 64)
    inputs = suite.make_inputs(sizes, torch.bfloat16, 734455155)
    launch = {"nibble_base": 128.0, "config": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128}}
    monkeypatch.setattr(tests.kernel, "last_launch", lambda: launch)
    value, bound = suite.expected(inputs)
    assert (bound / value.abs()).median() < 1
    flipped = {"w_gate_scale": inputs["w_gate_scale"].flip(0)}
    mutant = suite.expected(inputs, {}, flipped)[0].reshape(rows).to(torch.bfloat16)
    correct = value.reshape(rows).to(torch.bfloat16)
    allowed = suite.eager_allowance(inputs, value, correct, torch.bfloat16)
    assert suite.norm_error(correct, value) < allowed < suite.norm_error(mutant, value) / 10


# generated/llama_mlp_int4.py and linear_int8.py broken the ways a dequantization goes
# wrong, in both paths their tests run under the interpreter (37 rows: the tiles; one row:
# the GEMV): each copy must fail its generated reference test.
QUANT_MUTATIONS = [
    (
        "llama_mlp_int4",
        "_nibble_floats(w_gate_bytes, BLOCK_N, BLOCK_K, True, False, DOT_DTYPE)",
        "_nibble_floats(w_gate_bytes, BLOCK_N, BLOCK_K, False, False, DOT_DTYPE)",
        "a tile's nibble order swapped",
    ),
    (
        "llama_mlp_int4",
        "x_lows += x_even\n                x_low, x_high = 2.0 * x_even, 0.125 * x_odd",
        "x_lows += x_odd\n                x_low, x_high = 2.0 * x_odd, 0.125 * x_even",
        "the GEMV's nibble order swapped (high_first's lines)",
    ),
    (
        "llama_mlp_int4",
        "- (NIBBLE_BASE + w_gate_zero_k.to(tl.float32))[:, None] * x_sum[None, :]",
        "- NIBBLE_BASE * x_sum[None, :]",
        "a tile's zero point dropped",
    ),
    (
        "llama_mlp_int4",
        "w_gate_part -= (16.0 + w_gate_zero_k) * x_sums_128[None, :]",
        "w_gate_part -= 16.0 * x_sums_128[None, :]",
        "the GEMV's zero point dropped",
    ),
    (
        "llama_mlp_int4",
        "+ offs_n * stride_w_gate_scale_rows\n"
        "                + (k * BLOCK_K) // 128 * stride_w_gate_scale_groups",
        "+ offs_n * stride_w_gate_scale_groups\n"
        "                + (k * BLOCK_K) // 128 * stride_w_gate_scale_rows",
        "a tile's scales read along the wrong axis",
    ),
    (
        "linear_int8",
        "w_scale_ptr + offs_n * stride_w_scale_rows",
        "w_scale_ptr + (N - 1 - offs_n) * stride_w_scale_rows",
        "per-channel scales of the wrong rows (both paths)",
    ),
]


def test_generated_tests_catch_broken_dequantization(tmp_path):
    from test_kernels import run_mutants

    output = run_mutants(ROOT / "generated", tmp_path, QUANT_MUTATIONS, "matches_reference")
    assert "outside the bound" in output


def test_tuning_passes_over_a_config_ptxas_crashes_on(monkeypatch):
    """ptxas 12.8 segfaults on a few configs that fit (an H200's attention bias backward
    met one): the launcher's tuning times the others instead of failing the call."""
    from triton.runtime.errors import PTXASError

    module = generated("linear_int8")
    chain = module._CHAIN
    device = sys.modules[type(chain).__module__.rsplit(".", 1)[0] + ".device"]
    tiles = [c for c in module.CONFIGS if c["BLOCK_M"] > 1 and c.get("SPLIT_K", 1) == 1]
    crashing, timed = tiles[0], []

    def launch(plan, views, out2d, config):
        if config is crashing:
            raise PTXASError("`ptxas` failed with error code -11")
        timed.append(config)

    def graph_bench(call):
        call()
        return [1.0 + len(timed)]  # the first config that runs is the fastest

    monkeypatch.setattr(chain, "launch", launch)
    monkeypatch.setattr(device, "graph_bench", graph_bench)
    plan = {"rows": 4096, "words": False}
    best = chain.tune(plan, None, torch.empty(1))
    assert crashing not in timed and best is timed[0]


def test_meta_tensors_give_shapes_under_the_interpreter_too():
    """Meta tensors (a model built on `torch.device("meta")`) take the reference, which
    gives the output's shape and dtype: the interpreter runs CPU tensors only (it crashed
    inside Triton on meta ones)."""
    meta = {"device": "meta"}
    mlp = generated("llama_mlp_gate_up")
    x = torch.empty(3, 4096, dtype=torch.bfloat16, **meta)
    w = torch.empty(14336, 4096, dtype=torch.bfloat16, **meta)
    out = mlp.llama_mlp_gate_up(x, w, w)
    assert (out.shape, out.dtype, out.device.type) == ((3, 14336), torch.bfloat16, "meta")
    attention = generated("llama3_attention")
    q = torch.empty(2, 5, 32, 128, dtype=torch.bfloat16, requires_grad=True, **meta)
    kv = torch.empty(2, 5, 8, 128, dtype=torch.bfloat16, **meta)
    attention.llama3_attention(q, kv, kv).sum().backward()
    assert q.grad.shape == q.shape and q.grad.device.type == "meta"
    fp8 = generated("deepseek_mlp_fp8")
    x8 = torch.empty(3, 256, dtype=torch.float8_e4m3fn, **meta)
    w8 = torch.empty(128, 256, dtype=torch.float8_e4m3fn, **meta)
    scales = torch.empty(3, 2, **meta), torch.empty(1, 2, **meta)
    out = fp8.deepseek_mlp_fp8(x8, scales[0], w8, scales[1], w8, scales[1])
    assert out.shape == (3, 128) and out.device.type == "meta"


def test_a_view_whose_offsets_pass_2_31_takes_int64_offsets():
    # x = big[:, :K] holds few elements, but its rows lie 2**26 apart: its last offset is
    # past 2**31, which the element counts alone (the earlier rule) did not see. Meta
    # tensors: the plan is made, the reference gives the shapes.
    module = generated("linear_int8")
    meta = {"device": "meta"}
    w = torch.empty(48, 64, dtype=torch.int8, **meta)
    w_scale, b = torch.empty(48, **meta), torch.empty(48, dtype=torch.bfloat16, **meta)
    for row_stride, wide in ((1024, False), (2**26, True)):
        x = torch.empty(40, row_stride, dtype=torch.bfloat16, **meta)[:, :64]
        module._CHAIN.plans.clear()
        assert module.linear_int8(x, w, w_scale, b).shape == (40, 48)
        (plan,) = module._CHAIN.plans.values()
        assert plan["consts"]["INT64"] is wide


def test_quantizers_round_ties_to_even_as_torch_does():
    # bf16 inputs make exact ties on the fp8 grid common (x / scale = 84 between 80 and
    # 88): the interpreter's hand rounding took them up, torch's cast (and the GPU's) to
    # even; 27 of 5,100 values differed.
    rowwise, groups = generated("quantize_fp8_rowwise"), generated("quantize_fp8_groups")
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(17, 384, generator=gen) * 3).to(torch.bfloat16)
    for module, name in ((rowwise, "quantize_fp8_rowwise"), (groups, "quantize_fp8_groups")):
        q, scale = getattr(module, name)(x)
        want_q, want_scale = module.reference(x)
        assert torch.equal(scale, want_scale), name
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), name


def test_the_quantizer_check_refuses_values_truncated_toward_zero():
    # The allowance is half an fp8 step (round to nearest): a kernel that truncates, off
    # by up to a whole step, must fail it, and the kernel's own output must pass.
    tests = generated("test_quantize_fp8_rowwise")
    suite = tests.harness.QuantizerSuite(vars(tests))
    inputs = suite.make_inputs({**suite.sizes, **suite.cases[-1]}, torch.float16, 11)
    q, scale = suite.run(inputs)
    assert suite.check(inputs, q, scale, 11) == (True, True)
    exact = inputs["x"].double() / scale.double()[:, None]
    nearest = exact.clamp(-448, 448).to(torch.float8_e4m3fn)
    bits = nearest.view(torch.uint8).to(torch.int16)
    # The fp8 value next toward zero wherever rounding went away from it (the magnitude
    # is the low seven bits).
    away = (nearest.double().abs() > exact.abs()) & ((bits & 0x7F) > 0)
    truncated = torch.where(away, bits - 1, bits).to(torch.uint8).view(torch.float8_e4m3fn)
    assert bool(away.any())
    assert suite.check(inputs, truncated, scale, 11)[1] is False
