"""A GPU's own power curve, measured on the host by `runbook calibrate`: the file, where it lives, how it is found.

What a well-fed GPU draws depends on the arithmetic intensity of its work (FLOPs per byte of weights read):
an H200 decoding bf16 at batch 1 draws ~517-534 W, at batch 64 its 700 W limit (shared/reference/nvml.md §5.x).
It also depends on the bits moved: the same H200 copying randn bf16 drew 556 W, zeros 404 W, uniform random
bytes 609 W, so `runbook calibrate` moves weight-like data (randn) in every load. A figure measured once, elsewhere, may not hold for this board, driver,
power limit or cooling, so `runbook calibrate` measures this GPU and `gpu.reference` prefers that curve.

The file is JSON, one per GPU model, board, driver and power limit, in the user's configuration directory
(`$XDG_CONFIG_HOME/gpu-runbook/calibration/`). A simulated run never reads it unless it is named.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

FORMAT = 1
LoadKind = Literal["copy", "decode-gemm", "compute-gemm"]
# bytes a weight takes in memory, per dtype a GEMM reads (FP4's block scales: one FP8 scale per 16 weights)
# (NVFP4: one FP8 scale per 16 weights; MXFP4: one 8-bit scale per 32; int4 AWQ/GPTQ: an fp16 scale and zero per 128)
WEIGHT_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5 + 1 / 16,
                                  "mxfp4": 0.5 + 1 / 32, "int4": 0.5 + 4 / 128}  # fmt: skip


def flops_per_byte(rows: float, dtype: str) -> float:
    """Arithmetic intensity of a GEMM of `rows` tokens over weights of `dtype`: 2 x rows FLOPs per weight read."""
    return 2.0 * rows / WEIGHT_BYTES[dtype]


class CalibrationError(Exception):
    """A calibration file that cannot be read: the message names the file and the field."""


class LoadPoint(BaseModel):
    """One load run alone on the idle GPU, with what NVML read beside it (medians over the samples kept)."""

    model_config = ConfigDict(extra="forbid")
    kind: LoadKind
    dtype: str | None = None  # the weights' dtype of a GEMM (None for the copy)
    batch: int | None = None  # rows of a decode-shaped GEMM
    flops_per_byte: float = Field(ge=0, allow_inf_nan=False)  # 0 for the copy: it computes nothing
    draw_w: float = Field(gt=0, allow_inf_nan=False)  # median power draw
    draw_p95_w: float | None = None
    sm_mhz: float | None = None
    mem_mhz: float | None = None
    util_pct: float | None = None
    # share of samples (0-1) with each clock event reason active, only the reasons seen
    clock_event_reasons: dict[str, float] = Field(default_factory=dict)
    gbps: float | None = None  # bytes moved per second (the copy: read + written; a GEMM: its weights read)
    tflops: float | None = None
    seconds: float | None = None  # how long it ran
    samples: int | None = None


class Calibration(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: int = FORMAT
    gpu_name: str
    board_part_number: str | None = None
    serial: str | None = None
    driver_version: str | None = None
    power_limit_w: float | None = None  # the enforced limit it was measured at
    host: str | None = None
    measured_at: str  # ISO 8601, UTC
    gpu_index: int | None = None
    library: str | None = None  # what ran the loads (e.g. "torch 2.11.0+cu128")
    loads: list[LoadPoint] = Field(min_length=1)

    def curve(self) -> list[tuple[float, float]]:
        """(FLOPs per byte, draw W) by intensity: the GEMMs' points (loads of one intensity averaged, bf16 at batch 64
        with FP8 at 32), from a floor at 0 that is the lowest draw measured. The copy is not a GEMM, and with
        weight-like data it can draw more than a batch-1 GEMM (an H200: 556 W against 534 W), so it sets the floor
        only where it is the lowest."""
        by_x: dict[float, list[float]] = {}
        for p in self.loads:
            if p.kind != "copy":
                by_x.setdefault(p.flops_per_byte, []).append(p.draw_w)
        points = sorted((x, round(sum(ys) / len(ys), 1)) for x, ys in by_x.items())
        floor = min(p.draw_w for p in self.loads)
        return points if points and points[0][0] == 0 else [(0.0, floor), *points]

    def spans_decode(self) -> str | None:
        """Why this curve cannot stand in for the table's (None: it can): it must hold decode GEMMs from batch 1
        (<= 2 FLOPs a byte) up to where a GPU reaches its limit (>= 64; an H200 at bf16 batch 64), or reading it at
        a run's batch would fall on a line drawn across what was never measured."""
        xs = [p.flops_per_byte for p in self.loads if p.kind == "decode-gemm"]
        if len(xs) < 2 or min(xs) > 2 or max(xs) < 64:
            have = f"{min(xs):g}-{max(xs):g} FLOPs a byte" if xs else "no decode GEMM"
            return f"it holds {have}; a yardstick needs decode GEMMs from 2 or less to 64 or more (runbook calibrate's default batches)"
        return None

    @property
    def copy_draw_w(self) -> float | None:
        return next((p.draw_w for p in self.loads if p.kind == "copy"), None)

    def describe(self) -> str:
        """Where the curve comes from, in one line: what a report's reader needs to trust it."""
        board = f", board {self.board_part_number}" if self.board_part_number else ""
        driver = f", driver {self.driver_version}" if self.driver_version else ""
        limit = f", {self.power_limit_w:g} W limit" if self.power_limit_w else ""
        host = f" on {self.host}" if self.host else ""
        return f"runbook calibrate: {self.gpu_name}{board}{driver}{limit}{host}, {self.measured_at[:10]} ({len(self.loads)} loads)"


