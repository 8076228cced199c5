"""Fleet probes over GPU exporters' series: `gpu.sample`, `gpu.inventory`, `gpu.reference` and `gpu.dcgm`
values for every host at once, from PromQL. A host is NVIDIA or AMD by the series it has: dcgm-exporter's
DCGM_FI_* (here) or the AMD Device Metrics Exporter's (`amd.py`, read per physical GPU); `gpu.dcgm` is
dcgm-exporter's alone.

Facts (vllm-and-fleet.md §5): a stock dcgm-exporter (`default-counters.csv`) exports no power limits, no
max clocks and no violation counters; DCGM 4.6 renamed 268 fields (ids kept, old names aliased), so every
field is asked for under both names; the violation counters are cumulative ns per DCGM's own
`dcgm_fields.h` (older headers and exporters say µs, dcgm-exporter#589): `unit="auto"` reads ns, and
`unit="us"` is for older exporters.
Each per-GPU number comes back aggregated over the window by the engine, grouped by the host labels and
`gpu`, so an answer holds one number per GPU whatever the scrape interval.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..gpu_table import gpu_model
from ..gpu_values import (
    DcgmValues,
    InventoryValues,
    ReferenceValues,
    SampleValues,
    pcie_link_gbps,
    reference_for,
    stats,
)
from . import amd
from .client import FleetAnswer, FleetProbe, HostKey, Sample, Window


@dataclass(frozen=True)
class Field:
    name: str  # dcgm-exporter's (pre-4.6) name
    id: int
    kind: str  # gauge | counter, as the counters file says
    help: str
    aliases: tuple[str, ...] = ()  # DCGM 4.6 names of the same id

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


# Every DCGM field a runbook's metrics evidence reads, with its id (NVIDIA/DCGM dcgmlib/dcgm_fields.h) and
# the DCGM 4.6 name (vllm-and-fleet.md §5.2). `runbook fleet --dcgm-counters` prints them as a counters file.
FIELDS: dict[str, Field] = {f.name: f for f in (
    Field("DCGM_FI_DEV_SM_CLOCK", 100, "gauge", "SM clock frequency (in MHz)."),
    Field("DCGM_FI_DEV_MEM_CLOCK", 101, "gauge", "Memory clock frequency (in MHz)."),
    Field("DCGM_FI_DEV_MAX_SM_CLOCK", 113, "gauge", "Maximum supported SM clock (in MHz)."),
    Field("DCGM_FI_DEV_MAX_MEM_CLOCK", 114, "gauge", "Maximum supported memory clock (in MHz)."),
    Field("DCGM_FI_DEV_GPU_TEMP", 150, "gauge", "GPU temperature (in C)."),
    Field("DCGM_FI_DEV_POWER_USAGE", 155, "gauge", "Power draw (in W).", ("DCGM_FI_DEV_BOARD_POWER_WATTS",)),
    Field("DCGM_FI_DEV_POWER_MGMT_LIMIT", 160, "gauge", "Power management limit (in W).", ("DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS",)),
    Field("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", 162, "gauge", "Maximum power management limit (in W).", ("DCGM_FI_DEV_BOARD_POWER_LIMIT_MAX_WATTS",)),
    Field("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 164, "gauge", "Effective power limit the driver enforces (in W).", ("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",)),
    Field("DCGM_FI_DEV_GPU_UTIL", 203, "gauge", "GPU utilization (in %).", ("DCGM_FI_DEV_GPU_UTIL_RATIO",)),
    Field("DCGM_FI_DEV_POWER_VIOLATION", 240, "counter", "Throttling duration due to power constraints (in ns)."),
    Field("DCGM_FI_DEV_THERMAL_VIOLATION", 241, "counter", "Throttling duration due to thermal constraints (in ns)."),
    Field("DCGM_FI_PROF_SM_ACTIVE", 1002, "gauge", "The ratio of cycles an SM has at least 1 warp assigned.", ("DCGM_FI_PROF_SM_UTIL_RATIO",)),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1004, "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.", ("DCGM_FI_PROF_TENSOR_UTIL_RATIO",)),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", 1005, "gauge", "Ratio of cycles the device memory interface is active sending or receiving data."),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", 1009, "gauge", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second."),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", 1010, "gauge", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second."),
)}  # fmt: skip

# Fields the stock default-counters.csv does not enable (vllm-and-fleet.md §5.1): what --dcgm-counters adds.
NOT_IN_STOCK = {"DCGM_FI_DEV_MAX_SM_CLOCK", "DCGM_FI_DEV_MAX_MEM_CLOCK", "DCGM_FI_DEV_POWER_MGMT_LIMIT",
                "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_VIOLATION",
                "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_PROF_SM_ACTIVE"}  # fmt: skip

# value path (as rules read it) -> the dcgm-exporter field it comes from: how a missing value is named.
VALUE_FIELDS: dict[str, str] = {
    "power.gpus[].power_limit_enforced_w": "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "power.gpus[].power_limit_max_w": "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX",
    "power.power_limit_enforced_w": "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "power.power_limit_max_w": "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX",
    "power.event_reasons.sw_power_cap": "DCGM_FI_DEV_POWER_VIOLATION",
    "power.slowdown_fraction": "DCGM_FI_DEV_THERMAL_VIOLATION",
    "power.throttled_fraction": "DCGM_FI_DEV_POWER_VIOLATION",
    "power.sm_clock_ratio": "DCGM_FI_DEV_MAX_SM_CLOCK",
    "inv.gpus[].max_mem_clock_mhz": "DCGM_FI_DEV_MAX_MEM_CLOCK",
    "power.pcie_tx_bytes_per_s": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "power.pcie_rx_bytes_per_s": "DCGM_FI_PROF_PCIE_RX_BYTES",
    "dcgm.prof_dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "dcgm.prof_pipe_tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
}


def counters_csv() -> str:
    """A dcgm-exporter counters file (`-f`) with every field the fleet probes read."""
    lines = ["# dcgm-exporter counters for `runbook fleet` (format: DCGM FIELD, Prometheus metric type, help message).",
             "# Pass it with `dcgm-exporter -f FILE` (or DCGM_EXPORTER_COLLECTORS). Fields marked + are not in the stock",
             "# default-counters.csv. The violation counters are cumulative ns (DCGM's dcgm_fields.h; older docs say us)."]  # fmt: skip
    for f in FIELDS.values():
        mark = " (+ not in the stock default-counters.csv)" if f.name in NOT_IN_STOCK else ""
        lines.append(f"# field {f.id}{mark}")
        lines.append(f"{f.name}, {f.kind}, {f.help}")
    return "\n".join(lines) + "\n"


def _q(window: Window, field: str, fn: str, by: str) -> str:
    """`agg by (host labels, gpu) (fn(FIELD[w]))` under each of the field's names, `or`-ed: one series per GPU."""
    parts = []
    for name in FIELDS[field].names:
        inner = f"{fn}({window.sel(name)}[{window.range}])" if not fn.startswith("quantile") else f"quantile_over_time({fn.split(':')[1]}, {window.sel(name)}[{window.range}])"
        parts.append(f"max by ({by}) ({inner})")
    return " or ".join(parts)


