"""`runbook test`: expected verdicts per scenario, from the runbook's tests: section or a sidecar file."""

from __future__ import annotations

from gpu_runbook.cli import main

RUNBOOK = """
name: small
title: A small runbook with tests
params:
  kv_limit: { type: int, default: 1000000 }
hypotheses:
  - id: no-p2p
    title: GPU pairs without peer-to-peer
    probes:
      topo: { probe: gpu.topology }
    confirm: topo.any_pair_without_p2p
    refute: "!topo.any_pair_without_p2p"
    children:
      - id: passthrough
        title: GPUs passed through to a VM
        probes:
          inv: { probe: gpu.inventory }
        confirm: inv.virtualization_mode == "passthrough"
        refute: inv.virtualization_mode != "passthrough"
  - id: small-kv
    title: KV cache below the limit
    probes:
      srv: { probe: sglang.server }
    confirm: srv.max_total_num_tokens < params.kv_limit
    refute: srv.max_total_num_tokens >= params.kv_limit
  - id: shown-only
    title: Shown, not compared
    probes:
      srv: { probe: sglang.server }
    confirm: srv.tp_size == 8
tests:
  - scenario: seed-rtx-pro-6000-tp8-vm
    expect: { no-p2p: confirmed, passthrough: confirmed, small-kv: confirmed }
  - scenario: healthy-h200-nvlink
    expect: { no-p2p: refuted, passthrough: skipped, small-kv: refuted }
  - scenario: healthy-h200-nvlink
    set: { kv_limit: 5000000 }
    expect: { small-kv: confirmed }
"""


def test_passes_when_every_verdict_matches(write_runbook, capsys):
    rb = write_runbook(RUNBOOK)
    assert main(["test", str(rb)]) == 0
    out = capsys.readouterr().out
    assert "OK: 3 test(s)" in out
    assert "shown-only" in out and "XX" not in out


def test_fails_naming_the_hypothesis_when_an_expectation_changes(write_runbook, capsys):
    rb = write_runbook(RUNBOOK.replace("{ no-p2p: refuted, passthrough: skipped, small-kv: refuted }", "{ no-p2p: refuted, passthrough: skipped, small-kv: confirmed }"))
    assert main(["test", str(rb)]) == 1
    out = capsys.readouterr().out
    assert "FAILED: 1 mismatch(es)" in out and "healthy-h200-nvlink: small-kv" in out
    line = next(l for l in out.splitlines() if l.strip().startswith("XX"))
    assert "small-kv" in line and "confirmed" in line and "refuted" in line


def test_scenario_filter(write_runbook, capsys):
    rb = write_runbook(RUNBOOK)
    assert main(["test", str(rb), "--scenario", "seed-rtx-pro-6000-tp8-vm"]) == 0
    assert "OK: 1 test(s)" in capsys.readouterr().out
    assert main(["test", str(rb), "--scenario", "thermal-slowdown"]) == 1
    assert "no tests for scenario(s) thermal-slowdown" in capsys.readouterr().err


def test_sidecar_tests_file(write_runbook, tmp_path, capsys):
    rb = write_runbook(RUNBOOK.split("tests:")[0], name="side.yaml")
    (tmp_path / "side.tests.yaml").write_text(
        "tests:\n  - scenario: admin-power-cap\n    expect: { no-p2p: refuted, small-kv: refuted }\n"
    )
    assert main(["test", str(rb)]) == 0
    assert "admin-power-cap" in capsys.readouterr().out
    (tmp_path / "side.tests.yaml").write_text(
        "tests:\n  - scenario: admin-power-cap\n    expect: { no-p2p: refuted, nope: refuted }\n  - scenario: no-such-box\n    expect: {}\n"
    )
    assert main(["test", str(rb)]) == 1
    err = capsys.readouterr().err
    assert "side.tests.yaml:3:32: expected verdict for unknown hypothesis 'nope'" in err
    assert "side.tests.yaml:4:15: no scenario named 'no-such-box'" in err


