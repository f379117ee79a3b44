"""Generated launchers called from several threads (a server's pool, a user's own): what
one thread's call finds out is not another's, first-use work is done once, and what a
call keeps for the next is not handed to another thread's call at the same time. On the
Triton interpreter; each test orders the threads with events where a race would be luck."""

import importlib.util
import os
import threading
import time

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from fusegen.cli import main  # noqa: E402
from fusegen.runtime import attention  # noqa: E402

SPECS = """
kernels:
  - name: threads_mm
    doc: A small matmul chain.
    dims: {M: dynamic, K: dynamic, N: dynamic}
    dtypes: [fp32]
    inputs: {x: [M, K], w: [K, N], b: [N]}
    chain:
      - matmul: x @ w
      - bias: b
      - relu
  - name: threads_ew
    doc: A small elementwise chain.
    dims: {M: dynamic, N: dynamic}
    dtypes: [fp32]
    inputs: {x: [M, N], r: [M, N]}
    chain:
      - input: x
      - silu
      - add: r
  - name: threads_register
    doc: Loaded by one test only, so that its ops are not registered before it.
    dims: {M: dynamic, N: dynamic}
    dtypes: [fp32]
    inputs: {x: [M, N], r: [M, N]}
    chain:
      - input: x
      - relu
      - add: r
"""


# CPU tensors run on the interpreter only where it stands in for a GPU (tests/conftest.py
# sets it without one); on a GPU machine they run the reference, which launches nothing.
on_the_interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="CPU tensors on Triton's interpreter; a GPU machine runs them on the reference",
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("threads")
    (root / "threads.yaml").write_text(SPECS)
    assert main(["build", str(root / "threads.yaml"), "--out", str(root / "gen")]) == 0
    return root / "gen"


