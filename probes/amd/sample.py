"""`amd.sample`: power, activity, clocks, violations and PCIe traffic of AMD GPUs over a window, from amdsmi.

It does the job `gpu.sample` names and fills its values (`SampleValues`), one entry per physical GPU: in a
partition mode amdsmi reports socket power and activity on partition 0 only (amd.md §2.3), so partition 0 speaks
for its GPU and the other partitions' "N/A" is not read as 0. What holds the clock comes from
`amdsmi_get_violation_status` (amdsmi 6.4+, MI300 and newer; amdsmi 7.0.2 `amdsmi_interface.py:2423`): each sample's
`active_*` flags, named as the GPU concepts name them (PPT -> sw_power_cap; socket, VR and HBM thermal ->
sw_thermal_slowdown; PROCHOT -> hw_thermal_slowdown and hw_slowdown), and a locked GFX clock
(`amdsmi_get_clock_info` clk_locked) -> applications_clocks_setting.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from gpu_runbook.plugin import Bars, Context, Evidence, Probe, Series, downsample, utcnow
from pydantic import Field

from ..gpu_values import SampleValues, pcie_link_gbps, stats
from .common import AmdSelection, Device, Reader, celsius, open_devices, physical_groups, watts_from_uw

BUSY_FOR_CLOCK_PCT = 50  # sm_clock_ratio reads samples at or above this activity, as gpu.sample does

REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal_slowdown",
           "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting")  # fmt: skip
# amdsmi_get_violation_status's active_* flag -> the reasons it stands for
VIOLATIONS = {
    "active_ppt_pwr": ("sw_power_cap",),
    "active_socket_thrm": ("sw_thermal_slowdown",),
    "active_vr_thrm": ("sw_thermal_slowdown",),
    "active_hbm_thrm": ("sw_thermal_slowdown",),
    "active_prochot_thrm": ("hw_thermal_slowdown", "hw_slowdown"),
}
THROTTLE = {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
SLOWDOWN = THROTTLE - {"sw_power_cap"}


class SampleParams(AmdSelection):
    duration_s: float = Field(10.0, gt=0, le=3600, description="sampling window")
    interval_s: float = Field(0.5, ge=0.01, le=60, description="time between samples")


@dataclass
class _Track:
    t: list[float] = field(default_factory=list)
    power_w: list[float | None] = field(default_factory=list)
    gfx_pct: list[float | None] = field(default_factory=list)
    umc_pct: list[float | None] = field(default_factory=list)
    gfx_mhz: list[float | None] = field(default_factory=list)
    mem_mhz: list[float | None] = field(default_factory=list)
    temp_c: list[float | None] = field(default_factory=list)
    reasons: list[set[str] | None] = field(default_factory=list)
    tx_bps: list[float | None] = field(default_factory=list)
    rx_bps: list[float | None] = field(default_factory=list)
    energy: list[tuple[float, float]] = field(default_factory=list)  # (monotonic s, uJ)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


class _Sampler:
    """Reads each physical GPU's partition 0 once per tick."""

    def __init__(self, r: Reader, primaries: list[Device]) -> None:
        self.r = r
        self.primaries = primaries
        self.tracks = [_Track() for _ in primaries]
        self.has_violations = [True for _ in primaries]

    def tick(self, lib: Any) -> None:
        r = self.r
        for gi, d in enumerate(self.primaries):
            h, tr = d.handle, self.tracks[gi]
            tr.t.append(time.monotonic())
            power = r.q("amdsmi_get_power_info", h)
            # MI300+ report current_socket_power, older parts average_socket_power; socket_power is whichever applies
            tr.power_w.append(_num(r.field(power, "socket_power", "amdsmi_get_power_info")))
            act = r.q("amdsmi_get_gpu_activity", h)
            tr.gfx_pct.append(_num(r.field(act, "gfx_activity", "amdsmi_get_gpu_activity")))
            tr.umc_pct.append(_num(r.field(act, "umc_activity", "amdsmi_get_gpu_activity")))
            gfx = r.q("amdsmi_get_clock_info", h, lib.AmdSmiClkType.GFX)
            tr.gfx_mhz.append(_num(r.field(gfx, "clk", "amdsmi_get_clock_info")))
            tr.mem_mhz.append(_num(r.field(r.q("amdsmi_get_clock_info", h, lib.AmdSmiClkType.MEM), "clk", "amdsmi_get_clock_info")))
            tr.temp_c.append(celsius(r.q("amdsmi_get_temp_metric", h, lib.AmdSmiTemperatureType.HOTSPOT, lib.AmdSmiTemperatureMetric.CURRENT)))
            tr.reasons.append(self._reasons(gi, h, gfx))
            pci = r.q("amdsmi_get_gpu_pci_throughput", h)
            tr.tx_bps.append(_num(r.field(pci, "sent", "amdsmi_get_gpu_pci_throughput")))
            tr.rx_bps.append(_num(r.field(pci, "received", "amdsmi_get_gpu_pci_throughput")))
            e = r.q("amdsmi_get_energy_count", h)
            acc, res = r.field(e, "energy_accumulator", "amdsmi_get_energy_count"), r.field(e, "counter_resolution", "amdsmi_get_energy_count")
            if acc is not None and res is not None:
                tr.energy.append((time.monotonic(), float(acc) * float(res)))  # accumulator x resolution = uJ

    def _reasons(self, gi: int, h: Any, gfx: Any) -> set[str] | None:
        if not self.has_violations[gi]:
            return None
        v = self.r.q("amdsmi_get_violation_status", h)
        if not isinstance(v, dict):
            self.has_violations[gi] = False  # not an MI300+, or an amdsmi older than 6.4: no reasons, not "none active"
            return None
        out = {reason for flag, reasons in VIOLATIONS.items() if v.get(flag) is True for reason in reasons}
        if isinstance(gfx, dict) and gfx.get("clk_locked") is True:
            out.add("applications_clocks_setting")
        return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _share(sets: list[set[str] | None], names: set[str]) -> float | None:
    seen = [s for s in sets if s is not None]
    return round(sum(1 for s in seen if s & names) / len(seen), 6) if seen else None


