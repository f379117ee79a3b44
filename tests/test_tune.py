"""`fusegen tune` and tuned tables without a GPU: the tuner's logic with a fake timer
on the Triton interpreter, the table it writes, and a launcher that, given a fake GPU
identity, takes its config from that table without tuning."""

import functools
import importlib.util
import json
import logging
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")

from conftest import HAS_CUDA  # noqa: E402
from fusegen import build, codegen, tables  # noqa: E402
from fusegen.tools import inspect_kernels, tune  # noqa: E402

SPEC = """
version: 1
kernels:
  - name: tiny_gelu
    dims: {M: dynamic, K: 64, N: 48}
    dtypes: [fp32, fp16]
    inputs: {x: [M, K], w: [N, K], b: [N]}
    chain:
      - matmul: {a: x, b: w.T}
      - bias: b
      - gelu_tanh
    autotune:
      configs:
        - {BLOCK_M: 16, BLOCK_N: 64, BLOCK_K: 64, GROUP_M: 1, num_warps: 4, num_stages: 2}
        - {BLOCK_M: 32, BLOCK_N: 32, BLOCK_K: 32, GROUP_M: 4, num_warps: 4, num_stages: 3}
        - {BLOCK_M: 64, BLOCK_N: 64, BLOCK_K: 64, GROUP_M: 8, num_warps: 4, num_stages: 3}
"""
FAKE_GPU = ("Fake GPU 80GB", [9, 0])


@pytest.fixture
def generated(write_spec, run_cli, tmp_path):
    spec = write_spec(SPEC)
    code, _, err = run_cli("build", str(spec), "--out", str(tmp_path / "gen"))
    assert code == 0, err
    return spec, tmp_path / "gen", build.load([spec]).kernels


def fake_gpu_loader(corrupt=None):
    """Load the generated module as the tuner does, as if on a GPU named FAKE_GPU; with
    `corrupt`, outputs of that config come back wrong."""

    def load(kernel, out_dir):
        module = tune.load_generated(kernel, out_dir)
        module._KERNELS.device_identity = lambda device: FAKE_GPU
        module._KERNELS.shared_memory_limit = lambda device: 232_448
        if corrupt is not None:
            launcher = getattr(module, kernel.name)

            @functools.wraps(launcher)
            def wrapped(*args, config=None, **kwargs):
                out = launcher(*args, config=config, **kwargs)
                if config == corrupt:
                    out.view(-1)[::7] += 1.0
                return out

            setattr(module, kernel.name, wrapped)
        return module

    return load


def test_tune_writes_a_table_the_launcher_uses_without_tuning(generated, monkeypatch, caplog):
    spec, out_dir, kernels = generated
    (kernel,) = kernels
    space = [dict(c.items()) for c in kernel.configs]
    # Times by config: the second is fastest, the first is rejected for wrong output.
    speed = {str(space[0]): 0.5, str(space[1]): 1.0, str(space[2]): 2.0}

    def timer(fn):
        fn()
        return speed[str(last_config[0])]

    last_config = [None]

    def load(kernel_, out):
        module = fake_gpu_loader(corrupt=space[0])(kernel_, out)
        launcher = getattr(module, kernel_.name)

        @functools.wraps(launcher)
        def spy(*args, config=None, **kwargs):
            last_config[0] = config
            return launcher(*args, config=config, **kwargs)

        setattr(module, kernel_.name, spy)
        return module

    lines = []
    results, written = tune.run(
        kernels,
        lambda k: [(40, 64, 48)],
        ["fp32"],
        out_dir,
        timer,
        lines.append,
        device="cpu",
        load=load,
    )
    assert written == [tables.path_for(out_dir, "tiny_gelu")]
    (result,) = results
    assert result.entry is not None
    rejected = [m for m in result.measured if m.problem]
    assert len(rejected) == 1 and "relative error" in rejected[0].problem
    entry = result.entry
    assert entry["best"] == "pointer" and entry["choices"]["pointer"]["config"] == space[1]
    assert entry["gpu"] == FAKE_GPU[0] and entry["capability"] == FAKE_GPU[1]
    assert entry["key"] == {
        "M_bucket": 64,
        "N": 48,
        "K": 64,
        "dtype": "float32",
        "out_dtype": "float32",
    }
    assert any("[2/3]" in line for line in lines)

    # The table as written: readable, and a fresh launcher on the "same GPU" uses it.
    table = tables.read(written[0])
    assert table["entries"][0]["kernel_hash"] == codegen.module_kernel_hash(
        (out_dir / "tiny_gelu.py").read_text()
    )
    module = import_fresh(out_dir / "tiny_gelu.py")
    monkeypatch.setattr(module._KERNELS, "device_identity", lambda device: FAKE_GPU)
    monkeypatch.setattr(module._KERNELS, "can_tune", lambda device: True)

    def no_tuning(*args):
        raise AssertionError("tuned despite a table entry")

    monkeypatch.setattr(module._KERNELS, "tune", no_tuning)
    # 100 rows: bucket 128, next to the entry's 64.
    x, w, b = torch.randn(100, 64), torch.randn(48, 64) / 8, torch.randn(48)
    with caplog.at_level(logging.INFO):
        y = module.tiny_gelu(x, w, b)
    launch = module.last_launch()
    assert launch["source"] == "table" and launch["config"] == space[1]
    assert "tuned table entry for M_bucket=64" in caplog.text
    torch.testing.assert_close(y, module.reference(x, w, b), rtol=1e-5, atol=1e-5)

    # 300 rows: bucket 512, three powers of two from the entry, which does not serve.
    with pytest.raises(AssertionError, match="tuned despite"):
        module.tiny_gelu(torch.randn(300, 64), w, b)

    # Another GPU finds no entry: it tunes (here: the interpreter cannot, so it says so).
    module._KERNELS.plans.clear()
    module._CALLS.clear()
    monkeypatch.setattr(module._KERNELS, "device_identity", lambda device: ("Other GPU", [8, 0]))
    with pytest.raises(AssertionError, match="tuned despite"):
        module.tiny_gelu(x, w, b)