def test_also_accepts_a_second_verdict_and_nothing_else(write_runbook, capsys):
    """`also` names the one other verdict a rule at its threshold may give; a third still fails."""
    wrong = RUNBOOK.replace("{ no-p2p: refuted, passthrough: skipped, small-kv: refuted }", "{ no-p2p: refuted, passthrough: skipped, small-kv: confirmed }")
    accepted = write_runbook(wrong.replace("    expect: { no-p2p: refuted, passthrough: skipped, small-kv: confirmed }",
                                           "    expect: { no-p2p: refuted, passthrough: skipped, small-kv: confirmed }\n    also: { small-kv: refuted }"),
                             name="accepted.yaml")  # fmt: skip
    assert main(["test", str(accepted)]) == 0
    assert "small-kv" in (out := capsys.readouterr().out) and "confirmed|refuted" in out
    third = write_runbook(wrong.replace("    expect: { no-p2p: refuted, passthrough: skipped, small-kv: confirmed }",
                                        "    expect: { no-p2p: refuted, passthrough: skipped, small-kv: confirmed }\n    also: { small-kv: inconclusive }"),
                          name="third.yaml")  # fmt: skip
    assert main(["test", str(third)]) == 1
    assert "healthy-h200-nvlink: small-kv" in capsys.readouterr().out
    stray = write_runbook(RUNBOOK.replace("    expect: { small-kv: confirmed }", "    expect: { small-kv: confirmed }\n    also: { no-p2p: refuted }"),
                          name="stray.yaml")  # fmt: skip
    assert main(["validate", str(stray)]) == 2
    assert "also: 'no-p2p' has no verdict under expect" in capsys.readouterr().err


def test_a_deciding_value_within_20_percent_of_its_threshold_is_named():
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from gpu_runbook.model import Severity, Verdict
    from gpu_runbook.results import HypothesisResult, Results
    from gpu_runbook.runbook_test import near_thresholds

    def hyp(hid: str, rule: str, values: dict) -> HypothesisResult:
        return HypothesisResult(id=hid, parent=None, title=hid, verdict=Verdict.confirmed, reason="", severity=Severity.warning,
                                rule=rule, rule_values=values)  # fmt: skip

    results = Results(runbook="r", started_at=datetime.now(timezone.utc), params={"low": 0.1}, hypotheses=[
        hyp("launch-bound", "p.idle_share >= params.low && p.kernels > 100", {"p.idle_share": 0.105, "p.kernels": 900, "params.low": 0.1}),
        hyp("far", "m.queued.p50 >= 1.0", {"m.queued.p50": 616.0}),
        hyp("not-expected", "x.y < 0.5", {"x.y": 0.49}),
    ])  # fmt: skip
    case = SimpleNamespace(test=SimpleNamespace(expect={"launch-bound": Verdict.confirmed, "far": Verdict.confirmed}))
    warnings = near_thresholds(results, case)  # type: ignore[arg-type]
    assert warnings == ["launch-bound: p.idle_share = 0.105 against 0.1 (>=), within 20% of the threshold"]


def test_a_bounded_value_is_near_its_threshold_by_the_room_left_to_its_bound():
    """A clock ratio cannot pass 1.0: 0.99 against 0.9 uses 90 % of the room above the threshold (far), 0.91
    uses 10 % (near); a utilization of 95 % against 80 % is far, 83 % is near; an unbounded figure stays relative."""
    from gpu_runbook.runbook_test import NEAR_SHARE, _room

    def near(name: str, v: float, t: float) -> bool:
        return abs(v - t) <= NEAR_SHARE * _room(name, v, t)

    assert not near("power.sm_clock_ratio.mean", 0.99, 0.9) and near("power.sm_clock_ratio.mean", 0.91, 0.9)
    assert not near("power.gpu_util_pct.mean", 95, 80) and near("power.gpu_util_pct.mean", 83, 80)
    assert not near("metrics.running_to_cap_p50", 1.0, 0.95)  # a batch at its cap: the whole room to 1.0
    assert not near("act.tensor_util_pct.mean", 33, 20)  # far below its bound: relative (13 against 20)
    assert near("prof.idle_share", 0.0465, 0.05) and not near("prof.communication_share", 0.41, 0.3)  # shares: relative
    assert near("prof.roofline_ratio", 1.1, 1.0) and not near("prof.roofline_ratio", 9.5, 1.0)


