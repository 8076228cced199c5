"""--depth quick|standard|deep: the tier decides what runs; quick drives no load and names the next command."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpu_runbook import depth
from gpu_runbook.cli import main
from gpu_runbook.load import LoadConfig, LoadGenerator
from gpu_runbook.loader import LoadError, find, load
from gpu_runbook.registry import Registry
from gpu_runbook.runner import Runner, resolve_params
from gpu_runbook.session import target_for

SCENARIO = "seed-rtx-pro-6000-tp8"


@pytest.fixture(scope="module")
def bundled() -> Registry:
    return Registry.discover([])


def test_quick_drives_no_load_marks_what_needs_it_and_names_the_next_command(tmp_path, capsys) -> None:
    out = tmp_path / "r.json"
    rc = main(["run", "power-starvation", "--depth", "quick", "--simulate", SCENARIO, "--no-tui",
               "--json", str(out), "--report", str(tmp_path / "r.md")])  # fmt: skip
    assert rc in (0, 1)  # 1: a finding confirmed from the configuration (--fail-on is not given: 0)
    data = json.loads(out.read_text())
    assert data["depth"] == "quick" and data["load"] is None
    assert data["target"]["simulator"]["peak_running"] == 0  # the server never saw a request from us
    nodes = {h["id"]: h for h in data["hypotheses"]}
    underfed = nodes["gpus-underfed"]
    assert underfed["verdict"] != "confirmed" and "load" in underfed["needs"] and "needs load" in underfed["depth_note"]
    profile = next(p for p in data["probes"] if p["probe"] == "sglang.profile")
    assert profile["status"] == "unavailable" and profile["reason"].startswith("not run at --depth quick")
    # the under-load samplers looked for a few seconds, not the runbook's window
    sample = next(p for p in data["probes"] if p["probe"] == "gpu.sample")
    assert sample["params"]["duration_s"] == depth.QUICK_SAMPLE_S
    nxt = f"runbook run power-starvation --depth standard --simulate {SCENARIO}"
    assert data["next_command"] == nxt
    printed = capsys.readouterr().out
    assert nxt in printed and "Depth quick" in printed
    report = (tmp_path / "r.md").read_text()
    assert "**Depth quick:**" in report and nxt in report
    # re-judged offline, the results are still the quick look's, with the same marks and the same next command
    assert main(["rejudge", str(out), "--json", str(tmp_path / "again.json"), "--report", str(tmp_path / "again.md")]) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["depth"] == "quick" and again["next_command"] == nxt
    assert {h["id"]: h["depth_note"] for h in again["hypotheses"]} == {h["id"]: h["depth_note"] for h in data["hypotheses"]}


def test_quick_confirms_underfed_gpus_when_the_server_already_has_load(bundled) -> None:
    """Someone else's traffic keeps the simulated box busy: a quick look sees the GPUs underfed, and says
    the verdict was judged on that traffic, not on a load of its own."""
    loaded = load(find("power-starvation"), bundled)
    params = resolve_params(loaded, {}, "quick")

    async def look(target, nvml):
        traffic = LoadGenerator(target, LoadConfig(concurrency=256, input_len=128, output_len=64))
        await traffic.start()
        try:
            assert await traffic.until_streaming(60.0)
            await traffic.until_admitted(limit_s=60.0)
            runner = Runner(loaded, bundled, target, params, nvml=nvml, depth="quick")
            return await runner.run()
        finally:
            await traffic.stop()

    with target_for("", None, SCENARIO) as (target, nvml, _host):
        results = asyncio.run(look(target, nvml))
    node = results.by_id("gpus-underfed")
    assert node is not None and node.verdict.value == "confirmed", node.reason
    assert "needs load" in node.depth_note and results.load is None and results.depth == "quick"


def test_deep_sets_the_runbooks_deep_params_and_set_still_wins(bundled) -> None:
    loaded = load(find("power-starvation"), bundled)
    standard, deep = resolve_params(loaded, {}, "standard"), resolve_params(loaded, {}, "deep")
    assert deep["profile_steps"] > standard["profile_steps"] and deep["sample_seconds"] > standard["sample_seconds"]
    assert resolve_params(loaded, {"profile_steps": "7"}, "deep")["profile_steps"] == 7


def test_a_depth_naming_an_unknown_param_is_an_error_with_its_line(tmp_path, bundled) -> None:
    path = tmp_path / "rb.yaml"
    path.write_text("name: rb\ntitle: t\nparams:\n  a: { type: int, default: 1 }\ndepths:\n  deep: { b: 2 }\n"
                    "hypotheses:\n  - id: h\n    title: h\n    confirm: params.a > 0\n")  # fmt: skip
    with pytest.raises(LoadError) as exc:
        load(path, bundled)
    assert "rb.yaml:6" in str(exc.value) and "unknown param 'b'" in str(exc.value)


def test_needs_are_declared_in_the_schema_and_checked(tmp_path, bundled) -> None:
    path = tmp_path / "rb.yaml"
    path.write_text("name: rb\ntitle: t\nhypotheses:\n  - id: h\n    title: h\n    needs: [load, nap]\n    confirm: 'true'\n")
    with pytest.raises(LoadError) as exc:
        load(path, bundled)
    assert "rb.yaml:6" in str(exc.value)


def test_next_command_keeps_target_and_params_and_never_the_key() -> None:
    cmd = depth.next_command("power-starvation", "quick", server_url="http://10.0.0.5:30000", sets=["gpus=0,1", "x=a b"])
    assert cmd == "runbook run power-starvation --depth standard --server-url http://10.0.0.5:30000 --set gpus=0,1 --set 'x=a b'"
    assert depth.next_command("power-starvation", "deep") is None
    assert depth.next_depth("standard") == "deep"


def test_note_says_what_a_tier_did_not_give() -> None:
    assert depth.note(["load"], "standard") == ""
    assert "needs load" in depth.note(["load"], "quick")
    assert "a profile (not run)" in depth.note(["profile"], "quick")
    assert depth.note(["sweep"], "deep") == ""
