"""`fusegen bench` without a GPU: it refuses clearly, and with a fake timer its logic
and every output format work (on the Triton interpreter). And the experiments' edits of
generated kernels still apply."""

import json
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from conftest import HAS_CUDA, ROOT  # noqa: E402
from fusegen import build, codegen, tables  # noqa: E402
from fusegen.tools import bench, bench_suite, report  # noqa: E402

ANCHORS = ROOT / "benchmarks" / "specs" / "anchors.yaml"
ROWS = ROOT / "benchmarks" / "specs" / "rows.yaml"
QUANTIZED = ROOT / "specs" / "quantized.yaml"


@pytest.mark.skipif(HAS_CUDA, reason="checks the message shown without a GPU")
def test_refuses_without_a_gpu(run_cli):
    code, out, err = run_cli("bench", str(ANCHORS))
    assert code == 2 and out == ""
    assert "needs a CUDA GPU" in err


def test_shapes_map_onto_dims_and_respect_static_ones():
    kernels = {k.name: k for k in build.load([ANCHORS]).kernels}
    assert bench.shape_dims(kernels["anchor_gelu"], (16, 4096, 14336)) == {
        "M": 16,
        "K": 4096,
        "N": 14336,
    }
    assert bench.shape_dims(kernels["anchor_ew"], (16384, 8192)) == {"M": 16384, "N": 8192}
    with pytest.raises(ValueError, match="takes shapes M,K,N"):
        bench.shape_dims(kernels["anchor_gelu"], (16, 4096))
    (gpt2,) = [
        k for k in build.load([ROOT / "specs" / "gpt2.yaml"]).kernels if k.name == "gpt2_mlp_up"
    ]
    with pytest.raises(ValueError, match="fixes K = 768"):
        bench.shape_dims(gpt2, (16, 4096, 3072))


def test_default_shapes_follow_the_spec():
    """A spec that fixes every dim but the rows is benched at DEFAULT_ROWS there (the
    anchor shapes would not fit it); a dynamic one at the anchor shapes; --rows on a
    dynamic dim is refused with the dim named."""
    examples = {k.name: k for k in build.load(build.collect([ROOT / "specs"])).kernels}
    assert bench.kernel_shapes(examples["gpt2_mlp_up"]) == [(16, 768, 3072), (4096, 768, 3072)]
    assert bench.kernel_shapes(examples["llama_add_rmsnorm"]) == [(16, 4096), (4096, 4096)]
    assert (
        bench.kernel_shapes(examples["bias_gelu_residual"]) == bench.DEFAULT_SHAPES["elementwise"]
    )
    assert bench.kernel_shapes(examples["gpt2_mlp_up"], rows=[1]) == [(1, 768, 3072)]
    given = [(2, 768, 3072), (3, 768)]
    assert bench.kernel_shapes(examples["gpt2_mlp_up"], given) == [(2, 768, 3072)]
    assert bench.kernel_shapes(examples["masked_softmax"], given) == [(3, 768)]
    with pytest.raises(ValueError, match="dim N is dynamic"):
        bench.kernel_shapes(examples["bias_gelu_residual"], rows=[16])


def test_bad_arguments_exit_2_before_any_gpu_work(run_cli):
    """Checked before the GPU is: a dynamic dim with --rows, an unknown kernel or
    --compare name, a malformed shape."""
    code, out, err = run_cli("bench", str(ANCHORS), "--rows", "16")
    assert code == 2 and out == "" and "anchor_gelu: dims K, N are dynamic" in err
    code, _, err = run_cli("bench", str(ANCHORS), "--kernels", "nope")
    assert code == 2 and "no kernel named nope; these specs have anchor_gelu" in err
    code, _, err = run_cli("bench", str(ANCHORS), "--compare", "eager,cublas")
    assert code == 2 and "no variant named cublas; valid: eager, compile" in err
    code, _, err = run_cli("bench", str(ANCHORS), "--shapes", "16,x")
    assert code == 2 and "'16,x' is not a comma-separated list" in err
    for layout, message in (
        ("x=diagonal", "no layout 'diagonal'; valid: transposed, sliced"),
        ("y=sliced", "no input 'y'; inputs: b, r, w, w1, w3, x"),
        ("b=transposed", "'b' has one dim"),
        ("x", "--layout takes INPUT=KIND, got x"),
    ):
        code, out, err = run_cli("bench", str(ANCHORS), "--layout", layout)
        assert code == 2 and out == "" and message in err, (layout, err)


