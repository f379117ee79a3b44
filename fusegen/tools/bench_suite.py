"""A bench suite: named `fusegen bench` runs in one YAML file (`fusegen bench --suite`).

Each run is what one `fusegen bench` command line would say: its spec files, kernels,
shapes or row counts, dtype, the variants to compare, input layouts, timer, tuned tables,
and any FUSEGEN_* settings the launchers should see. The file is read like a spec
(fusegen.spec.source: positions kept, repeated keys refused) and checked whole before anything
runs; every mistake is reported with its file, line and column and what would be valid.
Paths in it are relative to the suite's repository (the nearest folder above it with
.git or pyproject.toml), so it runs the same from any working directory.
"""

from __future__ import annotations

import os
import re
import shlex
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from fusegen import build
from fusegen.tools import bench
from fusegen.spec import source
from fusegen.errors import SpecError, SpecErrors, did_you_mean
from fusegen.ir import Kernel

DTYPES = ("bf16", "fp16", "fp32")
TIMERS = ("call", "graph")
COMPARE = tuple(n for n in bench.VARIANT_NAMES if n != "fusegen")
FIELDS = {
    "measures": "what the run measures, in words (required)",
    "specs": "spec files or folders, relative to the repository (required)",
    "kernels": "only these kernels of the specs (default: all)",
    "shapes": "full shapes, each [M, K, N] or [M, N]",
    "rows": "row counts, the other dims at the specs' sizes",
    "dtype": f"one of {', '.join(DTYPES)} (default: bf16)",
    "compare": f"what to time besides fusegen, a list of {', '.join(COMPARE)} (required)",
    "layout": f"input: kind, for inputs not stored contiguously ({', '.join(bench.LAYOUTS)})",
    "timer": f"one of {', '.join(TIMERS)} (default: call)",
    "tables": "the tuned tables' folder, or none to tune at first calls (default: generated)",
    "env": "FUSEGEN_* settings the launchers see during the run",
}
NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
ENV_NAME = re.compile(r"FUSEGEN_[A-Z0-9_]+")
EXAMPLE = (
    "a suite is a mapping with a `runs:` mapping, each run named (lower-case letters, digits, "
    "dashes) with the fields: " + ", ".join(FIELDS)
)


@dataclass(frozen=True)
class Run:
    name: str
    measures: str
    specs: tuple[str, ...]  # as the suite writes them, relative to root
    kernels: tuple[Kernel, ...]
    kernel_names: tuple[str, ...] | None  # the suite's `kernels:`, None: every kernel
    shapes: tuple[tuple[int, ...], ...] | None
    rows: tuple[int, ...] | None
    dtype: str
    compare: tuple[str, ...]
    layouts: dict = field(default_factory=dict)
    timer: str = "call"
    tables: str | None = "generated"  # None: tune at the first call of each shape
    env: dict = field(default_factory=dict)
    root: Path = Path(".")

    def shapes_for(self, kernel: Kernel) -> list[tuple]:
        return bench.kernel_shapes(
            kernel,
            list(self.shapes) if self.shapes is not None else None,
            list(self.rows) if self.rows is not None else None,
        )

    def variants(self) -> list[bench.Variant]:
        wanted = {"fusegen", *(bench.VARIANT_NAMES[c] for c in self.compare)}
        return [v for v in bench.VARIANTS if v.name in wanted]

    def tables_dir(self) -> Path | None:
        return None if self.tables is None else self.root / self.tables

    def command(self) -> str:
        """The `fusegen bench` command line that runs the same, from the repository root."""
        words = ["fusegen", "bench", *self.specs]
        if self.kernel_names:
            words += ["--kernels", *self.kernel_names]
        if self.shapes is not None:
            words += ["--shapes", *(",".join(map(str, s)) for s in self.shapes)]
        if self.rows is not None:
            words += ["--rows", ",".join(map(str, self.rows))]
        if self.dtype != "bf16":
            words += ["--dtype", self.dtype]
        if self.layouts:
            words += ["--layout", *(f"{k}={v}" for k, v in self.layouts.items())]
        words += ["--compare", ",".join(self.compare)]
        if self.timer != "call":
            words += ["--timer", self.timer]
        if self.tables != "generated":
            words += ["--tables", self.tables or "none"]
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join(env + [shlex.quote(w) for w in words])


@dataclass(frozen=True)
class Suite:
    display: str  # the file, relative to its repository
    runs: tuple[Run, ...]

    def select(self, names: list[str] | None) -> list[Run]:
        """The runs named (all where None), in the suite's order; ValueError naming the
        unknown ones and the valid names."""
        have = [r.name for r in self.runs]
        unknown = [n for n in names or [] if n not in have]
        if unknown:
            raise ValueError(
                f"{self.display} has no run named {', '.join(unknown)}; runs: {', '.join(have)}"
                + (did_you_mean(unknown[0], have) if len(unknown) == 1 else "")
            )
        return [r for r in self.runs if not names or r.name in names]


