#!/usr/bin/env python3
"""How fast `runbook diff` (two seed-run results) and `runbook rejudge` (one) answer, against
`runbook report` on the same file, measured in the same run. Target: under 1 s each.

The two results come from the README's main command (the seed box, 2048 concurrent requests, the
default windows) unless --before/--after name existing files. Each command runs as a user runs it
(a fresh process), RUNS times; the median counts. `report` reads the same JSON and renders the same
kind of Markdown without loading the runbook, so the ratio shows what re-judging and diffing add.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 5
TARGET_S = 1.0


def runbook_cmd() -> list[str]:
    exe = shutil.which("runbook")
    return [exe] if exe else [sys.executable, "-m", "gpu_runbook.cli"]


def timed(cmd: list[str], cwd: Path) -> float:
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def seed_run(cmd: list[str], out: Path, cwd: Path) -> Path:
    subprocess.run(
        cmd + ["run", "power-starvation", "--simulate", "seed-rtx-pro-6000-tp8", "--set", "load_concurrency=2048", "--no-tui",
               "--json", str(out), "--report", str(out.with_suffix(".md"))],
        cwd=cwd, stdout=subprocess.DEVNULL, check=True,
    )  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="an existing results file (default: make one with the seed run)")
    parser.add_argument("--after", type=Path, help="a second results file (default: make one with the seed run)")
    args = parser.parse_args()
    cmd = runbook_cmd()
    with tempfile.TemporaryDirectory(prefix="bench-rejudge-") as tmp:
        work = Path(tmp)
        before = args.before.resolve() if args.before else seed_run(cmd, work / "before.json", work)
        after = args.after.resolve() if args.after else seed_run(cmd, work / "after.json", work)
        size_mb = before.stat().st_size / 1e6
        report = timed(cmd + ["report", str(before), "--out", str(work / "r.md")], work)
        rejudge = timed(cmd + ["rejudge", str(before), "--json", str(work / "j.json"), "--report", str(work / "j.md")], work)
        diff = timed(cmd + ["diff", str(before), str(after), "--out", str(work / "d.md")], work)
    print(f"results file        : {size_mb:7.2f} MB ({before.name})")
    print(f"runbook report      : {report * 1000:7.1f} ms (median of {RUNS})")
    print(f"runbook rejudge     : {rejudge * 1000:7.1f} ms ({rejudge / report:.2f}x report)")
    print(f"runbook diff        : {diff * 1000:7.1f} ms ({diff / report:.2f}x report)")
    ok = rejudge < TARGET_S and diff < TARGET_S
    print(f"target < {TARGET_S:g} s each  : {'OK' if ok else 'SLOW'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
