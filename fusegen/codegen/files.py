"""IR -> Python source: the kernel module and its test module for each kernel.

Every decision about what the code says is made here and in the *_text modules, in
Python; the templates only print. Output is formatted by the pinned black and parsed
before it is returned.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import black
import jinja2

from fusegen import __version__, configs, ops
from fusegen.codegen import hub_text, naming
from fusegen.codegen.chain_text import (
    dict_literal,
    docstring_safe,
    dtype_literal,
    formula,
    steps_in_order,
    tuple_literal,
    wrapped_doc,
)
from fusegen.codegen.attention_text import module_context as attention_module_context
from fusegen.codegen.loss_text import module_context as loss_module_context
from fusegen.codegen import quant_text, quantize_text
from fusegen.ir import Attention, Config, Kernel, LossHead, QuantChain, Quantizer, Tensor
from fusegen.codegen.kernel_text import (
    align_heuristic,
    aligned_ints,
    epilogue,
    fast_tanh,
    helpers,
    mainloop,
    params,
    row_chain,
    row_pieces,
    row_stats,
    saved,
    tile_addr,
    tma_mainloop,
    tma_operands,
    weights,
)
from fusegen.codegen.backward_text import (
    backward_facts,
    backward_params,
    helper_grads,
    row_backward,
    tile_backward,
    tile_epilogue,
)
from fusegen.codegen.python_text import input_doc, out_doc, reference_lines, reference_return
from fusegen.codegen.equivalence_text import (
    aligned_cases,
    bound_lines,
    bound_returns,
    cases,
    dist,
    heavy,
    kinked,
)

BLACK_MODE = black.Mode(line_length=100, target_versions={black.TargetVersion.PY310})


def template_dir() -> Path:
    return Path(__file__).resolve().parent / "templates"


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


_ENV = _environment()


@dataclass(frozen=True)
class Rendered:
    filename: str
    text: str


RUNTIME_DIR = "_fusegen_runtime"  # the runtime package, beside the kernel modules


def render(kernel: Kernel | Attention | LossHead | QuantChain | Quantizer) -> list[Rendered]:
    """The kernel module and its test module, formatted and checked to parse."""
    if isinstance(kernel, Quantizer):
        files = (
            (f"{kernel.name}.py", "quantize_module.py.j2", quantize_context(kernel)),
            (f"test_{kernel.name}.py", "quantize_test.py.j2", quantize_test_context(kernel)),
        )
    elif isinstance(kernel, QuantChain):
        files = (
            (f"{kernel.name}.py", "quant_module.py.j2", quant_context(kernel)),
            (f"test_{kernel.name}.py", "quant_test.py.j2", quant_test_context(kernel)),
        )
    elif isinstance(kernel, LossHead):
        files = (
            (f"{kernel.name}.py", "loss_module.py.j2", loss_context(kernel)),
            (
                f"test_{kernel.name}.py",
                "loss_test.py.j2",
                {"header": header(kernel), "name": kernel.name},
            ),
        )
    elif isinstance(kernel, Attention):
        files = (
            (f"{kernel.name}.py", "attention_module.py.j2", attention_context(kernel)),
            (f"test_{kernel.name}.py", "attention_test.py.j2", attention_test_context(kernel)),
        )
    else:
        runtime_hash = runtime_digest()
        files = (
            (f"{kernel.name}.py", "kernel_module.py.j2", kernel_context(kernel, runtime_hash)),
            (f"test_{kernel.name}.py", "test_module.py.j2", test_context(kernel)),
        )
    out = []
    for filename, template, context in files:
        text = _format(filename, _ENV.get_template(template).render(**context))
        if KERNEL_HASH_PLACEHOLDER in text:
            text = text.replace(KERNEL_HASH_PLACEHOLDER, kernel_source_hash(text))
        out.append(Rendered(filename, text))
    return out


def render_hub(hub: str, kernels: list, texts: list[str]) -> list[Rendered]:
    """A `kernels` local repository's own files around a build's modules (hub_text):
    the package's __init__.py and layers.py, and the variant's metadata.json, named
    relative to the output folder. texts: the build's module texts (the metadata's id)."""
    folder = hub_text.hub_folder(hub)
    context = hub_text.layers_context(hub, kernels)
    init = {**context, "all_modules": [k.name for k in kernels]}
    out = [
        Rendered(f"{folder}/__init__.py", _ENV.get_template("hub_init.py.j2").render(**init)),
        Rendered(f"{folder}/layers.py", _ENV.get_template("hub_layers.py.j2").render(**context)),
    ]
    out = [Rendered(r.filename, _format(r.filename, r.text)) for r in out]
    texts = [*texts, *(r.text for r in out)]
    variant = folder.rsplit("/", 1)[0]
    return [*out, Rendered(f"{variant}/metadata.json", hub_text.metadata(hub, texts))]


def render_runtime() -> list[Rendered]:
    """The launch support every kernel module in an output folder shares: fusegen's
    runtime package (fusegen/runtime/), copied as it is into RUNTIME_DIR with a header,
    its RUNTIME_HASH the digest of the copies with the placeholder in place."""
    digest = runtime_digest()
    return [
        Rendered(f"{RUNTIME_DIR}/{name}", text.replace(RUNTIME_HASH_PLACEHOLDER, digest))
        for name, text in _runtime_texts()
    ]


def runtime_digest() -> str:
    whole = hashlib.sha256()
    for name, text in _runtime_texts():
        whole.update(f"{name}\0{text}\0".encode())
    return whole.hexdigest()[:16]


@functools.cache
def _runtime_texts() -> tuple[tuple[str, str], ...]:
    """(file name, text with its header) of each module of the runtime package, sorted."""
    header = (
        f"# Generated by fusegen {__version__}: the launch support of the kernel modules in "
        "this folder.\n# Do not edit: `fusegen build` copies it from fusegen/runtime/.\n"
    )
    folder = Path(__file__).resolve().parent.parent / "runtime"
    return tuple(
        (path.name, header + path.read_text(encoding="utf-8"))
        for path in sorted(folder.glob("*.py"))
    )


def _format(filename: str, text: str) -> str:
    ast.parse(text, filename=filename)  # a template bug must not reach a user's repo
    return _black(text)


@functools.lru_cache(maxsize=512)
def _black(text: str) -> str:
    # Black takes most of a build (~0.7 s a module on a slow core); a process that builds
    # the same specs again (a test session, `build` then `build --check`) formats once.
    return black.format_str(text, mode=BLACK_MODE)


# As long as the hashes they stand for, so that black's layout does not change.
KERNEL_HASH_PLACEHOLDER = "kernel-hash-here"
RUNTIME_HASH_PLACEHOLDER = "runtime-hash-hex"


def kernel_source_hash(module_text: str) -> str:
    """sha256 (16 hex digits) of the code of the forward's Triton kernels and helpers in
    a module (decorators included; docstrings, comments and layout not): the code a tuned
    config was measured on. Launcher, docs, config spaces and the training kernels are
    not."""
    pieces = []
    for node in ast.parse(module_text).body:
        # The training kernels (the backward, its derivative helpers, a matmul chain's
        # epilogue) take no tuned config.
        training = ("_backward", "_grad", "_epilogue")
        backward = node.name.endswith(training) if hasattr(node, "name") else False
        if (
            isinstance(node, ast.FunctionDef)
            and not backward
            and any("triton" in ast.unparse(d) for d in node.decorator_list)
        ):
            if ast.get_docstring(node) is not None:
                node.body = node.body[1:] or [ast.Pass()]
            pieces.append(ast.unparse(node))
    return hashlib.sha256("\n".join(pieces).encode()).hexdigest()[:16]


def module_kernel_hash(module_text: str) -> str | None:
    """The KERNEL_HASH a generated module declares, or None."""
    match = re.search(r'^KERNEL_HASH = "([0-9a-f]{16})"$', module_text, re.MULTILINE)
    return match.group(1) if match else None


def header(kernel: Kernel) -> list[str]:
    return [
        f"Generated by fusegen {__version__} from {kernel.spec_display} "
        f"(sha256 {kernel.spec_sha256[:16]}).",
        f"Do not edit: change the spec, then run `fusegen build {kernel.spec_display}`.",
    ]


def attention_context(att: Attention) -> dict:
    context = attention_module_context(
        att, header(att), f"{att.name}_{att.spec_sha256[:12]}", DOC_WIDTH
    )
    return {**context, "runtime_hash": runtime_digest()}


def loss_context(head: LossHead) -> dict:
    return {**loss_module_context(head, header(head), DOC_WIDTH), "runtime_hash": runtime_digest()}


def quant_context(qc: QuantChain) -> dict:
    context = quant_text.context(qc, header(qc), runtime_digest(), DOC_WIDTH, param_lines)
    return {**context, "kernel_hash_placeholder": KERNEL_HASH_PLACEHOLDER}


def quantize_context(qz: Quantizer) -> dict:
    return quantize_text.context(qz, header(qz), runtime_digest(), DOC_WIDTH, param_lines)


def quantize_test_context(qz: Quantizer) -> dict:
    return quantize_text.test_context(qz, header(qz))


def quant_test_context(qc: QuantChain) -> dict:
    return quant_text.test_context(qc, header(qc))


def attention_test_context(att: Attention) -> dict:
    return {"header": header(att), "name": att.name, "window": att.window}


def kernel_context(kernel: Kernel, runtime_hash: str) -> dict:
    mm = kernel.matmul
    unpinned = [t for t in kernel.inputs if t.dtype is None]
    outs = outputs(kernel)
    out_names = [naming.OUT, *kernel.emits]
    views = [naming.view2d(t.name) for t in kernel.inputs] + [naming.view2d(n) for n in out_names]
    strides = [f"*_rt.strides_of({', '.join(naming.view2d(t.name) for t in kernel.inputs)})"]
    # The outputs are contiguous: [rows] for a reduction, else [rows, cols].
    strides += ["1"] if kernel.reduces else [kernel.col, "1"]
    strides += [kernel.col, "1"] * len(kernel.emits)
    launch_tail = [d.name for d in kernel.dims] + [f"_rt.bucket({kernel.row})"] + strides
    operands, dots = mainloop(kernel) if mm else ([], [])
    gate = kernel.gate
    value = "acc" if mm else "value"
    tune_key = [naming.ROWS_BUCKET, kernel.col] + ([mm.k] if mm else [])
    source_tensor = kernel.tensor(kernel.source) if kernel.source else None
    doc_lines = wrapped_doc(kernel.doc, DOC_WIDTH)
    dims_doc = ", ".join(f"{d.name} = {d.size if d.size else 'dynamic'}" for d in kernel.dims)
    summary = (
        doc_lines
        + ([""] if doc_lines else [])
        + [
            f"    {formula(kernel)}",
            "",
            f"Dims: {dims_doc}. Dtypes: {', '.join(kernel.dtypes)}, computed in fp32."
            + (" Target: AMD GPUs (ROCm)." if kernel.target == "amd" else ""),
            "",
            *textwrap.wrap(
                f"Use: y = {kernel.name}({', '.join(t.name for t in kernel.inputs)}). "
                "reference(...) is the same chain unfused; last_launch() says what the last "
                f"call ran. Only torch, triton and {RUNTIME_DIR}/ (beside this file) are needed.",
                DOC_WIDTH,
            ),
        ]
    )
    operand_views = [naming.view2d(t.name) for t in tma_operands(kernel)] if mm else []
    copyable = {
        i: naming.view2d(t.name)
        for i, t in enumerate(kernel.inputs)
        if naming.view2d(t.name) in operand_views
    }
    reference = reference_lines(kernel)
    return {
        "launcher_doc": launcher_doc(kernel, outs),
        "runtime_hash": runtime_hash,
        "uses_functional": any("F." in line for line in reference),
        "config_lines": config_lines(kernel),
        "config_comment": textwrap.wrap(
            "Configs, one a row (None: the kernel's default). CONFIGS: the autotuner's, per "
            "row-count power-of-two bucket, "
            + " and ".join(tune_key[1:])
            + ". DEFAULT_CONFIG: where tuning cannot run. INTERPRETER_CONFIG: under "
            "TRITON_INTERPRET=1 (large tiles: its cost is per op).",
            DOC_WIDTH - 2,
        ),
        "dims_unpacked": ", ".join(d.name for d in kernel.dims),
        "dims_values": ", ".join(f'shapes["{d.name}"]' for d in kernel.dims),
        "copy_views": ", ".join(copyable.values()),
        "copy_dict": "{" + ", ".join(f"{i}: {v}" for i, v in copyable.items()) + "}",
        "returns_tuple": tuple_literal([o["kwarg"] for o in outs]),
        "call_tuple": tuple_literal([t.name for t in kernel.inputs]),
        "views_tuple": tuple_literal([naming.view2d(t.name) for t in kernel.inputs]),
        "copy_tuple": tuple_literal(list(copyable.values())) if copyable else "()",
        "paths": kernel_paths(kernel),
        "kernels_dims": tuple_literal(
            [f'"{d}"' for d in (kernel.row, kernel.col, *([mm.k] if mm else []))]
        ),
        "kernels_options": kernels_options(kernel),
        "header": header(kernel),
        "title": f"{kernel.name}: the fused kernel, its launcher and its PyTorch reference.",
        "summary": summary,
        "name": kernel.name,
        "formula": formula(kernel),
        "dims_literal": dict_literal([(d.name, str(d.size)) for d in kernel.dims]),
        "dtypes_literal": tuple_literal([dtype_literal(d) for d in kernel.dtypes]),
        "out_dtype_literal": dtype_literal(kernel.out_dtype) if kernel.out_dtype else "None",
        "fp32_matmul": f'"{kernel.fp32_matmul}"' if kernel.fp32_matmul else "None",
        # The inner strides too: a column-major input is tuned apart from a row-major one.
        "tune_key": "[" + ", ".join(f'"{k}"' for k in tune_key + inner_strides(kernel)) + "]",
        "kernel_hash_placeholder": KERNEL_HASH_PLACEHOLDER,
        "has_tma": mm is not None and kernel.target == "nvidia",
        "partials": naming.PARTIALS,
        "arrivals": naming.ARRIVALS,
        "deterministic": kernel.deterministic,
        "helpers": helpers(kernel),
        "fast_tanh": fast_tanh(kernel),
        "matmul": mm is not None,
        "k": mm.k if mm else "",
        "offs_k": naming.offs(mm.k) if mm else "",
        "mask_k": naming.mask(mm.k) if mm else "",
        "rows_bucket": naming.ROWS_BUCKET,
        "kernel_fn": naming.kernel_fn(kernel.name),
        "params": param_lines(params(kernel)),
        "aligned_ints": aligned_ints(kernel),
        "align_heuristic": align_heuristic(kernel) if not mm else "",
        "tma_params": param_lines(params(kernel, tma=True)),
        "tma": tma_mainloop(kernel) if mm else {},
        "tma_operands": (
            tuple_literal([naming.view2d(t.name) for t in tma_operands(kernel)]) if mm else "()"
        ),
        "row": kernel.row,
        "col": kernel.col,
        "offs_row": naming.offs(kernel.row),
        "offs_col": naming.offs(kernel.col),
        "mask_row": naming.mask(kernel.row),
        "mask_col": naming.mask(kernel.col),
        "operands": operands,
        "dots": dots,
        "accumulators": ["acc"] + (["acc_gate"] if gate else []),
        "value": value,
        "source_addr": tile_addr(source_tensor, (kernel.row, kernel.col)) if source_tensor else "",
        "epilogue": epilogue(kernel, value),
        "out_ptr": naming.ptr(naming.OUT),
        "out_addr": tile_addr(
            Tensor(naming.OUT, (kernel.row, kernel.col), None, "", False), (kernel.row, kernel.col)
        ),
        "inputs": [
            {
                "name": t.name,
                "view": naming.view2d(t.name),
                "dims": tuple_literal([f'"{d}"' for d in t.dims]),
                "batched": t.batched,
                "doc": input_doc(kernel, t),
            }
            for t in kernel.inputs
        ],
        "out_shape": (
            "(*shapes.lead,)"
            if kernel.reduces
            else (
                f'(*shapes.lead, shapes["{kernel.col}"])'
                if any(t.batched for t in kernel.inputs)
                else f'(shapes["{kernel.row}"], shapes["{kernel.col}"])'
            )
        ),
        "outputs": outs,
        "emits": bool(kernel.emits),
        "returns": (
            "(" + ", ".join(o["kwarg"] for o in outputs(kernel)) + ")" if kernel.emits else "out"
        ),
        "return_annotation": " -> tuple[torch.Tensor, ...]" if kernel.emits else " -> torch.Tensor",
        "op_name": f"{kernel.name}_{kernel.spec_sha256[:12]}",
        "reference_return": reference_return(kernel, unpinned[0].name),
        "rowwise": kernel.row_step is not None,
        "reduces": kernel.reduces,
        "refuses_empty_rows": kernel.row_step is not None and kernel.row_step.op == "max",
        **row_context(kernel),
        "returns_unpacked": ", ".join(o["kwarg"] for o in outs),
        "out_view_expr": f"({outs[0]['view']})",
        "saves": 1 + bool(gate) if mm else 1,
        "stats": bool(row_stats(kernel)),
        "saved": saved(kernel) if mm else [],
        "grad_helpers": helper_grads(kernel),
        "backward": backward_context(kernel),
        "train_epilogue": epilogue_context(kernel),
        "last_launch_doc": last_launch_doc(kernel),
        "requires_grad_any": " or ".join(f"{t.name}.requires_grad" for t in kernel.inputs),
        "input_names": tuple_literal([f'"{t.name}"' for t in kernel.inputs]),
        "dims": [d.name for d in kernel.dims],
        "call_args": ", ".join(t.name for t in kernel.inputs),
        "autocast_targets": (
            f"({kernel.inputs[0].name},)"
            if len(kernel.inputs) == 1
            else ", ".join(t.name for t in kernel.inputs)
        ),
        "nonfinite_fallback": kernel.fallback_nonfinite == "reference",
        "out_view": naming.view2d(naming.OUT),
        "views": ", ".join(views),
        # A batched input of the kernel's rank is passed as it is: a reshape per call
        # costs more (1.6 us measured) than the check.
        "call_views": ", ".join(
            (
                f"{t.name} if {t.name}.dim() == 2 else {t.name}.reshape(-1, {t.name}.shape[-1])"
                if t.batched and len(t.dims) == 2
                else (
                    f"{t.name} if {t.name}.dim() == 1 else {t.name}.reshape(-1)"
                    if t.batched
                    else t.name
                )
            )
            for t in kernel.inputs
        ),
        "launch_tail": ", ".join(launch_tail),
        "reference_lines": reference,
        "tune_key_values": ", ".join(
            [f"_rt.bucket({kernel.row})", kernel.col] + ([mm.k] if mm else [])
        ),
    }


def inner_strides(kernel: Kernel) -> list[str]:
    """The stride of each 2-D input along its last dim: 1 unless it arrives column-major."""
    return [naming.stride(t.name, t.dims[-1]) for t in kernel.inputs if len(t.dims) == 2]


def optional_literal(kernel: Kernel) -> str:
    """Per kernel path, the settings a config may add to its default's, each with the
    value the kernel takes when it is left out (None: a compile option, not passed)."""
    if kernel.matmul is None:
        return '{"pointer": {}}'
    if kernel.target == "amd":
        amd = ", ".join(f'"{k}": None' for k in configs.AMD_OPTIONS)
        return '{"pointer": {"SPLIT_K": 1, ' + amd + "}}"
    return '{"pointer": {"SPLIT_K": 1}, "tma": {}}'


def launcher_doc(kernel: Kernel, outs: list[dict]) -> list[str]:
    """The launcher's docstring, wrapped to the line length (its first line opens it)."""

    def item(name: str, text: str) -> list[str]:
        return textwrap.wrap(
            f"{name}: {text}", DOC_WIDTH - 8, initial_indent="    ", subsequent_indent="        "
        )

    lines = [f'"""{docstring_safe(formula(kernel))}', "", "Args:"]
    for t in kernel.inputs:
        lines += item(t.name, input_doc(kernel, t))
    for o in outs:
        lines += item(
            o["kwarg"],
            f"a buffer for {o['what']} (optional; contiguous, sharing no memory with an input).",
        )
    lines += item(
        "config", "a config to launch instead of choosing one, in the form of DEFAULT_CONFIG."
    )
    lines += ["", "Returns:"]
    for o in outs:
        lines += item(o["what"], f"{o['doc']}.")
    lines.append("")
    lines += textwrap.wrap(
        "Raises TypeError or ValueError naming the tensor and dim for a wrong type, shape, "
        "dtype or device. Where an input requires grad (grad mode on), the outputs carry a "
        "grad_fn: the backward kernel, then (a matmul chain) cuBLAS for the operands, computing "
        "only the gradients asked for; out= and config= are refused there. Inside "
        f"torch.compile it is the custom op fusegen::"
        f"{kernel.name}_{kernel.spec_sha256[:12]} (with `out=` or `config=` given there, an "
        "eager call: a graph break).",
        DOC_WIDTH - 4,
    )
    return [*lines, '"""']


