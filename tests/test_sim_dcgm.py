"""The simulated dcgm-exporter serves its last collection until the next one, as dcgm-exporter does."""

from __future__ import annotations

import time

import httpx

from gpu_runbook.sim.dcgm_exporter import SimDcgmExporter
from gpu_runbook.sim.host import SimulatedHost


def test_a_reading_is_served_until_the_next_collection():
    readings = iter(range(1000))

    def collect():
        n = next(readings)
        return [{"gpu": 0, "uuid": "GPU-0", "pci_bus_id": "0:1:0.0", "model": "m", "DCGM_FI_DEV_POWER_USAGE": n,
                 "DCGM_FI_DEV_GPU_UTIL": 0, "DCGM_FI_DEV_SM_CLOCK": 0, "DCGM_FI_DEV_MEM_CLOCK": 0,
                 "DCGM_FI_PROF_DRAM_ACTIVE": 0.0, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.0}]  # fmt: skip

    slow = SimDcgmExporter(collect, interval_s=3600)
    assert slow.text() == slow.text() == slow.text()  # one collection for the whole hour
    fast = SimDcgmExporter(collect, interval_s=0.05)
    first = fast.text()
    deadline = time.monotonic() + 10
    while fast.text() == first and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fast.text() != first


def test_the_scenario_serves_dcgm_fields_on_its_own_port():
    with SimulatedHost.start("dcgm-exporter-30s") as host:
        assert host.dcgm_url and host.dcgm_url.startswith("http://127.0.0.1:") and host.target().dcgm_url == host.dcgm_url
        text = httpx.get(host.dcgm_url, timeout=10).text
    assert "DCGM_FI_PROF_DRAM_ACTIVE{" in text and 'gpu="7"' in text
