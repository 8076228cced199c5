"""The plain renderer: one line per event, then a closing summary. Used without a terminal or with --no-tui."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .evidence import without_status
from .events import (
    Event,
    LoadFinished,
    LoadStarted,
    LogLine,
    NodeStarted,
    ProbeFinished,
    ProbeStarted,
    RunStarted,
    VerdictReached,
)
from .marks import mark
from .report import first_step
from .results import Results, load_outcome


class ProgressPrinter:
    def __init__(self, stream: TextIO | None = None, verbose: bool = False) -> None:
        self.stream = stream or sys.stdout
        self.verbose = verbose
        self.t0 = time.monotonic()
        self.titles: dict[str, str] = {}

    def _line(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", file=self.stream, flush=True)

    def __call__(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.t0 = time.monotonic()
            self.titles = {hid: title for hid, _, title in event.tree}
            target = event.target.get("label") or event.target.get("sglang_url")
            self._line(f"runbook {event.runbook}: {event.title} (target: {target})")
        elif isinstance(event, NodeStarted) and self.verbose:
            self._line(f"  investigating {event.id}")
        elif isinstance(event, ProbeStarted) and self.verbose:
            self._line(f"  probe {event.probe} started{' (under load)' if event.under_load else ''}")
        elif isinstance(event, ProbeFinished):
            summary = without_status(event.summary, event.status)
            self._line(f"  probe {event.probe}: {event.status} in {event.duration_s:.1f}s: {summary}")
        elif isinstance(event, LoadStarted):
            cfg = event.config
            self._line(f"load: {cfg.get('concurrency')} concurrent requests to /{cfg.get('endpoint')}, warming up {event.warmup_s:g}s")
        elif isinstance(event, LoadFinished):
            if event.error:
                self._line(f"load: {event.error}")
            elif event.report:
                self._line(f"load stopped: {load_outcome(event.report)}")
        elif isinstance(event, VerdictReached):
            self._line(f"{mark(event.verdict)} {event.verdict.value:<12} {event.id}: {event.reason}")
        elif isinstance(event, LogLine):
            self._line(f"  {event.level}: {event.message}")


def summary(results: Results, json_path: str | None, report_path: str | None) -> str:
    lines = [""]
    confirmed = results.confirmed()
    if results.interrupted:
        lines.append("Interrupted: the results below are what was found before the stop.")
    if confirmed:
        lines.append(f"Confirmed ({len(confirmed)}), most severe first:")
        for h in confirmed:
            lines.append(f"  {mark('confirmed')} [{h.severity.value}] {h.id}: {h.title}")
        actionable = [h for h in results.causes() if h.next_steps]
        if actionable:
            lines.append("What to do:")
            lines.extend(f"  - {h.id}: {first_step(h.next_steps)}" for h in actionable)
    else:
        lines.append("No hypothesis was confirmed.")
    unmeasured = results.unmeasured()
    if unmeasured:
        lines.append("Not measured:")
        lines.extend(f"  {mark('inconclusive')} {c.probe}: {clip(c.reason or c.status.value, 110)}" for c in unmeasured)
    if results.no_gpu_seen():
        lines.append(f"No NVIDIA driver here: `runbook run {results.runbook} --simulate seed-rtx-pro-6000-tp8` shows a run on the simulated host.")
    counts = ", ".join(f"{v} {k}" for k, v in results.counts().items() if v)
    lines.append(f"Verdicts: {counts}. Took {results.duration_s:.1f}s.")
    if json_path:
        lines.append(f"JSON results: {json_path}")
    if report_path:
        lines.append(f"Report: {report_path}")
    return "\n".join(lines)


def clip(text: str, width: int) -> str:
    """One line of at most `width` characters (whitespace folded), for terminal tables and summaries."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
