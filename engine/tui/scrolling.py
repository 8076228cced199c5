"""The scrolling keys every scrollable pane answers (the footer shows them once each).

Their own module because the panes (detail, report) bind them and the keys screen lists the panes'
bindings: the panes must not depend on the keys screen.
"""

from __future__ import annotations

from textual.binding import Binding

SCROLL_BINDINGS = [
    Binding("up", "scroll_up", "scroll", key_display="↑↓"),
    Binding("down", "scroll_down", "scroll", show=False),
    Binding("pageup", "page_up", "page", key_display="PgUp/PgDn"),
    Binding("pagedown", "page_down", "page", show=False),
    Binding("space", "page_down", "page down", key_display="Space"),
]
