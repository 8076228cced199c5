"""Scrape a dcgm-exporter /metrics endpoint: power, limits, clocks, utilisation and DCGM_FI_PROF_* activity.

A second opinion next to NVML, and the only source of SM/tensor activity where GPM is not supported.
Parsed with prometheus-client's own parser; label names are matched case-insensitively because
dcgm-exporter renamed `Hostname` to `hostname` and `-o` switches `UUID` to `uuid` (nvml.md §4.2).
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpu_runbook.fetch import FetchError, check_lines, fetch
from gpu_runbook.plugin import Bars, Context, Evidence, Probe, Table, utcnow
from pydantic import BaseModel, ConfigDict, Field

from ..gpu_values import DcgmValues, stats

# dcgm-exporter device fields -> value keys (units in the names; DCGM reports power in W, energy in mJ).
DEV_FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_POWER_USAGE": "power_usage_w",
    "DCGM_FI_DEV_POWER_USAGE_INSTANT": "power_usage_instant_w",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "power_limit_enforced_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_requested_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN": "power_limit_min_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": "power_limit_max_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": "power_limit_default_w",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "total_energy_mj",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MEM_CLOCK": "mem_clock_mhz",
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util_pct",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "mem_copy_util_pct",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "clocks_event_reasons",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "clocks_event_reasons",
    "DCGM_FI_DEV_POWER_VIOLATION": "power_violation_ns",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "thermal_violation_ns",
}
PROF_PREFIX = "DCGM_FI_PROF_"
# PROF ratios rules will want; always present in values (None when the exporter does not export them).
PROF_KEYS = ("prof_gr_engine_active", "prof_sm_active", "prof_sm_occupancy", "prof_pipe_tensor_active", "prof_dram_active")
AGG_KEYS = ("power_usage_w", "draw_to_enforced_limit", "gpu_util_pct", "sm_clock_mhz", "mem_clock_mhz", *PROF_KEYS)


DEFAULT_URL = "http://127.0.0.1:9400/metrics"


class DcgmParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(None, description=f"dcgm-exporter metrics endpoint (default: the target's, else {DEFAULT_URL})")
    request_timeout_s: float = Field(5.0, gt=0, le=120)
    duration_s: float = Field(0.0, ge=0, le=3600, description="scrape over this window (0: one scrape)")
    interval_s: float = Field(1.0, gt=0, le=600, description="time between scrapes")


def _prof_key(metric: str) -> str:
    """DCGM_FI_PROF_PIPE_TENSOR_ACTIVE -> prof_pipe_tensor_active; PCIe/NVLink bytes are rates (B/s)."""
    key = "prof_" + metric[len(PROF_PREFIX):].lower()
    return key + "_per_s" if key.endswith("_bytes") else key


def parse_dcgm(text: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per-GPU (and per MIG instance) dicts keyed "gpu" or "gpu/gi", plus the metric names seen."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415 - only this probe needs it

    gpus: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if family.type == "counter" and name == family.name + "_total":
                name = family.name  # the parser appends `_total` to counters; DCGM names have none
            if not name.startswith("DCGM_FI_"):
                continue
            labels = {k.lower(): v for k, v in sample.labels.items()}
            gpu = labels.get("gpu")
            if gpu is None:
                continue
            key = DEV_FIELDS.get(name) or (_prof_key(name) if name.startswith(PROF_PREFIX) else None)
            if key is None:
                continue
            seen.add(name)
            gi = labels.get("gpu_i_id")
            gid = f"{gpu}/{gi}" if gi else gpu
            entry = gpus.setdefault(gid, {
                "gpu": gpu,
                "gpu_instance_id": gi,
                "uuid": labels.get("uuid") or labels.get("gpu_uuid"),
                "pci_bus_id": labels.get("pci_bus_id"),
                "model_name": labels.get("modelname") or labels.get("model_name"),
                "hostname": labels.get("hostname"),
                "driver_version": labels.get("dcgm_fi_driver_version"),
            })
            value = float(sample.value)
            entry[key] = int(value) if key == "clocks_event_reasons" else value
    return gpus, sorted(seen)


async def _scrape(ctx: Context, url: str, timeout_s: float) -> tuple[dict[str, dict[str, Any]], list[str]] | Evidence:
    try:
        resp = await fetch(ctx.http, url, timeout_s=timeout_s)  # bounded: size, deadline, redirects (gpu_runbook.fetch)
    except FetchError as exc:
        if exc.kind in ("too_large", "encoding", "redirect"):
            return Evidence.failed(exc.message)
        return Evidence.unavailable(
            f"dcgm-exporter not reachable at {url} ({exc.detail}); "
            "start it (default port 9400) or pass its URL in the `url` parameter."
        )
    if resp.status_code != 200:
        return Evidence.unavailable(f"dcgm-exporter at {url} answered HTTP {resp.status_code}")
    try:
        check_lines(resp.text, url)
        return parse_dcgm(resp.text)
    except FetchError as exc:
        return Evidence.failed(exc.message)
    except ValueError as exc:
        return Evidence.failed(f"could not parse metrics from {url}: {exc}")


def _gpu_sort(gid: str) -> tuple[int, str]:
    head = gid.split("/")[0]
    return (int(head) if head.isdigit() else 1 << 30, gid)


class DcgmExporter(Probe):
    """Reads dcgm-exporter's /metrics: power vs limits, clocks, utilisation and PROF activity per GPU.

    `unavailable` when the endpoint cannot be reached, answers non-200, or carries no DCGM_FI_* metrics.
    The values are declared in `DcgmValues`.
    """

    name = "gpu.dcgm"
    gpu_vendor = "nvidia"  # on an AMD host the amd family does this job (Registry.for_target)
    prefetch = True
    description = "dcgm-exporter metrics: power vs limits, clocks, utilisation, DCGM_FI_PROF_* activity"
    Params = DcgmParams
    Values = DcgmValues
    default_timeout_s = 15.0

    async def run(self, ctx: Context, params: DcgmParams) -> Evidence:
        started = utcnow()
        url = params.url or getattr(ctx.target, "dcgm_url", None) or DEFAULT_URL
        # dcgm-exporter refreshes every 30 s by default (`-c 30000`): one scrape is one reading, whatever the window.
        scrapes: list[dict[str, dict[str, Any]]] = []
        seen: list[str] = []
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        n = 1 if params.duration_s <= 0 else max(2, int(params.duration_s / params.interval_s) + 1)
        for i in range(n):
            if i:
                await asyncio.sleep(max(0.0, t0 + i * params.interval_s - loop.time()))
            got = await _scrape(ctx, url, params.request_timeout_s)
            if isinstance(got, Evidence):
                if scrapes:  # keep what the window already read
                    ctx.log(f"gpu.dcgm: stopped after {len(scrapes)} scrapes: {got.reason}")
                    break
                got.started_at, got.finished_at = started, utcnow()
                return got
            scrapes.append(got[0])
            seen = sorted(set(seen) | set(got[1]))
        per_gpu = scrapes[-1]
        if not per_gpu:
            return Evidence.unavailable(
                f"{url} carries no per-GPU DCGM_FI_* metrics (is it a dcgm-exporter?)",
                started_at=started, finished_at=utcnow(),
            )
        for scrape in scrapes:
            for g in scrape.values():
                p, lim = g.get("power_usage_w"), g.get("power_limit_enforced_w")
                g["draw_to_enforced_limit"] = round(p / lim, 6) if p is not None and lim else None
        gpus = [per_gpu[k] for k in sorted(per_gpu, key=_gpu_sort)]
        limits = [g["power_limit_enforced_w"] for g in gpus if g.get("power_limit_enforced_w") is not None]
        pooled = {k: [g.get(k) for scrape in scrapes for g in scrape.values()] for k in AGG_KEYS}
        readings = {tuple(sorted((gid, g.get("prof_dram_active"), g.get("prof_pipe_tensor_active"), g.get("power_usage_w"))
                                 for gid, g in scrape.items())) for scrape in scrapes}  # fmt: skip
        values: dict[str, Any] = {
            "url": url,
            "gpu_count": len(gpus),
            "metrics": seen,
            "prof_available": any(m.startswith(PROF_PREFIX) for m in seen),
            "power_limit_enforced_w": min(limits) if limits else None,
            # over every GPU and every scrape of the window
            **{k: stats(v) for k, v in pooled.items()},
            "scrapes": len(scrapes),
            # distinct readings the exporter produced in the window: 1 means it never refreshed (one sample, not a window)
            "readings_distinct": len(readings),
            "gpus": gpus,
        }
        blocks: list[Any] = []
        bars = [(f"GPU {g['gpu']}", g["power_usage_w"], g.get("power_limit_enforced_w") or 0.0)
                for g in gpus if g.get("power_usage_w") is not None]
        if bars:
            blocks.append(Bars(title="dcgm-exporter power draw vs enforced limit", unit="W", bars=bars))
        blocks.append(Table(
            title="dcgm-exporter per GPU",
            columns=["GPU", "power W", "GPU util %", "SM MHz", "tensor active", "SM active", "DRAM active"],
            rows=[[g["gpu"], g.get("power_usage_w"), g.get("gpu_util_pct"), g.get("sm_clock_mhz"),
                   g.get("prof_pipe_tensor_active"), g.get("prof_sm_active"), g.get("prof_dram_active")] for g in gpus],
        ))
        pw, tensor = values["power_usage_w"], values["prof_pipe_tensor_active"]
        summary = (f"dcgm-exporter: {len(gpus)} GPUs"
                   + (f", {pw['mean']:.0f} W mean draw" if pw else "")
                   + (f", tensor pipe active {tensor['mean'] * 100:.1f}%" if tensor else
                      ", no PROF metrics" if not values["prof_available"] else ""))
        return Evidence(summary=summary, values=values, blocks=blocks, started_at=started, finished_at=utcnow())
