#!/usr/bin/env python3
"""How fast the TUI answers: first paint after launch, and every key on the simulated seed run.

1. First paint: a child process does what `runbook run power-starvation --simulate seed-rtx-pro-6000-tp8`
   does (imports, loads the runbook, starts the simulated host, builds the app) and says when the first
   screen is drawn; the time counts from launching the child. Baseline: `python -c pass`, same run.
   Target: under 1 s.
2. Keys: the app is driven with Textual's pilot against the seed run (short windows); each key is timed
   from the press until the app has handled it and repainted (for `v`, until the report is on screen).
   Baseline: a key nothing is bound to, same run. Target: every key under 100 ms.

    python benchmarks/tui_keys.py            # both
    python benchmarks/tui_keys.py --keys     # keys only
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAINT_RUNS = 3
KEY_RUNS = 5
KEY_TARGET_S = 0.100
PAINT_TARGET_S = 1.0
SEED = "seed-rtx-pro-6000-tp8"
PARAMS = {"sample_seconds": "2", "warmup_seconds": "1", "load_concurrency": "1024", "load_input_len": "1024"}

CHILD = r"""
import asyncio, sys, time
from engine.loader import find, load
from engine.probe import Target
from engine.registry import Registry
from engine.runner import Runner, resolve_params
from engine.sim.host import SimulatedHost
from engine.tui.app import RunbookApp

registry = Registry.discover()
loaded = load(find("power-starvation"), registry)
with SimulatedHost.start(sys.argv[1]) as host:
    runner = Runner(loaded, registry, Target(sglang_url=host.url, label="simulated", simulated=True), resolve_params(loaded, {}), nvml=host.nvml)
    app = RunbookApp(runner, None, None, autostart=False)

    async def main():
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            print("PAINTED", flush=True)

    asyncio.run(main())
"""


def first_paint() -> tuple[float, float]:
    """(median launch-to-first-paint, median `python -c pass`) in seconds."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def once(args: list[str], marker: str | None) -> float:
        start = time.perf_counter()
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO, env=env)
        took = None
        assert proc.stdout is not None
        for line in proc.stdout:
            if marker and line.startswith(marker):
                took = time.perf_counter() - start
        proc.wait()
        return took if took is not None else time.perf_counter() - start

    paint = statistics.median(once([sys.executable, "-c", CHILD, SEED], "PAINTED") for _ in range(PAINT_RUNS))
    base = statistics.median(once([sys.executable, "-c", "pass"], None) for _ in range(PAINT_RUNS))
    return paint, base


# (label, keys to press, the condition that says the key was answered)
def key_plan(app) -> list[tuple[str, list[str], object]]:
    from engine.tui.keys import KeysScreen
    from engine.tui.report_screen import ReportScreen

    main = lambda: not isinstance(app.screen, (ReportScreen, KeysScreen))  # noqa: E731
    return [
        ("unbound key (baseline)", ["x"], main),
        ("down", ["down"], main),
        ("up", ["up"], main),
        ("enter", ["enter"], main),
        ("space (fold)", ["space"], main),
        ("space (unfold)", ["space"], main),
        ("tab (to detail)", ["tab"], main),
        ("pagedown", ["pagedown"], main),
        ("pageup", ["pageup"], main),
        ("tab (to tree)", ["tab", "tab"] if app.query_one("#log").display else ["tab"], main),
        ("w (wide tables)", ["w"], main),
        ("w (fit tables)", ["w"], main),
        ("l (log)", ["l"], main),
        ("l (log again)", ["l"], main),
        ("f (follow)", ["f"], main),
        ("? (keys)", ["question_mark"], lambda: isinstance(app.screen, KeysScreen)),
        ("escape (close keys)", ["escape"], main),
        ("v (report)", ["v"], lambda: isinstance(app.screen, ReportScreen) and app.screen.is_ready()),
        ("escape (close report)", ["escape"], main),
        ("s (save)", ["s"], main),
    ]


async def drive_keys() -> dict[str, list[float]]:
    from engine.loader import find, load
    from engine.probe import Target
    from engine.registry import Registry
    from engine.runner import Runner, resolve_params
    from engine.sim.host import SimulatedHost
    from engine.tui.app import RunbookApp

    registry = Registry.discover()
    loaded = load(find("power-starvation"), registry)
    times: dict[str, list[float]] = {}
    with SimulatedHost.start(SEED) as host, tempfile.TemporaryDirectory() as tmp:
        runner = Runner(loaded, registry, Target(sglang_url=host.url, label="simulated", simulated=True), resolve_params(loaded, PARAMS), nvml=host.nvml)
        app = RunbookApp(runner, f"{tmp}/r.json", f"{tmp}/r.md", stable=True)
        async with app.run_test(size=(120, 40)) as pilot:
            deadline = time.monotonic() + 180
            while not app.state.done:
                if time.monotonic() > deadline:
                    raise SystemExit("the seed run did not finish in 180 s")
                await pilot.pause(0.05)
            await pilot.pause(0.3)
            await pilot.press("down")  # onto the first finding: its evidence has the tables
            for _ in range(KEY_RUNS):
                for label, keys, answered in key_plan(app):
                    start = time.perf_counter()
                    await pilot.press(*keys)
                    while not answered():
                        await pilot.pause()
                    await pilot.pause()  # the repaint the key caused
                    times.setdefault(label, []).append((time.perf_counter() - start) / len(keys))
            await pilot.press("q")
    return times


def main() -> int:
    ok = True
    if "--keys" not in sys.argv:
        paint, base = first_paint()
        ok &= paint < PAINT_TARGET_S
        print(f"python -c pass                 : {base * 1000:7.1f} ms (median of {PAINT_RUNS})")
        print(f"launch to first paint (seed)   : {paint * 1000:7.1f} ms (median of {PAINT_RUNS}), {paint / base:.1f}x baseline, "
              f"target < {PAINT_TARGET_S * 1000:.0f} ms: {'OK' if paint < PAINT_TARGET_S else 'SLOW'}")  # fmt: skip
    times = asyncio.run(drive_keys())
    base = statistics.median(times["unbound key (baseline)"])
    print(f"\nkey latency on the finished seed run (press to repaint, median and max of {KEY_RUNS}):")
    for label, samples in times.items():
        med, worst = statistics.median(samples), max(samples)
        slow = worst >= KEY_TARGET_S
        ok &= not slow
        print(f"  {label:<24} {med * 1000:7.1f} ms  max {worst * 1000:7.1f} ms  {med / base if base else 0:5.1f}x baseline  {'SLOW' if slow else 'OK'}")
    print(f"\ntarget: every key < {KEY_TARGET_S * 1000:.0f} ms: {'OK' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