def test_a_table_that_chose_the_pointer_kernel_does_not_hide_the_tma_one(generated, monkeypatch):
    """Re-tuning measures every kernel the tensors allow: an entry from a tune where the
    pointer kernel won (or the only one offered) must not decide which kernels are timed."""
    _, out_dir, kernels = generated
    monkeypatch.delenv("FUSEGEN_TMA", raising=False)

    def loader(hopper):
        def load(kernel, out):
            module = fake_gpu_loader()(kernel, out)
            module._KERNELS.can_tune = lambda device: True  # tables are consulted, as on a GPU
            if hopper:  # as on an H200: the TMA kernel where FUSEGEN_TMA allows it
                module._KERNELS.path = lambda d, operands, outputs=(): (
                    "pointer" if os.environ.get("FUSEGEN_TMA") == "0" else "tma"
                )
            return module

        return load

    def timer(fn):
        fn()
        return 1.0

    def tune_once(hopper):
        results, _ = tune.run(
            kernels, lambda k: [(40, 64, 48)], ["fp32"], out_dir, timer, lambda line: None,
            device="cpu", load=loader(hopper),
        )  # fmt: skip
        return results[0].entry

    assert set(tune_once(hopper=False)["choices"]) == {"pointer"}
    entry = tune_once(hopper=True)
    assert set(entry["choices"]) == {"pointer", "tma"}


