"""The GPU concepts every GPU source fills: the values of `gpu.inventory`, `gpu.sample`, `gpu.reference` and
`gpu.dcgm` (NVML and dcgm-exporter on a host, probes/gpu/; Prometheus for a fleet, probes/prometheus/), the
statistics they share, and the yardstick a GPU model is judged against (`reference_for`). A GPU source imports
these; no source imports another."""

from __future__ import annotations

import math
from typing import Any, Literal

from gpu_runbook import calibration
from gpu_runbook.plugin import Values, value
from pydantic import ConfigDict, Field

from .gpu_table import gpu_model, gpu_table


class Stats(Values):
    """What `stats()` returns: the distribution of one quantity's samples (in the unit of the field that holds it)."""

    mean: float = value("mean of the samples", default=...)
    min: float = value("smallest sample", default=...)
    max: float = value("largest sample", default=...)
    p50: float = value("median (linear interpolation between closest ranks)", default=...)
    p95: float = value("95th percentile (linear interpolation between closest ranks)", default=...)


def _percentile(sorted_xs: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = (len(sorted_xs) - 1) * pct / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def stats(xs: list[float | None]) -> dict[str, float] | None:
    vals = sorted(float(x) for x in xs if x is not None)
    if not vals:
        return None
    out = {
        "mean": sum(vals) / len(vals),
        "min": vals[0],
        "max": vals[-1],
        "p50": _percentile(vals, 50),
        "p95": _percentile(vals, 95),
    }
    return {k: round(v, 6) for k, v in out.items()}


def pcie_lane_gbps(gen: int) -> float | None:
    """Usable GB/s per lane per direction: GT/s x encoding efficiency / 8 (Gen5 x16 = 63.0 GB/s)."""
    table = {1: 2.5 * 0.8 / 8, 2: 5.0 * 0.8 / 8, 3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8,
             5: 32 * 128 / 130 / 8, 6: 64 * 242 / 256 / 8}
    return table.get(gen)


def pcie_link_gbps(gen: int | None, width: int | None) -> float | None:
    if gen is None or width is None:
        return None
    lane = pcie_lane_gbps(gen)
    return None if lane is None else round(lane * width, 3)


Architecture = Literal["kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell",
                       "rubin", "unknown"]  # fmt: skip


VirtualizationMode = Literal["none", "passthrough", "vgpu", "host_vgpu", "host_vsga", "unknown"]


GpuVendor = Literal["nvidia", "amd"]


class GpuProcess(Values):
    """A process holding a GPU (amdsmi_get_gpu_process_list); names need root for other users' processes."""

    pid: int = value("process id", default=...)
    name: str | None = value("process name (None: not visible to this user)")
    memory_bytes: int | None = value("device memory it holds", unit="bytes")


class InventoryGpu(Values):
    """One GPU's facts, as NVML or amdsmi reports them (None where it does not). On AMD one entry per device amdsmi
    lists: in a partition mode (CPX...) each compute partition is a device."""

    index: int = value("NVML index (as nvidia-smi numbers the GPUs)", default=...)
    name: str | None = value("nvmlDeviceGetName, e.g. 'NVIDIA H200'")
    uuid: str | None = value("nvmlDeviceGetUUID")
    pci_bus_id: str | None = value("PCI bus id, e.g. '00000000:18:00.0'")
    compute_capability: str | None = value("CUDA compute capability, e.g. '9.0'")
    compute_capability_major: int | None = value("major part of the compute capability")
    compute_capability_minor: int | None = value("minor part of the compute capability")
    architecture: Architecture | None = value("nvmlDeviceGetArchitecture, named ('unknown': a number this table lacks)")
    memory_total_bytes: int | None = value("device memory", unit="bytes")
    memory_total_mib: int | None = value("device memory", unit="MiB")
    virtualization_mode: VirtualizationMode | None = value("nvmlDeviceGetVirtualizationMode, named")
    power_limit_enforced_w: float | None = value("the power limit the driver enforces (the lowest of all limits)", unit="W")
    power_limit_requested_w: float | None = value("the power management limit set (nvidia-smi -pl)", unit="W")
    power_limit_default_w: float | None = value("the default power limit", unit="W")
    power_limit_min_w: float | None = value("the lowest limit the board allows", unit="W")
    power_limit_max_w: float | None = value("the highest limit the board allows (board maximum)", unit="W")
    max_sm_clock_mhz: int | None = value("maximum SM clock", unit="MHz")
    max_mem_clock_mhz: int | None = value("maximum memory clock", unit="MHz")
    pcie_link_gen_current: int | None = value("PCIe generation now (drops at idle)")
    pcie_link_gen_max: int | None = value("highest PCIe generation of the GPU and its slot")
    pcie_link_width_current: int | None = value("PCIe lanes now", unit="lanes")
    pcie_link_width_max: int | None = value("most PCIe lanes", unit="lanes")
    pcie_link_max_gbps: float | None = value("usable bandwidth per direction at the max generation and width", unit="GB/s")
    nvlink_link_count: int | None = value("NVLink links (0: no NVLink); AMD: peers reached over XGMI or inside the package", unit="links")
    nvlink_active_links: int | None = value("NVLink links enabled; AMD: the same peers", unit="links")
    gfx_target: str | None = value("AMD: the graphics target (amdsmi target_graphics_version, e.g. 'gfx942')")
    compute_partition: str | None = value("AMD: compute partition mode (SPX, DPX, QPX, CPX)")
    memory_partition: str | None = value("AMD: memory partition mode (NPS1, NPS4)")
    partition_id: int | None = value("AMD: this device's compute partition on its GPU (0 in SPX)")
    physical_gpu: int | None = value("AMD: the physical GPU this device is (or is a partition of), in order")
    processes: list[GpuProcess] | None = value("AMD: processes holding this device (amdsmi_get_gpu_process_list)")


class InventoryValues(Values):
    """gpu.inventory: the GPUs' facts, and host-wide summaries of them (the most limiting GPU where they differ)."""

    gpu_count: int = value("GPUs read (opened, of those selected); AMD: devices, each compute partition one", default=...)
    gpu_vendor: GpuVendor | None = value("whose library read the GPUs (amd; absent from NVML's inventory)")
    physical_gpu_count: int | None = value("AMD: physical GPUs behind the devices (fewer in a partition mode)")
    compute_partition: str | None = value("AMD: the first GPU's compute partition mode (SPX, DPX, QPX, CPX)")
    memory_partition: str | None = value("AMD: the first GPU's memory partition mode (NPS1, NPS4)")
    gpu_name: str | None = value("the first GPU's name")
    gpu_names: list[str] = value("distinct GPU names, in index order", default=...)
    homogeneous: bool = value("one GPU model only", default=...)
    driver_version: str | None = value("driver version: NVIDIA's ('590.48.01') or amdgpu's")
    cuda_driver_version: str | None = value("CUDA version the driver supports, e.g. '13.1'")
    cuda_driver_version_int: int | None = value("the same as NVML reports it, e.g. 13010")
    compute_capability: str | None = value("the first GPU's compute capability, e.g. '9.0'")
    compute_capability_major: int | None = value("the first GPU's compute capability major")
    architecture: Architecture | None = value("the first GPU's architecture")
    virtualization_mode: VirtualizationMode | None = value("the first GPU's virtualization mode")
    power_limit_enforced_w: float | None = value("enforced power limit, lowest over GPUs", unit="W")
    power_limit_requested_w: float | None = value("power management limit, lowest over GPUs", unit="W")
    power_limit_default_w: float | None = value("default power limit, lowest over GPUs", unit="W")
    power_limit_min_w: float | None = value("lowest allowed limit, lowest over GPUs", unit="W")
    power_limit_max_w: float | None = value("board maximum, highest over GPUs", unit="W")
    max_sm_clock_mhz: int | None = value("maximum SM clock, lowest over GPUs", unit="MHz")
    memory_total_bytes: int | None = value("device memory, smallest over GPUs", unit="bytes")
    pcie_link_gen_max: int | None = value("max PCIe generation, lowest over GPUs")
    pcie_link_width_max: int | None = value("max PCIe lanes, fewest over GPUs", unit="lanes")
    pcie_link_max_gbps: float | None = value("usable PCIe bandwidth per direction, lowest over GPUs", unit="GB/s")
    nvlink_links_total: int | None = value("NVLink links over all GPUs", unit="links")
    nvlink_active_links_total: int | None = value("enabled NVLink links over all GPUs", unit="links")
    skipped_gpus: dict[str, str] = value("GPUs NVML lists but would not open: index -> NVML error name", default=...)
    unsupported_calls: list[str] = value("NVML functions the device or driver lacks (sorted)", default=...)
    errors: dict[str, str] = value("NVML function -> unexpected error name", default=...)
    gpus: list[InventoryGpu] = value("per GPU, in index order", default=...)


ReasonName = Literal["gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
                     "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting"]  # fmt: skip


class EventReasons(Values):
    """Share of the samples (0..1) in which each clock-event reason was active; 0.0 when never (every name is there).
    Named as NVML's clock-event reasons; on AMD filled from amdsmi_get_violation_status's active_* flags and the
    GFX clock's clk_locked, as each description says (a reason AMD has no counterpart for stays 0.0)."""

    gpu_idle: float = value("nothing is running: the clocks are lowered for idle", default=...)
    applications_clocks_setting: float = value("the application clocks setting holds the clock (AMD: the GFX clock is locked)", default=...)
    sw_power_cap: float = value("the power cap holds the clock (draw at the enforced limit; AMD: PPT violation active)", default=...)
    hw_slowdown: float = value("hardware slowdown (set with HW thermal or the power brake; AMD: PROCHOT)", default=...)
    sync_boost: float = value("held to the clock of GPUs in its sync-boost group", default=...)
    sw_thermal_slowdown: float = value("the driver slows the GPU for temperature (AMD: socket, VR or HBM thermal violation)", default=...)
    hw_thermal_slowdown: float = value("the hardware slows the GPU for temperature (AMD: PROCHOT thermal violation)", default=...)
    hw_power_brake_slowdown: float = value("the power brake (PSU or system asserting it)", default=...)
    display_clock_setting: float = value("held by the display clock", default=...)


class SampleGpu(Values):
    """One GPU over the window: its limits, links, and the same distributions as the host-wide values."""

    index: int = value("NVML index (as nvidia-smi numbers the GPUs)", default=...)
    name: str | None = value("nvmlDeviceGetName")
    uuid: str | None = value("nvmlDeviceGetUUID")
    power_limit_enforced_w: float | None = value("enforced power limit", unit="W")
    power_limit_max_w: float | None = value("board maximum (max power-limit constraint)", unit="W")
    max_sm_clock_mhz: int | None = value("maximum SM clock", unit="MHz")
    max_sm_clock_source: str | None = value("where the maximum SM clock came from (the GPU, else the GPU table)")
    max_mem_clock_mhz: int | None = value("maximum memory clock (its own: a mixed host is judged per GPU)", unit="MHz")
    pcie_link_gen_max: int | None = value("max PCIe generation")
    pcie_link_width_max: int | None = value("max PCIe lanes", unit="lanes")
    pcie_link_max_gbps: float | None = value("usable PCIe bandwidth per direction at max gen and width", unit="GB/s")
    pcie_link_gen_current: int | None = value("PCIe generation at the end of the window (under load)")
    pcie_link_width_current: int | None = value("PCIe lanes at the end of the window", unit="lanes")
    energy_avg_power_w: float | None = value("mean power over the window from the energy counter", unit="W")
    pcie_tx_bytes_per_s: float | None = value("PCIe TX byte counter delta / its window", unit="B/s")
    pcie_tx_bytes_window: float | None = value("PCIe TX bytes counted in the window", unit="bytes")
    pcie_rx_bytes_per_s: float | None = value("PCIe RX byte counter delta / its window", unit="B/s")
    pcie_rx_bytes_window: float | None = value("PCIe RX bytes counted in the window", unit="bytes")
    power_draw_w: Stats | None = value("board power (nvmlDeviceGetPowerUsage)", unit="W")
    draw_to_enforced_limit: Stats | None = value("draw / enforced power limit (0..1)")
    draw_to_max_constraint: Stats | None = value("draw / board maximum (0..1)")
    gpu_util_pct: Stats | None = value("NVML utilisation: share of time any kernel ran", unit="%")
    mem_util_pct: Stats | None = value("NVML memory utilisation: share of time memory was read or written", unit="%")
    sm_clock_mhz: Stats | None = value("SM clock", unit="MHz")
    mem_clock_mhz: Stats | None = value("memory clock", unit="MHz")
    sm_clock_ratio: Stats | None = value("SM clock / max SM clock (0..1), over samples with the GPU at least half busy")
    mem_clock_ratio: Stats | None = value("memory clock / this GPU's own max memory clock (0..1)")
    temperature_c: Stats | None = value("GPU temperature", unit="°C")
    pcie_tx_gbps: Stats | None = value("PCIe TX throughput (20 ms snapshots, 1 KB = 1000 B)", unit="GB/s")
    pcie_rx_gbps: Stats | None = value("PCIe RX throughput (20 ms snapshots, 1 KB = 1000 B)", unit="GB/s")
    pcie_tx_link_share: Stats | None = value("PCIe TX throughput / per-direction link bandwidth (0..1)")
    pcie_rx_link_share: Stats | None = value("PCIe RX throughput / per-direction link bandwidth (0..1)")
    power_instant_w: Stats | None = value("instant power (NVML_FI_DEV_POWER_INSTANT), where the field exists", unit="W")
    event_reasons: EventReasons | None = value("share of this GPU's samples with each clock-event reason")
    event_reasons_seen: list[ReasonName] | None = value("reasons active in any sample of this GPU")
    partitions: int | None = value("AMD: devices this GPU shows as (its compute partitions); power and activity come from partition 0")


class SampleValues(Values):
    """gpu.sample: power, utilisation, clocks, clock-event reasons and PCIe traffic over the window, all GPUs pooled."""

    gpu_count: int = value("GPUs sampled", default=...)
    sample_count: int = value("ticks (samples per GPU)", default=...)
    window_s: float = value("measured window, first to last tick", unit="s", default=...)
    interval_s: float = value("time between samples asked for", unit="s", default=...)
    power_limit_enforced_w: float | None = value("enforced power limit, lowest over GPUs", unit="W")
    power_limit_max_w: float | None = value("board maximum, highest over GPUs", unit="W")
    max_sm_clock_mhz: int | None = value("maximum SM clock, lowest over GPUs", unit="MHz")
    max_sm_clock_source: str | None = value(
        "where the maximum SM clock (the clock ratio's denominator) came from: the GPU (NVML, dcgm-exporter's "
        "DCGM_FI_DEV_MAX_SM_CLOCK), else the GPU table's published figure")
    power_draw_w: Stats | None = value("board power over all samples of all GPUs (the 1 s average on Ampere+)", unit="W")
    draw_to_enforced_limit: Stats | None = value("each sample's draw / its GPU's enforced limit (0..1)")
    draw_to_max_constraint: Stats | None = value("each sample's draw / its GPU's board maximum (0..1)")
    gpu_util_pct: Stats | None = value("NVML utilisation: share of time any kernel ran (not how many SMs)", unit="%")
    mem_util_pct: Stats | None = value("NVML memory utilisation", unit="%")
    sm_clock_mhz: Stats | None = value("SM clock", unit="MHz")
    mem_clock_mhz: Stats | None = value("memory clock", unit="MHz")
    sm_clock_ratio: Stats | None = value("SM clock / its GPU's max SM clock (0..1), over samples with it at least half busy")
    mem_clock_ratio: Stats | None = value("memory clock / its GPU's own max memory clock (0..1)")
    temperature_c: Stats | None = value("GPU temperature", unit="°C")
    pcie_tx_gbps: Stats | None = value("PCIe TX throughput (20 ms snapshots, 1 KB = 1000 B)", unit="GB/s")
    pcie_rx_gbps: Stats | None = value("PCIe RX throughput (20 ms snapshots, 1 KB = 1000 B)", unit="GB/s")
    pcie_tx_link_share: Stats | None = value("PCIe TX throughput / per-direction bandwidth of the GPU's max link (0..1)")
    pcie_rx_link_share: Stats | None = value("PCIe RX throughput / per-direction bandwidth of the GPU's max link (0..1)")
    power_instant_w: Stats | None = value("instant power (NVML_FI_DEV_POWER_INSTANT); None where the field does not exist", unit="W")
    energy_avg_power_w: Stats | None = value("over GPUs: each GPU's delta-energy / delta-time mean power", unit="W")
    pcie_tx_bytes_per_s: Stats | None = value("over GPUs: the PCIe TX byte counter's delta / window (whole-window traffic)", unit="B/s")
    pcie_rx_bytes_per_s: Stats | None = value("over GPUs: the PCIe RX byte counter's delta / window (whole-window traffic)", unit="B/s")
    pcie_tx_bytes_window: Stats | None = value("over GPUs: PCIe TX bytes counted in the window", unit="bytes")
    pcie_rx_bytes_window: Stats | None = value("over GPUs: PCIe RX bytes counted in the window", unit="bytes")
    pcie_counter_window_s: float | None = value("longest PCIe counter window over GPUs; None without counters", unit="s")
    event_reasons: EventReasons | None = value("share of all samples with each clock-event reason; None when no GPU reports reasons")
    throttled_fraction: float | None = value("share of samples with sw_power_cap, hw_slowdown, or a thermal or power-brake slowdown")
    slowdown_fraction: float | None = value("the same without sw_power_cap: thermal, HW slowdown, power brake")
    event_reasons_source: Literal["clocks_event_reasons", "clocks_throttle_reasons", "violation_status"] | None = value(
        "the call that gave the reasons (clocks_throttle_reasons: an NVIDIA driver older than R535; violation_status: amdsmi on MI300+)")
    gpu_vendor: GpuVendor | None = value("whose library was sampled (amd; absent from NVML's sample)")
    unsupported_calls: list[str] = value("NVML functions missing on some GPU (sorted)", default=...)
    errors: dict[str, str] = value("NVML function -> unexpected error name", default=...)
    skipped_gpus: dict[str, str] = value("GPUs NVML lists but would not open: index -> NVML error name", default=...)
    gpus: list[SampleGpu] = value("per GPU, in index order", default=...)


# "X" on the diagonal (a GPU and itself), else P2P_STATUS's names
P2PCell = Literal["X", "OK", "CNS", "GNS", "TNS", "DR", "NS", "U"]
Level = Literal["INT", "PIX", "PXB", "PHB", "NODE", "SYS"]


class P2PMatrices(Values):
    """nvmlDeviceGetP2PStatus per ordered pair: an NxN matrix per capability, in GPU order ("X" on the
    diagonal, None where the query is unsupported), or the whole matrix None when no pair answered."""

    read: list[list[P2PCell | None]] | None = value("P2P read status (nvidia-smi topo -p2p r)")
    write: list[list[P2PCell | None]] | None = value("P2P write status (nvidia-smi topo -p2p w)")
    nvlink: list[list[P2PCell | None]] | None = value("P2P over NVLink status (nvidia-smi topo -p2p n)")


class TopologyValues(Values):
    """gpu.topology: NVLink links, P2P status per GPU pair, and the PCIe common ancestor of each pair (NVML); on AMD,
    XGMI peers, P2P access per pair (amdsmi_is_P2P_accessible, as read and write) and the link type of each pair."""

    gpu_count: int = value("GPUs read", default=...)
    nvlink_link_count: list[int | None] = value("NVLink links per GPU (None where unknown); AMD: peers over XGMI or inside the package", unit="links", default=...)
    nvlink_active_links: list[int | None] = value("enabled NVLink links per GPU (None where unknown)", unit="links", default=...)
    nvlink_active_links_total: int | None = value("enabled NVLink links over all GPUs", unit="links")
    nvlink_supported: bool = value("any GPU has an NVLink link", default=...)
    p2p: P2PMatrices = value("P2P status matrices: read, write, nvlink", default=...)
    p2p_ok_pairs: int | None = value("unordered GPU pairs with read and write P2P OK; None when neither was read", unit="pairs")
    pairs_total: int = value("unordered GPU pairs, N*(N-1)/2", unit="pairs", default=...)
    pairs_without_p2p: int | None = value("unordered pairs where read or write P2P is not OK; None when neither was read", unit="pairs")
    any_pair_without_p2p: bool | None = value("some pair lacks read or write P2P; None when neither could be read")
    topology: list[list[str | None]] | None = value(
        "NxN common-ancestor matrix as nvidia-smi topo -m names it ('X', 'INT', 'PIX', 'PXB', 'PHB', 'NODE', 'SYS'; "
        "the level number for one it does not name; None where unsupported), or None when no pair answered")
    topology_worst: Level | None = value("the farthest path over all pairs (SYS > NODE > PHB > PXB > PIX > INT)")
    link_types: list[list[str | None]] | None = value(
        "AMD: NxN link type per pair as amdsmi_topo_get_link_type names it ('X', 'INTERNAL' inside one GPU's package, 'XGMI', "
        "'PCIE'); None on NVIDIA")
    unsupported_calls: list[str] = value("NVML functions the device or driver lacks (sorted)", default=...)
    errors: dict[str, str] = value("NVML function -> unexpected error name", default=...)
    skipped_gpus: dict[str, str] = value("GPUs NVML lists but would not open: index -> NVML error name", default=...)


ReferenceKind = Literal["calibration", "measured curve", "single figure", "estimate"]


class ReferenceValues(Values):
    """gpu.reference: the yardstick for "underfed": what a well-fed GPU of this model draws, against the intensity of its work."""

    gpu_name: str = value("the first GPU's name (nvmlDeviceGetName)", default=...)
    board_max_w: float | None = value("board maximum (max power-limit constraint), highest over GPUs", unit="W")
    memory_bound_draw_w: float | None = value(
        "the curve's floor, the yardstick where the run's shape is unknown: a copy's draw (a calibration's lowest draw, where a "
        "GEMM drew less), else the fallback share of board_max_w", unit="W")
    memory_bound_share: float | None = value("memory_bound_draw_w / board_max_w (0..1)")
    draw_curve: list[list[float]] | None = value(
        "[FLOPs per byte of weights, W] pairs by intensity: what a well-fed GPU draws at that intensity (one pair: a single "
        "figure for every intensity; null: no figure at all); rules read it with interp(ref.draw_curve, x)", default=...)
    curve_limit_w: float | None = value("the power limit the curve was measured at (null: a single figure or an estimate)", unit="W")
    peak_dram_gbps: float | None = value("the model's peak DRAM bandwidth, from its table row (None where the table has no row)", unit="GB/s")
    reference_kind: ReferenceKind = value("calibration (this host's, runbook calibrate), measured curve (the GPU table), single figure, or estimate", default=...)
    reference_measured: bool = value("the draw is a measurement, not the fallback estimate", default=...)
    reference_source: str = value("where the figure comes from (the measurement, or the estimate's basis)", default=...)
    calibration_note: str | None = value("why a calibration file was not used (unreadable, another GPU model or power limit), if one was looked for")


def host_calibration(target: Any, name: str | None, enforced_w: float | None) -> tuple[calibration.Calibration | None, str | None]:
    """This host's calibration for this GPU model at this power limit, where the run looks for one
    (`Target.calibration`: the user's directory on a real host, a named file only when simulated), or why not."""
    where = getattr(target, "calibration", None)
    if not where:
        return None, None
    cal, problems = calibration.find(where, name, enforced_w)
    if cal is not None and (short := cal.spans_decode()) is None:
        return cal, None
    if cal is not None:
        return None, f"{cal.describe()} not used: {short}"
    limit = f" at a {enforced_w:g} W limit" if enforced_w else ""
    why = "; ".join(problems) if problems else f"none for {name}{limit} in {where} (runbook calibrate measures one)"
    return None, why


def reference_for(name: str | None, board_max_w: float | None, cal: calibration.Calibration | None = None) -> dict[str, Any]:
    """The yardstick from the best source there is: a calibration, the table's curve, its single figure, the fallback."""
    row = gpu_model(name)
    peak = row.dram_gbps.value if row is not None else None
    if cal is not None:
        curve = [[x, y] for x, y in cal.curve()]
        return {"memory_bound_draw_w": curve[0][1], "draw_curve": curve, "curve_limit_w": cal.power_limit_w,
                "peak_dram_gbps": peak, "reference_kind": "calibration", "reference_source": cal.describe(), "reference_measured": True}  # fmt: skip
    if row is not None and row.power_curve is not None:
        pc = row.power_curve
        curve = [[p.flops_per_byte, p.draw_w] for p in sorted(pc.points, key=lambda p: p.flops_per_byte)]
        floor = row.memory_bound_draw_w.value if row.memory_bound_draw_w is not None else curve[0][1]
        return {"memory_bound_draw_w": floor, "draw_curve": curve, "curve_limit_w": pc.limit_w, "peak_dram_gbps": peak,
                "reference_kind": "measured curve", "reference_source": pc.source, "reference_measured": True}  # fmt: skip
    if row is not None and row.memory_bound_draw_w is not None:
        figure = row.memory_bound_draw_w
        return {"memory_bound_draw_w": figure.value, "draw_curve": [[0.0, figure.value]], "curve_limit_w": None, "peak_dram_gbps": peak,
                "reference_kind": "single figure", "reference_source": f"a single point, applied at every batch: {figure.source}",
                "reference_measured": True}  # fmt: skip
    fallback = gpu_table().memory_bound_fallback
    draw = round(fallback.share * board_max_w, 1) if board_max_w else None
    return {"memory_bound_draw_w": draw, "draw_curve": [[0.0, draw]] if draw else None, "curve_limit_w": None, "peak_dram_gbps": None,
            "reference_kind": "estimate", "reference_source": fallback.source, "reference_measured": False}  # fmt: skip


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
