"""SGLang probes: server configuration, health, metrics over a window, and a concurrency sweep.

The first half holds the HTTP and Prometheus helpers (also used by `model.config`). Every way a request can go wrong becomes a `ProbeError` whose `status` says whether the thing to
measure is not there (`unavailable`: refused, 401, 404, timeout) or the data is broken (`failed`:
malformed JSON or metrics text), so each probe turns it into evidence with a clear reason.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from gpu_runbook import fetch as fetch_limits
from gpu_runbook import json_bounded
from gpu_runbook.evidence import Evidence, Series, Table, downsample
from gpu_runbook.fetch import FetchError, check_lines, fetch
from gpu_runbook.probe import Probe

from .sglang_config import config_concepts
from .metrics_values import MetricsValues, SweepValues, gauges_current, written_in_window, written_together
from .server_values import SglangHealthValues, SglangServerValues

if TYPE_CHECKING:
    from gpu_runbook.probe import Context


class ProbeError(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status  # "unavailable" | "failed"
        self.reason = reason


class NotFound(ProbeError):
    def __init__(self, reason: str) -> None:
        super().__init__("unavailable", reason)


MAX_BODY_BYTES = fetch_limits.MAX_BODY_BYTES  # the most read from one answer (decompressed): gpu_runbook.fetch


async def get(ctx: "Context", path: str, timeout_s: float) -> httpx.Response:
    """GET `path` on the target's server; 200 or a ProbeError (NotFound for 404). Through gpu_runbook.fetch:
    the body is capped after decompression, the whole exchange has `timeout_s`, redirects stay on the target."""
    base = ctx.target.server_url.rstrip("/")
    try:
        r = await fetch(ctx.http, base + path, headers=ctx.target.auth_headers(), timeout_s=timeout_s)
    except FetchError as e:
        raise _fetch_error(e, base, path, timeout_s) from e
    if r.status_code == 401:
        hint = "the API key was refused" if ctx.target.auth_headers() else "the server needs an API key (set the target's api_key)"
        raise ProbeError("unavailable", f"401 Unauthorized from {path}: {hint}")
    if r.status_code == 404:
        raise NotFound(f"{path} not found (404)")
    if r.status_code != 200:
        raise ProbeError("unavailable", f"{path} answered HTTP {r.status_code}: {r.text[:200]}")
    return r


def _fetch_error(e: FetchError, base: str, path: str, timeout_s: float) -> ProbeError:
    if e.kind == "connect":
        return ProbeError("unavailable", f"cannot connect to the SGLang server at {base}: {e.message.split(': ', 1)[-1]}")
    if e.kind == "timeout":
        return ProbeError("unavailable", f"the SGLang server at {base} did not answer {path} within {timeout_s:g} s")
    if e.kind == "http":
        return ProbeError("unavailable", f"{path} on {base}: {e.message.split(': ', 1)[-1]}")
    return ProbeError("failed", e.message)  # too large, a bad encoding, a redirect off the target


async def get_json(ctx: "Context", path: str, timeout_s: float) -> Any:
    r = await get(ctx, path, timeout_s)
    try:
        return json_bounded.loads(r.content)
    except ValueError as e:
        raise ProbeError("failed", f"malformed JSON from {path}: {e}") from e


async def get_json_fallback(ctx: "Context", paths: tuple[str, ...], timeout_s: float) -> tuple[Any, str]:
    """First of `paths` that exists (newer name first), with the path that answered."""
    last: NotFound | None = None
    for p in paths:
        try:
            return await get_json(ctx, p, timeout_s), p
        except NotFound as e:
            last = e
    raise NotFound(f"none of {', '.join(paths)} exists ({last})")


async def server_info(ctx: "Context", timeout_s: float = 10.0) -> tuple[dict[str, Any], str]:
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


# ---- Prometheus ---------------------------------------------------------------------------------

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


@dataclass
class Snapshot:
    """One scrape, aggregated across ranks: gauges, counters and histogram buckets (le -> count)."""

    t: float
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    labelled: dict[str, dict[str, float]] = field(default_factory=dict)  # counter -> label value -> value
    per_dp: dict[str, dict[str, float]] = field(default_factory=dict)  # gauge -> dp_rank -> value (DP attention)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)


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
    return snap


def counter_increase(a: Snapshot, b: Snapshot, name: str) -> float | None:
    if name not in a.counters or name not in b.counters:
        return None
    d = b.counters[name] - a.counters[name]
    return b.counters[name] if d < 0 else d  # a reset (restart) counts from zero


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile on cumulative buckets (linear within a bucket)."""
    items = sorted(buckets.items())
    if not items or items[-1][1] <= 0:
        return None
    total = items[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in items:
        if c >= rank:
            if math.isinf(le):
                return prev_le  # beyond the last finite bound: report that bound
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def window_quantiles(a: Snapshot, b: Snapshot, name: str, qs: tuple[float, ...] = (0.5, 0.95)) -> dict[str, float | None]:
    """Quantiles of a histogram's increase between two scrapes; None when nothing was observed."""
    ba, bb = a.buckets.get(name, {}), b.buckets.get(name, {})
    inc = {le: c - ba.get(le, 0.0) for le, c in bb.items()}
    if any(v < 0 for v in inc.values()):  # reset
        inc = dict(bb)
    out: dict[str, float | None] = {}
    for q in qs:
        v = histogram_quantile(q, inc)
        out[f"p{int(q * 100)}"] = round(v, 4) if v is not None else None
    return out


async def scrape(ctx: "Context", t: float, timeout_s: float) -> Snapshot:
    try:
        r = await get(ctx, "/metrics", timeout_s)
    except NotFound as e:
        raise ProbeError("unavailable", "start the server with --enable-metrics (/metrics answered 404)") from e
    return parse_metrics(r.text, t)


def stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "max": None, "last": None}
    return {"mean": round(sum(values) / len(values), 4), "max": round(max(values), 4), "last": round(values[-1], 4)}


