"""`fusegen build --kernels-hub NAME` (fusegen/codegen/hub_text.py): the output folder is a
local repository that the real `kernels` package loads, and kernelize() swaps its layers
into a tiny transformers LLaMA (RMSNorm, the MLP's SiLU) in inference, training and
torch.compile modes, with the outputs and gradients of the model as transformers runs it.
fp32 on the Triton interpreter (or a GPU)."""

import copy
import json
from pathlib import Path

import pytest

from conftest import integration_snippet
from fusegen.cli import main

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
transformers = pytest.importorskip("transformers")
kernels = pytest.importorskip("kernels")

SPEC = """\
version: 1
kernels:
  - name: hub_rmsnorm
    dims: {M: dynamic, N: 64}
    dtypes: [fp32]
    inputs: {x: [M, N], weight: [N]}
    chain:
      - input: x
      - rmsnorm: {weight: weight, eps: 1.0e-6}
  - name: hub_silu
    dims: {M: dynamic, N: 128}
    dtypes: [fp32]
    inputs: {x: [M, N]}
    chain:
      - input: x
      - silu
  - name: hub_gelu_bias
    dims: {M: dynamic, N: 128}
    dtypes: [fp32]
    inputs: {x: [M, N], b: [N]}
    chain:
      - input: x
      - bias: b
      - gelu_tanh
"""
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def hubs(tmp_path_factory):
    """Two repositories of the same spec under two names, each loaded by `kernels`."""
    root = tmp_path_factory.mktemp("hub")
    (root / "spec.yaml").write_text(SPEC)
    out = {}
    for name in ("tiny-kernels", "tiny-kernels-two"):
        assert (
            main(
                ["build", str(root / "spec.yaml"), "--out", str(root / name), "--kernels-hub", name]
            )
            == 0
        )
        out[name] = root / name
    return out


def test_the_layout_is_a_kernels_local_repository(hubs):
    repo = hubs["tiny-kernels"]
    variant = repo / "build" / "torch-universal"
    meta = json.loads((variant / "metadata.json").read_text())
    assert meta["name"] == "tiny-kernels" and meta["id"].startswith("_fusegen_tiny_kernels_")
    package = variant / "tiny_kernels"
    names = sorted(p.name for p in package.iterdir())
    assert "layers.py" in names and "hub_rmsnorm.py" in names
    assert not [n for n in names if n.startswith("test_")]  # the tests stay out
    loaded = kernels.get_local_kernel(repo)
    assert loaded.__name__ == meta["id"]
    layers = loaded.layers
    assert [n for n in ("RMSNorm", "SiLU", "GeluTanh") if hasattr(layers, n)] == ["RMSNorm", "SiLU"]
    # the chain with a bias is no layer's: it stays a launcher of the package
    assert callable(loaded.hub_gelu_bias)


def test_two_builds_load_side_by_side(hubs):
    one, two = (kernels.get_local_kernel(hubs[n]) for n in ("tiny-kernels", "tiny-kernels-two"))
    assert one.__name__ != two.__name__ and one.layers.RMSNorm is not two.layers.RMSNorm
    x, w = torch.randn(3, 64, device=DEVICE), torch.randn(64, device=DEVICE)
    assert torch.equal(one.hub_rmsnorm(x, w), two.hub_rmsnorm(x, w))


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, vocab_size=96, rms_norm_eps=1e-6,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).to(DEVICE)
    with torch.no_grad():  # not all ones, so that a dropped weight shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def counting(package):
    """Count the calls of the package's kernels through its layers."""
    calls = {"RMSNorm": 0, "SiLU": 0}
    layers = package.layers
    for key, (launch, dtypes) in list(layers._RMS_NORMS.items()):
        layers._RMS_NORMS[key] = (_counted(launch, calls, "RMSNorm"), dtypes)
    for key, (launch, dtypes) in list(layers._SILU.items()):
        layers._SILU[key] = (_counted(launch, calls, "SiLU"), dtypes)
    return calls


def _counted(launch, calls, name):
    def run(*args):
        calls[name] += 1
        return launch(*args)

    return run


MODES = {
    "inference": "INFERENCE",
    "training": "TRAINING",
    "training+compile": "TRAINING | TORCH_COMPILE",
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_kernelize_swaps_the_layers_in(hubs, mode):
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping

    package = kernels.get_local_kernel(hubs["tiny-kernels"])
    calls = counting(package)
    flags = Mode.INFERENCE if mode == "inference" else Mode.TRAINING
    if "compile" in mode:
        flags = flags | Mode.TORCH_COMPILE
    mapping = {
        name: {
            DEVICE: {flags: LocalLayerRepository(repo_path=hubs["tiny-kernels"], layer_name=name)}
        }
        for name in ("RMSNorm", "SiLU")
    }
    plain = tiny_llama()
    model = copy.deepcopy(plain)
    _mark_layers()
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, mode=flags, device=DEVICE)
    ids = torch.randint(0, 96, (2, 9), device=DEVICE)
    run = torch.compile(model, backend="aot_eager", fullgraph=True) if "compile" in mode else model
    if mode == "inference":
        with torch.no_grad():
            got, want = run(input_ids=ids).logits, plain(input_ids=ids).logits
        assert (got - want).abs().max() < 1e-5
    else:
        losses = [m(input_ids=ids, labels=ids).loss for m in (run, plain)]
        for loss in losses:
            loss.backward()
        assert abs(losses[0].item() - losses[1].item()) < 1e-5
        for (name, g), p in zip(model.named_parameters(), plain.parameters(), strict=True):
            assert (g.grad - p.grad).abs().max() <= 1e-5 * max(1.0, p.grad.abs().max()), name
    assert calls == {"RMSNorm": 5, "SiLU": 2}  # 2 norms a layer and the final; 1 MLP a layer


