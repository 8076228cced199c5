"""The load strip: shown while the runner drives load, so people see the host is being pushed."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ..marks import sparkline
from .state import LoadState

SPARK_WIDTH = 24


def load_text(load: LoadState, stable: bool = False) -> Text:
    """`load sampling · conc 64 · in flight 61 · 5,120 tok/s ▂▃▅▇ · errors 0 · 12s left`."""
    stats = load.stats
    text = Text()
    text.append("load ", style="bold")
    text.append(load.phase or "starting", style="red" if load.phase == "failed" else "cyan")
    if load.error:
        text.append(f" · {load.error}", style="red")
        return text
    report = load.report if load.phase == "stopped" else None
    conc = stats.get("concurrency", load.config.get("concurrency", "?"))
    text.append(f" · conc {conc}")
    if report is not None:
        text.append(f" · done {report.get('completed', 0)}, failed {report.get('failed', 0)}")
        tps = float(report.get("steady_output_tokens_per_s") or report.get("output_tokens_per_s") or 0.0)  # the report's figure
    else:
        text.append(f" · in flight {stats.get('in_flight', 0)}")
        tps = float(stats.get("output_tokens_per_s") or 0.0)
    text.append(f" · {tps:,.0f} tok/s ", style="bold")
    if load.tps:
        text.append(sparkline(load.tps, SPARK_WIDTH), style="cyan")
    errors = int(stats.get("errors", 0) or 0)
    text.append(f" · errors {errors}", style="bold red" if errors else "")
    if load.window_left_s is not None and report is None:
        text.append(f" · {'--' if stable else f'{load.window_left_s:.0f}'}s left")
    return text


class LoadPanel(Static):
    _last: str = ""

    def show(self, load: LoadState, stable: bool = False) -> None:
        self.display = bool(load.phase)
        text = load_text(load, stable)
        if text.plain != self._last:
            self._last = text.plain
            self.update(text)
