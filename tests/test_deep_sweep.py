"""--depth deep adds power-starvation's concurrency sweep (issue 26 item 4): it runs after the runbook's own load
has stopped (two loads at once would measure both), and only at deep: a standard run leaves it out."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from gpu_runbook import depth
from gpu_runbook.cli import main

SCENARIO = "healthy-h200-nvlink"
SHORT = ["--set", "sample_seconds=2", "--set", "steady_seconds=0", "--set", "warmup_seconds=1", "--set", "load_output_len=32",
         "--set", "load_concurrency=32", "--set", "profile_wait_seconds=30", "--set", "profile_steps=3",
         "--set", "seconds_per_level=1", "--set", "sweep_levels=4,16"]  # fmt: skip
HYP = "throughput-plateau-below-load"


def _run(tmp_path, tier: str) -> dict:
    out = tmp_path / f"{tier}.json"
    rc = main(["run", "power-starvation", "--depth", tier, "--simulate", SCENARIO, "--no-tui", "--json", str(out),
               "--report", str(tmp_path / f"{tier}.md"), *SHORT])  # fmt: skip
    assert rc in (0, 1), rc  # 1: a finding confirmed (no --fail-on given: 0)
    return json.loads(out.read_text())


def _at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_deep_sweeps_after_the_load_stopped_and_judges_the_plateau(tmp_path) -> None:
    data = _run(tmp_path, "deep")
    assert data["depth"] == "deep" and data["load"] is not None and data["load"]["completed"] > 0
    sweep = next(p for p in data["probes"] if p["probe"] == "sglang.sweep")
    assert sweep["status"] == "ok", sweep["reason"]
    assert [int(c) for c in sweep["params"]["levels"]] == [4, 16] and float(sweep["params"]["seconds_per_level"]) == 1.0
    started = _at(sweep["started_at"])
    # after every under-load probe finished (the load stops only then), and after the whole load window
    sampled = [_at(p["finished_at"]) for p in data["probes"] if p["under_load"]]
    assert sampled and started >= max(sampled)
    assert started >= _at(data["started_at"]) + timedelta(seconds=data["timings"]["load_window_s"])
    node = next(h for h in data["hypotheses"] if h["id"] == HYP)
    assert node["verdict"] in ("confirmed", "refuted"), node["reason"]
    assert any(e["probe"] == "sglang.sweep" and e["status"] == "ok" for e in node["evidence"])
    assert node["depth_note"] == "" and node["needs"] == ["sweep", "deep"]
    # levels of 4 and 16 on an H200 box that serves 32 without a wall: still scaling at 16, no plateau below the load
    assert node["verdict"] == "refuted" and node["rule_values"]["params.load_concurrency"] == 32


def test_standard_leaves_the_sweep_out_and_says_deep_measures_it(tmp_path) -> None:
    data = _run(tmp_path, "standard")
    node = next(h for h in data["hypotheses"] if h["id"] == HYP)
    assert node["verdict"] == "skipped" and "--depth deep measures it" in node["reason"]
    sweeps = [p for p in data["probes"] if p["probe"] == "sglang.sweep"]
    assert all(p["status"] == "unavailable" and p["reason"].startswith("not run at --depth standard") for p in sweeps)
    assert sweeps and all(p["duration_s"] == 0.0 for p in sweeps)


def test_a_deep_only_need_skips_standard_in_the_note_and_gates_every_call() -> None:
    assert depth.left_out(None, ["sweep", "deep"], "standard") == "deep"
    assert depth.left_out("sweep", ["sweep", "deep"], "quick") == "deep"
    assert depth.left_out("sweep", ["sweep", "deep"], "deep") is None
    assert depth.left_out("sweep", ["sweep"], "standard") is None  # throughput-plateau's sweep: standard runs it
    assert depth.left_out("profile", [], "quick") == "profile"
    assert depth.note(["sweep", "deep"], "quick").endswith("--depth deep measures it")
    assert depth.note(["sweep", "deep"], "standard", ["deep"]).endswith("--depth deep measures it")
    assert depth.note(["sweep", "deep"], "deep") == ""
    assert depth.first_running("deep") == "deep" and depth.first_running("sweep") == "standard"
