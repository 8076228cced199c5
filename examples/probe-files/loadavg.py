"""`host.loadavg`: is the CPU side of the server saturated? (tokenizer and scheduler are CPU work)"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict

from gpu_runbook.plugin import Context, Evidence, Probe, Table, Values, value


class LoadAvgParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    per_cpu: bool = True  # divide by the number of CPUs


class LoadAvgValues(Values):
    load_1m: float = value("runnable tasks, mean over 1 minute (per CPU when per_cpu)", unit="tasks", default=...)
    load_5m: float = value("the same over 5 minutes", unit="tasks", default=...)
    load_15m: float = value("the same over 15 minutes", unit="tasks", default=...)
    cpus: int = value("CPUs the OS reports", default=...)


class LoadAverage(Probe):
    name = "host.loadavg"
    description = "The 1, 5 and 15 minute load averages"
    Params = LoadAvgParams
    Values = LoadAvgValues

    async def run(self, ctx: Context, params: LoadAvgParams) -> Evidence:
        try:
            one, five, fifteen = os.getloadavg()
        except OSError:
            return Evidence.unavailable("this platform has no load average")
        cpus = os.cpu_count() or 1
        scale = cpus if params.per_cpu else 1
        values = {"load_1m": one / scale, "load_5m": five / scale, "load_15m": fifteen / scale, "cpus": cpus}
        table = Table(title="Load average", columns=["window", "load"], rows=[["1m", one], ["5m", five], ["15m", fifteen]])
        return Evidence(summary=f"load {one:.2f} {five:.2f} {fifteen:.2f} on {cpus} CPUs", values=values, blocks=[table])
