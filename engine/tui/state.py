"""What the UI knows about the run, recorded from the runner's events.

The runner calls subscribers synchronously from its own coroutine, so `RunState.__call__` only
records (a few dict writes) and bumps `version`; the app redraws from this state on a timer.
Nothing here touches Textual, which keeps the recording cheap and testable on its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .clock import Clock

if TYPE_CHECKING:
    from ..events import Event
    from ..results import Results

LOG_KEEP = 2000  # lines kept for the log widget; older ones are only in the JSON results
TPS_KEEP = 240  # tokens/s samples kept for the load sparkline (two minutes at the runner's 0.5 s tick)


@dataclass
class LogEntry:
    at: float
    level: str
    text: str


@dataclass
class LoadState:
    """The load window as the UI shows it: phase, live counters and the tokens/s history."""

    phase: str = ""  # "" (no load yet), "warming up", "sampling", "stopped", "failed"
    config: dict[str, Any] = field(default_factory=dict)
    warmup_s: float = 0.0
    started_at: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    window_left_s: float | None = None
    tps: list[float] = field(default_factory=list)
    report: dict[str, Any] | None = None
    error: str | None = None
    # the run's phase while the load runs (gpu_runbook.phases): before the window opens (connecting, admitting,
    # steady) the panel shows what the server admits, never a countdown; with its numbers (running, queued, of)
    stage: str = ""
    stage_numbers: dict[str, Any] = field(default_factory=dict)


@dataclass
class LiveState:
    """The latest live reading (engine/live.py): one entry per GPU and the server's gauges."""

    at_s: float = 0.0
    gpus: list[dict[str, Any]] = field(default_factory=list)
    server: dict[str, float] = field(default_factory=dict)
    samples: int = 0


# the sweep's own line per finished level (probes/server/sweep.py, LoadSweep): the curve so far is read from it
SWEEP_LEVEL = re.compile(r"concurrency (\d+): ([\d,.]+) output tok/s")


@dataclass
class SweepState:
    """A running concurrency sweep: its levels, the ones done with their tokens/s, when the current began."""

    key: str = ""
    levels: list[int] = field(default_factory=list)
    seconds_per_level: float = 0.0
    level_started: float = 0.0
    done: list[tuple[int, float]] = field(default_factory=list)
    running: bool = False

    def current(self) -> int:
        """1-based number of the level running now."""
        return min(len(self.done) + 1, len(self.levels))

    def left_s(self, now: float) -> float:
        """About how long the rest takes: whole levels to go, less what the current one has run."""
        remaining = max(0, len(self.levels) - len(self.done))
        return max(0.0, remaining * self.seconds_per_level - (now - self.level_started))


def sweep_levels(params: dict[str, Any]) -> list[int] | None:
    """The levels a sweep call will run (as the sweep orders them), or None when the call is not a sweep."""
    levels, per = params.get("levels"), params.get("seconds_per_level")
    if not isinstance(levels, list) or per is None:
        return None
    top = params.get("max_concurrency")
    return sorted({int(c) for c in levels if int(c) >= 1 and (top is None or int(c) <= int(top))})


@dataclass
class ProbeActivity:
    probe: str
    under_load: bool
    started_at: float
    status: str = "running"
    summary: str = ""
    duration_s: float = 0.0


