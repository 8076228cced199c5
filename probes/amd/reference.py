"""`amd.reference`: what a well-fed AMD GPU of this model draws, with the source: the job `gpu.reference` names.

The yardstick is the GPU concepts' (`gpu_values.reference_for`): this host's calibration, else the GPU table's
row for the model amdsmi names (`market_name`), else the fallback estimate from the board maximum (no AMD figure
for memory-bound draw is published: amd.md §3). Power caps are amdsmi's microwatts, read as W.
"""

from __future__ import annotations

from typing import Any

from gpu_runbook.plugin import Context, Evidence, Probe, Table, utcnow

from ..gpu_values import ReferenceValues, host_calibration, reference_for
from .common import AmdSelection, Reader, open_devices, watts_from_uw


class AmdReference(Probe):
    """What this AMD GPU model draws doing memory-bound work; the values are declared in `ReferenceValues`."""

    name = "amd.reference"
    gpu_vendor = "amd"
    gpu_role = "gpu.reference"
    prefetch = True
    description = "Memory-bound reference draw for this AMD GPU model (measured data with its source, else an estimate)"
    Params = AmdSelection
    Values = ReferenceValues

    async def run(self, ctx: Context, params: AmdSelection) -> Evidence:
        started = utcnow()
        devs = await open_devices(ctx, params.gpus, started)
        if isinstance(devs, Evidence):
            return devs

        def read(lib: Any) -> tuple[str | None, float | None, float | None]:
            r = Reader(lib)
            first = devs.devices[0].handle
            name = r.field(r.q("amdsmi_get_gpu_asic_info", first), "market_name", "amdsmi_get_gpu_asic_info")
            caps = [r.q("amdsmi_get_power_cap_info", d.handle) for d in devs.devices]
            tops = [w for c in caps if (w := watts_from_uw(r.field(c, "max_power_cap", "amdsmi_get_power_cap_info"))) is not None]
            enforced = watts_from_uw(r.field(caps[0], "power_cap", "amdsmi_get_power_cap_info"))
            return name, (max(tops) if tops else None), enforced

        name, board_max, enforced = await ctx.gpu.amdsmi.call(read)  # type: ignore[union-attr]
        cal, note = host_calibration(ctx.target, name, enforced)
        ref = reference_for(name, board_max, cal)
        draw = ref["memory_bound_draw_w"]
        values = {"gpu_name": name, "board_max_w": board_max, **ref, "calibration_note": note,
                  "memory_bound_share": round(draw / board_max, 4) if draw and board_max else None}  # fmt: skip
        curve = ref["draw_curve"] or []
        words = (f"a well-fed GPU draws {curve[0][1]:g} W at the floor of its curve to {max(y for _, y in curve):g} W ({ref['reference_kind']})"
                 if len(curve) > 1 else f"memory-bound work draws ~{curve[0][1]:g} W ({ref['reference_kind']})" if curve else "no reference draw")
        rows = [[k, values[k]] for k in ("gpu_name", "board_max_w", "memory_bound_draw_w", "memory_bound_share", "reference_kind",
                                         "peak_dram_gbps", "reference_source", "calibration_note") if values[k] is not None]  # fmt: skip
        return Evidence(summary=f"{name}: {words}", values=values, blocks=[Table(title="GPU reference", columns=["field", "value"], rows=rows)],
                        started_at=started, finished_at=utcnow())
