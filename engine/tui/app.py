"""The Textual app for `runbook run` in a terminal.

The runner runs as a task in Textual's own event loop. Its events land in `RunState` (record
only); a timer redraws from that state a few times a second, each widget repainting only what
changed. So probes never wait on the screen, and a burst of events costs one redraw.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from rich.text import Text
from textual.css.query import NoMatches
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import RichLog, Tree

from .clock import Clock, StableClock
from .detail import NodeDetail, file_rows, node_view, overview_view, summary_view
from .header import RunHeader, target_text
from .loadpanel import LoadPanel
from .keybar import KeyBar
from .keys import KeysScreen
from .state import LOG_KEEP, RunState
from .tree import ROOT, HypothesisTree

if TYPE_CHECKING:  # the engine's models load after the first paint (engine/tui/launch.py): a quick screen first
    from ..model import Hypothesis
    from ..results import Results
    from ..runner import Runner

REFRESH_HZ = 8
LEVEL_STYLE = {"error": "magenta", "warning": "yellow", "verdict": "bold", "load": "cyan", "probe": "dim", "info": ""}
STABLE_ENV = "RUNBOOK_TUI_STABLE"  # "1": fixed times and a still spinner (snapshots, screen captures)


class RunbookApp(App["Results"]):
    """`RunbookApp(runner, json_path, report_path)`; `stable=True` renders fixed times for snapshots.

    `runner=None`: the app paints at once and says what it loads; `adopt(runner)` fills it in (launch.py)."""

    CSS_PATH = "app.tcss"
    TITLE = "runbook"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        # priority: the screen's own (hidden) Tab would otherwise be the one the footer sees
        Binding("tab", "focus_next", "pane", key_display="Tab", priority=True),
        Binding("shift+tab", "focus_previous", "previous pane", show=False, priority=True),
        Binding("question_mark", "keys", "keys", key_display="?"),
        Binding("q", "quit_run", "quit"),
        Binding("r", "rejudge", "re-judge", tooltip="the branch's rules again on the evidence recorded (runbook re-read)"),
        Binding("R", "remeasure", "measure", key_display="R", tooltip="the branch's probes run again"),
        Binding("s", "save", "save"),
        Binding("v", "view_report", "report"),
        Binding("w", "toggle_wide", "wide", tooltip="tables with every column; scroll sideways with ←→"),
        Binding("l", "toggle_log", "log"),
        Binding("f", "follow", "follow"),
        Binding("ctrl+c", "quit_run", "quit", show=False, priority=True),
    ]
    LOG_MIN_HEIGHT = 32  # below this many rows the log starts hidden (l shows it): the findings need the room

    def __init__(
        self,
        runner: Runner | None,
        json_path: str | None = None,
        report_path: str | None = None,
        *,
        stable: bool | None = None,
        clock: Clock | None = None,
        autostart: bool = True,
        loading: str = "",
    ) -> None:
        super().__init__()
        self.runner: Runner | None = None
        self.json_path = json_path
        self.report_path = report_path
        self.stable = stable if stable is not None else os.environ.get(STABLE_ENV) == "1"
        self.clock = clock or (StableClock() if self.stable else Clock())
        self.state = RunState(clock=self.clock)
        self.state.runbook = loading  # until a runner comes: what is being loaded
        self.autostart = autostart
        self.results: Results | None = None  # the latest complete results (run or re-run)
        self.hypotheses: dict[str, Hypothesis] = {}
        self.when_painted: Callable[[], None] | None = None  # called once the first frame is on screen
        if runner is not None:
            self._take(runner)
        self._run_task: asyncio.Task | None = None
        self._quitting = False
        self._follow = True  # the cursor follows the running node; a person's move turns it off
        self._selected = ROOT
        self._snap: Results | None = None
        self._snap_version = -1
        self._logged = 0
        self._saved: set[str] = set()
        self._wide = False  # tables with every column, the detail pane scrolls sideways
        self._rereading = False  # `r` is reading the runbook again before it re-judges
        self._report: tuple[str, tuple] | None = None  # (markdown, drawn lines) of the latest complete results
        self._report_for: tuple[int, int] | None = None  # (id of those results, width drawn at)

    # -- layout ----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        with Horizontal(id="main"):
            yield HypothesisTree(id="tree")
            with Vertical(id="right"):
                yield LoadPanel(id="load")
                yield NodeDetail(id="detail")
        yield RichLog(id="log", max_lines=LOG_KEEP, wrap=True, min_width=20)
        yield KeyBar()

    def _take(self, runner: Runner) -> None:
        self.runner = runner
        self.state.runbook, self.state.title = runner.runbook.name, runner.runbook.title
        self.state.target = runner.target.public()
        runner.subscribers.append(self.state)
        runner.live_readings = True  # the live panel shows per-GPU and server readings while load runs
        self.hypotheses = {h.id: h for h, _ in runner.runbook.walk()}

    def on_mount(self) -> None:
        tree = self.query_one(HypothesisTree)
        tree.border_title = "hypotheses"
        tree.on_user_move = self._user_moved
        log = self.query_one("#log", RichLog)
        log.border_title = "log"
        log.display = self.size.height >= self.LOG_MIN_HEIGHT
        tree.focus()
        if self.runner is not None:
            self._show_runner()
        else:
            tree.root.set_label(Text(f"loading {self.state.runbook or 'the runbook'}…", style="dim"))
            self.query_one(NodeDetail).show(lambda: Text("loading the runbook and the probes…", style="dim"), "loading", ROOT)
        self.sync()
        self.set_interval(1 / REFRESH_HZ, self.sync)

    def on_ready(self) -> None:
        if self.when_painted is not None:
            self.when_painted()

    def adopt(self, runner: Runner, json_path: str | None, report_path: str | None) -> None:
        """The runner for an app already on screen (runner=None): the tree fills in and the run starts."""
        if self.runner is not None or self._quitting:
            return
        self.json_path, self.report_path = json_path, report_path
        self._take(runner)
        self._show_runner()
        self.refresh_bindings()
        self.sync()

    def _show_runner(self) -> None:
        assert self.runner is not None
        tree = self.query_one(HypothesisTree)
        tree.build(self.runner.runbook.name, [(h.id, p.id if p else None, h.title) for h, p in self.runner.runbook.walk()])
        if self.autostart:
            self.call_after_refresh(self.start)  # paint first: the runner's start-up (load, probes) can wait a frame

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While the runbook loads, only the keys that need no run answer (the others show dimmed)."""
        if self.runner is None and action not in ("quit_run", "keys", "focus_next", "focus_previous", "toggle_log"):
            return None
        return True

    def start(self) -> None:
        """Start the investigation (tests may mount first and start when ready)."""
        if self._run_task is None and self.runner is not None:
            self._run_task = asyncio.create_task(self._drive(self.runner.run()))

    async def _drive(self, work: Awaitable[Results]) -> None:
        try:
            self.results = await work
        except asyncio.CancelledError:
            self.results = self.runner.snapshot(interrupted=True)
        except Exception as exc:  # noqa: BLE001 - an engine bug ends the run, the UI stays to show it
            self.state.note(f"run failed: {type(exc).__name__}: {exc}", "error")
            self.state.phase = "failed"
            self.results = self.runner.snapshot(interrupted=True)
        if self.results is not None and self.state.results is None:
            self.state.results = self.results
        self.state.version += 1

    async def on_unmount(self) -> None:
        await self._stop_task()

    async def _stop_task(self) -> None:
        task = self._run_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    @property
    def running(self) -> bool:
        return self._run_task is not None and not self._run_task.done()

    # -- drawing ---------------------------------------------------------------------------------
    def current_results(self) -> Results:
        """Final results when the run ended, else what was found so far."""
        if not self.running and self.results is not None:
            return self.results
        return self.runner.snapshot()

    def sync(self) -> None:
        """The timer: bring every widget up to date with the recorded state. Cheap when nothing changed."""
        try:
            self._sync()
        except NoMatches:  # widgets still mounting (a busy machine): the next tick draws
            pass

    def _sync(self) -> None:
        st = self.state
        spinner = self.clock.spinner()
        if self.runner is None:
            self.query_one(RunHeader).show(st.runbook, "", st.elapsed(), "loading", spinner)
            return
        if st.version != self._snap_version:
            self._snap_version = st.version
            self._snap = self.current_results()
        inventory = self._snap.inventory() if self._snap is not None else {}
        target = target_text(st.target, inventory, self.stable)
        # what a running run waits for (admitting, sampling, profiling...); plain probing is just "running"
        phase = f"{st.phase} · {st.stage}" if st.phase == "running" and st.stage not in ("", "probing", "connecting") else st.phase
        self.query_one(RunHeader).show(st.runbook, target, st.elapsed(), phase, spinner)
        tree = self.query_one(HypothesisTree)
        tree.show_marks(st.marks, spinner, self._root_mark())
        self.query_one(LoadPanel).show(st.load, self.stable, live=st.live, sweep=st.sweep, now=st.elapsed(), done=st.done)
        self._follow_running(tree)
        self._show_detail(target)
        self._write_log()
        if st.done:
            self._prepare_report()

    def _root_mark(self) -> str:
        st = self.state
        if not st.done:
            return "running" if st.phase != "starting" else "pending"
        results = st.results or self.results
        if results is not None and results.confirmed():
            return "confirmed"
        return "inconclusive" if results is not None and results.interrupted else "refuted"

    def _follow_running(self, tree: HypothesisTree) -> None:
        if not self._follow:
            return
        st = self.state
        want = ROOT
        if not st.done:
            running = [hid for hid, _, _ in st.tree or [] if st.marks.get(hid) == "running"]
            if st.last_started in running:
                want = st.last_started or ROOT
            elif running:
                want = running[-1]
            else:
                want = self._selected
        if want != self._selected or (tree.cursor_node is not None and tree.cursor_node.data != want):
            node = tree.node_for(want)
            if node is not None:
                self._selected = want
                tree.move_cursor(node)

    def _show_detail(self, target: str) -> None:
        st, hid = self.state, self._selected
        detail = self.query_one(NodeDetail)
        if hid == ROOT or hid not in self.hypotheses:
            detail.border_title = "summary" if st.done else "overview"
            results = st.results or self.results
            if st.done and results is not None:
                from .. import report  # noqa: PLC0415

                files = file_rows(self.json_path, self.report_path or report.default_path(results), self._saved)
                detail.show(lambda: summary_view(st, results, files, target), ("summary", st.version, target, len(self._saved)), ROOT)
            else:
                desc = self.runner.runbook.description or ""
                detail.show(lambda: overview_view(st, desc, target, "…"), ("overview", st.version, target), ROOT)
            return
        hyp = self.hypotheses[hid]
        mark = st.marks.get(hid, "pending")
        result = self._snap.by_id(hid) if self._snap is not None and mark not in ("pending", "running") else None
        detail.border_title = hid
        live = tuple(p.probe for p in st.running_probes()) if mark == "running" else ()
        tps = len(st.load.tps) if mark == "running" else 0
        key = (hid, mark, st.reasons.get(hid), self._snap_version if mark not in ("pending", "running") else 0, live, tps, st.load.phase, self._wide)
        wide_to = 0
        if self._wide and result is not None and key != detail._key:  # measured once per view, not per tick
            from ..evidence import Table  # noqa: PLC0415
            from .blocks import FitTable  # noqa: PLC0415

            wide_to = max((FitTable(b).full_width() for ev in result.evidence for b in ev.blocks if isinstance(b, Table)), default=0)
        detail.show(lambda: node_view(st, hyp, result, "", self._wide), key, hid, wide_to)

    def _write_log(self) -> None:
        st = self.state
        total = st.log_dropped + len(st.log)
        if total == self._logged:
            return
        log = self.query_one("#log", RichLog)
        start = max(0, self._logged - st.log_dropped)
        for entry in st.log[start:]:
            line = Text(f"{entry.at:6.1f}s ", style="dim")
            line.append(entry.text, style=LEVEL_STYLE.get(entry.level, ""))
            log.write(line)
        self._logged = total

    # -- the user's moves --------------------------------------------------------------------------
    def _user_moved(self) -> None:
        self._follow = False

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        if self._follow:  # the follow moved the cursor; `_selected` already names that node
            return
        self._selected = event.node.data if event.node.data is not None else ROOT
        self.sync()

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        self._follow = False
        self._selected = event.node.data if event.node.data is not None else ROOT
        self.sync()

    def action_follow(self) -> None:
        self._follow = True
        self.notify("following the running hypothesis" if self.running else "showing the summary", timeout=2)
        self.sync()

    def action_toggle_log(self) -> None:
        log = self.query_one("#log", RichLog)
        log.display = not log.display
        if not log.display and log.has_focus:
            self.query_one(HypothesisTree).focus()

    def action_toggle_wide(self) -> None:
        self._wide = not self._wide
        # said on the pane's border while it lasts: a toast (a widget mounted, then a layout) cost the key more
        # than the tables did
        self.query_one(NodeDetail).border_subtitle = "every column · ←→ scrolls" if self._wide else ""
        self.sync()

    def action_keys(self) -> None:
        self.push_screen(KeysScreen(self))

    def action_rejudge(self) -> None:
        """`r`: the runbook's rules (read from disk again) on the evidence already recorded; no probe runs
        unless a node has none (it was skipped before)."""
        self._rerun(measure=False)

    def action_remeasure(self) -> None:
        """`R`: the branch's probes run again (a load window too, if the branch samples under load)."""
        self._rerun(measure=True)

    def _rerun(self, *, measure: bool) -> None:
        hid = self._selected
        if self.running or self._rereading:
            self.notify("The run is still going: re-run a branch once it ends.", severity="warning")
            return
        if hid not in self.hypotheses:
            self.notify("Select a hypothesis to re-run its branch.", severity="warning")
            return
        if measure:
            self._start_rerun(hid, measure=True)
            return
        self._rereading = True
        self.notify(f"Re-judging {hid}: reading the runbook again…", timeout=2)
        self.run_worker(self._rejudge(hid), group="rerun")

    async def _rejudge(self, hid: str) -> None:
        """Read the runbook in a thread (YAML and CEL take a few hundred ms), then re-judge with it."""
        try:
            fresh = await asyncio.to_thread(self.runner.read_fresh)
        except Exception as exc:  # noqa: BLE001 - a bad edit on disk is shown, the results stay
            self.notify(f"Cannot re-judge: {exc}", severity="error", timeout=8, markup=False)  # text, never Rich markup
            return
        finally:
            self._rereading = False
        self.runner.adopt(fresh)
        self.hypotheses = {h.id: h for h, _ in self.runner.runbook.walk()}
        self._start_rerun(hid, measure=False)

    def _start_rerun(self, hid: str, *, measure: bool) -> None:
        branch = [node.id for node, _ in self.hypotheses[hid].walk()]
        verb = "measuring again" if measure else "re-judging"
        how = "its probes run again" if measure else "the rules on the evidence recorded before, no new measurement"
        self.state.reset_branch(branch, f"{verb} {hid}")
        self.state.note(f"{verb} {hid} ({len(branch)} hypotheses): {how}")
        self.notify(f"{verb.capitalize()} {hid}: {how}. q keeps the earlier verdicts of what is not decided again.", timeout=4)
        self._follow = True
        self._run_task = asyncio.create_task(self._drive(self.runner.rerun(hid, measure=measure)))

    def action_save(self) -> None:
        """Write the JSON and the report; once the run has ended in a thread, so the keys stay quick."""
        results = self.current_results()
        if self.running:  # the runner changes these results as it goes: write them here, in its thread
            self._saved_files(results, self._write_files(results))
            return

        async def save() -> None:
            self._saved_files(results, await asyncio.to_thread(self._write_files, results))

        self.run_worker(save(), group="save")

    def _write_files(self, results: Results) -> list[str] | OSError:
        from .. import report  # noqa: PLC0415

        try:
            cached = self._report if self._report_for and self._report_for[0] == id(results) else None
            if cached is not None:
                path = Path(self.report_path) if self.report_path else report.default_path(results)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(cached[0], encoding="utf-8")
                written = [str(path)]
            else:
                written = [str(report.write(results, self.report_path))]
            if self.json_path:
                written.insert(0, str(results.write_json(self.json_path)))
        except OSError as exc:
            return exc
        return written

    def _saved_files(self, results: Results, written: list[str] | OSError) -> None:
        if isinstance(written, OSError):
            self.notify(f"Could not save: {written}", severity="error", markup=False)
            return
        self._saved.update(written)
        if self.report_path is None:
            from .. import report  # noqa: PLC0415

            self._saved.add(str(report.default_path(results)))
        self.state.note("saved " + ", ".join(written))
        self.notify("Saved " + ", ".join(written), timeout=4)
        self.sync()

    def _report_width(self) -> int:
        return max(20, self.size.width - 1)  # the report view's vertical scrollbar takes one column

    def _prepare_report(self) -> None:
        """Once the run (or a re-run) ends, draw the report in a thread so `v` opens it at once."""
        results, width = self.results, self._report_width()
        if results is None or self.running or self._report_for == (id(results), width):
            return
        self._report_for = (id(results), width)

        async def draw() -> None:
            from .. import report  # noqa: PLC0415
            from .report_screen import render_lines  # noqa: PLC0415

            markdown = report.render(results)
            prepared = await asyncio.to_thread(render_lines, markdown, width)
            if self._report_for == (id(results), width):
                self._report = (markdown, prepared)

        self._report = None
        self.run_worker(draw(), group="report", exclusive=True)

    def action_view_report(self) -> None:
        from .. import report  # noqa: PLC0415
        from .report_screen import ReportScreen  # noqa: PLC0415

        results = self.current_results()
        title = f"{results.runbook}{' (so far)' if self.running else ''}"
        if not self.running and self._report is not None and self._report_for == (id(results), self._report_width()):
            markdown, prepared = self._report
            self.push_screen(ReportScreen(markdown, title, prepared))
            return
        screen = ReportScreen(None, title)
        self.push_screen(screen)  # opens at once; the report fills in when drawn
        self.call_after_refresh(lambda: screen.show(report.render(results)))

    async def action_quit_run(self) -> None:
        """Cancel a run in progress (its findings are kept as interrupted results), then leave."""
        if self._quitting:
            return
        self._quitting = True
        if self.runner is None:  # quit while the runbook loads: nothing ran
            self.exit(None)
            return
        if self.running:
            self.state.phase = "cancelling"
            self.sync()
            await self._stop_task()
            self.results = self.runner.snapshot(interrupted=True)
        self.exit(self.results or self.runner.snapshot(interrupted=True))


def run_app(runner: Runner, json_path: str | None, report_path: str | None) -> Results:
    """Run the app in this thread until the user quits; returns what the run found. With an app already on
    screen (launch.py), the runner goes to that one and this waits until it closes."""
    from .handoff import on_screen  # noqa: PLC0415

    shown = on_screen()
    if shown is not None:
        app, returned = shown.hand_over(runner, json_path, report_path), None
        returned = app.return_value
    else:
        app = RunbookApp(runner, json_path, report_path)
        returned = app.run()
    from ..results import Results  # noqa: PLC0415

    if isinstance(returned, Results):
        return returned
    return app.results or runner.snapshot(interrupted=True)
