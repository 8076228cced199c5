"""Evidence blocks as Rich renderables: tables, bars against a maximum, sparklines.

The report draws the same blocks in Markdown (engine/report.py); these are the terminal's view,
kept narrow enough for an 80-column screen.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table as RichTable
from rich.text import Text

if TYPE_CHECKING:
    from ..evidence import Bars, Breakdown, Series, Table

BAR_WIDTH = 20
SPARK_WIDTH = 32
MAX_ROWS = 24


def fmt_value(value: Any) -> str:
    """The report's number format (imported when first drawn: the app paints before the engine loads)."""
    from ..report import fmt_value as report_fmt  # noqa: PLC0415

    return report_fmt(value)


def share_style(share: float) -> str:
    """Near the maximum is what the power runbooks look for: it stands out."""
    if share >= 0.95:
        return "bold red"
    if share >= 0.80:
        return "yellow"
    return "green"


def bar(value: float, top: float, width: int = BAR_WIDTH) -> Text:
    share = (value / top) if top else 0.0
    filled = max(0, min(width, round(share * width)))
    text = Text()
    text.append("█" * filled, style=share_style(share))
    text.append("░" * (width - filled), style="grey35")
    return text


def render_bars(block: Bars) -> RenderableType:
    table = RichTable.grid(padding=(0, 1))
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True, justify="right")
    table.add_column(no_wrap=True, justify="right")
    for label, value, top in block.bars:
        share = (value / top) if top else 0.0
        table.add_row(Text(str(label)), bar(value, top), Text(f"{fmt_value(float(value))}/{fmt_value(float(top))} {block.unit}".rstrip()), Text(f"{share * 100:.0f}%", style=share_style(share)))
    return Group(Text(block.title, style="bold"), table)


def render_series(block: Series, width: int = SPARK_WIDTH) -> RenderableType:
    values = [p[1] for p in block.points]
    head = Text(block.title, style="bold")
    if block.label:
        head.append(f" ({block.label})", style="dim")
    if not values:
        return Group(head, Text("no samples", style="dim"))
    from ..scales import describe, series_scale, sparkline as scaled_sparkline  # noqa: PLC0415

    scale = series_scale(block.title, block.unit, values)
    line = Text(scaled_sparkline(values, scale, width), style="cyan")
    line.append(f"  {describe(values, scale, block.unit)}", style="dim")
    return Group(head, line)


CELL_ROOM = 20  # a column may be cut to this many cells (with an ellipsis) before one is dropped
GAP = 2  # cells between columns


SEGMENT_STYLES = ("magenta", "blue", "cyan", "red", "yellow", "green", "white", "grey50", "grey23")


def render_breakdown(block: Breakdown, width: int = 40) -> RenderableType:
    """One stacked bar per row (a rank's decode step), a legend under it: the picture behind the shares."""
    table = RichTable.grid(padding=(0, 1))
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True)
    for label, shares in block.rows[:MAX_ROWS]:
        text, used = Text(), 0
        for i, share in enumerate(shares):
            n = min(width - used, round(max(0.0, share) * width))
            text.append("█" * n, style=SEGMENT_STYLES[i % len(SEGMENT_STYLES)])
            used += n
        text.append(" " * (width - used))
        table.add_row(Text(str(label)), text)  # data as Text: a plain str cell would be read as Rich markup
    legend = Text()
    for i, seg in enumerate(block.segments):
        legend.append("█ ", style=SEGMENT_STYLES[i % len(SEGMENT_STYLES)])
        legend.append(f"{seg}  ", style="dim")
    return Group(Text(block.title, style="bold"), table, legend)


def fit_widths(natural: list[int], room: int) -> list[int]:
    """Narrow the widest columns first, none below CELL_ROOM (then the caller had too many columns)."""
    widths = list(natural)
    while sum(widths) > room:
        widest = max(range(len(widths)), key=lambda i: widths[i])
        if widths[widest] <= min(CELL_ROOM, natural[widest]) and sum(widths) - widths[widest] + 1 > room:
            widths[widest] = max(1, widths[widest] - (sum(widths) - room))  # one column left that cannot fit
            break
        if widths[widest] <= CELL_ROOM and len(widths) > 1:
            break
        widths[widest] -= 1
    return widths


