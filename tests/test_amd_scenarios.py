"""power-starvation on the simulated MI300X boxes (issue 37, acceptance 1): the same runbook decides on amdsmi's
readings, and an AMD host's findings speak amd-smi, never nvidia-smi."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpu_runbook.loader import LoadError, find, load
from gpu_runbook.runbook_test import run_case, Case
from gpu_runbook.model import ScenarioTest

QUICK = {"sample_seconds": 3, "warmup_seconds": 1, "steady_seconds": 60, "load_output_len": 32, "profile_wait_seconds": 30}
GPU_HYPOTHESES = ("gpus-underfed", "power-limit-capped", "power-limit-lowered", "clocks-held-down", "p2p-unavailable")
NVIDIA_WORDS = ("nvidia-smi", "NVML", "nvml")


@pytest.fixture(scope="module")
def runbook(registry_module):
    return load(find("power-starvation"), registry_module)


@pytest.fixture(scope="module")
def registry_module():
    from gpu_runbook.registry import Registry

    return Registry.discover()


def test_the_gpu_hypotheses_speak_amd_on_amd_and_nothing_changes_on_nvidia(runbook):
    amd = {h.id: h for h, _ in runbook.for_server("sglang", "amd").runbook.walk()}
    nvidia = runbook.for_server("sglang", "nvidia")
    for hid in GPU_HYPOTHESES:
        text = amd[hid].why + amd[hid].next_steps_text + " ".join(r.title for r in amd[hid].references)
        assert not any(word in text for word in NVIDIA_WORDS), hid
    assert "amd-smi set -g <gpu> -o" in amd["power-limit-capped"].next_steps_text
    assert "amd-smi" in amd["clocks-held-down"].next_steps_text and "amd-smi" in amd["p2p-unavailable"].next_steps_text
    # NVIDIA's reading is the runbook's own text, and no vendor found reads as NVIDIA (whose probes then run)
    assert nvidia.runbook == runbook.for_server("sglang").runbook == runbook.for_server("sglang", None).runbook
    assert nvidia.rules.keys() == runbook.for_server("sglang").rules.keys()
    assert "nvidia-smi -pl" in {h.id: h for h, _ in nvidia.runbook.walk()}["power-limit-capped"].next_steps_text


def _run(runbook, registry, scenario: str):
    case = Case(ScenarioTest(scenario=scenario, set=QUICK, expect={}), where="")
    return run_case(runbook, registry, case)


def test_the_capped_mi300x_confirms_the_cap_read_from_amdsmi_with_amd_smi_steps(runbook, registry_module):
    results = _run(runbook, registry_module, "mi300x-power-cap")
    by_id = {h.id: h for h in results.hypotheses}
    capped = by_id["power-limit-capped"]
    assert capped.verdict.value == "confirmed", capped.reason
    assert "at a power cap of 500 W (board maximum 750 W); the PPT violation is active" in capped.headline
    assert any(p.probe == "amd.sample" for p in results.probes)  # the cap was read by the AMD probe, through amdsmi
    steps = " ".join(s.text for s in capped.steps)
    assert "sudo amd-smi set -g <gpu> -o <max W>" in steps and "nvidia-smi" not in steps
    serious = [h.id for h in results.hypotheses if h.verdict.value == "confirmed" and h.severity.value in ("warning", "critical")]
    assert serious == ["power-limit-capped"]
    assert results.target["gpu_vendor"] == "amd"
    # what renders the run reads the AMD probes as the GPU jobs they did: the header's inventory, the power chart
    from gpu_runbook.report import charts  # noqa: PLC0415

    assert results.inventory()["gpus"]["gpu_name"] == "AMD Instinct MI300X"
    assert any("Socket power vs power cap" in "\n".join(chart) for chart in charts(results))
    # re-judged offline from its JSON: the AMD evidence answers the GPU jobs the runbook names, in AMD's words
    from gpu_runbook.rejudge import rejudge  # noqa: PLC0415
    from gpu_runbook.results import Results  # noqa: PLC0415

    again = rejudge(Results.model_validate_json(results.model_dump_json()), runbook, registry_module)
    assert [(h.id, h.verdict) for h in again.hypotheses] == [(h.id, h.verdict) for h in results.hypotheses]
    assert [s.text for s in {h.id: h for h in again.hypotheses}["power-limit-capped"].steps] == [s.text for s in capped.steps]
    assert "nvidia-smi" not in json.dumps([h.model_dump(mode="json") for h in results.hypotheses if h.verdict.value == "confirmed"])


VARIANT_RUNBOOK = """
name: v
title: t
hypotheses:
  - id: capped
    title: capped
    probes:
      power: { probe: gpu.sample, with: { duration_s: 0.2, interval_s: 0.1 } }
    confirm: power.power_limit_enforced_w < 600.0
    headline: "limit {{ power.power_limit_enforced_w | W }} (nvidia-smi -q -d POWER)"
    next_steps: |
      - `sudo nvidia-smi -pl <max W>`
    gpus:
      amd:
        headline: "cap {{ power.power_limit_max_w | W }} of {{ power.power_limit_enforced_w | W }} (amd-smi metric -p)"
        next_steps: |
          - `sudo amd-smi set -g <gpu> -o <max W>`
"""


def test_a_gpu_variants_headline_and_steps_replace_the_hypothesis_own_on_that_vendor(load_runbook):
    loaded = load_runbook(VARIANT_RUNBOOK)
    amd, nvidia = loaded.for_server("sglang", "amd"), loaded.for_server("sglang", "nvidia")
    (h_amd, _), = amd.runbook.walk()
    (h_nv, _), = nvidia.runbook.walk()
    assert h_amd.headline.startswith("cap ") and h_nv.headline.startswith("limit ")
    assert [s.text for s in h_amd.steps] == ["`sudo amd-smi set -g <gpu> -o <max W>`"]
    assert [s.text for s in h_nv.steps] == ["`sudo nvidia-smi -pl <max W>`"]
    # each reading carries the rules of its own headline's fields, in their places
    assert amd.rule("capped", "headline.0").source.strip() == "power.power_limit_max_w"
    assert amd.rule("capped", "headline.1").source.strip() == "power.power_limit_enforced_w"
    assert nvidia.rule("capped", "headline.0").source.strip() == "power.power_limit_enforced_w"
    assert nvidia.rule("capped", "headline.1") is None


def test_a_gpu_variants_headline_is_checked_like_the_hypotheses(load_runbook):
    with pytest.raises(LoadError) as caught:
        load_runbook(VARIANT_RUNBOOK.replace("power.power_limit_max_w | W", "power.no_such_value | W"))
    assert "gpus.amd: headline field 1" in str(caught.value) and "no_such_value" in str(caught.value)
