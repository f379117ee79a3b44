"""The launcher's own tuning (no tuned table) on a GPU: what it picks at decode and
prefill rows, how long it takes, and its graph timer against triton's do_bench for the
chosen config. Usage: python3 benchmarks/autotune_check.py (GPU; run from the repo root)."""

import logging
import sys
import time

import torch
from triton.testing import do_bench

sys.path.insert(0, "generated")
import gpt2_mlp_up as m  # noqa: E402

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
m._KERNELS.table["entries"] = []  # as if no table: the launcher tunes
w = torch.randn(768, 3072, device="cuda", dtype=torch.bfloat16) / 30
b = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
for rows in (7, 16, 4096):
    x = torch.randn(rows, 768, device="cuda", dtype=torch.bfloat16)
    started = time.perf_counter()
    m.gpt2_mlp_up(x, w, b)
    torch.cuda.synchronize()
    launch = m.last_launch()
    print(f"rows {rows}: first call {time.perf_counter() - started:.2f} s: {launch}")
    config = launch["config"]
    call = lambda x=x, config=config: m.gpt2_mlp_up(x, w, b, config=config)  # noqa: E731
    graph = m._rt.graph_bench(call)
    print(
        f"  graph timer {graph[0]:.4f} ms, do_bench {do_bench(call, return_mode='median'):.4f} ms"
    )
