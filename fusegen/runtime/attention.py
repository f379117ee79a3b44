"""An attention module's kernels as the runtime launches them (`Attention`): the checks,
each kernel's config (a tuned table's, else the module's defaults), the pipeline stages
that fit shared memory, the decode split, the direct launch of the compiled kernels
once a call signature is known, autograd, and the ops torch.compile sees.

An attention module keeps its kernels, its constants and `reference`; it makes one
`Attention` from its namespace, which reads the constants when it needs them (so a test
may patch TMA_LOADS or a tool fill FORCED)."""

import logging
import math
import threading
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.autograd import forward_ad

from . import attention_hopper, attention_hopper_backward, launch, ops, tables
from .checks import (
    autocast_inputs,
    autocasting,
    bucket,
    errors_named,
    fp32_dot,
    fp32_matmul,
    needs_int64,
    refuse_dual,
    refuse_second_derivative,
    runs_triton,
)
from .device import device_facts, ensure_allocator
from .ops import typed
from .settings import TABLE_REACH

_log = logging.getLogger(__name__)

# (q, k) bucket steps within TABLE_REACH, nearest first
_NEAR = sorted(
    (abs(dq) + abs(dk), dq, dk)
    for dq in range(-TABLE_REACH, TABLE_REACH + 1)
    for dk in range(-TABLE_REACH, TABLE_REACH + 1)
)


# The Gluon forward's grid (attention_hopper.forward's persistent and longest_first) by mask
# and head dim, each against the grid of every tile and the `tl` forward on an H100
# (run_suite.sh's attention-persistent; benchmarks/RESULTS.md, issue 29):
# - no mask at 64 and 128: persistent, head by head (64, 16 x 16 x 1024: 0.168 ms against
#   0.199 and the `tl` forward's 0.184; 128, 4 x 32 x 4096: 1.76 against 1.85);
# - causal at 128: every tile (1.00 ms; persistent 1.04, longest first 1.45: its order
#   spreads over every head's keys at once, past what L2 holds);
# - causal at 64: longest first from LONGEST_FIRST_MIN_QUERIES queries (4 x 32/8 x 4096:
#   0.641 ms against the `tl` forward's 0.741); below, the `tl` forward (16 x 16 x 1024:
#   0.126 against 0.141 on either persistent order);
# - a sliding window at 128: persistent, longest first (every head's last query block,
#   then the ones before: a window's tiles weigh the same but each head's first few, which
#   go last): 4 x 32/8 x 4096, a 1024-key window, 0.492 ms [0.480-0.516] against 0.530
#   [0.516-0.549] head by head and 0.555 on every tile (7 alternated rounds, H100);
# - 96 and 192/128 (MLA): every tile, as measured before the persistent grid.
PERSISTENT_HEAD_DIMS = (64, 128)
LONGEST_FIRST_MIN_QUERIES = 4096
# The head dims whose calls take the Gluon backward: all of its own. At 64 it ran faster
# than the `tl` backward (with delta, H100, 5 alternated rounds; RESULTS.md, issue 29):
# 1.906 ms against 2.375 at 4 x 32/8 x 4096 causal, 0.547 against 0.611 at 16 x 16 x 1024
# unmasked, 0.387 against 0.401 causal; so at 64 a call takes it wherever the Gluon
# kernels fit, whichever forward (the same lse) ran before it (hopper_backward_fits).
HOPPER_BACKWARD_HEAD_DIMS = attention_hopper_backward.HEAD_DIMS


def hopper_grid(head_dim: int, mask: str | None, window: int | None = None) -> tuple[bool, bool]:
    """(persistent, longest_first) of the Gluon forward's calls of a module (above)."""
    if head_dim not in PERSISTENT_HEAD_DIMS:
        return False, False
    if window:
        return head_dim == 128, head_dim == 128
    if mask != "causal":
        return True, False
    return head_dim == 64, head_dim == 64


def cdiv(a, b):
    # triton.cdiv and triton.next_power_of_2 are constexpr functions whose host calls
    # go through triton's dispatch: about 20 us each, several per call.
    return -(-a // b)


# The two kernels every attention module launches beside its own: they read the
# outputs, whatever the scores were, so the spec changes nothing in them but the heads
# and v's head dim.


@triton.jit
def combine_splits(
    # fmt: off
    part_ptr, part_lse_ptr, out_ptr, lse_ptr, SQ, SPLITS,
    stride_o_b, stride_o_h, stride_o_s,
    HEADS: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    # fmt: on
):
    """out (and lse) of BLOCK_M rows of one (batch, head) from the SPLITS key splits'
    partial results: each split's out is normalized over its own keys, so the splits
    weigh exp2(their lse - the largest), added in split order (the same every run)."""
    batch = tl.program_id(1) // HEADS
    head = tl.program_id(1) % HEADS
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows < SQ)[:, None] & (offs_d < DV)[None, :]
    top = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for split in range(SPLITS):
        part = (split * tl.num_programs(1) + tl.program_id(1)).to(tl.int64) * SQ + rows
        top = tl.maximum(top, tl.load(part_lse_ptr + part, mask=rows < SQ, other=float("-inf")))
    seen_any = top > float("-inf")
    top = tl.where(seen_any, top, 0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    for split in range(SPLITS):
        part = (split * tl.num_programs(1) + tl.program_id(1)).to(tl.int64) * SQ + rows
        weight = tl.exp2(tl.load(part_lse_ptr + part, mask=rows < SQ, other=float("-inf")) - top)
        piece = tl.load(part_ptr + part[:, None] * DV + offs_d[None, :], mask=mask, other=0.0)
        acc += weight[:, None] * piece
        total += weight
    out = tl.where(seen_any[:, None], acc / tl.where(seen_any, total, 1.0)[:, None], 0.0)
    o_rows = batch.to(tl.int64) * stride_o_b + head * stride_o_h + rows * stride_o_s
    tl.store(
        out_ptr + o_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=mask
    )
    total = tl.where(seen_any, total, 1.0)
    lse = tl.where(seen_any, (top + tl.log2(total)) * 0.6931471805599453, float("-inf"))
    tl.store(lse_ptr + tl.program_id(1).to(tl.int64) * SQ + rows, lse, mask=rows < SQ)


@triton.jit
def backward_delta(
    # fmt: off
    out_ptr, d_out_ptr, delta_ptr, SQ,
    stride_o_b, stride_o_h, stride_o_s, stride_do_b, stride_do_h, stride_do_s,
    HEADS: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    # fmt: on
):
    """delta = rowsum(d_out * out) in fp32 for BLOCK_M rows of one (batch, head): the
    softmax backward's row term, read by both backward kernels."""
    batch = tl.program_id(1).to(tl.int64) // HEADS
    head = tl.program_id(1) % HEADS
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows < SQ)[:, None] & (offs_d < DV)[None, :]
    o_rows = batch * stride_o_b + head * stride_o_h + rows * stride_o_s
    do_rows = batch * stride_do_b + head * stride_do_h + rows * stride_do_s
    out = tl.load(out_ptr + o_rows[:, None] + offs_d[None, :], mask=mask, other=0.0)
    d_out = tl.load(d_out_ptr + do_rows[:, None] + offs_d[None, :], mask=mask, other=0.0)
    delta = tl.sum(out.to(tl.float32) * d_out.to(tl.float32), axis=1)
    tl.store(delta_ptr + tl.program_id(1).to(tl.int64) * SQ + rows, delta, mask=rows < SQ)


class _Plan:
    """What a call signature's launches need, worked out once (Attention.forward_plan_of)."""

    __slots__ = (
        "batch", "sq", "skv", "device", "dtype", "runs", "empty", "copies", "lengths",
        "out_shape", "lse_shape", "part_shapes", "forward", "combine", "tail", "bias_tail",
        "out_strides", "kept", "cuda",
    )  # fmt: skip


class _BackwardPlan:
    """What a backward call signature's launches need, worked out once
    (Attention.backward_plan_of): the delta kernel's launch, then the Gluon kernels'
    (hopper: launch.Described by kernel) or the `tl` kernels' (kv, q: None where the call
    needs none of their gradients)."""

    __slots__ = (
        "runs", "sq", "skv", "copies", "delta_shape", "delta_strides", "delta", "hopper",
        "reads", "bias_strides", "kv", "kv_strides", "q", "dq_strides", "d_scores",
        "d_scores_shape", "d_scores_dtype", "tma", "gluon_delta",
    )  # fmt: skip


