"""A build as a local repository of the `kernels` package (transformers' hub kernels):
`fusegen build --kernels-hub NAME` writes the kernel modules into the package NAME of the
variant folder build/torch-universal/ (pure Python and Triton: every torch and GPU), with
the variant's metadata.json, the package's __init__.py and its `layers` module.

`layers` holds a class for each layer transformers marks with
`@use_kernel_forward_from_hub(...)` that a kernel of the build computes, found from the
chains themselves (no spec syntax): an RMSNorm chain (`input`, then `rmsnorm` with a
weight, no offset) serves "RMSNorm"; a one-activation elementwise chain serves that
activation's layer ("SiLU", "GeluTanh", "NewGELU", "FastGELU", "GeLU"). A layer class
picks the build's kernel for the call's width (and eps) and dtype, else runs the math as
transformers' own layer does."""

from __future__ import annotations

import hashlib
import json
import re

from fusegen import __version__
from fusegen.ir import Kernel, RowStep, Step

HUB_NAME = re.compile(r"^[a-z][-a-z0-9]*[a-z0-9]$")  # the kernels package's rule for `name`
VARIANT = "torch-universal"  # loaded on every backend and torch version
# transformers' layer name -> the activation op it computes
ACTIVATION_LAYERS = {
    "SiLU": "silu",
    "GeluTanh": "gelu_tanh",
    "NewGELU": "gelu_tanh",
    "FastGELU": "gelu_tanh",
    "GeLU": "gelu",
}
MATH = {  # each op as transformers' layer computes it, for the calls no kernel takes
    "silu": "F.silu",
    "gelu_tanh": 'lambda x: F.gelu(x, approximate="tanh")',
    "gelu": "F.gelu",
}


def package_name(hub: str) -> str:
    return hub.replace("-", "_")


def hub_folder(hub: str) -> str:
    """The package folder, relative to the output folder."""
    return f"build/{VARIANT}/{package_name(hub)}"


def rms_norm_of(kernel: Kernel) -> tuple[int | None, float] | None:
    """(width, eps) where the kernel is y = rmsnorm(x) * weight and nothing else."""
    if kernel.matmul is not None or len(kernel.steps) != 1 or len(kernel.inputs) != 2:
        return None
    step = kernel.steps[0]
    params = dict(step.params) if isinstance(step, RowStep) else {}
    weight = kernel.inputs[1]
    if (
        not isinstance(step, RowStep)
        or step.op != "rmsnorm"
        or params.get("offset", 0.0) != 0.0
        or dict(step.operands) != {"weight": weight.name}
        or kernel.source != kernel.inputs[0].name
        or weight.dims != (kernel.col,)
    ):
        return None
    return _size(kernel, kernel.col), params["eps"]


def activation_of(kernel: Kernel) -> tuple[str, int | None] | None:
    """(op, width) where the kernel is one activation of its one input."""
    if kernel.matmul is not None or len(kernel.steps) != 1 or len(kernel.inputs) != 1:
        return None
    step = kernel.steps[0]
    if not isinstance(step, Step) or step.op not in ACTIVATION_LAYERS.values() or step.params:
        return None
    return step.op, _size(kernel, kernel.col)


def _size(kernel: Kernel, dim: str) -> int | None:
    return next(d.size for d in kernel.dims if d.name == dim)


def layers_context(hub: str, kernels: list[Kernel]) -> dict:
    """What layers.py.j2 prints: the modules it imports and, per layer, its kernels."""
    kernels = [k for k in kernels if isinstance(k, Kernel)]  # chains: not attention, losses
    norms = []
    for k in kernels:
        found = rms_norm_of(k)
        if found:
            norms.append({"module": k.name, "width": found[0], "eps": found[1]})
    activations = []
    for layer, op in ACTIVATION_LAYERS.items():
        serving = [
            {"module": k.name, "width": found[1]}
            for k in kernels
            if (found := activation_of(k)) and found[0] == op
        ]
        if serving:
            activations.append({"layer": layer, "op": op, "math": MATH[op], "kernels": serving})
    modules = sorted(
        {n["module"] for n in norms} | {k["module"] for a in activations for k in a["kernels"]}
    )
    return {
        "hub": hub,
        "version": __version__,
        "modules": modules,
        "norms": norms,
        "activations": activations,
    }


def metadata(hub: str, texts: list[str]) -> str:
    """The variant's metadata.json. Its id names the package in sys.modules: unique to
    this build's content, so two builds (or two versions of one) load side by side."""
    digest = hashlib.sha256("\0".join(sorted(texts)).encode()).hexdigest()[:16]
    fields = {
        "id": f"_fusegen_{package_name(hub)}_{digest}",
        "name": hub,
        "version": 1,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": "cuda"},
    }
    return json.dumps(fields, indent=2) + "\n"
