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


HOSTILE_RUNBOOK = """
name: hostile-tui
title: Server strings on the screen
hypotheses:
  - id: markup
    title: Markup in evidence
    probes:
      v: { probe: test.value, with: { values: { model_path: "[/] [bold red]x[/] [link=file:///etc/passwd]l[/link] [@click=app.quit]q[/] \\x1b]52;c;cHduZWQ=\\x07", n: 1 } } }
      f: { probe: test.fail, with: { message: "[/] [@click=app.quit]quit[/] \\x1b[31m" } }
    confirm: v.n == 1.0
"""


async def test_markup_and_escapes_in_evidence_are_shown_as_text(tmp_path: Path) -> None:
    """Rich markup from a server string was interpreted on screen and a malformed `[/]` crashed the TUI with a
    MarkupError; an OSC 52 sequence set the terminal's clipboard. The detail pane shows them as text."""
    from gpu_runbook.loader import load
    from gpu_runbook.registry import Registry
    from gpu_runbook.runner import Runner
    from gpu_runbook.target import Target

    FIGURES.tried("hostile servers", "TUI: Rich markup and escapes in evidence")
    (tmp_path / "h.yaml").write_text(HOSTILE_RUNBOOK)
    registry = Registry.discover([Path(__file__).parent / "probe_files"])
    runner = Runner(load(tmp_path / "h.yaml", registry), registry, Target())
    app = RunbookApp(runner, None, None, stable=True)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.done)
        for key in ("down", "down", "enter", "up"):
            await pilot.press(key)
            await pilot.pause()
        assert app.is_running  # [@click=app.quit] did not quit it
    assert app._exception is None
    results = app.results or runner.snapshot()
    text = "".join(ev.model_dump_json() for h in results.hypotheses for ev in h.evidence)  # what the probes returned
    assert "\\u001b" not in text and "\\u0007" not in text  # stripped where the evidence came in
    assert "[/] [@click=app.quit]quit[/]" in text  # the markup is kept as text
    FIGURES.passed("hostile servers", "TUI: Rich markup and escapes in evidence")
