"""Time many kernel configs (and kernel-source variants) of the anchor chains in one GPU
call, each checked against the float64 reference, to find what beats the current
spaces before changing them. Not part of fusegen: an experiment bench.

Each row: GPU time of calls replayed from a CUDA graph (inputs rotated over buffer sets
larger than the L2; `graph`), do_bench's median with the L2 cleared (`call`, what
`fusegen bench` reports), first-call seconds, relative error. `programs_per_sm` > 1 runs
the persistent TMA kernel with that many programs per SM (two CTAs resident per SM when
shared memory and registers allow, so one's epilogue overlaps the other's mainloop).

Usage (GPU, repo root, pydantic on PYTHONPATH):
    python3 benchmarks/experiments/sweep.py OUT.jsonl [CASE ...]     # CASE: names in CASES
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fusegen import build, codegen, configs  # noqa: E402
from fusegen.tools import bench, timing  # noqa: E402
from fusegen.writer import write_all  # noqa: E402

SPEC = Path(__file__).resolve().parents[1] / "specs" / "anchors.yaml"
CASE_BUDGET_S = float(os.environ.get("SWEEP_CASE_BUDGET_S", "240"))


def tma(bm, bn, bk, warps, stages, flatten=0, ws=0, subtile=0, group=8):
    """A TMA config as the launcher's config= takes it."""
    return dict(configs._tma(bm, bn, bk, group, warps, stages, flatten, ws, subtile).items())


def ptr(bm, bn, bk, warps, stages, split=1, group=8):
    """A pointer-kernel config as the launcher's config= takes it."""
    return dict(configs._mm(bm, bn, bk, group, warps, stages, split).items())


def no_activation(text):
    """The chain without its activation: how much of a tile's time the epilogue math is."""
    stripped = re.sub(r"acc = _gelu_tanh\(acc[^)]*\)", "acc = acc", text)
    assert stripped != text, "no gelu_tanh call to remove"
    return stripped


TANH_APPROX = (
    'tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [{}], dtype=tl.float32, '
    "is_pure=True, pack=1)"
)


def approx_tanh(text):
    """gelu_tanh and silu through the GPU's one-instruction tanh (max relative error
    2**-10.99) instead of sigmoid's exp and reciprocal: half the special-function work.
    The generator has done this itself since (spec `fast_tanh`): such text is kept."""
    if "def _tanh_approx(" in text:
        return text
    gelu = "return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))"
    silu = "return x * tl.sigmoid(x)"
    assert gelu in text or silu in text
    text = text.replace(
        gelu,
        "h = 0.5 * x\n    t = "
        + TANH_APPROX.format("0.7978845608028654 * (x + 0.044715 * x * x * x)")
        + "\n    return h + h * t",
    )
    return text.replace(
        silu, "h = 0.5 * x\n    t = " + TANH_APPROX.format("h") + "\n    return h + h * t"
    )


def host_descriptors(text):
    """The TMA kernel taking tensor descriptors made on the host (HostDescriptors
    below) instead of building them on the device at each launch: how much of a small
    kernel's time the device-side descriptors cost."""
    head, tma = text.split("_kernel_tma(", 1)
    made = re.compile(r"(\w+)_desc = tl\.make_tensor_descriptor\(\s*(\w+_ptr),")
    while found := made.search(tma):  # each call, on one line or several: to its ")"
        depth, end = 1, found.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(tma[end], 0)
            end += 1
        tma = tma[: found.start()] + f"{found.group(1)}_desc = {found.group(2)}" + tma[end:]
    tma = tma.replace("out_ptr.dtype.element_ty", "out_desc.dtype")
    return head + "_kernel_tma(" + tma


def _tma_part(text):
    """(the text through the TMA kernel's name, the rest of that kernel, what follows it)."""
    head, tma = text.split("_kernel_tma(", 1)
    end = re.search(r"\n\n\n(?=\S)", tma).start()  # the next top-level statement
    return head + "_kernel_tma(", tma[:end], tma[end:]


def bias_first(text):
    """The bias loaded before the K loop: its global-load latency hidden under the
    mainloop instead of stalling each tile's epilogue."""
    head, tma, tail = _tma_part(text)
    load = re.search(r"\n( +)b = tl\.load\(b_ptr \+ offs_n \* stride_b_n[^\n]*\n", tma)
    assert load, "no bias load"
    tma = tma.replace(load.group(0), "\n")
    indent = load.group(1)
    early = (
        f"{indent}offs_n_early = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)\n"
        f"{indent}b = tl.load(b_ptr + offs_n_early * stride_b_n, mask=offs_n_early < N, "
        "other=0.0).to(tl.float32)\n"
    )
    loop = re.search(r"\n( +)acc = tl\.zeros\(\(BLOCK_M, BLOCK_N\), dtype=tl\.float32\)\n", tma)
    tma = tma.replace(loop.group(0), "\n" + early + loop.group(0)[1:], 1)
    return head + tma + tail