class _Launch:
    """One kernel's launch for a plan: its grid and keyword arguments, then, from the
    second call, the compiled kernel launched directly (launch.Direct)."""

    __slots__ = ("owner", "kernel", "grid", "kwargs", "stage_key", "direct")

    def __init__(self, owner, kernel, grid, kwargs, stage_key=None):
        self.owner, self.kernel, self.grid, self.kwargs = owner, kernel, grid, kwargs
        self.stage_key, self.direct = stage_key, None

    def __call__(self, *args):
        if self.direct:
            self.direct(*args)
            return
        owner = self.owner
        if owner.tracing and owner.tracing_here():
            torch.library.wrap_triton(self.kernel)[self.grid](*args, **self.kwargs)
            return
        while True:
            try:
                compiled = self.kernel[self.grid](*args, **self.kwargs)
                break
            except (triton.runtime.errors.OutOfResources, triton.runtime.errors.PTXASError):
                # The estimate let through a config Triton could not fit, or ptxas 12.8
                # crashed on it (the bias kernel's dk/dv at head dim 128 with TMA loads
                # and 2 stages; 1 and 3 compile): fewer stages.
                stages = self.kwargs["num_stages"]
                if stages == 1:
                    raise
                self.kwargs = {**self.kwargs, "num_stages": stages - 1}
                if self.stage_key is not None:
                    owner.stages[self.stage_key] = stages - 1
        if self.stage_key is not None:  # the kernels with configs: `fusegen inspect`'s
            owner.last_compiled[self.kernel.__name__] = compiled
        if launch.enabled(owner.interpreted()):
            self.direct = launch.direct(compiled, self.kernel, self.grid, args, self.kwargs)


class _HopperLaunch:
    """A forward plan's launch of attention_hopper's kernel, with the `tl` forward's
    arguments (those it needs: q, k, v, out, lse); the compiled kernel kept as
    `hopper_forward` in the owner's last_compiled (`fusegen inspect`); from the second
    call launched without triton's dispatch (launch.Described)."""

    __slots__ = ("owner", "layout", "causal", "scale", "persistent", "longest_first", "launches")

    def __init__(self, owner, layout, causal, scale, persistent, longest_first):
        self.owner, self.layout, self.causal, self.scale = owner, layout, causal, scale
        self.persistent, self.longest_first = persistent, longest_first
        self.launches = launch.Described()

    def __call__(self, q, k, v, out, lse, *unused):
        owner = self.owner
        compiled = attention_hopper.forward(
            q, k, v, out, lse, layout=self.layout, causal=self.causal, scale=self.scale,
            alibi=owner.alibi, window=owner.window, persistent=self.persistent,
            longest_first=self.longest_first, launches=self.launches,
        )  # fmt: skip
        owner.last_compiled["hopper_forward"] = compiled


class _Trained(torch.autograd.Function):
    """A call with autograd, eagerly: the forward keeps lse, the backward recomputes."""

    @staticmethod
    def forward(ctx, attention, key_lengths, *inputs):
        out, lse = attention.forward(inputs, True, key_lengths)
        ctx.attention = attention
        ctx.save_for_backward(*inputs, out, lse, key_lengths)
        ctx.mark_non_differentiable(lse)
        # lse takes no gradient: autograd would otherwise fill a [batch, heads, q_len]
        # fp32 buffer with zeros for it at every backward call.
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        refuse_second_derivative(ctx.attention.name)
        *inputs, out, lse, key_lengths = ctx.saved_tensors
        if d_out is None:  # out reached no loss: every gradient is zero
            return (None, None, *(None for _ in inputs))
        needs = ctx.needs_input_grad[2:]
        grads = ctx.attention.backward(inputs, out, lse, d_out, needs, key_lengths)
        return (None, None, *grads)