def load(folder, kernel, name=None):
    """The module by its path, under a name of its own (as a plugin loader does)."""
    spec = importlib.util.spec_from_file_location(name or kernel, folder / f"{kernel}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_interpreted_kernel_at_a_time(monkeypatch):
    """Triton's interpreter patches triton.language while a kernel runs, so two threads
    running interpreted kernels at once break each other (a GPU has no such limit). The
    kernels' runs take turns; the launchers' host code still interleaves."""
    from triton.runtime import interpreter

    lock, run = threading.Lock(), interpreter.GridExecutor.__call__

    def serial(self, *args, **kwargs):
        with lock:
            return run(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", serial)


@on_the_interpreter
def test_last_launch_says_what_the_calling_threads_last_call_ran(folder):
    module = load(folder, "threads_ew")
    mine = {"BLOCK_M": 2, "BLOCK_N": 32, "num_warps": 1}
    other = {"BLOCK_M": 4, "BLOCK_N": 16, "num_warps": 1}
    x, r = torch.randn(8, 32), torch.randn(8, 32)
    called, other_called, seen = threading.Event(), threading.Event(), {}

    def request():
        module.threads_ew(x, r, config=mine)
        called.set()
        other_called.wait(timeout=30)  # another request ran in between
        seen["launch"], seen["run"] = module.last_launch(), module._KERNELS.last_run

    def other_request():
        called.wait(timeout=30)
        module.threads_ew(x, r, config=other)
        other_called.set()

    threads = [threading.Thread(target=f) for f in (request, other_request)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen["launch"]["config"] == mine
    assert seen["run"]["key"][0] == 8  # the row bucket of this thread's call
    assert module.last_launch()["config"] is None  # this thread made no call


def test_ops_are_registered_once_when_two_threads_import_a_module_at_once(folder, monkeypatch):
    # Thread A stops right after registering the training op, as a switch of threads
    # may; B imports the same file meanwhile. B took the ops as made, found no backward
    # op, and gave up on them: its training calls raised, its compiled calls broke the
    # graph.
    registered = torch.library.custom_op
    b_done = threading.Event()

    def paused(name, *args, **kwargs):
        op = registered(name, *args, **kwargs)
        if name.endswith("_train") and threading.current_thread().name == "A":
            b_done.wait(timeout=1)  # B's import runs here, unless it waits for A's
        return op

    monkeypatch.setattr(torch.library, "custom_op", paused)
    modules = {}

    def load_as(name):
        try:
            modules[name] = load(folder, "threads_register", f"threads_register_{name}")
        finally:
            if name == "B":
                b_done.set()

    a = threading.Thread(target=load_as, args=("A",), name="A")
    a.start()
    time.sleep(0.3)
    b = threading.Thread(target=load_as, args=("B",), name="B")
    b.start()
    a.join()
    b.join()
    monkeypatch.setattr(torch.library, "custom_op", registered)
    for name, module in modules.items():
        assert module._OP is not None, name
        assert module._KERNELS.train_op is not None, name
        x = torch.randn(4, 32, requires_grad=True)
        module.threads_register(x, torch.randn(4, 32)).sum().backward()
        assert x.grad is not None, name


@on_the_interpreter
def test_a_key_is_tuned_once_when_two_threads_call_it_at_once(
    folder, monkeypatch, one_interpreted_kernel_at_a_time
):
    # Tuning runs on a GPU; here the interpreter stands in for one, and a slow stand-in
    # for the tuner. Two threads tuned the key at once, sharing triton's Autotuner (which
    # keeps the call it tunes on itself) and timing each other's kernels.
    module = load(folder, "threads_mm")
    kernels = module._KERNELS
    tunings = []

    def autotuned(path, args, consts):
        tunings.append(path)
        time.sleep(0.3)
        return kernels.complete(path, module.INTERPRETER_CONFIG), 0.01

    monkeypatch.setattr(kernels, "can_tune", lambda device: True)
    monkeypatch.setattr(kernels, "device_identity", lambda device: ("cpu", [0, 0]))
    monkeypatch.setattr(kernels, "autotuned", autotuned)
    monkeypatch.delenv("FUSEGEN_AUTOTUNE", raising=False)
    x, w, b = torch.randn(16, 32), torch.randn(32, 16), torch.randn(16)
    start, sources = threading.Barrier(2), []

    def request():
        start.wait(timeout=30)
        torch.testing.assert_close(module.threads_mm(x, w, b), module.reference(x, w, b))
        sources.append(module.last_launch()["source"])

    threads = [threading.Thread(target=request) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tunings == ["pointer"]
    assert sources == ["autotune", "autotune"]


@on_the_interpreter
def test_another_threads_trace_leaves_an_eager_call_as_it_is(folder):
    # While torch.compile traced a triton op in one thread, every eager call in the
    # others took the trace's path: no plan kept (its checks again at each call), the
    # kernel through wrap_triton, no direct launch.
    module = load(folder, "threads_ew")
    kernels = module._KERNELS
    tracing, done = threading.Event(), threading.Event()

    def trace():
        tracing.set()
        done.wait(timeout=30)

    tracer = threading.Thread(target=kernels.traced(trace))
    tracer.start()
    tracing.wait(timeout=30)
    try:
        x, r = torch.randn(4, 32), torch.randn(4, 32)
        torch.testing.assert_close(module.threads_ew(x, r), module.reference(x, r))
        assert module._CALLS.get(module._signature(x, r)) is not None  # the plan is kept
        assert module.last_launch()["source"] == "interpreter"
    finally:
        done.set()
        tracer.join()
    assert not kernels.tracing


def test_split_decode_scratch_is_kept_per_thread_on_one_stream(monkeypatch):
    # A GPU-only path (plans keep scratch on CUDA devices, and split on a GPU's SM
    # count), checked on its own: the stream here is a stand-in. Two threads' split
    # calls on one stream launch forward, forward, combine, combine: with one set of
    # partial sums, the first combine read the second call's.
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False, raising=False)
    plan = attention._Plan()
    plan.device, plan.kept, plan.lse_shape = torch.device("cpu"), {}, (1, 2, 3)
    plan.part_shapes, plan.combine = ((4, 2, 3, 8), (4, 2, 3)), object()
    out = torch.empty(1, 3, 2, 8)
    found, both, first = {}, threading.Barrier(2), threading.Event()

    def call(name):
        if name == "b":
            first.wait(timeout=30)
        found[name] = [attention.Attention.scratch(None, plan, False, out) for _ in range(2)]
        first.set()
        both.wait(timeout=30)  # both threads live at once (a finished one's id is reused)

    threads = [threading.Thread(target=call, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in ("a", "b"):  # a thread's calls on a stream run in order: kept for it
        assert found[name][0][1] is found[name][1][1]
    assert found["a"][0][1].data_ptr() != found["b"][0][1].data_ptr()
    assert found["a"][0][2].data_ptr() != found["b"][0][2].data_ptr()
