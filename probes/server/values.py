"""What `sglang.metrics` and `sglang.sweep` return, declared (the `Values` models of gpu_runbook.values).

Every key is always there: a release that does not export a metric leaves its value null, not missing
(shared/reference/sglang-versions.md): `num_retracted_requests_total` and `cuda_graph_passes_total`
are 0.5.7+ (older releases: the retraction gauge, and null graph passes), `new_token_ratio`,
`forward_execution_seconds_total` and `scheduler_idle_seconds_total` only where the release exports
them, `estimated_*_per_gpu_total` only with `--enable-mfu-metrics`, the scheduler's
effective running cap only where `/server_info` reports it (0.5.8+).
Kept apart from probes/sglang/server.py so the models can change without touching the probes' code.
"""

from __future__ import annotations

from typing import Any, Literal

from gpu_runbook.plugin import Values, value


class MeanMaxLast(Values):
    """A gauge over the scrapes of the window; all null when no scrape carried it."""

    mean: float | None = value("mean over the scrapes", default=...)
    max: float | None = value("largest scrape", default=...)
    last: float | None = value("the last scrape", default=...)


class GaugeAge(Values):
    """When a gauge's value was written, relative to the window. The scheduler writes its gauges at its
    logs (each prefill batch, every `decode_log_interval` decode steps: 20-60 s apart at a 0.5-1.5 s
    step), so a window can hold only a value written before it opened; that value alone decides nothing."""

    written_s: float | None = value(
        "seconds after the window opened at which the scrape first showed the gauge's last value (its write is at or "
        "before this); null when the value did not change in the window, or when the source cannot tell when (a fleet's PromQL answer says only whether it changed)", unit="s", default=...)  # fmt: skip
    age_s: float | None = value("window end - written_s: how old the last value is at the window's end", unit="s", default=...)
    before_window: bool = value("the value read in the window was written before it opened (no change seen)", default=...)


class GaugeAges(Values):
    running: GaugeAge = value("running requests", default=...)
    queued: GaugeAge = value("queued requests", default=...)
    kv_usage: GaugeAge = value("KV cache usage", default=...)
    num_used_tokens: GaugeAge = value("KV tokens in use", default=...)
    gen_throughput: GaugeAge = value("the scheduler's generation throughput", default=...)
    new_token_ratio: GaugeAge = value("sglang:new_token_ratio", default=...)


class MeanMax(Values):
    mean: float | None = value("mean over the scrapes", default=...)
    max: float | None = value("largest scrape", default=...)


class Quantiles(Values):
    """Quantiles of a histogram's increase over the window (linear within a bucket, as Prometheus does);
    null when nothing was observed in the window."""

    p50: float | None = value("median", unit="s", default=...)
    p95: float | None = value("95th percentile", unit="s", default=...)


class Spread(Values):
    """A gauge over the scrapes with its median (the scheduler refreshes gauges only at its logs); all null
    when no scrape carried it."""

    mean: float | None = value("mean over the scrapes", default=...)
    min: float | None = value("smallest scrape", default=...)
    p50: float | None = value("median scrape", default=...)
    max: float | None = value("largest scrape", default=...)
    last: float | None = value("the last scrape", default=...)