# ---- probes --------------------------------------------------------------------------------------


def _as_evidence(e: ProbeError, **kw: Any) -> Evidence:
    return Evidence.unavailable(e.reason, **kw) if e.status == "unavailable" else Evidence.failed(e.reason, **kw)


# The contract keys, read verbatim from server_info when the server has them.
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

    values: declared in `SglangServerValues` (probes/server_values.py): concepts always present, raw flags when
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

    async def run(self, ctx: "Context", params: "SglangServer.Params") -> Evidence:
        try:
            info, path = await server_info(ctx, params.request_timeout_s)
        except ProbeError as e:
            return _as_evidence(e)
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


class SglangHealth(Probe):
    """`/health` with a timeout (it runs a 1-token generation, up to ~20 s on a hung GPU).

    values: declared in `SglangHealthValues` (probes/server_values.py); on timeout (failed): healthy false, timed_out true.
    """

    name = "sglang.health"
    server_kind, role = "sglang", "server.health"
    Values = SglangHealthValues
    description = "SGLang /health: status and latency"
    default_timeout_s = 40.0

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        request_timeout_s: float = Field(25.0, gt=0, le=600)

    async def run(self, ctx: "Context", params: "SglangHealth.Params") -> Evidence:
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
            return _as_evidence(_fetch_error(e, base, "/health", params.request_timeout_s))
        ms = round((time.perf_counter() - t0) * 1000, 1)
        healthy = r.status_code == 200
        values = {"healthy": healthy, "status_code": r.status_code, "latency_ms": ms}
        return Evidence(summary=f"/health {r.status_code} in {ms} ms" + ("" if healthy else " (unhealthy)"), values=values)


