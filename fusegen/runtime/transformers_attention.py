"""An attention module as transformers' attention implementation: an attention function
(`AttentionInterface`) and, under the same name, a mask function
(`AttentionMaskInterface`) that hands it key ranges instead of a [batch, 1, q, k] mask.

transformers builds a model's masks through the mask function registered under the
model's attention implementation, and passes what it returns to the attention function
as `attention_mask`. The mask function here returns the (start, end) rows of real keys
(left and right padding, a static cache's filled part) as an int32 [batch, 1, 1, 2]
tensor: 4D, so that transformers passes it on as a prepared mask (generate prepares a
static cache's masks before the model's forward). Where the queries do not stand at the
keys' end (a static cache's prefill), the rows are expanded (a view) along dim 2 to the
number of keys the kernel must see so that they do: a shape, so static under
torch.compile. Masks that are not ranges (packed sequences, custom mask functions,
a padding mask with a hole) are refused with a ValueError that says so.

Only the attention module's launcher runs per layer; this file imports transformers when
`register` is called, never at import."""

import math

import torch

from .attention import key_ranges_from_mask


def register(name, served, causal):
    """Register `served`, [(launcher, its module's runtime Attention)], as transformers'
    attention implementation `name`, with its mask function; returns name. causal: the
    specs' (a causal spec serves transformers' causal and sliding-window masks, a
    non-causal one its bidirectional masks)."""
    try:
        from transformers import AttentionInterface
        from transformers import masking_utils
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as error:  # transformers < 4.54 has no mask interface
        raise ImportError(
            f"use_in_transformers needs transformers with AttentionMaskInterface "
            f"(4.54 or newer): {error}"
        ) from None
    AttentionInterface.register(name, attention_function(name, served))
    try:
        from transformers.utils.import_utils import is_tracing
    except ImportError:  # older: no fake tensors' check

        def is_tracing(tensor=None):
            return torch.compiler.is_compiling()

    # transformers' mask functions and checks are looked up here, not while traced:
    # torch 2.11's dynamo cannot import from transformers' lazy modules.
    known = (masking_utils.causal_mask_function, masking_utils.bidirectional_mask_function)
    AttentionMaskInterface.register(name, mask_function(name, causal, known, is_tracing))
    return name


def attention_function(name, served):
    """transformers' attention function signature around the launchers: q, k, v as
    [batch, heads, seq, dim], the mask function's ranges; returns (out as [batch,
    seq, heads, dim], None). A call runs the served module whose spec fixed the layer's
    scaling, window and softcap. Raises ValueError where none did, where the layer asks
    for dropout or attention sinks, or where the mask is not the mask function's ranges."""
    specs = [
        (launcher, _layer_kind(attention.module), attention.module)
        for launcher, attention in served
    ]
    names = [attention.name for _, attention in served]

    def fusegen_attention(
        layer, query, key, value, attention_mask, scaling=None, dropout=0.0,
        sliding_window=None, softcap=None, s_aux=None, **kwargs,
    ):  # fmt: skip
        launcher, module = _served(name, names, specs, scaling, sliding_window, softcap)
        bshd = module["LAYOUT"] == "bshd"
        if dropout:
            raise ValueError(f"{name}: attention dropout ({dropout}) is not fused; set it to 0")
        if s_aux is not None:
            raise ValueError(f"{name}: attention sinks (s_aux) are not fused")
        ranges = None
        if _is_ranges(attention_mask, query.shape[0]):
            ranges = attention_mask[:, 0, 0]
            if attention_mask.shape[2] > 1:  # a static cache's prefill: its filled part
                keys = attention_mask.shape[2]
                key, value, ranges = key[:, :, :keys], value[:, :, :keys], ranges.contiguous()
        elif attention_mask is not None:
            raise ValueError(
                f"{name}: got a {type(attention_mask).__name__} mask of shape "
                f"{list(getattr(attention_mask, 'shape', []))}, not the key ranges of the "
                f"mask function registered under {name!r} (a 4D mask given to the model is "
                "not read: give it the 2D attention_mask)"
            )
        if bshd:  # transformers hands [batch, heads, seq, dim]: bshd views, read in place
            query, key, value = (t.transpose(1, 2) for t in (query, key, value))
        out = launcher(query, key, value, key_ranges=ranges)
        return (out if bshd else out.transpose(1, 2)), None

    return fusegen_attention


def _layer_kind(module):
    """(scale, window, softcap) a module's spec fixed."""
    return module["SCALE"], module.get("WINDOW"), module.get("SOFTCAP")


def _served(name, names, specs, scaling, sliding_window, softcap):
    """(launcher, module) of the served spec that is the layer's (scaling None: any)."""
    for launcher, (scale, window, cap), module in specs:
        if (
            (scaling is None or math.isclose(scaling, scale, rel_tol=1e-6))
            and (sliding_window or None) == window
            and (softcap or None) == cap
        ):
            return launcher, module
    if len(specs) == 1:  # say which field differs
        scale, window, cap = specs[0][1]
        if scaling is not None and not math.isclose(scaling, scale, rel_tol=1e-6):
            raise ValueError(f"{name}: the layer's scaling is {scaling}, the spec's {scale}")
        if (sliding_window or None) != window:
            raise ValueError(
                f"{name}: the layer's sliding window is {sliding_window}, the spec's {window}"
            )
        raise ValueError(f"{name}: the layer's softcap is {softcap}, the spec's {cap}")
    kinds = "; ".join(
        f"{n}: scaling {s}, window {w}, softcap {c}"
        for n, (_, (s, w, c), _) in zip(names, specs, strict=True)
    )
    raise ValueError(
        f"{name}: no module served here is the layer's (scaling {scaling}, sliding window "
        f"{sliding_window}, softcap {softcap}); served: {kinds}"
    )