# Docstrings and comments wrap here, inside black's (and ruff's) line length of 100.
DOC_WIDTH = 92


def kernel_paths(kernel: Kernel) -> list[tuple[str, str]]:
    """The Kernels object's paths: per kernel, (its function, space, default config)."""
    fn = naming.kernel_fn(kernel.name)
    paths = [("pointer", f"({fn}, CONFIGS, DEFAULT_CONFIG)")]
    if kernel.matmul is not None and kernel.target == "nvidia":
        paths.append(("tma", f"({fn}_tma, TMA_CONFIGS, TMA_DEFAULT_CONFIG)"))
    return paths


def kernels_options(kernel: Kernel) -> list[tuple[str, str]]:
    """The Kernels object's keyword arguments that differ from their defaults."""
    mm = kernel.matmul
    nvidia_mm = mm is not None and kernel.target == "nvidia"
    options = []
    if mm is not None:
        options.append(("optional", optional_literal(kernel)))
    if len(kernel.emits):
        options.append(("outputs", str(1 + len(kernel.emits))))
    pinned = [t for t in kernel.inputs if t.dtype is not None]
    if pinned:
        options.append(("pinned", dict_literal([(t.name, dtype_literal(t.dtype)) for t in pinned])))
    if nvidia_mm:
        flags = [
            (naming.column_major(t.name), [i.name for i in kernel.inputs].index(t.name))
            for t in tma_operands(kernel)
        ]
        options.append(("tma_operands", dict_literal([(f, str(i)) for f, i in flags])))
    if mm is not None:
        options.append(("weights", str(len(weights(kernel)))))
    if any(getattr(s, "broadcast", None) == "full" for s in steps_in_order(kernel)) and mm:
        options.append(("full_operands", "True"))
    if row_stats(kernel):
        options.append(("stats", str(len(row_stats(kernel)))))
    context = backward_context(kernel)
    options.append(("backward", backward_facts(kernel, context["grads"])))
    if context["saved_outputs"]:
        outputs = ["out", *kernel.emits]  # the launcher's outputs, in order
        kept = [str(outputs.index(e)) for e in context["saved_outputs"]]
        options.append(("backward_saves", tuple_literal(kept)))
    names = [t.name for t in kernel.inputs]
    reads = [str(names.index(n)) for n in context["inputs"]]
    options.append(("backward_reads", tuple_literal(reads) if reads else "()"))
    if mm:
        bs = [(mm.b, mm.b_transposed)] + (
            [(gate.matmul.b, gate.matmul.b_transposed)] if (gate := kernel.gate) else []
        )
        weights_text = tuple_literal([f"({names.index(b)}, {t})" for b, t in bs])
        options.append(("matmul", f"({names.index(mm.a)}, {mm.a_transposed}, {weights_text})"))
    flags = {
        "epilogue": has_epilogue(kernel),
        "recompute": mm is not None and kernel.backward_save == "inputs",
        "reduces": kernel.reduces,
        "rowwise": kernel.row_step is not None,
        "fast_tanh": fast_tanh(kernel),
        # A spec's own default (autotune.default) is launched as given where nothing is
        # tuned, not the estimate's pick.
        "spec_default": nvidia_mm and kernel.default_given,
        "nonfinite": kernel.fallback_nonfinite == "reference",
        "no_gpu_reference": kernel.fallback_no_gpu == "reference",
        "amd": kernel.target == "amd",
    }
    return options + [(name, "True") for name, on in flags.items() if on]


