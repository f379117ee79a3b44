"""What a user does with a model calling generated launchers besides calling it: a copy
of a model patched as docs/integration.md shows, meta-device shape inference (launchers
and the `kernels` hub layers), and the tracers and transforms that cannot run a Triton
kernel (torch.fx.symbolic_trace, torch.func's vmap, grad and jvp), refused with an error
naming the launcher and what to do instead of one from deep inside torch."""

import copy
import importlib.util
import logging
import sys
import types
from pathlib import Path

import pytest

from fusegen.cli import main

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

SPEC = """\
version: 1
kernels:
  - name: use_rmsnorm
    dims: {M: dynamic, N: 64}
    dtypes: [fp32]
    inputs: {x: [M, N], weight: [N]}
    chain:
      - input: x
      - rmsnorm: {weight: weight, eps: 1.0e-6}
  - name: use_gate_up
    dims: {M: dynamic, K: 64, N: 128}
    dtypes: [fp32]
    inputs: {x: [M, K], w_gate: [N, K], w_up: [N, K]}
    chain:
      - matmul: x @ w_gate.T
      - silu
      - gate: x @ w_up.T
  - name: use_silu
    dims: {M: dynamic, N: 128}
    dtypes: [fp32]
    inputs: {x: [M, N]}
    chain:
      - input: x
      - silu
  - name: use_strict_silu
    dims: {M: dynamic, N: 128}
    dtypes: [fp32]
    inputs: {x: [M, N]}
    fallback: {no_gpu: error}
    chain:
      - input: x
      - silu
  - name: use_attention
    dtypes: [fp32]
    attention: {layout: bshd, heads: 4, kv_heads: 2, head_dim: 16, causal: true}
"""
NAMES = ("use_rmsnorm", "use_gate_up", "use_silu", "use_strict_silu", "use_attention")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the launchers' modules by name, the folder of the same build as a hub repository)."""
    root = tmp_path_factory.mktemp("uses")
    (root / "spec.yaml").write_text(SPEC)
    assert main(["build", str(root / "spec.yaml"), "--out", str(root / "gen")]) == 0
    hub = ["build", str(root / "spec.yaml"), "--out", str(root / "hub")]
    assert main([*hub, "--kernels-hub", "use-kernels"]) == 0
    modules = {}
    for name in NAMES:
        spec = importlib.util.spec_from_file_location(name, root / "gen" / f"{name}.py")
        modules[name] = importlib.util.module_from_spec(spec)
        sys.modules[name] = modules[name]
        spec.loader.exec_module(modules[name])
    yield modules, root / "hub"
    for name in modules:
        sys.modules.pop(name, None)


class Block(torch.nn.Module):
    """An RMSNorm, then the gated MLP's gate/up projection, through the launchers, called
    by their names in this module (as `from use_rmsnorm import use_rmsnorm` would bind them:
    torch.fx patches such names)."""

    def __init__(self, modules):
        super().__init__()
        globals().update(
            use_rmsnorm=modules["use_rmsnorm"].use_rmsnorm,
            use_gate_up=modules["use_gate_up"].use_gate_up,
        )
        self.weight = torch.nn.Parameter(torch.randn(64, device=DEVICE))
        self.w_gate = torch.nn.Parameter(torch.randn(128, 64, device=DEVICE) / 8)
        self.w_up = torch.nn.Parameter(torch.randn(128, 64, device=DEVICE) / 8)

    def forward(self, x):
        h = use_rmsnorm(x, self.weight)  # noqa: F821 - bound by __init__
        return use_gate_up(h, self.w_gate, self.w_up)  # noqa: F821


