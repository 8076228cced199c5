"""A precondition that cannot be told for want of a value does not hold back a refutation that cannot depend on it
(issue 33: `p2p-unavailable` on a vLLM server whose TP is unknown, with P2P between every GPU pair)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.judge import Judge
from gpu_runbook.loader import load
from gpu_runbook.model import Verdict
from gpu_runbook.registry import Registry
from gpu_runbook.results import EvidenceRecord

RUNBOOK = """
name: whatever
title: refutations that hold whatever a missing value is
hypotheses:
  - id: p2p
    title: a GPU pair without P2P
    when: inv.gpu_count > 1.0 && server.tp > 1.0
    probes:
      inv: { probe: gpu.inventory }
      server: { probe: server.config }
      topo: { probe: gpu.topology }
    confirm: topo.any_pair_without_p2p
    refute: "!topo.any_pair_without_p2p"
  - id: reads-the-missing
    title: a refutation that reads the missing value
    when: server.tp > 1.0
    probes:
      server: { probe: server.config }
      topo: { probe: gpu.topology }
    confirm: topo.any_pair_without_p2p
    refute: "!topo.any_pair_without_p2p && server.tp <= 2.0"
"""


def scope(p2p_everywhere: bool, tp: int | None) -> dict[str, EvidenceRecord]:
    def rec(alias: str, probe: str, values: dict) -> EvidenceRecord:
        return EvidenceRecord(alias=alias, probe=probe, status=ProbeStatus.ok, values=values)

    return {"inv": rec("inv", "gpu.inventory", {"gpu_count": 8}), "server": rec("server", "vllm.server", {"tp": tp}),
            "topo": rec("topo", "gpu.topology", {"any_pair_without_p2p": not p2p_everywhere})}


def judged(tmp_path: Path, hid: str, evidence: dict[str, EvidenceRecord]) -> tuple[Verdict, str] | None:
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(RUNBOOK))
    registry = Registry.discover([])
    loaded = load(path, registry).for_server("vllm")
    judge = Judge(loaded, registry, {})
    hyp = next(h for h, _ in loaded.runbook.walk() if h.id == hid)
    when, refute = loaded.rule(hid, "when"), loaded.rule(hid, "refute")
    first = judge.precondition(hyp, when, evidence)
    if first is None:
        return None
    found = judge.refuted_whatever(when, refute, evidence) or first
    return found[0], found[1]


def test_a_refutation_that_cannot_depend_on_the_missing_value_decides(tmp_path):
    verdict, reason = judged(tmp_path, "p2p", scope(p2p_everywhere=True, tp=None))
    assert verdict is Verdict.refuted
    assert "holds whatever server.tp is" in reason and "!topo.any_pair_without_p2p" in reason


def test_without_p2p_the_unknown_precondition_still_decides_nothing(tmp_path):
    # confirming would claim a cause that may not apply (TP 1 needs no P2P): inconclusive, as before
    verdict, reason = judged(tmp_path, "p2p", scope(p2p_everywhere=False, tp=None))
    assert verdict is Verdict.inconclusive and "server.tp" in reason


def test_a_refutation_that_reads_the_missing_value_waits_for_it(tmp_path):
    verdict, _ = judged(tmp_path, "reads-the-missing", scope(p2p_everywhere=True, tp=None))
    assert verdict is Verdict.inconclusive


def test_a_precondition_that_can_be_told_is_untouched(tmp_path):
    assert judged(tmp_path, "p2p", scope(p2p_everywhere=True, tp=8)) is None  # true: the rules decide as always
    verdict, reason = judged(tmp_path, "p2p", scope(p2p_everywhere=True, tp=1))
    assert verdict is Verdict.skipped and reason.startswith("precondition false")