def _fractions(sets: list[set[str] | None]) -> dict[str, float] | None:
    seen = [s for s in sets if s is not None]
    return {n: round(sum(1 for s in seen if n in s) / len(seen), 6) for n in REASONS} if seen else None


def _energy_avg_w(energy: list[tuple[float, float]]) -> float | None:
    if len(energy) < 2:
        return None
    (t0, e0), (t1, e1) = energy[0], energy[-1]
    if t1 <= t0 or e1 < e0:
        return None
    return round((e1 - e0) / (t1 - t0) / 1e6, 6)


def _mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(sum(xs) / len(xs), 3) if xs else None


class AmdSample(Probe):
    """Power, activity, clocks, violations and PCIe traffic of AMD GPUs over a window (amdsmi), per physical GPU."""

    name = "amd.sample"
    gpu_vendor = "amd"
    gpu_role = "gpu.sample"
    description = "AMD GPUs: socket power vs power cap, activity, clocks, violations and PCIe traffic over a window, from amdsmi"
    Params = SampleParams
    Values = SampleValues

    async def run(self, ctx: Context, params: SampleParams) -> Evidence:
        started = utcnow()
        devs = await open_devices(ctx, params.gpus, started)
        if isinstance(devs, Evidence):
            return devs
        amd = ctx.gpu.amdsmi  # type: ignore[union-attr]

        def setup(lib: Any) -> tuple[list[dict[str, Any]], _Sampler]:
            r = Reader(lib)
            groups = physical_groups(r, devs.devices)
            statics = []
            for k, group in enumerate(groups):
                h = group[0].handle
                cap = r.q("amdsmi_get_power_cap_info", h)
                pcie = r.q("amdsmi_get_pcie_info", h)
                static = pcie.get("pcie_static") if isinstance(pcie, dict) else None
                gen, width = r.field(static, "pcie_interface_version", "amdsmi_get_pcie_info"), r.field(static, "max_pcie_width", "amdsmi_get_pcie_info")
                asic = r.q("amdsmi_get_gpu_asic_info", h)
                statics.append({
                    "index": k,
                    "name": r.field(asic, "market_name", "amdsmi_get_gpu_asic_info"),
                    "uuid": r.q("amdsmi_get_gpu_device_uuid", h),
                    "power_limit_enforced_w": watts_from_uw(r.field(cap, "power_cap", "amdsmi_get_power_cap_info")),
                    "power_limit_max_w": watts_from_uw(r.field(cap, "max_power_cap", "amdsmi_get_power_cap_info")),
                    "max_sm_clock_mhz": r.field(r.q("amdsmi_get_clock_info", h, lib.AmdSmiClkType.GFX), "max_clk", "amdsmi_get_clock_info"),
                    "max_sm_clock_source": "amdsmi_get_clock_info",
                    "max_mem_clock_mhz": r.field(r.q("amdsmi_get_clock_info", h, lib.AmdSmiClkType.MEM), "max_clk", "amdsmi_get_clock_info"),
                    "pcie_link_gen_max": gen,
                    "pcie_link_width_max": width,
                    "pcie_link_max_gbps": pcie_link_gbps(gen, width),
                    "partitions": len(group),
                })  # fmt: skip
            return statics, _Sampler(r, [g[0] for g in groups])

        statics, sampler = await amd.call(setup)
        loop = asyncio.get_running_loop()
        n_ticks = max(2, int(params.duration_s / params.interval_s + 1e-9) + 1)
        t0 = loop.time()
        for k in range(n_ticks):
            delay = t0 + k * params.interval_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await amd.call(sampler.tick)

        def links_now(lib: Any) -> list[tuple[Any, Any]]:
            out = []
            for d in sampler.primaries:
                metric = (sampler.r.q("amdsmi_get_pcie_info", d.handle) or {}).get("pcie_metric")
                speed = sampler.r.field(metric, "pcie_speed", "amdsmi_get_pcie_info")
                gen = {2500: 1, 5000: 2, 8000: 3, 16000: 4, 32000: 5, 64000: 6}.get(int(speed)) if speed is not None else None
                out.append((gen, sampler.r.field(metric, "pcie_width", "amdsmi_get_pcie_info")))
            return out

        links = await amd.call(links_now)
        return _evidence(params, statics, sampler, links, devs.skipped, started)


