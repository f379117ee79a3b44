"""Code variants of the generated attention kernels, measured before the generator
changes: each is a small text edit of a module built from
benchmarks/specs/attention_anchors.yaml, imported as its own module, checked against fp32
math attention (attention_anchors.check_case), then timed in alternating rounds with the
module as generated and SDPA's cuDNN backend (do_bench medians, ms, and TFLOP/s).

Variants (combinations are joined with "+"):
  base           the module as generated
  pointer        TMA_LOADS = False: pointer loads where the module has tensor descriptors
  heavy-first    the forward and dq kernels take their query blocks last-first: under a
                 causal mask the last blocks see the most keys, so the long programs start
                 first and the short ones fill the tail
  hoisted-offsets  each step's tile pointers (forward, dk/dv, dq) as a base moved to the
                 step's first key or row (a scalar) plus a tile of offsets no step
                 changes, computed once outside the loop. Compiled for sm_90 at causal
                 d 64 (64 x 64 tiles, 4 warps, 3 stages; nvdisasm): the forward's
                 unmasked step 305 -> 287 instructions, dk/dv's 359 -> 349, dq's 244 ->
                 239, the same 16-byte loads
  row-limit-mask the causal forward's masked steps (the diagonal) with one condition a
                 score, the key count folded into each row's last key and no `keys >=
                 first` (only key ranges need it; the cases pass none): 513 -> 473
                 instructions a diagonal step at causal d 64 on sm_90
  ws             the forward's unmasked key loop asks for warp specialization
                 (tl.range(..., warp_specialize=True))
  lazy-rescale   the forward rescales its accumulator only when some row's running max
                 grew by more than 8 (base 2; FA4's trick): probabilities then reach at
                 most 2**8 against a stale max, which bf16 and the fp32 sums hold. It
                 saves the accumulator's multiply a step and adds a block-wide max; the PV
                 dot stays in flight into the next step either way (dot_waits.py)
  rescale-if-grown  the same `if` at threshold 0: the generated arithmetic (a rescale
                 whenever some row's max grew), to tell the `if`'s part from the skipped
                 multiplies' (on the CPU it runs the rescale branch with a nonzero state)
  ones-sum       the forward's rows' sums of probabilities on the tensor cores: P times a
                 tile of ones (N = 16) into an accumulator of its own, rescaled as out's,
                 in place of an add a score and each row's shuffles (at d 64 the forward
                 issues more instructions than cuDNN's for the same dots). The unmasked
                 step 305 -> 280 instructions on sm_90, but on an H100 causal d 64 ran
                 0.139 ms against 0.127 (9 rounds): the extra dot costs more than the
                 adds, so the step is not bound by its instruction count
  persistent     the Gluon forward on its persistent grid, head by head, where the
                 runtime's hopper_grid runs every tile (a window's tiles weigh the same,
                 as no mask's, where the persistent grid won)
  longest-first  the same grid, every head's last query tile first
  kv-keys-major  the `tl` dk/dv kernel's programs keys-major (every kv head's first keys,
                 then every one's next), so that (causal) the grid ends on short programs:
                 under GQA a program runs its kv head's every query head, and heads-major
                 the last kv heads' longest programs start last
  bias-sum       a shared bias's gradient summed over the batch by the dq kernel (the
                 runtime does only where the per-entry buffer would pass
                 Attention.bias_grad_buffer_cap: on an H100 the per-entry buffer in
                 the bias's dtype and its sum, which `base` runs, won at d 64 and 128)
  bias-sum-unrolled  the same, the dq kernel's loop over a chunk's batch entries unrolled
                 (tl.static_range): the first entry's tiles read no earlier sum, and the
                 loop bound is no runtime scalar

    python3 benchmarks/experiments/attention_variants.py [--cases causal full ...]
        [--variants base lazy-rescale ...] [--rounds 3] [--out FILE.json]
    TRITON_INTERPRET=1 python3 benchmarks/experiments/attention_variants.py --check
        (CPU: every variant's edits apply and compute right at small odd shapes, the
        modules built with two kv heads)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import attention_anchors  # noqa: E402
from attention_anchors import CASES, SPEC, build  # noqa: E402

VARIANTS = [
    "base", "pointer", "heavy-first", "hoisted-offsets", "row-limit-mask", "ws",
    "lazy-rescale", "rescale-if-grown", "ones-sum", "persistent", "longest-first",
    "kv-keys-major", "bias-sum", "bias-sum-unrolled",
]  # fmt: skip
WORTH = {  # case -> the variants that can differ there (no mask: all blocks weigh the same)
    "causal": ["base", "heavy-first", "ws", "lazy-rescale", "rescale-if-grown"],
    "full": ["base", "ws", "lazy-rescale", "rescale-if-grown", "ones-sum"],
    "causal-d64": [
        "base",
        "heavy-first",
        "hoisted-offsets",
        "row-limit-mask",
        "ws",
        "lazy-rescale",
        "ones-sum",
    ],
    "gqa": ["base", "lazy-rescale", "ones-sum"],
    "gqa-d64-backward": ["base", "kv-keys-major"],
    "window": ["base", "persistent", "longest-first"],
    "alibi": ["base", "persistent"],
    "causal-backward": ["base", "heavy-first", "hoisted-offsets"],
    "learned-bias-backward": ["base", "hoisted-offsets", "bias-sum", "bias-sum-unrolled"],
}
RESCALE_AT = 8.0  # base 2: rescale once some row's max grew by more than 2**8


def _edit(src: str, start: str, end: str, old: str, new: str) -> str:
    """Replace `old` (which must occur) by `new` between the markers start and end."""
    lo = src.index(start)
    hi = src.index(end, lo)
    part = src[lo:hi]
    if old not in part:
        raise ValueError(f"variant edit: {old!r} not in {start!r}")
    return src[:lo] + part.replace(old, new) + src[hi:]


def heavy_first(src: str, name: str) -> str:
    reversed_m = "pid_m = tl.num_programs(0) - 1 - tl.program_id(0)"
    for kernel in ("forward", "backward_q"):
        src = _edit(
            src, f"def _{name}_{kernel}(\n", "\n\n\n", "pid_m = tl.program_id(0)", reversed_m
        )
    return src


# (kernel step, [(old, new), ...]): each step's tile pointers as a base moved to the step's
# first row (a scalar) plus a tile of offsets that no step changes, so the offsets are
# computed once, outside the key (or query) loop, not again each step.
HOISTED = {
    "forward_step": [
        ("keys[None, :] * stride_k_s + offs_d[:, None]",
         "tl.arange(0, BLOCK_N)[None, :] * stride_k_s + offs_d[:, None]"),
        ("keys[:, None] * stride_v_s + offs_d[None, :]",
         "tl.arange(0, BLOCK_N)[:, None] * stride_v_s + offs_d[None, :]"),
        ("k_base + k_offs", "(k_base + start * stride_k_s) + k_offs"),
        ("v_base + v_offs", "(v_base + start * stride_v_s) + v_offs"),
    ],
    "backward_kv_step": [
        ("rows[:, None] * stride_q_s + offs_d[None, :]",
         "tl.arange(0, BLOCK_M)[:, None] * stride_q_s + offs_d[None, :]"),
        ("rows[:, None] * stride_do_s + offs_d[None, :]",
         "tl.arange(0, BLOCK_M)[:, None] * stride_do_s + offs_d[None, :]"),
        ("q_base + q_offs", "(q_base + start * stride_q_s) + q_offs"),
        ("do_base + do_offs", "(do_base + start * stride_do_s) + do_offs"),
    ],
    "backward_q_step": [
        ("keys[:, None] * stride_k_s + offs_d[None, :]",
         "tl.arange(0, BLOCK_N)[:, None] * stride_k_s + offs_d[None, :]"),
        ("k_base + kv_offs", "(k_base + start * stride_k_s) + kv_offs"),
        ("v_base + keys[:, None] * stride_v_s + offs_d[None, :]",
         "(v_base + start * stride_v_s) + (tl.arange(0, BLOCK_N)[:, None] * stride_v_s"
         " + offs_d[None, :])"),
    ],
}  # fmt: skip


def hoisted_offsets(src: str, name: str) -> str:
    for step, pairs in HOISTED.items():
        for old, new in pairs:
            src = _edit(src, f"def _{name}_{step}(\n", "\n\n\n", old, new)
    return src


def replaced(kernel: str, old: str, new: str):
    """The edit of one line of the module's `kernel` (forward, backward_q, ...)."""
    return lambda src, name: _edit(src, f"def _{name}_{kernel}(\n", "\n\n\n", old, new)


