"""`fusegen tune` of attention kernels without a GPU: the tuner's logic with a fake timer
on the Triton interpreter (small config spaces), the table it writes, and the module's
lookup of that table for a GPU of the table's name."""

import importlib.util
import sys

import pytest

torch = pytest.importorskip("torch")

from fusegen import build, tables  # noqa: E402
from fusegen.tools import tune_attention  # noqa: E402

SPEC = """
version: 1
kernels:
  - name: tiny_attention
    dtypes: [fp16, fp32]
    attention: {layout: bshd, heads: 2, kv_heads: 1, head_dim: 32, causal: true}
"""
FAKE_GPU = ("Fake GPU 80GB", [9, 0])
SPACES = {  # per kernel: the fast config first; each kernel's own, so a mix-up shows
    "forward": [(16, 16, 4, 1), (32, 16, 4, 1)],
    "decode": [(16, 32, 4, 1), (32, 32, 4, 1)],
    "kv": [(32, 16, 4, 1), (32, 32, 4, 1)],
    "q": [(16, 32, 4, 1), (32, 16, 4, 1)],
}


def import_fresh(path):
    spec = importlib.util.spec_from_file_location(f"fresh_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def generated(write_spec, run_cli, tmp_path):
    spec = write_spec(SPEC)
    code, _, err = run_cli("build", str(spec), "--out", str(tmp_path / "gen"))
    assert code == 0, err
    return tmp_path / "gen", build.load([spec]).kernels


def test_tune_writes_a_table_the_module_reads(generated):
    out_dir, kernels = generated
    loaded = {}

    def load(att, folder):
        module = tune_attention.load_generated(att, folder)
        loaded["module"] = module
        forward = module._ATTENTION.forward

        def corrupted(*args, **kwargs):  # the second forward config computes wrongly
            out, lse = forward(*args, **kwargs)
            if module.FORCED.get("forward") == SPACES["forward"][1]:
                out = out + 1.0
            return out, lse

        module._ATTENTION.forward = corrupted
        return module

    def timer(fn):
        fn()
        forced = dict(loaded["module"].FORCED)
        if not forced:
            return 1.0  # the default
        ((kernel, config),) = forced.items()
        fast = [SPACES[kernel][0]] + ([SPACES["decode"][0]] if kernel == "forward" else [])
        return 0.5 if config in fast else 2.0

    lines = []
    results, written = tune_attention.run(
        kernels, [(1, 40, 40)], ["fp32"], out_dir, timer, lines.append,
        device="cpu", load=load, identity=FAKE_GPU, spaces=SPACES,
    )  # fmt: skip
    assert written == [tables.path_for(out_dir, "tiny_attention")]
    assert [r.kernel for r in results] == [f"tiny_attention {k}" for k in ("forward", "kv", "q")]
    forward = results[0]
    rejected = [m for m in forward.measured if m.problem]
    assert len(rejected) == 1 and "relative error" in rejected[0].problem, rejected
    for result in results:
        assert result.entry["best"] == "tuned"
        kernel = result.entry["key"]["kernel"]
        assert result.entry["choices"]["tuned"]["config"] == list(SPACES[kernel][0])
        assert result.entry["key"] == {
            "kernel": kernel, "dtype": "float32", "q_bucket": 64, "k_bucket": 64
        }  # fmt: skip

    # The table as written: readable, one entry per kernel, and a fresh module looks it up
    # for a GPU of that name, in the entry's buckets or next to them.
    table = tables.read(written[0])
    assert len(table["entries"]) == 3 and "--attention-shapes" in table["about"]
    module = import_fresh(out_dir / "tiny_attention.py")
    assert all(e["kernel_hash"] == module.KERNEL_HASH for e in table["entries"])
    look = module._ATTENTION.tuned_config
    assert look(FAKE_GPU, "kv", "float32", 40, 40) == SPACES["kv"][0]
    assert look(FAKE_GPU, "q", "float32", 100, 33) == SPACES["q"][0]  # 128, 64: one away
    assert look(FAKE_GPU, "q", "float32", 300, 40) is None  # 512: three powers of two away
    assert look(FAKE_GPU, "q", "float16", 40, 40) is None
    assert look(("Other GPU", [8, 0]), "q", "float32", 40, 40) is None

    # Re-tuning merges: the same slot replaced, nothing duplicated.
    tune_attention.run(
        kernels, [(1, 40, 40)], ["fp32"], out_dir, timer, lines.append,
        device="cpu", load=load, identity=FAKE_GPU, spaces=SPACES,
    )  # fmt: skip
    assert len(tables.read(written[0])["entries"]) == 3

    # A decode shape tunes the forward alone: no training step has one query.
    results, _ = tune_attention.run(
        kernels, [(1, 1, 40)], ["fp32"], out_dir, timer, lines.append,
        device="cpu", load=load, identity=FAKE_GPU, spaces=SPACES,
    )  # fmt: skip
    assert [r.kernel for r in results] == ["tiny_attention forward"]
    assert results[0].entry["choices"]["tuned"]["config"] == list(SPACES["decode"][0])
    assert len(tables.read(written[0])["entries"]) == 4


def test_configs_that_run_the_same_are_timed_once(generated):
    """A config whose pipeline stages overflow shared memory runs with fewer (the
    launcher cuts them by its estimate): the tuner records it as it ran, and times it
    only where no config before it ran so."""
    out_dir, kernels = generated
    spaces = {**SPACES, "kv": [(32, 16, 4, 1), (32, 16, 4, 3), (32, 16, 8, 3)]}
    loaded = {}

    def load(att, folder):
        module = loaded["module"] = tune_attention.load_generated(att, folder)
        meta = {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_D": 32, "BLOCK_DV": 32}
        one_stage = module._ATTENTION.shared_bytes("kv", 1, (torch.float32,), meta)
        module._ATTENTION.shared_limit = lambda device: one_stage  # 32x16 tiles: one stage
        return module

    timed = []

    def timer(fn):
        fn()
        timed.append(dict(loaded["module"].FORCED).get("kv"))
        return 2.0 if timed[-1] == spaces["kv"][0] else 1.0

    results, _ = tune_attention.run(
        kernels, [(1, 40, 40)], ["fp32"], out_dir, timer, lambda line: None,
        device="cpu", load=load, identity=FAKE_GPU, spaces=spaces,
    )  # fmt: skip
    (kv,) = [r for r in results if r.kernel == "tiny_attention kv"]
    assert [(m.config, m.problem) for m in kv.measured[1:]] == [
        ((32, 16, 4, 1), ""),
        ((32, 16, 4, 1), "ran as (32, 16, 4, 1), timed already"),
        ((32, 16, 8, 1), ""),
    ]
    assert [c for c in timed if c is not None] == [(32, 16, 4, 1), (32, 16, 8, 3)]
    assert kv.entry["choices"]["tuned"]["config"] == [32, 16, 8, 1]


def test_a_stale_entry_is_not_used(generated):
    out_dir, kernels = generated
    module = import_fresh(out_dir / "tiny_attention.py")
    entry = {
        "gpu": FAKE_GPU[0], "capability": FAKE_GPU[1], "kernel_hash": "0" * 16,
        "key": {"kernel": "q", "dtype": "float32", "q_bucket": 64, "k_bucket": 64},
        "best": "tuned", "choices": {"tuned": {"config": [16, 16, 4, 1], "ms": 0.1}},
    }  # fmt: skip
    path = tables.path_for(out_dir, "tiny_attention")
    path.write_text(tables.render("tiny_attention", "spec.yaml", [entry]))
    assert module._ATTENTION.tuned_config(FAKE_GPU, "q", "float32", 40, 40) is None
    fresh = import_fresh(out_dir / "tiny_attention.py")
    entry["kernel_hash"] = fresh.KERNEL_HASH
    path.write_text(tables.render("tiny_attention", "spec.yaml", [entry]))
    attention = import_fresh(out_dir / "tiny_attention.py")._ATTENTION
    assert attention.tuned_config(FAKE_GPU, "q", "float32", 40, 40) == (16, 16, 4, 1)


def test_tune_checks_attention_shapes_before_it_needs_a_gpu(generated, run_cli, tmp_path):
    out_dir, _ = generated
    spec = tmp_path / "spec.yaml"
    code, out, err = run_cli("tune", str(spec), "--out", str(out_dir), "--attention-shapes", "2,x")
    assert code == 2 and out == "" and "fusegen tune: " in err and "2,x" in err
