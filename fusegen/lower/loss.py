"""A chain that ends in `cross_entropy` (an LM head) -> ir.LossHead: the checks of its
matmul, the logit steps between it and the loss, and the loss's own options.

The chain is `matmul: x @ weight.T`, then any of `bias: b` ([V]), `scale: c` and
`softcap: c` in the order they apply, then `cross_entropy: {labels: labels, ...}` last."""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import pydantic

from fusegen import ops
from fusegen.errors import did_you_mean
from fusegen.ir import Dim, LogitStep, LossHead, Tensor
from fusegen.spec.models import CrossEntropySpec, KernelSpec

LOSS_OP = "cross_entropy"
LOGIT_OPS = ("bias", "scale", "softcap")
_FORM = (
    "a loss head's chain is `matmul: x @ weight.T`, then any of `bias: b`, `scale: c`, "
    "`softcap: c`, then `cross_entropy: {labels: labels}` last"
)


def ends_in_loss(chain: Any) -> bool:
    """Whether a raw chain holds a cross_entropy step (its kernel is a loss head)."""
    return isinstance(chain, list) and any(_op_of(step)[0] == LOSS_OP for step in chain)


def _op_of(step: Any) -> tuple[str | None, Any]:
    if isinstance(step, str):
        return step, None
    if isinstance(step, dict) and len(step) == 1:
        ((op, args),) = step.items()
        return op, args
    return None, None


def lower_loss_head(
    spec: KernelSpec,
    dims: dict[str, Dim],
    inputs: dict[str, Tensor],
    err: Callable[..., None],
    base: dict,
) -> LossHead | None:
    """The loss head, or None after reporting every problem to err(path, message, hint).
    `base` holds the IR fields every kernel has (name, doc, spec, dtypes)."""
    chain = spec.chain
    last = len(chain) - 1
    for i, step in enumerate(chain):
        op, _ = _op_of(step)
        if op == LOSS_OP and i != last:
            err(("chain", i), "cross_entropy must be the chain's last step", _FORM)
            return None
    matmul = _matmul(chain[0], inputs, err)
    if matmul is None:
        return None
    x, weight, transposed = matmul
    tokens, hidden = (dims[d] for d in x.dims)
    vocab = dims[weight.dims[0] if transposed else weight.dims[1]]
    if (weight.dims[1] if transposed else weight.dims[0]) != hidden.name:
        err(
            ("chain", 0, "matmul"),
            f"x @ {weight.name}{'.T' if transposed else ''} does not contract: x is "
            f"{list(x.dims)}, {weight.name} is {list(weight.dims)}",
            f"the weight is [vocab, {hidden.name}] read as .T (nn.Linear, a tied embedding) "
            f"or [{hidden.name}, vocab]",
        )
        return None
    if vocab.name == tokens.name:
        err(("chain", 0, "matmul"), "the vocabulary dim and the tokens dim must differ", _FORM)
        return None
    steps = []
    for i, step in enumerate(chain[1:last], start=1):
        lowered = _logit_step(i, step, inputs, vocab, err)
        if lowered is None:
            continue
        if lowered.op in (s.op for s in steps):
            err(("chain", i), f"{lowered.op} appears twice", "give each logit step once")
            continue
        if lowered.op == "bias" and any(s.op == "softcap" for s in steps):
            # The bias's gradient is summed from the block's gradient at the matmul's
            # output; softcap's slope between the two would have to be divided out.
            err(
                ("chain", i),
                "a bias after softcap: the bias's gradient cannot be made from the "
                "gradient at the matmul",
                "put the bias before softcap (x @ w.T + b, then softcap), as Gemma 2 does",
            )
        steps.append(lowered)  # (also where refused: its input is used, not "never used")
    op, args = _op_of(chain[last])
    loss = _cross_entropy(last, args, inputs, tokens, err)
    if loss is None:
        return None
    labels, ce = loss
    bias = next((inputs[s.operand] for s in steps if s.op == "bias"), None)
    pinned = next((t for t in (x, weight, bias) if t is not None and t.dtype is not None), None)
    if pinned is not None:
        err(
            ("inputs", pinned.name, "dtype"),
            f"a loss head's input '{pinned.name}' cannot pin a dtype",
            "x, the weight and the bias take the call's dtype, one of `dtypes`",
        )
        return None
    return LossHead(
        **base,
        x=x.name,
        weight=weight.name,
        weight_transposed=transposed,
        labels=labels.name,
        tokens=tokens,
        hidden=hidden,
        vocab=vocab,
        steps=tuple(steps),
        ignore_index=ce.ignore_index,
        reduction=ce.reduction,
        label_smoothing=ce.label_smoothing,
        z_loss=ce.z_loss,
        return_lse=ce.lse,
        labels_dtype=labels.dtype,
    )


