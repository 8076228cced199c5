"""The CLI conventions of issue 14 item 5: `-` is standard output, exit 3 when nothing was measured,
--json listings, `probes NAME`, shell completion, --fail-on levels, colour and NO_COLOR, --quiet,
usage on stderr, did-you-mean; and RUNBOOK_DEBUG=1 showing a failing probe's traceback."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_runbook.cli import _parser

TESTS = Path(__file__).parent
PROBE_FILES = TESTS / "probe_files"
CLI = [sys.executable, "-m", "gpu_runbook.cli"]
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_") and k != "NO_COLOR"}, "PYTHONPATH": str(TESTS.parent)}

QUICK = """
name: quick
title: Two quick findings
params:
  threshold: { type: float, default: 1.0 }
hypotheses:
  - id: warm
    title: A warning
    probes: { x: { probe: test.value, with: { values: { v: 1 } } } }
    confirm: x.v >= params.threshold
    refute: x.v < params.threshold
    severity: warning
  - id: note
    title: Only information
    probes: { x: { probe: test.value, with: { values: { v: 1 } } } }
    confirm: x.v == 1.0
    severity: info
"""

UNMEASURED = """
name: blind
title: Nothing can be seen
hypotheses:
  - id: gpus
    title: GPUs
    probes: { g: { probe: test.unavailable }, f: { probe: test.fail, with: { message: kaboom } } }
    confirm: g.x == 1.0 || f.x == 1.0
    severity: critical
