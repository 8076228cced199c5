"""The AMD probes against the fake amdsmi (amdsmi 7.0.2's names and units): numbers worked out by hand."""

from __future__ import annotations

import ctypes
import importlib.util

import pytest

from gpu_runbook.amdsmi_lib import Amdsmi, error_name, is_missing
from gpu_runbook.nvml import CLOCK_EVENT_REASONS
from gpu_runbook.probe import Context
from gpu_runbook.probes.amd.inventory import AmdInventory
from gpu_runbook.probes.amd.reference import AmdReference
from gpu_runbook.probes.amd.sample import AmdSample, SampleParams
from gpu_runbook.probes.amd.topology import AmdTopology
from gpu_runbook.probes.amd.common import AmdSelection
from gpu_runbook.gpu_backend import GpuBackend
from gpu_runbook.nvml import Nvml
from gpu_runbook.sim import fake_amdsmi as A
from gpu_runbook.sim import fake_nvml as F
from gpu_runbook.target import Target

FAST = SampleParams(duration_s=0.3, interval_s=0.05)  # 7 ticks


def gpu(i: int, partition: str = "SPX", memory: str = "NPS1", cap_w: float = 750.0, **reading) -> A.FakeAmdGpu:
    g = A.FakeAmdGpu(index=i, market_name="AMD Instinct MI300X", gfx_target="gfx942", device_id="0x74a1",
                     memory_total_bytes=196608 * 1024 * 1024, power_cap_w=cap_w, default_power_cap_w=750.0, min_power_cap_w=0.0,
                     max_power_cap_w=750.0, max_gfx_mhz=2100, max_mem_mhz=1300, idle_gfx_mhz=142, pcie_gen=5, pcie_width=16,
                     pcie_gen_current=5, pcie_width_current=16, compute_partition=partition, memory_partition=memory)  # fmt: skip
    g.load = F.Reading(**{"power_w": 600.0, "gpu_util_pct": 100, "mem_util_pct": 50, "sm_clock_mhz": 2100, "mem_clock_mhz": 1300,
                          "temperature_c": 70, **reading})  # fmt: skip
    return g


def ctx_for(host: A.FakeAmdHost) -> Context:
    backend = GpuBackend(nvml=Nvml(F.make_module(F.no_driver_box())), amdsmi=Amdsmi(A.make_module(host)))
    return Context(target=Target(), http=None, nvml=backend.nvml, gpu=backend)  # type: ignore[arg-type]


def test_the_fake_keeps_amdsmis_units_and_traps():
    host = A.FakeAmdHost(gpus=[gpu(0, cap_w=500.0)])
    m = A.make_module(host)
    with pytest.raises(A.AmdSmiLibraryException) as before_init:
        m.amdsmi_get_processor_handles()
    assert error_name(before_init.value) == "AMDSMI_STATUS_NOT_INIT" and str(before_init.value).startswith("Error code:\n\t32 |")
    m.amdsmi_init(m.AmdSmiInitFlags.INIT_AMD_GPUS)
    (h,) = m.amdsmi_get_processor_handles()
    cap = m.amdsmi_get_power_cap_info(h)
    assert (cap["power_cap"], cap["max_power_cap"]) == (500_000_000, 750_000_000)  # microwatts
    assert m.amdsmi_get_power_info(h)["average_socket_power"] == "N/A"  # MI300 reports current, not average
    assert m.AmdSmiClkType.GFX == m.AmdSmiClkType.SYS == 0
    assert isinstance(m.amdsmi_topo_get_p2p_status(h, h)["type"], ctypes.c_uint32)  # 7.0.2's raw c_uint32
    with pytest.raises(A.AmdSmiParameterException):
        m.amdsmi_get_clock_info(h, 0)  # a plain int is not an AmdSmiClkType
    host.not_supported.add("amdsmi_get_violation_status")
    with pytest.raises(A.AmdSmiLibraryException) as missing:
        m.amdsmi_get_violation_status(h)
    assert is_missing(missing.value)


