"""GPU probes against the fake NVML: numbers in W, ratios and reason names worked out by hand."""

from __future__ import annotations

import asyncio
import time

import pynvml
import pytest

from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.nvml import Nvml
from gpu_runbook.probe import Context
from gpu_runbook.target import Target
from gpu_runbook.sim import fake_nvml as F
from gpu_runbook.probes.gpu.activity import ActivityParams, GpuActivity
from gpu_runbook.probes.gpu_values import pcie_link_gbps, stats
from gpu_runbook.probes.gpu.inventory import GpuInventory, InventoryParams
from gpu_runbook.probes.gpu.sample import GpuSample, SampleParams
from gpu_runbook.probes.gpu.topology import GpuTopology, TopologyParams

FAST = SampleParams(duration_s=0.3, interval_s=0.05)  # 7 ticks: t = 0, 0.05, ..., 0.30
REASONS = ["gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
           "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting"]


class CountingNvml(Nvml):
    """Counts thread hops, to check sampling costs one hop per tick for all GPUs."""

    def __init__(self, module):
        super().__init__(module)
        self.hops = 0

    async def call(self, fn):
        self.hops += 1
        return await super().call(fn)


def ctx_for(host: F.FakeHost | None, nvml: Nvml | None = None) -> Context:
    return Context(target=Target(), http=None, nvml=nvml or Nvml(F.make_module(host)))  # type: ignore[arg-type]


def test_stats_by_hand():
    s = stats([4, None, 1, 3, 2])
    assert s == {"mean": 2.5, "min": 1.0, "max": 4.0, "p50": 2.5, "p95": 3.85}
    assert stats([None, None]) is None
    assert pcie_link_gbps(5, 16) == pytest.approx(63.015, abs=1e-3)  # 32 GT/s x 16 x 128/130 / 8
    assert pcie_link_gbps(4, 16) == pytest.approx(31.508, abs=1e-3)
    assert pcie_link_gbps(None, 16) is None


# --- acceptance 1: no GPU -----------------------------------------------------------------------

@pytest.mark.parametrize("probe,params", [(GpuInventory(), InventoryParams()), (GpuSample(), FAST),
                                          (GpuTopology(), TopologyParams()), (GpuActivity(), ActivityParams())])
async def test_no_driver_is_unavailable_with_the_error_name(probe, params):
    ev = await probe.run(ctx_for(F.no_driver_box()), params)
    assert ev.status.value == "unavailable"
    assert ev.reason.startswith("NVMLError_LibraryNotFound: NVML Shared Library Not Found.")
    assert "no NVIDIA driver" in ev.reason
    assert ev.summary.startswith("unavailable: NVMLError_LibraryNotFound")


async def test_driver_not_loaded_and_no_permission_reasons():
    ev = await GpuInventory().run(ctx_for(F.no_driver_box(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)), InventoryParams())
    assert ev.reason.startswith("NVMLError_DriverNotLoaded") and "lsmod" in ev.reason
    ev = await GpuSample().run(ctx_for(F.no_driver_box(pynvml.NVML_ERROR_NO_PERMISSION)), FAST)
    assert ev.reason.startswith("NVMLError_NoPermission") and "root" in ev.reason


async def test_real_pynvml_on_a_host_without_gpu():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        expected = type(exc).__name__
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this host has a working NVIDIA driver")
    ctx = ctx_for(None, Nvml())
    for probe, params in [(GpuInventory(), InventoryParams()), (GpuSample(), FAST)]:
        ev = await probe.run(ctx, params)
        assert ev.status.value == "unavailable"
        assert ev.reason.startswith(expected)


async def test_zero_gpus_is_unavailable():
    ev = await GpuInventory().run(ctx_for(F.FakeHost(gpus=[])), InventoryParams())
    assert ev.status.value == "unavailable" and "nvmlDeviceGetCount() is 0" in ev.reason


# --- the seeds' box: 8x RTX PRO 6000 Server on PCIe, passthrough, no P2P --------------------------

