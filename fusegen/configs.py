"""Kernel configurations: the built-in spaces, and the static checks every config passes.

Checks run before anything is compiled, so a bad block size is a spec error with a
location, not a Triton compile failure at a user's first call.
"""

from __future__ import annotations

from fusegen.ir import Config

# Shared memory a block may use on an H100/H200 (sm_90): 227 KiB.
SMEM_LIMIT_SM90 = 232_448
# Local data share (LDS) a workgroup may use on AMD CDNA GPUs (MI200, MI300): 64 KiB.
LDS_LIMIT_CDNA = 65_536
TARGETS = ("nvidia", "amd")
# AMD compile options a matmul config may carry, and the values each takes.
AMD_OPTIONS = {
    "matrix_instr_nonkdim": (0, 16, 32),
    "waves_per_eu": tuple(range(9)),
    "kpack": (1, 2),
}
# Triton refuses tensors of more elements than this.
MAX_TENSOR_NUMEL = 1 << 20
WARPS = (1, 2, 4, 8, 16, 32)
MAX_STAGES = 8

KEYS = {
    "matmul": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"),
    "elementwise": ("BLOCK_M", "BLOCK_N", "num_warps"),
}
# Settings only the TMA kernel reads; a matmul config may set them (0 or 1), and the
# TMA kernel's default fills those it leaves out.
TMA_SWITCHES = ("FLATTEN", "WARP_SPECIALIZE", "EPILOGUE_SUBTILE")
# Programs per output tile in the pointer kernel (SPLIT_K): 1 (no split) to 16.
SPLITS = (1, 2, 4, 8, 16)


def _mm(bm, bn, bk, group, warps, stages, split=None) -> Config:
    return Config(
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=group,
        num_warps=warps,
        num_stages=stages,
        SPLIT_K=split,
    )


def _tma(bm, bn, bk, group, warps, stages, flatten, warp_specialize, subtile) -> Config:
    return Config(
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=group,
        num_warps=warps,
        num_stages=stages,
        FLATTEN=flatten,
        WARP_SPECIALIZE=warp_specialize,
        EPILOGUE_SUBTILE=subtile,
    )


def _amd(bm, bn, bk, group, warps, stages, nonkdim, waves, kpack) -> Config:
    return Config(
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=group,
        num_warps=warps,
        num_stages=stages,
        matrix_instr_nonkdim=nonkdim,
        waves_per_eu=waves,
        kpack=kpack,
    )


def _ew(bm, bn, warps) -> Config:
    return Config(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)


# The autotuning space for the portable (pointer) matmul kernel: large tiles for
# throughput, and thin ones (BLOCK_M 16-32, long BLOCK_K) for decode-sized M.
MATMUL_SPACE = (
    _mm(128, 256, 64, 8, 8, 3),
    _mm(256, 128, 64, 8, 8, 3),
    _mm(128, 128, 64, 8, 8, 4),
    _mm(128, 128, 32, 8, 4, 4),
    _mm(128, 64, 64, 8, 4, 4),
    _mm(64, 128, 64, 8, 4, 4),
    _mm(64, 64, 64, 8, 4, 4),
    _mm(32, 128, 128, 8, 4, 4),
    _mm(16, 128, 128, 1, 4, 4),
    _mm(16, 64, 256, 1, 4, 3),
    _mm(16, 32, 256, 1, 4, 4),
    _mm(16, 64, 128, 1, 4, 4, split=4),
    _mm(16, 128, 128, 1, 4, 3, split=4),
    _mm(16, 64, 256, 1, 4, 3, split=2),
)
# Two accumulators (a gate) double the registers a tile needs: no 128x256 tiles.
GATED_SPACE = (
    _mm(128, 128, 64, 8, 8, 3),
    _mm(128, 64, 64, 8, 4, 4),
    _mm(64, 128, 64, 8, 4, 4),
    _mm(128, 64, 32, 8, 4, 4),
    _mm(64, 64, 64, 8, 4, 4),
    _mm(32, 64, 128, 8, 4, 4),
    _mm(16, 128, 128, 1, 4, 3),
    _mm(16, 64, 256, 1, 4, 3),
    _mm(16, 32, 256, 1, 4, 4),
    _mm(16, 64, 128, 1, 4, 3, split=4),
    _mm(16, 32, 128, 1, 4, 4, split=4),
)
ELEMENTWISE_SPACE = (
    _ew(1, 1024, 4),
    _ew(1, 2048, 8),
    _ew(2, 1024, 4),
    _ew(4, 1024, 8),
    _ew(8, 512, 4),
    _ew(16, 256, 4),
    _ew(32, 128, 4),
    _ew(64, 64, 4),
)

