"""`runbook fleet` against a real Prometheus and a real VictoriaMetrics, both scraping a simulated fleet.

Six simulated hosts, each in its own process (one GIL per host, as real hosts have their own CPUs) with its
SGLang server and dcgm-exporter on their own 127.0.0.1 ports and its own traffic: the seeds' box (a
20,000-token KV pool at 256 concurrent requests of 160 tokens, so its wall is reached in seconds), a healthy H200 box, an admin-capped H100 box (extended counters, and a second one with the
stock counters), a thermally throttled A100 box, and a box whose dcgm-exporter is down. Prometheus scrapes
every second; VictoriaMetrics too, started with a 1 s `-search.latencyOffset` that `runbook fleet` reads
from its /flags. Nothing is mocked: the verdicts come from PromQL answers of the real engines.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from gpu_runbook.cli import main
from gpu_runbook.sim.fleet import DOWN, STOCK, HostSpec, fleet_processes, prometheus_config

from prom_servers import PROMETHEUS, VICTORIA, hold_a_steady_window, prometheus, victoria_metrics

WINDOW_S = 15
SPECS = [
    # the seeds' box at its wall: prompts of 256 + 32 tokens fill a 40,000-token pool with what they hold from the
    # start, so a 15 s window sees KV usage past 0.93 or a retraction (128 + 32 in 20,000 tokens read a maximum of
    # 0.82-0.98 with an EXTEND pass no shorter than a decode step's fixed part: either side of the rule's 0.9)
    HostSpec("seed-box", "seed-rtx-pro-6000-tp8", {"server.max_total_num_tokens": 40000}, concurrency=256, input_len=256),
    HostSpec("healthy-box", "healthy-h200-nvlink", concurrency=96),
    HostSpec("capped-box", "admin-power-cap", concurrency=96),
    HostSpec("capped-stock-box", "admin-power-cap", concurrency=64, counters=STOCK),
    # 256 long requests: the draw follows 1 - exp(-running / 32), so a starved client's refill dips leave it
    # near its plateau (241 W against the 240 W reference, the underfed line at 204 W); 96 short ones read
    # 198-219 W on a busy 2-core machine, either side of that line
    HostSpec("hot-box", "thermal-slowdown", concurrency=256, output_len=256),
    HostSpec("dark-box", "healthy-rtx-pro-6000-tp2", concurrency=16, counters=DOWN),
]

pytestmark = pytest.mark.skipif(not (PROMETHEUS and VICTORIA), reason="prometheus and victoria-metrics are not installed (.ci/run installs them)")


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Any]]:
    with fleet_processes(SPECS) as members:
        config = prometheus_config(members, interval_s=1.0)
        with prometheus(config) as prom, victoria_metrics(config, latency_offset="1s") as vm:
            live = sum(1 for m in members if m.spec.counters != DOWN)
            hold_a_steady_window({"Prometheus": prom, "VictoriaMetrics": vm}, members, WINDOW_S, live)
            yield {"prometheus": prom, "victoriametrics": vm, "members": members}


def fleet(url: str, tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "fleet.json"
    report = tmp_path / "fleet.md"
    rc = main(["fleet", "power-starvation", "--prometheus", url, "--window", f"{WINDOW_S}s", "--json", str(out), "--report", str(report), *extra])
    assert rc == 0
    data = json.loads(out.read_text())
    data["report_text"] = report.read_text()
    return data


def verdicts(host: dict[str, Any]) -> dict[str, str]:
    return {h["id"]: h["verdict"] for h in host["results"]["hypotheses"]} if host["results"] else {}


def reasons(host: dict[str, Any]) -> dict[str, str]:
    return {h["id"]: h["reason"] for h in host["results"]["hypotheses"]}


def check_acceptance(data: dict[str, Any]) -> None:
    hosts = {h["host"]: h for h in data["hosts"]}
    ranked = [h["host"] for h in data["hosts"]]
    seed = verdicts(hosts["seed-box"])
    assert ranked[0] == "seed-box", ranked
    assert seed["gpus-underfed"] == "confirmed" and seed["kv-cache-wall"] == "confirmed", reasons(hosts["seed-box"])
    capped = verdicts(hosts["capped-box"])
    assert capped["power-limit-capped"] == "confirmed", reasons(hosts["capped-box"])["power-limit-capped"]
    healthy = hosts["healthy-box"]
    assert healthy["worst_severity"] not in ("critical", "warning"), healthy["confirmed"]
    assert verdicts(healthy)["gpus-underfed"] == "refuted"
    hot = verdicts(hosts["hot-box"])
    assert hot["clocks-held-down"] == "confirmed", reasons(hosts["hot-box"])["clocks-held-down"]
    dark = hosts["dark-box"]
    assert dark["join"] == "exporter down", dark
    # its server's series still decide what they can; the GPU side is said to be missing, not guessed
    assert verdicts(dark)["gpus-underfed"] == "inconclusive"
    assert "no dcgm-exporter series" in reasons(dark)["gpus-underfed"]
    assert dark["command"] and dark["server_instance"] in dark["command"]
    # what needs a host run says so, with the command for that host
    assert "needs a host run" in reasons(hosts["seed-box"])["p2p-unavailable"]
    assert hosts["seed-box"]["command"].startswith("runbook run power-starvation --server-url http://127.0.0.1:")
    assert "dark-box" in data["report_text"] and "```mermaid" in data["report_text"]


def test_prometheus_ranks_the_fleet(engines: dict[str, Any], tmp_path: Path) -> None:
    data = fleet(engines["prometheus"], tmp_path)
    assert data["engine"] == "prometheus" and data["latency_offset_s"] == 0.0
    check_acceptance(data)


def test_victoriametrics_gives_the_same_verdicts(engines: dict[str, Any], tmp_path: Path) -> None:
    prom = fleet(engines["prometheus"], tmp_path)
    vm = fleet(engines["victoriametrics"], tmp_path)
    assert vm["engine"] == "victoriametrics" and vm["latency_offset_s"] == 1.0  # read from its /flags
    check_acceptance(vm)
    decided = ("gpus-underfed", "power-limit-capped", "kv-cache-wall", "clocks-held-down", "low-concurrency")
    assert sorted(h["host"] for h in prom["hosts"]) == sorted(h["host"] for h in vm["hosts"])
    by_host = {h["host"]: h for h in vm["hosts"]}
    for p_host in prom["hosts"]:
        pv, vv = verdicts(p_host), verdicts(by_host[p_host["host"]])
        assert {k: pv.get(k) for k in decided} == {k: vv.get(k) for k in decided}, p_host["host"]


def test_stock_counters_name_the_missing_fields(engines: dict[str, Any], tmp_path: Path) -> None:
    data = fleet(engines["prometheus"], tmp_path)
    hosts = {h["host"]: h for h in data["hosts"]}
    stock, extended = hosts["capped-stock-box"], hosts["capped-box"]
    for hyp in ("power-limit-capped", "power-limit-lowered"):
        assert verdicts(stock)[hyp] == "inconclusive"
        reason = reasons(stock)[hyp]
        assert "DCGM_FI_DEV_ENFORCED_POWER_LIMIT" in reason and "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX" in reason, reason
        assert verdicts(extended)[hyp] in ("confirmed", "refuted")  # the --dcgm-counters file's fields decide it
    assert "DCGM_FI_DEV_ENFORCED_POWER_LIMIT" in stock["missing_fields"]
    assert "DCGM_FI_DEV_ENFORCED_POWER_LIMIT" not in extended["missing_fields"]
    # the stock box is still found underfed: its board maximum comes from the GPU table, said in a note
    assert verdicts(stock)["gpus-underfed"] == "confirmed"
    assert any("gpus.yaml" in n for n in stock["notes"])


def test_match_narrows_and_query_count_is_fixed(engines: dict[str, Any], tmp_path: Path) -> None:
    everything = fleet(engines["prometheus"], tmp_path)
    some = fleet(engines["prometheus"], tmp_path, "--match", 'host=~"seed-box|healthy-box"')
    assert sorted(h["host"] for h in some["hosts"]) == ["healthy-box", "seed-box"]
    assert some["queries"] == everything["queries"]  # queries depend on the runbook, not on the hosts


def test_unjoined_hosts_are_listed_not_guessed(engines: dict[str, Any], tmp_path: Path) -> None:
    # name hosts on server series by a label they do not carry: no server joins its GPUs
    data = fleet(engines["prometheus"], tmp_path, "--server-host-label", "instance")
    joins = {h["host"]: h["join"] for h in data["hosts"]}
    assert joins["seed-box"] == "gpu only"
    assert any(j == "server only" for j in joins.values())
    seed = next(h for h in data["hosts"] if h["host"] == "seed-box")
    assert verdicts(seed)["kv-cache-wall"] == "inconclusive"


def test_at_looks_back(engines: dict[str, Any], tmp_path: Path) -> None:
    """--at before any sample: nothing to decide, and the run says so instead of guessing."""
    out = tmp_path / "old.json"
    rc = main(["fleet", "power-starvation", "--prometheus", engines["prometheus"], "--window", "15s", "--at", "2020-01-01T00:00:00Z", "--json", str(out)])
    assert rc == 3
    assert json.loads(out.read_text())["hosts"] == []


def test_the_shared_memo_changes_no_verdict(engines: dict[str, Any]) -> None:
    """Hosts that read the same values are decided once: every field of every hypothesis's result (verdict,
    reason, values shown, headline, steps...) as judging each afresh gives."""
    from gpu_runbook.fleet import Fleet, FleetOptions
    from gpu_runbook.loader import load_path_or_name
    from gpu_runbook.probes.prometheus.client import PromClient, PromSource
    from gpu_runbook.registry import Registry

    registry = Registry.discover()
    loaded = load_path_or_name("power-starvation", registry)
    at = time.time() - 1
    runs = []
    for memo in (True, False):
        client = PromClient(PromSource(engines["prometheus"]))
        runs.append(Fleet(loaded, registry, client, FleetOptions(window_s=WINDOW_S, at=at, memo=memo)).run())
        client.close()
    judged = [{h.host: [x.model_dump(exclude={"started_at", "finished_at"}) for x in h.results.hypotheses]
               for h in r.hosts if h.results} for r in runs]  # fmt: skip
    assert judged[0] == judged[1]


@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_every_answer_is_read_off_its_text_as_json_reads_it(engines: dict[str, Any], engine: str) -> None:
    """Each of the fleet's queries, asked of the real engine: its answer takes the quick reading (vector.read), and
    that gives the very samples the JSON decoder's reading gives."""
    import httpx  # noqa: PLC0415

    from gpu_runbook import json_bounded
    from gpu_runbook.probes.prometheus import vector
    from gpu_runbook.probes.prometheus.client import DEFAULT_GPU_HOST, DEFAULT_SERVER_HOST, HostKey, Sample, Window, samples_of
    from gpu_runbook.probes.prometheus.gpu import gpu_queries
    from gpu_runbook.probes.prometheus.server import server_queries

    window = Window(WINDOW_S, time.time() - 2)
    queries = {**gpu_queries(window, HostKey.parse(DEFAULT_GPU_HOST)), **server_queries(window, HostKey.parse(DEFAULT_SERVER_HOST))}
    seen: dict = {}
    answered = 0
    with httpx.Client(trust_env=False) as client:
        for name, expr in queries.items():
            content = client.post(engines[engine] + "/api/v1/query", data={"query": expr, "time": f"{window.at:.3f}"}, timeout=30).content
            quick = vector.read(content, seen, Sample)
            assert quick is not None, (name, content[:300])
            assert quick == samples_of(json_bounded.loads(content)["data"]["result"]), name
            answered += bool(quick)
    assert answered >= 20  # most of the GPU fields and server gauges had series


def test_engines_say_how_far_behind_now_they_answer() -> None:
    """VictoriaMetrics hides its newest 30 s by default (-search.latencyOffset); Prometheus answers at once."""
    from gpu_runbook.probes.prometheus.client import PromClient, PromSource

    with victoria_metrics() as vm, prometheus("global:\n  scrape_interval: 15s\n") as prom:
        for url, want in ((vm, ("victoriametrics", 30.0)), (prom, ("prometheus", 0.0))):
            client = PromClient(PromSource(url))
            try:
                assert client.flavour() == want
            finally:
                client.close()
