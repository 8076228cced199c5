"""YAML with positions: plain Python data plus a map from each value's path to its line and column.

PyYAML's composer already knows where every node starts; we keep those marks so a pydantic error
at `hypotheses.0.children.2.confirm` can be reported as `FILE:LINE:COL`.

A runbook is shared like code, so the loader bounds what a file may cost before it is trusted: its
size, how deep it nests, how many nodes it has once aliases are expanded (a "billion laughs" is a few
lines of text), and how big an integer may be. Each refusal names the limit it hit, at the place it
was hit; the limits are listed in the README ("Limits").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Loc = tuple[Any, ...]

# Limits (the README's "Limits" section names each one). The largest bundled runbook is 27 KB,
# 760 nodes and 8 levels deep: these are far above what a hand-written runbook needs and far
# below what would take a second or a few hundred MB to load.
MAX_FILE_BYTES = 512 * 1024
MAX_DEPTH = 64  # nested mappings/sequences (a hypothesis level costs 2: `children:` list + mapping)
MAX_NODES = 10_000  # YAML nodes with every alias expanded
MAX_INT = 2**63  # integers must fit in 64 bits (what JSON readers and NVML/SGLang values use)


@dataclass(frozen=True)
class Pos:
    line: int  # 1-based
    col: int  # 1-based


class SourceError(Exception):
    """An error the user can fix in a file: printed as `FILE:LINE:COL: message`, never a traceback."""

    def __init__(self, path: str | Path, pos: Pos | None, message: str) -> None:
        self.path, self.pos, self.message = str(path), pos, message
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.pos:
            return f"{self.path}:{self.pos.line}:{self.pos.col}: {self.message}"
        if not Path(self.path).is_file():  # a name that matched nothing: a position would be made up
            return f"{self.path}: {self.message}"
        return f"{self.path}:1:1: {self.message}"


@dataclass
class Document:
    path: str
    data: Any
    positions: dict[Loc, Pos] = field(default_factory=dict)
    key_positions: dict[Loc, Pos] = field(default_factory=dict)  # where the key of a mapping entry sits
    styles: dict[Loc, str | None] = field(default_factory=dict)  # scalar style: None plain, '"', "'", '|', '>'
    text: str | None = None  # the file's text, to place errors inside block scalars

    def pos(self, loc: Loc, *, key: bool = False) -> Pos | None:
        """The closest known position for `loc`, walking up to the parent when a path is unknown."""
        loc = tuple(loc)
        while True:
            table = self.key_positions if key else self.positions
            if loc in table:
                return table[loc]
            if key and loc in self.positions:
                return self.positions[loc]
            if not loc:
                return None
            loc = loc[:-1]

    def inner_pos(self, loc: Loc, line: int, col: int, source: str | None = None) -> Pos | None:
        """Where (line, col) inside a scalar's text sits in the file (for CEL errors in a rule)."""
        start = self.positions.get(tuple(loc))
        if start is None:
            return None
        style = self.styles.get(tuple(loc))
        if source is not None and self.text is not None:
            offset = sum(len(part) + 1 for part in source.split("\n")[: line - 1]) + col - 1
            if style in ("|", ">"):
                return self._block_pos(start, offset, style)
            return self._flow_pos(start, offset, style)
        if line == 1:
            return Pos(start.line, start.col + (1 if style in ('"', "'") else 0) + col - 1)
        return Pos(start.line + line - 1, col)

    def _block_pos(self, start: Pos, offset: int, style: str) -> Pos:
        """Block scalars (| and >) start on the line after their indicator; literal lines keep their breaks
        and folded ones become spaces, so each raw line stands for its text plus one separator, except
        that in a folded scalar the first blank line after a text line is that line's break itself."""
        raw = (self.text or "").splitlines()[start.line :]  # start.line is 1-based: this is the next line
        indent = next((len(r) - len(r.lstrip(" ")) for r in raw if r.strip()), 0)
        after_text = False
        for number, text in enumerate(raw, start=start.line + 1):
            content = text[indent:]
            if not text.strip() and style == ">" and after_text:
                after_text = False
                continue
            if offset <= len(content):
                return Pos(number, indent + offset + 1)
            offset -= len(content) + 1
            after_text = bool(text.strip())
        return Pos(start.line + 1, indent + 1)

    def _flow_pos(self, start: Pos, offset: int, style: str | None) -> Pos:
        """Plain and quoted scalars: YAML folds a line break and the indentation after it into one space (a
        blank line into a newline), and a quoted scalar's escapes ('' or \\x) are one character each."""
        lines = (self.text or "").splitlines()
        li, ci = start.line - 1, start.col - 1 + (1 if style in ('"', "'") else 0)
        passed = 0  # characters of the value before (li, ci)
        while li < len(lines):
            raw = lines[li]
            while ci < len(raw):
                if passed >= offset:
                    return Pos(li + 1, ci + 1)
                if style == "'" and raw.startswith("''", ci):
                    ci += 2
                elif style == '"' and raw[ci] == "\\":
                    ci += 2 + {"x": 2, "u": 4, "U": 8}.get(raw[ci + 1 : ci + 2], 0)
                else:
                    ci += 1
                passed += 1
            li, blanks = li + 1, 0
            while li < len(lines) and not lines[li].strip():
                li, blanks = li + 1, blanks + 1
            passed += max(1, blanks)
            if li < len(lines):
                ci = len(lines[li]) - len(lines[li].lstrip())
        return start

    def error(self, loc: Loc, message: str, *, key: bool = False) -> SourceError:
        return SourceError(self.path, self.pos(loc, key=key), message)


