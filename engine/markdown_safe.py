"""Data in the Markdown report is text, never markup: the one place that escapes it.

A `model_path`, a version string, a trace's kernel name or anything in a results file may hold
`<script>`, `](javascript:...)`, `</details>` or a `## TL;DR` line. The report's templates run with
`finalize=text`, so every `{{ value }}` is escaped unless it is `Md`: Markdown the report built itself
from escaped parts (a code span from `code`, an HTML summary from `html`, a link from `link`, a block's
lines). Escaped means: control characters stripped, one line, no raw HTML (`<` as an entity), no link or
image (`[`/`]` escaped, a bare URL as a code span), no table cell break (`|`), no heading or
quote at a line's start, backslashes kept as backslashes. Backticks pair into code spans, which are inert.
"""

from __future__ import annotations

import html as _html
import re
from typing import Any

from .scrub import plain


class Md(str):
    """Markdown the report made itself from escaped parts: written as is."""

    __slots__ = ()


_SPECIAL = re.compile(r"[\\\[\]|]|<(?=[A-Za-z/!?])")
_ENTITIES = {"<": "&lt;"}  # no tag, comment or <autolink> can start; `<=`, `>`, `&` are text
_URL = re.compile(r"(?i)\b(?:(?:https?|ftp|file|mailto|javascript|data|vbscript):|www\.)[^\s`]*[^\s`.,;:!?)\]'\"]")
_CODE_SPAN = re.compile(r"(`[^`]*`)")
_LEADING = re.compile(r"^(\s*)([#>])")
_BREAKS = re.compile(r"\s*[\n\r\t\v\f\x1c-\x1f\x85\u2028\u2029]\s*")


def one_line(value: Any) -> str:
    """The value as one line of plain text (controls stripped, whitespace runs as one space)."""
    return " ".join(plain(str(value)).split())


def text(value: Any, table: bool = False) -> Md:
    """Any value as inert inline Markdown (the templates' `finalize`); `table`: for a table cell (pipes in
    code spans escaped too)."""
    if isinstance(value, Md):
        return value
    if value is None:
        return Md("")
    s = _BREAKS.sub(" ", plain(str(value)))  # one line; spaces kept (an indent, "because: ")
    if s.count("`") % 2:  # an unpaired backtick would turn the report's own text after it into code
        s = s.replace("`", "'")
    # code spans (paired backticks) are inert as they are; the text between them is escaped
    out = [(part.replace("|", "\\|") if table else part) if part.startswith("`") else _escape(part) for part in _CODE_SPAN.split(s)]
    return Md(_LEADING.sub(lambda m: m.group(1) + "\\" + m.group(2), "".join(out)))


def _escape(s: str) -> str:
    out, at = [], 0
    for m in _URL.finditer(s):  # a URL in data as a code span: copyable, never a live link
        out += [_SPECIAL.sub(_entity, s[at : m.start()]), code(m.group())]
        at = m.end()
    out.append(_SPECIAL.sub(_entity, s[at:]))
    return "".join(out)


def _entity(m: re.Match[str]) -> str:
    return _ENTITIES.get(m.group(), "\\" + m.group())


def code(value: Any, table: bool = False) -> Md:
    """The value as a code span: inert whatever it holds (a backtick inside becomes '; in a table cell a pipe is escaped)."""
    s = one_line(value).replace("`", "'")
    if table:
        s = s.replace("|", "\\|")
    return Md(f"`{s}`" if s else "")


def html(value: Any) -> Md:
    """The value for inside an HTML element (a <details> summary): escaped as HTML, `code` spans as <code>.
    Some renderers read Markdown inside HTML too, so brackets are entities (no `[c](javascript:...)` link can
    form) and a URL is a <code> span (never linkified)."""
    if isinstance(value, Md):
        value = str(value)
    s = one_line(value)
    if s.count("`") % 2:
        s = s.replace("`", "'")
    out = []
    for part in _CODE_SPAN.split(s):
        if part.startswith("`") and len(part) > 1:
            out.append(f"<code>{_html_text(part[1:-1])}</code>" if part[1:-1] else "")
            continue
        at = 0
        for m in _URL.finditer(part):
            out += [_html_text(part[at : m.start()]), f"<code>{_html_text(m.group())}</code>"]
            at = m.end()
        out.append(_html_text(part[at:]))
    return Md("".join(out))


def _html_text(s: str) -> str:
    return _html.escape(s, quote=True).replace("[", "&#91;").replace("]", "&#93;")


def link(title: Any, url: Any) -> Md:
    """A link the report makes (a runbook's reference): only http(s) URLs, else the title and the URL as text."""
    address = one_line(url)
    if re.match(r"(?i)^https?://[^\s()<>]+$", address):
        return Md(f"[{text(title)}]({address})")
    return Md(f"{text(title)} ({code(address)})")


def lines(values: list[Any]) -> list[Md]:
    """Lines the report built itself (each from escaped parts) marked as Markdown."""
    return [Md(v) for v in values]