class MetricsValues(Values):
    """`sglang.metrics`: the server's Prometheus metrics over a window of scrapes, aggregated over ranks
    (DP groups summed for counts and throughput, maxed for usage)."""

    scrapes: int = value("scrapes of /metrics in the window", default=...)
    window_s: float = value("time from the first scrape to the last", unit="s", default=...)
    num_running_reqs: MeanMaxLast = value("running requests, summed over DP ranks", unit="requests", default=...)
    num_queue_reqs: MeanMaxLast = value("queued requests, summed over DP ranks", unit="requests", default=...)
    token_usage: MeanMaxLast = value("KV token usage 0..1 (max over ranks)", default=...)
    num_used_tokens: MeanMaxLast = value("KV tokens in use (summed over DP ranks)", unit="tokens", default=...)
    gen_throughput: MeanMax = value("the scheduler's own generation-throughput gauge", unit="tokens/s", default=...)
    generation_tokens_per_s: float | None = value("sglang:generation_tokens_total increase / window", unit="tokens/s", default=...)
    prompt_tokens_per_s: float | None = value("sglang:prompt_tokens_total increase / window", unit="tokens/s", default=...)
    requests_per_s: float | None = value("sglang:num_requests_total increase / window", unit="requests/s", default=...)
    requests_completed: int | None = value("requests finished in the window (num_requests_total increase)", unit="requests", default=...)
    cache_hit_rate: float | None = value(
        "cached / prompt tokens over the window (0..1); null without prompt tokens or the cached counter", default=...)  # fmt: skip
    ttft_s: Quantiles = value("time to first token (time_to_first_token_seconds)", unit="s", default=...)
    itl_s: Quantiles = value("inter-token latency (inter_token_latency_seconds)", unit="s", default=...)
    e2e_s: Quantiles = value("end-to-end request latency (e2e_request_latency_seconds)", unit="s", default=...)
    queue_time_s: Quantiles = value("time in the waiting queue (queue_time_seconds)", unit="s", default=...)
    max_running_requests: int | None = value(
        "the scheduler's cap per DP group where server_info reports it (0.5.8+), else the flag, else null",
        unit="requests", default=...)  # fmt: skip
    max_total_num_tokens: int | None = value("KV cache capacity (the gauge, else server_info)", unit="tokens", default=...)
    running_to_cap: float | None = value("num_running_reqs.max / max_running_requests (over all DP groups)", default=...)
    # by concept (window_concepts, the names the runbooks read)
    running: Spread = value("running requests (summed over DP ranks)", unit="requests", default=...)
    running_per_dp: Spread = value("running requests per DP rank", unit="requests", default=...)
    dp_ranks: int = value("DP ranks exporting the gauge (else attn DP size, else 1)", default=...)
    queued: Spread = value("queued requests (summed over DP ranks)", unit="requests", default=...)
    kv_usage: Spread = value("KV token usage 0..1 (max over ranks)", default=...)
    new_token_ratio: Spread = value("sglang:new_token_ratio, the scheduler's admission estimate (null where not exported)", default=...)
    gauge_refreshes: int = value("scrapes that saw a new running/queued/usage reading (the scheduler writes them at its logs)", default=...)
    gauge_age: GaugeAges = value("when each gauge's value was written, relative to the window", default=...)
    gauges_written_in_window: bool = value(
        "running, queued and KV usage were each written inside the window (false: a value from before it; it decides nothing alone)",
        default=...)  # fmt: skip
    gauges_current: bool = value(
        "running, queued and KV usage hold for the window: written in it, or last written as idle (0 running, 0 queued: "
        "an admission would have written them again); the rules that read them decide nothing otherwise", default=...)  # fmt: skip
    retractions: float | None = value("requests retracted in the window (KV cache ran out mid-decode)", unit="requests", default=...)
    retractions_source: Literal["num_retracted_requests_total", "num_retracted_reqs gauge (sum of its log values)"] | None = value(
        "where `retractions` came from: the 0.5.7+ counter, else the gauge; null when neither is exported", default=...)  # fmt: skip
    decode_graph_passes: float | None = value("decode passes in a CUDA graph (cuda_graph_passes_total, 0.5.7+)", default=...)
    decode_eager_passes: float | None = value("decode passes without a CUDA graph (0.5.7+)", default=...)
    decode_passes: float | None = value("all decode passes in the window (0.5.7+)", default=...)
    decode_graph_share: float | None = value("share of decode passes that ran in a CUDA graph (0..1)", default=...)
    forward_busy_share: float | None = value("forward_execution_seconds_total increase / window (where exported)", default=...)
    scheduler_idle_share: float | None = value("scheduler_idle_seconds_total increase / window (where exported)", default=...)
    est_read_gb_per_s_per_gpu: float | None = value("estimated_read_bytes_per_gpu_total rate (--enable-mfu-metrics)", unit="GB/s", default=...)
    est_tflops_per_gpu: float | None = value("estimated_flops_per_gpu_total rate (--enable-mfu-metrics)", unit="TFLOP/s", default=...)
    running_cap: int | None = value("the running-request cap over all DP ranks (sglang_config's running_cap)", unit="requests", default=...)
    running_cap_source: Literal[
        "internal_states.effective_max_running_requests_per_dp", "max_running_requests flag", "default formula (estimate)"
    ] | None = value("where running_cap came from", default=...)  # fmt: skip
    running_to_cap_p50: float | None = value("running.p50 / running_cap", default=...)
    running_to_cap_max: float | None = value("running.max / running_cap", default=...)
    server_kind: Literal["sglang", "vllm"] | None = value(
        "the server whose series these are, where the values say it (a fleet reads a host as SGLang or vLLM by the "
        "series it has); absent from a host probe, whose server is the run's target", default=None)  # fmt: skip


class SweepLevel(Values):
    """One concurrency level: client-side figures from the load generator, batch figures from /metrics
    over the level's steady part (null without /metrics), GPU draw from NVML (null without it)."""

    concurrency: int = value("requests kept in flight", unit="requests", default=...)
    output_tokens_per_s: float = value("output tokens/s over the level's last 60% (steady state)", unit="tokens/s", default=...)
    request_throughput: float = value("completed requests per second", unit="requests/s", default=...)
    completed: int = value("requests completed", unit="requests", default=...)
    errors: int = value("requests failed", unit="requests", default=...)
    ttft_p50_ms: float | None = value("time to first token, median", unit="ms", default=...)
    ttft_p99_ms: float | None = value("time to first token, p99", unit="ms", default=...)
    itl_p50_ms: float | None = value("inter-token latency, median", unit="ms", default=...)
    itl_p99_ms: float | None = value("inter-token latency, p99", unit="ms", default=...)
    tpot_p50_ms: float | None = value("time per output token, median", unit="ms", default=...)
    e2e_p50_ms: float | None = value("request latency, median", unit="ms", default=...)
    running_mean: float | None = value("running requests, mean", unit="requests", default=...)
    running_max: float | None = value("running requests, max", unit="requests", default=...)
    queue_mean: float | None = value("queued requests, mean", unit="requests", default=...)
    queue_max: float | None = value("queued requests, max", unit="requests", default=...)
    token_usage_mean: float | None = value("KV token usage 0..1, mean", default=...)
    token_usage_max: float | None = value("KV token usage 0..1, max", default=...)
    gpu_draw_to_max: float | None = value("mean GPU draw / board maximum power (null without NVML or gpu_power)", default=...)
    gpu_draw_w: float | None = value("mean GPU draw", unit="W", default=...)
    client_cpu_share: float = value("the load generator's CPU time / wall time (1.0 = one full core)", default=...)