@dataclass
class RunState:
    clock: Clock = field(default_factory=Clock)
    runbook: str = ""
    title: str = ""
    target: dict[str, Any] = field(default_factory=dict)
    tree: list[tuple[str, str | None, str]] = field(default_factory=list)
    marks: dict[str, str] = field(default_factory=dict)  # id -> pending/running/<verdict>
    reasons: dict[str, str] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)  # id -> elapsed when the node started
    last_started: str | None = None
    probes: dict[str, ProbeActivity] = field(default_factory=dict)  # call key -> activity, latest per key
    log: list[LogEntry] = field(default_factory=list)
    log_dropped: int = 0
    load: LoadState = field(default_factory=LoadState)
    live: LiveState = field(default_factory=LiveState)
    sweep: SweepState = field(default_factory=SweepState)
    phase: str = "starting"  # starting, running, re-judging <id>, measuring again <id>, cancelling, finished, interrupted, failed
    stage: str = ""  # the runner's phase (gpu_runbook.phases): connecting, admitting, steady, warm-up, sampling, ...
    stage_text: str = ""
    results: Results | None = None
    finished_at: float | None = None
    version: int = 0

    # -- recording ------------------------------------------------------------------------------
    def __call__(self, event: Event) -> None:
        """The runner's subscriber: record and return. Never raises (a raise would stop the run)."""
        try:
            self._record(event)
        except Exception as exc:  # noqa: BLE001 - a UI bookkeeping bug must not cancel the investigation
            self._log("error", f"tui: could not record {type(event).__name__}: {exc}")
        self.version += 1

    def _record(self, event: Event) -> None:
        from ..events import LoadFinished, LoadProgress, LiveSample, LoadStarted, LogLine, NodeStarted, PhaseChanged, ProbeFinished, ProbeStarted, RunFinished, RunStarted, VerdictReached  # noqa: PLC0415 - the models load after the first paint

        now = self.clock.elapsed()
        if isinstance(event, RunStarted):
            self.runbook, self.title, self.target, self.tree = event.runbook, event.title, dict(event.target), list(event.tree)
            for hid, _, _ in event.tree:
                self.marks.setdefault(hid, "pending")
            if not self.phase.startswith(("re-judging", "measuring again")):
                self.phase = "running"
            self._log("info", f"run started: {event.runbook}")
            if self.target.get("server_found"):
                from ..target import server_named  # noqa: PLC0415 - the models load after the first paint

                self._log("info", f"server: {server_named(self.target)} ({self.target['server_found']})")
            if self.target.get("gpu_found"):
                self._log("info", f"gpus: {self.target['gpu_found']}")
        elif isinstance(event, NodeStarted):
            self.marks[event.id] = "running"
            self.started[event.id] = now
            self.last_started = event.id
        elif isinstance(event, VerdictReached):
            self.marks[event.id] = event.verdict.value
            self.reasons[event.id] = event.reason
            level = "error" if event.verdict.value == "error" else "verdict"
            if event.verdict.value != "skipped" or not event.reason.startswith("not explored"):
                self._log(level, f"{event.verdict.value} {event.id}: {event.reason}")
        elif isinstance(event, ProbeStarted):
            self.probes[event.key] = ProbeActivity(event.probe, event.under_load, now)
            levels = sweep_levels(event.params or {})
            if levels:
                self.sweep = SweepState(event.key, levels, float(event.params["seconds_per_level"]), now, running=True)
            self._log("probe", f"probe {event.probe} started{' under load' if event.under_load else ''}")
        elif isinstance(event, ProbeFinished):
            act = self.probes.get(event.key) or ProbeActivity(event.probe, False, now)
            act.status, act.summary, act.duration_s = event.status, event.summary, event.duration_s
            self.probes[event.key] = act
            if event.key == self.sweep.key:
                self.sweep.running = False
            level = "error" if event.status == "failed" else ("warning" if event.status == "unavailable" else "probe")
            self._log(level, f"probe {event.probe} {event.status} in {self.clock.duration(event.duration_s)}: {event.summary}")
        elif isinstance(event, LoadStarted):
            from ..target import endpoint_for, load_path  # noqa: PLC0415

            # the endpoint the load really drives on the server found (vLLM has no /generate: /v1/completions)
            kind = self.target.get("server_kind")
            cfg = {**event.config, "endpoint": endpoint_for(str(event.config.get("endpoint") or "generate"), kind)}
            self.load = LoadState(phase="warming up" if event.warmup_s > 0 else "sampling", config=cfg, warmup_s=event.warmup_s, started_at=now)
            self._log("load", f"load started: {cfg.get('concurrency')} concurrent requests to {load_path(cfg['endpoint'], kind)}, warm-up {event.warmup_s:g}s")
        elif isinstance(event, LoadProgress):
            self.load.stats = dict(event.stats)
            self.load.window_left_s = event.window_left_s
            if self.load.phase == "warming up" and not self.load.stage and float(event.stats.get("elapsed_s", 0.0)) >= self.load.warmup_s:
                self.load.phase = "sampling"  # a runner without phase events: the warm-up counted from the start
            self.load.tps.append(float(event.stats.get("output_tokens_per_s", 0.0) or 0.0))
            del self.load.tps[:-TPS_KEEP]
        elif isinstance(event, LoadFinished):
            self.load.report, self.load.error = event.report, event.error
            self.load.phase = "failed" if event.error else "stopped"
            self.load.window_left_s = 0.0
            if event.error:
                self._log("error", f"load: {event.error}")
            elif event.report:
                from ..results import load_outcome  # noqa: PLC0415 - the models load after the first paint

                self._log("load", f"load stopped: {load_outcome(event.report)}")
        elif isinstance(event, PhaseChanged):
            self.stage, self.stage_text = event.name, event.text
            if self.load.phase not in ("", "stopped", "failed"):
                self.load.stage, self.load.stage_numbers = event.name, dict(event.numbers)
                if event.name in ("warm-up", "sampling"):
                    self.load.phase = "warming up" if event.name == "warm-up" else "sampling"
        elif isinstance(event, LiveSample):
            self.live = LiveState(event.at_s, list(event.gpus), dict(event.server), self.live.samples + 1)
        elif isinstance(event, LogLine):
            self._log(event.level, event.message)
            level = SWEEP_LEVEL.search(event.message) if self.sweep.running else None
            if level:
                self.sweep.done.append((int(level.group(1)), float(level.group(2).replace(",", ""))))
                self.sweep.level_started = now
        elif isinstance(event, RunFinished):
            self.results = event.results
            self.finished_at = now
            self.phase = "interrupted" if event.interrupted else "finished"
            rerun = event.extra.get("rerun") if event.extra else None
            verb = "re-judging" if event.extra.get("mode") == "rejudge" else "measuring again"
            self._log("info", f"{verb} {rerun} finished" if rerun else "run finished")

    def _log(self, level: str, text: str) -> None:
        self.log.append(LogEntry(self.clock.elapsed(), level, text))
        if len(self.log) > LOG_KEEP:
            drop = len(self.log) - LOG_KEEP
            del self.log[:drop]
            self.log_dropped += drop

    # -- helpers for the app ----------------------------------------------------------------------
    def note(self, text: str, level: str = "info") -> None:
        """A line from the UI itself (saved files, re-runs), in the same log."""
        self._log(level, text)
        self.version += 1

    def reset_branch(self, ids: list[str], phase: str) -> None:
        """Before a re-run: the branch goes back to pending, the rest keeps its marks."""
        for hid in ids:
            self.marks[hid] = "pending"
            self.reasons.pop(hid, None)
        self.phase, self.finished_at = phase, None
        self.version += 1

    @property
    def done(self) -> bool:
        return self.phase in ("finished", "interrupted", "failed")

    def elapsed(self) -> float:
        return self.finished_at if self.finished_at is not None else self.clock.elapsed()

    def running_probes(self) -> list[ProbeActivity]:
        return [p for p in self.probes.values() if p.status == "running"]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for value in self.marks.values():
            out[value] = out.get(value, 0) + 1
        return out
