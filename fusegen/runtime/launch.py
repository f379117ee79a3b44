"""Launching a compiled kernel without triton's per-call dispatch.

`kernel[grid](...)` binds every argument, computes the specialization key and looks the
compiled kernel up on each call; `compiled[grid](...)` still builds a closure, reads
the current device and stream through triton's driver and fills launch metadata for
hooks nobody registered. Once a call signature has compiled its kernel, everything but
the tensors' addresses is known, so `Direct` keeps the compiled kernel's launcher and
what it takes, and a call costs one Python call into it."""

import threading

import torch

from .checks import switch
from .device import TRITON_VERSION

try:
    from triton import knobs as _knobs

    _HOOKS = _knobs.runtime  # launch_enter_hook, launch_exit_hook: chains of callables
except ImportError:  # triton before 3.4: no knobs
    _HOOKS = None

# Work done once per process, however many threads reach it together: registering a
# module's ops (a thread that found only some of them made gave up on torch.compile and
# autograd for its module) and runtime tuning (triton's Autotuner keeps the call it is
# tuning on itself, and two tunings on one GPU time each other's kernels). Taken at
# import and at a key's first call, never on a call whose plan is made.
ONCE = threading.RLock()


def _hooked():
    """Whether a launch hook is registered (a profiler's): then launches go through
    triton's own path, which calls them with their metadata. Read at each launch: a tool
    may add a hook, or set one in place of the chain, at any time."""
    if _HOOKS is None:
        return True
    enter, leave = _HOOKS.launch_enter_hook, _HOOKS.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))


def enabled(interpreted):
    """Whether direct launches may be used: not with FUSEGEN_DIRECT_LAUNCH=0, not under
    the interpreter, not before triton 3.3 (whose launcher took no constexprs)."""
    return not interpreted and TRITON_VERSION >= (3, 3) and switch("FUSEGEN_DIRECT_LAUNCH") != "0"


class Direct:
    """One compiled kernel and grid, launched with the positional arguments of a call
    (`direct(*args)`); its constexpr arguments, in the kernel's order, are kept."""

    __slots__ = ("compiled", "grid", "consts", "launch", "prefix", "device")

    def __init__(self, compiled, grid, consts, device):
        self.compiled, self.grid, self.consts = compiled, (*grid, 1, 1)[:3], consts
        self.device = device
        launcher = compiled.run
        function, metadata = compiled.function, compiled.packed_metadata
        scratch = getattr(launcher, "global_scratch_size", 1) or getattr(
            launcher, "profile_scratch_size", 1
        )
        if scratch or not hasattr(launcher, "launch"):
            # Scratch memory (tensor descriptors made in the kernel) is asked of triton's
            # allocator by the launcher's own Python, at each launch.
            self.launch, self.prefix = launcher, (function, metadata, None, None, None)
        else:
            cooperative, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
            self.launch = launcher.launch
            self.prefix = (function, cooperative, pdl, None, None, metadata, None, None, None)

    def __call__(self, *args):
        if _hooked():
            self.compiled[self.grid](*args, *self.consts)
            return self.compiled
        x, y, z = self.grid
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        self.launch(x, y, z, stream, *self.prefix, *args, *self.consts)
        return self.compiled


def direct(compiled, kernel, grid, args, kwargs):
    """A Direct for a launch that just ran `kernel[grid](*args, **kwargs)` and gave
    `compiled`, or None where its arguments cannot be lined up (a kernel wrapped in a
    way this does not know). `kernel` may sit inside @triton.heuristics, whose values
    are computed from the call's arguments as triton does."""
    try:
        fn, bound = kernel, dict(kwargs)
        while type(fn).__name__ == "Heuristics":
            for name, rule in fn.values.items():
                bound[name] = rule({**dict(zip(fn.arg_names, args, strict=False)), **bound})
            fn = fn.fn
        names = compiled.src.fn.arg_names
        bound = {**dict(zip(names, args, strict=False)), **bound}
        consts = tuple(bound[name] for name in names[len(args) :])
        device = compiled_device(args)
        return Direct(compiled, grid, consts, device)
    except (AttributeError, KeyError, TypeError):
        return None


def elsewhere(device):
    """Whether `device` is a CUDA device other than the current one. Triton launches on
    the current device (its context and stream), and a model spread over GPUs
    (transformers' device_map="auto") calls its later layers without making their device
    current: a call there runs with its device made current, as PyTorch's ops do."""
    return device.type == "cuda" and device.index != torch._C._cuda_getDevice()


