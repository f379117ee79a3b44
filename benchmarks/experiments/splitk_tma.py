"""Prototype for issue 3's two open leads, outside the generator so that one GPU call can
measure them before the generated TMA kernel changes (a kernel change makes every tuned
table stale, so it wants its re-tune in the same call):

- split-K in the persistent TMA kernel, for shapes with fewer output tiles than SMs
  (gelu 1000³: 64-128 tiles on 132 SMs): work units are (tile, K slice); each unit stores
  its fp32 partial sums, and the last of a tile's SPLIT_K units to arrive adds them in
  slice order (deterministic, like the pointer kernel's split-K) and runs the epilogue;
- tensor descriptors made on the host (HOST_DESC=1) instead of in the kernel: a sweep
  measured ~2 us less GPU time per launch (benchmarks/HISTORY.md, 2026-11-30, night).

The chain is the anchor's y = gelu_tanh(x @ w.T + b), tanh.approx on a GPU.

    python3 benchmarks/experiments/splitk_tma.py            # GPU: check and time, prints a table
    TRITON_INTERPRET=1 python3 benchmarks/experiments/splitk_tma.py --check  # CPU: correctness
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fusegen.tools import timing  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _gelu_tanh(x, FAST: tl.constexpr):
    if FAST:
        h = 0.5 * x
        t = tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;",
            "=r,r",
            [0.7978845608028654 * (x + 0.044715 * x * x * x)],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
        return h + h * t
    else:
        return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))


@triton.jit
def _finish(acc, b_ptr, out_ptr, offs_m, offs_n, M, N, stride_out_m, FAST: tl.constexpr):
    """The chain after the matmul, and the masked store."""
    b = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    acc = _gelu_tanh(acc + b[None, :], FAST)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = out_ptr + offs_m[:, None] * stride_out_m + offs_n[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _splitk_tma_kernel(
    x,
    w,
    b_ptr,
    out_ptr,
    partials_ptr,
    arrivals_ptr,
    M,
    N,
    K,
    stride_x_m,
    stride_w_n,
    stride_out_m,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PROGRAMS: tl.constexpr,
    HOST_DESC: tl.constexpr,
    FAST: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    if HOST_DESC:
        x_desc = x
        w_desc = w
    else:
        x_desc = tl.make_tensor_descriptor(
            x, shape=[M, K], strides=[stride_x_m, 1], block_shape=[BLOCK_M, BLOCK_K]
        )
        w_desc = tl.make_tensor_descriptor(
            w, shape=[N, K], strides=[stride_w_n, 1], block_shape=[BLOCK_N, BLOCK_K]
        )
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_steps, SPLIT_K)
    # A tile's SPLIT_K units are adjacent, so they run at once on neighbouring programs.
    for unit in tl.range(tl.program_id(0), num_pid_m * num_pid_n * SPLIT_K, PROGRAMS):
        tile_id = unit // SPLIT_K
        split = unit % SPLIT_K
        group_id = tile_id // (GROUP_M * num_pid_n)
        first_pid_m = group_id * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (tile_id % (GROUP_M * num_pid_n)) % group_size_m
        pid_n = (tile_id % (GROUP_M * num_pid_n)) // group_size_m
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_first = split * per_split
        for k in range(k_first, tl.minimum(k_first + per_split, k_steps)):
            x_tile = x_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            w_tile = w_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
            if DOT_UPCAST:
                x_tile = x_tile.to(tl.float32)
                w_tile = w_tile.to(tl.float32)
            acc = tl.dot(x_tile, w_tile.T, acc)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if SPLIT_K > 1:
            in_bounds = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            cells = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
            tl.store(partials_ptr + split * M * N + cells, acc, mask=in_bounds)
            tl.debug_barrier()  # every thread's partial sums are stored before the arrival
            arrived = tl.atomic_add(arrivals_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                tl.atomic_xchg(arrivals_ptr + tile_id, 0, sem="relaxed", scope="gpu")
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):
                    acc += tl.load(
                        partials_ptr + s * M * N + cells,
                        mask=in_bounds,
                        other=0.0,
                        cache_modifier=".cg",
                    )
                _finish(acc, b_ptr, out_ptr, offs_m, offs_n, M, N, stride_out_m, FAST)
        else:
            _finish(acc, b_ptr, out_ptr, offs_m, offs_n, M, N, stride_out_m, FAST)


def _scratch_allocator(size, alignment, stream):
    return torch.empty(
        size, device="cuda" if torch.cuda.is_available() else "cpu", dtype=torch.int8
    )


def make_launcher(x, w, b, config, programs):
    """A function of (x, w, b, out) launching one config; scratch made once per shape."""
    bm, bn, bk, warps, stages, split, host = config
    m, k = x.shape
    n = w.shape[0]
    device = x.device
    partials = torch.empty(max(split, 1) * m * n, device=device, dtype=torch.float32)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    arrivals = torch.zeros(tiles, device=device, dtype=torch.int32)
    grid = (min(tiles * split, programs),)
    fast = device.type == "cuda" and x.dtype in (torch.float16, torch.bfloat16)
    upcast = INTERPRETED and x.dtype == torch.bfloat16

    def launch(x, w, b, out):
        xa, wa = x, w
        if host:
            xa = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
            wa = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, bk])
        _splitk_tma_kernel[grid](
            xa, wa, b, out, partials, arrivals, m, n, k, x.stride(0), w.stride(0), out.stride(0),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, SPLIT_K=split, PROGRAMS=grid[0],
            HOST_DESC=host, FAST=fast, DOT_UPCAST=upcast, num_warps=warps, num_stages=stages,
        )  # fmt: skip
        return out

    return launch


def reference(x, w, b):
    return torch.nn.functional.gelu(x.double() @ w.double().T + b.double(), approximate="tanh")


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, SPLIT_K, host descriptors)
GPU_CONFIGS = [
    (bm, bn, bk, w, s, split, host)
    for (bm, bn, bk, w, s) in ((64, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3))
    for split in (1, 2, 4)
    for host in (0, 1)
]
GPU_SHAPES = [(1000, 1000, 1000), (2048, 1024, 2048), (4096, 1024, 4096), (512, 4096, 4096)]
CHECK_CONFIGS = [
    (32, 64, 32, 4, 1, split, host) for split in (1, 2, 3) for host in (0, 1)
]  # odd SPLIT_K: a last slice shorter than the others
CHECK_SHAPES = [(70, 96, 150), (33, 64, 200)]  # K: 16-byte rows, for the descriptors


def check(device, dtype, shapes, configs):
    """Every config against the float64 reference on fresh random inputs, outputs
    poisoned first; twice, so the arrival counters are shown to reset."""
    programs = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 4
    bad = []
    for (m, k, n), config in itertools.product(shapes, configs):
        if config[0] > m * 4 or config[1] > n * 4:
            continue
        for attempt in range(2):
            x = torch.randn(m, k, device=device, dtype=dtype)
            w = (torch.randn(n, k, device=device, dtype=dtype) / k**0.5).to(dtype)
            b = torch.randn(n, device=device, dtype=dtype)
            out = torch.full((m, n), float("nan"), device=device, dtype=dtype)
            make_launcher(x, w, b, config, programs)(x, w, b, out)
            exact = reference(x, w, b)
            error = ((out.double() - exact).norm() / exact.norm()).item()
            if not error < 2e-2:
                bad.append(((m, k, n), config, attempt, error))
    return bad


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="correctness only (CPU or GPU)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    triton.set_allocator(_scratch_allocator)
    if args.check or device == "cpu":
        dtype = torch.float16
        bad = check(device, dtype, CHECK_SHAPES, CHECK_CONFIGS)
        print("check:", "ok" if not bad else bad)
        sys.exit(1 if bad else 0)
    bad = check(device, torch.bfloat16, [(1000, 1000, 1000), (70, 96, 150)], GPU_CONFIGS)
    print("check:", "ok" if not bad else bad, flush=True)
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    for m, k, n in GPU_SHAPES:
        sets = [
            (
                torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16),
                torch.randn(n, device="cuda", dtype=torch.bfloat16),
                torch.empty(m, n, device="cuda", dtype=torch.bfloat16),
            )
            for _ in range(max(2, (512 << 20) // (2 * (m * k + n * k + m * n))))
        ]
        rotation = itertools.cycle(sets)

        def cublaslt(rotation=rotation):
            x, w, b, _ = next(rotation)
            return torch._addmm_activation(b, x, w.T, use_gelu=True)

        rows = [("cuBLASLt epilogue", cublaslt)]
        for config in GPU_CONFIGS:
            launch = make_launcher(*sets[0][:3], config, programs)
            rows.append(
                (str(config), lambda launch=launch, rotation=rotation: launch(*next(rotation)))
            )
        for name, fn in rows:
            try:
                graph = timing.graph_ms(fn)
                call = timing.do_bench_timer(fn)
                print(f"{m}x{k}x{n} {name:34} graph {graph:.4f} call {call:.4f}", flush=True)
            except Exception as exc:  # noqa: BLE001 - a prototype: report and go on
                print(f"{m}x{k}x{n} {name:34} failed: {str(exc).splitlines()[0][:100]}")


if __name__ == "__main__":
    main()
