"""The tests of a generated quantized-chain test module: the kernel against the chain in
float64 on the dequantized inputs, within the bound its `reference_and_bound` derives;
mutated references (scales on the wrong rows, nibbles swapped, zero points dropped)
outside it, so the check is known to catch those bugs; the launcher's refusals, its
configs, torch.compile and the fallback.

A test module states: kernel, LAUNCHER, DTYPES, ROW, COL, K, CASES, INPUTS (name:
(pinned dtype or None, "quantized" / "weight" / "normal" / "nonzero")), MATMUL (operand:
"a" or "b") and reference_and_bound(p_in, depth, fast_tanh, **float64 inputs)."""

import math

import pytest
import torch

from .equivalence import (  # noqa: F401 - the generated modules' bounds use U32, U_ACC, dot_error
    DEVICE,
    INTERPRETER_OUT_ROUNDING,
    ON_GPU,
    OUT_ROUNDING,
    U32,
    U_ACC,
    dot_error,
    norm_error,
    new_seed,
    outside_bound,
)
from .quant import cdiv, dequantize, draw_quantized, spread

# What each scale product adds to a sum's error: the scales' own product, the partial
# sum times it and its addition (a K-step's), the epilogue's two multiplications.
SCALE_PRODUCTS = 8 * U32
# On the CPU, dynamo's tracing of a launcher (its custom op and fake) is tested once for
# every quantized module, in fusegen's tests/test_quant.py: it costs seconds a module.
COMPILED_ON_CPU = "traced on the CPU by fusegen's tests/test_quant.py; here on a GPU"


def input_shapes(suite, sizes, lead=None):
    """(name, pinned dtype, distribution, shape) of each input a suite draws: its dims'
    sizes, with `lead` in place of the row dim where the input takes batch dims."""
    for name, (pinned, dist) in suite.inputs.items():
        shape = [sizes[d] for d in suite.dims[name]]
        if lead is not None and suite.batched[name]:
            shape = [*lead, *shape[1:]]
        yield name, pinned, dist, shape


def dtype_id(dtype):
    return str(dtype).replace("torch.", "")


