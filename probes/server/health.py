"""`/health`, for every server family: SGLang and vLLM both answer 200 while the engine is alive."""

from __future__ import annotations

import time

from gpu_runbook.fetch import FetchError, fetch
from gpu_runbook.plugin import Context, Evidence, Probe
from pydantic import BaseModel, ConfigDict, Field

from .http import as_evidence, fetch_error
from .values import HealthValues


class HealthProbe(Probe):
    """`/health` with a timeout (it runs a 1-token generation, up to ~20 s on a hung GPU).

    values: declared in `HealthValues` (probes/server/values.py); on timeout (failed): healthy false, timed_out true.
    """

    role = "server.health"
    Values = HealthValues
    default_timeout_s = 40.0

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        request_timeout_s: float = Field(25.0, gt=0, le=600)

    async def run(self, ctx: Context, params: HealthProbe.Params) -> Evidence:
        base = ctx.target.server_url.rstrip("/")
        t0 = time.perf_counter()
        try:
            r = await fetch(ctx.http, base + "/health", headers=ctx.target.auth_headers(), timeout_s=params.request_timeout_s)
        except FetchError as e:
            if e.kind == "timeout":
                return Evidence.failed(
                    f"/health did not answer within {params.request_timeout_s:g} s (hung scheduler or GPU?)",
                    values={"healthy": False, "timed_out": True, "latency_ms": round(params.request_timeout_s * 1000, 1)},
                )
            return as_evidence(fetch_error(e, base, "/health", params.request_timeout_s))
        ms = round((time.perf_counter() - t0) * 1000, 1)
        healthy = r.status_code == 200
        values = {"healthy": healthy, "status_code": r.status_code, "latency_ms": ms}
        return Evidence(summary=f"/health {r.status_code} in {ms} ms" + ("" if healthy else " (unhealthy)"), values=values)

