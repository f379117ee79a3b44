"""LayerNorm's training step (forward + backward, bf16): where the generated kernels lose
to Liger's, by hand-written variants checked against float64 and timed on GPU time.

    python3 benchmarks/experiments/layernorm_backward_variants.py --built FOLDER
        [--shapes 4096x8192 ...] [--rounds 3] [--out FILE.json]
    TRITON_INTERPRET=1 python3 benchmarks/experiments/layernorm_backward_variants.py --check

FOLDER: `fusegen build benchmarks/specs/training.yaml` (its train_layernorm). The
generated backward recomputes each row's mean and rstd (three reductions more than a
backward given them) and keeps two rows a program on 8 warps; Liger's forward stores
mean and rstd (8 bytes a row) and its backward runs one row at a time on 16 warps. The
variants separate the two:
- stats=1: the forward stores mean and rstd, the backward loads them (two reductions a
  row: sum(w*dy*xhat) and sum(w*dy));
- stats=0: the backward recomputes them (centred two-pass, four reductions a row);
each over rows a step (1, 2), warps (4-16), programs (one or two an SM) and the loop's
pipeline stages (1-3: how many row blocks' loads are in flight), the weight's and bias's
gradients kept per program and summed by a second pass. The forward
(storing the statistics) over rows, warps and its guard for rows of large, close values:
deviations around the row's first element found by a masked reduction (shift=1, the
generated forward's), loaded (shift=2), or none (shift=0), one row block a program or
a persistent loop over them (per_sm > 0); beside it, the generated forward as an
inference call.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

EPS_VALUE = 1e-5
EPS = tl.constexpr(EPS_VALUE)  # a global a kernel may read


@triton.jit
def _forward(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STATS: tl.constexpr, SHIFT: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    mask = mask_m[:, None] & mask_n[None, :]
    flat = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    x = tl.load(x_ptr + flat, mask=mask, other=0.0).to(tl.float32)
    # SHIFT: deviations taken around the row's first element first (the generated
    # forward's guard for rows of large, close values), found by a masked reduction (1,
    # as generated) or loaded (2); 0: none.
    shift = tl.zeros([BLOCK_M], dtype=tl.float32)
    if SHIFT == 1:
        shift = tl.sum(tl.where(offs_n[None, :] == 0, x, 0.0), axis=1)
    if SHIFT == 2:
        shift = tl.load(x_ptr + offs_m.to(tl.int64) * N, mask=mask_m, other=0.0).to(tl.float32)
    x = tl.where(mask, x - shift[:, None], 0.0)
    mean = tl.sum(x, axis=1) / N
    dev = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(dev * dev, axis=1) / N + EPS)
    w = tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    y = dev * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + flat, y.to(y_ptr.dtype.element_ty), mask=mask)
    if STATS:
        tl.store(mean_ptr + offs_m, shift + mean, mask=mask_m)
        tl.store(rstd_ptr + offs_m, rstd, mask=mask_m)


@triton.jit
def _forward_loop(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    """The forward with statistics as a persistent loop over row blocks (the weight and
    bias loaded once a program), the first element loaded as the shift (shift=2)."""
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w = tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    for block in tl.range(
        tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0), num_stages=LOOP_STAGES
    ):
        offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        mask = mask_m[:, None] & mask_n[None, :]
        flat = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        x = tl.load(x_ptr + flat, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(x_ptr + offs_m.to(tl.int64) * N, mask=mask_m, other=0.0).to(tl.float32)
        x = tl.where(mask, x - shift[:, None], 0.0)
        mean = tl.sum(x, axis=1) / N
        dev = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(dev * dev, axis=1) / N + EPS)
        y = dev * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(y_ptr + flat, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + offs_m, shift + mean, mask=mask_m)
        tl.store(rstd_ptr + offs_m, rstd, mask=mask_m)


@triton.jit
def _backward(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr, M, N,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STATS: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w = tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    # LOOP_STAGES > 1: the next row blocks' loads issued (cp.async into shared memory)
    # while this one computes; Triton pipelines a loop without a dot only when the loop
    # names its stages.
    for block in tl.range(pid, tl.cdiv(M, BLOCK_M), tl.num_programs(0), num_stages=LOOP_STAGES):
        offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        mask = mask_m[:, None] & mask_n[None, :]
        flat = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        x = tl.load(x_ptr + flat, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + flat, mask=mask, other=0.0).to(tl.float32)
        if STATS:
            mean = tl.load(mean_ptr + offs_m, mask=mask_m, other=0.0)
            rstd = tl.load(rstd_ptr + offs_m, mask=mask_m, other=0.0)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        else:
            mean = tl.sum(x, axis=1) / N
            dev = tl.where(mask, x - mean[:, None], 0.0)
            rstd = tl.rsqrt(tl.sum(dev * dev, axis=1) / N + EPS)
            xhat = dev * rstd[:, None]
        wdy = dy * w[None, :]
        c1 = tl.sum(xhat * wdy, axis=1) / N
        c2 = tl.sum(wdy, axis=1) / N
        dx = (wdy - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        tl.store(dx_ptr + flat, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * xhat, axis=0)
        db += tl.sum(dy, axis=0)
    tl.store(dw_ptr + pid * N + offs_n, dw, mask=mask_n)
    tl.store(db_ptr + pid * N + offs_n, db, mask=mask_n)


def forward(x, w, b, stats, rows, warps, shift=0, programs=0, stages=1):
    """programs > 0: the persistent forward (_forward_loop) on that many programs."""
    m, n = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(m, device=x.device, dtype=torch.float32)
    rstd = torch.empty(m, device=x.device, dtype=torch.float32)
    if programs:
        _forward_loop[(programs,)](
            x, w, b, y, mean, rstd, m, n, BLOCK_M=rows, BLOCK_N=triton.next_power_of_2(n),
            LOOP_STAGES=stages, num_warps=warps,
        )  # fmt: skip
        return y, mean, rstd
    _forward[(triton.cdiv(m, rows),)](
        x, w, b, y, mean, rstd, m, n, BLOCK_M=rows, BLOCK_N=triton.next_power_of_2(n),
        STATS=stats, SHIFT=shift, num_warps=warps,
    )  # fmt: skip
    return y, mean, rstd


def backward(dy, x, w, mean, rstd, stats, rows, warps, programs, stages=1):
    m, n = x.shape
    dx = torch.empty_like(x)
    dw = torch.empty(programs, n, device=x.device, dtype=torch.float32)
    db = torch.empty(programs, n, device=x.device, dtype=torch.float32)
    _backward[(programs,)](
        dy, x, w, mean, rstd, dx, dw, db, m, n, BLOCK_M=rows,
        BLOCK_N=triton.next_power_of_2(n), STATS=stats, LOOP_STAGES=stages, num_warps=warps,
    )  # fmt: skip
    return dx, dw.sum(0).to(w.dtype), db.sum(0).to(w.dtype)


def reference(x, w, b, dy):
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y = torch.nn.functional.layer_norm(x64, (x.shape[1],), w64, b64, EPS_VALUE)
    return (y, *torch.autograd.grad(y, (x64, w64, b64), dy.double()))


def error(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def inputs(m, n, dev, dtype):
    x = torch.randn(m, n, device=dev, dtype=dtype) * 2 + 0.5
    w = (torch.rand(n, device=dev) + 0.5).to(dtype)
    b = torch.randn(n, device=dev).to(dtype)
    return x, w, b, torch.randn(m, n, device=dev, dtype=dtype)


def errors_of(x, w, b, dy, stats, rows, warps, programs, stages=1):
    y, mean, rstd = forward(x, w, b, stats, rows, warps if x.is_cuda else 4)
    got = (y, *backward(dy, x, w, mean, rstd, stats, rows, warps, programs, stages))
    return max(error(g, r) for g, r in zip(got, reference(x, w, b, dy), strict=True))


def check() -> None:
    torch.manual_seed(0)
    x, w, b, dy = inputs(37, 200, "cpu", torch.float16)
    for stats, rows, programs, stages in itertools.product((0, 1), (1, 2, 4), (3, 7), (1, 2)):
        err = errors_of(x, w, b, dy, stats, rows, 4, programs, stages)
        print(f"stats={stats} rows={rows} programs={programs} stages={stages}: error {err:.1e}")
        assert err < 1e-2, err
    want = reference(x, w, b, dy)[0]
    for shift, programs, stages in ((0, 0, 1), (1, 0, 1), (2, 0, 1), (2, 3, 2)):
        # Rows of large, close values: the shift's case (fp16 holds 1000 + small steps).
        near = (1000 + torch.randn(37, 200) * 0.5).to(torch.float16)
        y = forward(x, w, b, 1, 2, 4, shift, programs, stages)[0]
        far = forward(near, w, b, 1, 2, 4, shift, programs, stages)[0]
        err, err_near = error(y, want), error(far, reference(near, w, b, dy)[0])
        print(f"forward shift={shift} programs={programs}: error {err:.1e},", end=" ")
        print(f"rows near 1000 {err_near:.1e}")
        assert err < 1e-2, err


BACKWARD_GRID = [
    dict(stats=s, rows=r, warps=w, per_sm=p, stages=st)
    for s, r, w, p, st in itertools.product((0, 1), (1, 2), (4, 8, 16), (1, 2), (1, 2, 3))
    if (r * 8 <= w * 32 or r == 1) and (s == 1 or (st == 1 and w >= 8))
]
# per_sm 0: one program a row block (_forward); else the persistent loop (_forward_loop,
# shift 2) on per_sm programs an SM, its loads pipelined over `stages`.
FORWARD_GRID = [
    dict(rows=r, warps=w, shift=sh, per_sm=0, stages=1)
    for r, w, sh in itertools.product((1, 2, 4), (4, 8, 16), (1, 2))
] + [
    dict(rows=r, warps=w, shift=2, per_sm=p, stages=st)
    for r, w, p, st in itertools.product((1, 2), (4, 8, 16), (1, 2), (1, 2, 3))
]


def shape_row(built: Path, m: int, n: int, rounds: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from quantized_chains import copies_for, graph_ms, load

    dev, dtype = "cuda", torch.bfloat16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    mod = load(built, "train_layernorm")
    copies = copies_for(3 * m * n * 2)
    sets = [inputs(m, n, dev, dtype) for _ in range(copies)]
    saved = []
    for x, w, b, _ in sets:
        _, mean, rstd = forward(x, w, b, 1, 1, 8)
        saved.append((mean, rstd))
    x0, w0, b0, dy0 = sets[0]
    out = {"shape": [m, n], "errors": {}, "backward": {}, "forward": {}}

    # Backward sweep alone (the stats from one forward; stats=0 ignores them).
    for c in BACKWARD_GRID:
        key = json.dumps(c)
        progs = c["per_sm"] * sms
        try:
            out["errors"][key] = errors_of(
                x0, w0, b0, dy0, c["stats"], c["rows"], c["warps"], progs, c["stages"]
            )
        except Exception as exc:  # noqa: BLE001
            out["errors"][key] = f"{type(exc).__name__}: {str(exc)[:120]}"
            continue

        def run(i, c=c, progs=progs):
            x, w, _, dy = sets[i % copies]
            mean, rstd = saved[i % copies]
            backward(dy, x, w, mean, rstd, c["stats"], c["rows"], c["warps"], progs, c["stages"])

        out["backward"][key] = graph_ms(run)
    want = reference(x0, w0, b0, dy0)[0]
    for c in FORWARD_GRID:
        fargs = (1, c["rows"], c["warps"], c["shift"], c["per_sm"] * sms, c["stages"])

        def fwd(i, fargs=fargs):
            x, w, b, _ = sets[i % copies]
            forward(x, w, b, *fargs)

        try:
            y, mean, rstd = forward(x0, w0, b0, *fargs)
        except Exception as exc:  # noqa: BLE001  (a config out of shared memory)
            out["errors"]["forward " + json.dumps(c)] = f"{type(exc).__name__}: {str(exc)[:120]}"
            continue
        out["errors"]["forward " + json.dumps(c)] = error(y, want)
        out["forward"][json.dumps(c)] = graph_ms(fwd)
    with torch.no_grad():  # the generated forward as inference calls it (no statistics)
        out["forward"]["generated"] = graph_ms(lambda i: mod.train_layernorm(*sets[i % copies][:3]))
    bad = {k: e for k, e in out["errors"].items() if not isinstance(e, float) or e > 1e-2}
    print(f"{m}x{n}: {len(out['errors']) - len(bad)} of {len(out['errors'])} configs (backward"
          " and forward) within 1e-2 of float64")  # fmt: skip
    for k, e in list(bad.items())[:4]:
        print("  wrong or failed:", k, e)
    for stats in (0, 1):
        ranked = sorted(
            (t, k) for k, t in out["backward"].items() if t and json.loads(k)["stats"] == stats
        )
        print(f"  backward, stats={stats}, best five (us):")
        for t, k in ranked[:5]:
            print(f"    {t * 1e3:7.1f}  {k}")
    print(f"  forward, generated (inference call): {out['forward']['generated'] * 1e3:.1f} us")
    ranked_f = sorted((t, k) for k, t in out["forward"].items() if t and k != "generated")
    for kind, keep in (("one block a program", 0), ("persistent", 1)):
        for t, k in [(t, k) for t, k in ranked_f if bool(json.loads(k)["per_sm"]) == keep][:3]:
            print(f"  forward with stats, {kind}: {t * 1e3:7.1f} us  {k}")

    # The steps, interleaved: generated, Liger, and the best variant of each kind.
    steps = {"generated": lambda i: step_generated(mod, sets[i % copies])}
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction

        def liger(i):
            x, w, b, dy = sets[i % copies]
            x, w, b = (t.requires_grad_() for t in (x, w, b))
            y = LigerLayerNormFunction.apply(x, w, b, EPS_VALUE)
            torch.autograd.grad(y, (x, w, b), dy)

        steps["liger"] = liger
    except ImportError as exc:
        print("  Liger not installed:", exc)
    fbest = json.loads(ranked_f[0][1])
    for stats in (0, 1):
        t, k = min(
            (t, k) for k, t in out["backward"].items() if t and json.loads(k)["stats"] == stats
        )
        c = json.loads(k)

        def variant(i, c=c):
            x, w, b, dy = sets[i % copies]
            _, mean, rstd = forward(
                x, w, b, c["stats"], fbest["rows"], fbest["warps"], fbest["shift"],
                fbest["per_sm"] * sms, fbest["stages"],
            )  # fmt: skip
            backward(dy, x, w, mean, rstd, c["stats"], c["rows"], c["warps"],
                     c["per_sm"] * sms, c["stages"])  # fmt: skip

        steps[f"variant stats={stats} {k}"] = variant
    times = {k: [] for k in steps}
    order = list(steps)
    for r in range(rounds):
        for k in order[r % len(order) :] + order[: r % len(order)]:
            times[k].append(graph_ms(steps[k]))
    least = 5 * m * n * 2  # x and y, then x, dy and dx
    print(f"  step (forward + backward), GPU us, {rounds} rounds interleaved:")
    for k, t in times.items():
        med = statistics.median(t)
        print(f"    {med * 1e3:7.1f} [{min(t) * 1e3:.1f}-{max(t) * 1e3:.1f}]"
              f" {least / med / 1e9:5.2f} TB/s  {k}")  # fmt: skip
    out["steps"] = times
    return out


def step_generated(mod, tensors):
    x, w, b, dy = tensors
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    y = mod.train_layernorm(x, w, b)
    torch.autograd.grad(y, (x, w, b), dy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--built", type=Path)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--shapes", nargs="+", default=["4096x8192", "4096x4096", "16384x4096"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.check:
        if os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("--check runs under TRITON_INTERPRET=1")
        check()
        return
    sys.path.insert(0, str(args.built))
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    results = []
    for shape in args.shapes:
        m, n = (int(v) for v in shape.split("x"))
        results.append(shape_row(args.built, m, n, args.rounds))
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
