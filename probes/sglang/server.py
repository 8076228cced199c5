"""SGLang probes: server configuration, health, metrics over a window, and a concurrency sweep.

SGLang's own words live here: /server_info and its fields per release, the `sglang:` series and how ranks export
them. Each is filed under the concept it fills (probes/server/window.py); the window maths are shared.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from gpu_runbook.fetch import FetchError, check_lines
from gpu_runbook.plugin import Context, Evidence, Probe, Series, Table, downsample
from pydantic import BaseModel, ConfigDict

from ..server import window as w
from ..server.health import HealthProbe
from ..server.http import (
    NotFound,
    ProbeError,
    as_evidence,
    get,
    get_json,
    get_json_fallback,
)
from ..server.sweep import LoadSweep
from ..server.values import MetricsValues
from ..server.window import Snapshot, WindowParams, age_note, summarize_window
from .config import config_concepts
from .values import SglangServerValues


async def server_info(ctx: Context, timeout_s: float = 10.0) -> tuple[dict[str, Any], str]:
    body, path = await get_json_fallback(ctx, ("/server_info", "/get_server_info"), timeout_s)
    if not isinstance(body, dict):
        raise ProbeError("failed", f"{path} did not return a JSON object")
    return body, path


def effective_max_running_requests(info: dict[str, Any]) -> int | None:
    """The scheduler's cap where the server reports it (0.5.23), else the flag if it was set."""
    states = info.get("internal_states") or []
    per_dp = states[0].get("effective_max_running_requests_per_dp") if isinstance(states, list) and states and isinstance(states[0], dict) else None
    if isinstance(per_dp, (int, float)) and not isinstance(per_dp, bool) and math.isfinite(per_dp):
        return int(per_dp)
    v = info.get("max_running_requests")
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None



SUM_GAUGES = (
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput", "sglang:num_used_tokens",
    "sglang:num_retracted_reqs", "sglang:decode_sum_seq_lens",
)  # fmt: skip
MAX_GAUGES = ("sglang:token_usage", "sglang:max_total_num_tokens", "sglang:cache_hit_rate", "sglang:new_token_ratio")
COUNTERS = (
    "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total", "sglang:cached_tokens_total",
    "sglang:num_retracted_requests_total", "sglang:forward_execution_seconds_total", "sglang:scheduler_idle_seconds_total",
    "sglang:estimated_flops_per_gpu_total", "sglang:estimated_read_bytes_per_gpu_total", "sglang:estimated_write_bytes_per_gpu_total",
)  # fmt: skip
# Counters kept per label value: graph passes per mode (0.5.7+) say which decode steps ran in a CUDA graph.
LABELLED_COUNTERS = {"sglang:cuda_graph_passes_total": "mode"}
HISTOGRAMS = (
    "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds", "sglang:queue_time_seconds",
)  # fmt: skip

# Each SGLang series and the concept it fills (probes/server/window.py).
CONCEPTS = {
    "sglang:num_running_reqs": w.RUNNING, "sglang:num_queue_reqs": w.QUEUED, "sglang:gen_throughput": w.GEN_THROUGHPUT,
    "sglang:num_used_tokens": w.KV_USED_TOKENS, "sglang:num_retracted_reqs": w.RETRACTED_GAUGE,
    "sglang:decode_sum_seq_lens": w.DECODE_SUM_SEQ_LENS, "sglang:token_usage": w.KV_USAGE,
    "sglang:max_total_num_tokens": w.KV_CAPACITY, "sglang:cache_hit_rate": w.CACHE_HIT_RATE_GAUGE,
    "sglang:new_token_ratio": w.NEW_TOKEN_RATIO, "sglang:prompt_tokens_total": w.PROMPT_TOKENS,
    "sglang:generation_tokens_total": w.GENERATION_TOKENS, "sglang:num_requests_total": w.REQUESTS_FINISHED,
    "sglang:cached_tokens_total": w.CACHED_TOKENS, "sglang:num_retracted_requests_total": w.RETRACTIONS,
    "sglang:forward_execution_seconds_total": w.FORWARD_SECONDS, "sglang:scheduler_idle_seconds_total": w.IDLE_SECONDS,
    "sglang:estimated_flops_per_gpu_total": w.EST_FLOPS, "sglang:estimated_read_bytes_per_gpu_total": w.EST_READ_BYTES,
    "sglang:estimated_write_bytes_per_gpu_total": w.EST_WRITE_BYTES, "sglang:cuda_graph_passes_total": w.GRAPH_PASSES,
    "sglang:time_to_first_token_seconds": w.TTFT, "sglang:inter_token_latency_seconds": w.ITL,
    "sglang:e2e_request_latency_seconds": w.E2E, "sglang:queue_time_seconds": w.QUEUE_TIME,
}  # fmt: skip


