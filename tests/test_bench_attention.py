"""`fusegen bench` of attention kernels without a GPU: the variants compute the spec's
attention (the masks, softcap, ALiBi and bias as SDPA and FlexAttention are given them),
the work counted, the report, the command line's checks."""

import pytest
import torch

from fusegen import build, tables
from fusegen.tools import bench, bench_attention, report
from fusegen.cli import main

SPECS = """
kernels:
  - name: att_causal_gqa_alibi
    dtypes: [fp32]
    attention: {layout: bshd, heads: 4, kv_heads: 2, head_dim: 32, causal: true, alibi: true}
  - name: att_window_softcap_bias
    dtypes: [fp32]
    attention:
      layout: bhsd
      heads: 2
      head_dim: 16
      causal: true
      window: 5
      softcap: 20.0
      bias: true
  - name: att_mla
    dtypes: [fp32]
    attention: {layout: bshd, heads: 2, kv_heads: 1, head_dim: 32, v_head_dim: 16, causal: true}
"""


@pytest.fixture
def kernels(write_spec):
    return {k.name: k for k in build.load([write_spec(SPECS)]).kernels}


@pytest.mark.parametrize("shape", [(1, 9, 9), (2, 3, 11), (1, 12, 7)])
def test_seen_pairs_count_the_masks(kernels, shape):
    _, sq, skv = shape
    for att in kernels.values():
        rows = torch.arange(sq)[:, None] + (skv - sq)
        keys = torch.arange(skv)[None, :]
        keep = keys <= rows
        if att.window:
            keep &= keys > rows - att.window
        assert bench_attention.seen_pairs(att, sq, skv) == int(keep.sum())
    att = kernels["att_causal_gqa_alibi"]
    flops, moved = bench_attention.work(att, 2, 3, 11, 2)
    assert flops == 4 * 2 * 4 * bench_attention.seen_pairs(att, 3, 11) * 32
    assert moved == (2 * 4 * 3 + 2 * 2 * 11) * 2 * 32 * 2
    mla = kernels["att_mla"]  # q.k over 32 dims, p.v over 16
    flops, moved = bench_attention.work(mla, 2, 3, 11, 2)
    assert flops == 2 * 2 * 2 * bench_attention.seen_pairs(mla, 3, 11) * (32 + 16)
    assert moved == (2 * 3 * (32 + 16) + 1 * 11 * (32 + 16)) * 2 * 2


def test_sdpa_and_flex_compute_the_spec_s_attention(kernels, tmp_path):
    # SDPA (on its math backend, the one a CPU has) and FlexAttention (uncompiled) with
    # the masks, ALiBi and bias as bench gives them: the module's float64 reference.
    for att in kernels.values():
        module = bench.load_module(att, tmp_path)
        for batch, sq, skv in [(2, 6, 13), (1, 13, 13)]:
            inputs = bench_attention.make_inputs(
                torch, att, batch, sq, skv, torch.float64, "cpu", seed=sq
            )
            want = module.reference(*inputs)
            calls = [bench_attention.flex_variant(torch, module, att, sq, skv, "cpu", False)]
            sdpa = bench_attention.sdpa_variant(torch, module, att, "math", sq, skv, "cpu")
            if att.softcap:
                assert sdpa == "SDPA has no softcap"
            else:
                calls.append(sdpa)
            for call in calls:
                torch.testing.assert_close(call(*inputs), want, rtol=1e-7, atol=1e-7)