def config_lines(kernel: Kernel) -> list[str]:
    """The config spaces as tables, a config a row (printed as they are: black leaves
    them), each path's settings named once."""
    lines = _space_lines("", kernel.configs, kernel.default_config, kernel.interpreter_config)
    if kernel.matmul is not None and kernel.target == "nvidia":
        lines += _space_lines("TMA_", kernel.tma_configs, kernel.tma_default_config, None)
    return lines


def _space_lines(
    prefix: str, space: list[Config], default: Config, interpreter: Config | None
) -> list[str]:
    space_, default_ = [dict(c.items()) for c in space], dict(default.items())
    interpreter_ = dict(interpreter.items()) if interpreter else None
    settings = list(default_)
    for config in [*space_, *([interpreter_] if interpreter_ else [])]:
        settings += [k for k in config if k not in settings]
    name = f"_{prefix}SETTINGS"
    lines = _wrapped(f"{name} = (", [f'"{s}"' for s in settings], ")")

    def row(config: Config) -> str:
        return ", ".join(f"{config[s]:>3}" if s in config else "None" for s in settings)

    lines.append(f"{prefix}CONFIGS = _rt.config_table({name}, [")
    lines += [f"    ({row(c)})," for c in space_]
    lines.append("])")
    lines.append(f"{prefix}DEFAULT_CONFIG = _rt.config_row({name}, {row(default_)})")
    if interpreter_:
        lines.append(f"INTERPRETER_CONFIG = _rt.config_row({name}, {row(interpreter_)})")
    return lines