def _mark(node: yaml.Node) -> Pos:
    return Pos(node.start_mark.line + 1, node.start_mark.column + 1)


class LimitError(Exception):
    """A document beyond one of the limits above, with the YAML mark where the limit was crossed."""

    def __init__(self, mark: Any, message: str) -> None:
        super().__init__(message)
        self.pos = Pos(mark.line + 1, mark.column + 1) if mark is not None else None
        self.message = message


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader's composer, counting depth and expanded nodes as it goes: it stops at the
    node that crosses a limit, before the recursion or the expansion costs anything."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._expanded = 0
        self._sizes: dict[int, int] = {}  # id(node) -> nodes in it, aliases expanded
        self._open_anchors: set[str] = set()  # anchors of the collections being composed right now

    def _count(self, n: int, mark: Any, what: str) -> None:
        self._expanded += n
        if self._expanded > MAX_NODES:
            raise LimitError(mark, f"{what}: the document expands to more than {MAX_NODES:,} YAML nodes (limit: MAX_NODES {MAX_NODES:,})")

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise LimitError(event.start_mark, f"alias *{event.anchor} refers to the node it is inside (recursive YAML anchors are not supported)")
            node = super().compose_node(parent, index)
            self._count(self._sizes.get(id(node), 1), event.start_mark, f"alias *{event.anchor}")
            return node
        nested = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if nested and self._depth >= MAX_DEPTH:
            raise LimitError(event.start_mark, f"nesting deeper than {MAX_DEPTH} levels (limit: MAX_DEPTH {MAX_DEPTH})")
        before = self._expanded
        self._count(1, event.start_mark, "this node")
        anchor = event.anchor if nested else None
        self._depth += nested
        if anchor:
            self._open_anchors.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= nested
            self._open_anchors.discard(anchor)
        self._sizes[id(node)] = self._expanded - before
        return node


_PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


