"""A probe for the load window's tests: it runs once the warm-up has ended, tells the test server so
(GET /gate opens the gate the streams wait at), then waits until the load's requests are done."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict

from gpu_runbook.evidence import Evidence
from gpu_runbook.probe import Context, Probe


class GateParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit_s: float = 30.0


class OpenGateProbe(Probe):
    name = "test.open_gate"
    description = "opens the test server's gate, then waits for the load to finish (engine tests)"
    Params = GateParams
    default_timeout_s = 60.0

    async def run(self, ctx: Context, params: GateParams) -> Evidence:
        assert ctx.load is not None, "runs under load"
        seen = ctx.load.stats()  # what the load had counted when the warm-up ended
        await ctx.http.get(ctx.target.sglang_url + "/gate")
        await asyncio.wait_for(ctx.load.wait(), params.limit_s)
        return Evidence(summary="gate opened", values={"tokens_at_start": seen.output_tokens, "completed_at_start": seen.completed})
