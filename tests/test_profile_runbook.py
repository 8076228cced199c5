"""The verdicts proposed for power-starvation, in a scratch runbook, against the simulated hosts."""

from __future__ import annotations

from pathlib import Path

from engine.loader import load
from engine.registry import Registry
from engine.runbook_test import run_tests

RUNBOOK = Path(__file__).parent / "data" / "profile-runbook.yaml"


def test_profile_verdicts_match_their_expectations_on_the_seed_box_and_the_h200(capsys):
    registry = Registry.discover()
    loaded = load(RUNBOOK, registry)
    ok = run_tests(loaded, registry, [])
    out = capsys.readouterr().out
    assert ok, out
