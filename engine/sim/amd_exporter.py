"""The AMD Device Metrics Exporter for a simulated host: its metric names, labels and partition behaviour.

Follows ROCm/device-metrics-exporter v1.5.1 (shared/reference/amd.md §2): metric names and help from
`pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go`, the mandatory labels (`gpu_id`, `card_model`, `serial_number`,
`hostname`, `gpu_partition_id`, `gpu_compute_partition_type`, `gpu_memory_partition_type`; the job and pod
labels are empty on a host without a scheduler, and an empty label is no label to Prometheus), `gpu_clock`'s
`clock_type`/`clock_index`, and `docs/configuration/metricslist.md` for partitions: in CPX/DPX/QPX each
physical GPU is listed once per partition (its own `gpu_id`, the parent's serial number and model); only
partition 0 reports power and activity, the others report 0, and clocks, temperatures and violation
residencies are suppressed on them. There is no power cap series: the exporter has none.

The readings are the simulated host's GPUs' (the same coupling as the host's fake GPU library): power, the
compute and memory clocks, temperature, activity; the violation residencies are the share of each collection
interval the coupling held the GPU at its power cap (PPT) or a thermal limit, in %.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .dcgm_exporter import SimDcgmExporter

# (name, help) as the exporter declares them (gpuagent_gpu_metrics.go, v1.5.1); all gauges
METRICS = (
    ("gpu_package_power", "Current socket power in Watts"),
    ("gpu_power_usage", "GPU Power usage in Watts"),
    ("gpu_gfx_activity", "Graphics engine usage in Percentage (0-100)"),
    ("gpu_umc_activity", "Memory engine usage in Percentage (0-100)"),
    ("gpu_junction_temperature", "Current junction/hotspot temperature in Celsius"),
    ("gpu_clock", "List of current GPU clock frequencies in MHz"),
    ("gpu_max_clock", "List of current GPU max clock frequencies in MHz"),
    ("gpu_violation_ppt_residency_percentage", "package power tracking percentage violation counter"),
    ("gpu_violation_socket_thermal_residency_percentage", "socket thermal percentage violation counter"),
)
# partitions per physical GPU by compute partition mode (MI300X: SPX 1 x 8 XCDs ... CPX 8 x 1 XCD; amd.md §1.4)
PARTITIONS = {"spx": 1, "dpx": 2, "qpx": 4, "cpx": 8}
XCCS = 8  # MI300X: one system (gfx) clock per XCC
ONLY_PARTITION_0 = {"gpu_junction_temperature", "gpu_clock", "gpu_max_clock", "gpu_violation_ppt_residency_percentage",
                    "gpu_violation_socket_thermal_residency_percentage"}  # suppressed on the other partitions  # fmt: skip
REPORT_0 = {"gpu_package_power", "gpu_power_usage", "gpu_gfx_activity", "gpu_umc_activity"}  # the others report 0


def card_model(name: str) -> str:
    """The exporter's card_model for a GPU: its model without the brand, as the exporter's own tests write it ("MI300X")."""
    return name.removeprefix("AMD Instinct ").strip() or name


def render(gpus: list[dict[str, Any]], hostname: str, mode: str = "spx", memory: str = "nps1") -> str:
    """Prometheus text as the exporter writes it. `gpus`: one dict per physical GPU (name, serial, readings); `mode`
    and `memory`: the compute and memory partition modes (lower case, as the exporter writes them)."""
    parts = PARTITIONS[mode]
    series: dict[str, list[str]] = {name: [] for name, _ in METRICS}
    for i, g in enumerate(gpus):
        for p in range(parts):
            labels = {"card_model": card_model(g["name"]), "gpu_compute_partition_type": mode, "gpu_id": str(i * parts + p),
                      "gpu_memory_partition_type": memory, "gpu_partition_id": str(p), "hostname": hostname,
                      "serial_number": g["serial"]}  # fmt: skip
            base = ",".join(f'{k}="{v}"' for k, v in labels.items())
            for name, _ in METRICS:
                if p > 0 and name in ONLY_PARTITION_0:
                    continue
                if name == "gpu_clock":
                    clocks = [(str(x), "system", g["gfx_clock_mhz"]) for x in range(XCCS)] + [(str(XCCS), "memory", g["mem_clock_mhz"])]
                elif name == "gpu_max_clock":
                    clocks = [(str(x), "system", g["max_gfx_clock_mhz"]) for x in range(XCCS)] + [(str(XCCS), "memory", g["max_mem_clock_mhz"])]
                else:
                    value = 0 if p > 0 and name in REPORT_0 else g[name]
                    series[name].append(f"{name}{{{base}}} {value}\n")
                    continue
                for index, kind, mhz in clocks:
                    series[name].append(f'{name}{{{base},clock_index="{index}",clock_type="{kind}"}} {mhz}\n')
    out = []
    for name, help_ in METRICS:
        out.append(f"# HELP {name} {help_}\n# TYPE {name} gauge\n")
        out.extend(series[name])
    return "".join(out)


class SimAmdExporter(SimDcgmExporter):
    """Serves `/metrics` on 127.0.0.1 (ephemeral port) as the AMD exporter does; `collect()` gives the physical
    GPUs' readings at most every `interval_s`."""

    def __init__(self, collect: Callable[[], list[dict[str, Any]]], interval_s: float, hostname: str, mode: str = "spx",
                 memory: str = "nps1") -> None:
        if mode not in PARTITIONS:
            raise ValueError(f"compute partition {mode!r}: one of {', '.join(PARTITIONS)}")
        self.hostname, self.mode, self.memory = hostname, mode, memory
        super().__init__(collect, interval_s)

    def text(self) -> str:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.interval_s:
                self._text, self._at = render(self.collect(), self.hostname, self.mode, self.memory), now
            return self._text


__all__ = ["METRICS", "PARTITIONS", "SimAmdExporter", "card_model", "render"]