def import_fresh(path):
    spec = importlib.util.spec_from_file_location(f"fresh_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_stale_table_is_ignored_and_says_so(generated, monkeypatch, caplog):
    spec, out_dir, _ = generated
    table = tables.path_for(out_dir, "tiny_gelu")
    table.write_text(tables.render("tiny_gelu", str(spec), [entry("0" * 16)]))
    module = import_fresh(out_dir / "tiny_gelu.py")
    monkeypatch.setattr(module._KERNELS, "device_identity", lambda device: ("NVIDIA H200", [9, 0]))
    monkeypatch.setattr(module._KERNELS, "can_tune", lambda device: True)
    monkeypatch.setattr(module, "DETERMINISTIC", True)  # no table entry: the default runs
    x, w, b = torch.randn(40, 64), torch.randn(48, 64) / 8, torch.randn(48)
    with caplog.at_level(logging.INFO):
        module.tiny_gelu(x, w, b)
    assert module.last_launch()["source"] == "default"
    assert "1 of 1 entries in" in caplog.text and "tuned for other kernel source" in caplog.text


def test_deterministic_kernels_never_tune(write_spec, run_cli, tmp_path, monkeypatch):
    spec = write_spec(SPEC.replace("    autotune:", "    deterministic: true\n    autotune:"))
    out_dir = tmp_path / "gen"
    assert run_cli("build", str(spec), "--out", str(out_dir))[0] == 0
    module = import_fresh(out_dir / "tiny_gelu.py")
    assert module.DETERMINISTIC is True
    monkeypatch.setattr(module._KERNELS, "device_identity", lambda device: FAKE_GPU)
    monkeypatch.setattr(module._KERNELS, "can_tune", lambda device: True)
    monkeypatch.setattr(
        module._KERNELS, "tune", lambda *a: pytest.fail("a deterministic kernel tuned")
    )
    x, w, b = torch.randn(40, 64), torch.randn(48, 64) / 8, torch.randn(48)
    module.tiny_gelu(x, w, b)
    launch = module.last_launch()
    assert launch["source"] == "default"
    # Where nothing is tuned the estimate picks from the space (see _estimated_choice).
    assert launch["config"] in [module._KERNELS.complete(launch["path"], c) for c in module.CONFIGS]


def test_a_shape_no_config_suits_runs_the_smallest_untuned(
    write_spec, run_cli, tmp_path, monkeypatch
):
    # One row: every tile of this space is at least twice as tall (fits says no to all),
    # so the estimate has nothing to rank; the config needing least shared memory runs,
    # as the autotuner's prune keeps it, not DEFAULT_CONFIG from outside the space.
    lines = SPEC.splitlines(keepends=True)
    spec = write_spec("".join(line for line in lines if "BLOCK_M: 16" not in line))
    out_dir = tmp_path / "gen"
    assert run_cli("build", str(spec), "--out", str(out_dir))[0] == 0
    module = import_fresh(out_dir / "tiny_gelu.py")
    monkeypatch.setattr(module._KERNELS, "device_identity", lambda device: FAKE_GPU)
    monkeypatch.setattr(module._KERNELS, "can_tune", lambda device: True)
    monkeypatch.setenv("FUSEGEN_AUTOTUNE", "0")
    module.tiny_gelu(torch.randn(1, 64), torch.randn(48, 64) / 8, torch.randn(48))
    launch = module.last_launch()
    assert launch["source"] == "default"
    assert (launch["config"]["BLOCK_M"], launch["config"]["BLOCK_K"]) == (32, 32)


def test_a_default_the_spec_gives_runs_as_given(write_spec, run_cli, tmp_path, monkeypatch):
    given = "    deterministic: true\n    autotune:\n      default: {BLOCK_M: 32, BLOCK_N: 32}\n"
    spec = write_spec(SPEC[: SPEC.index("    autotune:")] + given)
    out_dir = tmp_path / "gen"
    assert run_cli("build", str(spec), "--out", str(out_dir))[0] == 0
    module = import_fresh(out_dir / "tiny_gelu.py")
    monkeypatch.setattr(module._KERNELS, "device_identity", lambda device: FAKE_GPU)
    monkeypatch.setattr(module._KERNELS, "can_tune", lambda device: True)
    module.tiny_gelu(torch.randn(40, 64), torch.randn(48, 64) / 8, torch.randn(48))
    launch = module.last_launch()
    assert launch["source"] == "default" and launch["config"] == module.DEFAULT_CONFIG
    assert (module.DEFAULT_CONFIG["BLOCK_M"], module.DEFAULT_CONFIG["BLOCK_N"]) == (32, 32)


def test_tuning_refuses_a_module_that_differs_from_its_spec(generated):
    spec, out_dir, kernels = generated
    path = out_dir / "tiny_gelu.py"
    path.write_text(path.read_text() + "# edited\n")
    with pytest.raises(tune.TuneError, match="differs from what .* generates; run `fusegen build"):
        tune.load_generated(kernels[0], out_dir)
    path.unlink()
    with pytest.raises(tune.TuneError, match="missing"):
        tune.load_generated(kernels[0], out_dir)


def entry(hash_, rows=64, gpu="NVIDIA H200"):
    return {
        "gpu": gpu,
        "capability": [9, 0],
        "kernel_hash": hash_,
        "key": {"M_bucket": rows, "N": 48, "K": 64, "dtype": "float32", "out_dtype": "float32"},
        "best": "pointer",
        "choices": {"pointer": {"config": {"BLOCK_M": 16}, "ms": 0.1}},
    }


def test_tables_render_deterministically_and_merge_by_gpu_and_key(tmp_path):
    a, b, c = entry("1" * 16, 64), entry("1" * 16, 16), entry("1" * 16, 64, gpu="NVIDIA A100")
    text = tables.render("tiny_gelu", "spec.yaml", [a, b, c])
    assert text == tables.render("tiny_gelu", "spec.yaml", [c, b, a])
    assert '"config": {"BLOCK_M": 16}' in text  # short values stay on one line
    path = tmp_path / "t.tuned.json"
    path.write_text(text)
    assert [e["key"]["M_bucket"] for e in tables.read(path)["entries"]] == [64, 16, 64]
    newer = {**entry("2" * 16, 64), "best": "pointer"}
    merged = tables.merge(tables.read(path)["entries"], [newer])
    assert len(merged) == 3 and newer in merged and a not in merged


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "not valid JSON"),
        ('{"entries": {}}', 'an "entries" list'),
        ('{"entries": [{"gpu": "x"}]}', "entries[0] lacks capability, kernel_hash"),
        (
            '{"entries": [{"gpu": "x", "capability": [9, 0], "kernel_hash": "0", "key": {}, '
            '"best": "tma", "choices": {"pointer": {}}}]}',
            "entries[0]: best 'tma' is not in its choices",
        ),
    ],
)
def test_unreadable_tables_say_why(tmp_path, text, message):
    path = tmp_path / "k.tuned.json"
    path.write_text(text)
    with pytest.raises(tables.TableError, match=message.replace("[", r"\[")):
        tables.read(path)


