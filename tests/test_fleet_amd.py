"""AMD hosts in the fleet (issue 37 item 5, acceptance 4): `runbook fleet` reads the AMD Device Metrics Exporter's
series beside dcgm-exporter's and ranks NVIDIA and AMD hosts together.

A simulated fleet, each host in its own process with its server's /metrics and its GPU exporter, scraped by a real
Prometheus and a real VictoriaMetrics: an NVIDIA host (the healthy H200 box, dcgm-exporter with the extended
counters) and three AMD hosts (the MI300X scenarios) exporting what the AMD exporter v1.5.1 exports
(`gpu_package_power`, `gpu_gfx_activity`, `gpu_clock{clock_type}`... with `gpu_id`, `serial_number`,
`gpu_partition_id`, `card_model`, `hostname`): the healthy 8x MI300X SGLang box drawing little under load, the same
box with its power cap lowered to 500 W (a host run confirms `power-limit-capped` from amdsmi), and the single
MI300X in CPX on vLLM (listed as 8 partitions, only partition 0 reporting power and activity).

Acceptance: the AMD hosts read their own values (the draw, activity and clocks their series hold, summed over
partitions per physical GPU), the power-limit hypotheses on them are inconclusive because the exporter sends no power
cap (said so: never a verdict, not even on the capped box), the underfed AMD host is ranked first, and the NVIDIA
host's verdicts are the same as in a fleet run that sees no AMD series at all.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from gpu_runbook.cli import main
from gpu_runbook.probes.prometheus import amd
from gpu_runbook.probes.prometheus.client import HostKey, Sample, Window
from gpu_runbook.probes.prometheus.gpu import GpuReferenceFleet, GpuRows, GpuSampleFleet, gpu_queries
from gpu_runbook.sim.amd_exporter import render
from gpu_runbook.sim.fleet import AMD_JOB, DOWN, HostSpec, fleet_processes, prometheus_config

from prom_servers import PROMETHEUS, VICTORIA, hold_a_steady_window, prometheus, query, victoria_metrics, wait_for

WINDOW_S = 12
UNDERFED, CAPPED, HOT, CPX, NVIDIA = "mi300x-underfed", "mi300x-capped", "mi300x-hot", "mi300x-cpx", "h200-box"
DOWN_HOST = "mi300x-exporter-down"
# at 64 requests (batch_scale 40: 80 % of the way from idle to loaded) against the estimate's 0.85 x 450 W = 382 W
# (0.6 x the 750 W board: AMD publishes no memory-bound draw)
SPECS = [
    # asks for 260 W: ~235 W, far under the yardstick
    HostSpec(UNDERFED, "healthy-mi300x-sglang", {"gpu.power.loaded_w": 260}, concurrency=64),
    # held at its 500 W cap: ~490 W, above the yardstick
    HostSpec(CAPPED, "mi300x-power-cap", {}, concurrency=64),
    # thermally throttled (its clock held at 60 % of the peak): ~400 W, near it (no underfed verdict is asserted)
    HostSpec(HOT, "mi300x-thermal-throttle", {}, concurrency=64),
    # one GPU in CPX: ~540 W, above it
    HostSpec(CPX, "mi300x-cpx-vllm", {}, concurrency=64),
    HostSpec(NVIDIA, "healthy-h200-nvlink", {}, concurrency=32),
    # an AMD host whose exporter is down: its scrape fails, and the host says so
    HostSpec(DOWN_HOST, "healthy-mi300x-sglang", {}, concurrency=0, counters=DOWN),
]
AMD_HOSTS = {UNDERFED: 8, CAPPED: 8, HOT: 8, CPX: 1}  # host -> its physical GPUs
POWER_LIMIT = ("power-limit-capped", "power-limit-lowered")
# an AMD host's reasons and notes: never the other vendor's tools (the probe `gpu.dcgm` is named by its id)
NVIDIA_WORDS = re.compile(r"DCGM|dcgm-exporter|nvidia-smi|NVML")

needs_engines = pytest.mark.skipif(not (PROMETHEUS and VICTORIA), reason="prometheus and victoria-metrics are not installed (.ci/run installs them)")


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Any]]:
    with fleet_processes(SPECS) as members:
        assert {m.name: m.gpu_exporter for m in members} == {**{h: "amd" for h in AMD_HOSTS}, NVIDIA: "dcgm", DOWN_HOST: "amd"}
        config = prometheus_config(members, interval_s=1.0)
        with prometheus(config) as prom, victoria_metrics(config, latency_offset="1s") as vm:
            both = {"Prometheus": prom, "VictoriaMetrics": vm}
            hold_a_steady_window(both, members, WINDOW_S, live=1)  # the NVIDIA host's dcgm-exporter

            def amd_filled(url: str) -> bool:  # and a whole window of each AMD host's GPU 0
                rows = query(url, f'count_over_time(gpu_package_power{{gpu_id="0"}}[{WINDOW_S}s]) >= {WINDOW_S - 3}')
                return len(rows) == len(AMD_HOSTS)

            for name, url in both.items():
                wait_for(lambda url=url: amd_filled(url), 120, f"{name} to hold a window of the AMD hosts")
            yield {"prometheus": prom, "victoriametrics": vm, "config": config}


def fleet(url: str, tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "fleet.json"
    rc = main(["fleet", "power-starvation", "--prometheus", url, "--window", f"{WINDOW_S}s", "--json", str(out),
               "--report", str(tmp_path / "fleet.md"), *extra])  # fmt: skip
    assert rc == 0
    return json.loads(out.read_text())


def by_id(host: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["id"]: h for h in host["results"]["hypotheses"]}


def evidence(host: dict[str, Any], alias: str) -> dict[str, Any]:
    return next(e["values"] for h in host["results"]["hypotheses"] for e in h["evidence"] if e["alias"] == alias)


def series_mean(url: str, expr: str, at: float) -> float:
    """One number from the engine at the fleet run's `at`: what the fleet's own queries saw."""
    body = httpx.post(url + "/api/v1/query", data={"query": expr, "time": f"{at:.3f}"}, timeout=10.0).json()
    rows = body["data"]["result"]
    assert len(rows) == 1, (expr, rows)
    return float(rows[0]["value"][1])


@needs_engines
def test_scrape_config_reads_each_exporter_in_its_job(engines: dict[str, Any]) -> None:
    jobs = {j["job_name"]: j for j in yaml.safe_load(engines["config"])["scrape_configs"]}
    assert {c["labels"]["host"] for c in jobs[AMD_JOB]["static_configs"]} == {*AMD_HOSTS, DOWN_HOST}
    assert {c["labels"]["host"] for c in jobs["dcgm"]["static_configs"]} == {NVIDIA}
    # the CPX host lists its one GPU as 8 partitions, sharing the GPU's serial number; only partition 0 draws
    parts = query(engines["prometheus"], f'gpu_package_power{{host="{CPX}"}}')
    assert len(parts) == 8 and len({p["metric"]["serial_number"] for p in parts}) == 1
    assert {(p["metric"]["gpu_compute_partition_type"], p["metric"]["gpu_memory_partition_type"]) for p in parts} == {("cpx", "nps4")}
    assert all(float(p["value"][1]) == 0 for p in parts if p["metric"]["gpu_partition_id"] != "0")


@needs_engines
@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_amd_and_nvidia_hosts_are_ranked_together(engines: dict[str, Any], tmp_path: Path, engine: str) -> None:
    url = engines[engine]
    data = fleet(url, tmp_path)
    hosts = {h["host"]: h for h in data["hosts"]}
    assert [h["host"] for h in data["hosts"]][0] == UNDERFED, [(h["host"], h["confirmed"]) for h in data["hosts"]]
    assert all(hosts[h]["join"] == "joined" for h in (*AMD_HOSTS, NVIDIA))
    assert hosts[DOWN_HOST]["join"] == "exporter down" and "GPU exporter target" in hosts[DOWN_HOST]["join_detail"]
    assert by_id(hosts[UNDERFED])["gpus-underfed"]["verdict"] == "confirmed"
    # (the thermal host draws close to the yardstick, ~400 W against 382 W: its underfed verdict is left alone)
    assert {h: by_id(hosts[h])["gpus-underfed"]["verdict"] for h in (CAPPED, CPX)} == dict.fromkeys((CAPPED, CPX), "refuted")
    for name, count in AMD_HOSTS.items():
        h = hosts[name]
        power, ref = evidence(h, "power"), evidence(h, "ref")
        # their own values: the physical GPUs, the model their exporter names, the draw their series hold
        assert (h["gpu_count"], h["gpu_model"]) == (count, "MI300X"), name
        window = f"[{WINDOW_S}s]"
        drawn = series_mean(url, f'avg(sum by (serial_number) (avg_over_time(gpu_package_power{{host="{name}"}}{window})))', data["at"])
        assert power["power_draw_w"]["mean"] == pytest.approx(drawn, rel=1e-3), name
        util = series_mean(url, f'avg(avg_over_time(gpu_gfx_activity{{host="{name}",gpu_partition_id="0"}}{window}))', data["at"])
        assert power["gpu_util_pct"]["mean"] == pytest.approx(util, rel=1e-3), name
        assert power["max_sm_clock_mhz"] == 2100 and power["max_sm_clock_source"] == amd.EXPORTER_MAX_CLOCK
        clock = series_mean(url, f'avg(avg_over_time(gpu_clock{{host="{name}",clock_type="system"}}{window}))', data["at"])
        assert power["sm_clock_ratio"]["mean"] == pytest.approx(clock / 2100, rel=1e-3), name
        # no power cap: null, never a figure from elsewhere; the yardstick is the table's labelled estimate
        assert power["power_limit_enforced_w"] is None and power["power_limit_max_w"] is None
        assert (ref["board_max_w"], ref["memory_bound_draw_w"], ref["reference_kind"]) == (750.0, 450.0, "estimate")
        hyps = by_id(h)
        for hyp in POWER_LIMIT:
            assert hyps[hyp]["verdict"] == "inconclusive", (name, hyp, hyps[hyp]["verdict"])
            assert "the AMD Device Metrics Exporter exports no power cap" in hyps[hyp]["reason"], hyps[hyp]["reason"]
        # what a person reads of the host: reasons, notes, and the findings in the runbook's AMD words
        said = [hyps[x]["reason"] or "" for x in hyps] + h["notes"] + [h["join_detail"]]
        said += [json.dumps([x["headline"], x["steps"]]) for x in hyps.values() if x["verdict"] == "confirmed"]
        assert not [s for s in said if NVIDIA_WORDS.search(s)], [s for s in said if NVIDIA_WORDS.search(s)]
        assert "dcgm" not in {e["alias"] for x in hyps.values() for e in x["evidence"] if e["values"]}
    # the capped box's cap holds its clock below the peak, and its power-cap residency says so
    capped = evidence(hosts[CAPPED], "power")
    assert capped["sm_clock_ratio"]["mean"] < 0.98 and capped["event_reasons"]["sw_power_cap"] > 0.5, capped["event_reasons"]
    # the thermal host's socket-thermal residency is its slowdown share: the clock held down, said in AMD's words
    hot = by_id(hosts[HOT])["clocks-held-down"]
    assert hot["verdict"] == "confirmed" and evidence(hosts[HOT], "power")["slowdown_fraction"] > 0.5, hot["reason"]
    assert "GFX clock" in hot["headline"] and "amd-smi" in json.dumps(hot["steps"]), (hot["headline"], hot["steps"])
    # partitions summed per physical GPU: the CPX host draws what its one GPU draws, not a partition's share
    assert evidence(hosts[CPX], "power")["power_draw_w"]["mean"] > 300  # ~540 W; one partition's share would be ~70 W
    assert any("8 partitions per GPU" in n for n in hosts[CPX]["notes"]), hosts[CPX]["notes"]
    report = (tmp_path / "fleet.md").read_text()
    assert "the AMD Device Metrics Exporter exports no power cap" in report


@needs_engines
@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_nvidia_verdicts_do_not_change_beside_amd_hosts(engines: dict[str, Any], tmp_path: Path, engine: str) -> None:
    data = fleet(engines[engine], tmp_path)
    mixed = {h["host"]: h for h in data["hosts"]}[NVIDIA]
    # the same window, with no AMD series in it: the AMD hosts are only their servers then
    alone_run = fleet(engines[engine], tmp_path, "--match", f'job!="{AMD_JOB}"', "--at", f"{data['at']:.3f}")
    assert {h["host"]: h["join"] for h in alone_run["hosts"]} == {NVIDIA: "joined", **{h: "server only" for h in (*AMD_HOSTS, DOWN_HOST)}}
    alone = {h["host"]: h for h in alone_run["hosts"]}[NVIDIA]
    verdicts = {k: (v["verdict"], v["reason"]) for k, v in by_id(mixed).items()}
    assert verdicts == {k: (v["verdict"], v["reason"]) for k, v in by_id(alone).items()}
    # the extended counters hold the limits: the power-limit hypotheses are decided on the NVIDIA host
    assert all(verdicts[h][0] == "refuted" for h in POWER_LIMIT), {h: verdicts[h] for h in POWER_LIMIT}


# -- without an engine: the exporter's text, the queries, the partitions ---------------------------------------


def _gpu(i: int, watts: float) -> dict[str, Any]:
    return {"name": "AMD Instinct MI300X", "serial": f"S{i}", "gpu_package_power": watts, "gpu_power_usage": watts,
            "gpu_gfx_activity": 97, "gpu_umc_activity": 40, "gpu_junction_temperature": 61, "gfx_clock_mhz": 2100,
            "mem_clock_mhz": 1300, "max_gfx_clock_mhz": 2100, "max_mem_clock_mhz": 1300,
            "gpu_violation_ppt_residency_percentage": 0.0, "gpu_violation_socket_thermal_residency_percentage": 0.0}  # fmt: skip


def test_the_simulated_exporter_lists_partitions_as_the_release_does() -> None:
    text = render([_gpu(0, 600.0), _gpu(1, 610.0)], "box", "dpx")
    power = [line for line in text.splitlines() if line.startswith("gpu_package_power{")]
    assert len(power) == 4  # 2 GPUs x 2 partitions, each its own gpu_id
    assert 'gpu_id="1",gpu_memory_partition_type="nps1",gpu_partition_id="1"' in power[1] and power[1].endswith(" 0")
    assert 'card_model="MI300X"' in power[0] and 'serial_number="S0"' in power[1] and power[0].endswith(" 600.0")
    # clocks are partition 0's alone: 8 XCC system clocks and the memory clock per GPU
    clocks = [line for line in text.splitlines() if line.startswith("gpu_clock{")]
    assert len(clocks) == 2 * 9 and all('gpu_partition_id="0"' in c for c in clocks)
    assert "power_cap" not in text and "power_limit" not in text  # the exporter has no cap series


def _answers(rows: list[tuple[dict[str, str], dict[str, float]]]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for labels, values in rows:
        for name, v in values.items():
            out.setdefault(amd.PREFIX + name, []).append(Sample(labels, v))
    return out


def test_partitions_are_summed_per_physical_gpu() -> None:
    key = HostKey.parse("host,Hostname,instance")
    rows: list[tuple[dict[str, str], dict[str, float]]] = []
    for gpu in range(2):
        for part in range(4):
            labels = {"hostname": "box", "gpu_id": str(gpu * 4 + part), "serial_number": f"S{gpu}", "gpu_partition_id": str(part)}
            values = {"power_mean": 0.0 if part else 500.0 + gpu, "util_mean": 0.0 if part else 90.0, "power_samples": 12.0}
            if part == 0:
                values |= {"sm_clock_mean": 2050.0, "max_sm_clock": 2100.0, "power_violation_pct": 5.0, "thermal_violation_pct": 0.0}
            rows.append((labels, values))
    gpu_rows = GpuRows(key)
    for name, samples in _answers(rows).items():
        gpu_rows.add(name, samples)
    gpu_rows.add(amd.PREFIX + "model_name", [Sample({"hostname": "box", "gpu_id": "0", "serial_number": "S0",
                                                     "gpu_partition_id": "0", "card_model": "MI300X"}, 1.0)])  # fmt: skip
    got = gpu_rows.rows["box"]
    assert sorted(got) == ["0", "4"] and {g.partitions for g in got.values()} == {4} and {g.vendor for g in got.values()} == {"amd"}
    window = Window(12, 1.7e9)
    ans = GpuSampleFleet().fill(gpu_rows.rows, window)
    v = ans.values["box"]
    assert [g["power_draw_w"]["mean"] for g in v["gpus"]] == [500.0, 501.0] and v["gpu_count"] == 2
    assert v["gpu_util_pct"]["mean"] == 90.0 and v["event_reasons"]["sw_power_cap"] == 0.05 and v["slowdown_fraction"] == 0.0
    assert v["power_limit_enforced_w"] is None and amd.NO_POWER_CAP in ans.missing["box"]
    # the model from card_model, on every GPU of the host: the table's row for the reference
    ref = GpuReferenceFleet().fill(gpu_rows.rows, window).values["box"]
    assert ref["gpu_name"] == "MI300X" and ref["board_max_w"] == 750.0


def test_without_serial_numbers_a_gpu_is_a_run_of_partitions_from_partition_0() -> None:
    parts = [amd.Partition(str(i), "", str(i % 2), {"power_mean": 0.0 if i % 2 else 400.0}) for i in range(4)]
    gpus = amd.physical_gpus(parts)
    assert [(g.gpu, g.partitions, g.values["power_mean"]) for g in gpus] == [("0", 2, 400.0), ("2", 2, 400.0)]
    # unpartitioned GPUs without a serial (partition "NA"): one each
    assert len(amd.physical_gpus([amd.Partition(str(i), "", "NA", {}) for i in range(3)])) == 3


def test_amd_queries_keep_partitions_apart_and_ask_every_power_name() -> None:
    queries = gpu_queries(Window(900, 1.7e9, 'job="amd"'), HostKey.parse("host,Hostname,instance"))
    power = queries[amd.PREFIX + "power_mean"]
    assert power.count(" or ") == 2 and "gpu_package_power" in power and "gpu_average_package_power" in power
    assert "gpu_id, serial_number, gpu_partition_id" in power and 'job="amd"' in power
    assert 'clock_type="system",job="amd"' in queries[amd.PREFIX + "sm_clock_mean"]
    assert queries[amd.PREFIX + "sm_clock_mean"].startswith("avg by (")  # one clock per XCC: their mean
    assert "DCGM_FI_DEV_POWER_USAGE" in queries["power_mean"]  # dcgm-exporter's beside them, unchanged


def test_what_is_missing_is_said_in_each_exporters_words() -> None:
    from gpu_runbook.probes.prometheus.gpu import missing_reason

    assert missing_reason([amd.NO_POWER_CAP]) == "the AMD Device Metrics Exporter exports no power cap (a host run reads it from amdsmi)"
    residency = "gpu_violation_ppt_residency_percentage"
    assert missing_reason([residency]) == f"the AMD Device Metrics Exporter does not export {residency} for this host"
    dcgm = missing_reason(["DCGM_FI_DEV_ENFORCED_POWER_LIMIT"])
    assert dcgm.startswith("dcgm-exporter does not export DCGM_FI_DEV_ENFORCED_POWER_LIMIT: add it") and "AMD" not in dcgm
