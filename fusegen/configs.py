"""Kernel configurations: the built-in spaces, and the static checks every config passes.

Checks run before anything is compiled, so a bad block size is a spec error with a
location, not a Triton compile failure at a user's first call.
"""

from __future__ import annotations

from fusegen.ir import Config

# Shared memory a block may use on an H100/H200 (sm_90): 227 KiB.
SMEM_LIMIT_SM90 = 232_448
# Triton refuses tensors of more elements than this.
MAX_TENSOR_NUMEL = 1 << 20
WARPS = (1, 2, 4, 8, 16, 32)
MAX_STAGES = 8

KEYS = {
    "matmul": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"),
    "elementwise": ("BLOCK_M", "BLOCK_N", "num_warps"),
}


def _mm(bm, bn, bk, group, warps, stages) -> Config:
    return Config(
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, num_warps=warps, num_stages=stages
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

# The TMA kernel's spaces (sm_90+): the output tile also passes through shared memory,
# and thin tiles with long K steps keep many weight bytes in flight for decode-sized M.
TMA_MATMUL_SPACE = (
    _mm(128, 256, 64, 8, 8, 3),
    _mm(256, 128, 64, 8, 8, 3),
    _mm(128, 128, 64, 8, 8, 4),
    _mm(128, 128, 128, 8, 8, 3),
    _mm(64, 128, 64, 8, 4, 4),
    _mm(64, 64, 128, 8, 4, 4),
    _mm(16, 64, 256, 1, 4, 4),
    _mm(16, 32, 256, 1, 4, 6),
)
TMA_GATED_SPACE = (
    _mm(128, 128, 64, 8, 8, 3),
    _mm(128, 64, 64, 8, 4, 4),
    _mm(64, 128, 64, 8, 4, 4),
    _mm(64, 64, 128, 8, 4, 4),
    _mm(16, 64, 256, 1, 4, 3),
    _mm(16, 32, 256, 1, 4, 5),
)

DEFAULTS = {
    "matmul": _mm(128, 128, 64, 8, 8, 3),
    "gated": _mm(128, 64, 64, 8, 4, 4),
    "elementwise": _ew(4, 1024, 8),
}
SPACES = {"matmul": MATMUL_SPACE, "gated": GATED_SPACE, "elementwise": ELEMENTWISE_SPACE}
TMA_SPACES = {"matmul": TMA_MATMUL_SPACE, "gated": TMA_GATED_SPACE, "elementwise": ()}

# Under the Triton interpreter each tile operation costs about the same whatever its
# size (numpy does the work), so large tiles are much faster there: measured 34 s with
# 128x128 tiles and 6 s with 512x512 for one 7x4096x14336 matmul. Tests pick shapes
# larger than these blocks so that several tiles and masked edges still run.
INTERPRETER = {
    "matmul": _mm(32, 256, 256, 4, 4, 1),
    "gated": _mm(32, 256, 256, 4, 4, 1),
    "elementwise": _ew(16, 1024, 4),
}


def smem_bytes(config: Config, operand_bytes: int, weights: int, *, tma: bool = False) -> int:
    """Shared memory the pipelined mainloop stages: each stage holds one tile of `a`
    and one of each weight; on the TMA path the output tile is staged too."""
    a_tile = config.BLOCK_M * config.BLOCK_K
    b_tile = config.BLOCK_K * config.BLOCK_N
    out_tile = config.BLOCK_M * config.BLOCK_N if tma else 0
    return (config.num_stages * (a_tile + weights * b_tile) + out_tile) * operand_bytes


def _pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


def problems(
    config: Config, kind: str, *, weights: int = 1, operand_bytes: int = 2, tma: bool = False
) -> list[str]:
    """Why `config` cannot run for a kernel of `kind` ("matmul" | "elementwise"); [] if it can.

    `weights` is the number of matmul B operands (2 with a gate); `operand_bytes` the
    smallest element size the kernel is declared for.
    """
    out: list[str] = []
    values = dict(config.items())
    allowed = KEYS[kind]
    for key in values:
        if key not in allowed:
            out.append(
                f"{key} is not a setting of an {kind} kernel (settings: {', '.join(allowed)})"
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
        elif not out:
            smem = smem_bytes(config, operand_bytes, weights, tma=tma)
            if smem > SMEM_LIMIT_SM90:
                out.append(
                    f"needs {smem:,} bytes of shared memory at {operand_bytes}-byte operands, over "
                    f"the {SMEM_LIMIT_SM90:,} an H100/H200 block can have; use smaller blocks or "
                    f"fewer stages"
                )
    if values["num_warps"] not in WARPS:
        out.append(f"num_warps = {values['num_warps']} must be one of {', '.join(map(str, WARPS))}")
    if (
        kind == "elementwise"
        and not out
        and values["BLOCK_M"] * values["BLOCK_N"] > MAX_TENSOR_NUMEL
    ):
        out.append(
            f"BLOCK_M * BLOCK_N is over {MAX_TENSOR_NUMEL:,}, the largest tile Triton allows"
        )
    return out
