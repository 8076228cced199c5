"""A Rich renderable drawn once per width, then replayed.

The detail pane holds tables, Markdown and sparklines; Textual draws its content again for every layout
pass (it measures the height by drawing), every restyle (a focus change swaps the pane's border) and
every screen that closes over it. Drawing the same lines each time cost a key press 100-300 ms; replaying
them costs next to nothing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.segment import Segment

KEEP_WIDTHS = 4  # a resize or the wide/fit toggle asks for another width: keep a few


class Drawn:
    """`Drawn(renderable)`: renders like `renderable`; the lines for each set of options are kept."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable
        self._lines: dict[tuple[Any, ...], list[list[Segment]]] = {}
        self._measure: dict[tuple[Any, ...], Measurement] = {}

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        key = (options.min_width, options.max_width)
        found = self._measure.get(key)
        if found is None:
            found = self._measure[key] = Measurement.get(console, options, self.renderable)
        return found

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # drawn without a height (measuring asks for none, painting for the pane's): cut or padded here
        key = (options.max_width, options.justify, options.overflow, options.no_wrap, options.highlight, options.markup)
        lines = self._lines.get(key)
        if lines is None:
            if len(self._lines) >= KEEP_WIDTHS:
                self._lines.clear()
            lines = self._lines[key] = console.render_lines(self.renderable, options.update(height=None), pad=False, new_lines=False)
        height = options.height
        newline = Segment.line()
        for line in lines if height is None else lines[:height]:
            yield from line
            yield newline
        if height is not None:
            for _ in range(height - len(lines)):
                yield newline
