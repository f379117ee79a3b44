"""The intermediate representation: a kernel with every name resolved, every check done
and every default filled in. Frozen plain data; codegen reads it and decides nothing
that the spec decided.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Union

from fusegen.dtypes import QUANT_DTYPES


@dataclass(frozen=True)
class Dim:
    name: str
    size: int | None  # None: dynamic, known only at call time

    @property
    def var(self) -> str:
        """The lower-case stem used in kernel variable names: offs_m, mask_m, stride_x_m."""
        return self.name.lower()


@dataclass(frozen=True)
class Tensor:
    name: str
    dims: tuple[str, ...]
    dtype: str | None  # pinned dtype, or None: the call's dtype
    doc: str
    # Its first dim is the output's row dim, so a caller may pass extra leading (batch)
    # dims in its place; the launcher flattens them into rows.
    batched: bool


@dataclass(frozen=True)
class Matmul:
    a: str
    b: str
    a_transposed: bool  # the chain reads a.T
    b_transposed: bool
    m: str  # dim names: (a @ b) is [m, k] @ [k, n]
    k: str
    n: str


@dataclass(frozen=True)
class Step:
    """One elementwise op on the running fp32 value."""

    op: str  # an Activation or Binary name from fusegen.ops, or "bias" / "scale"
    params: tuple[tuple[str, float], ...] = ()  # an activation's parameters, in spec order
    operand: str | None = None  # input tensor name, for bias and binary ops
    broadcast: str | None = None  # "full" | "row" | "col", with an operand
    constant: float | None = None  # for scale, and binary ops with a constant


@dataclass(frozen=True)
class Gate:
    """value * (a @ b2 [+ bias] [-> activation]): a GLU sharing the chain's `a`."""

    matmul: Matmul
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class RowStep:
    """An op over each row: softmax, log_softmax, rmsnorm, layernorm, sum, mean, max."""

    op: str
    params: tuple[tuple[str, float], ...]  # in the op's parameter order, defaults filled
    operands: tuple[tuple[str, str], ...]  # (role, input name): mask, weight, bias
    mask_broadcast: str | None = None  # "full" or "row", for a softmax mask
    reduces: bool = False  # sum, mean, max: the value becomes one number per row


@dataclass(frozen=True)
class Emit:
    """Write the value at this point as an extra output."""

    name: str


ChainItem = Union[Step, Gate, RowStep, Emit]


@dataclass(frozen=True)
class Config:
    BLOCK_M: int | None = None
    BLOCK_N: int | None = None
    BLOCK_K: int | None = None
    GROUP_M: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    # The TMA kernel's switches (0 or 1): flatten the tile and K loops into one
    # software pipeline; warp-specialize it; store the output tile in two halves.
    FLATTEN: int | None = None
    WARP_SPECIALIZE: int | None = None
    EPILOGUE_SUBTILE: int | None = None
    # The pointer kernel only: programs per output tile, each summing a slice of K
    # (decode-sized M: more programs in flight on a weight stream that is the whole cost).
    SPLIT_K: int | None = None
    # AMD (ROCm) compile options: the MFMA instruction size, an occupancy hint, and
    # how many K elements each MFMA operand packs.
    matrix_instr_nonkdim: int | None = None
    waves_per_eu: int | None = None
    kpack: int | None = None

    def items(self) -> list[tuple[str, int]]:
        """The fields that are set, in declaration order."""
        return [
            (f.name, getattr(self, f.name))
            for f in fields(self)
            if getattr(self, f.name) is not None
        ]

    def meta(self) -> list[tuple[str, int]]:
        """The kernel's constexpr block sizes (launch options excluded)."""
        return [(k, v) for k, v in self.items() if k.isupper()]


