"""A generated module works however it is imported: as a package member, from a folder
on sys.path, and loaded by file path (as plugin loaders and notebooks do) — eagerly,
inside torch.compile (fullgraph) and, on a GPU, replayed from a CUDA graph. Each style
runs in a fresh process, so no import of another style can stand in for it."""

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
    shutil.copy(ROOT / "generated" / "_fusegen_runtime.py", package)
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