def test_bench_attention_with_a_fake_timer(kernels, tmp_path, monkeypatch):
    timings = iter(range(1, 1000))

    def fake_timer(fn):
        fn()
        return 0.1 * next(timings)  # fusegen first, so it is the fastest

    # A tuned table in tables_dir travels with the module bench imports (as for chains).
    entry = {
        "gpu": "Fake GPU", "capability": [9, 0], "kernel_hash": None,
        "key": {"kernel": "q", "dtype": "float32", "q_bucket": 8, "k_bucket": 32},
        "best": "tuned", "choices": {"tuned": {"config": [16, 16, 4, 1], "ms": 0.1}},
    }  # fmt: skip
    modules = {}

    def load_module(att, folder, tables_dir):
        module = bench.load_module(att, folder, tables_dir)
        if att.name == "att_causal_gqa_alibi":
            entry["kernel_hash"] = module.KERNEL_HASH
            path = tables.path_for(tables_dir, att.name)
            path.write_text(tables.render(att.name, "spec.yaml", [entry]))
            module = bench.load_module(att, folder, tables_dir)
        # Read now: a CPU call never looks the table up, and the folder goes with the run.
        modules[att.name] = module._ATTENTION.tuned_entries()
        return module

    monkeypatch.setattr(bench_attention, "load_module", load_module)
    lines = []
    ceilings, results = bench_attention.run(
        list(kernels.values()),
        [(2, 5, 17)],
        "fp32",
        ["fusegen", "eager", "sdpa flash"],
        fake_timer,
        lines.append,
        ceilings=bench.Ceilings(tflops=700.0, gbs=4000.0),
        device="cpu",
        tables_dir=tmp_path,
    )
    gpu = ("Fake GPU", (9, 0))
    assert modules["att_causal_gqa_alibi"] == {gpu: {("q", "float32", 8, 32): (16, 16, 4, 1)}}
    assert modules["att_window_softcap_bias"] == {}
    by = {(r.kernel, r.variant): r for r in results}
    assert set(by) == {(k, v) for k in kernels for v in ("fusegen", "eager", "sdpa flash")}
    for name in kernels:
        fused, eager = by[(name, "fusegen")], by[(name, "eager")]
        assert fused.ok and eager.ok and fused.error < 1e-5, (fused, eager)
        assert fused.speedup == pytest.approx(eager.ms / fused.ms)
        assert fused.shape == (2, 5, 17) and fused.rate > 0
    # The CPU's flash backend has no kernel for a v head dim of its own (as a GPU's for a
    # GQA decode call): not applicable, as the softcap is, and not counted as failing.
    no_kernel = by[("att_causal_gqa_alibi", "sdpa flash")]
    assert no_kernel.ok and no_kernel.ms is None
    assert no_kernel.note == bench_attention.NO_KERNEL
    assert by[("att_window_softcap_bias", "sdpa flash")].note == "SDPA has no softcap"
    assert "n/a" in report.table([no_kernel]) and "FAIL" not in report.table(results)
    assert any("att_causal_gqa_alibi 2x5x17 fp32: fusegen" in line for line in lines)
    assert "att_window_softcap_bias" in report.table(results)


def test_variant_names_follow_compare():
    assert bench_attention.variant_names(["eager"]) == ["fusegen", "eager"]
    names = bench_attention.variant_names(["sdpa", "flex", "compile"])
    assert names == ["fusegen", "sdpa flash", "sdpa cudnn", "sdpa efficient", "flex (compiled)"]


def test_bench_rejects_attention_shapes_that_are_not_three_numbers(write_spec, capsys):
    spec = write_spec(SPECS)
    assert main(["bench", str(spec), "--attention-shapes", "1,2"]) == 2
    err = capsys.readouterr().err
    assert "--attention-shapes takes BATCH,Q_LEN,K_LEN" in err and "1,2" in err
    assert main(["bench", str(spec), "--compare", "sdpa,nope"]) == 2
    assert "no variant named nope" in capsys.readouterr().err


def test_inspect_attention_runs_every_kernel(kernels, tmp_path):
    # One forward and backward through the module: a row per kernel launched (the
    # interpreter compiles nothing, so the metadata are None here).
    from fusegen.tools import inspect_kernels

    def load(att, out_dir):
        return bench.load_module(att, tmp_path)

    lines = []
    found = inspect_kernels.run_attention(
        [kernels["att_causal_gqa_alibi"]], [(1, 5, 40)], "fp32", tmp_path, lines.append,
        device="cpu", load=load,
    )  # fmt: skip
    names = [item.kernel for item in found]
    assert names == [f"att_causal_gqa_alibi {k}" for k in ("forward", "backward_kv", "backward_q")]
    assert all(item.shape == (1, 5, 40) and item.source == "interpreter" for item in found)
    assert found[0].config == {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}
    assert "att_causal_gqa_alibi 1x5x40 fp32" in lines[0]


def test_inspect_names_the_hopper_forward_s_one_config(kernels, tmp_path):
    # On an H100/H200 a plain attention's forward is the runtime's Gluon kernel, kept in
    # last_compiled as "hopper_forward": its config is the kernel's own, not a table's.
    from fusegen.runtime import attention_hopper
    from fusegen.tools import inspect_kernels

    module = bench.load_module(kernels["att_causal_gqa_alibi"], tmp_path)
    source, config = inspect_kernels.attention_config(
        torch, module, "hopper_forward", 256, 256, torch.bfloat16, "cpu"
    )
    assert (source, config) == ("hopper", attention_hopper.CONFIG)
    assert config == {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 9, "num_stages": 2}


@pytest.mark.parametrize("kernel", ["hopper_dkdv", "hopper_dq"])
def test_inspect_names_the_hopper_backward_s_configs(kernels, tmp_path, kernel):
    # Its backward kernels (attention_hopper_backward) are kept as hopper_dkdv and
    # hopper_dq, each with its one config.
    from fusegen.runtime import attention_hopper_backward
    from fusegen.tools import inspect_kernels

    module = bench.load_module(kernels["att_causal_gqa_alibi"], tmp_path)
    source, config = inspect_kernels.attention_config(
        torch, module, kernel, 256, 256, torch.bfloat16, "cpu"
    )
    assert (source, config) == ("hopper", attention_hopper_backward.CONFIGS[kernel])
    rows, keys = (64, 128) if kernel == "hopper_dkdv" else (128, 64)
    assert config == {"BLOCK_M": rows, "BLOCK_N": keys, "num_warps": 9, "num_stages": 2}
