"""The right pane: the selected hypothesis (why, the deciding rule and its values, evidence, next
steps), or for the tree's root the overview while running and the summary once the run ends."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.table import Table as RichTable
from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..marks import COLOURS, SYMBOLS, sparkline
from .drawn import Drawn
from .scrolling import SCROLL_BINDINGS

if TYPE_CHECKING:  # the views import the engine when first drawn: the app's first paint does not wait for it
    from ..model import Hypothesis
    from ..results import HypothesisResult, Results
    from .state import RunState

SEVERITIES = ("critical", "warning", "info")
SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def verdict_text(mark: str, spinner: str = "") -> Text:
    symbol = spinner if (mark == "running" and spinner) else SYMBOLS.get(mark, "?")
    return Text(f"{symbol} {mark}", style=f"bold {COLOURS.get(mark, 'white')}")


def section(title: str) -> Text:
    return Text(f"\n{title}", style="bold underline")


INLINE = re.compile(r"\*\*(.+?)\*\*|`([^`]+)`|(?<![\w*])\*([^*\s][^*]*?)\*(?!\w)|\[([^\]]+)\]\(([^)]+)\)")


def inline_md(text: str, style: str = "") -> Text:
    """One line of Markdown (bold, code, emphasis, links) as styled text: a runbook's advice reads as
    written, without its `**` and backticks."""
    out = Text(style=style, no_wrap=True, overflow="ellipsis")
    text = " ".join(text.split())
    at = 0
    for m in INLINE.finditer(text):
        out.append(text[at : m.start()])
        bold, code, em, label, _url = m.groups()
        if bold is not None:
            out.append(bold, style="bold")
        elif code is not None:
            out.append(code, style="bold cyan")
        elif em is not None:
            out.append(em, style="italic")
        else:
            out.append(label, style="underline")
        at = m.end()
    out.append(text[at:])
    return out


def one_line(text: str | Text, style: str = "") -> Text:
    """A line cut with an ellipsis where the pane ends, never wrapped (lists of findings, files, targets)."""
    line = Text(text, style=style) if isinstance(text, str) else text
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def node_view(state: RunState, hyp: Hypothesis, result: HypothesisResult | None, spinner: str, wide: bool = False) -> RenderableType:
    """One hypothesis: what it claims, how it was decided, on what evidence, and what to do next."""
    from rich.markdown import Markdown  # noqa: PLC0415 - drawn once a node is shown, not before the first paint

    from ..rules import format_value  # noqa: PLC0415

    mark = state.marks.get(hyp.id, "pending")
    parts: list[RenderableType] = []
    head = verdict_text(mark, spinner)
    head.append(f"  {hyp.id}", style="dim")
    if mark in ("confirmed", "error"):
        sev = (result.severity if result is not None else hyp.base_severity).value
        head.append(f"  [{sev}]", style=SEVERITY_STYLE.get(sev, ""))
    parts.append(head)
    parts.append(Text(hyp.title, style="bold"))
    reason = state.reasons.get(hyp.id)
    if mark == "running":
        parts.append(_running_text(state, hyp))
    elif reason:
        parts.append(Text(reason, style=COLOURS.get(mark, "")))
    if hyp.why:
        parts.append(section("Why"))
        parts.append(Markdown(hyp.why.strip()))
    if result is not None and mark not in ("pending", "running"):
        if result.rule:
            parts.append(section("Rule"))
            parts.append(Text(" ".join(result.rule.split()), style="bold cyan"))
            if result.rule_values:
                grid = RichTable.grid(padding=(0, 2))
                grid.add_column(style="dim", no_wrap=True, overflow="ellipsis", max_width=40)
                grid.add_column(no_wrap=True, overflow="ellipsis")
                for path, value in result.rule_values.items():
                    grid.add_row(Text(path), Text("missing" if value is None else format_value(value)))
                parts.append(grid)
        if result.evidence:
            parts.append(section("Evidence"))
            for ev in result.evidence:
                parts.extend(_evidence(ev, wide))
    if mark == "running" and state.load.tps and any(c.under_load for c in hyp.probes.values()):
        parts.append(section("Load while sampling"))
        line = Text(sparkline(state.load.tps, 32), style="cyan")
        line.append(f"  {state.load.tps[-1]:,.0f} tok/s now", style="dim")
        parts.append(line)
    if hyp.next_steps and mark not in ("refuted", "skipped"):
        parts.append(section("Next steps"))
        parts.append(Markdown(hyp.next_steps_text.strip()))
    if hyp.references:
        parts.append(section("References"))
        for ref in hyp.references:
            parts.append(Text(f"{ref.title}: {ref.url}", style="dim"))
    return Group(*parts)


def _asked(key: str) -> str | None:
    """The probe name a call key (runner._call_for: [generation, probe, params, ...]) was asked under."""
    try:
        parts = json.loads(key)
    except ValueError:
        return None
    return parts[1] if isinstance(parts, list) and len(parts) > 1 and isinstance(parts[1], str) else None


def _running_text(state: RunState, hyp: Hypothesis) -> Text:
    wanted = {call.probe for call in hyp.probes.values()}
    # a call's key holds the name the runbook asked for (a role: `server.metrics`); the activity, the probe that runs
    running = [p for key, p in state.probes.items() if p.status == "running" and (p.probe in wanted or _asked(key) in wanted)]
    text = Text("investigating", style=COLOURS["running"])
    if running:
        names = ", ".join(f"{p.probe}{' (under load, ' + state.load.phase + ')' if p.under_load and state.load.phase else ''}" for p in running)
        text.append(f": {names}", style="dim")
    elif any(c.under_load for c in hyp.probes.values()) and state.load.phase in ("", "warming up"):
        text.append(": waiting for the load window", style="dim")
    return text


def _evidence(ev: Any, wide: bool = False) -> list[RenderableType]:
    from ..report import flatten_values  # noqa: PLC0415
    from .blocks import render_block  # noqa: PLC0415

    line = Text()
    line.append(ev.alias, style="bold")
    line.append(f" ({ev.probe}{', under load' if ev.under_load else ''}) ", style="dim")
    status = ev.status.value
    line.append(status, style="green" if status == "ok" else ("yellow" if status == "unavailable" else "magenta"))
    if ev.summary:
        line.append(f": {ev.summary}")
    out: list[RenderableType] = [line]
    if ev.blocks:
        out.extend(render_block(b, wide) for b in ev.blocks)
    elif ev.values:
        grid = RichTable.grid(padding=(0, 2))
        grid.add_column(style="dim", no_wrap=True, overflow="ellipsis", max_width=40)
        grid.add_column(no_wrap=True, overflow="ellipsis")
        for name, value in flatten_values(ev.values, limit=12):
            grid.add_row(Text(str(name)), Text(str(value)))  # data as Text, never Rich markup
        out.append(grid)
    out.append(Text(""))
    return out


def summary_view(state: RunState, results: Results, files: list[tuple[str, str]], target: str) -> RenderableType:
    """The end of the run, findings first (they fit an 80x24 screen): confirmed findings by severity, one
    line each; what to do for the causes; the verdict counts; then the target, the load and the files."""
    from .. import findings  # noqa: PLC0415
    from ..report import first_step  # noqa: PLC0415
    from ..results import load_outcome  # noqa: PLC0415

    parts: list[RenderableType] = []
    head = Text()
    if results.interrupted:
        head.append("Interrupted", style="bold yellow")
        head.append(": found before the stop.")
    else:
        head.append("Finished", style="bold green")
    head.append(f"  {results.title}", style="bold")
    parts.append(one_line(head))
    counts = Text()
    for verdict, n in results.counts().items():
        if n:
            counts.append(f"{SYMBOLS.get(verdict, '?')} {n} {verdict}  ", style=COLOURS.get(verdict, ""))
    parts.append(counts)  # prose: it may wrap; every count must show
    for rerun in results.reruns:
        how = "re-judged on recorded evidence" if rerun.mode == "rejudge" else "measured again"
        line = f"{rerun.hypothesis} {how}: {len(rerun.rejudged) + len(rerun.remeasured)} decided again"
        if rerun.interrupted:
            line += f", stopped: {len(rerun.kept)} kept their earlier verdicts"
        parts.append(one_line(line, "yellow" if rerun.interrupted else "dim"))
    confirmed = results.confirmed()
    causes = {h.id for h in results.causes()}
    if confirmed:
        for severity in SEVERITIES:
            found = [h for h in confirmed if h.severity.value == severity]
            if not found:
                continue
            parts.append(one_line(f"{severity.capitalize()} ({len(found)})", f"underline {SEVERITY_STYLE[severity]}"))
            for h in found:
                line = Text(f"{SYMBOLS['confirmed']} ", style=COLOURS["confirmed"])
                line.append(h.id, style="bold")
                line.append(f": {findings.headline(h)}")  # the numbers that decided it, as the report words them
                parts.append(one_line(line))
        steps = [h for h in confirmed if h.next_steps and h.id in causes]  # a symptom's advice is "see below"
        if steps:
            parts.append(one_line("\nWhat to do", "bold"))
            for h in steps:
                line = Text("→ ", style="dim")
                line.append(f"{h.id}: ", style="bold")
                # the first step that applies, as the run rendered it (its {{ fields }} filled in), else the text's first
                shown = next((st.text for st in h.steps if st.applies is not False), None) if h.steps else None
                line.append_text(inline_md(shown if shown is not None else first_step(h.next_steps)))
                parts.append(one_line(line))
    else:
        parts.append(Text("\nNo hypothesis was confirmed.", style="green"))
    parts.append(Text(""))
    parts.append(one_line(target, "dim"))
    if results.load:
        parts.append(one_line(f"load: {load_outcome(results.load)}", "dim"))
        parts.append(one_line(f"latency: {findings.latency_text(results.load)}", "dim"))
    for label, path in files:
        line = Text(f"{label}: ", style="bold")
        line.append(path)
        parts.append(one_line(line))
    parts.append(Text("\n↑↓ a finding's evidence · v the report · r re-judge · R measure again · ? keys · q quit", style="dim"))
    return Group(*parts)


def overview_view(state: RunState, description: str, target: str, spinner: str) -> RenderableType:
    """The root while running: what the runbook is about, how far it got, what runs now."""
    parts: list[RenderableType] = [Text(state.title or state.runbook, style="bold"), Text(target, style="dim")]
    if description:
        parts.append(Text(""))
        parts.append(Text(" ".join(description.split())))
    counts = Text("\n")
    for mark in ("running", "pending", "confirmed", "refuted", "inconclusive", "skipped", "error"):
        n = state.counts().get(mark, 0)
        if n:
            symbol = spinner if mark == "running" else SYMBOLS[mark]
            counts.append(f"{symbol} {n} {mark}  ", style=COLOURS[mark])
    parts.append(counts)
    running = state.running_probes()
    if running:
        parts.append(section("Probes running"))
        for p in running:
            parts.append(Text(f"{spinner} {p.probe}{' (under load)' if p.under_load else ''}", style=COLOURS["running"]))
    return Group(*parts)


def file_rows(json_path: str | None, report_path: str | Path, saved: set[str]) -> list[tuple[str, str]]:
    """Where session.py writes on exit (or where `s` already saved)."""
    rows = []
    if json_path:
        rows.append(("JSON", f"{json_path} ({'saved' if str(json_path) in saved else 'written on exit'})"))
    rows.append(("Report", f"{report_path} ({'saved' if str(report_path) in saved else 'written on exit'})"))
    return rows


class NodeDetail(VerticalScroll):
    """Redrawn only when what it shows changed, so scrolling stays put while the run goes on."""

    BINDINGS = [
        *SCROLL_BINDINGS,
        Binding("left", "scroll_left", "sideways", key_display="←→", show=False),
        Binding("right", "scroll_right", "sideways", show=False),
    ]

    _key: Any = None
    _for: str | None = None
    KEEP_VIEWS = 32  # views drawn lately, by key: moving back to a node (or w back) shows it without drawing it

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._views: dict[Any, Drawn] = {}

    def compose(self):
        yield Static("", id="detail-body")

    def show(self, renderable_factory, key: Any, for_id: str, wide_to: int = 0) -> None:
        """`wide_to`: the width the content needs when tables show every column (0: fit the pane)."""
        if key == self._key:
            return
        self._key = key
        body = self.query_one("#detail-body", Static)
        self.styles.overflow_x = "auto" if wide_to else "hidden"
        body.styles.width = max(wide_to, self.scrollable_content_region.width) if wide_to else "100%"
        view = self._views.pop(key, None)
        if view is None:
            view = Drawn(renderable_factory())
            if len(self._views) >= self.KEEP_VIEWS:
                del self._views[next(iter(self._views))]
        self._views[key] = view  # the most recent last
        body.update(view)
        if for_id != self._for:
            self._for = for_id
            self.scroll_home(animate=False)


__all__ = ["NodeDetail", "file_rows", "node_view", "overview_view", "summary_view"]
