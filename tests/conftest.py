"""Shared fixtures. Without a GPU, generated kernels run on the Triton interpreter, which
must be switched on before anything imports triton."""

import os
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # fusegen itself needs no torch; only kernel tests do
    HAS_CUDA = False
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent


def integration_snippet(start: str) -> str:
    """The python block of docs/integration.md that begins with `start` (the tests that
    run the docs' snippets)."""
    text = (ROOT / "docs" / "integration.md").read_text()
    return start + text.split(start, 1)[1].split("```", 1)[0]


@pytest.fixture
def write_spec(tmp_path):
    """Write YAML text (dedented) to a spec file in a fresh folder; return its path."""

    def write(text: str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return write


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run `fusegen ARGS...` in-process from a folder; return (exit code, stdout, stderr)."""
    from fusegen.cli import main

    def run(*args: str, cwd: Path | None = None):
        if cwd is not None:
            monkeypatch.chdir(cwd)
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def pytest_report_header(config):
    mode = "CUDA" if HAS_CUDA else "Triton interpreter (TRITON_INTERPRET=1)"
    return f"fusegen kernels run on: {mode}; python {sys.version.split()[0]}"
