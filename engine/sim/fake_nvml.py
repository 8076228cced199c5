"""A stand-in for nvidia-ml-py's `pynvml` module, with NVML's units, errors and traps.

Product code, not only a test helper: the simulated host plugs it under `gpu_runbook.nvml.Nvml(module=...)`
so every GPU probe runs unchanged against it. It keeps NVML's semantics on purpose:

* integers in mW, mJ, MHz and KB/s, structs from the real binding where probes read fields;
* real `pynvml.NVMLError` subclasses, raised as NVML raises them (`NVMLError(NVML_ERROR_NOT_SUPPORTED)`);
* `nvmlInit` refcounting, `Uninitialized` before init, `FunctionNotFound` for any call the fake lacks;
* the tuple trap: passing `NVML_P2P_CAPS_INDEX_READ` (a tuple in the binding) raises `ctypes.ArgumentError`;
* the energy counter integrates power over monotonic time, so delta-energy / delta-time is the mean power;
* the PCIe byte counters (field values `NVML_FI_DEV_PCIE_COUNT_TX_BYTES`/`RX_BYTES`) integrate the
  traffic the same way, while `nvmlDeviceGetPcieThroughput` is a 20 ms snapshot in KB/s;
* `nvmlDeviceGetPowerUsage` is the 1 s average (Ampere+), `NVML_FI_DEV_POWER_INSTANT` the instant value;
  `nvmlDeviceGetFieldValues` fills one `c_nvmlFieldValue_t` per request and sets `nvmlReturn` on each.

Dynamic readings come from `FakeGpu.reading(now)`. It returns `FakeGpu.load` by default; the simulator
sets `FakeGpu.reading_fn` (a `(gpu, now) -> Reading` callable) to follow the load it generates.
"""

from __future__ import annotations

from types import SimpleNamespace

import ctypes
import threading
import time
import types
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import pynvml as _real  # imports fine without a GPU or driver

# What the probes treat as optional; `all_optional_not_supported_box` makes each of these raise NotSupported.
OPTIONAL_CALLS: frozenset[str] = frozenset(
    {
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetArchitecture",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetVirtualizationMode",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetSupportedClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetSupportedClocksThrottleReasons",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetP2PStatus",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleGet",
    }
)

# The nine documented clock-event reason bits (nvml.h 13.x).
EVENT_REASONS_DOCUMENTED = 0x1FF


@dataclass
class Reading:
    """One instant of a GPU's dynamic state, in human units (the fake converts to NVML's)."""

    power_w: float = 0.0
    gpu_util_pct: int = 0
    mem_util_pct: int = 0
    sm_clock_mhz: int = 0
    mem_clock_mhz: int = 0
    temperature_c: int = 30
    event_reasons: int = 0  # clocks-event-reasons bitmask
    pcie_tx_kbps: int = 0  # KB/s, as nvmlDeviceGetPcieThroughput returns (a 20 ms snapshot)
    pcie_rx_kbps: int = 0
    pcie_tx_bytes_per_s: float | None = None  # mean rate the byte counters integrate (default: the snapshot)
    pcie_rx_bytes_per_s: float | None = None
    power_instant_w: float | None = None  # NVML_FI_DEV_POWER_INSTANT (default: power_w)
    pstate: int = 0
    memory_used_bytes: int = 0
    # GPM metric id -> value (0..100), e.g. {pynvml.NVML_GPM_METRIC_SM_UTIL: 38.0}
    gpm: dict[int, float] = field(default_factory=dict)


