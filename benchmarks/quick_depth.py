#!/usr/bin/env python3
"""How long a quick look takes: `runbook run power-starvation --depth quick --simulate seed-rtx-pro-6000-tp8`
headless, end to end (start-up, the simulated host, 3 s of sampling, verdicts, report), against
`runbook --version` (start-up alone) measured in the same run. Target: under 15 s, with no load driven
(the simulated server's peak of running requests stays 0).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 3
TARGET_S = 15.0
SEED = "seed-rtx-pro-6000-tp8"


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> int:
    runbook = shutil.which("runbook") or str(Path(sys.executable).with_name("runbook"))
    baseline = statistics.median(timed([runbook, "--version"]) for _ in range(RUNS))
    samples, peaks = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(RUNS):
            out = Path(tmp) / f"r{i}.json"
            samples.append(timed([runbook, "run", "power-starvation", "--depth", "quick", "--simulate", SEED, "--no-tui",
                                  "--json", str(out), "--report", str(Path(tmp) / f"r{i}.md")]))  # fmt: skip
            data = json.loads(out.read_text())
            peaks.append(data["target"]["simulator"]["peak_running"])
    quick = statistics.median(samples)
    ok = quick < TARGET_S and not any(peaks)
    print(f"runbook --version            : {baseline * 1000:8.1f} ms (median of {RUNS})")
    print(f"power-starvation --depth quick: {quick * 1000:8.1f} ms (median of {RUNS}), {quick / baseline:.1f}x baseline")
    print(f"peak running requests on the server: {max(peaks)} (0: no load driven)")
    print(f"target < {TARGET_S:.0f} s with no load: {'OK' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
