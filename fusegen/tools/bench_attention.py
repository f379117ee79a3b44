"""`fusegen bench` of attention kernels: the fused kernels against eager math attention
(the module's `reference`), F.scaled_dot_product_attention on each backend (flash, cuDNN,
efficient) where it can compute the spec's attention, and compiled FlexAttention with
the spec's score and mask mods. Shapes are (batch, q_len, k_len); heads and head dim are
the spec's. Every variant's output is checked against the float64 reference first, and
inputs rotate over buffer sets as for the other kernels.

torch and triton are imported only when it runs.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path

from fusegen.tools.bench import (
    MAX_SETS,
    ROTATION_BYTES,
    TOLERANCE,
    Ceilings,
    Result,
    load_module,
    measure_ceilings,
    relative_error,
    torch_dtype,
    with_speedup,
)
from fusegen.ir import Attention

# (batch, q_len, k_len): a prefill, one long-context decode (the split-KV path) and a
# decode batch.
DEFAULT_SHAPES = [(4, 4096, 4096), (1, 1, 16384), (16, 1, 4096)]
SDPA_BACKENDS = ("flash", "cudnn", "efficient")
VARIANTS = ("fusegen", "eager", *(f"sdpa {b}" for b in SDPA_BACKENDS), "flex (compiled)")


def call_dtype(att: Attention, dtype_name: str, progress) -> str:
    """dtype_name where the spec allows it, else (said) the spec's first dtype."""
    if dtype_name in att.dtypes:
        return dtype_name
    progress(f"  {att.name}: no {dtype_name} in its dtypes; run in {att.dtypes[0]}")
    return att.dtypes[0]


def variant_names(compare: list[str]) -> list[str]:
    """The attention variants `--compare` asks for: eager, sdpa (each backend), flex."""
    names = ["fusegen"]
    if "eager" in compare:
        names.append("eager")
    if "sdpa" in compare:
        names += [f"sdpa {b}" for b in SDPA_BACKENDS]
    if "flex" in compare:
        names.append("flex (compiled)")
    return names


def seen_pairs(att: Attention, sq: int, skv: int) -> int:
    """How many (query, key) pairs the masks keep: the work of one (batch, head)."""
    total = 0
    for row in range(sq):
        last = min(row + skv - sq, skv - 1) if att.causal else skv - 1
        first = max(0, row + skv - sq - att.window + 1) if att.window else 0
        total += max(0, last - first + 1)
    return total


def work(att: Attention, batch: int, sq: int, skv: int, element: int) -> tuple[float, float]:
    """(flops, bytes moved) of a forward: two dots over the seen pairs; q, k, v and out
    (and the bias) read or written once."""
    flops = 2 * batch * att.heads * seen_pairs(att, sq, skv) * (att.head_dim + att.dv)
    moved = (att.heads * sq + att.kv_heads * skv) * (att.head_dim + att.dv) * batch * element
    if att.bias:
        moved += batch * att.heads * sq * skv * element
    return flops, moved


def make_inputs(torch, att: Attention, batch, sq, skv, dtype, device, seed) -> list:
    """q, k, v (and the bias, [batch, heads, q_len, k_len]) in the spec's layout."""
    generator = torch.Generator().manual_seed(seed)

    def shape(seq, heads, dim=att.head_dim):
        if att.layout == "bshd":
            return (batch, seq, heads, dim)
        return (batch, heads, seq, dim)

    sizes = [shape(sq, att.heads), shape(skv, att.kv_heads), shape(skv, att.kv_heads, att.dv)]
    if att.bias:
        sizes.append((batch, att.heads, sq, skv))
    return [torch.randn(s, generator=generator).to(dtype).to(device) for s in sizes]


def _bhsd(att: Attention, tensors):
    """q, k, v as [batch, heads, seq, dim] views (SDPA's and FlexAttention's layout)."""
    return [t.transpose(1, 2) if att.layout == "bshd" else t for t in tensors]


def _out_layout(att: Attention, out):
    return out.transpose(1, 2) if att.layout == "bshd" else out


def _keep(torch, att: Attention, sq: int, skv: int, device):
    """The masks as a [q_len, k_len] bool (True: seen), or None without one."""
    if not (att.causal or att.window):
        return None
    rows = torch.arange(sq, device=device)[:, None] + (skv - sq)
    keys = torch.arange(skv, device=device)[None, :]
    keep = keys <= rows
    if att.window:
        keep &= keys > rows - att.window
    return keep


