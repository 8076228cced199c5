"""`?`: every key the app answers, pane by pane, read from the live bindings so the list cannot go stale."""

from __future__ import annotations

from typing import Any

from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from .detail import NodeDetail
from .tree import HypothesisTree

# Keys Textual's widgets bind without a description: what they do here.
BUILTIN = {
    "cursor_up": "up", "cursor_down": "down", "select_cursor": "select (show it)", "toggle_node": "fold / unfold",
    "scroll_up": "scroll up", "scroll_down": "scroll down", "page_up": "page up", "page_down": "page down",
    "scroll_home": "to the top", "scroll_end": "to the end", "scroll_left": "scroll left", "scroll_right": "scroll right",
    "cursor_parent": "to the parent", "cursor_next_sibling": "next sibling", "cursor_previous_sibling": "previous sibling",
    "toggle_expand_all": "fold / unfold all", "expand_all": "unfold all", "collapse_all": "fold all",
    "page_left": "page left", "page_right": "page right", "toggle_node_all": "fold / unfold all",
}


def binding_rows(app: Any, node: Any) -> list[tuple[str, str]]:
    """(keys, what they do) for one widget's own bindings, one row per thing done (↑↓ move, not two rows)."""
    by_what: dict[str, list[str]] = {}
    for key, bindings in node._bindings.key_to_bindings.items():
        for b in bindings:
            what = b.tooltip or b.description or BUILTIN.get(b.action, b.action.replace("_", " "))
            if b.action.startswith("app.") and b.action != "app.pop_screen":
                continue
            keys = by_what.setdefault(what, [])
            shown = b.key_display or app.get_key_display(Binding(key, b.action))
            if not any(shown in k for k in keys):
                keys.append(shown)
    return [("/".join(keys), what) for what, keys in by_what.items()]


def keys_table(app: Any) -> RichTable:
    table = RichTable.grid(padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(no_wrap=True, overflow="ellipsis")
    sections = [("Everywhere", app), ("Hypotheses (left)", app.query_one(HypothesisTree)), ("Detail (right)", app.query_one(NodeDetail)),
                ("Log", app.query_one("#log"))]  # fmt: skip
    for title, node in sections:
        table.add_row(Text(title, style="bold underline"), "")
        for keys, what in binding_rows(app, node):
            table.add_row(keys, what)
        table.add_row("", "")
    table.add_row(Text("Report (v)", style="bold underline"), "")
    table.add_row("Esc/v/q", "back")
    table.add_row("t", "next section")
    table.add_row("↑↓/PgUp/PgDn/Space", "scroll")
    return table


class KeysScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close")]
    DEFAULT_CSS = """
    KeysScreen { align: center middle; }
    KeysScreen > VerticalScroll { width: auto; max-width: 90%; height: auto; max-height: 90%; border: heavy $accent;
                                  background: $surface; padding: 0 1; }
    """

    def __init__(self, app: Any) -> None:
        super().__init__()
        self._table = keys_table(app)

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "keys · Esc closes"
            yield Static(self._table, id="keys")
