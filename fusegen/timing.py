"""Timers for `bench` and `tune` (GPU only): `timer(fn) -> ms` for one call of fn.

`do_bench_timer` is what `bench` reports: triton's do_bench median, L2 cleared before
each call, the launch's CPU cost included where it outlasts the L2 clearing (as a user
calling the launcher from Python would see it). `graph_timer` is what `tune` ranks configs by:
the GPU time of the calls replayed from a CUDA graph, so a kernel shorter than its Python
launch is timed as itself and two tuning runs agree (do_bench's numbers for such
kernels carried the CPU's noise: 0.049-0.057 ms for one shape over three tunings).

torch and triton are imported only when a timer runs.
"""

from __future__ import annotations

import statistics

GRAPH_CALLS = 20  # calls captured in one graph (fn rotates its inputs on each)
GRAPH_REPLAYS = 15  # timed replays; the median is kept


def do_bench_timer(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def final_do_bench_timer(fn) -> float:
    """More repetitions than do_bench_timer, for choosing between close finalists."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=50, rep=400, return_mode="median")


def graph_timer(fn, calls: int = GRAPH_CALLS, replays: int = GRAPH_REPLAYS) -> float:
    """ms per call: the median over `replays` replays of a CUDA graph of `calls` calls.
    No L2 clearing: fn must rotate its inputs over buffer sets larger than the L2 (as
    bench.input_sets makes them). Falls back to do_bench where fn cannot be captured."""
    import torch

    fn()  # compiles, tunes, allocates outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return do_bench_timer(fn)
    graph.replay()  # the first replay uploads the graph
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return statistics.median(times)


def final_graph_timer(fn) -> float:
    return graph_timer(fn, calls=GRAPH_CALLS, replays=4 * GRAPH_REPLAYS)


TIMERS = {"call": do_bench_timer, "graph": graph_timer}
FINAL_TIMERS = {"call": final_do_bench_timer, "graph": final_graph_timer}
