"""Every output names the server found (issue 31 item 4): a run against a simulated vLLM server says vLLM, its
version and TP, and the endpoint its load really posts to (`/v1/completions`); a run against a simulated SGLang
server says SGLang and `/generate`, never vLLM. Each run goes through the CLI in a child process, with a short
window (a few seconds of sampling at 16 requests); nothing here waits on a clock of its own.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_runbook.cli import main
from gpu_runbook.events import LoadStarted, RunStarted
from gpu_runbook.results import read_results
from gpu_runbook.sim.scenario import load_scenario
from gpu_runbook.tui.header import target_text
from gpu_runbook.tui.state import RunState

from conftest import REPO

CLI = [sys.executable, "-m", "gpu_runbook.cli"]
SHORT = ["--set", "sample_seconds=3", "--set", "warmup_seconds=1", "--set", "load_concurrency=16"]
SCENARIOS = {"vllm": "seed-rtx-pro-6000-tp8-vllm", "sglang": "seed-rtx-pro-6000-tp8"}
TITLES = {"vllm": "vLLM", "sglang": "SGLang"}
PATHS = {"vllm": "/v1/completions", "sglang": "/generate"}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def run(request, tmp_path_factory) -> dict:
    """power-starvation against the scenario's simulated server, through the CLI: its stdout, report and results."""
    kind = request.param
    out = tmp_path_factory.mktemp(kind)
    cmd = [*CLI, "run", "power-starvation", "--simulate", SCENARIOS[kind], "--no-tui",
           "--report", str(out / "r.md"), "--json", str(out / "o.json"), *SHORT]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), text=True, capture_output=True, timeout=600)
    assert (out / "o.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"kind": kind, "stdout": proc.stdout, "report": (out / "r.md").read_text(), "results": read_results(out / "o.json"),
            "version": load_scenario(SCENARIOS[kind]).server.version}  # fmt: skip


def _footer(report: str) -> str:
    """The report's server line, under "Target and run"."""
    section = report.split("## Target and run", 1)[1]
    line = next(line for line in section.splitlines() if "server: " in line)
    return line.split("server: ", 1)[1]


def test_the_footer_names_the_kind_version_and_layout_found(run) -> None:
    footer = _footer(run["report"])
    title, other = TITLES[run["kind"]], TITLES["sglang" if run["kind"] == "vllm" else "vllm"]
    assert footer.startswith(f"{title} {run['version']}, model "), footer
    assert other not in footer, footer
    # the scenarios serve at TP 8, DP 1, with an FP8 KV cache whose capacity the server probe read
    assert ", TP 8, DP 1, " in footer and "TP ?" not in footer, footer
    assert re.search(r"KV cache fp8\S* \([\d,]+ tokens\)", footer), footer
    # and the figures are the server probe's own, whichever family read them
    server = run["results"].inventory()["server"]
    assert server["server_kind"] == run["kind"] and server["version"] == run["version"] and server["tp"] == 8


def test_the_load_names_the_endpoint_really_used(run) -> None:
    path, other = PATHS[run["kind"]], PATHS["sglang" if run["kind"] == "vllm" else "vllm"]
    load_lines = [line for line in run["stdout"].splitlines() if "concurrent requests to" in line]
    assert load_lines and all(f"requests to {path}," in line for line in load_lines), load_lines
    assert f"concurrent requests to `{path}`" in run["report"]
    assert other not in "\n".join(load_lines) and f"requests to `{other}`" not in run["report"]
    assert run["results"].load["config"]["endpoint"] == path.rsplit("/", 1)[1]  # the JSON records the one used


def test_the_progress_log_names_the_server_found(run) -> None:
    title = TITLES[run["kind"]]
    line = next(line for line in run["stdout"].splitlines() if "] server: " in line)
    assert re.search(rf"server: {title} at http://127\.0\.0\.1:\d+ \(the simulated {title} server of scenario ", line), line


def test_the_tui_header_summary_and_log_name_the_server_found(run) -> None:
    """The header (and the summary panel, which shows the same line) from the run's own results; the log from the
    events the runner sends, its load event carrying the endpoint the runbook asked for."""
    results, title, path = run["results"], TITLES[run["kind"]], PATHS[run["kind"]]
    header = target_text(results.target, results.inventory(), stable=True)
    assert f"{title} {run['version']} at http://127.0.0.1:PORT" in header, header
    state = RunState()
    state(RunStarted("power-starvation", "t", dict(results.target), []))
    state(LoadStarted({"endpoint": "generate", "concurrency": 16}, 1.0))
    log = "\n".join(entry.text for entry in state.log)
    assert f"server: {title} at http://127.0.0.1:" in log, log
    assert f"16 concurrent requests to {path}," in log, log
    assert state.load.config["endpoint"] == path.rsplit("/", 1)[1]


def test_simulate_help_names_no_single_server_kind(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "vLLM" in text and "simulated SGLang server" not in text, text
    assert text.count("SGLang") == text.count("SGLang or vLLM"), text  # SGLang only ever as one of the two
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = " ".join(capsys.readouterr().out.split())
    assert "SGLang server on" not in listing and "simulated server (SGLang or vLLM" in listing, listing


@pytest.mark.parametrize("kind", sorted(SCENARIOS))
def test_simulate_says_the_kind_it_serves_first(kind) -> None:
    """stdout's first line stays the URL (scripts read it); the first line on stderr names the kind and version."""
    proc = subprocess.Popen([*CLI, "simulate", SCENARIOS[kind]], cwd=REPO, env=_env(), text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=120), "no URL line"
        url = proc.stdout.readline().strip()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert url.startswith("http://127.0.0.1:"), url
    first = err.splitlines()[0]
    version = load_scenario(SCENARIOS[kind]).server.version
    assert first.startswith(f"serving {TITLES[kind]} {version} of scenario {SCENARIOS[kind]}: "), first
    assert TITLES["sglang" if kind == "vllm" else "vllm"] not in first.split(":", 1)[0], first


def test_the_report_of_a_results_file_from_before_vllm_still_says_sglang(tmp_path: Path, run) -> None:
    """Results written before server kinds (no `server_kind` anywhere) came from SGLang: the footer says so."""
    if run["kind"] != "sglang":
        pytest.skip("an SGLang run's results stand in for the old file")
    from gpu_runbook.report import render  # noqa: PLC0415

    old = run["results"].model_copy(deep=True)
    old.target.pop("server_kind", None)
    for h in old.hypotheses:
        for ev in h.evidence:
            ev.values.pop("server_kind", None)
    assert _footer(render(old)).startswith(f"SGLang {run['version']}, ")