class Suite:
    def __init__(self, namespace):
        self.kernel = namespace["kernel"]
        self.launcher = namespace["LAUNCHER"]
        self.dtypes = namespace["DTYPES"]
        self.row, self.col, self.k = namespace["ROW"], namespace["COL"], namespace["K"]
        self.cases = namespace["CASES"]
        self.inputs = namespace["INPUTS"]
        self.matmul = namespace["MATMUL"]
        self.reference_and_bound = namespace["reference_and_bound"]
        self.quant = self.kernel.QUANT
        self.dims = {name: dims for name, dims, _ in self.kernel.INPUTS}
        self.batched = {name: batched for name, _, batched in self.kernel.INPUTS}
        self.sizes = {d: s for d, s in self.kernel.DIMS.items() if s is not None}
        chain = self.kernel._CHAIN
        self.interpreted = type(chain.kernel).__name__ == "InterpretedFunction"
        self.out_rounding = INTERPRETER_OUT_ROUNDING if self.interpreted else OUT_ROUNDING

    def sizes_of(self, case):
        return {**self.sizes, **case}

    def paths(self):
        """(name, sizes, config) of each kernel path a call can take: the tiles at the
        last case's sizes (the launcher's config), and where the module has the GEMV
        path, one row with a GEMV config (the interpreter's, else the first of CONFIGS)."""
        found = [("tiles", self.sizes_of(self.cases[-1]), None)]
        gemv = [c for c in self.kernel.CONFIGS if c["BLOCK_M"] == 1]
        if gemv and self.kernel.DIMS[self.row] in (None, 1):
            config = self.kernel.INTERPRETER_GEMV_CONFIG if self.interpreted else gemv[0]
            found.append(
                ("gemv", self.word_sizes({**self.sizes_of(self.cases[-1]), self.row: 1}), config)
            )
        return found

    def word_sizes(self, sizes):
        """`sizes` with K a whole number of 32-bit words of the weights (8 int4 or 4 int8
        values), as the GEMV path reads them, where K is dynamic."""
        if self.kernel.DIMS[self.k] is not None:
            return sizes
        return {**sizes, self.k: cdiv(sizes[self.k], 8) * 8}

    # -- inputs ------------------------------------------------------------------------

    def make_inputs(self, sizes, dtype, seed, scale_dtype=torch.float32, lead=None):
        """The launcher's tensors by argument name, drawn on the CPU then moved."""
        gen = torch.Generator().manual_seed(seed)
        out = {}
        for name, pinned, dist, shape in input_shapes(self, sizes, lead):
            q = self.quant.get(name)
            if q is None:
                values = torch.randn(shape, generator=gen)
                if dist == "weight":
                    values = values * max(1, sizes[self.k]) ** -0.5  # K = 0: no values
                elif dist == "nonzero":
                    values = values.sign() * (0.5 + values.abs())
                out[name] = values.to(pinned or dtype).to(DEVICE)
                continue
            out.update(self.quantized(name, q, shape, sizes, gen, scale_dtype, lead))
        return out

    def quantized(self, name, q, shape, sizes, gen, scale_dtype, lead):
        fan = max(1, sizes[self.k]) ** -0.5 if self.matmul.get(name) == "b" else 1.0
        tensors = draw_quantized(name, q, shape, fan, gen, scale_dtype)
        return {n: t.to(DEVICE) for n, t in tensors.items()}

    def logical(self, inputs, quant=None):
        """The chain's inputs in float64: each quantized one dequantized exactly (with
        `quant` in place of its Quant where given: a mutation's)."""
        quant = {**self.quant, **(quant or {})}
        out = {}
        for name in self.inputs:
            q = quant.get(name)
            if q is None:
                out[name] = inputs[name].double()
            else:
                zero = inputs.get(f"{name}_zero") if q.zero_point else None
                out[name] = dequantize(
                    inputs[name], inputs[f"{name}_scale"], zero, q, torch.float64
                )
        return out

    # -- checks ------------------------------------------------------------------------

    def expected(self, inputs, quant=None, scales=None):
        exact = self.logical({**inputs, **(scales or {})}, quant)
        launch = self.kernel.last_launch()
        fast = int(launch.get("fast_tanh", False))
        p_in = SCALE_PRODUCTS + self.carried_error(inputs, exact, launch)
        ((value, bound),) = self.reference_and_bound(p_in, 1, fast, **exact)
        return value, bound

    def carried_error(self, inputs, exact, launch):
        """What a launch whose int4 weights reached the dot as NIBBLE_BASE + q (its
        `nibble_base`: a transposed decode tile's) adds to each dot's relative error. Each
        K step's dot starts at zero and has the offset and zero point, (NIBBLE_BASE + z)
        * sum(x), taken off before its scale multiplies it, so only that step's fp32 sums
        carry the larger values: their rounding is bounded by BLOCK_K * U_ACC of |x| @
        (NIBBLE_BASE + 15 + z) * s over the step, twice over (the dot and the row sums)
        plus the product and the subtraction, not by K * U_ACC of |x| @ |w|: the ratio of
        the two, at its largest, times that. 0 for any other launch."""
        base = launch.get("nibble_base", 0.0)
        if not base:
            return 0.0
        a = next(exact[n] for n, role in self.matmul.items() if role == "a").abs()
        a = a.reshape(-1, a.shape[-1])
        worst = 0.0
        for name, role in self.matmul.items():
            q = self.quant.get(name)
            if role != "b" or q is None or q.dtype != "int4":
                continue
            rows, k = exact[name].shape
            z = spread(inputs[f"{name}_zero"].double(), q, rows, k) if q.zero_point else 8.0
            s = spread(inputs[f"{name}_scale"].double(), q, rows, k).abs()
            carried = torch.broadcast_to((base + 15.0 + z) * s, (rows, k))
            tiny = torch.finfo(torch.float64).tiny
            ratio = (a @ carried.T) / (a @ exact[name].abs().T).clamp_min(tiny)
            worst = max(worst, ratio.max().item())
        return 2 * (launch["config"]["BLOCK_K"] + 1) * U_ACC * worst

    def outside(self, out, value, bound):
        """Where the output is outside the bound (the output's rounding included)."""
        value, bound = value.reshape(out.shape), bound.reshape(out.shape)
        return outside_bound(out, value, bound, self.out_rounding[out.dtype])[0]

    def run(self, inputs, sizes, dtype, lead=None, **options):
        """The launcher's output, written into a NaN-filled buffer."""
        rows = [sizes[self.row]] if lead is None else list(lead)
        out_dtype = self.kernel.OUT_DTYPE or dtype  # a chain ending in a cast: the cast's
        out = torch.full((*rows, sizes[self.col]), float("nan"), dtype=out_dtype, device=DEVICE)
        result = self.launcher(**inputs, out=out, **options)
        assert result is out
        return out

    def check(self, inputs, sizes, dtype, seed, lead=None, **options):
        out = self.run(inputs, sizes, dtype, lead, **options)
        launch = self.kernel.last_launch()
        assert launch["source"] == "kernel", f"the kernel did not run: {launch}"
        value, bound = self.expected(inputs)
        bad = self.outside(out, value, bound)
        if bad.any():
            first = tuple(bad.nonzero()[0].tolist())
            pytest.fail(
                f"{int(bad.sum())} of {bad.numel()} elements are outside the bound (seed "
                f"{seed}, {dtype}, {launch}); first at {first}: got {out[first].item()!r}, "
                f"expected {value.reshape(out.shape)[first].item()!r}"
            )
        allowed = self.eager_allowance(inputs, value, out, dtype)
        error = self.norm_error(out, value)
        if allowed is not None and not error <= allowed:
            pytest.fail(
                f"norm-wise error {error:.3g} against float64, over twice eager's plus a "
                f"rounding ({allowed:.3g}; seed {seed}, {dtype}, {launch})"
            )
        return out

    def norm_error(self, out, value):
        """||out - value|| / ||value|| over the elements `value` has in out's range."""
        value = value.reshape(out.shape)
        finite = torch.isfinite(out) & (value.abs() <= torch.finfo(out.dtype).max)
        return norm_error(out[finite], value[finite], out.dtype)

    def eager_allowance(self, inputs, value, out, dtype):
        """The norm-wise error a 16-bit output may have against float64: twice the chain's
        one PyTorch op at a time in the output's dtype (eager: the reference, its inputs
        dequantized into that dtype), plus one rounding. The element-wise bound is a
        worst case, loose by about sqrt(K): on a transposed decode tile, whose fp32 sums
        carry 128 + q, it is as large as the outputs at K = 4224, so a kernel reading one
        weight's scales on the wrong rows passed it (docs/tolerances.md). None for fp32
        calls and outputs, whose accumulation order matters at their own roundoff."""
        sixteen = (torch.float16, torch.bfloat16)
        if dtype not in sixteen or out.dtype not in sixteen:
            return None
        cast = self.kernel.OUT_DTYPE is not None  # the reference takes no other out_dtype
        eager = self.kernel.reference(**inputs, out_dtype=None if cast else dtype)
        eager_error = self.norm_error(eager.reshape(out.shape), value)
        return 2 * eager_error + self.out_rounding[out.dtype]

    def mutations(self, inputs):
        """(what, quant overrides, scale overrides) for bugs a kernel could have."""
        found = []
        for name, q in self.quant.items():
            scale = inputs[f"{name}_scale"]
            rows = scale.numel() if q.scale == "row" else scale.shape[0]
            ones = torch.ones_like(scale)
            found.append((f"{name}'s scales not applied", {}, {f"{name}_scale": ones}))
            if q.scale != "tensor" and rows > 1:
                flipped = scale.flip(0)
                found.append((f"{name}'s scales on the wrong rows", {}, {f"{name}_scale": flipped}))
            if q.scale in ("group", "block") and scale.shape[-1] > 1:
                rolled = scale.roll(1, dims=-1)
                found.append((f"{name}'s groups off by one along K", {}, {f"{name}_scale": rolled}))
            if q.dtype == "int4":
                other = "high_first" if q.packing == "low_first" else "low_first"
                found.append((f"{name}'s nibbles swapped", {name: q._replace(packing=other)}, {}))
            if q.zero_point and inputs[f"{name}_zero"].any():  # all 0: nothing to drop
                zero = torch.zeros_like(inputs[f"{name}_zero"])
                found.append((f"{name}'s zero points dropped", {}, {f"{name}_zero": zero}))
        return found


