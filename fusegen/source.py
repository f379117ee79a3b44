"""Read a spec file: YAML text -> plain Python data, remembering where every value stood.

PyYAML's `safe_load` forgets positions and silently keeps the last of two equal keys.
Here the node tree is walked by hand so that each value keeps its line and column (for
error messages) and a repeated key is an error instead of a silent overwrite.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml
from yaml.constructor import SafeConstructor

from fusegen.errors import SpecError, SpecErrors


@dataclass(frozen=True)
class SpecSource:
    path: Path  # where the file is on this machine
    display: str  # the name used in messages and headers: relative, machine-independent
    text: str
    data: object
    values: dict  # spec path -> (line, col) of the value, 1-based
    keys: dict  # spec path -> (line, col) of the mapping key that names it

    @property
    def sha256(self) -> str:
        # Line endings are normalised so a checkout with CRLF hashes the same.
        return hashlib.sha256(self.text.replace("\r\n", "\n").encode()).hexdigest()

    def locate(self, path: tuple, *, key: bool = False) -> tuple[int, int]:
        """Line and column of `path`, or of its nearest ancestor that exists in the file."""
        path = tuple(path)
        while True:
            if key and path in self.keys:
                return self.keys[path]
            if path in self.values:
                return self.values[path]
            if not path:
                return (1, 1)
            path = path[:-1]

    def error(self, path: tuple, message: str, hint: str = "", *, key: bool = False) -> SpecError:
        line, col = self.locate(path, key=key)
        return SpecError(self.display, line, col, tuple(path), message, hint)


def display_name(path: Path) -> str:
    """The spec's path relative to its repository (the nearest folder with .git or
    pyproject.toml), else relative to the working directory, else its bare name; always
    with forward slashes, so headers are the same on every machine."""
    path = path.resolve()
    for parent in path.parents:
        if (parent / ".git").exists() or (parent / "pyproject.toml").exists():
            return path.relative_to(parent).as_posix()
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.name


class _Walker:
    def __init__(self, display: str):
        self.display = display
        self.constructor = SafeConstructor()
        self.values: dict = {}
        self.keys: dict = {}
        self.errors: list[SpecError] = []

    def mark(self, node) -> tuple[int, int]:
        return (node.start_mark.line + 1, node.start_mark.column + 1)

    def walk(self, node, path: tuple):
        self.values[path] = self.mark(node)
        if isinstance(node, yaml.MappingNode):
            self.constructor.flatten_mapping(node)  # supports `<<: *anchor` merges
            out: dict = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    line, col = self.mark(key_node)
                    self.errors.append(
                        SpecError(self.display, line, col, path, "mapping keys must be plain names")
                    )
                    continue
                key = self.constructor.construct_object(key_node)
                if isinstance(key, bool) or not isinstance(key, (str, int)):
                    # YAML 1.1 reads `on`, `off`, `yes`, `no` as booleans.
                    key = key_node.value
                if key in out:
                    line, col = self.mark(key_node)
                    first = self.keys[path + (key,)]
                    self.errors.append(
                        SpecError(
                            self.display,
                            line,
                            col,
                            path + (key,),
                            f"key '{key}' appears twice in this mapping (first at line {first[0]})",
                            "remove one of them: YAML would silently keep only the last",
                        )
                    )
                    continue
                self.keys[path + (key,)] = self.mark(key_node)
                out[key] = self.walk(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.walk(item, path + (i,)) for i, item in enumerate(node.value)]
        return self.constructor.construct_object(node)


def load(path: Path, display: str | None = None) -> SpecSource:
    """Parse one spec file. Raises SpecErrors for unreadable, empty or non-YAML files."""
    path = Path(path)
    display = display or display_name(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecErrors([SpecError(display, 0, 0, (), f"cannot read the file: {exc}")]) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        message = f"not valid YAML: {problem}" + (f" ({context})" if context else "")
        raise SpecErrors([SpecError(display, line, col, (), message)]) from None
    if node is None:
        raise SpecErrors(
            [
                SpecError(
                    display,
                    0,
                    0,
                    (),
                    "the file is empty",
                    "a spec is a mapping with a `kernels:` list; see docs/spec.md",
                )
            ]
        )
    walker = _Walker(display)
    data = walker.walk(node, ())
    if walker.errors:
        raise SpecErrors(walker.errors)
    if not isinstance(data, dict):
        line, col = walker.values[()]
        raise SpecErrors(
            [
                SpecError(
                    display,
                    line,
                    col,
                    (),
                    f"the file holds a {type(data).__name__}, not a mapping",
                    "a spec is a mapping with a `kernels:` list; see docs/spec.md",
                )
            ]
        )
    return SpecSource(path, display, text, data, walker.values, walker.keys)