def test_the_hub_layers_infer_shapes_on_the_meta_device(built):
    """A model kernelized then moved to meta, or built on meta (as accelerate's
    init_empty_weights does) then kernelized, runs its forward for the shapes, as
    transformers' own layers do (the layers asked autocast about the meta device)."""
    transformers = pytest.importorskip("transformers")
    kernels = pytest.importorskip("kernels")
    _, hub = built
    mapping = {
        name: {
            device: kernels.LocalLayerRepository(repo_path=hub, layer_name=name)
            for device in ("cpu", "cuda")
        }
        for name in ("RMSNorm", "SiLU")
    }
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=1, vocab_size=96, rms_norm_eps=1e-6,
    )  # fmt: skip
    with torch.device("meta"):
        on_meta = transformers.LlamaForCausalLM(config)
    moved = transformers.LlamaForCausalLM(config)
    for model in (on_meta, moved):
        with kernels.use_kernel_mapping(mapping):
            kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device=DEVICE)
    moved.to("meta")
    ids = torch.randint(0, 96, (2, 5), device="meta")
    for model in (on_meta, moved):
        layer = model.model.layers[0]
        assert type(layer.input_layernorm.forward.__self__) is type(layer.input_layernorm)
        assert layer.input_layernorm.forward.__func__.__module__.endswith(".layers")
        logits = model(input_ids=ids).logits
        assert logits.device.type == "meta" and logits.shape == (2, 5, 96)


def test_fx_symbolic_trace_is_refused_with_the_way_to_keep_the_call(built):
    modules, _ = built
    block = Block(modules)
    with pytest.raises(
        TypeError, match=r"use_rmsnorm: torch\.fx\.symbolic_trace .*torch\.fx\.wrap"
    ):
        torch.fx.symbolic_trace(block)
    # What the message says works: the launchers stay one node each.
    launchers = (modules["use_rmsnorm"].use_rmsnorm, modules["use_gate_up"].use_gate_up)
    graph = torch.fx.Tracer(autowrap_functions=launchers).trace(block)
    traced = torch.fx.GraphModule(block, graph)
    x = torch.randn(3, 64, device=DEVICE)
    with torch.no_grad():
        assert torch.equal(traced(x), block(x))
    assert sum(n.op == "call_function" for n in graph.nodes) == 2


@pytest.mark.parametrize("transform", ["vmap", "grad", "jvp"])
def test_torch_func_transforms_are_refused_naming_the_launcher(built, transform):
    """Each failed inside the runtime before ('Cannot access data pointer of Tensor that
    doesn't have storage', or torch's setup_context message naming no op)."""
    modules, _ = built
    norm = modules["use_rmsnorm"].use_rmsnorm
    gate_up = modules["use_gate_up"].use_gate_up
    x, weight = torch.randn(3, 64, device=DEVICE), torch.randn(64, device=DEVICE)
    w = torch.randn(128, 64, device=DEVICE)
    calls = {
        "vmap": lambda: torch.func.vmap(lambda a: norm(a, weight))(x[None].expand(2, 3, 64)),
        "grad": lambda: torch.func.grad(lambda a: gate_up(a, w, w).sum())(x),
        "jvp": lambda: torch.func.jvp(lambda a: norm(a, weight), (x,), (x,)),
    }
    name = "use_rmsnorm" if transform != "grad" else "use_gate_up"
    with pytest.raises(TypeError, match=rf"{name}: torch\.func transforms .*reference\(\.\.\.\)"):
        calls[transform]()
    # The module's reference is what runs under them.
    reference = modules["use_rmsnorm"].reference
    batched = torch.func.vmap(lambda a: reference(a, weight))(x[None].expand(2, 3, 64))
    assert torch.allclose(batched[1], norm(x, weight), atol=1e-5)