@dataclass
class FakeGpu:
    """Static facts of one device plus its dynamic reading hook."""

    name: str
    uuid: str
    pci_bus_id: str
    compute_capability: tuple[int, int]
    architecture: int
    memory_total_bytes: int
    power_limit_enforced_w: float
    power_limit_requested_w: float
    power_limit_default_w: float
    power_limit_min_w: float
    power_limit_max_w: float
    max_sm_clock_mhz: int
    max_mem_clock_mhz: int
    pcie_gen_max: int = 5
    pcie_width_max: int = 16
    pcie_gen_current: int = 5
    pcie_width_current: int = 16
    nvlink_links: int = 0  # 0: nvmlDeviceGetNvLinkState raises NotSupported
    nvlink_active: bool = True
    virtualization_mode: int = _real.NVML_GPU_VIRTUALIZATION_MODE_NONE
    gpm_supported: bool = False
    supported_event_reasons: int = EVENT_REASONS_DOCUMENTED
    not_supported: set[str] = field(default_factory=set)  # function names that raise NotSupported
    load: Reading = field(default_factory=Reading)
    reading_fn: Callable[["FakeGpu", float], Reading] | None = None
    energy_mj: float = 1_000_000_000.0  # counter since "driver load"
    _energy_t: float | None = field(default=None, repr=False)
    pcie_bytes: list[float] = field(default_factory=lambda: [7.3e12, 6.9e12])  # TX, RX since driver load
    _pcie_t: float | None = field(default=None, repr=False)

    def reading(self, now: float) -> Reading:
        """The dynamic state at monotonic time `now`; the simulator overrides it through `reading_fn`."""
        return self.reading_fn(self, now) if self.reading_fn is not None else self.load

    def energy_at(self, now: float) -> int:
        """Integrate power (rectangle rule at each read) so the counter grows like NVML's, in mJ."""
        if self._energy_t is not None and now > self._energy_t:
            self.energy_mj += self.reading(now).power_w * 1000.0 * (now - self._energy_t)
        self._energy_t = now if self._energy_t is None else max(now, self._energy_t)
        return int(self.energy_mj)

    def pcie_bytes_at(self, now: float) -> tuple[int, int]:
        """Cumulative PCIe TX/RX bytes, integrated over the traffic like the energy counter (wraps at 2**64)."""
        if self._pcie_t is not None and now > self._pcie_t:
            r = self.reading(now)
            tx = r.pcie_tx_bytes_per_s if r.pcie_tx_bytes_per_s is not None else r.pcie_tx_kbps * 1000.0
            rx = r.pcie_rx_bytes_per_s if r.pcie_rx_bytes_per_s is not None else r.pcie_rx_kbps * 1000.0
            self.pcie_bytes[0] += tx * (now - self._pcie_t)
            self.pcie_bytes[1] += rx * (now - self._pcie_t)
        self._pcie_t = now if self._pcie_t is None else max(now, self._pcie_t)
        return int(self.pcie_bytes[0]) % (1 << 64), int(self.pcie_bytes[1]) % (1 << 64)


@dataclass
class FakeHost:
    """A host as NVML sees it: devices, driver, P2P and PCIe topology, or an init error."""

    gpus: list[FakeGpu]
    driver_version: str = "595.58.03"
    cuda_driver_version: int = 13020
    # P2P status per capability index (0 read, 1 write, 2 nvlink, ...): matrix[i][j]; missing index -> NotSupported
    p2p: dict[int, list[list[int]]] = field(default_factory=dict)
    topology: list[list[int]] | None = None  # common-ancestor levels; None -> NotSupported
    init_error: int | None = None  # NVML_ERROR_* code nvmlInit raises (no driver, no permission...)
    compute_pids: list[int] = field(default_factory=list)  # processes on every GPU (nvmlDeviceGetComputeRunningProcesses)
    clock: Callable[[], float] = time.monotonic