"""


def runbook(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), cwd=cwd, capture_output=True, text=True, env=env or ENV, timeout=timeout)


@pytest.fixture
def quick(tmp_path: Path) -> Path:
    (tmp_path / "quick.yaml").write_text(QUICK)
    return tmp_path


def run_quick(cwd: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return runbook("run", "quick.yaml", "--no-tui", "--probes-dir", str(PROBE_FILES), *extra, cwd=cwd, env=env)


# -- `-` is standard output ------------------------------------------------------------------------


def test_json_dash_writes_only_the_results_to_stdout_and_progress_to_stderr(quick):
    proc = run_quick(quick, "--json", "-", "--report", "r.md")
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)  # nothing but the JSON on stdout
    assert results["runbook"] == "quick" and {h["id"] for h in results["hypotheses"]} == {"warm", "note"}
    assert "confirmed    warm" in proc.stderr and "Verdicts: 2 confirmed" in proc.stderr
    assert not (quick / "-").exists()
    assert (quick / "r.md").exists()


def test_host_sanity_json_dash_pipes_into_json_tool(tmp_path):
    proc = subprocess.run(" ".join(CLI) + " run host-sanity --no-tui --json - --report r.md | " + sys.executable + " -m json.tool",
                          shell=True, cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["runbook"] == "host-sanity"


def test_report_dash_prints_the_report_and_writes_no_report_file(quick):
    proc = run_quick(quick, "--report", "-", "--json", "r.json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# Two quick findings") and "warm" in proc.stdout
    assert "Report:" not in proc.stdout + proc.stderr  # no file was written, so none is named
    assert not (quick / "-").exists() and not (quick / "reports").exists()
    again = runbook("report", "r.json", "--out", "-", cwd=quick)
    assert again.returncode == 0, again.stderr
    assert again.stdout == proc.stdout  # the same results, the same report
    assert not (quick / "-").exists()


def test_json_dash_and_report_dash_together_is_a_usage_error(quick):
    proc = run_quick(quick, "--json", "-", "--report", "-")
    assert proc.returncode == 2
    assert "--json - and --report - both ask for standard output" in proc.stderr
    assert proc.stdout == ""


# -- exit codes ----------------------------------------------------------------------------------------


def test_nothing_measured_exits_3(tmp_path):
    (tmp_path / "blind.yaml").write_text(UNMEASURED)
    proc = runbook("run", "blind.yaml", "--no-tui", "--probes-dir", str(PROBE_FILES), "--json", "r.json", "--report", "r.md", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "nothing could be measured" in proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["hypotheses"][0]["verdict"] == "error"  # still written


def test_unreachable_server_and_no_gpu_exits_3(tmp_path):
    with socket.socket() as s:  # a free port on 127.0.0.1 with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if _nvml_present():
        pytest.skip("this machine has an NVIDIA driver: the GPU probes measure something")
    proc = runbook("run", "power-starvation", "--no-tui", "--sglang-url", f"http://127.0.0.1:{port}", "--report", "r.md", cwd=tmp_path, timeout=300)
    assert "nothing could be measured" in proc.stderr
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr


def _nvml_present() -> bool:
    import ctypes.util  # noqa: PLC0415

    return ctypes.util.find_library("nvidia-ml") is not None or Path("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").exists()


def test_fail_on_levels(quick):
    assert run_quick(quick, "--report", "r.md").returncode == 0
    assert run_quick(quick, "--report", "r.md", "--fail-on", "warning").returncode == 1
    assert run_quick(quick, "--report", "r.md", "--fail-on", "confirmed").returncode == 1
    assert run_quick(quick, "--report", "r.md", "--fail-on", "critical").returncode == 0  # only a warning confirmed
    assert run_quick(quick, "--report", "r.md", "--fail-on", "warning", "--set", "threshold=2").returncode == 0  # refuted
    bad = run_quick(quick, "--fail-on", "info")
    assert bad.returncode == 2 and "--fail-on info" in bad.stderr and "critical" in bad.stderr


def test_bare_runbook_prints_usage_on_stderr_and_exits_2(tmp_path):
    proc = runbook(cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("usage: runbook")


# -- listings ----------------------------------------------------------------------------------------


def test_json_listings():
    listed = json.loads(runbook("list", "--json").stdout)
    assert {"host-sanity", "power-starvation"} <= {r["name"] for r in listed}
    assert all(set(r) == {"name", "title", "path"} for r in listed)
    scenarios = json.loads(runbook("scenarios", "--json").stdout)
    assert "seed-rtx-pro-6000-tp8" in {s["name"] for s in scenarios}
    probes = json.loads(runbook("probes", "--json").stdout)
    sample = next(p for p in probes if p["name"] == "gpu.sample")
    assert "duration_s" in {p["name"] for p in sample["params"]} and sample["units"]["power_draw_w"] == "W"
    shown = json.loads(runbook("show", "host-sanity", "--json").stdout)
    assert shown["name"] == "host-sanity" and shown["params"]["min_cpus"]["default"] == 8
    assert {h["id"]: h["probes"]["host"]["probe"] for h in shown["hypotheses"]}["few-cpus"] == "host.info"


def test_probes_name_prints_params_values_and_units():
    proc = runbook("probes", "sglang.metrics")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("sglang.metrics: SGLang /metrics over a window")
    assert "params (`with:`):" in out and "  duration_s: float, default 10.0" in out
    assert "values (MetricsValues; " in out
    assert re.search(r"^  generation_tokens_per_s +number or null, tokens/s: ", out, re.M), out
    assert re.search(r"^  itl_s +Quantiles, s: ", out, re.M)  # a nested model by name, then its fields
    assert re.search(r"^  Quantiles:\n    p50 ", out, re.M)
    as_json = json.loads(runbook("probes", "sglang.metrics", "--json").stdout)
    rows = {r["name"]: r for r in as_json["values"]}
    assert rows["window_s"]["unit"] == "s" and rows["window_s"]["always"] is True
    assert "Quantiles" in as_json["value_types"]
    plugin = runbook("probes", "test.value", "--probes-dir", str(PROBE_FILES))
    assert "  values: dict[str, Any], default {}" in plugin.stdout and "  delay_s: float, default 0.0" in plugin.stdout
    assert "values: not declared (the probe has no Values model) and not documented" in plugin.stdout
    declared = runbook("probes", "test.declared", "--probes-dir", str(PROBE_FILES)).stdout  # a plugin's own model
    assert re.search(r"^  power +PowerStats, W, may be null: board power over the window$", declared, re.M), declared
    assert re.search(r"^  gpus +list of GpuRow$", declared, re.M)


def test_probes_unknown_name_exits_2_with_did_you_mean():
    proc = runbook("probes", "gpu.sampel")
    assert proc.returncode == 2
    assert "no probe named 'gpu.sampel' (did you mean 'gpu.sample'" in proc.stderr  # (or AMD's amd.sample)


# -- completion ----------------------------------------------------------------------------------------

SUBCOMMANDS = set(next(a for a in _parser()._actions if a.dest == "command").choices)  # noqa: SLF001


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_script_names_every_subcommand(shell):
    proc = runbook("completion", shell)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    options = {"-l fail-on", "-l simulate"} if shell == "fish" else {"--fail-on", "--simulate"}
    for name in SUBCOMMANDS | options | {"confirmed warning critical"}:
        assert name in proc.stdout, (shell, name)
    if shutil.which(shell):
        syntax = subprocess.run([shell, "-n"], input=proc.stdout, capture_output=True, text=True)
        assert syntax.returncode == 0, syntax.stderr


def test_bash_completion_completes_subcommands_options_and_runbook_names(tmp_path):
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    script = tmp_path / "runbook.bash"
    script.write_text(runbook("completion", "bash").stdout)
    shim = tmp_path / "bin" / "runbook"  # the scripts ask `runbook list --json` for names
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m gpu_runbook.cli \"$@\"\n")
    shim.chmod(0o755)

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        cmd = f'source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _runbook; printf "%s\\n" "${{COMPREPLY[@]}}"'
        env = {**ENV, "PATH": f"{shim.parent}:{ENV.get('PATH', '')}"}
        proc = subprocess.run([bash, "-c", cmd], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [w for w in proc.stdout.splitlines() if w]

    assert complete("runbook", "sce") == ["scenarios"]
    assert complete("runbook", "run", "--fail") == ["--fail-on"]
    assert complete("runbook", "run", "--fail-on", "") == ["confirmed", "warning", "critical"]
    assert complete("runbook", "run", "host-s") == ["host-sanity"]
    assert complete("runbook", "run", "--simulate", "seed-") == ["seed-rtx-pro-6000-tp8", "seed-rtx-pro-6000-tp8-vllm", "seed-rtx-pro-6000-tp8-vm"]
    assert complete("runbook", "completion", "") == ["bash", "zsh", "fish"]


# -- colour, quiet ---------------------------------------------------------------------------------------


def _run_on_a_tty(cwd: Path, env: dict[str, str]) -> str:
    """The run's output as a terminal shows it: stdout is a pseudo-terminal (progress lines, not the TUI)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(CLI + ["run", "quick.yaml", "--no-tui", "--probes-dir", str(PROBE_FILES), "--report", "r.md"],
                            cwd=cwd, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    return b"".join(chunks).decode()


