"""`gpu.reference`: what this GPU model draws doing memory-bound work, from measured data with its source.

"Underfed" needs a yardstick. The board maximum is the wrong one: healthy memory-bound decode draws
well below it (an RTX PRO 6000 Server draws ~367 W of 600 W copying memory). The figures live in the
one GPU table (`probes/data/gpus.yaml`, read by `gpu_runbook.probes.gpu_table`), each with the measurement it came
from; a GPU without one gets an estimate that says it is one.
"""

from __future__ import annotations

from typing import Any

from gpu_runbook.evidence import Evidence, Table, utcnow
from gpu_runbook.probe import Context, Probe
from gpu_runbook.values import Values, value

from .gpu_common import GpuSelection, _open
from .gpu_table import gpu_model, gpu_table


def reference_for(name: str | None, board_max_w: float | None) -> dict[str, Any]:
    """The measured memory-bound draw of the GPU's table row, else the labelled fallback."""
    row = gpu_model(name)
    if row is not None and row.memory_bound_draw_w is not None:
        return {"memory_bound_draw_w": row.memory_bound_draw_w.value, "peak_dram_gbps": row.dram_gbps.value,
                "reference_source": row.memory_bound_draw_w.source, "reference_measured": True}  # fmt: skip
    fallback = gpu_table().memory_bound_fallback
    draw = round(fallback.share * board_max_w, 1) if board_max_w else None
    return {"memory_bound_draw_w": draw, "peak_dram_gbps": None, "reference_source": fallback.source, "reference_measured": False}


class ReferenceValues(Values):
    """gpu.reference: the yardstick for "underfed": what this GPU model draws on memory-bound work, with its source."""

    gpu_name: str = value("the first GPU's name (nvmlDeviceGetName)", default=...)
    board_max_w: float | None = value("board maximum (max power-limit constraint), highest over GPUs", unit="W")
    memory_bound_draw_w: float | None = value(
        "what this GPU model draws on memory-bound work flat out: measured, else the fallback share of board_max_w", unit="W")
    memory_bound_share: float | None = value("memory_bound_draw_w / board_max_w (0..1)")
    peak_dram_gbps: float | None = value("the model's peak DRAM bandwidth, from its table row (None for the fallback, or where the row has none)", unit="GB/s")
    reference_measured: bool = value("the draw is a measurement, not the fallback estimate", default=...)
    reference_source: str = value("where the figure comes from (the measurement, or the estimate's basis)", default=...)


class GpuReference(Probe):
    """What this GPU model draws doing memory-bound work; the values are declared in `ReferenceValues`."""

    name = "gpu.reference"
    prefetch = True
    description = "Memory-bound reference draw for this GPU model (measured data with its source)"
    Params = GpuSelection
    Values = ReferenceValues

    async def run(self, ctx: Context, params: GpuSelection) -> Evidence:
        started = utcnow()
        devs = await _open(ctx, params.gpus, started)
        if isinstance(devs, Evidence):
            return devs

        def read(lib: Any) -> tuple[str | None, float | None]:
            d = devs.devices[0]
            name = lib.nvmlDeviceGetName(d.handle)
            tops = []
            for dev in devs.devices:
                try:
                    tops.append(lib.nvmlDeviceGetPowerManagementLimitConstraints(dev.handle)[1] / 1000.0)
                except lib.NVMLError:
                    continue
            return (name.decode() if isinstance(name, bytes) else name), (max(tops) if tops else None)

        name, board_max = await ctx.nvml.call(read)
        ref = reference_for(name, board_max)
        draw = ref["memory_bound_draw_w"]
        values = {"gpu_name": name, "board_max_w": board_max, **ref,
                  "memory_bound_share": round(draw / board_max, 4) if draw and board_max else None}  # fmt: skip
        kind = "measured" if ref["reference_measured"] else "estimated"
        summary = f"{name}: memory-bound work draws ~{draw:g} W of {board_max:g} W ({kind})" if draw and board_max else f"{name}: no reference draw"
        rows = [[k, values[k]] for k in ("gpu_name", "board_max_w", "memory_bound_draw_w", "memory_bound_share", "peak_dram_gbps", "reference_source")]
        return Evidence(summary=summary, values=values, blocks=[Table(title="GPU reference", columns=["field", "value"], rows=rows)],
                        started_at=started, finished_at=utcnow())
