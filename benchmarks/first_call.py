"""First-call cost of the generated launchers on a GPU, each call in a fresh process with
an empty Triton cache: with the committed tuned table (compilation only) or without it
(--no-table: runtime tuning, what a shape no table covers costs).

    python3 benchmarks/first_call.py [--no-table] [--rows 16,4096]
    python3 benchmarks/first_call.py --spec benchmarks/specs/anchors.yaml \
        --kernels anchor_gelu --shapes 8192,4096,14336 16,4096,14336

Without --spec: the example kernels (specs/, their modules in generated/). A spec
elsewhere is rendered into a temporary folder (no table: it tunes). Prints one line per
kernel and shape: where its config came from, the first and second calls' times.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = r"""
import sys, tempfile, time
from pathlib import Path
import torch
sys.path.insert(0, {root!r})
from fusegen import build
from fusegen.tools import bench
spec, name, shape, no_table = {spec!r}, {name!r}, {shape!r}, {no_table}
kernel = next(k for k in build.load(build.collect([spec])).kernels if k.name == name)
examples = Path({root!r}, "specs").resolve() in (Path(spec).resolve(), Path(spec).resolve().parent)
folder = tempfile.mkdtemp()
if examples:
    module = bench.import_file(Path({root!r}, "generated", name + ".py"), "first_call_" + name)
else:
    module = bench.load_module(kernel, Path(folder))
if no_table:
    module._KERNELS.table["entries"] = []
sizes = bench.shape_dims(kernel, shape)
inputs = bench.make_inputs(torch, kernel, sizes, torch.bfloat16, "cuda", 0)
torch.cuda.synchronize()
times = []
for _ in range(2):
    start = time.perf_counter()
    getattr(module, name)(**inputs)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
launch = module.last_launch()
print(f"{{name}} {{'x'.join(map(str, shape))}}: {{launch['source']}} {{launch['path']}} "
      f"{{launch['config']}}: first call {{times[0]:.2f}} s, second {{times[1] * 1e3:.3f}} ms",
      flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default=str(ROOT / "specs"))
    parser.add_argument("--kernels", nargs="+")
    parser.add_argument("--rows", default="16,4096")
    parser.add_argument("--shapes", nargs="+")
    parser.add_argument("--no-table", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from fusegen import build
    from fusegen.tools import bench

    kernels = build.load(build.collect([args.spec])).kernels
    rows = [int(r) for r in args.rows.split(",")]
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes else None
    for kernel in kernels:
        if args.kernels and kernel.name not in args.kernels:
            continue
        try:
            wanted = bench.kernel_shapes(kernel, shapes, None if shapes else rows)
        except ValueError:  # dims other than the rows are dynamic: the anchor shapes
            wanted = bench.kernel_shapes(kernel)
        for shape in wanted:
            with tempfile.TemporaryDirectory() as cache:
                code = CHILD.format(
                    root=str(ROOT),
                    spec=args.spec,
                    name=kernel.name,
                    shape=shape,
                    no_table=args.no_table,
                )
                subprocess.run(
                    [sys.executable, "-c", code],
                    cwd=ROOT,
                    env={**os.environ, "TRITON_CACHE_DIR": cache},
                    check=False,
                )


if __name__ == "__main__":
    main()