async def test_inventory_reads_watts_from_microwatts_and_names_the_partitions():
    host = A.FakeAmdHost(gpus=[gpu(0, cap_w=500.0), gpu(1)])
    host.processes = [{"name": "python3", "pid": 4242, "mem": 1 << 30, "engine_usage": {}, "memory_usage": {}, "cu_occupancy": "N/A"}]
    ev = await AmdInventory().run(ctx_for(host), AmdSelection())
    v = ev.values
    assert ev.status.value == "ok"
    assert (v["gpu_count"], v["physical_gpu_count"], v["gpu_vendor"]) == (2, 2, "amd")
    assert (v["power_limit_enforced_w"], v["power_limit_max_w"], v["power_limit_default_w"]) == (500.0, 750.0, 750.0)
    assert (v["pcie_link_gen_max"], v["pcie_link_width_max"], v["pcie_link_max_gbps"]) == (5, 16, 63.015)
    assert v["gpus"][0]["pcie_link_gen_current"] == 5  # pcie_speed 32000 MT/s
    assert v["nvlink_links_total"] == 2  # each GPU reaches the other over XGMI
    assert (v["compute_partition"], v["memory_partition"], v["gpus"][1]["partition_id"]) == ("SPX", "NPS1", 0)
    assert v["gpus"][0]["processes"] == [{"pid": 4242, "name": "python3", "memory_bytes": 1 << 30}]
    assert v["compute_capability"] is None and v["cuda_driver_version"] is None  # NVIDIA's, not AMD's


async def test_cpx_shows_eight_devices_of_one_gpu_and_samples_it_once():
    host = A.FakeAmdHost(gpus=[gpu(0, partition="CPX", memory="NPS4")])
    inv = (await AmdInventory().run(ctx_for(host), AmdSelection())).values
    assert (inv["gpu_count"], inv["physical_gpu_count"], inv["compute_partition"]) == (8, 1, "CPX")
    assert inv["memory_total_bytes"] == 24576 * 1024 * 1024  # each partition its eighth
    assert [g["partition_id"] for g in inv["gpus"]] == list(range(8))
    s = (await AmdSample().run(ctx_for(host), FAST)).values
    assert s["gpu_count"] == 1 and s["gpus"][0]["partitions"] == 8
    assert s["power_draw_w"]["mean"] == 600.0 and s["gpu_util_pct"]["mean"] == 100.0  # partition 0 speaks for the GPU


async def test_sample_maps_violations_to_the_clock_concepts():
    held = CLOCK_EVENT_REASONS["sw_power_cap"] | CLOCK_EVENT_REASONS["hw_thermal_slowdown"]
    host = A.FakeAmdHost(gpus=[gpu(0, cap_w=600.0, sm_clock_mhz=1470, event_reasons=held)])
    ev = await AmdSample().run(ctx_for(host), FAST)
    v = ev.values
    assert v["event_reasons_source"] == "violation_status"
    r = v["event_reasons"]
    assert (r["sw_power_cap"], r["hw_thermal_slowdown"], r["hw_slowdown"], r["sw_thermal_slowdown"]) == (1.0, 1.0, 1.0, 0.0)
    assert v["throttled_fraction"] == 1.0 and v["slowdown_fraction"] == 1.0
    assert v["sm_clock_ratio"]["mean"] == pytest.approx(0.7)  # 1470 / 2100
    assert v["power_limit_enforced_w"] == 600.0 and v["draw_to_enforced_limit"]["mean"] == 1.0
    assert v["temperature_c"]["mean"] == 70.0


async def test_a_value_amdsmi_does_not_report_is_null_not_zero():
    host = A.FakeAmdHost(gpus=[gpu(0)], not_supported={"amdsmi_get_violation_status", "amdsmi_get_temp_metric"})
    v = (await AmdSample().run(ctx_for(host), FAST)).values
    assert v["event_reasons"] is None and v["throttled_fraction"] is None and v["event_reasons_source"] is None
    assert v["temperature_c"] is None
    assert {"amdsmi_get_violation_status", "amdsmi_get_temp_metric"} <= set(v["unsupported_calls"])
    assert v["power_instant_w"] is None and v["pcie_tx_bytes_window"] is None  # amdsmi has neither