def sdpa_variant(torch, module, att: Attention, backend: str, sq: int, skv: int, device):
    """F.scaled_dot_product_attention on one backend computing the spec's attention, or a
    reason it cannot (softcap: SDPA has no score mod)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if att.softcap:
        return "SDPA has no softcap"
    backend_enum = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,  # not timed by default; the CPU tests check the masks on it
    }[backend]
    keep = _keep(torch, att, sq, skv, device)
    # SDPA's is_causal aligns the first query with the first key: the spec's causal mask
    # only where q_len = k_len; elsewhere it is an explicit mask.
    is_causal = att.causal and not att.window and sq == skv and not att.alibi and not att.bias
    additive = None
    if att.alibi:
        slopes = torch.tensor(module.ALIBI_SLOPES, device=device)[:, None, None]
        rows = torch.arange(sq, device=device)[:, None] + (skv - sq)
        additive = slopes * (torch.arange(skv, device=device)[None, :] - rows)

    def call(q, k, v, *bias):
        q, k, v = _bhsd(att, (q, k, v))
        mask = None
        if not is_causal and (keep is not None or additive is not None or bias):
            mask = torch.zeros((sq, skv), dtype=q.dtype, device=device)
            if additive is not None:
                mask = mask + additive.to(q.dtype)
            if bias:
                mask = mask + bias[0]
            if keep is not None:
                mask = mask.masked_fill(~keep, float("-inf"))
        with sdpa_kernel(backend_enum):
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, scale=att.scale,
                enable_gqa=att.kv_heads != att.heads,
            )  # fmt: skip
        return _out_layout(att, out)

    return call


def flex_variant(torch, module, att: Attention, sq: int, skv: int, device, compiled=True):
    """torch.compile(flex_attention) with the spec's score mod (softcap, ALiBi, bias) and
    its masks as a block mask, made once for the shape (compiled=False: flex_attention
    as it is, which the CPU tests check the mods on)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    shift = skv - sq
    block_mask = None
    if att.causal or att.window:
        window = att.window

        def mask_mod(b, h, i, j):
            seen = j <= i + shift
            if window:
                seen = seen & (j > i + shift - window)
            return seen

        block_mask = create_block_mask(mask_mod, None, None, sq, skv, device=device)
    slopes = torch.tensor(module.ALIBI_SLOPES, device=device) if att.alibi else None
    flex = torch.compile(flex_attention) if compiled else flex_attention

    def call(q, k, v, *bias):
        def score_mod(score, b, h, i, j):
            if att.softcap:
                score = att.softcap * torch.tanh(score / att.softcap)
            if slopes is not None:
                score = score + slopes[h] * (j - i - shift)
            if bias:
                score = score + bias[0][b, h, i, j]
            return score

        q, k, v = _bhsd(att, (q, k, v))
        out = flex(
            q, k, v, score_mod=score_mod, block_mask=block_mask, scale=att.scale,
            enable_gqa=att.kv_heads != att.heads,
        )  # fmt: skip
        return _out_layout(att, out)

    return call


def _variant(torch, module, att, name, sq, skv, device):
    if name == "fusegen":
        return getattr(module, att.name)
    if name == "eager":
        return module.reference
    if name.startswith("sdpa "):
        return sdpa_variant(torch, module, att, name.split()[1], sq, skv, device)
    return flex_variant(torch, module, att, sq, skv, device)


def bench_shape(torch, timer, module, att, shape, dtype_name, names, ceilings, progress, device):
    batch, sq, skv = shape
    dtype = torch_dtype(torch, dtype_name)
    element = torch.empty((), dtype=dtype).element_size()
    flops, moved = work(att, batch, sq, skv, element)
    count = min(MAX_SETS, max(2, ROTATION_BYTES // max(int(moved), 1)))
    sets = [make_inputs(torch, att, batch, sq, skv, dtype, device, seed) for seed in range(count)]
    exact = module.reference(*[t.double() for t in sets[0]])
    floor_s = max(flops / (ceilings.tflops * 1e12), moved / (ceilings.gbs * 1e9))
    results = []
    for name in names:
        row = Result(att.name, shape, dtype_name, name)
        progress(f"  {att.name} {'x'.join(map(str, shape))} {dtype_name}: {name} ...")
        try:
            fn = _variant(torch, module, att, name, sq, skv, device)
            if isinstance(fn, str):
                results.append(Result(att.name, shape, dtype_name, name, note=fn))
                continue
            with torch.no_grad():
                start = time.perf_counter()
                out = fn(*sets[0])
                if device == "cuda":
                    torch.cuda.synchronize()
                row.first_call_s = time.perf_counter() - start
                row.error = relative_error(torch, out, exact)
                row.ok = row.error <= TOLERANCE[dtype_name]
                cycle = itertools.cycle(sets)
                row.ms = timer(lambda fn=fn, cycle=cycle: fn(*next(cycle)))
            row.rate = flops / row.ms / 1e9
            row.roofline = floor_s / (row.ms / 1e3)
        except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, not fatal
            if name.startswith("sdpa ") and _no_sdpa_kernel(exc):
                row = Result(att.name, shape, dtype_name, name, note=NO_KERNEL)
            else:
                row.ok, row.note = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        results.append(row)
    return with_speedup(results)


NO_KERNEL = "this backend has no kernel for the call"


def _no_sdpa_kernel(exc) -> bool:
    """Whether SDPA refused the call for want of a kernel on the chosen backend (flash
    and efficient on grouped-query decode, say): not applicable, as softcap is, rather
    than a failure, so that the bench's exit status means a wrong or broken kernel."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        text.startswith("No available kernel") or text.startswith("No viable backend")
    )


def check_shapes(shapes) -> None:
    """Raises ValueError unless every shape is (batch, q_len, k_len)."""
    bad = [s for s in shapes if len(s) != 3]
    if bad:
        raise ValueError(
            "--attention-shapes takes BATCH,Q_LEN,K_LEN (heads and head dim are the "
            f"spec's), got {' '.join(','.join(map(str, s)) for s in bad)}"
        )


def run(
    kernels,
    shapes,
    dtype_name,
    names,
    timer,
    progress,
    ceilings=None,
    device="cuda",
    tables_dir: Path | None = None,
) -> tuple[Ceilings, list[Result]]:
    """Bench every attention kernel at every (batch, q_len, k_len) in `shapes` with the
    variants `names` (see variant_names), each module with its tuned table from
    `tables_dir` where there is one (None: the defaults). `timer(fn) -> ms` and `ceilings`
    can be given (the tests run it on the CPU with a fake timer)."""
    import torch

    ceilings = ceilings or measure_ceilings(torch, timer)
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        for att in kernels:
            dtype = call_dtype(att, dtype_name, progress)
            module = load_module(att, Path(tmp), tables_dir)
            for shape in shapes:
                results += bench_shape(
                    torch, timer, module, att, shape, dtype, names, ceilings, progress, device
                )
    return ceilings, results
