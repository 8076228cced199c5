"""The bottom line: the keys the focused pane and the app answer, as one line of text.

Textual's Footer builds a widget per key and builds them all again on every focus change, which costs
the screen a full layout pass: most of what Tab took. This draws the same keys, in the footer's
colours and compact spacing, as one Text updated in place (no layout: the line's size never changes).
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text
from textual.widgets import Static


class KeyBar(Static):
    COMPONENT_CLASSES = {"keybar--key", "keybar--description"}
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        width: 1fr;
        text-wrap: nowrap;
        text-overflow: ellipsis;
        color: $footer-foreground;
        background: $footer-background;
        .keybar--key { color: $footer-key-foreground; background: $footer-key-background; text-style: bold; }
        .keybar--description { color: $footer-description-foreground; background: $footer-description-background; }
    }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", markup=False, **kwargs)
        self._shown: tuple[Any, ...] | None = None

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._changed)
        self.call_after_refresh(self.draw)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _changed(self, screen: Any) -> None:
        if self.is_attached and screen is self.screen:
            self.call_after_refresh(self.draw)

    def keys(self) -> list[tuple[str, str, bool]]:
        """(key as shown, what it does, enabled) for each action shown, once each, in binding order."""
        out, seen = [], set()
        for _node, binding, enabled, _tooltip in self.screen.active_bindings.values():
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            out.append((self.app.get_key_display(binding), binding.description, enabled))
        return out

    def draw(self) -> None:
        if not self.is_attached:
            return
        keys = tuple(self.keys())
        if keys == self._shown:
            return
        self._shown = keys
        key_style = self.get_component_rich_style("keybar--key", partial=True)
        what_style = self.get_component_rich_style("keybar--description", partial=True)
        line = Text(no_wrap=True, overflow="ellipsis", end="")
        dim = Style(dim=True)  # a key that does nothing now (while the runbook loads)
        for shown, what, enabled in keys:
            line.append(shown, style=key_style if enabled else key_style + dim)
            line.append(f" {what}", style=what_style if enabled else what_style + dim)
            line.append(" ")
        self.update(line, layout=False)
