"""Issue 14 items 2-4: the live panel's lines, tables that never wrap at 80 columns, the keys list, and
the key-latency benchmark's harness (driven here on the small demo runbook, so it is quick)."""

from __future__ import annotations

import io
import sys
import textwrap
from pathlib import Path

from rich.console import Console

from gpu_runbook.evidence import Table
from gpu_runbook.events import LiveSample, LoadStarted, LoadProgress, LogLine, ProbeFinished, ProbeStarted
from gpu_runbook.live import server_gauges
from gpu_runbook.loader import load
from gpu_runbook.probe import Target
from gpu_runbook.registry import Registry
from gpu_runbook.runner import Runner
from gpu_runbook.tui.app import RunbookApp
from gpu_runbook.tui.blocks import FitTable, collapse_rows
from gpu_runbook.tui.detail import NodeDetail
from gpu_runbook.tui.keys import KeysScreen, keys_table
from gpu_runbook.tui.loadpanel import LoadPanel, gpu_text
from gpu_runbook.tui.tree import HypothesisTree
from test_tui_support import make_runner, wait_for

REPO = Path(__file__).parent.parent
INVENTORY_COLUMNS = ["GPU", "name", "bus id", "CC", "memory MiB", "power limit W (enforced/max)", "max SM MHz",
                     "PCIe gen/width (cur/max)", "NVLink links", "virtualization"]  # fmt: skip


def inventory_rows(n: int = 8) -> list[list]:
    return [[i, "NVIDIA RTX PRO 6000 Blackwell Server Edition", f"00000000:{0x11 + i:02X}:00.0", "12.0", 97887, "600.0/600.0", 2430,
             "5/16 (5/16)", "0/0", "passthrough"] for i in range(n)]  # fmt: skip


def lines_at(renderable, width: int) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text().splitlines()


def table_rows(lines: list[str], title: str) -> list[str]:
    """The body lines of the table titled `title`: after its header rule, up to the first blank or note."""
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    rule = next(i for i in range(start, len(lines)) if set(lines[i].strip()) == {"─"})
    body = []
    for line in lines[rule + 1 :]:
        if not line.strip() or line.lstrip().startswith(("…", "1 more", "2 more")) or "more column" in line:
            break
        body.append(line)
    return body


# -- the live panel ---------------------------------------------------------------------------------


def test_server_gauges_sum_ranks_and_take_the_fullest_kv() -> None:
    text = textwrap.dedent("""\
        # TYPE sglang:num_running_reqs gauge
        sglang:num_running_reqs{dp_rank="0"} 120.0
        sglang:num_running_reqs{dp_rank="1"} 130.0
        # TYPE sglang:num_queue_reqs gauge
        sglang:num_queue_reqs{dp_rank="0"} 7.0
        sglang:num_queue_reqs{dp_rank="1"} 3.0
        # TYPE sglang:token_usage gauge
        sglang:token_usage{dp_rank="0"} 0.91
        sglang:token_usage{dp_rank="1"} 0.97
    """)
    assert server_gauges(text) == {"running": 250.0, "queued": 10.0, "kv_usage": 0.97}
    assert server_gauges("garbage {{{") == {}


async def test_live_panel_lines_follow_each_sample(tmp_path: Path) -> None:
    runner, _ = make_runner(tmp_path)
    app = RunbookApp(runner, None, None, stable=True, autostart=False)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        panel = app.query_one(LoadPanel)
        app.state(LoadStarted({"concurrency": 2048, "endpoint": "generate"}, 0.0))
        app.state(LoadProgress({"concurrency": 2048, "in_flight": 2040, "output_tokens_per_s": 1800.0, "errors": 0, "elapsed_s": 3.0}, 9.0))
        gpus = [{"index": i, "power_w": 236.4, "limit_w": 600.0, "util_pct": 100, "sm_clock_mhz": 2400 + i} for i in range(2)]
        app.state(LiveSample(1.0, gpus, {"running": 1935.0, "queued": 113.0, "kv_usage": 1.0}))
        app.sync()
        await wait_for(pilot, lambda: "GPU1" in panel._last)
        lines = panel._last.splitlines()
        assert lines[1] == "server running 1,935 · queued 113 · KV 100%"
        assert lines[2].startswith("GPU0 ") and " 236/600 W" in lines[2] and "util 100%" in lines[2] and "SM 2400 MHz" in lines[2]
        assert "SM 2401 MHz" in lines[3]
        gpus[0] = {**gpus[0], "power_w": 590.0}  # the next sample redraws the line
        app.state(LiveSample(2.0, gpus, {"running": 1935.0, "queued": 0.0, "kv_usage": 0.5}))
        app.sync()
        await wait_for(pilot, lambda: " 590/600 W" in panel._last)
        assert "KV 50%" in panel._last
        await wait_for(pilot, lambda: panel._width == panel.content_size.width)  # fitted to the laid-out panel
        assert all(len(line) <= panel.content_size.width for line in panel._last.splitlines())


