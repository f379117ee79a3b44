"""fusegen's code, its tests, the benchmark scripts and the generated modules pass ruff
(the rules in pyproject.toml's [tool.ruff]), checked by the ruff version pinned in the
test extra: another version could add or drop findings."""

import importlib.util
import re
import subprocess
import sys

import pytest

from conftest import ROOT

CHECKED = ["fusegen", "tests", "benchmarks", "generated"]

needs_ruff = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff is not installed (pip install -e '.[test]' installs the pinned one)",
)


def pinned_ruff() -> str:
    found = re.findall(r'"ruff==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert len(found) == 1, "pyproject.toml pins ruff once, as ruff==VERSION"
    return found[0]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@needs_ruff
def test_ruff_is_the_pinned_version():
    result = ruff("--version")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["ruff", pinned_ruff()]


@needs_ruff
def test_code_passes_ruff():
    result = ruff("check", *CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr
