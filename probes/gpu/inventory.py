"""`gpu.inventory`: what GPUs the host has, their limits, links and driver, read once from NVML."""

from __future__ import annotations

from typing import Any

from gpu_runbook.nvml import Device
from gpu_runbook.plugin import Context, Evidence, Probe, Table, utcnow

from ..gpu_values import InventoryValues, pcie_link_gbps
from .common import (
    GpuSelection,
    _first,
    _max,
    _min,
    _nvlink_links,
    _open,
    _present,
    _Reader,
    _w,
)

VIRTUALIZATION_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}
ARCHITECTURES = {
    2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere", 8: "ada",
    9: "hopper", 10: "blackwell", 13: "rubin",
}


def _static(r: _Reader, dev: Device) -> dict[str, Any]:
    """The per-GPU facts inventory reports (also what sample needs for its ratios)."""
    lib, h = r.lib, dev.handle
    pci = r.q("nvmlDeviceGetPciInfo", h)
    cc = r.q("nvmlDeviceGetCudaComputeCapability", h)
    arch = r.q("nvmlDeviceGetArchitecture", h)
    mem = r.q("nvmlDeviceGetMemoryInfo", h)
    virt = r.q("nvmlDeviceGetVirtualizationMode", h)
    constraints = r.q("nvmlDeviceGetPowerManagementLimitConstraints", h)
    gen_max = r.q("nvmlDeviceGetMaxPcieLinkGeneration", h)
    width_max = r.q("nvmlDeviceGetMaxPcieLinkWidth", h)
    links, active = _nvlink_links(r, h)
    return {
        "index": dev.index,
        "name": r.q("nvmlDeviceGetName", h),
        "uuid": r.q("nvmlDeviceGetUUID", h),
        "pci_bus_id": None if pci is None else pci.busId,
        "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
        "compute_capability_major": None if cc is None else int(cc[0]),
        "compute_capability_minor": None if cc is None else int(cc[1]),
        "architecture": None if arch is None else ARCHITECTURES.get(int(arch), "unknown"),
        "memory_total_bytes": None if mem is None else int(mem.total),
        "memory_total_mib": None if mem is None else int(mem.total) // (1024 * 1024),
        "virtualization_mode": None if virt is None else VIRTUALIZATION_MODES.get(int(virt), "unknown"),
        "power_limit_enforced_w": _w(r.q("nvmlDeviceGetEnforcedPowerLimit", h)),
        "power_limit_requested_w": _w(r.q("nvmlDeviceGetPowerManagementLimit", h)),
        "power_limit_default_w": _w(r.q("nvmlDeviceGetPowerManagementDefaultLimit", h)),
        "power_limit_min_w": None if constraints is None else _w(constraints[0]),
        "power_limit_max_w": None if constraints is None else _w(constraints[1]),
        "max_sm_clock_mhz": r.q("nvmlDeviceGetMaxClockInfo", h, lib.NVML_CLOCK_SM),
        "max_mem_clock_mhz": r.q("nvmlDeviceGetMaxClockInfo", h, lib.NVML_CLOCK_MEM),
        "pcie_link_gen_current": r.q("nvmlDeviceGetCurrPcieLinkGeneration", h),
        "pcie_link_gen_max": gen_max,
        "pcie_link_width_current": r.q("nvmlDeviceGetCurrPcieLinkWidth", h),
        "pcie_link_width_max": width_max,
        "pcie_link_max_gbps": pcie_link_gbps(gen_max, width_max),
        "nvlink_link_count": links,
        "nvlink_active_links": active,
    }


def _cuda_version(v: int | None) -> str | None:
    return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"


class InventoryParams(GpuSelection):
    pass


