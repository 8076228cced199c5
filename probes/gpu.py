"""GPU probes over NVML: inventory, sampled power/utilisation/clocks, topology/P2P, GPM activity.

All NVML access goes through `ctx.nvml` (gpu_runbook.nvml.Nvml), so tests and the simulator run these
probes unchanged on a fake `pynvml`. Conventions every probe here follows:

* Units are in the key names (`_w`, `_mhz`, `_pct`, `_gbps`, `_bytes`); ratios are 0..1.
* A value the device does not report (NotSupported, FunctionNotFound, NoData...) is present with the
  value None (JSON null), never 0; a stats dict is None when no sample had a value. Rules test
  `x != null` before comparing.
* Stats dicts are `{"mean", "min", "max", "p50", "p95"}`.
* No driver / library / permission: `unavailable` with the NVML error's class name and advice.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from gpu_runbook.evidence import Bars, Evidence, Series, Table, downsample, utcnow
from gpu_runbook.nvml import (
    CLOCK_EVENT_REASONS,
    MISSING_ERRORS,
    Device,
    Devices,
    error_name,
    is_missing,
    is_nvml_error,
    is_unavailable_error,
    open_devices,
    unavailable_reason,
)
from gpu_runbook.probe import Context, Probe

# --- shared helpers ------------------------------------------------------------------------------

STAT_KEYS = ("mean", "min", "max", "p50", "p95")

EVENT_REASONS = CLOCK_EVENT_REASONS
# Reasons that hold clocks below what the workload asks for (not idle, not a user setting).
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
# Reasons that slow the GPU regardless of the power limit: thermal, HW slowdown, power brake. NVML sets
# hw_slowdown together with HW thermal or the brake, so count samples with any of them (never add fractions).
SLOWDOWN_MASK = 0x8 | 0x20 | 0x40 | 0x80

VIRTUALIZATION_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}
ARCHITECTURES = {
    2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere", 8: "ada",
    9: "hopper", 10: "blackwell", 13: "rubin",
}
# nvmlDeviceGetTopologyCommonAncestor levels, named as `nvidia-smi topo -m` does ("INT": same board).
TOPOLOGY_LEVELS = {0: "INT", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlDeviceGetP2PStatus results, named as `nvidia-smi topo -p2p` does.
P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2}  # literal ints: the binding's READ constant is a tuple

EVENT_FN = "nvmlDeviceGetCurrentClocksEventReasons"
THROTTLE_FN = "nvmlDeviceGetCurrentClocksThrottleReasons"


def pcie_lane_gbps(gen: int) -> float | None:
    """Usable GB/s per lane per direction: GT/s x encoding efficiency / 8 (Gen5 x16 = 63.0 GB/s)."""
    table = {1: 2.5 * 0.8 / 8, 2: 5.0 * 0.8 / 8, 3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8,
             5: 32 * 128 / 130 / 8, 6: 64 * 242 / 256 / 8}
    return table.get(gen)


def pcie_link_gbps(gen: int | None, width: int | None) -> float | None:
    if gen is None or width is None:
        return None
    lane = pcie_lane_gbps(gen)
    return None if lane is None else round(lane * width, 3)


def _percentile(sorted_xs: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = (len(sorted_xs) - 1) * pct / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def stats(xs: list[float | None]) -> dict[str, float] | None:
    vals = sorted(float(x) for x in xs if x is not None)
    if not vals:
        return None
    out = {
        "mean": sum(vals) / len(vals),
        "min": vals[0],
        "max": vals[-1],
        "p50": _percentile(vals, 50),
        "p95": _percentile(vals, 95),
    }
    return {k: round(v, 6) for k, v in out.items()}


def _w(mw: int | None) -> float | None:
    return None if mw is None else mw / 1000.0


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _present(xs: list[Any]) -> list[Any]:
    return [x for x in xs if x is not None]


def _min(xs: list[Any]) -> Any:
    xs = _present(xs)
    return min(xs) if xs else None


def _max(xs: list[Any]) -> Any:
    xs = _present(xs)
    return max(xs) if xs else None


class _Reader:
    """Calls NVML by name; missing values become None and are remembered, other NVML errors are noted."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.missing: dict[str, str] = {}  # function name -> error name (NotSupported, FunctionNotFound...)
        self.errors: dict[str, str] = {}  # function name -> unexpected NVML error name

    def q(self, name: str, *args: Any) -> Any:
        fn = getattr(self.lib, name, None)
        if fn is None:
            self.missing[name] = "NVMLError_FunctionNotFound"
            return None
        try:
            return fn(*args)
        except Exception as exc:
            if is_missing(exc):
                self.missing.setdefault(name, error_name(exc))
                return None
            if is_nvml_error(exc):
                self.errors[name] = error_name(exc)
                return None
            raise


class GpuSelection(BaseModel):
    """Which GPUs a probe reads: on a host shared by several servers, only the ones under test."""

    model_config = ConfigDict(extra="forbid")
    gpus: list[int] = Field(
        default_factory=list,
        description="NVML indices (as nvidia-smi numbers them) of the GPUs to read; empty: every GPU",
    )


async def _open(ctx: Context, only: list[int] | None = None) -> Devices | Evidence:
    """Init NVML and open the devices (those in `only`, when given), or the `unavailable` evidence saying why not."""
    try:
        devs = await ctx.nvml.call(open_devices)
    except Exception as exc:
        if is_unavailable_error(exc):
            return Evidence.unavailable(unavailable_reason(exc))
        raise
    if only:
        present = sorted([d.index for d in devs.devices] + list(devs.skipped))
        absent = sorted(set(only) - set(present))
        if absent:
            return Evidence.unavailable(f"no GPU with index {', '.join(map(str, absent))}: NVML numbers this host's GPUs {present}")
        devs = Devices([d for d in devs.devices if d.index in only], {i: e for i, e in devs.skipped.items() if i in only})
    if not devs.devices:
        if devs.skipped:
            return Evidence.unavailable(
                f"{next(iter(devs.skipped.values()))}: NVML lists GPUs but none could be opened; "
                "run as root or check `dmesg` for lost GPUs."
            )
        return Evidence.unavailable("no GPU: the NVIDIA driver is loaded but nvmlDeviceGetCount() is 0.")
    return devs


