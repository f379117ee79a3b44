"""fusegen.runtime.launch on the CPU, with a stand-in for a compiled kernel: what a
direct launch passes to the compiled kernel's launcher (the GPU tests launch real ones)."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

from fusegen.runtime import launch


class _Launcher:
    """A compiled kernel's launcher that records each launch's arguments."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self):
        self.calls = []

    def launch(self, *args):
        self.calls.append(args)


class _Kernel:
    """A kernel whose `kernel[grid](...)` records the call and gives a compiled kernel."""

    def __init__(self, arg_names):
        self.calls = []
        self.launcher = _Launcher()
        fn = SimpleNamespace(arg_names=arg_names)
        self.compiled = SimpleNamespace(
            run=self.launcher, function="f", packed_metadata="m", src=SimpleNamespace(fn=fn)
        )

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            return self.compiled

        return call


def _descriptor(t, col, rows, width):
    """What TensorDescriptor keeps: a view of t from column col, its shape and strides."""
    view = t.view(rows, -1)[:, col:]
    return SimpleNamespace(base=view, shape=[rows, width], strides=[t.shape[-1], 1], padding="zero")


def test_a_described_launch_makes_the_descriptors_again_at_each_calls_addresses(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)
    monkeypatch.setattr(launch, "_hooked", lambda: False)
    monkeypatch.setattr(launch, "compiled_device", lambda args: 0)
    kernel = _Kernel(["a_desc", "b_desc", "out", "n", "BLOCK"])
    described = launch.Described()

    def call(a, out):
        def first():
            descs = (_descriptor(a, 0, 4, 32), _descriptor(a, 32, 4, 16))
            return kernel, (3,), descs, (a.shape[0],), {"BLOCK": 64, "num_warps": 4}

        return described((a, a), (out,), first)

    a, out = torch.randn(4, 48), torch.empty(4)
    assert call(a, out) is kernel.compiled
    grid, args, kwargs = kernel.calls[0]
    assert grid == (3,) and args[2:] == (out, 4) and kwargs == {"BLOCK": 64, "num_warps": 4}
    b, out_b = torch.randn(4, 48), torch.empty(4)
    assert call(b, out_b) is kernel.compiled
    assert len(kernel.calls) == 1  # the second call went straight to the launcher
    x, y, z, stream, function, _, _, _, _, meta, _, _, _, *rest = kernel.launcher.calls[0]
    assert (x, y, z, stream, function, meta) == (3, 1, 1, 7, "f", "m")
    first_tile, second_tile, *others = rest
    assert others == [out_b, 4, 64]
    assert first_tile.base.data_ptr() == b.data_ptr()
    assert second_tile.base.data_ptr() == b.data_ptr() + 32 * b.element_size()
    assert (second_tile.shape, second_tile.strides) == ([4, 16], [48, 1])
    assert second_tile.padding == "zero"