def test_build_check_reports_stale_and_unreadable_tables(generated, run_cli):
    spec, out_dir, _ = generated
    current = codegen.module_kernel_hash((out_dir / "tiny_gelu.py").read_text())
    table = tables.path_for(out_dir, "tiny_gelu")
    table.write_text(tables.render("tiny_gelu", str(spec), [entry(current), entry("0" * 16, 16)]))
    code, out, err = run_cli("build", str(spec), "--out", str(out_dir), "--check")
    assert code == 1
    assert "1 of 2 tuned entries were measured on other kernel source" in err
    assert "run `fusegen tune" in err and "out of date" not in err
    # A plain build writes the modules and warns.
    code, out, err = run_cli("build", str(spec), "--out", str(out_dir))
    assert code == 0 and "warning:" in err and "1 of 2 tuned entries" in err
    table.write_text("[1, 2")
    code, _, err = run_cli("build", str(spec), "--out", str(out_dir), "--check")
    assert code == 1 and "not valid JSON" in err
    table.write_text(tables.render("tiny_gelu", str(spec), [entry(current)]))
    assert run_cli("build", str(spec), "--out", str(out_dir), "--check")[0] == 0


def test_a_table_whose_kernel_is_gone_is_removed(generated, run_cli):
    spec, out_dir, _ = generated
    display = build.load([spec]).displays[0]
    gone = tables.path_for(out_dir, "renamed_away")
    gone.write_text(tables.render("renamed_away", display, [entry("1" * 16)]))
    code, _, err = run_cli("build", str(spec), "--out", str(out_dir), "--check")
    assert code == 1 and f"{gone}: no kernel in the specs makes it any more" in err
    code, out, _ = run_cli("build", str(spec), "--out", str(out_dir))
    assert code == 0 and not gone.exists() and "removed" in out


def test_the_kernel_hash_covers_kernels_only(generated):
    _, out_dir, _ = generated
    text = (out_dir / "tiny_gelu.py").read_text()
    base = codegen.kernel_source_hash(text)
    assert codegen.module_kernel_hash(text) == base

    def edited(old, new):
        assert old in text, old
        return codegen.kernel_source_hash(text.replace(old, new, 1))

    # Config spaces, layout, comments and docstrings are not kernel code; the code is.
    assert (
        edited(
            "DEFAULT_CONFIG = _rt.config_row(_SETTINGS, 128",
            "DEFAULT_CONFIG = _rt.config_row(_SETTINGS, 64",
        )
        == base
    )
    assert edited("tl.dot(", "tl.dot( ") == base
    assert edited("# The chain, in fp32.", "# edited") == base
    assert edited("for one [BLOCK_M", "for a [BLOCK_M") == base
    assert edited("tl.dot(", "tl.dot(-1 * ") != base