def mask_function(name, causal, known, is_tracing):
    """transformers' mask interface signature: the key ranges, or None where every key
    is seen (no padding mask, the queries at the keys' end). known: transformers' causal
    and bidirectional mask functions; is_tracing: its check of the same name."""

    def fusegen_key_ranges(
        batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
        attention_mask=None, **kwargs,
    ):  # fmt: skip
        kind = _mask_kind(mask_function, causal, known, is_tracing)
        if kind != ("causal" if causal else "bidirectional"):
            raise ValueError(
                f"{name}: transformers asked for a {kind} mask "
                f"({getattr(mask_function, '__qualname__', mask_function)}); the kernel is "
                f"{'causal' if causal else 'not causal'} and takes key ranges only (no "
                "packed sequences, no custom mask functions)"
            )
        return key_ranges(
            attention_mask, batch_size, q_length, kv_length, q_offset, kv_offset,
            kwargs.get("device"),
        )  # fmt: skip

    return fusegen_key_ranges


def key_ranges(attention_mask, batch_size, q_length, kv_length, q_offset, kv_offset, device=None):
    """The [batch, 1, 1 or keys, 2] int32 ranges (start, end) for keys kv_offset ..
    kv_offset + kv_length (positions) and queries q_offset .. q_offset + q_length, given
    transformers' 2D padding mask (or None); None where every key is seen. device: the
    model's, where there is no mask to take it from.

    The kernels put query i at key i + k_len - q_len. Where the queries end before the
    keys (a static cache, filled to q_offset + q_length), a single query (decode) gets its
    range's end clamped there; more queries get the keys cut to the filled part, which
    needs q_offset as an int (a static cache's prefill: transformers gives one)."""
    filled = q_offset + q_length - kv_offset  # keys up to the last query's position
    aligned = isinstance(filled, int) and filled == kv_length
    if attention_mask is None and aligned:
        return None
    if attention_mask is None:
        if isinstance(q_offset, torch.Tensor):
            device = q_offset.device
        start = torch.zeros(batch_size, dtype=torch.int32, device=device)
        end = torch.full((batch_size,), kv_length, dtype=torch.int32, device=device)
    else:
        padding = attention_mask
        if padding.shape[-1] < kv_offset + kv_length:  # transformers' own padding of it
            short = kv_offset + kv_length - padding.shape[-1]
            padding = torch.nn.functional.pad(padding, (0, short))
        try:
            ranges = key_ranges_from_mask(padding[:, kv_offset : kv_offset + kv_length])
        except ValueError as exc:  # a hole: no key range, and this path takes no bias
            raise ValueError(
                f"{str(exc).split(': a module')[0]}; run this batch on another attention "
                "implementation (attn_implementation='sdpa'), or pad it on one side"
            ) from None
        start, end = ranges[:, 0], ranges[:, 1]
    keys = None
    if not aligned:
        if q_length == 1:  # clamped: the kernel's causal alignment is then the same
            end = torch.minimum(end, torch.as_tensor(filled, device=end.device).to(end.dtype))
        elif torch.compiler.is_compiling() and isinstance(filled, torch.Tensor):
            raise ValueError(
                "a static cache's prefill under torch.compile: the filled length is a "
                "tensor, and the kernel needs it as an int to cut the keys"
            )
        else:
            keys = int(filled)
    ranges = torch.stack([start, end], dim=-1).to(torch.int32)[:, None, None]
    if keys is not None:
        ranges = ranges.expand(batch_size, 1, keys, 2)
    return ranges


def _is_ranges(mask, batch):
    """Whether an attention function's attention_mask is the mask function's ranges."""
    return (
        isinstance(mask, torch.Tensor)
        and mask.dtype == torch.int32
        and mask.shape[:2] == (batch, 1)
        and mask.shape[-1] == 2
    )


def _mask_kind(mask_function, causal, known, is_tracing):
    """'causal' (transformers' causal mask function, or its sliding-window one: the
    attention function checks the window), 'bidirectional', 'packed sequences', or
    'custom', read from the closures transformers builds. While traced (torch.compile)
    a closure made in the traced code cannot be read, nor even named: one is taken for
    the spec's kind (`causal`). transformers builds one for a sliding window and, unable
    to rule packed sequences out while traced, for every forward given position_ids
    without a cache or a mask. So packed sequences and custom mask functions are refused
    eagerly only."""
    causal_function, bidirectional_function = known
    if mask_function is None or mask_function is causal_function:
        return "causal"
    if mask_function is bidirectional_function:
        return "bidirectional"
    if torch.compiler.is_compiling():
        return "causal" if causal else "bidirectional"
    if getattr(mask_function, "__qualname__", "") != "and_masks.<locals>.and_mask":
        return "custom"
    parts = _closure(mask_function).get("mask_functions", ())
    if len(parts) == 2 and causal_function in parts:
        other = parts[1] if parts[0] is causal_function else parts[0]
        name = getattr(other, "__qualname__", "")
        if name.startswith("sliding_window_overlay"):
            return "causal"
        if name.startswith("packed_sequence_mask_function"):
            return _packed_kind(other, is_tracing)
    return "custom"


def _packed_kind(packed_function, is_tracing):
    """transformers builds the packed-sequence mask function whenever it cannot look at
    the positions (traced: dynamo, CUDA-graph capture, fake tensors), packed or not: look
    at them where that can be done, else take them for one sequence a row."""
    packed = _closure(packed_function).get("packed_sequence_mask")
    if not isinstance(packed, torch.Tensor) or is_tracing(packed):
        return "causal"
    return "causal" if bool((packed[:, -1] == 0).all()) else "packed sequences"


def _closure(fn):
    cells = getattr(fn, "__closure__", None) or ()
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in cells), strict=True))