@dataclass(frozen=True)
class Kernel:
    name: str
    doc: str
    spec_display: str  # the spec's path relative to its repo
    spec_sha256: str
    dims: tuple[Dim, ...]
    dtypes: tuple[str, ...]  # the call dtypes the launcher accepts
    inputs: tuple[Tensor, ...]  # in spec order: the launcher's argument order
    matmul: Matmul | None  # None: an elementwise chain
    source: str | None  # the input an elementwise chain starts from
    row: str  # the output's dims: [row, col]
    col: str
    steps: tuple[ChainItem, ...]
    out_dtype: str | None  # a `cast` step's dtype; None: the call's dtype
    fp32_matmul: str | None  # "tf32" | "ieee"; None: PyTorch's setting at each call
    fallback_no_gpu: str  # "reference" | "error"
    fallback_nonfinite: str  # "off" | "reference"
    configs: tuple[Config, ...]  # the pointer kernel's autotuning space
    tma_configs: tuple[Config, ...]  # the TMA kernel's (matmul chains only)
    default_config: Config
    tma_default_config: Config | None
    default_given: bool  # the spec's autotune.default: launched as given where nothing is tuned
    interpreter_config: Config
    deterministic: bool = False  # no runtime tuning: a tuned table's config or the default
    target: str = "nvidia"  # "nvidia" | "amd"
    # The spec's fast_tanh, on nvidia: activations with a tanh.approx form may use it
    # (the launcher decides per call: see kernel_text.fast_tanh).
    fast_tanh: bool = False
    # What a training forward keeps: "accumulators" (a matmul chain's, SAVE_PRE) or
    # "inputs" (the backward recomputes a matmul chain's accumulators).
    backward_save: str = "inputs"

    @property
    def kind(self) -> str:
        if self.matmul:
            return "matmul"
        return "row" if self.row_step else "elementwise"

    @property
    def row_step(self) -> RowStep | None:
        return next((s for s in self.steps if isinstance(s, RowStep)), None)

    @property
    def emits(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps if isinstance(s, Emit))

    @property
    def reduces(self) -> bool:
        """The output is one number per row."""
        return self.row_step is not None and self.row_step.reduces

    @property
    def gate(self) -> Gate | None:
        return next((s for s in self.steps if isinstance(s, Gate)), None)

    def dim(self, name: str) -> Dim:
        return next(d for d in self.dims if d.name == name)

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.inputs if t.name == name)


@dataclass(frozen=True)
class Attention:
    """A fused attention kernel: out = softmax(mask(softcap(scale * q @ k.T))) @ v."""

    name: str
    doc: str
    spec_display: str
    spec_sha256: str
    dtypes: tuple[str, ...]
    layout: str  # "bshd" | "bhsd"
    heads: int
    kv_heads: int  # heads % kv_heads == 0: each kv head serves heads // kv_heads query heads
    head_dim: int  # q's and k's
    scale: float
    scale_given: bool  # False: 1 / sqrt(head_dim)
    softcap: float | None
    causal: bool
    window: int | None  # a query sees its `window` most recent keys
    alibi: bool = False  # scores += slope[head] * (key - query position)
    bias: bool = False  # scores += an input broadcast to [batch, heads, q_len, k_len]
    v_head_dim: int = 0  # v's and out's (0: head_dim)

    @property
    def dv(self) -> int:
        """v's and out's head dim."""
        return self.v_head_dim or self.head_dim

    @property
    def kind(self) -> str:
        return "attention"

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


@dataclass(frozen=True)
class LogitStep:
    """One op between the LM head's matmul and its loss, on each logit in fp32."""

    op: str  # "bias" (operand: a [V] input), "scale" or "softcap" (constant)
    operand: str | None = None
    constant: float | None = None


@dataclass(frozen=True)
class LossHead:
    """A matmul whose columns end in a cross-entropy loss (an LM head):
    loss = cross_entropy(steps(x @ weight.T), labels), the [tokens, vocab] logits never
    all in memory at once."""

    name: str
    doc: str
    spec_display: str
    spec_sha256: str
    dtypes: tuple[str, ...]
    x: str  # [T, K]
    weight: str  # [V, K], or [K, V] where weight_transposed is False
    weight_transposed: bool  # the matmul reads weight.T: weight is [V, K] (nn.Linear)
    labels: str  # [T], integers
    tokens: Dim
    hidden: Dim
    vocab: Dim
    steps: tuple[LogitStep, ...]
    ignore_index: int
    reduction: str  # "mean" | "sum" | "none"
    label_smoothing: float
    z_loss: float
    return_lse: bool
    labels_dtype: str  # "int64" | "int32"

    @property
    def kind(self) -> str:
        return "loss"

    @property
    def bias(self) -> str | None:
        return next((s.operand for s in self.steps if s.op == "bias"), None)


