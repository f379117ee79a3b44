"""Decode attention (one query per sequence against a KV cache) over the forward's decode
config and the key split: DECODE_CONFIG, SPLIT_PROGRAMS_PER_SM and SPLIT_MIN_KEYS,
against SDPA, on GPU time (CUDA graph replay) at several cache lengths and batches.

    fusegen build benchmarks/specs/call_cost.yaml --out BUILD
    python3 benchmarks/experiments/decode_split.py BUILD [--module qwen2_attention]

Prints, per shape, SDPA's time, the module's defaults' and the ten fastest settings.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fusegen.tools.timing import graph_ms  # noqa: E402  (torch-free until it runs)

SHAPES = [(16, 2048), (16, 8192), (1, 8192), (64, 1024)]  # (sequences, cached keys)
CONFIGS = [(16, 32, 4, 3), (16, 64, 4, 3), (16, 64, 4, 4), (16, 128, 4, 3), (16, 64, 2, 3)]
PER_SM = [1, 2, 4, 8]
MIN_KEYS = [64, 128, 256]


def gpu_us(fn):
    """GPU time per call (us) from replaying a CUDA graph of the calls: bench's graph timer."""
    ms = graph_ms(fn)
    return float("nan") if ms is None else ms * 1e3  # NaN: the call cannot be captured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--module", default="qwen2_attention")
    args = parser.parse_args()
    path = args.folder / f"{args.module}.py"
    spec = importlib.util.spec_from_file_location(args.module, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[args.module] = module
    spec.loader.exec_module(module)
    launcher = getattr(module, args.module)
    defaults = (module.DECODE_CONFIG, module.SPLIT_PROGRAMS_PER_SM, module.SPLIT_MIN_KEYS)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    with torch.no_grad():
        for batch, keys in SHAPES:
            q = torch.randn(batch, 1, module.HEADS, module.HEAD_DIM, **bf16)
            k, v = (
                torch.randn(batch, keys, module.KV_HEADS, module.HEAD_DIM, **bf16) for _ in "kv"
            )
            t = [x.transpose(1, 2) for x in (q, k, v)]
            want = F.scaled_dot_product_attention(*t, enable_gqa=True).transpose(1, 2)
            sdpa = gpu_us(lambda t=t: F.scaled_dot_product_attention(*t, enable_gqa=True))
            found = []
            for config, per_sm, min_keys in itertools.product(CONFIGS, PER_SM, MIN_KEYS):
                module.DECODE_CONFIG, module.SPLIT_PROGRAMS_PER_SM = config, per_sm
                module.SPLIT_MIN_KEYS = min_keys
                module._ATTENTION.plans.clear()
                try:
                    error = (launcher(q, k, v).float() - want.float()).abs().max().item()
                    if error > 2e-2:
                        print("wrong", config, per_sm, min_keys, error)
                        continue
                    plan = module._ATTENTION.forward_plan(q.device, batch, 1, keys, q.dtype)
                    us = gpu_us(lambda q=q, k=k, v=v: launcher(q, k, v))
                    found.append((us, config, per_sm, min_keys, plan[2]))
                except Exception as exc:  # a config this GPU cannot run: a result
                    print("failed", config, per_sm, min_keys, type(exc).__name__)
            found.sort()
            default = [f for f in found if f[1:4] == defaults]
            print(f"{batch}x1 vs {keys} keys: sdpa {sdpa:.1f} us; defaults {default[0][0]:.1f} us"
                  f" ({default[0][4]} splits)")  # fmt: skip
            for us, config, per_sm, min_keys, splits in found[:10]:
                print(
                    f"    {us:6.1f} us  {config} per_sm {per_sm} min_keys {min_keys}: "
                    f"{splits} splits"
                )
    module.DECODE_CONFIG, module.SPLIT_PROGRAMS_PER_SM, module.SPLIT_MIN_KEYS = defaults
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