def parse_metrics(text: str, t: float) -> Snapshot:
    """Parse with prometheus-client and aggregate per-rank series with care.

    Scheduler gauges come per (dp, tp, pp, ep) rank; only attn-tp rank 0 exports by default, but with
    `--enable-metrics-for-all-schedulers` every rank does, so ranks of one DP group are maxed (they
    see the same batch) and DP groups are summed (running, queued, throughput) or maxed (usage).
    """
    from prometheus_client.parser import text_string_to_metric_families

    try:
        check_lines(text, "/metrics")  # a million series would cost minutes and ~1 GB to parse
    except FetchError as e:
        raise ProbeError("failed", e.message) from None
    snap = Snapshot(t=t)
    per_dp: dict[str, dict[str, float]] = {}
    cached_by_source: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                name, labels, value = s.name, s.labels, float(s.value)
                if not math.isfinite(value):  # NaN or +Inf as a sample's value is no count or level (le="+Inf" is a label)
                    continue
                if name in SUM_GAUGES or name in MAX_GAUGES:
                    group = per_dp.setdefault(name, {})
                    dp = labels.get("dp_rank", "0")
                    group[dp] = max(group.get(dp, value), value)
                elif name == "sglang:cached_tokens_total" and "cache_source" in labels:
                    src = labels["cache_source"]
                    cached_by_source[src] = cached_by_source.get(src, 0.0) + value
                elif name in COUNTERS:
                    snap.counters[name] = snap.counters.get(name, 0.0) + value
                elif name in LABELLED_COUNTERS:
                    group = snap.labelled.setdefault(name, {})
                    key = labels.get(LABELLED_COUNTERS[name], "")
                    group[key] = group.get(key, 0.0) + value
                elif name.endswith("_bucket") and name[:-7] in HISTOGRAMS:
                    b = snap.buckets.setdefault(name[:-7], {})
                    le = float(labels["le"])
                    b[le] = b.get(le, 0.0) + value
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise ProbeError("failed", f"malformed metrics text from /metrics: {e}") from e
    if cached_by_source:
        snap.counters["sglang:cached_tokens_total"] = cached_by_source.get("total", sum(cached_by_source.values()))
    for name, group in per_dp.items():
        snap.gauges[name] = sum(group.values()) if name in SUM_GAUGES else max(group.values())
        snap.per_dp[name] = dict(group)
    return _by_concept(snap)


def _by_concept(snap: Snapshot) -> Snapshot:
    """The scrape under the concept names the shared window reads, with each concept's series name kept."""
    out = Snapshot(t=snap.t)
    for src, dst in ((snap.gauges, out.gauges), (snap.counters, out.counters), (snap.labelled, out.labelled),
                     (snap.per_dp, out.per_dp), (snap.buckets, out.buckets)):  # fmt: skip
        for name, value in src.items():
            dst[CONCEPTS.get(name, name)] = value  # type: ignore[index]
            if name in CONCEPTS:
                out.names[CONCEPTS[name]] = name.removeprefix("sglang:")
    return out




async def scrape(ctx: Context, t: float, timeout_s: float) -> Snapshot:
    try:
        r = await get(ctx, "/metrics", timeout_s)
    except NotFound as e:
        raise ProbeError("unavailable", "start the server with --enable-metrics (/metrics answered 404)") from e
    return parse_metrics(r.text, t)



SERVER_KEYS = (
    "version", "tp_size", "pp_size", "dp_size", "ep_size", "quantization", "dtype", "kv_cache_dtype",
    "attention_backend", "prefill_attention_backend", "decode_attention_backend", "moe_runner_backend",
    "disable_cuda_graph", "cuda_graph_max_bs", "disable_radix_cache", "max_running_requests",
    "max_total_num_tokens", "chunked_prefill_size", "mem_fraction_static", "num_continuous_decode_steps",
    "disable_custom_all_reduce", "enable_flashinfer_allreduce_fusion", "enable_metrics", "model_path",
)  # fmt: skip
# Extra keys passed through when present (raw names, including 0.5.23's renamed fields).
EXTRA_KEYS = (
    "served_model_name", "page_size", "context_length", "max_req_input_len", "max_prefill_tokens",
    "schedule_policy", "schedule_conservativeness", "cuda_graph_max_bs_decode", "cuda_graph_max_bs_prefill",
    "flashinfer_allreduce_fusion_backend", "enforce_disable_flashinfer_allreduce_fusion",
    "enable_dp_attention", "attn_dp_size", "moe_a2a_backend", "speculative_algorithm", "enable_torch_compile",
    "enable_mscclpp", "enable_torch_symm_mem", "disable_overlap_schedule", "nnodes",
    "cuda_graph_backend_decode", "cuda_graph_backend_prefill",  # 0.5.23: how CUDA graphs are really switched off
)  # fmt: skip


