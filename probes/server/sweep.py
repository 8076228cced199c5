"""The concurrency sweep, for every server family: load at increasing concurrency through the load generator,
the family's metrics read per level, and where (and from the batch metrics, why) throughput stops scaling."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from gpu_runbook.plugin import Context, Evidence, Probe, Table
from pydantic import BaseModel, ConfigDict, Field

from .http import ProbeError, as_evidence
from .values import SweepValues
from .window import KV_USAGE, QUEUED, RUNNING, Snapshot, stats


class LoadSweep(Probe):
    """Load at increasing concurrency; where throughput stops scaling and, from /metrics, why. A family's sweep
    says how to read its scheduler's cap (`running_cap`) and scrape its /metrics (`scrape`).

    The values are declared in `SweepValues` (probes/server/values.py); `gpu_power` (default true) adds
    the GPU draw per level, `gpus` limits it to the server's GPUs.
    """

    drives_load = True  # the runner shows live GPU and server readings while the levels run
    needs = "sweep"
    role = "server.sweep"
    description = "Throughput and latency at increasing concurrency, and what stops the scaling"
    metrics_hint = "is /metrics enabled on the server?"  # what to do where a flat curve has no metrics to say why
    Values = SweepValues
    default_timeout_s = 60.0

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        levels: list[int] = Field(default_factory=lambda: [1, 4, 16, 64, 256, 1024])
        max_concurrency: int | None = None
        seconds_per_level: float = Field(10.0, gt=0, le=600)
        input_len: int = Field(256, ge=1)
        output_len: int = Field(256, ge=1)
        endpoint: Literal["generate", "completions"] = "generate"
        metrics_interval_s: float = Field(1.0, gt=0, le=600)
        gpu_power: bool = True  # also read GPU power per level through NVML: "compute-bound" needs it
        gpus: list[int] = Field(default_factory=list)  # NVML indices of the server's GPUs (empty: every GPU)

    async def running_cap(self, ctx: Context) -> int | None:
        """The scheduler's running-request cap (None: not reported); a ProbeError when the server does not answer."""
        raise NotImplementedError

    async def scrape(self, ctx: Context, t: float, timeout_s: float) -> Snapshot:
        """One scrape of the family's /metrics, under the concept names (probes/server/window.py)."""
        raise NotImplementedError

    def _levels(self, params: LoadSweep.Params) -> list[int]:
        lv = sorted({c for c in params.levels if c >= 1 and (params.max_concurrency is None or c <= params.max_concurrency)})
        return lv or [1]

    def timeout_s(self, params: BaseModel) -> float:
        p: LoadSweep.Params = params  # type: ignore[assignment]
        return self.default_timeout_s + len(self._levels(p)) * (p.seconds_per_level + 15)

    async def run(self, ctx: Context, params: LoadSweep.Params) -> Evidence:
        from gpu_runbook.load import LoadConfig, LoadGenerator

        try:
            cap = await self.running_cap(ctx)
        except ProbeError as e:
            return as_evidence(e)
        metrics_ok = True
        try:
            await self.scrape(ctx, 0.0, 5)
        except ProbeError as e:
            metrics_ok = False
            ctx.log(f"{self.name}: no metrics ({e.reason}); the limit will be unknown")
        levels: list[dict[str, Any]] = []
        unread: list[int] = []  # levels whose completed requests streamed no token the client could count
        read_power = params.gpu_power and await gpu_draw(ctx, params.gpus) is not None  # ask NVML once, not per scrape
        for k, c in enumerate(self._levels(params), 1):
            ctx.progress({"level": k, "levels": len(self._levels(params)), "concurrency": c})
            cfg = LoadConfig(endpoint=params.endpoint, concurrency=c, input_len=params.input_len, output_len=params.output_len,
                             request_timeout_s=max(30.0, params.seconds_per_level * 3))  # fmt: skip  (stopped by the loop below, after admission)
            gen = LoadGenerator(ctx.target, cfg)
            snaps: list[Snapshot] = []
            draws: list[float] = []
            t0 = time.perf_counter()
            tokens_at: list[tuple[float, int]] = []
            try:  # from the start: a timeout or Ctrl-C during the ramp must stop the streams too
                await gen.start()
                await gen.until_streaming(limit_s=max(30.0, params.seconds_per_level * 3))
                # measure once the server has admitted what it will (prefill admits a chunk at a time)
                await gen.until_admitted(limit_s=max(60.0, params.seconds_per_level * 6))
                t0 = time.perf_counter()
                tokens_at.append((0.0, gen.stats().output_tokens))
                while not gen.done and time.perf_counter() - t0 < params.seconds_per_level:
                    if metrics_ok:
                        try:
                            snaps.append(await self.scrape(ctx, time.perf_counter() - t0, 5))
                        except ProbeError as e:
                            ctx.log(f"{self.name}: scrape failed: {e.reason}")
                    tokens_at.append((time.perf_counter() - t0, gen.stats().output_tokens))
                    if read_power and time.perf_counter() - t0 >= params.seconds_per_level * 0.4:
                        reading = await gpu_draw(ctx, params.gpus)
                        if reading is not None:
                            draws.append(reading)
                    await asyncio.sleep(min(params.metrics_interval_s, max(0.0, params.seconds_per_level - (time.perf_counter() - t0))))
            finally:
                tokens_at.append((time.perf_counter() - t0, gen.stats().output_tokens))
                rep = await gen.stop()
            if rep.completed and not rep.completed_output_tokens:
                unread.append(c)
            # Skip the ramp: judge the batch from the second half of the level.
            steady = [s for s in snaps if s.t >= params.seconds_per_level * 0.4] or snaps

            def col(name: str) -> list[float]:
                return [s.gauges[name] for s in steady if name in s.gauges]

            run_, que, tu = stats(col(RUNNING)), stats(col(QUEUED)), stats(col(KV_USAGE))
            # Tokens/s over the steady part (after the ramp and the first 40% of the level), not the whole level.
            mid = next((p for p in tokens_at if p[0] >= params.seconds_per_level * 0.4), tokens_at[0])
            end = tokens_at[-1]
            steady_rate = (end[1] - mid[1]) / (end[0] - mid[0]) if end[0] > mid[0] else rep.output_tokens_per_s
            # the same figure as the table's: steady state, the level's last 60%
            ctx.log(f"{self.name}: concurrency {c}: {steady_rate:,.0f} output tok/s (steady state)")
            levels.append({
                "concurrency": c,
                "output_tokens_per_s": round(steady_rate, 2),
                "request_throughput": rep.request_throughput,
                "completed": rep.completed,
                "errors": rep.failed,
                "ttft_p50_ms": rep.ttft_ms.p50, "ttft_p99_ms": rep.ttft_ms.p99,
                "itl_p50_ms": rep.itl_ms.p50, "itl_p99_ms": rep.itl_ms.p99,
                "tpot_p50_ms": rep.tpot_ms.p50, "e2e_p50_ms": rep.e2e_ms.p50,
                "running_mean": run_["mean"], "running_max": run_["max"],
                "queue_mean": que["mean"], "queue_max": que["max"],
                "token_usage_mean": tu["mean"], "token_usage_max": tu["max"],
                "gpu_draw_to_max": round(sum(d[0] for d in draws) / len(draws), 4) if draws else None,
                "gpu_draw_w": round(sum(d[1] for d in draws) / len(draws), 1) if draws else None,
                "client_cpu_share": rep.client_cpu_share,
            })  # fmt: skip
        values: dict[str, Any] = {"levels": levels, "max_running_requests": cap, "metrics_available": metrics_ok,
                                  "server_kind": self.server_kind}  # fmt: skip
        values.update(diagnose(levels, cap, metrics_ok, self.metrics_hint))
        at = next((lv for lv in levels if lv["concurrency"] == values.get("plateau_concurrency")), levels[-1] if levels else {})
        values["draw_to_max_at_plateau"] = at.get("gpu_draw_to_max")
        values["draw_w_at_plateau"] = at.get("gpu_draw_w")
        values["gpu_power_available"] = any(lv["gpu_draw_to_max"] is not None for lv in levels)
        # One Python process streams every request: near a full core, the client, not the server, sets the pace.
        values["client_saturated"] = any((lv["client_cpu_share"] or 0.0) >= CLIENT_SATURATED for lv in levels)
        if values["client_saturated"]:
            ctx.log(f"{self.name}: the load generator used most of a CPU core; throughput at the top levels may be the client's limit")
        if unread:  # every request asks for output_len >= 1 tokens: completed with none counted = a stream not understood
            return Evidence.failed(f"requests completed at concurrency {unread} with no output token counted in their streams (a stream format the client does not read)", values=values)
        if all(lv["errors"] and not lv["completed"] and not lv["output_tokens_per_s"] for lv in levels):
            return Evidence.failed(f"every level failed to generate (errors at all {len(levels)} levels)", values=values)
        rows = [[lv["concurrency"], lv["output_tokens_per_s"], lv["ttft_p50_ms"], lv["itl_p50_ms"], lv["running_mean"],
                 lv["queue_mean"], lv["token_usage_max"], lv["gpu_draw_to_max"], lv["errors"]] for lv in levels]  # fmt: skip
        table = Table(title="concurrency sweep", columns=["concurrency", "out tok/s", "TTFT p50 ms", "ITL p50 ms", "running",
                                                          "queued", "token usage max", "GPU draw/max", "errors"], rows=rows)  # fmt: skip
        summary = f"peak {values['peak_output_tokens_per_s']} tok/s at {values['peak_concurrency']}; limit: {values['limit']} ({values['limit_reason']})"
        return Evidence(summary=summary, values=values, blocks=[table])


