"""The generated chain tests: `chain_tests` makes them from a test module's namespace,
which keeps only what is its chain's own (inputs, sizes, dtypes, flags and
`reference_and_bound`, the float64 value of each output beside a bound on a correct
kernel's error there). What a correct result is lives in equivalence.py; only the
generated tests import either.
"""

import pytest
import torch
import triton

from .chains import EPILOGUE_DTYPES
from .equivalence import (  # noqa: F401 - the generated modules' bounds use U32, U_ACC, dot_error
    DEVICE,
    ON_GPU,
    U32,
    U_ACC,
    Chain,
    as_tuple,
    dot_error,
    dtype_id,
    new_seed,
)

needs_gpu = pytest.mark.skipif(
    not ON_GPU, reason="needs a CUDA GPU (native compilation and autotuning)"
)
TRITON_VERSION = tuple(int(part) for part in triton.__version__.split(".")[:2])

SLOW_WEIGHTS = "the interpreter runs this spec's large weights slowly"


def case_id(case):
    return "-".join(f"{d}{n}" for d, n in case.items()) or "static"


def config_id(config):
    return "-".join(f"{k}{v}" for k, v in config.items())


def poisoned_empty(monkeypatch):
    """torch.empty filling floating tensors with NaN: a gradient element (or a partial
    sum) the backward does not write fails the comparison."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)


def column_major(inputs):
    """Every 2-D input transposed in memory (a strided view of the same values)."""
    return {name: t.T.contiguous().T if t.dim() == 2 else t for name, t in inputs.items()}


def chain_tests(namespace):
    """The tests of a generated chain test module, by name, made from its namespace (see
    Chain), in the order pytest collects them; `CHAIN` is the Chain they check with."""
    chain = Chain(namespace)
    tests = [
        *value_tests(chain),
        *gradient_tests(chain),
        *compile_tests(chain),
        *fallback_tests(chain),
        *(tma_tests(chain) if chain.tma else []),
        *tuning_tests(chain),
    ]
    return {"CHAIN": chain, **{test.__name__: test for test in tests}}


def value_tests(chain):
    """Outputs against the bound: every case and dtype, batched and strided inputs,
    repeated calls; and the launcher's refusals of wrong shapes and dtypes."""
    kernel, launcher = chain.kernel, chain.launcher
    sizes_of = chain.sizes
    dtypes = chain.dtypes

    @pytest.mark.parametrize("case", chain.cases, ids=case_id)
    @pytest.mark.parametrize("dtype", dtypes[-1:] if chain.heavy else dtypes, ids=dtype_id)
    def test_matches_reference(dtype, case):
        seed, sizes = new_seed(), {**sizes_of, **case}
        chain.run_and_check(chain.make_inputs(sizes, dtype, seed), sizes, dtype, seed)

    @pytest.mark.skipif(kernel.DIMS[chain.row] is not None, reason="the spec fixes the row count")
    @pytest.mark.skipif(not chain.batched, reason="no input takes batch dims")
    @pytest.mark.skipif(chain.heavy, reason=SLOW_WEIGHTS)
    def test_batched_leading_dims():
        # [2, 3, ...] inputs are flattened into 6 rows, and the output keeps the [2, 3].
        seed, sizes = new_seed(), {**sizes_of, **chain.cases[0], chain.row: 6}
        inputs = chain.make_inputs(sizes, dtypes[-1], seed, lead=[2, 3])
        chain.run_and_check(inputs, sizes, dtypes[-1], seed, lead=[2, 3])

    strides_elsewhere = "strides are tested on smaller kernels under the interpreter"

    @pytest.mark.skipif(chain.heavy, reason=strides_elsewhere)
    def test_noncontiguous_inputs():
        # Strided views (every 2-D input transposed in memory) give the same result.
        seed, sizes = new_seed(), {**sizes_of, **chain.cases[-1]}
        strided = column_major(chain.make_inputs(sizes, dtypes[-1], seed))
        assert any(not t.is_contiguous() for t in strided.values())
        chain.run_and_check(strided, sizes, dtypes[-1], seed)

    @pytest.mark.skipif(chain.heavy, reason=strides_elsewhere)
    def test_inputs_with_no_unit_stride():
        # Every other column of twice-as-wide tensors (x[:, ::2]): matmul operands are
        # copied to contiguous memory first (see the runtime's copies), the others read as
        # they are.
        seed, sizes = new_seed(), {**sizes_of, **chain.cases[-1]}
        inputs = chain.make_inputs(sizes, dtypes[-1], seed)
        strided = {}
        for name, t in inputs.items():
            wide = torch.full(
                (*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype, device=DEVICE
            )
            wide[..., ::2] = t
            strided[name] = wide[..., ::2] if t.dim() == 2 else t
        chain.run_and_check(strided, sizes, dtypes[-1], seed)
        plan = kernel._CALLS[kernel._signature(*strided.values())]
        copied = tuple(i for i, name in enumerate(strided) if name in chain.matmul_operands)
        assert plan.copies == copied

    def test_rejects_wrong_shapes():
        sizes = {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, dtypes[0], new_seed())
        uses = [d for dims, *_ in chain.inputs.values() for d in dims]
        batched_inputs = sum(batched for *_, batched in chain.inputs.values())
        wrong = []
        for name, (dims, _, _, batched) in chain.inputs.items():
            if not batched:
                wrong.append((name, [sizes[d] for d in dims] + [2]))  # one dim too many
            elif len(dims) > 1:
                wrong.append((name, []))  # too few dims to hold the non-batch ones
            for axis, dim in enumerate(dims):
                if batched and axis == 0 and batched_inputs == 1:
                    continue  # the only batched input: any leading shape is valid
                if (
                    not (batched and axis == 0)
                    and kernel.DIMS[dim] is None
                    and uses.count(dim) == 1
                ):
                    continue  # a dynamic dim no other input has: any size is valid
                shape = [sizes[d] for d in dims]
                shape[axis] += 1
                wrong.append((name, shape))
        assert wrong
        for name, shape in wrong:
            bad = {**inputs, name: torch.ones(shape, dtype=inputs[name].dtype, device=DEVICE)}
            with pytest.raises(ValueError, match=rf"\b{name}\b"):
                launcher(**bad)

    def test_rejects_wrong_dtype():
        inputs = chain.make_inputs({**sizes_of, **chain.cases[0]}, dtypes[0], new_seed())
        first = next(iter(inputs))
        bad = {**inputs, first: inputs[first].to(torch.float64)}
        with pytest.raises(TypeError, match=rf"\b{first}\b"):
            launcher(**bad)

    dynamic = [dim for dim, size in kernel.DIMS.items() if size is None]

    @pytest.mark.skipif(chain.heavy, reason=SLOW_WEIGHTS)
    @pytest.mark.skipif(not dynamic, reason="the spec fixes every dim")
    @pytest.mark.parametrize("dim", dynamic or [None])
    def test_a_dim_of_size_zero(dim):
        # An empty batch, K = 0 or rows of no columns: not bounded by equivalence.py (no
        # error to speak of), but the float64 reference's values, gradients included (a
        # row's sum over no columns has an output and gradients for its [rows] inputs),
        # or a ValueError where the reference cannot give one (a max over no columns).
        dtype, seed = dtypes[-1], new_seed()
        sizes = {**sizes_of, **chain.cases[0], dim: 0}
        inputs = chain.make_inputs(sizes, dtype, seed)
        asked = chain.float_inputs
        exact = {n: t.double().requires_grad_(n in asked) for n, t in inputs.items()}
        try:
            want = as_tuple(kernel.reference(**exact, out_dtype=torch.float64))
        except (IndexError, RuntimeError):
            with pytest.raises(ValueError, match=r"is 0\b"):
                launcher(**inputs)
            return
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
        results = as_tuple(launcher(**inputs, **chain.output_buffers(sizes, dtype)))
        for got, expected in zip(results, want, strict=True):
            expected = expected.detach().to(got.dtype).double()
            rtol = atol = tol[got.dtype]
            torch.testing.assert_close(got.double(), expected, rtol=rtol, atol=atol, equal_nan=True)
        results, upstream, grads = chain.grads_of(inputs, asked, seed)
        wanted = torch.autograd.grad(
            want, [exact[n] for n in asked], [u.double() for u in upstream], allow_unused=True
        )
        for name, got, expected in zip(asked, grads, wanted, strict=True):
            expected = torch.zeros_like(exact[name]) if expected is None else expected
            rtol = atol = tol[got.dtype]
            torch.testing.assert_close(
                got.double(),
                expected,
                rtol=rtol,
                atol=atol,
                equal_nan=True,
                msg=lambda text, name=name: f"d {name}: {text}",
            )

    @pytest.mark.skipif(chain.heavy, reason=SLOW_WEIGHTS)
    def test_repeated_calls_agree(monkeypatch):
        # The first call of a signature plans its launch; later ones reuse the plan and,
        # on a GPU, launch the compiled kernel directly (unless FUSEGEN_DIRECT_LAUNCH=0).
        dtype, seed, sizes = dtypes[0], new_seed(), {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, dtype, seed)
        runs, direct_runs = [], []
        for setting, calls in (("0", 2), ("1", 3)) if ON_GPU else (("0", 1), ("1", 2)):
            monkeypatch.setenv("FUSEGEN_DIRECT_LAUNCH", setting)
            monkeypatch.setattr(kernel, "_CALLS", {})
            for _ in range(calls):
                buffers = chain.output_buffers(sizes, dtype)
                runs.append(as_tuple(launcher(**inputs, **buffers)))
                chain.check_outputs(runs[-1], inputs, dtype, seed, kernel.last_launch())
                direct_runs.append(kernel._KERNELS.last_run.get("direct"))
        # Direct launches need triton 3.3+ (its launcher takes the constexprs).
        if ON_GPU and TRITON_VERSION >= (3, 3):
            assert direct_runs == [False, False, False, True, True]
        else:
            assert not any(direct_runs)
        for run in runs[1:]:
            for got, first in zip(run, runs[0], strict=True):
                torch.testing.assert_close(got, first, rtol=0, atol=0, equal_nan=True)

    @pytest.mark.skipif(not chain.special_rows, reason="no row op: a row is read once")
    def test_a_row_in_one_block_and_block_by_block():
        # Both ways a row op reads a row, whichever one the interpreter's config takes:
        # the whole row in one block, and block by block (its statistics merged as they
        # come). A GPU's default config may take the other.
        dtype, seed, sizes = dtypes[-1], new_seed(), {**sizes_of, **chain.cases[-1]}
        inputs = chain.make_inputs(sizes, dtype, seed)
        whole = 1 << max(4, (sizes[chain.col] - 1).bit_length())
        for block in (whole, max(16, whole // 4)):
            config = {**kernel.INTERPRETER_CONFIG, "BLOCK_M": 2, "BLOCK_N": block}
            buffers = chain.output_buffers(sizes, dtype)
            results = as_tuple(launcher(**inputs, **buffers, config=config))
            chain.check_outputs(results, inputs, dtype, seed, kernel.last_launch())

    def test_nan_propagates_as_in_pytorch():
        # A NaN in an input is NaN wherever PyTorch's float64 chain has one, and only
        # there: the GPU's plain min and max return the other operand (relu(NaN) would
        # be 0), and tl.max drops it from a row.
        dtype, seed, sizes = dtypes[-1], new_seed(), {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, dtype, seed)
        name = next(n for n, t in inputs.items() if t.is_floating_point())
        inputs[name] = inputs[name].clone()
        flat = inputs[name].view(-1)
        flat[0] = flat[flat.numel() // 2] = float("nan")
        results = as_tuple(launcher(**inputs, **chain.output_buffers(sizes, dtype)))
        exact = {n: t.double() for n, t in inputs.items()}
        wanted = as_tuple(kernel.reference(**exact, out_dtype=torch.float64))
        for out, want in zip(results, wanted, strict=True):
            assert want.isnan().any()
            assert torch.equal(out.isnan(), want.isnan()), (name, out, want)

    @pytest.mark.skipif(not chain.softmax_mask, reason="no softmax mask")
    def test_masked_keys_as_in_pytorch():
        # -inf in the additive mask: one key hidden from a row, the first block of keys
        # from another, every key from a third (NaN, as PyTorch's softmax gives; a [cols]
        # mask hides keys from every row, then every key). Both ways a row is read.
        dtype, seed, sizes = dtypes[-1], new_seed(), {**sizes_of, **chain.cases[-1]}
        inputs = chain.make_inputs(sizes, dtype, seed)
        mask = inputs[chain.softmax_mask].clone()
        cols = mask.shape[-1]
        if mask.dim() == 1:
            mask[[0, cols // 2]] = float("-inf")
            mask[: min(16, cols)] = float("-inf")
        else:
            # The first block hidden from a row past make_inputs' special rows (row 1's
            # values are 1e4: see the bound below), where there is one.
            row = 3 if mask.shape[0] > 4 else min(1, mask.shape[0] - 1)
            mask[0, cols // 2] = mask[row, : min(16, cols)] = float("-inf")
            mask[-1] = float("-inf")
        inputs[chain.softmax_mask] = mask
        exact = {n: t.double() for n, t in inputs.items()}
        wanted = as_tuple(kernel.reference(**exact, out_dtype=torch.float64))
        # fp32 arithmetic on a row's values errs by their magnitude's rounding, which an
        # output near the row's max (a log-probability of -2 in a row of 1e4s) does not
        # show: each row's allowance grows with its largest input value.
        rows = [t.abs().nan_to_num(0, 0, 0) for t in exact.values() if t.shape[-1] == cols]
        magnitude = torch.stack([t.expand(sizes[chain.row], cols) for t in rows]).amax((0, 2))
        whole = 1 << max(4, (sizes[chain.col] - 1).bit_length())
        for block in (whole, max(16, whole // 4)):
            config = {**kernel.INTERPRETER_CONFIG, "BLOCK_M": 2, "BLOCK_N": block}
            got = as_tuple(launcher(**inputs, **chain.output_buffers(sizes, dtype), config=config))
            for out, want in zip(got, wanted, strict=True):
                assert torch.equal(out.isnan(), want.isnan()), (block, out, want)
                # A masking bug moves whole rows; the sum's rounding grows with the columns.
                tol = 4 * chain.out_rounding[out.dtype] + cols * 2.0**-24
                atol = tol * (1 + magnitude.view(-1, *[1] * (out.dim() - 1)))
                # Equal infinities are right; any other infinity in either is wrong.
                error = (out.double() - want).abs().where(out.double() != want, 0.0)
                bad = error.nan_to_num(nan=0.0) > atol + tol * want.abs().nan_to_num(0, 0, 0)
                assert not bad.any(), (
                    f"seed {seed}, block {block}: {int(bad.sum())} elements, first at "
                    f"{tuple(bad.nonzero()[0].tolist())}"
                )
        if mask.dim() == 1:  # then every key hidden from every row
            inputs[chain.softmax_mask] = torch.full_like(mask, float("-inf"))
            exact = {n: t.double() for n, t in inputs.items()}
            wanted = as_tuple(kernel.reference(**exact, out_dtype=torch.float64))
            got = as_tuple(launcher(**inputs, **chain.output_buffers(sizes, dtype)))
            for out, want in zip(got, wanted, strict=True):
                assert want.isnan().any() and torch.equal(out.isnan(), want.isnan()), (out, want)

    return [
        test_matches_reference,
        test_masked_keys_as_in_pytorch,
        test_batched_leading_dims,
        test_noncontiguous_inputs,
        test_inputs_with_no_unit_stride,
        test_rejects_wrong_shapes,
        test_rejects_wrong_dtype,
        test_a_dim_of_size_zero,
        test_repeated_calls_agree,
        test_a_row_in_one_block_and_block_by_block,
        test_nan_propagates_as_in_pytorch,
    ]


def gradient_tests(chain):
    """Every input's gradient against autograd through the float64 reference, and the
    outputs of a training call against the bound."""
    kernel, launcher = chain.kernel, chain.launcher
    sizes_of, dtypes, asked_all = chain.sizes, chain.dtypes, chain.float_inputs

    # On the interpreter, the gradients run at the case with several tiles each way (the
    # others: batched, strided and one input at a time, below). HEAVY: on the CPU the
    # zoo's small specs (fusegen's tests/test_kernels.py) check the backward kernels.
    @pytest.mark.skipif(chain.heavy, reason=SLOW_WEIGHTS)
    @pytest.mark.parametrize("case", chain.cases if ON_GPU else chain.cases[-1:], ids=case_id)
    @pytest.mark.parametrize("dtype", dtypes, ids=dtype_id)
    def test_gradients_match_reference(monkeypatch, dtype, case):
        # Every input requires grad; the outputs' values are checked as without autograd.
        seed, sizes = new_seed(), {**sizes_of, **case}
        inputs = chain.make_inputs(sizes, dtype, seed)
        poisoned_empty(monkeypatch)
        results, upstream, got = chain.grads_of(inputs, asked_all, seed)
        launch = kernel.last_launch()
        assert not launch["source"].startswith("reference"), f"the kernel did not run: {launch}"
        chain.check_outputs([r.detach() for r in results], inputs, dtype, seed, launch)
        chain.check_grads(got, inputs, upstream, asked_all, dtype, seed)

    @pytest.mark.skipif(chain.heavy, reason=SLOW_WEIGHTS)
    @pytest.mark.parametrize("layout", ["batched", "strided"])
    def test_gradients_of_batched_and_strided_inputs(monkeypatch, layout):
        seed, sizes = new_seed(), {**sizes_of, **chain.cases[-1]}
        lead = None
        if layout == "batched":
            if kernel.DIMS[chain.row] is not None or not chain.batched:
                pytest.skip("no input takes batch dims")
            sizes[chain.row], lead = 6, [2, 3]
        inputs = chain.make_inputs(sizes, dtypes[-1], seed, lead=lead)
        if layout == "strided":
            inputs = column_major(inputs)
        poisoned_empty(monkeypatch)
        _, upstream, got = chain.grads_of(inputs, asked_all, seed)
        chain.check_grads(got, inputs, upstream, asked_all, dtypes[-1], seed)

    @pytest.mark.skipif(
        not ON_GPU, reason="needs a CUDA GPU (the interpreter has no direct launch)"
    )
    @pytest.mark.skipif(chain.heavy, reason=SLOW_WEIGHTS)
    def test_repeated_training_calls_agree(monkeypatch):
        # A training call's backward kernel (and a matmul chain's epilogue) launches
        # through triton's dispatch at its signature's first launch and directly from
        # the second (launch.Kept, unless FUSEGEN_DIRECT_LAUNCH=0): the same bits.
        dtype, seed, sizes = dtypes[-1], new_seed(), {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, dtype, seed)
        monkeypatch.setattr(kernel._KERNELS, "kept", type(kernel._KERNELS.kept)())
        monkeypatch.setattr(kernel, "_CALLS", {})
        runs = []
        for setting in ("0", "1", "1"):
            monkeypatch.setenv("FUSEGEN_DIRECT_LAUNCH", setting)
            _, upstream, got = chain.grads_of(inputs, asked_all, seed)
            runs.append(got)
        chain.check_grads(runs[0], inputs, upstream, asked_all, dtype, seed)
        if TRITON_VERSION >= (3, 3):  # the kernels' direct launches were made
            assert all(kernel._KERNELS.kept.launches.values())
        for run in runs[1:]:
            for got, first in zip(run, runs[0], strict=True):
                torch.testing.assert_close(got, first, rtol=0, atol=0, equal_nan=True)

    @pytest.mark.skipif(chain.heavy and len(asked_all) > 2, reason=SLOW_WEIGHTS)
    def test_only_the_asked_gradients_are_computed(monkeypatch):
        # One input at a time requires grad: its gradient is right, and a matmul chain
        # runs only the matmuls it needs (a frozen weight costs no weight gradient).
        dtype, seed, sizes = dtypes[-1], new_seed(), {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, dtype, seed)
        found = {"mm": torch.mm, "addmm": torch.addmm}  # addmm: a gate's share of dx
        for name in asked_all[:1] if chain.heavy else asked_all:
            calls = []
            for op, fn in found.items():
                monkeypatch.setattr(
                    torch, op, lambda *a, fn=fn, calls=calls, **k: calls.append(1) or fn(*a, **k)
                )
            _, upstream, got = chain.grads_of(inputs, [name], seed)
            for op, fn in found.items():
                monkeypatch.setattr(torch, op, fn)
            chain.check_grads(got, inputs, upstream, [name], dtype, seed)
            # A bf16 or fp16 training forward's own matmuls: cuBLAS's, then the epilogue.
            runtime = kernel._KERNELS
            forward = runtime.weights if runtime.epilogue and dtype in EPILOGUE_DTYPES else 0
            assert len(calls) == chain.mm_calls[name] + forward, (name, len(calls))

    @pytest.mark.skipif(chain.heavy, reason=SLOW_WEIGHTS)
    def test_gradients_inside_torch_compile_and_checkpointing():
        # fullgraph=True holds with autograd (the training op and its backward are custom
        # ops), and activation checkpointing recomputes the forward: the same gradients.
        torch._dynamo.reset()
        dtype, seed, sizes = dtypes[-1], new_seed(), {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, dtype, seed)
        _, upstream, eager = chain.grads_of(inputs, asked_all, seed)

        def model(**tensors):
            return as_tuple(launcher(**tensors))

        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        _, _, traced = chain.grads_of(inputs, asked_all, seed, call=compiled)

        def checkpointed(**tensors):
            return torch.utils.checkpoint.checkpoint(model, use_reentrant=False, **tensors)

        _, _, recomputed = chain.grads_of(inputs, asked_all, seed, call=checkpointed)
        for mine, theirs, again in zip(eager, traced, recomputed, strict=True):
            torch.testing.assert_close(theirs, mine, rtol=0, atol=0)
            torch.testing.assert_close(again, mine, rtol=0, atol=0)
        leaves = {n: t.detach().requires_grad_() for n, t in inputs.items()}
        with pytest.raises(RuntimeError, match="out= and config= are for calls without autograd"):
            launcher(**leaves, config=kernel.DEFAULT_CONFIG)
        torch._dynamo.reset()

    return [
        test_gradients_match_reference,
        test_gradients_of_batched_and_strided_inputs,
        test_repeated_training_calls_agree,
        test_only_the_asked_gradients_are_computed,
        test_gradients_inside_torch_compile_and_checkpointing,
    ]


def compile_tests(chain):
    """The launch's numerics settings (fp32 matmul precision, tanh.approx), and the
    launcher inside torch.compile, Inductor, CUDA graphs and torch.export."""
    kernel, launcher = chain.kernel, chain.launcher
    sizes_of, dtypes = chain.sizes, chain.dtypes
    tests = []

    @pytest.mark.skipif(torch.float32 not in dtypes, reason="the spec allows no fp32 call")
    def test_fp32_matmul_follows_torch_precision():
        # As in PyTorch and torch.compile, an fp32 matmul runs on tf32 where torch's
        # setting asks for it ("high", "medium") and at fp32-level error under "highest",
        # the default: tf32x3 on an NVIDIA GPU, ieee elsewhere (the interpreter); the
        # spec's fp32_matmul fixes one instead.
        seed, sizes = new_seed(), {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, torch.float32, seed)
        highest = "tf32x3" if ON_GPU and not torch.version.hip else "ieee"
        try:
            for setting, expected in (("high", "tf32"), ("highest", highest), ("medium", "tf32")):
                torch.set_float32_matmul_precision(setting)
                results = as_tuple(launcher(**inputs))
                launch = kernel.last_launch()
                assert launch["fp32_matmul"] == (kernel.FP32_MATMUL or expected), (setting, launch)
                _, wanted = chain.check_outputs(results, inputs, torch.float32, seed, launch)
                if ON_GPU:
                    # tf32 keeps 10 of fp32's 23 mantissa bits: ~1e-4 norm-wise, fp32
                    # ~1e-7 (the interpreter computes in fp32 whatever it is asked).
                    error = ((results[0].double() - wanted[0]).norm() / wanted[0].norm()).item()
                    assert (error > 1e-5) == (launch["fp32_matmul"] == "tf32"), (setting, error)
        finally:
            torch.set_float32_matmul_precision("highest")

    if chain.fan_in is not None:  # a matmul chain
        tests.append(test_fp32_matmul_follows_torch_precision)

    @needs_gpu
    def test_fast_tanh_only_for_16_bit_outputs():
        # The activations run on tanh.approx (FAST_TANH) where every output is bf16 or
        # fp16; fp32 outputs keep the exp-based form, whose error fits fp32's rounding.
        seed, sizes = new_seed(), {**sizes_of, **chain.cases[0]}
        for dtype in dtypes:
            inputs = chain.make_inputs(sizes, dtype, seed)
            results = as_tuple(launcher(**inputs))
            launch = kernel.last_launch()
            halves = all(r.dtype in (torch.float16, torch.bfloat16) for r in results)
            capable = kernel._KERNELS.device_facts(DEVICE)[0] >= 8
            assert launch["fast_tanh"] == (halves and capable), launch
            chain.check_outputs(results, inputs, dtype, seed, launch)

    if chain.fast_tanh:
        tests.append(test_fast_tanh_only_for_16_bit_outputs)

    @pytest.mark.skipif(chain.heavy, reason=SLOW_WEIGHTS)
    def test_runs_inside_torch_compile():
        # torch.compile traces the launcher as one custom op (its fake gives the outputs'
        # shapes), so fullgraph=True holds; with a buffer given, the call is a graph break.
        torch._dynamo.reset()
        dtype, seed, sizes = dtypes[0], new_seed(), {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, dtype, seed)

        def model(**tensors):
            return as_tuple(launcher(**tensors))

        results = torch.compile(model, backend="aot_eager", fullgraph=True)(**inputs)
        chain.check_outputs(results, inputs, dtype, seed, kernel.last_launch())

        def into_buffers(buffers, **tensors):
            return as_tuple(launcher(**tensors, **buffers))

        buffers = chain.output_buffers(sizes, dtype)
        results = torch.compile(into_buffers, backend="eager")(buffers, **inputs)
        assert all(r is b for r, b in zip(results, buffers.values(), strict=True))
        chain.check_outputs(results, inputs, dtype, seed, kernel.last_launch())

        torch._dynamo.reset()

    @needs_gpu
    def test_inductor_launches_the_kernels():
        # Where the ops are triton ops (torch 2.6+), torch.compile traces into them and
        # Inductor's own wrapper launches the fused kernel, and in training the backward
        # kernel: no call back into the Python launcher. Dynamic sizes take the same path.
        if not kernel._KERNELS.triton_ops():
            pytest.skip(
                "opaque custom ops here (Kernels.triton_ops: FUSEGEN_TRITON_OP=0, torch < 2.6)"
            )
        from torch._inductor.utils import run_and_get_code

        torch._dynamo.reset()
        dtype, seed, sizes = dtypes[0], new_seed(), {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, dtype, seed)

        def model(**tensors):
            return as_tuple(launcher(**tensors))

        compiled = torch.compile(model, fullgraph=True)
        with torch.no_grad():
            results, (code,) = run_and_get_code(compiled, **inputs)
        name = launcher.__name__
        assert f"_{name}_kernel" in code and "torch.ops.fusegen" not in code
        chain.check_outputs(results, inputs, dtype, seed, kernel.last_launch())
        asked = chain.float_inputs
        (_, upstream, got), codes = run_and_get_code(chain.grads_of, inputs, asked, seed, compiled)
        assert any(f"_{name}_kernel_backward" in c for c in codes)
        assert not any("torch.ops.fusegen" in c for c in codes)
        chain.check_grads(got, inputs, upstream, asked, dtype, seed)
        dynamic = torch.compile(model, fullgraph=True, dynamic=True)
        for case in chain.cases[:2]:
            inputs = chain.make_inputs({**sizes_of, **case}, dtype, seed)
            with torch.no_grad():
                results = dynamic(**inputs)
            chain.check_outputs(results, inputs, dtype, seed, kernel.last_launch())
        torch._dynamo.reset()

    @needs_gpu
    def test_cuda_graphs_and_export():
        # mode="reduce-overhead" replays the kernels from a CUDA graph; torch.export keeps
        # the op in the exported program, which runs the same.
        torch._dynamo.reset()
        dtype, seed, sizes = dtypes[0], new_seed(), {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, dtype, seed)

        class Model(torch.nn.Module):
            def forward(self, *tensors):
                return as_tuple(launcher(*tensors))

        graphed = torch.compile(Model(), mode="reduce-overhead", fullgraph=True)
        with torch.no_grad():
            for _ in range(3):
                results = tuple(r.clone() for r in graphed(*inputs.values()))
                chain.check_outputs(results, inputs, dtype, seed, kernel.last_launch())
            exported = torch.export.export(Model(), tuple(inputs.values()))
            results = exported.module()(*inputs.values())
        chain.check_outputs(as_tuple(results), inputs, dtype, seed, kernel.last_launch())
        torch._dynamo.reset()

    return tests + [
        test_runs_inside_torch_compile,
        test_inductor_launches_the_kernels,
        test_cuda_graphs_and_export,
    ]


def fallback_tests(chain):
    """What the launcher does where the kernel cannot run (no GPU, the interpreter off)
    or gives a non-finite result, as the spec's `fallback` says."""
    kernel, launcher = chain.kernel, chain.launcher
    sizes_of, dtypes = chain.sizes, chain.dtypes
    tests = []

    @pytest.mark.skipif(
        chain.heavy, reason="torch's CPU matmuls in 16-bit run this spec's weights slowly"
    )
    def test_gradients_fall_back_without_gpu(monkeypatch):
        # Not on a GPU and the interpreter off: autograd through the reference, outside
        # the custom op (autograd is off inside one).
        monkeypatch.setattr(kernel._KERNELS, "runs_triton", lambda device: False)
        monkeypatch.setattr(kernel, "_CALLS", {})
        dtype, seed, sizes = dtypes[-1], new_seed(), {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, dtype, seed)
        asked_all = chain.float_inputs
        for asked in (asked_all, asked_all[-1:]):
            _, upstream, got = chain.grads_of(inputs, asked, seed)
            chain.check_grads(got, inputs, upstream, asked, dtype, seed)

    def test_falls_back_without_gpu(monkeypatch):
        # Not on a GPU and the interpreter off: the reference runs, or (NO_GPU = "error")
        # a clear error.
        monkeypatch.setattr(kernel._KERNELS, "runs_triton", lambda device: False)
        monkeypatch.setattr(kernel, "_CALLS", {})  # plans made with the interpreter on
        inputs = chain.make_inputs({**sizes_of, **chain.cases[0]}, dtypes[0], new_seed())
        if chain.no_gpu == "reference":
            result = launcher(**inputs)
            assert kernel.last_launch()["source"] == "reference (no GPU)"
            torch.testing.assert_close(result, kernel.reference(**inputs), rtol=0, atol=0)
        else:
            with pytest.raises(RuntimeError, match="CUDA"):
                launcher(**inputs)

    if chain.no_gpu == "reference":
        tests.append(test_gradients_fall_back_without_gpu)
    tests.append(test_falls_back_without_gpu)
    out_arg = len(chain.inputs)  # the launch's arguments: the inputs, then the outputs

    def test_nonfinite_output_falls_back(monkeypatch):
        # A fused result with inf where the stepwise reference is finite returns the
        # reference.
        real_launch = kernel._KERNELS.launch

        def launch_then_corrupt(plan, args, config):
            real_launch(plan, args, config)
            args[out_arg].view(-1)[0] = float("inf")

        monkeypatch.setattr(kernel._KERNELS, "launch", launch_then_corrupt)
        inputs = chain.make_inputs({**sizes_of, **chain.cases[0]}, dtypes[0], new_seed())
        result = launcher(**inputs)
        assert kernel.last_launch()["source"] == "reference (non-finite output)"
        torch.testing.assert_close(result, kernel.reference(**inputs), rtol=0, atol=0)

    def test_finite_output_with_an_overflowing_sum_is_kept(monkeypatch):
        # The launcher first checks the output's fp32 sum; one that overflows while every
        # element is finite must still return the fused result.
        real_launch = kernel._KERNELS.launch
        kept = {}

        def launch_then_enlarge(plan, args, config):
            real_launch(plan, args, config)
            flat = args[out_arg].view(-1)
            flat[:2] = torch.finfo(flat.dtype).max
            kept["out"] = flat.clone()

        monkeypatch.setattr(kernel._KERNELS, "launch", launch_then_enlarge)
        inputs = chain.make_inputs({**sizes_of, **chain.cases[0]}, dtypes[0], new_seed())
        result = launcher(**inputs)
        assert kernel.last_launch()["source"] != "reference (non-finite output)"
        assert torch.equal(result.reshape(-1), kept["out"])

    if chain.nonfinite == "reference":
        tests += [
            test_nonfinite_output_falls_back,
            test_finite_output_with_an_overflowing_sum_is_kept,
        ]
    return tests


def tma_tests(chain):
    """The kernel for sm_90+ GPUs (tensor descriptors, a persistent grid) beside the
    portable one, and which shapes take it. The interpreter runs it too when asked to."""
    kernel, launcher = chain.kernel, chain.launcher
    sizes_of, dtypes = chain.sizes, chain.dtypes
    smaller = "the TMA kernel runs under the interpreter for smaller specs"

    @pytest.mark.skipif(chain.heavy, reason=smaller)
    @pytest.mark.parametrize("dtype", dtypes, ids=dtype_id)
    def test_tma_path(monkeypatch, dtype):
        monkeypatch.setenv("FUSEGEN_TMA", "1")
        seed, sizes = new_seed(), {**sizes_of, **chain.aligned}
        chain.run_and_check(chain.make_inputs(sizes, dtype, seed), sizes, dtype, seed)
        assert kernel.last_launch()["path"] == "tma"

    @pytest.mark.skipif(chain.heavy, reason=smaller)
    @pytest.mark.parametrize("flipped", chain.matmul_operands + ["all"])
    def test_tma_path_takes_column_major_operands(monkeypatch, flipped):
        # An operand stored the other way round (a transposed view, as nn.Linear's
        # weight.t() or a cuBLAS transA/transB) runs on the TMA kernel through a
        # descriptor of its transpose, without a copy.
        monkeypatch.setenv("FUSEGEN_TMA", "1")
        dtype, seed, sizes = dtypes[0], new_seed(), {**sizes_of, **chain.aligned}
        if kernel.DIMS[chain.row] is None:
            sizes[chain.row] = -(-sizes[chain.row] // 8) * 8  # a row length in the flipped storage
        inputs = chain.make_inputs(sizes, dtype, seed)
        for name in chain.matmul_operands if flipped == "all" else [flipped]:
            inputs[name] = inputs[name].T.contiguous().T
        chain.run_and_check(inputs, sizes, dtype, seed)
        assert kernel.last_launch()["path"] == "tma"
        assert kernel._CALLS[kernel._signature(*inputs.values())].copies == ()

    @needs_gpu
    def test_pointer_path_on_aligned_shapes(monkeypatch):
        # On a GPU aligned shapes take the TMA kernel; this runs the portable one on them.
        monkeypatch.setenv("FUSEGEN_TMA", "0")
        seed, sizes = new_seed(), {**sizes_of, **chain.aligned}
        chain.run_and_check(chain.make_inputs(sizes, dtypes[0], seed), sizes, dtypes[0], seed)
        assert kernel.last_launch()["path"] == "pointer"

    def test_unaligned_rows_take_the_pointer_path(monkeypatch):
        monkeypatch.setenv("FUSEGEN_TMA", "1")
        device, path = torch.device(DEVICE), kernel._KERNELS.path
        aligned = torch.empty(64, 264, dtype=torch.float16, device=device)
        assert path(device, (aligned,), (aligned,)) == "tma"
        # An operand may be column-major; an output may not.
        assert path(device, (aligned.T,), (aligned,)) == "tma"
        assert path(device, (aligned,), (aligned.T,)) == "pointer"
        # Rows of 50 fp16 elements (100 bytes), a start 2 bytes off, every other column.
        odd_rows = torch.empty(64, 50, dtype=torch.float16, device=device)
        off_start = torch.empty(64 * 264 + 1, dtype=torch.float16, device=device)[1:].view(64, 264)
        sliced = torch.empty(64, 528, dtype=torch.float16, device=device)[:, ::2]
        for tensor in (odd_rows, odd_rows.T, off_start, sliced):
            assert path(device, (aligned, tensor), (aligned,)) == "pointer"
        monkeypatch.setenv("FUSEGEN_TMA", "0")
        assert path(device, (aligned,), (aligned,)) == "pointer"

    @needs_gpu
    @pytest.mark.parametrize("config", kernel.TMA_CONFIGS, ids=config_id)
    def test_every_tma_config(monkeypatch, config):
        monkeypatch.setenv("FUSEGEN_TMA", "1")
        seed, sizes, dtype = new_seed(), {**sizes_of, **chain.aligned}, dtypes[0]
        inputs = chain.make_inputs(sizes, dtype, seed)
        element = torch.empty((), dtype=dtype).element_size()
        smem = kernel._KERNELS.config_smem(config, config["num_stages"], element, True)
        if smem > kernel._KERNELS.shared_memory_limit(DEVICE):
            pytest.skip("over this GPU's shared memory")
        results = as_tuple(launcher(**inputs, config=config))
        launch = kernel.last_launch()
        assert (launch["config"], launch["source"], launch["path"]) == (config, "explicit", "tma")
        chain.check_outputs(results, inputs, dtype, seed, kernel.last_launch())

    return [
        test_tma_path,
        test_tma_path_takes_column_major_operands,
        test_pointer_path_on_aligned_shapes,
        test_unaligned_rows_take_the_pointer_path,
        test_every_tma_config,
    ]


def tuning_tests(chain):
    """Configs: each of the space, autotuning, the untuned default, the estimate's
    ranking, a tuned table's entry; and a CUDA graph's replay of a tuned call."""
    kernel, launcher = chain.kernel, chain.launcher
    sizes_of, dtypes = chain.sizes, chain.dtypes
    runtime = kernel._KERNELS

    @needs_gpu
    @pytest.mark.parametrize("config", kernel.CONFIGS, ids=config_id)
    def test_every_config(monkeypatch, config):
        monkeypatch.setenv("FUSEGEN_TMA", "0")  # the portable kernel, whatever the shape
        seed, sizes, dtype = new_seed(), {**sizes_of, **chain.cases[-1]}, dtypes[0]
        inputs = chain.make_inputs(sizes, dtype, seed)
        element = torch.empty((), dtype=dtype).element_size()
        smem = runtime.config_smem(config, config.get("num_stages", 1), element)
        if smem > runtime.shared_memory_limit(DEVICE):
            pytest.skip("over this GPU's shared memory")
        results = as_tuple(launcher(**inputs, config=config))
        assert kernel.last_launch()["config"] == config
        assert kernel.last_launch()["source"] == "explicit"
        chain.check_outputs(results, inputs, dtype, seed, kernel.last_launch())

    @needs_gpu
    def test_autotunes_on_gpu(monkeypatch):
        monkeypatch.delenv("FUSEGEN_AUTOTUNE", raising=False)
        monkeypatch.setattr(runtime, "plans", {})
        monkeypatch.setattr(kernel, "_CALLS", {})
        monkeypatch.setitem(runtime.table, "entries", [])  # no tuned table: tune now
        launcher(**chain.make_inputs({**sizes_of, **chain.cases[0]}, dtypes[0], new_seed()))
        launch = kernel.last_launch()
        space = kernel.TMA_CONFIGS if launch["path"] == "tma" else kernel.CONFIGS
        expected = "default" if kernel.DETERMINISTIC else "autotune"
        assert launch["source"] == expected and (expected == "default" or launch["config"] in space)

    @needs_gpu
    def test_replays_from_a_cuda_graph():
        # After a first call of a shape (compiling, tuning), calls can be captured in a
        # CUDA graph; a replay reads whatever the captured input tensors hold then.
        dtype, sizes = dtypes[0], {**sizes_of, **chain.cases[0]}
        static = chain.make_inputs(sizes, dtype, new_seed())
        buffers = chain.output_buffers(sizes, dtype)
        launcher(**static, **buffers)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launcher(**static, **buffers)
        launch = kernel.last_launch()
        seed = new_seed()
        for name, value in chain.make_inputs(sizes, dtype, seed).items():
            static[name].copy_(value)
        for buffer in buffers.values():
            buffer.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        chain.check_outputs(tuple(buffers.values()), static, dtype, seed, launch)

    @needs_gpu
    def test_default_config_without_tuning(monkeypatch):
        monkeypatch.setenv("FUSEGEN_AUTOTUNE", "0")
        monkeypatch.setattr(runtime, "plans", {})
        monkeypatch.setattr(kernel, "_CALLS", {})
        monkeypatch.setitem(runtime.table, "entries", [])
        launcher(**chain.make_inputs({**sizes_of, **chain.cases[0]}, dtypes[0], new_seed()))
        launch = kernel.last_launch()
        assert launch["source"] == "default"
        if chain.estimated_default:
            # The estimate's pick from the space of the kernel that ran.
            space = kernel.TMA_CONFIGS if launch["path"] == "tma" else kernel.CONFIGS
            assert launch["config"] in [runtime.complete(launch["path"], c) for c in space]
        else:
            pointer = launch["path"] == "pointer"
            default = kernel.DEFAULT_CONFIG if pointer else runtime.paths["tma"][2]
            assert launch["config"] == default

    @pytest.mark.skipif(kernel.DIMS[chain.row] is not None, reason="the spec fixes the row count")
    def test_estimate_ranks_tiles_for_the_shape():
        # What a first call compiles (and runs untuned) comes from the estimate: large
        # row tiles for a prefill-sized call, the smallest for a decode-sized one
        # (measured so on an H200: fusegen's
        # benchmarks/results/2026-12-01-h200-layouts-first-calls/space.txt).
        dims = {dim: sizes_of.get(dim, 4096) for dim in kernel.DIMS}
        paths = [("pointer", kernel.CONFIGS)]
        if "tma" in runtime.paths:
            paths.append(("tma", kernel.TMA_CONFIGS))
        for path, space in paths:
            space = [runtime.complete(path, c) for c in space]
            smallest = min(c["BLOCK_M"] for c in space)
            for rows, wanted in ((8192, lambda m: m >= 128), (16, lambda m, s=smallest: m == s)):
                sizes = {"BLOCK_M": rows, "BLOCK_N": dims[chain.col], "BLOCK_K": dims[chain.fan_in]}
                ranked = runtime.ranked(space, path == "tma", sizes, 2, 132)
                assert sorted(ranked) == list(range(len(space)))
                assert wanted(space[ranked[0]]["BLOCK_M"]), (path, rows, space[ranked[0]])

    @pytest.mark.skipif(chain.heavy, reason=SLOW_WEIGHTS)
    def test_tuned_table_entry_runs_without_tuning(monkeypatch):
        # A table entry for this GPU and kernel source: its config runs, nothing is
        # timed. Off a GPU the interpreter stands in, with a made-up GPU identity.
        if not ON_GPU:
            monkeypatch.setattr(runtime, "can_tune", lambda device: True)
            monkeypatch.setattr(runtime, "device_identity", lambda device: ("Fake GPU", [9, 0]))
        gpu, capability = runtime.device_identity(torch.device(DEVICE))

        def no_tuning(*args):
            raise AssertionError("the launcher tuned despite a matching table entry")

        monkeypatch.setattr(runtime, "tune", no_tuning)
        monkeypatch.setattr(runtime, "plans", {})
        monkeypatch.setattr(kernel, "_CALLS", {})
        monkeypatch.delenv("FUSEGEN_TMA", raising=False)
        dtype = dtypes[0]
        seed, sizes = new_seed(), {**sizes_of, **chain.cases[0]}
        inputs = chain.make_inputs(sizes, dtype, seed)
        config = kernel.CONFIGS[-1] if ON_GPU else kernel.INTERPRETER_CONFIG
        config = runtime.complete("pointer", config)
        tma = runtime.complete("tma", config) if "tma" in runtime.paths else None
        # The row bucket next to this call's (twice its rows), the nearest that serves.
        nearby = 2 * kernel._rt.bucket(sizes[chain.row])
        entry = {
            "gpu": gpu,
            "capability": capability,
            "kernel_hash": kernel.KERNEL_HASH,
            "key": {**chain.table_key(sizes, dtype), runtime.key_names[0]: nearby},
            "best": "tma" if tma else "pointer",
            "choices": {
                "pointer": {"config": config, "ms": 1.0},
                **({"tma": {"config": tma, "ms": 0.5}} if tma else {}),
            },
        }
        stale = {
            **entry,
            "kernel_hash": "0" * 16,
            "choices": {"pointer": {"config": {}, "ms": 0.1}},
        }
        monkeypatch.setitem(runtime.table, "entries", [stale, entry])
        buffers = chain.output_buffers(sizes, dtype)
        results = as_tuple(launcher(**inputs, **buffers))
        launch = kernel.last_launch()
        assert launch["source"] == "table", launch
        assert launch["config"] == (tma if launch["path"] == "tma" else config)
        chain.check_outputs(results, inputs, dtype, seed, launch)

        # The table holds row-major measurements: a column-major input is tuned apart.
        tuned = []
        monkeypatch.setattr(runtime, "tune", lambda *args: tuned.append(args[1]))
        flipped = column_major(inputs)
        if any(kernel._rt.column_major(t) for t in flipped.values() if t.dim() == 2):
            launcher(**flipped)
            assert tuned and kernel.last_launch()["source"] == "default", kernel.last_launch()

    tests = [
        test_every_config,
        test_autotunes_on_gpu,
        test_replays_from_a_cuda_graph,
        test_default_config_without_tuning,
    ]
    if chain.tma:  # an NVIDIA matmul chain, whose first calls take the estimate's tiles
        tests.append(test_estimate_ranks_tiles_for_the_shape)
    return tests + [test_tuned_table_entry_runs_without_tuning]