class _Handle:
    """Opaque device handle (the real one is a ctypes pointer)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


def _err(code: int) -> Exception:
    return _real.NVMLError(code)


def make_module(host: FakeHost) -> types.ModuleType:
    """A module object exposing the pynvml names the probes use, backed by `host`."""
    mod = types.ModuleType("fake_pynvml")
    # Constants, error classes and structs from the real binding (not its functions: they would call NVML).
    for key, value in vars(_real).items():
        if key.startswith("__"):
            continue
        if callable(value) and key.startswith("nvml") and not isinstance(value, type):
            continue
        setattr(mod, key, value)
    mod.__doc__ = "fake pynvml backed by gpu_runbook.sim.fake_nvml.FakeHost"
    mod.host = host  # type: ignore[attr-defined]

    state = {"refcount": 0}
    lock = threading.Lock()
    gpm_samples: dict[int, tuple[int, float]] = {}  # sample address -> (gpu index, time)
    gpm_keep: dict[int, Any] = {}

    def need_init() -> None:
        if state["refcount"] <= 0:
            raise _err(_real.NVML_ERROR_UNINITIALIZED)

    def gpu_of(handle: Any, fn_name: str) -> FakeGpu:
        need_init()
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(host.gpus):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = host.gpus[handle.index]
        if fn_name in gpu.not_supported:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def export(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(mod, fn.__name__, fn)
        return fn

    # --- init / system -------------------------------------------------------------------------
    @export
    def nvmlInit() -> None:
        nvmlInitWithFlags(0)

    @export
    def nvmlInitWithFlags(flags: int) -> None:
        if host.init_error is not None:
            raise _err(host.init_error)
        with lock:
            state["refcount"] += 1

    @export
    def nvmlShutdown() -> None:
        need_init()
        with lock:
            state["refcount"] -= 1

    @export
    def nvmlSystemGetDriverVersion() -> str:
        need_init()
        return host.driver_version

    @export
    def nvmlSystemGetCudaDriverVersion() -> int:
        need_init()
        return host.cuda_driver_version

    @export
    def nvmlDeviceGetCount() -> int:
        need_init()
        return len(host.gpus)

    @export
    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        need_init()
        if not 0 <= index < len(host.gpus):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    # --- identity --------------------------------------------------------------------------------
    @export
    def nvmlDeviceGetName(h: Any) -> str:
        return gpu_of(h, "nvmlDeviceGetName").name

    @export
    def nvmlDeviceGetUUID(h: Any) -> str:
        return gpu_of(h, "nvmlDeviceGetUUID").uuid

    @export
    def nvmlDeviceGetPciInfo(h: Any) -> Any:
        g = gpu_of(h, "nvmlDeviceGetPciInfo")
        info = _real.nvmlPciInfo_t()
        info.busId = g.pci_bus_id.encode()
        dom, bus, dev = g.pci_bus_id.split(":")[0], g.pci_bus_id.split(":")[1], g.pci_bus_id.split(":")[2]
        info.busIdLegacy = f"{int(dom, 16):04X}:{bus}:{dev}".encode()
        info.domain, info.bus, info.device = int(dom, 16), int(bus, 16), int(dev.split(".")[0], 16)
        return info

    mod.nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo  # type: ignore[attr-defined]

    @export
    def nvmlDeviceGetCudaComputeCapability(h: Any) -> tuple[int, int]:
        return gpu_of(h, "nvmlDeviceGetCudaComputeCapability").compute_capability

    @export
    def nvmlDeviceGetArchitecture(h: Any) -> int:
        return gpu_of(h, "nvmlDeviceGetArchitecture").architecture

    @export
    def nvmlDeviceGetComputeRunningProcesses(h: Any) -> list[Any]:
        gpu_of(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=None) for pid in host.compute_pids]

    @export
    def nvmlDeviceGetMemoryInfo(h: Any, version: Any = None) -> Any:
        g = gpu_of(h, "nvmlDeviceGetMemoryInfo")
        mem = _real.c_nvmlMemory_t()
        used = min(g.memory_total_bytes, int(g.reading(host.clock()).memory_used_bytes))
        mem.total, mem.used = g.memory_total_bytes, used
        mem.free = g.memory_total_bytes - used
        return mem

    @export
    def nvmlDeviceGetPerformanceState(h: Any) -> int:
        return int(gpu_of(h, "nvmlDeviceGetPerformanceState").reading(host.clock()).pstate)

    @export
    def nvmlDeviceGetVirtualizationMode(h: Any) -> int:
        return gpu_of(h, "nvmlDeviceGetVirtualizationMode").virtualization_mode

    # --- power / energy (mW, mJ) ---------------------------------------------------------------
    @export
    def nvmlDeviceGetPowerUsage(h: Any) -> int:
        g = gpu_of(h, "nvmlDeviceGetPowerUsage")
        return int(round(g.reading(host.clock()).power_w * 1000))

    @export
    def nvmlDeviceGetPowerManagementLimit(h: Any) -> int:
        return int(round(gpu_of(h, "nvmlDeviceGetPowerManagementLimit").power_limit_requested_w * 1000))

    @export
    def nvmlDeviceGetEnforcedPowerLimit(h: Any) -> int:
        return int(round(gpu_of(h, "nvmlDeviceGetEnforcedPowerLimit").power_limit_enforced_w * 1000))

    @export
    def nvmlDeviceGetPowerManagementDefaultLimit(h: Any) -> int:
        return int(round(gpu_of(h, "nvmlDeviceGetPowerManagementDefaultLimit").power_limit_default_w * 1000))

    @export
    def nvmlDeviceGetPowerManagementLimitConstraints(h: Any) -> list[int]:
        g = gpu_of(h, "nvmlDeviceGetPowerManagementLimitConstraints")
        return [int(round(g.power_limit_min_w * 1000)), int(round(g.power_limit_max_w * 1000))]

    @export
    def nvmlDeviceGetTotalEnergyConsumption(h: Any) -> int:
        g = gpu_of(h, "nvmlDeviceGetTotalEnergyConsumption")
        with lock:
            return g.energy_at(host.clock())

    @export
    def nvmlDeviceGetFieldValues(h: Any, field_ids: list[Any]) -> Any:
        """NVML's batch read: one c_nvmlFieldValue_t per id; unknown fields carry NOT_SUPPORTED in nvmlReturn."""
        g = gpu_of(h, "nvmlDeviceGetFieldValues")
        now = host.clock()
        values = (_real.c_nvmlFieldValue_t * len(field_ids))()
        r = g.reading(now)
        with lock:
            tx, rx = g.pcie_bytes_at(now)
        for i, fid in enumerate(field_ids):
            v = values[i]
            try:
                v.fieldId, v.scopeId = fid
            except TypeError:
                v.fieldId = fid
            v.timestamp = int(time.time() * 1e6)
            v.latencyUsec = 0
            v.nvmlReturn = _real.NVML_SUCCESS
            if v.fieldId == _real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
                v.valueType, v.value.ullVal = _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, tx
            elif v.fieldId == _real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
                v.valueType, v.value.ullVal = _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, rx
            elif v.fieldId == _real.NVML_FI_DEV_POWER_INSTANT and v.scopeId == 0:
                w = r.power_instant_w if r.power_instant_w is not None else r.power_w
                v.valueType, v.value.uiVal = _real.NVML_VALUE_TYPE_UNSIGNED_INT, int(round(w * 1000))
            elif v.fieldId == _real.NVML_FI_DEV_POWER_AVERAGE and v.scopeId == 0:
                v.valueType, v.value.uiVal = _real.NVML_VALUE_TYPE_UNSIGNED_INT, int(round(r.power_w * 1000))
            elif v.fieldId == _real.NVML_FI_DEV_ENERGY and v.scopeId == 0:
                with lock:
                    v.valueType, v.value.ullVal = _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, g.energy_at(now)
            else:
                v.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
        return values

    # --- utilisation, clocks, temperature ------------------------------------------------------
    @export
    def nvmlDeviceGetUtilizationRates(h: Any) -> Any:
        r = gpu_of(h, "nvmlDeviceGetUtilizationRates").reading(host.clock())
        util = _real.c_nvmlUtilization_t()
        util.gpu, util.memory = int(r.gpu_util_pct), int(r.mem_util_pct)
        return util

    @export
    def nvmlDeviceGetClockInfo(h: Any, clock_type: int) -> int:
        r = gpu_of(h, "nvmlDeviceGetClockInfo").reading(host.clock())
        if clock_type in (_real.NVML_CLOCK_SM, _real.NVML_CLOCK_GRAPHICS):
            return int(r.sm_clock_mhz)
        if clock_type == _real.NVML_CLOCK_MEM:
            return int(r.mem_clock_mhz)
        raise _err(_real.NVML_ERROR_NOT_SUPPORTED)

    @export
    def nvmlDeviceGetMaxClockInfo(h: Any, clock_type: int) -> int:
        g = gpu_of(h, "nvmlDeviceGetMaxClockInfo")
        if clock_type in (_real.NVML_CLOCK_SM, _real.NVML_CLOCK_GRAPHICS):
            return g.max_sm_clock_mhz
        if clock_type == _real.NVML_CLOCK_MEM:
            return g.max_mem_clock_mhz
        raise _err(_real.NVML_ERROR_NOT_SUPPORTED)

    @export
    def nvmlDeviceGetTemperatureV(h: Any, sensor: int, version: Any = None) -> int:
        return int(gpu_of(h, "nvmlDeviceGetTemperatureV").reading(host.clock()).temperature_c)

    @export
    def nvmlDeviceGetTemperature(h: Any, sensor: int) -> int:
        return int(gpu_of(h, "nvmlDeviceGetTemperature").reading(host.clock()).temperature_c)

    @export
    def nvmlDeviceGetCurrentClocksEventReasons(h: Any) -> int:
        g = gpu_of(h, "nvmlDeviceGetCurrentClocksEventReasons")
        return g.reading(host.clock()).event_reasons & g.supported_event_reasons

    @export
    def nvmlDeviceGetSupportedClocksEventReasons(h: Any) -> int:
        return gpu_of(h, "nvmlDeviceGetSupportedClocksEventReasons").supported_event_reasons

    @export
    def nvmlDeviceGetCurrentClocksThrottleReasons(h: Any) -> int:
        g = gpu_of(h, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return g.reading(host.clock()).event_reasons & g.supported_event_reasons

    @export
    def nvmlDeviceGetSupportedClocksThrottleReasons(h: Any) -> int:
        return gpu_of(h, "nvmlDeviceGetSupportedClocksThrottleReasons").supported_event_reasons

    # --- PCIe -----------------------------------------------------------------------------------
    @export
    def nvmlDeviceGetPcieThroughput(h: Any, counter: int) -> int:
        r = gpu_of(h, "nvmlDeviceGetPcieThroughput").reading(host.clock())
        if counter == _real.NVML_PCIE_UTIL_TX_BYTES:
            return int(r.pcie_tx_kbps)
        if counter == _real.NVML_PCIE_UTIL_RX_BYTES:
            return int(r.pcie_rx_kbps)
        raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)

    @export
    def nvmlDeviceGetCurrPcieLinkGeneration(h: Any) -> int:
        return gpu_of(h, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen_current

    @export
    def nvmlDeviceGetMaxPcieLinkGeneration(h: Any) -> int:
        return gpu_of(h, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_gen_max

    @export
    def nvmlDeviceGetCurrPcieLinkWidth(h: Any) -> int:
        return gpu_of(h, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width_current

    @export
    def nvmlDeviceGetMaxPcieLinkWidth(h: Any) -> int:
        return gpu_of(h, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width_max

    # --- NVLink, P2P, topology ------------------------------------------------------------------
    @export
    def nvmlDeviceGetNvLinkState(h: Any, link: int) -> int:
        g = gpu_of(h, "nvmlDeviceGetNvLinkState")
        if g.nvlink_links <= 0:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < g.nvlink_links:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _real.NVML_FEATURE_ENABLED if g.nvlink_active else _real.NVML_FEATURE_DISABLED

    @export
    def nvmlDeviceGetP2PStatus(h1: Any, h2: Any, p2p_index: Any) -> int:
        if not isinstance(p2p_index, int):
            # What ctypes does with the binding's `NVML_P2P_CAPS_INDEX_READ = 0,` tuple.
            raise ctypes.ArgumentError("argument 3: TypeError: Don't know how to convert parameter 3")
        gpu_of(h1, "nvmlDeviceGetP2PStatus")
        gpu_of(h2, "nvmlDeviceGetP2PStatus")
        matrix = host.p2p.get(p2p_index)
        if matrix is None:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        return matrix[h1.index][h2.index]

    @export
    def nvmlDeviceGetTopologyCommonAncestor(h1: Any, h2: Any) -> int:
        gpu_of(h1, "nvmlDeviceGetTopologyCommonAncestor")
        gpu_of(h2, "nvmlDeviceGetTopologyCommonAncestor")
        if host.topology is None:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        return host.topology[h1.index][h2.index]

    # --- GPM ------------------------------------------------------------------------------------
    @export
    def nvmlGpmQueryDeviceSupport(h: Any) -> Any:
        g = gpu_of(h, "nvmlGpmQueryDeviceSupport")
        support = _real.c_nvmlGpmSupport_t()
        support.version = _real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if g.gpm_supported else 0
        return support

    @export
    def nvmlGpmSampleAlloc() -> Any:
        need_init()
        sample = ctypes.pointer(_real.struct_c_nvmlGpmSample_t())
        gpm_keep[ctypes.addressof(sample.contents)] = sample
        return sample

    @export
    def nvmlGpmSampleFree(sample: Any) -> None:
        need_init()
        addr = ctypes.addressof(sample.contents)
        gpm_samples.pop(addr, None)
        gpm_keep.pop(addr, None)

    @export
    def nvmlGpmSampleGet(h: Any, sample: Any) -> Any:
        g = gpu_of(h, "nvmlGpmSampleGet")
        if not g.gpm_supported:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        gpm_samples[ctypes.addressof(sample.contents)] = (h.index, host.clock())
        return sample

    @export
    def nvmlGpmMetricsGet(metrics_get: Any) -> Any:
        need_init()
        if metrics_get.version != _real.NVML_GPM_METRICS_GET_VERSION:
            raise _err(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        try:
            s1 = gpm_samples[ctypes.addressof(metrics_get.sample1.contents)]
            s2 = gpm_samples[ctypes.addressof(metrics_get.sample2.contents)]
        except (KeyError, ValueError) as exc:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT) from exc
        if s1[0] != s2[0]:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        reading = host.gpus[s2[0]].reading(s2[1])
        for i in range(metrics_get.numMetrics):
            m = metrics_get.metrics[i]
            if m.metricId in reading.gpm:
                m.value = float(reading.gpm[m.metricId])
                m.nvmlReturn = _real.NVML_SUCCESS
            else:
                m.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
        return metrics_get

    def __getattr__(name: str) -> Any:
        # Like an old driver without the symbol: the binding raises FunctionNotFound when called.
        if name.startswith("nvml"):
            def missing(*_a: Any, **_k: Any) -> Any:
                raise _err(_real.NVML_ERROR_FUNCTION_NOT_FOUND)

            missing.__name__ = name
            return missing
        raise AttributeError(name)

    mod.__getattr__ = __getattr__  # type: ignore[attr-defined]
    return mod


# --- builders --------------------------------------------------------------------------------------

def _copy(reading: Reading) -> Reading:
    """Each GPU gets its own Reading (and gpm dict), so a scenario can change one GPU alone."""
    return replace(reading, gpm=dict(reading.gpm))


def _matrix(n: int, off_diag: int, diag: int = _real.NVML_P2P_STATUS_OK) -> list[list[int]]:
    return [[diag if i == j else off_diag for j in range(n)] for i in range(n)]


RTX_PRO_6000_UNDER_LOAD = Reading(
    power_w=235.412,
    gpu_util_pct=100,
    mem_util_pct=61,
    sm_clock_mhz=2400,
    mem_clock_mhz=12481,
    temperature_c=58,
    event_reasons=0,
    pcie_tx_kbps=6_300_000,  # 6.3 GB/s: allreduce traffic through host memory
    pcie_rx_kbps=6_300_000,
    gpm={
        _real.NVML_GPM_METRIC_SM_UTIL: 38.0,
        _real.NVML_GPM_METRIC_SM_OCCUPANCY: 12.0,
        _real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 4.12,
        _real.NVML_GPM_METRIC_DRAM_BW_UTIL: 62.0,
    },
)


def rtx_pro_6000_pcie_box(n: int = 8, *, gpm_supported: bool = True, load: Reading | None = None) -> FakeHost:
    """The seeds' box: 8x RTX PRO 6000 Blackwell Server Edition in a KVM guest (passthrough), PCIe Gen5
    x16, no NVLink, P2P NOT_SUPPORTED between all pairs, 600 W limit, ~235 W drawn at 100 % util.

    Whether GB202 is a GPM "supported device" is unconfirmed; `gpm_supported` lets a scenario choose.
    """
    gpus = []
    for i in range(n):
        gpus.append(
            FakeGpu(
                name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
                uuid=f"GPU-e588912b-1368-6b4f-0e2a-0d08f8afb3{i:02x}",
                pci_bus_id=f"00000000:{0x06 + i * 0x10:02X}:00.0",
                compute_capability=(12, 0),
                architecture=_real.NVML_DEVICE_ARCH_BLACKWELL,
                memory_total_bytes=97887 * 1024 * 1024,
                power_limit_enforced_w=600.0,
                power_limit_requested_w=600.0,
                power_limit_default_w=600.0,
                power_limit_min_w=300.0,
                power_limit_max_w=600.0,
                max_sm_clock_mhz=2430,
                max_mem_clock_mhz=12481,
                pcie_gen_max=5,
                pcie_width_max=16,
                pcie_gen_current=5,
                pcie_width_current=16,
                nvlink_links=0,
                virtualization_mode=_real.NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH,
                gpm_supported=gpm_supported,
                load=_copy(load or RTX_PRO_6000_UNDER_LOAD),
            )
        )
    ns = _real.NVML_P2P_STATUS_NOT_SUPPORTED
    return FakeHost(
        gpus=gpus,
        p2p={0: _matrix(n, ns), 1: _matrix(n, ns), 2: _matrix(n, ns), 3: _matrix(n, ns), 4: _matrix(n, ns)},
        # A KVM guest sees every GPU behind the emulated host bridge: nvidia-smi prints PHB.
        topology=[[0 if i == j else _real.NVML_TOPOLOGY_HOSTBRIDGE for j in range(n)] for i in range(n)],
    )


H100_UNDER_LOAD = Reading(
    power_w=612.5,
    gpu_util_pct=100,
    mem_util_pct=45,
    sm_clock_mhz=1755,
    mem_clock_mhz=2619,
    temperature_c=67,
    event_reasons=int(_real.nvmlClocksEventReasonSwPowerCap),
    pcie_tx_kbps=250_000,
    pcie_rx_kbps=250_000,
    gpm={
        _real.NVML_GPM_METRIC_SM_UTIL: 92.0,
        _real.NVML_GPM_METRIC_SM_OCCUPANCY: 41.0,
        _real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 55.0,
        _real.NVML_GPM_METRIC_DRAM_BW_UTIL: 48.0,
    },
)


def h100_sxm_nvlink_box(n: int = 8, *, load: Reading | None = None) -> FakeHost:
    """An HGX H100 SXM5 80GB: 700 W limit (min 200 W), 18 NVLink links per GPU, P2P OK over NVLink."""
    gpus = []
    for i in range(n):
        gpus.append(
            FakeGpu(
                name="NVIDIA H100 80GB HBM3",
                uuid=f"GPU-4a1c0b8e-7d3f-11ee-9c2a-0242ac1200{i:02x}",
                pci_bus_id=f"00000000:{[0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB][i % 8]:02X}:00.0",
                compute_capability=(9, 0),
                architecture=_real.NVML_DEVICE_ARCH_HOPPER,
                memory_total_bytes=81559 * 1024 * 1024,
                power_limit_enforced_w=700.0,
                power_limit_requested_w=700.0,
                power_limit_default_w=700.0,
                power_limit_min_w=200.0,
                power_limit_max_w=700.0,
                max_sm_clock_mhz=1980,
                max_mem_clock_mhz=2619,
                pcie_gen_max=5,
                pcie_width_max=16,
                pcie_gen_current=5,
                pcie_width_current=16,
                nvlink_links=18,
                virtualization_mode=_real.NVML_GPU_VIRTUALIZATION_MODE_NONE,
                gpm_supported=True,
                load=_copy(load or H100_UNDER_LOAD),
            )
        )
    ok = _real.NVML_P2P_STATUS_OK
    topo = []
    for i in range(n):
        row = []
        for j in range(n):
            if i == j:
                row.append(_real.NVML_TOPOLOGY_INTERNAL)
            elif i // 4 == j // 4:
                row.append(_real.NVML_TOPOLOGY_NODE)
            else:
                row.append(_real.NVML_TOPOLOGY_SYSTEM)
        topo.append(row)
    return FakeHost(
        gpus=gpus,
        driver_version="590.48.01",
        cuda_driver_version=13010,
        p2p={k: _matrix(n, ok) for k in (0, 1, 2, 3, 4)},
        topology=topo,
    )


def all_optional_not_supported_box(n: int = 2) -> FakeHost:
    """Devices that answer only identity calls: every optional query raises NotSupported."""
    host = rtx_pro_6000_pcie_box(n)
    for g in host.gpus:
        g.not_supported = set(OPTIONAL_CALLS)
    host.p2p = {}
    host.topology = None
    return host


def no_driver_box(error: int = _real.NVML_ERROR_LIBRARY_NOT_FOUND) -> FakeHost:
    """No driver at all: nvmlInit raises (LibraryNotFound by default; DriverNotLoaded, NoPermission...)."""
    return FakeHost(gpus=[], init_error=error)
