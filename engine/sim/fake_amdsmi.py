"""A stand-in for AMD's `amdsmi` module, following the released amdsmi 7.0.2 (the PyPI wheel amdsmi-7.0.2, read in
`amdsmi/amdsmi_interface.py`, `amdsmi_wrapper.py` and `amdsmi_exception.py`; amd.md §1).

Product code, not only a test helper: the simulated host plugs it under `gpu_runbook.amdsmi_lib.Amdsmi(module=...)`
so every AMD probe runs unchanged against it. It keeps amdsmi's semantics on purpose:

* the same function names and positional signatures, the same dict keys each returns;
* its units: power caps in **microwatts** (`amdsmi_get_power_cap_info`, amdsmi.h "(uW)"), socket power in W
  (`amdsmi_get_power_info`), clocks in MHz, PCIe speed in MT/s (`pcie_speed` 32000 on Gen5), activity in %,
  energy as an accumulator times a resolution in uJ, temperatures in °C as the amd-smi CLI prints them;
* "N/A" where the library's `_validate_if_max_uint` or the 0xFFFF checks return it (`average_socket_power` on
  MI300, which reports `current_socket_power`; activity and power on a compute partition other than 0, which
  amdsmi does not report per partition: amd.md §2.3, from the Device Metrics Exporter's notes);
* `AmdSmiLibraryException(err_code)` (with the library's `err_code` and message) for a failing status,
  AMDSMI_STATUS_NOT_INIT (32) before `amdsmi_init`, NOT_SUPPORTED (2) for a call the scenario lacks;
* `amdsmi_topo_get_p2p_status` returns its `type` as a raw ctypes.c_uint32 (the 7.0.2 trap, `.value` to read it);
* `amdsmi_get_violation_status` (6.4+, MI300 and newer): `active_*` booleans for what holds the clock now,
  `per_*` the share of the time so far in %, PPT (package power) and socket thermal (amd.md §1.4).

Dynamic readings come from the physical GPU's `reading(now)`, the same `Reading` the fake NVML converts
(`gpu_runbook.sim.coupling` binds it): the event-reason bits it carries are the coupling's physics (a power cap
reached, a thermal fault), reported here as amdsmi's violations.
"""

from __future__ import annotations

import ctypes
import threading
import types
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable

from ..nvml import CLOCK_EVENT_REASONS
from .fake_nvml import Reading

RELEASE = "7.0.2"  # the amdsmi release this fake follows

# amdsmi_status_t (amdsmi 7.0.2 amdsmi_wrapper.py:337-382) and the messages amdsmi_exception.py gives them.
STATUS_SUCCESS, STATUS_INVAL, STATUS_NOT_SUPPORTED, STATUS_NO_PERM, STATUS_NOT_INIT = 0, 1, 2, 10, 32
_MESSAGES = {
    1: "AMDSMI_STATUS_INVAL - Invalid parameters",
    2: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    10: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    32: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
}
NA = "N/A"
# What a compute partition splits one MI300X into (WP3, amd.md §1.4: SPX 8 XCDs ... CPX 8x1 XCD).
PARTITIONS = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = _MESSAGES.get(err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_code(self) -> int:
        return self.err_code

    def get_error_info(self, detailed: bool = True) -> str:
        return self.err_info if detailed else self.err_info.split(" - ")[0]


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received: Any, expected: Any, msg: str | None = None) -> None:
        super().__init__(msg)
        self.err_code = None
        self.actualType = type(received)
        self.expectedType = expected


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 4294967295
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2
    INIT_AMD_APUS = 3
    INIT_NON_AMD_CPUS = 4
    INIT_NON_AMD_GPUS = 8


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0  # an alias of SYS, as in amdsmi_wrapper.py:401-403
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4
    PCIE = 5


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1  # an alias of HOTSPOT (amdsmi_wrapper.py:548-549)
    VRAM = 2
    HBM_0 = 3


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0


class AmdSmiLinkType(IntEnum):
    AMDSMI_LINK_TYPE_INTERNAL = 0
    AMDSMI_LINK_TYPE_PCIE = 1
    AMDSMI_LINK_TYPE_XGMI = 2
    AMDSMI_LINK_TYPE_NOT_APPLICABLE = 3
    AMDSMI_LINK_TYPE_UNKNOWN = 4


