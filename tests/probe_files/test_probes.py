"""Probes for the engine's own tests: they return what they are told, after a delay, or fail."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpu_runbook.plugin import Bars, Context, Evidence, Probe, Series, Table, Values, value

CALLS: list[dict[str, Any]] = []  # every run, with start/end times: tests read it


class ValueParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    values: dict[str, Any] = Field(default_factory=dict)
    delay_s: float = 0.0
    tag: str = ""


class ValueProbe(Probe):
    """Returns `values` after `delay_s`, recording when it ran and whether load was running."""

    name = "test.value"
    description = "returns the values it is given (engine tests)"
    Params = ValueParams

    async def run(self, ctx: Context, params: ValueParams) -> Evidence:
        entry = {"tag": params.tag, "start": time.monotonic(), "load": ctx.load is not None}
        CALLS.append(entry)
        await asyncio.sleep(params.delay_s)
        entry["end"] = time.monotonic()
        blocks = [
            Table(title="values", columns=["name", "value"], rows=[[k, str(v)] for k, v in params.values.items()]),
            Series(title="ramp", unit="W", points=[(i * 0.5, 100.0 + 10 * i) for i in range(8)]),
            Bars(title="power", unit="W", bars=[("GPU0", 235.0, 600.0), ("GPU1", 240.0, 600.0)]),
        ]
        return Evidence(summary=f"{len(params.values)} values", values=params.values, blocks=blocks)


class PowerStats(Values):
    mean: float = value(default=..., unit="W")
    max: float = value(default=..., unit="W")


class GpuRow(Values):
    index: int = value(default=...)
    power_w: float | None = value("board power", unit="W")


class DeclaredValues(Values):
    power: PowerStats | None = value("board power over the window", unit="W")
    gpus: list[GpuRow] = value(default=...)
    reasons: dict[str, float] = value("share of samples each reason was active", default=...)
    label: str = value(default=...)


class DeclaredProbe(Probe):
    """Declares its values, as a third-party probe may: `validate` checks rules' paths against them."""

    name = "test.declared"
    description = "returns fixed values it declares (engine tests)"
    Values = DeclaredValues

    async def run(self, ctx: Context, params: Any) -> Evidence:
        values = {"power": {"mean": 235.0, "max": 241.0}, "gpus": [{"index": 0, "power_w": 235.0}, {"index": 1, "power_w": None}],
                  "reasons": {"sw_power_cap": 0.0}, "label": "x"}  # fmt: skip
        return Evidence(summary="declared", values=values)


class FailParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str = "boom"


class FailProbe(Probe):
    name = "test.fail"
    description = "raises (engine tests)"
    Params = FailParams

    async def run(self, ctx: Context, params: FailParams) -> Evidence:
        raise RuntimeError(params.message)


class UnavailableProbe(Probe):
    name = "test.unavailable"
    description = "reports unavailable (engine tests)"

    async def run(self, ctx: Context, params: Any) -> Evidence:
        return Evidence.unavailable("NVMLError_LibraryNotFound: NVML Shared Library Not Found")


class SleepParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = 10.0


class SleepProbe(Probe):
    name = "test.sleep"
    description = "sleeps (engine tests: timeouts and cancellation)"
    Params = SleepParams
    default_timeout_s = 60.0

    async def run(self, ctx: Context, params: SleepParams) -> Evidence:
        await asyncio.sleep(params.seconds)
        return Evidence(summary="slept", values={"slept_s": params.seconds})