GPU_QUERIES: dict[str, tuple[str, str]] = {  # answer name -> (field, function over the window)
    "power_mean": ("DCGM_FI_DEV_POWER_USAGE", "avg_over_time"),
    "power_min": ("DCGM_FI_DEV_POWER_USAGE", "min_over_time"),
    "power_max": ("DCGM_FI_DEV_POWER_USAGE", "max_over_time"),
    "power_p50": ("DCGM_FI_DEV_POWER_USAGE", "quantile:0.5"),
    "power_p95": ("DCGM_FI_DEV_POWER_USAGE", "quantile:0.95"),
    "power_samples": ("DCGM_FI_DEV_POWER_USAGE", "count_over_time"),
    "util_mean": ("DCGM_FI_DEV_GPU_UTIL", "avg_over_time"),
    "sm_clock_mean": ("DCGM_FI_DEV_SM_CLOCK", "avg_over_time"),
    "mem_clock_mean": ("DCGM_FI_DEV_MEM_CLOCK", "avg_over_time"),
    "max_sm_clock": ("DCGM_FI_DEV_MAX_SM_CLOCK", "max_over_time"),
    "max_mem_clock": ("DCGM_FI_DEV_MAX_MEM_CLOCK", "max_over_time"),
    "temp_mean": ("DCGM_FI_DEV_GPU_TEMP", "avg_over_time"),
    "limit_enforced": ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "last_over_time"),
    "limit_requested": ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "last_over_time"),
    "limit_max": ("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "last_over_time"),
    "power_violation": ("DCGM_FI_DEV_POWER_VIOLATION", "increase"),
    "thermal_violation": ("DCGM_FI_DEV_THERMAL_VIOLATION", "increase"),
    "pcie_tx": ("DCGM_FI_PROF_PCIE_TX_BYTES", "avg_over_time"),
    "pcie_rx": ("DCGM_FI_PROF_PCIE_RX_BYTES", "avg_over_time"),
    "prof_dram": ("DCGM_FI_PROF_DRAM_ACTIVE", "avg_over_time"),
    "prof_dram_changes": ("DCGM_FI_PROF_DRAM_ACTIVE", "changes"),
    "prof_tensor": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "avg_over_time"),
    "prof_sm_active": ("DCGM_FI_PROF_SM_ACTIVE", "avg_over_time"),
}
ANSWER_FIELD = {name: field for name, (field, _) in GPU_QUERIES.items()}


