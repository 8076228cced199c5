"""A thermal slowdown in a fleet whose exporters do not send the maximum clocks (issue 34): the clock ratio reads the
GPU table's published maximum, the violation counters say "slowed", and a clock held down by the power cap is not
a slowdown. Real Prometheus and VictoriaMetrics scrape simulated hosts' dcgm-exporters on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from gpu_runbook.cli import main
from gpu_runbook.probes.prometheus.gpu import counters_csv
from gpu_runbook.sim.fleet import HostSpec, fleet_processes, prometheus_config

from prom_servers import PROMETHEUS, VICTORIA, hold_a_steady_window, prometheus, query, victoria_metrics

pytestmark = pytest.mark.skipif(not (PROMETHEUS and VICTORIA), reason="prometheus and victoria-metrics are not installed (.ci/run installs them)")

WINDOW_S = 15
# the extended counters without the maximum clocks: some exporters send neither (issue 34)
NO_MAX_CLOCKS = "\n".join(line for line in counters_csv().splitlines() if "_MAX_SM_CLOCK" not in line and "_MAX_MEM_CLOCK" not in line) + "\n"
SPECS = [
    # 8x A100 SXM at ~91 C: both thermal reasons set, the SM clock at ~57 % of its 1,410 MHz, well below the power limit
    HostSpec("hot-box", "thermal-slowdown", concurrency=256, output_len=256, counters=NO_MAX_CLOCKS),
    # 8x H100 at an admin power cap: the clock is below its maximum because the cap holds it, not heat
    HostSpec("capped-box", "admin-power-cap", concurrency=96, counters=NO_MAX_CLOCKS),
]


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Any]]:
    with fleet_processes(SPECS) as members:
        config = prometheus_config(members, interval_s=1.0)
        with prometheus(config) as prom, victoria_metrics(config, latency_offset="1s") as vm:
            hold_a_steady_window({"Prometheus": prom, "VictoriaMetrics": vm}, members, WINDOW_S)
            assert not query(prom, "DCGM_FI_DEV_MAX_SM_CLOCK")  # the exporters really do not send it
            yield {"prometheus": prom, "victoriametrics": vm}


def judged(url: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    out = tmp_path / "fleet.json"
    assert main(["fleet", "power-starvation", "--prometheus", url, "--window", f"{WINDOW_S}s", "--json", str(out),
                 "--report", str(tmp_path / "fleet.md")]) == 0
    hosts = {h["host"]: h for h in json.loads(out.read_text())["hosts"]}
    return {name: {h["id"]: h for h in host["results"]["hypotheses"]} for name, host in hosts.items()}


@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_a_thermal_slowdown_is_confirmed_with_the_tables_maximum_clock(engines, engine, tmp_path):
    hosts = judged(engines[engine], tmp_path)
    hot = hosts["hot-box"]["clocks-held-down"]
    assert hot["verdict"] == "confirmed", hot["reason"]
    # the ratio's denominator is named: the published figure of the GPU table, not an exported field
    assert "1,410 MHz" in hot["headline"] and "GPU table" in hot["headline"], hot["headline"]
    capped = hosts["capped-box"]
    assert capped["power-limit-capped"]["verdict"] == "confirmed", capped["power-limit-capped"]["reason"]
    assert capped["clocks-held-down"]["verdict"] != "confirmed", capped["clocks-held-down"]["reason"]