def _matmul(step: Any, inputs: dict[str, Tensor], err) -> tuple[Tensor, Tensor, bool] | None:
    """(x, weight, whether the weight is read transposed) of the chain's first step."""
    op, args = _op_of(step)
    if op != "matmul":
        err(("chain", 0), "a loss head starts with its matmul", _FORM)
        return None
    if not (isinstance(args, str) and re.match(ops.MATMUL_SHORTHAND, args)):
        err(("chain", 0, "matmul"), f"matmul takes `x @ weight.T`; got {args!r}", _FORM)
        return None
    refs = [part.strip() for part in args.split("@")]
    found = []
    for which, ref in zip(("x", "weight"), refs, strict=True):
        name, t = ref.removesuffix(".T"), ref.endswith(".T")
        if name not in inputs:
            err(
                ("chain", 0, "matmul"),
                f"unknown input '{name}'{did_you_mean(name, inputs)}",
                "declared inputs: " + ", ".join(inputs),
            )
            return None
        tensor = inputs[name]
        if len(tensor.dims) != 2:
            err(
                ("inputs", name, "shape"),
                f"{which} '{name}' must be 2-D, it is {list(tensor.dims)}",
            )
            return None
        if which == "x" and t:
            err(
                ("chain", 0, "matmul"),
                "a loss head reads x as [tokens, hidden], not x.T",
                "one token a row: `x @ weight.T`",
            )
            return None
        found.append((tensor, t))
    (x, _), (weight, transposed) = found
    return x, weight, transposed


def _logit_step(i: int, step: Any, inputs: dict[str, Tensor], vocab: Dim, err) -> LogitStep | None:
    op, args = _op_of(step)
    path = ("chain", i)
    if op not in LOGIT_OPS:
        err(
            path,
            f"'{op}' cannot come between a loss head's matmul and its loss"
            + did_you_mean(str(op), LOGIT_OPS),
            _FORM,
        )
        return None
    if op == "bias":
        if not isinstance(args, str) or args not in inputs:
            err(
                path + (op,),
                f"bias takes an input's name; got {args!r}"
                + (did_you_mean(args, inputs) if isinstance(args, str) else ""),
                "declared inputs: " + ", ".join(inputs),
            )
            return None
        if inputs[args].dims != (vocab.name,):
            err(
                ("inputs", args, "shape"),
                f"the bias '{args}' is {list(inputs[args].dims)}; it adds one value a vocabulary "
                f"entry: [{vocab.name}]",
            )
            return None
        return LogitStep("bias", operand=args)
    if isinstance(args, bool) or not isinstance(args, (int, float)) or not math.isfinite(args):
        err(path + (op,), f"{op} takes a finite number; got {args!r}", f"e.g. {op}: 30.0")
        return None
    if op == "scale" and args == 0:
        err(path + (op,), "scale 0 makes every logit 0", "a nonzero number, e.g. scale: 0.5")
        return None
    if op == "softcap" and args <= 0:
        err(
            path + (op,),
            f"softcap must be positive; got {args}",
            "logits -> softcap * tanh(logits / softcap) (Gemma 2: 30.0)",
        )
        return None
    return LogitStep(op, constant=float(args))


def _cross_entropy(i: int, args: Any, inputs: dict[str, Tensor], tokens: Dim, err):
    path = ("chain", i, LOSS_OP)
    if isinstance(args, str):  # cross_entropy: y
        args = {"labels": args}
    if not isinstance(args, dict):
        err(path, "cross_entropy takes {labels: NAME, ...}", "e.g. cross_entropy: {labels: labels}")
        return None
    ce = None
    try:
        ce = CrossEntropySpec.model_validate(args)
    except pydantic.ValidationError as exc:
        fields = list(CrossEntropySpec.model_fields)
        for e in exc.errors(include_url=False):
            field = e["loc"][0] if e["loc"] else ""
            if e["type"] == "extra_forbidden":
                err(
                    path + (field,),
                    f"unknown field '{field}'{did_you_mean(str(field), fields)}",
                    "fields here: " + ", ".join(fields),
                )
            elif e["type"] == "missing":
                err(
                    path,
                    f"missing required field '{field}'",
                    "e.g. cross_entropy: {labels: labels}",
                )
            else:
                message = e["msg"].removeprefix("Value error, ")
                err(path + (field,), f"{field} {args.get(field)!r}: {message}")
    name = ce.labels if ce else args.get("labels")
    if not isinstance(name, str):
        return None
    labels = inputs.get(name)
    if labels is None:
        err(
            path + ("labels",),
            f"unknown input '{name}'{did_you_mean(name, inputs)}",
            "declared inputs: " + ", ".join(inputs),
        )
        return None
    if labels.dtype not in ("int64", "int32"):
        err(
            ("inputs", name, "dtype"),
            f"the labels '{name}' must be integers, not " + (labels.dtype or "the call's dtype"),
            f"declare `{name}: {{shape: [{tokens.name}], dtype: int64}}`",
        )
        return None
    if labels.dims != (tokens.name,):
        err(
            ("inputs", name, "shape"),
            f"the labels '{name}' are {list(labels.dims)}; one label a token: [{tokens.name}]",
        )
        return None
    return (labels, ce) if ce else None
