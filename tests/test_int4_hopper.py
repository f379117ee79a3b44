"""The runtime's int4 SwiGLU at decode in Gluon (fusegen/runtime/int4_hopper.py):
compiled for sm_90 on any machine (no GPU needed), which chains and calls take it, its
launch bound to the kernel's parameters on the CPU, and on an H100/H200 its output
against float64."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from fusegen.codegen.quant_text import hopper_chain
from fusegen.lower.kernels import lower_file
from fusegen.runtime import int4_hopper, launch
from fusegen.spec import source
from test_attention_hopper import bound_launches
from test_quant import generated

needs_gluon = pytest.mark.skipif(not int4_hopper.AVAILABLE, reason="Triton without Gluon")
on_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs a GPU of compute capability 9.0 (H100, H200)",
)

# Compiled in a process of its own (the tests' Triton runs the interpreter without a GPU,
# and an interpreted function cannot be compiled), for sm_90 with the launch's registers:
# prints the shared memory, the PTX's wgmma, waits and shared stores, ptxas's registers
# and spill stores.
SM90_COMPILE = """
import json, os, re, subprocess, sys, tempfile
from pathlib import Path
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from fusegen.runtime import int4_hopper as ih, quant_hopper as qh

w = torch.empty(256, 256, dtype=torch.uint8)
x = torch.empty(16, 512, dtype=getattr(torch, sys.argv[3]))
tile = [ih.BLOCK_N, ih.GROUP // 2]
x_rows = int(sys.argv[8])
descs = (qh.descriptor(w, tile), qh.descriptor(w, tile), qh.descriptor(x, [x_rows, ih.GROUP]))
kernel = ih._int4_swiglu
names = [p.name for p in kernel.params]
types = {n: "i32" for n in names}
for n, d in zip(names, descs):
    types[n] = triton.runtime.jit.mangle_type(d)
types |= {"sg_ptr": sys.argv[1], "su_ptr": sys.argv[1], "zg_ptr": "*u8", "zu_ptr": "*u8"}
types["out_ptr"] = sys.argv[2]
stages, registers = int(sys.argv[5]), int(sys.argv[6])
meta = {"STAGES": stages, "AHEAD": int(sys.argv[4]), "PERMUTE_ROWS": int(sys.argv[7]),
        "num_warps": 4}
types |= {n: "constexpr" for n in meta}
constants = {(names.index(n),): v for n, v in meta.items()}
options = {"num_warps": 4, "maxnreg": registers}
compiled = triton.compile(GluonASTSource(kernel, types, constants),
                          target=GPUTarget("cuda", 90, 32), options=options)
ptx = compiled.asm["ptx"]
ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "kernel.ptx")
    Path(path).write_text(ptx)
    done = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", "--maxrregcount",
                           str(registers), path, "-o", path + ".cubin"],
                          capture_output=True, text=True, check=True)
report = done.stderr + done.stdout
print(json.dumps({"shared": compiled.metadata.shared, "warps": compiled.metadata.num_warps,
                  "wgmma": ptx.count("wgmma.mma_async"),
                  "waits": ptx.count("wgmma.wait_group"), "st_shared": ptx.count("st.shared"),
                  "registers": int(re.search(r"Used (\\d+) registers", report)[1]),
                  "spills": int(re.search(r"(\\d+) bytes spill stores", report)[1])}))