def test_a_comparison_the_rule_did_not_take_is_not_near_its_threshold():
    """`graphs ? batch <= max_bs : true`: with graphs off, a batch of 245 against a max_bs of 256 decides nothing
    (the rule is true whatever the batch), so it is not named; with graphs on it decides, and it is."""
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from gpu_runbook.evidence import ProbeStatus
    from gpu_runbook.model import Severity, Verdict
    from gpu_runbook.results import EvidenceRecord, HypothesisResult, Results
    from gpu_runbook.runbook_test import near_thresholds

    rule = "s.graphs ? m.batch <= s.max_bs : true"

    def results(graphs: bool) -> Results:
        ev = [EvidenceRecord(alias="s", probe="server", status=ProbeStatus.ok, values={"graphs": graphs, "max_bs": 256}),
              EvidenceRecord(alias="m", probe="metrics", status=ProbeStatus.ok, values={"batch": 245})]  # fmt: skip
        h = HypothesisResult(id="eager", parent=None, title="eager", verdict=Verdict.confirmed, reason="", severity=Severity.warning,
                             rule=rule, rule_values={"s.graphs": graphs, "m.batch": 245, "s.max_bs": 256}, evidence=ev)  # fmt: skip
        return Results(runbook="r", started_at=datetime.now(timezone.utc), hypotheses=[h])

    case = SimpleNamespace(test=SimpleNamespace(expect={"eager": Verdict.confirmed}))
    assert near_thresholds(results(False), case) == []  # type: ignore[arg-type]
    assert near_thresholds(results(True), case) == ["eager: m.batch = 245 against 256 (<=), within 20% of the threshold"]  # type: ignore[arg-type]


def test_an_inconclusive_verdict_between_two_thresholds_is_near_either():
    """Neither rule held: a communication share of 0.26 sits between refute (< 0.1) and confirm (>= 0.3), within 20 %
    of the confirm threshold, so a little noise would confirm it; 0.2 sits well between and is not named."""
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from gpu_runbook.evidence import ProbeStatus
    from gpu_runbook.model import Severity, Verdict
    from gpu_runbook.results import EvidenceRecord, HypothesisResult, Results
    from gpu_runbook.rules import compile_rule
    from gpu_runbook.runbook_test import near_thresholds

    rules = {"confirm": compile_rule("p.comm >= 0.3"), "refute": compile_rule("p.comm < 0.1")}
    loaded = SimpleNamespace(rule=lambda hid, field: rules.get(field))

    def results(share: float) -> Results:
        ev = [EvidenceRecord(alias="p", probe="profile", status=ProbeStatus.ok, values={"comm": share})]
        h = HypothesisResult(id="comm", parent=None, title="comm", verdict=Verdict.inconclusive, severity=Severity.warning,
                             reason="a sizeable share: neither rule held (confirm false: ...)", evidence=ev)  # fmt: skip
        return Results(runbook="r", started_at=datetime.now(timezone.utc), hypotheses=[h])

    case = SimpleNamespace(test=SimpleNamespace(expect={"comm": Verdict.inconclusive}))
    assert near_thresholds(results(0.26), case, loaded) == ["comm: p.comm = 0.26 against 0.3 (>=), within 20% of the threshold"]  # type: ignore[arg-type]
    assert near_thresholds(results(0.2), case, loaded) == []  # type: ignore[arg-type]
    assert near_thresholds(results(0.26), case) == []  # type: ignore[arg-type]  # without the runbook: only deciding rules
    # a mismatch shows what both rules read (an inconclusive verdict has no deciding rule's values)
    import io

    from gpu_runbook.runbook_test import compare

    out = io.StringIO()
    wrong = SimpleNamespace(test=SimpleNamespace(expect={"comm": Verdict.confirmed}, also={}, limiting={}))
    assert compare(wrong, results(0.26), out, loaded) == ["comm"]  # type: ignore[arg-type]
    assert "comm read: p.comm=0.26" in out.getvalue()


def test_jobs_run_the_scenarios_in_processes_and_print_them_in_the_files_order(write_runbook, capsys):
    """-j 3: each scenario in its own process (which loads the runbook again from its path), the tables in the
    file's order, the same verdicts as one at a time; a mismatch is still named."""
    rb = write_runbook(RUNBOOK)
    assert main(["test", str(rb), "-j", "3"]) == 0
    out = capsys.readouterr().out
    assert "OK: 3 test(s)" in out and "XX" not in out
    headers = [line for line in out.splitlines() if line and not line.startswith(" ") and line.endswith("]")]
    assert [h.split(" ")[0] for h in headers] == ["seed-rtx-pro-6000-tp8-vm", "healthy-h200-nvlink", "healthy-h200-nvlink"]
    assert "(set kv_limit=5000000)" in headers[2]
    wrong = write_runbook(RUNBOOK.replace("    set: { kv_limit: 5000000 }\n    expect: { small-kv: confirmed }",
                                          "    set: { kv_limit: 5000000 }\n    expect: { small-kv: refuted }"), name="wrong.yaml")  # fmt: skip
    assert main(["test", str(wrong), "--jobs", "2"]) == 1
    assert "FAILED: 1 mismatch(es) in 3 test(s): healthy-h200-nvlink: small-kv" in capsys.readouterr().out