class SweepValues(Values):
    """`sglang.sweep`: throughput and latency per concurrency level, and what stops the scaling."""

    levels: list[SweepLevel] = value("one entry per concurrency level, lowest first", default=...)
    server_kind: Literal["sglang", "vllm"] = value("the server kind swept (its probe family: sglang.sweep or vllm.sweep)", default=...)
    max_running_requests: int | None = value("the scheduler's cap (0.5.8+ effective value, else the flag), or null", unit="requests", default=...)
    metrics_available: bool = value("/metrics answered: without it the limit is unknown", default=...)
    peak_output_tokens_per_s: float = value("highest level throughput", unit="tokens/s", default=...)
    peak_concurrency: int | None = value("the level of the peak", unit="requests", default=...)
    plateau_concurrency: int | None = value(
        "lowest level within 10% of the peak; null while still scaling at the top level", unit="requests", default=...)  # fmt: skip
    limit: Literal["kv-cache", "running-requests-cap", "none", "unknown"] = value("what stops the scaling", default=...)
    limit_reason: str = value("why, in words, with the figures", default=...)
    draw_to_max_at_plateau: float | None = value("gpu_draw_to_max at the plateau level (else the top level)", default=...)
    draw_w_at_plateau: float | None = value("gpu_draw_w at the plateau level (else the top level)", unit="W", default=...)
    gpu_power_available: bool = value("some level read GPU power through NVML", default=...)
    client_saturated: bool = value(
        "some level kept the load generator at >= 85% of a core: a flat top may be the client's limit", default=...)  # fmt: skip


# Written in one call at each prefill-batch log and every decode_log_interval decode steps (gen_throughput only at
# decode logs): when one of them shows a new value, the others were rewritten then too, if unchanged
# (sglang-versions.md, "gauge refresh"; scheduler_metrics_mixin.py in 0.5.5.post3-0.5.23).
LOGGED_TOGETHER = ("running", "queued", "kv_usage", "num_used_tokens")


def written_together(ages: dict[str, dict[str, Any]], window_s: float | None) -> dict[str, dict[str, Any]]:
    """Each gauge of LOGGED_TOGETHER takes the group's latest write: a batch pinned at its cap keeps its running
    gauge's value while the queue and the KV usage move, and that value is as fresh as theirs. `window_s` None:
    the source says only whether a gauge changed (a fleet's PromQL answer), not when."""
    members = [ages[c] for c in LOGGED_TOGETHER if c in ages]
    # a member moved: its new value was seen at a time, or (PromQL) it is read and not from before the window
    if not any(a["written_s"] is not None or (window_s is None and not a["before_window"]) for a in members):
        return ages
    written = max((a["written_s"] for a in members if a["written_s"] is not None), default=None)
    out = dict(ages)
    for c in LOGGED_TOGETHER:
        if c in out and out[c]["before_window"]:
            out[c] = {"written_s": written, "age_s": round(window_s - written, 3) if written is not None and window_s is not None else None,
                      "before_window": False}  # fmt: skip
    return out


def written_in_window(ages: dict[str, dict[str, Any]]) -> bool:
    """Running, queued and KV usage were each written inside the window (after `written_together`)."""
    return not any(ages[c]["before_window"] for c in ("running", "queued", "kv_usage"))


def gauges_current(values: dict[str, Any]) -> bool:
    """The scheduler's gauges describe the window when it wrote them in it, or when their last values say it was idle
    (0 running, 0 queued): an idle scheduler writes no log, and a request admitted since would have logged its
    prefill batch. A counter cannot tell instead: generated tokens are counted when a request finishes."""
    if values.get("gauges_written_in_window"):
        return True
    running, queued = (values.get(k) or {} for k in ("running", "queued"))
    return running.get("last") == 0 and queued.get("last") == 0


class HealthValues(Values):
    """What `/health` answered (it runs a 1-token generation: up to ~20 s on a hung GPU)."""

    healthy: bool = value("HTTP 200 (false on another status, and on a timeout)", default=...)
    status_code: int = value("HTTP status of /health (missing on a timeout)", default=...)
    latency_ms: float = value("time to the answer (on a timeout: the timeout)", unit="ms", default=...)
    timed_out: bool | None = value("no answer within request_timeout_s (failed evidence only)")
