"""A loss head (ir.LossHead) -> what its module and test module say: the logit steps'
lines (each with its factor of the derivative), the reference's, the formula, the docs.
The templates print."""

from __future__ import annotations

import textwrap

from fusegen.codegen.chain_text import (
    dtype_literal,
    lit,
    tuple_literal,
    wrapped_doc,
)
from fusegen.ir import LossHead

# The logits block's most bytes where the backward makes the logits again (a loss a
# token, lse's gradient, a second backward): 64 MiB holds 4,096 vocabulary columns of
# 8,192 bf16 tokens.
BLOCK_BYTES = 64 << 20
# A training call of a scalar loss makes its gradients in the forward (three GEMMs, not
# four), in blocks of whole vocabulary rows of at most 256 MiB: faster at every measured
# shape than making the logits again in the backward (benchmarks/lm_head_loss.py, H200,
# bf16: 8,192 x 4,096 -> 128,256 43.9 ms against 53.8, and 44.8 against 50.0 in another
# run; 32,768 tokens 175.9 against 242.2).
GRADIENTS_IN_FORWARD = True
FORWARD_GRADS_BLOCK_BYTES = 256 << 20
FORWARD_GRADS_SOURCE = "43.9 ms against the backward's 53.8 at 8,192 x 4,096 -> 128,256 (H200)"
# The row kernels' columns a step and warps: one token's block row a program.
ROW_TILE, NUM_WARPS = 2048, 8
INTERPRETER_ROW_TILE = 256  # two steps a row in the tests' 300-column case


def logit_lines(head: LossHead) -> list[str]:
    """The Triton lines from `value` (the block's fp32 entries) to `logits`, and `slope`:
    d logits / d value."""
    lines = ["logits = value"]
    for step in head.steps:
        if step.op == "bias":
            lines.append(
                "logits = logits + tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)"
            )
        elif step.op == "scale":
            c = lit(step.constant)
            lines += [f"logits = logits * {c}  # SCALE", f"slope = slope * {c}"]
        else:
            c = lit(step.constant)
            lines += [
                f"capped = _tanh(logits / {c}, FAST_TANH)  # SOFTCAP",
                "slope = slope * (1.0 - capped * capped)",
                f"logits = {c} * capped",
            ]
    return lines


def reference_lines(head: LossHead) -> list[str]:
    """The PyTorch lines from `logits` (x @ weight.T in the call's dtype) on, eager's way."""
    out = []
    for step in head.steps:
        if step.op == "bias":
            out.append(f"logits = logits + {step.operand}")
        elif step.op == "scale":
            out.append("logits = logits * SCALE")
        else:
            out.append("logits = SOFTCAP * torch.tanh(logits / SOFTCAP)")
    return out


def formula(head: LossHead) -> str:
    text = f"x @ {head.weight}" + (".T" if head.weight_transposed else "")
    for step in head.steps:
        if step.op == "bias":
            text = f"{text} + {step.operand}"
        elif step.op == "scale":
            text = f"({text}) * {lit(step.constant)}"
        else:
            text = f"{lit(step.constant)} * tanh(({text}) / {lit(step.constant)})"
    options = [f"ignore_index={head.ignore_index}", f"reduction={head.reduction!r}"]
    if head.label_smoothing:
        options.append(f"label_smoothing={lit(head.label_smoothing)}")
    text = f"cross_entropy({text}, {head.labels}, {', '.join(options)})"
    if head.z_loss:
        text += f" + {lit(head.z_loss)} * lse**2"
    return text


def call_doc(head: LossHead, width: int) -> list[str]:
    """The launcher's docstring after its first line, wrapped."""
    labels = head.labels
    if head.reduction == "mean":
        loss = "the mean over the tokens not ignored (NaN where all are, as F.cross_entropy)"
    elif head.reduction == "sum":
        loss = "the sum over the tokens (0 for the ignored)"
    else:
        loss = f"one a token, shaped as {labels} (0 where ignored)"
    bias = next((f"; {s.operand}: [{head.vocab.name}]" for s in head.steps if s.op == "bias"), "")
    paragraphs = [
        f"{head.x}: [..., {head.hidden.name}]; {labels}: x's leading dims{bias}. The loss is "
        f"fp32, {loss}"
        + (f"; lse: fp32, shaped as {labels}." if head.return_lse else ".")
        + " A label outside [0, vocab) that is not IGNORE_INDEX gives its token a NaN loss "
        "(F.cross_entropy raises; checking would wait for the GPU).",
        "Raises TypeError or ValueError naming the tensor for a wrong type, shape, dtype or "
        "device. Where an input requires grad, the loss carries a grad_fn: "
        + (
            "a scalar loss's gradients are made in the forward's pass over the blocks "
            "(GRADIENTS_IN_FORWARD) and scaled by the backward, which otherwise (a second "
            "backward, lse's own gradient) makes each block's logits again from the saved lse."
            if head.reduction != "none"
            else "the backward makes each block's logits again from the saved lse."
        )
        + " Off a GPU (and the interpreter) it runs `reference`; inside torch.compile, "
        "eagerly (a graph break).",
    ]
    out: list[str] = []
    for paragraph in paragraphs:
        out += [*textwrap.wrap(paragraph, width), ""]
    return out[:-1]


def module_context(head: LossHead, header: list[str], doc_width: int) -> dict:
    doc_lines = wrapped_doc(head.doc, doc_width)
    steps = {s.op: s for s in head.steps}
    bias = steps["bias"].operand if "bias" in steps else None
    return {
        "header": header,
        "name": head.name,
        "doc_lines": doc_lines,
        "formula": formula(head),
        "formula_lines": textwrap.wrap(formula(head), doc_width - 4, break_long_words=False),
        "call_doc": call_doc(head, doc_width - 4),
        "x": head.x,
        "weight": head.weight,
        "labels": head.labels,
        "bias": bias,
        "weight_transposed": head.weight_transposed,
        "weight_shape": (
            f"[{head.vocab.name}, {head.hidden.name}]"
            if head.weight_transposed
            else f"[{head.hidden.name}, {head.vocab.name}]"
        ),
        "tokens": head.tokens,
        "hidden": head.hidden,
        "vocab": head.vocab,
        "ignore_index": head.ignore_index,
        "reduction": head.reduction,
        "label_smoothing": lit(head.label_smoothing),
        "smoothing": head.label_smoothing > 0,
        "z_loss": lit(head.z_loss),
        "return_lse": head.return_lse,
        "scale": lit(steps["scale"].constant) if "scale" in steps else None,
        "bias_after_scale": [s.op for s in head.steps][:2] == ["scale", "bias"],
        "softcap": lit(steps["softcap"].constant) if "softcap" in steps else None,
        "logit_lines": logit_lines(head),
        "reference_lines": reference_lines(head),
        "dtypes_tuple": tuple_literal([dtype_literal(d) for d in head.dtypes]),
        "dtypes_doc": ", ".join(head.dtypes),
        "labels_dtype": head.labels_dtype,
        "block_bytes": f"{BLOCK_BYTES >> 20} << 20",
        "row_tile": ROW_TILE,
        "gradients_in_forward": GRADIENTS_IN_FORWARD,
        "forward_grads_block_bytes": f"{FORWARD_GRADS_BLOCK_BYTES >> 20} << 20",
        "forward_grads_source": FORWARD_GRADS_SOURCE,
        "num_warps": NUM_WARPS,
        "interpreter_row_tile": INTERPRETER_ROW_TILE,
    }
