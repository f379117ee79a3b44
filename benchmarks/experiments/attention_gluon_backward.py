"""Attention's backward in Gluon (fusegen/runtime/attention_hopper_backward.py, the
forward's schedule carried over: two 64-key consumer warpgroups ping-ponging over the
query blocks a one-warp TMA producer streams, for dk and dv; a queries-major kernel of its
own for dq, so both stay deterministic) checked against float64 and timed against the
`tl` backward kernels of the generated module (the same module with its Hopper kernels
turned off), both given the runtime forward's lse; beside the runtime's kernels, dk/dv's
unmasked blocks' dots paired (S^T with dP^T, dV with dK, the runtime's) or not (dV with
dP^T; `paired_dots=2`: the masked blocks' too, untimed), dk/dv's query blocks of 32 or
64 rows (the runtime: 32 past head dim 128), the grids' order (`head_major`,
`dq_head_major`: the quarters of a kv head's key blocks, or a head's query blocks, run
head by head, the rest blocks-major; under GQA a dk/dv program
runs every query head of its group, so the heads-major grid ended on the last kv heads'
longest programs: keys-major past half took the dk/dv kernel from 1.919 to 1.686 ms at 4 x
28/4 x 4096 and is the runtime's under a causal mask; the dq kernel's is unmeasured, a
tail of 3-14% in a model of equal steps), dq's key blocks of 128 (the runtime: 64;
2-5% slower when measured), and each block's lse and delta loaded by the dk/dv
consumers (`row_tma=False`) instead of streamed by its producer (the runtime's where q_len
% 4 == 0: 8-12% off the dk/dv kernel on an H100, 2026-12-07).
Removed after their runs: three stages in either kernel's ring (within the spreads),
dk/dv's programs in the other order (causal: the longest last; within 2-3% either way),
and dq fused into the dk/dv kernel (FA3's way: the dq kernel recomputes S and dP, 7 dots
where a fused backward has 5): by scalar fp32 atomics 46-51% slower (commit 766cccd has
it and the order, `longest_first=False`, `fused_dq=True`); by TMA reduces (dS^T through
shared memory, dq = dS K in 64-column chunks, each added into an fp32 dq by one
`cp.reduce.async.bulk.tensor`, Gluon's builder's `create_async_tma_reduce`) 56% slower at
4 x 32 x 4096, d 128, causal (5.24 ms against 3.37; 4.77 with the first chunk's dot
between dV's and dK's; 788 bytes of spills against 100), commit fe74470 has it; and
FA3's split (`fused_dq`, commit 53dfc14 has it: both consumers' dS^T in shared memory,
each consumer half of dq's columns over the program's 128 keys, one 16 KB reduce a
consumer a block, the previous block's dq under this one's dV and dK): correct, and on an
H100 with the delta kernel 17% slower causal (4.18 ms against 3.56), 19% unmasked (7.26
against 6.08), 37% at GQA 28/4 (4.08 against 2.97); 864 bytes of spills against 200,
Nsight: 6.1 of 14.8 cycles between a warp's issues waiting on L1TEX (the spills' loads),
compute 40% against the kernel's 62%, L2 57% (the reduces) against 27%.
The Gluon timing leaves out delta (the `tl` rows include it: a row-sum kernel, about 2%
of the backward at the default shape).

    python3 benchmarks/experiments/attention_gluon_backward.py [--built FOLDER]
        [--cases causal full alibi window] [--shape B H S D] [--v-dim DV] [--kv-heads N]
        [--module NAME] [--rounds 5] [--only CALL...]
        (on an H100/H200: dq, dk and dv against float64, then timed against the `tl`
        backward kernels of the built module NAME, else anchor_attention_CASE, FOLDER:
        benchmarks/specs/attention_anchors.yaml built)
    ncu --profile-from-start off ... python3 benchmarks/experiments/attention_gluon_backward.py
        --profile --cases causal (one call of each Gluon kernel and of cuDNN's forward and
        backward, MHA only, profiled)
    python3 benchmarks/experiments/attention_gluon_backward.py --compile
        (CPU: compiled for sm_90; registers, spills and shared memory, head dims 128, 96
        and 192/128, ALiBi and a window)

bhsd, bf16.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch
import triton

from fusegen.codegen.attention_text import alibi_slopes
from fusegen.runtime import attention_hopper, attention_hopper_backward


def compile_report(
    causal=True,
    dim=128,
    dv=128,
    group=1,
    paired_dots=True,
    rows=None,
    alibi=0,
    window=0,
    delta_in_dq=False,
    row_tma=None,
):
    """Registers, spills and shared memory of the runtime's kernels compiled for sm_90
    (CPU); rows: the dk/dv kernel's query rows (dkdv_rows by default); alibi, window:
    the kernels' ALIBI (the power of two at or below the heads) and WINDOW."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quant_registers import compile_sm90, ptxas_report

    hb = attention_hopper_backward
    row_tma = hb.ROW_TMA if row_tma is None else row_tma
    q, v = (torch.empty(256, d, dtype=torch.bfloat16) for d in (dim, dv))
    for kernel in (hb._attention_dkdv, hb._attention_dq):
        q_rows = (rows or hb.dkdv_rows(dim)) if kernel is hb._attention_dkdv else hb.BLOCK_M
        descs, split = attention_hopper.tile_args(q, q, v, v, (256, 256), q_rows, hb.BLOCK_N)
        names = [p.name for p in kernel.params]
        types = {name: "i32" for name in names}
        if kernel is hb._attention_dkdv:  # lse's and delta's, 1-D
            descs += [hb.row_descriptor(torch.empty(256), q_rows)] * 2
        for name, desc in zip(names, descs, strict=False):
            types[name] = triton.runtime.jit.mangle_type(desc)
        types |= {n: "*bf16" for n in ("dk_ptr", "dv_ptr", "dq_ptr", "out_ptr") if n in names}
        types |= {"lse_ptr": "*fp32", "delta_ptr": "*fp32", "qk_scale": "fp32", "scale": "fp32"}
        meta = {"GROUP": group, "CAUSAL": causal, "ALIBI": alibi, "WINDOW": window}
        meta |= {"STAGES": 2, "num_warps": 4}
        meta |= split
        meta |= {"PAIRED_DOTS": paired_dots} if "PAIRED_DOTS" in names else {}
        meta |= {"HEAD_MAJOR": hb.HEAD_MAJOR if causal else 4}
        meta |= {"DELTA": delta_in_dq} if "DELTA" in names else {}
        meta |= {"ROW_TMA": row_tma} if "ROW_TMA" in names else {}
        types |= {name: "constexpr" for name in meta}
        constants = {(names.index(name),): value for name, value in meta.items()}
        compiled = compile_sm90(kernel, types, constants, {"num_warps": 4})
        print(f"{kernel.__name__} d={dim}/{dv} rows={q_rows} causal={causal} group={group} "
              f"paired={paired_dots} alibi={alibi} window={window} delta_in_dq={delta_in_dq} "
              f"row_tma={row_tma}: "
              f"{ptxas_report(compiled.asm['ptx'])} | "
              f"shared {compiled.metadata.shared} bytes", flush=True)  # fmt: skip


