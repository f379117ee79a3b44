"""A generated attention module as transformers' attention implementation
(fusegen/runtime/transformers_attention.py, each module's `use_in_transformers`): tiny
LLaMA, Qwen2 and Mistral models, fp32 on the Triton interpreter (or a GPU), against the
same weights under SDPA. Padded batches (left and right), generate with a dynamic and a
static cache, a compiled static-cache decode, training gradients, and the refusals."""

import copy
import importlib.util
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.masking_utils")

from conftest import integration_snippet  # noqa: E402
from fusegen.cli import main  # noqa: E402
from fusegen.runtime import transformers_attention as hf  # noqa: E402

SPECS = """\
version: 1
kernels:
  - name: tx_llama_attention
    doc: A tiny LLaMA's and Qwen2's attention (4 query heads, 2 kv heads, head dim 16).
    dtypes: [fp32]
    attention: {layout: bshd, heads: 4, kv_heads: 2, head_dim: 16, causal: true}
  - name: tx_window_attention
    doc: A tiny Mistral's (a window of 3 keys), in the other layout.
    dtypes: [fp32]
    attention: {layout: bhsd, heads: 4, kv_heads: 2, head_dim: 16, causal: true, window: 3}
  - name: tx_gemma_global
    doc: A tiny Gemma 2's global layers (softcapped scores, scale 1/sqrt(8)).
    dtypes: [fp32]
    attention:
      {layout: bshd, heads: 4, kv_heads: 2, head_dim: 16, causal: true, softcap: 50.0,
       scale: 0.35355339059327373}
  - name: tx_gemma_local
    doc: Its sliding layers (a window of 3 keys).
    dtypes: [fp32]
    attention:
      {layout: bshd, heads: 4, kv_heads: 2, head_dim: 16, causal: true, softcap: 50.0,
       scale: 0.35355339059327373, window: 3}
"""
SIZES = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    num_hidden_layers=2, vocab_size=128, head_dim=16,
)  # fmt: skip
MODELS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", "tx_llama_attention", {}),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", "tx_llama_attention", {}),
    "mistral": (
        "MistralForCausalLM",
        "MistralConfig",
        "tx_window_attention",
        {"sliding_window": 3},
    ),
}


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("transformers_attention")
    (root / "specs.yaml").write_text(SPECS)
    assert main(["build", str(root / "specs.yaml"), "--out", str(root / "gen")]) == 0
    modules = {}
    for name in ("tx_llama_attention", "tx_window_attention", "tx_gemma_global", "tx_gemma_local"):
        spec = importlib.util.spec_from_file_location(name, root / "gen" / f"{name}.py")
        modules[name] = importlib.util.module_from_spec(spec)
        sys.modules[name] = modules[name]
        spec.loader.exec_module(modules[name])
    yield modules
    for name in modules:
        sys.modules.pop(name, None)


def pair(built, model, seed=0, **sizes):
    """(sdpa, fusegen): MODELS[model] with the same random weights, each with its own
    config, the second through its attention module's use_in_transformers."""
    model_class, config_class, module, model_sizes = MODELS[model]
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**{**SIZES, **model_sizes, **sizes})
    config._attn_implementation = "sdpa"
    sdpa = getattr(transformers, model_class)(copy.deepcopy(config)).to(DEVICE).eval()
    fused = getattr(transformers, model_class)(copy.deepcopy(config)).to(DEVICE).eval()
    fused.load_state_dict(sdpa.state_dict())
    fused.set_attn_implementation(built[module].use_in_transformers())
    return sdpa, fused


def padded_batch(left):
    """Three sequences of up to 7 tokens, padded on the left (generate's) or the right
    (training's): one unpadded, one by 1, one by 3."""
    ids = torch.randint(1, 128, (3, 7), device=DEVICE)
    mask = torch.ones(3, 7, dtype=torch.long, device=DEVICE)
    for row, pads in ((1, 1), (2, 3)):
        mask[row, :pads] = 0 if left else 1
        if not left:
            mask[row, 7 - pads :] = 0
    return ids, mask


def generated(model, ids, mask, cache, tokens=5):
    """Greedy tokens, eagerly (on a GPU, generate would compile a static cache's decode:
    test_compiled_static_cache_decode_traces_once compiles it itself)."""
    return model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False,
        cache_implementation=cache, pad_token_id=0, disable_compile=True,
    )  # fmt: skip


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_left_padded_generate_gives_sdpas_tokens(built, model, cache):
    sdpa, fused = pair(built, model)
    module = MODELS[model][2]
    ids, mask = padded_batch(left=True)
    calls = count_calls(built[module])
    want = generated(sdpa, ids, mask, cache)
    assert torch.equal(generated(fused, ids, mask, cache), want)
    assert len(calls) == 2 * 5  # two layers, a prefill and four decode steps: all ours