@pytest.mark.skipif(HAS_CUDA, reason="checks the message shown without a GPU")
@pytest.mark.parametrize("command", ["tune", "inspect"])
def test_gpu_commands_refuse_without_a_gpu(generated, run_cli, command):
    spec, out_dir, _ = generated
    code, out, err = run_cli(command, str(spec), "--out", str(out_dir))
    assert code == 2 and out == "" and f"fusegen {command}: needs a CUDA GPU" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kernels", "nope"], "no kernel named nope; these specs have tiny_gelu"),
        (["--rows", "16,x"], "'16,x' is not a comma-separated list of positive integers"),
    ],
)
@pytest.mark.parametrize("command", ["tune", "inspect"])
def test_gpu_commands_check_their_arguments_first(generated, run_cli, command, args, message):
    spec, out_dir, _ = generated
    code, out, err = run_cli(command, str(spec), "--out", str(out_dir), *args)
    assert code == 2 and out == "" and f"fusegen {command}: {message}" in err


def test_rows_need_the_other_dims_fixed(write_spec, run_cli):
    spec = write_spec(SPEC.replace("K: 64, N: 48", "K: dynamic, N: 48"))
    code, _, err = run_cli("tune", str(spec))
    assert code == 2 and "dim K is dynamic; give full shapes with --shapes M,K,N" in err


def test_table_json_is_plain_json(generated):
    spec, out_dir, _ = generated
    text = tables.render("tiny_gelu", str(spec), [entry("1" * 16)])
    assert json.loads(text)["kernel"] == "tiny_gelu"


def test_inspect_reports_the_compiled_kernel(generated, monkeypatch):
    """On the interpreter there is no compiled kernel: the row says so (None), and says
    where the config came from; a fake compiled kernel's metadata fills the columns."""
    spec, out_dir, kernels = generated
    lines = []
    (found,) = inspect_kernels.run(
        kernels, lambda k: [(40, 64, 48)], "fp32", out_dir, lines.append, device="cpu"
    )
    assert found.source == "interpreter" and found.registers is None
    assert found.row().startswith("| tiny_gelu | 40x64x48 | fp32 | pointer (interpreter) | None |")

    class Meta:
        shared, num_warps, num_stages = 49152, 4, 3

    class Compiled:
        n_regs, n_spills, metadata = 128, 2, Meta

    def load(kernel, out):
        module = tune.load_generated(kernel, out)
        launch = module._KERNELS.launch

        def spy(*args):
            launch(*args)
            module._KERNELS.last_run["kernel"] = Compiled

        module._KERNELS.launch = spy
        return module

    (found,) = inspect_kernels.run(
        kernels, lambda k: [(40, 64, 48)], "fp32", out_dir, lines.append, device="cpu", load=load
    )
    assert (found.registers, found.spills, found.shared, found.warps, found.stages) == (
        128,
        2,
        49152,
        4,
        3,
    )


def test_inspect_counters_parse_ncu_output(monkeypatch):
    monkeypatch.setattr(inspect_kernels.shutil, "which", lambda name: None)
    assert "ncu) is not on PATH" in inspect_kernels.counters("k", [])
    monkeypatch.setattr(inspect_kernels.shutil, "which", lambda name: "/usr/bin/ncu")
    stdout = (
        "  k_kernel (132, 1, 1)x(256, 1, 1), Context 1, Stream 7\n"
        "    Section: Command line profiler metrics\n"
        "    dram__bytes.sum.per_second        Tbyte/s      3.21\n"
        "    l1tex__t_sector_hit_rate.pct      %            12.50\n"
        "    lts__t_sector_hit_rate.pct        %            86.29\n"
    )
    calls = []

    def fake_run(command, **kwargs):
        calls.append((command, kwargs["env"].get(inspect_kernels.CHILD)))
        return subprocess.CompletedProcess(command, 0, stdout=stdout, stderr="")

    monkeypatch.setattr(inspect_kernels.subprocess, "run", fake_run)
    found = inspect_kernels.counters("k", ["inspect", "spec.yaml"])
    assert found == {"L1 hit %": "12.50 %", "L2 hit %": "86.29 %", "DRAM bytes/s": "3.21 Tbyte/s"}
    ((command, child),) = calls
    assert command[0] == "/usr/bin/ncu" and "regex:_k_kernel" in command and child == "1"
    monkeypatch.setattr(
        inspect_kernels.subprocess,
        "run",
        lambda command, **kw: subprocess.CompletedProcess(
            command, 1, stdout="", stderr="ERR_NVGPUCTRPERM"
        ),
    )
    assert "ncu gave no counters: ERR_NVGPUCTRPERM" == inspect_kernels.counters("k", [])