# case -> (causal, ALiBi, window): the masks of the anchors' modules of the same name.
MASKS = {
    "causal": (True, False, 0),
    "full": (False, False, 0),
    "alibi": (True, True, 0),
    "window": (True, False, 1024),
}


def reference_grads(q, k, v, d_out, causal, slopes=None, window=0):
    """(dq, dk, dv) in float64 of bhsd q, k, v (k and v with kv heads, as many keys as
    queries); slopes: ALiBi's, one a query head; window: a query sees its `window` latest
    keys."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    keys, values = (t.repeat_interleave(group, 1) for t in (k, v))
    scores = q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
    seq = q.shape[-2]
    position = torch.arange(seq, device=q.device)
    if slopes is not None:
        slopes = torch.tensor(slopes, dtype=torch.float64, device=q.device)
        scores = scores + slopes[:, None, None] * (position[None, :] - position[:, None])
    if causal:
        seen = position[None, :] <= position[:, None]
        if window:
            seen &= position[None, :] > position[:, None] - window
        scores = scores.masked_fill(~seen, float("-inf"))
    out = torch.softmax(scores, -1) @ values
    out.backward(d_out.double())
    return q.grad, k.grad, v.grad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--built", help="benchmarks/specs/attention_anchors.yaml built here")
    parser.add_argument("--cases", nargs="+", default=["causal", "full"])
    parser.add_argument("--shape", type=int, nargs=4, default=[4, 32, 4096, 128])
    parser.add_argument("--kv-heads", type=int, help="GQA: kv heads (default: MHA)")
    parser.add_argument("--v-dim", type=int, help="v's head dim (default: D)")
    parser.add_argument(
        "--module", help="the built module whose `tl` kernels are timed (default: the case's)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="+", help="time only the calls of these names")
    parser.add_argument(
        "--profile", action="store_true", help="one call of each, under the CUDA profiler only"
    )
    args = parser.parse_args()
    if args.compile:
        for causal, group, paired in (
            (True, 1, True), (False, 1, True), (True, 7, True), (True, 1, False),
        ):  # fmt: skip
            compile_report(causal, group=group, paired_dots=paired)
        for dim, dv, rows in ((96, 96, None), (192, 128, None), (192, 128, 64)):
            compile_report(True, dim, dv, rows=rows)
        compile_report(True, alibi=32)  # BLOOM-style: ALiBi's slopes of 32 heads
        compile_report(True, group=4, window=1024)  # Mistral-style
        for dim, dv in ((128, 128), (96, 96), (192, 128)):  # delta from the dq kernel's tiles
            compile_report(True, dim, dv, delta_in_dq=True)
        return 0

    failed = sum(
        run_case(case, args.shape, args.kv_heads, args.rounds, args.built, args.profile,
                 args.v_dim, args.module, args.only)
        for case in args.cases
    )  # fmt: skip
    return 1 if failed else 0


def run_case(
    case, shape, kv_heads, rounds, built, profile=False, v_dim=None, module=None, only=None
):
    """dq, dk and dv of one case against float64, then timed (only: the calls of these
    names); the number of failed checks."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import attention_anchors

    causal, alibi, window = MASKS[case]
    batch, heads, seq, dim = shape
    kv_heads, v_dim = kv_heads or heads, v_dim or dim
    torch.manual_seed(0)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    q, k = torch.randn(*shape, **bf16), torch.randn(batch, kv_heads, seq, dim, **bf16)
    v = torch.randn(batch, kv_heads, seq, v_dim, **bf16)
    d_out = torch.randn(batch, heads, seq, v_dim, **bf16)
    group = heads // kv_heads
    out = torch.empty(batch, heads, seq, v_dim, **bf16)
    lse = torch.empty(batch, heads, seq, device="cuda")
    masks = {"causal": causal, "alibi": alibi, "window": window}
    attention_hopper.forward(q, k, v, out, lse, layout="bhsd", scale=dim**-0.5, **masks)
    delta = (out.float() * d_out.float()).sum(-1)

    def gluon(needs, delta=delta, **variant):
        return attention_hopper_backward.backward(
            q, k, v, d_out, lse, delta, needs, layout="bhsd", scale=dim**-0.5, **masks,
            **variant,
        )[0]  # fmt: skip

    from fusegen.runtime.attention import backward_delta

    def delta_kernel():
        """The runtime's row-sum kernel (what the module launches before the Gluon ones)."""
        written = torch.empty_like(delta)
        meta = {
            "HEADS": heads,
            "DV": v_dim,
            "BLOCK_M": 64,
            "BLOCK_D": triton.next_power_of_2(v_dim),
        }
        grid = (triton.cdiv(seq, 64), batch * heads)
        backward_delta[grid](out, d_out, written, seq, *out.stride()[:3], *d_out.stride()[:3],
                             **meta)  # fmt: skip
        return written

    def delta_in_dq(**knobs):
        """The dq kernel computing delta, then the dk/dv kernel reading it: the delta."""
        written = torch.full_like(delta, float("nan"))
        gluon((True, True, True), delta=written, out=out, **knobs)
        return written

    # The first batch entry's first kv head and its query heads, in float64.
    q_part, kv_part = (slice(0, 1), slice(0, group)), (slice(0, 1), slice(0, 1))
    parts = (q_part, kv_part, kv_part)
    slopes = alibi_slopes(heads)[:group] if alibi else None
    wants = reference_grads(
        q[q_part], k[kv_part], v[kv_part], d_out[q_part], causal, slopes, window
    )
    failed = 0
    wide_dq = dim + v_dim <= 256  # 128-key dq blocks fit shared memory
    checked = {"": {}, " (unpaired dots)": {"paired_dots": False}}
    checked |= {" (dq 128 keys)": {"keys_dq": 128}} if wide_dq else {}
    checked |= {" (dk/dv keys-major)": {"head_major": 0}}
    checked |= {" (dk/dv keys-major past half)": {"head_major": 2}}
    checked |= {" (dq blocks-major past half)": {"dq_head_major": 2}}
    checked |= {" (delta in dq)": {"out": out, "delta": torch.full_like(delta, float("nan"))}}
    checked |= {" (lse, delta loaded)": {"row_tma": False}}
    checked |= {" (masked blocks paired too)": {"paired_dots": 2}}
    checked |= {
        " (delta in dq, loaded)": {
            "out": out,
            "delta": torch.full_like(delta, float("nan")),
            "row_tma": False,
        }
    }
    if only:  # the variants the timed calls run
        kept = (
            "",
            " (delta in dq)",
            " (lse, delta loaded)",
            " (delta in dq, loaded)",
            " (masked blocks paired too)",
        )
        checked = {name: checked[name] for name in kept}
    for variant, knobs in checked.items():
        grads = gluon((True, True, True), **knobs)
        for name, got, want, part in zip(("dq", "dk", "dv"), grads, wants, parts, strict=True):
            error = (got[part].double() - want).abs().max().item() / want.abs().max().item()
            ok = error < 2e-2
            failed += not ok
            print(f"{case} {name}{variant}: max error {error:.2e} of max |grad| "
                  f"{'ok' if ok else 'FAIL'}")  # fmt: skip
    for name, written in (("delta kernel", delta_kernel()), ("delta in dq", delta_in_dq())):
        error = ((written - delta).abs().max() / delta.abs().max()).item()
        ok = error < 1e-5
        failed += not ok
        print(f"{case} {name}: max error {error:.2e} of max |delta| {'ok' if ok else 'FAIL'}")
    kv, q_only = (False, True, True), (True, False, False)
    if profile:  # ncu --profile-from-start off: these calls alone
        from torch.nn.attention import SDPBackend, sdpa_kernel

        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        gluon(kv)
        gluon(q_only)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal).backward(
                d_out
            )
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        return failed
    calls = {
        "gluon dk/dv": lambda: gluon(kv),
        "gluon dk/dv unpaired dots": lambda: gluon(kv, paired_dots=False),
        "gluon dk/dv 32-row blocks": lambda: gluon(kv, rows_dkdv=32),
        "gluon dk/dv 64-row blocks": lambda: gluon(kv, rows_dkdv=64),
        "gluon dk/dv keys-major": lambda: gluon(kv, head_major=0),
        "gluon dk/dv keys-major past half": lambda: gluon(kv, head_major=2),
        "gluon dq": lambda: gluon(q_only),
        "gluon dq blocks-major past half": lambda: gluon(q_only, dq_head_major=2),
        "gluon dk/dv + dq": lambda: gluon((True, True, True)),
        "delta kernel, gluon dq + dk/dv": lambda: gluon((True, True, True), delta=delta_kernel()),
        "gluon dq with delta + dk/dv": delta_in_dq,
        "gluon dk/dv, lse and delta loaded": lambda: gluon(kv, row_tma=False),
        "gluon dk/dv, masked blocks paired too": lambda: gluon(kv, paired_dots=2),
        "gluon dq with delta + dk/dv, loaded": lambda: delta_in_dq(row_tma=False),
    }
    if wide_dq:
        calls["gluon dq 128-key blocks"] = lambda: gluon(q_only, keys_dq=128)
    if built and (module or group == 1):
        name = module or f"anchor_attention_{case}"
        module = attention_anchors.load(Path(built), name)
        attention = module._ATTENTION
        bshd = module.LAYOUT == "bshd"
        inputs = tuple(t.transpose(1, 2) if bshd else t for t in (q, k, v))
        grad = d_out.transpose(1, 2) if bshd else d_out
        o = out.transpose(1, 2) if bshd else out

        def tl_backward(needs):
            hopper, attention.hopper = attention.hopper, None  # the `tl` kernels
            try:
                return attention.backward(inputs, o, lse, grad, needs)
            finally:
                attention.hopper = hopper

        calls["tl dk/dv (with delta)"] = lambda: tl_backward((False, True, True))
        calls["tl backward (with delta)"] = lambda: tl_backward((True, True, True))
    if only:
        calls = {name: call for name, call in calls.items() if name in only}
    times = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(triton.testing.do_bench(calls[name]))
    for name, ms in times.items():
        print(f"{case:7s} {name:26s} {statistics.median(ms):7.3f} ms "
              f"[{min(ms):.3f}-{max(ms):.3f}]", flush=True)  # fmt: skip
    return failed


if __name__ == "__main__":
    sys.exit(main())