def _nvlink_links(r: _Reader, h: Any) -> tuple[int | None, int | None]:
    """(link count, active links). NotSupported on link 0 means no NVLink; InvalidArgument ends the list."""
    lib = r.lib
    fn = getattr(lib, "nvmlDeviceGetNvLinkState", None)
    if fn is None:
        return None, None
    links = active = 0
    for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = fn(h, link)
        except Exception as exc:
            if not is_nvml_error(exc):
                raise
            name = error_name(exc)
            if name == "NVMLError_InvalidArgument" or (name == "NVMLError_NotSupported" and link == 0):
                break  # past the last link / no NVLink at all: both mean "no such link"
            if name in MISSING_ERRORS:
                continue
            r.errors["nvmlDeviceGetNvLinkState"] = name
            return None, None
        links += 1
        active += 1 if state == lib.NVML_FEATURE_ENABLED else 0
    return links, active


def _static(r: _Reader, dev: Device) -> dict[str, Any]:
    """The per-GPU facts inventory reports (also what sample needs for its ratios)."""
    lib, h = r.lib, dev.handle
    pci = r.q("nvmlDeviceGetPciInfo", h)
    cc = r.q("nvmlDeviceGetCudaComputeCapability", h)
    arch = r.q("nvmlDeviceGetArchitecture", h)
    mem = r.q("nvmlDeviceGetMemoryInfo", h)
    virt = r.q("nvmlDeviceGetVirtualizationMode", h)
    constraints = r.q("nvmlDeviceGetPowerManagementLimitConstraints", h)
    gen_max = r.q("nvmlDeviceGetMaxPcieLinkGeneration", h)
    width_max = r.q("nvmlDeviceGetMaxPcieLinkWidth", h)
    links, active = _nvlink_links(r, h)
    return {
        "index": dev.index,
        "name": r.q("nvmlDeviceGetName", h),
        "uuid": r.q("nvmlDeviceGetUUID", h),
        "pci_bus_id": None if pci is None else pci.busId,
        "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
        "compute_capability_major": None if cc is None else int(cc[0]),
        "compute_capability_minor": None if cc is None else int(cc[1]),
        "architecture": None if arch is None else ARCHITECTURES.get(int(arch), "unknown"),
        "memory_total_bytes": None if mem is None else int(mem.total),
        "memory_total_mib": None if mem is None else int(mem.total) // (1024 * 1024),
        "virtualization_mode": None if virt is None else VIRTUALIZATION_MODES.get(int(virt), "unknown"),
        "power_limit_enforced_w": _w(r.q("nvmlDeviceGetEnforcedPowerLimit", h)),
        "power_limit_requested_w": _w(r.q("nvmlDeviceGetPowerManagementLimit", h)),
        "power_limit_default_w": _w(r.q("nvmlDeviceGetPowerManagementDefaultLimit", h)),
        "power_limit_min_w": None if constraints is None else _w(constraints[0]),
        "power_limit_max_w": None if constraints is None else _w(constraints[1]),
        "max_sm_clock_mhz": r.q("nvmlDeviceGetMaxClockInfo", h, lib.NVML_CLOCK_SM),
        "max_mem_clock_mhz": r.q("nvmlDeviceGetMaxClockInfo", h, lib.NVML_CLOCK_MEM),
        "pcie_link_gen_current": r.q("nvmlDeviceGetCurrPcieLinkGeneration", h),
        "pcie_link_gen_max": gen_max,
        "pcie_link_width_current": r.q("nvmlDeviceGetCurrPcieLinkWidth", h),
        "pcie_link_width_max": width_max,
        "pcie_link_max_gbps": pcie_link_gbps(gen_max, width_max),
        "nvlink_link_count": links,
        "nvlink_active_links": active,
    }


def _first(xs: list[Any]) -> Any:
    return next((x for x in xs if x is not None), None)


def _cuda_version(v: int | None) -> str | None:
    return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"


def _stamp(ev: Evidence, started: Any) -> Evidence:
    ev.started_at = ev.started_at or started
    ev.finished_at = utcnow()
    return ev


# --- gpu.inventory -------------------------------------------------------------------------------


class InventoryParams(GpuSelection):
    pass


