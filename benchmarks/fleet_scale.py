#!/usr/bin/env python3
"""How `runbook fleet` scales: 100 and 1,000 hosts x 8 GPUs imported into a real VictoriaMetrics.

Series shaped as dcgm-exporter (the fields `runbook fleet --dcgm-counters` enables) and SGLang's scheduler
gauges write them, a sample every 10 s over the window, go in through VictoriaMetrics' import API
(`/api/v1/import/prometheus`, Prometheus text with timestamps), each fleet under its own `fleet` label.
Then `runbook fleet power-starvation --match fleet="..."` runs end to end as a user runs it (a fresh
process, `--at` the window's end), and the benchmark prints the queries it issued, seconds and peak memory
for each size, and their growth from 100 to 1,000 hosts. Targets (issue 24): the query count independent
of the host count, 1,000 hosts triaged in under 10 s.

Host states: one in ten underfed at a KV wall (the seeds' box), one in twenty admin-capped, the rest healthy.
Needs `victoria-metrics` on PATH (Debian package; `.ci/run` installs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from prom_servers import VICTORIA, query, victoria_metrics, wait_for  # noqa: E402

GPUS = 8
WINDOW_S = 60
STEP_S = 10
TARGET_S = 10.0


def host_lines(fleet: str, i: int, end_ms: int) -> list[str]:
    """One host's series over the window: its GPUs' DCGM fields and its server's gauges."""
    state = "seed" if i % 10 == 0 else "capped" if i % 20 == 5 else "healthy"
    model = "NVIDIA RTX PRO 6000 Blackwell Server Edition" if state == "seed" else "NVIDIA H200"
    board = 600.0 if state == "seed" else 700.0
    enforced = 350.0 if state == "capped" else board
    draw = {"seed": 235.0, "capped": 345.0, "healthy": 640.0}[state]
    host = f"{fleet}-host-{i:04d}"
    out: list[str] = []
    for t in range(WINDOW_S // STEP_S + 1):
        ts = end_ms - (WINDOW_S - t * STEP_S) * 1000
        jitter = (i * 7 + t * 13) % 5
        for g in range(GPUS):
            lab = f'gpu="{g}",UUID="GPU-{i:04d}-{g}",modelName="{model}",Hostname="{host}",host="{host}",fleet="{fleet}",job="dcgm",instance="10.{i // 250}.{i % 250}.1:9400"'
            fields = {
                "DCGM_FI_DEV_POWER_USAGE": draw + jitter, "DCGM_FI_DEV_GPU_UTIL": 100, "DCGM_FI_DEV_SM_CLOCK": 1800,
                "DCGM_FI_DEV_MEM_CLOCK": 3201 if state != "seed" else 13365, "DCGM_FI_DEV_MAX_SM_CLOCK": 1980,
                "DCGM_FI_DEV_MAX_MEM_CLOCK": 3201 if state != "seed" else 13365, "DCGM_FI_DEV_GPU_TEMP": 60,
                "DCGM_FI_DEV_POWER_MGMT_LIMIT": enforced, "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": board,
                "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": enforced,
                "DCGM_FI_DEV_POWER_VIOLATION": (t * STEP_S * 1e9 if state == "capped" else 0),
                "DCGM_FI_DEV_THERMAL_VIOLATION": 0, "DCGM_FI_PROF_PCIE_TX_BYTES": 1e8, "DCGM_FI_PROF_PCIE_RX_BYTES": 1e8,
            }  # fmt: skip
            out += [f"{name}{{{lab}}} {value} {ts}" for name, value in fields.items()]
        slab = f'model_name="m",host="{host}",fleet="{fleet}",job="sglang",instance="10.{i // 250}.{i % 250}.1:30000"'
        running, queued, usage = (1900, 140, 0.97) if state == "seed" else (300, 0, 0.4)
        out += [f"sglang:num_running_reqs{{{slab}}} {running + jitter} {ts}", f"sglang:num_queue_reqs{{{slab}}} {queued} {ts}",
                f"sglang:token_usage{{{slab}}} {usage} {ts}", f"sglang:generation_tokens_total{{{slab}}} {t * 50000} {ts}"]  # fmt: skip
    return out


def load(url: str, fleet: str, hosts: int, end_ms: int) -> int:
    lines = 0
    chunk: list[str] = []
    for i in range(hosts):
        chunk += host_lines(fleet, i, end_ms)
        if len(chunk) > 200_000 or i == hosts - 1:
            resp = httpx.post(url + "/api/v1/import/prometheus", content="\n".join(chunk) + "\n", timeout=120)
            resp.raise_for_status()
            lines += len(chunk)
            chunk = []
    return lines


CHILD = """
import os, resource, sys, time
from gpu_runbook.cli import main
t = time.perf_counter()
if os.environ.get("BENCH_PROFILE"):
    import cProfile
    prof = cProfile.Profile()
    rc = prof.runcall(main, sys.argv[1:])
    prof.dump_stats(os.environ["BENCH_PROFILE"])
else:
    rc = main(sys.argv[1:])
sys.stderr.write("BENCH %d %.3f %d\\n" % (rc, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
"""


def triage(url: str, fleet: str, at: float, out: Path, profile: str | None = None, *extra: str) -> dict:
    cmd = [sys.executable, "-c", CHILD, "fleet", "power-starvation", "--prometheus", url, "--window", f"{WINDOW_S}s",
           "--at", f"{at:.3f}", "--match", f'fleet="{fleet}"', "--json", str(out), *extra]  # fmt: skip
    start = time.perf_counter()
    env = {**os.environ, **({"BENCH_PROFILE": profile} if profile else {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - start
    line = next((ln for ln in proc.stderr.splitlines() if ln.startswith("BENCH ")), None)
    if proc.returncode not in (0,) or line is None:
        raise SystemExit(f"runbook fleet failed ({proc.returncode}): {proc.stderr[-2000:]}")
    _, rc, inner, rss_kb = line.split()
    data = json.loads(out.read_text())
    return {"hosts": len(data["hosts"]), "queries": data["queries"], "seconds": wall, "in_process_s": float(inner),
            "query_s": data["query_s"], "judge_s": data["judge_s"],
            "peak_mib": int(rss_kb) / 1024, "underfed": sum(1 for h in data["hosts"] if "gpus-underfed" in h["confirmed"])}  # fmt: skip


def verdicts(path: Path) -> dict:
    """Every host's hypothesis results (verdict, reason, values shown, headline, steps...) but their timestamps:
    what the memo must not change."""
    data = json.loads(path.read_text())
    return {h["host"]: [{k: v for k, v in x.items() if k not in ("started_at", "finished_at")} for x in h["results"]["hypotheses"]]
            for h in data["hosts"] if h.get("results")}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    import argparse  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,1000", help="fleet sizes, small first (default: %(default)s; quicker: 30,300)")
    ap.add_argument("--profile", metavar="PATH", help="cProfile the largest fleet's triage into PATH (pstats); its time then counts the profiler")
    ap.add_argument("--keep", metavar="DIR", help="write each fleet's JSON into DIR (to compare verdicts across versions)")
    ap.add_argument("--no-baseline", action="store_true", help="skip judging the largest fleet again with --no-memo (the in-run baseline)")
    args = ap.parse_args(argv)
    sizes = tuple(int(x) for x in args.sizes.split(","))
    if not VICTORIA:
        print("victoria-metrics is not installed (apt-get install victoria-metrics)")
        return 2
    end = int(time.time()) - 120
    with victoria_metrics() as url, tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        samples = sum(load(url, f"f{n}", n, end * 1000) for n in sizes)
        httpx.get(url + "/internal/force_flush", timeout=60)
        for n in sizes:
            wait_for(lambda n=n: (r := query(url, f'count(last_over_time(DCGM_FI_DEV_POWER_USAGE{{fleet="f{n}"}}[5m]))')) != [] and int(float(r[0]["value"][1])) == n * GPUS,
                     120, f"{n} hosts' series to be searchable")  # fmt: skip
        print(f"imported {samples:,} samples ({sum(sizes):,} hosts x {GPUS} GPUs) in {time.perf_counter() - t0:.1f} s")
        out = Path(args.keep or tmp)
        runs = {n: triage(url, f"f{n}", float(end), out / f"f{n}.json", args.profile if n == sizes[-1] else None) for n in sizes}
        n = sizes[-1]
        base = None if args.no_baseline else triage(url, f"f{n}", float(end), out / f"f{n}-no-memo.json", None, "--no-memo")
        same = base is None or verdicts(out / f"f{n}.json") == verdicts(out / f"f{n}-no-memo.json")
    print(f"{'hosts':>6} {'queries':>8} {'seconds':>8} {'(query':>7} {'judge)':>7} {'peak MiB':>9} {'underfed':>9}")
    for n, r in runs.items():
        print(f"{r['hosts']:>6} {r['queries']:>8} {r['seconds']:>8.2f} {r['query_s']:>7.2f} {r['judge_s']:>7.2f} {r['peak_mib']:>9.0f} {r['underfed']:>9}")
    small, big = runs[sizes[0]], runs[sizes[-1]]
    print(f"growth {sizes[0]:,} -> {sizes[-1]:,} hosts: queries x{big['queries'] / small['queries']:.2f}, seconds x{big['seconds'] / small['seconds']:.2f}, "
          f"peak memory x{big['peak_mib'] / small['peak_mib']:.2f}")  # fmt: skip
    if base is not None:
        print(f"{base['hosts']:>6} {base['queries']:>8} {base['seconds']:>8.2f} {base['query_s']:>7.2f} {base['judge_s']:>7.2f} {base['peak_mib']:>9.0f} {base['underfed']:>9}  (--no-memo: every host judged afresh)")
        print(f"same run, {n:,} hosts: judging once per distinct input takes x{big['judge_s'] / base['judge_s']:.2f} the time of judging "
              f"every host afresh; whole run x{big['seconds'] / base['seconds']:.2f}; verdicts and reasons identical: {same}")  # fmt: skip
    target = TARGET_S * sizes[-1] / 1000
    ok = same and big["queries"] == small["queries"] and big["seconds"] < target and big["hosts"] == sizes[-1]
    print(("OK" if ok else "MISSED") + f": query count independent of hosts: {big['queries'] == small['queries']}; "
          f"{sizes[-1]:,} hosts in {big['seconds']:.2f} s (target < {target:g} s)")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("NO_COLOR", "1")
    sys.exit(main())