# The TMA kernel's spaces (sm_90+). Measured on an H200 (bf16, 2026-11-30): for one
# GEMM chain, 128x256 tiles with a flattened, warp-specialized pipeline (8192x4096x14336:
# 1.346 ms against cuBLASLt's 1.434) or with a split epilogue store (4096x1024x4096:
# 0.066 ms); for the gated chain, 128x128 tiles without flattening and with the split
# store (8192x4096x14336: 2.84 ms; flattened: 3.66 ms), GROUP_M 16 measured 1.6% faster
# there than 8 on another H200 (2.978 vs 3.024 ms; benchmarks/experiments/sweep.py).
# Thin tiles serve decode-sized M.
TMA_MATMUL_SPACE = (
    _tma(128, 256, 64, 8, 8, 3, 1, 1, 0),
    _tma(128, 256, 64, 8, 8, 3, 1, 0, 0),
    _tma(128, 256, 64, 8, 8, 4, 1, 0, 1),
    _tma(128, 256, 64, 8, 8, 3, 1, 0, 1),
    _tma(256, 128, 64, 8, 8, 3, 1, 0, 1),
    _tma(128, 128, 64, 8, 8, 4, 1, 0, 0),
    _tma(64, 128, 64, 8, 4, 4, 0, 0, 0),
    _tma(16, 128, 128, 1, 4, 4, 0, 0, 0),
    _tma(16, 64, 128, 1, 4, 6, 0, 0, 0),
    _tma(16, 64, 256, 1, 4, 4, 0, 0, 0),
)
TMA_GATED_SPACE = (
    _tma(128, 128, 64, 8, 8, 3, 0, 0, 1),
    _tma(128, 128, 64, 16, 8, 3, 0, 0, 1),
    _tma(128, 128, 64, 8, 8, 4, 0, 0, 1),
    _tma(128, 128, 32, 8, 8, 4, 0, 0, 1),
    _tma(128, 128, 64, 8, 8, 3, 1, 1, 0),
    _tma(64, 128, 64, 8, 4, 4, 0, 0, 0),
    _tma(16, 128, 128, 1, 4, 3, 0, 0, 0),
    _tma(16, 64, 128, 1, 4, 6, 0, 0, 0),
    _tma(16, 64, 256, 1, 4, 3, 0, 0, 0),
)
TMA_DEFAULTS = {
    "matmul": _tma(128, 256, 64, 8, 8, 3, 1, 0, 1),
    "gated": _tma(128, 128, 64, 8, 8, 3, 0, 0, 1),
}

# Row ops (norms, softmax, reductions): one row per program for long rows, BLOCK_N up
# to 16384 elements held in registers; longer rows loop over BLOCK_N blocks twice.
# Fewer warps than elements/1024 can win where a row needs several reductions: LayerNorm
# on an H200 ran 16384x8192 in 0.152 ms with (1, 8192, 8 warps) against 0.180 for the
# best of the others, and 131072x1000 in 0.128 with (2, 1024, 4) against 0.145.
ROW_SPACE = (
    _ew(1, 1024, 4),
    _ew(1, 2048, 4),
    _ew(1, 2048, 8),
    _ew(1, 4096, 4),
    _ew(1, 4096, 8),
    _ew(1, 8192, 8),
    _ew(1, 8192, 16),
    _ew(1, 16384, 16),
    _ew(2, 1024, 4),
    _ew(4, 1024, 8),
    _ew(16, 256, 4),
)

