"""Hosts whose probe answers are alike are walked once (`Fleet._judge`'s reuse): each still gets the results
judging it afresh gives, its own reasons (the `runbook run` command names its own server) and its own copy.

Series go into a real VictoriaMetrics through its import API, as `benchmarks/fleet_scale.py` loads them:
two hosts with the very same values but their own instances, and a third that draws more.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from prom_servers import VICTORIA, query, victoria_metrics, wait_for

pytestmark = pytest.mark.skipif(not VICTORIA, reason="victoria-metrics is not installed (.ci/run installs it)")

GPUS = 2
WINDOW_S = 60
STEP_S = 10


def _lines(host: str, instance_ip: str, draw: float, end_ms: int, extra: str = "") -> list[str]:
    out = []
    for t in range(WINDOW_S // STEP_S + 1):
        ts = end_ms - (WINDOW_S - t * STEP_S) * 1000
        for g in range(GPUS):
            lab = f'gpu="{g}",modelName="NVIDIA H200",Hostname="{host}",job="dcgm",instance="{instance_ip}:9400"{extra}'
            fields = {"DCGM_FI_DEV_POWER_USAGE": draw + t % 3, "DCGM_FI_DEV_GPU_UTIL": 100, "DCGM_FI_DEV_SM_CLOCK": 1800,
                      "DCGM_FI_DEV_MEM_CLOCK": 3201, "DCGM_FI_DEV_GPU_TEMP": 60}  # fmt: skip
            out += [f"{name}{{{lab}}} {value} {ts}" for name, value in fields.items()]
        slab = f'job="sglang",instance="{instance_ip}:30000",Hostname="{host}"{extra}'
        out += [f"sglang:num_running_reqs{{{slab}}} {300 + t % 2} {ts}", f"sglang:num_queue_reqs{{{slab}}} 0 {ts}",
                f"sglang:token_usage{{{slab}}} 0.4 {ts}"]  # fmt: skip
    return out


def _import(url: str, lines: list[str], expr: str, count: int) -> None:
    """Series into VictoriaMetrics, as the benchmark loads them; returns once `expr` finds `count` of them."""
    httpx.post(url + "/api/v1/import/prometheus", content="\n".join(lines) + "\n", timeout=30).raise_for_status()
    httpx.get(url + "/internal/force_flush", timeout=30)
    wait_for(lambda: len(query(url, expr)) == count, 60, "the imported series")


def _run(url: str, loaded: Any, registry: Any, **options: Any) -> Any:
    """One `runbook fleet` over `url` with these FleetOptions, its client closed after."""
    from gpu_runbook.fleet import Fleet, FleetOptions
    from gpu_runbook.probes.prometheus.client import PromClient, PromSource

    client = PromClient(PromSource(url))
    try:
        return Fleet(loaded, registry, client, FleetOptions(window_s=WINDOW_S, **options)).run()
    finally:
        client.close()


def _hypotheses(fleet: Any) -> dict[str, list[dict]]:
    return {h.host: [x.model_dump(exclude={"started_at", "finished_at"}) for x in h.results.hypotheses] for h in fleet.hosts if h.results}


def test_alike_hosts_are_walked_once_and_each_keeps_its_own_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_runbook.fleet import FleetJudge
    from gpu_runbook.loader import load_path_or_name
    from gpu_runbook.probes.prometheus.client import HostKey
    from gpu_runbook.registry import Registry
    from gpu_runbook.runner import Runner

    end = int(time.time()) - 120
    hosts = {"alike-a": ("10.0.0.1", 400.0), "alike-b": ("10.0.0.2", 400.0), "other": ("10.0.0.3", 640.0)}
    walks: list[str] = []
    run = Runner.run

    async def counted(self: Runner) -> Any:
        assert isinstance(self.judge, FleetJudge)  # the fleet's hosts are judged by the fleet's judge
        walks.append(self.target.label)
        return await run(self)

    monkeypatch.setattr(Runner, "run", counted)
    registry = Registry.discover()
    loaded = load_path_or_name("power-starvation", registry)
    with victoria_metrics() as url:
        _import(url, [line for host, (ip, draw) in hosts.items() for line in _lines(host, ip, draw, end * 1000)],
                "last_over_time(sglang:token_usage[5m])", len(hosts))  # fmt: skip
        runs = {}
        for memo in (True, False):
            walks.clear()
            runs[memo] = _run(url, loaded, registry, at=float(end), memo=memo, gpu_key=HostKey.parse("Hostname"), server_key=HostKey.parse("Hostname"))
            assert sorted(h.host for h in runs[memo].hosts) == sorted(hosts)
            assert len(walks) == (2 if memo else 3), walks  # the alike pair walked once with the memo

    assert _hypotheses(runs[True]) == _hypotheses(runs[False])
    by_host = {h.host: h for h in runs[True].hosts}
    a, b = by_host["alike-a"], by_host["alike-b"]
    assert a.results is not b.results and all(x is not y for x, y in zip(a.results.hypotheses, b.results.hypotheses))
    for host, (ip, _) in hosts.items():
        reasons = [x.reason for x in by_host[host].results.hypotheses if "--server-url" in (x.reason or "")]
        assert reasons and all(f"http://{ip}:30000" in r for r in reasons), (host, reasons)
    assert a.results.target["label"] == "fleet: alike-a" and b.results.target["label"] == "fleet: alike-b"


def _comparable(text: str) -> dict:
    """A fleet file but its clocks: what no two runs share."""
    import json  # noqa: PLC0415

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("started_at", "finished_at", "duration_s", "query_s", "judge_s", "wall_s")}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return strip(json.loads(text))


def test_forked_workers_judge_and_write_as_one_process_does() -> None:
    """A fleet split over forked workers (each takes every n-th host; theirs come back as JSON) gives the very
    verdicts, ranks and file one process gives, and the file written a host at a time is pydantic's own text."""
    from gpu_runbook.fleet import report
    from gpu_runbook.loader import load_path_or_name
    from gpu_runbook.probes.prometheus.client import HostKey
    from gpu_runbook.registry import Registry

    end = int(time.time()) - 120
    hosts = {f"h{i}": (f"10.0.1.{i}", draw) for i, draw in enumerate((400.0, 400.0, 640.0, 230.0, 520.0, 610.0, 300.0))}
    registry = Registry.discover()
    loaded = load_path_or_name("power-starvation", registry)
    with victoria_metrics() as url:
        _import(url, [line for host, (ip, draw) in hosts.items() for line in _lines(host, ip, draw, end * 1000)],
                "last_over_time(sglang:token_usage[5m])", len(hosts))  # fmt: skip
        runs = {workers: _run(url, loaded, registry, at=float(end), workers=workers, gpu_key=HostKey.parse("Hostname"),
                              server_key=HostKey.parse("Hostname")) for workers in (1, 3)}  # fmt: skip
    one, split = runs[1], runs[3]
    shipped = [h.host for h in split.hosts if h.results is None and h.has_results]
    assert len(shipped) == len(hosts), shipped  # every host came back from a worker as the file's text
    text = report.to_json(split)
    assert _comparable(text) == _comparable(report.to_json(one))
    assert [(h.host, h.rank, h.confirmed) for h in split.hosts] == [(h.host, h.rank, h.confirmed) for h in one.hosts]
    assert all(h.judged() is not None for h in split.hosts)  # read back from their JSON
    assert _hypotheses(split) == _hypotheses(one)
    assert text == split.model_dump_json(indent=2) and report.to_json(one) == one.model_dump_json(indent=2)


