"""Timers for `bench` and `tune` (GPU only): `timer(fn) -> ms` for one call of fn.

`do_bench_timer` is what `bench` reports: triton's do_bench median, L2 cleared before
each call, the launch's CPU cost included where it outlasts the L2 clearing (as a user
calling the launcher from Python would see it); `graph_timer` (`bench --timer graph`)
the GPU time alone, of calls replayed from a CUDA graph. `tuning_timer` is what `tune`
ranks configs by: graph time for kernels shorter than their Python launch, so they are
timed as themselves and two tuning runs agree (do_bench's numbers for such kernels
carried the CPU's noise: 0.049-0.057 ms for one shape over three tunings; graph-timed,
0.0409-0.0411), do_bench for the rest.

torch and triton are imported only when a timer runs.
"""

from __future__ import annotations

import statistics

from fusegen.runtime.settings import GRAPH_TIMED_UNDER_MS  # the launcher's tuner agrees

GRAPH_CALLS = 20  # calls captured in one graph (fn rotates its inputs on each)
GRAPH_REPLAYS = 15  # timed replays; the median is kept


def do_bench_timer(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def final_do_bench_timer(fn) -> float:
    """More repetitions than do_bench_timer, for choosing between close finalists."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=50, rep=400, return_mode="median")


def graph_ms(fn, calls: int = GRAPH_CALLS, replays: int = GRAPH_REPLAYS) -> float | None:
    """ms per call: the median over `replays` replays of a CUDA graph of `calls` calls;
    None where fn cannot be captured. No L2 clearing: fn must rotate its inputs over
    buffer sets larger than the L2 (as bench.input_sets makes them)."""
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
        return None
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


def graph_timer(fn) -> float:
    """`bench --timer graph`: GPU time alone (do_bench where fn cannot be captured)."""
    ms = graph_ms(fn)
    return do_bench_timer(fn) if ms is None else ms


def tuning_timer(fn, replays: int = GRAPH_REPLAYS, fallback=do_bench_timer) -> float:
    """`tune`'s: graph time for kernels shorter than GRAPH_TIMED_UNDER_MS, which a
    Python launch would otherwise hide; do_bench for longer ones, which hide their launch
    (there the graph ranking picked a config 10% slower for a 0.12 ms gated kernel on
    an H200, by do_bench's and the bench's measure)."""
    ms = graph_ms(fn, replays=replays)
    return ms if ms is not None and ms < GRAPH_TIMED_UNDER_MS else fallback(fn)


def final_tuning_timer(fn) -> float:
    """For the finalists: four times the replays, or do_bench's longer run."""
    return tuning_timer(fn, replays=4 * GRAPH_REPLAYS, fallback=final_do_bench_timer)


TIMERS = {"call": do_bench_timer, "graph": graph_timer}
TUNING_TIMERS = {
    "call": (do_bench_timer, final_do_bench_timer),
    "graph": (tuning_timer, final_tuning_timer),
}
