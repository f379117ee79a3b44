"""A chain module's kernels as the runtime launches them (`Kernels`): checks shared by
every call signature, choosing a config (the caller's, a tuned table's, runtime tuning's,
an estimate's), the direct launch of the compiled kernel, training, torch.compile's ops.

A kernel module calls `Kernels` and the helpers below through this module (`_rt`)."""

import gc
import inspect
import logging
import math
import sys
import threading
import time
import types

import torch
import triton
from torch.autograd import forward_ad

from .checks import (  # noqa: F401 - the kernel modules reach these through this module
    Plan,
    Shapes,
    align,
    autocast_inputs,
    autocasting,
    bucket,
    call_dtype,
    check_pinned,
    column_major,
    common_device,
    config_key,
    config_row,
    config_table,
    config_values_problems,
    copies,
    fp32_dot,
    fp32_highest,
    fp32_matmul,
    layout,
    names_errors,
    needs_int64,
    plain,
    refuse_dual,
    refuse_grad_out,
    refuse_second_derivative,
    runs_triton,
    settled,
    shares_memory,
    signature,
    strides_of,
    switch,
    tma_ready,
)
from .device import device_facts, ensure_allocator, graph_bench, release_flush
from . import launch, ops, tables
from .ops import Traced, typed
from .settings import (
    HBM_BYTES_PER_US,
    L2_BYTES_PER_US,
    MMA_FLOPS_PER_US,
    ROW_BACKWARD_MAX_COLS,
    SHORTLIST,
    SPLIT_K_MAX_ROWS,
    TMA_US,
    WAVE_US,
)

_log = logging.getLogger(__name__)
# The call dtypes whose training forwards take cuBLAS's matmuls then the epilogue kernel
# (Kernels.epilogue_forward); fp32 keeps the fused kernel, whose tf32 cuBLAS would not run.
EPILOGUE_DTYPES = (torch.bfloat16, torch.float16)


# last_launch before any call.
_NOTHING_RAN = {
    "config": None,
    "source": None,
    "path": None,
    "fast_tanh": False,
    "fp32_matmul": None,
}


def _ran(record, run):
    """A thread's last call as a plan's `ready` entry holds it: [5] last_launch's record,
    [7] last_run's."""
    return [None] * 5 + [record, None, run]


class _Trained(torch.autograd.Function):
    """A training call eagerly: Kernels.forward_saving, then Kernels.backward."""

    @staticmethod
    def forward(ctx, kernels, *inputs):
        results = kernels.forward_saving(*inputs)
        results = results if isinstance(results, tuple) else (results,)
        ctx.kernels = kernels
        # The saved accumulators get no gradient: none is made of zeros ([M, N] each).
        ctx.set_materialize_grads(False)
        kernels.keep(ctx, inputs, results)
        ctx.mark_non_differentiable(*results[kernels.returns :])
        return results[0] if len(results) == 1 else results

    @staticmethod
    def backward(ctx, *grads):
        kernels = ctx.kernels
        refuse_second_derivative(kernels.name)
        # A matmul chain's backward writes d_pre over the saved accumulators it reads for
        # the last time: an [M, N] tensor a matmul less at the step's peak. A second
        # backward through the node (retain_graph) finds them overwritten: it recomputes
        # them, as for backward.save: inputs.
        again = getattr(ctx, "overwritten", False)
        ctx.overwritten = True

        def backward(grads, inputs, saved, needs):
            return kernels.backward(grads, inputs, saved, needs, overwrite=True, stale=again)

        return (None, *kernels.differentiate(ctx, grads, ctx.needs_input_grad[1:], backward))


class _BackwardPlan:
    """What a chain's backward call signature launches, worked out once
    (Kernels.backward_plan_of)."""

    __slots__ = (
        "launches", "rows", "cols", "device", "views", "grid", "stored", "buffers",
        "returned", "strides", "kernel", "kwargs",
    )  # fmt: skip