def test_gpu_line_is_a_fixed_scale_bar_and_fits_narrow_panes() -> None:
    half = gpu_text({"index": 3, "power_w": 300.0, "limit_w": 600.0, "util_pct": 97, "sm_clock_mhz": 1980}, width=70)
    bar = half.plain.split()[1]
    assert abs(bar.count("█") - bar.count("░")) <= 1  # half the limit: half the bar (to a cell), whatever others draw
    for width in (30, 40, 48):
        line = gpu_text({"index": 7, "power_w": 598.0, "limit_w": 600.0, "util_pct": 100, "sm_clock_mhz": 2430}, width=width).plain
        assert len(line) <= width and line.startswith("GPU7") and "598/600 W" in line


async def test_sweep_shows_level_concurrency_time_left_and_curve(tmp_path: Path) -> None:
    runner, _ = make_runner(tmp_path)
    app = RunbookApp(runner, None, None, stable=True, autostart=False)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        panel = app.query_one(LoadPanel)
        app.state(ProbeStarted("k", "sglang.sweep", False, {"levels": [64, 16, 256, 4096], "seconds_per_level": 10.0, "max_concurrency": 1024}))
        app.state(LogLine("sglang.sweep: concurrency 16: 1,200 output tok/s (steady state)"))
        app.state(LogLine("sglang.sweep: concurrency 64: 4,800 output tok/s (steady state)"))
        app.sync()
        await wait_for(pilot, lambda: "level 3 of 3" in panel._last)
        assert "conc 256" in panel._last and "1,200→4,800 tok/s" in panel._last and "s left" in panel._last
        app.state(ProbeFinished("k", "sglang.sweep", "ok", "done", 30.0))
        app.sync()
        await wait_for(pilot, lambda: not panel.display)


async def test_a_simulated_run_feeds_the_live_panel(tmp_path: Path) -> None:
    """The runner's own readings reach the screen during the window: one line per server GPU."""
    from gpu_runbook.runner import resolve_params
    from gpu_runbook.sim.host import SimulatedHost

    registry = Registry.discover()
    loaded = load(REPO / "runbooks" / "power-starvation.yaml", registry)
    params = resolve_params(loaded, {"sample_seconds": "3", "warmup_seconds": "1", "steady_seconds": "0", "load_concurrency": "256", "load_input_len": "256", "profile_wait_seconds": "10"})
    with SimulatedHost.start("seed-rtx-pro-6000-tp8") as host:
        runner = Runner(loaded, registry, Target(sglang_url=host.url, label="sim", simulated=True), params, nvml=host.nvml)
        app = RunbookApp(runner, None, str(tmp_path / "r.md"), stable=True)
        async with app.run_test(size=(80, 24)) as pilot:
            panel = app.query_one(LoadPanel)
            await wait_for(pilot, lambda: panel.display and "GPU7" in panel._last and "server running" in panel._last, timeout=60)
            shown = panel._last.splitlines()
            await pilot.press("q")
    gpu_lines = [line for line in shown if line.startswith("GPU")]
    assert len(gpu_lines) == 8 and all("/600 W" in line and "util" in line for line in gpu_lines), shown
    assert all(len(line) <= 80 for line in shown)


# -- tables -------------------------------------------------------------------------------------------


def test_table_at_80_columns_has_no_wrapped_cell() -> None:
    table = Table(title="GPU inventory", columns=INVENTORY_COLUMNS, rows=inventory_rows())
    for width in (46, 76, 120, 200):
        lines = lines_at(FitTable(table), width)
        assert all(len(line) <= width for line in lines)
        rows = table_rows(lines, "GPU inventory")
        assert [row.split()[0] for row in rows] == [str(i) for i in range(8)], lines  # one line per GPU: nothing wrapped
        assert all("00000000:" in row for row in rows)
        if width < 120:  # columns dropped: the table says so
            assert any("more column" in line and "w shows them" in line for line in lines)


def test_wide_table_keeps_every_cell_whole() -> None:
    lines = lines_at(FitTable(Table(title="GPU inventory", columns=INVENTORY_COLUMNS, rows=inventory_rows()), wide=True), 300)
    rows = table_rows(lines, "GPU inventory")
    assert all("600.0/600.0" in row and "NVIDIA RTX PRO 6000 Blackwell Server Edition" in row for row in rows)


def test_identical_rows_collapse_under_one_label() -> None:
    assert collapse_rows([["0", "a"], ["1", "a"], ["2", "a"], ["3", "b"]]) == [["0–2", "a"], ["3", "b"]]
    assert collapse_rows([["GPU0", "x"], ["GPU2", "x"]]) == [["GPU0, GPU2", "x"]]
    assert collapse_rows([[f"GPU{i}", "x"] for i in range(8)]) == [["GPU0–7", "x"]]
    lines = lines_at(FitTable(Table(title="NVLink", columns=["GPU", "links", "active"], rows=[[i, 0, 0] for i in range(8)])), 80)
    assert [row.rstrip() for row in table_rows(lines, "NVLink")] == ["0–7  0      0"]


