"""Re-judging a recorded run: the same runbook gives the same verdicts, an edited one judges the same host.

The exactness test runs power-starvation's bundled scenarios on the simulated host (short windows,
as the runbook's own tests do) and re-judges each result. Two scenarios run in the normal suite;
RUNBOOK_TEST_ALL_SCENARIOS=1 runs every one (the env var is read before conftest clears RUNBOOK_*).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu_runbook.loader import load, load_path_or_name
from gpu_runbook.model import Verdict
from gpu_runbook.probe import Target
from gpu_runbook.registry import Registry
from gpu_runbook.rejudge import recorded_evidence, rejudge, runbook_of
from gpu_runbook.results import SCHEMA_VERSION, Results, read_results
from gpu_runbook.runbook_test import collect_cases
from gpu_runbook.runner import Runner

TESTS = Path(__file__).parent
DATA = TESTS / "data"
REPO = TESTS.parent
CLI = [sys.executable, "-m", "gpu_runbook.cli"]
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}, "PYTHONPATH": str(REPO)}
ALL_SCENARIOS = os.environ.get("RUNBOOK_TEST_ALL_SCENARIOS") == "1"
CHEAP = ["healthy-h200-nvlink", "admin-power-cap"]


def _cases():
    loaded = load_path_or_name("power-starvation", Registry.discover([]))
    cases = collect_cases(loaded)
    return [c for c in cases if ALL_SCENARIOS or Path(c.test.scenario).stem in CHEAP]


def _simulated_run(scenario: str, sets: dict, record_all: bool = False) -> Results:
    """One run of power-starvation on the simulated host, as `runbook test` runs it."""
    from gpu_runbook.runner import resolve_params
    from gpu_runbook.sim.host import SimulatedHost

    registry = Registry.discover([])
    loaded = load_path_or_name("power-starvation", registry)
    with SimulatedHost.start(scenario) as host:
        target = Target(sglang_url=host.url, api_key=host.api_key, label=f"simulated: {host.name}", simulated=True)
        return asyncio.run(Runner(loaded, registry, target, resolve_params(loaded, sets), nvml=host.nvml, record_all=record_all).run())


def _decisions(results: Results) -> list[tuple]:
    return [(h.id, h.verdict, h.reason, h.rule, h.rule_values) for h in results.hypotheses]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: Path(c.test.scenario).stem)
def test_rejudge_with_the_same_runbook_reproduces_every_verdict(case, tmp_path):
    results = _simulated_run(case.test.scenario, case.test.set)
    path = results.write_json(tmp_path / "r.json")
    recorded = read_results(path)  # through the file, as `runbook rejudge` reads it
    registry = Registry.discover([])
    judged = rejudge(recorded, runbook_of(recorded, registry), registry)
    assert _decisions(judged) == _decisions(results)
    assert judged.rejudged_from["runbook_sha256"] == results.runbook_sha256 == judged.runbook_sha256
    assert judged.load == results.load and judged.target == results.target
    assert [len(h.evidence) for h in judged.hypotheses] == [len(h.evidence) for h in results.hypotheses]
    expected = {hid: v for hid, v in case.test.expect.items()}
    assert {h.id: h.verdict for h in judged.hypotheses if h.id in expected} == expected


@pytest.fixture(scope="module")
def healthy_all() -> Results:
    """The healthy box with --record-all: on NVLink, custom-allreduce-off is skipped by its precondition."""
    return _simulated_run("healthy-h200-nvlink", {"sample_seconds": 3, "warmup_seconds": 2}, record_all=True)


def test_record_all_keeps_skipped_branches_evidence_and_their_verdicts_stay_skipped(healthy_all, tmp_path):
    root = healthy_all.hypotheses[0]
    assert root.verdict is Verdict.refuted
    skipped = healthy_all.by_id("custom-allreduce-off")
    assert skipped.verdict is Verdict.skipped
    assert healthy_all.record_all is True
    assert [ev.probe for ev in skipped.evidence] == ["gpu.topology"] and skipped.evidence[0].values
    size = len(healthy_all.write_json(tmp_path / "r.json").read_bytes())
    assert size < 3_000_000, size  # compact: a few MB at most


def test_a_runbook_that_explores_further_is_judged_on_recorded_evidence(healthy_all, tmp_path):
    """--record-all is what makes this possible: the edited runbook judges a branch the live walk skipped."""
    registry = Registry.discover([])
    original = runbook_of(healthy_all, registry)
    data = yaml.safe_load(original.document.text)
    node = next(h for h in data["hypotheses"][0]["children"] if h["id"] == "custom-allreduce-off")
    del node["when"]  # judge it on NVLink too
    edited = tmp_path / "power-starvation.yaml"
    edited.write_text(yaml.safe_dump(data, sort_keys=False))
    judged = rejudge(healthy_all, load(edited, registry), registry)
    decided = judged.by_id("custom-allreduce-off")
    assert decided.verdict in (Verdict.confirmed, Verdict.refuted), decided.reason  # on evidence the live walk never used
    assert not any(h.reason.startswith("not recorded") for h in judged.hypotheses)
    assert judged.runbook_sha256 != healthy_all.runbook_sha256
    # re-judged by its own runbook, a --record-all run keeps the skipped branches' evidence for the next rejudge
    again = rejudge(healthy_all, original, registry)
    assert again.record_all and [[ev.model_dump() for ev in h.evidence] for h in again.hypotheses] == [[ev.model_dump() for ev in h.evidence] for h in healthy_all.hypotheses]


def test_evidence_the_run_did_not_read_makes_the_verdict_not_recorded(tmp_path, registry):
    """A probe called with other parameters than the run used has no recorded answer: inconclusive, not a guess."""
    fixed = read_results(DATA / "results-fixed.json")
    text = (DATA / "fixed-example.yaml").read_text()
    text = text.replace("draw_w_mean: 235.0, max_w: 600.0, util_pct: 100.0", "draw_w_mean: 235.0, max_w: 600.0, util_pct: 99.0")
    edited = tmp_path / "fixed-example.yaml"
    edited.write_text(text)
    judged = rejudge(fixed, load(edited, registry), registry)
    root = judged.by_id("gpus-underfed")
    assert root.verdict is Verdict.inconclusive
    assert root.reason == "not recorded: test.value (power)"
    assert all(h.verdict is Verdict.skipped for h in judged.hypotheses if h.parent == "gpus-underfed")


def test_results_of_schema_1_load_and_rejudge_with_their_runbook(registry):
    fixed = read_results(DATA / "results-fixed.json")
    assert fixed.schema_version == "1" and fixed.runbook_source == ""
    judged = rejudge(fixed, load(DATA / "fixed-example.yaml", registry), registry)
    assert [(h.id, h.verdict, h.reason) for h in judged.hypotheses] == [(h.id, h.verdict, h.reason) for h in fixed.hypotheses]
    assert judged.schema_version == SCHEMA_VERSION and judged.runbook_source  # what it writes is the new version


def test_a_param_set_on_rejudge_changes_the_verdict_it_names(registry):
    fixed = read_results(DATA / "results-fixed.json")
    judged = rejudge(fixed, load(DATA / "fixed-example.yaml", registry), registry, {"underfed_ratio": "0.3"})
    assert judged.by_id("gpus-underfed").verdict is Verdict.inconclusive  # 235 W is not below 0.3 x 600 W, not above 0.9 x
    assert judged.params["underfed_ratio"] == 0.3


def test_recorded_evidence_is_keyed_by_call(registry):
    fixed = read_results(DATA / "results-fixed.json")
    recorded = recorded_evidence(fixed)
    fails = [key for key, (ev, _) in recorded.evidence.items() if ev.probe == "test.fail"]
    assert len(recorded.evidence) == 4 and len(fails) == 1  # power, lim, m, and the failed call: a failure is evidence too
    assert recorded.load == fixed.load


def test_cli_rejudge_writes_results_and_report_and_rejects_bad_input(tmp_path):
    args = CLI + ["rejudge", str(DATA / "results-fixed.json"), "--runbook", str(DATA / "fixed-example.yaml"), "--probes-dir", str(TESTS / "probe_files")]
    done = subprocess.run(args + ["--json", str(tmp_path / "n.json"), "--report", str(tmp_path / "n.md")], capture_output=True, text=True, env=ENV, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    new = json.loads((tmp_path / "n.json").read_text())
    assert new["schema_version"] == SCHEMA_VERSION and new["rejudged_from"]["schema_version"] == "1"
    assert "gpus-underfed" in (tmp_path / "n.md").read_text()
    (tmp_path / "bad.json").write_text("{}")
    bad = subprocess.run(CLI + ["rejudge", str(tmp_path / "bad.json")], capture_output=True, text=True, env=ENV, cwd=tmp_path)
    assert bad.returncode == 2 and "bad.json: not a runbook results file" in bad.stderr and "Traceback" not in bad.stderr
    unknown = subprocess.run(args + ["--set", "nope=1"], capture_output=True, text=True, env=ENV, cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown param 'nope'" in unknown.stderr


REFUTED_ROOT = """
name: refuted-root
title: A root that is refuted, a child it skips
hypotheses:
  - id: root
    title: Root
    probes: { a: { probe: test.value, with: { values: { v: 1 } } } }
    confirm: a.v > 5.0
    refute: a.v <= 5.0
    children:
      - id: child
        title: Child
        probes: { b: { probe: test.value, with: { values: { w: 7 } } } }
        confirm: b.w > 5.0