def _wrapped(opening: str, items: list[str], closing: str, width: int = 96) -> list[str]:
    """`opening` items `closing`, the items wrapped at `width` under the first."""
    lines, current = [], opening
    indent = " " * len(opening)
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else closing)
        if len(current) + len(piece) + 1 > width and current.strip() not in ("", opening.strip()):
            lines.append(current.rstrip())
            current = indent
        current += piece + " "
    lines.append(current.rstrip())
    return lines


def param_lines(groups: list[dict]) -> list[str]:
    """A kernel's parameters, a few lines per group, its comment on the first (black
    leaves them)."""
    lines = []
    for group in (g for g in groups if g["names"]):
        comment = f"  # {group['comment']}"
        current, first = "", True
        for piece in (f"{n}," for n in group["names"]):
            limit = 92 - (len(comment) if first else 0)
            if current and len(current) + len(piece) + 1 > limit:
                lines.append(current + (comment if first else ""))
                current, first = "", False
            current = f"{current} {piece}" if current else piece
        lines.append(current + (comment if first else ""))
    return lines


def backward_context(kernel: Kernel) -> dict:
    """The backward kernel's parameters and lines (see fusegen.codegen.backward_text)."""
    pieces = row_backward(kernel) if kernel.row_step else tile_backward(kernel)
    return {
        **{k: pieces.get(k, []) for k in ("loads", "backward", "stores", "totals", "final")},
        "params": param_lines(backward_params(kernel, pieces)),
        "grads": pieces["grads"],
        "saved_outputs": pieces.get("saved_outputs", []),
        "inputs": pieces["inputs"],
    }


