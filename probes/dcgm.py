"""Scrape a dcgm-exporter /metrics endpoint: power, limits, clocks, utilisation and DCGM_FI_PROF_* activity.

A second opinion next to NVML, and the only source of SM/tensor activity where GPM is not supported.
Parsed with prometheus-client's own parser; label names are matched case-insensitively because
dcgm-exporter renamed `Hostname` to `hostname` and `-o` switches `UUID` to `uuid` (nvml.md §4.2).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpu_runbook.evidence import Bars, Evidence, Table, utcnow
from gpu_runbook.fetch import FetchError, check_lines, fetch
from gpu_runbook.probe import Context, Probe
from gpu_runbook.probes.gpu_common import Stats, stats
from gpu_runbook.values import Values, value

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


class DcgmGpu(Values):
    """One GPU (or MIG instance) as the last scrape saw it: its labels, then whichever fields it exported.

    Every DCGM_FI_PROF_<FIELD> becomes prof_<field> (a ratio 0..1; *_BYTES a rate in B/s); the fields
    below are those DCGM documents (nvml.md §4.1), any other (per-link NVLink, DCGM 4.6's *_UTIL_RATIO
    names) is kept too, as a number, but a rule can only name the declared ones."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, float] = Field(init=False)  # other prof_* fields: numbers

    gpu: str = value("DCGM GPU id (label `gpu`)", default=...)
    gpu_instance_id: str | None = value("MIG GPU instance id (label `GPU_I_ID`), null without MIG", default=...)
    uuid: str | None = value("GPU UUID label", default=...)
    pci_bus_id: str | None = value("PCI bus id label", default=...)
    model_name: str | None = value("modelName label", default=...)
    hostname: str | None = value("Hostname label", default=...)
    driver_version: str | None = value("DCGM_FI_DRIVER_VERSION label", default=...)
    draw_to_enforced_limit: float | None = value("power_usage_w / power_limit_enforced_w (null without either)", default=...)
    power_usage_w: float | None = value("DCGM_FI_DEV_POWER_USAGE", unit="W")
    power_usage_instant_w: float | None = value("DCGM_FI_DEV_POWER_USAGE_INSTANT", unit="W")
    power_limit_enforced_w: float | None = value("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", unit="W")
    power_limit_requested_w: float | None = value("DCGM_FI_DEV_POWER_MGMT_LIMIT", unit="W")
    power_limit_min_w: float | None = value("DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN", unit="W")
    power_limit_max_w: float | None = value("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", unit="W")
    power_limit_default_w: float | None = value("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", unit="W")
    total_energy_mj: float | None = value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION since boot", unit="mJ")
    sm_clock_mhz: float | None = value("DCGM_FI_DEV_SM_CLOCK", unit="MHz")
    mem_clock_mhz: float | None = value("DCGM_FI_DEV_MEM_CLOCK", unit="MHz")
    gpu_util_pct: float | None = value("DCGM_FI_DEV_GPU_UTIL", unit="%")
    mem_copy_util_pct: float | None = value("DCGM_FI_DEV_MEM_COPY_UTIL", unit="%")
    temperature_c: float | None = value("DCGM_FI_DEV_GPU_TEMP", unit="°C")
    clocks_event_reasons: int | None = value("DCGM_FI_DEV_CLOCKS_EVENT_REASONS (or the older CLOCK_THROTTLE_REASONS) bit mask")
    power_violation_ns: float | None = value("DCGM_FI_DEV_POWER_VIOLATION: time held by the power limit", unit="ns")
    thermal_violation_ns: float | None = value("DCGM_FI_DEV_THERMAL_VIOLATION: time held by temperature", unit="ns")
    prof_gr_engine_active: float | None = value("graphics/compute engine active, 0..1")
    prof_sm_active: float | None = value("cycles an SM has a warp, 0..1")
    prof_sm_occupancy: float | None = value("resident warps / maximum, 0..1")
    prof_pipe_tensor_active: float | None = value("cycles a tensor pipe is active, 0..1")
    prof_dram_active: float | None = value("cycles the memory interface is busy, 0..1")
    prof_pipe_fp64_active: float | None = value("FP64 pipe active, 0..1")
    prof_pipe_fp32_active: float | None = value("FP32 pipe active, 0..1")
    prof_pipe_fp16_active: float | None = value("FP16 pipe active (not HMMA), 0..1")
    prof_pipe_tensor_imma_active: float | None = value("integer tensor pipe active, 0..1")
    prof_pipe_tensor_hmma_active: float | None = value("half-precision tensor pipe active, 0..1")
    prof_pipe_tensor_dfma_active: float | None = value("FP64 tensor pipe active, 0..1")
    prof_pipe_int_active: float | None = value("integer pipe active, 0..1")
    prof_pcie_tx_bytes_per_s: float | None = value("DCGM_FI_PROF_PCIE_TX_BYTES (device to host, a rate)", unit="B/s")
    prof_pcie_rx_bytes_per_s: float | None = value("DCGM_FI_PROF_PCIE_RX_BYTES (host to device, a rate)", unit="B/s")
    prof_nvlink_tx_bytes_per_s: float | None = value("DCGM_FI_PROF_NVLINK_TX_BYTES, all links", unit="B/s")
    prof_nvlink_rx_bytes_per_s: float | None = value("DCGM_FI_PROF_NVLINK_RX_BYTES, all links", unit="B/s")


class DcgmValues(Values):
    """`gpu.dcgm`: dcgm-exporter's readings over a window; the aggregates are null when no GPU exported the field."""

    url: str = value("the metrics endpoint read", default=...)
    gpu_count: int = value("GPUs (and MIG instances) in the last scrape", default=...)
    metrics: list[str] = value("DCGM_FI_* names seen, sorted", default=...)
    prof_available: bool = value("any DCGM_FI_PROF_* field (needs DCGM profiling; off on some GPUs and VMs)", default=...)
    power_limit_enforced_w: float | None = value("lowest enforced power limit over GPUs", unit="W", default=...)
    power_usage_w: Stats | None = value("board power draw", unit="W", default=...)
    draw_to_enforced_limit: Stats | None = value("draw / enforced limit (1.0: at the cap)", default=...)
    gpu_util_pct: Stats | None = value("GPU utilisation (a kernel ran, not how busy)", unit="%", default=...)
    sm_clock_mhz: Stats | None = value("SM clock", unit="MHz", default=...)
    mem_clock_mhz: Stats | None = value("memory clock", unit="MHz", default=...)
    prof_gr_engine_active: Stats | None = value("graphics/compute engine active, 0..1", default=...)
    prof_sm_active: Stats | None = value("SM active, 0..1", default=...)
    prof_sm_occupancy: Stats | None = value("SM occupancy, 0..1", default=...)
    prof_pipe_tensor_active: Stats | None = value("tensor pipe active, 0..1", default=...)
    prof_dram_active: Stats | None = value("DRAM interface active, 0..1", default=...)
    scrapes: int = value("scrapes in the window", default=...)
    readings_distinct: int = value(
        "different readings the window saw (dcgm-exporter refreshes every 30 s by default: 1 = one reading, not a window)", default=...)  # fmt: skip
    gpus: list[DcgmGpu] = value("per GPU, from the last scrape, by GPU id", default=...)


class DcgmExporter(Probe):
    """Reads dcgm-exporter's /metrics: power vs limits, clocks, utilisation and PROF activity per GPU.

    `unavailable` when the endpoint cannot be reached, answers non-200, or carries no DCGM_FI_* metrics.
    The values are declared in `DcgmValues`.
    """

    name = "gpu.dcgm"
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
