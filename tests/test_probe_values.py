"""The probes' declared values against what they really return, and the path check `validate` uses.

The contract half runs every built-in probe on simulated hosts of several SGLang releases (and a dev
build, and a host with dcgm-exporter) and validates each evidence's values against the probe's
`Values` model, strictly and with unknown keys refused: a value the code returns but the model does
not name, or names with another type, fails here, so the model `validate` trusts cannot drift.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest

from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.registry import Registry
from gpu_runbook.values import Values, check_path, contract_errors, value
from probe_contract import SCENARIOS, run_builtin

BUILTIN = {n: c for n, c in Registry.discover([]).probes.items() if c.__module__.startswith("gpu_runbook.probes.")}


def test_every_builtin_probe_declares_its_values():
    undeclared = sorted(n for n, c in BUILTIN.items() if c.Values is None)
    assert not undeclared, f"built-in probes without a Values model: {undeclared}"
    for name, cls in BUILTIN.items():
        assert issubclass(cls.Values, Values), name
        assert cls.Values.model_config.get("extra") == "forbid", name


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_probes_return_what_they_declare(scenario):
    registry = Registry.discover([])
    evidence = asyncio.run(run_builtin(scenario, registry))
    assert set(evidence) == set(BUILTIN)
    problems = []
    for name, ev in evidence.items():
        model = BUILTIN[name].Values
        for err in contract_errors(model, ev.values, complete=ev.status is ProbeStatus.ok):
            problems.append(f"{name} ({ev.status.value}): {err}")
    assert not problems, f"{scenario}:\n" + "\n".join(problems)
    # the simulated hosts exercise the probes: most of them answer ok on every release
    ok = {n for n, ev in evidence.items() if ev.ok}
    assert {"gpu.inventory", "gpu.sample", "gpu.topology", "sglang.server", "sglang.metrics", "model.config"} <= ok, {
        n: ev.reason for n, ev in evidence.items() if not ev.ok}


# ---------------------------------------------------------------------------------------------
# the contract check itself


class _Stats(Values):
    mean: float = value(default=...)
    max: float = value(default=...)


class _Gpu(Values):
    index: int = value(default=...)
    power_w: float | None = value(unit="W")


class _Sample(Values):
    gpu_count: int = value(default=...)
    power_draw_w: _Stats | None = value("board power", unit="W")
    gpus: list[_Gpu] = value(default=...)
    event_reasons: dict[str, float] | None = None
    source: Literal["a", "b"] | None = None
    raw: Any = None


def test_contract_refuses_undeclared_keys_wrong_types_and_missing_required():
    good = {"gpu_count": 2, "power_draw_w": {"mean": 200, "max": 210.5}, "gpus": [{"index": 0}], "event_reasons": {"x": 0.0}}
    assert contract_errors(_Sample, good, complete=True) == []
    assert any("power_draw_wat" in e and "Extra inputs" in e for e in contract_errors(_Sample, {**good, "power_draw_wat": 1}, complete=True))
    assert any(e.startswith("gpu_count") for e in contract_errors(_Sample, {**good, "gpu_count": "2"}, complete=True))  # strict: no coercion
    assert any(e.startswith("gpu_count") for e in contract_errors(_Sample, {**good, "gpu_count": True}, complete=True))
    assert any(e.startswith("gpus.0.power") for e in contract_errors(_Sample, {**good, "gpus": [{"index": 0, "power": 1.0}]}, complete=True))
    missing = {k: v for k, v in good.items() if k != "gpus"}
    assert any(e.startswith("gpus") and "required" in e for e in contract_errors(_Sample, missing, complete=True))
    # unavailable evidence may carry any part of the values, but still nothing undeclared
    assert contract_errors(_Sample, {"gpu_count": 2}, complete=False) == []
    assert contract_errors(_Sample, {"gpu_cont": 2}, complete=False) != []


def test_path_check_follows_models_maps_lists_and_unions():
    assert check_path(_Sample, ["power_draw_w", "mean"]) is None
    assert check_path(_Sample, ["event_reasons", "sw_power_cap"]) is None  # a map: any key
    assert check_path(_Sample, ["raw", "anything", "deeper"]) is None  # Any: nothing known below
    assert check_path(_Sample, ["gpus", "<each>", "power_w"]) is None
    assert check_path(_Sample, ["gpus", "[]", "index"]) is None
    typo = check_path(_Sample, ["power_draw_w", "maen"])
    assert typo is not None and typo.index == 1 and "did you mean 'mean'" in typo.message
    top = check_path(_Sample, ["power_drw_w", "mean"])
    assert top is not None and top.index == 0 and "did you mean 'power_draw_w'" in top.message
    assert "'gpu_count' is a number, 'max' cannot be read from it" in check_path(_Sample, ["gpu_count", "max"]).message
    assert "list" in check_path(_Sample, ["gpus", "index"]).message
    elem = check_path(_Sample, ["gpus", "<each>", "powr_w"])
    assert elem is not None and elem.index == 2 and "power_w" in elem.message
    assert check_path(_Sample, ["source", "x"]) is not None
