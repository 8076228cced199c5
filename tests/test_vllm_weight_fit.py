"""vLLM's parallelism steps check that the weights fit (issue 33): GLM-5 NVFP4 needs ~206 GB a GPU at TP2 and
~103 GB at TP4, more than a 96 GB card holds, so neither is offered on the seeds' box; a model that fits is offered
both, with the weights per GPU in the step."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_runbook.loader import load_path_or_name
from gpu_runbook.probes.model import config_values
from gpu_runbook.registry import Registry
from gpu_runbook.sim.scenario import load_scenario

from test_step_preconditions import offered_steps, stats


@pytest.fixture(scope="module")
def runbook():
    return load_path_or_name("power-starvation", Registry.discover())


def scope(scenario: str, tp: int) -> dict[str, Any]:
    sc = load_scenario(scenario)
    g = sc.gpu
    return {
        "server": {"server_kind": "vllm", "version": "0.11.0", "tp": tp, "pp": 1, "dp": 1, "ep": 1, "custom_all_reduce_disabled": False,
                   "model_dtype": "bfloat16", "kv_dtype": "fp8", "cuda_graphs_decode": True, "graph_max_bs_decode": 512},
        "model": config_values(dict(sc.hf_config), sc.hf_quant_config),
        "inv": {"memory_total_bytes": g.memory_mib * 1024 * 1024, "gpu_count": g.count, "compute_capability_major": g.cc[0],
                "nvlink_active_links_total": 0},
        "topo": {"any_pair_without_p2p": False},
        "metrics": {"running_per_dp": stats(64.0)},
    }  # fmt: skip


def tp_steps(runbook, s: dict[str, Any]) -> dict[str, str]:
    """The offered steps that shrink the tensor-parallel group: TP/2 with DP 2, and a TP2 group."""
    out = {}
    for _, text in offered_steps(runbook, s, "vllm"):
        if "--data-parallel-size 2`" in text:
            out["half"] = text
        elif "`-tp 2`" in text:
            out["tp2"] = text
    return out


def test_glm5_on_96_gb_cards_is_offered_no_smaller_tensor_parallel_group(runbook):
    s = scope("seed-rtx-pro-6000-tp8-vllm", 8)
    assert s["model"]["expert_weights_gib"] + s["model"]["dense_weights_gib"] > 380  # GLM-5's weights in NVFP4
    assert tp_steps(runbook, s) == {}  # ~103 GiB a GPU at TP4, ~206 GiB at TP2: neither fits a 96 GB card


def test_each_step_is_offered_where_its_own_weights_fit(runbook):
    s = scope("healthy-h200-vllm", 8)  # a 235B MoE in BF16 on 141 GB cards: ~55 GiB a GPU at TP4, ~109 GiB at TP2
    total = s["model"]["expert_weights_gib"] + s["model"]["dense_weights_gib"]
    room = 0.75 * s["inv"]["memory_total_bytes"] / 2**30
    assert total / 4 < room < total / 2, (total, room)
    steps = tp_steps(runbook, s)
    assert set(steps) == {"half"}, steps
    assert "`--tensor-parallel-size 4 --data-parallel-size 2`" in steps["half"] and f"~{total / 4:,.1f}" in steps["half"], steps["half"]
    smaller = dict(s, model={**s["model"], "expert_weights_gib": s["model"]["expert_weights_gib"] / 4})
    assert set(tp_steps(runbook, smaller)) == {"half", "tp2"}  # a quarter of the experts: TP2 fits too
