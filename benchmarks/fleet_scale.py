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
Every host of the main fleets reads its own numbers (issue 34: a fleet of alike hosts is judged once per kind
by the memo, which no real fleet allows); a fleet of alike hosts is the second case. In the same run the largest
distinct fleet is judged again by the interpreter in this one process (`RUNBOOK_CEL=interpreted --workers 1`:
the per-host judge before the compiled evaluator and the workers) and the alike one without the memo: verdicts
and reasons must be identical, and the ratios are printed. The store is let finish merging the import before any
triage is timed. Targets: 1,000 distinct hosts in under 10 s, 10,000 in under 60 s.
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
TARGETS_S = {1000: 10.0, 10000: 60.0}  # issue 34: end to end, distinct hosts


def host_lines(fleet: str, i: int, end_ms: int, distinct: bool = True) -> list[str]:
    """One host's series over the window: its GPUs' DCGM fields and its server's gauges. `distinct`: every host
    reads its own numbers, as on a real fleet (power draw, KV usage and the token rate differ by under 0.1 % from
    host to host), so no two hosts' evidence is alike; else hosts of a state differ only by a 5-step jitter."""
    state = "seed" if i % 10 == 0 else "capped" if i % 20 == 5 else "healthy"
    model = "NVIDIA RTX PRO 6000 Blackwell Server Edition" if state == "seed" else "NVIDIA H200"
    board = 600.0 if state == "seed" else 700.0
    enforced = 350.0 if state == "capped" else board
    draw = {"seed": 235.0, "capped": 345.0, "healthy": 640.0}[state]
    host = f"{fleet}-host-{i:04d}"
    out: list[str] = []
    for t in range(WINDOW_S // STEP_S + 1):
        ts = end_ms - (WINDOW_S - t * STEP_S) * 1000
        # this host's own offsets, each well above the fleet's rounding (draw to 0.001 W, fractions to 6 places) and
        # together unique up to 50,000 hosts: 0-0.199 W of draw, 0-0.1 % of KV usage, 0-0.08 % of the token rate
        draw_own, usage_own = ((i % 200) * 0.001, ((i // 200) % 250) * 4e-6) if distinct else (0.0, 0.0)
        jitter = (i * 7 + t * 13) % 5
        for g in range(GPUS):
            lab = f'gpu="{g}",UUID="GPU-{i:04d}-{g}",modelName="{model}",Hostname="{host}",host="{host}",fleet="{fleet}",job="dcgm",instance="10.{i // 250}.{i % 250}.1:9400"'
            fields = {
                "DCGM_FI_DEV_POWER_USAGE": draw + jitter + draw_own + g * 0.01, "DCGM_FI_DEV_GPU_UTIL": 100, "DCGM_FI_DEV_SM_CLOCK": 1800,
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
                f"sglang:token_usage{{{slab}}} {usage * (1 - usage_own)} {ts}", f"sglang:generation_tokens_total{{{slab}}} {t * (50000 + (i % 40 if distinct else 0))} {ts}"]  # fmt: skip
    return out


def load(url: str, fleet: str, hosts: int, end_ms: int, distinct: bool = True) -> int:
    lines = 0
    chunk: list[str] = []
    for i in range(hosts):
        chunk += host_lines(fleet, i, end_ms, distinct)
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


def wait_settled(url: str) -> None:
    """Until the store runs no merge and holds no pending row, three polls in a row."""
    quiet = 0

    def settled() -> bool:
        nonlocal quiet
        text = httpx.get(url + "/metrics", timeout=10).text
        busy = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(("vm_active_merges", "vm_pending_rows")))
        quiet = 0 if busy else quiet + 1
        return quiet >= 3

    wait_for(settled, 600, "VictoriaMetrics to finish merging the import", interval_s=1.0)


def triage(url: str, fleet: str, at: float, out: Path, profile: str | None = None, *extra: str, cel: str = "") -> dict:
    cmd = [sys.executable, "-c", CHILD, "fleet", "power-starvation", "--prometheus", url, "--window", f"{WINDOW_S}s",
           "--at", f"{at:.3f}", "--match", f'fleet="{fleet}"', "--json", str(out), *extra]  # fmt: skip
    start = time.perf_counter()
    env = {**os.environ, **({"BENCH_PROFILE": profile} if profile else {}), **({"RUNBOOK_CEL": cel} if cel else {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - start
    line = next((ln for ln in proc.stderr.splitlines() if ln.startswith("BENCH ")), None)
    if proc.returncode not in (0,) or line is None:
        raise SystemExit(f"runbook fleet failed ({proc.returncode}): {proc.stderr[-2000:]}")
    _, rc, inner, rss_kb = line.split()
    if rc != "0":
        raise SystemExit(f"runbook fleet exited {rc}: {proc.stderr[-2000:]}")
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
    ap.add_argument("--sizes", default="100,1000", help="fleet sizes, small first (default: %(default)s; quicker: 30,300; at scale: 1000,10000)")
    ap.add_argument("--profile", metavar="PATH", help="cProfile the largest fleet's triage into PATH (pstats); its time then counts the profiler")
    ap.add_argument("--keep", metavar="DIR", help="write each fleet's JSON into DIR (to compare verdicts across versions)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the in-run baselines (the largest fleet judged by the interpreter, the alike fleet without the memo)")
    args = ap.parse_args(argv)
    sizes = tuple(int(x) for x in args.sizes.split(","))
    n = sizes[-1]
    if not VICTORIA:
        print("victoria-metrics is not installed (apt-get install victoria-metrics)")
        return 2
    end = int(time.time()) - 120
    fleets = [(f"f{m}", m, True) for m in sizes] + [(f"a{n}", n, False)]
    with victoria_metrics() as url, tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        samples = sum(load(url, name, m, end * 1000, distinct) for name, m, distinct in fleets)
        httpx.get(url + "/internal/force_flush", timeout=60)
        for name, m, _ in fleets:
            wait_for(lambda name=name, m=m: (r := query(url, f'count(last_over_time(DCGM_FI_DEV_POWER_USAGE{{fleet="{name}"}}[5m]))')) != [] and int(float(r[0]["value"][1])) == m * GPUS,
                     300, f"{m} hosts' series to be searchable")  # fmt: skip
        print(f"imported {samples:,} samples ({sum(m for _, m, _ in fleets):,} hosts x {GPUS} GPUs) in {time.perf_counter() - t0:.1f} s")
        # the store merges what it took in for a while after: time the triage against a store at rest, as a fleet's is
        wait_settled(url)
        out = Path(args.keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        runs = {m: triage(url, name, float(end), out / f"{name}.json", args.profile if m == n else None) for name, m, _ in fleets[:-1]}
        alike = triage(url, f"a{n}", float(end), out / f"a{n}.json")
        base = base_alike = None
        if not args.no_baseline:
            base = triage(url, f"f{n}", float(end), out / f"f{n}-interpreted.json", None, "--workers", "1", cel="interpreted")
            base_alike = triage(url, f"a{n}", float(end), out / f"a{n}-no-memo.json", None, "--no-memo")
        same = base is None or verdicts(out / f"f{n}.json") == verdicts(out / f"f{n}-interpreted.json")
        same_alike = base_alike is None or verdicts(out / f"a{n}.json") == verdicts(out / f"a{n}-no-memo.json")
    print(f"{'fleet':>18} {'hosts':>6} {'queries':>8} {'seconds':>8} {'(query':>7} {'judge)':>7} {'ms/host':>8} {'peak MiB':>9} {'underfed':>9}")

    def row(label: str, r: dict) -> None:
        print(f"{label:>18} {r['hosts']:>6} {r['queries']:>8} {r['seconds']:>8.2f} {r['query_s']:>7.2f} {r['judge_s']:>7.2f} "
              f"{1000 * r['judge_s'] / max(r['hosts'], 1):>8.2f} {r['peak_mib']:>9.0f} {r['underfed']:>9}")  # fmt: skip

    for m, r in runs.items():
        row("distinct", r)
    row("alike", alike)
    small, big = runs[sizes[0]], runs[n]
    if len(sizes) > 1:
        print(f"growth {sizes[0]:,} -> {n:,} distinct hosts: queries x{big['queries'] / small['queries']:.2f}, seconds x{big['seconds'] / small['seconds']:.2f}, "
              f"peak memory x{big['peak_mib'] / small['peak_mib']:.2f}")  # fmt: skip
    if base is not None and base_alike is not None:
        row("distinct, interp.", base)
        row("alike, no memo", base_alike)
        print(f"same run, {n:,} distinct hosts: judging takes x{big['judge_s'] / base['judge_s']:.2f} the time of the interpreter in one "
              f"process (RUNBOOK_CEL=interpreted --workers 1), {1000 * big['judge_s'] / n:.2f} ms a host against {1000 * base['judge_s'] / n:.2f}; "
              f"whole run x{big['seconds'] / base['seconds']:.2f}; verdicts and reasons identical: {same}")  # fmt: skip
        print(f"same run, {n:,} alike hosts: judging once per distinct input takes x{alike['judge_s'] / base_alike['judge_s']:.2f} the time of "
              f"judging every host afresh; verdicts and reasons identical: {same_alike}")  # fmt: skip
    timed = all(r["seconds"] < TARGETS_S.get(m, float("inf")) and r["hosts"] == m for m, r in runs.items())
    ok = same and same_alike and big["queries"] == small["queries"] and timed
    print(("OK" if ok else "MISSED") + f": query count independent of hosts: {big['queries'] == small['queries']}; "
          + "; ".join(f"{m:,} distinct hosts in {r['seconds']:.2f} s" + (f" (target < {TARGETS_S[m]:g} s)" if m in TARGETS_S else "")
                      for m, r in runs.items()))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("NO_COLOR", "1")
    sys.exit(main())
