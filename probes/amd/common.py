"""What every AMD GPU probe shares: the amdsmi reader, which devices to read, opening them, grouping partitions.

All amdsmi access goes through `ctx.gpu.amdsmi` (gpu_runbook.amdsmi_lib.Amdsmi), so the simulator runs these
probes unchanged on its fake (engine/sim/fake_amdsmi.py, amdsmi 7.0.2). They fill the same GPU concepts as the
NVML family (probes/gpu_values.py); the conventions are that family's:

* units in the key names; amdsmi's power caps are microwatts (amdsmi 7.0.2 `amdsmi_get_power_cap_info`,
  amdsmi.h "(uW)"), its socket power watts: both become W here;
* a value the device does not report ("N/A", NOT_SUPPORTED, NO_DATA) is None, never 0, and the call is named in
  `unsupported_calls`;
* no library / no driver / no permission: `unavailable` with what was found and what to do.

In a partition mode (CPX...) amdsmi lists each compute partition as a device; the partitions of one GPU share its
ASIC serial (`amdsmi_get_gpu_asic_info`), which is how devices are grouped into physical GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_runbook.amdsmi_lib import (
    SKIP_DEVICE_STATUSES,
    error_name,
    is_amdsmi_error,
    is_missing,
    is_unavailable_error,
    na,
    unavailable_reason,
)
from gpu_runbook.gpu_library import CallReader
from gpu_runbook.plugin import Context, Evidence, utcnow
from pydantic import BaseModel, ConfigDict, Field


class AmdSelection(BaseModel):
    """Which devices a probe reads: on a host shared by several servers, only the ones under test."""

    model_config = ConfigDict(extra="forbid")
    gpus: list[int] = Field(
        default_factory=list,
        description="device indices as amd-smi numbers them (each compute partition one); empty: every device",
    )


class Reader(CallReader):
    """Calls amdsmi by name (NOT_SUPPORTED, NOT_YET_IMPLEMENTED, NO_DATA: missing; other amdsmi errors: noted)."""

    absent = "absent from this amdsmi"
    is_missing = staticmethod(is_missing)
    is_library_error = staticmethod(is_amdsmi_error)
    error_name = staticmethod(error_name)

    def field(self, result: Any, key: str, call: str) -> Any:
        """`result[key]` with "N/A" as None (the call is then named missing for that value)."""
        if not isinstance(result, dict):
            return None
        value = na(result.get(key))
        if value is None:
            self.missing.setdefault(f"{call}:{key}", "N/A")
        return value


@dataclass(frozen=True)
class Device:
    index: int  # as amd-smi numbers the devices
    handle: Any


@dataclass
class Devices:
    devices: list[Device]
    skipped: dict[int, str]


def _open_devices(lib: Any) -> Devices:
    devices: list[Device] = []
    skipped: dict[int, str] = {}
    for i, h in enumerate(lib.amdsmi_get_processor_handles()):
        try:
            lib.amdsmi_get_gpu_device_bdf(h)  # a device this user may not open says so here
        except Exception as exc:
            if is_amdsmi_error(exc) and error_name(exc) in SKIP_DEVICE_STATUSES:
                skipped[i] = error_name(exc)
                continue
            raise
        devices.append(Device(i, h))
    return Devices(devices, skipped)


async def open_devices(ctx: Context, only: list[int] | None, started: Any) -> Devices | Evidence:
    """Init amdsmi and open the devices (those in `only`), or the `unavailable` evidence saying why not."""
    try:
        devs = await ctx.gpu.amdsmi.call(_open_devices)  # type: ignore[union-attr]
    except Exception as exc:
        if is_unavailable_error(exc):
            return _stamp(Evidence.unavailable(unavailable_reason(exc)), started)
        raise
    if only:
        present = sorted([d.index for d in devs.devices] + list(devs.skipped))
        absent = sorted(set(only) - set(present))
        if absent:
            return _stamp(Evidence.unavailable(f"no GPU with index {', '.join(map(str, absent))}: amdsmi numbers this host's devices {present}"), started)
        devs = Devices([d for d in devs.devices if d.index in only], {i: e for i, e in devs.skipped.items() if i in only})
    if not devs.devices:
        if devs.skipped:
            return _stamp(Evidence.unavailable(f"{next(iter(devs.skipped.values()))}: amdsmi lists GPUs but none could be opened; "
                                               "add this user to the render and video groups, or run as root."), started)
        return _stamp(Evidence.unavailable("no GPU: amdsmi initialised but lists no AMD GPU (amdsmi_get_processor_handles is empty)."), started)
    return devs


def physical_groups(r: Reader, devices: list[Device]) -> list[list[Device]]:
    """Devices grouped by physical GPU (the ASIC serial their partitions share; the BDF where there is none), in order."""
    groups: dict[str, list[Device]] = {}
    for d in devices:
        serial = r.field(r.q("amdsmi_get_gpu_asic_info", d.handle), "asic_serial", "amdsmi_get_gpu_asic_info")
        key = str(serial) if serial else f"bdf:{r.q('amdsmi_get_gpu_device_bdf', d.handle)}:{d.index}"
        groups.setdefault(key, []).append(d)
    return list(groups.values())


def partition_id(r: Reader, d: Device) -> int | None:
    return r.field(r.q("amdsmi_get_gpu_kfd_info", d.handle), "current_partition_id", "amdsmi_get_gpu_kfd_info")


def watts_from_uw(uw: Any) -> float | None:
    """amdsmi's power caps are microwatts (amdsmi.h "(uW)"; the CLI converts with SI MICRO)."""
    return None if uw is None else round(float(uw) / 1_000_000, 3)


def celsius(value: Any) -> float | None:
    """amdsmi_get_temp_metric's value: °C as the amd-smi CLI prints it; amdsmi.h calls it millidegrees (amd.md
    §1.4: the two disagree, unverified on hardware), so a reading above 1000 is taken as millidegrees."""
    if value is None:
        return None
    v = float(value)
    return v / 1000.0 if v > 1000 else v


def _stamp(ev: Evidence, started: Any) -> Evidence:
    ev.started_at = ev.started_at or started
    ev.finished_at = utcnow()
    return ev