class GpuInventory(Probe):
    """What GPUs the host has, their limits, links and driver, read once from NVML.

    Values (None where NVML does not report it):
      gpu_count, gpu_name (first GPU), gpu_names (distinct), homogeneous (bool),
      driver_version (str), cuda_driver_version (str "13.2"), cuda_driver_version_int (13020),
      compute_capability (str "12.0"), compute_capability_major (int), architecture ("blackwell"...),
      virtualization_mode ("none" | "passthrough" | "vgpu" | "host_vgpu" | "host_vsga"),
      power_limit_enforced_w (min over GPUs), power_limit_requested_w (min), power_limit_default_w (min),
      power_limit_min_w (min), power_limit_max_w (max over GPUs of the max constraint),
      max_sm_clock_mhz (min), memory_total_bytes (min),
      pcie_link_gen_max (min), pcie_link_width_max (min), pcie_link_max_gbps (min, per direction),
      nvlink_links_total, nvlink_active_links_total, skipped_gpus ({index: error name}),
      unsupported_calls (sorted NVML function names that were missing), errors ({function: error name}),
      gpus: list of per-GPU dicts with index, name, uuid, pci_bus_id, compute_capability,
        compute_capability_major, compute_capability_minor, architecture, memory_total_bytes,
        memory_total_mib, virtualization_mode, power_limit_enforced_w, power_limit_requested_w,
        power_limit_default_w, power_limit_min_w, power_limit_max_w, max_sm_clock_mhz,
        max_mem_clock_mhz, pcie_link_gen_current, pcie_link_gen_max, pcie_link_width_current,
        pcie_link_width_max, pcie_link_max_gbps, nvlink_link_count, nvlink_active_links.
    """

    name = "gpu.inventory"
    prefetch = True
    description = "GPUs, driver, power limits, clocks, PCIe and NVLink links, from NVML"
    Params = InventoryParams
    default_timeout_s = 30.0

    async def run(self, ctx: Context, params: Any) -> Evidence:
        started = utcnow()
        devs = await _open(ctx, params.gpus)
        if isinstance(devs, Evidence):
            return _stamp(devs, started)

        def read(lib: Any) -> tuple[list[dict[str, Any]], Any, Any, _Reader]:
            r = _Reader(lib)
            gpus = [_static(r, d) for d in devs.devices]
            return gpus, r.q("nvmlSystemGetDriverVersion"), r.q("nvmlSystemGetCudaDriverVersion"), r

        gpus, driver, cuda, r = await ctx.nvml.call(read)
        col = lambda k: [g[k] for g in gpus]  # noqa: E731
        names = list(dict.fromkeys(_present(col("name"))))
        links = _present(col("nvlink_link_count"))
        active = _present(col("nvlink_active_links"))
        values: dict[str, Any] = {
            "gpu_count": len(gpus),
            "gpu_name": _first(col("name")),
            "gpu_names": names,
            "homogeneous": len(names) <= 1,
            "driver_version": driver,
            "cuda_driver_version": _cuda_version(cuda),
            "cuda_driver_version_int": cuda,
            "compute_capability": _first(col("compute_capability")),
            "compute_capability_major": _first(col("compute_capability_major")),
            "architecture": _first(col("architecture")),
            "virtualization_mode": _first(col("virtualization_mode")),
            "power_limit_enforced_w": _min(col("power_limit_enforced_w")),
            "power_limit_requested_w": _min(col("power_limit_requested_w")),
            "power_limit_default_w": _min(col("power_limit_default_w")),
            "power_limit_min_w": _min(col("power_limit_min_w")),
            "power_limit_max_w": _max(col("power_limit_max_w")),
            "max_sm_clock_mhz": _min(col("max_sm_clock_mhz")),
            "memory_total_bytes": _min(col("memory_total_bytes")),
            "pcie_link_gen_max": _min(col("pcie_link_gen_max")),
            "pcie_link_width_max": _min(col("pcie_link_width_max")),
            "pcie_link_max_gbps": _min(col("pcie_link_max_gbps")),
            "nvlink_links_total": sum(links) if links else None,
            "nvlink_active_links_total": sum(active) if active else None,
            "skipped_gpus": {str(k): v for k, v in devs.skipped.items()},
            "unsupported_calls": sorted(r.missing),
            "errors": dict(r.errors),
            "gpus": gpus,
        }
        table = Table(
            title="GPU inventory",
            columns=["GPU", "name", "bus id", "CC", "memory MiB", "power limit W (enforced/max)",
                     "max SM MHz", "PCIe gen/width (cur/max)", "NVLink links", "virtualization"],
            rows=[
                [g["index"], g["name"], g["pci_bus_id"], g["compute_capability"], g["memory_total_mib"],
                 f"{g['power_limit_enforced_w']}/{g['power_limit_max_w']}", g["max_sm_clock_mhz"],
                 f"Gen{g['pcie_link_gen_current']}x{g['pcie_link_width_current']}"
                 f"/Gen{g['pcie_link_gen_max']}x{g['pcie_link_width_max']}",
                 g["nvlink_link_count"], g["virtualization_mode"]]
                for g in gpus
            ],
        )
        limit = values["power_limit_enforced_w"]
        summary = (
            f"{len(gpus)}x {values['gpu_name']}, driver {driver}, CC {values['compute_capability']}, "
            f"power limit {limit if limit is None else f'{limit:g}'} W, "
            f"NVLink links {values['nvlink_links_total']}, virtualization {values['virtualization_mode']}"
        )
        return Evidence(summary=summary, values=values, blocks=[table], started_at=started, finished_at=utcnow())


# --- gpu.sample ----------------------------------------------------------------------------------


class SampleParams(GpuSelection):
    duration_s: float = Field(10.0, gt=0, le=3600, description="sampling window")
    interval_s: float = Field(0.5, ge=0.01, le=60, description="time between samples")


@dataclass
class _Track:
    """What one GPU produced over the window."""

    t: list[float] = field(default_factory=list)
    power_mw: list[int | None] = field(default_factory=list)
    gpu_util: list[int | None] = field(default_factory=list)
    mem_util: list[int | None] = field(default_factory=list)
    sm_clock: list[int | None] = field(default_factory=list)
    mem_clock: list[int | None] = field(default_factory=list)
    temp: list[int | None] = field(default_factory=list)
    reasons: list[int | None] = field(default_factory=list)
    tx_kbps: list[int | None] = field(default_factory=list)
    rx_kbps: list[int | None] = field(default_factory=list)
    energy: list[tuple[float, int]] = field(default_factory=list)  # (monotonic s, mJ)
    pcie_bytes: list[tuple[float, int | None, int | None]] = field(default_factory=list)  # (monotonic s, TX, RX)
    power_instant_mw: list[int | None] = field(default_factory=list)