def quant_tests(namespace):
    suite = Suite(namespace)
    tests = [*value_tests(suite), *launcher_tests(suite)]
    return {"SUITE": suite, **{t.__name__: t for t in tests}}


def value_tests(suite):
    @pytest.mark.parametrize(
        "case", suite.cases, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items())
    )
    @pytest.mark.parametrize("dtype", suite.dtypes, ids=dtype_id)
    def test_matches_reference(dtype, case):
        seed, sizes = new_seed(), suite.sizes_of(case)
        suite.check(suite.make_inputs(sizes, dtype, seed), sizes, dtype, seed)

    paths = suite.paths()

    @pytest.mark.parametrize("path", paths, ids=lambda p: p[0])
    def test_mutations_fall_outside_the_bound(path):
        # A kernel with one of these bugs would fail test_matches_reference.
        _, sizes, config = path
        seed, dtype = new_seed(), suite.dtypes[0]
        inputs = suite.make_inputs(sizes, dtype, seed)
        out = suite.check(inputs, sizes, dtype, seed, config=config)
        mutations = suite.mutations(inputs)
        assert mutations, "no mutation applies"
        value = suite.expected(inputs)[0]
        allowed = suite.eager_allowance(inputs, value, out, dtype)
        for what, quant, scales in mutations:
            wrong, bound = suite.expected(inputs, quant, scales)
            # Caught element-wise (the kernel's output outside the mutant's bound), or
            # norm-wise (the mutant's value, rounded as the kernel's output would be, over
            # what check allows a 16-bit output against the true value).
            caught = suite.outside(out, wrong, bound).any() or (
                allowed is not None
                and suite.norm_error(wrong.reshape(out.shape).to(out.dtype), value) > allowed
            )
            assert caught, f"{what}: not caught (seed {seed})"

    def test_scales_in_16_bits():
        seed, sizes = new_seed(), suite.sizes_of(suite.cases[0])
        dtype = suite.dtypes[0]
        inputs = suite.make_inputs(sizes, dtype, seed, scale_dtype=torch.bfloat16)
        suite.check(inputs, sizes, dtype, seed)

    def in_wider(t, cols):
        """t as the `cols` columns of a zeroed tensor twice as wide (a strided view)."""
        wide = torch.zeros((t.shape[0], 2 * t.shape[1]), dtype=t.dtype, device=DEVICE)
        wide[:, cols] = t
        return wide[:, cols]

    @pytest.mark.parametrize("path", paths, ids=lambda p: p[0])
    def test_strided_inputs(path):
        # Every 2-D tensor a view of every other column of one twice as wide, zero
        # points column-major (their strides then differ from their scales'); on the
        # GEMV path, which reads them as 32-bit words, the quantized weights a view of
        # the first half of each row instead (rows apart, contiguous along K).
        name_, sizes, config = path
        seed, dtype = new_seed(), suite.dtypes[-1]
        inputs = suite.make_inputs(sizes, dtype, seed)
        strided = {}
        for name, t in inputs.items():
            if t.dim() == 2 and name.endswith("_zero"):
                t = t.T.contiguous().T
            elif t.dim() == 2:
                words = name_ == "gemv" and name in suite.quant
                t = in_wider(t, slice(0, t.shape[1]) if words else slice(None, None, 2))
            strided[name] = t
        suite.check(strided, sizes, dtype, seed, config=config)
        if name_ == "gemv":
            # Weights strided along K run the tiles; a GEMV config is refused.
            weights = {n: in_wider(strided[n], slice(None, None, 2)) for n in suite.quant}
            inputs = {**strided, **weights}
            suite.check(inputs, sizes, dtype, seed)
            assert suite.kernel.last_launch()["config"]["BLOCK_M"] > 1
            with pytest.raises(ValueError, match="32-bit words"):
                suite.launcher(**inputs, config=config)

    batched = [n for n, b in suite.batched.items() if b]

    @pytest.mark.skipif(not batched, reason="no input takes batch dims")
    @pytest.mark.skipif(suite.kernel.DIMS[suite.row] is not None, reason="the spec fixes the rows")
    def test_batched_leading_dims():
        seed, sizes = new_seed(), {**suite.sizes_of(suite.cases[0]), suite.row: 6}
        dtype = suite.dtypes[0]
        inputs = suite.make_inputs(sizes, dtype, seed, lead=[2, 3])
        suite.check(inputs, sizes, dtype, seed, lead=[2, 3])

    dynamic = [dim for dim, size in suite.kernel.DIMS.items() if size is None]

    @pytest.mark.skipif(not dynamic, reason="the spec fixes every dim")
    @pytest.mark.parametrize("dim", dynamic or [None])
    def test_a_dim_of_size_zero(dim):
        # An empty batch, no columns or K = 0 (scales and zero points of no groups): the
        # reference's values (the epilogue of zero sums at K = 0) in a buffer of NaN.
        dtype, sizes = suite.dtypes[0], {**suite.sizes_of(suite.cases[0]), dim: 0}
        inputs = suite.make_inputs(sizes, dtype, new_seed())
        want = suite.kernel.reference(**inputs, out_dtype=torch.float64)
        out = torch.full(want.shape, float("nan"), dtype=want.dtype, device=DEVICE)
        got = suite.launcher(**inputs, out=out.to(suite.kernel.OUT_DTYPE or dtype))
        torch.testing.assert_close(got.double(), want.to(got.dtype).double(), rtol=2e-2, atol=1e-3)

    return [
        test_matches_reference,
        test_mutations_fall_outside_the_bound,
        test_scales_in_16_bits,
        test_strided_inputs,
        test_batched_leading_dims,
        test_a_dim_of_size_zero,
    ]