@dataclass
class FakeAmdGpu:
    """One physical Instinct GPU (an OAM module): its static facts and the load hook the coupling binds."""

    index: int
    market_name: str
    gfx_target: str
    device_id: str
    memory_total_bytes: int
    power_cap_w: float
    default_power_cap_w: float
    min_power_cap_w: float
    max_power_cap_w: float
    max_gfx_mhz: int
    max_mem_mhz: int
    idle_gfx_mhz: int
    pcie_gen: int
    pcie_width: int
    pcie_gen_current: int
    pcie_width_current: int
    compute_partition: str = "SPX"
    memory_partition: str = "NPS1"
    driver_version: str = "6.12.12"
    hive_id: int = 0x5E11
    reading_fn: Callable[["FakeAmdGpu", float], Reading] | None = None
    load: Reading = field(default_factory=Reading)
    energy_uj: float = 0.0
    _energy_t: float | None = None
    violations: dict[str, int] = field(default_factory=lambda: {"counter": 0, "ppt_pwr": 0, "socket_thrm": 0, "prochot_thrm": 0})

    @property
    def partitions(self) -> int:
        return PARTITIONS[self.compute_partition]

    def reading(self, now: float) -> Reading:
        return self.reading_fn(self, now) if self.reading_fn is not None else self.load


@dataclass(frozen=True)
class FakeHandle:
    """amdsmi_processor_handle: one visible device, a whole GPU or one compute partition of it."""

    gpu: FakeAmdGpu
    partition: int
    bdf: str
    hip_id: int


@dataclass
class FakeAmdHost:
    gpus: list[FakeAmdGpu]
    xgmi: bool = True  # every GPU pair over XGMI (a hive); False: PCIe only
    processes: list[dict[str, Any]] = field(default_factory=list)  # amdsmi_get_gpu_process_list rows, on every device
    not_supported: set[str] = field(default_factory=set)  # functions that raise AMDSMI_STATUS_NOT_SUPPORTED

    def handles(self) -> list[FakeHandle]:
        out = []
        for g in self.gpus:
            bus = (0x05 + g.index * 0x20) % 0x100
            for p in range(g.partitions):
                # Partitions of one GPU as functions of its device (UNVERIFIED on hardware: amd-smi lists each
                # partition with its own BDF; the function number is this simulator's choice).
                out.append(FakeHandle(g, p, f"0000:{bus:02x}:00.{p}", len(out)))
        return out


def _uj_per_count() -> float:
    return 15.259  # counter_resolution (uJ per count) as amd-smi shows on MI300 (UNVERIFIED figure; the unit is amd.md §1.4)


