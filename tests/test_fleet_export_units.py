"""`runbook fleet --export-rules` without a metrics store: what the file says, and that runbook text stays text.

The alerts' agreement with `runbook fleet` is tests/test_fleet_export_rules.py's (a real Prometheus and vmalert);
here the file itself: every hypothesis is an alert or a comment with its reason, a title written as template code is
printed as written, and `promtool check rules` accepts it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpu_runbook.cli import main
from gpu_runbook.fleet.export import alert_name

PROMTOOL = shutil.which("promtool")
# titles that are Go template code, a rule the export compiles, two it cannot, and one the fleet never confirms
RUNBOOK = """\
name: odd-titles
title: "Fleet {{ $labels.host }}
  check"
description: A runbook for the export's tests.
params:
  busy:
    type: float
    default: 50
    description: busy line
hypotheses:
  - id: busy-gpus
    title: "GPUs busy {{ $labels.host }} {{ .Value }} }}"
    why: test
    severity: warning
    probes:
      power: { probe: gpu.sample, with: { duration_s: 5 } }
      inv: { probe: gpu.inventory }
      server: { probe: server.config }
    confirm: "!(power.gpu_util_pct.mean < params.busy) && power.gpus.exists(g, g.power_draw_w.p95 > 10.0)"
    children:
      - id: named-gpu
        title: A GPU by its name
        why: test
        severity: info
        confirm: inv.gpu_name == "NVIDIA H100"
      - id: mapped
        title: A list built per host
        why: test
        severity: info
        confirm: power.gpus.map(g, g.gpu_util_pct.mean).size() > 1
      - id: config-only
        title: Only the server's configuration says
        why: test
        severity: critical
        confirm: server.tp_size > 1.0
"""


@pytest.fixture
def exported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str, dict]:
    runbook = tmp_path / "odd.yaml"
    runbook.write_text(RUNBOOK)
    out = tmp_path / "rules.yml"
    assert main(["fleet", str(runbook), "--export-rules", str(out), "--for", "2m", "--set", "busy=60"]) == 0
    assert f"wrote 1 alerting rules of 4 hypotheses to {out}" in capsys.readouterr().err
    return out, out.read_text(), yaml.safe_load(out.read_text())


def test_every_hypothesis_is_an_alert_or_says_why_not(exported: tuple[Path, str, dict]) -> None:
    _, text, doc = exported
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert [a["alert"] for a in alerts] == [alert_name("odd-titles", "busy-gpus")] == ["RunbookOddTitlesBusyGpus"]
    alert = alerts[0]
    assert alert["for"] == "2m" and alert["labels"] == {"severity": "warning", "runbook": "odd-titles", "hypothesis": "busy-gpus"}
    # the param as set, the negation as its comparison, the GPUs' exists as a count per host
    assert ">= 60.0" in alert["expr"] and "group by (host)" in alert["expr"]
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert any(c.startswith("#   named-gpu: ") and "gpu_name is a string per host" in c for c in comments), comments
    assert any(c.startswith("#   mapped: ") and "size()" in c for c in comments), comments
    assert any(c.startswith("#   config-only: never confirmed by the fleet") for c in comments), comments
    assert "Fleet {{ $labels.host }} check" in comments[0]  # a two-line title is one comment line


def test_runbook_text_is_printed_not_run(exported: tuple[Path, str, dict]) -> None:
    _, _, doc = exported
    summary = next(r for g in doc["groups"] for r in g["rules"] if "alert" in r)["annotations"]["summary"]
    assert summary.startswith('{{ $labels.host }}: GPUs busy {{ "{{" }} $labels.host }} {{ "{{" }} .Value }} }}')


def test_a_quantity_that_is_not_a_duration_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "power-starvation", "--export-rules", str(tmp_path / "r.yml"), "--for", "soon"]) == 2
    assert "--for 'soon' is not a duration" in capsys.readouterr().err
    assert not (tmp_path / "r.yml").exists()


@pytest.mark.skipif(not PROMTOOL, reason="promtool is not installed (Debian's prometheus package has it)")
def test_promtool_accepts_it(exported: tuple[Path, str, dict]) -> None:
    out = subprocess.run([PROMTOOL, "check", "rules", str(exported[0])], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