def count_calls(module):
    calls = []
    runtime = module._ATTENTION
    forward = runtime.forward
    runtime.forward = lambda *args, **kw: (calls.append(1), forward(*args, **kw))[1]
    return calls


@pytest.mark.parametrize("left", [True, False], ids=["left", "right"])
def test_padded_logits_and_gradients_match_sdpa(built, left):
    sdpa, fused = pair(built, "llama")
    trains_alike(sdpa, fused, left)


def trains_alike(theirs, ours, left):
    """A padded batch's training step: the real tokens' logits and every parameter's
    gradient of `ours` as `theirs`'s (the same weights)."""
    ids, mask = padded_batch(left)
    labels = ids.masked_fill(mask == 0, -100)
    grads = []
    for model in (theirs, ours):
        model.train()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        grads.append((out.logits[mask.bool()], [p.grad for p in model.parameters()]))
    (want, want_grads), (got, got_grads) = grads
    assert (got - want).abs().max() < 1e-5
    for g, w in zip(got_grads, want_grads, strict=True):
        assert (g - w).abs().max() <= 1e-5 * max(1.0, w.abs().max())


def test_compiled_static_cache_decode_traces_once(built):
    """The forward compiled as generate compiles it for a static cache (fullgraph, static
    shapes): the same tokens, one graph for the prefill and one for every decode step
    (the cache's offset is a tensor: no recompile per position)."""
    import torch._dynamo.testing

    sdpa, fused = pair(built, "llama")
    ids, mask = padded_batch(left=True)
    want = generated(sdpa, ids, mask, "static")
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fused.forward = torch.compile(fused.forward, fullgraph=True, backend=counter, dynamic=False)
    try:
        assert torch.equal(generated(fused, ids, mask, "static"), want)
    finally:
        torch._dynamo.reset()
    assert counter.frame_count == 2


def test_a_mask_ranges_cannot_say_is_refused(built):
    sdpa, fused = pair(built, "llama")
    ids, mask = padded_batch(left=True)
    mask[0, 3] = 0
    with pytest.raises(ValueError, match="row 0 has a hole.*attn_implementation=.sdpa."):
        fused(input_ids=ids, attention_mask=mask)
    packed = torch.tensor([[0, 1, 2, 0, 1, 2, 3]], device=DEVICE)  # two sequences in a row
    with pytest.raises(ValueError, match="asked for a packed sequences mask"):
        fused(input_ids=ids[:1], position_ids=packed, use_cache=False)
    four_d = torch.ones(3, 1, 7, 7, dtype=torch.bool, device=DEVICE)
    with pytest.raises(ValueError, match="not the key ranges.*2D attention_mask"):
        fused(input_ids=ids, attention_mask=four_d)


def test_a_layer_the_spec_does_not_describe_is_refused(built):
    _, fused = pair(built, "mistral", sliding_window=5)  # the spec's window is 3
    ids, _ = padded_batch(left=True)
    with pytest.raises(ValueError, match="sliding window is 5, the spec's 3"):
        fused(input_ids=ids)
    _, fused = pair(built, "llama")
    for layer in fused.model.layers:
        layer.self_attn.scaling = 0.5
    with pytest.raises(ValueError, match="scaling is 0.5"):
        fused(input_ids=ids)
    _, fused = pair(built, "llama", attention_dropout=0.1)
    with pytest.raises(ValueError, match="dropout"):
        fused.train()(input_ids=ids)


def test_a_model_of_two_layer_kinds_runs_two_modules(built):
    """Gemma 2 alternates sliding and global layers under one attention implementation:
    use_in_transformers(also=[...]) serves both, each layer's call running the module of
    its window; left-padded generate and padded training against eager attention (SDPA
    has no softcap)."""
    sizes = dict(SIZES, sliding_window=3, query_pre_attn_scalar=8, attn_logit_softcapping=50.0)
    torch.manual_seed(0)
    config = transformers.Gemma2Config(**sizes)
    config._attn_implementation = "eager"
    eager = transformers.Gemma2ForCausalLM(copy.deepcopy(config)).to(DEVICE).eval()
    fused = transformers.Gemma2ForCausalLM(copy.deepcopy(config)).to(DEVICE).eval()
    fused.load_state_dict(eager.state_dict())
    assert config.layer_types == ["sliding_attention", "full_attention"]
    with pytest.raises(ValueError, match="sliding window is 3, the spec's None"):
        fused.set_attn_implementation(built["tx_gemma_global"].use_in_transformers())
        fused(input_ids=torch.ones(1, 4, dtype=torch.long, device=DEVICE))
    use = built["tx_gemma_global"].use_in_transformers
    fused.set_attn_implementation(use("tx_gemma", also=[built["tx_gemma_local"]]))
    calls = {n: count_calls(built[n]) for n in ("tx_gemma_global", "tx_gemma_local")}
    ids, mask = padded_batch(left=True)
    want = generated(eager, ids, mask, "dynamic")
    assert torch.equal(generated(fused, ids, mask, "dynamic"), want)
    assert len(calls["tx_gemma_global"]) == len(calls["tx_gemma_local"]) == 5
    trains_alike(eager, fused, left=False)
    with pytest.raises(TypeError, match="also= takes generated attention modules"):
        use("tx_gemma", also=[transformers])


