"""The hypothesis tree on the left: one node per hypothesis, with a live mark in colour and symbol."""

from __future__ import annotations

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
        Binding("up", "cursor_up", "navigate", key_display="↑↓"),
        Binding("down", "cursor_down", "navigate", show=False),
        Binding("enter", "select_cursor", "select", key_display="⏎"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__("runbook", data=ROOT, **kwargs)
        self.auto_expand = False
        self.guide_depth = 3
        self.by_id: dict[str, TreeNode[str]] = {}
        self._shown: dict[str, tuple[str, str]] = {}
        self._runbook = "runbook"

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

    def node_for(self, hid: str) -> TreeNode[str] | None:
        return self.root if hid == ROOT else self.by_id.get(hid)
