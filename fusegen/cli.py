"""The `fusegen` command.

Exit status: 0 done; 1 `build --check` found generated files missing or out of date;
2 the specs have errors (each printed as file:line:col: path: message) or the command
line is wrong. On errors nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fusegen import __version__, build, schema, writer
from fusegen.errors import SpecErrors


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusegen",
        description="Generate fused Triton kernels, PyTorch references and tests from YAML specs.",
    )
    parser.add_argument("--version", action="version", version=f"fusegen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("build", help="generate kernel and test modules from specs")
    b.add_argument(
        "specs", nargs="+", metavar="SPEC_OR_DIR", help="spec files, or folders of *.yaml specs"
    )
    b.add_argument(
        "--out", default="generated", metavar="DIR", help="where to write (default: generated)"
    )
    b.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if any generated file is missing or differs",
    )

    v = sub.add_parser("validate", help="check specs and print their errors; write nothing")
    v.add_argument("specs", nargs="+", metavar="SPEC_OR_DIR")

    sub.add_parser(
        "schema", help="print the spec's JSON Schema (for editors' YAML language servers)"
    )

    bench = sub.add_parser(
        "bench", help="time the kernels against eager, torch.compile and cuBLASLt (needs a GPU)"
    )
    bench.add_argument("specs", nargs="+", metavar="SPEC_OR_DIR")
    bench.add_argument(
        "--shapes",
        nargs="+",
        metavar="M,K,N",
        help="matmul shapes M,K,N and elementwise shapes M,N (default: the anchor shapes)",
    )
    bench.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    bench.add_argument("--kernels", nargs="+", metavar="NAME", help="only these kernels")
    bench.add_argument(
        "--compare",
        default="eager,compile,max-autotune,cublaslt",
        help="what to time besides fusegen, comma-separated (default: %(default)s)",
    )
    bench.add_argument(
        "--out", default="bench-results", metavar="DIR", help="where the JSON, Markdown and PNG go"
    )
    return parser


def _print_errors(exc: SpecErrors) -> int:
    files = list(dict.fromkeys(e.file for e in exc.errors))
    for error in sorted(exc.errors, key=lambda e: (files.index(e.file), e.line, e.col)):
        print(error.format(), file=sys.stderr)
    count = len(exc.errors)
    print(f"fusegen: {count} error{'s' if count != 1 else ''}; nothing written", file=sys.stderr)
    return 2


def _build(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    try:
        loaded = build.load(build.collect(args.specs))
        planned = build.plan(loaded, out_dir)
    except SpecErrors as exc:
        return _print_errors(exc)
    stale = build.orphans(loaded, planned, out_dir)
    if args.check:
        problems = writer.differences(planned) + [
            (p, "no kernel in the specs makes it any more") for p in stale
        ]
        for path, what in problems:
            print(f"{path}: {what}", file=sys.stderr)
        if problems:
            print(
                f"fusegen: {len(problems)} generated file(s) out of date; run `fusegen build "
                f"{' '.join(args.specs)}"
                + (f" --out {args.out}`" if args.out != "generated" else "`"),
                file=sys.stderr,
            )
            return 1
        print(f"fusegen: {len(planned)} generated files up to date")
        return 0
    written = writer.write_all(planned)
    for path in written:
        print(f"wrote {path}")
    for path in stale:
        path.unlink()
        print(f"removed {path} (no kernel in the specs makes it any more)")
    print(
        f"fusegen: {len(loaded.kernels)} kernel(s), {len(written)} file(s) written, "
        f"{len(planned) - len(written)} unchanged"
    )
    return 0


def _validate(args: argparse.Namespace) -> int:
    try:
        loaded = build.load(build.collect(args.specs))
    except SpecErrors as exc:
        return _print_errors(exc)
    for kernel in loaded.kernels:
        print(f"{kernel.spec_display}: {kernel.name}: ok")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from fusegen import bench, report

    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        print("fusegen bench: needs a CUDA GPU, and none is visible to torch", file=sys.stderr)
        return 2
    try:
        loaded = build.load(build.collect(args.specs))
    except SpecErrors as exc:
        return _print_errors(exc)
    kernels = [k for k in loaded.kernels if not args.kernels or k.name in args.kernels]
    wanted = ["fusegen"] + [
        bench.VARIANT_NAMES[c.strip()] for c in args.compare.split(",") if c.strip()
    ]
    variants = [v for v in bench.VARIANTS if v.name in wanted]
    shapes = dict(bench.DEFAULT_SHAPES)
    if args.shapes:
        given = [tuple(int(x) for x in s.split(",")) for s in args.shapes]
        pairs = [s for s in given if len(s) == 2]
        shapes = {"matmul": [s for s in given if len(s) == 3], "elementwise": pairs, "row": pairs}
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    ceilings, results = bench.run(
        kernels, shapes, args.dtype, variants, bench.do_bench_timer, progress
    )
    print(report.table(results))
    meta = {**bench.versions(), "command": "fusegen bench " + " ".join(args.raw)}
    for path in report.write(Path(args.out), results, ceilings, meta):
        print(f"wrote {path}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    args.raw = argv[1:]
    if args.command == "build":
        return _build(args)
    if args.command == "validate":
        return _validate(args)
    if args.command == "bench":
        return _bench(args)
    print(json.dumps(schema.json_schema(), indent=2, sort_keys=True))
    return 0
