"""The AMD Device Metrics Exporter's series, read per physical GPU: what `gpu.sample` and its siblings fill on an
AMD host of a fleet, beside dcgm-exporter's on an NVIDIA one (`prometheus/gpu.py`).

Facts (ROCm/device-metrics-exporter v1.5.1: `pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go` for the names, help
and labels, `docs/configuration/metricslist.md` for the platforms and partitions; shared/reference/amd.md §2):
- Every GPU series carries `gpu_id`, `card_model`, `serial_number`, `hostname`, `gpu_partition_id` and the
  partition types (mandatory labels). A partitioned GPU (CPX/DPX/QPX) is listed once per partition, each with
  its own `gpu_id` and the parent's `serial_number` and `card_model`.
- In those modes only partition 0 reports power and activity ("all other partitions report 0 (no per-XCD power
  sensor)"; "amdsmi does not return per-partition activity data"), and clocks, temperatures and the violation
  residencies are suppressed on the others. So a physical GPU's power is the sum over its partitions and its
  other readings are partition 0's: summing and taking the largest say the same here, and neither ever adds a
  reading twice.
- It exports no power cap or power limit at all (the cap exists only in the GPU config proto): a rule that
  compares the draw with the cap cannot be decided from these series; a host run reads it from amdsmi.
- `gpu_clock` carries `clock_type` (system = the compute clock, memory...) and `clock_index` (one system clock
  per XCC on MI300): the compute clock is their mean.
- The violation residencies `gpu_violation_*_residency_percentage` (MI3xx, bare metal) are the share of time the
  package power tracking limit (PPT, the power cap) or a thermal limit held the GPU, in %; their window mean is
  the share of the window (our reading of the gauges, as dcgm-exporter's violation counters are read).
- The names are the exporter's defaults: a deployment that sets `MetricsFieldPrefix` renames them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .client import HostKey, Sample, Window

EXPORTER = "the AMD Device Metrics Exporter"
PREFIX = "amd_"  # the answers' names: an AMD answer is never a dcgm-exporter one
NO_POWER_CAP = "power cap"  # what the exporter lacks for power-limit rules: no series at all (see missing_reason)
PER_GPU = ("gpu_id", "serial_number", "gpu_partition_id")  # the labels that tell one partition from another
MODEL_LABEL = "card_model"

# metric -> help, as the exporter declares them (gpuagent_gpu_metrics.go, v1.5.1)
METRICS: dict[str, str] = {
    "gpu_package_power": "Current socket power in Watts",  # MI3xx
    "gpu_power_usage": "GPU Power usage in Watts",  # MI2xx and MI3xx
    "gpu_average_package_power": "Average socket power in Watts",  # MI2xx
    "gpu_gfx_activity": "Graphics engine usage in Percentage (0-100)",
    "gpu_clock": "List of current GPU clock frequencies in MHz",
    "gpu_max_clock": "List of current GPU max clock frequencies in MHz",
    "gpu_junction_temperature": "Current junction/hotspot temperature in Celsius",  # MI3xx
    "gpu_edge_temperature": "Current edge temperature in Celsius",  # MI2xx
    "gpu_violation_ppt_residency_percentage": "package power tracking percentage violation counter",
    "gpu_violation_socket_thermal_residency_percentage": "socket thermal percentage violation counter",
    "gpu_violation_hbm_thermal_residency_percentage": "HBM thermal percentage violation counter",
    "gpu_violation_vr_thermal_residency_percentage": "voltage rail thermal percentage violation counter",
}
POWER = ("gpu_package_power", "gpu_power_usage", "gpu_average_package_power")  # the first a GPU has
TEMPERATURE = ("gpu_junction_temperature", "gpu_edge_temperature")
THERMAL = ("gpu_violation_socket_thermal_residency_percentage", "gpu_violation_hbm_thermal_residency_percentage",
           "gpu_violation_vr_thermal_residency_percentage")  # fmt: skip

# answer (as gpu.py names it) -> (metrics, the function over the window, a selector's extra matchers, how the
# partitions of one GPU combine). Several metrics: the first a GPU exports (`or`), but the thermal residencies,
# of which the largest holds the GPU.
QUERIES: dict[str, tuple[tuple[str, ...], str, str, str]] = {
    "power_mean": (POWER, "avg_over_time", "", "sum"),
    "power_min": (POWER, "min_over_time", "", "sum"),
    "power_max": (POWER, "max_over_time", "", "sum"),
    "power_p50": (POWER, "quantile:0.5", "", "sum"),
    "power_p95": (POWER, "quantile:0.95", "", "sum"),
    "power_samples": (POWER, "count_over_time", "", "max"),
    "util_mean": (("gpu_gfx_activity",), "avg_over_time", "", "max"),
    "sm_clock_mean": (("gpu_clock",), "avg_over_time", 'clock_type="system"', "max"),
    "mem_clock_mean": (("gpu_clock",), "avg_over_time", 'clock_type="memory"', "max"),
    "max_sm_clock": (("gpu_max_clock",), "max_over_time", 'clock_type="system"', "max"),
    "max_mem_clock": (("gpu_max_clock",), "max_over_time", 'clock_type="memory"', "max"),
    "temp_mean": (TEMPERATURE, "avg_over_time", "", "max"),
    "power_violation_pct": (("gpu_violation_ppt_residency_percentage",), "avg_over_time", "", "max"),
    "thermal_violation_pct": (THERMAL, "avg_over_time", "", "max"),
}
COMBINE = {name: how for name, (_, _, _, how) in QUERIES.items()}

# answer -> what names it when a GPU lacks it (the value a rule then cannot read)
ANSWER_METRIC: dict[str, str] = {
    "power_mean": "gpu_package_power", "util_mean": "gpu_gfx_activity", "sm_clock_mean": 'gpu_clock{clock_type="system"}',
    "mem_clock_mean": 'gpu_clock{clock_type="memory"}', "max_sm_clock": 'gpu_max_clock{clock_type="system"}',
    "temp_mean": "gpu_junction_temperature", "power_violation_pct": "gpu_violation_ppt_residency_percentage",
    "thermal_violation_pct": "gpu_violation_socket_thermal_residency_percentage",
}  # fmt: skip

# value path (as rules read it) -> what an AMD host lacks for it: the power limits are no series at all
VALUE_FIELDS: dict[str, str] = {
    "power.gpus[].power_limit_enforced_w": NO_POWER_CAP,
    "power.gpus[].power_limit_max_w": NO_POWER_CAP,
    "power.power_limit_enforced_w": NO_POWER_CAP,
    "power.power_limit_max_w": NO_POWER_CAP,
    "power.event_reasons.sw_power_cap": ANSWER_METRIC["power_violation_pct"],
    "power.throttled_fraction": ANSWER_METRIC["power_violation_pct"],
    "power.slowdown_fraction": ANSWER_METRIC["thermal_violation_pct"],
    "power.sm_clock_ratio": ANSWER_METRIC["max_sm_clock"],
}


def _sel(window: Window, metric: str, extra: str) -> str:
    matchers = ",".join(m for m in (extra, window.matchers) if m)
    return f"{metric}{{{matchers}}}" if matchers else metric


def queries(window: Window, key: HostKey) -> dict[str, str]:
    """Every AMD answer, one query each, one series per partition (the host's labels and PER_GPU); plus the model."""
    by = ", ".join(dict.fromkeys([*key.labels(), *PER_GPU]))
    out: dict[str, str] = {}
    for name, (metrics, fn, extra, _) in QUERIES.items():
        if name == "thermal_violation_pct":  # every thermal residency, each kept apart by a label, the largest taken
            each = [f'label_replace(avg_over_time({_sel(window, m, "")}[{window.range}]), "violation", "{m}", "", "")' for m in metrics]
            out[PREFIX + name] = f"max by ({by}) ({' or '.join(each)})"
            continue
        parts = []
        for metric in metrics:
            sel = f"{_sel(window, metric, extra)}[{window.range}]"
            inner = f"quantile_over_time({fn.split(':')[1]}, {sel})" if fn.startswith("quantile") else f"{fn}({sel})"
            # several clock_index per clock_type (one system clock per XCC): their mean is the GPU's clock
            parts.append(f"{'avg' if metric == 'gpu_clock' else 'max'} by ({by}) ({inner})")
        out[PREFIX + name] = " or ".join(parts)
    out[PREFIX + "model_name"] = " or ".join(
        f"max by ({by}, {MODEL_LABEL}) (last_over_time({_sel(window, m, '')}[{window.range}]))" for m in POWER)
    return out


@dataclass
class Partition:
    gpu_id: str
    serial: str
    partition: str
    values: dict[str, float] = field(default_factory=dict)
    model: str | None = None


@dataclass
class PhysicalGpu:
    """One physical GPU of an AMD host: its partitions' answers combined (power summed, the rest partition 0's)."""

    gpu: str  # its first partition's gpu_id
    values: dict[str, float]
    model: str | None
    partitions: int


class AmdPartitions:
    """The AMD answers, a partition at a time, as they come in; `gpus()` combines them per physical GPU."""

    def __init__(self, key: HostKey) -> None:
        self.key = key
        self.by_host: dict[str, dict[tuple[str, str, str], Partition]] = {}

    def add(self, name: str, samples: list[Sample]) -> None:
        answer = name.removeprefix(PREFIX)
        for s in samples:
            host = self.key.of(s.labels)
            gpu_id = s.labels.get("gpu_id")
            if host is None or gpu_id is None:
                continue
            ident = (gpu_id, s.labels.get("serial_number", ""), s.labels.get("gpu_partition_id", ""))
            parts = self.by_host.setdefault(host, {})
            p = parts.get(ident)
            if p is None:
                p = parts[ident] = Partition(*ident)
            if answer == "model_name":
                p.model = s.labels.get(MODEL_LABEL) or p.model
            else:
                p.values[answer] = s.value

    def gpus(self) -> dict[str, list[PhysicalGpu]]:
        """host -> its physical GPUs, in gpu_id order."""
        return {host: physical_gpus(list(parts.values())) for host, parts in self.by_host.items()}


def _num(text: str) -> tuple[int, str]:
    return (int(text), text) if text.isdigit() else (1 << 30, text)


def physical_gpus(partitions: list[Partition]) -> list[PhysicalGpu]:
    """Partitions grouped per physical GPU: by serial number where the exporter has one, else a run of partitions
    from a partition 0 (or an unpartitioned GPU, partition "NA") in gpu_id order; combined as COMBINE says."""
    groups: dict[Any, list[Partition]] = {}
    run = None
    for p in sorted(partitions, key=lambda p: _num(p.gpu_id)):
        if p.serial:
            k: Any = ("serial", p.serial)
        else:
            if run is None or p.partition in ("0", "NA", ""):
                run = ("run", p.gpu_id)
            k = run
        groups.setdefault(k, []).append(p)
    out = []
    for parts in groups.values():
        values: dict[str, float] = {}
        for name in {n for p in parts for n in p.values}:
            got = [p.values[name] for p in parts if name in p.values]
            values[name] = sum(got) if COMBINE.get(name) == "sum" else max(got)
        model = next((p.model for p in parts if p.model), None)
        out.append(PhysicalGpu(parts[0].gpu_id, values, model, len(parts)))
    return out


def violation_share(pct: float | None) -> float | None:
    """A residency percentage's window mean as a share of the window, clipped to 0..1."""
    return None if pct is None else round(min(1.0, max(0.0, pct / 100.0)), 6)


# why gpu.dcgm (the profiling ratios) has nothing for an AMD host
NOT_ON_AMD = (f"this host's GPUs are AMD's: {EXPORTER} has no such series (its gpu_prof_* profiler fields are off by "
              "default and not read here)")
EXPORTER_MAX_CLOCK = 'gpu_max_clock{clock_type="system"}'
NO_LIMITS = f"{EXPORTER} exports no power limits"


def notes(partitions: list[int]) -> list[str]:
    """How an AMD host's values were read: its exporter, no power cap, partitions summed per GPU."""
    out = [f"GPU values from {EXPORTER}; it exports no power cap, so the power-limit hypotheses need a host run"]
    if any(n > 1 for n in partitions):
        out.append(f"{max(partitions)} partitions per GPU (CPX/DPX...): power summed per physical GPU, the other readings "
                   "its partition 0's (the only one that reports them)")  # fmt: skip
    return out


def missing_reason(names: list[str]) -> str:
    """Why a hypothesis is undecided on an AMD host for want of `names` (NO_POWER_CAP or metrics)."""
    out = []
    if NO_POWER_CAP in names:
        out.append(f"{EXPORTER} exports no power cap (a host run reads it from amdsmi)")
    metrics = [n for n in names if n != NO_POWER_CAP]
    if metrics:
        out.append(f"{EXPORTER} does not export {', '.join(metrics)} for this host")
    return "; ".join(out)


__all__ = ["EXPORTER", "EXPORTER_MAX_CLOCK", "NOT_ON_AMD", "NO_LIMITS", "NO_POWER_CAP", "PREFIX", "VALUE_FIELDS",
           "AmdPartitions", "PhysicalGpu", "missing_reason", "notes", "physical_gpus", "queries", "violation_share"]  # fmt: skip
