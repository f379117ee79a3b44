"""A quantize chain's module text: an elementwise chain whose value is rounded to fp8
with one scale per row (or per group along it), and the scales."""

from __future__ import annotations


from fusegen import dtypes, ops
from fusegen.codegen import naming
from fusegen.codegen.chain_text import (
    dict_literal,
    dtype_literal,
    formula,
    tuple_literal,
    wrapped_doc,
)
from fusegen.codegen.equivalence_text import bound_lines, bound_returns, dist, dynamic_cases
from fusegen.codegen.kernel_text import (
    epilogue,
    fast_tanh,
    helpers,
    row_max,
    row_max_helpers,
    tile_addr,
)
from fusegen.codegen.python_text import reference_lines
from fusegen.ir import Quantizer, Tensor

# The largest finite value of each fp8 type: the scale maps a row's largest magnitude there.
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
# (mantissa bits, smallest normal exponent) of each: the grid the interpreter rounds to.
FP8_GRID = {"fp8_e4m3": (3, -6), "fp8_e5m2": (2, -14)}


def round_lines(dtype: str) -> list[str]:
    """Rounding q to the fp8 grid in fp32, to nearest with ties to even (as the GPU's
    conversion and torch's do), for the interpreter (ROUND_BY_HAND): its fp32 -> fp8
    conversion halves a value whose rounding carries into the exponent (7.9 -> 4.0), and
    converts values on the grid exactly. q / step is exact (step is a power of two)."""
    mantissa, smallest = FP8_GRID[dtype]
    return [
        "# The interpreter's fp32 -> fp8 conversion halves values whose rounding carries",
        "# into the exponent (7.9 -> 4.0): round onto the fp8 grid first, ties to even.",
        f"step = tl.exp2(tl.maximum(tl.floor(tl.log2(tl.abs(q))), {smallest}.0) - {mantissa}.0)",
        "units = tl.floor(q / step)",
        "half = q / step - units",
        "odd = units - 2.0 * tl.floor(units * 0.5)",
        "q = tl.where((half > 0.5) | ((half == 0.5) & (odd == 1.0)), units + 1.0, units) * step",
    ]


def kernel_params(qz: Quantizer) -> list[dict]:
    chain = qz.chain
    strides = [naming.stride(t.name, d) for t in chain.inputs for d in t.dims]
    strides += [naming.stride(naming.OUT, chain.row), naming.stride(naming.OUT, chain.col)]
    strides += ["stride_scale_rows"] + (["stride_scale_groups"] if qz.group else [])
    meta = ["BLOCK_M", "BLOCK_N", "INT64", "ROUND_BY_HAND"]
    meta += ["FAST_TANH"] if fast_tanh(chain) else []
    return [
        {
            "comment": "the inputs, the fp8 output, its scales",
            "names": [naming.ptr(t.name) for t in chain.inputs]
            + [naming.ptr(naming.OUT), "scale_ptr"],
        },
        {"comment": "dims", "names": [d.name for d in chain.dims]},
        {"comment": "strides, in elements", "names": strides},
        {"comment": "meta-parameters", "names": [f"{m}: tl.constexpr" for m in meta]},
    ]


def formula_text(qz: Quantizer) -> str:
    value = formula(qz.chain).removeprefix("y = ") if qz.chain.steps else qz.chain.source
    per = "row" if qz.group is None else f"{qz.group} values along {qz.chain.col}"
    return f"q, scale = quantize({value}) to {qz.dtype}, one scale per {per}"


