"""What every GPU probe shares: the NVML reader, which GPUs to read, opening them, stats dicts, PCIe link speed.

All NVML access goes through `ctx.nvml` (gpu_runbook.nvml.Nvml), so tests and the simulator run the GPU
probes unchanged on a fake `pynvml`. Conventions every GPU probe follows:

* Units are in the key names (`_w`, `_mhz`, `_pct`, `_gbps`, `_bytes`); ratios are 0..1.
* A value the device does not report (NotSupported, FunctionNotFound, NoData...) is present with the
  value None (JSON null), never 0; a stats dict is None when no sample had a value. Rules test
  `x != null` before comparing.
* Stats dicts are `{"mean", "min", "max", "p50", "p95"}`.
* No driver / library / permission: `unavailable` with the NVML error's class name and advice.
"""

from __future__ import annotations

from typing import Any

from gpu_runbook.nvml import (
    MISSING_ERRORS,
    Devices,
    error_name,
    is_missing,
    is_nvml_error,
    is_unavailable_error,
    open_devices,
    unavailable_reason,
)
from gpu_runbook.gpu_library import CallReader
from gpu_runbook.plugin import Context, Evidence, utcnow
from pydantic import BaseModel, ConfigDict, Field

STAT_KEYS = ("mean", "min", "max", "p50", "p95")




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


class _Reader(CallReader):
    """Calls NVML by name (NotSupported, FunctionNotFound, NoData...: missing; other NVML errors: noted)."""

    absent = "NVMLError_FunctionNotFound"
    is_missing = staticmethod(is_missing)
    is_library_error = staticmethod(is_nvml_error)
    error_name = staticmethod(error_name)


class GpuSelection(BaseModel):
    """Which GPUs a probe reads: on a host shared by several servers, only the ones under test."""

    model_config = ConfigDict(extra="forbid")
    gpus: list[int] = Field(
        default_factory=list,
        description="NVML indices (as nvidia-smi numbers them) of the GPUs to read; empty: every GPU",
    )


async def _open(ctx: Context, only: list[int] | None, started: Any) -> Devices | Evidence:
    """Init NVML and open the devices (those in `only`, when given), or the `unavailable` evidence saying
    why not, stamped with the probe's start, so every GPU probe can return it as it is."""
    found = await _devices(ctx, only)
    return _stamp(found, started) if isinstance(found, Evidence) else found


async def _devices(ctx: Context, only: list[int] | None) -> Devices | Evidence:
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


def _first(xs: list[Any]) -> Any:
    return next((x for x in xs if x is not None), None)


def _stamp(ev: Evidence, started: Any) -> Evidence:
    ev.started_at = ev.started_at or started
    ev.finished_at = utcnow()
    return ev