DEFAULTS = {
    "matmul": _mm(128, 128, 64, 8, 8, 3),
    "gated": _mm(128, 64, 64, 8, 4, 4),
    "elementwise": _ew(4, 1024, 8),
    "row": _ew(1, 4096, 8),
}
SPACES = {
    "matmul": MATMUL_SPACE,
    "gated": GATED_SPACE,
    "elementwise": ELEMENTWISE_SPACE,
    "row": ROW_SPACE,
}
TMA_SPACES = {"matmul": TMA_MATMUL_SPACE, "gated": TMA_GATED_SPACE, "elementwise": (), "row": ()}

# Under the Triton interpreter each tile operation costs about the same whatever its
# size (numpy does the work), so large tiles are much faster there: measured 34 s with
# 128x128 tiles and 6 s with 512x512 for one 7x4096x14336 matmul. Tests pick shapes
# larger than these blocks so that several tiles and masked edges still run.
INTERPRETER = {
    "matmul": _mm(32, 256, 256, 4, 4, 1),
    "gated": _mm(32, 256, 256, 4, 4, 1),
    "elementwise": _ew(16, 1024, 4),
    "row": _ew(4, 1024, 4),
}


# Quantized chains (fusegen.lower.quant): one pointer kernel, tuned at run time over
# decode tiles (BLOCK_M 16, narrow columns, long K steps: the weight stream is the cost)
# and prefill tiles. BLOCK_K is cut to divide the scales' groups (QuantChain.configs).
QUANT_SPACE = (
    _mm(16, 32, 128, 1, 4, 4),
    _mm(16, 64, 128, 1, 4, 4),
    _mm(16, 32, 256, 1, 4, 3),
    _mm(16, 64, 256, 1, 4, 3),
    _mm(32, 64, 128, 4, 4, 4),
    _mm(64, 64, 128, 8, 4, 4),
    _mm(64, 64, 128, 8, 4, 3),  # QUANT_FP8_STEP_DEFAULT
    _mm(64, 128, 64, 8, 4, 4),
    _mm(128, 128, 64, 8, 8, 3),
    _mm(128, 128, 128, 8, 8, 3),
    _mm(128, 256, 64, 8, 8, 3),
    _mm(128, 256, 128, 8, 8, 3),
)
# Two accumulators a tile: no 128 x 256 tiles.
QUANT_GATED_SPACE = tuple(c for c in QUANT_SPACE if c.BLOCK_M * c.BLOCK_N <= 128 * 128)
# Decode tiles with SPLIT_K programs a tile: more loads in flight where few tiles cover
# the output (the runtime tries them up to its SPLIT_ROWS rows).
QUANT_SPLIT_SPACE = (
    _mm(16, 32, 128, 1, 4, 4, split=2),
    _mm(16, 32, 128, 1, 4, 4, split=4),
    _mm(16, 64, 128, 1, 4, 4, split=4),
    _mm(32, 64, 128, 1, 4, 4, split=4),
)
QUANT_DEFAULT = _mm(64, 128, 64, 8, 4, 3)
# fp8 dots whose scales change along K: one scale group a K step (a dot the scales wait
# on: half-group steps ran 2-4x slower), within the 99 KB of shared memory sm_89 gives.
# DeepSeek-V3's SwiGLU at 4096 x 7168 -> 18432, H200: 3.06 ms, the fastest tile measured
# (64 x 128 x 128 at 2 stages 3.35, 128 x 128 x 128 at 3 stages 3.30, in the same run).
QUANT_FP8_STEP_DEFAULT = _mm(64, 64, 128, 8, 4, 3)
# One row of x against int8 / int4 weights, on the CUDA cores (BLOCK_M 1: QuantChain.gemv);
# the fastest of a 36-config sweep at 1 x 4096 -> 14336 int4 (H200), split-K for short N.
QUANT_GEMV_SPACE = (
    _mm(1, 16, 1024, 1, 4, 1),
    _mm(1, 8, 1024, 1, 2, 1),
    _mm(1, 16, 512, 1, 2, 1),
    _mm(1, 32, 512, 1, 4, 1),
    _mm(1, 32, 1024, 1, 4, 1),
    _mm(1, 8, 1024, 1, 2, 1, split=2),
    _mm(1, 16, 1024, 1, 4, 1, split=4),
)
QUANT_GEMV_INTERPRETER = _mm(1, 16, 64, 1, 4, 1)
QUANT_INTERPRETER = _mm(32, 64, 64, 1, 4, 1)


