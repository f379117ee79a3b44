"""target: amd. No AMD GPU is available here, so this checks the generated module's
structure (ROCm configs, no TMA kernel, LDS-sized spaces), the spec errors, and that
the module still runs and passes its own tests on the Triton interpreter."""

import ast
import subprocess
import sys

import pytest

from fusegen import build, codegen, configs
from fusegen.errors import SpecErrors
from fusegen.ir import Config

SPEC = """
version: 1
kernels:
  - name: amd_gelu
    target: amd
    dims: {M: dynamic, K: 96, N: 80}
    inputs: {x: [M, K], w: [N, K], b: [N]}
    chain:
      - matmul: {a: x, b: w.T}
      - bias: b
      - gelu: tanh
  - name: amd_swiglu
    target: amd
    dims: {M: dynamic, K: 4096, N: 14336}
    inputs: {x: [M, K], w1: [N, K], w3: [N, K]}
    chain:
      - matmul: {a: x, b: w1.T}
      - silu
      - gate: {matmul: {a: x, b: w3.T}}
"""


@pytest.fixture
def kernels(write_spec):
    return {k.name: k for k in build.load([write_spec(SPEC)]).kernels}


def test_amd_modules_carry_rocm_configs_and_no_tma_kernel(kernels):
    swiglu = kernels["amd_swiglu"]
    assert swiglu.target == "amd" and swiglu.fp32_matmul == "ieee"
    assert swiglu.tma_configs == () and swiglu.tma_default_config is None
    assert set(swiglu.configs) == set(configs.AMD_GATED_SPACE)
    text = codegen.render(swiglu)[0].text
    tree = ast.parse(text)
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "_amd_swiglu_kernel" in functions and "_amd_swiglu_kernel_tma" not in functions
    assert "TMA_CONFIGS" not in text and "tl.make_tensor_descriptor" not in text
    assert "pointer=(_amd_swiglu_kernel, CONFIGS, DEFAULT_CONFIG)," in text
    assert "tma=" not in text.split("_KERNELS = _rt.Kernels(")[1]
    settings = text.split("_SETTINGS = (")[1].split(")")[0]
    assert '"matrix_instr_nonkdim"' in settings and '"waves_per_eu"' in settings
    assert '"kpack"' in settings
    assert "Target: AMD GPUs (ROCm)." in text
    # The NVIDIA module of the same chain has both kernels and no ROCm options.
    nvidia = codegen.render(build.load([build.Path("specs/llama.yaml")]).kernels[0])[0].text
    assert "_kernel_tma(" in nvidia and "matrix_instr_nonkdim" not in nvidia


def test_amd_spaces_fit_the_lds_and_take_only_rocm_settings():
    for cfg in configs.AMD_MATMUL_SPACE:
        assert configs.problems(cfg, "matmul", target="amd") == []
    for cfg in configs.AMD_GATED_SPACE:
        assert configs.problems(cfg, "matmul", weights=2, target="amd") == []
    for cfg in configs.AMD_DEFAULTS.values():
        assert configs.problems(cfg, "matmul", weights=2, target="amd") == []
    big = configs.AMD_MATMUL_SPACE[0]  # 256x256x64: exactly 64 KiB of bf16 tiles
    assert configs.lds_bytes(big, 2, 1) == configs.LDS_LIMIT_CDNA
    assert "bytes of LDS" in " ".join(configs.problems(big, "matmul", weights=2, target="amd"))
    tma = Config(**{**dict(big.items()), "FLATTEN": 1})
    assert "FLATTEN is a setting for target nvidia, not amd" in configs.problems(
        tma, "matmul", target="amd"
    )
    nvidia = configs.MATMUL_SPACE[0]
    rocm = Config(**{**dict(nvidia.items()), "waves_per_eu": 2})
    assert "waves_per_eu is a setting for target amd, not nvidia" in configs.problems(
        rocm, "matmul"
    )
    bad = Config(**{**dict(big.items()), "kpack": 3, "matrix_instr_nonkdim": 8})
    found = " ".join(configs.problems(bad, "matmul", target="amd"))
    assert "kpack = 3 must be one of 1, 2" in found
    assert "matrix_instr_nonkdim = 8 must be one of 0, 16, 32" in found
    warps = Config(**{**dict(big.items()), "num_warps": 32})
    assert "num_warps = 32" in " ".join(configs.problems(warps, "matmul", target="amd"))


def test_amd_spec_errors(write_spec):
    text = SPEC.replace(
        "    target: amd\n    dims: {M: dynamic, K: 96",
        "    target: amd\n" "    fp32_matmul: tf32\n    dims: {M: dynamic, K: 96",
    )
    with pytest.raises(SpecErrors) as exc:
        build.load([write_spec(text)])
    messages = [e.format() for e in exc.value.errors]
    assert any(
        "fp32_matmul: fp32_matmul 'tf32' is for target nvidia" in m for m in messages
    ), messages
    text = SPEC.replace(
        "    target: amd\n    dims: {M: dynamic, K: 96",
        "    target: rocm\n" "    dims: {M: dynamic, K: 96",
    )
    with pytest.raises(SpecErrors) as exc:
        build.load([write_spec(text)])
    assert any("target" in e.format() and "'amd'" in e.format() for e in exc.value.errors)


def test_amd_module_runs_its_tests_on_the_interpreter(write_spec, run_cli, tmp_path):
    spec = write_spec(SPEC.split("  - name: amd_swiglu")[0])
    out = tmp_path / "gen"
    assert run_cli("build", str(spec), "--out", str(out))[0] == 0
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(out)],
        capture_output=True,
        text=True,
        env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", **_python_env()},
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout


def _python_env():
    import os

    return {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "HOME", "VIRTUAL_ENV")}