def has_epilogue(kernel: Kernel) -> bool:
    """A matmul chain whose training forward saves its accumulators: cuBLAS computes them
    there (bf16, fp16), and the epilogue kernel the rest of the chain."""
    return kernel.matmul is not None and kernel.backward_save != "inputs"


def last_launch_doc(kernel: Kernel) -> list[str]:
    """last_launch's docstring, its lines."""
    sources = "table, autotune, default, interpreter, explicit, reference (...), empty"
    paths = "pointer, tma"
    if has_epilogue(kernel):
        sources += ", training"
        paths += ", cublas + epilogue: a bf16 or fp16 training forward"
    text = (
        f'"""What the last call ran: its "config", "source" ({sources}), "path" ({paths}), '
        '"fast_tanh" (tanh.approx ran) and "fp32_matmul" (tf32, tf32x3 or ieee, for an fp32 '
        'matmul), as a dict."""'
    )
    return textwrap.wrap(text, DOC_WIDTH)


def epilogue_context(kernel: Kernel) -> dict | None:
    """The epilogue kernel's lines and parameters (see has_epilogue)."""
    if not has_epilogue(kernel):
        return None
    pieces = tile_epilogue(kernel)
    return {"lines": pieces["lines"], "params": param_lines(pieces["params"])}


def outputs(kernel: Kernel) -> list[dict]:
    """The launcher's outputs: the chain's result, then each extra output."""
    rows, cols = kernel.row, kernel.col
    main = {
        "kwarg": "out",
        "what": "y",
        "doc": out_doc(kernel),
        "shape": "plan.out_shape",
        "dtype": "plan.out_dtype",
        "view": (
            "out if out.dim() == 1 else out.view(-1)"
            if kernel.reduces
            else "out if out.dim() == 2 else out.view(-1, out.shape[-1])"
        ),
        "stand_in": naming.view2d(naming.OUT),
        "shape_2d": f"({rows},)" if kernel.reduces else f"({rows}, {cols})",
    }
    extras = [
        {
            "kwarg": f"out_{name}",
            "what": name,
            "doc": f"[..., {cols}] in the call dtype: the value at `output: {name}`",
            "shape": "plan.extra_shape",
            "dtype": "plan.dtype",
            "view": (
                f"out_{name} if out_{name}.dim() == 2 "
                f"else out_{name}.view(-1, out_{name}.shape[-1])"
            ),
            "stand_in": naming.view2d(name),
            "shape_2d": f"({rows}, {cols})",
        }
        for name in kernel.emits
    ]
    return [main, *extras]


