"""The plain renderer: one line per event, then a closing summary. Used without a terminal or with --no-tui."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, TextIO

from .evidence import without_status
from .events import (
    Event,
    LoadFinished,
    LoadStarted,
    LogLine,
    NodeStarted,
    PhaseChanged,
    ProbeFinished,
    ProbeStarted,
    RunStarted,
    VerdictReached,
)
from . import findings
from .marks import COLOURS, mark
from .numbers import quantity
from .depth import TIERS
from .results import Results, load_outcome
from .target import load_path, recorded_url, server_named


# Rich colour names (marks.COLOURS) as ANSI SGR codes, for plain terminals
_ANSI = {"red": "31", "green": "32", "yellow": "33", "magenta": "35", "cyan": "36", "grey50": "90"}


def use_colour(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to anything but "" (https://no-color.org)."""
    if os.environ.get("NO_COLOR", ""):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def coloured_mark(verdict: str, colour: bool) -> str:
    """The verdict's mark, in its colour when `colour` (the symbol alone still reads without it)."""
    symbol = mark(verdict)
    code = _ANSI.get(COLOURS.get(getattr(verdict, "value", verdict), ""))
    return f"\033[{code}m{symbol}\033[0m" if colour and code else symbol


# Without a line for this long a person cannot tell a slow server from a hung tool: the phase is said again.
QUIET_LIMIT_S = 10.0
# the phase comes about once a second, later on a busy machine: it is said again this much before the limit
REPEAT_MARGIN_S = 2.0


