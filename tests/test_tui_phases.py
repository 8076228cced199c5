"""The TUI during admission: the strip says "admitting" with running and queued, and counts nothing down.

The runner's own events are sent (as its load window sends them while the server admits), to the real
app with its real state and panel; the picture is taken with `stable=True`.
"""

from __future__ import annotations

from pathlib import Path

from gpu_runbook import phases
from gpu_runbook.events import LoadProgress, LoadStarted, PhaseChanged
from gpu_runbook.tui.app import RunbookApp
from gpu_runbook.tui.loadpanel import LoadPanel
from test_tui_support import make_runner, wait_for

ADMITTING = {"running": 1424, "queued": 624, "of": 2048, "open": 2048, "elapsed_s": 64.0, "limit_s": 180.0}
STATS = {"concurrency": 2048, "in_flight": 2048, "completed": 0, "errors": 0, "elapsed_s": 66.0, "output_tokens": 90000, "output_tokens_per_s": 1560.0}


def _admitting(runner) -> None:
    runner.emit(LoadStarted({"concurrency": 2048, "endpoint": "generate"}, 5.0))
    runner.emit(PhaseChanged("admitting", phases.text("admitting", ADMITTING), ADMITTING, True))
    runner.emit(LoadProgress(STATS, None))


def _panel_text(app) -> str:
    return app.query_one(LoadPanel)._last


async def test_the_strip_shows_admission_not_a_countdown(tmp_path: Path) -> None:
    runner, _ = make_runner(tmp_path, gated=True)
    runner.phase_every_s = 3600.0  # the demo runner has no load of its own: only the events sent here say the phase
    app = RunbookApp(runner, "results.json", "report.md")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.marks.get("power-capped") == "running")
        _admitting(runner)
        app.sync()
        await pilot.pause()
        text = _panel_text(app)
        assert "admitting" in text and "running 1,424" in text and "queued 624" in text, text
        assert "left" not in text, text
        # the window opens: now it counts down
        runner.emit(PhaseChanged("sampling", "sampling", {"of_s": 15.0, "left_s": 15.0, "of": 2048}, True))
        runner.emit(LoadProgress(STATS, 15.0))
        app.sync()
        await pilot.pause()
        text = _panel_text(app)
        assert "sampling" in text and "15s left" in text and "admitting" not in text, text
        # the window is over and the profile still runs under the load: the strip says so, not "0s left"
        runner.emit(PhaseChanged("profiling", "profiling", {"elapsed_s": 12.0, "limit_s": 90.0}, True))
        runner.emit(LoadProgress(STATS, 0.0))
        app.sync()
        await pilot.pause()
        text = _panel_text(app)
        assert "profiling 12s" in text and "left" not in text, text


def test_admission_snapshot(snap_compare, tmp_path: Path) -> None:
    runner, _ = make_runner(tmp_path, gated=True)
    runner.phase_every_s = 3600.0  # the demo runner has no load of its own: only the events sent here say the phase
    app = RunbookApp(runner, "results.json", "report.md", stable=True)

    async def admitting(pilot) -> None:
        await wait_for(pilot, lambda: app.state.marks.get("power-capped") == "running")
        _admitting(runner)
        app.sync()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(100, 30), run_before=admitting)
