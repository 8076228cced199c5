"""`amd.inventory`: what AMD GPUs the host has, their limits, links, partition modes and processes, read once from
amdsmi. It does the job `gpu.inventory` names (a runbook names that; on an AMD host this probe runs)."""

from __future__ import annotations

from typing import Any

from gpu_runbook.plugin import Context, Evidence, Probe, Table, utcnow

from ..gpu_values import InventoryValues, pcie_link_gbps
from .common import AmdSelection, Device, Reader, open_devices, partition_id, physical_groups, watts_from_uw


def _first(xs: list[Any]) -> Any:
    return next((x for x in xs if x is not None), None)


def _min(xs: list[Any]) -> Any:
    xs = [x for x in xs if x is not None]
    return min(xs) if xs else None


def _max(xs: list[Any]) -> Any:
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def _peers(r: Reader, d: Device, devices: list[Device]) -> int | None:
    """Other devices reached over XGMI or inside the same package (amdsmi_topo_get_link_type type 2 or 0)."""
    lib = r.lib
    fabric = {int(lib.AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI), int(lib.AmdSmiLinkType.AMDSMI_LINK_TYPE_INTERNAL)}
    answered = count = 0
    for other in devices:
        if other.index == d.index:
            continue
        link = r.q("amdsmi_topo_get_link_type", d.handle, other.handle)
        if isinstance(link, dict) and link.get("type") is not None:
            answered += 1
            count += int(int(link["type"]) in fabric)
    return count if answered or len(devices) == 1 else None


def _static(r: Reader, d: Device, devices: list[Device], physical: int) -> dict[str, Any]:
    lib, h = r.lib, d.handle
    asic = r.q("amdsmi_get_gpu_asic_info", h)
    cap = r.q("amdsmi_get_power_cap_info", h)
    gfx = r.q("amdsmi_get_clock_info", h, lib.AmdSmiClkType.GFX)
    mem = r.q("amdsmi_get_clock_info", h, lib.AmdSmiClkType.MEM)
    vram = r.q("amdsmi_get_gpu_vram_info", h)
    pcie = r.q("amdsmi_get_pcie_info", h)
    static = pcie.get("pcie_static") if isinstance(pcie, dict) else None
    metric = pcie.get("pcie_metric") if isinstance(pcie, dict) else None
    gen_max = r.field(static, "pcie_interface_version", "amdsmi_get_pcie_info")
    width_max = r.field(static, "max_pcie_width", "amdsmi_get_pcie_info")
    speed_now = r.field(metric, "pcie_speed", "amdsmi_get_pcie_info")
    size_mb = r.field(vram, "vram_size", "amdsmi_get_gpu_vram_info")
    procs = r.q("amdsmi_get_gpu_process_list", h)
    peers = _peers(r, d, devices)
    return {
        "index": d.index,
        "name": r.field(asic, "market_name", "amdsmi_get_gpu_asic_info"),
        "uuid": r.q("amdsmi_get_gpu_device_uuid", h),
        "pci_bus_id": r.q("amdsmi_get_gpu_device_bdf", h),
        "gfx_target": r.field(asic, "target_graphics_version", "amdsmi_get_gpu_asic_info"),
        "memory_total_bytes": None if size_mb is None else int(size_mb) * 1024 * 1024,  # vram_size is MB (amd.md §1.4)
        "memory_total_mib": None if size_mb is None else int(size_mb),
        "power_limit_enforced_w": watts_from_uw(r.field(cap, "power_cap", "amdsmi_get_power_cap_info")),
        "power_limit_requested_w": watts_from_uw(r.field(cap, "power_cap", "amdsmi_get_power_cap_info")),
        "power_limit_default_w": watts_from_uw(r.field(cap, "default_power_cap", "amdsmi_get_power_cap_info")),
        "power_limit_min_w": watts_from_uw(r.field(cap, "min_power_cap", "amdsmi_get_power_cap_info")),
        "power_limit_max_w": watts_from_uw(r.field(cap, "max_power_cap", "amdsmi_get_power_cap_info")),
        "max_sm_clock_mhz": r.field(gfx, "max_clk", "amdsmi_get_clock_info"),
        "max_mem_clock_mhz": r.field(mem, "max_clk", "amdsmi_get_clock_info"),
        # pcie_speed is MT/s (amdsmi.h; the CLI divides by 1000): 32000 is Gen5's 32 GT/s
        "pcie_link_gen_current": _gen_of_mts(speed_now),
        "pcie_link_gen_max": gen_max,
        "pcie_link_width_current": r.field(metric, "pcie_width", "amdsmi_get_pcie_info"),
        "pcie_link_width_max": width_max,
        "pcie_link_max_gbps": pcie_link_gbps(gen_max, width_max),
        "nvlink_link_count": peers,
        "nvlink_active_links": peers,
        "compute_partition": r.q("amdsmi_get_gpu_compute_partition", h) or None,
        "memory_partition": r.q("amdsmi_get_gpu_memory_partition", h) or None,
        "partition_id": partition_id(r, d),
        "physical_gpu": physical,
        "processes": None if procs is None else [
            {"pid": int(p["pid"]), "name": p.get("name") if p.get("name") not in (None, "N/A") else None,
             "memory_bytes": p.get("mem") if isinstance(p.get("mem"), int) else None} for p in procs],
    }  # fmt: skip