def repository_root(path: Path) -> Path:
    """The nearest folder above `path` with .git or pyproject.toml, else path's folder."""
    path = path.resolve()
    for parent in path.parents:
        if (parent / ".git").exists() or (parent / "pyproject.toml").exists():
            return parent
    return path.parent


def load(path: Path) -> Suite:
    """Read and check a suite file, its specs lowered; SpecErrors with every mistake."""
    try:
        src = source.load(Path(path))
    except SpecErrors as exc:  # its hints describe a spec; say what a suite is instead
        raise SpecErrors(
            [replace(e, hint=EXAMPLE) if "`kernels:`" in e.hint else e for e in exc.errors]
        ) from None
    root = repository_root(Path(path))
    errors: list[SpecError] = []
    data = src.data
    for key in data:
        if key != "runs":
            errors.append(
                src.error(
                    (key,), f"unknown key '{key}'{did_you_mean(key, ['runs'])}", EXAMPLE, key=True
                )
            )
    runs_data = data.get("runs")
    runs: list[Run] = []
    if not isinstance(runs_data, dict) or not runs_data:
        errors.append(src.error(("runs",), "`runs` must be a mapping of named runs", EXAMPLE))
    else:
        for name, body in runs_data.items():
            run = _run(src, root, str(name), body, errors)
            if run is not None:
                runs.append(run)
    if errors:
        raise SpecErrors(errors)
    return Suite(src.display, tuple(runs))


def _run(src, root: Path, name: str, body, errors: list[SpecError]) -> Run | None:
    """One run, checked; None where it has errors (appended to `errors`)."""
    at = ("runs", name)
    found: list[SpecError] = []

    def error(where: tuple, message: str, hint: str = "", key: bool = False) -> None:
        found.append(src.error(at + where, message, hint, key=key))

    if not NAME.fullmatch(name):
        hint = "it names the run's results folder"
        error((), f"run name '{name}' is not lower-case letters, digits and dashes", hint, key=True)
    if not isinstance(body, dict):
        error((), "a run is a mapping", "fields: " + ", ".join(FIELDS))
        errors += found
        return None
    for key in body:
        if key not in FIELDS:
            hint = "fields: " + ", ".join(FIELDS)
            error((key,), f"unknown field '{key}'{did_you_mean(key, FIELDS)}", hint, key=True)
    for required in ("measures", "specs", "compare"):
        if required not in body:
            error((), f"missing field '{required}'", f"{required}: {FIELDS[required]}", key=True)

    measures = body.get("measures", "")
    if not isinstance(measures, str) or ("measures" in body and not measures.strip()):
        error(("measures",), "`measures` must be text saying what the run measures")
    kernels, names = _kernels(body, root, error, found)
    dtype = _choice(body, "dtype", DTYPES, "bf16", error)
    timer = _choice(body, "timer", TIMERS, "call", error)
    compare = _strings(body, "compare", error) or []
    for i, c in enumerate(compare):
        if c not in COMPARE:
            hint = "valid: " + ", ".join(COMPARE)
            error(("compare", i), f"no variant '{c}'{did_you_mean(c, COMPARE)}", hint)
    shapes, rows = _shapes(body, error)
    layouts = _mapping(body, "layout", error)
    env = _mapping(body, "env", error)
    for key in env:
        if not ENV_NAME.fullmatch(str(key)):
            hint = "a run sets only fusegen's own settings (FUSEGEN_AUTOTUNE, FUSEGEN_TMA, ...)"
            error(("env", key), f"'{key}' is not a FUSEGEN_* setting", hint, key=True)
    tables = body.get("tables", "generated")
    if not isinstance(tables, str) or not tables:
        error(("tables",), "`tables` must be a folder or none", FIELDS["tables"])
    elif "tables" in body and tables != "none" and not (root / tables).is_dir():
        error(("tables",), f"no such folder: {tables}", f"relative to {root}; or none")
    if kernels is not None:
        _check_against_kernels(body, kernels, dtype, layouts, rows, error)
    errors += found
    if found:
        return None
    return Run(
        name=name,
        measures=" ".join(measures.split()),
        specs=tuple(body["specs"]),
        kernels=tuple(kernels),
        kernel_names=tuple(names) if names is not None else None,
        shapes=shapes,
        rows=rows,
        dtype=dtype,
        compare=tuple(compare),
        layouts=dict(layouts),
        timer=timer,
        tables=None if tables == "none" else tables,
        env={k: str(v) for k, v in env.items()},
        root=root,
    )


