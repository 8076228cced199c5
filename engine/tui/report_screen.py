"""The Markdown report inside the app (`v`): the same text session.py writes, before it is written."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, MarkdownViewer, Static


class ReportScreen(Screen[None]):
    BINDINGS = [
        Binding("escape,v,q", "app.pop_screen", "back"),
        Binding("t", "toc", "contents"),
    ]

    def __init__(self, markdown: str, title: str) -> None:
        super().__init__()
        self.markdown = markdown
        self.heading = title

    def compose(self) -> ComposeResult:
        yield Static(f" report  {self.heading}", id="report-title", markup=False)
        yield MarkdownViewer(self.markdown, show_table_of_contents=False, open_links=False)
        yield Footer()

    def action_toc(self) -> None:
        viewer = self.query_one(MarkdownViewer)
        viewer.show_table_of_contents = not viewer.show_table_of_contents
