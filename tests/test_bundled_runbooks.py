"""The project's own runbooks, tested the way runbook authors test theirs: `runbook test` against the
simulated scenarios, every hypothesis with an expected verdict in every scenario."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_runbook.loader import available, load
from gpu_runbook.registry import Registry
from gpu_runbook.runbook_test import run_tests

REPO = Path(__file__).parent.parent
BUNDLED = ["power-starvation", "throughput-plateau"]
JOBS = 3


@pytest.mark.parametrize("name", BUNDLED)
def test_every_hypothesis_has_an_expectation_in_every_scenario(name):
    loaded = load(REPO / "runbooks" / f"{name}.yaml", Registry.discover())
    ids = {h.id for h, _ in loaded.runbook.walk()}
    assert len(loaded.runbook.tests) >= 3
    for test in loaded.runbook.tests:
        assert set(test.expect) == ids, test.scenario


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_runbook_matches_its_expected_verdicts(name, capsys):
    loaded = load(REPO / "runbooks" / f"{name}.yaml", Registry.discover())
    # three scenarios at once, each in its own process: a simulated host mostly waits on its modelled time
    # (power-starvation: ~4.5 min one at a time, ~2 min so); a mismatch is re-run alone below
    ok = run_tests(loaded, Registry.discover(), [], jobs=JOBS)
    out = capsys.readouterr().out
    if not ok:
        # A scenario's verdict can move when a starved 2-core machine cannot keep its closed-loop client up (the
        # GPUs then idle between rounds): the mismatched scenarios run once more, and a second mismatch fails.
        # Known near-threshold scenarios are listed in the note of 2026-12-03; each retry is printed.
        failed = re.search(r"FAILED: .*?: (.*)$", out, flags=re.M)
        names = sorted({item.split(":")[0].strip() for item in failed.group(1).split(";")}) if failed else []
        assert names, out
        print(f"retrying after a mismatch on a busy machine: {', '.join(names)}", file=sys.stderr)
        ok = run_tests(loaded, Registry.discover(), names)
        out = out + "\n--- retry ---\n" + capsys.readouterr().out
    assert ok, out


def test_idle_gpus_without_load_do_not_confirm_underfed():
    """The issue's guard: with idle GPUs and no generated load, `gpus-underfed` must not be confirmed."""
    loaded = load(REPO / "runbooks" / "power-starvation.yaml", Registry.discover())
    idle = next(t for t in loaded.runbook.tests if t.scenario == "idle-gpus")
    assert idle.set.get("generate_load") is False
    assert idle.expect["gpus-underfed"].value != "confirmed"


def test_every_bundled_runbook_validates_from_another_directory(tmp_path):
    names = sorted(available())
    assert {"power-starvation", "throughput-plateau", "host-sanity"} <= set(names)
    proc = subprocess.run([sys.executable, "-m", "gpu_runbook.cli", "validate", *names], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ok: ") == len(names)


def test_validate_checks_a_tests_sidecar_with_its_runbook(tmp_path, capsys):
    """`runbook validate runbooks/*.yaml` also meets `<runbook>.tests.yaml`: it is checked as its runbook's tests
    (ids, params, scenarios), not refused for lacking a runbook's fields."""
    from gpu_runbook.cli import main

    assert main(["validate", str(REPO / "runbooks" / "power-starvation.tests.yaml")]) == 0
    assert "scenario tests of power-starvation.yaml" in capsys.readouterr().out
    (tmp_path / "power-starvation.yaml").write_text((REPO / "runbooks" / "power-starvation.yaml").read_text())
    (tmp_path / "power-starvation.tests.yaml").write_text(
        "tests:\n  - scenario: healthy-h200-nvlink\n    expect: { no-such-hypothesis: confirmed }\n")
    assert main(["validate", str(tmp_path / "power-starvation.tests.yaml")]) != 0
    err = capsys.readouterr().err
    assert "power-starvation.tests.yaml:" in err and "no-such-hypothesis" in err