class SglangMetrics(Probe):
    """SGLang's Prometheus metrics over a window (two or more scrapes of /metrics).

    The values are declared in `MetricsValues` (probes/metrics_values.py).
    """

    name = "sglang.metrics"
    server_kind, role = "sglang", "server.metrics"
    description = "SGLang /metrics over a window: load, KV usage, throughput, latency quantiles"
    Values = MetricsValues

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        duration_s: float = Field(10.0, gt=0, le=3600)
        interval_s: float = Field(1.0, gt=0, le=600)
        request_timeout_s: float = Field(5.0, gt=0, le=600)

    async def run(self, ctx: "Context", params: "SglangMetrics.Params") -> Evidence:
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
                return _as_evidence(e)
            if len(snaps) < 2:
                return _as_evidence(ProbeError(e.status, f"only one scrape succeeded: {e.reason}"))
            ctx.log(f"sglang.metrics: stopped early: {e.reason}")
            cut = e
        info: dict[str, Any] = {}
        try:
            info, _ = await server_info(ctx, params.request_timeout_s)
        except ProbeError:
            pass
        values = summarize_window(snaps, info)
        if cut is not None:  # a window the server stopped answering in is not the window asked for: no verdict on it
            return _as_evidence(ProbeError(cut.status, f"the window was cut short after {len(snaps)} of {n} scrapes: {cut.reason}"), values=values)
        blocks = []
        for key, title, unit, concept in (
            ("sglang:num_running_reqs", "running requests", "req", "running"),
            ("sglang:num_queue_reqs", "queued requests", "req", "queued"),
            ("sglang:token_usage", "KV token usage", "", "kv_usage"),
            ("sglang:gen_throughput", "generation throughput", "tok/s", "gen_throughput"),
        ):
            pts = [(round(s.t, 2), s.gauges[key]) for s in snaps if key in s.gauges]
            if pts:
                # the title stays the plain name (diff and the report find the series by it); the age goes in the label
                blocks.append(Series(title=title, unit=unit, label=key + _age_note(values["gauge_age"][concept]), points=downsample(pts)))
        run_ = values["num_running_reqs"]
        summary = (
            f"running {run_['mean']} (max {run_['max']}), queued {values['num_queue_reqs']['mean']}, "
            f"token usage max {values['token_usage']['max']}, {values['generation_tokens_per_s']} gen tok/s"
        )
        stale = [c for c in ("running", "queued", "kv_usage", "gen_throughput") if values["gauge_age"][c]["before_window"]]
        if stale:
            summary += f"; gauges written before the window (no new value in it): {', '.join(stale)}"
        return Evidence(summary=summary, values=values, blocks=blocks)


def _age_note(age: dict[str, Any]) -> str:
    """How old the series' last value is: the scheduler writes its gauges only at its logs."""
    if age["before_window"]:
        return " (last written before the window: the scheduler wrote no new value during it)"
    if age["written_s"] is not None:
        return f" (last written ~{age['written_s']:g} s into the window, {age['age_s']:g} s before its end)"
    return ""


