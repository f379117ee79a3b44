"""A generated module works however it is imported: as a package member, from a folder
on sys.path, and loaded by file path (as plugin loaders and notebooks do) — eagerly,
inside torch.compile (fullgraph) and, on a GPU, replayed from a CUDA graph. Each style
runs in a fresh process, so no import of another style can stand in for it."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

MODULE = "bias_gelu_residual"  # elementwise: quick on the Triton interpreter

CHILD = f"""
import importlib, importlib.util, os, sys
import torch

cuda = torch.cuda.is_available()
if not cuda:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton.jit reads it
style, folder = sys.argv[1], sys.argv[2]
if style == "package":
    sys.path.insert(0, folder)
    module = importlib.import_module("kernels.{MODULE}")
elif style == "sys_path":
    sys.path.insert(0, os.path.join(folder, "kernels"))
    module = importlib.import_module("{MODULE}")
else:
    spec = importlib.util.spec_from_file_location(
        "plugin_{MODULE}", os.path.join(folder, "kernels", "{MODULE}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
launcher = module.{MODULE}
device = "cuda" if cuda else "cpu"
generator = torch.Generator().manual_seed(0)
inputs = [torch.randn(shape, generator=generator).to(torch.float16).to(device)
          for shape in ((37, 96), (96,), (37, 96))]
exact = module.reference(*[t.double() for t in inputs], out_dtype=torch.float64)


def check(what, y):
    # Loose on purpose: the generated tests bound the numerics; this is about imports.
    error = ((y.double() - exact).abs() / (1 + exact.abs())).max().item()
    assert error < 1e-2, (style, what, error)
    print(style, what, "ok", module.last_launch()["source"])


check("eager", launcher(*inputs))
backend = "inductor" if cuda else "aot_eager"
compiled = torch.compile(lambda *t: launcher(*t) * 2, backend=backend, fullgraph=True)
check("compiled", compiled(*inputs) / 2)
if cuda:
    out = torch.full_like(inputs[0], float("nan"))
    launcher(*inputs, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launcher(*inputs, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check("cuda graph", out)
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder holding the package `kernels` with the generated module in it."""
    root = tmp_path_factory.mktemp("imports")
    package = root / "kernels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(ROOT / "generated" / f"{MODULE}.py", package)
    shutil.copytree(ROOT / "generated" / "_fusegen_runtime", package / "_fusegen_runtime")
    return root


@pytest.mark.parametrize("style", ["package", "sys_path", "by_path"])
def test_import_style(folder, style):
    result = subprocess.run(
        [sys.executable, "-c", CHILD, style, str(folder)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=folder,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"{style} eager ok" in result.stdout
    assert f"{style} compiled ok" in result.stdout


TWO_VERSIONS = f"""
import importlib.util, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch

def load(folder, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "{MODULE}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

old, new = load(sys.argv[1], "old_{MODULE}"), load(sys.argv[2], "new_{MODULE}")
hashes = [sys.modules[m._rt.__package__].RUNTIME_HASH for m in (old, new)]
assert old._rt is not new._rt and hashes[0] != hashes[1]
assert old._rt.__file__.startswith(sys.argv[1]) and new._rt.__file__.startswith(sys.argv[2])
inputs = [torch.randn(shape).half() for shape in ((37, 96), (96,), (37, 96))]
for module in (old, new):
    got = getattr(module, "{MODULE}")(*inputs)
    torch.testing.assert_close(got, module.reference(*inputs), rtol=1e-2, atol=1e-2)
print("side by side ok")
"""


def build_folder(out, version=None):
    """Build specs/elementwise.yaml into `out` in a fresh process, as fusegen `version`."""
    patch = f"fusegen.codegen.files.__version__ = {version!r}; " if version else ""
    code = (
        "import sys, fusegen.codegen.files; "
        + patch
        + "from fusegen.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    spec = ROOT / "specs" / "elementwise.yaml"
    result = subprocess.run(
        [sys.executable, "-c", code, "build", str(spec), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr


def test_folders_from_two_fusegen_versions_work_side_by_side(tmp_path):
    """Each module loads the runtime of its own folder, named by that runtime's hash: a
    folder built by another fusegen version keeps its own in the same process."""
    build_folder(tmp_path / "old", version="0.0.9")
    build_folder(tmp_path / "new")
    old_runtime = (tmp_path / "old" / "_fusegen_runtime" / "chains.py").read_text()
    assert old_runtime.startswith("# Generated by fusegen 0.0.9: ")
    assert old_runtime != (tmp_path / "new" / "_fusegen_runtime" / "chains.py").read_text()
    result = subprocess.run(
        [sys.executable, "-c", TWO_VERSIONS, str(tmp_path / "old"), str(tmp_path / "new")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "side by side ok" in result.stdout


def test_a_module_refuses_a_runtime_it_was_not_built_with(tmp_path):
    build_folder(tmp_path / "old", version="0.0.9")
    build_folder(tmp_path / "new")
    # A partial copy: the new runtime over the old module.
    shutil.copytree(
        tmp_path / "new" / "_fusegen_runtime",
        tmp_path / "old" / "_fusegen_runtime",
        dirs_exist_ok=True,
    )
    child = (
        "import importlib.util, os, sys; os.environ['TRITON_INTERPRET'] = '1'; "
        "spec = importlib.util.spec_from_file_location('m', sys.argv[1]); "
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)"
    )
    result = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path / "old" / f"{MODULE}.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "_fusegen_runtime: not the runtime of m; run `fusegen build`" in result.stderr


TESTS_AS_PACKAGE = """
import importlib, os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[1])
for name in sys.argv[2:]:
    module = importlib.import_module(f"kernels.test_{name}")
    assert module.kernel.__name__ == f"kernels.{name}", module.kernel.__name__
    print(name, "ok")
"""
# One generated test module of each kind: a chain's, an attention's, a loss head's, a
# quantized chain's.
TEST_KINDS = ("bias_gelu_residual", "llama3_attention", "llama3_lm_head_loss", "linear_int8")


def test_generated_tests_import_from_a_package(tmp_path):
    # A user who makes the output folder a package (pytest's rootdir-relative imports)
    # gets the tests importing their module as a package member.
    package = tmp_path / "kernels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in TEST_KINDS:
        for file in (f"{name}.py", f"test_{name}.py"):
            shutil.copy(ROOT / "generated" / file, package)
    shutil.copytree(ROOT / "generated" / "_fusegen_runtime", package / "_fusegen_runtime")
    result = subprocess.run(
        [sys.executable, "-c", TESTS_AS_PACKAGE, str(tmp_path), *TEST_KINDS],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.split() == [w for name in TEST_KINDS for w in (name, "ok")]


INTERPRET_TOO_LATE = f"""
import os, sys
import torch, triton
os.environ["TRITON_INTERPRET"] = "1"  # after triton: its own helpers stay compiled-only
sys.path.insert(0, sys.argv[1])
import {MODULE} as module
x = torch.randn(3, 96).half()
try:
    module.{MODULE}(x, x[0], x)
except RuntimeError as exc:
    print(exc)
"""


def in_generated(code, env):
    """Run `code` in a fresh process with generated/ as its argument, in `env`."""
    return subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "generated")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_interpreter_set_after_triton_says_so():
    # The kernel would fail inside Triton ("Cannot call @triton.jit'd outside of the
    # scope of a kernel"); the launcher names the cause instead.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = in_generated(INTERPRET_TOO_LATE, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "set after triton was imported" in result.stdout


def test_a_bad_setting_fails_the_import():
    # FUSEGEN_TRITON_OP=true was read only where registering the op caught the error:
    # the module imported with a warning and no op for torch.compile.
    child = f"import sys; sys.path.insert(0, sys.argv[1]); import {MODULE}"
    result = in_generated(child, {**os.environ, "FUSEGEN_TRITON_OP": "true"})
    assert result.returncode == 1
    assert "ValueError: FUSEGEN_TRITON_OP='true': set it to 0 or 1" in result.stderr
