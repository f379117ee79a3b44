"""First-call cost of the generated launchers on a GPU, each in a fresh process with an
empty Triton cache: with the committed tuned table (compilation only) and without it
(runtime tuning).

    python3 benchmarks/first_call.py [ROWS] [--no-table]

Prints one line per example kernel: where its config came from and the first and
second calls' times.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = r"""
import importlib.util, sys, time, torch
sys.path.insert(0, {root!r})
from fusegen import bench, build
name, rows, no_table = {name!r}, {rows}, {no_table}
kernel = next(k for k in build.load(build.collect(["specs"])).kernels if k.name == name)
spec = importlib.util.spec_from_file_location(name, {root!r} + f"/generated/{{name}}.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
if no_table:
    module._TABLE["entries"] = []
try:
    sizes = bench.shape_dims(kernel, bench.row_shapes(kernel, [rows])[0])
except ValueError as exc:
    print(f"{{name}}: skipped ({{exc}})")
    raise SystemExit(0)
inputs = bench.make_inputs(torch, kernel, sizes, torch.bfloat16, "cuda", 0)
torch.cuda.synchronize()
times = []
for _ in range(2):
    start = time.perf_counter()
    getattr(module, name)(**inputs)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
launch = module.last_launch()
print(f"{{name}} rows={{rows}}: {{launch['source']}} {{launch['path']}}: first call "
      f"{{times[0]:.2f}} s, second {{times[1] * 1e3:.2f}} ms", flush=True)
"""


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 4096
    no_table = "--no-table" in sys.argv
    names = sorted(
        p.stem for p in (ROOT / "generated").glob("*.py") if not p.stem.startswith("test_")
    )
    for name in names:
        with tempfile.TemporaryDirectory() as cache:
            code = CHILD.format(root=str(ROOT), name=name, rows=rows, no_table=no_table)
            subprocess.run(
                [sys.executable, "-c", code],
                cwd=ROOT,
                env={**os.environ, "TRITON_CACHE_DIR": cache},
                check=False,
            )


if __name__ == "__main__":
    main()
