"""The one table of per-GPU figures (`probes/data/gpus.yaml`): peaks for rooflines, the draw curve for gpu.reference.

One file and one loader, so a figure (peak DRAM bandwidth, say) is written once, with its source,
whichever probe reads it. A row is found by the name the GPU's library or exporter reports (NVML's name,
dcgm-exporter's modelName, amdsmi's market_name, the AMD exporter's card_model): the first row one of
whose `match` strings is a case-insensitive substring of it (the file lists the more specific names
first). The table is checked like a runbook: a bad field is an error naming file:line:col.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from gpu_runbook import yamlpos
from gpu_runbook.loader import LoadError, schema_errors
from pydantic import BaseModel, ConfigDict, Field, ValidationError

GPU_TABLE = Path(__file__).with_name("data") / "gpus.yaml"


class Figure(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: float | None
    source: str


class PcieFigure(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gen: int
    width: int
    source: str


class MeasuredFigure(BaseModel):
    """A measurement: only a GPU that was measured has one, so the value is never null."""

    model_config = ConfigDict(extra="forbid")
    value: float
    source: str


class Fallback(BaseModel):
    """What gpu.reference says for a GPU without a measured memory-bound draw: a share of its board maximum."""

    model_config = ConfigDict(extra="forbid")
    share: float = Field(gt=0, le=1)
    source: str


class CurvePoint(BaseModel):
    """What a well-fed GPU drew at one arithmetic intensity (FLOPs per byte of weights; 0 for a copy)."""

    model_config = ConfigDict(extra="forbid")
    flops_per_byte: float = Field(ge=0, allow_inf_nan=False)
    draw_w: float = Field(gt=0, allow_inf_nan=False)
    load: str  # what ran: "bf16 GEMM, batch 8"
    gbps: float | None = None


class PowerCurve(BaseModel):
    """Draw against intensity, measured at one power limit: vendor-neutral, the shape `runbook calibrate` writes."""

    model_config = ConfigDict(extra="forbid")
    limit_w: float = Field(gt=0)
    source: str
    points: list[CurvePoint] = Field(min_length=2)


class GpuModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    match: list[str] = Field(min_length=1)
    dram_gbps: Figure
    fp4_dense_tflops: Figure
    fp8_dense_tflops: Figure
    bf16_dense_tflops: Figure
    pcie: PcieFigure
    max_w: Figure
    # the SM clock's maximum, published: what a fleet whose exporter does not send DCGM_FI_DEV_MAX_SM_CLOCK reads
    max_sm_clock_mhz: Figure | None = None
    peer_link_gbps: Figure | None = None  # peak GPU-to-GPU bandwidth over all the GPU's links (XGMI on Instinct)
    memory_bound_draw_w: MeasuredFigure | None = None  # W drawn on memory-bound work flat out, where measured
    power_curve: PowerCurve | None = None  # draw against arithmetic intensity, where measured


class GpuTable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = 1
    memory_bound_fallback: Fallback
    gpus: list[GpuModel]


@lru_cache(maxsize=4)
def gpu_table(path: str = str(GPU_TABLE)) -> GpuTable:
    """The table, validated; a bad file raises LoadError with positioned errors."""
    try:
        doc = yamlpos.load(path)
    except yamlpos.SourceError as exc:
        raise LoadError([exc]) from None
    try:
        return GpuTable.model_validate(doc.data)
    except ValidationError as exc:
        raise LoadError(schema_errors(doc, exc)) from None


def gpu_model(name: str | None, table: GpuTable | None = None) -> GpuModel | None:
    """The table row whose `match` is a substring of the reported name (first row wins)."""
    if not name:
        return None
    for g in (table or gpu_table()).gpus:
        if any(m.lower() in name.lower() for m in g.match):
            return g
    return None
