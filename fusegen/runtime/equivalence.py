"""What a correct result is, for the generated chain tests: inputs drawn for a chain,
outputs poisoned with NaN, and results and gradients checked against the chain's float64
reference within its derived bound (docs/tolerances.md). `Chain` reads what a generated
test module states about its chain; harness.py makes the tests from it.

Every run draws fresh random inputs (a failure prints the seed; FUSEGEN_TEST_SEED
replays it) and fills the outputs with NaN before the launch, so an element the kernel
does not write fails. Without a CUDA GPU the kernel runs on the Triton interpreter,
with the module's small shapes.
"""

import math
import os
import random

import pytest
import torch

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"

U32 = 2.0**-24  # unit roundoff of fp32, the kernel's arithmetic
U_ACC = 2.0**-23  # per-term accumulation error: twice U32, for accumulators that truncate
TF32_PRODUCT = 2.0**-9  # relative error of a product of two fp32 values cut to tf32
# ... and of tf32x3's: each operand split into two tf32 halves (each cut within 2**-10 of
# what it holds, so the pair within 2**-20 of the value), the small halves' product
# dropped: three terms of 2**-20 at most.
TF32X3_PRODUCT = 2.0**-18
PRODUCT_ERROR = {"tf32": TF32_PRODUCT, "tf32x3": TF32X3_PRODUCT}
OUT_ROUNDING = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
# Triton's interpreter converts fp32 to bf16 toward zero (up to one ulp off), where a GPU
# rounds to nearest (half an ulp); round_bf16_to_nearest_in_the_interpreter (below) makes
# it round as a GPU does, and this allowance stays for an interpreter it cannot hook.
INTERPRETER_OUT_ROUNDING = {**OUT_ROUNDING, torch.bfloat16: 2.0**-7}