class _Builder:
    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.constructor = yaml.SafeLoader("")  # resolves scalars exactly as safe_load does

    def build(self, node: yaml.Node, loc: Loc) -> Any:
        self.doc.positions[loc] = _mark(node)
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and node.tag not in _PLAIN_TAGS:
            raise SourceError(self.doc.path, _mark(node), f"YAML tag {node.tag.replace('tag:yaml.org,2002:', '!!')} is not supported (plain mappings and lists only)")
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.build_scalar(key_node)
                if key in out:
                    raise SourceError(self.doc.path, _mark(key_node), f"duplicate key '{key}'")
                self.doc.key_positions[loc + (key,)] = _mark(key_node)
                out[key] = self.build(value_node, loc + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(child, loc + (i,)) for i, child in enumerate(node.value)]
        self.doc.styles[loc] = node.style
        return self.build_scalar(node)

    def build_scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise SourceError(self.doc.path, _mark(node), "a mapping key must be a plain value")
        if node.tag.endswith(":int") and sum(c.isdigit() for c in node.value) > 25:
            raise SourceError(self.doc.path, _mark(node), f"integer {_shown(node.value)} does not fit in 64 bits (limit: MAX_INT 2**63)")
        try:
            value = self.constructor.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError:
            raise
        except Exception as exc:  # noqa: BLE001 - YAML resolved the tag, Python could not convert the text
            raise SourceError(self.doc.path, _mark(node), f"{_shown(node.value)} is not a valid {_tag_name(node.tag)}: {_reason(exc)}") from None
        if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT <= value < MAX_INT:
            raise SourceError(self.doc.path, _mark(node), f"integer {_shown(node.value)} does not fit in 64 bits (limit: MAX_INT 2**63)")
        if isinstance(value, float) and math.isinf(value) and node.value.strip().lower().lstrip("+-") not in (".inf",):
            raise SourceError(self.doc.path, _mark(node), f"number {_shown(node.value)} is too large for a float")
        return value


def _tag_name(tag: str) -> str:
    short = tag.rsplit(":", 1)[-1]
    return {"int": "integer", "float": "number", "bool": "boolean (true or false)", "timestamp": "date or timestamp"}.get(short, short)


def _shown(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _reason(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return "not one of the words YAML accepts"
    if isinstance(exc, AttributeError):
        return "not in a format YAML accepts"
    return str(exc).split("\n")[0][:200] or type(exc).__name__


def load(path: str | Path, text: str | None = None) -> Document:
    """Parse one YAML document; YAML syntax errors come back as SourceError with the parser's position."""
    path = str(path)
    if text is None:
        try:
            size = Path(path).stat().st_size
            if size > MAX_FILE_BYTES:
                raise SourceError(path, None, f"the file is {size:,} bytes, more than a runbook may be (limit: MAX_FILE_BYTES {MAX_FILE_BYTES:,})")
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise SourceError(path, None, f"cannot read file: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise SourceError(path, None, f"not UTF-8 text (byte {exc.start})") from None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise SourceError(path, None, f"the text is more than a runbook may be (limit: MAX_FILE_BYTES {MAX_FILE_BYTES:,})")
    doc = Document(path=path, data=None, text=text)
    loader = None
    try:
        loader = _BoundedLoader(text)
        node = loader.get_single_node()
    except yaml.reader.ReaderError as exc:  # a control character: YAML refuses it before parsing
        before = text[: exc.position]
        pos = Pos(before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1)
        raise SourceError(path, pos, f"character U+{exc.character:04X} is not allowed in YAML (control characters must be escaped in a quoted string)") from None
    except LimitError as exc:
        raise SourceError(path, exc.pos, exc.message) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = Pos(mark.line + 1, mark.column + 1) if mark else None
        raise SourceError(path, pos, f"YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:  # pragma: no cover - other YAML errors carry no mark
        raise SourceError(path, None, f"YAML error: {exc}") from None
    except RecursionError:  # pragma: no cover - MAX_DEPTH stops nesting long before Python's limit
        raise SourceError(path, None, f"nesting too deep (limit: MAX_DEPTH {MAX_DEPTH})") from None
    finally:
        if loader is not None:
            loader.dispose()
    if node is None:
        raise SourceError(path, None, "the file is empty")
    try:
        doc.data = _Builder(doc).build(node, ())
    except RecursionError:
        raise SourceError(path, None, "an alias refers to itself (recursive YAML anchors are not supported)") from None
    except yaml.constructor.ConstructorError as exc:
        if "merge" in str(exc.problem):
            mark = exc.problem_mark
            raise SourceError(path, Pos(mark.line + 1, mark.column + 1) if mark else None, "YAML merge keys (<<) are not supported: repeat the fields") from None
        mark = exc.problem_mark
        raise SourceError(path, Pos(mark.line + 1, mark.column + 1) if mark else None, str(exc.problem)) from None
    return doc