def lazy_rescale(src: str, name: str, at: float = RESCALE_AT) -> str:
    step = f"def _{name}_forward_step(\n"
    lo = src.index(step)
    first = src.index("    new_max = tl.maximum(row_max, ", lo)
    last = src.index("    return acc, row_sum, new_max\n", first)
    old = src[first:last]
    factor = old.split("tl.max(scores, axis=1)", 1)[1].split(")\n", 1)[0]  # " * scale", or ""
    new = (
        f"    new_max = tl.maximum(row_max, tl.max(scores, axis=1){factor})\n"
        f"    if tl.max(new_max - row_max) > {at}:\n"
        "        rescale = tl.exp2(row_max - new_max)\n"
        "        acc = acc * rescale[:, None]\n"
        "        row_sum = row_sum * rescale\n"
        "        row_max = new_max\n"
        f"    probs = tl.exp2(scores{factor} - row_max[:, None])\n"
        "    row_sum = row_sum + tl.sum(probs, axis=1)\n"
        "    acc = tl.dot(probs.to(v.dtype), v, acc, input_precision=PRECISION)\n"
        "    return acc, row_sum, row_max\n"
    )
    return src[:first] + new + src[last + len("    return acc, row_sum, new_max\n") :]


def ones_sum(src: str, name: str) -> str:
    """The rows' sums of probabilities by the tensor cores: P times a [BLOCK_N, 16] tile of
    ones, into a [BLOCK_M, 16] accumulator rescaled as out's is (each of its columns
    the same sum), in place of a per-score add and the rows' shuffles."""
    forward = f"def _{name}_forward(\n"
    src = _edit(
        src,
        forward,
        "\n\n\n",
        "    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)\n",
        "    row_sum = tl.zeros([BLOCK_M, 16], dtype=tl.float32)\n",
    )
    src = _edit(
        src,
        forward,
        "\n\n\n",
        "    # A row that sees no key of",
        "    row_sum = tl.max(row_sum, axis=1)  # its columns are equal\n"
        "    # A row that sees no key of",
    )
    return _edit(
        src, f"def _{name}_forward_step(\n", "\n\n\n",
        "    row_sum = row_sum * rescale + tl.sum(probs, axis=1)\n"
        "    acc = tl.dot(probs.to(v.dtype), v, acc * rescale[:, None],"
        " input_precision=PRECISION)\n",
        "    probs = probs.to(v.dtype)\n"
        "    ones = tl.full([BLOCK_N, 16], 1.0, v.dtype)\n"
        "    row_sum = tl.dot(probs, ones, row_sum * rescale[:, None], input_precision=PRECISION)\n"
        "    acc = tl.dot(probs, v, acc * rescale[:, None], input_precision=PRECISION)\n",
    )  # fmt: skip