def collapse_rows(rows: list[list[str]]) -> list[list[str]]:
    """Rows equal apart from their first cell become one, labelled `0–7` or `GPU0, GPU2`: only when that cell
    numbers things alike (GPUs, ranks), never for field/value tables where equal values mean nothing."""
    if not rows or not all(re.fullmatch(r"\D*\d+", r[0]) for r in rows if r):
        return rows
    groups: dict[tuple[str, ...], list[str]] = {}
    for row in rows:
        groups.setdefault(tuple(row[1:]), []).append(row[0] if row else "")
    return [[_label_range(labels), *rest] for rest, labels in groups.items()]


def _label_range(labels: list[str]) -> str:
    if len(labels) == 1:
        return labels[0]
    parts = [re.fullmatch(r"(\D*)(\d+)", x) for x in labels]
    if all(parts) and len({m.group(1) for m in parts}) == 1:  # 0..7 or GPU0..GPU7, consecutive
        nums = [int(m.group(2)) for m in parts]
        if nums == list(range(nums[0], nums[0] + len(nums))):
            return f"{parts[0].group(1)}{nums[0]}–{nums[-1]}"
    return ", ".join(labels)


class FitTable:
    """A table that never wraps a cell: at the width it is given it cuts long cells with an ellipsis,
    then drops columns from the right (the first is the key, kept), then collapses rows made equal.
    `wide=True` shows every column at its full width, for a pane that scrolls sideways."""

    def __init__(self, block: Table, wide: bool = False) -> None:
        self.block, self.wide = block, wide
        self.columns = [str(c) for c in block.columns]
        self.cells = [[fmt_value(v) for v in row] for row in block.rows]

    def _widths(self, k: int) -> list[int]:
        return [max([len(self.columns[i])] + [len(r[i]) for r in self.cells if i < len(r)]) for i in range(k)]

    def full_width(self) -> int:
        """The width with every column at its full width (the pane's width for `wide`)."""
        return sum(self._widths(len(self.columns))) + GAP * max(0, len(self.columns) - 1)

    def columns_for(self, width: int) -> int:
        """How many columns fit in `width` when each may be cut to CELL_ROOM."""
        k = len(self.columns)
        while k > 1 and sum(min(w, CELL_ROOM) for w in self._widths(k)) + GAP * (k - 1) > width:
            k -= 1
        return k

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        full = sum(self._widths(len(self.columns))) + GAP * max(0, len(self.columns) - 1)
        return Measurement(min(full, 8), full if self.wide else min(full, options.max_width))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        k = len(self.columns) if self.wide else self.columns_for(options.max_width)
        rows = collapse_rows([r[:k] for r in self.cells])
        natural = [max([len(self.columns[i])] + [len(r[i]) for r in rows if i < len(r)]) for i in range(k)]
        widths = natural if self.wide else fit_widths(natural, options.max_width - GAP * (k - 1))
        yield Text(self.block.title, style="bold", no_wrap=True, overflow="ellipsis")
        table = RichTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, GAP - 1), header_style="bold", expand=False)
        for name, width in zip(self.columns[:k], widths):
            table.add_column(Text(str(name)), no_wrap=True, overflow="ellipsis", width=width)
        for row in rows[:MAX_ROWS]:
            table.add_row(*(Text(str(cell)) for cell in row))  # data as Text, never Rich markup
        yield table
        notes = []
        if len(rows) > MAX_ROWS:
            notes.append(f"… {len(rows) - MAX_ROWS} more rows in the JSON results")
        if k < len(self.columns):
            notes.append(f"{len(self.columns) - k} more column{'s' if len(self.columns) - k > 1 else ''}, w shows them: {', '.join(self.columns[k:])}")
        for note in notes:
            yield Text(note, style="dim", no_wrap=True, overflow="ellipsis")


def render_table(block: Table, wide: bool = False) -> RenderableType:
    return FitTable(block, wide)


def render_block(block: Any, wide: bool = False) -> RenderableType:
    from ..evidence import Bars, Breakdown, Series, Table  # noqa: PLC0415

    if isinstance(block, Breakdown):
        return render_breakdown(block)
    if isinstance(block, Bars):
        return render_bars(block)
    if isinstance(block, Series):
        return render_series(block)
    if isinstance(block, Table):
        return render_table(block, wide)
    return Text(f"({getattr(block, 'kind', type(block).__name__)} block)", style="dim")
