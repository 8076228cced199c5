"""What the runner tells renderers while it works. Renderers subscribe; the runner imports none of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union

from .model import Verdict


@dataclass(frozen=True)
class RunStarted:
    runbook: str
    title: str
    target: dict[str, Any]
    tree: list[tuple[str, str | None, str]]  # (id, parent, title) in tree order


@dataclass(frozen=True)
class NodeStarted:
    id: str


@dataclass(frozen=True)
class ProbeStarted:
    key: str  # identifies one deduplicated call
    probe: str
    under_load: bool
    params: dict[str, Any] = field(default_factory=dict)  # the call's resolved params (a sweep's levels)


@dataclass(frozen=True)
class ProbeFinished:
    key: str
    probe: str
    status: str
    summary: str
    duration_s: float


@dataclass(frozen=True)
class VerdictReached:
    id: str
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class LoadStarted:
    config: dict[str, Any]
    warmup_s: float


@dataclass(frozen=True)
class LoadProgress:
    stats: dict[str, Any]  # LoadStats as a dict: concurrency, in_flight, output_tokens_per_s, errors, elapsed_s
    window_left_s: float | None = None  # None until the sampling window has opened: nothing counts down before


@dataclass(frozen=True)
class PhaseChanged:
    """What the run is doing or waiting for now, with its numbers (gpu_runbook.phases writes `text`).

    Emitted when the phase changes (`changed`) and about once a second while it lasts, so a renderer
    can say how a wait goes without a clock of its own."""

    name: str  # connecting, admitting, steady, warm-up, sampling, profiling, sweeping, probing, finishing
    text: str  # one line for a person: "admitting: 1,424 of 2,048 requests streaming, 624 queued (12 s)"
    numbers: dict[str, Any] = field(default_factory=dict)  # what the text shows, by name (running, queued, left_s, ...)
    changed: bool = True


@dataclass(frozen=True)
class LiveSample:
    """One reading while load runs (engine/live.py), for the screen: no rule reads it."""

    at_s: float  # seconds since the readings began
    gpus: list[dict[str, Any]]  # index, power_w, limit_w, util_pct, sm_clock_mhz (None: NVML has no value)
    server: dict[str, float]  # running, queued (summed over ranks), kv_usage (0..1, fullest rank); absent: not read


@dataclass(frozen=True)
class LoadFinished:
    report: dict[str, Any] | None
    error: str | None = None


@dataclass(frozen=True)
class LogLine:
    message: str
    level: str = "info"


@dataclass(frozen=True)
class RunFinished:
    results: Any  # gpu_runbook.results.Results
    interrupted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


Event = Union[RunStarted, NodeStarted, ProbeStarted, ProbeFinished, VerdictReached, LoadStarted, LoadProgress, PhaseChanged, LiveSample, LoadFinished, LogLine, RunFinished]
Subscriber = Callable[[Event], None]