CLIENT_SATURATED = 0.85  # share of one core
KV_RESERVED_USAGE = 0.8  # KV token usage from which a queue is held by the KV cache (reservations, not only a full pool)


async def gpu_draw(ctx: Context, gpus: list[int] | None = None) -> tuple[float, float] | None:
    """(mean draw / board maximum, mean draw in W) of the server's GPUs now, or None where NVML cannot say."""

    from gpu_runbook.nvml import open_devices

    def read(nv: Any) -> tuple[float, float] | None:
        ratios, watts = [], []
        for dev in open_devices(nv).devices:  # a GPU NVML refuses (NoPermission, lost) is left out, not fatal
            if gpus and dev.index not in gpus:
                continue
            try:
                top = nv.nvmlDeviceGetPowerManagementLimitConstraints(dev.handle)[1]
                if top:
                    mw = nv.nvmlDeviceGetPowerUsage(dev.handle)
                    ratios.append(mw / top)
                    watts.append(mw / 1000.0)
            except nv.NVMLError:
                continue
        return (sum(ratios) / len(ratios), sum(watts) / len(watts)) if ratios else None

    try:
        return await ctx.nvml.call(read)
    except Exception:  # noqa: BLE001 - no NVML means no power column, not a failed sweep
        return None


def diagnose(levels: list[dict[str, Any]], cap: int | None, metrics_ok: bool, metrics_hint: str = "") -> dict[str, Any]:
    """Where throughput stops scaling and, from the batch metrics at the top level, why."""
    tputs = [lv["output_tokens_per_s"] or 0.0 for lv in levels]
    peak = max(tputs) if tputs else 0.0
    i_peak = tputs.index(peak) if tputs else 0
    out: dict[str, Any] = {"peak_output_tokens_per_s": peak, "peak_concurrency": levels[i_peak]["concurrency"] if levels else None}
    i_plat = next((i for i, t in enumerate(tputs) if peak and t >= 0.9 * peak), len(tputs) - 1)
    if peak <= 0:
        return {**out, "plateau_concurrency": None, "limit": "unknown", "limit_reason": "no tokens were generated"}
    top = levels[-1]
    if i_plat == len(levels) - 1:
        # Still rising by the 10% rule; but a queue at the top level with the batch pinned still names the wall
        # (short levels on a busy host can make a flat curve look like it is rising).
        pinned = diagnose_top(top, cap, levels) if metrics_ok and top.get("queue_mean") is not None else None
        if pinned is None or pinned["limit"] == "unknown":
            return {**out, "plateau_concurrency": None, "limit": "none",
                    "limit_reason": f"throughput still rising at the highest level ({top['concurrency']})"}  # fmt: skip
        # the server's batch stopped growing where it first reached the top level's: that is the plateau, measured
        # by the server; a throughput still "rising" past it is the client's noise, not more work done per step
        batch = top.get("running_max") or 0.0
        first = next((lv for lv in levels if (lv.get("running_max") or 0.0) >= 0.95 * batch), top)
        return {**out, "plateau_concurrency": first["concurrency"], **pinned}
    out["plateau_concurrency"] = levels[i_plat]["concurrency"]
    if not metrics_ok or top["queue_mean"] is None:
        return {**out, "limit": "unknown", "limit_reason": "throughput flat but no /metrics to say why" + (f" ({metrics_hint})" if metrics_hint else "")}
    return {**out, **diagnose_top(top, cap, levels, plateau=out["plateau_concurrency"])}


