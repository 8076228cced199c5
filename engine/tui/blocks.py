"""Evidence blocks as Rich renderables: tables, bars against a maximum, sparklines.

The report draws the same blocks in Markdown (engine/report.py); these are the terminal's view,
kept narrow enough for an 80-column screen.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table as RichTable
from rich.text import Text

from ..evidence import Bars, Breakdown, Series, Table
from ..scales import describe, series_scale, sparkline as scaled_sparkline
from ..report import fmt_value

BAR_WIDTH = 20
SPARK_WIDTH = 32
MAX_ROWS = 24


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
        table.add_row(str(label), bar(value, top), f"{fmt_value(float(value))}/{fmt_value(float(top))} {block.unit}".rstrip(), Text(f"{share * 100:.0f}%", style=share_style(share)))
    return Group(Text(block.title, style="bold"), table)


def render_series(block: Series, width: int = SPARK_WIDTH) -> RenderableType:
    values = [p[1] for p in block.points]
    head = Text(block.title, style="bold")
    if block.label:
        head.append(f" ({block.label})", style="dim")
    if not values:
        return Group(head, Text("no samples", style="dim"))
    scale = series_scale(block.title, block.unit, values)
    line = Text(scaled_sparkline(values, scale, width), style="cyan")
    line.append(f"  {describe(values, scale, block.unit)}", style="dim")
    return Group(head, line)


def render_table(block: Table) -> RenderableType:
    table = RichTable(title=block.title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False, header_style="bold", expand=False)
    for column in block.columns:
        table.add_column(str(column), overflow="fold")
    for row in block.rows[:MAX_ROWS]:
        table.add_row(*(fmt_value(v) for v in row))
    if len(block.rows) > MAX_ROWS:
        return Group(table, Text(f"… {len(block.rows) - MAX_ROWS} more rows in the JSON results", style="dim"))
    return table


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
        table.add_row(str(label), text)
    legend = Text()
    for i, seg in enumerate(block.segments):
        legend.append("█ ", style=SEGMENT_STYLES[i % len(SEGMENT_STYLES)])
        legend.append(f"{seg}  ", style="dim")
    return Group(Text(block.title, style="bold"), table, legend)


def render_block(block: Any) -> RenderableType:
    if isinstance(block, Breakdown):
        return render_breakdown(block)
    if isinstance(block, Bars):
        return render_bars(block)
    if isinstance(block, Series):
        return render_series(block)
    if isinstance(block, Table):
        return render_table(block)
    return Text(f"({getattr(block, 'kind', type(block).__name__)} block)", style="dim")
