"""What a kernel module's checks and plans use: a call's signature, dims bound to sizes,
dtype and device checks, layouts, the TMA and copy rules, configs as dicts."""

import functools
import math
import os

import torch
import triton.language as tl
from torch.autograd import forward_ad


def _any_autocast() -> bool:
    return torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")


# Whether torch.autocast is on for any device: one C call (0.08 us), which torch.compile
# traces; the generated launchers ask it first on every call.
autocasting = getattr(torch._C, "_is_any_autocast_enabled", _any_autocast)


# What autocast casts (float64 and fp8 it leaves as they are).
AUTOCAST_TYPES = (torch.float32, torch.float16, torch.bfloat16)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype torch.autocast runs matmuls in on this device, None where it is off."""
    try:
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
    except (TypeError, AttributeError, RuntimeError):  # torch < 2.4; a device autocast lacks
        if device.type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
    return None


def autocast_inputs(tensors, dtypes, pinned, matmul: bool) -> tuple:
    """A call's tensors as torch.autocast would hand them to the chain's ops, pinned ones
    (by place) as they are: a matmul chain's in autocast's dtype (F.linear's, the bias's
    too); a row or elementwise chain's in the widest of their dtypes (autocast runs norms
    and softmax in fp32, and elementwise ops promote), else autocast's. Only to a dtype in
    `dtypes`; else as they are (the checks then say what is wrong)."""
    floats = [
        t for i, t in enumerate(tensors)
        if isinstance(t, torch.Tensor) and t.dtype in AUTOCAST_TYPES and i not in pinned
    ]  # fmt: skip
    if not floats:
        return tuple(tensors)
    target = autocast_dtype(floats[0].device)
    if target is None:
        return tuple(tensors)
    if not matmul:
        widest = functools.reduce(torch.promote_types, (t.dtype for t in floats))
        target = widest if widest in dtypes else target
    if target not in dtypes:
        return tuple(tensors)
    return tuple(
        (
            t.to(target)
            if isinstance(t, torch.Tensor) and t.dtype in AUTOCAST_TYPES and i not in pinned
            else t
        )
        for i, t in enumerate(tensors)
    )


def errors_named(name: str, check, *args):
    """check(*args), a TypeError or ValueError it raises with `name: ` before its
    message (where it has none): a call's checks, whatever called the launcher."""
    try:
        return check(*args)
    except (TypeError, ValueError) as exc:
        if str(exc).startswith(f"{name}:"):
            raise
        raise type(exc)(f"{name}: {exc}") from None


def refuse_dual(name: str, tensors) -> None:
    """Forward-mode AD's dual tensors refused (torch.autograd.forward_ad): a kernel reads
    the primal values and would drop the tangents, a jvp silently wrong. The level is a
    global read (a few ns): calls outside dual_level() look at no tensor."""
    if forward_ad._current_level < 0:
        return
    for t in tensors:
        if isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None:
            raise NotImplementedError(
                f"{name}: forward-mode AD (a dual tensor's tangent) does not pass through a "
                "generated kernel; under forward_ad, call the module's reference(...) (the same "
                "chain in PyTorch ops), or take the jvp by reverse mode (torch.autograd.grad)"
            )


def names_errors(name: str):
    """A call's checks whose errors name the launcher (errors_named): a call through a
    model's forward does not show which launcher refused it."""

    def wrap(check):
        return functools.wraps(check)(lambda *args: errors_named(name, check, *args))

    return wrap


def runs_triton(device, interpreted: bool) -> bool:
    """Whether a launch on `device` runs the Triton kernels: a CUDA GPU does, the
    interpreter runs CPU tensors; elsewhere (meta tensors: shapes only) the reference."""
    if device.type == "cpu" and interpreted:
        # triton.language's own helpers (tl.cdiv) are made when triton is imported: with
        # TRITON_INTERPRET set only after that, a kernel fails inside the interpreter.
        if type(tl.cdiv).__name__ != "InterpretedFunction":
            raise RuntimeError(
                "TRITON_INTERPRET=1 was set after triton was imported, so the interpreter "
                "cannot run the kernels; set it before importing torch or triton (at the "
                "top of the script, or in the environment)"
            )
    return device.type == "cuda" or (device.type == "cpu" and interpreted)