def kv_keys_major(src: str, name: str) -> str:
    """The `tl` dk/dv kernel's programs keys-major: program (n, pair) of the grid (key
    blocks, batch * kv heads) takes the key block and pair of its place in launch order
    counted pair-fastest, so every kv head's first keys run before any one's next."""
    kernel = f"def _{name}_backward_kv(\n"
    lo = src.index(kernel)
    part = src[lo : src.index("\n\n\n", lo)]
    kv_heads = re.search(r"batch = tl\.program_id\(1\) // (\d+)\n", part).group(1)
    old = (
        "    pid_n = tl.program_id(0)\n"
        f"    batch = tl.program_id(1) // {kv_heads}\n"
        f"    kv_head = tl.program_id(1) % {kv_heads}\n"
    )
    new = (
        "    order = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)\n"
        "    pid_n = order // tl.num_programs(1)\n"
        f"    batch = order % tl.num_programs(1) // {kv_heads}\n"
        f"    kv_head = order % tl.num_programs(1) % {kv_heads}\n"
    )
    return _edit(src, kernel, "\n\n\n", old, new)


EDITS = {
    "heavy-first": heavy_first,
    "hoisted-offsets": hoisted_offsets,
    "bias-sum-unrolled": replaced(
        "backward_q",
        "for member in range(BATCH_CHUNK):",
        "for member in tl.static_range(BATCH_CHUNK):",
    ),
    # The causal forward's masked steps with one condition a score: the key bound folded
    # into each row's last key, no `keys >= first` (only key ranges need it; the cases
    # pass none).
    "row-limit-mask": replaced(
        "forward_step",
        "            (keys < SKV)[None, :]\n"
        "            & (keys >= first)[None, :]\n"
        "            & (keys[None, :] <= rows[:, None] + shift),\n",
        "            keys[None, :] <= tl.minimum(rows + shift, SKV - 1)[:, None],\n",
    ),
    "ws": replaced(
        "forward",
        "for start in range(full_lo, full_hi, BLOCK_N):",
        "for start in tl.range(full_lo, full_hi, BLOCK_N, warp_specialize=True):",
    ),
    "lazy-rescale": lazy_rescale,
    "rescale-if-grown": lambda src, name: lazy_rescale(src, name, at=0.0),
    "ones-sum": ones_sum,
    "kv-keys-major": kv_keys_major,
}


def variant_module(folder: Path, name: str, variant: str):
    """The edited module, imported under the generated module's name (which the anchors'
    checks read) from a file of its own, its torch op renamed so that imports coexist."""
    src = (folder / f"{name}.py").read_text()
    for part in variant.split("+"):
        if part in EDITS:
            src = EDITS[part](src, name)
    tag = variant.replace("+", "_").replace("-", "_")
    src = src.replace('op_name="', f'op_name="{tag}_', 1)
    path = folder / f"{name}__{tag}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if "pointer" in variant.split("+"):
        module.TMA_LOADS = False
    if "persistent" in variant.split("+"):
        module._ATTENTION.hopper_grid = (True, False)
    if "longest-first" in variant.split("+"):
        module._ATTENTION.hopper_grid = (True, True)
    if {"bias-sum", "bias-sum-unrolled"} & set(variant.split("+")):
        module._ATTENTION.bias_grad_buffer_cap = 0
    return module


