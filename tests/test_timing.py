"""fusegen.tools.timing without a GPU: which timer tuning uses for which kernel."""

from fusegen.tools import timing


def _patched(monkeypatch, graph):
    calls = []
    monkeypatch.setattr(timing, "graph_ms", lambda fn, replays=0: graph)
    fallback = lambda fn: calls.append("do_bench") or 0.5  # noqa: E731
    return calls, fallback


def test_short_kernels_are_ranked_by_graph_time(monkeypatch):
    calls, fallback = _patched(monkeypatch, 0.04)
    assert timing.tuning_timer(lambda: None, fallback=fallback) == 0.04
    assert calls == []


def test_long_kernels_are_ranked_by_do_bench(monkeypatch):
    calls, fallback = _patched(monkeypatch, timing.GRAPH_TIMED_UNDER_MS)
    assert timing.tuning_timer(lambda: None, fallback=fallback) == 0.5
    assert calls == ["do_bench"]


def test_uncapturable_calls_fall_back_to_do_bench(monkeypatch):
    calls, fallback = _patched(monkeypatch, None)
    assert timing.tuning_timer(lambda: None, fallback=fallback) == 0.5
    monkeypatch.setattr(timing, "do_bench_timer", lambda fn: 0.7)
    assert timing.graph_timer(lambda: None) == 0.7


def test_each_cli_choice_names_both_timers():
    assert set(timing.TIMERS) == set(timing.TUNING_TIMERS) == {"call", "graph"}
    assert all(
        len(pair) == 2 and all(map(callable, pair)) for pair in timing.TUNING_TIMERS.values()
    )
