"""The TUI survives its own timing: a report screen closed while its worker still draws (`v` then Esc on a
busy machine) must not crash the app (`NoMatches '#report-wait' on ReportScreen` was the error)."""

from __future__ import annotations

from pathlib import Path

from gpu_runbook.tui.app import RunbookApp
from gpu_runbook.tui.report_screen import ReportScreen
from hostile_figures import FIGURES
from test_tui_support import make_runner, wait_for

ROUNDS = 50


async def test_report_closed_while_it_draws_50_times(tmp_path: Path) -> None:
    FIGURES.tried("hostile servers", "TUI: v then Esc while the report draws (x50)")
    runner, _ = make_runner(tmp_path)
    app = RunbookApp(runner, None, None, stable=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.done)
        for i in range(ROUNDS):
            app._report = None  # no report drawn ahead: `v` opens the screen and a worker draws it
            await pilot.press("v")
            assert isinstance(app.screen, ReportScreen)
            if i % 2:
                await pilot.pause()  # let the worker start its thread before the screen closes
            await pilot.press("escape")
            assert not isinstance(app.screen, ReportScreen)
        await pilot.pause()
        await pilot.press("v")  # and the report still opens and draws afterwards
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen) and app.screen.is_ready())
    assert app._exception is None
    FIGURES.passed("hostile servers", "TUI: v then Esc while the report draws (x50)")
