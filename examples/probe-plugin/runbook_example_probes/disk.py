"""`example.disk`: free space where the model weights live (a full disk stalls checkpoint loads)."""

from __future__ import annotations

import shutil

from pydantic import BaseModel, ConfigDict

from gpu_runbook.plugin import Context, Evidence, Probe, Values, value


class DiskParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = "/"


class DiskValues(Values):
    path: str = value("the path asked about", default=...)
    total_gb: float = value("size of its filesystem", unit="GB", default=...)
    free_gb: float = value("free space on it", unit="GB", default=...)
    free_fraction: float = value("free / total, 0..1", default=...)


class DiskSpace(Probe):
    name = "example.disk"
    description = "Free disk space at a path"
    Params = DiskParams
    Values = DiskValues

    async def run(self, ctx: Context, params: DiskParams) -> Evidence:
        try:
            usage = shutil.disk_usage(params.path)
        except OSError as exc:
            return Evidence.unavailable(f"{params.path}: {exc.strerror}")
        values = {
            "path": params.path,
            "total_gb": usage.total / 1e9,
            "free_gb": usage.free / 1e9,
            "free_fraction": usage.free / usage.total if usage.total else 0.0,
        }
        return Evidence(summary=f"{values['free_gb']:.1f} GB free of {values['total_gb']:.1f} GB at {params.path}", values=values)
