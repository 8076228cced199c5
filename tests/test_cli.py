"""The command line as a user meets it: exit codes, Ctrl-C, --fail-on, the API key kept out of files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).parent
PROBE_FILES = TESTS / "probe_files"
CLI = [sys.executable, "-m", "gpu_runbook.cli"]
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}, "PYTHONPATH": str(TESTS.parent)}

SLOW = """
name: slow
title: A run to interrupt
hypotheses:
  - id: quick
    title: Quick
    probes: { x: { probe: test.value, with: { values: { v: 1 } } } }
    confirm: x.v == 1.0
    severity: critical
  - id: slow
    title: Slow
    probes: { s: { probe: test.sleep, with: { seconds: 60 } } }
    confirm: s.slept_s > 0.0
"""


def test_ctrl_c_writes_what_was_found_and_exits_130(tmp_path):
    (tmp_path / "slow.yaml").write_text(SLOW)
    proc = subprocess.Popen(
        CLI + ["run", "slow.yaml", "--no-tui", "--probes-dir", str(PROBE_FILES), "--json", "r.json", "--report", "r.md"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # wait until the quick verdict is printed
        line = proc.stdout.readline()
        if "confirmed    quick" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["interrupted"] is True
    verdicts = {h["id"]: (h["verdict"], h["reason"]) for h in results["hypotheses"]}
    assert verdicts == {"quick": ("confirmed", "confirm: x.v == 1.0 [x.v=1]"), "slow": ("inconclusive", "interrupted")}
    assert "Interrupted" in (tmp_path / "r.md").read_text()


def test_fail_on_confirmed_and_api_key_never_written(tmp_path):
    (tmp_path / "quick.yaml").write_text(SLOW.replace("seconds: 60", "seconds: 0.1"))
    args = CLI + ["run", "quick.yaml", "--no-tui", "--probes-dir", str(PROBE_FILES), "--json", "r.json", "--report", "r.md"]
    plain = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env={**ENV, "RUNBOOK_API_KEY": "sk-very-secret"})
    assert plain.returncode == 0, plain.stderr
    failing = subprocess.run(args + ["--fail-on", "confirmed", "--api-key", "sk-other-secret"], cwd=tmp_path, capture_output=True, text=True, env=ENV)
    assert failing.returncode == 1
    for name in ("r.json", "r.md"):
        text = (tmp_path / name).read_text()
        assert "sk-very-secret" not in text and "sk-other-secret" not in text


def test_usage_errors_exit_2(tmp_path):
    (tmp_path / "quick.yaml").write_text(SLOW)
    bad_set = subprocess.run(CLI + ["run", "quick.yaml", "--no-tui", "--set", "nope=1", "--probes-dir", str(PROBE_FILES)], cwd=tmp_path, capture_output=True, text=True, env=ENV)
    assert bad_set.returncode == 2 and "unknown param 'nope' for runbook slow" in bad_set.stderr
    missing = subprocess.run(CLI + ["run", "no-such-runbook", "--no-tui"], cwd=tmp_path, capture_output=True, text=True, env=ENV)
    assert missing.returncode == 2 and "no runbook named 'no-such-runbook'" in missing.stderr
    bare = subprocess.run(CLI, cwd=tmp_path, capture_output=True, text=True, env=ENV)
    assert bare.returncode == 2 and "usage: runbook" in bare.stderr and bare.stdout == ""  # issue 14: usage on stderr


def test_schema_is_json_schema_of_the_runbook_format():
    proc = subprocess.run(CLI + ["schema"], capture_output=True, text=True, env=ENV)
    schema = json.loads(proc.stdout)
    assert schema["title"] == "Runbook"
    assert {"name", "title", "hypotheses"} <= set(schema["required"])
    assert "with" in schema["$defs"]["ProbeCall"]["properties"]


def test_sglang_url_with_credentials_or_without_scheme_is_a_usage_error(tmp_path):
    for url, said in [
        ("http://user:hunter2@127.0.0.1:30000", "credentials in the URL"),
        ("127.0.0.1:30000", "expected http://HOST:PORT"),
        ("http://127.0.0.1:port", "--sglang-url http://127.0.0.1:port"),
    ]:
        proc = subprocess.run(
            [sys.executable, "-m", "gpu_runbook.cli", "run", "host-sanity", "--no-tui", "--sglang-url", url, "--json", str(tmp_path / "r.json")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
        assert "hunter2" not in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / "r.json").exists()


def test_runbook_test_with_an_unknown_scenario_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "gpu_runbook.cli", "test", "power-starvation", "--scenario", "no-such-box"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("no-such-box: no scenario named 'no-such-box' (available: ")
