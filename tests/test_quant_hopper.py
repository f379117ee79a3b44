"""The runtime's block-scaled fp8 SwiGLU in Gluon (fusegen/runtime/quant_hopper.py):
compiled for sm_90 on any machine (no GPU needed), which chains and calls take it, and
on an H100/H200 its output against float64."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from fusegen.codegen.quant_text import hopper_chain
from fusegen.lower.kernels import lower_file
from fusegen.runtime import quant_hopper
from fusegen.spec import source
from test_quant import generated

needs_gluon = pytest.mark.skipif(not quant_hopper.AVAILABLE, reason="Triton without Gluon")
on_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a GPU of compute capability 9.0 (H100, H200)",
)

# Compiled in a process of its own: the tests' Triton runs the interpreter without a GPU,
# and an interpreted function cannot be compiled. Prints the shared memory, the PTX's
# wgmma and waits, and ptxas's spill stores.
SM90_COMPILE = """
import json, os, re, subprocess, tempfile
from pathlib import Path
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from fusegen.runtime import quant_hopper as qh

x = torch.empty(256, 256, dtype=torch.float8_e4m3fn)
out = torch.empty(256, 256, dtype=getattr(torch, sys.argv[1]))
descs = (qh.descriptor(x, [qh.ROWS, qh.BLOCK_K]), qh.descriptor(x, [qh.BLOCK_N, qh.BLOCK_K]),
         qh.descriptor(x, [qh.BLOCK_N, qh.BLOCK_K]), qh.descriptor(out, [qh.ROWS, qh.BLOCK_N]))
kernel = qh._fp8_block_swiglu
names = [p.name for p in kernel.params]
types = {n: "i32" for n in names}
for n, d in zip(names, descs):
    types[n] = triton.runtime.jit.mangle_type(d)
types |= {n: "*fp32" for n in ("xs_ptr", "wgs_ptr", "wus_ptr")}
meta = {"GROUP_M": qh.GROUP_M, "STAGES": qh.STAGES, "REGISTERS": qh.REGISTERS, "num_warps": 4}
types |= {n: "constexpr" for n in meta}
constants = {(names.index(n),): v for n, v in meta.items()}
source = GluonASTSource(kernel, types, constants)
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
ptx = compiled.asm["ptx"]
ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "kernel.ptx")
    Path(path).write_text(ptx)
    done = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", path, "-o", path + ".cubin"],
                          capture_output=True, text=True, check=True)
spills = re.search(r"(\\d+) bytes spill stores", done.stderr + done.stdout)
print(json.dumps({"shared": compiled.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                  "waits_in_full": ptx.count("wgmma.wait_group.sync.aligned 0;"),
                  "waits": ptx.count("wgmma.wait_group"), "spills": int(spills[1])}))
