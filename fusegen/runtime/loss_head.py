"""A loss head's launcher (`LossHead`): cross-entropy over the columns of x @ weight.T
without the [tokens, vocab] logits in memory.

The logits are made one block at a time by cuBLAS (torch.mm) into one reused buffer,
and the module's two row kernels read each block: `stats` folds it into each token's
running max, sum of exponentials, label logit and logit sum; `grad` overwrites it with
d loss / d logits from the token's log-sum-exp. Two ways to the gradients:
- a training call of a scalar loss makes them in the forward (GRADIENTS_IN_FORWARD):
  blocks of whole vocabulary rows (FORWARD_GRADS_BLOCK_BYTES), so each token's lse is
  known once its block is made; three GEMMs a block (the logits, dx's rows, dW's share),
  the gradients scaled by d_loss in the backward;
- otherwise the forward only folds the stats (blocks of vocabulary columns, BLOCK_BYTES)
  and the backward makes each block again: four GEMMs, dx summed in fp32.
Memory beyond the inputs and gradients: the block, (the second way) dx's fp32 sum and a
few fp32 numbers a token.

A loss head module keeps its kernels, constants and `reference`; it makes one LossHead
from its namespace, which reads the constants when it needs them (a test may patch
BLOCK_BYTES to force many blocks)."""

import logging
import os

import torch
import triton
import triton.language as tl

from . import launch
from .checks import (
    autocast_inputs,
    autocasting,
    common_device,
    refuse_dual,
    refuse_second_derivative,
)
from .device import device_facts

_log = logging.getLogger(__name__)
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
FLOATS = (torch.bfloat16, torch.float16, torch.float32)
INTEGERS = (torch.int64, torch.int32)


