"""fusegen/attention_text.py: what the attention modules print that is worked out in Python."""

from pathlib import Path

import pytest

from fusegen.codegen import attention_text


def bloom_slopes(heads):
    """ALiBi's slopes as BLOOM's code writes them (a geometric series from 2**(-8/n) for
    the power of two n at or below heads; the rest every other one of 2n's)."""

    def series(n):
        start = 2 ** (-(2 ** -(n.bit_length() - 1 - 3)))
        return [start ** (i + 1) for i in range(n)]

    below = 1 << (heads.bit_length() - 1)
    return series(below) + series(2 * below)[0::2][: heads - below]


@pytest.mark.parametrize("heads", [1, 2, 6, 8, 12, 32, 40])
def test_alibi_slopes_are_bloom_s(heads):
    assert attention_text.alibi_slopes(heads) == pytest.approx(bloom_slopes(heads), rel=1e-12)


def test_alibi_slopes_by_hand():
    assert attention_text.alibi_slopes(8) == [2.0**-e for e in range(1, 9)]
    assert attention_text.alibi_slopes(6) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]


H200_SHARED = 232448  # bytes a block may take (sharedMemPerBlockOptin)


def one_stage_bytes(config, kernel, dim, element):
    """A lower bound of a kernel's shared memory at one stage: the tile it keeps (the
    forward's q; dk/dv's k and v; dq's q and d_out) and one step's streamed tiles."""
    block_m, block_n = config[:2]
    kept, streamed = {"forward": (block_m, 2 * block_n), "kv": (2 * block_n, 2 * block_m)}.get(
        kernel, (2 * block_m, 2 * block_n)
    )
    return (kept + streamed) * dim * element


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_fp32_tiles_fit_where_16_bit_ones_need_not(dim):
    fp32 = attention_text.FP32_CONFIGS[dim]
    for kernel, config in fp32.items():
        assert one_stage_bytes(config, kernel, dim, 4) < H200_SHARED, (dim, kernel)
    if dim == 256:  # why fp32 has tiles of its own: the 16-bit forward's need 256 KB
        assert one_stage_bytes(attention_text.CONFIGS[256], "forward", 256, 4) > H200_SHARED


@pytest.mark.parametrize("dim", [32, 48, 64, 80, 96, 112, 128, 192, 256])
def test_a_masked_score_times_the_base_2_factor_is_exact(dim):
    # The probabilities take exp2(scores * factor - max) as one fused multiply-add, max
    # being the rounded product: a masked row's exponent is the product's rounding error,
    # which -1e30 left at +8e20 at head dim 64 (exp2 inf, out NaN on the GPU).
    np = pytest.importorskip("numpy")
    from fractions import Fraction

    from fusegen.runtime import attention_hopper

    factor = np.float32(dim**-0.5 * attention_text.LOG2E)
    masked = np.float32(attention_text.MASKED_SCORE)
    assert float(masked) == attention_text.MASKED_SCORE
    rounded = np.float32(masked * factor)
    assert Fraction(float(masked)) * Fraction(float(factor)) == Fraction(float(rounded))
    # The Gluon forward's mask is the same number.
    source = Path(attention_hopper.__file__).read_text()
    assert f"MASKED: gl.constexpr = {float(masked)!r}".replace("e+", "e") in source