class _Sampler:
    """Reads every GPU in one go per tick; calls a device lacks are not retried within the window."""

    def __init__(self, lib: Any, devices: list[Device]) -> None:
        self.lib = lib
        self.devices = devices
        self.dead: list[dict[str, str]] = [{} for _ in devices]  # per GPU: function -> error name
        self.errors: dict[str, str] = {}
        self.reasons_source: list[str | None] = [EVENT_FN for _ in devices]
        self.tracks = [_Track() for _ in devices]
        self.tx, self.rx = lib.NVML_PCIE_UTIL_TX_BYTES, lib.NVML_PCIE_UTIL_RX_BYTES
        self.sm, self.mem = lib.NVML_CLOCK_SM, lib.NVML_CLOCK_MEM
        self.temp_sensor = lib.NVML_TEMPERATURE_GPU
        # Field ids (nvml.md §2.5, §2.7); an old binding without a name just reads nothing for it.
        self.field_ids = [getattr(lib, n, None) for n in ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
                                                          "NVML_FI_DEV_POWER_INSTANT")]  # fmt: skip

    def _q(self, gi: int, name: str, *args: Any) -> Any:
        dead = self.dead[gi]
        if name in dead:
            return None
        fn = getattr(self.lib, name, None)
        if fn is None:
            dead[name] = "NVMLError_FunctionNotFound"
            return None
        try:
            return fn(*args)
        except Exception as exc:
            if not is_nvml_error(exc):
                raise
            err = error_name(exc)
            if err in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_Deprecated"):
                dead[name] = err  # permanent for this device: don't pay for it every tick
            elif err not in MISSING_ERRORS:
                self.errors[name] = err
            return None

    def _reasons(self, gi: int, h: Any) -> int | None:
        source = self.reasons_source[gi]
        if source is None:
            return None
        value = self._q(gi, source, h)
        if value is None and self.dead[gi].get(source) == "NVMLError_FunctionNotFound" and source == EVENT_FN:
            self.reasons_source[gi] = THROTTLE_FN  # driver older than R535: the deprecated name
            return self._reasons(gi, h)
        if value is None and source in self.dead[gi]:
            self.reasons_source[gi] = None
        return value

    def _temperature(self, gi: int, h: Any) -> int | None:
        if "nvmlDeviceGetTemperatureV" not in self.dead[gi]:
            v = self._q(gi, "nvmlDeviceGetTemperatureV", h, self.temp_sensor)
            if v is not None or "nvmlDeviceGetTemperatureV" not in self.dead[gi]:
                return v
        return self._q(gi, "nvmlDeviceGetTemperature", h, self.temp_sensor)

    def tick(self, _lib: Any = None) -> None:
        q = self._q
        for gi, dev in enumerate(self.devices):
            h, tr = dev.handle, self.tracks[gi]
            tr.t.append(time.monotonic())
            tr.power_mw.append(q(gi, "nvmlDeviceGetPowerUsage", h))
            util = q(gi, "nvmlDeviceGetUtilizationRates", h)
            tr.gpu_util.append(None if util is None else util.gpu)
            tr.mem_util.append(None if util is None else util.memory)
            tr.sm_clock.append(q(gi, "nvmlDeviceGetClockInfo", h, self.sm))
            tr.mem_clock.append(q(gi, "nvmlDeviceGetClockInfo", h, self.mem))
            tr.temp.append(self._temperature(gi, h))
            tr.reasons.append(self._reasons(gi, h))
            tr.tx_kbps.append(q(gi, "nvmlDeviceGetPcieThroughput", h, self.tx))
            tr.rx_kbps.append(q(gi, "nvmlDeviceGetPcieThroughput", h, self.rx))
            e = q(gi, "nvmlDeviceGetTotalEnergyConsumption", h)
            if e is not None:
                tr.energy.append((time.monotonic(), int(e)))
            tx, rx, instant = self._fields(gi, h)
            if tx is not None or rx is not None:
                tr.pcie_bytes.append((time.monotonic(), tx, rx))
            tr.power_instant_mw.append(instant)

    def _fields(self, gi: int, h: Any) -> list[int | None]:
        """PCIe TX/RX byte counters and instant power in one nvmlDeviceGetFieldValues call; each entry's own nvmlReturn counts."""
        ids = [f for f in self.field_ids if f is not None]
        if not ids:
            return [None, None, None]
        got = self._q(gi, "nvmlDeviceGetFieldValues", h, ids)
        by_id: dict[int, int] = {}
        for v in got if got is not None else []:
            if v.nvmlReturn != getattr(self.lib, "NVML_SUCCESS", 0):
                continue
            value = _field_value(self.lib, v)
            if value is not None:
                by_id[int(v.fieldId)] = value
        return [None if f is None else by_id.get(f) for f in self.field_ids]


