"""`gpu.reference`: what a well-fed GPU of this model draws, against the intensity of its work, with the source.

"Underfed" needs a yardstick. The board maximum is the wrong one: healthy memory-bound decode draws
well below it (an RTX PRO 6000 Server draws ~367 W of 600 W copying memory), and what a well-fed GPU
draws grows with the batch it decodes (an H200: ~517 W at batch 1, its 700 W limit from batch 64).
So the yardstick is a curve of draw against arithmetic intensity (FLOPs per byte of weights), from the
best source there is, each called what it is: this GPU's own calibration (`runbook calibrate`), else
the GPU table's measured curve (`probes/data/gpus.yaml`), else its single measured figure (one point,
applied at every intensity), else an estimate from the board maximum. The rules place the run's shape
on it (`interp(ref.draw_curve, flops_per_byte)`); the first point, a copy, is the floor where the
shape is unknown.
"""

from __future__ import annotations

from typing import Any

from gpu_runbook import calibration
from gpu_runbook.plugin import Context, Evidence, Probe, Table, utcnow

from ..gpu_values import ReferenceValues, host_calibration, reference_for
from .common import GpuSelection, _open


class GpuReference(Probe):
    """What this GPU model draws doing memory-bound work; the values are declared in `ReferenceValues`."""

    name = "gpu.reference"
    gpu_vendor = "nvidia"  # on an AMD host the amd family does this job (Registry.for_target)
    prefetch = True
    description = "Memory-bound reference draw for this GPU model (measured data with its source)"
    Params = GpuSelection
    Values = ReferenceValues

    async def run(self, ctx: Context, params: GpuSelection) -> Evidence:
        started = utcnow()
        devs = await _open(ctx, params.gpus, started)
        if isinstance(devs, Evidence):
            return devs

        def read(lib: Any) -> tuple[str | None, float | None, float | None]:
            d = devs.devices[0]
            name = lib.nvmlDeviceGetName(d.handle)
            tops = []
            for dev in devs.devices:
                try:
                    tops.append(lib.nvmlDeviceGetPowerManagementLimitConstraints(dev.handle)[1] / 1000.0)
                except lib.NVMLError:
                    continue
            try:
                enforced = lib.nvmlDeviceGetEnforcedPowerLimit(d.handle) / 1000.0
            except lib.NVMLError:
                enforced = None
            return (name.decode() if isinstance(name, bytes) else name), (max(tops) if tops else None), enforced

        name, board_max, enforced = await ctx.nvml.call(read)
        cal, note = self._calibration(ctx, name, enforced)
        ref = reference_for(name, board_max, cal)
        draw = ref["memory_bound_draw_w"]
        values = {"gpu_name": name, "board_max_w": board_max, **ref, "calibration_note": note,
                  "memory_bound_share": round(draw / board_max, 4) if draw and board_max else None}  # fmt: skip
        summary = f"{name}: {_curve_words(ref)}" if draw and board_max else f"{name}: no reference draw"
        rows = [[k, values[k]] for k in ("gpu_name", "board_max_w", "memory_bound_draw_w", "memory_bound_share", "reference_kind",
                                         "peak_dram_gbps", "reference_source", "calibration_note") if values[k] is not None]  # fmt: skip
        blocks: list[Any] = [Table(title="GPU reference", columns=["field", "value"], rows=rows)]
        if len(ref["draw_curve"] or []) > 1:
            blocks.append(Table(title=f"What a well-fed {name} draws ({ref['reference_kind']})", columns=["FLOPs per byte of weights", "W"],
                                rows=[[x, y] for x, y in ref["draw_curve"]]))  # fmt: skip
        return Evidence(summary=summary, values=values, blocks=blocks, started_at=started, finished_at=utcnow())

    @staticmethod
    def _calibration(ctx: Context, name: str | None, enforced_w: float | None) -> tuple[calibration.Calibration | None, str | None]:
        """This host's calibration for this GPU model at this power limit (`gpu_values.host_calibration`)."""
        return host_calibration(ctx.target, name, enforced_w)


def _curve_words(ref: dict[str, Any]) -> str:
    curve, kind = ref["draw_curve"], ref["reference_kind"]
    if len(curve) > 1:
        said = f"{kind}: {ref['reference_source']}" if kind == "calibration" else kind
        return f"a well-fed GPU draws {curve[0][1]:g} W at the floor of its curve to {max(y for _, y in curve):g} W at the top ({said})"
    return f"memory-bound work draws ~{curve[0][1]:g} W ({kind})"