def server_values(info: dict[str, Any]) -> dict[str, Any]:
    """Contract keys from a server_info body; a field this version lacks stays missing."""
    v: dict[str, Any] = {k: info[k] for k in SERVER_KEYS + EXTRA_KEYS if k in info}
    if "cuda_graph_max_bs" not in v and "cuda_graph_max_bs_decode" in info:
        v["cuda_graph_max_bs"] = info["cuda_graph_max_bs_decode"]  # 0.5.23 renamed it (decode graphs)
    if "flashinfer_allreduce_fusion_backend" in info:
        # 0.5.22+: the flag became a backend choice (the old key is kept and always false); a backend means the fusion is on.
        v["enable_flashinfer_allreduce_fusion"] = info["flashinfer_allreduce_fusion_backend"] not in (None, "", "none")
    eff = effective_max_running_requests(info)
    states = info.get("internal_states") if isinstance(info.get("internal_states"), list) else []
    st = states[0] if states and isinstance(states[0], dict) else {}
    if st.get("effective_max_running_requests_per_dp") is not None:
        v["effective_max_running_requests"] = eff
    if isinstance(st.get("memory_usage"), dict):
        mu = st["memory_usage"]
        for src, dst in (("weight", "weight_memory_gb"), ("kvcache", "kv_cache_memory_gb"), ("token_capacity", "kv_token_capacity")):
            if isinstance(mu.get(src), (int, float)):
                v[dst] = mu[src]
    if isinstance(st.get("last_gen_throughput"), (int, float)):
        v["last_gen_throughput"] = st["last_gen_throughput"]
    return v


class SglangServer(Probe):
    """SGLang's configuration: server info, model info and the served models.

    values: declared in `SglangServerValues` (probes/sglang/values.py): concepts always present, raw flags when
    the server's release reports them.
    """

    name = "sglang.server"
    server_kind, role = "sglang", "server.config"
    Values = SglangServerValues
    prefetch = True
    description = "SGLang server and model configuration (server_info, model_info, /v1/models)"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        request_timeout_s: float = 10.0

    async def run(self, ctx: Context, params: SglangServer.Params) -> Evidence:
        try:
            info, path = await server_info(ctx, params.request_timeout_s)
        except ProbeError as e:
            return as_evidence(e)
        values = server_values(info)
        raw = dict(values)
        values.update(config_concepts(info))
        # the flags as the server reports them (a diff compares these): not a name a concept has taken over
        # with a value of its own (decode_attention_backend falls back to attention_backend when unset)
        values["launch_args"] = [k for k in SERVER_KEYS + EXTRA_KEYS if k in raw and values[k] == raw[k]]
        values["info_endpoint"] = path
        values["server_kind"] = "sglang"
        try:
            mi, _ = await get_json_fallback(ctx, ("/model_info", "/get_model_info"), params.request_timeout_s)
            if isinstance(mi, dict):
                for k in ("model_type", "architectures", "is_generation"):
                    if k in mi:
                        values[k] = mi[k]
        except ProbeError as e:
            ctx.log(f"sglang.server: model info: {e.reason}")
        try:
            models = await get_json(ctx, "/v1/models", params.request_timeout_s)
            data = models.get("data") if isinstance(models, dict) else None
            if isinstance(data, list):
                values["served_models"] = [m.get("id") for m in data if isinstance(m, dict)]
                if data and isinstance(data[0], dict) and data[0].get("max_model_len") is not None:
                    values["max_model_len"] = data[0]["max_model_len"]
        except ProbeError as e:
            ctx.log(f"sglang.server: /v1/models: {e.reason}")
        rows = [[k, values[k]] for k in SERVER_KEYS if k in values]
        cap = values.get("effective_max_running_requests", values.get("max_running_requests"))
        summary = (
            f"SGLang {values.get('version', '?')} serving {values.get('model_path', '?')}: "
            f"TP{values.get('tp_size', '?')} DP{values.get('dp_size', '?')}, "
            f"KV {values.get('max_total_num_tokens', '?')} tokens, max running {cap if cap is not None else 'auto'}"
        )
        return Evidence(summary=summary, values=values, blocks=[Table(title="SGLang server", columns=["field", "value"], rows=rows)])


