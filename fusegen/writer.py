"""Writing generated files: all or nothing, atomically, or only comparing (`--check`)."""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Planned:
    path: Path
    text: str


class WriteError(Exception):
    """A planned file cannot be written (a folder or file in the way, no permission);
    nothing was replaced."""


def _on_disk(path: Path) -> bytes | None:
    """The file's bytes, None where there is none; a folder in its place is a WriteError."""
    if path.is_dir():
        raise WriteError(f"{path}: a folder is in the way of a generated file")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def differences(planned: list[Planned]) -> list[tuple[Path, str]]:
    """(path, "missing" | "differs") for each planned file not already on disk as planned
    (a folder in a file's place differs)."""
    out = []
    for item in planned:
        try:
            found = _on_disk(item.path)
        except WriteError:
            out.append((item.path, "differs (a folder is in its place)"))
            continue
        except OSError as exc:
            out.append((item.path, f"differs (cannot read it: {exc.strerror or exc})"))
            continue
        if found is None:
            out.append((item.path, "missing"))
        elif found != item.text.encode("utf-8"):
            out.append((item.path, "differs"))
    return out


def _fresh_mode() -> int:
    """The mode open() gives a new file here: 0666 less the umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def write_all(planned: list[Planned], last: tuple[Path, ...] = ()) -> list[Path]:
    """Write every file that changed, all or nothing: each new text goes to a temporary
    file beside its target first; only when every one is written are they renamed into
    place (a reader or a crash never sees half a file, and a folder that cannot be
    written leaves every file as it was). `last`: paths renamed after the others (the
    runtime's hash, so that an interrupted rename leaves a runtime its modules refuse).
    Returns the paths written; raises WriteError."""
    changed = []
    for item in planned:
        try:
            if _on_disk(item.path) != item.text.encode("utf-8"):
                changed.append(item)
        except OSError as exc:
            raise WriteError(f"{item.path}: cannot read it: {exc.strerror or exc}") from None
    changed.sort(key=lambda item: item.path in last)
    temporary: list[tuple[str, Path]] = []
    fresh = _fresh_mode()
    try:
        for item in changed:
            item.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(
                prefix=f".{item.path.name}.", suffix=".tmp", dir=item.path.parent
            )
            temporary.append((tmp, item.path))
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(item.text)
            # mkstemp makes 0600: the file keeps its mode, or a new one gets the umask's.
            try:
                mode = stat.S_IMODE(item.path.stat().st_mode)
            except FileNotFoundError:
                mode = fresh
            os.chmod(tmp, mode)
    except OSError as exc:
        for tmp, _ in temporary:
            Path(tmp).unlink(missing_ok=True)
        where = exc.filename or (temporary[-1][1] if temporary else "")
        raise WriteError(f"{where}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        for tmp, _ in temporary:
            Path(tmp).unlink(missing_ok=True)
        raise
    for done, (tmp, path) in enumerate(temporary):
        try:
            os.replace(tmp, path)
        except OSError as exc:
            for left, _ in temporary[done:]:
                Path(left).unlink(missing_ok=True)
            raise WriteError(
                f"{path}: cannot replace it: {exc.strerror or exc} ({done} of "
                f"{len(temporary)} files were replaced)"
            ) from None
    return [path for _, path in temporary]
