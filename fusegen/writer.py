"""Writing generated files: all or nothing, atomically, or only comparing (`--check`)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Planned:
    path: Path
    text: str


def differences(planned: list[Planned]) -> list[tuple[Path, str]]:
    """(path, "missing" | "differs") for each planned file not already on disk as planned."""
    out = []
    for item in planned:
        if not item.path.exists():
            out.append((item.path, "missing"))
        elif item.path.read_text(encoding="utf-8") != item.text:
            out.append((item.path, "differs"))
    return out


def write_all(planned: list[Planned]) -> list[Path]:
    """Write every file that changed. Each file is replaced atomically (a temporary file
    in the same folder, then a rename), so a reader or a crash never sees half a file.
    Returns the paths written."""
    written = []
    for item in planned:
        if item.path.exists() and item.path.read_text(encoding="utf-8") == item.text:
            continue
        item.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            prefix=f".{item.path.name}.", suffix=".tmp", dir=item.path.parent
        )
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(item.text)
            os.replace(tmp, item.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        written.append(item.path)
    return written