def test_key_ranges_of_transformers_offsets():
    """The ranges for each way transformers sizes a mask: queries at the keys' end (no
    ranges without a padding mask), a static cache's decode (the end clamped to the
    query's position, a tensor offset) and prefill (the keys cut, as a view's shape),
    a sliding-window cache's offset into the 2D mask."""
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert hf.key_ranges(None, 2, 3, 3, 0, 0) is None
    ranges = hf.key_ranges(mask, 2, 5, 5, 0, 0)
    assert ranges.shape == (2, 1, 1, 2) and ranges.dtype == torch.int32
    assert ranges[:, 0, 0].tolist() == [[2, 5], [0, 4]]
    decode = hf.key_ranges(mask[:, :4], 2, 1, 8, torch.tensor(3), 0)  # cache of 8, 4th token
    assert decode[:, 0, 0].tolist() == [[2, 4], [0, 4]]
    no_mask = hf.key_ranges(None, 2, 1, 8, torch.tensor(3), 0)
    assert no_mask[:, 0, 0].tolist() == [[0, 4], [0, 4]]
    prefill = hf.key_ranges(mask, 2, 5, 8, 0, 0)
    assert prefill.shape == (2, 1, 5, 2) and prefill.stride(2) == 0
    assert prefill[:, 0, 0].tolist() == [[2, 5], [0, 4]]
    unmasked_prefill = hf.key_ranges(None, 2, 5, 8, 0, 0, device="cpu")
    assert unmasked_prefill.shape == (2, 1, 5, 2)  # the cut; the end clamps to it
    window = hf.key_ranges(mask, 2, 1, 3, 4, 2)  # keys 2..4 of a 5-token mask
    assert window[:, 0, 0].tolist() == [[0, 3], [0, 2]]


def test_the_integration_docs_snippet_runs(built, monkeypatch):
    """docs/integration.md's use_in_transformers snippet, as written, on a tiny LLaMA
    (the module it imports standing in for llama3_attention)."""
    snippet = integration_snippet("from llama3_attention import use_in_transformers")
    monkeypatch.setitem(sys.modules, "llama3_attention", built["tx_llama_attention"])
    sdpa, model = pair(built, "llama")
    ids, mask = padded_batch(left=True)

    def tokenizer(prompts, padding, padding_side, return_tensors):
        assert (padding, padding_side, return_tensors) == (True, "left", "pt")
        return transformers.BatchEncoding({"input_ids": ids.cpu(), "attention_mask": mask.cpu()})

    scope = {"model": model, "tokenizer": tokenizer, "prompts": ["a", "b", "c"], "device": DEVICE}
    scope["labels"] = ids.masked_fill(mask == 0, -100)
    exec(compile(snippet, "docs/integration.md", "exec"), scope)
    assert model.config._attn_implementation == "tx_llama_attention"
    want = generated(sdpa, ids, mask, "static", tokens=8)
    assert torch.equal(scope["tokens"], want)
    assert all(p.grad is not None for p in model.parameters())


def test_compiled_forward_without_cache(built):
    """A compiled forward with no cache and no mask, as a training step or llama_decode.py
    compiles it: transformers, unable to rule packed sequences out while traced, hands the
    mask function an and-mask of the causal mask and its packed-sequence one (a closure
    that cannot be read while traced)."""
    sdpa, fused = pair(built, "llama")
    ids, _ = padded_batch(left=True)
    want = sdpa(input_ids=ids, use_cache=False).logits
    run = torch.compile(fused, fullgraph=True, backend="aot_eager")
    try:
        got = run(input_ids=ids, use_cache=False).logits
    finally:
        torch._dynamo.reset()
    assert (got - want).abs().max() < 1e-5
