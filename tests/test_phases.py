"""The run says what it waits for: phase events with numbers, printed headless before 10 s pass silent."""

from __future__ import annotations

import asyncio
import io

from gpu_runbook import phases
from gpu_runbook.events import LoadProgress, LogLine, PhaseChanged, RunStarted
from gpu_runbook.loader import load
from gpu_runbook.progress import QUIET_LIMIT_S, ProgressPrinter
from gpu_runbook.registry import Registry
from gpu_runbook.runner import Runner
from gpu_runbook.session import target_for

ADMITTED = """
name: admitted
title: Does the load get admitted?
load: { concurrency: 256, input_len: 128, output_len: 32, warmup_s: 1, steady_s: 60 }
hypotheses:
  - id: busy
    title: Busy GPUs
    probes:
      s: { probe: gpu.sample, under_load: true, with: { duration_s: 1.5, interval_s: 0.25 } }
    confirm: s.gpu_util_pct.mean > 90.0
"""


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _phase(name: str, changed: bool, **numbers) -> PhaseChanged:
    return PhaseChanged(name, phases.text(name, numbers), numbers, changed)


def test_the_printer_says_each_phase_and_repeats_it_before_ten_silent_seconds() -> None:
    clock, out = FakeClock(), io.StringIO()
    printer = ProgressPrinter(out, colour=False, clock=clock)
    printer(RunStarted("rb", "t", {"label": "x"}, []))
    printer(_phase("admitting", True, running=10, queued=90, of=100, elapsed_s=0.0, limit_s=180))
    lines = out.getvalue().splitlines()
    assert "admitting: 10 streaming, 90 queued of 100 requests (0 s, up to 180 s)" in lines[-1]
    for step in range(1, 8):  # repeats of the same phase well inside the quiet limit print nothing
        clock.now += 1.0
        printer(_phase("admitting", False, running=10 + step, queued=90 - step, of=100, elapsed_s=step, limit_s=180))
    assert len(out.getvalue().splitlines()) == len(lines)
    clock.now += 1.0
    printer(_phase("admitting", False, running=19, queued=81, of=100, elapsed_s=8.0, limit_s=180))
    assert "19 streaming, 81 queued" in out.getvalue().splitlines()[-1]
    # another line in between resets the silence; a new phase prints at once
    clock.now += 5.0
    printer(LogLine("something"))
    count = len(out.getvalue().splitlines())
    clock.now += QUIET_LIMIT_S - 3.0
    printer(_phase("admitting", False, running=20, queued=80, of=100, elapsed_s=16.0, limit_s=180))
    assert len(out.getvalue().splitlines()) == count
    printer(_phase("sampling", True, of=100, tok_per_s=1560.0, of_s=15.0, left_s=15.0, elapsed_s=0.0))
    assert out.getvalue().splitlines()[-1].endswith("sampling under 100 requests, 1,560 tok/s: 15 s left of 15 s")


def test_phase_lines_name_their_numbers_with_units() -> None:
    assert phases.text("steady", {"elapsed_s": 42.4, "limit_s": 240, "running": 1424, "queued": 624, "of": 2048}) == (
        "waiting for the steady state (the first requests finish and are replaced): 42 s of at most 240 s; "
        "1,424 streaming, 624 queued of 2,048 requests"
    )
    assert phases.text("sweeping", {"level": 3, "levels": 6, "concurrency": 64, "elapsed_s": 12}) == "sweeping: level 3 of 6 (concurrency 64), 12 s in"
    assert phases.text("probing", {"probes": ["gpu.sample"], "elapsed_s": 1}) == "probing: gpu.sample (1 s)"


def test_a_loaded_run_goes_through_admission_before_its_window_counts_down(tmp_path) -> None:
    """Against the simulated host: connecting, admitting (with running and queued), steady, warm-up, then
    sampling; no LoadProgress carries a time left before the sampling phase began."""
    path = tmp_path / "admitted.yaml"
    path.write_text(ADMITTED)
    registry = Registry.discover([])
    loaded = load(path, registry)
    events: list = []
    printed = io.StringIO()
    with target_for("", None, "seed-rtx-pro-6000-tp8") as (target, nvml, _host):
        runner = Runner(loaded, registry, target, nvml=nvml, subscribers=[events.append, ProgressPrinter(printed, colour=False)])
        results = asyncio.run(runner.run())
    # headless, each phase is a line with its numbers
    lines = printed.getvalue().splitlines()
    assert any("… admitting: " in line and " streaming, " in line and " queued of 256 requests" in line for line in lines), lines
    assert any("… waiting for the steady state" in line and "of at most 60 s" in line for line in lines), lines
    assert any("… sampling under 256 requests" in line and "left of 1.5 s" in line for line in lines), lines
    assert results.hypotheses[0].verdict.value in ("confirmed", "inconclusive")
    changes = [e.name for e in events if isinstance(e, PhaseChanged) and e.changed]
    order = [n for n in ("connecting", "admitting", "steady", "warm-up", "sampling") if n in changes]
    assert order == ["connecting", "admitting", "steady", "warm-up", "sampling"], changes
    assert changes.index("admitting") < changes.index("sampling") < len(changes) - 1 and changes[-1] == "probing"
    admitting = [e for e in events if isinstance(e, PhaseChanged) and e.name == "admitting"]
    assert all({"running", "queued", "of"} <= set(e.numbers) and e.numbers["of"] == 256 for e in admitting)
    assert all(e.numbers["running"] + e.numbers["queued"] <= 256 for e in admitting)
    opened = next(i for i, e in enumerate(events) if isinstance(e, PhaseChanged) and e.name == "sampling" and e.changed)
    before = [e for e in events[:opened] if isinstance(e, LoadProgress)]
    assert before and all(e.window_left_s is None for e in before)
    after = [e for e in events[opened:] if isinstance(e, LoadProgress)]
    assert any(e.window_left_s is not None for e in after)
