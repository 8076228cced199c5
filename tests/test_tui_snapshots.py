"""SVG snapshots of the running and the finished screen at 80x24 and 120x40.

The app runs with `stable=True`: elapsed times, durations and the spinner render fixed, so the
pictures only change when the UI does. Update with `pytest tests/test_tui_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_runbook.tui.app import RunbookApp
from gpu_runbook.tui.tree import HypothesisTree
from test_tui_support import make_runner, open_gate, wait_for

SIZES = [(80, 24), (120, 40)]
SETTLED = {"virtualized": "confirmed", "memory-tight": "refuted", "cache-evictions": "skipped", "power-capped": "running"}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_running_screen(snap_compare, tmp_path: Path, size: tuple[int, int]) -> None:
    runner, _ = make_runner(tmp_path, gated=True)
    app = RunbookApp(runner, "results.json", "report.md", stable=True)

    async def at_the_gate(pilot) -> None:
        await wait_for(pilot, lambda: all(app.state.marks.get(k) == v for k, v in SETTLED.items()))
        app.sync()
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=at_the_gate)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_finished_screen(snap_compare, tmp_path: Path, size: tuple[int, int]) -> None:
    runner, registry = make_runner(tmp_path, gated=True)
    app = RunbookApp(runner, "results.json", "report.md", stable=True)

    async def to_the_end(pilot) -> None:
        await wait_for(pilot, lambda: all(app.state.marks.get(k) == v for k, v in SETTLED.items()))
        open_gate(registry)
        await wait_for(pilot, lambda: app.state.done)
        app.sync()
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=to_the_end)


def test_finished_node_with_bars_and_series(snap_compare, tmp_path: Path) -> None:
    """The power node's evidence: bars against the limit and a sparkline."""
    runner, _ = make_runner(tmp_path)
    app = RunbookApp(runner, "results.json", "report.md", stable=True)

    async def select_power(pilot) -> None:
        await wait_for(pilot, lambda: app.state.done)
        await wait_for(pilot, lambda: app._selected == "" and app.query_one(HypothesisTree).cursor_line == 0)
        await pilot.press("down", "down", "l")
        app.sync()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(100, 40), run_before=select_power)
