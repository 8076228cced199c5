"""`gpu.activity`: whether "100 % utilised" GPUs are computing, from NVML GPM (SM, occupancy, tensor, DRAM)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gpu_runbook.nvml import error_name, is_nvml_error
from gpu_runbook.plugin import Context, Evidence, Probe, Table, Values, utcnow, value
from pydantic import Field

from ..gpu_values import Stats, stats
from .common import GpuSelection, _first, _open, _Reader

GPM_METRICS = {
    "sm_util_pct": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_util_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}


class ActivityGpu(Values):
    """One GPU's GPM metrics over the window (None where it has no GPM or the metric failed)."""

    index: int = value("NVML index (as nvidia-smi numbers the GPUs)", default=...)
    name: str | None = value("nvmlDeviceGetName")
    gpm_supported: bool | None = value("nvmlGpmQueryDeviceSupport: a GPM device; None when the query failed")
    reason: str | None = value("why this GPU has no metrics (not supported, or the NVML error); None when it has them")
    sm_util_pct: float | None = value("SM utilisation (NVML_GPM_METRIC_SM_UTIL)", unit="%")
    sm_occupancy_pct: float | None = value("SM occupancy: resident warps / max (NVML_GPM_METRIC_SM_OCCUPANCY)", unit="%")
    tensor_util_pct: float | None = value("any tensor pipe active (NVML_GPM_METRIC_ANY_TENSOR_UTIL)", unit="%")
    dram_bw_util_pct: float | None = value("DRAM bandwidth utilisation (NVML_GPM_METRIC_DRAM_BW_UTIL)", unit="%")


class ActivityValues(Values):
    """gpu.activity: NVML GPM activity over the window; the stats dicts are over the GPUs that have GPM."""

    gpu_count: int = value("GPUs read", default=...)
    supported_gpu_count: int = value("GPUs whose GPM metrics were read", default=...)
    window_s: float = value("time between the two GPM samples (0.0 when no GPU was sampled)", unit="s", default=...)
    sm_util_pct: Stats | None = value("SM utilisation over supported GPUs", unit="%")
    sm_occupancy_pct: Stats | None = value("SM occupancy over supported GPUs", unit="%")
    tensor_util_pct: Stats | None = value("tensor-pipe utilisation over supported GPUs", unit="%")
    dram_bw_util_pct: Stats | None = value("DRAM bandwidth utilisation over supported GPUs", unit="%")
    gpus: list[ActivityGpu] = value("per GPU, in index order", default=...)
    unsupported_calls: list[str] = value("NVML functions the device or driver lacks (sorted)", default=...)
    errors: dict[str, str] = value("NVML function -> unexpected error name", default=...)
    skipped_gpus: dict[str, str] = value("GPUs NVML lists but would not open: index -> NVML error name", default=...)


class ActivityParams(GpuSelection):
    duration_s: float = Field(1.0, ge=0.2, le=600, description="GPM window (NVML needs > 100 ms)")


class GpuActivity(Probe):
    """Whether "100 % utilised" GPUs are computing: NVML GPM SM, occupancy, tensor and DRAM activity.

    `unavailable` (with the reason) when no GPU is a GPM-supported device (nvmlGpmQueryDeviceSupport).
    The values are declared in `ActivityValues`; unavailable evidence carries them too.
    """

    name = "gpu.activity"
    gpu_vendor = "nvidia"  # on an AMD host the amd family does this job (Registry.for_target)
    description = "NVML GPM: SM utilisation, occupancy, tensor and DRAM activity (busy vs computing)"
    Params = ActivityParams
    Values = ActivityValues

    async def run(self, ctx: Context, params: ActivityParams) -> Evidence:
        started = utcnow()
        devs = await _open(ctx, params.gpus, started)
        if isinstance(devs, Evidence):
            return devs
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
                   + (f"SM util {su['mean']:.0f}%" if su else "SM util n/a"))
        summary += f", tensor util {tu['mean']:.1f}%" if tu else ""
        return Evidence(summary=summary, values=values, blocks=[table], started_at=started, finished_at=utcnow())