def _gen_of_mts(mts: Any) -> int | None:
    """The PCIe generation of a link speed in MT/s (2500 Gen1 ... 64000 Gen6)."""
    if mts is None:
        return None
    return {2500: 1, 5000: 2, 8000: 3, 16000: 4, 32000: 5, 64000: 6}.get(int(mts))


class AmdInventory(Probe):
    """What AMD GPUs the host has, their limits, links, partition modes and processes, read once from amdsmi.

    The values are `gpu.inventory`'s (`InventoryValues`); AMD's own (partition modes, processes) are declared there too.
    """

    name = "amd.inventory"
    gpu_vendor = "amd"
    gpu_role = "gpu.inventory"
    prefetch = True
    description = "AMD GPUs, driver, power caps, clocks, PCIe and XGMI, partition modes and processes, from amdsmi"
    Params = AmdSelection
    Values = InventoryValues

    async def run(self, ctx: Context, params: Any) -> Evidence:
        started = utcnow()
        devs = await open_devices(ctx, params.gpus, started)
        if isinstance(devs, Evidence):
            return devs

        def read(lib: Any) -> tuple[list[dict[str, Any]], int, Any, Reader]:
            r = Reader(lib)
            groups = physical_groups(r, devs.devices)
            where = {d.index: k for k, group in enumerate(groups) for d in group}
            gpus = [_static(r, d, devs.devices, where[d.index]) for d in devs.devices]
            driver = r.q("amdsmi_get_gpu_driver_info", devs.devices[0].handle)
            return gpus, len(groups), r.field(driver, "driver_version", "amdsmi_get_gpu_driver_info"), r

        gpus, physical, driver, r = await ctx.gpu.amdsmi.call(read)  # type: ignore[union-attr]
        col = lambda k: [g[k] for g in gpus]  # noqa: E731
        names = list(dict.fromkeys(x for x in col("name") if x is not None))
        links = [x for x in col("nvlink_link_count") if x is not None]
        values: dict[str, Any] = {
            "gpu_count": len(gpus),
            "gpu_vendor": "amd",
            "physical_gpu_count": physical,
            "compute_partition": _first(col("compute_partition")),
            "memory_partition": _first(col("memory_partition")),
            "gpu_name": _first(col("name")),
            "gpu_names": names,
            "homogeneous": len(names) <= 1,
            "driver_version": driver,
            "cuda_driver_version": None,
            "cuda_driver_version_int": None,
            "compute_capability": None,
            "compute_capability_major": None,
            "architecture": None,
            "virtualization_mode": None,
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
            "nvlink_active_links_total": sum(links) if links else None,
            "skipped_gpus": {str(k): v for k, v in devs.skipped.items()},
            "unsupported_calls": sorted(r.missing),
            "errors": dict(r.errors),
            "gpus": gpus,
        }
        table = Table(
            title="GPU inventory (amdsmi)",
            columns=["GPU", "name", "bus id", "partition", "memory MiB", "power cap W (current/max)", "max GFX MHz",
                     "PCIe gen/width (cur/max)", "XGMI peers", "processes"],
            rows=[
                [g["index"], g["name"], g["pci_bus_id"], f"{g['compute_partition']}/{g['memory_partition']} #{g['partition_id']}",
                 g["memory_total_mib"], f"{g['power_limit_enforced_w']}/{g['power_limit_max_w']}", g["max_sm_clock_mhz"],
                 f"Gen{g['pcie_link_gen_current']}x{g['pcie_link_width_current']}/Gen{g['pcie_link_gen_max']}x{g['pcie_link_width_max']}",
                 g["nvlink_link_count"], ", ".join(f"{p['name']} ({p['pid']})" for p in g["processes"] or [])]
                for g in gpus
            ],
        )  # fmt: skip
        cap = values["power_limit_enforced_w"]
        parts = f" as {len(gpus)} {values['compute_partition']} devices" if physical != len(gpus) else ""
        summary = (f"{physical}x {values['gpu_name']}{parts}, amdgpu driver {driver}, "
                   f"power cap {cap if cap is None else f'{cap:g}'} W, partition {values['compute_partition']}/{values['memory_partition']}")
        return Evidence(summary=summary, values=values, blocks=[table], started_at=started, finished_at=utcnow())