def test_quantized_specs_bench_their_chains_and_refuse_the_rest(run_cli):
    """`fusegen bench`, `tune` and `inspect` take quantized chains, not quantizers; a
    layout on a quantized input is refused. All before the GPU is asked for."""
    for command in ("bench", "tune", "inspect"):
        code, out, err = run_cli(command, str(QUANTIZED), "--kernels", "quantize_fp8_rowwise")
        assert code == 2 and out == "" and "a quantizer takes its config from" in err
    code, _, err = run_cli("bench", str(QUANTIZED), "--layout", "w_gate=transposed")
    assert code == 2 and "'w_gate' is quantized" in err
    code, _, err = run_cli("bench", str(QUANTIZED), "--layout", "x=diagonal")
    assert code == 2 and "no layout 'diagonal'" in err


def test_a_suite_run_takes_quantized_chains_not_quantizers(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(
        f"runs:\n  quantized:\n    measures: the quantized chains\n"
        f"    specs: [{QUANTIZED}]\n    shapes: [[16, 4096, 14336]]\n    compare: [eager]\n"
    )
    (run,) = bench_suite.load(path).runs
    assert sorted(k.name for k in run.kernels) == [
        "deepseek_mlp_fp8", "gelu_fp8_rowwise", "linear_int8", "llama_mlp_int4",
    ]  # fmt: skip


def test_bench_times_quantized_chains_with_a_fake_timer():
    # Every quantized chain of specs/quantized.yaml (int4 + zero points, int8, fp8
    # row-wise and block-scaled), drawn as the generated tests draw them, each variant
    # checked against the float64 reference (under the interpreter here).
    # Beside them, the same chain on the weights dequantized before any timing: fusegen's
    # own kernel and eager PyTorch (what the model ran before quantization).
    kernels = [k for k in build.load([QUANTIZED]).kernels if k.kind == "quant"]
    names = ("fusegen", "eager", "fusegen, dequantized weights", "eager, dequantized weights")
    variants = [bench.VARIANTS[[v.name for v in bench.VARIANTS].index(n)] for n in names]
    times = {n: t for n, t in zip(names, (1.0, 4.0, 2.0, 3.0), strict=True)}
    row_of = {}

    def timer(fn):
        fn()
        return times[row_of["variant"]]

    def progress(line):
        for name in names:
            if line.endswith(f": {name} ..."):
                row_of["variant"] = name

    _, results = bench.run(
        kernels,
        lambda k: bench.kernel_shapes(k, [(3, 256, 64)]),
        "bf16",
        variants,
        timer,
        progress,
        ceilings=bench.Ceilings(700.0, 4000.0),
        device="cpu",
    )
    assert len(results) == 4 * len(kernels) == 16
    assert all(r.ok for r in results), [(r.kernel, r.variant, r.error, r.note) for r in results]
    fused = [r for r in results if r.variant == "fusegen"]
    assert all(r.speedup == pytest.approx(2.0) for r in fused)  # over fusegen's dense chain
    assert bench.VARIANT_NAMES["dequantized"] == "fusegen, dequantized weights"
    # A dtype a kernel does not take is skipped, and said so (quantized chains: bf16, fp16).
    lines = []
    _, none = bench.run(
        kernels, lambda k: [(3, 256, 64)], "fp32", variants, lambda fn: 1.0, lines.append,
        ceilings=bench.Ceilings(700.0, 4000.0), device="cpu",
    )  # fmt: skip
    assert none == [] and "  skipped: linear_int8 does not take fp32 (--dtype)" in lines
    notes = {r.kernel: r.note for r in results if r.variant == "fusegen"}
    assert notes["llama_mlp_int4"].startswith("fp32 dot (kernel)")  # the interpreter's dot
    assert notes["deepseek_mlp_fp8"].startswith("fp8 dot (kernel)")
    # The bytes a call moves: int4 half a byte a value, bf16 group scales and uint8 zero
    # points (both weights), x and the output.
    (int4,) = [k for k in kernels if k.name == "llama_mlp_int4"]
    sizes = {"M": 16, "K": 4096, "N": 14336}
    flops, moved = bench.work(int4, sizes, 2)
    weight = 14336 * 4096 / 2 + 14336 * 32 * (2 + 1)
    assert flops == 2 * 2 * 16 * 4096 * 14336
    assert moved == 2 * weight + 2 * 16 * 4096 + 2 * 16 * 14336
    (fp8,) = [k for k in kernels if k.name == "deepseek_mlp_fp8"]
    flops, moved = bench.work(fp8, {"M": 256, "K": 1024, "N": 512}, 2)
    x = 256 * 1024 + 256 * 8 * 4  # fp8 values, fp32 scales a 128-group of a row
    weight = 512 * 1024 + 4 * 8 * 4  # fp8 values, fp32 scales a 128 x 128 block
    assert moved == x + 2 * weight + 2 * 256 * 512


def test_bench_stores_inputs_as_the_layouts_say():
    """Every variant gets the same strided inputs; the rows say which were strided."""
    (kernel,) = [k for k in build.load([ANCHORS]).kernels if k.name == "anchor_gelu"]
    seen = []

    def recording(torch_, module, kernel_):
        def run(**t):
            seen.append({name: tensor.stride() for name, tensor in t.items()})
            return module.reference(**t)

        return run

    variants = [bench.VARIANTS[0], bench.Variant("recording", lambda k: True, recording)]
    _, results = bench.run(
        [kernel],
        lambda k: [(6, 40, 24)],
        "fp32",
        variants,
        lambda fn: (fn(), 1.0)[1],
        lambda line: None,
        ceilings=bench.Ceilings(1.0, 1.0),
        device="cpu",
        layouts={"x": "sliced", "w": "transposed"},
    )
    assert all(r.ok and r.layout == "x sliced, w transposed" for r in results), results
    assert seen and all(s == {"x": (80, 2), "w": (1, 24), "b": (1,)} for s in seen)
    assert "6x40x24 (x sliced, w transposed)" in report.table(results)


def test_work_counts_flops_and_bytes():
    kernels = {k.name: k for k in build.load([ANCHORS]).kernels}
    flops, moved = bench.work(kernels["anchor_swiglu"], {"M": 16, "K": 4096, "N": 14336}, 2)
    assert flops == 2 * 2 * 16 * 4096 * 14336  # two matmuls
    assert moved == 2 * (16 * 4096 + 2 * 14336 * 4096 + 16 * 14336)
    assert bench.cublaslt_form(kernels["anchor_gelu"]) == "gelu"
    assert bench.cublaslt_form(kernels["anchor_swiglu"]) is None


def test_bench_with_a_fake_timer(tmp_path):
    kernels = build.load([ANCHORS]).kernels
    timings = iter(range(1, 1000))

    def fake_timer(fn):
        fn()  # the function must run
        return 0.1 * next(timings)  # fusegen first, so it is the fastest

    variants = [v for v in bench.VARIANTS if v.name in ("fusegen", "eager", "cuBLASLt epilogue")]
    lines = []
    ceilings, results = bench.run(
        kernels,
        lambda k: bench.kernel_shapes(k, [(7, 40, 24), (5, 24)]),
        "fp32",
        variants,
        fake_timer,
        lines.append,
        ceilings=bench.Ceilings(tflops=700.0, gbs=4000.0),
        device="cpu",
    )
    assert any("anchor_gelu 7x40x24 fp32: fusegen" in line for line in lines)
    by = {(r.kernel, r.variant): r for r in results}
    assert set(by) == {
        ("anchor_gelu", "fusegen"),
        ("anchor_gelu", "eager"),
        ("anchor_gelu", "cuBLASLt epilogue"),
        ("anchor_swiglu", "fusegen"),
        ("anchor_swiglu", "eager"),
        ("anchor_ew", "fusegen"),
        ("anchor_ew", "eager"),
    }
    assert all(r.ok for r in results), [
        (r.kernel, r.variant, r.error, r.note) for r in results if not r.ok
    ]
    gelu = by[("anchor_gelu", "fusegen")]
    assert gelu.speedup == pytest.approx(by[("anchor_gelu", "eager")].ms / gelu.ms)
    assert gelu.rate == pytest.approx(2 * 7 * 40 * 24 / gelu.ms / 1e9)
    assert "pointer" in gelu.note

    text = report.table(results)
    assert "anchor_swiglu" in text and "vs best other" in text
    paths = report.write(tmp_path, results, ceilings, {"gpu": "fake", "torch": "t", "triton": "x"})
    names = {p.name for p in paths}
    assert {"bench.json", "bench.md"} <= names
    data = json.loads((tmp_path / "bench.json").read_text())
    assert len(data["results"]) == len(results) and data["ceilings"]["tflops"] == 700.0
    assert "| **fusegen** |" in (tmp_path / "bench.md").read_text()
    if "bench.png" in names:
        assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_row_kernels_with_a_fake_timer():
    kernels = build.load([ROWS]).kernels
    variants = [v for v in bench.VARIANTS if v.name in ("fusegen", "eager")]
    _, results = bench.run(
        kernels,
        lambda k: [(5, 40)],
        "fp32",
        variants,
        lambda fn: (fn(), 1.0)[1],
        lambda line: None,
        ceilings=bench.Ceilings(700.0, 4000.0),
        device="cpu",
    )
    assert len(results) == 6 and all(r.ok for r in results), [(r.kernel, r.note) for r in results]
    flops, moved = bench.work(kernels[0], {"M": 5, "N": 40}, 4)
    assert flops == 0 and moved == 4 * (3 * 5 * 40 + 40 + 5 * 40)  # x, residual, out, h + weight


def test_a_failing_variant_is_reported_not_fatal():
    (kernel,) = [k for k in build.load([ANCHORS]).kernels if k.name == "anchor_ew"]

    def broken(torch_, module, kernel_):
        raise RuntimeError("no such backend")

    variants = [bench.VARIANTS[0], bench.Variant("broken", lambda k: True, broken)]
    _, results = bench.run(
        [kernel],
        lambda k: [(3, 8)],
        "fp32",
        variants,
        lambda fn: 1.0,
        lambda line: None,
        ceilings=bench.Ceilings(1.0, 1.0),
        device="cpu",
    )
    broken_row = next(r for r in results if r.variant == "broken")
    assert not broken_row.ok and "RuntimeError: no such backend" in broken_row.note


def test_bench_uses_the_tuned_table_beside_the_modules(tmp_path):
    # `fusegen bench` measures what the committed module would run: its tuned table.
    (kernel,) = [k for k in build.load([ANCHORS]).kernels if k.name == "anchor_gelu"]
    tables_dir, modules = tmp_path / "generated", tmp_path / "bench"
    tables_dir.mkdir()
    modules.mkdir()
    kernel_hash = codegen.module_kernel_hash(codegen.render(kernel)[0].text)
    entry = {"gpu": "Some GPU", "capability": [9, 0], "kernel_hash": kernel_hash, "key": {}}
    tables.path_for(tables_dir, kernel.name).write_text(
        tables.render(kernel.name, kernel.spec_display, [entry])
    )
    module = bench.load_module(kernel, modules, tables_dir)
    assert module._KERNELS.table_entries() == [entry]
    without = bench.load_module(kernel, tmp_path, None)
    assert without._KERNELS.table_entries() == []


# -- the suite: benchmarks/suite.yaml, `fusegen bench --suite` -------------------------

SUITE = ROOT / "benchmarks" / "suite.yaml"


def test_the_committed_suite_names_the_recorded_runs():
    """Every run of benchmarks/suite.yaml loads (its specs, kernels, shapes, layouts and
    dtypes agree) and says the `fusegen bench` command it stands for."""
    suite = bench_suite.load(SUITE)
    runs = {r.name: r for r in suite.runs}
    assert suite.display == "benchmarks/suite.yaml"
    assert {"anchors-bf16", "anchors-fp16", "anchors-gpu-time", "examples", "row-chains"} <= set(
        runs
    )
    assert all(
        r.measures and r.command().startswith(("fusegen bench ", "FUSEGEN_")) for r in runs.values()
    )
    assert runs["examples"].command() == "fusegen bench specs --compare cublaslt,eager,compile"
    assert runs["anchors-untuned-default"].command() == (
        "FUSEGEN_AUTOTUNE=0 fusegen bench benchmarks/specs/anchors.yaml --kernels anchor_gelu "
        "anchor_swiglu --shapes 8192,4096,14336 4096,1024,4096 16,4096,14336 1000,1000,1000 "
        "--compare eager --tables none"
    )
    sliced = runs["opt-fc1-x-sliced"]
    assert sliced.layouts == {"x": "sliced"} and sliced.dtype == "fp16"
    assert sliced.shapes_for(sliced.kernels[0]) == [(4096, 768, 3072)]
    assert runs["anchors-gpu-time"].timer == "graph"
    assert [v.name for v in runs["anchors-bf16"].variants()] == [
        "fusegen",
        "eager",
        "torch.compile",
        "cuBLASLt epilogue",
    ]


def test_suite_list_prints_each_run_without_a_gpu(run_cli):
    code, out, err = run_cli("bench", "--suite", str(SUITE), "--list", "--runs", "examples")
    assert code == 0 and err == ""
    assert out.splitlines()[1] == "    fusegen bench specs --compare cublaslt,eager,compile"


def _suite(tmp_path, text: str):
    path = tmp_path / "suite.yaml"
    path.write_text(text.replace("ANCHORS", str(ANCHORS)).replace("ROWS", str(ROWS)))
    return path


def test_a_bad_suite_is_reported_whole_before_any_gpu_work(tmp_path, run_cli):
    path = _suite(
        tmp_path,
        """\
runs:
  anchors:
    measure: a typo
    specs: [ANCHORS]
    kernels: [anchor_gleu]
    compare: [eager, cublas]
    dtype: bf32
  rows:
    measures: row counts on dynamic dims
    specs: [ANCHORS]
    kernels: [anchor_gelu]
    rows: [16]
    compare: [eager]
    layout: {y: sliced}
    env: {PATH: /tmp}
  Shapes:
    measures: shapes that fit no kernel
    specs: [ANCHORS, missing.yaml]
    shapes: [[16, 4096], [0, 1]]
    compare: [eager]
    tables: nowhere
""",
    )
    code, out, err = run_cli("bench", "--suite", str(path))
    assert code == 2 and out == ""
    for message in (
        "suite.yaml:2:3: runs.anchors: missing field 'measures'",
        "suite.yaml:3:5: runs.anchors.measure: unknown field 'measure'; did you mean 'measures'?",
        "suite.yaml:5:15: runs.anchors.kernels[0]: no kernel 'anchor_gleu'; did you mean "
        "'anchor_gelu'?\n    the specs have anchor_gelu, anchor_swiglu, anchor_ew",
        "suite.yaml:6:22: runs.anchors.compare[1]: no variant 'cublas'; did you mean 'cublaslt'?"
        "\n    valid: eager, compile, max-autotune, cublaslt",
        "suite.yaml:7:12: runs.anchors.dtype: no dtype 'bf32'",
        "suite.yaml:12:11: runs.rows.rows: anchor_gelu: dims K, N are dynamic",
        "suite.yaml:14:13: runs.rows.layout: y=sliced: no input 'y'; inputs: b, w, x",
        "suite.yaml:15:11: runs.rows.env.PATH: 'PATH' is not a FUSEGEN_* setting",
        "runs.Shapes: run name 'Shapes' is not lower-case letters, digits and dashes",
        "runs.Shapes.specs[1]: no such file or folder: missing.yaml",
        "runs.Shapes.shapes[1]: [0, 1] is not a shape",
        "runs.Shapes.tables: no such folder: nowhere",
    ):
        assert message in err, (message, err)
    assert err.rstrip().endswith("fusegen: 12 errors; nothing written")

    (tmp_path / "empty.yaml").write_text("")
    code, _, err = run_cli("bench", "--suite", str(tmp_path / "empty.yaml"))
    assert code == 2 and "the file is empty" in err and "a suite is a mapping with a `runs:`" in err


def test_suite_options_are_checked(run_cli):
    """--suite takes no specs and none of the options a run sets; --runs and --list need
    --suite; an unknown run is named with the runs there are."""
    code, _, err = run_cli("bench", "--suite", str(SUITE), "specs", "--dtype", "fp16")
    assert code == 2 and "--suite takes only --runs, --list and --out; got specs, --dtype" in err
    code, _, err = run_cli("bench", "specs", "--runs", "examples")
    assert code == 2 and "--runs and --list go with --suite FILE" in err
    code, _, err = run_cli("bench")
    assert code == 2 and "give SPEC_OR_DIR, or --suite FILE" in err
    code, _, err = run_cli("bench", "--suite", str(SUITE), "--runs", "exampels")
    assert code == 2 and "has no run named exampels; runs: anchors-bf16," in err
    assert err.rstrip().endswith("did you mean 'examples'?")


def test_the_suite_runs_what_it_names_with_a_fake_timer(tmp_path, monkeypatch):
    """Each run: its kernels at its shapes, dtype and layouts, the variants it compares,
    its timer, its FUSEGEN_* settings (set during the run only); results in OUT/RUN/."""
    from fusegen import cli

    path = _suite(
        tmp_path,
        """\
runs:
  gelu-sliced:
    measures: anchor_gelu with x sliced, against eager and cuBLASLt
    specs: [ANCHORS]
    kernels: [anchor_gelu]
    shapes: [[7, 40, 24]]
    dtype: fp32
    layout: {x: sliced}
    compare: [eager, cublaslt]
  rows-untuned:
    measures: the row chains untuned, GPU time
    specs: [ROWS]
    kernels: [bench_layernorm]
    shapes: [[5, 40]]
    dtype: fp32
    compare: [eager]
    timer: graph
    tables: none
    env: {FUSEGEN_AUTOTUNE: 0}
""",
    )
    monkeypatch.delenv("FUSEGEN_AUTOTUNE", raising=False)
    suite = bench_suite.load(path)
    seen = []

    def timer(name):
        def fake(fn):
            fn()
            seen.append((name, os.environ.get("FUSEGEN_AUTOTUNE")))
            return 1.0

        return fake

    code = cli._bench_suite_work(
        tmp_path / "out",
        suite,
        suite.select(None),
        timers={"call": timer("call"), "graph": timer("graph")},
        ceilings=bench.Ceilings(700.0, 4000.0),
        device="cpu",
    )
    assert code == 0
    assert "FUSEGEN_AUTOTUNE" not in os.environ
    assert seen == [("call", None)] * 3 + [("graph", "0")] * 2
    sliced = json.loads((tmp_path / "out" / "gelu-sliced" / "bench.json").read_text())
    assert sliced["meta"]["command"].startswith(f"fusegen bench {ANCHORS} --kernels anchor_gelu")
    assert sliced["meta"]["suite"].endswith("suite.yaml --runs gelu-sliced")
    got = [(r["kernel"], tuple(r["shape"]), r["variant"], r["layout"]) for r in sliced["results"]]
    assert got == [
        ("anchor_gelu", (7, 40, 24), v, "x sliced")
        for v in ("fusegen", "eager", "cuBLASLt epilogue")
    ]
    rows = json.loads((tmp_path / "out" / "rows-untuned" / "bench.json").read_text())
    assert rows["meta"]["timer"] == "graph"
    assert rows["meta"]["command"].startswith("FUSEGEN_AUTOTUNE=0 fusegen bench")
    assert [(r["kernel"], r["variant"], r["ok"]) for r in rows["results"]] == [
        ("bench_layernorm", "fusegen", True),
        ("bench_layernorm", "eager", True),
    ]


# -- benchmarks/experiments: edits of the generated kernels' text -----------------------


def run_experiment(name: str, *args: str, interpret: bool) -> subprocess.CompletedProcess:
    """benchmarks/experiments/NAME.py ARGS in a process of its own, on the Triton
    interpreter or (Gluon, which has none: compiled for sm_90) without it; fails the
    test where it exits non-zero."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"PYTHONDONTWRITEBYTECODE": "1"} | ({"TRITON_INTERPRET": "1"} if interpret else {})
    script = ROOT / "benchmarks" / "experiments" / f"{name}.py"
    done = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return done


def test_the_attention_variants_still_apply_and_compute_right():
    # Each variant is a text edit of a generated module: one that no longer applies (the
    # generator moved on) or computes wrong fails here, on the CPU, not in a GPU call.
    done = run_experiment("attention_variants", "--check", interpret=True)
    assert "PASS" in done.stdout, done.stdout[-3000:]


def test_the_int4_decode_variants_match_float64():
    # Each unpacking of the words GEMV (pipelined loads, TMA, a byte's nibbles in one shift)
    # and the tile variants, on small odd shapes under the interpreter: a wrong one fails
    # here, not in a GPU call. Their errors are fp16's rounding of the output (2.7e-4).
    done = run_experiment("int4_unpack_variants", "--check", interpret=True)
    errors = [float(line.rsplit("error ", 1)[1]) for line in done.stdout.splitlines()]
    assert len(errors) == 12 and max(errors) < 1e-3, done.stdout


def test_the_stream_ceilings_read_kernel_reads_every_word_once():
    # Its GPU run asserts the same before timing; here a wrong grid or mask fails on the CPU.
    done = run_experiment("stream_ceiling", "--check", interpret=True)
    assert "PASS" in done.stdout, done.stdout[-3000:]


def test_dot_waits_compiles_the_attention_kernels_for_sm90(tmp_path):
    # dot_waits.py compiles the generated attention kernels ahead of time with its own
    # list of their constexprs: one the generator adds must reach that list (it went
    # stale once on INT64), or reading the compiler's schedule needs a GPU call to fail.
    subprocess.run(
        [sys.executable, "-m", "fusegen", "build", "benchmarks/specs/attention_anchors.yaml",
         "--out", str(tmp_path)],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    for kernel in ("forward", "kv", "q"):
        done = run_experiment(
            "dot_waits", "attention", str(tmp_path), "anchor_attention_t5", "--kernel", kernel,
            "--config", "64,64,4,2", interpret=False,
        )  # fmt: skip
        assert "0 bytes spill stores" in done.stdout, done.stdout


def test_the_gluon_attention_experiments_compile_for_sm90():
    # Gluon has no interpreter: the variants are compiled for sm_90 (no GPU needed), so a
    # Triton update that breaks them fails here, not in a GPU call.
    done = run_experiment(
        "attention_gluon_hopper", "--compile", "--variants", "pingpong-heads", "ws",
        interpret=False,
    )  # fmt: skip
    reports = [line for line in done.stdout.splitlines() if "registers" in line]
    assert len(reports) == 4 and all("0 bytes spill stores" in r for r in reports), done.stdout
    done = run_experiment("attention_gluon_backward", "--compile", interpret=False)
    # The runtime's dk/dv and dq kernels at four of the experiment's settings at head dim
    # 128, at 96, MLA's 192/128 and MLA's with 64-row dk/dv blocks, with ALiBi and a window,
    # and with delta from the dq kernel at 128, 96 and 192/128 (no spills in that kernel).
    assert done.stdout.count("registers") == 24, done.stdout
    delta_dq = [
        r
        for r in done.stdout.splitlines()
        if r.startswith("_attention_dq") and "delta_in_dq=True" in r
    ]
    assert len(delta_dq) == 3 and all("0 bytes spill stores" in r for r in delta_dq), delta_dq


def test_the_gluon_fp8_block_kernel_compiles_for_sm90_without_spills():
    # The block-scaled SwiGLU in Gluon (benchmarks/experiments/fp8_block_gluon.py) has no
    # interpreter to run on: each variant is compiled for sm_90, as its GPU run launches it.
    done = run_experiment("fp8_block_gluon", "--compile", interpret=False)
    reports = dict(line.split(":", 1) for line in done.stdout.splitlines())
    assert len(reports) == 7, done.stdout
    for variant, facts in reports.items():
        # 128-column tiles: one value (8 bytes) spilled outside the loop.
        spills = "8 bytes spill stores" if variant == "wide a-regs" else "0 bytes spill stores"
        assert spills in facts, (variant, facts)
        # Every K step's dots are waited for in full before their scales multiply them.
        in_full = re.search(r"aligned 0; (\d+) \| wait_group.sync.aligned (\d+)", facts)
        assert in_full and in_full[1] == in_full[2], (variant, facts)
    # Two m64n64 dots a step and consumer, or one m64n128 (joint).
    assert "wgmma.mma_async 16 " in reports["smem"] and "wgmma.mma_async 8 " in reports["joint"]
    assert "wgmma.mma_async 12 " in reports["joint c3"]
    assert "wgmma.mma_async 16 " in reports["wide a-regs"]


def test_the_gluon_int8_decode_kernel_compiles_for_sm90_without_spills():
    # benchmarks/experiments/int8_decode_gluon.py: each variant compiled for sm_90 at the
    # registers its GPU run launches it with (80 or 128 a thread: three or two programs
    # an SM), without spills.
    done = run_experiment("int8_decode_gluon", "--compile", interpret=False)
    reports = dict(line.split(":", 1) for line in done.stdout.splitlines())
    assert len(reports) == 5, done.stdout
    for variant, facts in reports.items():
        assert "0 bytes spill stores" in facts, (variant, facts)
        registers = 80 if "r80" in variant else 128
        assert f"Used {registers} registers" in facts, (variant, facts)


def test_the_gluon_int4_decode_kernel_compiles_for_sm90_without_a_layout_conversion():
    # benchmarks/experiments/int4_decode_gluon.py: the packed bytes are loaded in a layout
    # whose nibbles are wgmma's register operand as they stand. A conversion through
    # shared memory (a wrong layout) would add dozens of st.shared; the kernel has three
    # (the split-K arrival's broadcast and the barriers' setup), and the ones-smem
    # variants 8 more (a thread's 64 ones of the [64, 128] tile, stored once).
    done = run_experiment("int4_decode_gluon", "--compile", interpret=False)
    reports = dict(line.split(":", 1) for line in done.stdout.splitlines())
    assert len(reports) == 14, done.stdout
    for variant, facts in reports.items():
        assert "0 bytes spill stores" in facts, (variant, facts)
        stores = 11 if "ones-smem" in variant else 3
        assert f"st.shared {stores} " in facts, (variant, facts)
        registers = 80 if "r80" in variant else 96 if "r96" in variant else 128
        assert f"Used {registers} registers" in facts, (variant, facts)


def test_the_fp8_block_experiment_edits_the_generated_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "benchmarks" / "experiments"))
    try:
        from fp8_block_scale_fma import tma_source, two_multiply_source
    finally:
        del sys.path[:2]
    text = (ROOT / "generated" / "deepseek_mlp_fp8.py").read_text()
    edited = two_multiply_source(text)
    assert edited.count("if False:") == 2
    compile(edited, "deepseek_mlp_fp8.py", "exec")
    edited = tma_source(text)
    assert edited.count("_desc.load(") == 3 and "tl.load(\n            x_ptr" not in edited
    compile(edited, "deepseek_mlp_fp8.py", "exec")


def test_dot_waits_reads_which_dots_triton_leaves_in_flight():
    # Compiled for sm_90 without a GPU (so not under the interpreter): the block-scaled
    # fp8 K step multiplies each dot by its scales, so Triton 3.6 waits on it at once; a
    # row-wise scaled chain's dot stays in flight (its wait leaves one pending). A Triton
    # that changes this changes what the block-scaled kernel can reach (RESULTS, issue 31).

    def waits(module):
        done = run_experiment(
            "dot_waits", "quantized", f"generated/{module}.py", "--config", "128,128,128,8,3",
            interpret=False,
        )  # fmt: skip
        lines = [line.strip() for line in done.stdout.splitlines()[1:]]
        assert "registers" in lines[-1] and "programs an SM" in lines[-1], lines
        return lines[:-1]

    assert waits("deepseek_mlp_fp8") == [
        "dot 1 (A from shared memory): waited at once (its wait: pendings 0)",
        "dot 2 (A from shared memory): waited at once (its wait: pendings 0)",
    ]
    assert waits("gelu_fp8_rowwise") == [
        "dot 1 (A from shared memory): in flight (its wait: pendings 1)"
    ]


def test_the_anchors_say_each_row_s_issue_29_verdict():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from attention_anchors import CASES, TARGETS, verdict
    finally:
        del sys.path[0]
    assert set(TARGETS) <= set(CASES)
    fast, slow = {"ms": 1.0}, {"ms": 2.0}
    assert verdict("causal", fast, slow, None) == ">= 1.00x sdpa: met"
    assert verdict("causal", slow, fast, None) == ">= 1.00x sdpa: missed"
    assert verdict("d96", {"ms": 1.04}, {"ms": 1.0}, None) == ">= 0.95x sdpa: met"
    # Against both anchors: the slower ratio decides; a missing anchor is said so.
    assert verdict("padding-bias", fast, slow, {"ms": 0.9}).endswith("missed")
    assert verdict("padding-bias", fast, slow, None) == ">= 1.00x sdpa and flex: not measured"
    assert verdict("alibi", {"ms": 1.0}, None, {"ms": 1.6}) == ">= 1.50x flex: met"
    assert verdict("decode", fast, slow, slow) == "-"


def test_the_anchors_leave_out_a_variant_whose_output_is_wrong():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from attention_anchors import anchors_of
    finally:
        del sys.path[0]

    def entry(ms, error):
        return {"ms": ms, "rounds": [ms], "error": error, "tflops": 1.0}

    # The H100's decode-gqa row of 2026-12-05: cuDNN's and Flex's causal mask at one query
    # is top-left, so they read one key and ran "2.7x faster" with an error of 39.
    row = {
        "fusegen": entry(0.105, 2.3e-3),
        "sdpa flash": {"error_text": "RuntimeError: No available kernel."},
        "sdpa cudnn": entry(0.039, 39.0),
        "sdpa efficient": entry(0.2, 2.4e-3),
        "flex (compiled)": entry(0.090, 39.0),
    }
    mine, sdpa_name, sdpa, flex, wrong = anchors_of(row)
    assert mine["ms"] == 0.105 and sdpa_name == "sdpa efficient" and sdpa["ms"] == 0.2
    assert flex is None and wrong == {"sdpa cudnn": 39.0, "flex (compiled)": 39.0}
    row["fusegen"] = entry(0.105, 0.5)  # fusegen wrong: it is the one left out
    assert anchors_of(row)[4] == {"fusegen": 0.5, "sdpa cudnn": 39.0, "flex (compiled)": 39.0}


def test_the_anchors_host_report_says_host_and_wall_time_and_where_it_went(monkeypatch, capsys):
    """attention_anchors.py --host on a stand-in step (the CPU: no GPU to wait for): the
    host and wall time per step, then the CPU ops and the Python functions that took the
    host's time, the step's own among them."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from attention_anchors import host_report
    finally:
        del sys.path[0]
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    x = torch.randn(32, 32, requires_grad=True)

    def a_training_step():
        torch.autograd.grad((x @ x).sum(), [x])

    host_report(a_training_step, steps=3)
    lines = capsys.readouterr().out.splitlines()
    host, wall = (float(lines[0].split()[i]) for i in (1, 4))
    assert lines[0].startswith("  host ") and 0 < host <= wall
    assert any("aten::mm" in line for line in lines[1:11])
    assert any(line.startswith("  py ") and "a_training_step" in line for line in lines)
