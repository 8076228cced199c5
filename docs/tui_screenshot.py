"""Draw docs/tui.svg: the real TUI at the end of a power-starvation run on the simulated seed box.

    python docs/tui_screenshot.py [--out docs/tui.svg] [--size 120x40]

It runs `runbook run power-starvation --simulate seed-rtx-pro-6000-tp8 --set load_concurrency=2048
--set load_input_len=256` with the app under Textual's pilot (as tests/test_tui_simulated.py drives it), waits
for the summary, selects the first confirmed finding and saves the screen with `App.save_screenshot`.
It takes about as long as that run (two to three minutes).
"""

from __future__ import annotations

import argparse
import os
import asyncio
import time
from pathlib import Path

from gpu_runbook.loader import load
from gpu_runbook.registry import Registry
from gpu_runbook.runner import Runner, resolve_params
from gpu_runbook.session import target_for
from gpu_runbook.tui.app import RunbookApp

REPO = Path(__file__).resolve().parent.parent
SCENARIO = "seed-rtx-pro-6000-tp8"
PARAMS = {"load_concurrency": "2048", "load_input_len": "256"}


async def shoot(out: Path, size: tuple[int, int], tmp: Path) -> None:
    registry = Registry.discover()
    loaded = load(REPO / "runbooks" / "power-starvation.yaml", registry)
    params = resolve_params(loaded, PARAMS)
    with target_for("", None, SCENARIO) as (target, nvml, _host):
        runner = Runner(loaded, registry, target, params, nvml=nvml)
        # relative paths, as a user's run names them (the picture shows them); written under tmp (the cwd)
        app = RunbookApp(runner, "r.json", "reports/power-starvation.md", stable=True)
        async with app.run_test(size=size) as pilot:
            deadline = time.monotonic() + 600
            while not app.state.done:
                if time.monotonic() > deadline:
                    raise SystemExit("the run did not finish in 10 minutes")
                await pilot.pause(0.5)
            app.sync()
            await pilot.pause(0.5)
            app.save_screenshot(filename=out.name, path=str(out.parent))
            await pilot.press("q")
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "tui.svg"))
    ap.add_argument("--size", default="120x40")
    args = ap.parse_args()
    w, h = (int(x) for x in args.size.split("x"))
    import tempfile

    out = Path(args.out).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        asyncio.run(shoot(out, (w, h), Path(tmp)))


if __name__ == "__main__":
    main()