"""


def test_cli_record_all_runs_skipped_probes_and_rejudge_can_then_explore(tmp_path):
    (tmp_path / "rb.yaml").write_text(REFUTED_ROOT)
    common = ["--no-tui", "--probes-dir", str(TESTS / "probe_files")]
    for flag, name in (([], "plain.json"), (["--record-all"], "all.json")):
        done = subprocess.run(CLI + ["run", "rb.yaml", *common, *flag, "--json", name, "--report", "r.md"], capture_output=True, text=True, env=ENV, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    plain, full = read_results(tmp_path / "plain.json"), read_results(tmp_path / "all.json")
    assert plain.by_id("child").verdict is full.by_id("child").verdict is Verdict.skipped
    assert plain.by_id("child").evidence == [] and [ev.values for ev in full.by_id("child").evidence] == [{"w": 7}]
    assert (plain.record_all, full.record_all) == (False, True)
    (tmp_path / "always.yaml").write_text(REFUTED_ROOT.replace("    refute: a.v <= 5.0\n", "    refute: a.v <= 5.0\n    explore: always\n"))
    args = ["--runbook", "always.yaml", "--probes-dir", str(TESTS / "probe_files"), "--report", "j.md"]
    for name, verdict, reason in (("plain.json", "inconclusive", "not recorded: test.value (b)"), ("all.json", "confirmed", "confirm: b.w > 5.0 [b.w=7]")):
        done = subprocess.run(CLI + ["rejudge", name, *args, "--json", f"j-{name}"], capture_output=True, text=True, env=ENV, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        child = read_results(tmp_path / f"j-{name}").by_id("child")
        assert (child.verdict.value, child.reason) == (verdict, reason)