class Kernels:
    """One kernel module's Triton kernels as this runtime launches them: what the module
    says of them, and what its calls found out (plans chosen, tuned kernels, the last
    launch). The module's constants (DIMS, DTYPES, OUT_DTYPE, FP32_MATMUL,
    INTERPRETER_CONFIG, TUNED_TABLE, KERNEL_HASH, DETERMINISTIC) and its `reference` are
    read from its namespace when used.

    pointer, tma: per kernel path, (its kernel, config space, default config); tma: the
        TMA kernel's, for sm_90 and newer GPUs (None: no TMA kernel).
    optional: per path, settings a config may add to its default's, and the kernel's
        value for each one left out (None: a compile option, not passed).
    inputs: the launcher's input names, in order; outputs: how many tensors it returns.
    pinned: {input: the dtype the spec pins it to}.
    dims: the output's row and column dims, then the matmul's reduction dim if any.
    tune_key: the kernel arguments the autotuner keys on.
    tma_operands: the TMA kernel's layout flags -> operands' places in its arguments.
    weights: matmuls per output tile (2 for a gated chain; 0: no matmul).
    """

    def __init__(
        self,
        module,
        name,
        *,
        pointer,
        inputs,
        dims,
        tune_key,
        op_name,
        tma=None,
        optional=None,
        outputs=1,
        pinned=None,
        tma_operands=None,
        weights=0,
        full_operands=False,
        rowwise=False,
        fast_tanh=False,
        spec_default=False,
        nonfinite=False,
        no_gpu_reference=False,
        amd=False,
        backward=(),
        backward_reads=(),
        backward_saves=(),
        matmul=None,
        reduces=False,
        recompute=False,
        epilogue=False,
        stats=0,
    ):
        self.module, self.name = module, name
        self.paths = {"pointer": pointer, **({"tma": tma} if tma else {})}
        self.optional = optional or {path: {} for path in self.paths}
        self.inputs, self.dims, self.tune_key, self.pinned = inputs, dims, tune_key, pinned or {}
        # What a tuned table's entry keys on, in the order of a plan's key.
        self.key_names = (f"{dims[0]}_bucket", *dims[1:], "dtype", "out_dtype")
        # In a launch's arguments: the outputs, then a matmul chain's accumulators' buffers
        # (SAVE_PRE) or a norm's statistics' buffer (SAVE_STATS: `stats` fp32 numbers a
        # row, which its backward reads instead of reducing the row again). saves: how
        # many buffers a training forward keeps (0: the accumulators are recomputed).
        accumulators = 1 + (weights > 1) if weights else 0
        buffers = accumulators or int(bool(stats))
        self.stats = stats
        self.returns, self.saves = outputs, 0 if recompute else buffers
        self.outputs = slice(len(inputs), len(inputs) + outputs + buffers)
        # The backward: (gradient, input index or -1, kind) per gradient its kernel
        # writes, kind "=<name>" where it is the same tensor as <name>'s; a matmul
        # chain's (a index, a transposed, ((b index, b transposed), ...)).
        self.grads, self.matmul = backward, matmul
        self.backward_reads, self.reduces = backward_reads, reduces  # inputs it reads; [rows] out
        self.backward_saves = backward_saves  # the outputs it reads, by place
        self.epilogue = epilogue  # a matmul chain's training forward: cuBLAS, then its kernel
        # A stored gradient's input -> the inputs that get the same tensor: the backward
        # (an op, whose outputs may not alias) returns it once, in the stored one's place.
        places = {name: index for name, index, _ in backward}
        self.same = {}
        for _, index, kind in backward:
            if kind.startswith("="):
                self.same.setdefault(places[kind[1:]], []).append(index)
        self.train_op = self.backward_op = None
        self.op_name, self.tma_operands, self.weights = op_name, tma_operands or {}, weights
        self.full_operands, self.rowwise, self.uses_fast_tanh = full_operands, rowwise, fast_tanh
        # The estimate ranks matmul configs (its constants are measured on NVIDIA GPUs),
        # and picks the untuned config unless the spec gives its own (spec_default).
        self.estimated = weights > 0 and not amd
        self.estimated_default = self.estimated and not spec_default
        self.nonfinite, self.no_gpu_reference, self.amd = nonfinite, no_gpu_reference, amd
        # What each thread's last call ran (last_launch; last_run: the compiled "kernel"
        # and plan "key", for fusegen tune and inspect): a server's threads each read
        # their own call's. A launch of a known signature stores its plan's `ready`
        # entry, [5] the one and [7] the other, in one store.
        self.here = threading.local()
        self.plans = {}  # tuning key -> (path, config, source) chosen once
        self.table = {}  # "entries": the tuned table's entries, read at first use
        self.tuned = {}  # path -> its autotuned kernel
        self.shortlists = {}  # path -> configs its next tuning compiles (set by tune)
        self.logged = set()
        self.untraced_launcher = None
        # thread -> depth, while traced_call (or a training op) runs for torch.compile in
        # it: another thread's eager calls meanwhile are no trace (tracing_here). Empty,
        # it costs a call what the counter it replaced did.
        self.tracing = {}
        self.save_pre_pointer = False  # a training forward's TMA launch ran out of resources
        self.kept = launch.Kept()  # launch_kept's direct launches

    # What the last call ran, and what goes wrong loudly.

    @property
    def last(self):
        ran = getattr(self.here, "ran", None)
        return _NOTHING_RAN if ran is None else ran[5]

    @property
    def last_run(self):
        ran = getattr(self.here, "ran", None)
        return {} if ran is None or ran[7] is None else ran[7]

    def last_launch(self):
        last = self.last
        config = last["config"]
        return {**last, "config": dict(config) if config is not None else None}

    def record(self, config, source, path=None, fast_tanh=False, fp32_matmul=None):
        """What last_launch says (a launch of a known signature stores its plan's dict)."""
        last = {
            "config": config,
            "source": source,
            "path": path,
            "fast_tanh": fast_tanh,
            "fp32_matmul": fp32_matmul,
        }
        self.here.ran = _ran(last, self.last_run or None)

    def tracing_here(self):
        """Whether torch.compile traces in this thread (read after `self.tracing`, so
        a call outside any trace pays nothing for it)."""
        return threading.get_ident() in self.tracing

    def log_once(self, reason, message, *args):
        if reason not in self.logged:
            self.logged.add(reason)
            _log.warning(f"{self.name}: {message}", *args)

    def refuse_grad(self, *tensors):
        """Raise for inputs that require grad where no backward can run (a torch without
        torch.library.custom_op, or the inference op called directly): the output would
        carry no gradient, and training would silently leave them unchanged."""
        names = [
            n
            for n, t in zip(self.inputs, tensors, strict=True)
            if getattr(t, "requires_grad", False)
        ]
        one = len(names) == 1
        detached = ", ".join(f"{name}.detach()" for name in names)
        raise RuntimeError(
            f"{self.name}: {', '.join(names)} {'requires' if one else 'require'} grad, but the "
            "backward runs through torch.library.custom_op (torch 2.4 or newer), which this call "
            f"cannot reach: its output would carry no gradient to {'it' if one else 'them'}. "
            "Call the launcher itself (not its inference op) on such a torch; for inference, "
            f"call it under torch.no_grad() or pass {detached}; or train through reference(...)."
        )

    def dtype_and_device(self, *tensors):
        """The call's dtype (that of every input the spec does not pin, one of DTYPES)
        and its device, which every input shares."""
        named = dict(zip(self.inputs, tensors, strict=True))
        dtype = call_dtype(
            {n: t for n, t in named.items() if n not in self.pinned}, self.module["DTYPES"]
        )
        check_pinned({n: (named[n], d) for n, d in self.pinned.items()})
        return dtype, common_device(named)

    def check_out(self, name, out, plan, inputs, outputs=()):
        """A caller's buffer for output `name` ("out": the chain's result; "out_<x>": the
        value at `output: x`, in the call dtype), apart from the inputs and `outputs` (the
        call's other output buffers)."""
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(out).__name__}")
        refuse_grad_out(name, out)
        main = name == "out"
        shape, dtype = (plan.out_shape, plan.out_dtype) if main else (plan.extra_shape, plan.dtype)
        device = plan.device
        if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
            raise ValueError(
                f"{name} must be {list(shape)} {dtype} on {device}, got "
                f"{list(out.shape)} {out.dtype} on {out.device}"
            )
        if not out.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        for other, tensor in zip(self.inputs, inputs, strict=True):
            if shares_memory(out, tensor):
                raise ValueError(f"{name} shares memory with {other}; pass a separate buffer")
        twice = sum(t is out for t in outputs) > 1
        if twice or any(
            isinstance(t, torch.Tensor) and t is not out and shares_memory(out, t) for t in outputs
        ):
            raise ValueError(f"{name} shares memory with another output; pass separate buffers")

    # Where a call runs.

    def interpreted(self):
        """Whether TRITON_INTERPRET=1 was set when the module was imported (triton.jit
        decides then); the kernel may sit inside a @triton.heuristics wrapper."""
        fn = self.paths["pointer"][0]
        while type(fn).__name__ == "Heuristics":
            fn = fn.fn
        return type(fn).__name__ == "InterpretedFunction"

    def runs_triton(self, device):
        return runs_triton(device, self.interpreted())

    def can_tune(self, device):
        """Tables and tuning are per GPU: under the interpreter there is neither."""
        return device.type == "cuda" and not self.interpreted()

    def device_facts(self, device):
        return device_facts(device, self.amd)

    def shared_memory_limit(self, device):
        return self.device_facts(device)[2]

    def device_identity(self, device):
        """(name, [major, minor]) as tuned tables record a GPU."""
        return tables.device_identity(device)

    def path(self, device, operands, outputs=()):
        """ "tma" on sm_90+ GPUs when every matmul operand (row- or column-major) and
        output (row-major) allows it, else "pointer". FUSEGEN_TMA=0 forces the pointer
        path; FUSEGEN_TMA=1 takes the TMA path wherever the tensors allow, the
        interpreter included."""
        if "tma" not in self.paths or not self.runs_triton(device):
            return "pointer"
        setting = switch("FUSEGEN_TMA")
        traced = bool(self.tracing) and self.tracing_here()
        ready = all(tma_ready(t, either_major=True, traced=traced) for t in operands)
        if setting == "0" or not ready or not all(tma_ready(t, traced=traced) for t in outputs):
            return "pointer"
        if setting == "1":
            return "tma"
        if self.interpreted() or device.type != "cuda" or torch.version.hip:
            return "pointer"  # ROCm reports CDNA3 as major 9 too: no TMA there
        return "tma" if self.device_facts(device)[0] >= 9 else "pointer"

    def fast_tanh(self, device, *out_dtypes):
        """Whether the activations run on tanh.approx (FAST_TANH): on NVIDIA GPUs from
        Ampere on, where every output is bf16 or fp16 (its error, under 2**-10.98 of
        tanh's value, is a small fraction of their rounding at the input's scale; the
        tests bound it); never under the interpreter (no PTX there)."""
        return (
            device.type == "cuda"
            and not torch.version.hip
            and not self.interpreted()
            and all(d in (torch.float16, torch.bfloat16) for d in out_dtypes)
            and self.device_facts(device)[0] >= 8
        )

    def finish(self, plan, calls, inputs, *views):
        """Complete a plan from its checks (device, dtypes, shapes, path, tail, key; views:
        every input's and output's 2-D view) and remember it under the call's signature.
        The key gains the layout last: which 2-D views are column-major, as such calls are
        tuned apart and the tuned table (measured on row-major inputs) serves only calls
        with none."""
        plan.key = (*plan.key, layout(*(v for v in views if v.dim() == 2)))
        plan.runs_triton = self.runs_triton(plan.device)
        plan.launches = plan.runs_triton and math.prod(plan.out_shape) > 0
        consts = {"INT64": needs_int64(*views)}
        plan.fp32 = self.weights > 0 and plan.dtype == torch.float32
        plan.follows_torch = plan.fp32 and self.module["FP32_MATMUL"] is None
        plan.highest = fp32_highest(plan.device)
        plan.cuda = plan.device.index if plan.device.type == "cuda" else None
        if self.weights:
            consts["DOT_UPCAST"] = self.interpreted() and plan.dtype == torch.bfloat16
            # tl.dot ignores it for 16-bit operands; an fp32 call may set it again (launch).
            consts["INPUT_PRECISION"] = self.module["FP32_MATMUL"] or "tf32"
            consts["SAVE_PRE"] = False  # a training forward's plan sets it (forward_saving)
        if self.stats:
            consts["SAVE_STATS"] = False  # as SAVE_PRE
        if self.uses_fast_tanh:
            out_dtypes = [plan.out_dtype] + [plan.dtype] * (self.returns - 1)
            consts["FAST_TANH"] = self.fast_tanh(plan.device, *out_dtypes)
        plan.consts = consts
        plan.ready = {}  # config (None: chosen) -> what its launch needs, from launch
        if not (self.tracing and self.tracing_here()):  # fake tensors have no address
            if len(calls) >= 1024:
                calls.clear()
            calls[signature(*inputs)] = plan
        return plan

    def without_launch(self, plan, outputs, inputs):
        """A call whose plan launches nothing: an empty output, or no GPU (and no
        interpreter), where the spec says to run the reference or to raise."""
        if plan.runs_triton:
            self.record(None, "empty")
        elif plan.device.type == "meta":
            # Shape inference (a model built on the meta device): the outputs as made,
            # with no warning and no refusal, as PyTorch's own ops there.
            self.record(None, "meta (shapes only)")
        elif self.no_gpu_reference:
            self.log_once(
                "no-gpu",
                "the inputs are on %s, where no kernel runs (a CUDA GPU runs them, the "
                "Triton interpreter CPU tensors); running the PyTorch reference",
                plan.device,
            )
            results = self.module["reference"](*inputs)
            for buffer, result in zip(
                outputs, results if len(outputs) > 1 else (results,), strict=True
            ):
                buffer.copy_(result)
            self.record(None, "reference (no GPU)")
        else:
            raise RuntimeError(
                f"{self.name}: the inputs are on {plan.device}; the kernel needs CUDA tensors "
                "(or TRITON_INTERPRET=1 set before import to run it on the Triton interpreter)"
            )
        return outputs[0] if len(outputs) == 1 else outputs

    def empty_outputs(self, plan):
        """The outputs of a call as torch.compile traces it (see a module's _fake)."""
        out = torch.empty(plan.out_shape, dtype=plan.out_dtype, device=plan.device)
        extras = self.returns - 1
        if not extras:
            return out
        return (
            out,
            *(
                torch.empty(plan.extra_shape, dtype=plan.dtype, device=plan.device)
                for _ in range(extras)
            ),
        )

    def keep_finite(self, out, *inputs):
        """Where the fused output has inf/NaN and the stepwise reference is finite there,
        put the reference in it. One reduction is read back: the sum is finite only where
        every element is (a finite output whose sum overflows only costs the element-wise
        check)."""
        if out.is_cuda and torch.cuda.is_current_stream_capturing():
            # Checking needs the output on the CPU, which a CUDA graph cannot wait for.
            self.log_once("nonfinite-graph", "no inf/NaN check while a CUDA graph is captured")
            return
        if torch.isfinite(out.sum(dtype=torch.float32)):
            return
        bad = ~torch.isfinite(out)
        if not bad.any():
            return
        expected = self.module["reference"](*inputs)
        expected = expected[0] if isinstance(expected, tuple) else expected
        if (bad & torch.isfinite(expected)).any():
            self.log_once(
                "nonfinite",
                "the fused output has inf/NaN where the stepwise reference is finite; "
                "returning the reference",
            )
            out.copy_(expected)
            self.record(None, "reference (non-finite output)")

    # Launching.

    def launch(self, plan, args, config):
        """Launch the kernel with the config `choose` picks; remember what ran. What a
        signature's launch needs (kernel, grid, keyword arguments) is worked out once and
        kept in its plan, and from the second call the compiled kernel is launched
        directly (see direct): a call of a known signature costs a dict lookup and the
        launch. An fp32 call that follows PyTorch's matmul precision reads it each time.
        While torch.compile traces (see traced_call), the launch goes into its graph."""
        if self.tracing and self.tracing_here():
            return self.traced_launch(plan, args)
        if forward_ad._current_level >= 0:  # inside dual_level(): a read, not a call
            refuse_dual(self.name, args[: self.outputs.start])
        if plan.cuda is not None and plan.cuda != torch._C._cuda_getDevice():
            with torch.cuda.device(plan.device):  # see launch.elsewhere
                return self.launch(plan, args, config)
        given = args
        key = None if config is None else config_key(config)
        precision = None
        if plan.follows_torch:
            # fp32_dot(plan.device), the device's part kept in the plan.
            precision = "tf32" if fp32_matmul() == "tf32" else plan.highest
            key = (key, precision)
        if plan.copies:
            args = list(args)
            for index in plan.copies:
                args[index] = args[index].contiguous()
        # A caller's output buffer may start off 16 bytes: the TMA kernel cannot store
        # there, and what triton compiled assumed alignment.
        aligned = True
        for output in args[self.outputs]:
            if output.data_ptr() % 16:
                aligned = False
                break
        path = plan.path if aligned else "pointer"
        ready = plan.ready.get(key)
        if ready is None or ready[0] != path:
            if len(plan.ready) >= 64:
                plan.ready.clear()
            consts = plan.consts
            if precision is not None:
                consts = {**consts, "INPUT_PRECISION": precision}
            ready = plan.ready[key] = self._ready(path, plan, args, config, consts)
        _, kernel, grid, kwargs, split, record, direct, _ = ready
        if self.weights:
            # Unsplit, the output stands in for the scratch (see scratch): no call for it.
            output = args[self.outputs.start]
            args = (*args, *(self.scratch(args, split) if split > 1 else (output, output)))
        if direct and aligned:
            direct(*args)
            self.here.ran = ready
            return
        try:
            compiled = kernel[grid](*args, **kwargs)
        except (triton.runtime.errors.OutOfResources, triton.runtime.errors.PTXASError) as exc:
            # The shared-memory estimate let through a config that does not fit
            # (Triton's count moves with the chain and the precision: tf32x3 takes
            # more), or ptxas 12.8 crashed on it: fewer pipeline stages, then the
            # pointer kernel, for this signature from now on.
            if config is not None or (ready[0] == "pointer" and kwargs["num_stages"] == 1):
                raise
            if kwargs["num_stages"] > 1:
                stages = kwargs["num_stages"] - 1
                ready[3] = {**kwargs, "num_stages": stages}
                ready[5] = {**record, "config": {**record["config"], "num_stages": stages}}
                self.log_once("resources", "%s; fewer pipeline stages", exc)
            else:
                self.log_once("tma-resources", "%s; the pointer kernel runs instead", exc)
                plan.path, plan.ready = "pointer", {}
            return self.launch(plan, given, config)
        ran = {"kernel": compiled, "key": plan.key, "direct": False}
        if direct is None and aligned:  # False: no direct launch for this plan (asked once)
            made = None
            if launch.enabled(self.interpreted()):
                made = launch.direct(compiled, kernel, grid, args, kwargs)
            # The record first: a thread finding the direct launch reads it next.
            ready[7] = {"kernel": compiled, "key": plan.key, "direct": True}
            ready[6] = made or False
        self.here.ran = _ran(record, ran)

    def _ready(self, path, plan, args, config, consts):
        """[path asked for, kernel, grid, keyword arguments, SPLIT_K, what last_launch
        says, the direct launch (None: not yet asked; False: none), last_run's record of
        a direct launch]."""
        asked = path
        path, chosen, source = self.choose(path, plan.key, args, consts, config)
        kwargs = {**self.path_consts(path, args, consts), **self.triton_kwargs(path, chosen)}
        dims = dict(zip(self.module["DIMS"], plan.tail, strict=False))
        grid = (*self.grid({**dims, **kwargs}), 1, 1)[:3]  # a compiled kernel takes 3
        fp32 = consts["INPUT_PRECISION"] if plan.fp32 else None
        fast = bool(consts.get("FAST_TANH"))
        record = {
            "config": chosen,
            "source": source,
            "path": path,
            "fast_tanh": fast,
            "fp32_matmul": fp32,
        }
        return [
            asked,
            self.paths[path][0],
            grid,
            kwargs,
            chosen.get("SPLIT_K", 1),
            record,
            None,
            None,
        ]

    def grid(self, meta):
        rows, cols = meta[self.dims[0]], meta[self.dims[1]]
        if self.rowwise:
            return (triton.cdiv(rows, meta["BLOCK_M"]),)  # a program per BLOCK_M rows
        tiles = triton.cdiv(rows, meta["BLOCK_M"]) * triton.cdiv(cols, meta["BLOCK_N"])
        if "NUM_SMS" in meta:
            return (min(tiles, meta["NUM_SMS"]),)  # persistent: a program per SM
        return (tiles * meta.get("SPLIT_K", 1),)

    def path_consts(self, path, args, consts):
        if path != "tma":
            return consts
        device = args[0].device
        ensure_allocator(device)
        sms = self.device_facts(device)[1] if device.type == "cuda" else 4
        layouts = {flag: column_major(args[i]) for flag, i in self.tma_operands.items()}
        return {**consts, "NUM_SMS": sms, **layouts}

    def scratch(self, args, split):
        """The split-K scratch for `split` programs per tile: fp32 partial sums (per
        accumulator) and zeroed arrival counters, enough for any tile of 16 or more."""
        out = args[self.outputs.start]
        if split <= 1 and self.tracing and self.tracing_here():
            # Never read either (SPLIT_K is 1): empty, as zeros would cost the compiled
            # graph a launch of its own.
            return torch.empty(1, dtype=torch.float32, device=out.device), torch.empty(
                1, dtype=torch.int32, device=out.device
            )
        if split <= 1:
            # An unsplit kernel never touches them (SPLIT_K is a constexpr): the output
            # stands in. No tensor is kept, as one made at a first call under CUDA graphs
            # (reduce-overhead) would sit in the graph's pool untracked, which it refuses.
            return out, out
        rows, cols = out.shape
        partials = torch.empty(
            self.weights * split * rows * cols, dtype=torch.float32, device=out.device
        )
        arrivals = torch.zeros(
            triton.cdiv(rows, 16) * triton.cdiv(cols, 16), dtype=torch.int32, device=out.device
        )
        return partials, arrivals

    # Configs.

    def complete(self, path, config):
        """`config` with just the settings `path`'s kernel takes: the ones it leaves out
        filled from that path's default, optional ones kept where given."""
        default = self.paths[path][2]
        completed = {k: config.get(k, default[k]) for k in default}
        return {**completed, **{k: config[k] for k in self.optional[path] if k in config}}

    def triton_kwargs(self, path, config):
        fixed = {k: v for k, v in self.optional[path].items() if v is not None}
        return {**fixed, **config, "num_stages": config.get("num_stages", 1)}

    def triton_config(self, path, config):
        meta = {
            k: v
            for k, v in self.triton_kwargs(path, config).items()
            if k not in ("num_warps", "num_stages")
        }
        return triton.Config(
            meta, num_warps=config["num_warps"], num_stages=config.get("num_stages", 1)
        )

    def checked_config(self, path, config):
        required = set(self.paths["pointer"][2])
        allowed = set().union(
            *(default for _, _, default in self.paths.values()), *self.optional.values()
        )
        if not isinstance(config, dict) or not required <= set(config) <= allowed:
            raise ValueError(
                f"config must be a dict with keys {sorted(required)} (optional: "
                f"{sorted(allowed - required) or 'none'}), got {config!r}"
            )
        problems = config_values_problems(config, dot=bool(self.weights))
        if problems:
            raise ValueError(f"{self.name}: bad config {config!r}: " + "; ".join(problems))
        return self.complete(path, config)

    def config_smem(self, meta, stages, element_size, tma=False):
        """Shared memory a config needs: its pipelined input tiles, the output tile a
        TMA store goes through, fp32 scratch where the chain loads a full-tile operand
        (triton reshapes the accumulator through shared memory for it), and an A tile
        more where tf32x3 splits fp32 operands (meta's INPUT_PRECISION: 64x128x64 at 4
        stages took 245,816 bytes on an H200, the tiles and output 229,376)."""
        if not self.weights:
            return 0
        a_tile = meta["BLOCK_M"] * meta["BLOCK_K"]
        b_tile = meta["BLOCK_K"] * meta["BLOCK_N"]
        out_tile = meta["BLOCK_M"] * meta["BLOCK_N"] * element_size if tma else 0
        if meta.get("EPILOGUE_SUBTILE"):
            out_tile //= 2  # stored in two halves
        scratch = meta["BLOCK_M"] * meta["BLOCK_N"] * 4 if self.full_operands else 0
        if meta.get("INPUT_PRECISION") == "tf32x3":
            scratch += a_tile * element_size + 1024
        if self.amd:
            # Triton's AMD pipeliner keeps num_stages - 1 sets of tiles in LDS (at least one).
            stages = max(1, stages - 1)
        return stages * (a_tile + self.weights * b_tile) * element_size + out_tile + scratch

    def sizes(self, dims):
        """{"BLOCK_M": rows, "BLOCK_N": cols[, "BLOCK_K": depth]} from a kernel's dims."""
        return dict(
            zip(("BLOCK_M", "BLOCK_N", "BLOCK_K"), (dims[d] for d in self.dims), strict=False)
        )

    def fits(self, config, tma, sizes, element_size, device):
        """Whether a config is worth compiling: within the device's shared memory, and no
        block far larger than the dim it tiles ({"BLOCK_M": rows, ...}; such a tile only
        adds masked work)."""
        if self.config_smem(
            config, config.get("num_stages", 1), element_size, tma
        ) > self.shared_memory_limit(device):
            return False
        split = config.get("SPLIT_K", 1)
        if split > 1 and (
            sizes["BLOCK_M"] > SPLIT_K_MAX_ROWS
            or triton.cdiv(sizes["BLOCK_K"], config["BLOCK_K"]) < 2 * split
        ):
            return False  # many rows, or too few K blocks to share out
        return not any(config[b] >= 2 * max(16, bucket(n)) for b, n in sizes.items())

    def prune(self, configs, named_args, **kwargs):
        """Drop configs before compiling (see fits); keep the smallest if none fits. With
        the estimate, keep the shortlist it ranks first."""
        first = named_args[f"{self.inputs[0]}_ptr"]
        tma = "NUM_SMS" in kwargs
        sizes = self.sizes(named_args)
        element = first.element_size()
        precision = {"INPUT_PRECISION": kwargs.get("INPUT_PRECISION")}
        kept = [
            c
            for c in configs
            if self.fits(
                {**c.kwargs, "num_stages": c.num_stages, **precision},
                tma,
                sizes,
                element,
                first.device,
            )
        ]
        if kept and self.estimated:
            ranked = self.ranked(
                [c.kwargs for c in kept], tma, sizes, element, self.device_facts(first.device)[1]
            )
            return [
                kept[i]
                for i in ranked[: self.shortlists.get("tma" if tma else "pointer", SHORTLIST)]
            ]
        return kept or [
            min(configs, key=lambda c: self.config_smem(c.kwargs, c.num_stages, element, tma))
        ]

    def estimate_us(self, config, tma, sizes, element_size, sms):
        """A config's time for a shape, roughly (us), to rank configs before compiling
        any: waves of output tiles over the SMs, each tile as long as the longer of its
        tensor-core work and its loads. Tensor cores work on 64 rows at a time; weight
        tiles that one row of tiles alone reads come from HBM, shared ones mostly from
        L2. The pointer kernel's larger tiles run ~1.25x the TMA kernel's (measured), and
        far slower with K or N not a multiple of 16 (no vector loads). On the anchor GEMM
        chains of an H200 it ranks the fastest config first, or one within 6% of it."""
        rows, cols, depth = sizes["BLOCK_M"], sizes["BLOCK_N"], sizes["BLOCK_K"]
        block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
        split = config.get("SPLIT_K", 1)
        row_tiles = triton.cdiv(rows, block_m)
        waves = triton.cdiv(row_tiles * triton.cdiv(cols, block_n) * split, sms)
        share = triton.cdiv(depth, split)
        mma = 2 * max(block_m, 64) * block_n * share * self.weights / MMA_FLOPS_PER_US
        weight_bytes_per_us = HBM_BYTES_PER_US if row_tiles == 1 else L2_BYTES_PER_US
        loads = block_m * share * element_size / L2_BYTES_PER_US
        loads += self.weights * block_n * share * element_size / weight_bytes_per_us
        estimate = waves * (max(mma, loads) + WAVE_US)
        if tma:
            estimate += TMA_US
        elif block_m >= 64:
            estimate *= 1.25 if depth % 16 == 0 and cols % 16 == 0 else 3.0
        if split > 1:  # partial sums stored and read back
            estimate += 2 * split * rows * cols * 4 * self.weights / (HBM_BYTES_PER_US * sms)
        return estimate

    def ranked(self, configs, tma, sizes, element_size, sms):
        """Indices of `configs` by estimated time, fastest first; ties keep the space's order."""
        times = [self.estimate_us(c, tma, sizes, element_size, sms) for c in configs]
        return sorted(range(len(configs)), key=lambda i: times[i])

    def estimated_choice(self, path, args, precision=None):
        """(path, config) the estimate picks where nothing is tuned: the best of `path`'s
        fitting configs (at an fp32 call's `precision`), and of the pointer kernel's too
        where `path` is TMA and FUSEGEN_TMA leaves the choice open (decode-sized calls run
        faster on it); where none fits, the one needing the least shared memory."""
        first = args[0]
        sizes = self.sizes(dict(zip(self.module["DIMS"], args[self.outputs.stop :], strict=False)))
        sms = self.device_facts(first.device)[1]
        paths = [path] + (["pointer"] if path == "tma" and not switch("FUSEGEN_TMA") else [])
        best = None
        for candidate in paths:
            tma = candidate == "tma"
            space = [self.complete(candidate, c) for c in self.paths[candidate][1]]
            at = {"INPUT_PRECISION": precision}
            for config in (
                c
                for c in space
                if self.fits({**c, **at}, tma, sizes, first.element_size(), first.device)
            ):
                estimate = self.estimate_us(config, tma, sizes, first.element_size(), sms)
                if best is None or estimate < best[0]:
                    best = (estimate, candidate, config)
        if best is None:  # no tile suits so small a shape: the smallest, as prune keeps
            space = [self.complete(path, c) for c in self.paths[path][1]]
            size, tma = first.element_size(), path == "tma"
            return path, min(
                space, key=lambda c: self.config_smem(c, c.get("num_stages", 1), size, tma)
            )
        return best[1], best[2]

    # Choosing a launch's config: the caller's; the interpreter's; a tuned table's entry
    # for this GPU; runtime tuning; the default.

    def choose(self, path, key, args, consts, config, tune=True):
        """(path, config, source) for a launch: the caller's config; the interpreter's;
        else, once per key, the tuned table's entry for this GPU, or (unless
        DETERMINISTIC or FUSEGEN_AUTOTUNE=0) runtime tuning, or the default. Tuning times
        both kernels where both can run and FUSEGEN_TMA is unset, and keeps the faster.
        tune=False (while torch.compile traces: no data to time): what eager calls tuned,
        else the table's, else the default, which is not kept, so an eager call may tune."""
        if config is not None:
            if isinstance(config, dict) and config.get("SPLIT_K", 1) != 1:
                path = "pointer"  # split-K is the pointer kernel's; the TMA one would drop it
            return path, self.checked_config(path, config), "explicit"
        device = args[0].device
        if not self.can_tune(device):
            return path, self.complete(path, self.module["INTERPRETER_CONFIG"]), "interpreter"
        if self.tracing and self.tracing_here():
            key = settled(key)
            if key is None:  # no table entry or estimate serves every size without guards
                return path, self.paths[path][2], "default (dynamic size)"
        tuning = not self.module["DETERMINISTIC"] and switch("FUSEGEN_AUTOTUNE") != "0"
        row_major = not any(key[len(self.key_names)])  # a plan's key ends with the layout
        # An fp32 call's precision changes what fits (tf32x3) and what is fastest.
        precision = consts.get("INPUT_PRECISION")
        key = (*key, precision, path, switch("FUSEGEN_TMA"), tuning)
        plan = self.plans.get(key) or (self.from_table(path, key, device) if row_major else None)
        if plan is None and tuning and tune:
            plan = self.tune(path, key, args, consts)
        if plan is None:
            if self.estimated_default:
                precision = consts.get("INPUT_PRECISION")
                plan = (*self.estimated_choice(path, args, precision), "default")
            else:
                plan = (path, self.paths[path][2], "default")
            if tune or not tuning:
                self.plans[key] = plan
            _log.info(
                "%s: %s: no tuned table entry; default config %s",
                self.name,
                self.key_text(key),
                plan[1],
            )
        return plan

    def key_text(self, key):
        return " ".join(
            f"{name}={plain(value)}" for name, value in zip(self.key_names, key, strict=False)
        )

    def table_entries(self):
        """The tuned table's entries for these kernels ([] if there is none or it cannot
        be read), read at first use."""
        if "entries" not in self.table:
            self.table["entries"] = tables.entries(self.module, self.name)
        return self.table["entries"]

    def from_table(self, path, key, device):
        """The table's plan for a key on this GPU, or None: the entry of its row bucket,
        else of the nearest one within reach (tables.nearest); else tuning or the
        estimate does better."""
        name, capability = self.device_identity(device)
        wanted = {n: plain(v) for n, v in zip(self.key_names, key, strict=False)}
        rows = self.key_names[0]
        pick = "best" if path == "tma" and not key[-2] else path
        identity = (name, capability, self.module["KERNEL_HASH"])

        def choose(entry):
            if (entry["gpu"], entry["capability"], entry["kernel_hash"]) != identity:
                return None
            chosen = entry["best"] if pick == "best" else pick
            return chosen, self.complete(chosen, entry["choices"][chosen]["config"])

        found = tables.nearest(self.table_entries(), wanted, rows, choose)
        if found is None:
            return None
        entry, (chosen, config) = found
        self.plans[key] = (chosen, config, "table")
        _log.info(
            "%s: %s: tuned table entry for %s=%s: %s %s (%s ms when tuned)",
            self.name,
            self.key_text(key),
            rows,
            entry["key"][rows],
            chosen,
            config,
            entry["choices"][chosen].get("ms"),
        )
        return self.plans[key]

    def tune(self, path, key, args, consts):
        """Runtime tuning of a key, once, whatever threads call it at the same time: a
        thread that waited for another's tuning of the key takes its result."""
        with launch.ONCE:
            if key in self.plans:
                return self.plans[key]
            return self.tune_now(path, key, args, consts)

    def tune_now(self, path, key, args, consts):
        started = time.perf_counter()
        candidates = [path]
        if path == "tma" and not switch("FUSEGEN_TMA"):
            candidates.append("pointer")
        if self.estimated:
            favoured = self.estimated_choice(path, args)[0]
            for candidate in candidates:
                self.shortlists[candidate] = SHORTLIST if candidate == favoured else 1
        found = {}
        for candidate in candidates:
            try:
                found[candidate] = self.autotuned(candidate, args, consts)
            except Exception as exc:  # noqa: BLE001 - any tuning failure falls back
                self.log_once("tuning", "tuning the %s kernel failed (%s)", candidate, exc)
        release_flush()
        if not found:
            return None
        best = min(found, key=lambda p: found[p][1])
        self.plans[key] = (best, found[best][0], "autotune")
        _log.info(
            "%s: %s: tuned in %.1f s: %s (no tuned table entry; `fusegen tune` makes one)",
            self.name,
            self.key_text(key),
            time.perf_counter() - started,
            ", ".join(f"{p} {c} {ms:.4f} ms" for p, (c, ms) in found.items()),
        )
        return self.plans[key]

    def tuned_kernel(self, path):
        """The autotuned kernel for a path, made at first use: the interpreter cannot tune."""
        if path not in self.tuned:
            kernel, space, _ = self.paths[path]
            takes_timer = "do_bench" in inspect.signature(triton.autotune).parameters
            self.tuned[path] = triton.autotune(
                configs=[self.triton_config(path, self.complete(path, c)) for c in space],
                key=self.tune_key,
                prune_configs_by={"early_config_prune": self.prune},
                **({"do_bench": graph_bench} if takes_timer else {}),
            )(kernel)
        return self.tuned[path]

    def autotuned(self, path, args, consts):
        """Run (tuning first, for a new key) the autotuned kernel of a path; return the
        config it chose and that config's time in ms."""
        tuned = self.tuned_kernel(path)
        if self.weights:
            # Scratch for the space's largest split; the kernel resets its counters after each run.
            split = max(c.get("SPLIT_K", 1) for c in self.paths[path][1])
            args = (
                *args,
                *self.scratch(
                    args, split if args[self.outputs.start].shape[0] <= SPLIT_K_MAX_ROWS else 1
                ),
            )
        tuned[self.grid](*args, **self.path_consts(path, args, consts))
        best = tuned.best_config
        found = {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages}
        optional = self.optional[path]
        chosen = {k: found[k] for k in self.paths[path][2]}
        chosen.update({k: found[k] for k in optional if k in found and found[k] != optional[k]})
        timing = getattr(tuned, "configs_timings", {}).get(best)
        if timing is None:  # one config: the tuner does not time it
            kwargs = {**self.path_consts(path, args, consts), **self.triton_kwargs(path, chosen)}
            timing = graph_bench(lambda: self.paths[path][0][self.grid](*args, **kwargs))
        return chosen, timing[0] if isinstance(timing, (list, tuple)) else timing

    # Training: the forward that keeps what the backward reads, and the backward.

    def trained(self, inputs, plain):
        """A call where an input requires grad (grad mode on), through the custom op
        fusegen::<op_name>_train, whose autograd runs the backward kernel: its outputs
        carry a grad_fn, eagerly and inside torch.compile alike. `plain`: no out= or
        config= given (which autograd cannot serve, as for torch's own out= ops)."""
        if not plain:
            raise RuntimeError(
                f"{self.name}: out= and config= are for calls without autograd; with inputs "
                "that require grad, call it without them (or under torch.no_grad())"
            )
        if self.train_op is None:
            self.refuse_grad(*inputs)
        if torch.compiler.is_compiling():
            results = self.train_op(*inputs)
        else:
            # Eagerly, an autograd.Function costs a few us where the custom ops' Python
            # dispatch costs hundreds (measured on an H200: 1.1 -> ms per add + RMSNorm step).
            results = _Trained.apply(self, *inputs)
        if not isinstance(results, (tuple, list)):
            return results
        return results[0] if self.returns == 1 else tuple(results[: self.returns])

    def autocast(self, *inputs):
        """The inputs as torch.autocast would hand them to the chain's ops (checks'
        autocast_inputs), the spec's pinned inputs kept."""
        pinned = {i for i, name in enumerate(self.inputs) if name in self.pinned}
        return autocast_inputs(inputs, self.module["DTYPES"], pinned, bool(self.weights))

    def keep(self, ctx, inputs, outputs):
        """What a training call's autograd node keeps: the inputs, what the forward saved,
        and the outputs' metadata (for an output whose gradient does not arrive)."""
        extra = [outputs[i] for i in self.backward_saves]
        ctx.save_for_backward(*inputs, *outputs[self.returns :], *extra)
        ctx.outputs = [(o.shape, o.dtype, o.device) for o in outputs[: self.returns]]

    def differentiate(self, ctx, grads, needs, backward):
        """The inputs' gradients (None where not needed) for a training call's node."""
        saved = ctx.saved_tensors
        count = len(self.inputs)
        grads = [
            g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
            for g, (shape, dtype, device) in zip(grads[: self.returns], ctx.outputs, strict=True)
        ]
        needs = [bool(n) for n in needs]
        found = list(backward(grads, list(saved[:count]), list(saved[count:]), needs))
        for index, others in self.same.items():
            for other in others:  # the same values: one tensor for both (autograd copes)
                found[other] = found[index]
        return tuple(g if n else None for g, n in zip(found, needs, strict=True))

    def returned(self, needs):
        """Per input, whether the backward returns its gradient: asked for, or the stored
        one of a gradient another input asked for gets too."""
        returned = list(needs)
        for index, others in self.same.items():
            returned[index] = returned[index] or any(needs[i] for i in others)
            for other in others:
                returned[other] = False
        return returned

    def call_plan(self, inputs):
        module = self.module
        if self.tracing and self.tracing_here():
            return module["_plan"](*inputs)
        return module["_CALLS"].get(module["_signature"](*inputs)) or module["_plan"](*inputs)

    def saved_shape(self, plan):
        return (math.prod(plan.out_shape[:-1]), plan.out_shape[-1])

    def saved_buffers(self, plan):
        """Empty tensors for what a training forward keeps beyond its outputs: a matmul
        chain's accumulators ([rows, cols], the call's dtype), a norm's per-row
        statistics ([rows, stats], fp32)."""
        if self.stats:
            rows = self.saved_shape(plan)[0]
            return (torch.empty((rows, self.stats), dtype=torch.float32, device=plan.device),)
        return tuple(
            torch.empty(self.saved_shape(plan), dtype=plan.dtype, device=plan.device)
            for _ in range(self.saves)
        )

    def forward_saving(self, *inputs):
        """The training forward: the outputs, then what the backward reads beyond them: a
        matmul chain's accumulators before the epilogue (stored by the same kernel:
        SAVE_PRE), a norm's per-row statistics (SAVE_STATS). Other chains keep only their
        inputs: their backward reads them again."""
        plan = self.call_plan(inputs)
        outputs = self.empty_outputs(plan)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        if plan.launches and self.epilogue and plan.dtype in EPILOGUE_DTYPES:
            saved = self.epilogue_forward(plan, inputs, outputs[0])
            results = (*outputs, *saved)
            return results[0] if len(results) == 1 else results
        saved = self.saved_buffers(plan)
        if plan.launches:
            train = plan.saving() if saved else plan
            try:
                self.module["_launch"](train, inputs, outputs, None, saved)
            except triton.runtime.errors.OutOfResources as exc:
                if train.path == "pointer":
                    raise
                # The stores of the accumulators take shared memory of their own (a
                # layout conversion), which a TMA config tuned for inference may lack.
                self.log_once("save-pre", "training forwards take the pointer kernel: %s", exc)
                train.path, train.ready, self.save_pre_pointer = "pointer", {}, True
                self.module["_launch"](train, inputs, outputs, None, saved)
        else:
            self.without_launch(plan, outputs, inputs)  # the backward takes the reference's too
        results = (*outputs, *saved)
        return results[0] if len(results) == 1 else results

    def epilogue_forward(self, plan, inputs, out):
        """A matmul chain's training forward as cuBLAS's matmuls, whose accumulators the
        backward reads, then the chain after them as a kernel of its own. Measured on an
        H200 (benchmarks/training_chains.py, bf16, GPU time): ahead of the fused kernel
        storing its accumulators as well (SwiGLU 4096x4096->14336 forward 1.513 -> 1.433
        ms; gelu + bias 1.061 -> 0.760 ms), which wins only where nothing is stored
        (inference). Returns the accumulators."""
        views = self.module["_checked"](*inputs)[2]
        saved = self.accumulators(views)
        rows, cols = saved[0].shape
        config, grid, _ = self.backward_launch(rows, cols, plan.device)
        reads = [views[i] for i in self.backward_reads]
        out_2d = out.view(rows, cols)
        strides = [s for t in reads for s in t.stride()]
        kernel = self.module[f"_{self.name}_kernel_epilogue"]
        int64 = needs_int64(*reads, *saved, out_2d)
        self.launch_kept(
            kernel, grid, (*saved, *reads, out_2d, rows, cols, *strides), {"INT64": int64, **config}
        )
        self.record(config, "training", "cublas + epilogue")
        return tuple(saved)

    def backward(self, grads, inputs, saved, needs, overwrite=False, stale=False):
        """The inputs' gradients from the outputs' (`grads`), as a list: an empty tensor
        for each input `needs` does not ask for, which costs no work (a frozen weight: no
        weight-gradient matmul). A matmul chain's: overwrite, d_pre written over the
        accumulators (the kernel reads each tile before it writes it); stale, the saved
        accumulators were overwritten so (as with backward.save: inputs) cuBLAS makes
        them again. What the launch needs is a _BackwardPlan's (backward_plan), made at
        the first call of its signature: a later call makes its views, allocates and
        launches."""
        plan = self.backward_plan(grads, inputs, saved, needs, overwrite, stale)
        if not plan.launches:
            return self.reference_grads(grads, inputs, needs)
        views = [
            t if shape is None else t.reshape(shape)
            for t, shape in zip(inputs, plan.views, strict=True)
        ]
        if self.matmul and (stale or not saved):  # backward.save: inputs, or overwritten
            saved = [*self.accumulators(views), *saved[self.saves :]]
        cols = plan.cols
        incoming = self.incoming(grads, cols)
        reads = [views[i] for i in self.backward_reads]
        buffers = []
        for shape, dtype in plan.buffers:
            if shape is None:  # d_pre, d_pre_gate: over the saved accumulators
                buffers.append(saved[len(buffers)])
            else:
                buffers.append(torch.empty(shape, dtype=dtype, device=plan.device))
        args = (*incoming, *reads, *saved, *buffers, plan.rows, cols, *plan.strides)
        self.launch_kept(plan.kernel, plan.grid, args, plan.kwargs)
        returned, stored = plan.returned, plan.stored
        found = [None] * len(inputs)

        def add(index, grad):
            found[index] = grad if found[index] is None else found[index] + grad

        for (_, index, kind), buffer in zip(stored, buffers, strict=True):
            if index >= 0 and returned[index]:
                grad = buffer if kind == "full" else buffer.sum(0).to(inputs[index].dtype)
                add(index, grad.view(inputs[index].shape))
        if self.matmul:
            a_index, a_t, weights = self.matmul
            a = views[a_index].t() if a_t else views[a_index]  # [M, K]
            d_a = None
            for (b_index, b_t), d_pre in zip(weights, buffers, strict=False):
                b = views[b_index].t() if b_t else views[b_index]  # [K, N]
                if needs[a_index] and d_a is None:
                    d_a = torch.mm(d_pre, b.t())
                elif needs[a_index]:  # a gate's share added in cuBLAS's epilogue: no pass
                    d_a = torch.addmm(d_a, d_pre, b.t(), out=d_a)
                if needs[b_index]:
                    add(b_index, torch.mm(d_pre.t(), a) if b_t else torch.mm(a.t(), d_pre))
            if d_a is not None:
                add(a_index, (d_a.t() if a_t else d_a).reshape(inputs[a_index].shape))
        return [
            g.contiguous() if g is not None else t.new_empty(0)
            for g, t in zip(found, inputs, strict=True)
        ]

    def incoming(self, grads, cols):
        """The outputs' gradients as the backward kernel reads them: [rows, cols], a
        reduction's [rows] as it is (its plan's strides are these views')."""
        return [
            g.reshape(-1) if i == 0 and self.reduces else g.reshape(-1, cols)
            for i, g in enumerate(grads)
        ]

    def backward_plan(self, grads, inputs, saved, needs, overwrite, stale):
        """The _BackwardPlan of a backward call: kept in its forward's plan (the call's
        signature), by the gradients' and saved tensors' signature, needs, overwrite and
        stale; made afresh while traced or where something is not a tensor."""
        plan = self.call_plan(inputs)
        traced = self.tracing and self.tracing_here()
        rest = None if traced else signature(*grads, *saved)
        if rest is None:
            return self.backward_plan_of(plan, grads, inputs, saved, needs, overwrite, stale)
        kept = getattr(plan, "backward", None)
        if kept is None:
            kept = plan.backward = {}
        key = (rest, tuple(needs), overwrite, stale)
        found = kept.get(key)
        if found is None:
            if len(kept) >= 64:
                kept.clear()
            found = kept[key] = self.backward_plan_of(
                plan, grads, inputs, saved, needs, overwrite, stale
            )
        return found

    def backward_plan_of(self, plan, grads, inputs, saved, needs, overwrite, stale):
        """The checks of a backward call, then its kernel's grid, keyword arguments and
        strides, the buffers it allocates (shape and dtype; (None, None): d_pre over a
        saved accumulator) and, per input, the shape its 2-D view is reshaped to (None:
        the input itself)."""
        found = _BackwardPlan()
        dims = dict(zip(self.module["DIMS"], plan.tail, strict=False))
        found.rows, found.cols = rows, cols = dims[self.dims[0]], dims[self.dims[1]]
        found.device = plan.device
        found.launches = self.backward_launches(inputs)
        if not found.launches:
            return found
        views = self.module["_checked"](*inputs)[2]
        found.views = [
            None if v is t else tuple(v.shape) for v, t in zip(views, inputs, strict=True)
        ]
        if self.matmul and (stale or not saved):  # made again by cuBLAS: [rows, cols] each
            again = torch.empty((rows, cols), dtype=plan.dtype, device="meta")
            saved = [*[again] * len(self.matmul[2]), *saved[self.saves :]]
        incoming = self.incoming(grads, cols)
        reads = [views[i] for i in self.backward_reads]
        row_bytes = sum(
            t.element_size() for t in (*incoming, *reads, *saved) if t.shape[-1] == cols
        )
        config, found.grid, blocks = self.backward_launch(rows, cols, plan.device, row_bytes)
        flags, found.stored, found.buffers, made = {}, [], [], []
        found.returned = returned = self.returned(needs)
        for name, index, kind in self.grads:
            if kind.startswith("="):
                continue
            found.stored.append((name, index, kind))
            want = index < 0 or returned[index]
            if index >= 0:
                flags[f"NEED_{name.upper()}"] = want
            dtype = plan.dtype if index < 0 else inputs[index].dtype
            if overwrite and self.matmul and index < 0:  # d_pre, d_pre_gate: as saved
                found.buffers.append((None, None))
                made.append(saved[len(found.buffers) - 1])
                continue
            if not want:
                shape, dtype = (1,), torch.float32
            elif kind == "full":
                shape = (rows, cols)
            else:
                shape, dtype = (
                    (blocks[0], cols) if kind == "row" else (blocks[1], rows)
                ), torch.float32
            found.buffers.append((shape, dtype))
            made.append(torch.empty(shape, dtype=dtype, device="meta"))
        found.strides = tuple(s for t in (*incoming, *reads) for s in t.stride())
        found.kernel = self.module[f"_{self.name}_kernel_backward"]
        int64 = needs_int64(*incoming, *reads, *saved, *(b for b in made if b.dim() == 2))
        found.kwargs = {"INT64": int64, **flags, **config}
        return found

    def accumulators(self, views):
        """A matmul chain's accumulators again (spec backward.save: inputs), by cuBLAS in
        the call's dtype: what the forward would have saved."""
        a_index, a_t, weights = self.matmul
        a = views[a_index].t() if a_t else views[a_index]
        return [torch.mm(a, views[b].t() if b_t else views[b]) for b, b_t in weights]

    def backward_launches(self, inputs):
        """Whether the backward kernel runs for these inputs: a Triton device, something
        to compute, and (a row chain) rows that fit in BLOCK_N; else the reference's
        autograd computes the gradients (logged once for long rows)."""
        plan = self.call_plan(inputs)
        if not plan.launches:
            return False
        cols = dict(zip(self.module["DIMS"], plan.tail, strict=False))[self.dims[1]]
        if not cols:
            # Empty rows (a sum or mean over none) have a non-empty output, but the kernel
            # has no row to tile; the reference's gradients are empty or zero.
            return False
        if self.rowwise and cols > ROW_BACKWARD_MAX_COLS:
            self.log_once(
                "long-rows",
                "rows over %d columns: the backward runs the reference's autograd",
                ROW_BACKWARD_MAX_COLS,
            )
            return False
        return True

    def backward_launch(self, rows, cols, device, row_bytes=8):
        """(config, grid, (row blocks, column blocks)) for the backward kernel: a tile
        kernel's fixed tiles, or a row kernel's whole row in BLOCK_N, its programs
        looping over row blocks (a few per SM: its [cols] sums are stored per program).
        row_bytes: what the loop loads a step per column and row (each [rows, cols] and
        [cols] tensor's element size), which bounds how many steps' loads it may keep in
        flight in shared memory."""
        interpreted = self.interpreted()
        if self.rowwise:
            # Measured on an H200 (benchmarks/backward_configs.py, GPU time): 8192-element
            # blocks on 4 warps, 8 warps from 8192 columns (two rows where [cols] partial
            # sums are kept: LayerNorm 4096x8192 0.155 -> 0.107 ms; one row else: softmax
            # 0.079 -> 0.058); few programs where each stores partial sums (one per SM at
            # 8192 columns, two at 4096: add + RMSNorm 16384x4096 0.171 -> 0.160), eight
            # per SM where none are kept.
            partial = any(kind == "row" for _, _, kind in self.grads)
            block_n = triton.next_power_of_2(cols)
            block_m = 2 if block_n == 8192 and partial else max(1, min(16, 8192 // block_n))
            warps = 4 if block_n < 8192 else 8 if block_n == 8192 else 16
            per_sm = max(1, 8192 // block_n) if partial else 8
            stages = 1
            if self.stats and partial and block_n >= 1024:
                # With the statistics kept, a program's loop has little to compute between
                # its loads: three steps' loads in flight (LOOP_STAGES 3; 2 gains nothing)
                # on one or two programs an SM (backward_configs.py --stages 1 3,
                # 2026-12-04): LayerNorm 4096 x 8192 0.094 -> 0.070 ms (one row, 8
                # warps); at 4096 columns two rows on 8 warps (add + RMSNorm 16384 x
                # 4096 0.161 -> 0.134, RMSNorm 0.121 -> 0.105, LayerNorm 0.149 -> 0.117);
                # BERT's 768 two rows on 4 warps, two programs an SM (0.068 -> 0.049).
                pipelined = (
                    (1, 8 if block_n == 8192 else 16, 1)
                    if block_n >= 8192
                    else (2, 8, 1) if block_n == 4096 else (2, 4, 2)
                )
                stage = pipelined[0] * block_n * row_bytes
                room = self.shared_memory_limit(device) - 16384  # the reductions' scratch
                if interpreted or 3 * stage <= room:
                    (block_m, warps, per_sm), stages = pipelined, 3
                elif block_n >= 4096:
                    # Unpipelined (fp32 rows, smaller GPUs), one row a step (2026-12-04):
                    # 16 warps and one program an SM (LayerNorm 4096 x 8192 0.108 -> 0.094
                    # ms); at 4096 columns 4 warps and 8 programs an SM where one [cols]
                    # sum is kept (RMSNorm 16384 x 4096 0.131 -> 0.121), 8 and 2 with two.
                    sums = sum(kind == "row" for _, _, kind in self.grads)
                    block_m, warps, per_sm = 1, 16, 1
                    if block_n == 4096:
                        warps, per_sm = (4, 8) if sums == 1 else (8, 2)
            programs = triton.cdiv(rows, block_m)
            programs = min(programs, 2 if interpreted else per_sm * self.device_facts(device)[1])
            config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps}
            config["LOOP_STAGES"] = stages
            return config, (programs,), (programs, 1)
        # Measured as the row kernels': reading a matmul's accumulators, 64x128 on 4 warps
        # (gelu + bias 4096x14336: 0.132 -> 0.102 ms), a gated chain's two 32x128 on 8
        # (0.141 -> 0.138); an elementwise chain's inputs, 64x128 on 8.
        block_m, warps = (32, 8) if self.weights > 1 else (64, 4) if self.matmul else (64, 8)
        config = {"BLOCK_M": block_m, "BLOCK_N": 128, "num_warps": warps}
        if interpreted:
            config["BLOCK_M"] = min(64, triton.next_power_of_2(rows))
            config["BLOCK_N"] = min(256, triton.next_power_of_2(cols))
        blocks = (triton.cdiv(rows, config["BLOCK_M"]), triton.cdiv(cols, config["BLOCK_N"]))
        return config, (blocks[0] * blocks[1],), blocks

    def reference_grads(self, grads, inputs, needs):
        """The gradients by the reference's autograd (no GPU, or rows too long), through
        torch.func.vjp: it works inside a custom op too, where autograd is off (a compiled
        model's backward op)."""
        floating = [i for i, t in enumerate(inputs) if t.is_floating_point()]

        def reference(*primals):
            given = list(inputs)
            for i, t in zip(floating, primals, strict=True):
                given[i] = t
            return self.module["reference"](*given)

        outputs, vjp = torch.func.vjp(reference, *(inputs[i] for i in floating))
        found = dict(
            zip(
                floating, vjp(tuple(grads) if isinstance(outputs, tuple) else grads[0]), strict=True
            )
        )
        # Copies: an add's gradients are one tensor twice, or the incoming gradient itself,
        # which a custom op may not return. Placed as the kernel's are (see returned).
        return [
            found[i].clone(memory_format=torch.contiguous_format) if n else t.new_empty(0)
            for i, (t, n) in enumerate(zip(inputs, self.returned(needs), strict=True))
        ]

    def training_ops(self):
        """fusegen::<op_name>_train (the forward that saves, with autograd) and
        fusegen::<op_name>_backward, registered once per process: triton ops where
        Inductor can launch their kernels (see triton_ops), else opaque custom ops."""
        train_name, backward_name = f"{self.op_name}_train", f"{self.op_name}_backward"
        count = self.returns + self.saves
        if getattr(torch.ops.fusegen, train_name, None) is None:
            traced = self.triton_ops()
            forward = typed(
                self.traced(self.forward_saving) if traced else self.forward_saving,
                self.inputs,
                count,
            )
            backward = typed(
                self.traced(self.backward) if traced else self.backward,
                {
                    "grads": list[torch.Tensor],
                    "inputs": list[torch.Tensor],
                    "saved": list[torch.Tensor],
                    "needs": list[bool],
                },
                list[torch.Tensor],
            )
            train = self.register(f"fusegen::{train_name}", forward, traced)
            backward = self.register(f"fusegen::{backward_name}", backward, traced)
            if not traced:

                @train.register_fake
                def _(*inputs):
                    plan = self.module["_checked"](*inputs)[0]
                    outputs = self.empty_outputs(plan)
                    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
                    results = (*outputs, *self.saved_buffers(plan))
                    return results[0] if count == 1 else results

                @backward.register_fake
                def _(grads, inputs, saved, needs):
                    return [
                        (
                            torch.empty(t.shape, dtype=t.dtype, device=t.device)
                            if n
                            else t.new_empty(0)
                        )
                        for t, n in zip(inputs, self.returned(needs), strict=True)
                    ]

            def setup(ctx, inputs, output):
                outputs = output if isinstance(output, tuple) else (output,)
                self.keep(ctx, inputs, outputs)

            def differentiate(ctx, *grads):
                refuse_second_derivative(self.name)
                return self.differentiate(ctx, grads, ctx.needs_input_grad, self.backward_op)

            train.register_autograd(differentiate, setup_context=setup)
        return (
            getattr(torch.ops.fusegen, train_name).default,
            getattr(torch.ops.fusegen, backward_name).default,
        )

    # Inside torch.compile, and importing.

    def triton_ops(self):
        """Whether this module's ops are triton ops (ops.triton_ops), but not for a spec
        whose launcher reads its output back (`nonfinite: reference`)."""
        return ops.triton_ops(self.interpreted()) and not self.nonfinite

    def register(self, name, fn, traced):
        """An op named `name` running `fn` (typed: see ops.typed): a triton op, whose fake is
        `fn` itself on fake tensors, or an opaque custom op."""
        if traced:
            return torch.library.triton_op(name, fn, mutates_args=())
        return torch.library.custom_op(name, fn, mutates_args=())

    def traced(self, fn):
        """`fn` with the launches it makes going into the graph being traced (traceable)."""

        def run(*args):
            with ops.tracing_in_this_thread(self.tracing):
                return fn(*args)

        return run

    def launch_kept(self, kernel, grid, args, kwargs):
        """kernel[grid](*args, **kwargs) for a launch outside the call's plan (the
        training epilogue, the backward): into the graph while torch.compile traces,
        else through launch.Kept, directly from the second launch of its arguments."""
        if self.tracing and self.tracing_here():
            Traced(kernel)[grid](*args, **kwargs)
            return
        self.kept(kernel, grid, args, kwargs, self.interpreted())

    def traceable(self, kernel):
        """A kernel to launch, as the graph torch.compile traces can hold it (wrap_triton:
        Inductor then compiles and launches it); itself outside tracing."""
        return Traced(kernel) if self.tracing and self.tracing_here() else kernel

    def traced_call(self, *inputs):
        """The launcher as a triton op runs it: the checks and plan on the (fake) inputs,
        then the launch into the graph. What the launcher decides per call signature is
        decided here once per compiled graph, which torch.compile guards on the shapes,
        strides and dtypes it read; the config is the one eager calls tuned for the same
        key, else the tuned table's, else the default (no data to tune on)."""
        plan = self.module["_plan"](*inputs)
        outputs = self.empty_outputs(plan)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        if not plan.launches:
            results = self.module["reference"](*inputs) if math.prod(plan.out_shape) else outputs
            results = results if isinstance(results, tuple) else (results,)
            # An op returns no input itself (a chain of casts to the call dtype would).
            results = tuple(r.clone() if any(r is t for t in inputs) else r for r in results)
            return results[0] if len(results) == 1 else results
        self.module["_launch"](plan, inputs, outputs, None)
        return outputs[0] if len(outputs) == 1 else outputs

    def traced_launch(self, plan, args):
        """launch, while torch.compile traces: the kernel, grid and constexprs chosen from
        the plan, launched through wrap_triton (no direct launch, no tuning)."""
        consts = plan.consts
        if plan.follows_torch:
            consts = {**consts, "INPUT_PRECISION": fp32_dot(plan.device)}  # at trace time
        if plan.copies:
            args = list(args)
            for index in plan.copies:
                args[index] = args[index].contiguous()
        path, chosen, source = self.choose(plan.path, plan.key, args, consts, None, tune=False)
        if path == "tma" and consts.get("SAVE_PRE") and not self.stores_fit(chosen, args):
            # Eagerly this is an OutOfResources caught at the launch (forward_saving);
            # Inductor compiles later, so the estimate decides here.
            path, chosen, source = self.choose("pointer", plan.key, args, consts, None, tune=False)
        kwargs = {**self.path_consts(path, args, consts), **self.triton_kwargs(path, chosen)}
        dims = dict(zip(self.module["DIMS"], plan.tail, strict=False))
        grid = (*self.grid({**dims, **kwargs}), 1, 1)[:3]
        if self.weights:
            args = (*args, *self.scratch(args, chosen.get("SPLIT_K", 1)))
        self.traceable(self.paths[path][0])[grid](*args, **kwargs)
        fp32 = consts["INPUT_PRECISION"] if plan.fp32 else None
        self.record(chosen, source, path, bool(consts.get("FAST_TANH")), fp32)

    def stores_fit(self, config, args):
        """Whether a TMA config still fits shared memory with a training forward's
        stores of the accumulators, which go through an fp32 layout conversion."""
        element = args[0].element_size()
        extra = 0 if self.full_operands else config["BLOCK_M"] * config["BLOCK_N"] * 4
        if self.save_pre_pointer:
            return False
        used = self.config_smem(config, config.get("num_stages", 1), element, tma=True)
        return used + extra <= self.shared_memory_limit(args[0].device)

    def untraced(self, *args, **kwargs):
        """The launcher inside a torch.compile'd function when the op cannot serve
        (`out=` or `config=` given, or no torch.library.custom_op): run eagerly, a
        graph break, since it reads pointers and launches compiled kernels itself, which
        Dynamo cannot trace. torch.compiler.disable is reached only here: importing it
        costs seconds."""
        if self.untraced_launcher is None:
            self.untraced_launcher = torch.compiler.disable(self.module[self.name])
        return self.untraced_launcher(*args, **kwargs)

    def custom_op(self, fake):
        """The launcher as torch.compile sees it: an op named fusegen::<op_name>, so a
        compiled model keeps one graph (fullgraph=True works); a second import of the
        same module reuses it. A triton op where triton_ops() holds (torch.compile traces
        through traced_call and Inductor launches the kernel), else an opaque custom op
        traced through `fake` (the module's checks, then empty outputs). Its autograd
        setup refuses inputs that require grad, as the launcher does. None where torch
        has no torch.library.custom_op."""
        if not hasattr(torch.library, "custom_op"):
            return None

        def refuse(ctx, inputs, output):  # reached only where an input needs a gradient
            self.refuse_grad(*inputs)

        def no_backward(ctx, *grads):
            raise RuntimeError(f"{self.name} has no backward")  # unreachable: refuse raises

        try:
            # One registration per process: see launch.ONCE.
            with launch.ONCE:
                packet = getattr(torch.ops.fusegen, self.op_name, None)
                if packet is None:
                    traced = self.triton_ops()
                    launcher = self.module[self.name]
                    call = (
                        self.traced(self.traced_call)
                        if traced
                        else (lambda *tensors: launcher(*tensors))
                    )
                    op = self.register(
                        f"fusegen::{self.op_name}", typed(call, self.inputs, self.returns), traced
                    )
                    if not traced:
                        op.register_fake(fake)
                    op.register_autograd(no_backward, setup_context=refuse)
                    packet = getattr(torch.ops.fusegen, self.op_name)
                if self.grads:
                    self.train_op, self.backward_op = self.training_ops()
                return packet.default
        except Exception as exc:  # noqa: BLE001 - this torch's custom ops differ: no op
            _log.warning(
                "%s: no custom op for torch.compile (%s); calls there run eagerly", self.name, exc
            )
            return None

    def make_importable(self):
        """Put the module in sys.modules under its name if it is not there: torch.compile
        imports the module of each function it traces by that name, and a module loaded
        by file path (importlib.util.spec_from_file_location, as plugin loaders and
        notebooks do) is in sys.modules under none."""
        name = self.module["__name__"]
        if name in sys.modules:
            if sys.modules[name].__dict__ is not self.module:
                _log.warning(
                    "%s: sys.modules[%r] is another module: torch.compile would read its "
                    "globals for this one's; load this file under a name of its own",
                    self.name,
                    name,
                )
            return
        for holder in gc.get_referrers(self.module):
            if isinstance(holder, types.ModuleType) and holder.__dict__ is self.module:
                sys.modules[name] = holder