"""

# The knobs the runtime ships (AHEAD, STAGES, REGISTERS, PERMUTE_ROWS, X_ROWS).
SHIPPED = (
    int4_hopper.AHEAD,
    int4_hopper.STAGES,
    int4_hopper.REGISTERS,
    int4_hopper.PERMUTE_ROWS,
    int4_hopper.X_ROWS,
)


@needs_gluon
@pytest.mark.parametrize(
    "scales, out, x, ahead, stages, registers, permute_rows, x_rows",
    [
        ("*bf16", "*bf16", "bfloat16", *SHIPPED),
        ("*fp32", "*fp16", "float16", *SHIPPED),
        # Variants int4_decode_rows.py times (those measured slower, fewer registers for
        # more programs an SM, are left to the GPU test): 6 slots, 6 groups ahead; x's
        # permute 4 rows a warp; x's tile of 8 rows (calls of up to 8).
        ("*bf16", "*bf16", "bfloat16", 6, 6, *SHIPPED[2:]),
        ("*bf16", "*bf16", "bfloat16", *SHIPPED[:3], 4, 16),
        ("*fp32", "*fp16", "float16", *SHIPPED[:3], 2, 8),
        ("*bf16", "*bf16", "bfloat16", *SHIPPED[:3], 4, 8),
    ],
)
def test_the_kernel_compiles_for_sm90_without_spills(
    scales, out, x, ahead, stages, registers, permute_rows, x_rows
):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = [scales, out, x, str(ahead), str(stages), str(registers), str(permute_rows)]
    args.append(str(x_rows))
    done = subprocess.run(
        [sys.executable, "-c", SM90_COMPILE, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    # The ring's slots of both weights' packed tiles [64, 64] bytes and x's [x_rows, 128]
    # bf16, x's permuted tile, + barriers.
    tiles = stages * (2 * 64 * 64 + x_rows * 128 * 2) + x_rows * 128 * 2
    assert tiles <= facts["shared"] < tiles + 1024, facts
    # A step's two dots (gate, up: m64nXk16 x 8 each; the zero points are off the
    # operands, no ones-dot), both waited for at once.
    assert facts["wgmma"] == 16 and facts["waits"] == 1, facts
    # The nibbles reach wgmma in registers: x's permuted tile is the only shared store in
    # the loop (a layout conversion of the weights through shared memory would add
    # dozens).
    assert facts["st_shared"] <= 3, facts
    # The consumer's warpgroup and the producer's warp, allocated as two warpgroups.
    assert facts["warps"] == 8, facts
    assert facts["registers"] <= registers and facts["spills"] == 0, facts


CHAIN = """
kernels:
  - name: mlp
    dims: {{M: dynamic, K: dynamic, N: dynamic}}
    dtypes: [bf16, fp16]
    inputs:
      x: {x}
      w_gate: {{shape: [N, K], dtype: int4, scale: {scale}, zero_point: {zero}{packing}}}
      w_up: {{shape: [N, K], dtype: int4, scale: {{per_group: 128}}, zero_point: true}}
    chain:
      - matmul: x @ w_gate.T
      - {act}
      - gate: x @ w_up.T
{more}"""


@pytest.mark.parametrize(
    "changes, takes",
    [
        ({}, True),
        ({"packing": ", packing: low_first"}, True),
        ({"packing": ", packing: high_first"}, False),  # the kernel reads the low nibble first
        ({"zero": "false"}, False),  # signed values, no zero points
        ({"scale": "{per_group: 64}"}, False),  # a K step is one group of 128
        ({"scale": "per_channel"}, False),
        ({"x": "{shape: [M, K], dtype: int8, scale: per_row}"}, False),
        ({"act": "gelu"}, False),  # the kernel's epilogue is silu's
        ({"more": "      - scale: 2.0\n"}, False),
    ],
)
def test_only_the_awq_int4_swiglu_takes_it(write_spec, changes, takes):
    fields = {
        "x": "[M, K]",
        "scale": "{per_group: 128}",
        "zero": "true",
        "packing": "",
        "act": "silu",
        "more": "",
    }
    (qc,) = lower_file(source.load(write_spec(CHAIN.format(**{**fields, **changes}))))
    assert hopper_chain(qc) == (("int4_swiglu", ("x", "w_gate", "w_up")) if takes else None)


def test_the_example_module_names_its_chain_to_the_runtime():
    module = generated("llama_mlp_int4")
    assert module.HOPPER == {"chain": "int4_swiglu", "operands": ("x", "w_gate", "w_up")}
    assert not hasattr(generated("linear_int8"), "HOPPER")


def int4_call(m=16, k=512, n=200, scale_dtype=torch.bfloat16, device="cpu", dtype=torch.bfloat16):
    """llama_mlp_int4's tensors of a call (x, w_gate, its scales and zero points, w_up,
    its scales and zero points), random."""
    gen = torch.Generator(device=device).manual_seed(m + k + n)

    def weight():
        packed = torch.randint(0, 256, (n, k // 2), generator=gen, device=device)
        scale = (torch.rand(n, k // 128, generator=gen, device=device) + 0.5) / (6 * k**0.5)
        zero = torch.randint(0, 16, (n, k // 128), generator=gen, device=device)
        return packed.to(torch.uint8), scale.to(scale_dtype), zero.to(torch.uint8)

    x = torch.randn(m, k, generator=gen, device=device).to(dtype)
    return (x, *weight(), *weight())


def fits_case(m=16, k=512, n=200):
    """llama_mlp_int4's chain, a call's views (CPU tensors stand in: the check reads their
    dtypes, shapes, layouts and addresses) and a plan on a GPU of capability 9.0."""
    chain = generated("llama_mlp_int4")._CHAIN
    plan = {
        "interpreted": False,
        "device": torch.device("cuda", 0),
        "dtype": torch.bfloat16,
        "rows": m,
        "cols": n,
        "k": k,
        "out_dtype": torch.bfloat16,
    }
    return chain, list(int4_call(m, k, n)), plan


@needs_gluon
def test_calls_that_fit_it(monkeypatch):
    chain, views, plan = fits_case()
    runtime = sys.modules[type(chain).__module__]  # generated/'s copy of runtime/quant.py
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.delenv("FUSEGEN_QUANT_HOPPER", raising=False)
    default = sys.modules[runtime.__name__.rsplit(".", 1)[0] + ".int4_hopper"].DEFAULT
    assert chain.hopper_fits(views, plan) == default  # opt-in until measured in the runtime
    monkeypatch.setenv("FUSEGEN_QUANT_HOPPER", "0")
    assert not chain.hopper_fits(views, plan)  # the way back to the `tl` kernel
    monkeypatch.setenv("FUSEGEN_QUANT_HOPPER", "1")
    assert chain.hopper_fits(views, plan)
    assert chain.hopper_fits(views, {**plan, "out_dtype": torch.float16})
    assert chain.hopper_fits(views, {**plan, "dtype": torch.float16})  # fp16's 1024 + q
    assert chain.hopper_fits(views, {**plan, "rows": runtime.HOPPER_INT4_MIN_ROWS})
    x, wg, sg, zg, wu, su, zu = views
    refused = [
        {"plan": {"out_dtype": torch.float32}},
        {"plan": {"dtype": torch.float32}},
        {"plan": {"rows": runtime.HOPPER_INT4_MIN_ROWS - 1}},  # fewer than it takes
        {"plan": {"rows": int4_hopper.ROWS + 1}},  # the tiles'
        {"plan": {"interpreted": True}},
        {"plan": {"device": torch.device("cpu")}},
        {"plan": {"k": 384, "cols": 200}},  # weights' shape not [N, K / 2]
        {"views": {0: x.T.contiguous().T}},  # column-major
        {"views": {0: torch.zeros(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape)}},  # unaligned
        {"views": {1: wg.view(torch.int8)}},
        {"views": {2: sg.T.contiguous().T}},  # groups not contiguous
        {"views": {5: su.float()}},  # the gate's and the up's scales differ in dtype
        {"views": {3: zg.to(torch.int32)}},
        {"views": {6: torch.zeros(200, 8, dtype=torch.uint8)[:, :4]}},  # strides differ
    ]
    for change in refused:
        changed = list(views)
        for i, t in change.get("views", {}).items():
            changed[i] = t
        assert not chain.hopper_fits(changed, {**plan, **change.get("plan", {})}), change
    ragged_k = list(int4_call(16, 448, 200))  # K not a multiple of the group
    assert not chain.hopper_fits(ragged_k, {**plan, "k": 448})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (10, 0))
    assert not chain.hopper_fits(views, plan)  # Blackwell: another instruction set


@needs_gluon
@pytest.mark.parametrize("m, k, n", [(16, 512, 200), (3, 384, 64), (1, 128, 1)])
def test_the_launch_binds_every_kernel_parameter(monkeypatch, m, k, n):
    """The Gluon kernel does not run on the CPU: what the module's call would launch it
    with (through QuantChain.launch_hopper: its operands picked from the call's tensors)
    is bound to the kernel's parameters here, so that an operand misplaced, or a
    parameter added to the kernel and not its launch, fails without a GPU."""
    launched = bound_launches(monkeypatch)
    chain = generated("llama_mlp_int4")._CHAIN
    views = list(int4_call(m, k, n))
    out = torch.empty(m, n, dtype=torch.bfloat16)
    chain.launch_hopper({"hopper_launches": launch.Described(), "dot": "bfloat16"}, views, out)
    bound = launched["_int4_swiglu"]
    x, wg, sg, zg, wu, su, zu = views
    assert bound["wg_desc"].base is wg and bound["wu_desc"].base is wu
    assert bound["x_desc"].base is x and bound["x_desc"].block_shape == [16, 128]
    assert bound["wg_desc"].block_shape == [64, 64]
    assert [bound[f"{p}_ptr"] for p in ("sg", "zg", "su", "zu", "out")] == [sg, zg, su, zu, out]
    assert (bound["M"], bound["N"], bound["K"]) == (m, n, k)
    assert (bound["stride_s_n"], bound["stride_z_n"], bound["stride_out_m"]) == (k // 128,) * 2 + (
        n,
    )
    assert bound["STAGES"] == int4_hopper.STAGES and bound["maxnreg"] == int4_hopper.REGISTERS
    assert chain.last_launch["path"] == "hopper"
    assert chain.last_launch["config"]["BLOCK_N"] == int4_hopper.BLOCK_N
    # What the generated tests' bound carries for the weights' 128 + q in the dots
    # (quant_harness.carried_error), as for a transposed `tl` tile.
    assert chain.last_launch["nibble_base"] == 128.0
    chain.launch_hopper(
        {"hopper_launches": launch.Described(), "dot": "float16"},
        [views[0].half(), *views[1:]],
        out,
    )
    assert chain.last_launch["nibble_base"] == 1024.0


def every_row_count(monkeypatch):
    """The generated llama_mlp_int4 module, its Gluon kernel taken (FUSEGEN_QUANT_HOPPER=1)
    from one row on (the kernel's own ragged rows under test), with plans of this test's
    own."""
    monkeypatch.setenv("FUSEGEN_QUANT_HOPPER", "1")
    module = generated("llama_mlp_int4")
    runtime = sys.modules[type(module._CHAIN).__module__]
    monkeypatch.setattr(runtime, "HOPPER_INT4_MIN_ROWS", 1)
    monkeypatch.setattr(module._CHAIN, "plans", {})  # this test's plans left behind with it
    return module


@on_hopper
@needs_gluon
@pytest.mark.parametrize(
    "m, k, n, scale_dtype, dtype",
    [
        (16, 4096, 14336, torch.bfloat16, torch.bfloat16),
        (16, 4096, 14336, torch.float16, torch.float16),  # AWQ's: fp16 x and scales
        (5, 384, 200, torch.float16, torch.bfloat16),  # N not a multiple of 64, K 3 groups
        (1, 128, 1, torch.float32, torch.float16),
        (13, 1152, 4160, torch.bfloat16, torch.float16),
        (2, 4096, 1000, torch.float16, torch.bfloat16),
    ],
)
def test_module_calls_match_float64(m, k, n, scale_dtype, dtype, monkeypatch):
    """Each output poisoned first; against the module's reference in float64 within one
    bf16 rounding of the output (fp32 sums of exact products); a second call, launched
    directly at a new output's address, gives the same bits (no split of K)."""
    module = every_row_count(monkeypatch)
    x, wg, sg, zg, wu, su, zu = int4_call(m, k, n, scale_dtype, "cuda", dtype)
    want = module.reference(
        x.double(), wg, sg.double(), zg, wu, su.double(), zu, out_dtype=torch.float64
    )
    outs = []
    for out_dtype in (torch.bfloat16, torch.bfloat16, torch.float16):
        out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
        module.llama_mlp_int4(x, wg, sg, zg, wu, su, zu, out=out)
        assert module.last_launch()["path"] == "hopper"
        error = (out.double() - want).abs().max() / want.abs().max()
        assert error < 8e-3, error  # bf16's rounding is 3.9e-3 of a value
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


@on_hopper
@needs_gluon
@pytest.mark.parametrize(
    "knobs, dtype",
    [
        ({"AHEAD": 1}, torch.bfloat16),
        ({"AHEAD": 6, "STAGES": 6}, torch.bfloat16),  # the defaults before 2026-12-07
        ({"AHEAD": 6, "STAGES": 6}, torch.float16),
        ({"STAGES": 2}, torch.bfloat16),
        ({"REGISTERS": 96}, torch.bfloat16),
        ({"AHEAD": 2, "STAGES": 2, "REGISTERS": 80}, torch.bfloat16),
        ({"PERMUTE_ROWS": 4}, torch.bfloat16),
        ({"X_ROWS": 8}, torch.bfloat16),  # the 3- and 5-row calls; 16 rows keep 16
        ({"X_ROWS": 8, "PERMUTE_ROWS": 4}, torch.float16),
    ],
    ids=[
        "ahead1",
        "ahead6-stages6",
        "ahead6-stages6-fp16",
        "stages2",
        "registers96",
        "registers80",
        "permute-rows4",
        "x-rows8",
        "x-rows8-permute-rows4-fp16",
    ],
)
@pytest.mark.parametrize("m, k, n", [(16, 4096, 4160), (3, 384, 200), (5, 128, 72)])
def test_the_kernels_variants_match_float64(knobs, dtype, m, k, n):
    """The variants int4_decode_rows.py times (scales loaded nearer or further ahead, more
    or fewer slots, fewer registers for more programs an SM, x's permute 4 rows a warp,
    x's tile of 8 rows), K of fewer groups than they look ahead (one group) included."""
    module = generated("llama_mlp_int4")
    x, wg, sg, zg, wu, su, zu = int4_call(m, k, n, device="cuda", dtype=dtype)
    want = module.reference(
        x.double(), wg, sg.double(), zg, wu, su.double(), zu, out_dtype=torch.float64
    )
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    int4_hopper.int4_swiglu(x, wg, sg, zg, wu, su, zu, out, **knobs)
    error = (out.double() - want).abs().max() / want.abs().max()
    assert error < 8e-3, error


@on_hopper
@needs_gluon
def test_which_calls_take_it_on_the_gpu(monkeypatch):
    """With FUSEGEN_QUANT_HOPPER=1, from HOPPER_INT4_MIN_ROWS to ROWS rows of bf16 or fp16
    x; a caller's config, a row more, fewer rows and the default (until measured) take the
    `tl` kernel, which gives the same output within bf16's rounding; torch.compile's
    call takes the eager call's kernel."""
    monkeypatch.setenv("FUSEGEN_QUANT_HOPPER", "1")
    module = generated("llama_mlp_int4")
    monkeypatch.setattr(module._CHAIN, "plans", {})
    runtime = sys.modules[type(module._CHAIN).__module__]
    x, wg, sg, zg, wu, su, zu = int4_call(int4_hopper.ROWS + 1, 1024, 512, device="cuda")
    weights = (wg, sg, zg, wu, su, zu)
    rows = x[: int4_hopper.ROWS]
    hopper = module.llama_mlp_int4(rows, *weights)
    assert module.last_launch()["path"] == "hopper"
    tl_out = module.llama_mlp_int4(rows, *weights, config=module.DEFAULT_CONFIG)
    assert module.last_launch().get("path") is None
    torch.testing.assert_close(tl_out, hopper, rtol=8e-3, atol=8e-3 * hopper.abs().max().item())
    for taken in (x[: runtime.HOPPER_INT4_MIN_ROWS], rows.half()):
        module.llama_mlp_int4(taken, *weights)
        assert module.last_launch()["path"] == "hopper", taken.dtype
    for refused in (x, x[: runtime.HOPPER_INT4_MIN_ROWS - 1]):
        module.llama_mlp_int4(refused, *weights)
        assert module.last_launch().get("path") is None, refused.shape
    compiled = torch.compile(module.llama_mlp_int4, fullgraph=True)
    assert torch.equal(compiled(rows, *weights), hopper)
    monkeypatch.delenv("FUSEGEN_QUANT_HOPPER")
    module.llama_mlp_int4(rows, *weights)
    assert (module.last_launch().get("path") == "hopper") == int4_hopper.DEFAULT