def test_gpu_queries_group_by_the_first_host_label_where_every_series_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where every GPU series carries the host key's first label (`host`), the GPU queries group by it alone (one
    question says so); where one series lacks it, by all of the key's labels. The hosts and their verdicts are
    the same as grouping by all of them."""
    from gpu_runbook.fleet import Fleet, FleetOptions
    from gpu_runbook.fleet import judge
    from gpu_runbook.loader import load_path_or_name
    from gpu_runbook.probes.prometheus.client import PromClient, PromSource, Window
    from gpu_runbook.registry import Registry

    end = int(time.time()) - 120
    registry = Registry.discover()
    loaded = load_path_or_name("power-starvation", registry)
    named = {"a": ("10.0.2.1", 400.0, ',host="a"'), "b": ("10.0.2.2", 640.0, ',host="b"')}
    unnamed = {"c": ("10.0.3.1", 400.0, ',host="c"'), "d": ("10.0.3.2", 640.0, "")}  # d: Hostname and instance only
    with victoria_metrics() as url:
        _import(url, [line for fleet, hosts in (("named", named), ("unnamed", unnamed)) for host, (ip, draw, extra) in hosts.items()
                      for line in _lines(host, ip, draw, end * 1000, f',fleet="{fleet}"{extra}')],
                "last_over_time(DCGM_FI_DEV_GPU_UTIL[5m])", 4 * GPUS)  # fmt: skip
        for fleet, hosts in (("named", named), ("unnamed", unnamed)):
            runs = {}
            for narrowing in (True, False):
                if not narrowing:
                    monkeypatch.setattr(judge, "lacking_first_label", lambda window, key: None)
                client = PromClient(PromSource(url))
                try:
                    f = Fleet(loaded, registry, client, FleetOptions(window_s=WINDOW_S, at=float(end), matchers=f'fleet="{fleet}"'))
                    if narrowing:
                        grouped = f._gpu_grouping(Window(WINDOW_S, float(end), f'fleet="{fleet}"'), float(end))
                        assert grouped.ways == (("host",) if fleet == "named" else ("host", "Hostname", "instance")), (fleet, grouped)
                    runs[narrowing] = f.run()
                finally:
                    client.close()
            monkeypatch.undo()
            joins = {h.host: h.join for h in runs[True].hosts}
            # d's server is named by its instance (the server key is host,instance), so it does not join: as before
            assert joins == ({"a": "joined", "b": "joined"} if fleet == "named" else {"c": "joined", "d": "gpu only", "10.0.3.2": "server only"})
            assert joins == {h.host: h.join for h in runs[False].hosts}
            assert _hypotheses(runs[True]) == _hypotheses(runs[False])


def test_no_lookup_thread_is_left_when_the_workers_fork() -> None:
    """Name lookups run on threads that stay idle after; the fleet ends them before it forks its workers (a fork
    beside a live thread may deadlock the child), and a later lookup still works."""
    import threading

    from gpu_runbook.probes.prometheus.client import PromClient, PromSource

    def lookups() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("runbook-fetch")]

    with victoria_metrics() as url:
        client = PromClient(PromSource(url.replace("127.0.0.1", "localhost")))  # a name: looked up on a thread
        try:
            assert client.flavour()[0] == "victoriametrics" and lookups()
            client.release_threads()
            assert lookups() == []
            assert client.flavour()[0] == "victoriametrics"
        finally:
            client.close()
