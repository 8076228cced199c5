"""Live readings while load runs: per-GPU power against its limit, utilisation and SM clock from NVML (or,
on an AMD host, socket power against the power cap, GFX activity and GFX clock from amdsmi), and the server's running / queued requests and KV usage from its /metrics, about once a second.

The probes' evidence arrives when their window closes; a person watching the window wants to see it
happen. The runner polls these while the load window (or a probe that drives its own load, a sweep)
is open and emits one `LiveSample` per reading. The readings are for the screen only: no rule reads
them, so a failed read is a missing value, never an error.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from .events import LiveSample
from .fetch import fetch
from .amdsmi_lib import na
from .nvml import Nvml, open_devices, query

INTERVAL_S = 1.0
SERVER_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")


def read_gpus(lib: Any, only: list[int] | None) -> list[dict[str, Any]]:
    """One reading per GPU: index, power_w, limit_w, util_pct, sm_clock_mhz (None where NVML has no value)."""
    out: list[dict[str, Any]] = []
    for dev in open_devices(lib).devices:
        if only and dev.index not in only:
            continue
        h = dev.handle

        def q(name: str, *args: Any) -> Any:
            try:
                return query(getattr(lib, name), h, *args)
            except Exception:  # noqa: BLE001 - a display reading: missing, not fatal
                return None

        power, limit, util = q("nvmlDeviceGetPowerUsage"), q("nvmlDeviceGetEnforcedPowerLimit"), q("nvmlDeviceGetUtilizationRates")
        out.append({
            "index": dev.index,
            "power_w": None if power is None else power / 1000.0,
            "limit_w": None if limit is None else limit / 1000.0,
            "util_pct": None if util is None else util.gpu,
            "sm_clock_mhz": q("nvmlDeviceGetClockInfo", lib.NVML_CLOCK_SM),
        })
    return out


def read_amd_gpus(lib: Any, only: list[int] | None) -> list[dict[str, Any]]:
    """The same reading per AMD device from amdsmi (7.0.2 names): socket power (W; "N/A" on a partition other than
    0), the power cap (microwatts, as W), GFX activity and GFX clock; None where amdsmi has no value."""
    out: list[dict[str, Any]] = []
    for index, h in enumerate(lib.amdsmi_get_processor_handles()):
        if only and index not in only:
            continue

        def q(name: str, key: str, *args: Any) -> Any:
            try:
                value = na(getattr(lib, name)(h, *args).get(key))
            except Exception:  # noqa: BLE001 - a display reading: missing, not fatal
                return None
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        cap = q("amdsmi_get_power_cap_info", "power_cap")
        out.append({
            "index": index,
            "power_w": q("amdsmi_get_power_info", "socket_power"),
            "limit_w": None if cap is None else cap / 1_000_000,
            "util_pct": q("amdsmi_get_gpu_activity", "gfx_activity"),
            "sm_clock_mhz": q("amdsmi_get_clock_info", "clk", lib.AmdSmiClkType.GFX),
        })
    return out


def server_gauges(text: str) -> dict[str, float]:
    """running and queued summed over the DP ranks, KV usage the fullest rank (0..1), from Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415 - only while load runs

    found: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in SERVER_GAUGES:
                    found.setdefault(sample.name, []).append(float(sample.value))
    except ValueError:  # a truncated scrape: what was parsed so far
        pass
    out: dict[str, float] = {}
    if "sglang:num_running_reqs" in found:
        out["running"] = sum(found["sglang:num_running_reqs"])
    if "sglang:num_queue_reqs" in found:
        out["queued"] = sum(found["sglang:num_queue_reqs"])
    if "sglang:token_usage" in found:
        out["kv_usage"] = max(found["sglang:token_usage"])
    return out


class LiveMonitor:
    """`await LiveMonitor(...).run()` until cancelled; `emit` gets a LiveSample per reading."""

    def __init__(self, nvml: Nvml, http: Any, metrics_url: str, headers: dict[str, str], emit: Callable[[LiveSample], None],
                 gpus: list[int] | None = None, interval_s: float = INTERVAL_S, amdsmi: Any = None) -> None:  # fmt: skip
        self.nvml, self.http, self.metrics_url, self.headers = nvml, http, metrics_url, headers
        self.amdsmi = amdsmi  # an AMD host's GPUs are read through amdsmi (gpu_runbook.amdsmi_lib.Amdsmi), not NVML
        self.emit, self.gpus, self.interval_s = emit, gpus, interval_s
        self._gpus_ok = True
        self._metrics_ok = True

    async def run(self) -> None:
        started = time.monotonic()
        while True:
            tick = time.monotonic()
            gpus, server = await asyncio.gather(self._gpus(), self._server())
            if gpus or server:
                self.emit(LiveSample(round(tick - started, 2), gpus, server))
            await asyncio.sleep(max(0.05, self.interval_s - (time.monotonic() - tick)))

    async def _gpus(self) -> list[dict[str, Any]]:
        if not self._gpus_ok:
            return []
        try:
            if self.amdsmi is not None:
                return await self.amdsmi.call(lambda lib: read_amd_gpus(lib, self.gpus))
            return await self.nvml.call(lambda lib: read_gpus(lib, self.gpus))
        except Exception:  # noqa: BLE001 - no NVML here: the panel shows the server alone
            self._gpus_ok = False
            return []

    async def _server(self) -> dict[str, float]:
        if not self._metrics_ok:
            return {}
        try:
            response = await fetch(self.http, self.metrics_url, headers=self.headers, timeout_s=2.0)  # bounded
        except Exception:  # noqa: BLE001 - a slow or busy server: try again next second
            return {}
        if response.status_code == 404:  # started without --enable-metrics: stop asking
            self._metrics_ok = False
            return {}
        return server_gauges(response.text) if response.status_code == 200 else {}