def _field_value(lib: Any, v: Any) -> int | None:
    """An integer field value read through its valueType (the union member NVML filled)."""
    member = {
        getattr(lib, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
        getattr(lib, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
        getattr(lib, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
        getattr(lib, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
        getattr(lib, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        getattr(lib, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(int(v.valueType))
    return None if member is None else int(getattr(v.value, member))


def _counter_delta(points: list[tuple[float, int | None, int | None]], col: int) -> tuple[float, int] | None:
    """(window s, bytes) between the first and last read of a cumulative byte counter; it wraps at 2**64."""
    pts = [(p[0], p[col]) for p in points if p[col] is not None]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    (t0, b0), (t1, b1) = pts[0], pts[-1]
    return t1 - t0, (int(b1) - int(b0)) % (1 << 64)


def _energy_avg_w(energy: list[tuple[float, int]]) -> float | None:
    """Mean power over the window from the energy counter: delta mJ / delta s / 1000."""
    if len(energy) < 2:
        return None
    (t0, e0), (t1, e1) = energy[0], energy[-1]
    if t1 <= t0 or e1 < e0:  # no time elapsed, or the counter reset (driver reload)
        return None
    return round((e1 - e0) / (t1 - t0) / 1000.0, 6)


def _mask_fraction(masks: list[int], mask: int) -> float | None:
    """Share of samples with any bit of `mask` active; None when no GPU reported reasons."""
    return round(sum(1 for m in masks if m & mask) / len(masks), 6) if masks else None


def _reason_fractions(masks: list[int | None]) -> dict[str, float] | None:
    seen = _present(masks)
    if not seen:
        return None
    return {name: round(sum(1 for m in seen if m & bit) / len(seen), 6) for name, bit in EVENT_REASONS.items()}


def _names(mask: int | None) -> list[str] | None:
    return None if mask is None else [n for n, b in EVENT_REASONS.items() if mask & b]


class GpuSample(Probe):
    """Power, utilisation, clocks, clock-event reasons and PCIe traffic, sampled over a window.

    Samples all GPUs every `interval_s` for `duration_s` (one thread hop per tick for all GPUs).
    Stats dicts are {mean, min, max, p50, p95} over all samples of all GPUs (None when never reported).

    Values:
      gpu_count, sample_count (ticks), window_s (measured), interval_s,
      power_limit_enforced_w (min over GPUs), power_limit_max_w (max over GPUs of the max constraint),
      max_sm_clock_mhz (min over GPUs),
      power_draw_w, draw_to_enforced_limit, draw_to_max_constraint, gpu_util_pct, mem_util_pct,
      sm_clock_mhz, mem_clock_mhz, sm_clock_ratio (SM clock / max SM clock), temperature_c,
      pcie_tx_gbps, pcie_rx_gbps (GB/s, 1 KB = 1000 B), pcie_tx_link_share, pcie_rx_link_share
      (throughput / per-direction bandwidth of the GPU's max PCIe gen and width): stats dicts;
      energy_avg_power_w: stats dict over GPUs of each GPU's delta-energy / delta-time mean power;
      pcie_tx_bytes_per_s, pcie_rx_bytes_per_s: stats dicts over GPUs of each GPU's cumulative PCIe byte
        counter (field values NVML_FI_DEV_PCIE_COUNT_TX_BYTES / _RX_BYTES) delta / window, in B/s: the
        whole window's traffic, where pcie_tx_gbps are 20 ms snapshots; None where no GPU supports them;
      pcie_tx_bytes_window, pcie_rx_bytes_window: stats dicts over GPUs of the bytes counted in the window;
      pcie_counter_window_s: the longest counter window over GPUs (s), None without counters;
      power_instant_w: stats dict over all samples of NVML_FI_DEV_POWER_INSTANT (GetPowerUsage is the
        1 s average on Ampere and newer), None where the field does not exist;
      event_reasons: {name: fraction of samples active} over all GPUs, with every name in
        EVENT_REASONS (gpu_idle, applications_clocks_setting, sw_power_cap, hw_slowdown, sync_boost,
        sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown, display_clock_setting),
        0.0 when never active; None when no GPU reports reasons;
      throttled_fraction: fraction of samples with any of sw_power_cap, hw_slowdown,
        sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown (None as above);
      slowdown_fraction: the same without sw_power_cap (thermal, HW slowdown, power brake);
      event_reasons_source: "clocks_event_reasons" | "clocks_throttle_reasons" (old drivers) | None;
      unsupported_calls (sorted NVML function names missing on some GPU), errors ({function: error}),
      skipped_gpus ({index: error name}),
      gpus: per-GPU dicts with index, name, uuid, power_limit_enforced_w, power_limit_max_w,
        max_sm_clock_mhz, pcie_link_gen_max, pcie_link_width_max, pcie_link_gen_current,
        pcie_link_width_current, pcie_link_max_gbps, energy_avg_power_w (scalar), the same stats
        dicts as above, event_reasons ({name: fraction} or None), event_reasons_seen (names active
        in any sample, or None).
    """

    name = "gpu.sample"
    description = "power draw vs limit, utilisation, clocks, clock-event reasons and PCIe traffic over a window"
    Params = SampleParams
    default_timeout_s = 30.0

    async def run(self, ctx: Context, params: SampleParams) -> Evidence:
        started = utcnow()
        devs = await _open(ctx, params.gpus)
        if isinstance(devs, Evidence):
            return _stamp(devs, started)

        def setup(lib: Any) -> tuple[list[dict[str, Any]], _Sampler, _Reader]:
            r = _Reader(lib)
            statics = []
            for d in devs.devices:
                h = d.handle
                constraints = r.q("nvmlDeviceGetPowerManagementLimitConstraints", h)
                gen, width = r.q("nvmlDeviceGetMaxPcieLinkGeneration", h), r.q("nvmlDeviceGetMaxPcieLinkWidth", h)
                statics.append({
                    "index": d.index,
                    "name": r.q("nvmlDeviceGetName", h),
                    "uuid": r.q("nvmlDeviceGetUUID", h),
                    "power_limit_enforced_w": _w(r.q("nvmlDeviceGetEnforcedPowerLimit", h)),
                    "power_limit_max_w": None if constraints is None else _w(constraints[1]),
                    "max_sm_clock_mhz": r.q("nvmlDeviceGetMaxClockInfo", h, lib.NVML_CLOCK_SM),
                    "pcie_link_gen_max": gen,
                    "pcie_link_width_max": width,
                    "pcie_link_max_gbps": pcie_link_gbps(gen, width),
                })
            return statics, _Sampler(lib, devs.devices), r

        statics, sampler, reader = await ctx.nvml.call(setup)
        loop = asyncio.get_running_loop()
        n_ticks = max(2, int(params.duration_s / params.interval_s + 1e-9) + 1)
        t0 = loop.time()
        for k in range(n_ticks):
            delay = t0 + k * params.interval_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await ctx.nvml.call(sampler.tick)

        def finish(lib: Any) -> list[tuple[Any, Any]]:
            # The current link is read under load: it drops to Gen1 at idle (nvml.md §2.5).
            return [(reader.q("nvmlDeviceGetCurrPcieLinkGeneration", d.handle),
                     reader.q("nvmlDeviceGetCurrPcieLinkWidth", d.handle)) for d in devs.devices]

        links_now = await ctx.nvml.call(finish)
        return _sample_evidence(params, statics, sampler, reader, links_now, devs, started)


def _sample_evidence(params: SampleParams, statics: list[dict[str, Any]], sampler: _Sampler, reader: _Reader,
                     links_now: list[tuple[Any, Any]], devs: Devices, started: Any) -> Evidence:
    per_gpu: list[dict[str, Any]] = []
    pooled: dict[str, list[Any]] = {}
    t_origin = min((tr.t[0] for tr in sampler.tracks if tr.t), default=0.0)

    def derive(st: dict[str, Any], tr: _Track) -> dict[str, list[Any]]:
        power = [_w(p) for p in tr.power_mw]
        link = st["pcie_link_max_gbps"]
        tx = [None if v is None else v / 1e6 for v in tr.tx_kbps]
        rx = [None if v is None else v / 1e6 for v in tr.rx_kbps]
        return {
            "power_draw_w": power,
            "draw_to_enforced_limit": [_ratio(p, st["power_limit_enforced_w"]) for p in power],
            "draw_to_max_constraint": [_ratio(p, st["power_limit_max_w"]) for p in power],
            "gpu_util_pct": tr.gpu_util,
            "mem_util_pct": tr.mem_util,
            "sm_clock_mhz": tr.sm_clock,
            "mem_clock_mhz": tr.mem_clock,
            "sm_clock_ratio": [_ratio(c, st["max_sm_clock_mhz"]) for c in tr.sm_clock],
            "temperature_c": tr.temp,
            "pcie_tx_gbps": tx,
            "pcie_rx_gbps": rx,
            "pcie_tx_link_share": [_ratio(v, link) for v in tx],
            "pcie_rx_link_share": [_ratio(v, link) for v in rx],
            "power_instant_w": [_w(p) for p in tr.power_instant_mw],
        }

    all_masks: list[int | None] = []
    energy_avgs: list[float | None] = []
    counters: dict[str, list[float | None]] = {k: [] for k in ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
                                                                "pcie_tx_bytes_window", "pcie_rx_bytes_window")}  # fmt: skip
    counter_windows: list[float] = []
    for gi, (st, tr) in enumerate(zip(statics, sampler.tracks)):
        series = derive(st, tr)
        for k, xs in series.items():
            pooled.setdefault(k, []).extend(xs)
        all_masks.extend(tr.reasons)
        seen = _present(tr.reasons)
        avg = _energy_avg_w(tr.energy)
        energy_avgs.append(avg)
        gen_now, width_now = links_now[gi]
        gpu_counters: dict[str, float | None] = {}
        for direction, col in (("tx", 1), ("rx", 2)):
            d = _counter_delta(tr.pcie_bytes, col)
            gpu_counters[f"pcie_{direction}_bytes_per_s"] = None if d is None else round(d[1] / d[0], 3)
            gpu_counters[f"pcie_{direction}_bytes_window"] = None if d is None else float(d[1])
            if d is not None:
                counter_windows.append(d[0])
        for k, v in gpu_counters.items():
            counters[k].append(v)
        per_gpu.append({
            **st,
            "pcie_link_gen_current": gen_now,
            "pcie_link_width_current": width_now,
            "energy_avg_power_w": avg,
            **gpu_counters,
            **{k: stats(xs) for k, xs in series.items()},
            "event_reasons": _reason_fractions(tr.reasons),
            "event_reasons_seen": _names(_or(seen)) if seen else None,
        })

    present_masks = _present(all_masks)
    sources = {s for s in sampler.reasons_source if s is not None}
    unsupported = sorted({name for dead in sampler.dead for name in dead} | set(reader.missing))
    values: dict[str, Any] = {
        "gpu_count": len(statics),
        "sample_count": max((len(tr.t) for tr in sampler.tracks), default=0),
        "window_s": round(max((tr.t[-1] - tr.t[0] for tr in sampler.tracks if tr.t), default=0.0), 6),
        "interval_s": params.interval_s,
        "power_limit_enforced_w": _min([s["power_limit_enforced_w"] for s in statics]),
        "power_limit_max_w": _max([s["power_limit_max_w"] for s in statics]),
        "max_sm_clock_mhz": _min([s["max_sm_clock_mhz"] for s in statics]),
        **{k: stats(xs) for k, xs in pooled.items()},
        "energy_avg_power_w": stats(energy_avgs),
        **{k: stats(xs) for k, xs in counters.items()},
        "pcie_counter_window_s": round(max(counter_windows), 6) if counter_windows else None,
        "event_reasons": _reason_fractions(all_masks),
        "throttled_fraction": _mask_fraction(present_masks, THROTTLE_MASK),
        "slowdown_fraction": _mask_fraction(present_masks, SLOWDOWN_MASK),
        "event_reasons_source": (
            "clocks_throttle_reasons" if THROTTLE_FN in sources else "clocks_event_reasons" if sources else None
        ),
        "unsupported_calls": unsupported,
        "errors": {**reader.errors, **sampler.errors},
        "skipped_gpus": {str(k): v for k, v in devs.skipped.items()},
        "gpus": per_gpu,
    }

    blocks: list[Any] = [
        Bars(
            title="Power draw vs enforced limit (mean over window)",
            unit="W",
            bars=[(f"GPU {g['index']}", g["power_draw_w"]["mean"], g["power_limit_enforced_w"] or 0.0)
                  for g in per_gpu if g["power_draw_w"] is not None],
        )
    ]
    for st, tr in zip(statics, sampler.tracks):
        pts = [(round(t - t_origin, 3), p / 1000.0) for t, p in zip(tr.t, tr.power_mw) if p is not None]
        if pts:
            blocks.append(Series(title=f"GPU {st['index']} power", unit="W", label=f"GPU {st['index']}",
                                 points=downsample(pts, 120)))
    util_pts = _mean_series(sampler, t_origin, lambda tr: tr.gpu_util)
    if util_pts:
        blocks.append(Series(title="GPU utilisation (mean over GPUs)", unit="%", label="all GPUs",
                             points=downsample(util_pts, 120)))

    p = values["power_draw_w"]
    ratio = values["draw_to_enforced_limit"]
    active = [n for n, f in (values["event_reasons"] or {}).items() if f > 0]
    summary = (
        f"{len(statics)} GPUs over {values['window_s']:.1f} s: "
        + (f"{p['mean']:.0f} W mean draw" if p else "power draw not reported")
        + (f" ({ratio['mean'] * 100:.0f}% of the enforced limit)" if ratio else "")
        + (f", GPU util {values['gpu_util_pct']['mean']:.0f}%" if values["gpu_util_pct"] else "")
        + (f", clock event reasons: {', '.join(active)}" if active else
           ", no clock event reasons" if values["event_reasons"] is not None else "")
    )
    return Evidence(summary=summary, values=values, blocks=blocks, started_at=started, finished_at=utcnow())


def _or(masks: list[int]) -> int:
    out = 0
    for m in masks:
        out |= m
    return out


def _mean_series(sampler: _Sampler, t_origin: float, pick: Callable[[_Track], list[Any]]) -> list[tuple[float, float]]:
    """Mean over GPUs at each tick index (ticks are shared), with the first GPU's timestamp."""
    tracks = [tr for tr in sampler.tracks if tr.t]
    if not tracks:
        return []
    out = []
    for k in range(min(len(tr.t) for tr in tracks)):
        vals = _present([pick(tr)[k] for tr in tracks])
        if vals:
            out.append((round(tracks[0].t[k] - t_origin, 3), sum(vals) / len(vals)))
    return out


# --- gpu.topology --------------------------------------------------------------------------------


class TopologyParams(GpuSelection):
    pass


class GpuTopology(Probe):
    """How the GPUs talk to each other: NVLink links, P2P status per pair, PCIe common ancestors.

    Values:
      gpu_count,
      nvlink_link_count (list per GPU, None where unknown), nvlink_active_links (list per GPU),
      nvlink_active_links_total, nvlink_supported (bool: any GPU has a link),
      p2p: {"read": M, "write": M, "nvlink": M}, each M an NxN matrix of nvidia-smi names
        ("X" self, "OK", "CNS", "GNS", "TNS", "DR", "NS", "U"; null where the query is unsupported),
        or the whole M null when no pair answered,
      p2p_ok_pairs: count of unordered pairs with read and write OK,
      pairs_total: N*(N-1)/2,
      pairs_without_p2p: count of unordered pairs where read or write is not OK,
      any_pair_without_p2p: bool (None when neither read nor write P2P status could be read),
      topology: NxN matrix of common-ancestor names ("X", "INT", "PIX", "PXB", "PHB", "NODE", "SYS";
        null where unsupported) or None,
      topology_worst: the farthest level over all pairs ("SYS" > "NODE" > "PHB" > "PXB" > "PIX" > "INT") or None,
      unsupported_calls, errors, skipped_gpus.
    """

    name = "gpu.topology"
    prefetch = True
    description = "NVLink links, P2P read/write/NVLink status per GPU pair, PCIe topology matrix"
    Params = TopologyParams
    default_timeout_s = 30.0

    async def run(self, ctx: Context, params: Any) -> Evidence:
        started = utcnow()
        devs = await _open(ctx, params.gpus)
        if isinstance(devs, Evidence):
            return _stamp(devs, started)
        ds = devs.devices
        n = len(ds)

        def read(lib: Any) -> tuple[list[tuple[Any, Any]], dict[str, Any], Any, _Reader]:
            r = _Reader(lib)
            links = [_nvlink_links(r, d.handle) for d in ds]
            p2p: dict[str, Any] = {}
            for cap, idx in P2P_CAPS.items():
                m = [["X" if i == j else _p2p_name(r.q("nvmlDeviceGetP2PStatus", ds[i].handle, ds[j].handle, idx))
                      for j in range(n)] for i in range(n)]
                answered = any(m[i][j] is not None for i in range(n) for j in range(n) if i != j)
                p2p[cap] = m if answered or n == 1 else None
            topo = [["X" if i == j else _level_name(r.q("nvmlDeviceGetTopologyCommonAncestor", ds[i].handle, ds[j].handle))
                     for j in range(n)] for i in range(n)]
            answered = any(topo[i][j] is not None for i in range(n) for j in range(n) if i != j)
            return links, p2p, topo if answered or n == 1 else None, r

        links, p2p, topo, r = await ctx.nvml.call(read)
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        read_m, write_m = p2p["read"], p2p["write"]
        ok_pairs = without = 0
        known = read_m is not None or write_m is not None
        for i, j in pairs:
            cells = [m[i][j] for m in (read_m, write_m) if m is not None] + \
                    [m[j][i] for m in (read_m, write_m) if m is not None]
            cells = _present(cells)
            if cells and all(c == "OK" for c in cells):
                ok_pairs += 1
            elif cells:
                without += 1
        counts = [c for c, _ in links]
        actives = [a for _, a in links]
        worst = None
        if topo is not None:
            order = ["INT", "PIX", "PXB", "PHB", "NODE", "SYS"]
            levels = [topo[i][j] for i, j in pairs if topo[i][j] in order]
            worst = max(levels, key=order.index) if levels else None
        values = {
            "gpu_count": n,
            "nvlink_link_count": counts,
            "nvlink_active_links": actives,
            "nvlink_active_links_total": sum(_present(actives)) if _present(actives) else None,
            "nvlink_supported": any((c or 0) > 0 for c in counts),
            "p2p": p2p,
            "p2p_ok_pairs": ok_pairs if known else None,
            "pairs_total": len(pairs),
            "pairs_without_p2p": without if known else None,
            "any_pair_without_p2p": (without > 0) if known else None,
            "topology": topo,
            "topology_worst": worst,
            "unsupported_calls": sorted(r.missing),
            "errors": dict(r.errors),
            "skipped_gpus": {str(k): v for k, v in devs.skipped.items()},
        }
        labels = [f"GPU{d.index}" for d in ds]
        blocks: list[Any] = []
        for cap in ("read", "write", "nvlink"):
            if p2p[cap] is not None:
                blocks.append(Table(title=f"P2P {cap} status", columns=["", *labels],
                                    rows=[[labels[i], *[c or "-" for c in p2p[cap][i]]] for i in range(n)]))
        if topo is not None:
            blocks.append(Table(title="PCIe topology (common ancestor)", columns=["", *labels],
                                rows=[[labels[i], *[c or "-" for c in topo[i]]] for i in range(n)]))
        blocks.append(Table(title="NVLink", columns=["GPU", "links", "active"],
                            rows=[[labels[i], counts[i], actives[i]] for i in range(n)]))
        p2p_text = ("P2P status unknown" if not known else
                    f"P2P unavailable for {without} of {len(pairs)} GPU pairs" if without else
                    f"P2P OK for all {len(pairs)} GPU pairs")
        summary = (f"{n} GPUs, NVLink active links {values['nvlink_active_links_total']}, {p2p_text}"
                   + (f", farthest path {worst}" if worst else ""))
        return Evidence(summary=summary, values=values, blocks=blocks, started_at=started, finished_at=utcnow())


def _p2p_name(status: int | None) -> str | None:
    return None if status is None else P2P_STATUS.get(int(status), "U")


def _level_name(level: int | None) -> str | None:
    return None if level is None else TOPOLOGY_LEVELS.get(int(level), str(level))


# --- gpu.activity (GPM) --------------------------------------------------------------------------

GPM_METRICS = {
    "sm_util_pct": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_util_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}


class ActivityParams(GpuSelection):
    duration_s: float = Field(1.0, ge=0.2, le=600, description="GPM window (NVML needs > 100 ms)")


class GpuActivity(Probe):
    """Whether "100 % utilised" GPUs are computing: NVML GPM SM, occupancy, tensor and DRAM activity.

    `unavailable` (with the reason) when no GPU is a GPM-supported device (nvmlGpmQueryDeviceSupport).
    Values (all 0..100 percentages over the window; stats dicts over supported GPUs):
      gpu_count, supported_gpu_count, window_s,
      sm_util_pct, sm_occupancy_pct, tensor_util_pct (any tensor pipe), dram_bw_util_pct: stats dicts,
      gpus: per-GPU dicts with index, name, gpm_supported (bool or None when the query failed),
        reason (why not supported, or None), sm_util_pct, sm_occupancy_pct, tensor_util_pct,
        dram_bw_util_pct (floats or None),
      unsupported_calls, errors, skipped_gpus.
    """

    name = "gpu.activity"
    description = "NVML GPM: SM utilisation, occupancy, tensor and DRAM activity (busy vs computing)"
    Params = ActivityParams
    default_timeout_s = 30.0

    async def run(self, ctx: Context, params: ActivityParams) -> Evidence:
        started = utcnow()
        devs = await _open(ctx, params.gpus)
        if isinstance(devs, Evidence):
            return _stamp(devs, started)
        ds = devs.devices
        r_holder: dict[str, _Reader] = {}

        def first(lib: Any) -> tuple[list[dict[str, Any]], dict[int, tuple[Any, Any]], float]:
            r = r_holder.setdefault("r", _Reader(lib))
            gpus, samples = [], {}
            for d in ds:
                g: dict[str, Any] = {"index": d.index, "name": r.q("nvmlDeviceGetName", d.handle),
                                     "gpm_supported": None, "reason": None, **{k: None for k in GPM_METRICS}}
                gpus.append(g)
                try:
                    support = lib.nvmlGpmQueryDeviceSupport(d.handle)
                except Exception as exc:
                    if not is_nvml_error(exc):
                        raise
                    g["reason"] = f"{error_name(exc)} from nvmlGpmQueryDeviceSupport"
                    continue
                g["gpm_supported"] = bool(support.isSupportedDevice)
                if not g["gpm_supported"]:
                    g["reason"] = "nvmlGpmQueryDeviceSupport: isSupportedDevice=0"
                    continue
                try:
                    s1 = lib.nvmlGpmSampleAlloc()
                    s2 = lib.nvmlGpmSampleAlloc()
                    samples[d.index] = (s1, s2)
                    lib.nvmlGpmSampleGet(d.handle, s1)
                except Exception as exc:
                    if not is_nvml_error(exc):
                        raise
                    g["reason"] = f"{error_name(exc)} from GPM sampling"
            return gpus, samples, time.monotonic()

        def second(lib: Any, gpus: list[dict[str, Any]], samples: dict[int, tuple[Any, Any]]) -> float:
            try:
                ids = {k: getattr(lib, v) for k, v in GPM_METRICS.items()}
                for d, g in zip(ds, gpus):
                    if d.index not in samples or g["reason"] is not None:
                        continue
                    s1, s2 = samples[d.index]
                    try:
                        lib.nvmlGpmSampleGet(d.handle, s2)
                        mg = lib.c_nvmlGpmMetricsGet_t()
                        mg.version = lib.NVML_GPM_METRICS_GET_VERSION
                        mg.numMetrics = len(ids)
                        mg.sample1, mg.sample2 = s1, s2
                        for i, mid in enumerate(ids.values()):
                            mg.metrics[i].metricId = mid
                        lib.nvmlGpmMetricsGet(mg)
                    except Exception as exc:
                        if not is_nvml_error(exc):
                            raise
                        g["reason"] = f"{error_name(exc)} from GPM sampling"
                        continue
                    for i, key in enumerate(ids):
                        m = mg.metrics[i]
                        g[key] = round(float(m.value), 6) if m.nvmlReturn == lib.NVML_SUCCESS else None
                return time.monotonic()
            finally:
                for s1, s2 in samples.values():
                    for s in (s1, s2):
                        try:
                            lib.nvmlGpmSampleFree(s)
                        except Exception:  # noqa: BLE001 - freeing is best effort
                            pass

        gpus, samples, t_first = await ctx.nvml.call(first)
        try:
            if samples:
                await asyncio.sleep(params.duration_s)
        finally:
            t_second = await ctx.nvml.call(lambda lib: second(lib, gpus, samples))
        r = r_holder["r"]
        supported = [g for g in gpus if g["gpm_supported"] and g["reason"] is None]
        values: dict[str, Any] = {
            "gpu_count": len(gpus),
            "supported_gpu_count": len(supported),
            "window_s": round(t_second - t_first, 6) if samples else 0.0,
            **{k: stats([g[k] for g in supported]) for k in GPM_METRICS},
            "gpus": gpus,
            "unsupported_calls": sorted(r.missing),
            "errors": dict(r.errors),
            "skipped_gpus": {str(k): v for k, v in devs.skipped.items()},
        }
        if not supported:
            reasons = sorted({g["reason"] for g in gpus if g["reason"]})
            name = _first([g["name"] for g in gpus])
            reason = (f"GPM metrics are not available on {name}: {'; '.join(reasons)}. "
                      "Use gpu.dcgm (DCGM_FI_PROF_*) or Nsight Compute to see SM and tensor activity.")
            return Evidence.unavailable(reason, values=values, started_at=started, finished_at=utcnow())
        table = Table(title="GPM activity (% over window)",
                      columns=["GPU", "SM util", "SM occupancy", "tensor util", "DRAM BW util"],
                      rows=[[g["index"], *[g[k] for k in GPM_METRICS]] for g in gpus])
        su, tu = values["sm_util_pct"], values["tensor_util_pct"]
        summary = (f"{len(supported)}/{len(gpus)} GPUs with GPM over {values['window_s']:.1f} s: "
                   f"SM util {su['mean']:.0f}%" if su else "SM util n/a")
        summary += f", tensor util {tu['mean']:.1f}%" if tu else ""
        return Evidence(summary=summary, values=values, blocks=[table], started_at=started, finished_at=utcnow())
