"""vLLM in the fleet (issue 34 item 3): `runbook fleet` reads vLLM's series as `vllm.metrics` reads a server's, for
every release's name of the KV gauge, and ranks SGLang and vLLM hosts together.

A simulated mixed fleet, each host in its own process with its server's /metrics and a dcgm-exporter, scraped by a
real Prometheus and a real VictoriaMetrics: three idle vLLM hosts whose releases export the KV gauge differently
(0.8.5: only `vllm:gpu_cache_usage_perc`; 0.10.2: both names; 0.34.0: only `vllm:kv_cache_usage_perc`, the old one
hidden from 0.11), an idle SGLang host, and a vLLM 0.8.5 host under traffic at its KV wall.

Acceptance: the idle hosts' server-side verdicts match `runbook run --depth quick --simulate` of the same scenario
with the same `scenario_set` (a quick run drives no load, and a simulated host has no traffic of its own: both sides
read an idle server, so the comparison is like for like), and so do the values those verdicts read. The loaded host
shows the fleet deciding on vLLM's series under load (its preemptions or its full cache, under the old gauge name)
and is ranked first, ahead of the SGLang and vLLM hosts alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from gpu_runbook.cli import main
from gpu_runbook.sim.fleet import HostSpec, fleet_processes, prometheus_config
from gpu_runbook.sim.scenario import scenario_with

from prom_servers import PROMETHEUS, VICTORIA, hold_a_steady_window, prometheus, query, victoria_metrics

WINDOW_S = 12
# host -> (scenario, scenario_set, the KV gauge names its /metrics carries)
IDLE = {
    "vllm-085-box": ("vllm-085-old-kv-name", {}, {"vllm:gpu_cache_usage_perc"}),
    "vllm-0102-box": ("seed-rtx-pro-6000-tp8-vllm", {"server.version": "0.10.2"}, {"vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"}),
    "vllm-034-box": ("healthy-h200-vllm", {}, {"vllm:kv_cache_usage_perc"}),
    "sglang-box": ("healthy-h200-nvlink", {}, set()),
}
WALL = "vllm-wall-box"
SPECS = [HostSpec(name, scenario, dict(changes), concurrency=0) for name, (scenario, changes, _) in IDLE.items()] + [
    # 0.8.5 with an 8,192-token cache (128 blocks of 64): 64 requests of 256 + 32 tokens need ~5 blocks each, so the
    # cache is full and requests wait (and decodes that need a block preempt)
    HostSpec(WALL, "vllm-085-old-kv-name", {"server.max_total_num_tokens": 8192}, concurrency=64, input_len=256),
]
# the hypotheses that read only the server's metrics (low-concurrency's precondition reads the GPUs' utilization)
SERVER_SIDE = ("low-concurrency", "running-requests-capped", "kv-cache-wall")
# what those verdicts read of the metrics
READ = (("running", "p50"), ("running_per_dp", "p50"), ("queued", "p50"), ("kv_usage", "p50"), ("kv_usage", "max"),
        ("retractions",), ("gauges_current",))  # fmt: skip

needs_engines = pytest.mark.skipif(not (PROMETHEUS and VICTORIA), reason="prometheus and victoria-metrics are not installed (.ci/run installs them)")


def quick_run(tmp: Path, host: str) -> dict[str, Any]:
    """`runbook run --depth quick --simulate` of the host's scenario, its scenario_set applied (a scenario file)."""
    scenario, changes, _ = IDLE[host]
    if changes:
        path = tmp / f"{host}.yaml"
        path.write_text(yaml.safe_dump(scenario_with(scenario, changes).model_dump(by_alias=True, mode="json"), sort_keys=False))
        scenario = str(path)
    out = tmp / f"{host}-quick.json"
    rc = main(["run", "power-starvation", "--depth", "quick", "--simulate", scenario, "--json", str(out),
               "--report", str(tmp / f"{host}-quick.md"), "--no-tui", "-q"])  # fmt: skip
    assert rc in (0, 1), rc
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("quick")
    with fleet_processes(SPECS) as members:
        assert {m.name: m.server_kind for m in members} == {**{h: "vllm" for h in IDLE}, "sglang-box": "sglang", WALL: "vllm"}
        config = prometheus_config(members, interval_s=1.0)
        with prometheus(config) as prom, victoria_metrics(config, latency_offset="1s") as vm:
            # the quick runs while the engines fill their window (each its own simulated host, idle)
            quick = {host: quick_run(tmp, host) for host in IDLE}
            hold_a_steady_window({"Prometheus": prom, "VictoriaMetrics": vm}, members, WINDOW_S)
            yield {"prometheus": prom, "victoriametrics": vm, "quick": quick, "config": config}


