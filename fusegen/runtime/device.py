"""A GPU's facts, read once, and the timer runtime tuning ranks configs with."""

import torch
import triton

from .settings import GRAPH_TIMED_UNDER_MS

_DEVICES = {}  # device index -> (compute capability major, SM count, shared memory per block)
_FLUSH = {}  # device index -> the buffer that clears the L2 cache between timed calls
_ALLOCATION = getattr(triton.runtime, "_allocation", None)
try:
    TRITON_VERSION = tuple(int(part) for part in triton.__version__.split(".")[:2])
except ValueError:
    TRITON_VERSION = (0, 0)


def device_facts(device, amd=False):
    """(capability major, SM count, shared memory a block may use), read once; for a
    device that is no GPU (the interpreter), stand-ins of a small one."""
    if torch.device(device).type != "cuda":
        return (0, 4, 65_536 if amd else 101_376)
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if index not in _DEVICES:
        props = torch.cuda.get_device_properties(index)
        smem = getattr(props, "shared_memory_per_block_optin", 65_536 if amd else 101_376)
        _DEVICES[index] = (props.major, props.multi_processor_count, smem)
    return _DEVICES[index]


def ensure_allocator(device):
    """Tensor descriptors made inside a kernel need a little global scratch memory,
    which triton asks an allocator for. Keep one the caller set; else set one."""
    current = getattr(_ALLOCATION, "_allocator", None)
    if current is not None and type(current.get()).__name__ != "NullAllocator":
        return

    def scratch(size, alignment, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(scratch)


# -- Timing configs --------------------------------------------------------------------


def graph_bench(kernel_call, quantiles=(0.5, 0.2, 0.8)):
    """Autotuning's timer: a config's GPU time per call (see _graph_samples). Triton's
    default times each Python call, which for a kernel shorter than its launch measures
    the launch, so decode-sized configs came out ranked by noise. Triton's default where
    a call cannot be captured, and for kernels of GRAPH_TIMED_UNDER_MS or more, where the
    launch is hidden anyway (on an H200 the graph ranking picked a config 10% slower for
    a 0.12 ms gated kernel). Returns quantiles of the per-call times, as triton's timers do."""
    samples = _graph_samples(kernel_call)
    if samples is None or samples[len(samples) // 2] >= GRAPH_TIMED_UNDER_MS:
        from triton.testing import do_bench

        return do_bench(kernel_call, quantiles=list(quantiles))
    return [samples[min(int(q * len(samples)), len(samples) - 1)] for q in quantiles]


def _graph_samples(kernel_call, calls=20, replays=10):
    """Sorted ms per call, one per replay, from CUDA graphs of [clear the L2 cache,
    call] x calls less [clear the L2 cache] x calls; None where a call cannot be captured."""
    kernel_call()  # compiles outside the capture
    flush = _l2_flush()
    # Only this thread's CUDA calls are barred while capturing: a server's other threads
    # keep serving (synchronizing, allocating) while one call tunes (the default, "global",
    # would make their calls raise).
    mode = "thread_local"
    try:
        both = torch.cuda.CUDAGraph()
        with torch.cuda.graph(both, capture_error_mode=mode):
            for _ in range(calls):
                flush.zero_()
                kernel_call()
        alone = torch.cuda.CUDAGraph()
        with torch.cuda.graph(alone, capture_error_mode=mode):
            for _ in range(calls):
                flush.zero_()
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    both.replay()
    alone.replay()
    samples = []
    for _ in range(replays):  # interleaved, so drift in clocks hits both alike
        times = []
        for graph in (both, alone):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        samples.append(max(times[0] - times[1], 0.0) / calls)
    return sorted(samples)


def release_flush():
    """Free the L2-clearing buffers (twice the L2 cache of GPU memory), between tunings."""
    _FLUSH.clear()


def _l2_flush():
    """A buffer twice the L2 cache of the current GPU, zeroed between timed calls."""
    index = torch.cuda.current_device()
    if index not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 64 << 20
        _FLUSH[index] = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
    return _FLUSH[index]