BIAS_HALVES_SPLIT = """\
            b_left, b_right = tl.split(tl.permute(tl.reshape(b, (2, BLOCK_N // 2)), (1, 0)))
"""
BIAS_HALVES_LOADED = (
    "            offs_h = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)\n"
    "            b_left = tl.load(b_ptr + offs_h * stride_b_n, mask=offs_h < N, other=0.0)"
    ".to(tl.float32)\n"
    "            offs_h = offs_h + BLOCK_N // 2\n"
    "            b_right = tl.load(b_ptr + offs_h * stride_b_n, mask=offs_h < N, other=0.0)"
    ".to(tl.float32)\n"
)


def sub_chain(text):
    """With EPILOGUE_SUBTILE, the chain runs on each half of the tile just before that
    half's store, so the first half's TMA store overlaps the second half's math."""
    head, tma, tail = _tma_part(text)
    start = tma.index("        # The chain, in fp32.")
    end = tma.index("        else:\n            out_desc.store(")
    chain = tma[start : tma.index("        if EPILOGUE_SUBTILE:")]
    half = (
        "            acc_halves = tl.permute("
        "tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))\n"
        "            acc_left, acc_right = tl.split(acc_halves)\n"
        + (BIAS_HALVES_SPLIT if "offs_n_early" in tma else BIAS_HALVES_LOADED)
        + "            acc_left = _gelu_tanh(acc_left + b_left[None, :], FAST_TANH)\n"
        "            out_desc.store("
        "[pid_m * BLOCK_M, pid_n * BLOCK_N], acc_left.to(out_ptr.dtype.element_ty))\n"
        "            acc_right = _gelu_tanh(acc_right + b_right[None, :], FAST_TANH)\n"
        "            out_desc.store(\n"
        "                [pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2],\n"
        "                acc_right.to(out_ptr.dtype.element_ty),\n"
        "            )\n"
    )
    whole = "\n".join("    " + line if line else line for line in chain.split("\n"))
    rest = tma[end:]
    rest = rest.replace(
        "        else:\n",
        "        else:\n" + whole.rstrip(" "),
        1,
    )
    tma = tma[:start] + "        if EPILOGUE_SUBTILE:\n" + half + rest
    return head + tma + tail


SOURCE_VARIANTS = {
    "base": lambda text: text,
    "noact": no_activation,
    "approx": approx_tanh,
    "hostdesc": lambda text: host_descriptors(approx_tanh(text)),
    "biasfirst": bias_first,
    "subchain": sub_chain,
    "subbias": lambda text: sub_chain(bias_first(text)),
}