def fleet(url: str, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "fleet.json"
    rc = main(["fleet", "power-starvation", "--prometheus", url, "--window", f"{WINDOW_S}s", "--json", str(out), "--report", str(tmp_path / "fleet.md")])
    assert rc == 0
    return json.loads(out.read_text())


def by_id(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["id"]: h for h in results["hypotheses"]}


def metrics(results: dict[str, Any]) -> dict[str, Any]:
    """The server metrics' values (the evidence of the hypothesis that asks for them: the root)."""
    return next(e["values"] for h in results["hypotheses"] for e in h["evidence"] if e["alias"] == "metrics")


def metrics_read(results: dict[str, Any]) -> dict[str, Any]:
    """The server metrics at the paths the server-side rules read."""
    out = {}
    for path in READ:
        v: Any = metrics(results)
        for part in path:
            v = v.get(part) if isinstance(v, dict) else None
        out[".".join(path)] = v
    return out


@needs_engines
def test_scrape_config_reads_each_server_by_its_kind(engines: dict[str, Any]) -> None:
    jobs = yaml.safe_load(engines["config"])["scrape_configs"]
    assert [j["job_name"] for j in jobs] == ["dcgm", "sglang", "vllm"]
    assert {c["labels"]["host"] for c in jobs[2]["static_configs"]} == {"vllm-085-box", "vllm-0102-box", "vllm-034-box", WALL}
    # each release exports the KV gauge under its own names, scraped with the host label
    for host, (_, _, names) in IDLE.items():
        found = {r["metric"]["__name__"] for r in query(engines["prometheus"], f'{{__name__=~"vllm:(kv|gpu)_cache_usage_perc",host="{host}"}}')}
        assert found == names, host


@needs_engines
@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_idle_hosts_match_a_quick_run(engines: dict[str, Any], tmp_path: Path, engine: str) -> None:
    data = fleet(engines[engine], tmp_path)
    hosts = {h["host"]: h for h in data["hosts"]}
    for host in IDLE:
        fleet_host, quick = hosts[host], engines["quick"][host]
        assert fleet_host["join"] == "joined", fleet_host
        f_hyps, q_hyps = by_id(fleet_host["results"]), by_id(quick)
        f_verdicts = {h: f_hyps[h]["verdict"] for h in SERVER_SIDE}
        assert f_verdicts == {h: q_hyps[h]["verdict"] for h in SERVER_SIDE}, (host, {h: f_hyps[h]["reason"] for h in SERVER_SIDE})
        # decided from the series, not left undecided for want of them
        assert f_verdicts["kv-cache-wall"] == f_verdicts["running-requests-capped"] == "refuted", (host, f_verdicts)
        assert metrics_read(fleet_host["results"]) == metrics_read(quick), host
        # the values the rules showed: the same, but the cap, which no series holds (a host run reads it)
        assert f_hyps["kv-cache-wall"]["rule_values"] == q_hyps["kv-cache-wall"]["rule_values"], host
        f_capped, q_capped = (dict(h["running-requests-capped"]["rule_values"]) for h in (f_hyps, q_hyps))
        assert f_capped.pop("metrics.running_to_cap_p50") is None
        q_capped.pop("metrics.running_to_cap_p50")
        assert f_capped == q_capped, host
        kind = "sglang" if host == "sglang-box" else "vllm"
        ev = metrics(fleet_host["results"])
        assert ev["server_kind"] == kind and ev["kv_usage"]["max"] == 0.0
        if kind == "vllm":  # the name read: the 0.9.2+ one where the release has it
            names = IDLE[host][2]
            assert ev["kv_usage_series"] == ("vllm:kv_cache_usage_perc" if "vllm:kv_cache_usage_perc" in names else "vllm:gpu_cache_usage_perc")
            assert ev["retractions_source"] == "vllm:num_preemptions_total"
            # the runbook read as vLLM reads it (its `servers.vllm` text), as the quick run does
            assert "--max-num-seqs" in f_hyps["running-requests-capped"]["why"]
        assert f_hyps["running-requests-capped"]["why"] == q_hyps["running-requests-capped"]["why"], host


@needs_engines
@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_a_mixed_fleet_is_ranked_together(engines: dict[str, Any], tmp_path: Path, engine: str) -> None:
    data = fleet(engines[engine], tmp_path)
    ranked = [h["host"] for h in data["hosts"]]
    wall = data["hosts"][0]
    assert ranked[0] == WALL, ranked
    hyps = by_id(wall["results"])
    assert hyps["kv-cache-wall"]["verdict"] == "confirmed", hyps["kv-cache-wall"]["reason"]
    assert "--gpu-memory-utilization" in json.dumps(hyps["kv-cache-wall"]["steps"]), hyps["kv-cache-wall"]["steps"]  # vLLM's step
    ev = metrics(wall["results"])
    assert ev["server_kind"] == "vllm" and ev["kv_usage_series"] == "vllm:gpu_cache_usage_perc"
    assert ev["retractions"] > 0 or (ev["queued"]["p50"] >= 1 and ev["kv_usage"]["max"] >= 0.9), ev
    assert wall["kv_usage_max"] == ev["kv_usage"]["max"]
    assert {h["host"] for h in data["hosts"]} == {*IDLE, WALL}
    assert all(h["rank"] == i for i, h in enumerate(data["hosts"], 1))


# -- without an engine: the queries and the values from given answers ---------------------------------------------


def test_vllm_queries_sum_engines_per_host_and_ask_both_kv_names() -> None:
    from gpu_runbook.probes.prometheus.client import HostKey, Window
    from gpu_runbook.probes.prometheus.server import VLLM, server_queries

    queries = server_queries(Window(900, 1.7e9, 'job="vllm"'), HostKey.parse("host,instance"))
    vllm = {k.removeprefix(VLLM): q for k, q in queries.items() if k.startswith(VLLM)}
    by = "by (host, Host, instance, Instance)"  # the host's labels (either case) and the server's instance: not `engine`
    assert vllm["running_p50"].startswith(f"sum {by} (") and "engine" not in vllm["running_p50"]
    assert vllm["retractions"] == f'sum {by} (increase(vllm:num_preemptions_total{{job="vllm"}}[900s]))'
    # the KV gauge: maxed over engines, the 0.9.2+ name first, the old one for hosts without it
    new, old = vllm["kv_usage_max"].split(" or ")
    assert new.startswith(f"max {by}") and "vllm:kv_cache_usage_perc" in new and "vllm:gpu_cache_usage_perc" in old
    assert all('job="vllm"' in q for q in vllm.values())


def _answers(labels: dict[str, str], **values: float) -> dict[str, list[Any]]:
    from gpu_runbook.probes.prometheus.client import Sample

    return {name: [Sample(labels, v)] for name, v in values.items()}


def test_vllm_values_keep_the_host_probes_contract() -> None:
    from gpu_runbook.probes.prometheus.client import HostKey, Sample, Window
    from gpu_runbook.probes.prometheus.server import PINNED_SOURCE, VLLM, ServerMetricsFleet
    from gpu_runbook.probes.server.values import MetricsValues
    from gpu_runbook.probes.vllm.values import VllmMetricsValues
    from gpu_runbook.values import contract_errors

    key = HostKey.parse("host,instance")
    capped = {"host": "capped", "instance": "10.0.0.2:8000"}
    spread = {f"{c}_{s}": v for c, v in (("running", 64.0), ("queued", 190.0), ("kv_usage", 0.03)) for s in ("mean", "min", "p50", "max", "last")}
    answers = {VLLM + k: a for k, a in _answers(capped, **spread, dp_ranks=1.0, scrapes=15.0, gauge_changes=0.0, queued_changes=3.0,
                                                kv_usage_changes=2.0, retractions=0.0, kv_series_0=1.0, gen_tokens_per_s=800.0,
                                                pin_running_min=64.0, pin_running_max=64.0, pin_queued_min=180.0, pin_kv_max=0.04).items()}  # fmt: skip
    answers[VLLM + "cache_config"] = [Sample(dict(capped, num_gpu_blocks="7742", block_size="64", kv_cache_size_tokens=""), 1.0)]
    sg = {"host": "sg", "instance": "10.0.0.1:30000"}
    answers.update(_answers(sg, **{f"{c}_{s}": 1.0 for c in ("running", "queued", "kv_usage", "used_tokens") for s in ("mean", "min", "p50", "max", "last")}))
    ans, instances = ServerMetricsFleet().fill_servers(answers, key, Window(15, 1.7e9))
    assert instances == {"capped": "10.0.0.2:8000", "sg": "10.0.0.1:30000"}
    v = ans.values["capped"]
    assert contract_errors(VllmMetricsValues, v, complete=True) == []
    assert contract_errors(MetricsValues, ans.values["sg"], complete=True) == []
    assert (v["server_kind"], ans.values["sg"]["server_kind"]) == ("vllm", "sglang")
    assert v["kv_usage_series"] == "vllm:kv_cache_usage_perc" and v["max_total_num_tokens"] == 7742 * 64
    # running pinned at 64 while requests waited and the cache had room: the cap, measured as vllm.metrics measures it
    assert (v["running_cap"], v["running_cap_source"], v["running_to_cap_p50"]) == (64, PINNED_SOURCE, 1.0)
    # gauges written in the window (the queue and the KV usage moved): running's value is as fresh as theirs
    assert v["gauges_current"] is True and v["retractions_source"] == "vllm:num_preemptions_total"
    # not pinned (the cache was full): no cap, said why
    full = {k: a for k, a in answers.items() if k.startswith(VLLM)}
    full[VLLM + "pin_kv_max"] = [Sample(capped, 0.97)]
    v = ServerMetricsFleet().fill_servers(full, key, Window(15, 1.7e9))[0].values["capped"]
    assert v["running_cap"] is None and v["running_to_cap_p50"] is None and "max_num_seqs" in v["unknown"]["running_cap"]
