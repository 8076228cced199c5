#!/usr/bin/env python3
"""How long refusing a hostile document takes, against loading the largest bundled runbook (27 KB,
power-starvation) measured in the same run.

Issue 15: alias bombs took 30 s and 2 GB, deep nesting crashed, a 10 MB runbook loaded for 30 s.
Each limit in engine/yamlpos.py stops the work at the node that crosses it, so a refusal should cost
no more than a few loads of a real runbook. Target: every case within 10x the baseline (and the
absolute time is printed: "well under a second" on an idle machine).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpu_runbook.loader import LoadError, load  # noqa: E402
from gpu_runbook.registry import Registry  # noqa: E402

RUNS = 5
TARGET_RATIO = 10.0


def timed(path: Path, registry: Registry) -> float:
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        try:
            load(path, registry)
        except LoadError:
            pass
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def generated(tmp: Path) -> dict[str, Path]:
    """The cases too big to keep in tests/broken/."""
    big = tmp / "150k-hypotheses.yaml"
    with big.open("w") as f:
        f.write("name: big\ntitle: t\nhypotheses:\n")
        for i in range(150_000):
            f.write(f'  - id: h{i}\n    title: Hypothesis {i}\n    confirm: "true"\n')
    under = tmp / "just-under-the-size-limit.yaml"
    with under.open("w") as f:
        f.write("name: many\ntitle: t\nhypotheses:\n")
        i = 0
        while f.tell() < 500 * 1024:
            f.write(f'  - id: h{i}\n    title: Hypothesis {i}\n    confirm: "true"\n')
            i += 1
    return {"10 MB, 150k hypotheses": big, "500 KB of hypotheses (node limit)": under}


def main() -> int:
    registry = Registry.discover([REPO / "tests" / "probe_files"])
    baseline = timed(REPO / "runbooks" / "power-starvation.yaml", registry)
    print(f"{'load power-starvation.yaml (baseline)':<44}: {baseline * 1000:8.1f} ms (median of {RUNS})")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        cases = {p.name: p for p in sorted((REPO / "tests" / "broken").glob("*.yaml"))}
        cases.update(generated(Path(tmp)))
        for name, path in cases.items():
            t = timed(path, registry)
            worst = max(worst, t / baseline)
            print(f"{name:<44}: {t * 1000:8.1f} ms  {t / baseline:6.2f}x")
    verdict = "OK" if worst <= TARGET_RATIO else "SLOW"
    print(f"worst ratio to baseline: {worst:.2f}x (target <= {TARGET_RATIO:g}x): {verdict}")
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    sys.exit(main())