def test_a_kept_launch_goes_direct_only_for_arguments_like_the_first(monkeypatch):
    """launch.Kept (a chain's training epilogue and backward): the first launch of a
    key through triton's dispatch, later ones with the same kernel, grid, integers,
    constexprs and tensors' dtypes, devices and alignment straight into the compiled
    kernel; anything else, or an argument it cannot key on, through the dispatch."""
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)
    monkeypatch.setattr(launch, "_hooked", lambda: False)
    monkeypatch.setattr(launch, "compiled_device", lambda args: 0)
    kernel = _Kernel(["x", "out", "n", "INT64", "BLOCK"])
    kept = launch.Kept()
    monkeypatch.setattr(launch, "enabled", lambda interpreted: not interpreted)
    x, out = torch.randn(64), torch.empty(64)
    kwargs = {"INT64": False, "BLOCK": 32, "num_warps": 4}
    assert kept(kernel, (2,), (x, out, 64), kwargs, False) is kernel.compiled
    y, out_y = torch.randn(64), torch.empty(64)
    kept(kernel, (2,), (y, out_y, 64), dict(kwargs), False)
    assert len(kernel.calls) == 1  # the second went straight to the launcher
    assert kernel.launcher.calls[0][-5:] == (y, out_y, 64, False, 32)  # then the constexprs
    others = [
        ((x, out, 63), kwargs),  # another integer
        ((x[1:], out, 64), kwargs),  # 4 bytes off x's alignment
        ((x.double(), out, 64), kwargs),  # another dtype
        ((x, out, 64), {**kwargs, "BLOCK": 64}),  # another constexpr
    ]
    for args, other in others:
        kept(kernel, (2,), args, other, False)
    assert len(kernel.calls) == 1 + len(others)
    kept(kernel, (2,), (x, out, [64]), kwargs, False)  # unhashable: the dispatch each time
    kept(kernel, (2,), (x, out, [64]), kwargs, False)
    interpreted = launch.Kept()
    for _ in range(2):  # the interpreter: none made
        interpreted(kernel, (2,), (x, out, 64), kwargs, True)
    assert len(kernel.calls) == 5 + len(others)
    switched = launch.Kept()  # FUSEGEN_DIRECT_LAUNCH=0 at its first launch, then on
    monkeypatch.setattr(launch, "enabled", lambda interpreted: False)
    switched(kernel, (2,), (x, out, 64), kwargs, False)
    monkeypatch.setattr(launch, "enabled", lambda interpreted: not interpreted)
    for _ in range(2):
        switched(kernel, (2,), (x, out, 64), kwargs, False)
    assert len(kernel.calls) == 7 + len(others)
    assert len(kernel.launcher.calls) == 2


def test_a_call_on_another_gpu_than_the_current_one_is_told_apart(monkeypatch):
    """launch.elsewhere: a CUDA device other than the current one (the launchers then make
    it current: Triton launches on the current device); never asked of the CPU's."""
    current = {"index": 0}
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: current["index"], raising=False)
    assert launch.elsewhere(torch.device("cuda", 1))
    assert not launch.elsewhere(torch.device("cuda", 0))
    current["index"] = 1
    assert not launch.elsewhere(torch.device("cuda", 1))
    monkeypatch.setattr(torch._C, "_cuda_getDevice", None, raising=False)  # not called
    assert not launch.elsewhere(torch.device("cpu"))
    assert not launch.elsewhere(torch.device("meta"))


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
def test_launchers_run_on_their_inputs_gpu_whatever_device_is_current():
    """Inputs on cuda:1 with cuda:0 current (a layer of a model spread over GPUs): each
    kind of launcher (a row chain, a GEMM chain, attention, a quantized chain), first and
    second call (the direct launch), gives its reference's result on cuda:1."""
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "generated"))
    torch.cuda.set_device(0)
    on = {"device": "cuda:1", "dtype": torch.bfloat16}
    x = torch.randn(16, 4096, **on)
    w_int8 = torch.randint(-127, 128, (512, 4096), device="cuda:1", dtype=torch.int8)
    q = torch.randn(2, 128, 32, 128, **on)
    k, v = (torch.randn(2, 128, 8, 128, **on) for _ in "kv")
    calls = {
        "llama_rmsnorm": (x, torch.randn(4096, **on)),
        "llama_mlp_gate_up": (x, *(torch.randn(14336, 4096, **on) / 64 for _ in "gu")),
        "llama3_attention": (q, k, v),
        "linear_int8": (x, w_int8, torch.rand(512, **on) / 100, torch.randn(512, **on)),
    }
    for name, args in calls.items():
        module = importlib.import_module(name)
        want = module.reference(*args).float()
        for _ in range(2):
            got = getattr(module, name)(*args)
            assert got.device == torch.device("cuda:1"), name
            scale = want.abs().max().item()
            assert (got.float() - want).abs().max().item() <= 2e-2 * scale, name
        assert torch.cuda.current_device() == 0
