"""`gpu.sample`: power, utilisation, clocks, clock-event reasons and PCIe traffic, sampled over a window."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpu_runbook.nvml import (
    CLOCK_EVENT_REASONS,
    MISSING_ERRORS,
    Device,
    Devices,
    error_name,
    is_nvml_error,
)
from gpu_runbook.plugin import (
    Bars,
    Context,
    Evidence,
    Probe,
    Series,
    downsample,
    utcnow,
)
from pydantic import Field

from ..gpu_values import SampleValues, pcie_link_gbps, stats
from .common import GpuSelection, _max, _min, _open, _present, _ratio, _Reader, _w

BUSY_FOR_CLOCK_PCT = 50  # sm_clock_ratio reads samples at or above this utilization

EVENT_REASONS = CLOCK_EVENT_REASONS
# Reasons that hold clocks below what the workload asks for (not idle, not a user setting).
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
# Reasons that slow the GPU regardless of the power limit: thermal, HW slowdown, power brake. NVML sets
# hw_slowdown together with HW thermal or the brake, so count samples with any of them (never add fractions).
SLOWDOWN_MASK = 0x8 | 0x20 | 0x40 | 0x80

EVENT_FN = "nvmlDeviceGetCurrentClocksEventReasons"
THROTTLE_FN = "nvmlDeviceGetCurrentClocksThrottleReasons"


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
    The values are declared in `SampleValues`: stats dicts (`Stats`) over all samples of all GPUs
    (None when never reported), and the same per GPU under `gpus`.
    """

    name = "gpu.sample"
    gpu_vendor = "nvidia"  # on an AMD host the amd family does this job (Registry.for_target)
    description = "power draw vs limit, utilisation, clocks, clock-event reasons and PCIe traffic over a window"
    Params = SampleParams
    Values = SampleValues

    async def run(self, ctx: Context, params: SampleParams) -> Evidence:
        started = utcnow()
        devs = await _open(ctx, params.gpus, started)
        if isinstance(devs, Evidence):
            return devs

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
                    "max_mem_clock_mhz": r.q("nvmlDeviceGetMaxClockInfo", h, lib.NVML_CLOCK_MEM),
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
            # clocks under load: a sample of a GPU under half busy (idle between a closed loop's rounds) drops its
            # clock by design and says nothing about a clock held down
            "sm_clock_ratio": [None if u is not None and u < BUSY_FOR_CLOCK_PCT else _ratio(c, st["max_sm_clock_mhz"])
                               for c, u in zip(tr.sm_clock, tr.gpu_util)],
            "mem_clock_ratio": [_ratio(c, st.get("max_mem_clock_mhz")) for c in tr.mem_clock],
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
        "max_sm_clock_source": "nvmlDeviceGetMaxClockInfo" if any(s["max_sm_clock_mhz"] for s in statics) else None,
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
