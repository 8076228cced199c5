"""One vocabulary per server (issue 31, acceptance 1).

Every bundled scenario is run end to end through the CLI, and what a person reads of the run is scanned for
the other server's words: on a vLLM host no "SGLang", "sglang", "SGLANG_" or "/generate"; on an SGLang host no
"vLLM", "vllm" or "VLLM_". What a person reads: standard output and error, the Markdown report, the JSON's prose
(summaries, headlines, reasons, explanations, steps, labels, probe names, block titles and rows, the load's
and the target's texts) and, for one scenario of each kind, the TUI's screens (header, tree, the detail pane
of every hypothesis, the summary, the load panel, the key bar, the log).

Not prose, so not scanned: rule expressions (a rule may well test `server.server_kind == 'sglang'`) and the
recorded field names and values a rule read (`name=value`, "`name` = value", the TUI's rule grid), the
evidence's recorded values (data, under their own names), the call parameters and the runbook's source. Only
text that *is* a rule of the runbook, or such a binding right after one, is taken out: a rule shown where
it is not one of the runbook's rules is prose and is scanned.

A failure lists every hit, where it was found (stream and line, report line, JSON path, TUI pane), as a to-do
list. The runs go in parallel (they mostly wait on sampling windows) and only those of the selected tests.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_runbook.sim.scenario import load_scenario
from rich.console import Console, Group
from rich.table import Table as RichTable
from rich.text import Text

REPO = Path(__file__).parent.parent
RUNBOOKS = REPO / "runbooks"
SCENARIOS = {p.stem: p for p in sorted((RUNBOOKS / "scenarios").glob("*.yaml"))}
KIND = {name: load_scenario(path).server.kind for name, path in SCENARIOS.items()}
VENDOR = {name: load_scenario(path).gpu.vendor for name, path in SCENARIOS.items()}

# The other server's words, by the kind of server the run is on (the lists, exactly).
FOREIGN = {
    "vllm": re.compile(r"SGLang|sglang|SGLANG_|/generate"),
    "sglang": re.compile(r"vLLM|vllm|VLLM_"),
}

# The other GPU vendor's tools and library, by the vendor of the host's GPUs (issue 37): an AMD host's prose names
# amd-smi and amdsmi, never nvidia-smi or NVML; an NVIDIA host's never amd-smi or amdsmi.
GPU_FOREIGN = {
    "amd": re.compile(r"nvidia-smi|NVML|\bnvml"),
    "nvidia": re.compile(r"amd-smi|amdsmi"),
}

# Short windows: the words do not depend on how long a window is. Each name is a power-starvation param.
SHORT = {"sample_seconds": "3", "warmup_seconds": "1", "load_concurrency": "32", "steady_seconds": "0",
         "profile_wait_seconds": "20"}  # fmt: skip
# throughput-plateau: a sweep that reaches the running cap of the *-64 scenarios in a few seconds
SWEEP = {"sweep_levels": "16,64,128", "seconds_per_level": "1", "output_len": "32"}
# `--depth standard` (load, profile, sweep) for these; `--depth quick` for every scenario. Chosen by what they
# add: the seeds' box on each server, and vLLM's profiler (the profile's prose).
STANDARD_PREFERRED = ("seed-rtx-pro-6000-tp8", "seed-rtx-pro-6000-tp8-vllm", "healthy-h200-vllm-profiler")
PLATEAU_PREFERRED = ("running-cap-64", "max-num-seqs-64-vllm")
TUI_PREFERRED = ("seed-rtx-pro-6000-tp8", "seed-rtx-pro-6000-tp8-vllm")


def _pick(preferred: Iterable[str], per_kind: int = 1) -> list[str]:
    """The preferred scenarios that exist, topped up so each kind has at least `per_kind` (scenarios come and go)."""
    chosen = [name for name in preferred if name in SCENARIOS]
    for kind in FOREIGN:
        have = [n for n in chosen if KIND[n] == kind]
        chosen += [n for n in SCENARIOS if KIND[n] == kind and n not in chosen][: max(0, per_kind - len(have))]
    return chosen


@dataclass(frozen=True)
class Run:
    runbook: str
    scenario: str
    depth: str

    @property
    def id(self) -> str:
        return f"{self.runbook}-{self.depth}-{self.scenario}"

    @property
    def kind(self) -> str:
        return KIND[self.scenario]

    def argv(self, out: Path) -> list[str]:
        sets = SWEEP if self.runbook == "throughput-plateau" else SHORT
        argv = [sys.executable, "-m", "gpu_runbook.cli", "run", self.runbook, "--simulate", self.scenario, "--no-tui",
                "--depth", self.depth, "--json", str(out / "r.json"), "--report", str(out / "r.md")]  # fmt: skip
        for name, value in sets.items():
            argv += ["--set", f"{name}={value}"]
        return argv + (["-v"] if self.depth == "standard" else [])  # -v: node and probe starts too (quick: the default lines)


RUNS = (
    [Run("power-starvation", name, "quick") for name in SCENARIOS]
    + [Run("power-starvation", name, "standard") for name in _pick(STANDARD_PREFERRED)]
    + [Run("throughput-plateau", name, "standard") for name in _pick(PLATEAU_PREFERRED)]
)


def test_the_scenarios_of_both_kinds_are_found() -> None:
    """The split the rest relies on: the vLLM scenarios are the files that say `kind: vllm`, the rest SGLang's."""
    by_kind = {kind: sorted(n for n in SCENARIOS if KIND[n] == kind) for kind in FOREIGN}
    assert {"healthy-h200-vllm", "healthy-h200-vllm-profiler", "max-num-seqs-64-vllm", "seed-rtx-pro-6000-tp8-vllm",
            "vllm-085-old-kv-name"} <= set(by_kind["vllm"])  # fmt: skip
    assert len(by_kind["sglang"]) >= 10 and "seed-rtx-pro-6000-tp8" in by_kind["sglang"]
    for kind in by_kind:
        assert any(r.kind == kind and r.depth == "standard" for r in RUNS), kind
        assert any(r.kind == kind and r.runbook == "throughput-plateau" for r in RUNS), kind


