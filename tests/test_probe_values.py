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


# ---------------------------------------------------------------------------------------------
# what validate makes of rules (through the loader, with the test probes' declared models)


def _errors(load_runbook, rule: str, *, probe: str = "test.declared", field: str = "confirm") -> list[str]:
    from gpu_runbook.loader import LoadError

    text = f"name: t\ntitle: T\nhypotheses:\n  - id: a\n    title: A\n    probes:\n      m: {{ probe: {probe} }}\n    {field}: {rule}\n"
    try:
        load_runbook(text)
    except LoadError as exc:
        return [f"{e.pos.line}:{e.pos.col}: {e.message}" for e in exc.errors]
    return []


def test_validate_accepts_what_the_models_allow(load_runbook):
    for rule in (
        "m.power.mean > 1.0 && m.gpus.all(g, g.index >= 0.0) && m.reasons.sw_power_cap < 0.5",
        "m.gpus[0].power_w > 1.0 && m.reasons['hw_slowdown'] == 0.0 && has(m.power.max)",
        "m.gpus.exists(g, m.gpus[int(g.index)].power_w > 1.0) && m.label.startsWith('x')",
        "load.steady_output_tokens_per_s < 1000.0 && load.ttft_ms.p99 > 1.0 && load.config.concurrency > 1.0",
        "m.reasons.exists(k, m.reasons[k] > 0.1) && size(m.gpus.filter(g, g.power_w != null)) > 0",
    ):
        assert _errors(load_runbook, f'"{rule}"') == [], rule
    assert _errors(load_runbook, '"m.anything.goes > 1.0"', probe="test.value") == []  # no model: taken on trust


def test_validate_reports_each_wrong_member_once_in_the_rules_own_terms(load_runbook):
    assert _errors(load_runbook, '"m.pwr.all(g, g.mean > 1.0) && m.pwr.max > 1.0"') == [
        "8:17: confirm: test.declared has no value 'pwr' (did you mean 'power'?)"]  # fmt: skip
    assert _errors(load_runbook, '"m.label.all(c, c > 1.0)"') == ["8:17: confirm: 'label' is a string: it cannot be iterated"]
    assert _errors(load_runbook, '"m.gpus.index > 1.0"')[0].startswith("8:22: confirm: 'gpus' is a list, 'index' cannot be read from it")
    # an index's own expression is read in the scope it is written in (g is the macro's, not an alias)
    inner = '"m.gpus[size(m.gpus.filter(g, g.powr > 1.0))].index > 0.0"'
    assert _errors(load_runbook, inner) == ["8:46: confirm: an element of 'gpus' has no value 'powr' (did you mean 'power_w'?)"]


def test_headline_field_errors_name_the_field_on_one_line(load_runbook):
    from gpu_runbook.loader import LoadError

    text = ("name: t\ntitle: T\nhypotheses:\n  - id: a\n    title: A\n    probes:\n      m: { probe: test.declared }\n"
            '    confirm: m.label == "x"\n    headline: "{{ m.power.mean +\n      m.power.mx | W }}"\n')  # fmt: skip
    with pytest.raises(LoadError) as info:
        load_runbook(text)
    (err,) = info.value.errors
    assert str(err).endswith("10:15: headline field 1 ('m.power.mean + m.power.mx'): 'power' has no value 'mx' (did you mean 'max'?)")


def test_path_check_takes_a_bare_list_as_unknown_elements():
    class Loose(Values):
        items: list = value(default=...)  # type: ignore[type-arg]
        pair: tuple[int, str] | None = None

    assert check_path(Loose, ["items", "[]", "anything"]) is None
    assert check_path(Loose, ["items", "<each>"]) is None
    assert check_path(Loose, ["pair", "[]", "x"]) is None
