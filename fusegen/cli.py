"""The `fusegen` command.

Exit status: 0 done; 1 `build --check` found generated files missing or out of date;
2 the specs have errors (each printed as file:line:col: path: message) or the command
line is wrong. On errors nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from fusegen import __version__, build, codegen, writer
from fusegen.codegen import hub_text
from fusegen.spec import schema
from fusegen.tools.bench import DEFAULT_ROWS, LAYOUTS
from fusegen.tools.bench_attention import DEFAULT_SHAPES as ATTENTION_SHAPES
from fusegen.errors import SpecErrors

# What `bench` takes where an option is not given (None in argparse, so that --suite can
# tell which were given: a suite run sets them itself).
_BENCH_DEFAULTS = {
    "dtype": "bf16",
    "compare": "eager,compile,max-autotune,cublaslt,dequantized,dequantized-eager,sdpa,flex",
    "tables": "generated",
    "timer": "call",
    "layout": [],
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fusegen",
        description="Generate fused Triton kernels, PyTorch references and tests from YAML specs.",
    )
    parser.add_argument("--version", action="version", version=f"fusegen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("build", help="generate kernel and test modules from specs")
    b.add_argument(
        "specs",
        nargs="+",
        metavar="SPEC_OR_DIR",
        help="spec files, or folders of *.yaml and *.yml specs",
    )
    b.add_argument(
        "--out", default="generated", metavar="DIR", help="where to write (default: generated)"
    )
    b.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if any generated file is missing or differs",
    )
    b.add_argument(
        "--kernels-hub",
        metavar="NAME",
        help="write DIR as a local repository of the `kernels` package named NAME (lower "
        "case, digits, hyphens): the modules in build/torch-universal/NAME/ with a `layers` "
        "module that kernelize() swaps into transformers' hub-marked layers",
    )

    v = sub.add_parser("validate", help="check specs and print their errors; write nothing")
    v.add_argument("specs", nargs="+", metavar="SPEC_OR_DIR")

    sub.add_parser(
        "schema", help="print the spec's JSON Schema (for editors' YAML language servers)"
    )

    bench = sub.add_parser(
        "bench",
        help="time the kernels against eager, torch.compile and cuBLASLt (needs a GPU)",
        description="Time the kernels of SPEC_OR_DIR, or the runs of a suite file (--suite).",
    )
    bench.add_argument("specs", nargs="*", metavar="SPEC_OR_DIR")
    bench.add_argument(
        "--suite",
        metavar="FILE",
        help="run the named runs of this suite file (e.g. benchmarks/suite.yaml) instead of "
        "SPEC_OR_DIR; each run's results go to OUT/RUN/. Each run sets what the options below "
        "would, so only --runs, --list and --out go with it",
    )
    bench.add_argument(
        "--runs", nargs="+", metavar="RUN", help="with --suite: only these runs (default: all)"
    )
    bench.add_argument(
        "--list",
        action="store_true",
        help="with --suite: print each run, what it measures and its command line; time nothing",
    )
    bench.add_argument(
        "--shapes",
        nargs="+",
        metavar="M,K,N",
        help="matmul shapes M,K,N and elementwise/row shapes M,N (default: --rows where the "
        "spec fixes every dim but the rows, else the anchor shapes)",
    )
    bench.add_argument(
        "--rows",
        metavar="M,M,...",
        help="row counts, the other dims at the spec's sizes (default: "
        + ",".join(map(str, DEFAULT_ROWS))
        + " where the spec fixes the other dims)",
    )
    _attention_shapes_option(bench, "each timed against the variants of --compare")
    bench.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="(default: bf16)")
    bench.add_argument(
        "--layout",
        nargs="+",
        metavar="INPUT=KIND",
        help="store these inputs other than contiguously, for every variant: "
        + "; ".join(f"{k}: {v}" for k, v in LAYOUTS.items()),
    )
    bench.add_argument("--kernels", nargs="+", metavar="NAME", help="only these kernels")
    bench.add_argument(
        "--compare",
        help="what to time besides fusegen, comma-separated (default: "
        + _BENCH_DEFAULTS["compare"]
        + "; sdpa (its flash, cuDNN and efficient backends) and flex (compiled "
        "FlexAttention) time attention kernels, the others the rest)",
    )
    bench.add_argument(
        "--out", default="bench-results", metavar="DIR", help="where the JSON, Markdown and PNG go"
    )
    bench.add_argument(
        "--tables",
        metavar="DIR",
        help="where the tuned tables are (default: generated); 'none': tune at the first "
        "call of each shape, as a module without a table does (attention: its defaults)",
    )
    bench.add_argument(
        "--timer",
        choices=["call", "graph"],
        help="call: do_bench of each Python call, launch cost included where it shows "
        "(default); graph: GPU time of calls replayed from a CUDA graph",
    )
    tune = sub.add_parser(
        "tune",
        help="measure the config spaces on this GPU and write tuned tables beside the modules",
    )
    inspect = sub.add_parser(
        "inspect",
        help="registers, spills and shared memory of the configs the launchers choose (GPU)",
    )
    for command in (tune, inspect):
        command.add_argument("specs", nargs="+", metavar="SPEC_OR_DIR")
        command.add_argument(
            "--rows",
            default=",".join(map(str, DEFAULT_ROWS)),
            metavar="M,M,...",
            help="row counts to use, the other dims at the spec's sizes (default: %(default)s)",
        )
        command.add_argument(
            "--shapes", nargs="+", metavar="M,K,N", help="full shapes instead of --rows"
        )
        command.add_argument("--kernels", nargs="+", metavar="NAME", help="only these kernels")
        command.add_argument(
            "--out", default="generated", metavar="DIR", help="the generated modules' folder"
        )
    tune.add_argument(
        "--timer",
        default="graph",
        choices=["call", "graph"],
        help="graph (default): rank kernels shorter than 0.1 ms by GPU time replayed from "
        "a CUDA graph (reproducible where the launch outlasts the kernel), longer ones by "
        "do_bench; call: do_bench per call for all",
    )
    tune.add_argument(
        "--dtypes", nargs="+", default=["bf16"], choices=["bf16", "fp16", "fp32"], metavar="DTYPE"
    )
    _attention_shapes_option(tune, "each kernel (forward, dk/dv, dq) tuned at each")
    inspect.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    _attention_shapes_option(inspect, "one forward and backward at each")
    inspect.add_argument(
        "--counters",
        action="store_true",
        help="also L1/L2 hit rates and DRAM bandwidth of one launch, via Nsight Compute (ncu)",
    )
    return parser


def _gpu_or_exit(command: str) -> bool:
    try:
        import torch

        if torch.cuda.is_available():
            return True
    except ImportError:
        pass
    print(f"fusegen {command}: needs a CUDA GPU, and none is visible to torch", file=sys.stderr)
    return False


def _shapes_for(args: argparse.Namespace):
    """kernel -> its shapes, from --shapes or --rows (see bench.kernel_shapes); raises
    ValueError on bad input."""
    from fusegen.tools import bench

    given = [_shape(s) for s in args.shapes] if args.shapes else None
    rows = list(_shape(args.rows)) if args.rows else None
    return lambda k: bench.kernel_shapes(k, given, rows)


def _shape_form(kernel) -> str:
    """What a --shapes value of this kernel names."""
    from fusegen.tools import bench

    chain = bench.chain_of(kernel)
    if chain.matmul:
        return f"a shape is {chain.matmul.m},{chain.matmul.k},{chain.matmul.n} (three values)"
    return f"a shape is {chain.row},{chain.col} (two values)"


def _shape(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise ValueError(f"'{text}' is not a comma-separated list of positive integers")
    return values


def _gpu_command(args: argparse.Namespace, command: str, work, check=None) -> int:
    """The frame `bench`, `tune` and `inspect` share: the specs, the kernels asked for and their
    shapes (and `check(kernels)`, which raises ValueError) are checked first (exit 2 with
    every error), then a GPU is required, then `work(kernels, shapes_for, progress)` runs;
    its TuneError or ValueError exits 2."""
    from fusegen.tools import bench
    from fusegen.tools.tune import TuneError

    try:
        loaded = build.load(build.collect(args.specs))
    except SpecErrors as exc:
        return _print_errors(exc)
    names = [k.name for k in loaded.kernels]
    unknown = [n for n in args.kernels or [] if n not in names]
    try:
        rows = getattr(args, "rows", None)
        if getattr(args, "shapes", None) and rows and rows != ",".join(map(str, DEFAULT_ROWS)):
            raise ValueError("give --shapes or --rows, not both (--shapes are whole shapes)")
        tables = getattr(args, "tables", "none")
        if tables not in ("none", "generated") and not Path(tables).is_dir():
            raise ValueError(f"--tables {tables}: no such folder ('none': tune at first calls)")
        if unknown:
            raise ValueError(
                f"no kernel named {', '.join(unknown)}; these specs have {', '.join(names)}"
            )
        kernels = [k for k in loaded.kernels if not args.kernels or k.name in args.kernels]
        heads = [k.name for k in kernels if k.kind == "loss"]
        if heads and (args.kernels or len(heads) == len(kernels)):
            raise ValueError(
                f"{', '.join(heads)}: a loss head has no configs to {command} (its GEMMs are "
                "cuBLAS's); time it with benchmarks/lm_head_loss.py"
            )
        kernels = [k for k in kernels if k.kind != "loss"]
        # Quantized chains are taken; quantizers have no configs (theirs follow the
        # row's width).
        quantizers = [k.name for k in kernels if k.kind == "quantize"]
        if quantizers and (args.kernels or len(quantizers) == len(kernels)):
            raise ValueError(
                f"{', '.join(quantizers)}: a quantizer takes its config from the row's "
                f"width: nothing to {command} (the quantized chains are taken)"
            )
        kernels = [k for k in kernels if k.kind != "quantize"]
        if not kernels:
            raise ValueError("no kernels left to run")
        shapes_for = _shapes_for(args)
        unusable = []
        for k in kernels:
            if k.kind != "attention":
                problems = []
                usable = list(bench.usable_sizes(k, shapes_for(k), problems.append))
                if not usable and args.shapes:
                    found = "; ".join(p.removeprefix("  skipped: ") for p in problems)
                    unusable.append(found or f"{k.name}: {_shape_form(k)}")
        if unusable and len(unusable) == sum(k.kind != "attention" for k in kernels):
            raise ValueError(
                "no --shapes value applies to any kernel asked for: " + " | ".join(unusable)
            )
        if check:
            check(kernels)
    except ValueError as exc:
        print(f"fusegen {command}: {exc}", file=sys.stderr)
        return 2
    if not _gpu_or_exit(command):
        return 2
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        return work(kernels, shapes_for, progress)
    except (ValueError, TuneError) as exc:
        print(f"fusegen {command}: {exc}", file=sys.stderr)
        return 2


def _tune(args: argparse.Namespace) -> int:
    from fusegen.tools import timing, tune, tune_attention

    def work(kernels, shapes_for, progress) -> int:
        chains, attention = _by_kind(kernels)
        results, written = [], []
        if chains:
            results, written = tune.run(
                chains,
                shapes_for,
                args.dtypes,
                Path(args.out),
                timing.TUNING_TIMERS[args.timer][0],
                progress,
                final_timer=timing.TUNING_TIMERS[args.timer][1],
            )
        if attention:
            found, paths = tune_attention.run(
                attention,
                args.attention_shape_list,
                args.dtypes,
                Path(args.out),
                timing.TUNING_TIMERS[args.timer][0],
                progress,
            )
            results, written = results + found, written + paths
        for r in results:
            best = r.entry["choices"][r.entry["best"]] if r.entry else None
            chosen = (
                f"{r.entry['best']} {best['ms']} ms {best['config']}"
                if r.entry
                else "no config agreed with the reference"
            )
            shape = "x".join(map(str, r.shape))
            print(f"{r.kernel} {shape} {r.dtype}: {chosen} ({r.seconds:.1f} s)")
        for path in written:
            print(f"wrote {path}")
        return 0 if all(r.entry for r in results) else 1

    return _gpu_command(args, "tune", work, check=lambda kernels: _check_attention_shapes(args))


def _inspect(args: argparse.Namespace) -> int:
    return _gpu_command(
        args,
        "inspect",
        lambda *a: _inspect_work(args, *a),
        check=lambda kernels: _check_attention_shapes(args),
    )


def _attention_shapes_option(parser: argparse.ArgumentParser, use: str) -> None:
    parser.add_argument(
        "--attention-shapes",
        nargs="+",
        metavar="B,SQ,SKV",
        help="attention kernels' shapes: batch, query length, key length (heads and head dim "
        f"are the spec's); {use} (default: "
        + " ".join(",".join(map(str, s)) for s in ATTENTION_SHAPES)
        + ")",
    )


def _by_kind(kernels) -> tuple[list, list]:
    """(chain kernels, attention kernels): each command runs them by its own module."""
    return [k for k in kernels if k.kind != "attention"], [
        k for k in kernels if k.kind == "attention"
    ]


def _check_attention_shapes(args) -> None:
    """--attention-shapes (or the defaults) into args.attention_shape_list; raises ValueError."""
    from fusegen.tools import bench_attention

    given = [_shape(s) for s in args.attention_shapes or []]
    bench_attention.check_shapes(given)
    args.attention_shape_list = given or list(ATTENTION_SHAPES)


def _inspect_work(args: argparse.Namespace, kernels, shapes_for, progress) -> int:
    import os

    from fusegen.tools import inspect_kernels

    chains, attention = _by_kind(kernels)
    found = inspect_kernels.run(chains, shapes_for, args.dtype, Path(args.out), progress)
    found += inspect_kernels.run_attention(
        attention, args.attention_shape_list, args.dtype, Path(args.out), progress
    )
    if os.environ.get(inspect_kernels.CHILD):
        return 0  # a child run under ncu: the parent prints
    print(inspect_kernels.HEADER)
    for item in found:
        print(item.row())
    spilled = [i for i in found if i.spills]
    for item in spilled:
        print(
            f"warning: {item.kernel} {item.shape}: {item.spills} registers spill to local memory "
            f"with {item.config}; a smaller tile or fewer stages may run faster",
            file=sys.stderr,
        )
    if args.counters:
        for item in found:
            if item.path == "attention":
                continue  # ncu's kernel filter and argv are the chain kernels' (not yet here)
            argv = ["inspect", *args.specs, "--kernels", item.kernel, "--dtype", item.dtype]
            argv += ["--shapes", ",".join(map(str, item.shape)), "--out", args.out]
            print(f"{item.kernel} {item.shape}: {inspect_kernels.counters(item.kernel, argv)}")
    return 0


def _print_errors(exc: SpecErrors) -> int:
    files = list(dict.fromkeys(e.file for e in exc.errors))
    for error in sorted(exc.errors, key=lambda e: (files.index(e.file), e.line, e.col)):
        print(error.format(), file=sys.stderr)
    count = len(exc.errors)
    print(f"fusegen: {count} error{'s' if count != 1 else ''}; nothing written", file=sys.stderr)
    return 2


def _build(args: argparse.Namespace) -> int:
    out_dir, hub = Path(args.out), args.kernels_hub
    if hub is not None and not hub_text.HUB_NAME.match(hub):
        print(
            f"fusegen: --kernels-hub {hub!r}: a `kernels` repository name is two or more "
            "lower-case letters, digits and hyphens, starting with a letter and not ending "
            "with a hyphen (e.g. llama-kernels)",
            file=sys.stderr,
        )
        return 2
    try:
        loaded = build.load(build.collect(args.specs))
        planned = build.plan(loaded, out_dir, hub)
    except SpecErrors as exc:
        return _print_errors(exc)
    modules = build.modules_dir(out_dir, hub)
    folders = build.folder_displays(args.specs)
    stale = build.orphans(loaded, planned, modules, folders)
    stale += build.orphan_tables(loaded, modules, folders)
    tuned = build.table_problems(loaded, planned, modules)
    old_packages, old_hub, tables_to_move = build.renamed_hubs(loaded, out_dir, hub, folders)
    if args.check:
        renamed = f"a package of an earlier --kernels-hub name (the repository is {hub} now)"
        outdated = writer.differences(planned) + [
            (p, "no kernel in the specs makes it any more") for p in stale
        ]
        outdated += [(p, renamed) for p in old_packages]
        for path, what in outdated + tuned:
            print(f"{path}: {what}", file=sys.stderr)
        specs = " ".join(args.specs) + (f" --out {args.out}" if args.out != "generated" else "")
        specs += f" --kernels-hub {hub}" if hub else ""
        if outdated:
            print(
                f"fusegen: {len(outdated)} generated file(s) out of date; run `fusegen build "
                f"{specs}`",
                file=sys.stderr,
            )
        if tuned:
            print(
                f"fusegen: {len(tuned)} tuned table(s) stale or unreadable; run `fusegen tune "
                f"{specs}` on the GPU",
                file=sys.stderr,
            )
        if outdated or tuned:
            return 1
        print(f"fusegen: {len(planned)} generated files up to date")
        return 0
    try:
        written = writer.write_all(planned, last=(modules / codegen.RUNTIME_DIR / "__init__.py",))
    except writer.WriteError as exc:
        print(f"fusegen: {exc}; nothing written", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    for path in stale:
        path.unlink()
        print(f"removed {path} (no kernel in the specs makes it any more)")
    for table, target in tables_to_move:
        table.replace(target)
        print(f"moved {table} to {target} (the repository is {hub} now)")
    for path in old_hub:
        path.unlink()
    for folder in sorted({p.parent for p in old_hub}, key=lambda p: -len(p.parts)):
        shutil.rmtree(folder / "__pycache__", ignore_errors=True)
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    for package in old_packages:
        print(f"removed {package} (a package of an earlier --kernels-hub name)")
    for path, what in tuned:
        print(f"warning: {path}: {what}", file=sys.stderr)
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
    from fusegen.tools import bench

    if args.suite:
        return _bench_suite(args)
    if not args.specs:
        print("fusegen bench: give SPEC_OR_DIR, or --suite FILE", file=sys.stderr)
        return 2
    if args.runs or args.list:
        print("fusegen bench: --runs and --list go with --suite FILE", file=sys.stderr)
        return 2
    for name, default in _BENCH_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    compare = [c.strip() for c in args.compare.split(",") if c.strip()]
    unknown = [c for c in compare if c not in bench.VARIANT_NAMES]
    if unknown:
        print(
            f"fusegen bench: --compare: no variant named {', '.join(unknown)}; valid: "
            + ", ".join(n for n in bench.VARIANT_NAMES if n != "fusegen"),
            file=sys.stderr,
        )
        return 2
    wanted = {"fusegen", *(bench.VARIANT_NAMES[c] for c in compare)}
    variants = [v for v in bench.VARIANTS if v.name in wanted]
    bad = [item for item in args.layout if item.count("=") != 1]
    if bad:
        print(f"fusegen bench: --layout takes INPUT=KIND, got {', '.join(bad)}", file=sys.stderr)
        return 2
    args.layouts = dict(item.split("=") for item in args.layout)
    return _gpu_command(
        args,
        "bench",
        lambda kernels, shapes_for, progress: _bench_work(
            args, kernels, shapes_for, variants, progress
        ),
        check=lambda kernels: _bench_checks(args, kernels),
    )


def _bench_checks(args, kernels) -> None:
    """--layout against the chain kernels, --attention-shapes' form; raises ValueError."""
    from fusegen.tools import bench

    bench.check_layouts(_by_kind(kernels)[0], args.layouts)
    _check_attention_shapes(args)