class HostDescriptors:
    """Stands in for the TMA kernel in the launcher's paths: makes the descriptors on
    the host (triton.tools.tensor_descriptor) from the tensors the launcher passes."""

    def __init__(self, kernel, roles):
        self.kernel, self.roles = kernel, roles  # roles: argument index -> x / w / out

    def __getitem__(self, grid):
        from triton.tools.tensor_descriptor import TensorDescriptor

        def launch(*args, **kwargs):
            args = list(args)
            bm, bn, bk = kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["BLOCK_K"]
            blocks = {
                "x": [bm, bk],
                "w": [bn, bk],
                "out": [bm, bn // 2 if kwargs.get("EPILOGUE_SUBTILE") else bn],
            }
            for index, role in self.roles.items():
                args[index] = TensorDescriptor.from_tensor(args[index], blocks[role])
            return self.kernel[grid](*args, **kwargs)

        return launch


HOST_ROLES = {
    "anchor_gelu": {0: "x", 1: "w", 3: "out"},
    "anchor_swiglu": {0: "x", 1: "w", 2: "w", 3: "out"},
}

# name -> (kernel, shape, [(source variant, path, programs per SM, config)], baselines)
CASES = {
    "gelu4096": (
        "anchor_gelu",
        (4096, 1024, 4096),
        [
            ("base", "tma", 1, c)
            for c in (
                tma(128, 256, 64, 8, 3, 1, 0, 1),
                tma(128, 256, 64, 8, 4, 1, 0, 1),
                tma(128, 256, 64, 8, 3, 1, 1, 0),
                tma(128, 256, 64, 8, 3, 0, 0, 1),
                tma(128, 256, 64, 8, 3, 0, 1, 0),
                tma(128, 256, 128, 8, 2, 1, 0, 1),
                tma(256, 128, 64, 8, 3, 1, 0, 1),
                tma(256, 128, 64, 8, 4, 1, 0, 1),
                tma(128, 128, 64, 8, 4, 1, 0, 0),
                tma(128, 256, 64, 8, 3, 1, 0, 1, group=4),
                tma(128, 256, 64, 8, 3, 1, 0, 1, group=16),
            )
        ]
        + [
            ("base", "tma", 2, c)
            for c in (
                tma(128, 128, 64, 4, 2, 0, 0, 1),
                tma(128, 128, 64, 4, 3, 0, 0, 1),
                tma(128, 128, 64, 4, 3, 1, 0, 1),
                tma(128, 128, 64, 8, 3, 1, 0, 1),
                tma(128, 128, 32, 4, 4, 1, 0, 1),
                tma(64, 256, 64, 4, 2, 1, 0, 1),
            )
        ]
        + [
            ("noact", "tma", 1, tma(128, 256, 64, 8, 3, 1, 0, 1)),
            ("noact", "tma", 2, tma(128, 128, 64, 4, 3, 1, 0, 1)),
        ],
        ("cublaslt",),
    ),
    "gelu1000": (
        "anchor_gelu",
        (1000, 1000, 1000),
        [
            ("base", "tma", 1, c)
            for c in (
                tma(64, 128, 64, 4, 4),
                tma(64, 64, 64, 4, 4),
                tma(128, 64, 64, 4, 4),
                tma(64, 128, 128, 4, 3),
                tma(128, 128, 64, 8, 3),
                tma(64, 64, 128, 4, 3),
                tma(64, 128, 64, 4, 4, 1, 0, 0),
            )
        ]
        + [
            ("base", "tma", 2, c)
            for c in (
                tma(64, 64, 64, 4, 4),
                tma(64, 64, 64, 4, 3, 1),
                tma(64, 128, 64, 4, 3),
            )
        ]
        + [
            ("base", "pointer", 1, c)
            for c in (
                ptr(64, 64, 64, 4, 4),
                ptr(64, 128, 64, 4, 4),
                ptr(128, 128, 64, 8, 3),
                ptr(64, 128, 64, 4, 4, split=2),
                ptr(128, 128, 64, 8, 3, split=2),
                ptr(128, 128, 64, 8, 3, split=4),
                ptr(64, 64, 64, 4, 4, split=2),
            )
        ],
        ("cublaslt",),
    ),
    "swiglu8192": (
        "anchor_swiglu",
        (8192, 4096, 14336),
        [
            ("base", "tma", 1, c)
            for c in (
                tma(128, 128, 64, 8, 3, 0, 0, 1),
                tma(128, 128, 64, 8, 4, 0, 0, 1),
                tma(128, 128, 64, 8, 3, 0, 1, 1),
                tma(128, 128, 64, 8, 3, 0, 1, 0),
                tma(128, 128, 64, 8, 3, 1, 1, 0),
                tma(128, 128, 64, 8, 3, 0, 0, 1, group=16),
                tma(128, 128, 128, 8, 2, 0, 0, 1),
                tma(256, 128, 64, 16, 3, 0, 0, 1),
                tma(256, 128, 64, 16, 2, 0, 0, 1),
                tma(128, 256, 64, 16, 2, 0, 0, 1),
                tma(128, 256, 32, 16, 4, 0, 0, 1),
            )
        ],
        ("compile", "gemm2x"),
    ),
}


# Round 2 (after round 1 showed the gelu epilogue is 18% of the 4096x1024 kernel).
CASES["gelu4096approx"] = (
    "anchor_gelu",
    (4096, 1024, 4096),
    [
        ("approx", "tma", 1, c)
        for c in (
            tma(128, 256, 64, 8, 3, 1, 0, 1),
            tma(128, 256, 64, 8, 4, 1, 0, 1),
            tma(128, 256, 64, 8, 3, 1, 1, 0),
        )
    ]
    + [
        ("approx", "tma", 2, c)
        for c in (
            tma(128, 128, 64, 8, 3, 1, 0, 1),
            tma(128, 128, 64, 4, 3, 1, 0, 1),
        )
    ],
    ("cublaslt",),
)
CASES["gelu8192"] = (
    "anchor_gelu",
    (8192, 4096, 14336),
    [
        (v, "tma", 1, c)
        for v in ("base", "approx")
        for c in (
            tma(128, 256, 64, 8, 3, 1, 1, 0),
            tma(128, 256, 64, 8, 3, 1, 0, 1),
        )
    ]
    + [("approx", "tma", 2, tma(128, 128, 64, 8, 3, 1, 0, 1))],
    ("cublaslt",),
)
CASES["swiglu8192"][2].insert(0, ("approx", "tma", 1, tma(128, 128, 64, 8, 3, 0, 0, 1)))


# Round 3: is there a fixed cost in the TMA kernel (device-side descriptors)? Small and
# mid shapes, with the descriptors made on the device (approx) or the host (hostdesc).
for _shape in ((256, 256, 256), (1000, 1000, 1000), (4096, 1024, 4096)):
    _rows = [
        (variant, "tma", 1, config)
        for variant in ("approx", "hostdesc")
        for config in (
            (tma(64, 128, 64, 4, 4), tma(128, 128, 64, 8, 3))
            if _shape[0] <= 1000
            else (tma(128, 256, 64, 8, 3, 1, 0, 1), tma(128, 256, 64, 8, 3, 0, 0, 1))
        )
    ]
    CASES[f"desc{_shape[0]}"] = ("anchor_gelu", _shape, _rows, ("cublaslt",))


# Round 4: did the first-call tuner mis-rank gelu 8192 at fp16 (it picked the
# warp-specialized config, 1.50 ms, where bf16 ran FLATTEN=1 alone at 1.33)?
_big = [
    ("approx", "tma", 1, c)
    for c in (
        tma(128, 256, 64, 8, 3, 1, 0, 0),
        tma(128, 256, 64, 8, 3, 1, 1, 0),
        tma(128, 256, 64, 8, 3, 1, 0, 1),
    )
]
CASES["gelu8192fp16"] = ("anchor_gelu", (8192, 4096, 14336), _big, ("cublaslt",), "fp16")
CASES["gelu8192bf16"] = ("anchor_gelu", (8192, 4096, 14336), _big, ("cublaslt",), "bf16")


# Round 5: the epilogue's place in a tile. The bias loaded before the K loop
# (biasfirst), the chain run per half-tile so the first half's store overlaps the second's
# math (subchain), both (subbias).
_epilogue_variants = ("base", "biasfirst", "subchain", "subbias")
CASES["epi4096"] = (
    "anchor_gelu",
    (4096, 1024, 4096),
    [
        (v, "tma", per_sm, c)
        for v in _epilogue_variants
        for per_sm, c in (
            (1, tma(128, 256, 64, 8, 3, 1, 0, 1)),
            (1, tma(128, 256, 64, 8, 4, 1, 0, 1)),
            (2, tma(128, 128, 64, 8, 3, 1, 0, 1)),
            (2, tma(128, 128, 64, 4, 3, 1, 0, 1)),
        )
    ],
    ("cublaslt",),
)
CASES["epi1000"] = (
    "anchor_gelu",
    (1000, 1000, 1000),
    [
        (v, "tma", 1, c)
        for v in _epilogue_variants
        for c in (tma(64, 128, 64, 4, 4, 0, 0, 1), tma(128, 128, 64, 8, 3, 0, 0, 1))
    ],
    ("cublaslt",),
)
CASES["epi8192"] = (
    "anchor_gelu",
    (8192, 4096, 14336),
    [(v, "tma", 1, tma(128, 256, 64, 8, 3, 1, 0, 1)) for v in _epilogue_variants],
    ("cublaslt",),
)


def baseline(name, torch, module, kernel, sizes):
    if name == "cublaslt":
        return bench._cublaslt(torch, module, kernel)
    if name == "compile":
        return bench._compiled("default")(torch, module, kernel)
    if name == "gemm2x":  # the two GEMMs alone, as one of twice the columns: a ceiling

        def run(x, w1, w3):
            return x @ w13.T

        w13 = None

        def make(x, w1, w3):
            nonlocal w13
            if w13 is None:
                w13 = torch.cat([w1, w3])
            return run(x, w1, w3)

        return make
    raise ValueError(name)


def fresh_module(kernel, folder, variant, programs_per_sm):
    text = SOURCE_VARIANTS[variant](codegen.render(kernel)[0].text)
    path = folder / f"{kernel.name}_{variant}_{programs_per_sm}.py"
    path.write_text(text)
    write_all(build.runtime_files(folder))  # the launch support the module loads
    module = bench.import_file(path, f"sweep_{kernel.name}_{variant}_{programs_per_sm}")
    kernels = module._KERNELS
    kernels.table["entries"] = []
    if variant == "hostdesc":
        kernel_fn, configs, default = kernels.paths["tma"]
        kernels.paths["tma"] = (
            HostDescriptors(kernel_fn, HOST_ROLES[kernel.name]),
            configs,
            default,
        )
        kernels.direct = lambda *args: None  # the direct launch would pass tensors
    if programs_per_sm > 1:
        # This module's view of the GPU only: the runtime's device cache is shared by
        # every module loaded from it.
        facts = kernels.device_facts

        def more_programs(device):
            major, sms, smem = facts(device)
            return major, sms * programs_per_sm, smem

        kernels.device_facts = more_programs
    return module


def label(c):
    tile = (
        f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} g{c['GROUP_M']}"
        f" w{c['num_warps']} s{c['num_stages']}"
    )
    extra = "".join(
        f" {k[:2]}{v}" for k, v in c.items() if k.isupper() and not k.startswith(("BLOCK", "GROUP"))
    )
    return tile + extra


