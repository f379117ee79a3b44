"""How fast one GPU streams N bytes from memory into its SMs in one kernel, by N: the
ceiling a decode kernel's weight stream is held to (issue 31's int4 and int8 rows, whose
weights are 30-60 MB: too few for a kernel's start and tail to vanish in, as they do in
a large copy's 4.2 TB/s).

Variants at each size, GPU time of CUDA-graph replays (each call on its own copy of the
bytes, copies enough to exceed L2, so every call reads from memory):
    read      a Triton kernel that loads every 4-byte word once and keeps a sum a program
              (the least a weight-streaming kernel does), over its launch settings: words
              a load step (BLOCK), warps, programs an SM (a contiguous run of words each,
              or one BLOCK each: "tiles", as the decode kernels' grids are), and stages of
              loads in flight (tl.range's num_stages); every setting timed once, the best
              three then timed again in the alternating rounds
    copy      torch's device-to-device copy of half the bytes (it reads and writes them)
    sum       torch.sum of the bytes as int32 words (PyTorch's own reduction kernel)

    python3 benchmarks/experiments/stream_ceiling.py [--mb 29.4 61.5 235] [--rounds 5]
    TRITON_INTERPRET=1 python3 benchmarks/experiments/stream_ceiling.py --check
        (CPU: the read kernel's sums against torch's, odd sizes, every grid kind)

Defaults: 61.5 MB is the int4 SwiGLU's weights at decode (2 x 14336 x 4096 nibbles, bf16
scales and uint8 zero points a group of 128), 29.4 MB half of it, 235 MB the bf16
SwiGLU's weights: 3x the bf16 chain's time is reachable only if the first streams in a
third of the time the last takes.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from quantized_chains import copies_for, graph_ms, timed  # noqa: E402


@triton.jit
def _read(src, partial, n_words, words_per_program, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    start = pid * words_per_program
    end = tl.minimum(start + words_per_program, n_words)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for offset in tl.range(start, end, BLOCK, num_stages=STAGES):
        offs = offset + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < end, other=0)
    tl.store(partial + pid, tl.sum(acc, 0))


def read(src: torch.Tensor, partial: torch.Tensor, block: int, warps: int, programs: int,
         stages: int) -> torch.Tensor:  # fmt: skip
    """Launch _read over src's int32 words; programs 0: one BLOCK a program (tiles)."""
    words = src.numel()
    if programs == 0:
        per, grid = block, triton.cdiv(words, block)
    else:
        per = triton.cdiv(triton.cdiv(words, programs), block) * block
        grid = triton.cdiv(words, per)
    _read[(grid,)](src, partial, words, per, BLOCK=block, STAGES=stages, num_warps=warps)
    return partial[:grid]


SETTINGS = [  # (BLOCK, warps, programs an SM (0: tiles), stages)
    *itertools.product((2048, 4096, 8192), (4, 8), (1, 2, 4, 8), (1, 3)),
    *((block, warps, 0, 1) for block in (1024, 2048, 4096) for warps in (4, 8)),
]


def name(block, warps, per_sm, stages) -> str:
    grid = "tiles" if per_sm == 0 else f"{per_sm}/SM"
    return f"read {block}w {warps}warps {grid} {stages}st"


def measure(megabytes: float, rounds: int) -> None:
    n_bytes = int(megabytes * 1e6) // 16 * 16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copies = copies_for(n_bytes)
    srcs = [torch.randint(-(2**31), 2**31 - 1, (n_bytes // 4,), dtype=torch.int32, device="cuda")
            for _ in range(copies)]  # fmt: skip
    halves = [s.view(torch.uint8)[: n_bytes // 2] for s in srcs]
    dsts = [torch.empty_like(h) for h in halves]
    partial = torch.empty(n_bytes // 4096 + 8 * sms, dtype=torch.int32, device="cuda")

    def reader(block, warps, per_sm, stages):
        return lambda i: read(srcs[i % copies], partial, block, warps, per_sm * sms, stages)

    want = srcs[0].sum(dtype=torch.int64).item() % 2**32
    first = {}
    for setting in SETTINGS:
        got = read(srcs[0], partial, *setting[:2], setting[2] * sms, setting[3])
        assert got.sum(dtype=torch.int64).item() % 2**32 == want, setting  # every word read once
        first[setting] = graph_ms(reader(*setting))
    best = sorted(first, key=first.get)[:3]
    variants = {name(*s): reader(*s) for s in best}
    variants["copy (half, read + write)"] = lambda i: dsts[i % copies].copy_(halves[i % copies])
    variants["sum (torch)"] = lambda i: srcs[i % copies].sum()
    result = timed(variants, {}, rounds)
    print(f"{megabytes:g} MB ({n_bytes} bytes), {copies} copies; first pass best: "
          f"{', '.join(f'{name(*s)} {first[s] * 1e3:.1f} us' for s in best)}")  # fmt: skip
    for variant, times in result["ms"].items():
        med = statistics.median(times)
        print(f"  {variant:34s} {med * 1e3:7.2f} us [{min(times) * 1e3:.2f}-"
              f"{max(times) * 1e3:.2f}]  {n_bytes / med / 1e6:6.0f} GB/s")  # fmt: skip
    for note in result.get("notes", []):
        print(f"  note: {note}")


def check() -> int:
    """The read kernel's per-program sums add up to torch's sum of the words, every grid
    kind, at sizes that leave a partial last block and a partial last program."""
    torch.manual_seed(0)
    for words in (1, 1000, 4099, 3 * 2048 + 5):
        # Small words: the interpreter's sums refuse to wrap past int32 (a GPU's wrap).
        src = torch.randint(0, 2**16, (words,), dtype=torch.int32)
        want = src.sum(dtype=torch.int64).item() % 2**32
        partial = torch.full((64,), 7, dtype=torch.int32)
        for block, programs, stages in ((1024, 0, 1), (1024, 3, 1), (2048, 2, 3), (1024, 1, 3)):
            got = read(src, partial, block, 4, programs, stages).sum(dtype=torch.int64).item()
            assert got % 2**32 == want, (words, block, programs, stages)
    print("PASS: every word read once, every grid kind")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[29.4, 61.5, 235.0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="CPU, interpreter: the sums")
    args = parser.parse_args()
    if args.check:
        return check()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for megabytes in args.mb:
        measure(megabytes, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
