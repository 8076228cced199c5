"""YAML with positions: plain Python data plus a map from each value's path to its line and column.

PyYAML's composer already knows where every node starts; we keep those marks so a pydantic error
at `hypotheses.0.children.2.confirm` can be reported as `FILE:LINE:COL`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Loc = tuple[Any, ...]


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
        if style in ("|", ">") and source is not None and self.text is not None:
            return self._block_pos(start, line, col, source)
        if line == 1:
            return Pos(start.line, start.col + (1 if style in ('"', "'") else 0) + col - 1)
        return Pos(start.line + line - 1, col)

    def _block_pos(self, start: Pos, line: int, col: int, source: str) -> Pos:
        """Block scalars (| and >) start on the line after their indicator; literal lines keep their breaks
        and folded ones become spaces, so each raw line stands for its text plus one separator."""
        offset = sum(len(part) + 1 for part in source.split("\n")[: line - 1]) + col - 1
        raw = (self.text or "").splitlines()[start.line :]  # start.line is 1-based: this is the next line
        indent = next((len(r) - len(r.lstrip(" ")) for r in raw if r.strip()), 0)
        for number, text in enumerate(raw, start=start.line + 1):
            content = text[indent:]
            if offset <= len(content):
                return Pos(number, indent + offset + 1)
            offset -= len(content) + 1
        return Pos(start.line + 1, indent + 1)

    def error(self, loc: Loc, message: str, *, key: bool = False) -> SourceError:
        return SourceError(self.path, self.pos(loc, key=key), message)


def _mark(node: yaml.Node) -> Pos:
    return Pos(node.start_mark.line + 1, node.start_mark.column + 1)


class _Builder:
    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.constructor = yaml.SafeLoader("")  # resolves scalars exactly as safe_load does

    def build(self, node: yaml.Node, loc: Loc) -> Any:
        self.doc.positions[loc] = _mark(node)
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
        return self.constructor.construct_object(node, deep=True)


def load(path: str | Path, text: str | None = None) -> Document:
    """Parse one YAML document; YAML syntax errors come back as SourceError with the parser's position."""
    path = str(path)
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise SourceError(path, None, f"cannot read file: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise SourceError(path, None, f"not UTF-8 text (byte {exc.start})") from None
    doc = Document(path=path, data=None, text=text)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = Pos(mark.line + 1, mark.column + 1) if mark else None
        raise SourceError(path, pos, f"YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:  # pragma: no cover - other YAML errors carry no mark
        raise SourceError(path, None, f"YAML error: {exc}") from None
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
