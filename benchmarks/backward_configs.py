"""Time the generated backward kernels over a grid of launch configs, on a GPU.

The runtime launches a backward kernel with a config it computes (Kernels.backward_launch:
a tile kernel's fixed tiles, a row kernel's whole row in BLOCK_N with a few programs per
SM looping over row blocks). This measures that choice against the others on the example
modules at training sizes, so the defaults come from measurements:

    python benchmarks/backward_configs.py [--out FILE.json] [--built FOLDER]
        [--modules NAME ...] [--stages 1 3]

Each row: the module, the config, the GPU time of the whole backward call (CUDA graph
replays: the kernel, the partial sums' reduction; a matmul chain asks for no operand
gradient, so no cuBLAS). --built FOLDER adds benchmarks/specs/training.yaml's modules;
--stages sweeps a row kernel's loop pipeline stages (LOOP_STAGES) over a narrower grid.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.testing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "generated"))
sys.path.insert(0, str(ROOT))
from fusegen.tools.timing import graph_ms  # noqa: E402  (torch-free until called)

# module: (input shapes, ...), each set timed in turn; rows at training sizes (LLaMA: 4 x
# 4096 tokens).
CASES = {
    "llama_add_rmsnorm": ({"x": (16384, 4096), "residual": (16384, 4096), "weight": (4096,)},),
    "llama_rmsnorm": ({"x": (16384, 4096), "weight": (4096,)},),
    "bert_add_layernorm": (
        {"x": (16384, 768), "residual": (16384, 768), "gamma": (768,), "beta": (768,)},
    ),
    "masked_softmax": ({"scores": (32768, 2048), "mask": (32768, 2048)},),
    "llama_mlp_gate_up": ({"x": (4096, 4096), "w_gate": (14336, 4096), "w_up": (14336, 4096)},),
    "bias_gelu_residual": ({"x": (16384, 8192), "b": (8192,), "r": (16384, 8192)},),
    # benchmarks/specs/training.yaml's, from --built: Liger's benchmark shapes.
    "train_gemma_rmsnorm": ({"x": (16384, 3072), "weight": (3072,)},),
    "train_layernorm": (
        {"x": (4096, 8192), "weight": (8192,), "bias": (8192,)},
        {"x": (16384, 4096), "weight": (4096,), "bias": (4096,)},
    ),
    "train_softmax": ({"x": (4096, 8192)},),
    "train_gelu_bias": ({"x": (4096, 4096), "w": (14336, 4096), "b": (14336,)},),
}


def row_grid(cols, sms, stages=(1,)):
    """Row kernels' configs; with stages beyond 1 (the loop's loads pipelined), a
    narrower grid of rows, warps and programs so that the sweep stays minutes long."""
    block_n = triton.next_power_of_2(cols)
    wide = stages == (1,)
    for block_m, warps, per_sm, loop_stages in itertools.product(
        (1, 2, 4, 8) if wide else (1, 2),
        (4, 8, 16, 32) if wide else (4, 8, 16),
        (1, 2, 4, 8, 16) if wide else (1, 2, 4),
        stages,
    ):
        if block_m * block_n <= 32768:
            config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps}
            yield {**config, "LOOP_STAGES": loop_stages}, per_sm * sms


def tile_grid():
    for bm, bn, warps in itertools.product((32, 64, 128), (64, 128, 256), (4, 8)):
        if bm * bn <= 16384:
            yield {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps}, None


def launch_for(kernels, config, programs, rows, cols):
    if kernels.rowwise:
        programs = min(programs, triton.cdiv(rows, config["BLOCK_M"]))
        return config, (programs,), (programs, 1)
    blocks = (triton.cdiv(rows, config["BLOCK_M"]), triton.cdiv(cols, config["BLOCK_N"]))
    return config, (blocks[0] * blocks[1],), blocks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--modules", nargs="*", default=list(CASES))
    parser.add_argument("--built", help="a folder holding training.yaml's modules")
    parser.add_argument(
        "--stages", nargs="+", type=int, default=[1],
        help="row kernels: the loop's pipeline stages to sweep (LOOP_STAGES)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.built:
        sys.path.insert(0, args.built)
    else:
        args.modules = [m for m in args.modules if not m.startswith("train_")]
    if not torch.cuda.is_available():
        print("backward_configs.py: needs a CUDA GPU", file=sys.stderr)
        return 1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for name, shapes in [(m, shapes) for m in args.modules for shapes in CASES[m]]:
        module = __import__(name)
        kernels = module._KERNELS
        gen = torch.Generator(device="cuda").manual_seed(0)
        inputs = [
            torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.5
            for s in shapes.values()
        ]
        outputs = kernels.forward_saving(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        grads = [torch.randn_like(o) for o in outputs[: kernels.returns]]
        saved = list(outputs[kernels.returns :])
        saved += [outputs[i] for i in kernels.backward_saves]  # the outputs it reads
        # Operand gradients of a matmul chain are cuBLAS's: time the kernel alone.
        needs = [
            not (kernels.matmul and i in (kernels.matmul[0], *[b for b, _ in kernels.matmul[2]]))
            for i in range(len(inputs))
        ]
        plan = kernels.call_plan(inputs)
        dims = dict(zip(module.DIMS, plan.tail, strict=False))
        rows, cols = dims[kernels.dims[0]], dims[kernels.dims[1]]
        default = kernels.backward_launch(rows, cols, inputs[0].device)
        grid = list(row_grid(cols, sms, tuple(args.stages)) if kernels.rowwise else tile_grid())
        timings = []
        original = kernels.backward_launch
        for config, programs in [(default[0], default[1][0] if kernels.rowwise else None), *grid]:
            chosen = launch_for(kernels, config, programs, rows, cols)
            kernels.backward_launch = lambda r, c, d, *rest, chosen=chosen: chosen
            try:
                call = functools.partial(kernels.backward, grads, inputs, saved, needs)
                # GPU time: a slow host's launch would otherwise hide the kernel's.
                ms = graph_ms(call, calls=10, replays=10)
                ms = triton.testing.do_bench(call, return_mode="median") if ms is None else ms
            except Exception as exc:  # noqa: BLE001 - a config that does not compile
                ms = float("nan")
                print(f"{name} {config} {programs}: {type(exc).__name__}", file=sys.stderr)
            finally:
                kernels.backward_launch = original
            timings.append({"config": config, "programs": chosen[1][0], "ms": ms})
        default_ms = timings[0]["ms"]
        best = min(timings[1:], key=lambda t: t["ms"] if t["ms"] == t["ms"] else 1e9)
        results.append(
            {
                "module": name,
                "rows": rows,
                "cols": cols,
                "default": timings[0],
                "best": best,
                "all": timings,
            }
        )
        print(
            f"{name} [{rows}, {cols}]: default {default_ms:.4f} ms {timings[0]['config']} "
            f"x{timings[0]['programs']}; best {best['ms']:.4f} ms {best['config']} "
            f"x{best['programs']}",
            flush=True,
        )
        for t in sorted(timings[1:], key=lambda t: t["ms"] if t["ms"] == t["ms"] else 1e9)[:5]:
            print(f"    {t['ms']:.4f} ms {t['config']} x{t['programs']}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
