"""Where runbooks are found: ./runbooks, RUNBOOK_PATH, the bundled ones, and file paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MINIMAL = "name: {name}\ntitle: {title}\nhypotheses:\n  - id: a\n    title: A\n    confirm: 'true'\n"


def test_cwd_runbooks_shadow_bundled_and_runbook_path_adds(tmp_path, monkeypatch):
    local = tmp_path / "runbooks"
    local.mkdir()
    (local / "host-sanity.yaml").write_text(MINIMAL.format(name="host-sanity", title="my own host-sanity"))
    (local / "host-sanity.tests.yaml").write_text("tests: []\n")
    extra = tmp_path / "team"
    extra.mkdir()
    (extra / "team-check.yaml").write_text(MINIMAL.format(name="team-check", title="the team's check"))
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_runbook.cli", "list"], capture_output=True, text=True, cwd=tmp_path,
        env={"RUNBOOK_PATH": str(extra), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert "my own host-sanity" in lines["host-sanity"]
    assert "the team's check" in lines["team-check"]
    assert "power-starvation" in lines  # bundled ones still there
    assert "host-sanity.tests" not in lines