def run_case(case, folder, variants, rounds, shape=None):
    """{variant: {"ms", "rounds", "error", "tflops"} or {"error_text"}} for one case."""
    module_name, case_shape, backward, bias_kind, dtype = CASES[case]
    shape = shape or case_shape
    calls, errors = {}, {}
    work = None
    for variant in variants:
        try:
            module = variant_module(folder, module_name, variant)
        except Exception as exc:  # noqa: BLE001 - an edit that no longer applies is a result
            errors[variant] = f"{type(exc).__name__}: {exc}"
            print(case, variant, errors[variant], flush=True)
            continue
        anchors = ("sdpa",) if variant == variants[0] else ()
        if attention_anchors.DEVICE == "cpu":
            dtype = torch.float16  # the interpreter's bf16 dot is wrong
        got, errs, work = attention_anchors.check_case(
            f"{case} {variant}", module, shape, backward, bias_kind, dtype, anchors
        )
        for name, step in got.items():
            label = variant if name == "fusegen" else name
            calls[label] = step
            errors[label] = errs[name]
        errors.setdefault(variant, errs.get("fusegen"))
    calls = {v: c for v, c in calls.items() if isinstance(errors[v], float) and errors[v] < 2e-2}
    if attention_anchors.DEVICE == "cpu":
        return {
            v: {"error": e} if isinstance(e, float) else {"error_text": e}
            for v, e in errors.items()
        }
    from triton.testing import do_bench

    times = {v: [] for v in calls}
    order = list(calls)
    for r in range(rounds):
        for v in order[r % len(order) :] + order[: r % len(order)]:
            times[v].append(do_bench(calls[v]))
    rows = {}
    for v, error in errors.items():
        if v not in calls:
            rows[v] = {"error_text": str(error)}
            continue
        ms = statistics.median(times[v])
        rows[v] = {"ms": ms, "rounds": times[v], "error": error, "tflops": work / ms * 1e-9}
        print(
            f"{case} {v}: {ms:.3f} ms [{min(times[v]):.3f}-{max(times[v]):.3f}]"
            f" {work / ms * 1e-9:.0f} TFLOP/s, error {error:.1e}",
            flush=True,
        )
    return rows


def few_heads(attention: dict) -> tuple[int, int]:
    """(heads, kv heads) of a module of the anchors' spec as the CPU check builds it: two
    kv heads, each with as many query heads as the spec's (the interpreter runs a program
    a head, and the edits do not depend on the count)."""
    group = attention["heads"] // attention.get("kv_heads", attention["heads"])
    return 2 * group, 2


def check() -> int:
    """CPU, interpreter: every variant's edits apply and compute right at small shapes."""
    attention_anchors.DEVICE = "cpu"
    failed = False
    spec = yaml.safe_load(SPEC.read_text())
    heads_of = {}
    for kernel in spec["kernels"]:
        attention = kernel["attention"]
        heads, kv_heads = few_heads(attention)
        heads_of[kernel["name"]] = heads
        attention["heads"] = heads
        if "kv_heads" in attention:
            attention["kv_heads"] = kv_heads
    with tempfile.TemporaryDirectory() as folder:
        small = Path(folder) / "attention_anchors.yaml"
        small.write_text(yaml.safe_dump(spec, sort_keys=False))
        build(Path(folder), small)
        for case, variants in WORTH.items():
            module_name, (*_, dim), _, bias_kind, _ = CASES[case]
            # two batch entries where a learned bias's gradient is summed over them
            shape = (2 if bias_kind == "learned" else 1, heads_of[module_name], 37, 37, dim)
            for variant, row in run_case(case, Path(folder), variants, 0, shape).items():
                # The interpreter has no TMA or warp specialization: only the edits'
                # arithmetic is checked.
                bad = "error" not in row or row["error"] > 2e-2
                print(case, variant, row, "BAD" if bad else "ok", flush=True)
                failed |= bad
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(WORTH), choices=list(WORTH))
    parser.add_argument("--variants", nargs="*", default=VARIANTS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.check:
        return check()
    report = {"device": torch.cuda.get_device_name(), "cases": {}}
    with tempfile.TemporaryDirectory() as folder:
        build(Path(folder))
        for case in args.cases:
            variants = [v for v in args.variants if v in WORTH[case] or "+" in v]
            report["cases"][case] = run_case(case, Path(folder), variants, args.rounds)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_PRINT_AUTOTUNING", "0")
    sys.exit(main())
