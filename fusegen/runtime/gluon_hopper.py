"""The Gluon names (Triton's lower-level language) the Hopper kernels import, in one
place: attention_hopper, attention_hopper_backward and quant_hopper. AVAILABLE is False
on a Triton without Gluon, and the callers run their `tl` kernels instead."""

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    AVAILABLE = True
except ImportError:
    AVAILABLE = False

__all__ = [
    "AVAILABLE",
    "TensorDescriptor",
    "fence_async_shared",
    "gl",
    "gluon",
    "mbarrier",
    "tma",
    "warpgroup_mma",
    "warpgroup_mma_wait",
]