def _bench_work(args, kernels, shapes_for, variants, progress) -> int:
    from fusegen.tools import bench, bench_attention, report, timing

    chains, attention = _by_kind(kernels)
    timer = timing.TIMERS[args.timer]
    ceilings, results = None, []
    if chains:
        ceilings, results = bench.run(
            chains,
            shapes_for,
            args.dtype,
            variants,
            timer,
            progress,
            tables_dir=None if args.tables == "none" else Path(args.tables),
            layouts=args.layouts,
        )
    if attention:
        compare = [c.strip() for c in args.compare.split(",")]
        ceilings, more = bench_attention.run(
            attention,
            args.attention_shape_list,
            args.dtype,
            bench_attention.variant_names(compare),
            timer,
            progress,
            ceilings,
            tables_dir=None if args.tables == "none" else Path(args.tables),
        )
        results += more
    print(report.table(results))
    meta = {
        **bench.versions(),
        "command": "fusegen bench " + " ".join(args.raw),
        "timer": args.timer,
    }
    for path in report.write(Path(args.out), results, ceilings, meta):
        print(f"wrote {path}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1


def _bench_suite(args: argparse.Namespace) -> int:
    """`bench --suite FILE [--runs RUN...] [--list]`: the suite is checked whole (exit 2
    with every error) before a GPU is asked for; each run's results go to OUT/RUN/."""
    from fusegen.tools import bench_suite

    given = [f"--{n}" for n in ("shapes", "rows", "kernels", *_BENCH_DEFAULTS)]
    given = [o for o in given if getattr(args, o[2:]) not in (None, [])]
    if args.specs or given:
        extra = ", ".join(args.specs + given)
        print(
            f"fusegen bench: --suite takes only --runs, --list and --out; got {extra} (a suite "
            "run sets its specs, kernels, shapes, dtype, compare, layout, tables and timer)",
            file=sys.stderr,
        )
        return 2
    try:
        suite = bench_suite.load(Path(args.suite))
        runs = suite.select(args.runs)
    except SpecErrors as exc:
        return _print_errors(exc)
    except ValueError as exc:
        print(f"fusegen bench: --runs: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for run in runs:
            print(f"{run.name}: {run.measures}\n    {run.command()}")
        return 0
    if not _gpu_or_exit("bench"):
        return 2
    return _bench_suite_work(Path(args.out), suite, runs)


def _bench_suite_work(out: Path, suite, runs, timers=None, ceilings=None, device="cuda") -> int:
    """Each run in turn, its results in out/RUN/ (a GPU is there); `timers`, `ceilings` and
    `device` are for the tests, which run this on the CPU with a fake timer."""
    from fusegen.tools import bench, bench_suite, report, timing

    timers = timers or timing.TIMERS
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    status = 0
    for run in runs:
        progress(f"{suite.display} {run.name}: {run.command()}")
        measured, results = bench_suite.run(run, timers[run.timer], progress, ceilings, device)
        print(f"## {run.name}: {run.measures}\n{run.command()}\n")
        print(report.table(results) + "\n")
        meta = {
            **bench.versions(),
            "command": run.command(),
            "suite": f"fusegen bench --suite {suite.display} --runs {run.name}",
            "timer": run.timer,
        }
        for path in report.write(out / run.name, results, measured, meta):
            print(f"wrote {path}", file=sys.stderr)
        status = status or (0 if all(r.ok for r in results) else 1)
    return status


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`fusegen schema | head`): no traceback, and no second
        # error when Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a command a closed pipe stopped (128 + SIGPIPE)


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    args.raw = argv[1:]
    if args.command == "build":
        return _build(args)
    if args.command == "validate":
        return _validate(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "tune":
        return _tune(args)
    if args.command == "inspect":
        return _inspect(args)
    print(json.dumps(schema.json_schema(), indent=2, sort_keys=True))
    return 0
