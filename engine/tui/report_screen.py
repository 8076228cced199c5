"""The Markdown report inside the app (`v`): the same text session.py writes, before it is written.

Textual's MarkdownViewer builds a widget per block and took seconds on a real report; here Rich renders
the Markdown once into lines (in a thread, ahead of time once the run ends) and a line-API view scrolls
them, so the screen opens at once and scrolling costs nothing.
"""

from __future__ import annotations

import io
import re

from rich.console import Console
from rich.markdown import Markdown
from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.geometry import Size
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

from .scrolling import SCROLL_BINDINGS

HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)


def render_lines(markdown: str, width: int) -> tuple[list[Strip], list[int]]:
    """The report drawn at `width` cells, and the line of each heading (for `t`). Safe in a thread."""
    console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system="truecolor", legacy_windows=False)
    lines = console.render_lines(Markdown(markdown, hyperlinks=False), console.options.update(width=width), pad=True)
    strips = [Strip(line, width) for line in lines]
    titles = {" ".join(re.sub(r"[`*_]", "", t).split()) for t in HEADING.findall(markdown)}
    headings = [i for i, s in enumerate(strips) if s.text.strip() and " ".join(s.text.split()) in titles]
    return strips, headings


class ReportView(ScrollView, can_focus=True):
    """Pre-rendered report lines, scrolled with the keys of any pane."""

    BINDINGS = [
        *SCROLL_BINDINGS,
        Binding("home", "scroll_home", "top", show=False),
        Binding("end", "scroll_end", "end", show=False),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lines: list[Strip] = []
        self.headings: list[int] = []

    def set_lines(self, lines: list[Strip], headings: list[int]) -> None:
        self.lines, self.headings = lines, headings
        width = max((s.cell_length for s in lines), default=0)
        self.virtual_size = Size(width, len(lines))
        self.refresh()

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        if index >= len(self.lines):
            return Strip.blank(self.size.width, self.rich_style)
        return self.lines[index].crop_extend(scroll_x, scroll_x + self.size.width, self.rich_style)

    def next_heading(self) -> None:
        later = [h for h in self.headings if h > self.scroll_offset.y]
        self.scroll_to(y=later[0] if later else 0, animate=False)


class ReportScreen(Screen[None]):
    BINDINGS = [
        Binding("escape,v,q", "app.pop_screen", "back"),
        Binding("t", "next_heading", "next section"),
    ]

    def __init__(self, markdown: str | None, title: str, prepared: tuple[list[Strip], list[int]] | None = None) -> None:
        """`markdown` None: the caller renders it and calls `show()`; `prepared`: lines already drawn."""
        super().__init__()
        self.markdown = markdown or ""
        self.heading = title
        self._prepared = prepared

    def compose(self) -> ComposeResult:
        # the keys in the title line: a Footer costs a widget per key, and this screen must open at once
        yield Static(f" report  {self.heading}   Esc back · t next section · ↑↓ PgUp/PgDn Space scroll", id="report-title", markup=False)
        yield Static("rendering the report…", id="report-wait")
        yield ReportView(id="report")

    def on_mount(self) -> None:
        self.query_one(ReportView).focus()
        if self._prepared is not None:
            self._apply(self._prepared)
        elif self.markdown:
            self.run_worker(self._draw(self.markdown), exclusive=True)

    def show(self, markdown: str, prepared: tuple[list[Strip], list[int]] | None = None) -> None:
        self.markdown = markdown
        if not self.is_attached:  # closed (Esc) before the report was rendered: nothing to fill in
            return
        if prepared is not None:
            self._apply(prepared)
        else:
            self.run_worker(self._draw(markdown), exclusive=True)

    async def _draw(self, markdown: str) -> None:
        import asyncio  # noqa: PLC0415

        try:
            width = max(20, self.query_one(ReportView).size.width or self.app.size.width)
        except NoMatches:  # the screen closed before its worker started
            return
        self._apply(await asyncio.to_thread(render_lines, markdown, width))

    def _apply(self, prepared: tuple[list[Strip], list[int]]) -> None:
        """Show the drawn lines; a worker that outlived its screen (`v` then Esc while it drew) does nothing."""
        try:
            wait, view = self.query_one("#report-wait"), self.query_one(ReportView)
        except NoMatches:
            return
        wait.display = False
        view.set_lines(*prepared)

    def on_resize(self) -> None:
        try:
            view = self.query_one(ReportView)
        except NoMatches:
            return
        if self.markdown and view.lines and view.size.width and view.virtual_size.width != view.size.width:
            self.run_worker(self._draw(self.markdown), exclusive=True)  # drawn for another width: draw again

    def is_ready(self) -> bool:
        """The report is on screen (the benchmark's and the tests' condition)."""
        try:
            return self.is_mounted and bool(self.query_one(ReportView).lines)
        except NoMatches:
            return False

    def action_next_heading(self) -> None:
        self.query_one(ReportView).next_heading()