def _mark_layers():
    """transformers marks LlamaRMSNorm and SiLUActivation for the hub only where its
    kernels range takes the installed kernels (5.20: 0.17); else mark them as it would."""
    from transformers.activations import SiLUActivation
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    for layer, name in ((LlamaRMSNorm, "RMSNorm"), (SiLUActivation, "SiLU")):
        if getattr(layer, "kernel_layer_name", None) is None:
            kernels.replace_kernel_forward_from_hub(layer, name)


def test_the_norm_layer_runs_under_autocast(hubs):
    """Mixed precision (fp32 weights, bf16 activations under torch.autocast): the layer
    runs the kernel, in fp32, returning fp32 as transformers' LlamaRMSNorm does (it fell
    back to the layer's math whenever the dtypes differed)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    package = kernels.get_local_kernel(hubs["tiny-kernels"])
    calls = counting(package)
    plain = LlamaRMSNorm(64, eps=1e-6).to(DEVICE)
    with torch.no_grad():
        plain.weight.add_(0.1 * torch.randn_like(plain.weight))
    x = torch.randn(3, 64, device=DEVICE).to(torch.bfloat16)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        got, want = package.layers._rms_norm(plain, x), plain(x)
    assert calls["RMSNorm"] == 1 and got.dtype == want.dtype == torch.float32
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()  # theirs rounds h to bf16
    package.layers._rms_norm(plain, x)  # outside autocast: the layer's math
    assert calls["RMSNorm"] == 1


def test_a_bad_hub_name_is_refused_and_nothing_written(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    assert main(["build", str(spec), "--out", str(tmp_path / "out"), "--kernels-hub", "Tiny_"]) == 2
    assert "lower-case letters, digits and hyphens" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_check_sees_a_hub_build_up_to_date(hubs, capsys):
    spec = Path(hubs["tiny-kernels"]).parent / "spec.yaml"
    args = ["build", str(spec), "--out", str(hubs["tiny-kernels"]), "--kernels-hub", "tiny-kernels"]
    assert main([*args, "--check"]) == 0
    layers = hubs["tiny-kernels"] / "build" / "torch-universal" / "tiny_kernels" / "layers.py"
    text = layers.read_text()
    layers.write_text(text + "\n# edited\n")
    try:
        assert main([*args, "--check"]) == 1
    finally:
        layers.write_text(text)


def test_the_docs_snippets_run(hubs, tmp_path):
    """docs/integration.md's kernelize snippet, then its FSDP2 one (each layer compiled),
    on a tiny LLaMA: the repository this test built for the docs' folder, this machine's
    device, torch.compile on aot_eager (no C++ compiler needed), FSDP2 over one process."""
    import torch.distributed as dist

    plain = tiny_llama()
    model = copy.deepcopy(plain)
    _mark_layers()
    calls = counting(kernels.get_local_kernel(hubs["tiny-kernels"]))
    snippet = integration_snippet("from pathlib import Path\n\nfrom kernels import")
    snippet += integration_snippet("from torch.distributed.fsdp import fully_shard")
    snippet = snippet.replace('Path("llama-kernels")', f'Path("{hubs["tiny-kernels"]}")')
    snippet = snippet.replace('"cuda"', f'"{DEVICE}"')
    snippet = snippet.replace("layer.compile()", 'layer.compile(backend="aot_eager")')
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group(
        "nccl" if DEVICE == "cuda" else "gloo", store=store, rank=0, world_size=1
    )
    try:
        scope = {"model": model, "torch": torch}
        exec(compile(snippet, "docs/integration.md", "exec"), scope)
        ids = torch.randint(0, 96, (2, 9), device=DEVICE)
        loss = scope["model"](input_ids=ids, labels=ids).loss
        loss.backward()
        want = plain(input_ids=ids, labels=ids).loss
        want.backward()
        assert abs(loss.item() - want.item()) < 1e-5
        for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            assert (g - q.grad).abs().max() <= 1e-5 * max(1.0, q.grad.abs().max()), name
        assert calls["RMSNorm"] == 5  # traced once: the layers' two and the final norm's
    finally:
        dist.destroy_process_group()
