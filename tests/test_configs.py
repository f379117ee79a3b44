"""Static config checks: every problem caught before anything compiles."""

import pytest

from fusegen import configs
from fusegen.ir import Config


def mm(**kw):
    base = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    return Config(**{**base, **kw})


def test_builtin_spaces_are_valid():
    for cfg in configs.MATMUL_SPACE:
        assert configs.problems(cfg, "matmul") == []
    for cfg in configs.GATED_SPACE:
        assert configs.problems(cfg, "matmul", weights=2) == []
    for cfg in configs.TMA_MATMUL_SPACE:
        assert configs.problems(cfg, "matmul", tma=True) == []
    for cfg in configs.TMA_GATED_SPACE:
        assert configs.problems(cfg, "matmul", weights=2, tma=True) == []
    for cfg in configs.ELEMENTWISE_SPACE:
        assert configs.problems(cfg, "elementwise") == []
    for cfg in configs.ROW_SPACE:
        assert configs.problems(cfg, "elementwise") == []
    for kind, cfg in configs.DEFAULTS.items():
        assert (
            configs.problems(
                cfg,
                "matmul" if kind in ("matmul", "gated") else "elementwise",
                weights=2 if kind == "gated" else 1,
            )
            == []
        )


@pytest.mark.parametrize("profile", configs.PROFILES)
@pytest.mark.parametrize("kind", ["matmul", "gated"])
def test_profile_spaces_are_valid(kind, profile):
    space, tma_space, default, tma_default = configs.profile_spaces(kind, profile)
    weights = 2 if kind == "gated" else 1
    assert space and tma_space
    for cfg in (*space, default):
        assert configs.problems(cfg, "matmul", weights=weights) == []
    for cfg in (*tma_space, tma_default):
        assert configs.problems(cfg, "matmul", weights=weights, tma=True) == []
    assert len(set(space)) == len(space) and len(set(tma_space)) == len(tma_space)


def test_far_larger_blocks():
    # At least twice the power of two covering the dim (and 16, tl.dot's smallest tile).
    assert configs.far_larger(128, 64) and not configs.far_larger(64, 64)
    assert not configs.far_larger(64, 40) and configs.far_larger(128, 40)
    assert not configs.far_larger(16, 1) and configs.far_larger(32, 3)
    assert configs.oversized(mm(BLOCK_K=256), {"BLOCK_K": 200}) == []
    assert configs.oversized(mm(BLOCK_K=256), {"BLOCK_K": 64, "BLOCK_M": None})


@pytest.mark.parametrize(
    "cfg, fragment",
    [
        (mm(BLOCK_M=96), "BLOCK_M = 96 is not a power of two"),
        (mm(BLOCK_K=8), "BLOCK_K = 8 is under 16"),
        (mm(num_warps=3), "num_warps = 3 must be one of"),
        (mm(num_stages=0), "num_stages = 0 must be 1 to 8"),
        (mm(GROUP_M=0), "GROUP_M = 0 must be at least 1"),
        (mm(BLOCK_M=256, BLOCK_N=256, BLOCK_K=128, num_stages=4), "shared memory"),
        (Config(BLOCK_M=64, BLOCK_N=64), "missing BLOCK_K, GROUP_M, num_warps, num_stages"),
    ],
)
def test_bad_matmul_configs(cfg, fragment):
    assert any(fragment in p for p in configs.problems(cfg, "matmul"))


def test_shared_memory_counts_every_weight_and_the_dtype():
    cfg = mm(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4)
    assert configs.smem_bytes(cfg, 2, 1) == 4 * (128 * 64 + 64 * 256) * 2
    assert configs.problems(cfg, "matmul", operand_bytes=2) == []
    assert configs.problems(cfg, "matmul", operand_bytes=2, weights=2) != []
    assert configs.problems(cfg, "matmul", operand_bytes=4) != []


def test_elementwise_configs():
    assert configs.problems(Config(BLOCK_M=4, BLOCK_N=1024, num_warps=8), "elementwise") == []
    assert (
        "not a setting"
        in configs.problems(
            Config(BLOCK_M=4, BLOCK_N=1024, BLOCK_K=16, num_warps=8), "elementwise"
        )[0]
    )
    assert (
        "largest tile"
        in configs.problems(Config(BLOCK_M=1024, BLOCK_N=2048, num_warps=8), "elementwise")[0]
    )
