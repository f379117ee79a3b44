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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build":
        return _build(args)
    if args.command == "validate":
        return _validate(args)
    print(json.dumps(schema.json_schema(), indent=2, sort_keys=True))
    return 0