# `autotune: {profile: ...}` keeps part of a built-in matmul space: "training" the
# throughput tiles (BLOCK_M >= 64), "inference" the latency ones (BLOCK_M <= 64) plus
# deeper pipelines for decode-sized M, where the weights' stream is the whole cost.
PROFILES = ("general", "training", "inference")
INFERENCE_EXTRA = {
    "matmul": (_mm(16, 64, 128, 1, 4, 6), _mm(32, 64, 128, 4, 4, 5)),
    "gated": (_mm(16, 64, 128, 1, 4, 5), _mm(32, 32, 128, 4, 4, 5)),
}
INFERENCE_TMA_EXTRA = {
    "matmul": (_tma(16, 128, 128, 1, 4, 6, 0, 0, 0), _tma(32, 128, 128, 4, 4, 5, 0, 0, 0)),
    "gated": (_tma(32, 64, 128, 4, 4, 5, 0, 0, 0),),
}
INFERENCE_DEFAULTS = {"matmul": _mm(64, 128, 64, 8, 4, 4), "gated": _mm(32, 64, 128, 8, 4, 4)}
INFERENCE_TMA_DEFAULTS = {
    "matmul": _tma(64, 128, 64, 8, 4, 4, 0, 0, 0),
    "gated": _tma(64, 128, 64, 8, 4, 4, 0, 0, 0),
}


# AMD (ROCm, CDNA): no TMA kernel. Triton's AMD pipeliner with num_stages = 2 prefetches
# the next tiles into registers and keeps one set in LDS, so 64 KiB holds a 256x256x64
# bf16 pair. MFMA 16x16 instructions (matrix_instr_nonkdim 16) suit every tile here;
# kpack 2 packs bf16/fp16 operands for the MFMA; waves_per_eu hints occupancy. After
# the configs AMD's Triton tuning guide gives for MI300; not measured here (no AMD GPU).
AMD_MATMUL_SPACE = (
    _amd(256, 256, 64, 4, 8, 2, 16, 2, 2),
    _amd(128, 256, 64, 4, 8, 2, 16, 2, 2),
    _amd(256, 128, 64, 4, 8, 2, 16, 2, 2),
    _amd(128, 128, 64, 8, 4, 2, 16, 0, 2),
    _amd(64, 128, 64, 8, 4, 2, 16, 0, 1),
    _amd(32, 64, 128, 1, 4, 2, 16, 0, 1),
    _amd(16, 64, 256, 1, 4, 2, 16, 0, 1),
)
AMD_GATED_SPACE = (
    _amd(128, 128, 64, 8, 8, 2, 16, 2, 2),
    _amd(128, 64, 64, 8, 4, 2, 16, 0, 2),
    _amd(64, 64, 64, 8, 4, 2, 16, 0, 1),
    _amd(16, 64, 128, 1, 4, 2, 16, 0, 1),
)
AMD_DEFAULTS = {
    "matmul": _amd(128, 128, 64, 8, 4, 2, 16, 0, 2),
    "gated": _amd(128, 64, 64, 8, 4, 2, 16, 0, 2),
}


