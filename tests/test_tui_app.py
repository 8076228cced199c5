"""Pilot tests: the app driven against real runs of a small runbook (engine + test probes, no GPU)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from textual.widgets import RichLog

from gpu_runbook.events import LoadFinished, LoadProgress, LoadStarted
from gpu_runbook.session import write_outputs
from gpu_runbook.tui.app import RunbookApp
from gpu_runbook.tui.detail import NodeDetail
from gpu_runbook.tui.loadpanel import LoadPanel
from gpu_runbook.tui.report_screen import ReportScreen, ReportView
from gpu_runbook.tui.tree import HypothesisTree
from test_tui_support import make_runner, open_gate, wait_for


def label(app: RunbookApp, hid: str) -> str:
    return app.query_one(HypothesisTree).by_id[hid].label.plain


async def test_marks_fill_in_live_and_follow_the_running_node(tmp_path: Path) -> None:
    runner, registry = make_runner(tmp_path, gated=True)
    app = RunbookApp(runner, None, str(tmp_path / "r.md"), stable=True)
    async with app.run_test(size=(100, 40)) as pilot:  # tall enough for the log to show from the start
        await wait_for(pilot, lambda: app.state.marks.get("virtualized") == "confirmed" and app.state.marks.get("power-capped") == "running")
        app.sync()
        assert label(app, "virtualized").startswith("● ")
        assert label(app, "power-capped").startswith("⠋ ")  # the stable spinner frame
        assert label(app, "psu-undersized").startswith("· ")  # pending
        assert app._selected == "power-capped"  # follows the running node
        assert app.query_one(NodeDetail).border_title == "power-capped"
        open_gate(registry)
        await wait_for(pilot, lambda: app.state.done)
        app.sync()
        assert {hid: label(app, hid)[0] for hid in app.query_one(HypothesisTree).by_id} == {
            "virtualized": "●", "power-capped": "●", "psu-undersized": "●",
            "sensor-broken": "!", "memory-tight": "○", "cache-evictions": "-",
        }
        assert app._selected == ""  # the run ended: the summary (the tree's root) is shown
        assert app.query_one(NodeDetail).border_title == "summary"
        log = "\n".join(line.text for line in app.query_one("#log", RichLog).lines)
        assert "sensor went away" in log and "run finished" in log
    assert app.results is not None and not app.results.interrupted


async def test_navigation_stops_following_and_shows_the_node(tmp_path: Path) -> None:
    runner, _ = make_runner(tmp_path)
    app = RunbookApp(runner, None, str(tmp_path / "r.md"), stable=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.done)
        # the end of the run moves the view to the summary at the root: start navigating from there
        await wait_for(pilot, lambda: app._selected == "" and app.query_one(HypothesisTree).cursor_line == 0)
        await pilot.press("down", "down")
        await pilot.pause()
        assert app._selected == "power-capped" and not app._follow
        app.sync()
        detail = app.query_one(NodeDetail)
        assert detail.border_title == "power-capped"
        body = rendered_text(detail.query_one("#detail-body").content)
        await pilot.press("enter")
        assert app._selected == "power-capped"
        await pilot.press("f")
        await pilot.pause()
        assert app._follow and app._selected == ""
    assert "The GPUs run at their power limit" in body and "power.draw_ratio > 0.9" in body, body[:400]


def rendered_text(renderable) -> str:
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


async def test_rerun_a_branch(tmp_path: Path) -> None:
    runner, registry = make_runner(tmp_path)
    app = RunbookApp(runner, None, str(tmp_path / "r.md"), stable=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.done)
        await wait_for(pilot, lambda: app._selected == "" and app.query_one(HypothesisTree).cursor_line == 0)
        await pilot.press("down", "down")  # power-capped
        registry.probes["test.power"].gate = __import__("asyncio").Event()
        await pilot.press("R")
        await wait_for(pilot, lambda: app.state.marks.get("power-capped") == "running")
        assert app.state.phase == "measuring again power-capped"
        assert app.state.marks["psu-undersized"] == "pending" and app.state.marks["virtualized"] == "confirmed"
        tasks_before = app._run_task
        await pilot.press("r")  # refused while running, says so
        await pilot.pause()
        assert app._run_task is tasks_before, "a second run must not start while one runs"
        assert any("still going" in str(n.message) for n in app._notifications), list(app._notifications)
        open_gate(registry)
        await wait_for(pilot, lambda: app.state.done)
        assert app.state.marks["psu-undersized"] == "confirmed"
    assert app.results is not None and app.results.by_id("power-capped").verdict.value == "confirmed"
    assert app.results.by_id("power-capped").rerun == "remeasured"
    assert [(r.hypothesis, r.mode, r.interrupted) for r in app.results.reruns] == [("power-capped", "remeasure", False)]


CONFIRMED = {"virtualized", "power-capped", "psu-undersized"}


async def test_quit_during_a_rerun_keeps_the_saved_findings(tmp_path: Path) -> None:
    """Issue 14's data loss: save, measure a branch again, quit while it runs. The files written on exit
    still hold every earlier verdict and say the re-run was stopped and which nodes kept their verdict."""
    runner, registry = make_runner(tmp_path)
    json_path, report_path = tmp_path / "results.json", tmp_path / "report.md"
    app = RunbookApp(runner, str(json_path), str(report_path), stable=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.done)
        await pilot.press("s")
        await wait_for(pilot, lambda: json_path.exists())
        saved = {h["id"]: h["verdict"] for h in __import__("json").loads(json_path.read_text())["hypotheses"]}
        await wait_for(pilot, lambda: app._selected == "" and app.query_one(HypothesisTree).cursor_line == 0)
        await pilot.press("down", "down")  # power-capped
        registry.probes["test.power"].gate = __import__("asyncio").Event()  # its probe now blocks
        await pilot.press("R")
        await wait_for(pilot, lambda: app.state.marks.get("power-capped") == "running")
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_value is not None)
    results = app.return_value
    write_outputs(results, str(json_path), str(report_path))
    from gpu_runbook.results import Results

    written = Results.read_json(json_path)
    assert {h.id: h.verdict.value for h in written.hypotheses} == saved
    assert {h.id for h in written.confirmed()} == CONFIRMED
    assert not written.interrupted  # the result is complete; the re-run says it was stopped
    rerun = written.reruns[-1]
    assert rerun.hypothesis == "power-capped" and rerun.mode == "remeasure" and rerun.interrupted
    assert set(rerun.kept) == {"power-capped", "psu-undersized", "sensor-broken"} and not rerun.remeasured
    assert "test.power" not in {c.probe for c in written.unmeasured()}  # the cut-short call is not "not measured"
    assert "power-capped" in report_path.read_text() and "stopped" in report_path.read_text()


async def test_rejudge_reads_recorded_evidence_with_the_rules_on_disk(tmp_path: Path) -> None:
    """`r` measures nothing (the gated probe would block) and applies a rule edited since the run."""
    runner, registry = make_runner(tmp_path)
    app = RunbookApp(runner, None, str(tmp_path / "r.md"), stable=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.done)
        await wait_for(pilot, lambda: app._selected == "" and app.query_one(HypothesisTree).cursor_line == 0)
        runbook = tmp_path / "tui-demo.yaml"
        runbook.write_text(runbook.read_text().replace("confirm: power.draw_ratio > 0.9", "confirm: power.draw_ratio > 0.99"))
        registry.probes["test.power"].gate = __import__("asyncio").Event()  # never opened: a measurement would hang
        await pilot.press("down", "down", "r")
        await wait_for(pilot, lambda: app.state.done and app.state.marks.get("power-capped") == "inconclusive")
        assert any("no new measurement" in str(n.message) for n in app._notifications)
    rerun = app.results.reruns[-1]
    assert rerun.mode == "rejudge" and "power-capped" in rerun.rejudged and not rerun.remeasured
    assert app.results.by_id("power-capped").rerun == "rejudged"
    assert app.results.by_id("virtualized").verdict.value == "confirmed"  # outside the branch: untouched


async def test_save_writes_report_and_json(tmp_path: Path) -> None:
    runner, _ = make_runner(tmp_path)
    json_path, report_path = tmp_path / "out" / "results.json", tmp_path / "out" / "report.md"
    app = RunbookApp(runner, str(json_path), str(report_path), stable=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.done)
        await pilot.press("s")
        await wait_for(pilot, lambda: str(report_path) in app._saved)
        assert json_path.exists() and report_path.exists()
        assert "power-capped" in report_path.read_text()
        assert str(report_path) in app._saved


async def test_report_viewer(tmp_path: Path) -> None:
    runner, _ = make_runner(tmp_path)
    app = RunbookApp(runner, None, str(tmp_path / "r.md"), stable=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.done)
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen) and app.screen.is_ready())
        assert "power-capped" in app.screen.markdown
        shown = "\n".join(strip.text for strip in app.screen.query_one(ReportView).lines)
        assert "power-capped" in shown and "**" not in shown  # drawn Markdown, not its source
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ReportScreen)
        assert not app.query_one("#log").display  # 30 rows: the log starts hidden, the findings need the room
        await pilot.press("l")
        assert app.query_one("#log").display
        await pilot.press("l")
        assert not app.query_one("#log").display


async def test_quit_mid_run_keeps_what_was_found(tmp_path: Path) -> None:
    runner, _ = make_runner(tmp_path, gated=True)
    app = RunbookApp(runner, str(tmp_path / "results.json"), str(tmp_path / "report.md"), stable=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.marks.get("power-capped") == "running" and app.state.marks.get("virtualized") == "confirmed")
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_value is not None)
    results = app.return_value
    assert results is not None and results.interrupted
    assert results.by_id("virtualized").verdict.value == "confirmed"
    assert results.by_id("power-capped").reason == "interrupted"
    written_json, written_report = write_outputs(results, str(tmp_path / "results.json"), str(tmp_path / "report.md"))
    assert written_json is not None and written_json.exists() and written_report.exists()


async def test_load_strip_shows_the_load(tmp_path: Path) -> None:
    runner, _ = make_runner(tmp_path)
    app = RunbookApp(runner, None, None, stable=True, autostart=False)
    async with app.run_test(size=(160, 30)) as pilot:
        await pilot.pause()  # let the screen finish mounting before sync() queries its widgets
        panel = app.query_one(LoadPanel)
        assert not panel.display
        app.state(LoadStarted({"concurrency": 64, "endpoint": "generate"}, 5.0))
        for tps in (100.0, 900.0, 1800.0):
            app.state(LoadProgress({"concurrency": 64, "in_flight": 61, "output_tokens_per_s": tps, "errors": 2, "elapsed_s": 6.0}, 12.0))
        app.sync()
        await pilot.pause()
        text = panel._last
        assert panel.display
        assert "conc 64" in text and "in flight 61" in text and "1,800 tok/s" in text and "errors 2" in text and "--s left" in text
        assert "sampling" in text
        app.state(LoadFinished({"completed": 500, "failed": 0, "output_tokens_per_s": 1500.0}))
        app.sync()
        assert "done 500" in panel._last and "stopped" in panel._last