QUANT_SPEC = """
version: 1
kernels:
  - name: tiny_int4
    dims: {M: dynamic, K: 256, N: 64}
    dtypes: [bf16]
    inputs:
      x: [M, K]
      w: {shape: [N, K], dtype: int4, scale: {per_group: 128}, zero_point: true}
    chain:
      - matmul: x @ w.T
      - silu
"""


def test_tune_writes_a_quantized_chains_table_its_launcher_takes(
    write_spec, run_cli, tmp_path, monkeypatch
):
    # The launcher's own tuning, done ahead by `fusegen tune` (checked against float64
    # on the interpreter here, with a fake timer and GPU identity): the table's entry is
    # the config a fresh launcher on the same GPU takes, for the call's row bucket and
    # the next; another GPU, another N, or rows the GEMV path does not serve find none.
    spec = write_spec(QUANT_SPEC)
    out_dir = tmp_path / "gen"
    code, _, err = run_cli("build", str(spec), "--out", str(out_dir))
    assert code == 0, err
    (kernel,) = build.load([spec]).kernels
    speed, ran = {}, {}  # the fake time of each config; the config of the last call

    def load(kernel_, out):
        module = tune.load_generated(kernel_, out)
        module._CHAIN.device_identity = lambda device: FAKE_GPU
        gemv = next(c for c in module.CONFIGS if c["BLOCK_M"] == 1)
        tiles = [c for c in module.CONFIGS if c["BLOCK_M"] > 1][:2]
        module.CONFIGS[:] = [gemv, *tiles]  # a short space: the interpreter is slow
        speed.update({str(gemv): 0.5, str(tiles[0]): 2.0, str(tiles[1]): 1.0})
        launcher = getattr(module, kernel_.name)

        def spy(*args, config=None, **kwargs):
            ran["config"] = config
            return launcher(*args, config=config, **kwargs)

        setattr(module, kernel_.name, spy)
        return module

    def timer(fn):
        fn()
        return speed[str(ran["config"])]

    results, written = tune.run(
        [kernel], lambda k: [(16, 256, 64), (1, 256, 64)], ["bf16"], out_dir, timer,
        lambda line: None, device="cpu", load=load,
    )  # fmt: skip
    assert written == [tables.path_for(out_dir, "tiny_int4")]
    sixteen, one = (r.entry for r in results)
    # At one row the GEMV config (the fastest) is tried and wins; at 16 rows the
    # launcher's tuning would not try it (GEMV_ROWS), nor does `fusegen tune`.
    assert one["key"] == {
        "M_bucket": 1, "N": 64, "K": 256, "dtype": "bfloat16", "out_dtype": "bfloat16",
        "words": True,
    }  # fmt: skip
    gemv, tile = one["choices"]["quant"]["config"], sixteen["choices"]["quant"]["config"]
    assert one["best"] == "quant" and gemv["BLOCK_M"] == 1
    assert sixteen["key"]["M_bucket"] == 16 and tile["BLOCK_M"] > 1
    skipped = [m for m in results[0].measured if m.problem.startswith("skipped")]
    assert [m.config["BLOCK_M"] for m in skipped] == [1]
    table = tables.read(written[0])
    assert {e["kernel_hash"] for e in table["entries"]} == {
        codegen.module_kernel_hash((out_dir / "tiny_int4.py").read_text())
    }

    module = import_fresh(out_dir / "tiny_int4.py")
    chain = module._CHAIN
    monkeypatch.setattr(chain, "device_identity", lambda device: FAKE_GPU)
    plan = {
        "rows": 1, "cols": 64, "k": 256, "dtype": torch.bfloat16,
        "out_dtype": torch.bfloat16, "words": True, "device": torch.device("cpu"),
    }  # fmt: skip
    assert chain.from_table(plan) == gemv
    assert chain.from_table({**plan, "rows": 2}) == gemv  # bucket 2, next to 1
    assert chain.from_table({**plan, "rows": 8}) == tile  # bucket 8, next to 16
    assert chain.from_table({**plan, "rows": 32}) == tile
    assert chain.from_table({**plan, "rows": 128}) is None  # 8x the nearest entry's rows
    assert chain.from_table({**plan, "cols": 128}) is None
    assert chain.from_table({**plan, "words": False}) is None
    monkeypatch.setattr(chain, "device_identity", lambda device: ("Other GPU", [8, 0]))
    assert chain.from_table(plan) is None