@dataclass(frozen=True)
class Quant:
    """A quantized matmul operand: what its tensor stores and how its values are scaled.
    Its dims are [rows, K], K last: the value at (r, k) is
    (stored[r, k] - zero[r // rows_per, k // group]) * scale[r // rows_per, k // group]."""

    name: str
    dtype: str  # a fusegen.dtypes.QUANT_DTYPES name
    scale: str  # "tensor" | "row" | "group" | "block"
    group: int | None  # values along K that share a scale ("group", "block"); None: all K
    rows_per: int | None  # rows that share one ("block"; 1 for "row", "group"); None: all
    zero_point: bool
    packing: str | None  # int4: "low_first" | "high_first"

    @property
    def scale_name(self) -> str:
        return f"{self.name}_scale"

    @property
    def zero_name(self) -> str | None:
        return f"{self.name}_zero" if self.zero_point else None

    @property
    def k_varying(self) -> bool:
        """Its scales change along K: applied to each K step's partial sums."""
        return self.scale in ("group", "block")


class _WrapsChain:
    """A kernel kind built around a chain Kernel (`chain`): named and located by it."""

    @property
    def name(self) -> str:
        return self.chain.name

    @property
    def spec_display(self) -> str:
        return self.chain.spec_display

    @property
    def spec_sha256(self) -> str:
        return self.chain.spec_sha256

    @property
    def dtypes(self) -> tuple:
        return self.chain.dtypes


@dataclass(frozen=True)
class QuantChain(_WrapsChain):
    """A matmul chain whose operands may be quantized (int8, packed int4, fp8) with their
    scales: the chain (a matmul Kernel, its configs unused) and each quantized operand."""

    chain: Kernel
    quant: tuple[Quant, ...]
    configs: tuple[Config, ...]  # the autotuning space (BLOCK_K fitted to the groups)
    default_config: Config
    interpreter_config: Config
    # One-row calls under the interpreter, where the chain has the GEMV path (gemv).
    interpreter_gemv_config: Config | None = None

    @property
    def kind(self) -> str:
        return "quant"

    @property
    def weights(self) -> list[str]:
        """The matmul's weight and a gate's: each meets the chain's `a` in a dot."""
        mm = self.chain.matmul
        return [mm.b] + [g.matmul.b for g in self.chain.steps if isinstance(g, Gate)]

    @property
    def gemv(self) -> bool:
        """One-row calls may run without tensor cores (configs with BLOCK_M 1): x
        unquantized, the weights all int8 or all int4 (weight-only), every group along K
        a power of two (a K step then holds whole groups) of whole 32-bit words (the
        path reads the weights as words: 8 int4 or 4 int8 values)."""
        if self.quant_of(self.chain.matmul.a) is not None:
            return False
        found = [self.quant_of(b) for b in self.weights]
        if any(q is None for q in found) or len({q.dtype for q in found}) != 1:
            return False
        if found[0].dtype not in ("int8", "int4"):
            return False
        per_word = 32 // QUANT_DTYPES[found[0].dtype].bits
        return all(
            q.group is None or (not q.group & (q.group - 1) and q.group >= per_word) for q in found
        )

    def quant_of(self, name: str) -> Quant | None:
        return next((q for q in self.quant if q.name == name), None)

    @property
    def fp8_dot(self) -> bool:
        """Both operands of every matmul are fp8: the tensor cores take them as stored."""
        return all(
            (q := self.quant_of(name)) is not None and q.dtype.startswith("fp8")
            for name in [self.chain.matmul.a, *self.weights]
        )


@dataclass(frozen=True)
class Quantizer(_WrapsChain):
    """An elementwise chain whose value is quantized to fp8 (its last step `quantize`):
    one scale per row, or per `group` values along the row, = max(|value|) / the fp8
    type's largest, and the value / scale rounded to fp8. `chain`: the elementwise
    Kernel before it (no steps: the input as it is)."""

    chain: Kernel
    dtype: str  # "fp8_e4m3" | "fp8_e5m2"
    group: int | None  # None: one scale a row

    @property
    def kind(self) -> str:
        return "quantize"
