"""A quantized chain module's launcher (`QuantChain`), and the math its reference, tests
and `fusegen bench` share: dequantize, pack_int4, draw_quantized.

A module states its inputs (INPUTS), each quantized one's storage and scales (QUANT,
as `Quant`), its configs and its kernel; a call is checked once per signature (shapes,
dtypes, strides, devices), and its plan, config included, kept for the next."""

import functools
import logging
import math
import os
import zlib
from collections import namedtuple

import torch
import triton
import triton.language as tl

from . import int4_hopper, launch, quant_hopper, tables
from .checks import (
    Shapes,
    autocast_inputs,
    autocasting,
    bucket,
    config_values_problems,
    errors_named,
    needs_int64,
    refuse_dual,
    refuse_grad_out,
    runs_triton,
    shares_memory,
    signature,
    switch,
    tma_ready,
)
from .device import device_facts

_log = logging.getLogger(__name__)

Quant = namedtuple("Quant", "dtype scale group rows_per zero_point packing")
# The stored tensor's dtype per quantized dtype, without and with zero points.
STORAGE = {
    "int8": (torch.int8, torch.uint8),
    "int4": (torch.uint8, torch.uint8),
    "fp8_e4m3": (torch.float8_e4m3fn,) * 2,
    "fp8_e5m2": (torch.float8_e5m2,) * 2,
}
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The most rows a call may have for its tuning to try the GEMV configs (BLOCK_M 1), which
# read the weights once a row: past a few rows the tensor cores' tiles win.
GEMV_ROWS = 4
# The most rows a call may have for its tuning to try split-K configs (more programs over
# the weights' stream at decode; their fp32 partial sums grow with the rows).
SPLIT_ROWS = 64
TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
# The fewest rows a call may have to run quant_hopper's Gluon kernel. At 7168 -> 18432 on an
# H100 (benchmarks/fp8_block_rows.py) it takes 0.67x the `tl` kernel's time at 512 rows and
# more, but 1.09x at 128 and 1.45x at 16: its 128-row tiles are mostly padding there.
HOPPER_MIN_ROWS = 256
# And the fewest waves of its 128 x 128 output tiles over the SMs: it was measured only at
# 2.2 waves or more (256 x 18432 on 132 SMs: 288 tiles). Fewer, as a MoE expert's 2048
# columns under 2,176 rows make, run the `tl` kernel, whose tuned configs can fill the GPU
# with smaller tiles.
HOPPER_MIN_WAVES = 2
# The fewest rows a call may have to run int4_hopper's Gluon kernel (it takes up to
# int4_hopper.ROWS): at one row it ran 26.5 us against the generated GEMV's 28.5 (4096 ->
# 14336 x 2, H200, benchmarks/int4_decode_rows.py), at 16 rows 27.2 against the tiles'
# 44.5. (Before its operands took the zero points, at one row the GEMV was ahead: 28.6
# against 35.9.)
HOPPER_INT4_MIN_ROWS = 1


def cdiv(a, b):
    return -(-a // b)


def _row_major(*tensors):
    """Whether each tensor is 2-D, contiguous and 16-byte aligned (a TMA descriptor's
    source); not a traced one (torch.compile's fake tensors have no address)."""
    try:
        return all(t.dim() == 2 and t.is_contiguous() and tma_ready(t) for t in tensors)
    except RuntimeError:
        return False


def unpack_int4(packed, packing, signed):
    """[rows, K // 2] uint8 -> [rows, K] int16, the even K index from the nibble
    `packing` names; two's complement where signed."""
    low, high = (packed & 15).to(torch.int16), (packed >> 4).to(torch.int16)
    first, second = (low, high) if packing == "low_first" else (high, low)
    values = torch.stack((first, second), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])
    return (values ^ 8) - 8 if signed else values


def pack_int4(values, packing="low_first"):
    """[rows, K] integers (-8..7, or 0..15) -> [rows, K // 2] uint8, two a byte: how a
    quantized chain's int4 inputs are stored (K even)."""
    nibbles = (values.to(torch.int16) & 15).to(torch.uint8)
    even, odd = nibbles[..., 0::2], nibbles[..., 1::2]
    low, high = (even, odd) if packing == "low_first" else (odd, even)
    return low | (high << 4)


# The spread of the stored values, to draw scales that make the dequantized values O(1).
VALUE_SPREAD = {"int8": 74.0, "int4": 4.6, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0}


