"""Hostile specs fail fast, located, in bounded memory, writing nothing (fusegen.spec.limits).

The small hostile files live in tests/specs_with_errors (alias_bomb, recursive_anchors,
yaml_tags, huge_integers, large_values, control_characters); the large ones are made
here, in tmp_path.
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT
from fusegen.errors import SpecErrors
from fusegen.spec import limits, source

KERNEL = """\
  - name: {name}
    dims: {{M: dynamic, N: dynamic}}
    inputs: {{x: [M, N]}}
    chain: [{{input: x}}, relu]
"""


def kernels(*names: str) -> str:
    return "kernels:\n" + "".join(KERNEL.format(name=n) for n in names)


@pytest.fixture
def rejects(run_cli, tmp_path):
    """Build `paths` into a fresh folder: exit 2, nothing written, within 10 s; return
    the error output."""

    def check(*paths) -> str:
        out_dir = tmp_path / "out"
        start = time.monotonic()
        code, out, err = run_cli("build", "--out", str(out_dir), *map(str, paths))
        assert time.monotonic() - start < 10
        assert code == 2, out + err
        assert "nothing written" in err and "Traceback" not in err
        assert not out_dir.exists()
        return err

    return check


def test_file_size_is_checked_before_reading(tmp_path, rejects):
    spec = tmp_path / "big.yaml"
    spec.write_text(kernels("k") + "#" * limits.MAX_BYTES)
    err = rejects(spec)
    assert f"big.yaml: (top level): the file is {spec.stat().st_size:,} bytes" in err
    assert f"at most {limits.MAX_BYTES:,} bytes" in err


def test_the_byte_budget_is_shared_by_a_build(tmp_path, rejects, monkeypatch):
    monkeypatch.setattr(limits, "MAX_BYTES", 4000)
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(kernels("a") + "#" * 2500 + "\n")
    b.write_text(kernels("b") + "#" * 2500 + "\n")
    err = rejects(a, b)
    assert f"b.yaml: (top level): the file is {b.stat().st_size:,} bytes, after " in err
    assert "a.yaml" not in err


def test_non_regular_files_are_not_read(tmp_path, rejects):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    assert f"{fifo}: (top level): not a regular file" in rejects(fifo)


def test_a_folder_of_too_many_specs_is_refused_before_reading(tmp_path, rejects):
    for i in range(limits.MAX_FILES + 1):
        (tmp_path / f"s{i}.yaml").write_text("not: [valid")
    err = rejects(tmp_path)
    assert f"{limits.MAX_FILES + 1:,} spec files in this build" in err
    assert "not valid YAML" not in err


def test_deep_nesting_stops_the_composer(tmp_path, rejects):
    spec = tmp_path / "deep.yaml"
    spec.write_text("kernels: " + "[" * 100_000 + "]" * 100_000 + "\n")
    err = rejects(spec)
    column = len("kernels: ") + limits.MAX_DEPTH  # the first list past the limit
    assert f"deep.yaml:1:{column}: (top level): lists and mappings nested more than" in err


def test_deep_nesting_through_aliases_and_merges(write_spec, rejects):
    half = limits.MAX_DEPTH // 2 + 1
    spec = write_spec(
        "a: &a " + "[" * half + "]" * half + "\nkernels: " + "[" * half + "*a" + "]" * half + "\n"
    )
    # At the alias use that makes the value too deep.
    err = rejects(spec)
    assert "spec.yaml:2:" + str(len("kernels: ") + half + 1) + ": kernels" + "[0]" * half in err
    lines = ["m0: &m0 {x: 1}"] + [f"m{i}: &m{i} {{<<: *m{i - 1}}}" for i in range(1, 40)]
    spec = write_spec("\n".join(lines) + "\nkernels: []\n")
    # The file's mapping, m31's and 31 merges down to m0 would be 33 levels.
    assert f"spec.yaml:{limits.MAX_DEPTH}:16: m{limits.MAX_DEPTH - 1}: lists and" in rejects(spec)


def test_too_many_values_stop_the_composer(write_spec, rejects):
    spec = write_spec("kernels: [" + ", ".join(["1"] * limits.MAX_NODES) + "]\n")
    assert f"more than {limits.MAX_NODES:,} YAML values" in rejects(spec)


def test_long_values(write_spec, rejects):
    spec = write_spec(f"""
        kernels:
          - name: k
            doc: {"x" * 6000}
            dims: {{M: dynamic, N: {"9" * 5000}}}
        """)
    err = rejects(spec)
    assert "spec.yaml:3:10: kernels[0].doc: a value of 6,000 characters" in err
    assert "spec.yaml:4:27: kernels[0].dims.N: a value of 5,000 characters" in err
    assert f"at most {limits.MAX_SCALAR_CHARS:,} characters" in err


def test_integers_past_64_bits_are_refused_both_signs(write_spec):
    # Checked by size: a negative one was let through (abs() dropped) and reached Python.
    data = source.load(write_spec(f"a: {2**63 - 1}\nb: {-(2**63 - 1)}\n")).data
    assert data == {"a": 2**63 - 1, "b": -(2**63 - 1)}
    for big in (2**63, -(2**63), -(10**26)):
        with pytest.raises(SpecErrors, match="out of range"):
            source.load(write_spec(f"a: {big}\n"))


def test_kernels_per_file_and_per_build(tmp_path, rejects):
    spec = tmp_path / "many.yaml"
    spec.write_text(kernels(*(f"k{i}" for i in range(limits.MAX_KERNELS_PER_FILE + 1))))
    err = rejects(spec)
    assert f"many.yaml:2:3: kernels: {limits.MAX_KERNELS_PER_FILE + 1} kernels in one file" in err

    per_file = limits.MAX_KERNELS_PER_FILE
    files = []
    for f in range(limits.MAX_KERNELS // per_file + 1):
        files.append(tmp_path / f"part{f}.yaml")
        files[-1].write_text(kernels(*(f"k{f}_{i}" for i in range(per_file))))
    err = rejects(*files)
    assert f"more than {limits.MAX_KERNELS} kernels in this build" in err
    assert err.count("kernels in this build") == 1


def test_counts_in_a_kernel(write_spec, rejects):
    n = limits.MAX_INPUTS + 1
    inputs = ", ".join(f"r{i}: [M, N]" for i in range(n))
    dims = ", ".join(f"D{i}: 8" for i in range(limits.MAX_DIMS + 1))
    steps = ", ".join(["relu"] * limits.MAX_CHAIN_STEPS)
    config = "      - {BLOCK_M: 16, BLOCK_N: 64, num_warps: 4}\n"
    spec = write_spec(
        "kernels:\n  - name: k\n"
        f"    dims: {{{dims}}}\n"
        f"    inputs: {{{inputs}}}\n"
        f"    chain: [{{input: r0}}, {steps}]\n"
        "    autotune:\n      configs:\n" + config * (limits.MAX_CONFIGS + 1)
    )
    err = rejects(spec)
    assert f"spec.yaml:3:11: kernels[0].dims: {limits.MAX_DIMS + 1} dims" in err
    assert f"spec.yaml:4:13: kernels[0].inputs: {n} inputs" in err
    assert f"spec.yaml:5:12: kernels[0].chain: {limits.MAX_CHAIN_STEPS + 1} chain steps" in err
    assert f"kernels[0].autotune.configs: {limits.MAX_CONFIGS + 1} configs" in err
    assert f"a kernel has at most {limits.MAX_CHAIN_STEPS} chain steps" in err


def test_bytes_yaml_does_not_allow(tmp_path, rejects):
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"kernels:\n  - name: k\x00\n")
    assert "nul.yaml:2:12: (top level): not valid YAML: the control character U+0000" in (
        rejects(nul)
    )
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"kernels:\n  - name: caf\xe9\n")
    assert "latin1.yaml:2:14: (top level): cannot read the file: byte 0xe9 is not UTF-8" in (
        rejects(latin1)
    )


def test_bom_and_old_line_endings_still_read(tmp_path, run_cli):
    spec = tmp_path / "k.yaml"
    spec.write_bytes(b"\xef\xbb\xbf" + kernels("k").replace("\n", "\r").encode())
    code, out, err = run_cli("validate", str(spec))
    assert code == 0, err


def test_a_file_name_cannot_reach_the_generated_headers(tmp_path, rejects):
    # The name is copied into each generated module's header comment.
    spec = tmp_path / 'k\nimport os; os.system("echo pwned")\n#.yaml'
    spec.write_text(kernels("k"))
    err = rejects(tmp_path)
    assert "the file name holds the control character U+000A" in err
    assert "k\\nimport os" in err  # printed escaped, on one line


def test_hostile_specs_stay_within_memory(tmp_path):
    """Each hostile spec, in a process limited to 512 MB of address space (a normal build
    needs under 150), exits 2 within seconds; before the limits, the alias bomb grew past
    4.6 GB and never finished."""
    (tmp_path / "deep.yaml").write_text("kernels: " + "[" * 100_000 + "]" * 100_000 + "\n")
    (tmp_path / "wide.yaml").write_text("kernels: [" + ",".join(["1"] * 200_000) + "]\n")
    script = textwrap.dedent("""
        import resource, sys, time
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
        from fusegen.cli import main
        for spec in sys.argv[1:]:
            start = time.monotonic()
            code = main(["build", "--out", "out", spec])
            print(spec, code, round(time.monotonic() - start, 2), flush=True)
        """)
    specs = [
        ROOT / "tests" / "specs_with_errors" / f"{n}.yaml"
        for n in ("alias_bomb", "recursive_anchors")
    ]
    specs += [tmp_path / "deep.yaml", tmp_path / "wide.yaml"]
    result = subprocess.run(
        [sys.executable, "-c", script, *map(str, specs)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "out").exists()
    rows = [line.split() for line in result.stdout.splitlines()]
    assert [r[0] for r in rows] == list(map(str, specs)), result.stderr[-2000:]
    for spec, code, seconds in rows:
        assert code == "2" and float(seconds) < 10, (spec, code, seconds)


def test_docs_cannot_inject_code(write_spec, run_cli, tmp_path):
    import ast

    code_text = '{q} + __import__("os").system("echo pwned") + {q}'.format(q='"' * 3)
    spec = write_spec(
        "kernels:\n"
        "  - name: k\n"
        f"    doc: 'a {code_text} b \\'\n"
        "    dims: {M: dynamic, N: dynamic}\n"
        f"    inputs: {{x: {{shape: [M, N], doc: 'c {code_text} d'}}}}\n"
        "    chain: [{input: x}, relu]\n"
    )
    code, _, err = run_cli("build", str(spec), "--out", str(tmp_path / "gen"))
    assert code == 0, err
    tree = ast.parse((tmp_path / "gen" / "k.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "system"]
    assert not calls, f"the spec's text became code at line {calls[0].lineno}"