# The on/off settings, each read where it applies (switch); all are checked at import too,
# so a bad value is an error even where the one place reading it would swallow it.
SWITCHES = (
    "FUSEGEN_TMA",
    "FUSEGEN_AUTOTUNE",
    "FUSEGEN_DIRECT_LAUNCH",
    "FUSEGEN_TRITON_OP",
    "FUSEGEN_QUANT_HOPPER",
)


def switch(name: str) -> str:
    """A FUSEGEN_* on/off setting: "0", "1", or "" where unset; any other value is a
    ValueError naming it (`FUSEGEN_TMA=true` was read as unset in one place and as on in
    another)."""
    value = os.environ.get(name, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}={value!r}: set it to 0 or 1, or leave it unset")
    return value


def refuse_grad_out(name: str, out: torch.Tensor) -> None:
    """A caller's output buffer that requires grad (grad mode on) is refused, as PyTorch's
    own out= ops refuse it: the launcher would write it with no grad_fn."""
    if out.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(
            f"{name} requires grad: a buffer given as an output takes no autograd; pass one "
            "that does not, or call under torch.no_grad()"
        )


def refuse_second_derivative(name: str) -> None:
    """Raise where a generated backward runs with grad mode on: a backward with
    create_graph=True, which asks for the gradient's own graph. The backward kernels are
    not differentiable, and their results would carry no grad_fn: a second derivative
    silently missing, or an error later that names nothing."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{name}: a second derivative (a backward with create_graph=True) is not "
            "supported: the generated backward is not differentiable"
        )


def config_values_problems(config: dict, dot: bool) -> list[str]:
    """Why a caller's config (`config=`) cannot compile, before Triton says it from deep
    inside: blocks that are not powers of two (tl.arange), under 16 in a dot (tl.dot's
    smallest tile), warps and stages out of range."""
    out = []
    config = {k: int(v) if _integral(v) else v for k, v in config.items()}  # numpy ints
    for key, value in config.items():
        if not key.startswith("BLOCK_"):
            continue
        if not _integer(value) or value < 1 or value & (value - 1):
            out.append(f"{key} = {value!r} is not a power of two (Triton's tl.arange needs one)")
        elif dot and value < 16:
            out.append(f"{key} = {value} is under 16, the smallest tile tl.dot takes")
    blocks = {k: v for k, v in config.items() if k.startswith("BLOCK_") and _integer(v)}
    for a, b in (("BLOCK_M", "BLOCK_N"), ("BLOCK_M", "BLOCK_K"), ("BLOCK_K", "BLOCK_N")):
        if blocks.get(a, 1) * blocks.get(b, 1) > 1 << 20:
            out.append(f"{a} x {b} is over 2**20 values a tile, Triton's most")
    if config.get("num_warps") not in (1, 2, 4, 8, 16, 32) or not _integer(config["num_warps"]):
        out.append(f"num_warps = {config.get('num_warps')!r} must be one of 1, 2, 4, 8, 16, 32")
    if "num_stages" in config and (
        not _integer(config["num_stages"]) or config["num_stages"] not in range(1, 9)
    ):
        out.append(f"num_stages = {config['num_stages']!r} must be 1 to 8")
    if "SPLIT_K" in config and (
        not _integer(config["SPLIT_K"]) or config["SPLIT_K"] not in (1, 2, 4, 8, 16)
    ):
        out.append(f"SPLIT_K = {config['SPLIT_K']!r} must be one of 1, 2, 4, 8, 16")
    if "GROUP_M" in config and (not _integer(config["GROUP_M"]) or config["GROUP_M"] < 1):
        out.append(f"GROUP_M = {config['GROUP_M']!r} must be a positive integer")
    for flag in ("FLATTEN", "WARP_SPECIALIZE"):
        if flag in config and config[flag] not in (0, 1):
            out.append(f"{flag} = {config[flag]!r} must be 0 or 1")
    return out


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integral(value) -> bool:
    """A numpy or torch integer scalar, which a config may hold."""
    dtype = getattr(value, "dtype", None)
    return dtype is not None and getattr(value, "ndim", 1) == 0 and "int" in str(dtype)


class Plan:
    """What the checks of one call signature decided (see a kernel module's _plan)."""

    __slots__ = (
        "device",
        "dtype",
        "out_dtype",
        "out_shape",
        "extra_shape",
        "runs_triton",
        "launches",
        "path",
        "tail",
        "consts",
        "key",
        "ready",
        "fp32",
        "follows_torch",
        "highest",
        "cuda",
        "copies",
        "training",
        "backward",
    )

    def saving(self):
        """This plan for a training forward (SAVE_PRE: the accumulators kept; SAVE_STATS:
        a norm's per-row statistics), made once."""
        if getattr(self, "training", None) is None:
            train = Plan()
            for name in Plan.__slots__:
                if name not in ("training", "backward") and hasattr(self, name):
                    setattr(train, name, getattr(self, name))
            saves = {k: True for k in ("SAVE_PRE", "SAVE_STATS") if k in self.consts}
            train.consts, train.ready, train.training = {**self.consts, **saves}, {}, False
            self.training = train
        return self.training or self


# os.environ.get encodes its key and wraps a mapping: about 0.6 us, twice per call of a
# launcher that takes 10. The process's environment as os.environ keeps it, where it can.
_ENVIRON = getattr(os.environ, "_data", None)
_ENVIRON_KEYS = (
    tuple(os.environ.encodekey(name) for name in ("FUSEGEN_TMA", "FUSEGEN_AUTOTUNE"))
    if _ENVIRON is not None and hasattr(os.environ, "encodekey")
    else None
)


def _settings():
    """FUSEGEN_TMA and FUSEGEN_AUTOTUNE as they are now."""
    if _ENVIRON_KEYS is None:
        return os.environ.get("FUSEGEN_TMA"), os.environ.get("FUSEGEN_AUTOTUNE")
    return _ENVIRON.get(_ENVIRON_KEYS[0]), _ENVIRON.get(_ENVIRON_KEYS[1])


def signature(*tensors):
    """What a plan depends on: shapes, strides, dtypes, devices, 16-byte alignment,
    FUSEGEN_TMA and FUSEGEN_AUTOTUNE. None for a non-tensor argument (the checks then
    say what is wrong)."""
    # One flat tuple, five entries a tensor (a call's arity is its module's): a tuple per
    # tensor, built by a comprehension, cost 0.15 us more per call to make and hash.
    key = []
    add = key.append
    try:
        for t in tensors:
            add(t.shape)
            add(t.stride())
            add(t.dtype)
            add(t.device)
            add(t.data_ptr() % 16)
    except (AttributeError, RuntimeError):
        return None
    key += _settings()
    return tuple(key)


class Shapes:
    """Binds each dim to the size the first tensor having it gives, and checks the rest
    against it and against the spec."""

    def __init__(self, declared):
        self.declared = declared
        self.sizes = {}
        self.origin = {}
        self.lead = None
        self.lead_origin = None

    def __getitem__(self, dim):
        return self.sizes[dim]

    def bind(self, name, tensor, dims, batched=False):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        spelled = ", ".join(dims)
        if batched:
            if tensor.dim() < len(dims):
                raise ValueError(
                    f"{name} must be [..., {spelled}] (leading dims are flattened into "
                    f"{dims[0]}), got shape {list(tensor.shape)}"
                )
            lead = tuple(tensor.shape[: tensor.dim() - len(dims) + 1])
            if self.lead is None:
                self.lead, self.lead_origin = lead, name
            elif lead != self.lead:
                raise ValueError(
                    f"{name} has leading dims {list(lead)} but {self.lead_origin} has "
                    f"{list(self.lead)}; they must match"
                )
            tensor = tensor.reshape(math.prod(lead), *tensor.shape[len(lead) :])
        elif tensor.dim() != len(dims):
            raise ValueError(
                f"{name} must be {len(dims)}-D [{spelled}], got shape {list(tensor.shape)}"
            )
        for axis, dim in enumerate(dims):
            self._bind_dim(dim, tensor.shape[axis], f"{name}.shape[{axis}]")
        return tensor

    def nonempty(self, dim, why):
        """Refuse a size of 0 for `dim` where the chain has no value to give (a max over
        no columns, which torch.amax refuses too, would be -inf)."""
        if self.sizes[dim] == 0:
            raise ValueError(f"{self.origin[dim]} is 0: {why}")

    def _bind_dim(self, dim, size, where):
        declared = self.declared[dim]
        if dim in self.sizes:
            if size != self.sizes[dim]:
                raise ValueError(
                    f"{where} is {size}, but {self.origin[dim]} is {self.sizes[dim]}; "
                    f"both are dim {dim}"
                )
        elif declared is not None and size != declared:
            raise ValueError(f"{where} is {size}, but the spec fixes dim {dim} = {declared}")
        self.sizes[dim] = size
        self.origin.setdefault(dim, where)


def call_dtype(tensors, allowed):
    """The one dtype all unpinned inputs ({name: tensor}) share, one of `allowed`."""
    name, first = next(iter(tensors.items()))
    for other, tensor in tensors.items():
        if tensor.dtype != first.dtype:
            raise TypeError(
                f"{other} is {tensor.dtype} but {name} is {first.dtype}; they must match"
            )
    if first.dtype not in allowed:
        listed = ", ".join(str(d) for d in allowed)
        hint = ""
        if first.dtype is torch.float64:  # gradcheck's dtype
            hint = "; a float64 check (gradcheck) runs the module's reference(...)"
        raise TypeError(f"{name} is {first.dtype}; this kernel takes {listed}{hint}")
    return first.dtype


def check_pinned(tensors):
    """{name: (tensor, the dtype the spec pins it to)}."""
    for name, (tensor, dtype) in tensors.items():
        if tensor.dtype != dtype:
            raise TypeError(f"{name} must be {dtype} (pinned by the spec), got {tensor.dtype}")


def common_device(tensors):
    name, first = next(iter(tensors.items()))
    for other, tensor in tensors.items():
        if tensor.device != first.device:
            raise ValueError(f"{other} is on {tensor.device} but {name} is on {first.device}")
    return first.device


def _span(t):
    return (
        sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True)) + 1
    ) * t.element_size()


