"""Tuned tables: the configs `fusegen tune` chose, in a JSON file beside each module.

A table is written by `fusegen tune` on a GPU, reviewed and committed with the module;
the generated launcher reads it at its first call (`_from_table` in the runtime) and
uses the entry for its GPU, kernel source and shape instead of tuning. This module
reads, merges, formats and checks tables; it needs neither torch nor triton.

    {"about": ..., "kernel": "gpt2_mlp_up", "spec": "specs/gpt2.yaml", "entries": [
      {"gpu": "NVIDIA H200", "capability": [9, 0], "kernel_hash": "65c32a97306087d3",
       "key": {"M_bucket": 8192, "N": 3072, "K": 768, "dtype": "bfloat16", ...},
       "best": "tma",
       "choices": {"pointer": {"config": {...}, "ms": 0.1}, "tma": {"config": {...}, "ms": 0.09}},
       "tuned": {"shape": [...], "triton": "3.6.0", "torch": "2.11.0", "date": ..., ...}}]}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".tuned.json"
REQUIRED = ("gpu", "capability", "kernel_hash", "key", "best", "choices")
# Values printed on one line each, so that an entry reads as a short block.
_INLINE = ("capability", "key", "config", "shape", "rejected")


class TableError(ValueError):
    """A table that cannot be read: the message names the file and what is wrong."""


def path_for(out_dir: Path, kernel_name: str) -> Path:
    return out_dir / f"{kernel_name}{SUFFIX}"


def read(path: Path) -> dict:
    """The table at `path`, checked for the fields the launcher reads."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise TableError(f"{path}: cannot read it: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise TableError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from exc
    if not isinstance(table, dict) or not isinstance(table.get("entries"), list):
        raise TableError(f'{path}: expected an object with an "entries" list')
    for i, entry in enumerate(table["entries"]):
        missing = [f for f in REQUIRED if not isinstance(entry, dict) or f not in entry]
        if missing:
            raise TableError(f"{path}: entries[{i}] lacks {', '.join(missing)}")
        if entry["best"] not in entry["choices"]:
            raise TableError(f"{path}: entries[{i}]: best '{entry['best']}' is not in its choices")
    return table


def identity(entry: dict) -> tuple:
    """What makes two entries the same slot: one GPU, one key."""
    return (entry["gpu"], tuple(entry["capability"]), tuple(sorted(entry["key"].items())))


def _order(entry: dict) -> tuple:
    key = entry["key"]
    return (
        entry["gpu"],
        tuple(entry["capability"]),
        str(key.get("dtype")),
        *map(str, key.values()),
    )


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """`old` with `new` entries replacing those of the same GPU and key; sorted."""
    fresh = {identity(e) for e in new}
    kept = [e for e in old if identity(e) not in fresh]
    return sorted(kept + new, key=_order)


def render(kernel_name: str, spec_display: str, entries: list[dict], about: str = "") -> str:
    """A table's text: stable key order, sorted entries, short values on one line.
    `about`: what the launcher does with it (default: a chain kernel's launcher)."""
    table = {
        "about": about
        or (
            f"Configs `fusegen tune` chose for {kernel_name}. The launcher in {kernel_name}.py "
            "uses an entry when its GPU name, capability and kernel_hash match, from the "
            "entry of the call's row bucket or one next to it; else it tunes at run time. "
            f"Regenerate with `fusegen tune {spec_display} --shapes ...` on the GPU."
        ),
        "kernel": kernel_name,
        "spec": spec_display,
        "entries": sorted(entries, key=_order),
    }
    inline: list[str] = []

    def stash(value):
        if isinstance(value, dict):
            return {k: (_mark(inline, v) if k in _INLINE else stash(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [stash(v) for v in value]
        return value

    text = json.dumps(stash(table), indent=2, ensure_ascii=False)
    for i, value in enumerate(inline):
        text = text.replace(f'"\\u0000{i}\\u0000"', json.dumps(value, ensure_ascii=False))
    return text + "\n"


def _mark(inline: list, value) -> str:
    inline.append(value)
    return f"\0{len(inline) - 1}\0"


@dataclass(frozen=True)
class Staleness:
    path: Path
    stale: int  # entries tuned for other kernel source
    total: int

    def message(self) -> str:
        return (
            f"{self.stale} of {self.total} tuned entries were measured on other kernel source "
            "(their kernel_hash differs from the module's KERNEL_HASH); the launcher ignores "
            "them. Run `fusegen tune` on the GPU to measure them again"
        )


def staleness(path: Path, kernel_hash: str) -> Staleness | None:
    """How many of a table's entries no longer match the module's kernel source (None
    when all do or there is no table). Raises TableError for an unreadable table."""
    if not path.exists():
        return None
    entries = read(path)["entries"]
    stale = sum(e["kernel_hash"] != kernel_hash for e in entries)
    return Staleness(path, stale, len(entries)) if stale else None