def max_sm_clock(exported: float | None, model_name: str | None, series: str | None = None) -> tuple[float | None, str | None]:
    """The SM clock's maximum and where it came from: the exporter's series (`series`; DCGM_FI_DEV_MAX_SM_CLOCK by
    default: not in the stock counters, and not sent by every exporter), else the GPU table's published figure."""
    if exported:
        return float(exported), series or "DCGM_FI_DEV_MAX_SM_CLOCK"
    row = gpu_model(model_name)
    figure = row.max_sm_clock_mhz if row is not None else None
    if figure is None or not figure.value:
        return None, None
    return float(figure.value), f"the GPU table ({row.id}: {figure.source})"


def gpu_queries(window: Window, key: HostKey) -> dict[str, str]:
    """Every GPU answer the family needs, one query each; plus the GPU model per GPU (a label)."""
    by = ", ".join([*key.labels(), "gpu"])
    out = {name: _q(window, field, fn, by) for name, (field, fn) in GPU_QUERIES.items()}
    names = " or ".join(f"max by ({by}, modelName) (last_over_time({window.sel(n)}[{window.range}]))"
                        for n in FIELDS["DCGM_FI_DEV_POWER_USAGE"].names)  # fmt: skip
    out["model_name"] = names
    out.update(amd.queries(window, key))  # the AMD exporter's, beside them: a host answers one side or the other
    return out


def lacking_first_label(window: Window, key: HostKey) -> str | None:
    """A query for the GPU series that lack `key`'s first way (its label, in any of its spellings), or None where
    that way joins labels (namespace/pod). No series in the answer: every GPU series names its host by that way,
    so the GPU queries may group by it alone (`narrowed`), and the answers carry one host label, not three: on
    10,000 hosts that was a sixth of the store's work and of reading its answers."""
    first = key.ways[0]
    if "/" in first:
        return None
    names = sorted({n for f in FIELDS.values() for n in f.names} | {m for metrics, *_ in amd.QUERIES.values() for m in metrics})
    alt = "|".join(re.escape(n) for n in names)
    variants = ",".join(f'{v}=""' for v in HostKey((first,)).labels())
    sel = "{" + ",".join(x for x in (f'__name__=~"{alt}"', window.matchers, variants) if x) + "}"
    return f"count(last_over_time({sel}[{window.range}]))"


def narrowed(key: HostKey) -> HostKey:
    """`key` as the GPU queries group by it where every GPU series has its first way (`lacking_first_label`)."""
    return HostKey(key.ways[:1])


def value_fields() -> list[tuple[str, str]]:
    """(value path, what a host lacks for it) for both exporters: a DCGM field, or the AMD exporter's metric or
    `amd.NO_POWER_CAP`. How `runbook fleet` names why a hypothesis is undecided."""
    return [*VALUE_FIELDS.items(), *amd.VALUE_FIELDS.items()]


def missing_reason(names: list[str]) -> str:
    """Why a hypothesis is undecided for want of `names`, in the words of the exporter each belongs to."""
    dcgm = [n for n in names if n in FIELDS]
    other = [n for n in names if n not in FIELDS]
    out = []
    if dcgm:
        out.append(f"dcgm-exporter does not export {', '.join(dcgm)}: add {'them' if len(dcgm) > 1 else 'it'} to its "
                   "counters file (runbook fleet --dcgm-counters prints one)")  # fmt: skip
    if other:
        out.append(amd.missing_reason(other))
    return "; ".join(out)