class Attention:
    """One attention module's kernels as this runtime launches them.

    module: the module's namespace: LAYOUT, HEADS, KV_HEADS, HEAD_DIM, V_HEAD_DIM,
        DTYPES, the configs (CONFIG, DECODE_ROWS, DECODE_CONFIG, BACKWARD_CONFIGS,
        FP32_CONFIGS, INTERPRETER_CONFIG), the split (SPLIT_MIN_KEYS,
        SPLIT_PROGRAMS_PER_SM, PACKED_ROWS), TMA_LOADS, TUNED_TABLE, KERNEL_HASH and
        `reference`, read when used.
    kernels: the forward, backward_kv and backward_q kernels (combine_splits and
        backward_delta, which run beside them, are this module's).
    bias: the call takes a bias after v; softcap: the kernels take FAST_TANH; split_v:
        v's head dim is its own (BLOCK_DV); packed: query heads share kv heads, and a
        decode call packs a group's into one block; tma: the kernels take TMA.
    hopper: "causal" or "none" where the module's attention is plain, ALiBi's or a
        window's (no softcap or bias) at head dims attention_hopper takes, with that mask:
        a call that fits (hopper_forward_fits, hopper_backward_fits) runs the Gluon
        kernels of attention_hopper (forward) and attention_hopper_backward on an
        H100/H200.
    """

    def __init__(
        self, module, name, *, forward, backward_kv, backward_q, op_name,
        bias=False, softcap=False, split_v=False, packed=False, tma=False, all_keys=False,
        hopper=None,
    ):  # fmt: skip
        self.module, self.name, self.op_name = module, name, op_name
        # No causal mask or window: each query sees every key a call does not cut off by
        # key lengths, so the dq kernel writes every element of d bias's buffer.
        self.all_keys = all_keys
        self.kernels = {"forward": forward, "kv": backward_kv, "q": backward_q}
        self.bias, self.softcap, self.split_v = bias, softcap, split_v
        self.packs, self.tma, self.hopper = packed, tma, hopper
        self.hopper_grid = hopper_grid(module["HEAD_DIM"], hopper, module.get("WINDOW"))
        # What the Hopper kernels add to plain attention, as the module states it.
        self.alibi, self.window = "ALIBI_SLOPES" in module, module.get("WINDOW")
        self.inputs = ("q", "k", "v", "bias") if bias else ("q", "k", "v")
        axes = ("batch", "seq", "heads", "dim")
        if module["LAYOUT"] != "bshd":
            axes = ("batch", "heads", "seq", "dim")
        self.layout_doc = ", ".join(axes)
        self.heads_axis, self.seq_axis = axes.index("heads"), axes.index("seq")
        self.plans = {}  # call signature -> _Plan (forward calls)
        self.backward_plans = {}  # backward_key -> _BackwardPlan
        self.forced = module.setdefault("FORCED", {})  # kernel -> config (`fusegen tune`)
        self.stages = {}  # (kernel, dtypes, tiles, precision, stages asked) -> those that fit
        # Bytes of per-entry d scores (one [batch, heads, q_len, k_len] buffer in the
        # bias's dtype, then a sum over the entries that share the bias) past which the
        # dq kernel sums the entries itself (batch_chunk) into an fp32 buffer batch /
        # chunk the size: a memory bound, not a speed one. On an H100 the per-entry
        # buffer won at both dims timed (attention_anchors.py --anchors summed): T5's
        # 32 x 8 x 512 x 512 at d 64 (0.442 ms against 0.549-0.610 summed) and 2 x 32 x
        # 2048 x 2048 at d 128 (2.557 against 3.366): the summing kernel's grid is batch /
        # chunk the size. Benchmarks and tests set it to 0 to time or test either way.
        self.bias_grad_buffer_cap = 2**31
        self.last_compiled = {}  # kernel name -> its last launch's compiled kernel
        # thread -> depth, while a triton op runs the launcher in it (as_traced): another
        # thread's eager calls meanwhile are no trace (tracing_here).
        self.tracing = {}
        self.table = None  # (gpu, capability) -> {(kernel, dtype, q, k buckets): config}
        self.identities = {}
        self.op = None
        self.hopper_ops = None  # (forward, backward): opaque ops of the Gluon kernels

    def tracing_here(self):
        """Whether torch.compile traces in this thread (read after `self.tracing`, so
        a call outside any trace pays nothing for it)."""
        return threading.get_ident() in self.tracing

    # The call.

    def __call__(self, inputs, key_lengths, return_lse, key_ranges=None):
        if autocasting():  # inside torch.autocast: q, k and v in its dtype, as SDPA's
            inputs = autocast_inputs(inputs, self.module["DTYPES"], {3}, matmul=True)
        if key_ranges is not None:
            # Ranges ride in key_lengths' place: [batch, 2] where lengths are [batch].
            if key_lengths is not None:
                raise ValueError("give key_lengths or key_ranges, not both")
            key_lengths = key_ranges
            if not isinstance(key_ranges, torch.Tensor) or key_ranges.dim() != 2:
                got = _shape_or_type(key_ranges)
                raise ValueError(f"key_ranges must be a [batch, 2] tensor (start, end), got {got}")
        elif isinstance(key_lengths, torch.Tensor) and key_lengths.dim() != 1:
            raise ValueError(
                f"key_lengths must have shape [{inputs[0].shape[0]}] (batch), got "
                f"{list(key_lengths.shape)}; (start, end) rows go in key_ranges"
            )
        if torch.compiler.is_compiling() and self.op is not None:
            out, lse = self.op(*inputs, key_lengths)
        elif torch.is_grad_enabled() and _requires_grad(inputs):
            ops.refuse_stand_ins(self.name, *inputs[:3])  # torch.func's grad: before autograd's
            out, lse = _Trained.apply(self, key_lengths, *inputs)
        else:
            out, lse = self.forward(inputs, return_lse, key_lengths)
        return (out, lse) if return_lse else out

    def signature(self, inputs, key_lengths):
        """What a forward plan depends on: each tensor's shape, strides, dtype, device and
        16-byte alignment, key_lengths' too, TMA_LOADS, and an fp32 call's precision."""
        # One flat tuple, five entries a tensor (key_lengths' last, a call's strings after
        # them): cheaper to make and hash than a tuple per tensor.
        key = []
        add = key.append
        for t in inputs if key_lengths is None else (*inputs, key_lengths):
            add(t.shape)
            add(t.stride())
            add(t.dtype)
            add(t.device)
            add(t.data_ptr() % 16)
        if inputs[0].dtype is torch.float32:
            add(fp32_matmul())
        add(self.module.get("TMA_LOADS"))
        return tuple(key)

    def forward(self, inputs, want_lse, key_lengths=None):
        """(out, lse or None): the forward kernel (and the combine, split), or the
        reference without a GPU."""
        traced = self.tracing and self.tracing_here()
        if forward_ad._current_level >= 0:  # inside dual_level(): a read, not a call
            refuse_dual(self.name, inputs)
        if traced or self.forced:  # fake tensors, or configs being timed
            plan = self.forward_plan_of(inputs, key_lengths)
        else:
            try:
                key = self.signature(inputs, key_lengths)
            except (AttributeError, RuntimeError, TypeError):
                key = None  # not tensors: the checks say what is wrong
            plan = self.plans.get(key) if key is not None else None
            if plan is None:
                plan = self.forward_plan_of(inputs, key_lengths)
                if key is not None:
                    if len(self.plans) >= 1024:
                        self.plans.clear()
                    self.plans[key] = plan
        if not plan.runs:
            out, lse = self.module["reference"](*inputs, key_lengths=key_lengths, return_lse=True)
            return out, lse if want_lse else None
        if plan.cuda is not None and plan.cuda != torch._C._cuda_getDevice() and not traced:
            with torch.cuda.device(plan.device):  # see launch.elsewhere
                return self.forward(inputs, want_lse, key_lengths)
        q, k, v = inputs[:3]
        if plan.copies:
            q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        if plan.empty:  # no queries, or no keys: each row sees none, so 0 (and lse -inf)
            out = torch.zeros(plan.out_shape, dtype=plan.dtype, device=plan.device)
            lse = torch.full(plan.lse_shape, float("-inf"), device=plan.device)
            return out, lse if want_lse else None
        # size=, here and in scratch: torch parses a tuple given by name 0.3 us faster.
        out = torch.empty(size=plan.out_shape, dtype=plan.dtype, device=plan.device)
        lse, part, part_lse = self.scratch(plan, want_lse, out)
        lengths = q if key_lengths is None else key_lengths
        if plan.lengths:
            lengths = int32_lengths(key_lengths, plan.skv)
        bias = (inputs[3], *plan.bias_tail) if self.bias else ()
        plan.forward(q, k, v, out, lse, lengths, part, part_lse, *plan.tail, *bias)
        if plan.combine:
            splits = plan.part_shapes[0][0]
            plan.combine(part, part_lse, out, lse, plan.sq, splits, *plan.out_strides)
        return out, lse if want_lse else None

    def scratch(self, plan, want_lse, out):
        """(lse, the splits' partial out, their lse) of a forward call. lse is written
        even when not asked for: one kernel for every call, so that a call gives the same
        bits eagerly and compiled (whose op always keeps lse), which fp32's FMA dots would
        not promise across two compilations. What the call does not return is kept per
        plan and stream (and thread, where a combine reads them), and used again by the
        next such call (which runs after it): a decode step's allocations are its host
        time. Not while a CUDA graph is
        captured, whose buffers must come from its own pool, nor traced."""
        device, fp32 = plan.device, torch.float32
        if plan.kept is None or torch._C._cuda_isCurrentStreamCapturing():
            lse = torch.empty(size=plan.lse_shape, dtype=fp32, device=device)
            part = part_lse = out  # pointers never read without splits
            if plan.part_shapes:
                part = torch.empty(size=plan.part_shapes[0], dtype=fp32, device=device)
                part_lse = torch.empty(size=plan.part_shapes[1], dtype=fp32, device=device)
            return lse, part, part_lse
        stream = torch._C._cuda_getCurrentRawStream(device.index)
        if plan.combine is not None:
            # The combine reads the partial sums the forward wrote. Two threads' calls on
            # one stream (a server's pool: each thread's current stream is the default)
            # can launch forward, forward, combine, combine: one thread's combine would
            # read the other's sums. A thread's own calls on a stream run in order.
            stream = (stream, threading.get_ident())
        kept = plan.kept.get(stream)
        if kept is None:
            kept = [torch.empty(plan.lse_shape, dtype=fp32, device=device)]
            for shape in plan.part_shapes or ((1,), (1,)):
                kept.append(torch.empty(shape, dtype=fp32, device=device))
            plan.kept[stream] = kept
        lse = torch.empty(size=plan.lse_shape, dtype=fp32, device=device) if want_lse else kept[0]
        return lse, kept[1], kept[2]

    def forward_plan_of(self, inputs, key_lengths):
        """The checks of a forward call, then its launches' grids and arguments."""
        batch, sq, skv = self.checked(inputs, key_lengths)
        q = inputs[0]
        plan = _Plan()
        plan.batch, plan.sq, plan.skv, plan.device, plan.dtype = batch, sq, skv, q.device, q.dtype
        plan.cuda = q.device.index if q.device.type == "cuda" else None  # see forward
        plan.runs = self.runs_triton(q.device)
        plan.out_shape = (*q.shape[:3], self.module["V_HEAD_DIM"])
        plan.lse_shape = (batch, self.module["HEADS"], sq)
        plan.empty = batch * sq * skv == 0 or 0 in q.shape
        plan.copies = any(t.stride(-1) != 1 for t in inputs[:3])
        # The kernels read int32 lengths (a descriptor's row count): others are converted.
        plan.lengths = key_lengths is not None and (
            key_lengths.dtype != torch.int32 or not key_lengths.is_contiguous()
        )
        plan.part_shapes, plan.combine = (), None
        # Buffers a call returns none of are kept for the next (scratch): eagerly on a GPU.
        traced = self.tracing and self.tracing_here()
        plan.kept = {} if q.device.type == "cuda" and not traced else None
        if not plan.runs or plan.empty:
            return plan
        m = self.module
        if self.hopper_forward_fits(inputs, key_lengths, batch, sq, skv):
            causal = self.hopper == "causal"
            grid = self.hopper_grid if self.persistent_fits(sq, skv) else (False, False)
            plan.forward = _HopperLaunch(self, m["LAYOUT"], causal, m["SCALE"], *grid)
            plan.tail = plan.bias_tail = ()
            return plan
        heads, v_dim = m["HEADS"], m["V_HEAD_DIM"]
        # What the kernels read: the inputs, or the copies of those without a unit stride.
        strides = [
            self.strides_of(t) if t.stride(-1) == 1 else self.contiguous_strides(t.shape)
            for t in inputs[:3]
        ]
        plan.out_strides = self.contiguous_strides(plan.out_shape)
        packed, (block_m, block_n, warps, stages), splits, split_keys = self.forward_plan(
            q.device, batch, sq, skv, q.dtype
        )
        if packed:
            grid = (1, batch * m["KV_HEADS"], splits)
        else:
            grid = (cdiv(sq, block_m), batch * heads, splits)
        kv = [inputs[1], inputs[2]]
        plan.bias_tail = self.bias_strides(inputs[3], batch, sq, skv) if self.bias else ()
        meta = {
            "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": bucket(m["HEAD_DIM"]),
            **({"BLOCK_DV": bucket(v_dim)} if self.split_v else {}),
            "DOT_UPCAST": self.interpreted() and q.dtype == torch.bfloat16,
            "PRECISION": self.dot_precision(q),
            "LENGTHS": key_lengths is not None, "SPLIT": splits > 1,
            "RANGES": key_lengths is not None and key_lengths.dim() == 2,
            "INT64": wide_offsets(inputs[: 4 if self.bias else 3], [plan.out_shape]),
            **({"PACKED": packed} if self.packs else {}),
            **({"TMA": self.tma_loads(*kv)} if self.tma else {}),
            **({"FAST_TANH": self.fast_tanh(q)} if self.softcap else {}),
            **({"BIAS_ROW": bias_row(plan.bias_tail)} if self.bias else {}),
        }  # fmt: skip
        plan.tail = (split_keys, sq, skv, *strides[0], *strides[1], *strides[2], *plan.out_strides)
        dtypes = self.dtypes_of(inputs)
        plan.forward = self.launch_of("forward", grid, dtypes, meta, warps, stages, q.device)
        if splits > 1:
            rows = batch * heads
            plan.part_shapes = ((splits, rows, sq, v_dim), (splits, rows, sq))
            combine = {"HEADS": heads, "DV": v_dim, "BLOCK_M": 16, "BLOCK_D": bucket(v_dim)}
            plan.combine = _Launch(self, combine_splits, (cdiv(sq, 16), rows), combine)
        return plan

    # The backward.

    def backward(self, inputs, out, lse, d_out, needs, key_lengths=None):
        """(dq, dk, dv[, d bias]) from the forward's out and lse: delta = rowsum(d_out *
        out), then one kernel for dk and dv (per kv block, over its query heads) and one
        for dq (and d bias): attention_hopper_backward's where the call fits the Hopper
        kernels (hopper_backward_fits), the `tl` kernels otherwise. The checks, configs,
        grids and strides of a call are its _BackwardPlan's, made at the first call of its
        backward_key: a later call allocates the gradients and launches."""
        needs = tuple(needs)
        key = self.backward_key(inputs, key_lengths, out, d_out, lse, needs)
        plan = self.backward_plans.get(key) if key is not None else None
        if plan is None:
            plan = self.backward_plan_of(inputs, out, d_out, needs, key_lengths)
            if key is not None:
                if len(self.backward_plans) >= 1024:
                    self.backward_plans.clear()
                self.backward_plans[key] = plan
        if not plan.runs:
            return self.reference_grads(inputs, d_out, needs, key_lengths)
        q, k, v = inputs[:3]
        if plan.copies:
            q, k, v, out, d_out = (
                t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, out, d_out)
            )
        lengths = q if key_lengths is None else int32_lengths(key_lengths, plan.skv)
        device, fp32 = q.device, torch.float32
        if plan.tma:  # triton's allocator is set per thread: this one may not have it yet
            ensure_allocator(device)
        delta = torch.empty(size=plan.delta_shape, dtype=fp32, device=device)
        if not plan.gluon_delta:
            plan.delta(out, d_out, delta, plan.sq, *plan.delta_strides)
        if plan.hopper is not None:
            m = self.module
            grads, compiled = attention_hopper_backward.backward(
                q, k, v, d_out.contiguous(), lse, delta, needs,
                layout=m["LAYOUT"], causal=self.hopper == "causal", scale=m["SCALE"],
                alibi=self.alibi, window=self.window, launches=plan.hopper,
                out=out if plan.gluon_delta else None,
            )  # fmt: skip
            self.last_compiled.update(compiled)
            return grads
        bias = (inputs[3], *plan.bias_strides) if self.bias else ()
        d_q = d_k = d_v = d_bias = None
        if plan.kv is not None:
            d_k = torch.empty(size=k.shape, dtype=k.dtype, device=device)
            d_v = torch.empty(size=v.shape, dtype=v.dtype, device=device)
            plan.kv(
                q, k, v, d_out, lse, delta, d_k, d_v, lengths, *plan.reads, *plan.kv_strides,
                *bias,
            )  # fmt: skip
        if plan.q is not None:
            d_q = torch.empty(size=q.shape, dtype=q.dtype, device=device)
            extra = ()
            if self.bias:
                d_scores = plan.d_scores(
                    size=plan.d_scores_shape, dtype=plan.d_scores_dtype, device=device
                )
                extra = (*bias, d_scores)
            plan.q(q, k, v, d_out, lse, delta, d_q, lengths, *plan.reads, *plan.dq_strides, *extra)
            if self.bias:
                d_q = d_q if needs[0] else None
                d_bias = summed_to(d_scores, inputs[3]) if needs[3] else None
        return (d_q, d_k, d_v, d_bias) if self.bias else (d_q, d_k, d_v)

    def backward_plan_of(self, inputs, out, d_out, needs, key_lengths):
        """The checks of a backward call, then its launches (None for a kernel whose
        gradients it does not need), grids and the strides it passes them."""
        batch, sq, skv = self.checked(inputs, key_lengths)
        q = inputs[0]
        plan = _BackwardPlan()
        plan.sq, plan.skv = sq, skv
        plan.runs = self.runs_triton(q.device) and out.numel() > 0
        if not plan.runs:
            return plan
        m = self.module
        heads = m["HEADS"]
        dtypes = self.dtypes_of(inputs)
        plan.copies = any(t.stride(-1) != 1 for t in (*inputs[:3], out, d_out))
        q, k, v, out, d_out = (
            t if t.stride(-1) == 1 else t.contiguous() for t in (*inputs[:3], out, d_out)
        )
        block_d, block_dv = bucket(m["HEAD_DIM"]), bucket(m["V_HEAD_DIM"])
        upcast = self.interpreted() and q.dtype == torch.bfloat16
        strides = self.strides_of
        plan.delta_shape = (batch, heads, sq)
        plan.delta_strides = (*strides(out), *strides(d_out))
        meta = {"HEADS": heads, "DV": m["V_HEAD_DIM"], "BLOCK_M": 64, "BLOCK_D": block_dv}
        plan.delta = _Launch(self, backward_delta, (cdiv(sq, 64), batch * heads), meta)
        plan.hopper = plan.kv = plan.q = None
        plan.tma = plan.gluon_delta = False
        if self.hopper_backward_fits(inputs, key_lengths, batch, sq, skv):
            plan.hopper = {}  # attention_hopper_backward's launch.Described, by kernel
            # delta from the dq kernel, or without dq from the Gluon kernel that computes
            # it as the dq kernel does: dk the same bits whether dq is wanted or not.
            plan.gluon_delta = attention_hopper_backward.DELTA_IN_DQ
            return plan
        plan.reads = (sq, skv, *strides(q), *strides(k), *strides(v), *strides(d_out))
        plan.bias_strides = self.bias_strides(inputs[3], batch, sq, skv) if self.bias else ()
        common = {
            "BLOCK_D": block_d, "DOT_UPCAST": upcast,
            **({"BLOCK_DV": block_dv} if self.split_v else {}),
            "PRECISION": self.dot_precision(q), "LENGTHS": key_lengths is not None,
            "RANGES": key_lengths is not None and key_lengths.dim() == 2,
            "INT64": wide_offsets(
                (q, k, v, out, d_out, *inputs[3:4]), bias_grad=sq * skv if self.bias else 0
            ),
            **({"FAST_TANH": self.fast_tanh(q)} if self.softcap else {}),
            **({"BIAS_ROW": bias_row(plan.bias_strides)} if self.bias else {}),
        }  # fmt: skip
        if needs[1] or needs[2]:
            block_m, block_n, warps, stages = self.config(q.device, "kv", sq, skv, q.dtype)
            meta = {"BLOCK_M": block_m, "BLOCK_N": block_n, **common}
            if self.tma:
                meta["TMA"] = self.tma_loads(q, d_out)
                plan.tma |= meta["TMA"] and q.device.type == "cuda"
            grid = (cdiv(skv, block_n), batch * m["KV_HEADS"])
            plan.kv = self.launch_of("kv", grid, dtypes, meta, warps, stages, q.device)
            plan.kv_strides = self.contiguous_strides(k.shape)
            if self.split_v:
                plan.kv_strides += self.contiguous_strides(v.shape)
        wants_bias = self.bias and needs[3]
        if needs[0] or wants_bias:  # the dq kernel also gives d bias: each (row, key) once
            block_m, block_n, warps, stages = self.config(q.device, "q", sq, skv, q.dtype)
            meta = {"BLOCK_M": block_m, "BLOCK_N": block_n, **common}
            if self.tma:
                meta["TMA"] = self.tma_loads(k, v)
                plan.tma |= meta["TMA"] and q.device.type == "cuda"
            chunk = 1
            if self.bias:
                bias = inputs[3]
                shared = bias.dim() < 4 or bias.shape[0] == 1
                per_entry = batch * heads * sq * skv * bias.element_size()
                if wants_bias and shared and per_entry > self.bias_grad_buffer_cap:
                    programs = cdiv(sq, block_m) * batch * heads
                    chunk = batch_chunk(batch, programs, self.sm_count(q.device))
                plan.d_scores_shape = (batch // chunk, heads, sq, skv) if wants_bias else (1,)
                # Each score's gradient once, in the bias's dtype as eager's (half the
                # bytes of fp32, summed with fp32 accumulation, no cast after); fp32 where
                # the kernel sums batch entries into it.
                wide = chunk > 1 or not wants_bias
                plan.d_scores_dtype = torch.float32 if wide else bias.dtype
                written = wants_bias and self.all_keys and key_lengths is None
                # A [batch, heads, q_len, k_len] memset spared where every element is
                # written (134 MB in bf16 at T5's 32 x 8 x 512 x 512).
                # Without d bias, a 1-element stand-in the kernel never writes: no zeros.
                plan.d_scores = torch.empty if written or not wants_bias else torch.zeros
                meta["BIAS_GRAD"] = bool(wants_bias)
                meta["BATCH_CHUNK"] = chunk
            grid = (cdiv(sq, block_m), batch // chunk * heads)
            plan.q = self.launch_of("q", grid, dtypes, meta, warps, stages, q.device)
            plan.dq_strides = self.contiguous_strides(q.shape)
        return plan

    def backward_key(self, inputs, key_lengths, out, d_out, lse, needs):
        """What a backward call's launches depend on: the forward's signature, out's,
        d_out's and lse's shapes, strides and alignment (as the kernels read them), and
        needs. None while traced or while `fusegen tune` forces configs: then each call
        makes its own launches."""
        if (self.tracing and self.tracing_here()) or self.forced:
            return None
        try:
            signature = self.signature(inputs, key_lengths)
        except (AttributeError, RuntimeError, TypeError):
            return None
        layouts = tuple((t.shape, t.stride(), t.data_ptr() % 16) for t in (out, d_out, lse))
        return signature, layouts, tuple(needs)

    def reference_grads(self, inputs, d_out, needs, key_lengths=None):
        """The gradients by the reference's autograd (no GPU), through torch.func.vjp,
        which also works inside a custom op (a compiled model's backward)."""
        reference = self.module["reference"]
        _, vjp = torch.func.vjp(lambda *xs: reference(*xs, key_lengths=key_lengths), *inputs)
        return tuple(g.contiguous() if n else None for g, n in zip(vjp(d_out), needs, strict=True))

    # Checks.

    def checked(self, inputs, key_lengths=None):
        """The call's (batch, q_len, k_len), after its checks; an error names the module
        (a call through transformers' attention interface does not show it)."""
        return errors_named(self.name, self._checked, inputs, key_lengths)

    def _checked(self, inputs, key_lengths):
        m = self.module
        ops.refuse_stand_ins(self.name, *inputs[:3])
        q, k, v = inputs[:3]
        for name, t in zip(("q", "k", "v"), inputs[:3], strict=True):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 4:
                raise ValueError(
                    f"{name} must be 4-D [{self.layout_doc}], got shape {list(t.shape)}"
                )
            if t.dtype != q.dtype:
                raise TypeError(f"{name} is {t.dtype} but q is {q.dtype}; they must match")
            if t.device != q.device:
                raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
        if q.dtype not in m["DTYPES"]:
            spec_names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
            add = f": add {spec_names[q.dtype]} there" if q.dtype in spec_names else ""
            raise TypeError(
                f"q is {q.dtype}; this kernel takes {', '.join(map(str, m['DTYPES']))} (its "
                f"spec's `dtypes`{add})"
            )
        heads_axis, seq = self.heads_axis, self.seq_axis
        for name, t, heads, width in (
            ("q", q, m["HEADS"], m["HEAD_DIM"]),
            ("k", k, m["KV_HEADS"], m["HEAD_DIM"]),
            ("v", v, m["KV_HEADS"], m["V_HEAD_DIM"]),
        ):
            for dim, axis, want in (("heads", heads_axis, heads), ("dim", 3, width)):
                if t.shape[axis] != want:
                    raise ValueError(
                        f"{name}.shape[{axis}] ({dim}) is {t.shape[axis]}; the spec says {want}"
                    )
        if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
            raise ValueError(
                f"q, k and v must share the batch dim, got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}"
            )
        if v.shape[seq] != k.shape[seq]:
            raise ValueError(
                f"v.shape[{seq}] (seq) is {v.shape[seq]} but k's is {k.shape[seq]}; they must match"
            )
        if key_lengths is not None:
            ranges = isinstance(key_lengths, torch.Tensor) and key_lengths.dim() == 2
            name, want = ("key_ranges", "[batch, 2]") if ranges else ("key_lengths", "[batch]")
            if (
                not isinstance(key_lengths, torch.Tensor)
                or key_lengths.is_floating_point()
                or key_lengths.is_complex()
                or key_lengths.dtype == torch.bool  # a mask, not lengths
            ):
                got = (
                    key_lengths.dtype
                    if isinstance(key_lengths, torch.Tensor)
                    else type(key_lengths).__name__
                )
                raise TypeError(f"{name} must be an integer torch.Tensor {want}, got {got}")
            if key_lengths.shape != ((q.shape[0], 2) if ranges else (q.shape[0],)):
                got = list(key_lengths.shape)
                want = (
                    f"[{q.shape[0]}, 2] (batch; start, end)"
                    if ranges
                    else f"[{q.shape[0]}] (batch)"
                )
                raise ValueError(f"{name} must have shape {want}, got {got}")
            if key_lengths.device != q.device:
                raise ValueError(f"{name} is on {key_lengths.device} but q is on {q.device}")
        if self.bias:
            self.check_bias(inputs[3], (q.shape[0], m["HEADS"], q.shape[seq], k.shape[seq]), q)
        return q.shape[0], q.shape[seq], k.shape[seq]

    @staticmethod
    def check_bias(bias, scores, q):
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor, got {type(bias).__name__}")
        if bias.dtype not in (q.dtype, torch.float32):
            raise TypeError(
                f"bias is {bias.dtype}; it must be q's dtype ({q.dtype}) or torch.float32"
            )
        if bias.dim() > 4 or any(
            b not in (1, s) for b, s in zip(reversed(bias.shape), reversed(scores), strict=False)
        ):
            raise ValueError(
                f"bias has shape {list(bias.shape)}, which does not broadcast to the scores' "
                f"{list(scores)} (batch, heads, q_len, k_len)"
            )
        if bias.device != q.device:
            raise ValueError(f"bias is on {bias.device} but q is on {q.device}")

    def strides_of(self, t):
        """(batch, head, position) strides in elements; the kernels read dim at unit stride."""
        s = t.stride()
        return (s[0], s[2], s[1]) if self.module["LAYOUT"] == "bshd" else s[:3]

    def contiguous_strides(self, shape):
        """strides_of a contiguous tensor of this shape (an output, or a copy)."""
        s, step = [0] * len(shape), 1
        for axis in reversed(range(len(shape))):
            s[axis] = step
            step *= shape[axis]
        return (s[0], s[2], s[1]) if self.module["LAYOUT"] == "bshd" else tuple(s[:3])

    def bias_strides(self, bias, batch, sq, skv):
        """The bias's (batch, head, query, key) strides as the scores' [batch, heads, q_len,
        k_len]: 0 along the dims it broadcasts over (read in place, never copied)."""
        return bias.expand(batch, self.module["HEADS"], sq, skv).stride()

    def dtypes_of(self, inputs):
        return (inputs[0].dtype, inputs[3].dtype) if self.bias else (inputs[0].dtype,)

    # Where a call runs, and how.

    def interpreted(self):
        return type(self.kernels["forward"]).__name__ == "InterpretedFunction"

    def runs_triton(self, device):
        return runs_triton(device, self.interpreted())

    def sm_count(self, device):
        """The GPU's multiprocessors (0 off a GPU: the interpreter runs no split)."""
        return device_facts(device)[1] if device.type == "cuda" else 0

    def shared_limit(self, device):
        """The shared memory a program may take on `device` (what Triton's compiler checks;
        no limit off a GPU, where the interpreter runs)."""
        return device_facts(device)[2] if device.type == "cuda" else float("inf")

    def fast_tanh(self, q):
        """The softcap on tanh.approx: bf16 and fp16 calls on an NVIDIA GPU (not the
        interpreter, which has no PTX)."""
        return (
            q.device.type == "cuda"
            and not torch.version.hip
            and not self.interpreted()
            and q.dtype in (torch.bfloat16, torch.float16)
        )

    @staticmethod
    def dot_precision(q):
        """How an fp32 call's products run (fp32_dot: as PyTorch's precision setting
        says, read at each plan); 16-bit operands multiply exactly either way."""
        return fp32_dot(q.device) if q.dtype == torch.float32 else "tf32"

    def tma_loads(self, *tensors):
        """Whether a kernel reads these tensors' tiles through tensor descriptors:
        TMA_LOADS, an NVIDIA GPU of compute capability 9 or newer (or the interpreter),
        and tensors whose rows start on 16 bytes, as the bulk copy needs. Not in a triton
        op: a traced tensor has no address to check, and Inductor's launch of a kernel
        that makes descriptors is unmeasured."""
        device = tensors[0].device
        traced = self.tracing and self.tracing_here()
        if not self.module.get("TMA_LOADS") or torch.version.hip or traced:
            return False
        if device.type == "cuda":
            if device_facts(device)[0] < 9:
                return False
            ensure_allocator(device)
        elif not self.interpreted():
            return False
        return all(
            t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
            for t in tensors
        )

    def hopper_fits(self, inputs, key_lengths, batch, sq, skv, traced=False):
        """Whether a call runs the Gluon kernels (attention_hopper's forward,
        attention_hopper_backward's): a module that has them (hopper), Gluon in this
        Triton, a GPU of compute capability 9.0 (its wgmma), no key lengths or ranges,
        bf16 or fp16, q, k, v contiguous and 16-byte aligned, at least 128 queries (fewer:
        the decode paths) and, causal, as many keys, and a wave of programs at least (128
        query rows of a head each, one an SM): a smaller call is bound by its launch,
        which the `tl` forward's direct launch makes cheaper. Not while `fusegen tune`
        times the `tl` kernels' configs. While traced (a triton op's body, on fake
        tensors) only with `traced`, which leaves out the alignment (fake tensors have no
        address): the body then calls the opaque op of hopper_ops, whose eager call
        checks again."""
        if not self.hopper or not attention_hopper.AVAILABLE or key_lengths is not None:
            return False
        if (self.tracing and self.tracing_here() and not traced) or self.forced or sq < 128:
            return False
        if self.hopper == "causal" and sq != skv:
            return False
        q = inputs[0]
        if q.device.type != "cuda" or torch.version.hip or self.interpreted():
            return False
        if torch.cuda.get_device_capability(q.device) != (9, 0):
            return False
        if cdiv(sq, 128) * batch * self.module["HEADS"] < self.sm_count(q.device):
            return False
        if q.dtype not in (torch.bfloat16, torch.float16):
            return False
        if wide_offsets(inputs[:3]):  # the Gluon kernels' offsets are 32-bit
            return False
        return all(t.is_contiguous() and (traced or t.data_ptr() % 16 == 0) for t in inputs[:3])

    def persistent_fits(self, sq, skv):
        """Whether a call that fits the Gluon forward runs it on the persistent grid
        (hopper_grid): as many keys as queries (its measured calls; cross-attention runs
        the grid of every tile at 128, the `tl` forward at 64: hopper_forward_fits) and,
        causal at head dim 64 (without a window), LONGEST_FIRST_MIN_QUERIES."""
        if not self.hopper_grid[0] or sq != skv:
            return False
        return not self.hopper_grid[1] or bool(self.window) or sq >= LONGEST_FIRST_MIN_QUERIES

    def hopper_forward_fits(self, inputs, key_lengths, batch, sq, skv, traced=False):
        """hopper_fits, and at head dim 64 only where the persistent grid runs
        (persistent_fits): the grid of every tile is slower than the `tl` forward there."""
        if self.module["HEAD_DIM"] == 64 and not self.persistent_fits(sq, skv):
            return False
        return self.hopper_fits(inputs, key_lengths, batch, sq, skv, traced)

    def hopper_backward_fits(self, inputs, key_lengths, batch, sq, skv, traced=False):
        """hopper_fits and head dims whose calls take the backward's kernels (at 64 too
        where the forward was the `tl` one: its lse is the same)."""
        dims = (self.module["HEAD_DIM"], self.module["V_HEAD_DIM"])
        return dims in HOPPER_BACKWARD_HEAD_DIMS and self.hopper_fits(
            inputs, key_lengths, batch, sq, skv, traced
        )

    def forward_plan(self, device, batch, sq, skv, dtype):
        """(packed, config, splits, keys per split) of a forward call: packed where the
        group's query heads fit one block (decode), then the key split (split_keys)."""
        m = self.module
        block_m, block_n, warps, stages = self.config(device, "forward", sq, skv, dtype)
        group = m["HEADS"] // m["KV_HEADS"]
        packed = self.packs and sq * group <= m["PACKED_ROWS"]
        if packed:
            block_m = max(16, bucket(sq * group))
            programs = batch * m["KV_HEADS"]
        else:
            programs = cdiv(sq, block_m) * batch * m["HEADS"]
        return (
            packed,
            (block_m, block_n, warps, stages),
            *self.split_keys(device, programs, skv, block_n),
        )

    def split_keys(self, device, programs, skv, block_n):
        """(splits, keys per split) of the forward: where its `programs` alone would fill
        under half the GPU (decode: a few queries per sequence against a long cache), the
        keys are shared out among up to SPLIT_PROGRAMS_PER_SM programs per multiprocessor,
        SPLIT_MIN_KEYS or more each, and the combine kernel adds the partial results;
        else (1, k_len)."""
        m = self.module
        sms = self.sm_count(device)
        if 2 * programs > sms or skv < 2 * m["SPLIT_MIN_KEYS"]:
            return 1, skv
        splits = min(cdiv(m["SPLIT_PROGRAMS_PER_SM"] * sms, programs), skv // m["SPLIT_MIN_KEYS"])
        per_split = cdiv(cdiv(skv, splits), block_n) * block_n
        return cdiv(skv, per_split), per_split

    # Configs and pipeline stages.

    def config(self, device, kernel, q_len, k_len, dtype):
        """The launch config of a kernel ("forward", "kv" or "q") for a call: the one
        `fusegen tune` is trying (FORCED), else this GPU's tuned entry for the call's
        dtype and length buckets or one next to them, else the module's default."""
        if kernel in self.forced:
            return self.forced[kernel]
        if device.type != "cuda":
            return self.module["INTERPRETER_CONFIG"]
        tuned = self.tuned_config(
            self.identity(device), kernel, str(dtype).removeprefix("torch."), q_len, k_len
        )
        return tuned if tuned is not None else self.default_config(kernel, q_len, dtype)

    def default_config(self, kernel, q_len, dtype):
        """The config without a table entry: DECODE_CONFIG for a forward of up to
        DECODE_ROWS queries, FP32_CONFIGS for an fp32 call, else CONFIG or
        BACKWARD_CONFIGS."""
        m = self.module
        if kernel == "forward" and q_len <= m["DECODE_ROWS"]:
            return m["DECODE_CONFIG"]
        if dtype == torch.float32:
            return m["FP32_CONFIGS"][kernel]
        return m["CONFIG"] if kernel == "forward" else m["BACKWARD_CONFIGS"][kernel]

    def identity(self, device):
        index = torch.cuda.current_device() if device.index is None else device.index
        if index not in self.identities:
            self.identities[index] = tables.identity(index)
        return self.identities[index]

    def tuned_entries(self):
        """{(gpu, capability): {(kernel, dtype, q bucket, k bucket): config}}, read once."""
        if self.table is None:
            self.table = {}
            for e in tables.entries(self.module, self.name):
                try:
                    k = e["key"]
                    slot = self.table.setdefault((e["gpu"], tuple(e["capability"])), {})
                    config = tuple(e["choices"][e["best"]]["config"])
                    slot[(k["kernel"], k["dtype"], k["q_bucket"], k["k_bucket"])] = config
                except (KeyError, TypeError):
                    continue
        return self.table

    def tuned_config(self, identity, kernel, dtype, q_len, k_len):
        """The entry of the nearest length buckets within TABLE_REACH, or None."""
        entries = self.tuned_entries().get((identity[0], tuple(identity[1])))
        if not entries:
            return None
        q_bucket, k_bucket = bucket(max(1, q_len)), bucket(max(1, k_len))
        for _, dq, dk in _NEAR:
            q = q_bucket << dq if dq >= 0 else q_bucket >> -dq
            k = k_bucket << dk if dk >= 0 else k_bucket >> -dk
            found = entries.get((kernel, dtype, q, k))
            if found is not None:
                return found
        return None

    def shared_bytes(self, kernel, stages, dtypes, meta):
        """The shared memory Triton 3.6 gives a config of `kernel` ("forward", "kv",
        "q") at sm_90, from above: the tiles held over the loop, one buffer per stage
        of those each step loads, dk/dv's lse and delta rows per stage, in fp32 its p
        and ds tiles, which its dots convert through shared memory, and a bias tile
        once (twice in dk/dv's bf16 and fp16). Against Triton's own count compiling for
        sm_90 (the three kernels, head dims 16 to 256, bf16, fp16 and fp32, with and
        without a bias): exact or up to 4% over in bf16 and fp16; in fp32, whose tiles
        Triton buffers fewer times past one stage, up to 60% over
        (tests/test_kernels.py, test_attention_shared_memory_estimate_holds). An fp32
        call's tf32x3 dots (fp32_dot) hold each operand's two halves: up to 1.67x the
        estimate at "ieee" over 45 configs of five modules (MLA's dq at one stage; an H100
        failed a traced fp32 backward at 279 KB against 230 estimated), so 1.75x; where
        they add less (as little as nothing) that cuts a stage which would fit."""
        item = dtypes[0].itemsize
        m, n, d = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_D"]
        dv = meta.get("BLOCK_DV", d)
        held, step = {
            "forward": (m * d, n * (d + dv)),
            "kv": (n * (d + dv), m * (d + dv)),
            "q": (m * (d + dv), n * (d + dv)),
        }[kernel]
        once, per_stage = held * item, step * item
        kv = kernel == "kv"
        if len(dtypes) > 1:
            # the bias tile; dk/dv reads it transposed, through a second (fp32 converts p
            # and ds through the tile counted below)
            once += m * n * dtypes[1].itemsize * (2 if kv and item < 4 else 1)
        if kv:
            per_stage += 8 * m
            once += m * n * 4 if item == 4 else 0
        total = once + stages * per_stage
        return total * 7 // 4 if meta.get("PRECISION") == "tf32x3" else total

    def launch_of(self, kind, grid, dtypes, meta, warps, stages, device):
        """A _Launch of kernel `kind` with `stages` pipeline stages cut to the most that
        fit shared memory by the estimate (shared_bytes), kept per kernel, dtypes, tiles
        and dot precision. Eager and traced calls take the same: Inductor compiles after
        the trace, where nothing is caught, and the stages can change an fp32 sum's last
        bits."""
        key = (kind, dtypes, meta["BLOCK_M"], meta.get("BLOCK_N"), meta["PRECISION"], stages)
        fitting = self.stages.get(key)
        if fitting is None:
            fitting, limit = stages, self.shared_limit(device)
            while fitting > 1 and self.shared_bytes(kind, fitting, dtypes, meta) > limit:
                fitting -= 1
            self.stages[key] = fitting
        kwargs = {**meta, "num_warps": warps, "num_stages": fitting}
        return _Launch(self, self.kernels[kind], grid, kwargs, key)

    # Autograd and torch.compile.

    def triton_ops(self):
        """Whether the ops are triton ops (ops.triton_ops): not under the interpreter."""
        return ops.triton_ops(self.interpreted())

    def as_traced(self, fn):
        """fn (its signature kept: a triton op's schema comes from it) with its launches
        going through wrap_triton while traced: a triton op's body. Called eagerly (torch
        turns wrap_triton off for it), it is the launcher as it is, with its TMA loads
        and its retry on fewer stages."""

        def run(*args):
            if not torch._library.triton.is_wrap_triton_enabled():
                return fn(*args)
            with ops.tracing_in_this_thread(self.tracing):
                return fn(*args)

        run.__wrapped__ = fn  # inspect.signature (the op's schema) reads fn's
        return run

    def op_bodies(self):
        """The forward and backward ops' bodies, typed for torch.library's schema."""
        count = len(self.inputs)
        params = {name: torch.Tensor for name in self.inputs}
        params["key_lengths"] = Optional[torch.Tensor]

        def forward(*args):
            inputs, key_lengths = args[:count], args[count]
            traced = self.tracing and self.tracing_here()
            if traced and self.hopper_ops and self.fits_traced(inputs, key_lengths):
                return self.hopper_ops[0](*args)
            return self.forward(inputs, True, key_lengths)

        def backward(*args):
            inputs, key_lengths, (out, lse, d_out, needs) = (
                args[:count],
                args[count],
                args[count + 1 :],
            )
            if (
                self.tracing
                and self.tracing_here()
                and self.hopper_ops
                and self.fits_traced(inputs, key_lengths, self.hopper_backward_fits)
            ):
                return self.hopper_ops[1](*args)
            grads = self.backward(inputs, out, lse, d_out, needs, key_lengths)
            # An empty tensor for each gradient not asked for: the schema holds no None.
            return [t.new_empty(0) if g is None else g for g, t in zip(grads, inputs, strict=True)]

        backward_params = {
            **params,
            "out": torch.Tensor,
            "lse": torch.Tensor,
            "d_out": torch.Tensor,
            "needs": list[bool],
        }
        return (
            typed(forward, params, tuple[torch.Tensor, torch.Tensor]),
            typed(backward, backward_params, list[torch.Tensor]),
        )

    def fits_traced(self, inputs, key_lengths, fits=None):
        """Whether a traced call fits the Gluon kernels (fits, by default
        hopper_forward_fits, on its shapes)."""
        batch, sq, skv = self.checked(inputs, key_lengths)
        return (fits or self.hopper_forward_fits)(inputs, key_lengths, batch, sq, skv, traced=True)

    def fake_forward(self, *args):
        """(out, lse) as empty tensors of the forward op's outputs (its fake)."""
        inputs, key_lengths = args[: len(self.inputs)], args[len(self.inputs)]
        batch, sq, _ = self.checked(inputs, key_lengths)
        q = inputs[0]
        out = torch.empty((*q.shape[:3], self.module["V_HEAD_DIM"]), dtype=q.dtype, device=q.device)
        return out, q.new_empty((batch, self.module["HEADS"], sq), dtype=torch.float32)

    def fake_backward(self, *args):
        """The backward op's gradients as empty tensors (its fake)."""
        inputs, needs = args[: len(self.inputs)], args[-1]
        return [
            torch.empty_like(t, memory_format=torch.contiguous_format) if n else t.new_empty(0)
            for t, n in zip(inputs, needs, strict=True)
        ]

    def opaque(self, name, forward, backward):
        """forward and backward as custom ops torch.compile does not look into (the
        module's ops without triton ops; the Gluon kernels, which Inductor cannot launch
        itself), their fakes fake_forward and fake_backward."""
        forward = torch.library.custom_op(f"fusegen::{name}", forward, mutates_args=())
        backward = torch.library.custom_op(f"fusegen::{name}_backward", backward, mutates_args=())
        forward.register_fake(self.fake_forward)
        backward.register_fake(self.fake_backward)
        return forward, backward

    def register(self, name=None, traced=None):
        """The launcher as torch.compile sees it: one op for the forward (out and lse)
        and one for the backward (fullgraph=True works), triton ops where triton_ops()
        (or `traced`) says, else opaque custom ops. None without torch.library.custom_op.
        Once per process, whatever threads import the module at once (launch.ONCE): one
        that found the forward op made, but not yet the rest, would take it half made."""
        with launch.ONCE:
            return self.register_now(name, traced)

    def register_now(self, name, traced):
        name = name or self.op_name
        if not hasattr(torch.library, "custom_op"):
            return None
        count = len(self.inputs)
        if getattr(torch.ops.fusegen, name, None) is None:
            traced = self.triton_ops() if traced is None else traced
            forward, backward = self.op_bodies()
            if traced:
                if self.hopper and attention_hopper.AVAILABLE:
                    # The bodies as they run eagerly (tracing 0: hopper_fits decides),
                    # called by the triton ops' bodies where a traced call fits them.
                    self.opaque(f"{name}_hopper", forward, backward)
                    fusegen = torch.ops.fusegen
                    self.hopper_ops = (
                        getattr(fusegen, f"{name}_hopper").default,
                        getattr(fusegen, f"{name}_hopper_backward").default,
                    )
                forward = torch.library.triton_op(
                    f"fusegen::{name}", self.as_traced(forward), mutates_args=()
                )
                backward = torch.library.triton_op(
                    f"fusegen::{name}_backward", self.as_traced(backward), mutates_args=()
                )
            else:
                forward, backward = self.opaque(name, forward, backward)

            def setup(ctx, inputs, output):
                ctx.save_for_backward(*inputs, *output)

            def differentiate(ctx, d_out, d_lse):
                refuse_second_derivative(self.name)
                needs = [bool(n) for n in ctx.needs_input_grad[:count]]
                grads = getattr(torch.ops.fusegen, f"{name}_backward")(
                    *ctx.saved_tensors, d_out, needs
                )
                return (*(g if n else None for g, n in zip(grads, needs, strict=True)), None)

            forward.register_autograd(differentiate, setup_context=setup)
        return getattr(torch.ops.fusegen, name).default

    def registered(self):
        """register() at import, outside any tracing; the op the launcher calls while
        compiled."""
        self.op = self.register()
        return self.op

    def for_transformers(self, launcher, causal):
        """The module's use_in_transformers; transformers is imported when it is called."""
        module, default = self.name, launcher

        def use_in_transformers(name: str = module, launcher=None, *, also=()) -> str:
            """Register this attention with transformers (4.54 or newer) as the attention
            implementation `name`, then `model.set_attn_implementation(name)`: an
            attention function and, under the same name, a mask function that turns the
            model's masks (its 2D attention_mask, its cache's offsets) into key_ranges,
            with no [batch, 1, q, k] mask. Left and right padding, dynamic and static
            caches work. A mask that is not one run of keys per row (packed sequences,
            custom mask functions, a padding hole) raises ValueError, as does a layer
            whose scaling, window, softcap or dropout is not the spec's. launcher: a
            wrapper of this module's launcher to call instead. also: other generated
            attention modules for a model whose layers differ (Gemma 2's sliding and
            global layers): each layer's call runs the module whose scale, window and
            softcap are the layer's. Returns name."""
            from . import transformers_attention

            served = [(launcher or default, self)]
            for other in also:
                use = getattr(other, "use_in_transformers", None)
                if not hasattr(use, "attention"):
                    raise TypeError(
                        f"also= takes generated attention modules without a bias input; "
                        f"{getattr(other, '__name__', other)!r} is not one"
                    )
                if use.causal != causal:
                    raise ValueError(
                        f"{use.attention.name} is {'' if use.causal else 'not '}causal and "
                        f"{self.name} is {'' if causal else 'not '}causal: one model's masks "
                        "are one kind"
                    )
                served.append((use.launcher, use.attention))
            return transformers_attention.register(name, served, causal)

        # What also= reads of this module's.
        use_in_transformers.attention, use_in_transformers.launcher = self, launcher
        use_in_transformers.causal = causal
        return use_in_transformers


def _requires_grad(inputs):
    """Whether an input requires grad (a non-tensor does not: the checks refuse it; nor
    does torch.fx's Proxy, whose requires_grad is another Proxy: the checks name it)."""
    try:
        for t in inputs:
            if t.requires_grad is True:
                return True
    except AttributeError:
        return False
    return False


def int32_lengths(key_lengths, skv):
    """key_lengths (or key_ranges) as the kernels read them: int32, contiguous; wider
    integers clamped to [0, k_len] first (the kernels clamp there), so that 2**31 does
    not wrap to a negative length."""
    if key_lengths.dtype not in (torch.int32, torch.int16, torch.int8, torch.uint8):
        key_lengths = key_lengths.clamp(0, skv)
    return key_lengths.to(torch.int32).contiguous()


def _shape_or_type(x):
    """What an error says a wrong argument was: a tensor's shape, else its type."""
    return list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__


def key_ranges_from_mask(attention_mask, check=True):
    """The launchers' key_ranges, [batch, 2] int32 (start, end), from a [batch, k_len]
    padding mask (transformers' 2D attention_mask: 1 or True where a key is real), whose
    real keys in each row are one run: left padding, right padding, or both. A row with
    none gets an empty range. check: raise ValueError for a row with a hole (a sync with
    the GPU; skipped while traced), which ranges cannot express: pass it as a bias."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        got = _shape_or_type(attention_mask)
        raise ValueError(f"attention_mask must be a [batch, k_len] tensor, got {got}")
    real = attention_mask.to(torch.bool)
    keys = torch.arange(real.shape[-1], device=real.device)
    start = torch.where(real, keys, real.shape[-1]).amin(-1)
    end = torch.where(real, keys + 1, 0).amax(-1)
    if check and not torch.compiler.is_compiling():
        holes = real.sum(-1) != (end - start).clamp(min=0)
        if bool(holes.any()):
            row = int(holes.nonzero()[0, 0])
            raise ValueError(
                f"attention_mask row {row} has a hole (its real keys are not one run); "
                "key_ranges cannot express it: a module built with `bias: true` takes the "
                "mask as an additive bias ([batch, 1, 1, k_len], -inf where masked)"
            )
    return torch.stack([start, end], dim=-1).to(torch.int32)


def wide_offsets(tensors, shapes=(), bias_grad=0):
    """Whether an offset inside one batch entry reaches 2**31 (the kernels' INT64: their
    positions times strides in 64 bits; the batch's offset always is): for the tensors
    as they lie (every dim but the first), for the contiguous tensors of `shapes` the
    call makes, and (bias_grad: q_len * k_len) for d bias's [q_len, k_len] of one head."""
    entries = (t[0] for t in tensors if len(t))  # one batch entry of each, as it lies
    made = max([math.prod(shape[1:]) for shape in shapes] + [bias_grad])
    return needs_int64(*entries) or made > 2**31


def bias_row(strides):
    """Whether a bias with these (batch, head, query, key) strides is one row of keys per
    batch entry ([batch, 1, 1, k_len]: a padding mask), which the kernels read as a row
    and broadcast, not as a tile of equal rows."""
    return strides[1] == 0 and strides[2] == 0


def summed_to(d_scores, bias):
    """d bias: the scores' gradient (the dq kernel's: over the batch in chunks where the
    bias is shared by it) summed over the dims the bias broadcast over (a 16-bit sum
    accumulates in fp32), in the bias's dtype."""
    lead = d_scores.dim() - bias.dim()
    dims = [
        d
        for d in range(d_scores.dim())
        if d_scores.shape[d] > 1 and (d < lead or bias.shape[d - lead] == 1)
    ]
    summed = d_scores.sum(dims, keepdim=True) if dims else d_scores  # sum([]) sums all
    return summed.reshape(bias.shape).to(bias.dtype)


def batch_chunk(batch, programs, sms):
    """The batch entries each dq program takes in turn, summing their d bias (a bias the
    batch shares): the largest divisor of batch that leaves four programs an SM (four in
    all on the interpreter, sms 0), so the d bias written is batch / chunk times the
    bias's heads, not batch times. At two an SM (chunk 4) T5's step was slower than at
    four (chunk 2) on an H100, both slower than per entry: it runs only where the
    per-entry buffer would pass Attention.bias_grad_buffer_cap."""
    return max(
        c
        for c in range(1, batch + 1)
        if batch % c == 0 and (c == 1 or programs // c >= 4 * max(sms, 1))
    )
