"""host-sanity's advice fits the host: peer-to-peer is a matter between GPUs, so a one-GPU host is not told to check it."""

from __future__ import annotations

import pytest

from gpu_runbook.loader import load_path_or_name
from gpu_runbook.registry import Registry
from gpu_runbook.rules import evaluate, to_cel_data


@pytest.fixture(scope="module")
def runbook():
    return load_path_or_name("host-sanity", Registry.discover())


def p2p_step_offered(runbook, inv: dict) -> bool | None:
    hyp = next(h for h, _ in runbook.runbook.hypotheses[0].walk() if h.id == "virtualized-host")
    index = next(i for i, step in enumerate(hyp.steps) if "topo -p2p" in step.text)
    rule = runbook.rule("virtualized-host", f"next_steps.{index}.when")
    data = to_cel_data({"host": {"is_virtualized": True}, "inv": inv, "params": {}, "load": {}})
    return evaluate(rule, data).value


def test_a_one_gpu_host_is_not_told_to_check_peer_to_peer(runbook):
    assert p2p_step_offered(runbook, {"gpu_count": 1}) is False


def test_a_multi_gpu_host_is(runbook):
    assert p2p_step_offered(runbook, {"gpu_count": 8}) is True


def test_a_host_whose_gpus_could_not_be_counted_still_gets_the_way_to_look(runbook):
    assert p2p_step_offered(runbook, {}) is True  # gpu.inventory unavailable: its values are empty
