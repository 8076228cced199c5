#!/usr/bin/env python3
"""How fast `runbook --help` answers, against a bare `python -c pass` measured in the same run.

The CLI imports heavy modules (pydantic models, httpx, cel, textual) only inside the command that
needs them, so `--help` should cost little more than starting Python. Target: under 0.3 s.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time

RUNS = 15


def timed(cmd: list[str]) -> float:
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    runbook = shutil.which("runbook")
    help_cmd = [runbook, "--help"] if runbook else [sys.executable, "-m", "gpu_runbook.cli", "--help"]
    baseline = timed([sys.executable, "-c", "pass"])
    cli = timed(help_cmd)
    print(f"python -c pass      : {baseline * 1000:7.1f} ms (median of {RUNS})")
    print(f"{' '.join(help_cmd[-2:]) if not runbook else 'runbook --help'}      : {cli * 1000:7.1f} ms (median of {RUNS})")
    print(f"ratio to baseline   : {cli / baseline:7.2f}x")
    verdict = "OK" if cli < 0.3 else "SLOW"
    print(f"target < 300 ms     : {verdict}")
    return 0 if cli < 0.3 else 1


if __name__ == "__main__":
    sys.exit(main())