def make_module(host: FakeAmdHost, now_fn: Callable[[], float] | None = None) -> types.ModuleType:
    """A module with amdsmi 7.0.2's names over `host`."""
    import time  # noqa: PLC0415

    now = now_fn or time.monotonic
    m = types.ModuleType("amdsmi")
    m.__version__ = RELEASE  # type: ignore[attr-defined]
    state = {"init": False}
    lock = threading.Lock()
    handles = host.handles()
    for cls in (AmdSmiException, AmdSmiLibraryException, AmdSmiParameterException, AmdSmiInitFlags, AmdSmiClkType,
                AmdSmiTemperatureType, AmdSmiTemperatureMetric, AmdSmiLinkType):  # fmt: skip
        setattr(m, cls.__name__, cls)

    def api(fn: Callable[..., Any]) -> Callable[..., Any]:
        name = fn.__name__

        def call(*args: Any) -> Any:
            if not state["init"]:
                raise AmdSmiLibraryException(STATUS_NOT_INIT)
            if name in host.not_supported:
                raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)
            if args and not isinstance(args[0], FakeHandle):
                raise AmdSmiParameterException(args[0], FakeHandle)
            return fn(*args)

        call.__name__ = name
        call.__wrapped__ = fn  # type: ignore[attr-defined] - its parameters, checked against the release's
        setattr(m, name, call)
        return call

    def amdsmi_init(flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        with lock:
            state["init"] = True

    def amdsmi_shut_down() -> None:
        with lock:
            state["init"] = False

    def amdsmi_get_processor_handles() -> list[FakeHandle]:
        if not state["init"]:
            raise AmdSmiLibraryException(STATUS_NOT_INIT)
        return list(handles)

    m.amdsmi_init = amdsmi_init  # type: ignore[attr-defined]
    m.amdsmi_shut_down = amdsmi_shut_down  # type: ignore[attr-defined]
    m.amdsmi_get_processor_handles = amdsmi_get_processor_handles  # type: ignore[attr-defined]

    def primary(h: FakeHandle) -> bool:
        return h.partition == 0

    @api
    def amdsmi_get_gpu_device_bdf(h: FakeHandle) -> str:
        return h.bdf

    @api
    def amdsmi_get_gpu_device_uuid(h: FakeHandle) -> str:
        return f"{h.gpu.index:02x}ff74a1-0000-1000-80{h.partition:02x}-{0x5E11 + h.gpu.index:012x}"

    @api
    def amdsmi_get_gpu_enumeration_info(h: FakeHandle) -> dict[str, Any]:
        return {"drm_render": 128 + h.hip_id, "drm_card": h.hip_id, "hsa_id": h.hip_id + 1, "hip_id": h.hip_id,
                "hip_uuid": f"GPU-{h.gpu.index:04x}{h.partition:04x}74a10000"}  # fmt: skip

    @api
    def amdsmi_get_gpu_kfd_info(h: FakeHandle) -> dict[str, Any]:
        return {"kfd_id": 40000 + h.hip_id, "node_id": h.hip_id + 2, "current_partition_id": h.partition}

    @api
    def amdsmi_get_gpu_asic_info(h: FakeHandle) -> dict[str, Any]:
        g = h.gpu
        return {"market_name": g.market_name, "vendor_id": "0x1002", "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
                "subvendor_id": "0x1002", "device_id": g.device_id, "rev_id": "0x00", "asic_serial": f"0x{0xA1B2C3D400 + g.index:016X}",
                "oam_id": g.index, "num_compute_units": 304 // g.partitions, "target_graphics_version": g.gfx_target,
                "subsystem_id": "0x74a1"}  # fmt: skip

    @api
    def amdsmi_get_gpu_driver_info(h: FakeHandle) -> dict[str, Any]:
        return {"driver_name": "amdgpu", "driver_version": h.gpu.driver_version, "driver_date": "2015/01/01 00:00"}

    @api
    def amdsmi_get_gpu_vram_info(h: FakeHandle) -> dict[str, Any]:
        size_mb = h.gpu.memory_total_bytes // (1024 * 1024) // h.gpu.partitions
        return {"vram_type": 7, "vram_vendor": "SAMSUNG", "vram_size": size_mb, "vram_bit_width": 8192, "vram_max_bandwidth": NA}

    @api
    def amdsmi_get_power_cap_info(h: FakeHandle) -> dict[str, Any]:
        g = h.gpu
        uw = lambda w: int(round(w * 1_000_000))  # noqa: E731 - microwatts, as amdsmi.h says
        return {"power_cap": uw(g.power_cap_w), "default_power_cap": uw(g.default_power_cap_w), "dpm_cap": g.max_gfx_mhz,
                "min_power_cap": uw(g.min_power_cap_w), "max_power_cap": uw(g.max_power_cap_w)}  # fmt: skip

    @api
    def amdsmi_get_power_info(h: FakeHandle) -> dict[str, Any]:
        if not primary(h):  # socket power is read on partition 0 only
            return {"socket_power": NA, "current_socket_power": NA, "average_socket_power": NA, "gfx_voltage": NA,
                    "soc_voltage": NA, "mem_voltage": NA, "power_limit": NA}  # fmt: skip
        r = h.gpu.reading(now())
        watts = int(round(r.power_instant_w if r.power_instant_w is not None else r.power_w))
        return {"socket_power": watts, "current_socket_power": watts, "average_socket_power": NA,  # MI300: current, not average
                "gfx_voltage": NA, "soc_voltage": NA, "mem_voltage": NA, "power_limit": int(round(h.gpu.power_cap_w))}  # fmt: skip

    @api
    def amdsmi_get_energy_count(h: FakeHandle) -> dict[str, Any]:
        g, t = h.gpu, now()
        with lock:
            if g._energy_t is not None and t > g._energy_t:
                g.energy_uj += g.reading(t).power_w * 1e6 * (t - g._energy_t)
            g._energy_t = t if g._energy_t is None else max(t, g._energy_t)
            count = int(g.energy_uj / _uj_per_count())
        return {"energy_accumulator": count, "counter_resolution": _uj_per_count(), "timestamp": int(t * 1e9)}

    @api
    def amdsmi_get_gpu_activity(h: FakeHandle) -> dict[str, Any]:
        if not primary(h):  # "amdsmi does not return per-partition activity" (amd.md §2.3)
            return {"gfx_activity": NA, "umc_activity": NA, "mm_activity": NA}
        r = h.gpu.reading(now())
        return {"gfx_activity": int(r.gpu_util_pct), "umc_activity": int(r.mem_util_pct), "mm_activity": NA}

    @api
    def amdsmi_get_clock_info(h: FakeHandle, clock_type: AmdSmiClkType) -> dict[str, Any]:
        if not isinstance(clock_type, AmdSmiClkType):
            raise AmdSmiParameterException(clock_type, AmdSmiClkType)
        g, r = h.gpu, h.gpu.reading(now())
        if clock_type == AmdSmiClkType.GFX:
            return {"clk": int(r.sm_clock_mhz), "min_clk": g.idle_gfx_mhz, "max_clk": g.max_gfx_mhz, "clk_locked": False, "clk_deep_sleep": 0}
        if clock_type == AmdSmiClkType.MEM:
            return {"clk": int(r.mem_clock_mhz), "min_clk": 900, "max_clk": g.max_mem_mhz, "clk_locked": False, "clk_deep_sleep": 0}
        raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)

    @api
    def amdsmi_get_temp_metric(h: FakeHandle, sensor: AmdSmiTemperatureType, metric: AmdSmiTemperatureMetric) -> int:
        if sensor == AmdSmiTemperatureType.EDGE:  # MI300 reports no edge sensor (amd.md §1.4: N/A in the MI300A sample)
            raise AmdSmiLibraryException(STATUS_NOT_SUPPORTED)
        r = h.gpu.reading(now())
        return int(r.temperature_c) + (8 if sensor == AmdSmiTemperatureType.VRAM else 0)

    @api
    def amdsmi_get_violation_status(h: FakeHandle) -> dict[str, Any]:
        g, r = h.gpu, h.gpu.reading(now())
        bits = r.event_reasons
        active = {"ppt_pwr": bool(bits & CLOCK_EVENT_REASONS["sw_power_cap"]),
                  "socket_thrm": bool(bits & CLOCK_EVENT_REASONS["sw_thermal_slowdown"]),
                  "prochot_thrm": bool(bits & CLOCK_EVENT_REASONS["hw_thermal_slowdown"])}  # fmt: skip
        with lock:
            g.violations["counter"] += 1
            for k, on in active.items():
                g.violations[k] += int(on)
            acc = dict(g.violations)
        per = {k: int(round(100 * acc[k] / acc["counter"])) for k in active}
        return {
            "reference_timestamp": int(now() * 1e6), "violation_timestamp": int(now() * 1e9), "acc_counter": acc["counter"],
            "acc_prochot_thrm": acc["prochot_thrm"], "acc_ppt_pwr": acc["ppt_pwr"], "acc_socket_thrm": acc["socket_thrm"],
            "acc_vr_thrm": 0, "acc_hbm_thrm": 0, "acc_gfx_clk_below_host_limit": NA,
            "per_prochot_thrm": per["prochot_thrm"], "per_ppt_pwr": per["ppt_pwr"], "per_socket_thrm": per["socket_thrm"],
            "per_vr_thrm": 0, "per_hbm_thrm": 0, "per_gfx_clk_below_host_limit": NA,
            "active_prochot_thrm": active["prochot_thrm"], "active_ppt_pwr": active["ppt_pwr"], "active_socket_thrm": active["socket_thrm"],
            "active_vr_thrm": False, "active_hbm_thrm": False, "active_gfx_clk_below_host_limit": NA,
            # per XCP and XCC (2-D in 7.0.2): not modelled, N/A as the library says for a value it lacks
            **{f"{kind}_{what}": [[NA] * 8] for kind in ("acc", "per", "active")
               for what in ("gfx_clk_below_host_limit_pwr", "gfx_clk_below_host_limit_thm", "gfx_clk_below_host_limit_total", "low_utilization")},
        }  # fmt: skip

    @api
    def amdsmi_get_pcie_info(h: FakeHandle) -> dict[str, Any]:
        g = h.gpu
        mts = {1: 2500, 2: 5000, 3: 8000, 4: 16000, 5: 32000, 6: 64000}  # MT/s, as amdsmi.h says (amd.md §1.4)
        return {
            "pcie_static": {"max_pcie_width": g.pcie_width, "max_pcie_speed": mts[g.pcie_gen], "pcie_interface_version": g.pcie_gen,
                            "slot_type": "OAM"},
            "pcie_metric": {"pcie_width": g.pcie_width_current, "pcie_speed": mts[g.pcie_gen_current], "pcie_bandwidth": NA,
                            "pcie_replay_count": 0, "pcie_l0_to_recovery_count": 0, "pcie_replay_roll_over_count": 0,
                            "pcie_nak_sent_count": 0, "pcie_nak_received_count": 0, "pcie_lc_perf_other_end_recovery_count": 0},
        }  # fmt: skip

    @api
    def amdsmi_get_gpu_pci_throughput(h: FakeHandle) -> dict[str, Any]:
        r = h.gpu.reading(now())
        sent = r.pcie_tx_bytes_per_s if r.pcie_tx_bytes_per_s is not None else r.pcie_tx_kbps * 1000
        received = r.pcie_rx_bytes_per_s if r.pcie_rx_bytes_per_s is not None else r.pcie_rx_kbps * 1000
        return {"sent": int(sent), "received": int(received), "max_pkt_sz": 256}  # bytes in the last second

    @api
    def amdsmi_get_xgmi_info(h: FakeHandle) -> dict[str, Any]:
        return {"xgmi_lanes": 16 if host.xgmi else 0, "xgmi_hive_id": h.gpu.hive_id if host.xgmi else 0, "xgmi_node_id": h.gpu.index,
                "index": h.gpu.index}  # fmt: skip

    @api
    def amdsmi_topo_get_link_type(a: FakeHandle, b: FakeHandle) -> dict[str, int]:
        if a.gpu is b.gpu:
            return {"hops": 0, "type": AmdSmiLinkType.AMDSMI_LINK_TYPE_INTERNAL.value}
        if host.xgmi:
            return {"hops": 1, "type": AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI.value}
        return {"hops": 2, "type": AmdSmiLinkType.AMDSMI_LINK_TYPE_PCIE.value}

    @api
    def amdsmi_topo_get_p2p_status(a: FakeHandle, b: FakeHandle) -> dict[str, Any]:
        link = amdsmi_topo_get_link_type(a, b)["type"]
        ok = link in (0, 2)
        return {"type": ctypes.c_uint32(link),  # a raw c_uint32 in 7.0.2 (amdsmi_interface.py:3342)
                "cap": {"is_iolink_coherent": int(ok), "is_iolink_atomics_32bit": int(ok), "is_iolink_atomics_64bit": int(ok),
                        "is_iolink_dma": int(ok), "is_iolink_bi_directional": int(ok)}}  # fmt: skip

    @api
    def amdsmi_is_P2P_accessible(a: FakeHandle, b: FakeHandle) -> bool:
        return True if host.xgmi or a.gpu is b.gpu else False

    @api
    def amdsmi_get_gpu_compute_partition(h: FakeHandle) -> str:
        return h.gpu.compute_partition

    @api
    def amdsmi_get_gpu_memory_partition(h: FakeHandle) -> str:
        return h.gpu.memory_partition

    @api
    def amdsmi_get_gpu_process_list(h: FakeHandle) -> list[dict[str, Any]]:
        return [dict(p) for p in host.processes]

    return m