def time_row(fn, sets, exact, check=True):
    rotation = itertools.cycle(sets)
    call = lambda: fn(**next(rotation))  # noqa: E731
    started = time.perf_counter()
    out = fn(**sets[0])
    torch.cuda.synchronize()
    first = time.perf_counter() - started
    error = bench.relative_error(torch, out, exact) if check else None
    graph = timing.graph_ms(call)
    call_ms = do_bench(call, warmup=25, rep=200, return_mode="median")
    return dict(first_s=round(first, 2), error=error, graph_ms=graph, call_ms=call_ms)


def main():
    out_path = Path(sys.argv[1])
    wanted = sys.argv[2:] or list(CASES)
    kernels = {k.name: k for k in build.load([SPEC]).kernels}
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    with tempfile.TemporaryDirectory() as tmp, out_path.open("a") as log:

        def emit(row):
            log.write(json.dumps(row) + "\n")
            log.flush()
            graph, call, error = row.get("graph_ms"), row.get("call_ms"), row.get("error")
            print(
                f"{row['case']:11} {row['what']:62} graph {graph and round(graph, 4)} "
                f"call {call and round(call, 4)} err {error and round(error, 5)} "
                f"first {row.get('first_s')} {row.get('failed', '')}",
                flush=True,
            )

        for case in wanted:
            kernel_name, shape, rows, baselines, *dtype = CASES[case]
            dtype = dtype[0] if dtype else "bf16"
            kernel = kernels[kernel_name]
            sizes = dict(zip(("M", "K", "N"), shape, strict=True))
            modules = {}
            sets, exact = None, None
            case_start = time.perf_counter()
            for name in baselines:
                if sets is None:
                    module = modules.setdefault(
                        ("base", 1), fresh_module(kernel, Path(tmp), "base", 1)
                    )
                    sets, exact = bench.input_sets(torch, module, kernel, sizes, dtype, "cuda")
                try:
                    fn = baseline(name, torch, modules[("base", 1)], kernel, sizes)
                    timed = time_row(fn, sets, exact, check=name != "gemm2x")
                    emit(dict(case=case, what=f"baseline {name}", **timed))
                except Exception as exc:  # noqa: BLE001 - an experiment: record and go on
                    emit(dict(case=case, what=f"baseline {name}", failed=repr(exc)[:300]))
            for variant, path, per_sm, config in rows:
                if time.perf_counter() - case_start > CASE_BUDGET_S:
                    emit(dict(case=case, what="out of time budget: rest skipped"))
                    break
                key = (variant, per_sm)
                if key not in modules:
                    modules[key] = fresh_module(kernel, Path(tmp), variant, per_sm)
                module = modules[key]
                if sets is None:
                    sets, exact = bench.input_sets(torch, module, kernel, sizes, dtype, "cuda")
                os.environ["FUSEGEN_TMA"] = "1" if path == "tma" else "0"
                launcher = getattr(module, kernel.name)
                fn = functools.partial(launcher, config=config)
                what = f"{variant} {path} x{per_sm} {label(config)}"
                row = dict(case=case, what=what, config=config, path=path, programs_per_sm=per_sm)
                try:
                    row.update(time_row(fn, sets, exact))
                    ran = module.last_launch()
                    if ran["path"] != path:
                        row["failed"] = f"ran the {ran['path']} path"
                except Exception as exc:  # noqa: BLE001
                    row["failed"] = repr(exc)[:300]
                    traceback.print_exc(limit=1)
                    torch.cuda.synchronize()
                emit(row)
            os.environ.pop("FUSEGEN_TMA", None)


if __name__ == "__main__":
    main()