def test_a_deepcopy_of_a_model_patched_as_the_docs_show_runs_on_its_own_weights(built):
    """docs/integration.md's use_kernels, on a tiny LLaMA with launchers of its dims: a
    copy's patched MLP and norms read the copy's weights (lambdas over the module, as the
    docs had them, kept reading the original's)."""
    transformers = pytest.importorskip("transformers")
    modules, _ = built
    text = (Path(__file__).resolve().parents[1] / "docs" / "integration.md").read_text()
    code = "def fused_mlp" + text.split("def fused_mlp", 1)[1].split("\nuse_kernels(model)", 1)[0]
    namespace = {
        "types": types,
        "llama_mlp_gate_up": modules["use_gate_up"].use_gate_up,
        "llama_rmsnorm": modules["use_rmsnorm"].use_rmsnorm,
    }
    exec(code, namespace)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=1, vocab_size=96, rms_norm_eps=1e-6,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).to(DEVICE)
    namespace["use_kernels"](model)
    copied = copy.deepcopy(model)
    mlp, norm = copied.model.layers[0].mlp, copied.model.norm
    with torch.no_grad():
        mlp.gate_proj.weight.mul_(-1)
        norm.weight.add_(1.0)
        x = torch.randn(3, 64, device=DEVICE)
        act = torch.nn.functional.silu
        want = mlp.down_proj(act(mlp.gate_proj(x)) * mlp.up_proj(x))
        assert torch.allclose(mlp(x), want, atol=1e-4)
        want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
        assert torch.allclose(norm(x), want, atol=1e-4)
        original = model.model.layers[0].mlp
        assert not torch.allclose(original(x), mlp(x), atol=1e-4)


def test_a_launcher_on_the_meta_device_gives_the_shapes_quietly(built, caplog):
    """A model built on meta runs its launchers for their outputs' shapes, with no warning
    of a reference run and no refusal under `fallback: {no_gpu: error}` (which said the
    kernel needs CUDA tensors)."""
    modules, _ = built
    x = torch.randn(3, 128, device="meta")
    with caplog.at_level(logging.WARNING):
        for name in ("use_silu", "use_strict_silu"):
            y = getattr(modules[name], name)(x)
            assert y.device.type == "meta" and y.shape == (3, 128)
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_attention_refuses_fx_and_torch_func_naming_the_launcher(built):
    """Attention failed inside torch (fx: a TraceError on control flow; vmap: the
    interpreter's storage access; grad: autograd's setup_context message)."""
    attention = built[0]["use_attention"].use_attention
    q = torch.randn(2, 5, 4, 16, device=DEVICE)
    k, v = (torch.randn(2, 5, 2, 16, device=DEVICE) for _ in "kv")

    class Layer(torch.nn.Module):
        def forward(self, q, k, v):
            return attention(q, k, v)

    with pytest.raises(TypeError, match=r"use_attention: torch\.fx\.symbolic_trace"):
        torch.fx.symbolic_trace(Layer())
    with pytest.raises(TypeError, match=r"use_attention: torch\.func transforms"):
        torch.func.vmap(lambda a: attention(a, k, v))(q[None].expand(2, *q.shape))
    with pytest.raises(TypeError, match=r"use_attention: torch\.func transforms"):
        torch.func.grad(lambda a: attention(a, k, v).sum())(q)


def test_a_float64_call_names_the_launcher_and_what_checks_in_float64(built):
    """gradcheck's float64 got 'x is torch.float64; this kernel takes ...', naming neither
    the launcher (one of many in a model) nor what runs in float64."""
    norm = built[0]["use_rmsnorm"].use_rmsnorm
    x, weight = torch.randn(3, 64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^use_rmsnorm: x is torch\.float64.*reference\(\.\.\.\)"):
        norm(x, weight)


def test_forward_mode_ad_is_refused_naming_the_launcher(built):
    """A dual tensor's tangent was dropped: the output had none, a jvp silently wrong."""
    import torch.autograd.forward_ad as fwAD

    modules = built[0]
    norm, attention = modules["use_rmsnorm"].use_rmsnorm, modules["use_attention"].use_attention
    x, weight = torch.randn(3, 64, device=DEVICE), torch.randn(64, device=DEVICE)
    q = torch.randn(2, 5, 4, 16, device=DEVICE)
    k, v = (torch.randn(2, 5, 2, 16, device=DEVICE) for _ in "kv")
    with fwAD.dual_level():
        norm(x, weight)  # no tangent anywhere: runs
        with pytest.raises(NotImplementedError, match=r"^use_rmsnorm: forward-mode AD"):
            norm(fwAD.make_dual(x, torch.ones_like(x)), weight)
        with pytest.raises(NotImplementedError, match=r"^use_attention: forward-mode AD"):
            attention(q, fwAD.make_dual(k, torch.ones_like(k)), v)