def shares_memory(a, b):
    if a.numel() == 0 or b.numel() == 0:
        return False
    a_start, a_end = a.data_ptr(), a.data_ptr() + _span(a)
    b_start, b_end = b.data_ptr(), b.data_ptr() + _span(b)
    return a.device == b.device and a_start < b_end and b_start < a_end


def needs_int64(*tensors):
    """Whether some element's offset (index times stride) reaches 2**31."""
    return any(
        sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True)) >= 2**31
        for t in tensors
    )


def strides_of(*tensors):
    """Every tensor's strides, one after another: a kernel's stride arguments."""
    return tuple(stride for t in tensors for stride in t.stride())


def bucket(rows):
    """The power of two at or above `rows`: tuning per bucket, not per exact size. A
    dynamic size (torch.compile's SymInt) is compared with each power of two in turn,
    which guards the compiled graph to this bucket."""
    if isinstance(rows, int):
        return 1 << max(rows - 1, 0).bit_length()
    found = 1
    while found < rows:
        found *= 2
    return found


def align(*ints):
    """The largest power of two up to 16 that divides each of `ints` (0 is divisible by
    any): a row or elementwise kernel's ALIGN, computed by its heuristic at each launch."""
    common = math.gcd(*ints)
    return 16 if common == 0 else min(16, common & -common)


def column_major(tensor):
    """Whether a 2-D tensor's unit stride is along its first dim (a transposed view)."""
    return tensor.stride(0) == 1 and tensor.stride(1) != 1 and tensor.shape[1] > 1


def settled(key):
    """A plan's key as torch.compile traces it, with each size (and layout flag) the
    trace has fixed (a dim the spec fixes: the checks guard it) as an int (a bool); None
    where one is still symbolic: a SymInt cannot key a dict, nor a SymBool be compared
    with a key's bool outside the trace."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_bool, is_concrete_int

    def plain_value(value):
        if isinstance(value, torch.SymInt):
            return int(value) if is_concrete_int(value) else None
        if isinstance(value, torch.SymBool):
            return bool(value) if is_concrete_bool(value) else None
        if isinstance(value, tuple):
            inner = tuple(plain_value(v) for v in value)
            return None if None in inner else inner
        return value

    out = tuple(plain_value(v) for v in key)
    return None if None in out else out


def layout(*tensors):
    """Which of these 2-D tensors are column-major."""
    return tuple(column_major(t) for t in tensors)


def tma_ready(tensor, either_major=False, traced=False):
    """A tensor descriptor needs a unit-stride last dim, 16-byte-aligned other strides
    and a 16-byte-aligned start (an fp16 row of 50 elements is 100 bytes: not aligned).
    either_major: a column-major 2-D tensor will do, read through its transpose.
    traced: a tensor torch.compile traces, with no address: its offset into its storage
    decides (Inductor's buffers start aligned, and it copies an input that does not)."""
    size = tensor.element_size()
    strides = tensor.stride()
    if either_major and column_major(tensor):
        strides = strides[::-1]
    return (
        tensor.numel() > 0
        and strides[-1] == 1
        and all(stride * size % 16 == 0 for stride in strides[:-1])
        and (tensor.storage_offset() * size if traced else tensor.data_ptr()) % 16 == 0
    )


def copies(operands):
    """({launch argument index: 2-D matmul operand}) -> (the indices a launch copies to
    contiguous memory first, the operands as the plan sees them). An operand with no
    unit stride, a slice such as x[:, ::2], is copied: one pass, and the copy takes the
    TMA kernel, where the pointer kernel's strided loads ran 3x slower than eager
    PyTorch (which copies too). Other inputs are read as they are, whatever their strides."""
    copied, seen = (), []
    for index, tensor in operands.items():
        if 1 not in (tensor.stride(0), tensor.stride(1)):
            copied += (index,)
            tensor = torch.empty(tensor.shape, device="meta", dtype=tensor.dtype)
        seen.append(tensor)
    return copied, seen


# What torch.backends.cuda.matmul.fp32_precision reads (torch 2.9 and newer), called
# without the module-level __getattr__ in front of it: 1 us of an fp32 call's 5.
_FP32_PRECISION = getattr(torch._C, "_get_fp32_precision_getter", None)
if getattr(torch.backends.cuda.matmul, "fp32_precision", None) is None:
    _FP32_PRECISION = None


def fp32_matmul():
    """ "tf32" or "ieee": how PyTorch runs an fp32 matmul now, as torch.compile follows it
    too. torch.set_float32_matmul_precision("high" or "medium") or
    torch.backends.cuda.matmul.fp32_precision = "tf32" (or allow_tf32 = True) give tf32;
    "highest", the default, gives ieee. Read at each fp32 call: the setting is global."""
    if _FP32_PRECISION is not None:
        return "tf32" if _FP32_PRECISION("cuda", "matmul") == "tf32" else "ieee"
    matmul = torch.backends.cuda.matmul
    setting = getattr(matmul, "fp32_precision", None)  # torch 2.9 and newer
    if setting is None:
        return "tf32" if matmul.allow_tf32 else "ieee"
    return "tf32" if setting == "tf32" else "ieee"


def fp32_dot(device):
    """How an fp32 tl.dot runs under PyTorch's precision setting now (fp32_matmul), on
    `device`: "tf32" where PyTorch takes tf32; at "highest", "tf32x3" on an NVIDIA GPU,
    the sum of three tf32 products of each operand split in two (all but the two small
    halves' product), fp32-level error at tensor-core speed (on an H200, BERT's and T5's
    fp32 chains 1.21x and 1.28x eager's cuBLAS SGEMM, at 0.44x its error against float64;
    benchmarks/experiments/fp32_precision.py); else "ieee" (AMD, the interpreter)."""
    if fp32_matmul() == "tf32":
        return "tf32"
    return fp32_highest(device)


def fp32_highest(device):
    """fp32_dot's choice on `device` at "highest": what a plan keeps, as device.type
    (0.16 us) is no cheaper than the rest of the choice."""
    return "tf32x3" if device.type == "cuda" and not torch.version.hip else "ieee"


def config_table(settings, rows):
    """A config space as dicts, from a table: the settings' names, then one row of
    values per config (None: the setting is left out, the kernel's default)."""
    return [config_row(settings, *row) for row in rows]


def config_row(settings, *values):
    """One config as a dict, from the settings' names and a row of their values."""
    return {k: v for k, v in zip(settings, values, strict=True) if v is not None}


def plain(value):
    """A key's value as a tuned table spells it: dtypes without "torch."."""
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


def config_key(config):
    """A caller's config as a key of plan.ready (None: the launcher chooses)."""
    try:
        key = None if config is None else tuple(config.items())
        hash(key)
        return key
    except (AttributeError, TypeError):
        return ("unusable", id(config))  # checked_config says what is wrong


for _name in SWITCHES:
    switch(_name)