def test_inspect_reports_a_quantized_chains_compiled_kernel(write_spec, run_cli, tmp_path):
    spec = write_spec(QUANT_SPEC)
    out_dir = tmp_path / "gen"
    assert run_cli("build", str(spec), "--out", str(out_dir))[0] == 0
    kernels = build.load([spec]).kernels
    (found,) = inspect_kernels.run(
        kernels, lambda k: [(3, 256, 64)], "bf16", out_dir, lambda line: None, device="cpu"
    )
    assert found.source == "interpreter" and found.registers is None
    assert found.row().startswith("| tiny_int4 | 3x256x64 | bf16 | fp32 dot (interpreter) |")

    class Meta:
        shared, num_warps, num_stages = 32768, 4, 2

    class Compiled:
        n_regs, n_spills, metadata = 96, 0, Meta

    def load(kernel, out):
        module = tune.load_generated(kernel, out)
        launch = module._CHAIN.launch

        def spy(*args):
            launch(*args)
            module._CHAIN.last_compiled = Compiled

        module._CHAIN.launch = spy
        return module

    (found,) = inspect_kernels.run(
        kernels, lambda k: [(3, 256, 64)], "bf16", out_dir, lambda line: None, device="cpu",
        load=load,
    )  # fmt: skip
    assert (found.registers, found.spills, found.shared, found.warps, found.stages) == (
        96, 0, 32768, 4, 2,
    )  # fmt: skip


def test_a_deterministic_quantized_chain_takes_its_table_or_its_default(
    write_spec, run_cli, tmp_path, monkeypatch
):
    # The spec's `deterministic: true` reaches the module: no tuning at run time, the
    # tuned table's config where it has one for the GPU, else DEFAULT_CONFIG (as the
    # chains do). Without it the launcher tunes where the table has nothing.
    spec = write_spec(
        QUANT_SPEC.replace("    dtypes: [bf16]\n", "    dtypes: [bf16]\n    deterministic: true\n")
    )
    out_dir = tmp_path / "gen"
    assert run_cli("build", str(spec), "--out", str(out_dir))[0] == 0
    module = import_fresh(out_dir / "tiny_int4.py")
    assert module.DETERMINISTIC is True
    chain = module._CHAIN
    monkeypatch.setattr(chain, "device_identity", lambda device: FAKE_GPU)
    monkeypatch.setattr(chain, "tune", lambda *args: pytest.fail("tuned at run time"))
    plan = {
        "rows": 16, "cols": 64, "k": 256, "dtype": torch.bfloat16, "interpreted": False,
        "out_dtype": torch.bfloat16, "words": True, "device": torch.device("cpu"),
    }  # fmt: skip
    assert chain.config_for(plan, None, None) == (module.DEFAULT_CONFIG, "default")
    tile = next(c for c in module.CONFIGS if c["BLOCK_M"] > 1 and c != module.DEFAULT_CONFIG)
    entry = {
        "gpu": FAKE_GPU[0], "capability": FAKE_GPU[1], "kernel_hash": module.KERNEL_HASH,
        "key": chain.table_key(plan), "best": "quant", "choices": {"quant": {"config": tile}},
    }  # fmt: skip
    table = tables.path_for(out_dir, "tiny_int4")
    table.write_text(tables.render("tiny_int4", str(spec), [entry]))
    module = import_fresh(out_dir / "tiny_int4.py")
    chain = module._CHAIN
    monkeypatch.setattr(chain, "device_identity", lambda device: FAKE_GPU)
    monkeypatch.setattr(chain, "tune", lambda *args: pytest.fail("tuned at run time"))
    assert chain.config_for(plan, None, None) == (tile, "table")
    monkeypatch.setitem(vars(module), "DETERMINISTIC", False)
    tuned = []
    monkeypatch.setattr(chain, "tune", lambda *args: tuned.append(1) or tile)
    assert chain.config_for({**plan, "cols": 128}, None, None) == (tile, "tuned") and tuned