"""


@needs_gluon
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
def test_the_kernel_compiles_for_sm90_within_shared_memory(out_dtype):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", "import sys\n" + SM90_COMPILE, out_dtype],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    # Three ring slots of two x tiles [64, 128] and two weight tiles [128, 128] (fp8), the
    # two consumers' output tiles [64, 128] (16-bit), + barriers.
    tiles = 3 * (2 * 64 * 128 + 2 * 128 * 128) + 2 * 64 * 128 * 2
    assert tiles <= facts["shared"] < tiles + 1024
    # Each consumer's K step: the gate's m64n128k32 x 4, then the up's, each waited for in
    # full before its scales multiply it (nothing left in flight across the loop).
    assert facts["wgmma"] == 16 and facts["waits"] == facts["waits_in_full"] == 4, facts
    # ptxas keeps one value (8 bytes) on the stack outside the loop, as the experiment's.
    assert facts["spills"] <= 8, facts


CHAIN = """
kernels:
  - name: mlp
    dims: {{M: dynamic, K: dynamic, N: dynamic}}
    dtypes: [bf16]
    inputs:
      x: {{shape: [M, K], dtype: fp8_e4m3, scale: {x_scale}}}
      w_gate: {{shape: [N, K], dtype: {w_dtype}, scale: {{per_block: [128, 128]}}}}
      w_up: {{shape: [N, K], dtype: fp8_e4m3, scale: {{per_block: [128, 128]}}}}
    chain:
      - matmul: x @ w_gate.T
      - {act}
      - gate: x @ w_up.T
{more}"""


@pytest.mark.parametrize(
    "changes, takes",
    [
        ({}, True),
        ({"act": "gelu"}, False),  # the kernel's epilogue is silu's
        ({"x_scale": "per_row"}, False),
        ({"x_scale": "{per_group: 64}"}, False),
        ({"w_dtype": "fp8_e5m2"}, False),
        ({"more": "      - scale: 2.0\n"}, False),
    ],
)
def test_only_the_block_scaled_swiglu_takes_it(write_spec, changes, takes):
    fields = {"x_scale": "{per_group: 128}", "w_dtype": "fp8_e4m3", "act": "silu", "more": ""}
    (qc,) = lower_file(source.load(write_spec(CHAIN.format(**{**fields, **changes}))))
    assert hopper_chain(qc) == (("swiglu", ("x", "w_gate", "w_up")) if takes else None)


def test_the_example_module_names_its_operands_to_the_runtime():
    module = generated("deepseek_mlp_fp8")
    assert module.HOPPER == {"chain": "swiglu", "operands": ("x", "w_gate", "w_up")}
    assert not hasattr(generated("gelu_fp8_rowwise"), "HOPPER")


def fits_case(m=300, k=1024, n=256):
    """deepseek_mlp_fp8's chain, views of a call (CPU tensors stand in: the check reads
    their dtypes, layouts and addresses) and a plan on a GPU of capability 9.0."""
    chain = generated("deepseek_mlp_fp8")._CHAIN
    x = torch.zeros(m, k, dtype=torch.float8_e4m3fn)
    w = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    views = [x, torch.ones(m, k // 128 + 1), w, torch.ones(2, 8), w.clone(), torch.ones(2, 8)]
    plan = {
        "interpreted": False,
        "device": torch.device("cuda", 0),
        "rows": m,
        "cols": n,
        "k": k,
        "out_dtype": torch.bfloat16,
    }
    return chain, views, plan


@needs_gluon
def test_calls_that_fit_it(monkeypatch):
    chain, views, plan = fits_case()
    runtime = sys.modules[type(chain).__module__]  # generated/'s copy of runtime/quant.py
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    # A GPU of 2 SMs: the case's 3 x 2 output tiles are HOPPER_MIN_WAVES of them.
    monkeypatch.setattr(runtime, "device_facts", lambda device: (9, 2, 232_448))
    monkeypatch.delenv("FUSEGEN_QUANT_HOPPER", raising=False)
    assert chain.hopper_fits(views, plan)  # the default
    monkeypatch.setenv("FUSEGEN_QUANT_HOPPER", "0")
    assert not chain.hopper_fits(views, plan)  # the way back to the `tl` kernel
    monkeypatch.setenv("FUSEGEN_QUANT_HOPPER", "1")
    assert chain.hopper_fits(views, plan)
    assert chain.hopper_fits(views, {**plan, "out_dtype": torch.float16})
    x = views[0]
    refused = [
        {"plan": {"out_dtype": torch.float32}},
        {"plan": {"cols": 252}},  # out's rows not 16-byte multiples
        {"plan": {"k": 1000}},  # x's and the weights' rows not 16-byte multiples
        {"plan": {"interpreted": True}},
        {"plan": {"device": torch.device("cpu")}},
        {"plan": {"rows": runtime.HOPPER_MIN_ROWS - 1}},
        {"plan": {"cols": 128}},  # 3 tiles on 2 SMs: under HOPPER_MIN_WAVES
        {"views": {0: x.T.contiguous().T}},  # column-major
        {"views": {0: torch.zeros(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape)}},  # unaligned
        {"views": {1: views[1].bfloat16()}},  # scales in bf16
        {"views": {2: views[2].view(torch.float8_e5m2)}},
    ]
    for change in refused:
        changed = list(views)
        for i, t in change.get("views", {}).items():
            changed[i] = t
        assert not chain.hopper_fits(changed, {**plan, **change.get("plan", {})}), change
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (10, 0))
    assert not chain.hopper_fits(views, plan)  # Blackwell: another instruction set


def every_row_count(monkeypatch):
    """The generated deepseek_mlp_fp8 module, its Gluon kernel taken at any shape (below
    HOPPER_MIN_ROWS and HOPPER_MIN_WAVES too: the kernel's own ragged tiles under test),
    with plans of this test's own."""
    monkeypatch.delenv("FUSEGEN_QUANT_HOPPER", raising=False)
    module = generated("deepseek_mlp_fp8")
    runtime = sys.modules[type(module._CHAIN).__module__]
    monkeypatch.setattr(runtime, "HOPPER_MIN_ROWS", 1)
    monkeypatch.setattr(runtime, "HOPPER_MIN_WAVES", 0)
    monkeypatch.setattr(module._CHAIN, "plans", {})  # this test's plans left behind with it
    return module


@on_hopper
@needs_gluon
@pytest.mark.parametrize(
    "m, k, n",
    [(300, 1152, 200), (128, 384, 192), (1, 256, 64), (4096, 7168, 2048), (257, 2048, 136)],
)
def test_module_calls_match_float64(m, k, n, monkeypatch):
    """Ragged M and N (N not a multiple of the tile, K an odd count of groups), each
    output poisoned first; against the module's reference in float64, within the error
    of cuBLASLt's block-scaled kernel (fp32 sums, one bf16 rounding)."""
    module = every_row_count(monkeypatch)
    torch.manual_seed(m + k + n)
    groups, blocks = -(-k // 128), -(-n // 128)
    x = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    xs = torch.rand(m, groups, device="cuda") + 0.5
    wg, wu = (torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn) for _ in range(2))
    wgs, wus = ((torch.rand(blocks, groups, device="cuda") + 0.5) / k**0.5 for _ in range(2))
    for _ in range(2):  # the second call launches directly, at a new output's address
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        module.deepseek_mlp_fp8(x, xs, wg, wgs, wu, wus, out=out)
        assert module.last_launch()["path"] == "hopper"
        want = module.reference(
            x, xs.double(), wg, wgs.double(), wu, wus.double(), out_dtype=torch.float64
        )
        error = (out.double() - want).abs().max() / want.abs().max()
        assert error < 8e-3, error  # bf16's rounding is 3.9e-3 of a value


@on_hopper
@needs_gluon
def test_which_calls_take_it_on_the_gpu(monkeypatch):
    """By default from HOPPER_MIN_ROWS rows and HOPPER_MIN_WAVES of output tiles; a
    caller's config, FUSEGEN_QUANT_HOPPER=0, a row fewer and a tile column fewer take
    the `tl` kernel, which gives the same output within bf16's rounding; torch.compile's
    call takes the eager call's kernel."""
    monkeypatch.delenv("FUSEGEN_QUANT_HOPPER", raising=False)
    module = generated("deepseek_mlp_fp8")
    monkeypatch.setattr(module._CHAIN, "plans", {})
    runtime = sys.modules[type(module._CHAIN).__module__]
    rows = runtime.HOPPER_MIN_ROWS
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = runtime.HOPPER_MIN_WAVES * sms * 128 // -(-rows // 128)  # just enough tiles
    torch.manual_seed(0)
    x = torch.randn(rows, 256, device="cuda").to(torch.float8_e4m3fn)
    xs = torch.rand(rows, 2, device="cuda") + 0.5
    w = torch.randn(n, 256, device="cuda").to(torch.float8_e4m3fn)
    ws = torch.rand(n // 128, 2, device="cuda") / 16
    hopper = module.deepseek_mlp_fp8(x, xs, w, ws, w, ws)
    assert module.last_launch()["path"] == "hopper"
    tl_out = module.deepseek_mlp_fp8(x, xs, w, ws, w, ws, config=module.DEFAULT_CONFIG)
    assert module.last_launch()["config_from"] == "caller"
    assert module.last_launch().get("path") is None
    torch.testing.assert_close(tl_out, hopper, rtol=8e-3, atol=8e-3 * hopper.abs().max().item())
    module.deepseek_mlp_fp8(x[:-1], xs[:-1], w, ws, w, ws)
    assert module.last_launch().get("path") is None  # a row fewer than HOPPER_MIN_ROWS
    module.deepseek_mlp_fp8(x, xs, w[:-128], ws[:-1], w[:-128], ws[:-1])
    assert module.last_launch().get("path") is None  # a tile column fewer
    monkeypatch.setenv("FUSEGEN_QUANT_HOPPER", "0")
    module.deepseek_mlp_fp8(x, xs, w, ws, w, ws)
    assert module.last_launch().get("path") is None
    monkeypatch.delenv("FUSEGEN_QUANT_HOPPER")
    compiled = torch.compile(module.deepseek_mlp_fp8, fullgraph=True)
    assert torch.equal(compiled(x, xs, w, ws, w, ws), hopper)