WIDE_PROBE = '''
from gpu_runbook.evidence import Evidence, Table
from gpu_runbook.probe import Probe

class Inventory(Probe):
    name = "test.inventory"
    description = "a wide GPU table"

    async def run(self, ctx, params):
        return Evidence(summary="8 GPUs", values={"gpu_count": 8}, blocks=[Table(title="GPU inventory", columns=COLUMNS, rows=ROWS)])
'''


async def test_a_node_with_a_wide_table_at_80x24(tmp_path: Path) -> None:
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "wide_probe.py").write_text(f"COLUMNS = {INVENTORY_COLUMNS!r}\nROWS = {inventory_rows()!r}\n" + WIDE_PROBE, encoding="utf-8")
    runbook = tmp_path / "wide.yaml"
    runbook.write_text(textwrap.dedent("""
        name: wide
        title: A wide table
        hypotheses:
          - id: eight-gpus-with-a-long-identifier-that-does-not-fit
            title: Eight GPUs
            why: "The **maximum** is read from NVML, `never` assumed."
            probes: { inv: { probe: test.inventory } }
            confirm: inv.gpu_count == 8.0
    """), encoding="utf-8")
    registry = Registry.discover([probes])
    runner = Runner(load(runbook, registry), registry, Target())
    app = RunbookApp(runner, None, str(tmp_path / "r.md"), stable=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.done)
        await wait_for(pilot, lambda: app._selected == "" and app.query_one(HypothesisTree).cursor_line == 0)
        await pilot.press("down")
        await wait_for(pilot, lambda: app.query_one(NodeDetail).border_title.startswith("eight-gpus"))
        detail = app.query_one(NodeDetail)
        body = detail.query_one("#detail-body")
        width = body.content_size.width
        lines = lines_at(body.content, width)
        rows = table_rows(lines, "GPU inventory")
        assert [row.split()[0] for row in rows] == [str(i) for i in range(8)]
        text = "\n".join(lines)
        assert "**" not in text and "`never`" not in text and "maximum" in text  # Why renders its Markdown
        tree = app.query_one(HypothesisTree)
        label = tree.render_label(tree.by_id["eight-gpus-with-a-long-identifier-that-does-not-fit"], tree.rich_style, tree.rich_style)
        assert label.plain.endswith("…") and label.cell_len <= tree.scrollable_content_region.width
        await pilot.press("w")  # every column, the pane scrolls sideways
        await wait_for(pilot, lambda: body.styles.width is not None and body.styles.width.value > width)
        wide = lines_at(body.content, int(body.styles.width.value))
        assert all("600.0/600.0" in row for row in table_rows(wide, "GPU inventory"))


# -- keys ---------------------------------------------------------------------------------------------


async def test_question_mark_lists_every_key(tmp_path: Path) -> None:
    runner, _ = make_runner(tmp_path)
    app = RunbookApp(runner, None, None, stable=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.done)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, KeysScreen))
        text = "\n".join(lines_at(keys_table(app), 100))
        for key, what in [("r", "evidence recorded"), ("R", "probes run again"), ("Tab", "pane"),
                          ("PgUp", "page"), ("Space", "page down"), ("Space", "fold"), ("w", "every column"), ("?", "keys"),
                          ("q", "quit"), ("v", "report"), ("Esc", "back")]:  # fmt: skip
            assert any(key in line.split("  ")[0].strip().split("/") and what in line for line in text.splitlines()), (key, what, text)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, KeysScreen))


async def test_footer_shows_the_focused_panes_keys(tmp_path: Path) -> None:
    runner, _ = make_runner(tmp_path)
    app = RunbookApp(runner, None, None, stable=True)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.done)

        def footer_keys() -> set[str]:
            return {b.key_display or b.key for _, b, enabled, _ in app.screen.active_bindings.values() if b.show and enabled}

        assert {"↑↓", "⏎", "Space", "Tab", "?"} <= footer_keys()
        await pilot.press("tab")
        await wait_for(pilot, lambda: isinstance(app.focused, NodeDetail))
        assert {"PgUp/PgDn", "Space", "Tab"} <= footer_keys() and "⏎" not in footer_keys()


async def test_key_benchmark_harness_times_every_key(tmp_path: Path) -> None:
    """The harness itself (not the timings): on the demo runbook it answers every key it plans."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import tui_keys
    finally:
        sys.path.pop(0)
    runner, _ = make_runner(tmp_path)
    times = await tui_keys.drive_keys(runner=runner, runs=1, tmp=str(tmp_path))
    assert "repaint, no key (baseline)" in times and "v (report)" in times and "s (save)" in times
    assert all(len(samples) == 1 and samples[0] > 0 for samples in times.values())