# Which configs of a built-in matmul space a profile keeps, by their row tile.
PROFILE_KEEPS = {"training": lambda c: c.BLOCK_M >= 64, "inference": lambda c: c.BLOCK_M <= 64}


def profile_spaces(
    kind: str, profile: str, target: str = "nvidia"
) -> tuple[tuple[Config, ...], tuple[Config, ...], Config, Config | None]:
    """The built-in (space, TMA space, default, TMA default) of a kernel kind under a
    profile and target. Elementwise and row kernels have one space: the profile leaves
    them be."""
    if kind not in ("matmul", "gated"):
        return SPACES[kind], TMA_SPACES[kind], DEFAULTS[kind], TMA_DEFAULTS.get(kind)
    keep = PROFILE_KEEPS.get(profile, lambda c: True)
    if target == "amd":
        space = AMD_MATMUL_SPACE if kind == "matmul" else AMD_GATED_SPACE
        return tuple(filter(keep, space)), (), AMD_DEFAULTS[kind], None
    space = tuple(filter(keep, SPACES[kind]))
    tma_space = tuple(filter(keep, TMA_SPACES[kind]))
    if profile != "inference":
        return space, tma_space, DEFAULTS[kind], TMA_DEFAULTS[kind]
    return (
        space + INFERENCE_EXTRA[kind],
        tma_space + INFERENCE_TMA_EXTRA[kind],
        INFERENCE_DEFAULTS[kind],
        INFERENCE_TMA_DEFAULTS[kind],
    )


def far_larger(block: int, size: int) -> bool:
    """Whether a block is at least twice the power of two covering `size` (and 16, the
    smallest tile tl.dot takes): such a tile only adds masked-out work. The generated
    launcher prunes by the same rule at run time."""
    covering = 1 << max(size - 1, 0).bit_length()
    return block >= 2 * max(16, covering)


def oversized(config: Config, sizes: dict[str, int | None]) -> list[str]:
    """The blocks of `config` far larger than the static dims in `sizes`
    ({"BLOCK_M": rows, ...}; None where the dim is dynamic)."""
    values = dict(config.items())
    return [
        f"{block} = {values[block]} is far larger than the dim it tiles ({size}); "
        f"a block of {max(16, 1 << max(size - 1, 0).bit_length())} covers it, with less "
        "masked-out work"
        for block, size in sizes.items()
        if size is not None and block in values and far_larger(values[block], size)
    ]


def smem_bytes(
    config: Config,
    operand_bytes: int,
    weights: int,
    *,
    tma: bool = False,
    full_operand: bool = False,
) -> int:
    """Shared memory a matmul config needs: each pipeline stage holds one tile of `a` and
    one of each weight; the TMA path stages the output tile; and a full-tile epilogue
    operand costs an fp32 tile of scratch (triton reshapes the accumulator for it;
    measured on an H200: a residual add took 128x256 tiles over the limit)."""
    a_tile = config.BLOCK_M * config.BLOCK_K
    b_tile = config.BLOCK_K * config.BLOCK_N
    out_tile = config.BLOCK_M * config.BLOCK_N * operand_bytes if tma else 0
    if config.EPILOGUE_SUBTILE:
        out_tile //= 2  # stored in two halves
    scratch = config.BLOCK_M * config.BLOCK_N * 4 if full_operand else 0
    return config.num_stages * (a_tile + weights * b_tile) * operand_bytes + out_tile + scratch


def _pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


def lds_bytes(config: Config, operand_bytes: int, weights: int) -> int:
    """LDS an AMD matmul config needs: Triton's AMD pipeliner keeps num_stages - 1 sets
    of tiles there (at least one) and prefetches the next into registers."""
    tiles = config.BLOCK_M * config.BLOCK_K + weights * config.BLOCK_K * config.BLOCK_N
    return max(1, config.num_stages - 1) * tiles * operand_bytes


