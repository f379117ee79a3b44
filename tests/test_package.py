"""The wheel, not the checkout: templates ship inside it and `fusegen build` works from
any folder with it alone."""

import os
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Build a real wheel of this checkout and install it (without deps) into a folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp.glob("fusegen-*.whl")
    site = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    return wheel, site


def test_wheel_holds_the_templates(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    for template in ("kernel_module.py.j2", "runtime_loader.py.j2", "test_module.py.j2"):
        assert f"fusegen/codegen/templates/{template}" in names


def test_build_from_another_folder_with_the_wheel(installed, tmp_path):
    _, site = installed
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = (
        "import fusegen, sys; from fusegen.cli import main; "
        "print(fusegen.__file__); sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "build", str(ROOT / "specs"), "--out", "gen"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(
        str(site)
    ), "fusegen was not imported from the wheel"
    for module in (ROOT / "generated").glob("*.py"):
        assert (work / "gen" / module.name).read_text() == module.read_text(), module.name