def compiled_device(args):
    """The CUDA device index of a launch: its first tensor's, or tensor descriptor's (a
    kernel may take nothing else)."""
    for arg in args:
        tensor = arg if isinstance(arg, torch.Tensor) else getattr(arg, "base", None)
        if isinstance(tensor, torch.Tensor):
            index = tensor.device.index
            return torch.cuda.current_device() if index is None else index
    return torch.cuda.current_device()


class _Address:
    """A descriptor's base as triton's launcher reads it (data_ptr()): an address, where a
    TensorDescriptor keeps a tensor view."""

    __slots__ = ("address",)

    def __init__(self, address):
        self.address = address

    def data_ptr(self):
        return self.address


class _Tile:
    """A host tensor descriptor as triton's launcher reads it at a launch (base, shape,
    strides, padding), from which it encodes the TMA map each launch."""

    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, address, shape, strides, padding):
        self.base, self.shape, self.strides = _Address(address), shape, strides
        self.padding = padding


class Described:
    """One kernel that takes host tensor descriptors, launched for one call signature (its
    owner keeps one a signature: the same shapes, strides, dtypes, scalars and alignment
    at each call). The first call goes through triton's dispatch, which compiles; later
    ones straight into the compiled kernel's launcher (Direct), with descriptors made at
    the call's addresses from the first call's shapes, strides and offsets. Triton's
    dispatch of the Gluon attention kernels (30 arguments, 8 descriptors) and the
    tensor views their descriptors need cost more host time than a small call's kernel."""

    __slots__ = ("direct", "tiles", "scalars")

    def __init__(self):
        self.direct = None

    def __call__(self, sources, tensors, first):
        """Launches the kernel over descriptors of sources (one a descriptor: the tensor
        it tiles), then tensors (the kernel's arguments after its descriptors) and
        scalars; first() gives (kernel, grid, descriptors, scalars, keyword arguments),
        called while there is no direct launch. Returns the compiled kernel."""
        if self.direct is not None:
            tiles = [
                _Tile(t.data_ptr() + offset, *rest)
                for t, (offset, *rest) in zip(sources, self.tiles, strict=True)
            ]
            return self.direct(*tiles, *tensors, *self.scalars)
        kernel, grid, descriptors, scalars, kwargs = first()
        args = (*descriptors, *tensors, *scalars)
        device = (sources or tensors)[0].device  # a kernel may take no descriptors
        with torch.cuda.device(device):  # triton launches on the current device
            compiled = kernel[grid](*args, **kwargs)
        if enabled(False):
            self.tiles = [
                (d.base.data_ptr() - t.data_ptr(), d.shape, d.strides, d.padding)
                for d, t in zip(descriptors, sources, strict=True)
            ]
            self.scalars = scalars
            self.direct = direct(compiled, kernel, grid, args, kwargs)
        return compiled


class Kept:
    """Launches a call makes outside its plan (a chain's training epilogue and its
    backward kernel), kept by all that triton compiles them for and more: the kernel,
    grid, each integer, float and constexpr argument, each tensor's dtype, device and
    16-byte alignment. The first launch of a key goes through triton's dispatch (which
    compiles); later ones straight into the compiled kernel (Direct). On an H200
    triton's dispatch cost 51 us a call against 21 launched directly (issue 27's
    `launch-cost`): a training step pays it for each such kernel."""

    __slots__ = ("launches",)

    def __init__(self):
        self.launches = {}

    def __call__(self, kernel, grid, args, kwargs, interpreted):
        """kernel[grid](*args, **kwargs); `interpreted`: the kernel runs on Triton's
        interpreter (no direct launch)."""
        try:
            key = (
                kernel, grid, *kwargs.items(),
                *((a.dtype, a.device, a.data_ptr() % 16) if isinstance(a, torch.Tensor) else a
                  for a in args),
            )  # fmt: skip
            found = self.launches.get(key)
        except TypeError:  # an unhashable argument: nothing to key on
            return kernel[grid](*args, **kwargs)
        if found:
            return found(*args)
        compiled = kernel[grid](*args, **kwargs)
        # Switched off (FUSEGEN_DIRECT_LAUNCH=0): no entry, so switching on takes effect.
        if found is None and enabled(interpreted):
            if len(self.launches) >= 1024:
                self.launches.clear()
            made = direct(compiled, kernel, grid, args, kwargs)
            self.launches[key] = made or False  # False: launched through triton from now on
        return compiled