def problems(
    config: Config,
    kind: str,
    *,
    weights: int = 1,
    operand_bytes: int = 2,
    tma: bool = False,
    full_operand: bool = False,
    target: str = "nvidia",
) -> list[str]:
    """Why `config` cannot run for a kernel of `kind` ("matmul" | "elementwise"); [] if it can.

    `weights` is the number of matmul B operands (2 with a gate); `operand_bytes` the
    smallest element size the kernel is declared for.
    """
    out: list[str] = []
    values = dict(config.items())
    allowed = KEYS[kind]
    amd = target == "amd"
    switches = tuple(AMD_OPTIONS) if amd else TMA_SWITCHES
    optional = (*switches, "SPLIT_K") if kind == "matmul" else ()
    for key in values:
        if key == "SPLIT_K" and kind == "matmul":
            if values[key] not in SPLITS:
                out.append(f"SPLIT_K = {values[key]} must be one of {', '.join(map(str, SPLITS))}")
        elif key in AMD_OPTIONS and key in optional:
            if values[key] not in AMD_OPTIONS[key]:
                valid = ", ".join(map(str, AMD_OPTIONS[key]))
                out.append(f"{key} = {values[key]} must be one of {valid}")
        elif key in (*AMD_OPTIONS, *TMA_SWITCHES) and key not in optional and kind == "matmul":
            other = "nvidia" if amd else "amd"
            out.append(f"{key} is a setting for target {other}, not {target}")
        elif key in optional:
            if values[key] not in (0, 1):
                out.append(f"{key} = {values[key]} must be 0 or 1")
        elif key not in allowed:
            out.append(
                f"{key} is not a setting of an {kind} kernel "
                f"(settings: {', '.join(allowed + optional)})"
            )
    missing = [k for k in allowed if k not in values]
    if missing:
        out.append(f"missing {', '.join(missing)}")
    if out:
        return out
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        if key in values and not _pow2(values[key]):
            out.append(
                f"{key} = {values[key]} is not a power of two (Triton's tl.arange needs one)"
            )
    if kind == "matmul":
        for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            if _pow2(values[key]) and values[key] < 16:
                out.append(f"{key} = {values[key]} is under 16, the smallest tile tl.dot takes")
        if values["GROUP_M"] < 1:
            out.append(f"GROUP_M = {values['GROUP_M']} must be at least 1")
        if not 1 <= values["num_stages"] <= MAX_STAGES:
            out.append(f"num_stages = {values['num_stages']} must be 1 to {MAX_STAGES}")
        elif not out and amd:
            lds = lds_bytes(config, operand_bytes, weights)
            if lds > LDS_LIMIT_CDNA:
                out.append(
                    f"needs {lds:,} bytes of LDS at {operand_bytes}-byte operands, over the "
                    f"{LDS_LIMIT_CDNA:,} an AMD CDNA workgroup can have; use smaller blocks"
                )
        elif not out:
            smem = smem_bytes(config, operand_bytes, weights, tma=tma, full_operand=full_operand)
            if smem > SMEM_LIMIT_SM90:
                out.append(
                    f"needs {smem:,} bytes of shared memory at {operand_bytes}-byte operands, over "
                    f"the {SMEM_LIMIT_SM90:,} an H100/H200 block can have; use smaller blocks or "
                    f"fewer stages"
                )
    warps = WARPS[:-1] if amd else WARPS  # 64-lane wavefronts: 16 fill a 1024-thread block
    if values["num_warps"] not in warps:
        out.append(f"num_warps = {values['num_warps']} must be one of {', '.join(map(str, warps))}")
    if (
        kind == "elementwise"
        and not out
        and values["BLOCK_M"] * values["BLOCK_N"] > MAX_TENSOR_NUMEL
    ):
        out.append(
            f"BLOCK_M * BLOCK_N is over {MAX_TENSOR_NUMEL:,}, the largest tile Triton allows"
        )
    return out
