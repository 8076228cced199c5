"""The TUI driven against a live simulated-host run of the headline runbook (issue 7's pilot test)."""

from __future__ import annotations

from pathlib import Path

from gpu_runbook.loader import load
from gpu_runbook.target import Target
from gpu_runbook.registry import Registry
from gpu_runbook.runner import Runner, resolve_params
from gpu_runbook.sim.host import SimulatedHost
from gpu_runbook.tui.app import RunbookApp
from gpu_runbook.tui.loadpanel import LoadPanel
from gpu_runbook.tui.tree import HypothesisTree
from test_tui_support import wait_for

REPO = Path(__file__).parent.parent

# the seeds' box with a 40,000-token KV pool: its wall in seconds (power-starvation's own seed test sets the same)
SEED_SMALL = Path(__file__).parent / "data" / "scenarios" / "seed-kv-40k.yaml"


async def test_power_starvation_on_the_seed_box_fills_in_live(tmp_path: Path) -> None:
    registry = Registry.discover()
    loaded = load(REPO / "runbooks" / "power-starvation.yaml", registry)
    params = resolve_params(loaded, {"sample_seconds": "2", "warmup_seconds": "1", "steady_seconds": "60", "load_output_len": "32", "profile_wait_seconds": "30", "load_concurrency": "512"})
    with SimulatedHost.start(SEED_SMALL) as host:
        runner = Runner(loaded, registry, Target(sglang_url=host.url, label=f"simulated: {host.name}", simulated=True), params, nvml=host.nvml)
        app = RunbookApp(runner, str(tmp_path / "r.json"), str(tmp_path / "r.md"), stable=True)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.state.marks.get("gpus-underfed") == "running", timeout=30)
            await wait_for(pilot, lambda: app.query_one(LoadPanel).display, timeout=30)  # the load strip shows while load runs
            await wait_for(pilot, lambda: app.state.done, timeout=90)
            app.sync()
            tree = app.query_one(HypothesisTree)
            marks = {hid: node.label.plain[0] for hid, node in tree.by_id.items()}
            await pilot.press("q")
    confirmed = {hid for hid, mark in marks.items() if mark == "●"}
    # the screen's marks are the runner's: verdicts that hold on this box whatever the sampled moment (the KV wall
    # depends on where the window falls in the refill waves of 32-token requests: `runbook test` decides it)
    assert {"gpus-underfed", "custom-allreduce-off", "sm120-untuned"} <= confirmed
    assert marks["power-limit-capped"] == marks["clocks-held-down"] == "○"
    assert marks["communication-bound"] != "○"  # issue 11: idle-looking links are not evidence (test_power_starvation_rules)
    assert app.results is not None and not app.results.interrupted
    assert {h.id for h in app.results.confirmed()} == confirmed