@dataclass
class GpuRow:
    host: str
    gpu: str
    values: dict[str, float]
    model_name: str | None = None
    vendor: str = "nvidia"  # nvidia (dcgm-exporter's series) | amd (the AMD Device Metrics Exporter's)
    partitions: int = 1  # AMD: the partitions (CPX, DPX...) the exporter listed this physical GPU as


def per_gpu(answers: dict[str, list[Sample]], key: HostKey) -> dict[str, dict[str, GpuRow]]:
    """host -> gpu -> the answers for that GPU."""
    rows = GpuRows(key)
    for name, samples in answers.items():
        rows.add(name, samples)
    return rows.rows


class GpuRows:
    """`per_gpu`, an answer at a time (as they come in: `PromClient.query_all`'s `on_answer`). AMD answers are
    kept per partition and join `rows` per physical GPU; a host with dcgm-exporter's series is an NVIDIA host."""

    def __init__(self, key: HostKey) -> None:
        self.key = key
        self.nvidia: dict[str, dict[str, GpuRow]] = {}
        self.amd = amd.AmdPartitions(key)
        self._rows: dict[str, dict[str, GpuRow]] | None = None  # `rows`, until the next answer

    @property
    def rows(self) -> dict[str, dict[str, GpuRow]]:
        """host -> gpu -> its answers: the NVIDIA hosts', then each AMD host's physical GPUs (a host with both
        exporters' series is read as NVIDIA)."""
        if self._rows is None:
            out = self.nvidia if not self.amd.by_host else dict(self.nvidia)
            for host, gpus in self.amd.gpus().items():
                if host not in out:
                    out[host] = {g.gpu: GpuRow(host, g.gpu, g.values, g.model, "amd", g.partitions) for g in gpus}
            self._rows = out
        return self._rows

    def add(self, name: str, samples: list[Sample]) -> None:
        self._rows = None
        if name.startswith(amd.PREFIX):
            self.amd.add(name, samples)
            return
        out, key = self.nvidia, self.key
        for s in samples:
            host = key.of(s.labels)
            gpu = s.labels.get("gpu")
            if host is None or gpu is None:
                continue
            gpus = out.get(host)
            if gpus is None:
                gpus = out[host] = {}
            row = gpus.get(gpu)
            if row is None:
                row = gpus[gpu] = GpuRow(host, gpu, {})
            if name == "model_name":
                row.model_name = s.labels.get("modelName") or s.labels.get("modelname") or row.model_name
            else:
                row.values[name] = s.value


def _gpu_sort(g: str) -> tuple[int, str]:
    return (int(g), g) if g.isdigit() else (1 << 30, g)


def violation_fraction(increase: float | None, window_s: float, unit: str) -> tuple[float | None, str]:
    """Share of the window a violation counter says the GPU was held: ns per DCGM's header, µs for old exporters.

    `auto` reads ns (DCGM's dcgm_fields.h; dcgm-exporter#589 moved the exporters from µs): magnitudes alone
    cannot tell a µs counter from a ns one that throttled 1000x less, so an exporter older than that change
    needs `us` said (`--violation-unit us`). The share is clipped to 0..1."""
    if increase is None or window_s <= 0:
        return None, unit
    per_s = {"ns": 1e9, "us": 1e6}
    chosen = "ns" if unit == "auto" else unit
    return round(min(1.0, max(0.0, increase / (window_s * per_s[chosen]))), 6), chosen


