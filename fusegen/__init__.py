"""fusegen: describe a fused op chain in YAML; get an autotuned Triton kernel, its PyTorch
reference and equivalence tests, as modules to commit."""

__version__ = "0.1.0"