def _kernels(body: dict, root: Path, error, found: list) -> tuple[list | None, list | None]:
    """(the run's kernels, its `kernels:` names); kernels None where the specs or the
    names have errors (the specs' own errors go into `found`, with their positions)."""
    specs = _strings(body, "specs", error)
    names = _strings(body, "kernels", error) if "kernels" in body else None
    if not specs or ("kernels" in body and names is None):
        return None, names
    missing = [i for i, p in enumerate(specs) if not (root / p).exists()]
    for i in missing:
        error(("specs", i), f"no such file or folder: {specs[i]}", f"relative to {root}")
    if missing:
        return None, names
    try:
        found_kernels = build.load(build.collect([str(root / p) for p in specs])).kernels
        # A suite times chain kernels, quantized ones included; `fusegen bench SPEC` times
        # attention kernels, and benchmarks/lm_head_loss.py loss heads.
        kernels = [k for k in found_kernels if k.kind not in ("attention", "loss", "quantize")]
    except SpecErrors as exc:
        found += exc.errors
        return None, names
    if names is None:
        return kernels, None
    have = [k.name for k in kernels]
    unknown = [(i, n) for i, n in enumerate(names) if n not in have]
    for i, n in unknown:
        hint = "the specs have " + ", ".join(have)
        error(("kernels", i), f"no kernel '{n}'{did_you_mean(n, have)}", hint)
    return (None if unknown else [k for k in kernels if k.name in names]), names


def _check_against_kernels(body, kernels, dtype, layouts, rows, error) -> None:
    """What needs the kernels: each takes the dtype, the layouts name their inputs, the
    row counts fit their static dims, and some kernel takes each shape."""
    for kernel in kernels:
        if dtype not in kernel.dtypes:
            hint = f"its spec allows {', '.join(kernel.dtypes)}; name the others in `kernels:`"
            error(("dtype",), f"{kernel.name} does not take {dtype}", hint)
    try:
        bench.check_layouts(kernels, layouts)
    except ValueError as exc:
        error(("layout",), str(exc).replace("--layout ", ""), FIELDS["layout"])
    for kernel in kernels if rows is not None else []:
        try:
            bench.row_shapes(kernel, list(rows))
        except ValueError as exc:
            error(
                ("rows",), str(exc).replace("--shapes ", "`shapes:` "), "or name fewer `kernels:`"
            )
    given = body.get("shapes") if isinstance(body.get("shapes"), list) else []
    for i, shape in enumerate(given):
        if not _is_shape(shape):
            continue  # reported by _shapes
        reasons = []
        for kernel in kernels:
            try:
                bench.shape_dims(kernel, tuple(shape))
                break
            except ValueError as exc:
                reasons.append(str(exc))
        else:
            error(("shapes", i), f"no kernel of this run takes {shape}", "; ".join(reasons))


def _strings(body: dict, key: str, error) -> list[str] | None:
    value = body.get(key)
    if key not in body:
        return None
    if not isinstance(value, list) or not value:
        error((key,), f"`{key}` must be a list", FIELDS[key])
        return None
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            error((key, i), f"`{key}` holds names; got {item!r}", FIELDS[key])
            return None
    return value


def _choice(body: dict, key: str, valid: tuple, default: str, error) -> str:
    value = body.get(key, default)
    if value not in valid:
        error(
            (key,),
            f"no {key} {value!r}{did_you_mean(str(value), valid)}",
            "valid: " + ", ".join(valid),
        )
        return default
    return value


def _mapping(body: dict, key: str, error) -> dict:
    value = body.get(key, {})
    if not isinstance(value, dict):
        error((key,), f"`{key}` must be a mapping", FIELDS[key])
        return {}
    for name, item in value.items():
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            error((key, name), f"{key} {name}: {item!r} is not text", FIELDS[key])
    return value


def _shapes(body: dict, error) -> tuple[tuple | None, tuple | None]:
    """(shapes, rows) as tuples; each None where the run does not give it."""
    if "shapes" in body and "rows" in body:
        error(
            ("rows",),
            "a run gives `shapes` or `rows`, not both",
            "shapes: full shapes; rows: row counts at the specs' other sizes",
            key=True,
        )
        return None, None
    shapes = rows = None
    if "shapes" in body:
        value = body["shapes"]
        ok = isinstance(value, list) and value
        for i, shape in enumerate(value if ok else []):
            if not _is_shape(shape):
                error(
                    ("shapes", i),
                    f"{shape!r} is not a shape",
                    "a shape is [M, K, N] (matmul chains) or [M, N], positive integers",
                )
                ok = False
        if not isinstance(value, list) or not value:
            error(("shapes",), "`shapes` must be a list of shapes", FIELDS["shapes"])
        shapes = tuple(tuple(s) for s in value) if ok else None
    if "rows" in body:
        value = body["rows"]
        if not (isinstance(value, list) and value and _counts(value)):
            error(("rows",), f"{value!r} is not a list of row counts", "e.g. rows: [16, 4096]")
        else:
            rows = tuple(value)
    return shapes, rows


def _is_shape(value) -> bool:
    return isinstance(value, list) and len(value) in (2, 3) and _counts(value)


def _counts(values: list) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values)


@contextmanager
def settings(env: dict):
    """os.environ with `env` set, as it was afterwards."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(run_: Run, timer, progress, ceilings=None, device="cuda"):
    """bench.run for one suite run, its FUSEGEN_* settings set meanwhile."""
    with settings(run_.env):
        return bench.run(
            list(run_.kernels),
            run_.shapes_for,
            run_.dtype,
            run_.variants(),
            timer,
            progress,
            ceilings=ceilings,
            device=device,
            tables_dir=run_.tables_dir(),
            layouts=run_.layouts,
        )