class GpuSampleFleet(FleetProbe):
    """`gpu.sample`'s values from dcgm-exporter series: draw against the limits, util, clocks, throttle time."""

    name = "prom.gpu.sample"
    serves = "gpu.sample"
    Values = SampleValues

    def __init__(self, violation_unit: str = "auto") -> None:
        self.violation_unit = violation_unit

    def fill(self, rows: dict[str, dict[str, GpuRow]], window: Window) -> FleetAnswer:
        ans = FleetAnswer()
        for host, gpus in rows.items():
            missing: set[str] = set()
            per: list[dict[str, Any]] = []
            unit_used = None
            power_frac: list[float] = []
            thermal_frac: list[float] = []
            is_amd = any(g.vendor == "amd" for g in gpus.values())
            for gid in sorted(gpus, key=_gpu_sort):
                v = gpus[gid].values
                if is_amd:  # no power cap series at all, and the metrics it lacks by their own names
                    missing.add(amd.NO_POWER_CAP)
                    missing.update(f for a, f in amd.ANSWER_METRIC.items() if a not in v)
                else:
                    missing.update(f for a, f in ANSWER_FIELD.items() if a not in v)
                mean, p95 = v.get("power_mean"), v.get("power_p95")
                enforced, board = v.get("limit_enforced"), v.get("limit_max")
                if is_amd:
                    pf, tf = amd.violation_share(v.get("power_violation_pct")), amd.violation_share(v.get("thermal_violation_pct"))
                else:
                    pf, unit_used = violation_fraction(v.get("power_violation"), window.seconds, self.violation_unit)
                    tf, _ = violation_fraction(v.get("thermal_violation"), window.seconds, self.violation_unit)
                if pf is not None:
                    power_frac.append(pf)
                if tf is not None:
                    thermal_frac.append(tf)
                top, top_source = max_sm_clock(v.get("max_sm_clock"), gpus[gid].model_name, amd.EXPORTER_MAX_CLOCK if is_amd else None)
                ratio = (v["sm_clock_mean"] / top) if v.get("sm_clock_mean") is not None and top else None
                power = None if mean is None else {
                    "mean": round(mean, 3), "min": round(v.get("power_min", mean), 3), "max": round(v.get("power_max", mean), 3),
                    "p50": round(v.get("power_p50", mean), 3), "p95": round(p95 if p95 is not None else mean, 3)}  # fmt: skip
                per.append({
                    "index": int(gid) if gid.isdigit() else len(per),
                    "name": gpus[gid].model_name,
                    "uuid": None,
                    "power_limit_enforced_w": enforced,
                    "power_limit_max_w": board,
                    "max_sm_clock_mhz": int(top) if top else None,
                    "max_sm_clock_source": top_source,
                    "power_draw_w": power,
                    "draw_to_enforced_limit": _one(mean / enforced) if mean is not None and enforced else None,
                    "draw_to_max_constraint": _one(mean / board) if mean is not None and board else None,
                    "gpu_util_pct": _one(v.get("util_mean")),
                    "sm_clock_mhz": _one(v.get("sm_clock_mean")),
                    "mem_clock_mhz": _one(v.get("mem_clock_mean")),
                    "sm_clock_ratio": _one(ratio),
                    "temperature_c": _one(v.get("temp_mean")),
                    "pcie_tx_bytes_per_s": v.get("pcie_tx"),
                    "pcie_rx_bytes_per_s": v.get("pcie_rx"),
                    "event_reasons": None,
                })
            samples = [gpus[g].values.get("power_samples") for g in gpus]
            count = int(max((s for s in samples if s is not None), default=0))

            def pooled(k: str, sub: str = "mean") -> dict[str, float] | None:
                return stats([(g[k] or {}).get(sub) if g[k] else None for g in per])

            powers = [g["power_draw_w"] for g in per if g["power_draw_w"]]
            draw = None
            if powers:
                means = stats([p["mean"] for p in powers])
                assert means is not None
                draw = dict(means, min=min(p["min"] for p in powers), max=max(p["max"] for p in powers),
                            p95=stats([p["p95"] for p in powers])["p95"])  # type: ignore[index]  # fmt: skip
            enforced_all = [g["power_limit_enforced_w"] for g in per if g["power_limit_enforced_w"] is not None]
            board_all = [g["power_limit_max_w"] for g in per if g["power_limit_max_w"] is not None]
            sw_cap = max(power_frac) if power_frac and len(power_frac) == len(per) else None
            thermal = max(thermal_frac) if thermal_frac and len(thermal_frac) == len(per) else None
            reasons = None
            if sw_cap is not None or thermal is not None:
                reasons = {k: None for k in ("gpu_idle", "applications_clocks_setting", "hw_slowdown", "sync_boost",
                                             "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting")}  # fmt: skip
                reasons.update(sw_power_cap=sw_cap, sw_thermal_slowdown=thermal)
            values: dict[str, Any] = {
                "gpu_count": len(per),
                "sample_count": count,
                "window_s": window.seconds,
                "interval_s": round(window.seconds / count, 3) if count else window.seconds,
                "power_limit_enforced_w": min(enforced_all) if len(enforced_all) == len(per) and per else None,
                "power_limit_max_w": max(board_all) if len(board_all) == len(per) and per else None,
                "max_sm_clock_mhz": min((g["max_sm_clock_mhz"] for g in per if g["max_sm_clock_mhz"]), default=None),
                "max_sm_clock_source": "; ".join(dict.fromkeys(g["max_sm_clock_source"] for g in per if g["max_sm_clock_source"])) or None,
                "power_draw_w": draw,
                "draw_to_enforced_limit": pooled("draw_to_enforced_limit"),
                "draw_to_max_constraint": pooled("draw_to_max_constraint"),
                "gpu_util_pct": pooled("gpu_util_pct"),
                "sm_clock_mhz": pooled("sm_clock_mhz"),
                "mem_clock_mhz": pooled("mem_clock_mhz"),
                "sm_clock_ratio": pooled("sm_clock_ratio"),
                "temperature_c": pooled("temperature_c"),
                "pcie_tx_bytes_per_s": stats([g["pcie_tx_bytes_per_s"] for g in per]),
                "pcie_rx_bytes_per_s": stats([g["pcie_rx_bytes_per_s"] for g in per]),
                "pcie_counter_window_s": window.seconds if any(g["pcie_tx_bytes_per_s"] is not None for g in per) else None,
                "event_reasons": reasons,
                "throttled_fraction": None if sw_cap is None or thermal is None else round(min(1.0, sw_cap + thermal), 6),
                "slowdown_fraction": thermal,
                "event_reasons_source": None,
                "unsupported_calls": [],
                "errors": {},
                "skipped_gpus": {},
                "gpus": per,
            }
            ans.values[host] = values
            ans.missing[host] = sorted(missing)
            if unit_used and (power_frac or thermal_frac):
                ans.notes.setdefault(host, []).append(
                    f"violation counters read as {unit_used} ({'DCGM header' if unit_used == 'ns' else 'older exporter'})")
            if is_amd:
                ans.notes.setdefault(host, []).extend(amd.notes([g.partitions for g in gpus.values()]))
        return ans


