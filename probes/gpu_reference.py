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

from typing import Any, Literal

from gpu_runbook import calibration
from gpu_runbook.evidence import Evidence, Table, utcnow
from gpu_runbook.probe import Context, Probe
from gpu_runbook.values import Values, value

from .gpu_common import GpuSelection, _open
from .gpu_table import gpu_model, gpu_table

ReferenceKind = Literal["calibration", "measured curve", "single figure", "estimate"]


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
        """This host's calibration for this GPU model at this power limit, where the run looks for one
        (`Target.calibration`: the user's directory on a real host, a named file only when simulated)."""
        where = getattr(ctx.target, "calibration", None)
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


def _curve_words(ref: dict[str, Any]) -> str:
    curve, kind = ref["draw_curve"], ref["reference_kind"]
    if len(curve) > 1:
        said = f"{kind}: {ref['reference_source']}" if kind == "calibration" else kind
        return f"a well-fed GPU draws {curve[0][1]:g} W at the floor of its curve to {max(y for _, y in curve):g} W at the top ({said})"
    return f"memory-bound work draws ~{curve[0][1]:g} W ({kind})"