# -- what is not prose: the runbooks' rules and the field names they read -----------------------------------------
RULE_KEYS = {"when", "confirm", "refute", "cost", "factor"}  # CEL in a runbook (hypotheses, variants, steps, gains)
PATH = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+"  # a recorded field a rule reads: alias.field...


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _rules_in(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in RULE_KEYS and isinstance(value, str) and value.strip():
                yield _collapse(value)
            else:
                yield from _rules_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from _rules_in(item)


def rules_of(results: dict[str, Any]) -> list[str]:
    """Every rule of the run's runbook (each server's variants too) and every rule the results recorded, longest first."""
    found = set(_rules_in(yaml.safe_load(results.get("runbook_source") or "") or {}))
    for h in results.get("hypotheses") or []:
        found |= {_collapse(h[k]) for k in ("rule",) if h.get(k)}
        found |= {_collapse(s["when"]) for s in h.get("steps") or [] if isinstance(s, dict) and s.get("when")}
    return sorted(found, key=len, reverse=True)


class Strip:
    """Takes the rules (and the bindings shown with them) out of a text, leaving everything else as it was."""

    def __init__(self, rules: list[str]) -> None:
        self.rules = rules
        self.any_rule = re.compile("|".join(re.escape(r) for r in rules)) if rules else None

    def __call__(self, text: str) -> str:
        if self.any_rule is None:
            return text
        out, at = [], 0
        for m in self.any_rule.finditer(text):
            if m.start() < at:
                continue
            start, end = m.start(), m.end()
            if start > 0 and text[start - 1] == "`" and text[end : end + 1] == "`":  # the report: "by `rule` with `x` = 1"
                start, end = start - 1, self._report_bindings(text, end + 1)
            elif text.startswith(" [", end):  # the runner's reason: "rule [x=1, y=missing]"
                end = self._reason_bindings(text, end)
            out.append(text[at:start] + "‹rule›")
            at = end
        out.append(text[at:])
        return "".join(out)

    @staticmethod
    def _reason_bindings(text: str, end: int) -> int:
        """`end` at " [": past the "]" that closes `name=value, ...` (a value runs to the next ", name=" or to the
        "]" that ends the line or a clause), or `end` unchanged when what follows is not such a list."""
        first = re.compile(r" \[(" + PATH + ")=").match(text, end)
        if first is None:
            return end
        pos = first.end()
        nxt = re.compile(r", (" + PATH + ")=")
        close = re.compile(r"\](?=[;)]|\n|$)")  # the list ends the line, or a clause: "(confirm false: r [..]; ..)"
        while True:
            b, c = nxt.search(text, pos), close.search(text, pos)
            if c is None:
                return end
            if b is not None and b.start() < c.start() and "\n" not in text[pos : b.start()]:
                pos = b.end()
                continue
            return c.end()

    @staticmethod
    def _report_bindings(text: str, end: int) -> int:
        """`end` after the rule's closing backtick: past " with `name` = value, ..." (a value runs to the next
        ", `name` = " or to the sentence's end)."""
        m = re.compile(r" with `(" + PATH + ")` = ").match(text, end)
        if m is None:
            return end
        pos = m.end()
        nxt = re.compile(r", `(" + PATH + ")` = ")
        stop = re.compile(r"\.(?=\s|$)|\n|$")
        while True:
            b, s = nxt.search(text, pos), stop.search(text, pos)
            if b is not None and (s is None or b.start() < s.start()):
                pos = b.end()
                continue
            return s.start() if s is not None else len(text)


# -- where a person reads it: JSON prose, report, streams -----------------------------------------------------------
# JSON keys whose values are not prose: rules, what rules read, recorded values, call parameters, the runbook's
# source and path, timestamps and other data a tool reads.
NOT_PROSE = {
    "rule", "rule_values", "when", "headline_values", "values", "params", "runbook_source", "runbook_path",
    "runbook_sha256", "started_at", "finished_at", "config", "server_url", "sglang_url", "dcgm_url", "calibration",
    "points", "decode_timeline", "errors_by_kind", "error_examples", "factor",
}  # fmt: skip


def _label(item: Any, i: int) -> str:
    if isinstance(item, dict):
        for key in ("id", "alias", "probe", "title"):
            if isinstance(item.get(key), str):
                return f"[{item[key]}]"
    return f"[{i}]"


def json_prose(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(JSON path, text) for every string a person reads in the results."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in NOT_PROSE:
                yield from json_prose(value, f"{path}.{key}" if path else key)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from json_prose(item, f"{path}{_label(item, i)}")
    elif isinstance(node, str):
        yield path, node


@dataclass
class Hit:
    where: str
    word: str
    context: str

    def __str__(self) -> str:
        return f"{self.where}: {self.word!r} in …{self.context}…"


def scan(pattern: re.Pattern[str], where: str, text: str) -> list[Hit]:
    hits = []
    for lineno, line in enumerate(text.splitlines() or [text], 1):
        for m in pattern.finditer(line):
            context = line[max(0, m.start() - 70) : m.end() + 70].strip()
            hits.append(Hit(f"{where}:{lineno}" if "\n" in text else where, m.group(0), context))
    return hits


CHECKOUT = str(Path(__file__).resolve().parent.parent)


def hits_in_outputs(kind: str, stdout: str, stderr: str, report: str, results: dict[str, Any],
                    pattern: re.Pattern[str] | None = None) -> list[Hit]:
    rules, pattern = Strip(rules_of(results)), pattern or FOREIGN[kind]

    def strip(text: str) -> str:  # where this checkout sits (the report names the runbook's path) is no prose of the run
        return rules(text.replace(CHECKOUT, "<checkout>"))
    hits = scan(pattern, "stdout", strip(stdout)) + scan(pattern, "stderr", strip(stderr))
    hits += scan(pattern, "report.md", strip(report))
    for path, text in json_prose(results):
        hits += scan(pattern, f"json {path}", strip(text))
    return hits


def _todo(run_id: str, kind: str, hits: list[Hit]) -> str:
    lines = [f"{run_id} ({kind}): {len(hits)} of the other server's words in its prose:"]
    lines += [f"  - {h}" for h in hits]
    return "\n".join(lines)


# -- the runs, in parallel, only those the selected tests need ------------------------------------------------------
@dataclass
class Output:
    rc: int
    stdout: str
    stderr: str
    report: str | None
    results: dict[str, Any] | None


def _run(run: Run, out: Path) -> Output:
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["COLUMNS"] = "200"
    proc = subprocess.run(run.argv(out), check=False, cwd=out, env=env, text=True, capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
    report = (out / "r.md").read_text(encoding="utf-8") if (out / "r.md").exists() else None
    results = json.loads((out / "r.json").read_text(encoding="utf-8")) if (out / "r.json").exists() else None
    return Output(proc.returncode, proc.stdout, proc.stderr, report, results)


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[Output]]]:
    wanted = {item.callspec.params["run"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec") and "run" in item.callspec.params}  # fmt: skip
    root = tmp_path_factory.mktemp("vocabulary")
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield {r.id: pool.submit(_run, r, root / r.id) for r in RUNS if r in wanted}


# -- the TUI: every pane, every hypothesis's detail, on one scenario of each kind -------------------------------
def _plain(renderable: Any, width: int = 4000) -> str:
    """A Rich renderable as the text it draws (wide: a rule or a sentence stays on one line)."""
    if isinstance(renderable, Text):
        return renderable.plain
    if isinstance(renderable, str):
        return renderable
    console = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False, soft_wrap=False)
    with console.capture() as cap:
        console.print(renderable)
    return cap.get()


def _is_names_grid(part: Any, names: set[str]) -> bool:
    """The detail pane's grid of recorded names and values (a rule's bindings, an evidence's values): data."""
    if not isinstance(part, RichTable) or part.show_header or part.box is not None or len(part.columns) != 2:
        return False
    cells = [c.plain if isinstance(c, Text) else str(c) for c in part.columns[0].cells]
    return bool(cells) and all(c in names or c == "…" or (c.endswith("…") and any(n.startswith(c[:-1]) for n in names)) for c in cells)


def _pane_text(renderable: Any, names: set[str]) -> str:
    renderable = getattr(renderable, "renderable", renderable)  # the pane's Drawn: what it replays
    if isinstance(renderable, Group):
        return "\n".join(_pane_text(part, names) for part in renderable.renderables if not _is_names_grid(part, names))
    return _plain(renderable)


def _recorded_names(results: Any) -> set[str]:
    names: set[str] = set()
    for h in results.hypotheses:
        names |= set(h.rule_values or {})
        for ev in h.evidence:
            names |= {str(k) for k in (ev.values or {})}
    return names


async def _tui_screens(scenario: str, tmp_path: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """Run power-starvation on `scenario` in the app (as `runbook run` does in a terminal) and read every pane."""
    from gpu_runbook.loader import load
    from gpu_runbook.registry import Registry
    from gpu_runbook.runner import Runner, resolve_params
    from gpu_runbook.sim.host import SimulatedHost
    from gpu_runbook.tui.app import RunbookApp
    from gpu_runbook.tui.keybar import KeyBar
    from gpu_runbook.tui.keys import keys_table
    from gpu_runbook.tui.loadpanel import LoadPanel
    from gpu_runbook.tui.tree import HypothesisTree
    from test_tui_support import wait_for
    from textual.widgets import Static

    registry = Registry.discover()
    loaded = load(RUNBOOKS / "power-starvation.yaml", registry)
    params = resolve_params(loaded, dict(SHORT), "standard", registry)
    screens: dict[str, str] = {}
    with SimulatedHost.start(scenario) as host:
        runner = Runner(loaded, registry, host.target(), params, nvml=host.nvml, depth="standard")
        app = RunbookApp(runner, str(tmp_path / "r.json"), str(tmp_path / "r.md"), stable=True)
        async with app.run_test(size=(160, 50)) as pilot:
            load_seen: list[str] = []

            def done_or_note_load() -> bool:
                panel = app.query_one(LoadPanel)
                if panel.display:
                    text = _plain(panel.content)
                    if text.strip() and (not load_seen or load_seen[-1] != text):
                        load_seen.append(text)
                return app.state.done

            await wait_for(pilot, done_or_note_load, timeout=120)
            app.sync()
            await pilot.pause()
            results = app.results
            assert results is not None and not results.interrupted
            names = _recorded_names(results)
            screens["header"] = _plain(app.query_one("#header-left", Static).content) + "\n" + _plain(app.query_one("#header-right", Static).content)
            tree = app.query_one(HypothesisTree)
            screens["tree"] = "\n".join([tree.root.label.plain] + [f"{hid}: {node.label.plain}" for hid, node in tree.by_id.items()])
            screens["key bar"] = _plain(app.query_one(KeyBar).content)
            screens["keys (?)"] = _plain(keys_table(app))
            for i, text in enumerate(load_seen):
                screens[f"load panel (frame {i})"] = text
            screens["log"] = "\n".join(entry.text for entry in app.state.log)
            body = app.query_one("#detail-body", Static)
            screens["summary"] = _pane_text(body.content, names)
            tree.on_user_move()  # as a person's first move does: the cursor stops following the run (a follow tick
            await pilot.pause()  # racing a selection would move it back to the summary)
            for hid, node in tree.by_id.items():
                tree.select_node(node)

                def showing(hid: str = hid) -> bool:
                    app.sync()
                    return app.query_one("#detail").border_title == hid

                await wait_for(pilot, showing, timeout=30)
                screens[f"detail [{hid}]"] = _pane_text(body.content, names)
            await pilot.press("q")
    return screens, json.loads(results.model_dump_json())


TUI_RUNS = _pick(TUI_PREFERRED)


@pytest.mark.parametrize("scenario", TUI_RUNS)
async def test_no_other_servers_words_on_the_tui_screens(scenario: str, tmp_path: Path, runs: dict[str, Future[Output]]) -> None:
    # (`runs`: the CLI runs go on in the background meanwhile)
    kind = KIND[scenario]
    screens, results = await _tui_screens(scenario, tmp_path)
    strip, pattern = Strip(rules_of(results)), FOREIGN[kind]
    assert screens["log"] and len(screens) > 10, sorted(screens)
    hits = [h for where, text in screens.items() for h in scan(pattern, f"tui {where}", strip(text))]
    assert not hits, _todo(f"tui power-starvation-standard-{scenario}", kind, hits)


# -- the stripping itself: only rules and their bindings go ---------------------------------------------------------
def test_only_rules_and_their_bindings_are_taken_out() -> None:
    rule = "inv.cc_major == 12.0 && server.server_kind == 'sglang'"
    strip = Strip([rule])
    reason = f"precondition false: {rule} [inv.cc_major=9, server.server_kind=vllm]"
    assert strip(reason) == "precondition false: ‹rule›"
    report = f"Decided by `{rule}` with `inv.cc_major` = 9, `server.server_kind` = vllm. Then SGLang's words."
    assert strip(report) == "Decided by ‹rule›. Then SGLang's words."
    # a rule that is not one of the runbook's, and prose around a rule, stay
    assert strip("refute: server.kind == 'sglang' [server.kind=vllm]") == "refute: server.kind == 'sglang' [server.kind=vllm]"
    assert strip(f"{rule} on sglang") == "‹rule› on sglang"
    assert strip(f"{rule} [see sglang docs]") == "‹rule› [see sglang docs]"
    # a value with brackets (a list, cut at 60 characters) ends at the line's closing bracket
    rule2 = "ref.curve != null"
    assert Strip([rule2])(f"x: {rule2} [ref.curve=[[0.0, 488.0], [1.0,..., ref.n=2]\nsglang") == "x: ‹rule›\nsglang"
    both = f"neither rule held (confirm false: {rule} [inv.cc_major=9]; refute false: {rule2} [ref.curve=[1, 2]]) sglang"
    assert Strip([rule, rule2])(both) == "neither rule held (confirm false: ‹rule›; refute false: ‹rule›) sglang"
    assert scan(FOREIGN["vllm"], "stdout", "a\nPOST /generate to SGLang") == [
        Hit("stdout:2", "/generate", "POST /generate to SGLang"), Hit("stdout:2", "SGLang", "POST /generate to SGLang")]
    assert not FOREIGN["sglang"].search("SGLang at /generate") and FOREIGN["sglang"].search("VLLM_USE_V1")


@pytest.mark.parametrize("run", RUNS, ids=[r.id for r in RUNS])
def test_no_other_servers_words_in_a_runs_prose(run: Run, runs: dict[str, Future[Output]]) -> None:
    out = runs[run.id].result()
    assert out.results is not None and out.report is not None, f"{run.id}: exit {out.rc}, no results written\n{out.stderr[-3000:]}"
    assert out.results["target"]["server_kind"] == run.kind, out.results["target"]
    hits = hits_in_outputs(run.kind, out.stdout, out.stderr, out.report, out.results)
    assert not hits, _todo(run.id, run.kind, hits)
    vendor = VENDOR[run.scenario]
    hits = hits_in_outputs(run.kind, out.stdout, out.stderr, out.report, out.results, pattern=GPU_FOREIGN[vendor])
    assert not hits, _todo(run.id, f"{vendor} GPUs", hits).replace("the other server's words", "the other GPU vendor's words")