class SglangMetrics(Probe):
    """SGLang's Prometheus metrics over a window (two or more scrapes of /metrics).

    The values are declared in `MetricsValues` (probes/server/values.py).
    """

    name = "sglang.metrics"
    server_kind, role = "sglang", "server.metrics"
    description = "SGLang /metrics over a window: load, KV usage, throughput, latency quantiles"
    Values = MetricsValues

    Params = WindowParams

    async def run(self, ctx: Context, params: WindowParams) -> Evidence:
        t0 = time.perf_counter()
        n = max(2, int(params.duration_s / params.interval_s) + 1)
        snaps: list[Snapshot] = []
        cut: ProbeError | None = None
        try:
            for i in range(n):
                if i:
                    await asyncio.sleep(max(0.0, t0 + i * params.duration_s / (n - 1) - time.perf_counter()))
                snaps.append(await scrape(ctx, time.perf_counter() - t0, params.request_timeout_s))
        except ProbeError as e:
            if not snaps:
                return as_evidence(e)
            if len(snaps) < 2:
                return as_evidence(ProbeError(e.status, f"only one scrape succeeded: {e.reason}"))
            ctx.log(f"sglang.metrics: stopped early: {e.reason}")
            cut = e
        info: dict[str, Any] = {}
        try:
            info, _ = await server_info(ctx, params.request_timeout_s)
        except ProbeError:
            pass
        values = summarize_window(snaps, sglang_conf(info))
        if cut is not None:  # a window the server stopped answering in is not the window asked for: no verdict on it
            return as_evidence(ProbeError(cut.status, f"the window was cut short after {len(snaps)} of {n} scrapes: {cut.reason}"), values=values)
        blocks = []
        for key, title, unit, concept in (
            (w.RUNNING, "running requests", "req", "running"),
            (w.QUEUED, "queued requests", "req", "queued"),
            (w.KV_USAGE, "KV token usage", "", "kv_usage"),
            (w.GEN_THROUGHPUT, "generation throughput", "tok/s", "gen_throughput"),
        ):
            pts = [(round(s.t, 2), s.gauges[key]) for s in snaps if key in s.gauges]
            if pts:
                # the title stays the plain name (diff and the report find the series by it); the age goes in the label
                series = "sglang:" + snaps[-1].names.get(key, key)
                blocks.append(Series(title=title, unit=unit, label=series + age_note(values["gauge_age"][concept]), points=downsample(pts)))
        run_ = values["num_running_reqs"]
        summary = (
            f"running {run_['mean']} (max {run_['max']}), queued {values['num_queue_reqs']['mean']}, "
            f"token usage max {values['token_usage']['max']}, {values['generation_tokens_per_s']} gen tok/s"
        )
        stale = [c for c in ("running", "queued", "kv_usage", "gen_throughput") if values["gauge_age"][c]["before_window"]]
        if stale:
            summary += f"; gauges written before the window (no new value in it): {', '.join(stale)}"
        return Evidence(summary=summary, values=values, blocks=blocks)


def sglang_conf(info: dict[str, Any]) -> dict[str, Any]:
    """What the shared window needs of SGLang's configuration, by concept (`summarize_window`'s `conf`)."""
    conf = config_concepts(info) if info else {}
    cap = effective_max_running_requests(info or {})
    # running is summed over DP groups; a per-DP cap (0.5.23's effective value) must be summed the same way
    states = (info or {}).get("internal_states") if isinstance((info or {}).get("internal_states"), list) else []
    per_dp = bool(states) and isinstance(states[0], dict) and states[0].get("effective_max_running_requests_per_dp") is not None
    kv = (info or {}).get("max_total_num_tokens")
    return {**conf, "max_running_requests": cap, "max_running_requests_total": cap * len(states) if cap and per_dp else cap,
            "kv_capacity_tokens": kv if isinstance(kv, (int, float)) and not isinstance(kv, bool) else None}  # fmt: skip


class SglangHealth(HealthProbe):
    """`/health` with a timeout (it runs a 1-token generation, up to ~20 s on a hung GPU)."""

    name = "sglang.health"
    server_kind = "sglang"
    description = "SGLang /health: status and latency"


class SglangSweep(LoadSweep):
    """The concurrency sweep over SGLang's `/generate`, read from its /metrics."""

    name = "sglang.sweep"
    server_kind = "sglang"
    description = "Throughput and latency at increasing concurrency, and what stops the scaling"
    metrics_hint = "start the server with --enable-metrics"

    async def running_cap(self, ctx: Context) -> int | None:
        info, _ = await server_info(ctx, 10)
        return effective_max_running_requests(info)

    async def scrape(self, ctx: Context, t: float, timeout_s: float) -> Snapshot:
        return await scrape(ctx, t, timeout_s)