def _evidence(params: SampleParams, statics: list[dict[str, Any]], sampler: _Sampler, links: list[tuple[Any, Any]],
              skipped: dict[int, str], started: Any) -> Evidence:
    per_gpu: list[dict[str, Any]] = []
    pooled: dict[str, list[Any]] = {}
    all_reasons: list[set[str] | None] = []
    energy_avgs, tx_rates, rx_rates = [], [], []
    for st, tr, (gen_now, width_now) in zip(statics, sampler.tracks, links):
        link = st["pcie_link_max_gbps"]
        tx = [None if v is None else v / 1e9 for v in tr.tx_bps]
        rx = [None if v is None else v / 1e9 for v in tr.rx_bps]
        series = {
            "power_draw_w": tr.power_w,
            "draw_to_enforced_limit": [_ratio(p, st["power_limit_enforced_w"]) for p in tr.power_w],
            "draw_to_max_constraint": [_ratio(p, st["power_limit_max_w"]) for p in tr.power_w],
            "gpu_util_pct": tr.gfx_pct,
            "mem_util_pct": tr.umc_pct,
            "sm_clock_mhz": tr.gfx_mhz,
            "mem_clock_mhz": tr.mem_mhz,
            "sm_clock_ratio": [None if u is not None and u < BUSY_FOR_CLOCK_PCT else _ratio(c, st["max_sm_clock_mhz"])
                               for c, u in zip(tr.gfx_mhz, tr.gfx_pct)],
            "mem_clock_ratio": [_ratio(c, st["max_mem_clock_mhz"]) for c in tr.mem_mhz],
            "temperature_c": tr.temp_c,
            "pcie_tx_gbps": tx,
            "pcie_rx_gbps": rx,
            "pcie_tx_link_share": [_ratio(v, link) for v in tx],
            "pcie_rx_link_share": [_ratio(v, link) for v in rx],
        }  # fmt: skip
        for k, xs in series.items():
            pooled.setdefault(k, []).extend(xs)
        all_reasons.extend(tr.reasons)
        avg = _energy_avg_w(tr.energy)
        energy_avgs.append(avg)
        # amdsmi has no cumulative PCIe byte counter: the rate is the mean of its one-second readings over the window
        tx_rate, rx_rate = _mean(tr.tx_bps), _mean(tr.rx_bps)
        tx_rates.append(tx_rate)
        rx_rates.append(rx_rate)
        seen = sorted({n for s in tr.reasons if s for n in s}, key=REASONS.index)
        per_gpu.append({
            **st, "pcie_link_gen_current": gen_now, "pcie_link_width_current": width_now, "energy_avg_power_w": avg,
            "pcie_tx_bytes_per_s": tx_rate, "pcie_rx_bytes_per_s": rx_rate, "pcie_tx_bytes_window": None, "pcie_rx_bytes_window": None,
            **{k: stats(xs) for k, xs in series.items()}, "power_instant_w": None,
            "event_reasons": _fractions(tr.reasons),
            "event_reasons_seen": seen if any(s is not None for s in tr.reasons) else None,
        })  # fmt: skip
    has_reasons = any(s is not None for s in all_reasons)
    r = sampler.r
    values: dict[str, Any] = {
        "gpu_count": len(statics),
        "gpu_vendor": "amd",
        "sample_count": max((len(tr.t) for tr in sampler.tracks), default=0),
        "window_s": round(max((tr.t[-1] - tr.t[0] for tr in sampler.tracks if tr.t), default=0.0), 6),
        "interval_s": params.interval_s,
        "power_limit_enforced_w": min((s["power_limit_enforced_w"] for s in statics if s["power_limit_enforced_w"] is not None), default=None),
        "power_limit_max_w": max((s["power_limit_max_w"] for s in statics if s["power_limit_max_w"] is not None), default=None),
        "max_sm_clock_mhz": min((s["max_sm_clock_mhz"] for s in statics if s["max_sm_clock_mhz"] is not None), default=None),
        "max_sm_clock_source": "amdsmi_get_clock_info" if any(s["max_sm_clock_mhz"] for s in statics) else None,
        **{k: stats(xs) for k, xs in pooled.items()},
        "power_instant_w": None,
        "energy_avg_power_w": stats(energy_avgs),
        "pcie_tx_bytes_per_s": stats(tx_rates),
        "pcie_rx_bytes_per_s": stats(rx_rates),
        "pcie_tx_bytes_window": None,
        "pcie_rx_bytes_window": None,
        "pcie_counter_window_s": None,
        "event_reasons": _fractions(all_reasons),
        "throttled_fraction": _share(all_reasons, THROTTLE),
        "slowdown_fraction": _share(all_reasons, SLOWDOWN),
        "event_reasons_source": "violation_status" if has_reasons else None,
        "unsupported_calls": sorted(r.missing),
        "errors": dict(r.errors),
        "skipped_gpus": {str(k): v for k, v in skipped.items()},
        "gpus": per_gpu,
    }
    blocks: list[Any] = [Bars(title="Socket power vs power cap (mean over window)", unit="W",
                              bars=[(f"GPU {g['index']}", g["power_draw_w"]["mean"], g["power_limit_enforced_w"] or 0.0)
                                    for g in per_gpu if g["power_draw_w"] is not None])]  # fmt: skip
    t_origin = min((tr.t[0] for tr in sampler.tracks if tr.t), default=0.0)
    for st, tr in zip(statics, sampler.tracks):
        pts = [(round(t - t_origin, 3), p) for t, p in zip(tr.t, tr.power_w) if p is not None]
        if pts:
            blocks.append(Series(title=f"GPU {st['index']} power", unit="W", label=f"GPU {st['index']}", points=downsample(pts, 120)))
    p, ratio = values["power_draw_w"], values["draw_to_enforced_limit"]
    active = [n for n, f in (values["event_reasons"] or {}).items() if f > 0]
    summary = (
        f"{len(statics)} GPUs over {values['window_s']:.1f} s: "
        + (f"{p['mean']:.0f} W mean socket power" if p else "socket power not reported")
        + (f" ({ratio['mean'] * 100:.0f}% of the power cap)" if ratio else "")
        + (f", GFX activity {values['gpu_util_pct']['mean']:.0f}%" if values["gpu_util_pct"] else "")
        + (f", violations: {', '.join(active)}" if active else ", no violations" if values["event_reasons"] is not None else "")
    )
    return Evidence(summary=summary, values=values, blocks=blocks, started_at=started, finished_at=utcnow())