def _one(x: float | None) -> dict[str, float] | None:
    """A GPU's window mean as a Stats (min = max = p50 = p95 = the mean): the engine returned one number."""
    if x is None:
        return None
    x = round(float(x), 6)
    return {"mean": x, "min": x, "max": x, "p50": x, "p95": x}


class GpuInventoryFleet(FleetProbe):
    """`gpu.inventory`'s values the exporter knows: GPUs, their model, limits and max clocks."""

    name = "prom.gpu.inventory"
    serves = "gpu.inventory"
    Values = InventoryValues

    def fill(self, rows: dict[str, dict[str, GpuRow]], window: Window) -> FleetAnswer:
        ans = FleetAnswer()
        for host, gpus in rows.items():
            per = []
            for gid in sorted(gpus, key=_gpu_sort):
                v = gpus[gid].values
                per.append({
                    "index": int(gid) if gid.isdigit() else len(per), "name": gpus[gid].model_name,
                    "power_limit_enforced_w": v.get("limit_enforced"), "power_limit_requested_w": v.get("limit_requested"),
                    "power_limit_max_w": v.get("limit_max"),
                    "max_sm_clock_mhz": int(v["max_sm_clock"]) if v.get("max_sm_clock") else None,
                    "max_mem_clock_mhz": int(v["max_mem_clock"]) if v.get("max_mem_clock") else None,
                })  # fmt: skip
            names = list(dict.fromkeys(g["name"] for g in per if g["name"]))

            def low(k: str) -> Any:
                xs = [g[k] for g in per if g[k] is not None]
                return min(xs) if xs and len(xs) == len(per) else None

            ans.values[host] = {
                "gpu_count": len(per), "gpu_name": per[0]["name"] if per else None, "gpu_names": names,
                "homogeneous": len(names) <= 1, "power_limit_enforced_w": low("power_limit_enforced_w"),
                "power_limit_requested_w": low("power_limit_requested_w"),
                "power_limit_max_w": max((g["power_limit_max_w"] for g in per if g["power_limit_max_w"] is not None), default=None),
                "max_sm_clock_mhz": low("max_sm_clock_mhz"), "gpus": per,
            }  # fmt: skip
        return ans