async def test_topology_reads_xgmi_and_p2p_per_pair():
    host = A.FakeAmdHost(gpus=[gpu(0), gpu(1), gpu(2)])
    v = (await AmdTopology().run(ctx_for(host), AmdSelection())).values
    assert (v["pairs_total"], v["p2p_ok_pairs"], v["any_pair_without_p2p"]) == (3, 3, False)
    assert v["link_types"][0] == ["X", "XGMI", "XGMI"] and v["nvlink_active_links_total"] == 6
    host.xgmi = False
    v = (await AmdTopology().run(ctx_for(host), AmdSelection())).values
    assert v["any_pair_without_p2p"] is True and v["link_types"][0][1] == "PCIE" and v["nvlink_active_links_total"] == 0


async def test_reference_finds_the_table_row_by_market_name_and_says_it_is_an_estimate():
    v = (await AmdReference().run(ctx_for(A.FakeAmdHost(gpus=[gpu(0)])), AmdSelection())).values
    assert (v["gpu_name"], v["board_max_w"], v["reference_kind"], v["reference_measured"]) == ("AMD Instinct MI300X", 750.0, "estimate", False)
    assert v["memory_bound_draw_w"] == 450.0  # the fallback share (0.6) of 750 W: no AMD figure is published


@pytest.mark.skipif(importlib.util.find_spec("amdsmi") is not None, reason="amdsmi is installed here")
async def test_no_amdsmi_is_unavailable_and_says_what_was_found():
    backend = GpuBackend(nvml=Nvml(F.make_module(F.no_driver_box())), amdsmi=Amdsmi())
    ctx = Context(target=Target(), http=None, nvml=backend.nvml, gpu=backend)  # type: ignore[arg-type]
    ev = await AmdInventory().run(ctx, AmdSelection())
    assert ev.status.value == "unavailable" and ev.reason.startswith("amdsmi: not installed.")


@pytest.mark.parametrize("partition, memory", [("SPX", "NPS1"), ("CPX", "NPS4")])
async def test_the_amd_probes_return_what_the_gpu_concepts_declare(partition, memory):
    """Strictly, unknown keys refused: the AMD family fills the same models the NVML family does."""
    from gpu_runbook.evidence import ProbeStatus  # noqa: PLC0415
    from gpu_runbook.values import contract_errors  # noqa: PLC0415

    held = CLOCK_EVENT_REASONS["sw_thermal_slowdown"]
    host = A.FakeAmdHost(gpus=[gpu(0, partition, memory, event_reasons=held), gpu(1, partition, memory)],
                         processes=[{"name": "N/A", "pid": 7, "mem": "N/A", "engine_usage": {}, "memory_usage": {}, "cu_occupancy": 3}])
    for probe, params in ((AmdInventory(), AmdSelection()), (AmdSample(), FAST), (AmdTopology(), AmdSelection()), (AmdReference(), AmdSelection())):
        ev = await probe.run(ctx_for(host), params)
        assert ev.status is ProbeStatus.ok, (probe.name, ev.reason)
        assert not contract_errors(probe.Values, ev.values, complete=True), (probe.name, contract_errors(probe.Values, ev.values, complete=True))


async def test_the_live_panel_reads_amd_gpus_through_amdsmi():
    from gpu_runbook.live import LiveMonitor  # noqa: PLC0415

    host = A.FakeAmdHost(gpus=[gpu(0, partition="DPX", cap_w=500.0, power_w=480.0, gpu_util_pct=97, sm_clock_mhz=1900)])
    samples = []
    ctx = ctx_for(host)
    monitor = LiveMonitor(ctx.nvml, None, "http://127.0.0.1:9/metrics", {}, samples.append, amdsmi=ctx.gpu.amdsmi)
    gpus = await monitor._gpus()
    assert gpus == [{"index": 0, "power_w": 480, "limit_w": 500.0, "util_pct": 97, "sm_clock_mhz": 1900},
                    {"index": 1, "power_w": None, "limit_w": 500.0, "util_pct": None, "sm_clock_mhz": 1900}]  # partition 1: N/A