def launcher_tests(suite):
    kernel = suite.kernel

    def small():
        seed, sizes = new_seed(), suite.sizes_of(suite.cases[0])
        return seed, sizes, suite.make_inputs(sizes, suite.dtypes[0], seed)

    def test_rejects_bad_scales_and_storage():
        _, _, inputs = small()
        for name, q in suite.quant.items():
            scale = inputs[f"{name}_scale"]
            wrong = {**inputs, f"{name}_scale": torch.ones(scale.numel() + 1, device=DEVICE)}
            with pytest.raises(ValueError, match=f"{name}_scale must hold"):
                suite.launcher(**wrong)
            stored = inputs[name]
            other = torch.float16 if stored.dtype != torch.float16 else torch.int8
            with pytest.raises(TypeError, match=f"{name} must be"):
                suite.launcher(**{**inputs, name: stored.to(other)})
            if q.zero_point:
                zero = inputs[f"{name}_zero"].to(torch.int32)
                with pytest.raises(TypeError, match=f"{name}_zero must be uint8"):
                    suite.launcher(**{**inputs, f"{name}_zero": zero})

    def test_inference_only():
        _, _, inputs = small()
        plain = next((n for n in suite.inputs if n not in suite.quant), None)
        if plain is None:
            pytest.skip("every input is quantized: none can require grad")
        inputs[plain] = inputs[plain].clone().requires_grad_()
        with pytest.raises(RuntimeError, match="inference-only"):
            suite.launcher(**inputs)
        with torch.no_grad():
            suite.launcher(**inputs)

    def test_every_config():
        # The interpreter runs the default config beside its own, and the first and last
        # split-K configs of each path (the last tile a transposed one, SWAP_AB, where
        # the module has it); a GPU every config.
        seed, sizes, inputs = small()
        words = suite.word_sizes(sizes)  # the GEMV path's K
        word_inputs = suite.make_inputs(words, suite.dtypes[0], seed)
        split = [c for c in kernel.CONFIGS if c.get("SPLIT_K", 1) > 1]
        tiles = [c for c in split if c["BLOCK_M"] > 1]
        tiles = tiles[:1] + tiles[1:][-1:]
        gemv = [c for c in split if c["BLOCK_M"] == 1][:1]
        configs = kernel.CONFIGS if ON_GPU else [kernel.DEFAULT_CONFIG, *tiles, *gemv]
        for config in configs:
            at, given = (words, word_inputs) if config["BLOCK_M"] == 1 else (sizes, inputs)
            reach = config["BLOCK_K"] * (config.get("SPLIT_K", 1) - 1)
            if at[suite.k] <= reach and kernel.DIMS[suite.k] is None:
                # The last split would have no K step (a split dropped from the sum would
                # pass): K just past it, in whole groups and 32-bit words of the weights.
                unit = math.lcm(8, *(q.group for q in suite.quant.values() if q.group))
                at = {**at, suite.k: (reach // unit + 1) * unit}
                given = suite.make_inputs(at, suite.dtypes[0], seed)
            suite.check(given, at, suite.dtypes[0], seed, config=config)
            assert kernel.last_launch()["config"] == config

    def test_rejects_configs_that_cannot_compile():
        _, _, inputs = small()
        tile = next(c for c in kernel.CONFIGS if c["BLOCK_M"] > 1)
        with pytest.raises(ValueError, match="config must be a dict with keys"):
            suite.launcher(**inputs, config={"BLOCK_M": tile["BLOCK_M"]})
        bad = {**tile, "BLOCK_N": 24, "SPLIT_K": 3}
        with pytest.raises(ValueError, match="BLOCK_N = 24 is not a power of two.*SPLIT_K = 3"):
            suite.launcher(**inputs, config=bad)
        if not any(c["BLOCK_M"] == 1 for c in kernel.CONFIGS):
            with pytest.raises(ValueError, match="BLOCK_M 1 is the one-row GEMV path"):
                suite.launcher(**inputs, config={**tile, "BLOCK_M": 1})

    def test_rejects_configs_across_groups():
        # A K step over two groups would apply one group's scale to both: wrong values.
        groups = [q.group for q in suite.quant.values() if q.group]
        if not groups:
            pytest.skip("no input has group or block scales")
        seed, sizes, inputs = small()
        tile = next(c for c in kernel.CONFIGS if c["BLOCK_M"] > 1)
        with pytest.raises(ValueError, match="within one group"):
            suite.launcher(**inputs, config={**tile, "BLOCK_K": 2 * max(groups)})
        gemv = next((c for c in kernel.CONFIGS if c["BLOCK_M"] == 1), None)
        if gemv is not None:
            words = suite.word_sizes(sizes)
            word_inputs = suite.make_inputs(words, suite.dtypes[0], seed)
            with pytest.raises(ValueError, match="whole groups"):
                suite.launcher(**word_inputs, config={**gemv, "BLOCK_K": min(groups) // 2})

    def test_falls_back_without_gpu(monkeypatch):
        seed, sizes, inputs = small()
        chain = kernel._CHAIN
        plan = chain.plan

        def no_gpu(*args):
            return {**plan(*args), "runs_triton": False}

        monkeypatch.setattr(chain, "plan", no_gpu)
        monkeypatch.setattr(chain, "plans", {})
        if kernel.NO_GPU == "error":  # the spec's fallback: {no_gpu: error}
            with pytest.raises(RuntimeError, match="no CUDA GPU"):
                suite.launcher(**inputs)
            return
        out = suite.launcher(**inputs)
        assert kernel.last_launch()["source"].startswith("reference")
        # The module's reference, run in the call's dtype as eager PyTorch would.
        assert torch.equal(out, kernel.reference(**inputs))

    @pytest.mark.skipif(not ON_GPU, reason=COMPILED_ON_CPU)
    def test_runs_inside_torch_compile():
        seed, sizes, inputs = small()
        compiled = torch.compile(lambda **t: suite.launcher(**t), fullgraph=True)
        out = compiled(**inputs)
        want = suite.launcher(**inputs)
        torch.testing.assert_close(out, want, rtol=0, atol=0)

    @pytest.mark.skipif(not ON_GPU, reason="tuning times configs on a GPU")
    def test_tunes_once_per_key(monkeypatch):
        _, _, inputs = small()
        monkeypatch.setattr(kernel._CHAIN, "tuned", {})
        # The `tl` kernel's configs: a call the Gluon kernel takes (quant_hopper) has none.
        monkeypatch.setattr(kernel._CHAIN, "hopper", None)
        monkeypatch.setattr(kernel._CHAIN, "plans", {})
        suite.launcher(**inputs)
        assert len(kernel._CHAIN.tuned) == 1
        ((config, chosen_by),) = kernel._CHAIN.tuned.values()
        assert kernel.last_launch()["config"] == config
        assert kernel.last_launch()["config_from"] == chosen_by
        # From the tuned table beside the module where it has an entry for this GPU.
        assert chosen_by == "table" or (chosen_by == "tuned" and config in kernel.CONFIGS)

    return [
        test_rejects_bad_scales_and_storage,
        test_inference_only,
        test_every_config,
        test_rejects_configs_that_cannot_compile,
        test_rejects_configs_across_groups,
        test_falls_back_without_gpu,
        test_runs_inside_torch_compile,
        test_tunes_once_per_key,
    ]


# -- quantizers: a chain's value rounded to fp8 with its scales ----------------------


def fp8_step(t, fp8_dtype):
    """The spacing of fp8 values at |t| (float64): 2**(exponent - mantissa bits), and
    the subnormals' below the smallest normal."""
    info = torch.finfo(fp8_dtype)
    mantissa = 3 if fp8_dtype == torch.float8_e4m3fn else 2
    exponent = torch.floor(torch.log2(t.abs().clamp_min(info.smallest_normal)))
    return torch.exp2(exponent - mantissa)


class QuantizerSuite:
    def __init__(self, namespace):
        self.kernel = namespace["kernel"]
        self.launcher = namespace["LAUNCHER"]
        self.dtypes = namespace["DTYPES"]
        self.row, self.col = namespace["ROW"], namespace["COL"]
        self.cases = namespace["CASES"]
        self.inputs = namespace["INPUTS"]
        self.reference_and_bound = namespace["reference_and_bound"]
        self.dims = {name: dims for name, dims, _ in self.kernel.INPUTS}
        self.batched = {name: batched for name, _, batched in self.kernel.INPUTS}
        self.sizes = {d: s for d, s in self.kernel.DIMS.items() if s is not None}
        self.fp8 = self.kernel.OUT_DTYPE
        self.group = self.kernel.GROUP

    def make_inputs(self, sizes, dtype, seed, lead=None):
        gen = torch.Generator().manual_seed(seed)
        out = {}
        for name, pinned, dist, shape in input_shapes(self, sizes, lead):
            values = torch.randn(shape, generator=gen)
            if dist == "nonzero":
                values = values.sign() * (0.5 + values.abs())
            if self.batched[name] and len(self.dims[name]) == 2:
                rows = values.view(-1, shape[-1])
                rows[0] = 0.0  # all zero: the scale's floor
                if rows.shape[0] > 2:
                    rows[2] *= 1000.0
            out[name] = values.to(pinned or dtype).to(DEVICE)
        return out

    def run(self, inputs):
        """(q, scale) from the launcher, into outputs filled with NaN."""
        first = inputs[next(n for n, b in self.batched.items() if b)]
        cols = first.shape[-1]
        q = torch.full(first.shape, float("nan"), device=DEVICE).to(self.fp8)
        lead = tuple(first.shape[:-1])
        scale_shape = (*lead, cols // self.group) if self.group else lead
        scale = torch.full(scale_shape, float("nan"), device=DEVICE)
        got = self.launcher(**inputs, out=q, scale=scale)
        assert got[0] is q and got[1] is scale
        return q, scale

    def check(self, inputs, q, scale, seed, scale_for_values=None):
        """Every scale and fp8 value within its bound; returns whether all are (with
        `scale_for_values`: the values checked against those scales instead)."""
        exact = {n: t.double() for n, t in inputs.items()}
        fast = int(self.kernel.last_launch().get("fast_tanh", False))
        ((value, bound),) = self.reference_and_bound(0.0, 1, fast, **exact)
        width = self.group or value.shape[-1]
        parts = value.reshape(-1, value.shape[-1] // width, width)
        errors = bound.reshape(parts.shape)
        fp8_max = self.kernel.FP8_MAX
        s = scale.double().reshape(parts.shape[:2])
        amax = parts.abs().amax(-1)
        want = amax.clamp_min(1e-12) / fp8_max
        slack = errors.amax(-1) / fp8_max + want * 2.0**-22
        scales_ok = ((s - want).abs() <= slack).all()
        used = s if scale_for_values is None else scale_for_values.double().reshape(s.shape)
        t = parts / used[..., None]
        got = q.double().reshape(parts.shape)
        # Rounded to the nearest fp8 value: within half a step (the cast's RN, or the
        # interpreter's rounding by hand; floor or truncation would take up to a whole).
        allowed = 0.5 * fp8_step(t, self.fp8) + errors / used[..., None] + t.abs() * 2.0**-20
        values_ok = ((got - t.clamp(-fp8_max, fp8_max)).abs() <= allowed).all()
        return bool(scales_ok), bool(values_ok)


def quantizer_tests(namespace):
    suite = QuantizerSuite(namespace)

    @pytest.mark.parametrize(
        "case", suite.cases, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items())
    )
    @pytest.mark.parametrize("dtype", suite.dtypes, ids=dtype_id)
    def test_matches_reference(dtype, case):
        seed = new_seed()
        inputs = suite.make_inputs({**suite.sizes, **case}, dtype, seed)
        q, scale = suite.run(inputs)
        assert suite.kernel.last_launch()["source"] == "kernel"
        assert suite.check(inputs, q, scale, seed) == (True, True), f"seed {seed}, {dtype}"

    def test_scales_of_the_wrong_rows_fail():
        seed = new_seed()
        inputs = suite.make_inputs({**suite.sizes, **suite.cases[-1]}, suite.dtypes[0], seed)
        q, scale = suite.run(inputs)
        flipped = scale.reshape(scale.shape[0], -1).flip(0).reshape(scale.shape)
        assert suite.check(inputs, q, scale, seed, scale_for_values=flipped)[1] is False

    batched = [n for n, b in suite.batched.items() if b]

    @pytest.mark.skipif(suite.kernel.DIMS[suite.row] is not None, reason="the spec fixes the rows")
    def test_an_empty_batch():
        # No rows: empty values and scales, from the launcher and the reference alike.
        inputs = suite.make_inputs({**suite.sizes, **suite.cases[0]}, suite.dtypes[0], new_seed())
        empty = {n: t[:0] if n in batched else t for n, t in inputs.items()}
        for q, scale in (suite.run(empty), suite.kernel.reference(**empty)):
            assert q.numel() == 0 and scale.numel() == 0

    @pytest.mark.skipif(suite.kernel.DIMS[suite.col] is not None, reason="the spec fixes K")
    def test_rows_of_no_values():
        # A row's scale needs a value (its scale would be left unwritten); groups of none
        # are none.
        inputs = suite.make_inputs({**suite.sizes, **suite.cases[0]}, suite.dtypes[0], new_seed())
        empty = {n: t[..., :0] if n in batched else t for n, t in inputs.items()}
        if suite.group:
            q, scale = suite.run(empty)
            assert q.numel() == 0 and scale.shape[-1] == 0
            return
        for call in (suite.launcher, suite.kernel.reference):
            with pytest.raises(ValueError, match="needs at least one value"):
                call(**empty)

    @pytest.mark.skipif(suite.kernel.DIMS[suite.row] is not None, reason="the spec fixes the rows")
    def test_batched_leading_dims():
        seed = new_seed()
        sizes = {**suite.sizes, **suite.cases[0], suite.row: 6}
        inputs = suite.make_inputs(sizes, suite.dtypes[0], seed, lead=[2, 3])
        q, scale = suite.run(inputs)
        assert q.shape[:2] == (2, 3) and scale.shape[:2] == (2, 3)
        flat = {n: t.reshape(-1, t.shape[-1]) if n in batched else t for n, t in inputs.items()}
        assert suite.check(flat, q.reshape(6, -1), scale.reshape(6, -1), seed) == (True, True)

    def test_inference_only():
        seed = new_seed()
        inputs = suite.make_inputs({**suite.sizes, **suite.cases[0]}, suite.dtypes[0], seed)
        first = batched[0]
        with pytest.raises(RuntimeError, match="no gradients"):
            suite.launcher(**{**inputs, first: inputs[first].clone().requires_grad_()})

    @pytest.mark.skipif(not ON_GPU, reason=COMPILED_ON_CPU)
    def test_runs_inside_torch_compile():
        seed = new_seed()
        inputs = suite.make_inputs({**suite.sizes, **suite.cases[0]}, suite.dtypes[0], seed)
        compiled = torch.compile(lambda **t: suite.launcher(**t), fullgraph=True)
        q, scale = compiled(**inputs)
        want_q, want_scale = suite.launcher(**inputs)
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
        assert torch.equal(scale, want_scale)

    def test_falls_back_without_gpu(monkeypatch):
        seed = new_seed()
        inputs = suite.make_inputs({**suite.sizes, **suite.cases[0]}, suite.dtypes[0], seed)
        chain = suite.kernel._QUANTIZER
        plan = chain.plan
        monkeypatch.setattr(chain, "plan", lambda *a: {**plan(*a), "runs_triton": False})
        monkeypatch.setattr(chain, "plans", {})
        if suite.kernel.NO_GPU == "error":  # the spec's fallback: {no_gpu: error}
            with pytest.raises(RuntimeError, match="no CUDA GPU"):
                suite.run(inputs)
            return
        q, scale = suite.run(inputs)
        assert suite.kernel.last_launch()["source"].startswith("reference")
        # The reference runs the chain in the call's dtype, as eager PyTorch would.
        want_q, want_scale = suite.kernel.reference(**inputs)
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
        assert torch.equal(scale, want_scale)

    tests = [
        test_matches_reference,
        test_scales_of_the_wrong_rows_fail,
        test_an_empty_batch,
        test_rows_of_no_values,
        test_batched_leading_dims,
        test_inference_only,
        test_runs_inside_torch_compile,
        test_falls_back_without_gpu,
    ]
    return {"SUITE": suite, **{t.__name__: t for t in tests}}