class GpuReferenceFleet(FleetProbe):
    """`gpu.reference` from the exporter's `modelName` label: the same table row a host run reads."""

    name = "prom.gpu.reference"
    serves = "gpu.reference"
    Values = ReferenceValues

    def fill(self, rows: dict[str, dict[str, GpuRow]], window: Window) -> FleetAnswer:
        ans = FleetAnswer()
        for host, gpus in rows.items():
            first = gpus[sorted(gpus, key=_gpu_sort)[0]] if gpus else None
            name = first.model_name if first else None
            if name is None:
                continue
            boards = [g.values["limit_max"] for g in gpus.values() if g.values.get("limit_max") is not None]
            board = max(boards) if boards else None
            if board is None:  # a stock exporter has no limits: the board maximum from the GPU table, with its source
                row = gpu_model(name)
                board = row.max_w.value if row is not None and row.max_w is not None else None
                if board is not None:
                    lacks = amd.NO_LIMITS if first.vendor == "amd" else "the exporter has no DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX"
                    ans.notes.setdefault(host, []).append(f"board maximum {board:g} W from probes/data/gpus.yaml ({lacks})")
            ref = reference_for(name, board)
            draw = ref["memory_bound_draw_w"]
            ans.values[host] = {"gpu_name": name, "board_max_w": board, **ref,
                                "memory_bound_share": round(draw / board, 4) if draw and board else None}  # fmt: skip
        return ans


class DcgmFleet(FleetProbe):
    """`gpu.dcgm`'s window aggregates: PROF activity and power per host."""

    name = "prom.gpu.dcgm"
    serves = "gpu.dcgm"
    Values = DcgmValues

    def fill(self, rows: dict[str, dict[str, GpuRow]], window: Window) -> FleetAnswer:
        ans = FleetAnswer()
        for host, gpus in rows.items():
            if any(g.vendor != "nvidia" for g in gpus.values()):
                continue  # dcgm-exporter's PROF fields: an AMD host has none
            vs = [gpus[g].values for g in sorted(gpus, key=_gpu_sort)]
            changes = [v["prof_dram_changes"] for v in vs if "prof_dram_changes" in v]
            ans.values[host] = {
                "url": "prometheus", "gpu_count": len(vs), "metrics": [],
                "prof_available": any("prof_dram" in v or "prof_tensor" in v for v in vs),
                "power_limit_enforced_w": min((v["limit_enforced"] for v in vs if "limit_enforced" in v), default=None),
                "power_usage_w": stats([v.get("power_mean") for v in vs]),
                "draw_to_enforced_limit": stats([v["power_mean"] / v["limit_enforced"] for v in vs if v.get("power_mean") is not None and v.get("limit_enforced")]),
                "gpu_util_pct": stats([v.get("util_mean") for v in vs]),
                "sm_clock_mhz": stats([v.get("sm_clock_mean") for v in vs]),
                "mem_clock_mhz": stats([v.get("mem_clock_mean") for v in vs]),
                "prof_gr_engine_active": None,
                "prof_sm_active": stats([v.get("prof_sm_active") for v in vs]),
                "prof_sm_occupancy": None,
                "prof_pipe_tensor_active": stats([v.get("prof_tensor") for v in vs]),
                "prof_dram_active": stats([v.get("prof_dram") for v in vs]),
                "scrapes": int(max((v.get("power_samples", 0) for v in vs), default=0)),
                # distinct readings: changes() + 1 of the DRAM activity, the fewest over GPUs
                "readings_distinct": int(min(changes) + 1) if changes else 0,
                "gpus": [],
            }  # fmt: skip
        return ans


GPU_FAMILY = (GpuSampleFleet, GpuInventoryFleet, GpuReferenceFleet, DcgmFleet)

__all__ = ["FIELDS", "GPU_FAMILY", "NOT_IN_STOCK", "VALUE_FIELDS", "GpuRows", "counters_csv", "gpu_queries",
           "missing_reason", "pcie_link_gbps", "per_gpu", "value_fields", "violation_fraction"]  # fmt: skip