def summarize_window(snaps: list[Snapshot], info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `sglang.metrics` values from a list of scrapes (also used by the sweep per level)."""
    first, last = snaps[0], snaps[-1]
    window = max(1e-9, last.t - first.t)

    def series(name: str) -> list[float]:
        return [s.gauges[name] for s in snaps if name in s.gauges]

    def rate(name: str) -> float | None:
        inc = counter_increase(first, last, name)
        return round(inc / window, 3) if inc is not None else None

    gen = stats(series("sglang:gen_throughput"))
    values: dict[str, Any] = {
        "scrapes": len(snaps),
        "window_s": round(window, 3),
        "num_running_reqs": stats(series("sglang:num_running_reqs")),
        "num_queue_reqs": stats(series("sglang:num_queue_reqs")),
        "token_usage": stats(series("sglang:token_usage")),
        "num_used_tokens": stats(series("sglang:num_used_tokens")),
        "gen_throughput": {"mean": gen["mean"], "max": gen["max"]},
        "generation_tokens_per_s": rate("sglang:generation_tokens_total"),
        "prompt_tokens_per_s": rate("sglang:prompt_tokens_total"),
        "requests_per_s": rate("sglang:num_requests_total"),
    }
    done = counter_increase(first, last, "sglang:num_requests_total")
    values["requests_completed"] = int(done) if done is not None else None
    prompt = counter_increase(first, last, "sglang:prompt_tokens_total")
    cached = counter_increase(first, last, "sglang:cached_tokens_total")
    values["cache_hit_rate"] = round(cached / prompt, 4) if prompt and cached is not None else None
    for hist, key in (
        ("sglang:time_to_first_token_seconds", "ttft_s"),
        ("sglang:inter_token_latency_seconds", "itl_s"),
        ("sglang:e2e_request_latency_seconds", "e2e_s"),
        ("sglang:queue_time_seconds", "queue_time_s"),
    ):
        values[key] = window_quantiles(first, last, hist)
    cap = effective_max_running_requests(info or {})
    values["max_running_requests"] = cap
    kv = last.gauges.get("sglang:max_total_num_tokens")
    if kv is None and info and isinstance(info.get("max_total_num_tokens"), (int, float)):
        kv = info["max_total_num_tokens"]
    values["max_total_num_tokens"] = int(kv) if kv is not None and math.isfinite(kv) else None
    rmax = values["num_running_reqs"]["max"]
    # running is summed over DP groups; a per-DP cap (0.5.23's effective value) must be summed the same way
    states = (info or {}).get("internal_states") if isinstance((info or {}).get("internal_states"), list) else []
    per_dp = bool(states) and isinstance(states[0], dict) and states[0].get("effective_max_running_requests_per_dp") is not None
    total_cap = cap * len(states) if cap and per_dp else cap
    values["running_to_cap"] = round(rmax / total_cap, 4) if total_cap and rmax is not None else None
    values.update(window_concepts(snaps, info or {}))
    return values


def spread(values: list[float]) -> dict[str, float | None]:
    """{mean, min, p50, max, last}: gauges are refreshed only at scheduler logs, so a rule wants the median too."""
    if not values:
        return {"mean": None, "min": None, "p50": None, "max": None, "last": None}
    ordered = sorted(values)
    return {"mean": round(sum(values) / len(values), 4), "min": round(ordered[0], 4), "p50": round(ordered[len(ordered) // 2], 4),
            "max": round(ordered[-1], 4), "last": round(values[-1], 4)}  # fmt: skip


def _refreshes(snaps: list[Snapshot], names: tuple[str, ...]) -> int:
    """How many scrapes saw a new value of any of `names`: a real scheduler writes its gauges only at its logs."""
    seen, prev = 0, None
    for s in snaps:
        cur = tuple(s.gauges.get(n) for n in names)
        if prev is not None and cur != prev:
            seen += 1
        prev = cur
    return seen


GAUGE_CONCEPTS = {"running": "sglang:num_running_reqs", "queued": "sglang:num_queue_reqs", "kv_usage": "sglang:token_usage",
                  "num_used_tokens": "sglang:num_used_tokens", "gen_throughput": "sglang:gen_throughput",
                  "new_token_ratio": "sglang:new_token_ratio"}  # fmt: skip


def _gauge_age(snaps: list[Snapshot], metric: str) -> dict[str, Any]:
    """When the gauge's last value appeared, relative to the first scrape. /metrics carries no write time, so
    the write is placed at the first scrape that showed the value; a value that never changed in the window
    was written before it opened (or rewritten unchanged: a scrape cannot tell, so it is not counted as fresh)."""
    first_t, end = snaps[0].t, snaps[-1].t - snaps[0].t
    written, prev, seen = None, None, False
    for s in snaps:
        v = s.gauges.get(metric)
        if v is None:
            continue
        if seen and v != prev:
            written = s.t - first_t
        prev, seen = v, True
    return {"written_s": round(written, 3) if written is not None else None,
            "age_s": round(end - written, 3) if written is not None else None,
            "before_window": seen and written is None}  # fmt: skip


def window_concepts(snaps: list[Snapshot], info: dict[str, Any]) -> dict[str, Any]:
    """The window named by concept (running, queued, KV usage, retractions, graph passes), per `sglang_config`."""
    first, last = snaps[0], snaps[-1]
    window = max(1e-9, last.t - first.t)
    conf = config_concepts(info) if info else {}

    def series(name: str) -> list[float]:
        return [s.gauges[name] for s in snaps if name in s.gauges]

    ranks = max((len(s.per_dp.get("sglang:num_running_reqs", {})) for s in snaps), default=0) or conf.get("attn_dp") or 1
    running = series("sglang:num_running_reqs")
    out: dict[str, Any] = {
        "running": spread(running),
        "running_per_dp": spread([r / ranks for r in running]),
        "dp_ranks": ranks,
        "queued": spread(series("sglang:num_queue_reqs")),
        "kv_usage": spread(series("sglang:token_usage")),
        "new_token_ratio": spread(series("sglang:new_token_ratio")),
        "gauge_refreshes": _refreshes(snaps, ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")),
        "gauge_age": written_together({concept: _gauge_age(snaps, metric) for concept, metric in GAUGE_CONCEPTS.items()}, snaps[-1].t - snaps[0].t),
    }
    out["gauges_written_in_window"] = written_in_window(out["gauge_age"])
    out["gauges_current"] = gauges_current(out)
    # Retractions: the counter (0.5.7+) is exact; the gauge counts since the previous log and resets, so sum its refreshes.
    inc = counter_increase(first, last, "sglang:num_retracted_requests_total")
    if inc is not None:
        out["retractions"], out["retractions_source"] = inc, "num_retracted_requests_total"
    else:
        readings = series("sglang:num_retracted_reqs")
        if readings:
            total, prev = 0.0, None
            for r in readings:
                if r != prev and r > 0:
                    total += r
                prev = r
            out["retractions"], out["retractions_source"] = total, "num_retracted_reqs gauge (sum of its log values)"
        else:
            out["retractions"], out["retractions_source"] = None, None
    # Which decode passes ran in a CUDA graph (0.5.7+, counted on every decode pass); is_cuda_graph is never set.
    pa, pb = first.labelled.get("sglang:cuda_graph_passes_total"), last.labelled.get("sglang:cuda_graph_passes_total")
    if pb is not None:
        pa = pa or {}
        d = {k: max(0.0, v - pa.get(k, 0.0)) for k, v in pb.items()}
        graph, eager = d.get("decode_cuda_graph", 0.0), d.get("decode_none", 0.0)
        out["decode_graph_passes"], out["decode_eager_passes"] = graph, eager
        out["decode_passes"] = graph + eager
        out["decode_graph_share"] = round(graph / (graph + eager), 4) if graph + eager else None
    else:
        out.update(decode_graph_passes=None, decode_eager_passes=None, decode_passes=None, decode_graph_share=None)
    for counter, key, scale in (
        ("sglang:forward_execution_seconds_total", "forward_busy_share", 1.0),
        ("sglang:scheduler_idle_seconds_total", "scheduler_idle_share", 1.0),
        ("sglang:estimated_read_bytes_per_gpu_total", "est_read_gb_per_s_per_gpu", 1e-9),
        ("sglang:estimated_flops_per_gpu_total", "est_tflops_per_gpu", 1e-12),
    ):
        d = counter_increase(first, last, counter)
        out[key] = round(d / window * scale, 4) if d is not None else None
    cap = conf.get("running_cap")
    out["running_cap"] = cap
    out["running_cap_source"] = conf.get("running_cap_source")
    r = out["running"]
    out["running_to_cap_p50"] = round(r["p50"] / cap, 4) if cap and r["p50"] is not None else None
    out["running_to_cap_max"] = round(r["max"] / cap, 4) if cap and r["max"] is not None else None
    return out


class SglangSweep(Probe):
    """Load at increasing concurrency; where throughput stops scaling and, from /metrics, why.

    The values are declared in `SweepValues` (probes/metrics_values.py); `gpu_power` (default true) adds
    the GPU draw per level, `gpus` limits it to the server's GPUs.
    """

    drives_load = True  # the runner shows live GPU and server readings while the levels run
    needs = "sweep"
    name = "sglang.sweep"
    server_kind, role = "sglang", "server.sweep"
    description = "Throughput and latency at increasing concurrency, and what stops the scaling"
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

    async def running_cap(self, ctx: "Context") -> int | None:
        """The scheduler's running-request cap (None: not reported); a ProbeError when the server does not answer."""
        info, _ = await server_info(ctx, 10)
        return effective_max_running_requests(info)

    async def scrape(self, ctx: "Context", t: float, timeout_s: float) -> Snapshot:
        """One scrape, filed under the series names the levels read (SGLang's)."""
        return await scrape(ctx, t, timeout_s)

    def _levels(self, params: "SglangSweep.Params") -> list[int]:
        lv = sorted({c for c in params.levels if c >= 1 and (params.max_concurrency is None or c <= params.max_concurrency)})
        return lv or [1]

    def timeout_s(self, params: BaseModel) -> float:
        p: SglangSweep.Params = params  # type: ignore[assignment]
        return self.default_timeout_s + len(self._levels(p)) * (p.seconds_per_level + 15)

    async def run(self, ctx: "Context", params: "SglangSweep.Params") -> Evidence:
        from gpu_runbook.load import LoadConfig, LoadGenerator

        try:
            cap = await self.running_cap(ctx)
        except ProbeError as e:
            return _as_evidence(e)
        metrics_ok = True
        try:
            await self.scrape(ctx, 0.0, 5)
        except ProbeError as e:
            metrics_ok = False
            ctx.log(f"sglang.sweep: no metrics ({e.reason}); the limit will be unknown")
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
                            ctx.log(f"sglang.sweep: scrape failed: {e.reason}")
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

            run_, que, tu = stats(col("sglang:num_running_reqs")), stats(col("sglang:num_queue_reqs")), stats(col("sglang:token_usage"))
            # Tokens/s over the steady part (after the ramp and the first 40% of the level), not the whole level.
            mid = next((p for p in tokens_at if p[0] >= params.seconds_per_level * 0.4), tokens_at[0])
            end = tokens_at[-1]
            steady_rate = (end[1] - mid[1]) / (end[0] - mid[0]) if end[0] > mid[0] else rep.output_tokens_per_s
            # the same figure as the table's: steady state, the level's last 60%
            ctx.log(f"sglang.sweep: concurrency {c}: {steady_rate:,.0f} output tok/s (steady state)")
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
        values.update(diagnose(levels, cap, metrics_ok))
        at = next((lv for lv in levels if lv["concurrency"] == values.get("plateau_concurrency")), levels[-1] if levels else {})
        values["draw_to_max_at_plateau"] = at.get("gpu_draw_to_max")
        values["draw_w_at_plateau"] = at.get("gpu_draw_w")
        values["gpu_power_available"] = any(lv["gpu_draw_to_max"] is not None for lv in levels)
        # One Python process streams every request: near a full core, the client, not the server, sets the pace.
        values["client_saturated"] = any((lv["client_cpu_share"] or 0.0) >= CLIENT_SATURATED for lv in levels)
        if values["client_saturated"]:
            ctx.log("sglang.sweep: the load generator used most of a CPU core; throughput at the top levels may be the client's limit")
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


async def gpu_draw(ctx: "Context", gpus: list[int] | None = None) -> tuple[float, float] | None:
    """(mean draw / board maximum, mean draw in W) of the server's GPUs now, or None where NVML cannot say."""

    from gpu_runbook.nvml import open_devices  # noqa: PLC0415 - the sweep imports NVML only when it reads power

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


def diagnose(levels: list[dict[str, Any]], cap: int | None, metrics_ok: bool) -> dict[str, Any]:
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
        return {**out, "limit": "unknown", "limit_reason": "throughput flat but no /metrics to say why (start the server with --enable-metrics)"}
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
    # SGLang admits against the running requests' remaining tokens x new_token_ratio, so a queue held by
    # the KV cache shows usage from ~0.8 (reservations), not only near 1.0 (sglang-versions.md §9, §10)
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
            f"{top['queue_mean']:.0f} wait (the cap is not reported; it looks like max_running_requests)")}  # fmt: skip
    return {**out, "limit": "unknown", "limit_reason": (
        f"throughput flat from concurrency {plateau} with {top['queue_mean']:.0f} queued and KV usage "
        f"{usage:.2f}: the step time grows with the batch (compute or communication bound)")}  # fmt: skip
