"""The live panel: shown while load runs, so people see the host being pushed as it happens.

One line for the load (or the sweep: level k of n, its concurrency, time left, the curve so far), one
for the server (running, queued, KV usage) and one per GPU (power against its limit as a bar on a
fixed 0..limit scale, utilisation, SM clock), each updated with every live sample. Every line is
fitted to the panel's width by dropping its least important parts, so nothing wraps.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from ..marks import sparkline
from ..numbers import quantity
from .blocks import bar, share_style
from .state import LiveState, LoadState, SweepState

SPARK_WIDTH = 24
Part = tuple[Text, int]  # a piece of a line and its priority: the lowest goes first when the line is too wide


def fit(parts: list[Part], width: int) -> Text:
    """Join the parts, dropping the lowest-priority ones until the line fits; then cut with an ellipsis."""
    kept = list(parts)
    while len(kept) > 1 and sum(p.cell_len for p, _ in kept) > width:
        kept.remove(min(kept, key=lambda p: p[1]))
    line = Text(no_wrap=True, overflow="ellipsis")
    for piece, _ in kept:
        line.append_text(piece)
    line.truncate(width, overflow="ellipsis")
    return line


def _t(text: str, style: str = "") -> Text:
    return Text(text, style=style)


# the runner's phases before the sampling window opens: the server is still taking the load in
WAITING = {"connecting": "connecting", "admitting": "admitting", "steady": "waiting for the steady state"}


def waiting_parts(load: LoadState, stable: bool = False) -> list[Part]:
    """`load admitting · running 1,424 · queued 624 of 2,048 · 1,560 tok/s · 40s`: what the server took in so far."""
    n = load.stage_numbers
    parts: list[Part] = [(_t("load ", "bold"), 9), (_t(WAITING[load.stage], "yellow"), 9)]
    parts.append((_t(f" · running {quantity(n.get('running', 0), 'count')}"), 8))
    parts.append((_t(f" · queued {quantity(n.get('queued', 0), 'count')}", "yellow" if n.get("queued") else ""), 8))
    parts.append((_t(f" of {quantity(n.get('of', load.config.get('concurrency')), 'count')}"), 7))
    parts.append((_t(f" · {quantity(float(load.stats.get('output_tokens_per_s') or 0.0), 'tok/s')}", "bold"), 5))
    if load.tps:
        parts.append((_t(" " + sparkline(load.tps, SPARK_WIDTH), "cyan"), 1))
    took, limit = n.get("elapsed_s"), n.get("limit_s")
    if took is not None:
        shown = "--" if stable else f"{float(took):.0f}"
        parts.append((_t(f" · {shown}s" + (f" of up to {float(limit):.0f}s" if limit else ""), "dim"), 6))
    return parts


def load_parts(load: LoadState, stable: bool = False) -> list[Part]:
    """`load sampling · conc 64 · in flight 61 · 5,120 tok/s ▂▃▅▇ · errors 0 · 12s left`; before the window opens,
    `waiting_parts` (no countdown of a window that has not begun)."""
    stats = load.stats
    if load.stage in WAITING and load.phase not in ("stopped", "failed") and not load.error:
        return waiting_parts(load, stable)
    parts: list[Part] = [(_t("load ", "bold"), 9), (_t(load.phase or "starting", "red" if load.phase == "failed" else "cyan"), 9)]
    if load.error:
        parts.append((_t(f" · {load.error}", "red"), 8))
        return parts
    report = load.report if load.phase == "stopped" else None
    conc = stats.get("concurrency", load.config.get("concurrency", "?"))
    parts.append((_t(f" · conc {conc}"), 7))
    if report is not None:
        parts.append((_t(f" · done {report.get('completed', 0)}, failed {report.get('failed', 0)}"), 5))
        tps = float(report.get("steady_output_tokens_per_s") or report.get("output_tokens_per_s") or 0.0)  # the report's figure
    else:
        parts.append((_t(f" · in flight {stats.get('in_flight', 0)}"), 4))
        tps = float(stats.get("output_tokens_per_s") or 0.0)
    parts.append((_t(f" · {tps:,.0f} tok/s", "bold"), 8))
    if load.tps:
        parts.append((_t(" " + sparkline(load.tps, SPARK_WIDTH), "cyan"), 1))
    errors = int(stats.get("errors", 0) or 0)
    parts.append((_t(f" · errors {errors}", "bold red" if errors else ""), 6 if errors else 2))
    if load.stage in ("profiling", "finishing", "sweeping") and report is None and not load.window_left_s:
        # the sampling is over, a probe still works under the load: say which, not "0s left"
        took = load.stage_numbers.get("elapsed_s")
        parts.append((_t(f" · {load.stage}" + ("" if stable or took is None else f" {float(took):.0f}s")), 8))
    elif load.window_left_s is not None and report is None:
        parts.append((_t(f" · {'--' if stable else f'{load.window_left_s:.0f}'}s left"), 8))
    return parts


def load_text(load: LoadState, stable: bool = False, width: int = 200) -> Text:
    return fit(load_parts(load, stable), width)


def sweep_text(sweep: SweepState, now: float, stable: bool = False, width: int = 200) -> Text:
    """`sweep level 3 of 6 · conc 256 · ~40s left · ▂▄▆ 1,024→9,800 tok/s`."""
    k, n = sweep.current(), len(sweep.levels)
    parts: list[Part] = [(_t("sweep ", "bold"), 9), (_t(f"level {k} of {n}", "cyan"), 9)]
    if sweep.levels:
        parts.append((_t(f" · conc {sweep.levels[k - 1]}"), 8))
    parts.append((_t(f" · ~{'--' if stable else f'{sweep.left_s(now):.0f}'}s left"), 7))
    if sweep.done:
        rates = [r for _, r in sweep.done]
        parts.append((_t(" · " + sparkline(rates, min(SPARK_WIDTH, max(len(rates), 1))), "cyan"), 6))  # the curve so far
        parts.append((_t(f" {sweep.done[0][1]:,.0f}→{rates[-1]:,.0f} tok/s", "dim"), 3))
    return fit(parts, width)


def server_text(server: dict[str, float], width: int = 200) -> Text:
    """`server running 256 · queued 1,792 · KV 97%`; KV near full stands out."""
    parts: list[Part] = [(_t("server ", "bold"), 9)]
    if "running" in server:
        parts.append((_t(f"running {server['running']:,.0f}"), 8))
    if "queued" in server:
        parts.append((_t(f" · queued {server['queued']:,.0f}", "yellow" if server["queued"] else ""), 7))
    if "kv_usage" in server:
        parts.append((_t(" · KV "), 6))
        parts.append((_t(f"{server['kv_usage'] * 100:.0f}%", share_style(server["kv_usage"])), 6))
    return fit(parts, width)


def gpu_text(gpu: dict, width: int = 200) -> Text:
    """`GPU0  ████████████░░░░  598/600 W  util 100%  SM 2430 MHz`; the bar's scale is 0..the GPU's limit."""
    power, limit = gpu.get("power_w"), gpu.get("limit_w")
    util, sm = gpu.get("util_pct"), gpu.get("sm_clock_mhz")
    head = _t(f"GPU{gpu.get('index', '?')!s:<3}", "bold")
    watts = _t(f" {'?' if power is None else f'{power:4.0f}'}/{'?' if limit is None else f'{limit:.0f}'} W")
    util_part = _t(f"  util {'?' if util is None else f'{util:3d}'}%")
    sm_part = _t(f"  SM {'?' if sm is None else f'{sm:4d}'} MHz", "dim")
    rest = watts.cell_len + util_part.cell_len + sm_part.cell_len
    bar_width = max(6, min(30, width - head.cell_len - rest))
    parts: list[Part] = [(head, 9)]
    if power is not None and limit:
        parts.append((bar(power, limit, bar_width), 7))
    parts += [(watts, 8), (util_part, 6), (sm_part, 5)]
    return fit(parts, width)


def live_view(load: LoadState, live: LiveState, sweep: SweepState, now: float, stable: bool, width: int) -> Group:
    lines: list[Text] = []
    if sweep.running:
        lines.append(sweep_text(sweep, now, stable, width))
    if load.phase and not (sweep.running and load.phase == "stopped"):
        lines.append(load_text(load, stable, width))
    if sweep.running or load.phase in ("warming up", "sampling"):  # after the window a reading is stale (before it, live)
        if live.server:
            lines.append(server_text(live.server, width))
        lines.extend(gpu_text(g, width) for g in live.gpus)
    return Group(*lines)


class LoadPanel(Static):
    """Shown while load runs (the load window, or a probe driving its own load); hidden once the run ends."""

    _last: str = ""
    _width: int = 0
    _args: tuple | None = None

    def on_resize(self) -> None:
        if self._args is not None and self.content_size.width != self._width:
            load, stable, live, sweep, now = self._args
            self.show(load, stable, live=live, sweep=sweep, now=now)

    def show(self, load: LoadState, stable: bool = False, *, live: LiveState | None = None, sweep: SweepState | None = None,
             now: float = 0.0, done: bool = False) -> None:  # fmt: skip
        live, sweep = live or LiveState(), sweep or SweepState()
        self.display = not done and bool(load.phase or sweep.running)
        if not self.display:
            return
        self._args = (load, stable, live, sweep, now)
        # before its first layout the panel has no width yet: guess from the pane it sits in, re-fit on resize
        width = max(20, self.content_size.width or (self.parent.content_size.width - 4 if self.parent else 76))
        view = live_view(load, live, sweep, now, stable, width)
        plain = "\n".join(t.plain for t in view.renderables)
        if plain != self._last or width != self._width:
            self._width = width
            self._last = plain
            self.update(view)