def default_dir() -> Path:
    """`$XDG_CONFIG_HOME/gpu-runbook/calibration` (XDG: ~/.config when unset or not absolute)."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "gpu-runbook" / "calibration"


def file_name(cal: Calibration) -> str:
    """One file per GPU model, board, driver and limit: a new calibration of the same replaces the old."""
    parts = [cal.gpu_name, cal.board_part_number or "", cal.driver_version or "", f"{cal.power_limit_w:g}w" if cal.power_limit_w else ""]
    slug = re.sub(r"[^a-z0-9.]+", "-", " ".join(p for p in parts if p).lower()).strip("-")
    return f"{slug or 'gpu'}.json"


def save(cal: Calibration, path: str | Path | None = None) -> Path:
    """Write it (to `path`, a file or directory; default `default_dir()`), atomically; the path written."""
    target = Path(path) if path is not None else default_dir()
    if target.suffix != ".json":
        target = target / file_name(cal)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(cal.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return target


def read(path: str | Path) -> Calibration:
    """One calibration file; a bad one raises CalibrationError naming the file and the field."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CalibrationError(f"{p}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise CalibrationError(f"{p}: not JSON ({str(exc)[:120]})") from None
    try:
        cal = Calibration.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise CalibrationError(f"{p}: {where}: {err['msg']}") from None
    if cal.format != FORMAT:
        raise CalibrationError(f"{p}: format: {cal.format} is not a format this runbook reads ({FORMAT})")
    return cal


def find(location: str | Path, gpu_name: str | None, power_limit_w: float | None = None) -> tuple[Calibration | None, list[str]]:
    """The newest calibration at `location` (a file, or a directory of them) for this GPU model, measured at
    this power limit (within 1 W) where the limit is known; and the files that could not be read, said why."""
    if not gpu_name:
        return None, []
    p = Path(location)
    files = [p] if p.is_file() else sorted(p.glob("*.json")) if p.is_dir() else []
    problems: list[str] = []
    found: list[Calibration] = []
    for f in files:
        try:
            cal = read(f)
        except CalibrationError as exc:
            problems.append(str(exc))
            continue
        if cal.gpu_name.strip().lower() != gpu_name.strip().lower():
            continue
        if power_limit_w and cal.power_limit_w and abs(cal.power_limit_w - power_limit_w) > 1.0:
            continue
        found.append(cal)
    return (max(found, key=lambda c: c.measured_at) if found else None), problems