class GpuInventory(Probe):
    """What GPUs the host has, their limits, links and driver, read once from NVML.

    The values are declared in `InventoryValues` (None where NVML does not report a value).
    """

    name = "gpu.inventory"
    gpu_vendor = "nvidia"  # on an AMD host the amd family does this job (Registry.for_target)
    prefetch = True
    description = "GPUs, driver, power limits, clocks, PCIe and NVLink links, from NVML"
    Params = InventoryParams
    Values = InventoryValues

    async def run(self, ctx: Context, params: Any) -> Evidence:
        started = utcnow()
        devs = await _open(ctx, params.gpus, started)
        if isinstance(devs, Evidence):
            return devs

        def read(lib: Any) -> tuple[list[dict[str, Any]], Any, Any, _Reader]:
            r = _Reader(lib)
            gpus = [_static(r, d) for d in devs.devices]
            return gpus, r.q("nvmlSystemGetDriverVersion"), r.q("nvmlSystemGetCudaDriverVersion"), r

        gpus, driver, cuda, r = await ctx.nvml.call(read)
        col = lambda k: [g[k] for g in gpus]  # noqa: E731
        names = list(dict.fromkeys(_present(col("name"))))
        links = _present(col("nvlink_link_count"))
        active = _present(col("nvlink_active_links"))
        values: dict[str, Any] = {
            "gpu_count": len(gpus),
            "gpu_name": _first(col("name")),
            "gpu_names": names,
            "homogeneous": len(names) <= 1,
            "driver_version": driver,
            "cuda_driver_version": _cuda_version(cuda),
            "cuda_driver_version_int": cuda,
            "compute_capability": _first(col("compute_capability")),
            "compute_capability_major": _first(col("compute_capability_major")),
            "architecture": _first(col("architecture")),
            "virtualization_mode": _first(col("virtualization_mode")),
            "power_limit_enforced_w": _min(col("power_limit_enforced_w")),
            "power_limit_requested_w": _min(col("power_limit_requested_w")),
            "power_limit_default_w": _min(col("power_limit_default_w")),
            "power_limit_min_w": _min(col("power_limit_min_w")),
            "power_limit_max_w": _max(col("power_limit_max_w")),
            "max_sm_clock_mhz": _min(col("max_sm_clock_mhz")),
            "memory_total_bytes": _min(col("memory_total_bytes")),
            "pcie_link_gen_max": _min(col("pcie_link_gen_max")),
            "pcie_link_width_max": _min(col("pcie_link_width_max")),
            "pcie_link_max_gbps": _min(col("pcie_link_max_gbps")),
            "nvlink_links_total": sum(links) if links else None,
            "nvlink_active_links_total": sum(active) if active else None,
            "skipped_gpus": {str(k): v for k, v in devs.skipped.items()},
            "unsupported_calls": sorted(r.missing),
            "errors": dict(r.errors),
            "gpus": gpus,
        }
        table = Table(
            title="GPU inventory",
            columns=["GPU", "name", "bus id", "CC", "memory MiB", "power limit W (enforced/max)",
                     "max SM MHz", "PCIe gen/width (cur/max)", "NVLink links", "virtualization"],
            rows=[
                [g["index"], g["name"], g["pci_bus_id"], g["compute_capability"], g["memory_total_mib"],
                 f"{g['power_limit_enforced_w']}/{g['power_limit_max_w']}", g["max_sm_clock_mhz"],
                 f"Gen{g['pcie_link_gen_current']}x{g['pcie_link_width_current']}"
                 f"/Gen{g['pcie_link_gen_max']}x{g['pcie_link_width_max']}",
                 g["nvlink_link_count"], g["virtualization_mode"]]
                for g in gpus
            ],
        )
        limit = values["power_limit_enforced_w"]
        summary = (
            f"{len(gpus)}x {values['gpu_name']}, driver {driver}, CC {values['compute_capability']}, "
            f"power limit {limit if limit is None else f'{limit:g}'} W, "
            f"NVLink links {values['nvlink_links_total']}, virtualization {values['virtualization_mode']}"
        )
        return Evidence(summary=summary, values=values, blocks=[table], started_at=started, finished_at=utcnow())