def context(qz: Quantizer, header: list[str], runtime_hash: str, doc_width: int, param_lines):
    chain = qz.chain
    out = Tensor(naming.OUT, (chain.row, chain.col), None, "", False)
    source = chain.tensor(chain.source)
    ref = reference_lines(chain)
    doc_lines = wrapped_doc(chain.doc, doc_width)
    offs_r, offs_c = naming.offs(chain.row), naming.offs(chain.col)
    scale_addr = f"scale_ptr + {offs_r} * stride_scale_rows"
    if qz.group:
        scale_addr += " + pid_g * stride_scale_groups"
    fp8_max = repr(FP8_MAX[qz.dtype])
    return {
        "header": header,
        "name": chain.name,
        "runtime_hash": runtime_hash,
        "doc_lines": doc_lines,
        "formula": formula_text(qz),
        "inputs_doc": [
            f"{t.name}: {'[..., ' + ', '.join(t.dims[1:]) + ']' if t.batched else list(t.dims)}"
            for t in chain.inputs
        ],
        "uses_functional": any("F." in line for line in ref),
        "dims_literal": dict_literal([(d.name, str(d.size)) for d in chain.dims]),
        "dtypes_literal": tuple_literal([dtype_literal(d) for d in chain.dtypes]),
        "fp8_torch": f"torch.{dtypes.QUANT_DTYPES[qz.dtype].torch}",
        "fp8_max": fp8_max,
        "group": qz.group,
        "inputs_literal": tuple_literal(
            [
                f'("{t.name}", {tuple_literal([repr(d) for d in t.dims])}, {t.batched})'
                for t in chain.inputs
            ]
        ),
        "fast_tanh": fast_tanh(chain),
        "helpers": [*helpers(chain), *row_max_helpers()],
        "amax": row_max("tl.where(in_bounds, tl.abs(value), 0.0)"),
        "scale_floor": ops.nan_max("amax", "1e-12"),
        "clamped": ops.nan_min(ops.nan_max("value / scale[:, None]", f"-{fp8_max}"), fp8_max),
        "kernel_fn": naming.kernel_fn(chain.name),
        "params": param_lines(kernel_params(qz)),
        "row": chain.row,
        "col": chain.col,
        "offs_row": offs_r,
        "offs_col": offs_c,
        "mask_row": naming.mask(chain.row),
        "mask_col": naming.mask(chain.col),
        "source_addr": tile_addr(source, (chain.row, chain.col)),
        "out_addr": tile_addr(out, (chain.row, chain.col)),
        "scale_addr": scale_addr,
        "chain_lines": epilogue(chain, "value"),
        "round_lines": round_lines(qz.dtype),
        "launcher_args": [t.name for t in chain.inputs],
        "reference_lines": ref,
        "no_gpu": chain.fallback_no_gpu,
    }


def test_context(qz: Quantizer, header: list[str]) -> dict:
    chain = qz.chain
    bounds = bound_lines(chain)
    gpu = {"row": [1, 77], "col": [4096, 1000 * (qz.group or 1)]}
    cpu = {"row": [1, 37], "col": [96, 300]}
    if qz.group:
        gpu["col"] = [qz.group * 3, qz.group * 33]
        cpu["col"] = [qz.group * 3, qz.group * 5]

    def role(name: str) -> str:
        return "row" if name == chain.row else "col"

    return {
        "header": header,
        "name": chain.name,
        "formula": formula_text(qz),
        "uses_functional": any("F." in line for line in bounds),
        "fast_tanh": fast_tanh(chain),
        "tanh_approx": f"2.0**{ops.TANH_APPROX_EXPONENT}",
        "dtypes_literal": "[" + ", ".join(dtype_literal(d) for d in chain.dtypes) + "]",
        "row": chain.row,
        "col": chain.col,
        "cases_cpu": repr(dynamic_cases(chain, cpu, role)),
        "cases_gpu": repr(dynamic_cases(chain, gpu, role)),
        "test_inputs": [
            {
                "name": t.name,
                "dist": dist(chain, t),
                "dtype": dtype_literal(t.dtype) if t.dtype else "None",
            }
            for t in chain.inputs
        ],
        "ref_args": ", ".join(t.name for t in chain.inputs),
        "bound_lines": bounds,
        "bound_returns": bound_returns(chain),
    }