def cdiv(a, b):
    return -(-a // b)


# A block's fewest vocabulary columns (fewer make small GEMMs) and their multiple; the
# tests lower both to force many blocks on small vocabularies.
MIN_COLS, ALIGN = 1024, 128


def blocks(tokens, vocab, item, budget):
    """(token rows, vocab columns) of a logits block of at most `budget` bytes: every
    token where the budget allows MIN_COLS columns for them (dW's rows then come from one
    GEMM over all tokens, written once), the columns a multiple of ALIGN."""
    min_cols, align = MIN_COLS, ALIGN
    cols = budget // max(1, tokens * item) // align * align
    cols = max(min(cols, cdiv(vocab, align) * align), min(min_cols, cdiv(vocab, align) * align))
    rows = max(1, min(tokens, budget // (cols * item)))
    return rows, min(cols, vocab)


def _spans(total, step):
    return [(start, min(total, start + step)) for start in range(0, total, step)]


_OUT_DTYPE_MM = None  # whether torch.addmm takes out_dtype (CUDA, torch >= 2.8)


def coefficients(kept, each, labels, vocab):
    """Each token's factor on its d loss / d logits: `each` where its label counts, 0
    where ignored, NaN where the label is out of range (its loss is NaN: its gradients
    are too, so a loss scaler's check skips the step as it would for the loss)."""
    coef = torch.where(kept, each, 0.0)
    return torch.where(kept & ((labels < 0) | (labels >= vocab)), float("nan"), coef)


def accumulate(acc, a, b):
    """acc (fp32) += a @ b, a and b in 16 or 32 bits, the product summed in fp32 without
    rounding it to a's dtype first."""
    global _OUT_DTYPE_MM
    if a.is_cuda and a.dtype != torch.float32 and _OUT_DTYPE_MM is not False:
        try:
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
            _OUT_DTYPE_MM = True
            return
        except (RuntimeError, TypeError) as exc:
            _OUT_DTYPE_MM = False
            _log.info("torch.addmm has no out_dtype here (%s): dx sums fp32 products", exc)
    acc.addmm_(a.float(), b.float())


class LossHead:
    """The launcher of one loss head module: checks, the block loop, autograd."""

    def __init__(self, namespace, name, *, stats, grad):
        self.module = namespace
        self.name = name
        self.stats = stats
        self.grad = grad
        self.last = {}  # what the last call ran (tests, tools)

    # Checks.

    def check(self, x, weight, labels, bias):
        """The vocabulary size; TypeError or ValueError naming the input (the spec's
        names) for a wrong type, dtype, device or shape."""
        m = self.module
        n_x, n_w, n_y, *n_b = m["INPUT_NAMES"]
        if n_b and bias is None:  # the kernels would read a buffer of another size
            raise TypeError(f"{n_b[0]} must be a torch.Tensor (the spec adds a bias), got None")
        floats = {n_x: x, n_w: weight} | ({n_b[0]: bias} if bias is not None else {})
        for label, t in (*floats.items(), (n_y, labels)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{label} must be a torch.Tensor, got {type(t).__name__}")
        for label, t in floats.items():
            if t.dtype != x.dtype:
                raise TypeError(f"{label} is {t.dtype} but {n_x} is {x.dtype}; they must match")
        if x.dtype not in m["DTYPES"]:
            allowed = ", ".join(map(str, m["DTYPES"]))
            raise TypeError(f"{n_x} is {x.dtype}; this loss head takes {allowed}")
        if labels.dtype not in INTEGERS:
            raise TypeError(f"{n_y} must be int64 or int32 class indices, got {labels.dtype}")
        common_device({**floats, n_y: labels})
        hidden, vocab = m["HIDDEN"], m["VOCAB"]
        if x.dim() < 1 or x.shape[-1] == 0:
            raise ValueError(
                f"{n_x} must be [..., {m['HIDDEN_NAME']}] with {m['HIDDEN_NAME']} > 0, got "
                f"{list(x.shape)}"
            )
        k = x.shape[-1]
        if hidden is not None and k != hidden:
            raise ValueError(
                f"{n_x}'s last dim is {k}, but the spec fixes {m['HIDDEN_NAME']} = {hidden}"
            )
        want = "[vocab, hidden]" if m["WEIGHT_TRANSPOSED"] else "[hidden, vocab]"
        if weight.dim() != 2:
            raise ValueError(f"{n_w} must be 2-D {want}, got {list(weight.shape)}")
        v, wk = weight.shape if m["WEIGHT_TRANSPOSED"] else weight.shape[::-1]
        if wk != k:
            raise ValueError(f"{n_w} is {list(weight.shape)} ({want}) but {n_x}'s last dim is {k}")
        if vocab is not None and v != vocab:
            raise ValueError(
                f"{n_w}'s vocabulary dim is {v}, but the spec fixes {m['VOCAB_NAME']} = {vocab}"
            )
        if v == 0:
            raise ValueError(f"{n_w} has an empty vocabulary")
        if labels.shape != x.shape[:-1]:
            raise ValueError(
                f"{n_y} are {list(labels.shape)}; one a token of {n_x}: {list(x.shape[:-1])}"
            )
        if bias is not None and bias.shape != (v,):
            raise ValueError(f"{n_b[0]} is {list(bias.shape)}; one value a vocabulary entry: [{v}]")
        tokens = m["TOKENS"]
        if tokens is not None and labels.numel() != tokens:
            raise ValueError(
                f"{labels.numel()} tokens, but the spec fixes {m['TOKENS_NAME']} = {tokens}"
            )
        return v

    # The call.

    @torch.compiler.disable  # a graph break: the block loop runs eagerly inside a compile
    def __call__(self, x, weight, labels, bias=None):
        if autocasting():  # inside torch.autocast: the matmul's operands in its dtype
            x, weight, labels, bias = autocast_inputs(
                (x, weight, labels, bias), self.module["DTYPES"], (), matmul=True
            )
        vocab = self.check(x, weight, labels, bias)
        shape = labels.shape
        x2 = x.reshape(-1, x.shape[-1])  # any strides: cuBLAS reads it
        # The kernels read the labels and the bias (and the per-token vectors below) one
        # element a row: contiguous.
        y = labels.reshape(-1).contiguous()
        bias = bias.contiguous() if bias is not None else None
        if not (x.is_cuda or (_INTERPRETED and x.device.type == "cpu")):
            _log.info("%s: no GPU and no interpreter: running the reference", self.name)
            self.last = {"path": "reference"}
            return self.module["reference"](
                x, weight, labels, *([bias] if bias is not None else [])
            )
        refuse_dual(self.name, (x, weight, bias))
        if launch.elsewhere(x.device):
            with torch.cuda.device(x.device):  # see launch.elsewhere
                return self(x, weight, labels, bias)
        loss, lse = _Function.apply(self, vocab, x2, weight, y, bias, torch.is_grad_enabled())
        if self.module["REDUCTION"] == "none":
            loss = loss.view(shape)
        return (loss, lse.view(shape)) if self.module["RETURN_LSE"] else loss

    # The blocks.

    def weight_block(self, weight, v0, v1):
        """weight's columns v0:v1 of the logits as the [hidden, cols] right operand."""
        return weight[v0:v1].T if self.module["WEIGHT_TRANSPOSED"] else weight[:, v0:v1]

    def by_vocab(self, dw):
        """dweight as [vocab, hidden] (a view: the transpose of a [hidden, vocab] weight's)."""
        return dw if self.module["WEIGHT_TRANSPOSED"] else dw.T

    def options(self, x):
        """The row kernels' launch options for a call on x."""
        m = self.module
        return {
            "ROW_TILE": m["INTERPRETER_ROW_TILE"] if _INTERPRETED else m["ROW_TILE"],
            "FAST_TANH": x.is_cuda and x.dtype != torch.float32,
            "num_warps": m["NUM_WARPS"],
        }

    def fold(self, block, t0, labels, bias, stats, col0, first, options):
        """The stats kernel over a block of rows t0.. and vocabulary columns col0..: each
        token's running max, sum of exponentials, label logit and logit sum (`stats`)."""
        t1 = t0 + block.shape[0]
        self.stats[(block.shape[0],)](
            block, block.stride(0), labels[t0:t1], bias, *(s[t0:t1] for s in stats),
            block.shape[1], col0, FIRST=first, **options,
        )  # fmt: skip

    def to_grad(self, block, t0, labels, bias, lse, coef, coef_lse, col0, vocab, options):
        """The grad kernel over a block, in place: d loss / d logits, each token's row scaled
        by coef (the loss's) and coef_lse (lse's, where not None)."""
        t1 = t0 + block.shape[0]
        self.grad[(block.shape[0],)](
            block, block.stride(0), labels[t0:t1], bias, lse[t0:t1], coef[t0:t1],
            (coef_lse if coef_lse is not None else lse)[t0:t1], block.shape[1], col0, vocab,
            HAS_LSE_GRAD=coef_lse is not None, **options,
        )  # fmt: skip

    @staticmethod
    def new_stats(tokens, device):
        """(running max, sum, label logit, logit sum), fp32 [tokens] each."""
        f32 = dict(dtype=torch.float32, device=device)
        return (
            torch.empty(tokens, **f32),
            torch.empty(tokens, **f32),
            torch.zeros(tokens, **f32),
            torch.empty(tokens, **f32),
        )

    def forward_stats(self, x, weight, labels, bias, vocab):
        """Each token's log-sum-exp, label logit and logit sum (fp32), block by block."""
        tokens = x.shape[0]
        rows, cols = blocks(tokens, vocab, x.element_size(), self.module["BLOCK_BYTES"])
        buffer = torch.empty(rows * cols, dtype=x.dtype, device=x.device)
        stats = self.new_stats(tokens, x.device)
        bias = bias if bias is not None else stats[0]  # unread where the head has no bias
        options = self.options(x)
        spans = _spans(vocab, cols)
        for t0, t1 in _spans(tokens, rows):
            for j, (v0, v1) in enumerate(spans):
                block = buffer[: (t1 - t0) * (v1 - v0)].view(t1 - t0, v1 - v0)
                torch.mm(x[t0:t1], self.weight_block(weight, v0, v1), out=block)
                self.fold(block, t0, labels, bias, stats, v0, j == 0, options)
        self.last = {
            "path": "blocks",
            "block": (rows, cols),
            "blocks": cdiv(tokens, rows) * len(spans),
        }
        top, total, label_logit, logit_sum = stats
        return top + torch.log(total), label_logit, logit_sum

    def forward_with_grads(self, x, weight, labels, bias, vocab, needs):
        """The forward and, in the same pass, d loss / d (x, weight, bias) for an upstream
        gradient of 1 (three GEMMs where the backward would take four): blocks of whole
        vocabulary rows (each token's lse known once its block is made), the grad kernel
        over each in place, dx's rows from one GEMM, dweight summed over the token
        blocks. Returns the stats and the three gradients (None where not needed)."""
        m = self.module
        tokens = x.shape[0]
        # Token rows a multiple of 128 (no ragged GEMM tile) ran no faster on an H200
        # (43.17 ms against 42.79 at 8,192 x 4,096 -> 128,256, the spreads overlapping).
        rows = max(1, min(tokens, m["FORWARD_GRADS_BLOCK_BYTES"] // (vocab * x.element_size())))
        buffer = torch.empty(rows * vocab, dtype=x.dtype, device=x.device)
        stats = self.new_stats(tokens, x.device)
        top, total, label_logit, logit_sum = stats
        lse = torch.empty_like(top)
        kept = labels != m["IGNORE_INDEX"]
        each = 1.0 / kept.sum() if m["REDUCTION"] == "mean" else torch.ones((), device=x.device)
        coef = coefficients(kept, each, labels, vocab)
        need_x, need_w, need_b = needs
        dx = torch.empty_like(x) if need_x else None
        dw = (torch.empty_like(weight) if tokens else torch.zeros_like(weight)) if need_w else None
        db32 = torch.zeros(vocab, dtype=torch.float32, device=x.device) if need_b else None
        bias = bias if bias is not None else top
        options = self.options(x)
        w_all = self.weight_block(weight, 0, vocab)
        spans = _spans(tokens, rows)
        for i, (t0, t1) in enumerate(spans):
            block = buffer[: (t1 - t0) * vocab].view(t1 - t0, vocab)
            torch.mm(x[t0:t1], w_all, out=block)
            self.fold(block, t0, labels, bias, stats, 0, True, options)
            torch.log(total[t0:t1], out=lse[t0:t1]).add_(top[t0:t1])
            self.to_grad(block, t0, labels, bias, lse, coef, None, 0, vocab, options)
            if need_x:
                torch.mm(block, w_all.T, out=dx[t0:t1])
            if need_b:
                db32 += block.sum(0, dtype=torch.float32)
            if need_w and i == 0:
                torch.mm(block.T, x[t0:t1], out=self.by_vocab(dw))
            elif need_w:
                self.by_vocab(dw).addmm_(block.T, x[t0:t1])
        self.last = {
            "path": "gradients in the forward",
            "block": (rows, vocab),
            "blocks": len(spans),
        }
        grads = (dx, dw, self.bias_grad(db32, x.dtype) if need_b else None)
        return lse, label_logit, logit_sum, grads

    def losses(self, lse, label_logit, logit_sum, labels, vocab):
        """Each token's loss (0 where ignored, NaN where its label is out of range) and
        how many count toward the mean."""
        m = self.module
        eps = m["LABEL_SMOOTHING"]
        ignored = labels == m["IGNORE_INDEX"]
        loss = lse - (1.0 - eps) * label_logit
        if eps:
            loss = loss - eps / vocab * logit_sum
        if m["Z_LOSS"]:
            loss = loss + m["Z_LOSS"] * lse * lse
        bad = ~ignored & ((labels < 0) | (labels >= vocab))  # PyTorch raises; we cannot sync
        loss = torch.where(ignored, 0.0, torch.where(bad, float("nan"), loss))
        return loss, (~ignored).sum()

    def backward_blocks(self, x, weight, labels, bias, lse, coef, coef_lse, needs, vocab):
        """(dx, dweight, dbias): the block's logits again, the grad kernel over them in
        place (d loss / d logits, scaled by each token's coefficient), then the GEMMs."""
        tokens = x.shape[0]
        rows, cols = blocks(tokens, vocab, x.element_size(), self.module["BLOCK_BYTES"])
        buffer = torch.empty(rows * cols, dtype=x.dtype, device=x.device)
        need_x, need_w, need_b = needs
        dx32 = torch.zeros(x.shape, dtype=torch.float32, device=x.device) if need_x else None
        dw = (torch.empty_like(weight) if tokens else torch.zeros_like(weight)) if need_w else None
        db32 = torch.zeros(vocab, dtype=torch.float32, device=x.device) if need_b else None
        bias = bias if bias is not None else lse
        options = self.options(x)
        t_spans = _spans(tokens, rows)
        for v0, v1 in _spans(vocab, cols):
            w_block = self.weight_block(weight, v0, v1)
            dw_rows = self.by_vocab(dw)[v0:v1] if need_w else None
            if need_w and len(t_spans) > 1:  # summed over the token blocks in fp32
                dw_rows = torch.zeros((v1 - v0, x.shape[1]), dtype=torch.float32, device=x.device)
            for t0, t1 in t_spans:
                block = buffer[: (t1 - t0) * (v1 - v0)].view(t1 - t0, v1 - v0)
                torch.mm(x[t0:t1], w_block, out=block)
                self.to_grad(block, t0, labels, bias, lse, coef, coef_lse, v0, vocab, options)
                if need_x:
                    accumulate(dx32[t0:t1], block, w_block.T)
                if need_b:
                    db32[v0:v1] += block.sum(0, dtype=torch.float32)
                if need_w and len(t_spans) > 1:
                    accumulate(dw_rows, block.T, x[t0:t1])
                elif need_w:
                    torch.mm(block.T, x[t0:t1], out=dw_rows)  # dweight's rows, in place
            if need_w and len(t_spans) > 1:
                self.by_vocab(dw)[v0:v1].copy_(dw_rows)
        return (
            dx32.to(x.dtype) if need_x else None,
            dw,
            self.bias_grad(db32, x.dtype) if need_b else None,
        )

    def bias_grad(self, db32, dtype):
        """d bias from its fp32 sum of the blocks' gradients at the matmul: over SCALE
        where the bias adds after it (a softcap before the bias is refused by the spec)."""
        if self.module.get("BIAS_AFTER_SCALE"):
            db32 = db32.div_(self.module["SCALE"])
        return db32.to(dtype)


@triton.jit
def _scale_in_place(x_ptr, factor_ptr, n, ITERS, BLOCK: tl.constexpr):
    """x *= factor, the factor read on the GPU (no host sync); nothing is read or
    written where it is 1, the upstream gradient of a scalar loss's plain backward."""
    factor = tl.load(factor_ptr).to(tl.float32)
    if factor != 1.0:
        for i in range(ITERS):
            block = (i * tl.num_programs(0) + tl.program_id(0)).to(tl.int64)
            offs = block * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offs, mask=offs < n)
            tl.store(x_ptr + offs, (x.to(tl.float32) * factor).to(x.dtype), mask=offs < n)


def scale_by(g, factor):
    """g *= factor (a one-element tensor), in place. The gradients made in the forward
    wait here for d_loss; torch's `g.mul_(factor)` reads a 0-d GPU tensor as a broadcast
    operand, which runs its slow strided kernel: 1.45 ms for dW and dx at LLaMA-3's head
    (8B dims, 4,096 tokens; an H200 profile), almost always to multiply by 1."""
    if not g.is_contiguous() or not (g.is_cuda or _INTERPRETED):
        return g.mul_(factor.to(g.dtype))
    block = 4096
    blocks = -(-g.numel() // block)
    programs = max(1, min(blocks, 4 * device_facts(g.device)[1]))
    iters = -(-blocks // programs)
    _scale_in_place[(programs,)](g, factor, g.numel(), iters, BLOCK=block, num_warps=4)
    return g


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, head, vocab, x, weight, labels, bias, grad_mode):
        m = head.module
        needs = ctx.needs_input_grad[2], ctx.needs_input_grad[3], ctx.needs_input_grad[5]
        ctx.grads = None
        # The loss is a scalar: its gradients are the ones made here times d_loss. Not
        # without grad mode (an eval of a model in training), nor in fp16, where the
        # gradients at an upstream 1 underflow before a loss scaler's factor arrives.
        in_forward = grad_mode and x.dtype != torch.float16 and m["REDUCTION"] != "none"
        if m["GRADIENTS_IN_FORWARD"] and in_forward and any(needs):
            lse, label_logit, logit_sum, ctx.grads = head.forward_with_grads(
                x, weight, labels, bias, vocab, needs
            )
        else:
            lse, label_logit, logit_sum = head.forward_stats(x, weight, labels, bias, vocab)
        losses, counted = head.losses(lse, label_logit, logit_sum, labels, vocab)
        reduction = head.module["REDUCTION"]
        if reduction == "mean":
            loss = losses.sum() / counted  # NaN where every token is ignored, as PyTorch
        elif reduction == "sum":
            loss = losses.sum()
        else:
            loss = losses
        ctx.head, ctx.vocab = head, vocab
        ctx.save_for_backward(x, weight, labels, bias, lse, counted)
        ctx.mark_non_differentiable(labels)
        ctx.set_materialize_grads(False)
        return loss, lse

    @staticmethod
    def backward(ctx, d_loss, d_lse):
        head, vocab = ctx.head, ctx.vocab
        refuse_second_derivative(head.name)
        x, weight, labels, bias, lse, counted = ctx.saved_tensors
        needs = ctx.needs_input_grad[2], ctx.needs_input_grad[3], ctx.needs_input_grad[5]
        if not any(needs) or (d_loss is None and d_lse is None):
            return None, None, None, None, None, None
        made, ctx.grads = ctx.grads, None  # scaled in place: a second backward recomputes
        if made is not None and d_loss is not None:
            grads = [scale_by(g, d_loss) if g is not None else None for g in made]
            if d_lse is not None:  # lse's share: the blocks again, the loss's coef 0
                more = head.backward_blocks(
                    x, weight, labels, bias, lse, torch.zeros_like(lse),
                    d_lse.float().reshape(-1).contiguous(), needs, vocab,
                )  # fmt: skip
                grads = [g if g is None else g.add_(o) for g, o in zip(grads, more, strict=True)]
            dx, dw, db = grads
            return None, None, dx, dw, None, db, None
        kept = labels != head.module["IGNORE_INDEX"]
        reduction = head.module["REDUCTION"]
        if d_loss is None:
            coef = torch.zeros_like(lse)
        else:  # ignored tokens 0, even where all are (mean: 0 / 0), as F.cross_entropy
            each = d_loss.float() / counted if reduction == "mean" else d_loss.float()
            each = each.reshape(-1) if reduction == "none" else each
            coef = coefficients(kept, each, labels, vocab)
        # An upstream gradient may be expanded (stride 0: the gradient of a sum).
        coef_lse = d_lse.float().reshape(-1).contiguous() if d_lse is not None else None
        dx, dw, db = head.backward_blocks(
            x, weight, labels, bias, lse, coef, coef_lse, needs, vocab
        )
        return None, None, dx, dw, None, db, None
