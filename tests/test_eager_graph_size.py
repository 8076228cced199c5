"""Eager mode does not hide itself (issue 33): `--enforce-eager` makes vLLM's largest decode graph 0, so
`cuda-graphs-disabled` holds the batch against what the same launch would capture with graphs on
(`graph_max_bs_if_enabled`, from the release's default sizes and max_num_seqs: probes/vllm/facts.py), and offers
"Drop `--enforce-eager`" in the words of the release (`-O` is `--compilation-config` through 0.11,
`--optimization-level` from 0.12: engine/vllm_releases.yaml `optimization-level-flag`)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gpu_runbook.headlines import render
from gpu_runbook.loader import load_path_or_name
from gpu_runbook.model import headline_parts
from gpu_runbook.probe import Context
from gpu_runbook.probes.vllm import facts
from gpu_runbook.registry import Registry
from gpu_runbook.rules import evaluate, to_cel_data
from gpu_runbook.sim.host import SimulatedHost
from gpu_runbook.sim.scenario import load_scenario

HID = "cuda-graphs-disabled"


def test_the_default_capture_size_follows_max_num_seqs_from_0_10():
    # 0.9.2 config.py:2133 cuda_graph_sizes [512]; 0.10.0 config.py:2456 [min(max_num_seqs * 2, 512)]
    assert [facts.default_graph_max_bs(v, 64) for v in ("0.8.5", "0.9.2", "0.10.0", "0.11.0", "0.34.0")] == [512, 512, 128, 128, 128]
    assert facts.default_graph_max_bs("0.11.0", 2048) == 512
    assert facts.default_graph_max_bs("0.11.0", None) is None


def test_what_an_eager_launch_would_capture():
    assert facts.graph_max_bs_if_enabled("0.11.0", 64, None) == (128, "this release's default: min(2 x max_num_seqs 64, 512)")
    assert facts.graph_max_bs_if_enabled("0.8.5", 64, None)[0] == 512
    assert facts.graph_max_bs_if_enabled("0.11.0", 64, 32) == (32, "the capture size set at launch")
    assert facts.graph_max_bs_if_enabled("0.11.0", None, None) == (None, None)


def server(version: str, eager: bool, if_enabled: int | None = 128) -> dict[str, Any]:
    return {"server_kind": "vllm", "version": version, "version_known": True, "cuda_graphs_decode": not eager,
            "graph_max_bs_decode": 0 if eager else if_enabled, "graph_max_bs_if_enabled": if_enabled}


@pytest.fixture(scope="module")
def vllm_runbook():
    return load_path_or_name("power-starvation", Registry.discover([])).for_server("vllm")


def judge(loaded, srv: dict[str, Any], running: float) -> dict[str, Any]:
    """The hypothesis's rules on a scope: confirmed, not limiting (and its text), and the steps that apply (rendered)."""
    hyp = next(h for h, _ in loaded.runbook.walk() if h.id == HID)
    params = {n: p.default for n, p in loaded.runbook.params.items()}
    data = to_cel_data({"server": srv, "metrics": {"running_per_dp": {"p50": running}, "decode_graph_share": None},
                        "params": params, "load": {}})
    out: dict[str, Any] = {"confirmed": evaluate(loaded.rule(HID, "confirm"), data).value,
                           "not_limiting": evaluate(loaded.rule(HID, "not_limiting.when"), data).value}
    fields = [loaded.rule(HID, f"not_limiting.says.{j}") for j in range(len(headline_parts(hyp.not_limiting.says)))]
    out["says"] = render(hyp.not_limiting.says, fields, data)[0]
    steps = []
    for i, step in enumerate(hyp.steps):
        if step.when is not None and evaluate(loaded.rule(HID, f"next_steps.{i}.when"), data).value is not True:
            continue
        parts = [loaded.rule(HID, f"next_steps.{i}.text.{j}") for j in range(len(headline_parts(step.text)))]
        steps.append(" ".join(render(step.text, parts, data)[0].split()))
    out["steps"] = steps
    return out


def test_an_eager_server_at_a_batch_its_release_would_capture_is_limiting(vllm_runbook):
    got = judge(vllm_runbook, server("0.11.0", eager=True), 64.0)
    assert got["confirmed"] is True and got["not_limiting"] is False
    assert len(got["steps"]) == 1 and got["steps"][0].startswith("Drop `--enforce-eager`")
    assert "`-O 0`" in got["steps"][0] and "--optimization-level" not in got["steps"][0]  # 0.11: -O is --compilation-config
    assert "for batches up to 128 per rank (this window ran 64)" in got["steps"][0]


def test_an_eager_server_far_past_the_capture_size_is_not_limiting_and_says_where_it_would_be(vllm_runbook):
    got = judge(vllm_runbook, server("0.11.0", eager=True, if_enabled=512), 2000.0)
    assert got["confirmed"] is True and got["not_limiting"] is True
    assert "2,000" in got["says"] and "would start to matter at 512 running per rank or fewer" in got["says"]


def test_from_0_12_the_step_names_the_optimization_level(vllm_runbook):
    got = judge(vllm_runbook, server("0.20.0", eager=True), 64.0)
    assert len(got["steps"]) == 1 and "`--optimization-level 0`" in got["steps"][0] and "`-O 0`" not in got["steps"][0]


def test_graphs_on_within_the_largest_graph_is_refuted_and_past_it_is_not_limiting(vllm_runbook):
    within = judge(vllm_runbook, server("0.11.0", eager=False, if_enabled=512), 64.0)
    assert within["confirmed"] is False and within["steps"] == []
    past = judge(vllm_runbook, server("0.11.0", eager=False, if_enabled=128), 300.0)
    assert past["confirmed"] is True and past["not_limiting"] is True and past["steps"] == []


def probe_values(name: str) -> dict[str, Any]:
    probe = Registry.discover([]).for_target("sglang.server", "vllm")

    async def read(host: SimulatedHost) -> Any:
        async with httpx.AsyncClient() as http:
            return await probe().run(Context(target=host.target(), http=http, nvml=host.nvml), probe.Params())

    with SimulatedHost.start(load_scenario(name)) as host:
        ev = asyncio.run(read(host))
    assert ev.ok, ev.reason
    return ev.values


def test_the_probe_reads_an_eager_server_as_graphs_off_and_what_they_would_capture():
    v = probe_values("eager-vllm-max-num-seqs-64")
    assert (v["cuda_graphs_decode"], v["graph_max_bs_decode"], v["graph_max_bs_if_enabled"]) == (False, 0, 128)
    assert "min(2 x max_num_seqs 64, 512)" in v["sources"]["graph_max_bs_if_enabled"]
    on = probe_values("healthy-h200-vllm")  # graphs on, capture size 512 set: the same number both ways
    assert on["cuda_graphs_decode"] is True and on["graph_max_bs_decode"] == on["graph_max_bs_if_enabled"] == 512


def test_without_dev_mode_or_a_command_line_it_is_unknown():
    v = probe_values("max-num-seqs-64-vllm")  # no dev mode, and the simulated host shows no command line
    assert v["cuda_graphs_decode"] is None and v["graph_max_bs_if_enabled"] is None
    assert "VLLM_SERVER_DEV_MODE" in v["unknown"]["graph_max_bs_if_enabled"]


def test_a_dev_build_gets_the_step_that_names_both_spellings(vllm_runbook):
    srv = {**server("0.0.0.dev0", eager=True), "version_known": False}
    got = judge(vllm_runbook, srv, 64.0)
    assert len(got["steps"]) == 1 and "`--optimization-level` from 0.12.0" in got["steps"][0]
