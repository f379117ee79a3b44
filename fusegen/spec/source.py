"""Read a spec file: YAML text -> plain Python data, remembering where every value stood.

PyYAML's `safe_load` forgets positions and silently keeps the last of two equal keys.
Here the node tree is walked by hand so that each value keeps its line and column (for
error messages) and a repeated key is an error instead of a silent overwrite.

A spec is untrusted input, so reading it is bounded (fusegen.spec.limits): the file's size is
checked before it is read, the composer stops at a depth and a count of values, and the
walk counts every value an alias stands for each time it is used, so a small file that
expands to billions of values, or an anchor that contains itself, is an error at a line
instead of memory and time without end. Only plain YAML is read: mappings, lists,
strings, numbers, booleans and null; other tags (`!!python/...`, `!custom`, `!!binary`)
are errors.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from yaml.constructor import SafeConstructor

from fusegen.spec import limits
from fusegen.errors import SpecError, SpecErrors, bad_character

_YAML = "tag:yaml.org,2002:"
_MAP, _SEQ, _MERGE, _VALUE, _TIMESTAMP = (
    _YAML + t for t in ("map", "seq", "merge", "value", "timestamp")
)
_SCALAR_TAGS = frozenset(_YAML + t for t in ("str", "int", "float", "bool", "null"))
_PLAIN = "a spec holds only mappings, lists, strings, numbers, booleans and null"


@dataclass
class Budget:
    """What the spec files of one build may still use, all files together (see
    fusegen.spec.limits): bytes to read and YAML values to compose and expand."""

    bytes: int = field(default_factory=lambda: limits.MAX_BYTES)
    nodes: int = field(default_factory=lambda: limits.MAX_NODES)


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
    """The spec's path relative to its repository (the nearest folder with .git, else
    the nearest with pyproject.toml: the packages of one git repository name their specs
    apart), else relative to the working directory (`..` where it is not below it);
    always with forward slashes, so headers are the same on every machine. Two spec files
    never share a name: a build removes the modules a spec of its name no longer makes."""
    path = path.resolve()
    for marker in (".git", "pyproject.toml"):
        for parent in path.parents:
            if (parent / marker).exists():
                return path.relative_to(parent).as_posix() or "."
    try:
        return Path(os.path.relpath(path, Path.cwd().resolve())).as_posix()
    except ValueError:  # another drive (Windows)
        return path.as_posix()


def _short(text: str, chars: int = 40) -> str:
    return text if len(text) <= chars else text[:chars] + "..."


class _Stop(Exception):
    """A limit was reached: reading the file stops here with this one error."""

    def __init__(self, mark, path: tuple, message: str, hint: str):
        self.mark, self.path, self.message, self.hint = mark, path, message, hint


def _too_many(mark, path: tuple = ()) -> _Stop:
    return _Stop(
        mark,
        path,
        f"more than {limits.MAX_NODES:,} YAML values in the specs of this build "
        "(an alias counts the values it stands for, each time it is used)",
        "a real spec holds under 100; check for aliases used inside aliases",
    )


def _too_deep(mark, path: tuple = ()) -> _Stop:
    return _Stop(
        mark,
        path,
        f"lists and mappings nested more than {limits.MAX_DEPTH} levels deep",
        "a spec needs 6 levels (a `<<` merge counts as one)",
    )


class _Alias(yaml.Node):
    """One use of an alias (`*name`): PyYAML hands back the anchored node itself, which
    forgets where the alias stood and hides an anchor that contains itself."""

    id = "alias"

    def __init__(self, target: yaml.Node, event: yaml.AliasEvent):
        super().__init__(target.tag, None, event.start_mark, event.end_mark)
        self.target = target
        self.anchor = event.anchor


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, composing no more than `nodes` values and `MAX_DEPTH` levels
    (its composer recurses once per level) and marking every alias use. A number with an
    exponent and no dot (`1e-4`) is a float, as in YAML 1.2 (1.1 reads it as text)."""

    def __init__(self, text: str, nodes: int):
        super().__init__(text)
        self.nodes_left = nodes
        self.depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        self.nodes_left -= 1
        if self.nodes_left < 0:
            raise _too_many(event.start_mark)
        if isinstance(event, yaml.AliasEvent):
            return _Alias(super().compose_node(parent, index), event)
        if not isinstance(event, yaml.CollectionStartEvent):
            return super().compose_node(parent, index)
        if self.depth >= limits.MAX_DEPTH:
            raise _too_deep(event.start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


# YAML 1.2's booleans, true and false alone: 1.1's `yes`, `no`, `on`, `off` are text (as
# the JSON Schema's editors read them), so `nonfinite: off` is the word.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _YAML + "bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _YAML + "bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
# YAML 1.2's floats that YAML 1.1 leaves as text: digits and an exponent, no dot.
_Loader.add_implicit_resolver(
    _YAML + "float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

_INVALID = object()  # a scalar that was reported as an error


class _Walker:
    def __init__(self, display: str, nodes: int):
        self.display = display
        self.constructor = SafeConstructor()
        self.values: dict = {}
        self.keys: dict = {}
        self.errors: list[SpecError] = []
        self.nodes_left = nodes
        self.open: set[int] = set()  # collections being read: an alias to one is a cycle
        self.expanding: list[tuple[_Alias, tuple]] = []  # alias uses being read, outermost first
        self.scalars: dict[int, object] = {}  # id(scalar node) -> its value

    def mark(self, node) -> tuple[int, int]:
        return (node.start_mark.line + 1, node.start_mark.column + 1)

    def error(self, node, path: tuple, message: str, hint: str = "") -> None:
        line, col = self.mark(node)
        self.errors.append(SpecError(self.display, line, col, path, message, hint))

    def stop(self, limit, node, path: tuple) -> _Stop:
        # Point at the alias use that started the expansion, where there is one.
        where, at = self.expanding[0] if self.expanding else (node, path)
        return limit(where.start_mark, at)

    def count(self, node, path: tuple) -> None:
        self.nodes_left -= 1
        if self.nodes_left < 0:
            raise self.stop(_too_many, node, path)

    def target(self, node, path: tuple):
        """The node an alias stands for (the node itself if it is none); None, with an
        error, for an alias inside its own anchor."""
        if not isinstance(node, _Alias):
            return node
        if id(node.target) in self.open:
            self.error(
                node,
                path,
                f"alias '*{_short(node.anchor)}' is used inside its own anchor",
                "an anchor cannot contain itself: its value would be infinitely deep",
            )
            return None
        return node.target

    def walk(self, node, path: tuple, depth: int = 0):
        self.values[path] = self.mark(node)
        self.count(node, path)
        alias = isinstance(node, _Alias)
        if alias:
            self.expanding.append((node, path))
        try:
            target = self.target(node, path)
            if target is None:
                return None
            if isinstance(target, yaml.ScalarNode):
                value = self.scalar(target, path)
                return None if value is _INVALID else value
            if depth >= limits.MAX_DEPTH:
                raise self.stop(_too_deep, target, path)
            kind, tag = (
                ("mapping", _MAP) if isinstance(target, yaml.MappingNode) else ("list", _SEQ)
            )
            if target.tag != tag:
                self.error(
                    target, path, f"unsupported YAML tag '{self.tag(target)}' on a {kind}", _PLAIN
                )
                return None
            self.open.add(id(target))
            try:
                if kind == "mapping":
                    return self.mapping(target, path, depth + 1)
                return [
                    self.walk(item, path + (i,), depth + 1) for i, item in enumerate(target.value)
                ]
            finally:
                self.open.discard(id(target))
        finally:
            if alias:
                self.expanding.pop()

    @staticmethod
    def tag(node) -> str:
        tag = node.tag
        return _short("!!" + tag[len(_YAML) :] if tag.startswith(_YAML) else tag)

    def scalar(self, node, path: tuple):
        # An alias may use one long scalar thousands of times: read it once.
        key = id(node)
        if key not in self.scalars:
            self.scalars[key] = self.read_scalar(node, path)
        return self.scalars[key]

    def read_scalar(self, node, path: tuple):
        text = node.value
        if len(text) > limits.MAX_SCALAR_CHARS:
            self.error(
                node,
                path,
                f"a value of {len(text):,} characters",
                f"a value (a name, a doc) has at most {limits.MAX_SCALAR_CHARS:,} characters",
            )
            return _INVALID
        ch = bad_character(text)
        if ch is not None:
            self.error(
                node,
                path,
                f"the value holds the control character U+{ord(ch):04X}",
                "a spec's text is printable characters, spaces, tabs and newlines",
            )
            return _INVALID
        if node.tag == _TIMESTAMP:
            return text  # no field takes a date: `doc: 2024-01-01` is text
        if node.tag not in _SCALAR_TAGS:
            self.error(node, path, f"unsupported YAML tag '{self.tag(node)}'", _PLAIN)
            return _INVALID
        try:
            value = self.constructor.yaml_constructors[node.tag](self.constructor, node)
        except (ValueError, KeyError, yaml.YAMLError):
            self.error(node, path, f"'{_short(text)}' is not a valid {self.tag(node)}")
            return _INVALID
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limits.MAX_INT:
            self.error(
                node,
                path,
                f"the integer {_short(text, 24)} is out of range",
                f"integers in a spec are at most 2**63 - 1 ({limits.MAX_INT:,}) in size",
            )
            return _INVALID
        return value

    def mapping(self, node, path: tuple, depth: int) -> dict:
        # Merged keys come first and explicit keys override them, as in PyYAML; of
        # `<<: [*a, *b]`, a's keys override b's.
        out: dict = {}
        pairs = []
        merge_line = 0
        for key_node, value_node in node.value:
            self.count(key_node, path)
            key_node = self.target(key_node, path)
            if key_node is None:
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.error(key_node, path, "mapping keys must be plain names")
            elif key_node.tag == _MERGE:
                if merge_line:
                    self.error(
                        key_node,
                        path,
                        f"a second merge key `<<` in this mapping (first at line {merge_line})",
                        "merge several mappings with one key: `<<: [*a, *b]`",
                    )
                    continue
                merge_line = self.mark(key_node)[0]
                for source in self.merge_sources(value_node, path):
                    out.update(self.merged(source, path, depth))
            else:
                pairs.append((key_node, value_node))
        seen: dict = {}
        for key_node, value_node in pairs:
            if key_node.tag == _VALUE:
                key = key_node.value
            else:
                key = self.scalar(key_node, path)
                if key is _INVALID:
                    continue
                if isinstance(key, bool) or not isinstance(key, (str, int)):
                    key = key_node.value  # a key `true`: the text
            if key in seen:
                line, col = self.mark(key_node)
                self.errors.append(
                    SpecError(
                        self.display,
                        line,
                        col,
                        path + (key,),
                        f"key '{key}' appears twice in this mapping (first at line {seen[key]})",
                        "remove one of them: YAML would silently keep only the last",
                    )
                )
                continue
            seen[key] = self.mark(key_node)[0]
            self.keys[path + (key,)] = self.mark(key_node)
            out[key] = self.walk(value_node, path + (key,), depth)
        return out

    def merge_sources(self, node, path: tuple) -> list:
        """The mappings a `<<` key merges, in the order they apply (later ones win)."""
        self.count(node, path)
        target = self.target(node, path)
        if target is None:
            return []
        if isinstance(target, yaml.MappingNode):
            return [node]
        if isinstance(target, yaml.SequenceNode) and all(
            isinstance(item.target if isinstance(item, _Alias) else item, yaml.MappingNode)
            for item in target.value
        ):
            return target.value[::-1]
        self.error(
            node,
            path,
            "a merge key `<<` takes a mapping or a list of mappings",
            "for example `<<: *base` where `base: &base {M: dynamic}`",
        )
        return []

    def merged(self, source, path: tuple, depth: int) -> dict:
        if depth >= limits.MAX_DEPTH:
            raise self.stop(_too_deep, source, path)
        alias = isinstance(source, _Alias)
        if alias:
            self.expanding.append((source, path))
        target = self.target(source, path)
        try:
            if target is None:
                return {}
            self.open.add(id(target))
            try:
                return self.mapping(target, path, depth + 1)
            finally:
                self.open.discard(id(target))
        finally:
            if alias:
                self.expanding.pop()


def _file_error(display: str, message: str, hint: str = "", line: int = 0, col: int = 0):
    return SpecErrors([SpecError(display, line, col, (), message, hint)])


def _read(path: Path, display: str, budget: Budget) -> str:
    """The file's text, its size checked before it is read; CRLF and CR become LF."""
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise _file_error(display, "not a regular file", "a spec is a .yaml file")
            if info.st_size > budget.bytes:
                raise _file_error(display, *_too_big(info.st_size, budget))
            raw = f.read(budget.bytes + 1)
    except OSError as exc:
        raise _file_error(display, f"cannot read the file: {exc.strerror or exc}") from None
    if len(raw) > budget.bytes:  # it grew while being read
        raise _file_error(display, *_too_big(len(raw), budget))
    budget.bytes -= len(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _file_error(
            display,
            f"cannot read the file: byte 0x{raw[exc.start]:02x} is not UTF-8 ({exc.reason})",
            "a spec is UTF-8 text",
            line,
            col,
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _too_big(size: int, budget: Budget) -> tuple[str, str]:
    read = limits.MAX_BYTES - budget.bytes
    earlier = f", after {read:,} in the build's other specs" if read else ""
    return (
        f"the file is {size:,} bytes{earlier}",
        f"one build reads at most {limits.MAX_BYTES:,} bytes of specs; a spec is a few KB",
    )


def load(path: Path, display: str | None = None, budget: Budget | None = None) -> SpecSource:
    """Parse one spec file. Raises SpecErrors for unreadable, empty, non-YAML or
    oversized files. `budget` is shared by the files of one build (a fresh one if None)."""
    path = Path(path)
    budget = budget or Budget()
    display = display or display_name(path)
    ch = bad_character(display, allowed="")
    if ch is not None:
        # The name is copied into the generated files' header comments.
        raise _file_error(
            display,
            f"the file name holds the control character U+{ord(ch):04X}",
            "rename the file: its name appears in the generated files' headers",
        )
    text = _read(path, display, budget)
    loader = None
    try:
        loader = _Loader(text, budget.nodes)
        node = loader.get_single_node()
    except _Stop as stop:
        line, col = stop.mark.line + 1, stop.mark.column + 1
        raise SpecErrors([SpecError(display, line, col, (), stop.message, stop.hint)]) from None
    except yaml.YAMLError as exc:
        raise SpecErrors([_yaml_error(display, text, exc)]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if node is None:
        raise _file_error(
            display,
            "the file is empty",
            "a spec is a mapping with a `kernels:` list; see docs/spec.md",
        )
    walker = _Walker(display, budget.nodes)
    try:
        data = walker.walk(node, ())
    except _Stop as stop:
        line, col = stop.mark.line + 1, stop.mark.column + 1
        walker.errors.append(SpecError(display, line, col, stop.path, stop.message, stop.hint))
    budget.nodes = max(walker.nodes_left, 0)
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


def _yaml_error(display: str, text: str, exc: yaml.YAMLError) -> SpecError:
    if isinstance(exc, yaml.reader.ReaderError):
        # A character YAML does not allow in a stream (NUL, other controls).
        before = text[: exc.position]
        line = before.count("\n") + 1
        col = exc.position - (before.rfind("\n") + 1) + 1
        return SpecError(
            display,
            line,
            col,
            (),
            f"not valid YAML: the control character U+{exc.character:04X} is not allowed",
            "a spec's text is printable characters, spaces, tabs and newlines",
        )
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    message = f"not valid YAML: {problem}" + (f" ({context})" if context else "")
    return SpecError(display, line, col, (), message)
