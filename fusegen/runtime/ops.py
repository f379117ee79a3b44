"""The launchers as torch.compile sees them: ops with typed signatures, and kernels
launched into a traced graph."""

import contextlib
import inspect
import threading

import torch

from .checks import switch


def typed(fn, params, returns):
    """`fn` with a signature torch.library infers an op's schema from: params, names
    (each a Tensor) or {name: type}; returns, a count of Tensors or a type."""
    if not isinstance(params, dict):
        params = dict.fromkeys(params, torch.Tensor)
    if isinstance(returns, int):
        returns = torch.Tensor if returns == 1 else tuple[(torch.Tensor,) * returns]

    def op(*args):
        return fn(*args)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    op.__signature__ = inspect.Signature(
        [inspect.Parameter(name, kind, annotation=t) for name, t in params.items()],
        return_annotation=returns,
    )
    return op


@contextlib.contextmanager
def tracing_in_this_thread(depths):
    """This thread counted into `depths` (thread -> depth: a launcher's `tracing`) while
    a torch.compile trace runs the launcher in it, so that other threads' eager calls
    meanwhile take no traced path."""
    me = threading.get_ident()
    depths[me] = depths.get(me, 0) + 1
    try:
        yield
    finally:
        if depths[me] == 1:
            del depths[me]
        else:
            depths[me] -= 1


def resolve_heuristics(kernel, args, kwargs):
    """(the jit function inside any @triton.heuristics, the keyword arguments with the
    values those compute), each rule seeing the ones before it, outermost first, as
    triton does; a traced size's comparison is made a bool (a guard of the graph)."""
    kwargs = dict(kwargs)
    while type(kernel).__name__ == "Heuristics":
        for name, rule in kernel.values.items():
            value = rule({**dict(zip(kernel.arg_names, args, strict=False)), **kwargs})
            kwargs[name] = bool(value) if isinstance(value, torch.SymBool) else value
        kernel = kernel.fn
    return kernel, kwargs


class Traced:
    """A kernel launched into the graph torch.compile traces, through wrap_triton, which
    takes no @triton.heuristics: they are worked out first (resolve_heuristics)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            kernel, kwargs = resolve_heuristics(self.kernel, args, kwargs)
            return torch.library.wrap_triton(kernel)[grid](*args, **kwargs)

        return launch


def triton_ops(interpreted):
    """Whether a module's ops are torch.library.triton_op (torch 2.6 or newer), so that
    torch.compile traces into them and Inductor launches the kernels from its own
    wrapper: unless FUSEGEN_TRITON_OP=0 is set at import, and not under the interpreter
    (torch cannot trace an interpreted kernel). Elsewhere they are opaque custom ops,
    whose Python launcher runs at each call of the compiled graph."""
    return (
        switch("FUSEGEN_TRITON_OP") != "0"
        and hasattr(torch.library, "triton_op")
        and hasattr(torch.library, "wrap_triton")
        and not interpreted
    )


def refuse_stand_ins(name, *tensors):
    """Raise, naming the launcher and what to do, where torch.fx.symbolic_trace (Proxy) or
    a torch.func transform (vmap, grad, jvp: wrapped tensors) calls it: its Triton kernel
    reads real storage, and it would fail deep inside with a message naming nothing. Part
    of a call's checks (once per call signature, not per call)."""
    for tensor in tensors:
        if isinstance(tensor, torch.fx.Proxy):
            raise TypeError(
                f"{name}: torch.fx.symbolic_trace cannot trace into a generated launcher (its "
                "Triton kernel needs real tensors); keep the call one node of the graph: "
                f'torch.fx.wrap("{name}") at the top of the module that calls it, or '
                f"torch.fx.Tracer(autowrap_functions=({name},)); torch.export keeps it one op "
                "as it is"
            )
        functorch = torch._C._functorch
        if isinstance(tensor, torch.Tensor) and (
            functorch.is_batchedtensor(tensor) or functorch.is_gradtrackingtensor(tensor)
        ):
            raise TypeError(
                f"{name}: torch.func transforms (vmap, grad, jvp, jacrev, ...) cannot run a "
                "generated launcher: its Triton kernel needs real tensors and its backward is "
                "no functorch rule; under them, call the module's reference(...) (the same "
                "chain in PyTorch ops), or use torch.autograd.grad on the launcher's output"
            )