def test_verdict_marks_are_coloured_on_a_tty_unless_no_color(quick):
    coloured = _run_on_a_tty(quick, ENV)
    assert "\x1b[31m●\x1b[0m confirmed    warm" in coloured
    plain = _run_on_a_tty(quick, {**ENV, "NO_COLOR": "1"})
    assert "\x1b[" not in plain and "● confirmed    warm" in plain
    empty = _run_on_a_tty(quick, {**ENV, "NO_COLOR": ""})  # no-color.org: an empty NO_COLOR does not count
    assert "\x1b[31m●" in empty
    piped = run_quick(quick, "--report", "r.md")
    assert "\x1b[" not in piped.stdout and "● confirmed    warm" in piped.stdout


def test_quiet_prints_only_the_summary(quick):
    proc = run_quick(quick, "--report", "r.md", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "probe test.value" not in proc.stdout and "confirmed    warm" not in proc.stdout
    assert "Root causes (2), most severe first" in proc.stdout and "Verdicts: 2 confirmed" in proc.stdout


# -- did you mean -------------------------------------------------------------------------------------


def test_did_you_mean_on_runbook_scenario_and_param(quick):
    rb = runbook("run", "host-sanit", "--no-tui", cwd=quick)
    assert rb.returncode == 2 and "no runbook named 'host-sanit'" in rb.stderr and "(did you mean 'host-sanity'?)" in rb.stderr
    sc = runbook("run", "host-sanity", "--no-tui", "--simulate", "seed-rtx-pro-6000-tp9", cwd=quick)
    assert sc.returncode == 2 and "(did you mean 'seed-rtx-pro-6000-tp8'" in sc.stderr
    param = run_quick(quick, "--set", "treshold=2")
    assert param.returncode == 2 and "unknown param 'treshold'" in param.stderr and "(did you mean 'threshold'?)" in param.stderr
    far = run_quick(quick, "--set", "zzz=2")
    assert far.returncode == 2 and "did you mean" not in far.stderr


# -- RUNBOOK_DEBUG ------------------------------------------------------------------------------------


def test_runbook_debug_shows_a_failing_probes_traceback(tmp_path):
    (tmp_path / "blind.yaml").write_text(UNMEASURED)
    args = ("run", "blind.yaml", "--no-tui", "--probes-dir", str(PROBE_FILES), "--report", "r.md")
    plain = runbook(*args, cwd=tmp_path)
    assert "Traceback" not in plain.stdout + plain.stderr and "RuntimeError: kaboom" in plain.stdout
    debug = runbook(*args, cwd=tmp_path, env={**ENV, "RUNBOOK_DEBUG": "1"})
    assert debug.returncode == 3
    out = debug.stdout
    assert "probe test.fail raised:\nTraceback (most recent call last):" in out
    assert 'test_probes.py", line' in out and "raise RuntimeError(params.message)" in out
    assert "! error        gpus: " in out  # the branch is still marked error and the run went on