def row_context(kernel: Kernel) -> dict:
    if kernel.row_step is None:
        return {
            "row_pieces": {},
            "row_first_pass": [],
            "row_second_pass": [],
            "row_after": [],
            "row_store": "",
        }
    first, after = row_chain(kernel, emits=True)
    second, _ = row_chain(kernel, emits=False)
    if kernel.reduces:
        addr = (
            f"{naming.ptr(naming.OUT)} + {naming.offs(kernel.row)}"
            f" * {naming.stride(naming.OUT, kernel.row)}"
        )
        mask = naming.mask(kernel.row)
    else:
        out = Tensor(naming.OUT, (kernel.row, kernel.col), None, "", False)
        addr, mask = tile_addr(out, (kernel.row, kernel.col)), "in_bounds"
    store = f"tl.store({addr}, value.to({naming.ptr(naming.OUT)}.dtype.element_ty), mask={mask})"
    return {
        "row_pieces": row_pieces(kernel),
        "row_first_pass": first,
        "row_second_pass": second,
        "row_after": after,
        "row_store": store,
    }


def test_context(kernel: Kernel) -> dict:
    cpu, gpu = cases(kernel)
    aligned_cpu, aligned_gpu = aligned_cases(kernel)
    mm = kernel.matmul
    nvidia_matmul = mm is not None and kernel.target == "nvidia"
    return {
        "uses_functional": any("F." in line for line in bound_lines(kernel)),
        "header": header(kernel),
        "name": kernel.name,
        "formula": formula(kernel),
        "dtypes_literal": "[" + ", ".join(dtype_literal(d) for d in kernel.dtypes) + "]",
        "row": kernel.row,
        "col": kernel.col,
        "fan_in": f'"{mm.k}"' if mm else "None",
        "test_inputs": [
            {
                "name": t.name,
                "dims": tuple_literal([f'"{d}"' for d in t.dims]),
                "dtype": dtype_literal(t.dtype) if t.dtype else "None",
                "dist": dist(kernel, t),
                "batched": t.batched,
            }
            for t in kernel.inputs
        ],
        "cases_cpu": repr(cpu),
        "outputs_literal": repr(["out", *(f"out_{e}" for e in kernel.emits)]),
        "reduces": kernel.reduces,
        "source": kernel.source or "",
        "special_rows": kernel.row_step is not None,
        "softmax_mask": dict(kernel.row_step.operands).get("mask") if kernel.row_step else None,
        "bound_returns": bound_returns(kernel),
        "aligned_cpu": repr(aligned_cpu),
        "aligned_gpu": repr(aligned_gpu),
        "matmul": mm is not None,
        "has_tma": nvidia_matmul,
        "heavy": heavy(kernel),
        "kinked": kinked(kernel),
        "cases_gpu": repr(gpu),
        "ref_args": ", ".join(t.name for t in kernel.inputs),
        "matmul_operands": repr([t.name for t in tma_operands(kernel)] if mm else []),
        "bound_lines": bound_lines(kernel),
        "fast_tanh": fast_tanh(kernel),
        "estimated_default": nvidia_matmul and not kernel.default_given,
        "tanh_approx": f"2.0**{ops.TANH_APPROX_EXPONENT}",
        "no_gpu": kernel.fallback_no_gpu,
        "nonfinite": kernel.fallback_nonfinite,
        "recompute": mm is not None and kernel.backward_save == "inputs",
        "mm_calls": repr(mm_calls(kernel)),
    }


def mm_calls(kernel: Kernel) -> dict[str, int]:
    """The torch.mm calls of a backward asked for one input's gradient: the matmul's `a`
    needs one per weight, a weight its own, others none; a backward that recomputes the
    accumulators (backward.save: inputs) first makes one per weight."""
    if not kernel.matmul:
        return {t.name: 0 for t in kernel.inputs}
    per_weight = len(weights(kernel))
    operands = {t.name for t in tma_operands(kernel)}
    recomputed = per_weight if kernel.backward_save == "inputs" else 0
    return {
        t.name: recomputed + (per_weight if t.name == kernel.matmul.a else int(t.name in operands))
        for t in kernel.inputs
    }