def diagnose_top(top: dict[str, Any], cap: int | None, levels: list[dict[str, Any]], plateau: int | None = None) -> dict[str, Any]:
    """Why the batch stops growing, from the queue, KV usage and running count at the top level."""
    out: dict[str, Any] = {}
    c = top["concurrency"]
    queued = top["queue_mean"] >= max(1.0, 0.05 * c)
    usage = top["token_usage_max"] or 0.0
    running = top["running_max"] or 0.0
    if queued and cap and running >= 0.95 * cap:
        return {**out, "limit": "running-requests-cap", "limit_reason": (
            f"running requests pinned at the scheduler's cap of {cap} with KV token usage only {usage:.2f} "
            f"while {top['queue_mean']:.0f} wait")}  # fmt: skip
    # A scheduler that admits against the running requests' remaining tokens (SGLang's new_token_ratio) shows a
    # queue held by the KV cache from ~0.8 usage (reservations), not only near 1.0 (sglang-versions.md §9, §10)
    if queued and usage >= KV_RESERVED_USAGE:
        return {**out, "limit": "kv-cache", "limit_reason": (
            f"at concurrency {c} about {top['queue_mean']:.0f} requests wait while KV token usage reaches {usage:.2f}: "
            f"the KV cache holds only ~{running:.0f} running requests")}  # fmt: skip
    pinned = len(levels) >= 2 and levels[-2]["running_max"] == top["running_max"]
    if queued and pinned and cap and running < 0.95 * cap:
        # requests wait, the batch is the same at the top two levels and far below the scheduler's cap: the only
        # other bound on admission is the KV cache (its reservations for the running requests' remaining tokens)
        return {**out, "limit": "kv-cache", "limit_reason": (
            f"running requests stay at {running:.0f} across the top levels, far below the cap of {cap}, while "
            f"{top['queue_mean']:.0f} wait (KV token usage {usage:.2f}: the KV cache's reservations hold admission)")}  # fmt: skip
    if queued and usage < KV_RESERVED_USAGE and pinned and not cap:
        return {**out, "limit": "running-requests-cap", "limit_reason": (
            f"running requests stay at {running:.0f} across the top levels with KV token usage {usage:.2f} while "
            f"{top['queue_mean']:.0f} wait (the cap is not reported; it looks like a running-request cap)")}  # fmt: skip
    return {**out, "limit": "unknown", "limit_reason": (
        f"throughput flat from concurrency {plateau} with {top['queue_mean']:.0f} queued and KV usage "
        f"{usage:.2f}: the step time grows with the batch (compute or communication bound)")}  # fmt: skip