class ProgressPrinter:
    """`quiet`: only errors (a load that failed, error log lines); the summary is printed by the caller.

    Each phase change prints a line; while a phase lasts, its line comes again with fresh numbers once
    nothing was printed for `QUIET_LIMIT_S` less `REPEAT_MARGIN_S` (the runner repeats the phase about once a second).
    """

    def __init__(self, stream: TextIO | None = None, verbose: bool = False, quiet: bool = False, colour: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.stream = stream or sys.stdout
        self.verbose = verbose and not quiet
        self.quiet = quiet
        self.colour = use_colour(self.stream) if colour is None else colour
        self.clock = clock
        self.t0 = clock()
        self.last_line = self.t0
        self.titles: dict[str, str] = {}
        self.server_kind: str | None = None  # the kind found (RunStarted's target): the load's path depends on it

    def _line(self, text: str) -> None:
        self.last_line = self.clock()
        print(f"[{self.last_line - self.t0:6.1f}s] {text}", file=self.stream, flush=True)

    def __call__(self, event: Event) -> None:
        if self.quiet:
            if isinstance(event, RunStarted):
                self.t0 = self.clock()
            elif isinstance(event, LoadFinished) and event.error:
                self._line(f"load: {event.error}")
            elif isinstance(event, LogLine) and event.level in ("warning", "error"):
                self._line(f"  {event.level}: {event.message}")
            return
        if isinstance(event, RunStarted):
            self.t0 = self.last_line = self.clock()
            self.titles = {hid: title for hid, _, title in event.tree}
            self.server_kind = event.target.get("server_kind")
            target = event.target.get("label") or recorded_url(event.target)
            self._line(f"runbook {event.runbook}: {event.title} (target: {target})")
            if event.target.get("server_found"):
                self._line(f"server: {server_named(event.target)} ({event.target['server_found']})")
            if event.target.get("gpu_found"):
                self._line(f"gpus: {event.target['gpu_found']}")
        elif isinstance(event, NodeStarted) and self.verbose:
            self._line(f"  investigating {event.id}")
        elif isinstance(event, ProbeStarted) and self.verbose:
            self._line(f"  probe {event.probe} started{' (under load)' if event.under_load else ''}")
        elif isinstance(event, ProbeFinished):
            summary = without_status(event.summary, event.status)
            self._line(f"  probe {event.probe}: {event.status} in {event.duration_s:.1f}s: {summary}")
        elif isinstance(event, LoadStarted):
            cfg = event.config
            path = load_path(str(cfg.get("endpoint") or "generate"), self.server_kind)  # the one really used (vLLM: /v1/completions)
            self._line(f"load: {cfg.get('concurrency')} concurrent requests to {path}, warming up {event.warmup_s:g}s")
        elif isinstance(event, LoadFinished):
            if event.error:
                self._line(f"load: {event.error}")
            elif event.report:
                self._line(f"load stopped: {load_outcome(event.report)}")
        elif isinstance(event, VerdictReached):
            self._line(f"{coloured_mark(event.verdict, self.colour)} {event.verdict.value:<12} {event.id}: {event.reason}")
        elif isinstance(event, LogLine):
            self._line(f"  {event.level}: {event.message}")
        elif isinstance(event, PhaseChanged):
            if event.changed or self.clock() - self.last_line >= QUIET_LIMIT_S - REPEAT_MARGIN_S:
                self._line(f"… {event.text}")


def summary(results: Results, json_path: str | None, report_path: str | None, colour: bool | None = None) -> str:
    """The closing summary: the symptom with its numbers, root causes with their consequences, the steps
    ranked by estimated gain, throughput and latency, what was not measured (gpu_runbook.findings decides
    all of it, so the report says the same). Marks are coloured when `colour` (default: a colour terminal)."""
    colour = use_colour(sys.stdout) if colour is None else colour
    lines = [""]
    if results.interrupted:
        lines.append("Interrupted: the results below are what was found before the stop.")
    found = findings.findings(results)
    lines.append(f"Symptom: {findings.symptom_line(results).replace('`', '')}")
    if found:
        basis, why = findings.ranking_basis(results)
        # what ranks them, said (gpu_runbook.findings.ranking_basis): the decode profile's shares, or the configuration
        order = (f"ranked by {why}" if basis == "profile" else
                 f"most severe first (ranked by the configuration: {why.partition('; ')[2] or why})")  # fmt: skip
        lines.append(f"Root causes ({len(found)}), {order}, each with what follows from it:")

        def show(f: findings.Finding, indent: str, lead: str) -> None:
            h = f.result
            cost = f" (~{findings.cost_text(h)})" if h.cost is not None else ""
            lines.append(indent + clip(f"{coloured_mark('confirmed', colour)} {lead}[{h.severity.value}] {h.id}{cost}: {findings.headline(h)}", 160 - len(indent)))
            for g in f.because:
                show(g, indent + "    ", "because ")
            for g in f.consequences:
                show(g, indent + "    ", f"follows from {f.id}: ")

        for f in found:
            show(f, "  ", "")
        for h in findings.not_limiting(results):
            lines.append("  " + clip(f"true, not limiting at this load: {h.id}: {h.not_limiting_note}", 200))
        steps = findings.ranked_steps(results)
        if steps:
            lines.append("Do first (ranked by estimated gain; estimates, not measurements):")
            for i, s in enumerate(steps[:3], 1):
                gain = f" [{findings.gain_short(s.step, 'in the report')}]" if s.step.gain else ""
                lines.append(f"  {i}. {s.finding.id}: {clip(s.step.text, 150)}{gain}")
    elif results.confirmed():
        lines.append(f"Confirmed ({len(results.confirmed())}):")
        lines.extend(f"  {coloured_mark('confirmed', colour)} [{h.severity.value}] {h.id}: {findings.headline(h)}" for h in results.confirmed())
    else:
        lines.append("No hypothesis was confirmed.")
    if results.load:
        tput = findings.throughput_text(results)
        lines.append(f"Load: {quantity((results.load.get('config') or {}).get('concurrency'))} concurrent requests; {tput}")
        lines.append(f"Latency: {findings.latency_text(results.load)}")
        note = findings.outlived_note(results.load)
        if note:
            lines.append(note)
    unmeasured = results.unmeasured()
    if unmeasured:
        lines.append("Not measured:")
        lines.extend(f"  {coloured_mark('inconclusive', colour)} {c.probe}: {clip(c.reason or c.status.value, 110)}" for c in unmeasured)
    if results.no_gpu_seen():
        lines.append(f"No NVIDIA driver here: `runbook run {results.runbook} --simulate seed-rtx-pro-6000-tp8` shows a run on the simulated host.")
    if results.depth != "standard":
        lines.append(f"Depth {results.depth}: {depth_what(results.depth)}.")
        marked = [h.id for h in results.hypotheses if h.depth_note and h.verdict.value != "skipped"]
        if marked:
            lines.append(f"  Judged without what they need ({len(marked)}): {clip(', '.join(marked), 140)}")
    if results.depth == "quick" and results.next_command:
        lines.append(f"Next, to measure under load: {results.next_command}")
    counts = ", ".join(f"{v} {k}" for k, v in results.counts().items() if v)
    lines.append(f"Verdicts: {counts}. Took {results.duration_s:.1f}s.")
    if json_path:
        lines.append(f"JSON results: {json_path}")
    if report_path:
        lines.append(f"Report: {report_path}")
    return "\n".join(lines)


def depth_what(depth: str) -> str:
    """What a depth ran, in words (gpu_runbook.depth)."""
    tier = TIERS.get(depth)
    return tier.what if tier is not None else depth


def clip(text: str, width: int) -> str:
    """One line of at most `width` characters (whitespace folded), for terminal tables and summaries."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
