"""Spec errors: every problem found in a spec, with where it is and what would be valid.

Errors are values. Each stage collects them and keeps going where it safely can, so a
user sees every mistake in one run; the CLI prints them all and exits 2.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

# Control characters (Unicode category Cc), surrogates, line and paragraph separators,
# and the bidirectional-text controls that can make text read differently from what it holds.
_BAD = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e\u2066-\u2069]")

Path = tuple  # path inside the spec: ("kernels", 0, "chain", 2, "gelu")


def format_path(path: Sequence[object]) -> str:
    """("kernels", 0, "chain", 2) -> "kernels[0].chain[2]"."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def bad_character(text: str, allowed: str = "\n\t") -> str | None:
    """The first character of `text` that a spec may not hold (control characters other
    than `allowed`, surrogates, line and paragraph separators, bidirectional controls),
    or None."""
    for match in _BAD.finditer(text):
        if match.group() not in allowed:
            return match.group()
    return None


def printable(text: str) -> str:
    """`text` with the characters bad_character finds written as escapes (\\x1b), so a
    message about a hostile spec cannot drive the terminal it is printed on."""
    if bad_character(text, allowed="") is None:
        return text
    return "".join(ascii(ch)[1:-1] if bad_character(ch, allowed="") else ch for ch in text)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' did you mean ...?' suffix when some choice is close to `word`, else ''."""
    close = difflib.get_close_matches(str(word), sorted(set(choices)), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


@dataclass(frozen=True)
class SpecError:
    file: str
    line: int  # 1-based; 0 when the error is about the file as a whole
    col: int
    path: tuple
    message: str
    hint: str = ""  # what would be valid

    def format(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}" if self.line else self.file
        text = printable(f"{where}: {format_path(self.path)}: {self.message}")
        if self.hint:
            text += f"\n    {printable(self.hint)}"
        return text


@dataclass
class SpecErrors(Exception):
    """Raised by a stage that found errors; carries all of them."""

    errors: list[SpecError] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(e.format() for e in self.errors)