async def test_inventory_rtx_pro_6000_box():
    ev = await GpuInventory().run(ctx_for(F.rtx_pro_6000_pcie_box()), InventoryParams())
    v = ev.values
    assert ev.ok
    assert v["gpu_count"] == 8
    assert v["gpu_name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert v["compute_capability"] == "12.0" and v["compute_capability_major"] == 12
    assert v["architecture"] == "blackwell"
    assert v["virtualization_mode"] == "passthrough"
    assert v["power_limit_enforced_w"] == 600.0
    assert v["power_limit_max_w"] == 600.0
    assert v["power_limit_default_w"] == 600.0
    assert v["power_limit_min_w"] == 300.0
    assert v["driver_version"] == "595.58.03"
    assert v["cuda_driver_version"] == "13.2"
    assert v["nvlink_links_total"] == 0
    assert v["pcie_link_gen_max"] == 5 and v["pcie_link_width_max"] == 16
    g = v["gpus"][1]
    assert g["pci_bus_id"] == "00000000:16:00.0"
    assert g["memory_total_mib"] == 97887
    assert g["max_sm_clock_mhz"] == 2430 and g["max_mem_clock_mhz"] == 12481
    assert ev.blocks[0].kind == "table" and len(ev.blocks[0].rows) == 8


async def test_sample_rtx_pro_6000_box_ratio_reasons_energy():
    nvml = CountingNvml(F.make_module(F.rtx_pro_6000_pcie_box()))
    ev = await GpuSample().run(ctx_for(None, nvml), FAST)
    v = ev.values
    assert ev.ok
    assert v["sample_count"] == 7
    # open + setup + 7 ticks + final link read: one hop per tick for all 8 GPUs, not per call
    assert nvml.hops == 1 + 1 + 7 + 1
    assert v["power_draw_w"]["mean"] == pytest.approx(235.412)
    assert v["draw_to_enforced_limit"]["mean"] == pytest.approx(235.412 / 600)  # 0.392353
    assert v["draw_to_max_constraint"]["p95"] == pytest.approx(0.392353, abs=1e-6)
    assert v["sm_clock_ratio"]["mean"] == pytest.approx(2400 / 2430)  # 0.987654
    assert v["gpu_util_pct"]["min"] == 100
    assert v["pcie_tx_gbps"]["mean"] == pytest.approx(6.3)  # 6,300,000 KB/s
    assert v["pcie_tx_link_share"]["mean"] == pytest.approx(6.3 / 63.015, rel=1e-4)  # ~0.1 of Gen5 x16
    # the energy counter integrates 235.412 W: delta mJ / delta s is that power
    # (5%: the counter and the clock are read a moment apart, and a busy machine stretches the moment)
    assert v["energy_avg_power_w"]["mean"] == pytest.approx(235.412, rel=5e-2)
    assert v["gpus"][0]["energy_avg_power_w"] == pytest.approx(235.412, rel=5e-2)
    assert v["event_reasons"] == {name: 0.0 for name in REASONS}
    assert v["throttled_fraction"] == 0.0
    assert v["event_reasons_source"] == "clocks_event_reasons"
    assert v["power_limit_enforced_w"] == 600.0
    assert v["gpus"][0]["pcie_link_gen_current"] == 5
    assert v["unsupported_calls"] == []
    kinds = [b.kind for b in ev.blocks]
    assert kinds[0] == "bars" and kinds.count("series") == 9  # 8 power series + mean utilisation
    assert ev.blocks[0].bars[0] == ("GPU 0", pytest.approx(235.412), 600.0)
    assert "39% of the enforced limit" in ev.summary


async def test_sample_per_gpu_differences_and_decoded_reasons():
    host = F.rtx_pro_6000_pcie_box()
    for i, g in enumerate(host.gpus):
        g.load = F.Reading(power_w=200 + 10 * i, gpu_util_pct=100, sm_clock_mhz=2430 - 100 * i,
                           event_reasons=0x4 if i < 3 else (0x1 | 0x40 if i == 7 else 0))
    ev = await GpuSample().run(ctx_for(host), FAST)
    v = ev.values
    # power 200, 210, ..., 270 W, 7 samples each: 56 values
    assert v["power_draw_w"] == {"mean": 235.0, "min": 200.0, "max": 270.0, "p50": 235.0, "p95": 270.0}
    assert v["draw_to_enforced_limit"]["max"] == pytest.approx(270 / 600)
    assert v["gpus"][2]["power_draw_w"]["mean"] == 220.0
    # sm_power_cap on 3 of 8 GPUs in every sample; GPU 7 idle + HW thermal
    assert v["event_reasons"]["sw_power_cap"] == pytest.approx(3 / 8)
    assert v["event_reasons"]["gpu_idle"] == pytest.approx(1 / 8)
    assert v["event_reasons"]["hw_thermal_slowdown"] == pytest.approx(1 / 8)
    assert v["event_reasons"]["hw_slowdown"] == 0.0
    assert v["throttled_fraction"] == pytest.approx(4 / 8)
    assert v["gpus"][7]["event_reasons_seen"] == ["gpu_idle", "hw_thermal_slowdown"]
    assert v["gpus"][0]["event_reasons"]["sw_power_cap"] == 1.0
    # SM clocks 2430..1730 against 2430: GPU 3 runs at 2130/2430
    assert v["gpus"][3]["sm_clock_ratio"]["mean"] == pytest.approx(2130 / 2430)
    assert "sw_power_cap" in ev.summary


async def test_sample_falls_back_to_throttle_reasons_on_old_drivers():
    host = F.rtx_pro_6000_pcie_box(2)
    host.gpus[0].load = F.Reading(power_w=100, event_reasons=0x4)
    mod = F.make_module(host)
    del mod.nvmlDeviceGetCurrentClocksEventReasons  # the driver lacks it: FunctionNotFound
    ev = await GpuSample().run(ctx_for(None, Nvml(mod)), FAST)
    assert ev.values["event_reasons_source"] == "clocks_throttle_reasons"
    assert ev.values["event_reasons"]["sw_power_cap"] == pytest.approx(0.5)


async def test_sampling_does_not_block_the_loop():
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    t0 = time.monotonic()
    await GpuSample().run(ctx_for(F.rtx_pro_6000_pcie_box()), FAST)
    elapsed = time.monotonic() - t0
    task.cancel()
    assert elapsed < 5.0
    assert ticks >= 3  # the loop kept running while NVML was read (~30 ticks on an idle machine)


async def test_sample_window_respects_duration():
    ev = await GpuSample().run(ctx_for(F.rtx_pro_6000_pcie_box(1)), SampleParams(duration_s=0.2, interval_s=0.1))
    assert ev.values["sample_count"] == 3
    assert 0.15 <= ev.values["window_s"] < 2.0
    assert GpuSample().timeout_s(SampleParams(duration_s=10)) == 40.0


async def test_series_are_bounded():
    ev = await GpuSample().run(ctx_for(F.rtx_pro_6000_pcie_box(1)), SampleParams(duration_s=0.3, interval_s=0.01))
    series = [b for b in ev.blocks if b.kind == "series"]
    assert series and all(len(s.points) <= 120 for s in series)
    assert ev.values["sample_count"] == 31


async def test_topology_rtx_pro_6000_box_reports_p2p_unavailable():
    ev = await GpuTopology().run(ctx_for(F.rtx_pro_6000_pcie_box()), TopologyParams())
    v = ev.values
    assert ev.ok
    assert v["any_pair_without_p2p"] is True
    assert v["pairs_without_p2p"] == 28 and v["pairs_total"] == 28 and v["p2p_ok_pairs"] == 0
    assert v["p2p"]["read"][0][0] == "X" and v["p2p"]["read"][0][1] == "NS"
    assert v["p2p"]["write"][3][5] == "NS" and v["p2p"]["nvlink"][7][6] == "NS"
    assert v["nvlink_active_links"] == [0] * 8 and v["nvlink_active_links_total"] == 0
    assert v["nvlink_supported"] is False
    assert v["topology"][0][1] == "PHB" and v["topology"][2][2] == "X"
    assert v["topology_worst"] == "PHB"
    assert "P2P unavailable for 28 of 28" in ev.summary


async def test_h100_nvlink_box():
    ctx = ctx_for(F.h100_sxm_nvlink_box())
    topo = await GpuTopology().run(ctx, TopologyParams())
    v = topo.values
    assert v["nvlink_active_links"] == [18] * 8 and v["nvlink_active_links_total"] == 144
    assert v["nvlink_supported"] is True
    assert v["any_pair_without_p2p"] is False and v["pairs_without_p2p"] == 0 and v["p2p_ok_pairs"] == 28
    assert v["p2p"]["nvlink"][0][7] == "OK"
    assert v["topology"][0][3] == "NODE" and v["topology"][0][4] == "SYS" and v["topology_worst"] == "SYS"
    inv = await GpuInventory().run(ctx, InventoryParams())
    assert inv.values["nvlink_links_total"] == 144 and inv.values["compute_capability"] == "9.0"
    assert inv.values["architecture"] == "hopper" and inv.values["virtualization_mode"] == "none"
    assert inv.values["power_limit_min_w"] == 200.0
    s = await GpuSample().run(ctx, FAST)
    assert s.values["draw_to_enforced_limit"]["mean"] == pytest.approx(612.5 / 700)  # 0.875
    assert s.values["sm_clock_ratio"]["mean"] == pytest.approx(1755 / 1980)
    assert s.values["event_reasons"]["sw_power_cap"] == 1.0 and s.values["throttled_fraction"] == 1.0
    act = await GpuActivity().run(ctx, ActivityParams(duration_s=0.2))
    assert act.ok and act.values["sm_util_pct"]["mean"] == 92.0 and act.values["tensor_util_pct"]["mean"] == 55.0


async def test_activity_rtx_box_separates_busy_from_computing():
    ev = await GpuActivity().run(ctx_for(F.rtx_pro_6000_pcie_box()), ActivityParams(duration_s=0.2))
    v = ev.values
    assert ev.ok and v["supported_gpu_count"] == 8
    assert v["sm_util_pct"]["mean"] == 38.0
    assert v["sm_occupancy_pct"]["mean"] == 12.0
    assert v["tensor_util_pct"]["mean"] == pytest.approx(4.12)
    assert v["dram_bw_util_pct"]["p95"] == 62.0
    assert v["window_s"] >= 0.2


async def test_activity_unsupported_device_is_unavailable_with_reason():
    ev = await GpuActivity().run(ctx_for(F.rtx_pro_6000_pcie_box(2, gpm_supported=False)), ActivityParams(duration_s=0.2))
    assert ev.status.value == "unavailable"
    assert "isSupportedDevice=0" in ev.reason and "gpu.dcgm" in ev.reason
    assert ev.values["gpus"][0]["gpm_supported"] is False and ev.values["sm_util_pct"] is None


# --- every optional call NotSupported: missing, never 0 ---------------------------------------------

async def test_all_optional_not_supported_reports_missing_not_zero():
    ctx = ctx_for(F.all_optional_not_supported_box())
    inv = await GpuInventory().run(ctx, InventoryParams())
    assert inv.ok and inv.values["gpu_count"] == 2
    for key in ("power_limit_enforced_w", "power_limit_max_w", "compute_capability", "virtualization_mode",
                "pcie_link_gen_max", "max_sm_clock_mhz"):
        assert inv.values[key] is None, key
    assert inv.values["gpus"][0]["power_limit_enforced_w"] is None
    assert "nvmlDeviceGetEnforcedPowerLimit" in inv.values["unsupported_calls"]

    s = await GpuSample().run(ctx, FAST)
    assert s.ok
    for key in ("power_draw_w", "draw_to_enforced_limit", "gpu_util_pct", "sm_clock_ratio", "energy_avg_power_w",
                "event_reasons", "throttled_fraction", "pcie_tx_gbps", "temperature_c", "power_limit_enforced_w"):
        assert s.values[key] is None, key
    assert s.values["gpus"][1]["power_draw_w"] is None
    assert s.values["event_reasons_source"] is None
    assert "nvmlDeviceGetPowerUsage" in s.values["unsupported_calls"]
    assert "power draw not reported" in s.summary

    t = await GpuTopology().run(ctx, TopologyParams())
    assert t.values["p2p"] == {"read": None, "write": None, "nvlink": None}
    assert t.values["any_pair_without_p2p"] is None and t.values["topology"] is None

    a = await GpuActivity().run(ctx, ActivityParams(duration_s=0.2))
    assert a.status.value == "unavailable" and "NVMLError_NotSupported" in a.reason


async def test_evidence_is_json_able():
    ctx = ctx_for(F.rtx_pro_6000_pcie_box(2))
    for probe, params in [(GpuInventory(), InventoryParams()), (GpuSample(), FAST), (GpuTopology(), TopologyParams()),
                          (GpuActivity(), ActivityParams(duration_s=0.2))]:
        ev = await probe.run(ctx, params)
        ev.model_dump_json()
        assert ev.started_at is not None and ev.finished_at is not None


async def test_slowdown_fraction_counts_samples_not_bits():
    """NVML raises hw_slowdown together with HW thermal slowdown: one slowed sample counts once."""
    host = F.rtx_pro_6000_pcie_box()
    for i, g in enumerate(host.gpus):
        # GPUs 0-1: hw_slowdown + hw_thermal + sw_thermal at once; GPU 2: power cap only; the rest: none
        g.load = F.Reading(power_w=300, gpu_util_pct=100, event_reasons=(0x8 | 0x40 | 0x20) if i < 2 else (0x4 if i == 2 else 0))
    v = (await GpuSample().run(ctx_for(host), FAST)).values
    assert v["slowdown_fraction"] == pytest.approx(2 / 8)
    assert v["throttled_fraction"] == pytest.approx(3 / 8)
    summed = v["event_reasons"]["hw_slowdown"] + v["event_reasons"]["hw_thermal_slowdown"] + v["event_reasons"]["sw_thermal_slowdown"]
    assert summed == pytest.approx(6 / 8)  # what adding fractions would have claimed


async def test_sweep_power_reading_leaves_out_a_gpu_nvml_refuses():
    """One GPU answering NoPermission must not hide the sweep's power column for the others."""
    from gpu_runbook.probes.server.sweep import gpu_draw

    host = F.rtx_pro_6000_pcie_box(2)
    mod = F.make_module(host)
    opened = mod.nvmlDeviceGetHandleByIndex

    def handle(i):
        if i == 1:
            raise mod.NVMLError(mod.NVML_ERROR_NO_PERMISSION)
        return opened(i)

    mod.nvmlDeviceGetHandleByIndex = handle
    ratio, watts = await gpu_draw(ctx_for(None, Nvml(mod)))
    assert ratio == pytest.approx(235.412 / 600) and watts == pytest.approx(235.412)  # GPU 0 alone


async def test_sweep_power_reading_reads_only_the_gpus_it_was_given():
    from gpu_runbook.probes.server.sweep import gpu_draw

    host = F.rtx_pro_6000_pcie_box(2)
    host.gpus[1].load.power_w = 500.0  # another server's busy GPU
    mod = F.make_module(host)
    assert (await gpu_draw(ctx_for(None, Nvml(mod)), [0]))[1] == pytest.approx(235.412)
    assert (await gpu_draw(ctx_for(None, Nvml(mod))))[1] == pytest.approx((235.412 + 500.0) / 2)


async def test_gpus_param_reads_only_the_servers_gpus():
    """A host shared by two servers: the probes see the GPUs they are pointed at, by NVML index."""
    ctx = ctx_for(F.rtx_pro_6000_pcie_box())
    inv = await GpuInventory().run(ctx, InventoryParams(gpus=[2, 5]))
    assert inv.ok and inv.values["gpu_count"] == 2
    assert [g["index"] for g in inv.values["gpus"]] == [2, 5]
    topo = await GpuTopology().run(ctx, TopologyParams(gpus=[2, 5]))
    assert topo.values["pairs_total"] == 1 and topo.values["pairs_without_p2p"] == 1
    sample = await GpuSample().run(ctx, SampleParams(duration_s=0.2, interval_s=0.1, gpus=[5]))
    assert [g["index"] for g in sample.values["gpus"]] == [5]
    missing = await GpuInventory().run(ctx, InventoryParams(gpus=[1, 9]))
    assert missing.status is ProbeStatus.unavailable
    assert missing.reason == "no GPU with index 9: NVML numbers this host's GPUs [0, 1, 2, 3, 4, 5, 6, 7]"
