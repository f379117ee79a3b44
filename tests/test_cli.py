"""The `fusegen` command: exit codes, messages, and that errors write nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

ERROR_SPECS = sorted((ROOT / "tests" / "specs_with_errors").glob("*.yaml"))
# The runtime package a build copies beside the kernel modules.
RUNTIME_FILES = sorted(p.name for p in (ROOT / "fusegen" / "runtime").glob("*.py"))

GOOD = """
kernels:
  - name: relu_plus
    dims: {M: dynamic, N: dynamic}
    inputs: {x: [M, N], r: [M, N]}
    chain: [{input: x}, relu, {add: r}]
"""


@pytest.mark.parametrize("spec", ERROR_SPECS, ids=lambda p: p.stem)
def test_bad_spec_prints_every_error_and_exits_2(spec, run_cli):
    code, out, err = run_cli("validate", str(spec.relative_to(ROOT)), cwd=ROOT)
    assert code == 2
    assert out == ""
    assert err == spec.with_suffix(".expected").read_text(encoding="utf-8")


@pytest.mark.parametrize("spec", ERROR_SPECS, ids=lambda p: p.stem)
def test_bad_spec_builds_nothing(spec, run_cli, tmp_path):
    # A good spec beside the bad one must not be written either: all or nothing.
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    out_dir = tmp_path / "out"
    code, _, err = run_cli("build", str(good), str(spec), "--out", str(out_dir))
    assert code == 2
    assert "nothing written" in err
    assert not out_dir.exists()


def test_every_error_names_file_line_and_spec_path():
    for expected in ROOT.glob("tests/specs_with_errors/*.expected"):
        for line in expected.read_text().splitlines():
            if line.startswith("tests/"):
                location, path, message = line.split(": ", 2)
                assert location.startswith(f"tests/specs_with_errors/{expected.stem}.yaml"), line
                assert path and message, line


def test_build_writes_modules_and_reports(write_spec, run_cli, tmp_path):
    spec = write_spec(GOOD)
    code, out, err = run_cli("build", str(spec), "--out", str(tmp_path / "gen"))
    assert code == 0, err
    assert (tmp_path / "gen" / "relu_plus.py").is_file()
    assert (tmp_path / "gen" / "test_relu_plus.py").is_file()
    assert (tmp_path / "gen" / "_fusegen_runtime" / "chains.py").is_file()  # launch support
    assert f"1 kernel(s), {2 + len(RUNTIME_FILES)} file(s) written" in out
    # A second build changes nothing.
    code, out, _ = run_cli("build", str(spec), "--out", str(tmp_path / "gen"))
    assert code == 0 and f"0 file(s) written, {2 + len(RUNTIME_FILES)} unchanged" in out


def test_check_reports_missing_and_changed_files(write_spec, run_cli, tmp_path):
    spec = write_spec(GOOD)
    gen = tmp_path / "gen"
    code, _, err = run_cli("build", "--check", str(spec), "--out", str(gen))
    assert code == 1
    assert "relu_plus.py: missing" in err and not gen.exists()

    run_cli("build", str(spec), "--out", str(gen))
    assert run_cli("build", "--check", str(spec), "--out", str(gen))[0] == 0

    module = gen / "relu_plus.py"
    module.write_text(module.read_text() + "# hand edit\n")
    code, _, err = run_cli("build", "--check", str(spec), "--out", str(gen))
    assert code == 1 and "relu_plus.py: differs" in err
    assert module.read_text().endswith("# hand edit\n"), "--check must not write"


def test_renamed_kernel_leaves_no_stale_module(write_spec, run_cli, tmp_path):
    spec = write_spec(GOOD)
    gen = tmp_path / "gen"
    run_cli("build", str(spec), "--out", str(gen))
    spec.write_text(GOOD.replace("relu_plus", "relu_add"))
    code, _, err = run_cli("build", "--check", str(spec), "--out", str(gen))
    assert code == 1 and "relu_plus.py: no kernel in the specs makes it any more" in err
    code, out, _ = run_cli("build", str(spec), "--out", str(gen))
    assert code == 0 and "removed" in out
    assert sorted(p.name for p in gen.iterdir()) == [
        "_fusegen_runtime",
        "relu_add.py",
        "test_relu_add.py",
    ]


def test_renamed_kernels_hub_leaves_no_old_package(write_spec, run_cli, tmp_path):
    # metadata.json names one package: the old name's is removed, its tuned table moved
    # into the new one; a package holding a file of the user's is left alone.
    spec = write_spec(GOOD)
    repo, variant = tmp_path / "repo", tmp_path / "repo" / "build" / "torch-universal"
    for name in ("kept-name", "first-name"):
        assert run_cli("build", str(spec), "--out", str(repo), "--kernels-hub", name)[0] == 0
        (variant / "kept_name" / "notes.txt").write_text("mine")
    (variant / "first_name" / "relu_plus.tuned.json").write_text("{}")
    args = ("build", str(spec), "--out", str(repo), "--kernels-hub", "new-name")
    code, _, err = run_cli(*args, "--check")
    assert code == 1 and "first_name: a package of an earlier --kernels-hub name" in err
    assert "kept_name" not in err
    code, out, _ = run_cli(*args)
    assert code == 0 and "first_name (a package of an earlier --kernels-hub name)" in out
    assert sorted(p.name for p in variant.iterdir()) == [
        "kept_name",
        "metadata.json",
        "new_name",
    ]
    assert (variant / "new_name" / "relu_plus.tuned.json").read_text() == "{}"
    assert (variant / "kept_name" / "notes.txt").exists()
    err = run_cli(*args, "--check")[2]
    assert "package of an earlier" not in err and "relu_plus.tuned.json" in err  # "{}"


def test_a_renamed_hub_keeps_the_new_packages_own_table(write_spec, run_cli, tmp_path):
    spec = write_spec(GOOD)
    repo, variant = tmp_path / "repo", tmp_path / "repo" / "build" / "torch-universal"
    assert run_cli("build", str(spec), "--out", str(repo), "--kernels-hub", "old-name")[0] == 0
    (variant / "old_name" / "relu_plus.tuned.json").write_text("old")
    (variant / "new_name").mkdir()
    (variant / "new_name" / "relu_plus.tuned.json").write_text("new")
    assert run_cli("build", str(spec), "--out", str(repo), "--kernels-hub", "new-name")[0] == 0
    assert (variant / "new_name" / "relu_plus.tuned.json").read_text() == "new"
    assert not (variant / "old_name").exists()


def test_a_build_keeps_another_specs_modules_and_tuned_tables(write_spec, run_cli, tmp_path):
    # Two specs built into one folder, then one rebuilt alone: the other's module and its
    # tuned table (GPU measurements) are not this build's to remove.
    from fusegen import tables

    a = write_spec(GOOD, "a.yaml")
    b = write_spec(GOOD.replace("relu_plus", "relu_other"), "b.yaml")
    gen = tmp_path / "gen"
    assert run_cli("build", str(a), str(b), "--out", str(gen))[0] == 0
    display = next(line for line in (gen / "relu_other.py").read_text().splitlines()[:1])
    spec = display.split(" from ")[1].split(" (")[0]
    (gen / "relu_other.tuned.json").write_text(tables.render("relu_other", spec, []))
    code, out, _ = run_cli("build", str(a), "--out", str(gen))
    assert code == 0 and "removed" not in out
    assert (gen / "relu_other.py").exists() and (gen / "relu_other.tuned.json").exists()
    assert run_cli("build", str(a), "--out", str(gen), "--check")[0] == 0


def test_kernel_name_used_in_two_files(write_spec, run_cli):
    a = write_spec(GOOD, "a.yaml")
    b = write_spec(GOOD, "b.yaml")
    code, _, err = run_cli("validate", str(a.parent))
    assert code == 2
    assert f"{b.name}:2:11: kernels[0].name: kernel name 'relu_plus' is also used in" in err
    assert a.name in err


def test_kernel_names_differing_only_in_case_clash(write_spec, run_cli):
    # relu_plus.py and Relu_Plus.py are one file on macOS and Windows.
    a = write_spec(GOOD, "a.yaml")
    write_spec(GOOD.replace("relu_plus", "Relu_Plus"), "b.yaml")
    code, _, err = run_cli("validate", str(a.parent))
    assert code == 2 and "kernel name 'Relu_Plus' is also used in" in err
    assert "(as 'relu_plus')" in err and "differ only in case" in err


def test_missing_path_and_empty_folder(run_cli, tmp_path):
    code, _, err = run_cli("validate", str(tmp_path / "nope.yaml"))
    assert code == 2 and "no such file or folder" in err
    code, _, err = run_cli("validate", str(tmp_path))
    assert code == 2 and "no .yaml or .yml spec files" in err


def test_validate_ok(write_spec, run_cli):
    code, out, _ = run_cli("validate", str(write_spec(GOOD)))
    assert code == 0 and "relu_plus: ok" in out


def test_schema_is_json_and_describes_every_op(run_cli):
    from fusegen import ops

    code, out, _ = run_cli("schema")
    assert code == 0
    schema = json.loads(out)
    chain = schema["$defs"]["KernelSpec"]["properties"]["chain"]["items"]
    named = {key for form in chain["anyOf"] for key in form.get("properties", {})}
    assert set(ops.ALL_OPS) <= named


def test_example_specs_match_the_schema(run_cli):
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    schema = json.loads(run_cli("schema")[1])
    for spec in sorted((ROOT / "specs").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(spec.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"kernels": [{"name": "k", "chain": [{"gleu": None}]}]}, schema)


def test_usage_errors_exit_2(capsys):
    from fusegen.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["build"])
    assert exc.value.code == 2
    assert "SPEC_OR_DIR" in capsys.readouterr().err


def test_runs_as_module_and_script(tmp_path, write_spec):
    spec = write_spec(GOOD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "fusegen", "validate", str(spec)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "relu_plus: ok" in result.stdout


def test_write_is_atomic(write_spec, tmp_path, monkeypatch, run_cli):
    """A write that fails half-way leaves the previous file whole and no temp files."""
    from fusegen import writer

    spec = write_spec(GOOD)
    gen = tmp_path / "gen"
    run_cli("build", str(spec), "--out", str(gen))
    before = {p: p.read_text() for p in gen.rglob("*") if p.is_file()}
    spec.write_text(GOOD.replace("relu, {add: r}", "silu, {add: r}"))

    real_replace = os.replace

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(writer.os, "replace", failing_replace)
    code, _, err = run_cli("build", str(spec), "--out", str(gen))
    assert code == 2 and "disk full (0 of" in err
    monkeypatch.setattr(writer.os, "replace", real_replace)
    assert {p: p.read_text() for p in gen.rglob("*") if p.is_file()} == before
    assert not [p for p in gen.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.parametrize("in_the_way", ["runtime file", "module folder", "out file"])
def test_a_path_that_cannot_be_written_writes_nothing(write_spec, tmp_path, run_cli, in_the_way):
    """A file where the runtime's folder goes, a folder where a module goes, or --out
    naming a file: exit 2 with the path, and nothing written (the modules were written
    before the runtime failed)."""
    spec = write_spec(GOOD)
    out = tmp_path / "gen"
    if in_the_way == "out file":
        out.write_text("not a folder")
    else:
        out.mkdir()
        if in_the_way == "runtime file":
            (out / "_fusegen_runtime").write_text("")
        else:
            (out / "relu_plus.py").mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, _, err = run_cli("build", str(spec), "--out", str(out))
    assert code == 2 and "nothing written" in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    code, _, err = run_cli("build", "--check", str(spec), "--out", str(out))
    assert code == 1


def test_check_and_build_read_any_bytes_at_a_generated_path(write_spec, tmp_path, run_cli):
    spec = write_spec(GOOD)
    out = tmp_path / "gen"
    run_cli("build", str(spec), "--out", str(out))
    (out / "relu_plus.py").write_bytes(b"\xff\xfe not utf-8")
    code, _, err = run_cli("build", "--check", str(spec), "--out", str(out))
    assert code == 1 and "relu_plus.py: differs" in err
    code, _, _ = run_cli("build", str(spec), "--out", str(out))
    assert code == 0 and (out / "relu_plus.py").read_text().startswith("# Generated")


def test_check_examples_are_up_to_date(run_cli):
    code, out, err = run_cli("build", "--check", "specs", cwd=ROOT)
    assert code == 0, err
    assert "up to date" in out


def test_display_path_is_repo_relative(run_cli, tmp_path):
    # Run from elsewhere: the header still names specs/... relative to the repository.
    gen = tmp_path / "gen"
    code, _, _ = run_cli(
        "build", str(ROOT / "specs" / "bert.yaml"), "--out", str(gen), cwd=tmp_path
    )
    assert code == 0
    assert (gen / "bert_intermediate.py").read_text() == (
        ROOT / "generated" / "bert_intermediate.py"
    ).read_text()


def test_spec_outside_a_repo_is_named_relative_to_cwd(tmp_path, run_cli):
    (tmp_path / "specs").mkdir()
    spec = tmp_path / "specs" / "k.yaml"
    spec.write_text(GOOD)
    run_cli("build", "specs", "--out", "gen", cwd=tmp_path)
    text = Path(tmp_path / "gen" / "relu_plus.py").read_text()
    assert "from specs/k.yaml (sha256 " in text.splitlines()[0]
    assert str(tmp_path) not in text


def test_check_covers_the_folders_runtime(write_spec, run_cli, tmp_path):
    spec = write_spec(GOOD)
    gen = tmp_path / "gen"
    run_cli("build", str(spec), "--out", str(gen))
    runtime = gen / "_fusegen_runtime" / "settings.py"
    runtime.write_text(runtime.read_text().replace("SHORTLIST = 3", "SHORTLIST = 9"))
    code, _, err = run_cli("build", "--check", str(spec), "--out", str(gen))
    assert code == 1 and "settings.py: differs" in err
    runtime.unlink()
    code, _, err = run_cli("build", "--check", str(spec), "--out", str(gen))
    assert code == 1 and "settings.py: missing" in err


def test_build_removes_what_the_runtime_no_longer_holds(write_spec, run_cli, tmp_path):
    """The single-file runtime of earlier versions, and a runtime module this fusegen
    does not write, are stale: --check names them, build removes them."""
    spec = write_spec(GOOD)
    gen = tmp_path / "gen"
    run_cli("build", str(spec), "--out", str(gen))
    header = (gen / "_fusegen_runtime" / "ops.py").read_text().split("\n", 1)[0]
    for stale in (gen / "_fusegen_runtime.py", gen / "_fusegen_runtime" / "gone.py"):
        stale.write_text(header + "\n")
    (gen / "_fusegen_runtime" / "mine.py").write_text("# a user's file: kept\n")
    code, _, err = run_cli("build", "--check", str(spec), "--out", str(gen))
    assert code == 1 and "gone.py: no kernel in the specs makes it any more" in err
    code, out, _ = run_cli("build", str(spec), "--out", str(gen))
    assert code == 0 and "removed" in out
    assert not (gen / "_fusegen_runtime.py").exists()
    assert sorted(p.name for p in (gen / "_fusegen_runtime").iterdir()) == sorted(
        ["mine.py", *RUNTIME_FILES]
    )


def test_a_spec_file_removed_from_a_folder_leaves_stale_modules(tmp_path, run_cli):
    # The folder build no longer reads b.yaml: its module is stale, as a removed kernel's.
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a.yaml").write_text(GOOD)
    (specs / "b.yaml").write_text(GOOD.replace("relu_plus", "other"))
    gen = tmp_path / "gen"
    assert run_cli("build", str(specs), "--out", str(gen), cwd=tmp_path)[0] == 0
    (specs / "b.yaml").unlink()
    code, _, err = run_cli("build", "--check", "specs", "--out", "gen", cwd=tmp_path)
    assert code == 1 and "other.py: no kernel in the specs makes it any more" in err
    assert run_cli("build", "specs", "--out", "gen", cwd=tmp_path)[0] == 0
    assert not (gen / "other.py").exists() and (gen / "relu_plus.py").exists()


def test_specs_of_one_file_name_in_two_folders_keep_their_modules(tmp_path, run_cli):
    # Outside any repository a spec is named by its path from the working directory, so
    # two model.yaml files built into one folder do not take each other's modules for
    # their own (the second build removed the first's).
    for folder, text in (("one", GOOD), ("two", GOOD.replace("relu_plus", "other"))):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.yaml").write_text(text)
    (tmp_path / "work").mkdir()
    for folder in ("one", "two"):
        code, out, _ = run_cli(
            "build", f"../{folder}/model.yaml", "--out", "../gen", cwd=tmp_path / "work"
        )
        assert code == 0 and "removed" not in out
    assert (tmp_path / "gen" / "relu_plus.py").exists() and (tmp_path / "gen" / "other.py").exists()


def test_gpu_commands_refuse_shapes_no_kernel_takes(run_cli):
    # Checked before a GPU is asked for: a 2-value shape for matmuls, a fixed dim asked
    # otherwise (each was dropped, and tune exited 0 having done nothing).
    for shape, message in (("16,768", "a shape is M,K,N"), ("16,999,3072", "fixes K = 768")):
        code, _, err = run_cli("tune", "specs/gpt2.yaml", "--shapes", shape, cwd=ROOT)
        assert code == 2 and "no --shapes value applies" in err and message in err, err


def test_tools_pass_over_loss_heads(run_cli):
    # A loss head has no configs: bench and tune name it and point at its benchmark.
    for command in ("bench", "tune"):
        code, _, err = run_cli(command, "specs/lm_head.yaml", cwd=ROOT)
        assert code == 2 and "a loss head has no configs" in err, err
        assert "benchmarks/lm_head_loss.py" in err


def test_a_reader_that_stops_early_gets_no_traceback():
    # `fusegen schema | head`: the schema (70 KB) outlasts the pipe's buffer.
    child = subprocess.Popen(
        [sys.executable, "-m", "fusegen", "schema"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    child.stdout.read(10)
    child.stdout.close()
    assert child.wait(timeout=60) == 141
    assert child.stderr.read() == b""
