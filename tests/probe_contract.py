"""Every built-in probe, run for real on a simulated host: the evidence the contract test checks.

Short windows (a second or two) with the scenario's load running, as a runbook samples `under_load`;
the sweep drives its own load afterwards, as it does in a run.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

import httpx

from gpu_runbook.evidence import Evidence
from gpu_runbook.load import LoadConfig, LoadGenerator
from gpu_runbook.probe import Context
from gpu_runbook.registry import Registry
from gpu_runbook.sim.host import SimulatedHost

# SGLang releases the simulator models, each with its layout of /server_info and /metrics
# (shared/reference/sglang-versions.md), plus a dev build and a host with dcgm-exporter.
SCENARIOS = (
    "admin-power-cap",  # 0.5.5.post3
    "fp8-kv-checkpoint",  # 0.5.9
    "seed-rtx-pro-6000-tp8",  # 0.5.10
    "tp2-kvm-guest",  # 0.5.13
    "healthy-h200-nvlink",  # 0.5.23
    "dev-build-version",  # 0.0.0.dev0
    "dcgm-exporter-30s",  # 0.5.10, dcgm-exporter beside it
)

UNDER_LOAD = {
    "gpu.sample": {"duration_s": 1.0, "interval_s": 0.25},
    "gpu.activity": {"duration_s": 0.5},
    "gpu.dcgm": {"duration_s": 1.0, "interval_s": 0.5},
    "sglang.metrics": {"duration_s": 2.0, "interval_s": 1.0},
    "sglang.profile": {"num_steps": 1, "wait_s": 10.0},
}
AFTER_LOAD = {"sglang.sweep": {"levels": [1, 8], "seconds_per_level": 1.0, "input_len": 32, "output_len": 64}}


async def _one(probe: Any, ctx: Context, params: dict[str, Any]) -> Evidence:
    return await probe.run(ctx, probe.Params.model_validate(params))


async def run_builtin(scenario: str, registry: Registry) -> dict[str, Evidence]:
    """probe name -> the evidence it returned on this simulated host."""
    builtin = {name: cls for name, cls in registry.probes.items() if cls.__module__.startswith("gpu_runbook.probes.")}
    out: dict[str, Evidence] = {}
    with SimulatedHost.start(scenario) as host, tempfile.TemporaryDirectory() as tmp:
        target = host.target()
        async with httpx.AsyncClient() as http:
            load = LoadGenerator(target, LoadConfig(concurrency=32, input_len=64, output_len=512), client=http)
            ctx = Context(target=target, http=http, nvml=host.nvml, load=load)
            await load.start()
            try:
                now = {n: c for n, c in builtin.items() if n not in AFTER_LOAD}
                params = {n: {**UNDER_LOAD.get(n, {}), **({"output_dir": tmp} if n == "sglang.profile" else {})} for n in now}
                results = await asyncio.gather(*(_one(c(), ctx, params[n]) for n, c in now.items()))
                out.update(zip(now, results))
            finally:
                await load.stop()
            for name, p in AFTER_LOAD.items():
                if name in builtin:
                    out[name] = await _one(builtin[name](), Context(target=target, http=http, nvml=host.nvml), p)
    return out