def round_bf16_to_nearest_in_the_interpreter():
    """Make Triton's interpreter convert fp32 to bf16 to nearest even, as a GPU and
    PyTorch do, where it truncates: a softmax's 0.9999993 became 0.99609 (not 1.0), and
    its backward, which reads that output, made a gradient of 14x eager's error (seed
    2061104602 of masked_softmax). An interpreter without the hook this replaces keeps
    its own conversion (INTERPRETER_OUT_ROUNDING allows for it). The tests' processes
    only: only they import this module."""
    from triton.runtime import interpreter

    np = interpreter.np  # the interpreter's own numpy (it needs one; generated code imports none)
    builder = getattr(interpreter, "InterpreterBuilder", None)
    cast = getattr(builder, "cast_impl", None)
    if cast is None or getattr(cast, "rounds_to_nearest", False):
        return
    import triton.language as tl

    def cast_impl(self, src, dst_type):
        if not (src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16):
            return cast(self, src, dst_type)
        values = np.asarray(src.data, dtype=np.float32)
        bits = values.view(np.uint32)
        odd = (bits >> np.uint32(16)) & np.uint32(1)
        rounded = ((bits + np.uint32(0x7FFF) + odd) >> np.uint32(16)).astype(np.uint16)
        quiet = ((bits >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
        data = np.where(np.isnan(values), quiet, rounded)
        return interpreter.TensorHandle(data, dst_type.scalar)

    cast_impl.rounds_to_nearest = True
    builder.cast_impl = cast_impl


if os.environ.get("TRITON_INTERPRET") == "1":
    round_bf16_to_nearest_in_the_interpreter()

# Absolute error allowed near zero: fp16 rounds below its normal range to a fixed
# spacing (half of it, 2**-25); fp32 math may flush values under 2**-126 to zero (GPU
# fast math), and an unhooked interpreter's bf16 conversion mangles such values.
OUT_TINY = {torch.float32: 2.0**-126, torch.float16: 2.0**-25, torch.bfloat16: 2.0**-126}


def outside_bound(out, expected, bound, rounding):
    """(where `out` is further from its float64 `expected` value than `bound` allows, that
    bound with the output's own rounding added: `rounding`, its dtype's unit roundoff).
    NaN, the poison, is never within; past the dtype's largest finite value the right
    answer is an infinity of the value's sign."""
    bound = bound + rounding * (expected.abs() + bound) + OUT_TINY[out.dtype]
    error = (out.double() - expected).abs()
    may_overflow = expected.abs() + bound > torch.finfo(out.dtype).max
    overflowed = may_overflow & torch.isinf(out) & (out.sign() == expected.sign())
    return ~((error <= bound) | overflowed), bound


def norm_error(got, want, dtype):
    """||got - want|| / ||want|| (want in float64; `dtype`'s tiny keeps an all-zero want
    finite): the norm-wise error the checks hold against eager's."""
    return (got.double() - want).norm().item() / (want.norm().item() + OUT_TINY[dtype])


def new_seed():
    fixed = os.environ.get("FUSEGEN_TEST_SEED")
    return int(fixed) if fixed else random.SystemRandom().randrange(2**31)


def dot_error(a, b, p_in):
    """Bound on an fp32-accumulated a @ b: each of the K terms may carry K * U_ACC of
    its magnitude (plus p_in when the operands are cut to tf32: once, or split in three)."""
    return (a.shape[-1] * U_ACC + p_in) * (a.abs() @ b.abs())


def reduction_depth(launch, cols):
    """How many roundings a row's sum can pass through: a tree over a block of BLOCK_N
    columns, then one per block."""
    block = (launch["config"] or {}).get("BLOCK_N", 1 << max(cols - 1, 0).bit_length())
    block = min(block, 1 << max(cols - 1, 0).bit_length())
    return math.ceil(math.log2(max(block, 2))) + math.ceil(cols / block) + 2


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def dtype_id(dtype):
    return str(dtype).removeprefix("torch.")


class Chain:
    """A chain as its generated test module states it, and the checks made from that.

    Read from the module's namespace: `kernel` (the module under test), LAUNCHER (its
    function), DTYPES, ROW and COL (the output is [ROW, COL] after any batch dims),
    FAN_IN (the matmul's reduction dim, or None), INPUTS (name: (dims, pinned dtype or
    None, distribution, batched)), CASES and ALIGNED (sizes of the dynamic dims), HEAVY,
    KINKED,
    OUTPUTS (the launcher's output keywords), REDUCES, SOURCE, MATMUL_OPERANDS,
    SPECIAL_ROWS, SOFTMAX_MASK, the flags TMA, FAST_TANH, NO_GPU, NONFINITE and ESTIMATED_DEFAULT,
    MM_CALLS, and `reference_and_bound`."""

    def __init__(self, namespace):
        self.kernel = namespace["kernel"]
        self.launcher = namespace["LAUNCHER"]
        self.dtypes = namespace["DTYPES"]
        self.row, self.col = namespace["ROW"], namespace["COL"]
        self.fan_in = namespace["FAN_IN"]
        self.inputs = namespace["INPUTS"]
        self.cases = namespace["CASES"]
        self.aligned = namespace["ALIGNED"]
        self.heavy = namespace["HEAVY"]
        self.kinked = namespace["KINKED"]
        self.outputs = namespace["OUTPUTS"]
        self.reduces = namespace["REDUCES"]
        self.source = namespace["SOURCE"]
        self.matmul_operands = namespace["MATMUL_OPERANDS"]
        self.special_rows = namespace["SPECIAL_ROWS"]
        self.softmax_mask = namespace["SOFTMAX_MASK"]
        self.tma = namespace["TMA"]
        self.fast_tanh = namespace["FAST_TANH"]
        self.no_gpu = namespace["NO_GPU"]
        self.nonfinite = namespace["NONFINITE"]
        self.estimated_default = namespace["ESTIMATED_DEFAULT"]
        self.mm_calls = namespace["MM_CALLS"]
        self.reference_and_bound = namespace["reference_and_bound"]
        self.sizes = {dim: size for dim, size in self.kernel.DIMS.items() if size is not None}
        # The inputs that can require grad (a pinned integer or bool input cannot).
        self.float_inputs = [
            name
            for name, (_, pinned, _, _) in self.inputs.items()
            if pinned is None or pinned.is_floating_point
        ]
        self.batched = any(batched for *_, batched in self.inputs.values())
        self.interpreted = self.kernel._KERNELS.interpreted()
        self.out_rounding = INTERPRETER_OUT_ROUNDING if self.interpreted else OUT_ROUNDING

    def make_inputs(self, sizes, dtype, seed, lead=None):
        """Random inputs in their dtype (so their float64 copies are exact), on DEVICE.
        With `lead`, batched inputs get those leading dims in place of ROW."""
        generator = torch.Generator().manual_seed(seed)
        tensors = {}
        for index, (name, (dims, pinned, dist, batched)) in enumerate(self.inputs.items()):
            shape = [sizes[d] for d in dims]
            if lead is not None and batched:
                shape = [*lead, *shape[1:]]
            values = torch.randn(shape, generator=generator)
            if dist == "weight":
                # Like a trained layer's weights: outputs stay O(1) whatever the fan-in.
                values = values * max(1, sizes[self.fan_in]) ** -0.5  # K = 0: no values
            elif dist == "nonzero":
                values = values.sign() * (0.5 + values.abs())
            if self.special_rows and dims == (self.row, self.col) and values.numel():
                rows = values.view(-1, shape[-1])
                # A constant row (zero variance: naive formulas divide 0 by 0), a row of
                # large values (1e4: naive softmax overflows, sums of squares lose digits)
                # and one of small values in every full input (1e-3: a norm's eps is then
                # most of its variance, so a dropped or misplaced eps shows).
                rows[0] = 3.0 - 1.25 * index
                if rows.shape[0] > 1 and name == self.source:
                    rows[1] *= 1e4
                if rows.shape[0] > 2:
                    rows[2] *= 1e-3
            tensors[name] = values.to(pinned or dtype).to(DEVICE)
        return tensors

    def output_buffers(self, sizes, dtype, lead=None):
        """NaN-filled buffers for every output, by keyword."""
        rows = lead or [sizes[self.row]]
        full = [*rows, sizes[self.col]]
        buffers = {}
        for name in self.outputs:
            main = name == "out"
            shape = rows if main and self.reduces else full
            out_dtype = (self.kernel.OUT_DTYPE or dtype) if main else dtype
            buffers[name] = torch.full(shape, float("nan"), dtype=out_dtype, device=DEVICE)
        return buffers

    def check_outputs(self, results, inputs, dtype, seed, launch):
        """Every output within its bound; returns the float64 inputs and expected values."""
        exact = {name: t.double() for name, t in inputs.items()}
        p_in = PRODUCT_ERROR.get(launch["fp32_matmul"], 0.0)
        cols = inputs[self.source].shape[-1] if self.source else results[0].shape[-1]
        fast = int(launch["fast_tanh"])
        depth = reduction_depth(launch, cols)
        if launch.get("path") == "cublas + epilogue":  # the accumulators rounded, as stored
            exact["p_acc"] = self.out_rounding[dtype]
        pairs = self.reference_and_bound(p_in, depth, fast, **exact)
        exact.pop("p_acc", None)
        for name, out, (expected, bound) in zip(self.outputs, results, pairs, strict=True):
            assert out.shape == expected.shape, (name, out.shape, expected.shape)
            bad, bound = outside_bound(out, expected, bound, self.out_rounding[out.dtype])
            if bad.any():
                first = tuple(bad.nonzero()[0].tolist())
                pytest.fail(
                    f"{name}: {int(bad.sum())} of {bad.numel()} elements are outside the "
                    f"bound (seed {seed}, {dtype}, {launch}); first at {first}: "
                    f"got {out[first].item()!r}, expected {expected[first].item()!r} "
                    f"+- {bound[first].item():.3g}"
                )
        return exact, [expected for expected, _ in pairs]

    def run_and_check(self, inputs, sizes, dtype, seed, lead=None):
        buffers = self.output_buffers(sizes, dtype, lead)
        results = as_tuple(self.launcher(**inputs, **buffers))
        launch = self.kernel.last_launch()
        assert all(r is b for r, b in zip(results, buffers.values(), strict=True))
        assert not launch["source"].startswith("reference"), f"the kernel did not run: {launch}"
        exact, expected = self.check_outputs(results, inputs, dtype, seed, launch)
        # The module's own reference is the same chain: check it against the test's.
        refs = as_tuple(self.kernel.reference(**exact, out_dtype=torch.float64))
        for ref, want in zip(refs, expected, strict=True):
            torch.testing.assert_close(ref, want, rtol=1e-9, atol=1e-12)
        if dtype in (torch.float16, torch.bfloat16):
            self.check_against_eager(results, inputs, expected, dtype, seed)

    def check_against_eager(self, results, inputs, expected, dtype, seed):
        """Norm-wise, each output may be at most twice as far from float64 as the same
        chain one PyTorch op at a time in the call's dtype (eager), plus one rounding of
        the result. The element-wise bound is a worst case, loose by about sqrt(K) at a
        large K: a kernel that rounds its accumulators to bf16 before the epilogue passed
        it at K = 4096 in fp16, at 15x eager's error there (docs/tolerances.md).
        16-bit calls only: eager in fp32 may run another matmul precision than the kernel
        (a spec's pinned tf32), and fp32's accumulation order matters at its roundoff."""
        eager = as_tuple(self.kernel.reference(**inputs))
        for name, out, theirs, want in zip(self.outputs, results, eager, expected, strict=True):
            # Where the exact value is past the dtype's range, or eager overflowed in a
            # step the kernel keeps in fp32, there is no error to compare.
            finite = (
                torch.isfinite(out)
                & torch.isfinite(theirs)
                & (want.abs() <= torch.finfo(out.dtype).max)
            )
            want = want[finite]
            error = norm_error(out[finite], want, out.dtype)
            eager_error = norm_error(theirs[finite], want, out.dtype)
            rounding = self.out_rounding[out.dtype]
            if not error <= 2 * eager_error + rounding:
                pytest.fail(
                    f"{name}: norm-wise error {error:.3g} against float64, over twice eager "
                    f"{dtype_id(dtype)}'s {eager_error:.3g} plus a rounding ({rounding:.3g}); "
                    f"seed {seed}"
                )

    def upstream_grads(self, results, seed):
        generator = torch.Generator().manual_seed(seed + 1)
        return [torch.randn(r.shape, generator=generator).to(r.dtype).to(DEVICE) for r in results]

    def grads_of(self, inputs, asked, seed, call=None):
        """Run the launcher (or `call`) on inputs of which `asked` require grad; returns
        the outputs, the upstream gradients and the asked inputs' gradients."""
        leaves = {n: t.detach().requires_grad_(n in asked) for n, t in inputs.items()}
        results = as_tuple((call or self.launcher)(**leaves))
        assert all(r.requires_grad and r.grad_fn is not None for r in results)
        upstream = self.upstream_grads(results, seed)
        return results, upstream, torch.autograd.grad(results, [leaves[n] for n in asked], upstream)

    def check_grads(self, got, inputs, upstream, asked, dtype, seed):
        """Each asked input's gradient against autograd through the reference in float64.
        Norm-wise, its error may be at most twice that of the same chain run one PyTorch
        op at a time in the call's dtype (eager), plus four roundings of the result; and
        no element may be off by more than 8x eager's worst one plus four roundings of the
        largest (plus 32 of fp32's, for the kernel's own arithmetic). Where the chain has a
        kink (KINKED: relu's at 0) the rounding of a saved value turns into a jump at
        elements other than eager's, so there the norm leaves out the worst 1/32 of the
        elements and the element-wise bound the worst 1/256, and allows an eighth of the
        largest in place of those roundings: a jump is sparse, a wrong term is not.
        Elsewhere every element counts: a wrong edge row or column of tiles is then caught
        (docs/tolerances.md, "Gradients")."""
        exact = {n: t.detach().double().requires_grad_(n in asked) for n, t in inputs.items()}
        eager = {n: t.detach().requires_grad_(n in asked) for n, t in inputs.items()}

        def autograd(results, leaves, grads):
            # Outputs that depend on no asked input (h, with only a norm's weight asked)
            # drop out.
            pairs = [
                (r, g) for r, g in zip(as_tuple(results), grads, strict=True) if r.requires_grad
            ]
            outputs, grads = zip(*pairs, strict=True)
            return torch.autograd.grad(
                outputs, [leaves[n] for n in asked], grads, allow_unused=True
            )

        reference = self.kernel.reference
        doubles = [g.double() for g in upstream]
        wanted = autograd(reference(**exact, out_dtype=torch.float64), exact, doubles)
        plain = autograd(reference(**eager), eager, upstream)
        for name, mine, want, theirs in zip(asked, got, wanted, plain, strict=True):
            want = torch.zeros_like(exact[name]) if want is None else want
            theirs = torch.zeros_like(eager[name]) if theirs is None else theirs
            assert mine is not None and mine.shape == inputs[name].shape, (name, mine)
            assert mine.dtype == inputs[name].dtype, (name, mine.dtype)
            rounding = self.out_rounding[mine.dtype]
            scale = want.norm().item() + OUT_TINY[mine.dtype]
            misses = (mine.double() - want).abs().flatten().sort().values
            spared = (misses.numel() // 32, misses.numel() // 256) if self.kinked else (0, 0)
            error = misses[: misses.numel() - spared[0]].norm().item() / scale
            eager_error = (theirs.double() - want).norm().item() / scale
            # No NaN (the poison: an element not written; an inf can be right, where fp16
            # overflows as eager does) and every element (all but the worst 1/256 where
            # KINKED) within the element-wise bound: a kink's flip moves a whole row of a
            # matmul operand's gradient (seed 1783738941 of the zoo's mm_broadcasts: one
            # row of dw, 7.9 against 7.2 allowed).
            no_nan = not bool(torch.isnan(mine).any())
            last = misses.numel() - 1 - spared[1]
            worst = misses[last].item() if misses.numel() else 0.0
            eager_worst = (theirs.double() - want).abs().max().item()
            largest = want.abs().max().item()
            # Without a kink, 8x eager's worst alone held every 16-bit element over 36
            # seeds (fp32: 2.1 roundings of the largest more, where eager was lucky); an
            # eighth of the largest let a wrong edge column through at bf16
            # (docs/tolerances.md).
            slack = largest / 8 if self.kinked else (4 * rounding + 32 * U32) * largest
            allowed = 8 * eager_worst + slack + OUT_TINY[mine.dtype]
            # A gradient summed over many terms (a bias's over rows) carries an fp32 sum's
            # rounding, which grows as sqrt(terms), is relative to the terms' size (not
            # their sum's, which cancels) and in whose luck eager can beat it.
            terms = max(g.numel() for g in upstream) / max(mine.numel(), 1)
            summed = 16 * 2.0**-24 * math.sqrt(max(terms, 1.0))
            if not (
                no_nan and error <= 2 * eager_error + 4 * rounding + summed and worst <= allowed
            ):
                pytest.fail(
                    f"d{name}: norm-wise error {error:.3g} (eager {eager_error:.3g}), worst "
                    f"element {worst:.3g} (allowed {allowed:.3g}), NaN: {not no_nan}; "
                    f"seed {seed}, {dtype}"
                )

    def table_key(self, sizes, dtype):
        """A tuned table's key for a call at `sizes` in `dtype` (row bucket included)."""
        values = [1 << max(sizes[self.row] - 1, 0).bit_length(), sizes[self.col]]
        if self.fan_in:
            values.append(sizes[self.fan_in])
        names = self.kernel._KERNELS.key_names
        out_dtype = self.kernel.OUT_DTYPE or dtype
        return {
            **dict(zip(names, values, strict=False)),
            names[-2]: dtype_id(dtype),
            names[-1]: dtype_id(out_dtype),
        }