def draw_quantized(name, q, shape, fan, gen, scale_dtype=torch.float32):
    """Random stored values of quantized input `name` (a Quant's storage, [..., K]) with
    scales (and zero points) of its kind, as the tests and `fusegen bench` draw them, on
    the CPU: {name: stored, name_scale: scales[, name_zero: zero points]}. The
    dequantized values are O(fan) (fan: K ** -0.5 for a weight, 1 for activations)."""
    rows, k = shape[:-1], shape[-1]
    if q.dtype in ("int8", "int4"):
        low, high = {
            ("int8", False): (-128, 127),
            ("int8", True): (0, 255),
            ("int4", False): (-8, 7),
            ("int4", True): (0, 15),
        }[(q.dtype, q.zero_point)]
        values = torch.randint(low, high + 1, shape, generator=gen)
        if q.dtype == "int4":
            stored = pack_int4(values, q.packing)
        else:
            stored = values.to(STORAGE["int8"][q.zero_point])
    else:
        stored = torch.randn(shape, generator=gen).to(STORAGE[q.dtype][0])
    flat_rows = 1
    for r in rows:
        flat_rows *= r
    factor_shape = {
        "tensor": [1],
        "row": list(rows),
        "group": [*rows, k // (q.group or 1)],
        "block": [cdiv(flat_rows, q.rows_per or 1), k // (q.group or 1)],
    }[q.scale]
    scale = (0.5 + torch.rand(factor_shape, generator=gen)) * fan / VALUE_SPREAD[q.dtype]
    tensors = {name: stored, f"{name}_scale": scale.to(scale_dtype)}
    if q.zero_point:
        top = 15 if q.dtype == "int4" else 255
        zero = torch.randint(0, top + 1, factor_shape, generator=gen, dtype=torch.int32)
        tensors[f"{name}_zero"] = zero.to(torch.uint8)
    return tensors


# AutoAWQ's GEMM layout: nibble i of a word holds column 8 * word + AWQ_ORDER[i].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _nibbles(words):
    """int32 [rows, W] -> [rows, W, 8] values 0..15: nibble i (bits 4i to 4i + 3) at i."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=words.device)
    return (words.unsqueeze(-1) >> shifts) & 15


def _check_packed(fmt, t, name, dims, want):
    """A packed checkpoint tensor: int32, of shape `want` (None: any size there; `dims`
    names each), else a ValueError naming the format's layout."""
    ok = t.dtype == torch.int32 and t.dim() == len(want)
    if not ok or any(w is not None and s != w for s, w in zip(t.shape, want, strict=True)):
        here = ", ".join(d if w is None else str(w) for d, w in zip(dims, want, strict=True))
        raise ValueError(
            f"{fmt}: {name} must be int32 [{', '.join(dims)}], here [{here}] (N and G from "
            f"scales [G, N]), got {t.dtype} {list(t.shape)}"
        )


def _check_sizes(fmt, n, k, groups):
    if n % 8 or k % groups:
        raise ValueError(f"{fmt}: N ({n}) must be a multiple of 8, K ({k}) of G ({groups})")


def _as_input(values, zeros, scales, packing):
    """[N, K] values 0..15, [N, K / group] zero points and scales -> the (w, w_scale,
    w_zero) an int4 input with per-group scales and zero points takes."""
    zeros = zeros.contiguous()
    if zeros.max() > 255 or zeros.min() < 0:
        raise ValueError("zero points must lie in 0..255 (uint8)")
    return pack_int4(values, packing), scales.contiguous(), zeros.to(torch.uint8)


def from_awq(qweight, qzeros, scales, packing="low_first"):
    """AutoAWQ's GEMM checkpoint tensors as an int4 input with `scale: {per_group: G},
    zero_point: true` takes them: (w [N, K // 2] uint8, w_scale [N, K // G], w_zero
    [N, K // G] uint8), two values a byte in `packing` order. AWQ stores qweight int32
    [K, N // 8] and qzeros int32 [K // G, N // 8], packed along N (nibble i of a word
    is column 8 * word + AWQ_ORDER[i]), and scales [K // G, N]; the weight is
    (q - zero) * scale."""
    groups, n = scales.shape
    _check_packed("AWQ", qweight, "qweight", ("K", "N // 8"), (None, n // 8))
    _check_packed("AWQ", qzeros, "qzeros", ("G", "N // 8"), (groups, n // 8))
    k = qweight.shape[0]
    _check_sizes("AWQ", n, k, groups)

    def columns(words):  # [rows, N // 8] -> [rows, N]
        nibbles = _nibbles(words)
        out = torch.empty_like(nibbles)
        out[..., list(AWQ_ORDER)] = nibbles
        return out.reshape(words.shape[0], n)

    return _as_input(columns(qweight).T, columns(qzeros).T, scales.T, packing)


def from_gptq(qweight, qzeros, scales, g_idx=None, packing="low_first", zero_offset=1):
    """GPTQ checkpoint tensors (AutoGPTQ, GPTQModel; 4 bits, desc_act off) as an int4
    input with `scale: {per_group: G}, zero_point: true` takes them: (w [N, K // 2]
    uint8, w_scale [N, K // G], w_zero [N, K // G] uint8), two values a byte in
    `packing` order. GPTQ stores qweight int32 [K // 8, N] packed along K (nibble i of a
    word is row 8 * word + i), qzeros int32 [K // G, N // 8] packed along N (nibble i:
    column 8 * word + i), each zero stored one less than it is (the v1 format;
    zero_offset=0 for v2 checkpoints), scales [K // G, N]; the weight is (q - zero) *
    scale. g_idx, the group of each k, must be k // G: act-order checkpoints (desc_act)
    permute K, which per-group scales along K cannot say."""
    groups, n = scales.shape
    _check_packed("GPTQ", qweight, "qweight", ("K // 8", "N"), (None, n))
    _check_packed("GPTQ", qzeros, "qzeros", ("G", "N // 8"), (groups, n // 8))
    k = qweight.shape[0] * 8
    _check_sizes("GPTQ", n, k, groups)
    if g_idx is not None:
        in_order = torch.arange(k, device=g_idx.device) // (k // groups)
        if not torch.equal(g_idx.to(in_order.dtype), in_order):
            raise ValueError(
                "GPTQ: g_idx is not k // group_size: an act-order (desc_act) checkpoint "
                "permutes K; quantize without desc_act, or take K (x's columns, the "
                "weight's values) in g_idx.argsort() order"
            )
    values = _nibbles(qweight.T).reshape(n, k)
    zeros = _nibbles(qzeros).reshape(groups, n) + zero_offset
    return _as_input(values, zeros.T, scales.T, packing)


def checkpoint_converters(packing):
    """(from_awq, from_gptq) making a module's int4 inputs in its nibble order."""
    return functools.partial(from_awq, packing=packing), functools.partial(
        from_gptq, packing=packing
    )


# The exact float an int4 nibble is OR-ed into for a 16-bit dot (the kernels' NIBBLE_BASE).
NIBBLE_BASES = {"bfloat16": 128.0, "float16": 1024.0}


def spread(factors, quant, rows, k):
    """Scales or zero points as [rows, k] (or a scalar), each value over what it covers."""
    if quant.scale == "tensor":
        return factors.reshape(())
    if quant.scale == "row":
        return factors.reshape(rows, 1)
    spread = factors.reshape(math.prod(factors.shape[:-1]), factors.shape[-1])
    if quant.scale == "block":
        spread = spread.repeat_interleave(quant.rows_per, dim=0)[:rows]
    return spread.repeat_interleave(quant.group, dim=1)[:, :k]


def dequantize(stored, scale, zero, quant, dtype):
    """The values a quantized input stands for, in `dtype`: (stored - zero) * scale,
    exact in float64 (the reference's tests), else rounded once."""
    if quant.dtype == "int4":
        values = unpack_int4(stored, quant.packing, signed=not quant.zero_point)
    else:
        values = stored
    shape = values.shape
    values = values.reshape(math.prod(shape[:-1]), shape[-1])  # -1 is ambiguous at K = 0
    rows, k = values.shape
    wide = torch.float64
    values = values.to(wide)
    if zero is not None:
        values = values - spread(zero.to(wide), quant, rows, k)
    values = values * spread(scale.to(wide), quant, rows, k)
    return values.reshape(shape).to(dtype)


def _in_words(t):
    """Whether the GEMV path can read `t` as 32-bit words: contiguous along its last dim
    (a whole number of words long), 4-byte aligned, its rows whole words apart. False for
    a tensor without storage (torch.compile's fakes: no launch follows)."""
    try:
        aligned = t.data_ptr() % 4 == 0
    except RuntimeError:
        return False
    return (
        aligned
        and t.stride(-1) == 1
        and t.shape[-1] % 4 == 0
        and all(s % 4 == 0 for s in t.stride()[:-1])
    )


class QuantChain:
    """A quantized chain module's launches: its checks per call signature, the config
    (the caller's, the interpreter's, tuned at the first call of a key, or the default),
    and the reference where no GPU runs the kernel."""

    # What a chain writes (an fp32 accumulator's value, rounded once); a quantizer: fp8.
    out_dtypes = (torch.bfloat16, torch.float16, torch.float32)

    def __init__(self, module, name, kernel):
        self.module, self.name, self.kernel = module, name, kernel
        self.dims = module["DIMS"]
        self.inputs = module["INPUTS"]
        self.quant = module["QUANT"]
        # Whether the kernel has the one-row GEMV path (BLOCK_M 1; int8 / int4 weights).
        self.gemv = "INTERPRETER_GEMV_CONFIG" in module
        self.plans = {}  # call signature -> plan
        self.tuned = {}  # tuning key -> (config, where it came from)
        self.table = {}  # "entries": the tuned table's entries, read at first use
        self.last_launch = {}
        self.last_compiled = None  # the last launch's compiled kernel (`fusegen inspect`)
        self.kept = launch.Kept()  # a quantizer's launches, directly from the second
        # The launcher's tensors in order: (name, role, the input it belongs to).
        self.arguments = []
        for name_, _, _ in self.inputs:
            q = self.quant.get(name_)
            self.arguments.append((name_, "quant" if q else "plain", name_))
            if q:
                self.arguments.append((f"{name_}_scale", "scale", name_))
                if q.zero_point:
                    self.arguments.append((f"{name_}_zero", "zero", name_))
        # The module's Gluon kernel (quant_hopper's for "swiglu", int4_hopper's for
        # "int4_swiglu"), if it has one: its operands' places among the launcher's tensors
        # (x, the weight, the gate's weight; each followed by its scale and zero point
        # where it has them).
        self.hopper = None
        self.hopper_chain = (module.get("HOPPER") or {}).get("chain")
        if self.hopper_chain and quant_hopper.AVAILABLE:
            names = [n for n, _, _ in self.arguments]
            self.hopper = [
                names.index(f"{n}{suffix}")
                for n in module["HOPPER"]["operands"]
                for suffix in ("", "_scale", "_zero")
                if f"{n}{suffix}" in names
            ]
        self.op = self._custom_op()

    # -- a call --------------------------------------------------------------------------

    def __call__(self, tensors, out, out_dtype, config):
        if autocasting():  # inside torch.autocast: the unquantized inputs in its dtype
            stored = {i for i, (_, role, _) in enumerate(self.arguments) if role != "plain"}
            tensors = autocast_inputs(tensors, self.module["DTYPES"], stored, matmul=True)
        if torch.compiler.is_compiling() and out is None and config is None:
            return self.op(list(tensors), out_dtype)
        refuse_dual(self.name, tensors)
        first = tensors[0]
        if isinstance(first, torch.Tensor) and launch.elsewhere(first.device):
            with torch.cuda.device(first.device):  # see launch.elsewhere
                return self(tensors, out, out_dtype, config)
        if torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
        ):
            raise RuntimeError(
                f"{self.name}: a quantized chain is inference-only and makes no gradients; "
                "call it under torch.no_grad() or with inputs that do not require grad"
            )
        if out is not None and out_dtype is None and self.module["OUT_DTYPE"] is None:
            out_dtype = out.dtype  # the output's dtype, as out_dtype= would give it
        key = (signature(*tensors), out_dtype)
        if self.hopper is not None:  # the Gluon kernel's switch is part of the plan
            key += (os.environ.get("FUSEGEN_QUANT_HOPPER"),)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plan(tensors, out_dtype)
            self.plans[key] = plan
        if out is None:
            out = torch.empty(plan["out_shape"], dtype=plan["out_dtype"], device=plan["device"])
        else:
            self.check_out(out, plan, tensors)
        if config is not None:  # wrong at any size, an empty batch's too
            self.check_config(config, plan)
        if not out.numel():  # no rows or no columns: nothing to compute
            return out
        if not plan["runs_triton"]:
            return self.without_gpu(tensors, out, plan)
        views = plan["views"](tensors)
        out2d = out.view(-1, out.shape[-1])
        if config is None and plan["hopper"] and self.hopper_takes(out2d):
            self.launch_hopper(plan, views, out2d)
            return out
        if config is None:
            config, chosen_by = self.config_for(plan, views, out2d)
        else:
            chosen_by = "caller"
        self.launch(plan, views, out2d, config)
        self.last_launch = {
            "source": "kernel",
            "config": dict(config),
            "config_from": chosen_by,
            "dot": plan["dot"],
            "fast_tanh": plan["consts"].get("FAST_TANH", False),
            "nibble_base": self.nibble_base(config, plan["dot"]),
        }
        return out

    def hopper_takes(self, out2d):
        """Whether the Gluon kernel can write out2d: unit strides along its columns, and
        for quant_hopper's TMA stores, 16-byte-aligned rows."""
        if self.hopper_chain == "int4_swiglu":  # stores by pointers
            return out2d.stride(1) == 1
        return out2d.is_contiguous() and tma_ready(out2d)

    def launch_hopper(self, plan, views, out2d):
        """The call on the module's Gluon kernel (plan["hopper"]: it fits); from the
        plan's second call, launched directly with descriptors at the call's addresses."""
        operands = [views[i] for i in self.hopper]
        if self.hopper_chain == "int4_swiglu":
            kernel, config = int4_hopper.int4_swiglu, int4_hopper.CONFIG
        else:
            kernel, config = quant_hopper.fp8_block_swiglu, quant_hopper.CONFIG
        self.last_compiled = kernel(*operands, out2d, launches=plan["hopper_launches"])
        self.last_launch = {
            "source": "kernel",
            "path": "hopper",
            "config": dict(config),
            "config_from": "hopper",
            "dot": plan["dot"],
            "fast_tanh": False,
            "nibble_base": self.nibble_base(config, plan["dot"]),
        }

    def hopper_fits(self, views, plan):
        """Whether a call runs the module's Gluon kernel: a module that has one, on a GPU
        of compute capability 9.0 (H100, H200), a 16-bit output, the operands row-major,
        contiguous and 16-byte aligned, what the chain's kernel takes besides
        (_fp8_fits, _int4_fits), and FUSEGEN_QUANT_HOPPER not 0 (the way back to the `tl`
        kernel; int4_hopper's kernel, where its DEFAULT is off, only with
        FUSEGEN_QUANT_HOPPER=1). Else the `tl` kernel."""
        value = switch("FUSEGEN_QUANT_HOPPER")
        if self.hopper is None or value == "0":
            return False
        if self.hopper_chain == "int4_swiglu" and not (int4_hopper.DEFAULT or value == "1"):
            return False
        if plan["interpreted"] or plan["device"].type != "cuda":
            return False
        if torch.cuda.get_device_capability(plan["device"]) != (9, 0):
            return False
        if plan["out_dtype"] not in (torch.bfloat16, torch.float16):
            return False
        operands = [views[i] for i in self.hopper]
        if self.hopper_chain == "int4_swiglu":
            return self._int4_fits(operands, plan)
        return self._fp8_fits(operands, plan)

    def _fp8_fits(self, operands, plan):
        """quant_hopper's block-scaled fp8 SwiGLU: HOPPER_MIN_ROWS or more and
        HOPPER_MIN_WAVES of output tiles, a multiple of 8 columns, the operands fp8 e4m3
        (K a multiple of 16), their scales fp32."""
        if plan["rows"] < HOPPER_MIN_ROWS or plan["cols"] % 8:
            return False
        tiles = cdiv(plan["rows"], 128) * cdiv(plan["cols"], 128)
        if tiles < HOPPER_MIN_WAVES * device_facts(plan["device"])[1]:
            return False
        x, xs, wg, wgs, wu, wus = operands
        return (
            _row_major(x, wg, wu)
            and all(t.dtype == torch.float8_e4m3fn for t in (x, wg, wu))
            and all(t.dtype == torch.float32 for t in (xs, wgs, wus))
            and plan["k"] % 16 == 0
        )

    def _int4_fits(self, operands, plan):
        """int4_hopper's int4 SwiGLU: HOPPER_INT4_MIN_ROWS to int4_hopper.ROWS rows of
        bf16 or fp16 x, K a multiple of 128, the packed weights uint8 [N, K / 2], their scales
        (any float dtype) and uint8 zero points [N, K / 128] with unit stride along K, the
        gate's and the up's with the same strides."""
        if not HOPPER_INT4_MIN_ROWS <= plan["rows"] <= int4_hopper.ROWS:
            return False
        if plan["dtype"] not in (torch.bfloat16, torch.float16) or plan["k"] % int4_hopper.GROUP:
            return False
        x, wg, sg, zg, wu, su, zu = operands
        groups = (plan["cols"], plan["k"] // int4_hopper.GROUP)
        return (
            _row_major(x, wg, wu)
            and all(
                w.dtype == torch.uint8 and w.shape == (plan["cols"], plan["k"] // 2)
                for w in (wg, wu)
            )
            and all(t.shape == groups and t.stride(1) == 1 for t in (sg, zg, su, zu))
            and sg.dtype in SCALE_DTYPES
            and su.dtype == sg.dtype
            and zg.dtype == zu.dtype == torch.uint8
            and sg.stride() == su.stride()
            and zg.stride() == zu.stride()
        )

    def nibble_base(self, config, dot):
        """What each int4 weight carried into the launch's dot beyond its value: the
        kernel's NIBBLE_BASE where the tile ran transposed (its SWAP_AB: BLOCK_M from 2
        to 63, BLOCK_N 64 and up; int4_hopper's tiles are such) on a 16-bit dot, else 0."""
        transposed = 1 < config["BLOCK_M"] < 64 <= config["BLOCK_N"]
        if not (self.module.get("NIBBLE_FLOATS") and transposed):
            return 0.0
        return NIBBLE_BASES.get(dot, 0.0)

    def check_config(self, config, plan):
        """A caller's config, refused where it would not compile (its keys, powers of two,
        a dot's 16) or where the kernel would compute something else: a tile's K step must
        lie within one scale group, a GEMV's hold whole groups."""
        required = {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"}
        if not isinstance(config, dict) or not required <= set(config) <= required | {"SPLIT_K"}:
            raise ValueError(
                f"{self.name}: config must be a dict with keys {sorted(required)} (optional: "
                f"['SPLIT_K']), got {config!r}"
            )
        # BLOCK_M 1 is the GEMV path, on the CUDA cores: no dot, any power-of-two tile.
        problems = config_values_problems(config, dot=config["BLOCK_M"] != 1)
        if problems:
            raise ValueError(f"{self.name}: bad config {config!r}: " + "; ".join(problems))
        if config["BLOCK_M"] == 1 and not self.gemv:
            raise ValueError(
                f"{self.name}: BLOCK_M 1 is the one-row GEMV path, which only chains whose "
                "weights are all int8 or all int4 have; BLOCK_M must be at least 16"
            )
        if config["BLOCK_M"] == 1 and not plan["words"]:
            raise ValueError(
                f"{self.name}: a GEMV config (BLOCK_M 1) reads the weights as 32-bit words: "
                "each must be contiguous along K, 4-byte aligned, with rows a multiple of 4 "
                "bytes apart (K a multiple of 8 for int4, of 4 for int8)"
            )
        block_k = config["BLOCK_K"]
        for name, q in self.quant.items():
            if not q.group:
                continue
            if config["BLOCK_M"] == 1 and block_k % q.group:
                raise ValueError(
                    f"{self.name}: a GEMV config's BLOCK_K holds whole groups of {name}'s "
                    f"scales: a multiple of {q.group}, got {block_k}"
                )
            if config["BLOCK_M"] > 1 and q.group % block_k:
                raise ValueError(
                    f"{self.name}: a K step lies within one group of {name}'s scales: "
                    f"BLOCK_K must divide {q.group}, got {block_k}"
                )

    def launch(self, plan, views, out2d, config):
        """One launch. From a plan's second launch of a config, the compiled kernel is
        launched directly (runtime.launch): a decode-sized call is worth its host time."""
        rows, cols, split = plan["rows"], plan["cols"], config.get("SPLIT_K", 1)
        tiles = cdiv(rows, config["BLOCK_M"]) * cdiv(cols, config["BLOCK_N"])
        # Split-K's partial sums and the arrival counters its last program resets; an
        # unsplit kernel never touches them (SPLIT_K is a constexpr): the output stands in.
        partials = arrivals = out2d
        if split > 1:
            size = self.module["ACCUMULATORS"] * split * rows * cols
            partials = out2d.new_empty((size,), dtype=torch.float32)
            arrivals = torch.zeros(tiles, dtype=torch.int32, device=out2d.device)
        args = [*views, out2d, partials, arrivals, *plan["dim_sizes"]]
        for t, count in zip(views, plan["stride_counts"], strict=True):
            args += t.stride()[:count]
        args += out2d.stride()
        key = tuple(config.items())
        direct = plan["direct"].get(key)
        aligned = out2d.data_ptr() % 16 == 0  # what the compiled kernel assumed
        if direct and aligned:
            self.last_compiled = direct(*args)
            return
        meta = {"SPLIT_K": 1, **{k: v for k, v in config.items() if k.isupper()}}
        options = {k: v for k, v in config.items() if not k.isupper()}
        grid = (tiles * split,)
        kwargs = {**meta, **plan["consts"], **options}
        compiled = self.last_compiled = self.kernel[grid](*args, **kwargs)
        if direct is None and aligned and launch.enabled(plan["interpreted"]):
            plan["direct"][key] = launch.direct(compiled, self.kernel, grid, args, kwargs) or False

    def refuse_without_gpu(self):
        """The spec's `fallback: {no_gpu: error}`: raise where the kernel cannot run."""
        if self.module.get("NO_GPU", "reference") == "error":
            raise RuntimeError(f"{self.name}: no CUDA GPU and the Triton interpreter is off")

    def without_gpu(self, tensors, out, plan):
        self.refuse_without_gpu()
        _log.info("%s: no CUDA GPU and TRITON_INTERPRET unset: running the reference", self.name)
        named = {n: t for (n, _, _), t in zip(self.arguments, tensors, strict=True)}
        out.copy_(self.module["reference"](**named, out_dtype=plan["out_dtype"]))
        self.last_launch = {"source": "reference (no GPU)", "config": None, "dot": None}
        self.last_launch["fast_tanh"] = False
        return out

    # -- checks, once per call signature -------------------------------------------------

    def plan(self, tensors, out_dtype):
        """Check a call, and decide what holds while its signature does; an error names
        the kernel."""
        return errors_named(self.name, self._plan, tensors, out_dtype)

    def _plan(self, tensors, out_dtype):
        if len(tensors) != len(self.arguments):
            raise TypeError(f"{self.name} takes {len(self.arguments)} tensors, got {len(tensors)}")
        for (n, _, _), t in zip(self.arguments, tensors, strict=True):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{n} must be a torch.Tensor, got {type(t).__name__}")
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"{self.name}: inputs on several devices: {sorted(map(str, devices))}")
        device = tensors[0].device
        named = {n: t for (n, _, _), t in zip(self.arguments, tensors, strict=True)}
        plain = {n: named[n] for n, _, _ in self.inputs if n not in self.quant}
        dtype = self.compute_dtype(plain, out_dtype)
        # A packed int4 operand's last dim is bound as half of K, then K from twice it.
        packed = {f"{dims[-1]}/2": None for n, dims, _ in self.inputs if self._int4(n)}
        shapes = Shapes({**self.dims, **packed})
        views = {}
        for name, dims, batched in self.inputs:
            q = self.quant.get(name)
            self.check_dtype(name, named[name], q, dtype)
            if self._int4(name):
                view = shapes.bind(name, named[name], (*dims[:-1], f"{dims[-1]}/2"), batched)
                where = f"{name}.shape[-1] * 2 (two int4 values a byte)"
                shapes._bind_dim(dims[-1], 2 * view.shape[-1], where)
            else:
                view = shapes.bind(name, named[name], dims, batched)
            views[name] = view
        sizes, lead = shapes.sizes, shapes.lead
        for name, dims, batched in self.inputs:
            q = self.quant.get(name)
            if q is not None:
                self.check_factors(name, q, named, dims, sizes, lead if batched else None)
        out_dtype = self.module["OUT_DTYPE"] or out_dtype or dtype
        if self.out_dtypes and out_dtype not in self.out_dtypes:
            got = out_dtype if isinstance(out_dtype, torch.dtype) else repr(out_dtype)
            raise TypeError(
                f"the output's dtype (out_dtype=, or out='s) is {got}; it is one of "
                f"{', '.join(map(str, self.out_dtypes))}"
            )
        row_dim, col_dim = self.module["ROW"], self.module["COL"]
        rows, cols = sizes[row_dim], sizes[col_dim]
        out_shape = (*(lead or (rows,)), cols)
        interpreted = type(self.kernel).__name__ == "InterpretedFunction"
        runs = runs_triton(device, interpreted)
        fp8 = self.module["FP8_DOT"]
        # The interpreter's bf16 dots are wrong (its fp16 ones right): bf16 calls dot in fp32 there.
        dot_dtype = torch.float32 if interpreted and dtype == torch.bfloat16 else dtype
        dot = "fp8" if fp8 else "fp32" if dot_dtype != dtype else str(dtype).replace("torch.", "")
        counts = [
            (
                views[n].dim()
                if role in ("quant", "plain")
                else {"tensor": 0, "row": 1}.get(self.quant[owner].scale, 2)
            )
            for n, role, owner in self.arguments
        ]
        # Per argument: what makes the kernel's view of a call's tensor (the scales'
        # shape, or an input's dim count, past which leading batch dims are flattened).
        ranks = {n: len(dims) for n, dims, _ in self.inputs}
        shaping = [
            (self.quant[owner], None) if role in ("scale", "zero") else (None, ranks[n])
            for n, role, owner in self.arguments
        ]

        def as_views(call):
            out = []
            for t, (q, rank) in zip(call, shaping, strict=True):
                if q is not None:
                    out.append(self.factor_view(t, q))
                elif t.dim() != rank:
                    lead = t.shape[: t.dim() - rank + 1]
                    out.append(t.reshape(math.prod(lead), *t.shape[t.dim() - rank + 1 :]))
                else:
                    out.append(t)
            return out

        words = self.gemv and all(_in_words(views[n]) for n in self.quant)
        # Offsets reach 2**31 by a stride too: x = qkv[:, :K] holds few elements.
        int64 = (
            needs_int64(*(t for t in tensors if isinstance(t, torch.Tensor)))
            or rows * cols >= 2**31
        )
        consts = {"INT64": int64, "DOT_DTYPE": TL_DTYPES[dot_dtype]}
        if self.module.get("FAST_TANH_USED"):
            consts["FAST_TANH"] = (
                device.type == "cuda" and not interpreted and out_dtype != torch.float32
            )
        plan = {
            "device": device,
            "dtype": dtype,
            "out_dtype": out_dtype,
            "out_shape": out_shape,
            "rows": rows,
            "cols": cols,
            "k": sizes[self.module["K"]],
            "dim_sizes": [sizes[d] for d in self.dims],
            "stride_counts": counts,
            "views": as_views,
            "consts": consts,
            "runs_triton": runs,
            "direct": {},  # config -> its direct launch (False: none)
            "interpreted": interpreted,
            "dot": dot,
            "words": words,
            "hopper_launches": launch.Described(),  # the Gluon kernel's, where it fits
        }
        plan["hopper"] = self.hopper_fits(as_views(tensors), plan)
        return plan

    def _int4(self, name):
        q = self.quant.get(name)
        return q is not None and q.dtype == "int4"

    def compute_dtype(self, plain, out_dtype, reference=False):
        """The call's dtype: the plain (unquantized, unpinned) inputs' (by name), which must
        agree; with none, out_dtype (where the chain does not end in a cast, whose dtype is
        the output's), else the first of DTYPES. reference: float64 too (the tests')."""
        found = {t.dtype for t in plain.values()}
        if len(found) > 1:
            got = ", ".join(f"{n} {t.dtype}" for n, t in plain.items())
            raise TypeError(f"{self.name}: the unquantized inputs must share one dtype, got {got}")
        cast = self.module["OUT_DTYPE"]
        if cast is not None and out_dtype not in (None, cast, torch.float64):
            raise TypeError(
                f"{self.name}: the chain ends in a cast to {cast}, the output's dtype; "
                f"out_dtype may be that or None, got {out_dtype}"
            )
        if found:
            dtype = found.pop()
        elif out_dtype == torch.float64:
            dtype = out_dtype
        else:
            dtype = (out_dtype if cast is None else None) or self.module["DTYPES"][0]
        if dtype == torch.float64 and reference:
            return dtype
        if dtype not in self.module["DTYPES"]:
            allowed = ", ".join(str(d).replace("torch.", "") for d in self.module["DTYPES"])
            whose = f"{', '.join(plain)} (the unquantized inputs) are" if plain else "out_dtype is"
            raise TypeError(f"{self.name}: {whose} {dtype}, not one of the spec's: {allowed}")
        return dtype

    def check_dtype(self, name, t, q, dtype):
        if q is None:
            return
        want = STORAGE[q.dtype][1 if q.zero_point else 0]
        if t.dtype != want:
            packed = " (two int4 values a byte)" if q.dtype == "int4" else ""
            raise TypeError(f"{name} must be {want}{packed} for {q.dtype}, got {t.dtype}")

    def check_factors(self, name, q, named, dims, sizes, lead):
        rows, k = sizes[dims[0]], sizes[dims[-1]]
        if q.dtype == "int4" and k % 2:
            raise ValueError(f"{name}: int4 packs two values a byte along {dims[-1]}, which is {k}")
        if q.group is not None and k % q.group:
            raise ValueError(
                f"{name}: its scales' group of {q.group} does not divide {dims[-1]} = {k}"
            )
        expected = {
            "tensor": None,
            "row": (rows,),
            "group": (rows, k // (q.group or 1)),
            "block": (cdiv(rows, q.rows_per or 1), k // (q.group or 1)),
        }[q.scale]
        for suffix, kind in (("_scale", "scales"), ("_zero", "zero points")):
            t = named.get(name + suffix)
            if t is None:
                continue
            # Leading batch dims (of a batched operand's scales) count as rows.
            flat = self.factor_view(t, q) if lead and q.scale in ("row", "group") else t
            if expected is None:
                ok = t.numel() == 1
                want = "[1] (one)"
            else:
                ok = tuple(flat.shape) == expected
                want = "[" + ", ".join(map(str, expected)) + "]"
            if not ok:
                checkpoint = ""
                transposed = expected is not None and tuple(t.shape) == expected[::-1]
                if transposed and q.dtype == "int4" and q.zero_point:
                    # AWQ and GPTQ keep them [K / group, N]; from_awq / from_gptq convert.
                    checkpoint = (
                        " (transposed: an AWQ or GPTQ checkpoint's layout; the module's "
                        "from_awq / from_gptq convert one)"
                    )
                raise ValueError(
                    f"{name}{suffix} must hold {name}'s {kind} as {want} ({q.scale} "
                    f"scales), got shape {list(t.shape)}{checkpoint}"
                )
            if suffix == "_scale" and t.dtype not in SCALE_DTYPES:
                raise TypeError(f"{name}_scale must be fp32, bf16 or fp16, got {t.dtype}")
            if suffix == "_zero" and t.dtype != torch.uint8:
                raise TypeError(f"{name}_zero must be uint8, got {t.dtype}")

    @staticmethod
    def factor_view(t, q):
        if q.scale == "tensor":
            return t.reshape(1)
        if q.scale == "row":
            return t.reshape(-1)
        # Not reshape(-1, ...): ambiguous at K = 0, and slower.
        return t.flatten(0, -2) if t.dim() > 1 else t[None]

    def check_out(self, out, plan, tensors, name="out", shape=None, dtype=None):
        """A caller's output buffer (`out`, or a quantizer's `scale` with its shape and
        dtype): its shape, dtype, device, contiguity, and no memory shared with an input."""
        shape = plan["out_shape"] if shape is None else shape
        dtype = plan["out_dtype"] if dtype is None else dtype
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{self.name}: {name} must be a torch.Tensor, got {type(out).__name__}")
        refuse_grad_out(name, out)
        if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
            raise ValueError(
                f"{self.name}: {name} must be {list(shape)} {dtype}, got {list(out.shape)} "
                f"{out.dtype}"
            )
        if out.device != plan["device"]:
            raise ValueError(
                f"{self.name}: {name} is on {out.device}; the inputs on {plan['device']}"
            )
        if not out.is_contiguous():
            raise ValueError(f"{self.name}: {name} must be contiguous")
        for (argument, _, _), t in zip(self.arguments, tensors, strict=True):
            if shares_memory(out, t):
                raise ValueError(
                    f"{self.name}: {name} shares memory with {argument}; pass a separate buffer"
                )

    # -- configs ----------------------------------------------------------------------

    def config_for(self, plan, views, out2d):
        """(config, where it came from) for a call: the interpreter's; else, once per
        tuning key (table_key), the tuned table's entry for this GPU, or the fastest of
        CONFIGS on this call's tensors, or (DETERMINISTIC, FUSEGEN_AUTOTUNE=0: no tuning
        at run time) the default."""
        if plan["interpreted"]:
            if plan["rows"] == 1 and plan["words"]:  # words: a GEMV path to run
                return self.module["INTERPRETER_GEMV_CONFIG"], "interpreter"
            return self.module["INTERPRETER_CONFIG"], "interpreter"
        tuning = not self.module["DETERMINISTIC"] and os.environ.get("FUSEGEN_AUTOTUNE") != "0"
        key = (bucket(plan["rows"]), plan["cols"], plan["k"], plan["dtype"], plan["out_dtype"])
        key += (plan["words"], tuning)
        found = self.tuned.get(key)
        if found is None:
            with launch.ONCE:  # a key's tuning once, whatever threads ask for it at once
                found = self.tuned.get(key)
                if found is not None:
                    return found
                config = self.from_table(plan)
                if config:
                    found = (config, "table")
                elif tuning:
                    found = (self.tune(plan, views, out2d), "tuned")
                else:
                    found = (self.module["DEFAULT_CONFIG"], "default")
                self.tuned[key] = found
        return found

    def table_key(self, plan):
        """A call's key as tuned tables record it: its row bucket, N, K, dtypes, and
        whether the GEMV path may read its weights as words."""
        return {
            f"{self.module['ROW']}_bucket": bucket(plan["rows"]),
            self.module["COL"]: plan["cols"],
            self.module["K"]: plan["k"],
            "dtype": str(plan["dtype"]).replace("torch.", ""),
            "out_dtype": str(plan["out_dtype"]).replace("torch.", ""),
            "words": plan["words"],
        }

    def device_identity(self, device):
        """(name, [major, minor]) as tuned tables record a GPU."""
        return tables.device_identity(device)

    def from_table(self, plan):
        """The tuned table's config for a call on this GPU, or None: the entry of the
        call's key or of the nearest row bucket within reach (tables.nearest), whose
        config this call can run (a GEMV config for a few rows only, split-K for
        decode-sized calls)."""
        if "entries" not in self.table:
            self.table["entries"] = tables.entries(self.module, self.name)
        if not self.table["entries"]:
            return None
        gpu = tuple(self.device_identity(plan["device"]))
        wanted = self.table_key(plan)

        def choose(entry):
            if (entry["gpu"], entry["capability"]) != gpu:
                return None
            config = dict(entry["choices"][entry["best"]]["config"])
            self.check_config(config, plan)
            return config if self.may_run(config, plan) else None

        found = tables.nearest(
            self.table["entries"], wanted, f"{self.module['ROW']}_bucket", choose
        )
        if found is None:
            return None
        _log.info("%s: %s: tuned table entry: %s", self.name, wanted, found[1])
        return found[1]

    @staticmethod
    def may_run(config, plan):
        """Whether tuning would try config for this call: the GEMV path (BLOCK_M 1) for
        a few rows whose weights it reads as words, split-K for decode-sized calls."""
        if config["BLOCK_M"] == 1 and (plan["rows"] > GEMV_ROWS or not plan["words"]):
            return False
        return config.get("SPLIT_K", 1) == 1 or plan["rows"] <= SPLIT_ROWS

    def tune(self, plan, views, out2d):
        """The fastest config of CONFIGS on this call's tensors (written to a scratch
        output), each timed by the runtime's graph timer."""
        from .device import graph_bench

        scratch = torch.empty_like(out2d)
        best, best_ms = None, float("inf")
        for config in self.module["CONFIGS"]:
            if not self.may_run(config, plan):
                continue
            try:
                ms = graph_bench(lambda c=config: self.launch(plan, views, scratch, c))[0]
            except (
                triton.runtime.errors.OutOfResources,
                triton.runtime.errors.PTXASError,  # ptxas 12.8 crashes on a few configs
                RuntimeError,
            ) as exc:
                _log.debug("%s: config %s does not run: %s", self.name, config, exc)
                continue
            if ms < best_ms:
                best, best_ms = config, ms
        return best or self.module["DEFAULT_CONFIG"]

    # -- torch.compile -----------------------------------------------------------------

    def _custom_op(self):
        """The launcher as a torch op, which torch.compile calls as one node (its fake
        makes the output's shape from the same checks)."""
        where = zlib.crc32(self.module.get("__file__", self.name).encode())
        name = f"fusegen_quant::{self.name}_{where:08x}"
        chain = self

        @torch.library.custom_op(name, mutates_args=())
        def op(tensors: list[torch.Tensor], out_dtype: torch.dtype | None) -> torch.Tensor:
            return chain(tuple(tensors), None, out_dtype, None)

        @op.register_fake
        def _(tensors, out_dtype):
            plan = chain.plan(tuple(tensors), out_dtype)
            return tensors[0].new_empty(plan["out_shape"], dtype=plan["out_dtype"])

        return op


def quantize_values(value, fp8_dtype, fp8_max, group, rounded=True):
    """(q, scale) of a quantizer's reference: per row (or per `group` along it) scale =
    max(|value|, 1e-12) / fp8_max in fp32, q = value / scale in fp8 (unrounded, in the
    value's dtype, where not `rounded`)."""
    rows = value.reshape(math.prod(value.shape[:-1]), value.shape[-1])
    if rows.dtype != torch.float64:
        rows = rows.float()  # the kernel's arithmetic
    width = group or rows.shape[-1]
    if not width:
        raise ValueError(f"a row's scale needs at least one value; x is {list(value.shape)}")
    parts = rows.reshape(rows.shape[0], rows.shape[-1] // width, width)  # -1: not at 0 rows
    amax = parts.abs().amax(dim=-1).clamp_min(1e-12)
    scale = (amax / fp8_max).to(torch.float32)
    q = (parts / scale[..., None].to(parts.dtype)).clamp(-fp8_max, fp8_max).reshape(value.shape)
    lead = value.shape[:-1]
    scale = scale.reshape(*lead, scale.shape[-1]) if group else scale.reshape(lead)
    return (q.to(fp8_dtype) if rounded else q), scale


class Quantizer(QuantChain):
    """A quantize chain module's launches: the checks, dims and fallback of a
    QuantChain (no quantized inputs), two outputs (the fp8 values and their scales),
    and a config from the row's width (no tuning)."""

    out_dtypes = ()  # its module's fp8 type

    def __call__(self, tensors, out=None, scale=None):
        if torch.compiler.is_compiling() and out is None and scale is None:
            return tuple(self.op(list(tensors), None))
        refuse_dual(self.name, tensors)
        first = tensors[0]
        if isinstance(first, torch.Tensor) and launch.elsewhere(first.device):
            with torch.cuda.device(first.device):  # see launch.elsewhere
                return self(tensors, out, scale)
        if torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
        ):
            raise RuntimeError(
                f"{self.name}: quantizing makes no gradients; call it under torch.no_grad()"
            )
        key = signature(*tensors)
        plan = self.plans.get(key)
        group = self.module["GROUP"]
        if plan is None:
            plan = self.plan(tensors, None)
            if group and plan["cols"] % group:
                raise ValueError(
                    f"{self.name}: a group of {group} does not divide {self.module['COL']} = "
                    f"{plan['cols']}"
                )
            if not group and not plan["cols"]:  # its scale would be left unwritten
                raise ValueError(
                    f"{self.name}: {self.module['COL']} = 0: a row's scale needs at least one "
                    "value"
                )
            self.plans[key] = plan
        lead = plan["out_shape"][:-1]
        scale_shape = (*lead, plan["cols"] // group) if group else lead
        if out is None:
            out = torch.empty(plan["out_shape"], dtype=plan["out_dtype"], device=plan["device"])
        else:
            self.check_out(out, plan, tensors)
        if scale is None:
            scale = torch.empty(scale_shape, dtype=torch.float32, device=plan["device"])
        else:
            self.check_out(scale, plan, tensors, "scale", scale_shape, torch.float32)
            if shares_memory(scale, out):
                raise ValueError(f"{self.name}: scale shares memory with out")
        if not out.numel():  # no rows (an empty batch) or no columns: nothing to quantize
            return out, scale
        if not plan["runs_triton"]:
            self.refuse_without_gpu()
            named = {n: t for (n, _, _), t in zip(self.arguments, tensors, strict=True)}
            q, s = self.module["reference"](**named)
            out.copy_(q)
            scale.copy_(s)
            self.last_launch = {"source": "reference (no GPU)", "config": None}
            return out, scale
        views = plan["views"](tensors)
        out2d = out.view(-1, out.shape[-1])
        scale2d = scale.view(out2d.shape[0], -1)
        config = self.config(plan)
        args = [*views, out2d, scale2d, *plan["dim_sizes"]]
        for t, count in zip(views, plan["stride_counts"], strict=True):
            args += t.stride()[:count]
        args += [*out2d.stride(), scale2d.stride(0)] + ([scale2d.stride(1)] if group else [])
        rows = plan["rows"]
        grid = (cdiv(rows, config["BLOCK_M"]), plan["cols"] // group if group else 1)
        consts = {"INT64": plan["consts"]["INT64"], "ROUND_BY_HAND": plan["interpreted"]}
        if "FAST_TANH" in plan["consts"]:
            consts["FAST_TANH"] = plan["consts"]["FAST_TANH"]
        self.kept(self.kernel, grid, args, {**config, **consts}, plan["interpreted"])
        self.last_launch = {"source": "kernel", "config": dict(config)}
        return out, scale

    def config(self, plan):
        """BLOCK_N: the group, or up to 4096 columns a step; rows to fill about 4096
        values a program; warps by the values a program holds."""
        group = self.module["GROUP"]
        width = triton.next_power_of_2(group or min(plan["cols"], 4096))
        block_m = max(1, min(64, 4096 // width))
        if plan["interpreted"]:
            block_m = min(block_m, 16)
        return {
            "BLOCK_M": block_m,
            "BLOCK_N": width,
            "num_warps": 8 if block_m * width >= 4096 else 4,
        }

    def _custom_op(self):
        where = zlib.crc32(self.module.get("__file__", self.name).encode())
        name = f"fusegen_quant::{self.name}_{where:08x}"
        quantizer = self

        @torch.library.custom_op(name, mutates_args=())
        def op(
            tensors: list[torch.Tensor], unused: torch.dtype | None
        ) -> tuple[torch.Tensor, torch.Tensor]:
            return quantizer(tuple(tensors))

        @op.register_fake
        def _(tensors, unused):
            plan = quantizer.plan(tuple(tensors), None)
            lead, group = plan["out_shape"][:-1], quantizer.module["GROUP"]
            scale_shape = (*lead, plan["cols"] // group) if group else lead
            q = tensors[0].new_empty(plan["out_shape"], dtype=plan["out_dtype"])
            return q, tensors[0].new_empty(scale_shape, dtype=torch.float32)

        return op
