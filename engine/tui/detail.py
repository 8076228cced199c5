"""The right pane: the selected hypothesis (why, the deciding rule and its values, evidence, next
steps), or for the tree's root the overview while running and the summary once the run ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.markdown import Markdown
from rich.table import Table as RichTable
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from .. import findings
from ..marks import COLOURS, SYMBOLS, sparkline
from ..report import first_step, flatten_values
from ..model import Hypothesis
from ..results import HypothesisResult, Results, load_outcome
from ..rules import format_value
from .blocks import render_block
from .state import RunState

SEVERITIES = ("critical", "warning", "info")
SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def verdict_text(mark: str, spinner: str = "") -> Text:
    symbol = spinner if (mark == "running" and spinner) else SYMBOLS.get(mark, "?")
    return Text(f"{symbol} {mark}", style=f"bold {COLOURS.get(mark, 'white')}")


def section(title: str) -> Text:
    return Text(f"\n{title}", style="bold underline")


def node_view(state: RunState, hyp: Hypothesis, result: HypothesisResult | None, spinner: str) -> RenderableType:
    """One hypothesis: what it claims, how it was decided, on what evidence, and what to do next."""
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
        parts.append(Text(" ".join(hyp.why.split()), style="default"))
    if result is not None and mark not in ("pending", "running"):
        if result.rule:
            parts.append(section("Rule"))
            parts.append(Text(" ".join(result.rule.split()), style="bold cyan"))
            if result.rule_values:
                grid = RichTable.grid(padding=(0, 2))
                grid.add_column(style="dim", no_wrap=True)
                grid.add_column()
                for path, value in result.rule_values.items():
                    grid.add_row(path, "missing" if value is None else format_value(value))
                parts.append(grid)
        if result.evidence:
            parts.append(section("Evidence"))
            for ev in result.evidence:
                parts.extend(_evidence(ev))
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


def _running_text(state: RunState, hyp: Hypothesis) -> Text:
    wanted = {call.probe for call in hyp.probes.values()}
    running = [p for p in state.running_probes() if p.probe in wanted]
    text = Text("investigating", style=COLOURS["running"])
    if running:
        names = ", ".join(f"{p.probe}{' (under load, ' + state.load.phase + ')' if p.under_load and state.load.phase else ''}" for p in running)
        text.append(f": {names}", style="dim")
    elif any(c.under_load for c in hyp.probes.values()) and state.load.phase in ("", "warming up"):
        text.append(": waiting for the load window", style="dim")
    return text


def _evidence(ev: Any) -> list[RenderableType]:
    line = Text()
    line.append(ev.alias, style="bold")
    line.append(f" ({ev.probe}{', under load' if ev.under_load else ''}) ", style="dim")
    status = ev.status.value
    line.append(status, style="green" if status == "ok" else ("yellow" if status == "unavailable" else "magenta"))
    if ev.summary:
        line.append(f": {ev.summary}")
    out: list[RenderableType] = [line]
    if ev.blocks:
        out.extend(render_block(b) for b in ev.blocks)
    elif ev.values:
        grid = RichTable.grid(padding=(0, 2))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column()
        for name, value in flatten_values(ev.values, limit=12):
            grid.add_row(name, value)
        out.append(grid)
    out.append(Text(""))
    return out


def summary_view(state: RunState, results: Results, files: list[tuple[str, str]], target: str) -> RenderableType:
    """The end of the run: confirmed findings grouped by severity, verdict counts, the files."""
    parts: list[RenderableType] = []
    head = Text()
    if results.interrupted:
        head.append("Interrupted", style="bold yellow")
        head.append(": what was found before the stop.")
    else:
        head.append("Finished", style="bold green")
    head.append(f"  {results.title}", style="bold")
    parts.append(head)
    parts.append(Text(target, style="dim"))
    counts = Text()
    for verdict, n in results.counts().items():
        if n:
            counts.append(f"{SYMBOLS.get(verdict, '?')} {n} {verdict}  ", style=COLOURS.get(verdict, ""))
    parts.append(counts)
    if results.load:
        parts.append(Text(f"load: {load_outcome(results.load)}", style="dim"))
        parts.append(Text(f"latency: {findings.latency_text(results.load)}", style="dim"))
    for label, path in files:
        line = Text(f"{label}: ", style="bold")
        line.append(path)
        parts.append(line)
    confirmed = results.confirmed()
    causes = {h.id for h in results.causes()}
    if confirmed:
        for severity in SEVERITIES:
            found = [h for h in confirmed if h.severity.value == severity]
            if not found:
                continue
            parts.append(Text(f"\n{severity.capitalize()} ({len(found)})", style=f"underline {SEVERITY_STYLE[severity]}"))
            for h in found:
                line = Text(f"{SYMBOLS['confirmed']} ", style=COLOURS["confirmed"])
                line.append(h.id, style="bold")
                line.append(f": {findings.headline(h)}")  # the numbers that decided it, as the report words them
                parts.append(line)
                if h.next_steps and h.id in causes:  # a symptom's advice is "see below"; the causes carry the fixes
                    parts.append(Text(f"  → {first_step(h.next_steps)}", style="dim"))
    else:
        parts.append(Text("\nNo hypothesis was confirmed.", style="green"))
    parts.append(Text("\nv view the report · ↑↓ a finding's evidence · r re-run a branch · q quit", style="dim"))
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

    _key: Any = None
    _for: str | None = None

    def compose(self):
        yield Static("", id="detail-body")

    def show(self, renderable_factory, key: Any, for_id: str) -> None:
        if key == self._key:
            return
        self._key = key
        self.query_one("#detail-body", Static).update(renderable_factory())
        if for_id != self._for:
            self._for = for_id
            self.scroll_home(animate=False)


__all__ = ["NodeDetail", "file_rows", "node_view", "overview_view", "summary_view"]
