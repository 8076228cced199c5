"""The fake pynvml keeps nvidia-ml-py's units, errors and traps, so probes tested on it behave on hardware."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from gpu_runbook.sim import fake_nvml as F


def _init(host: F.FakeHost):
    mod = F.make_module(host)
    mod.nvmlInit()
    return mod


def test_units_are_nvml_integers_in_mw_and_kbps():
    mod = _init(F.rtx_pro_6000_pcie_box())
    h = mod.nvmlDeviceGetHandleByIndex(3)
    assert mod.nvmlDeviceGetPowerUsage(h) == 235412
    assert mod.nvmlDeviceGetEnforcedPowerLimit(h) == 600000
    assert mod.nvmlDeviceGetPowerManagementLimit(h) == 600000
    assert mod.nvmlDeviceGetPowerManagementDefaultLimit(h) == 600000
    assert mod.nvmlDeviceGetPowerManagementLimitConstraints(h) == [300000, 600000]
    assert mod.nvmlDeviceGetUtilizationRates(h).gpu == 100
    assert mod.nvmlDeviceGetMaxClockInfo(h, mod.NVML_CLOCK_SM) == 2430
    assert mod.nvmlDeviceGetClockInfo(h, mod.NVML_CLOCK_SM) == 2400
    assert mod.nvmlDeviceGetPcieThroughput(h, mod.NVML_PCIE_UTIL_TX_BYTES) == 6_300_000
    assert mod.nvmlDeviceGetCudaComputeCapability(h) == (12, 0)
    assert mod.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_BLACKWELL
    assert mod.nvmlDeviceGetVirtualizationMode(h) == pynvml.NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
    assert mod.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    assert mod.nvmlDeviceGetPciInfo(h).busId == "00000000:36:00.0"
    assert mod.nvmlDeviceGetMemoryInfo(h).total == 97887 * 1024 * 1024
    assert mod.nvmlDeviceGetCount() == 8


def test_errors_are_the_real_pynvml_classes():
    mod = F.make_module(F.rtx_pro_6000_pcie_box(2))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        mod.nvmlDeviceGetCount()
    mod.nvmlInit()
    h0, h1 = mod.nvmlDeviceGetHandleByIndex(0), mod.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        mod.nvmlDeviceGetNvLinkState(h0, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        mod.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        mod.nvmlDeviceGetSomethingTheFakeLacks(h0)
    assert mod.NVMLError is pynvml.NVMLError
    mod.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        mod.nvmlDeviceGetName(h0)
    assert h1 is not None


def test_p2p_read_tuple_trap_and_literal_index():
    mod = _init(F.rtx_pro_6000_pcie_box(2))
    h0, h1 = mod.nvmlDeviceGetHandleByIndex(0), mod.nvmlDeviceGetHandleByIndex(1)
    assert mod.NVML_P2P_CAPS_INDEX_READ == (0,)  # the binding's trailing comma, copied as is
    with pytest.raises(ctypes.ArgumentError):
        mod.nvmlDeviceGetP2PStatus(h0, h1, mod.NVML_P2P_CAPS_INDEX_READ)
    assert mod.nvmlDeviceGetP2PStatus(h0, h1, 0) == pynvml.NVML_P2P_STATUS_NOT_SUPPORTED == 5
    assert mod.nvmlDeviceGetTopologyCommonAncestor(h0, h1) == pynvml.NVML_TOPOLOGY_HOSTBRIDGE


def test_nvlink_links_end_with_invalid_argument():
    mod = _init(F.h100_sxm_nvlink_box(2))
    h = mod.nvmlDeviceGetHandleByIndex(0)
    assert [mod.nvmlDeviceGetNvLinkState(h, i) for i in range(18)] == [pynvml.NVML_FEATURE_ENABLED] * 18
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        mod.nvmlDeviceGetNvLinkState(h, 18)


def test_energy_counter_integrates_power_over_the_host_clock():
    now = [100.0]
    host = F.rtx_pro_6000_pcie_box(1)
    host.clock = lambda: now[0]
    host.gpus[0].load.power_w = 250.0
    mod = _init(host)
    h = mod.nvmlDeviceGetHandleByIndex(0)
    e0 = mod.nvmlDeviceGetTotalEnergyConsumption(h)
    now[0] = 102.0
    e1 = mod.nvmlDeviceGetTotalEnergyConsumption(h)
    assert e1 - e0 == 500_000  # 250 W x 2 s = 500 J = 500,000 mJ
    now[0] = 101.0  # a clock that steps back never decreases the counter
    assert mod.nvmlDeviceGetTotalEnergyConsumption(h) == e1


def test_reading_hook_follows_the_simulator():
    host = F.rtx_pro_6000_pcie_box(1)
    host.gpus[0].reading_fn = lambda gpu, now: F.Reading(power_w=123.456, gpu_util_pct=7, event_reasons=0x5)
    mod = _init(host)
    h = mod.nvmlDeviceGetHandleByIndex(0)
    assert mod.nvmlDeviceGetPowerUsage(h) == 123456
    assert mod.nvmlDeviceGetUtilizationRates(h).gpu == 7
    assert mod.nvmlDeviceGetCurrentClocksEventReasons(h) == 0x5


def test_init_error_for_the_no_driver_box():
    mod = F.make_module(F.no_driver_box())
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        mod.nvmlInit()
    mod = F.make_module(F.no_driver_box(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        mod.nvmlInit()


def test_every_optional_call_not_supported():
    mod = _init(F.all_optional_not_supported_box())
    h = mod.nvmlDeviceGetHandleByIndex(0)
    assert mod.nvmlDeviceGetName(h) == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    for name in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetCurrentClocksEventReasons"):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            getattr(mod, name)(h)


def test_gpm_with_the_real_structs():
    mod = _init(F.rtx_pro_6000_pcie_box(1))
    h = mod.nvmlDeviceGetHandleByIndex(0)
    assert mod.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    s1, s2 = mod.nvmlGpmSampleAlloc(), mod.nvmlGpmSampleAlloc()
    mod.nvmlGpmSampleGet(h, s1)
    mod.nvmlGpmSampleGet(h, s2)
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, 2, s1, s2
    mg.metrics[0].metricId = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    mg.metrics[1].metricId = pynvml.NVML_GPM_METRIC_FP64_UTIL
    mod.nvmlGpmMetricsGet(mg)
    assert mg.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS and mg.metrics[0].value == pytest.approx(4.12)
    assert mg.metrics[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    mod.nvmlGpmSampleFree(s1)
    mod.nvmlGpmSampleFree(s2)
