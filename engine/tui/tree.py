"""The hypothesis tree on the left: one node per hypothesis, with a live mark in colour and symbol."""

from __future__ import annotations

from typing import Callable

from rich.text import Text
from textual.binding import Binding
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from ..marks import COLOURS, SYMBOLS

ROOT = ""  # the root node's data: selecting it shows the overview, and the summary at the end


def mark_text(mark: str, spinner: str) -> Text:
    """The symbol and its colour; a running node shows the spinner frame instead of a fixed symbol."""
    symbol = spinner if mark == "running" else SYMBOLS.get(mark, "?")
    return Text(symbol, style=f"bold {COLOURS.get(mark, 'white')}")


class HypothesisTree(Tree[str]):
    """Ids, not titles, keep the tree narrow; the title is the first thing the detail pane shows."""

    BINDINGS = [
        Binding("up", "cursor_up", "move", key_display="↑↓"),
        Binding("down", "cursor_down", "move", show=False),
        Binding("enter", "select_cursor", "show", key_display="⏎"),
        Binding("space", "toggle_node", "fold", key_display="Space"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__("runbook", data=ROOT, **kwargs)
        self.auto_expand = False
        self.guide_depth = 3
        self.by_id: dict[str, TreeNode[str]] = {}
        self._shown: dict[str, tuple[str, str]] = {}
        self._runbook = "runbook"
        self.on_user_move: Callable[[], None] = lambda: None  # the app stops following here

    def build(self, runbook: str, nodes: list[tuple[str, str | None, str]]) -> None:
        """Once, from RunStarted's (id, parent, title) list, in tree order."""
        self.clear()
        self.by_id.clear()
        self._shown.clear()
        self._runbook = runbook
        self.root.set_label(Text(runbook, style="bold"))
        parents = {parent for _, parent, _ in nodes if parent}
        for hid, parent, _title in nodes:
            under = (self.by_id.get(parent) if parent else None) or self.root
            if hid in parents:
                node = under.add(Text(hid), data=hid, expand=True)
            else:
                node = under.add_leaf(Text(hid), data=hid)
            self.by_id[hid] = node
        self.root.expand_all()

    def show_marks(self, marks: dict[str, str], spinner: str, root_mark: str) -> None:
        """Relabel only the nodes whose mark (or spinner frame) changed: no needless repaints."""
        for hid, node in self.by_id.items():
            mark = marks.get(hid, "pending")
            key = (mark, spinner if mark == "running" else "")
            if self._shown.get(hid) == key:
                continue
            self._shown[hid] = key
            label = mark_text(mark, spinner)
            label.append(" ")
            label.append(hid, style="dim" if mark in ("pending", "skipped") else "")
            node.set_label(label)
        key = (root_mark, spinner if root_mark == "running" else "")
        if self._shown.get(ROOT) != key:
            self._shown[ROOT] = key
            label = mark_text(root_mark, spinner)
            label.append(" ")
            label.append(self._runbook, style="bold")
            self.root.set_label(label)

    def render_label(self, node: TreeNode[str], base_style, style) -> Text:
        """A label wider than the pane is cut with an ellipsis (no sideways scroll to find an id's end)."""
        text = super().render_label(node, base_style, style)
        depth, up = 0, node.parent
        while up is not None:
            depth, up = depth + 1, up.parent
        room = self.scrollable_content_region.width - depth * self.guide_depth
        if room > 1 and text.cell_len > room:
            text.truncate(room, overflow="ellipsis")
        return text

    def on_resize(self) -> None:
        self._invalidate()  # labels are cut to the width: redraw them all

    def node_for(self, hid: str) -> TreeNode[str] | None:
        return self.root if hid == ROOT else self.by_id.get(hid)


# The cursor moves a person makes (keys, or a click, which ends in select_cursor). Each tells the app
# before the cursor moves, so the highlight that follows is known to be theirs: guessing it from the
# highlight events alone races with the app's own follow moves (a move onto the line the cursor is
# already on posts no highlight at all).
USER_MOVES = (
    "cursor_up", "cursor_down", "page_up", "page_down", "scroll_home", "scroll_end", "select_cursor",
    "cursor_parent", "cursor_parent_next_sibling", "cursor_previous_sibling", "cursor_next_sibling",
)


def _told_first(name: str):
    inherited = getattr(Tree, f"action_{name}")

    def action(self: HypothesisTree, *args):
        self.on_user_move()
        return inherited(self, *args)

    action.__name__ = action.__qualname__ = f"action_{name}"
    return action


for _name in USER_MOVES:
    setattr(HypothesisTree, f"action_{_name}", _told_first(_name))
