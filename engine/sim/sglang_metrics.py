"""SGLang-shaped Prometheus exposition for the simulated server, per release family.

Written by hand (not through a prometheus_client registry) so the label sets, sample order and
histogram layout follow SGLang's multiprocess output per version (`_sum`, `_bucket`s, `_count`;
labels sorted, `le` among them; `pid` on two gauges), and so rendering stays cheap under load.

What a scrape shows follows the real scheduler (shared reference sglang-versions.md §9): gauges are
the values last *logged* (`SimState.logged`), token counters the finished requests, `is_cuda_graph`
always 0 (declared, never set), and a labelled counter appears only once something incremented it
(a prometheus_client child exists only after `.labels()`), which is why a fresh 0.5.23 server has
no `cuda_graph_passes_total` yet. The family lists are those of the releases read for the
reference: 0.5.5.post3 (`srt/metrics/collector.py`) and 0.5.23 (`srt/observability/metrics_collector.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .sglang_info import at_least
from .sim_state import Histogram, SimState

S, SP, T, TS, C = "sched", "sched_pid", "tok", "tok_stream", "cached"

# (name, type, help, labels) in the order 0.5.5.post3 exports them; values come from `_values`.
CLASSIC: list[tuple[str, str, str, str]] = [
    ("num_retracted_reqs", "gauge", "The number of retracted requests.", SP),
    ("num_paused_reqs", "gauge", "The number of paused requests by async weight sync.", SP),
    ("prompt_tokens_total", "counter", "Number of prefill tokens processed.", TS),
    ("generation_tokens_total", "counter", "Number of generation tokens processed.", TS),
    ("num_requests_total", "counter", "Number of requests processed.", TS),
    ("cached_tokens_total", "counter", "Number of cached prompt tokens.", C),
    ("queue_time_seconds", "histogram", "Histogram of queueing time in seconds.", S),
    ("time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.", TS),
    ("inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.", T),
    ("e2e_request_latency_seconds", "histogram", "Histogram of End-to-end request latency in seconds", TS),
    ("num_retractions", "histogram", "Histogram of retraction counts per request.", T),
    ("num_running_reqs", "gauge", "The number of running requests.", S),
    ("num_used_tokens", "gauge", "The number of used tokens.", S),
    ("token_usage", "gauge", "The token usage.", S),
    ("pending_prealloc_token_usage", "gauge", "The token usage for pending preallocated tokens (not preallocated yet).", S),
    ("swa_token_usage", "gauge", "The token usage for SWA layers.", S),
    ("mamba_usage", "gauge", "The token usage for Mamba layers.", S),
    ("gen_throughput", "gauge", "The generation throughput (token/s).", S),
    ("num_queue_reqs", "gauge", "The number of requests in the waiting queue.", S),
    ("num_grammar_queue_reqs", "gauge", "The number of requests in the grammar waiting queue.", S),
    ("num_running_reqs_offline_batch", "gauge", "The number of running low-priority offline batch requests(label is 'batch').", S),
    ("cache_hit_rate", "gauge", "The prefix cache hit rate.", S),
    ("spec_accept_length", "gauge", "The average acceptance length of speculative decoding.", S),
    ("spec_accept_rate", "gauge", "The average acceptance rate of speculative decoding (`accepted tokens / total draft tokens` in batch).", S),
    ("num_prefill_prealloc_queue_reqs", "gauge", "The number of requests in the prefill prealloc queue.", S),
    ("num_prefill_inflight_queue_reqs", "gauge", "The number of requests in the prefill inflight queue.", S),
    ("num_decode_prealloc_queue_reqs", "gauge", "The number of requests in the decode prealloc queue.", S),
    ("num_decode_transfer_queue_reqs", "gauge", "The number of requests in the decode transfer queue.", S),
    ("kv_transfer_speed_gb_s", "gauge", "The transfer speed of the KV cache in GB/s.", S),
    ("kv_transfer_latency_ms", "gauge", "The transfer latency of the KV cache in ms.", S),
    ("kv_transfer_bootstrap_ms", "gauge", "The bootstrap time of the KV transfer in ms.", S),
    ("kv_transfer_alloc_ms", "gauge", "The allocation waiting time of the KV transfer in ms.", S),
    ("utilization", "gauge", "The utilization.", S),
    ("engine_startup_time", "gauge", "The time taken for the engine to start up.", S),
    ("engine_load_weights_time", "gauge", "The time taken for the engine to load weights.", S),
    ("new_token_ratio", "gauge", "The new token ratio.", S),
    ("is_cuda_graph", "gauge", "Whether the batch is using CUDA graph.", S),
]

# 0.5.23, in its export order.
REFACTORED: list[tuple[str, str, str, str]] = [
    ("max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.", S),
    ("weight_memory_usage_gb", "gauge", "Memory used by model weights in GB.", S),
    ("kv_cache_memory_usage_gb", "gauge", "Memory used by the KV cache pools in GB.", S),
    ("graph_memory_usage_gb", "gauge", "Memory used by captured device graphs in GB.", S),
    ("page_size", "gauge", "KV cache page size in tokens.", S),
    ("num_pages", "gauge", "Number of KV cache pages.", S),
    ("context_len", "gauge", "Maximum context length.", S),
    ("startup_available_gpu_memory_gb", "gauge", "Available GPU memory in GB at startup.", S),
    ("num_running_reqs", "gauge", "The number of running requests.", S),
    ("num_queue_reqs", "gauge", "The number of requests in the waiting queue.", S),
    ("num_grammar_queue_reqs", "gauge", "The number of requests in the grammar waiting queue.", S),
    ("gen_throughput", "gauge", "The generation throughput (token/s).", S),
    ("cache_hit_rate", "gauge", "The prefix cache hit rate.", S),
    ("decode_sum_seq_lens", "gauge", "The sum of all sequence lengths in decode.", S),
    ("token_usage", "gauge", "The token usage.", S),
    ("full_token_usage", "gauge", "The token usage for full attention layers.", S),
    ("swa_token_usage", "gauge", "The token usage for SWA layers.", S),
    ("mamba_usage", "gauge", "The token usage for Mamba layers.", S),
    ("num_used_tokens", "gauge", "The number of used tokens.", S),
    ("kv_available_tokens", "gauge", "Number of free token slots in the KV cache pool.", S),
    ("kv_evictable_tokens", "gauge", "Number of evictable (radix-cached) token slots in the KV cache pool.", S),
    ("kv_used_tokens", "gauge", "Number of actively used token slots in the KV cache pool.", S),
    ("swa_available_tokens", "gauge", "Number of free token slots in the SWA pool (hybrid-SWA only).", S),
    ("swa_evictable_tokens", "gauge", "Number of evictable (radix-cached) token slots in the SWA pool.", S),
    ("swa_used_tokens", "gauge", "Number of actively used token slots in the SWA pool.", S),
    ("mamba_available_tokens", "gauge", "Number of free state slots in the mamba SSM pool (hybrid-SSM only).", S),
    ("mamba_evictable_tokens", "gauge", "Number of evictable (radix-cached) state slots in the mamba SSM pool.", S),
    ("mamba_used_tokens", "gauge", "Number of actively used state slots in the mamba SSM pool.", S),
    ("spec_accept_length", "gauge", "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).", S),
    ("spec_accept_rate", "gauge", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).", S),
    ("spec_cap_length", "gauge", "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot.", S),
    ("spec_block_accept_length", "gauge", "Mean uncapped full-block accept length per verify step.", S),
    ("spec_num_steps", "gauge", "Currently active speculative_num_steps.", S),
    ("spec_num_draft_tokens", "gauge", "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).", S),
    ("num_prefill_bootstrap_queue_reqs", "gauge", "The number of requests in the prefill bootstrap queue.", S),
    ("num_prefill_inflight_queue_reqs", "gauge", "The number of requests in the prefill inflight queue.", S),
    ("num_decode_prealloc_queue_reqs", "gauge", "The number of requests in the decode prealloc queue.", S),
    ("num_decode_transfer_queue_reqs", "gauge", "The number of requests in the decode transfer queue.", S),
    ("num_decode_host_receive_queue_reqs", "gauge", "Requests in the decode transfer queue receiving into host memory or waiting for device admission.", S),
    ("num_decode_deferred_kv_release_reqs", "gauge", "The number of failed decode requests whose KV allocations are held pending transfer drain.", S),
    ("pending_prealloc_token_usage", "gauge", "The token usage for pending preallocated tokens (not preallocated yet).", S),
    ("prealloc_full_token_usage", "gauge", "Share of the full-attention KV pool held by decode requests whose KV transfer is pending.", S),
    ("prealloc_swa_token_usage", "gauge", "Share of the SWA KV pool held by decode requests whose KV transfer is pending.", S),
    ("utilization", "gauge", "The utilization.", S),
    ("fwd_occupancy", "gauge", "Forward pass GPU occupancy percentage.", S),
    ("new_token_ratio", "gauge", "The new token ratio.", S),
    ("is_cuda_graph", "gauge", "Whether the batch is using CUDA graph.", S),
    ("num_unique_running_routing_keys", "gauge", "Number of unique routing keys in running batch.", S),
    ("routing_key_running_req_count", "gauge", "Distribution of routing keys by running request count (gt < count <= le).", S),
    ("routing_key_all_req_count", "gauge", "Distribution of routing keys by running+waiting request count (gt < count <= le).", S),
    ("prefill_effective_tokens_total", "counter", "Effective prefill tokens with retracted-request re-counts excluded, updated on each log interval.", S),
    ("scheduler_idle_seconds_total", "counter", "Total wall time while the scheduler has no runnable or queued work.", S),
    ("scheduler_process_cpu_seconds_total", "counter", "Total CPU time consumed by the scheduler process across all threads.", S),
    ("scheduler_stage_seconds_total", "counter", "Total scheduler-loop wall time exclusively attributed to each stage.", S),
    ("dp_attention_tokens_total", "counter", "Tokens of MLP-sync steps on this DP rank.", S),
    ("dp_attention_steps_total", "counter", "MLP-sync steps on this DP rank.", S),
    ("dp_attention_pairs_total", "counter", "Causal (query, key) pairs attended by MLP-sync steps on this DP rank.", S),
    ("prompt_tokens_total", "counter", "Number of prefill tokens processed.", TS),
    ("generation_tokens_total", "counter", "Number of generation tokens processed.", TS),
    ("num_requests_total", "counter", "Number of requests processed.", TS),
    ("cached_tokens_total", "counter", "Number of cached prompt tokens by source (device/host/storage).", C),
    ("dp_attention_token_imbalance_ratio", "histogram", "Per MLP-sync step, max tokens over mean tokens across the DP ranks.", S),
    ("dp_attention_sync_wait_seconds", "histogram", "Wall time of this DP rank's scheduler MLP-sync all-gather per step.", S),
    ("queue_time_seconds", "histogram", "Histogram of queueing time in seconds.", S),
    ("time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.", TS),
    ("inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.", T),
    ("e2e_request_latency_seconds", "histogram", "Histogram of End-to-end request latency in seconds", TS),
    ("request_time_per_output_token_seconds", "histogram", "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).", TS),
    ("prompt_tokens_histogram", "histogram", "Histogram of prompt token length.", T),
    ("uncached_prompt_tokens_histogram", "histogram", "Histogram of uncached (compute) prompt token length.", T),
    ("generation_tokens_histogram", "histogram", "Histogram of generation token length.", T),
    ("num_retracted_reqs", "gauge", "The number of retracted requests.", SP),
    ("num_paused_reqs", "gauge", "The number of paused requests by async weight sync.", SP),
]

ROUTING_BUCKETS = [("0", "1"), ("1", "2"), ("2", "3"), ("3", "5"), ("5", "7"), ("7", "10"), ("10", "20"), ("20", "50"),
                   ("50", "100"), ("100", "200"), ("200", "+Inf")]  # fmt: skip
STAGES = ["other", "recv_requests", "process_input_requests", "get_next_batch_to_run", "process_queue", "run_batch",
          "process_batch_result", "sanity_check_cache", "idle"]  # fmt: skip
IMBALANCE_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
SYNC_WAIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass
class MetricsStatic:
    """What a release exports about its start-up (0.5.23's memory gauges) and which optional series are on."""

    page_size: int = 1
    context_len: int = 40960
    weight_gb: float = 0.0
    kvcache_gb: float = 0.0
    graph_gb: float = 0.0
    startup_available_gb: float = 0.0
    enable_mfu_metrics: bool = False
    device_timer: bool = False  # SGLANG_ENABLE_METRICS_DEVICE_TIMER=1
    flops_per_token: float = 0.0  # estimated_* per GPU (model estimate)
    read_bytes_per_step: float = 0.0


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{d[k]}"' for k in sorted(d)) + "}"


def _fmt(v: float) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return repr(float(v))


def _split(total: float, parts: int, index: int) -> float:
    """Rank `index`'s share of a total spread over DP ranks (integers stay integers)."""
    if parts <= 1:
        return total
    if float(total).is_integer():
        base, rest = divmod(int(total), parts)
        return float(base + (1 if index < rest else 0))
    return total / parts


def render(state: SimState, *, version: str, model_name: str, pid: int, static: MetricsStatic | None = None) -> str:
    """The `/metrics` body for `version` from what the scheduler last logged and the finished requests."""
    static = static or MetricsStatic()
    refactored = at_least(version, 0, 5, 22)
    dp = max(1, state.dp_size)
    base = {"engine_type": "unified", "model_name": model_name, "pp_rank": "0", "tp_rank": "0"}
    if at_least(version, 0, 5, 7):  # 0.5.7 scheduler_metrics_mixin.py:93 (sglang-versions.md "Corrections")
        base["moe_ep_rank"] = "0"
    ranks = [dict(base, dp_rank=str(i)) for i in range(dp)] if dp > 1 else [base]
    tok: dict[str, str] = {"model_name": model_name}
    if at_least(version, 0, 5, 12):
        tok["engine_type"] = "unified"
    kinds = {
        S: ranks,
        SP: [dict(r, pid=str(pid)) for r in ranks],
        T: [tok],
        TS: [dict(tok, is_streaming="true") if refactored else tok],
        C: [dict(tok, cache_source="total") if refactored else tok],
    }
    lg = state.logged
    usage = lg.token_usage
    capacity_per_rank = state.max_total_num_tokens // dp
    gauges: dict[str, Callable[[int], float]] = {
        "num_running_reqs": lambda i: _split(lg.num_running_reqs, dp, i),
        "num_queue_reqs": lambda i: _split(lg.num_queue_reqs, dp, i),
        "num_used_tokens": lambda i: _split(lg.num_used_tokens, dp, i),
        "kv_used_tokens": lambda i: _split(lg.num_used_tokens, dp, i),
        "kv_available_tokens": lambda i: capacity_per_rank - _split(lg.num_used_tokens, dp, i),
        "token_usage": lambda i: round(usage, 4),
        "full_token_usage": lambda i: round(usage, 4),
        "gen_throughput": lambda i: round(_split(lg.gen_throughput, dp, i), 2),
        "new_token_ratio": lambda i: round(lg.new_token_ratio, 4),
        "cache_hit_rate": lambda i: lg.cache_hit_rate,
        "decode_sum_seq_lens": lambda i: _split(lg.decode_sum_seq_lens, dp, i),
        "num_retracted_reqs": lambda i: _split(lg.num_retracted_reqs, dp, i),
        "max_total_num_tokens": lambda i: capacity_per_rank,
        "weight_memory_usage_gb": lambda i: round(static.weight_gb, 2),
        "kv_cache_memory_usage_gb": lambda i: round(static.kvcache_gb, 2),
        "page_size": lambda i: static.page_size,
        "num_pages": lambda i: capacity_per_rank // max(1, static.page_size),
        "context_len": lambda i: static.context_len,
        "startup_available_gpu_memory_gb": lambda i: round(static.startup_available_gb, 2),
        "fwd_occupancy": lambda i: math.nan,
        "is_cuda_graph": lambda i: 0.0,  # declared, never assigned in any covered release (§9)
    }
    out: list[str] = []

    def head(name: str, kind: str, help_: str) -> None:
        out.append(f"# HELP sglang:{name} {help_}\n# TYPE sglang:{name} {kind}\n")

    def sample(name: str, labels: dict[str, str], value: float) -> None:
        out.append(f"sglang:{name}{_labels(labels)} {_fmt(value)}\n")

    def histogram(name: str, h: Histogram, labels: dict[str, str]) -> None:
        sample(name + "_sum", labels, h.total)
        running = 0
        for bound, c in zip(h.bounds, h.counts):
            running += c
            sample(name + "_bucket", dict(labels, le=repr(float(bound))), float(running))
        sample(name + "_bucket", dict(labels, le="+Inf"), float(h.count))
        sample(name + "_count", labels, float(h.count))

    hists = {
        "queue_time_seconds": state.queue_time, "time_to_first_token_seconds": state.ttft,
        "inter_token_latency_seconds": state.itl, "e2e_request_latency_seconds": state.e2e,
        "num_retractions": state.retractions, "request_time_per_output_token_seconds": state.tpot,
        "prompt_tokens_histogram": state.prompt_len, "uncached_prompt_tokens_histogram": state.prompt_len,
        "generation_tokens_histogram": state.output_len,
        "dp_attention_token_imbalance_ratio": Histogram(IMBALANCE_BUCKETS),
        "dp_attention_sync_wait_seconds": Histogram(SYNC_WAIT_BUCKETS),
    }  # fmt: skip
    counters = {
        "prompt_tokens_total": float(state.prompt_tokens_total),
        "generation_tokens_total": float(state.generation_tokens_total),
        "num_requests_total": float(state.completed_requests),
        "cached_tokens_total": float(state.cached_tokens_total),
        "scheduler_idle_seconds_total": state.idle_seconds,
        "scheduler_process_cpu_seconds_total": 0.0,
    }
    catalog = REFACTORED if refactored else CLASSIC
    if not refactored and at_least(version, 0, 5, 6):
        catalog = [("max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.", S)] + catalog
    if not refactored and at_least(version, 0, 5, 7):
        catalog = catalog + [("decode_sum_seq_lens", "gauge", "The sum of all sequence lengths in decode.", S)]
    for name, kind, help_, lk in catalog:
        head(name, kind, help_)
        for i, labels in enumerate(kinds[lk]):
            if kind == "histogram":
                histogram(name, hists[name], labels)
            elif name == "graph_memory_usage_gb":
                sample(name, dict(labels, phase="decode"), round(static.graph_gb, 2))
            elif name.startswith("routing_key_"):
                for gt, le in ROUTING_BUCKETS:
                    sample(name, dict(labels, gt=gt, le=le), 0.0)
            elif name == "prefill_effective_tokens_total":
                for mode in ("input", "device_hit", "host_hit", "storage_hit"):
                    sample(name, dict(labels, mode=mode), float(state.realtime_prefill_tokens) if mode == "input" else 0.0)
            elif name == "scheduler_stage_seconds_total":
                for cat in STAGES:
                    value = state.busy_seconds if cat == "run_batch" else state.idle_seconds if cat == "idle" else 0.0
                    sample(name, dict(labels, category=cat, forward_overlap="none"), value)
            elif name in ("dp_attention_tokens_total", "dp_attention_pairs_total"):
                for k in ("scheduled", "imbalance"):
                    sample(name, dict(labels, kind=k), 0.0)
            elif name == "dp_attention_steps_total":
                for k in ("active", "idle"):
                    sample(name, dict(labels, rank_state=k), 0.0)
            elif name in counters:
                sample(name, labels, counters[name])
            else:
                sample(name, labels, float(gauges.get(name, lambda _i: 0.0)(i)))
    _lazy_series(state, version, static, kinds[S], head, sample)
    return "".join(out)


def _lazy_series(state: SimState, version: str, static: MetricsStatic, ranks: list[dict[str, str]],
                 head: Callable[[str, str, str], None], sample: Callable[[str, dict[str, str], float], None]) -> None:
    """Newer labelled counters: each family appears once something incremented it (0.5.7+ unless noted)."""
    if not at_least(version, 0, 5, 7):
        return
    dp = len(ranks)
    if state.retracted_requests_total:
        for name, value, help_ in (
            ("num_retracted_requests_total", state.retracted_requests_total, "Total number of retracted requests."),
            ("num_retracted_input_tokens_total", state.retracted_input_tokens_total, "Total number of retracted input tokens."),
            ("num_retracted_output_tokens_total", state.retracted_output_tokens_total, "Total number of retracted output tokens."),
        ):
            head(name, "counter", help_)
            for i, labels in enumerate(ranks):
                sample(name, labels, _split(float(value), dp, i))
    passes = [("decode_cuda_graph", state.graph_decode_passes), ("decode_none", state.eager_decode_passes)]
    if at_least(version, 0, 5, 10):
        passes.append(("prefill_none", state.prefill_batches))
    if any(v for _, v in passes):
        head("cuda_graph_passes_total", "counter", "Total number of forward passes categorized by CUDA graph.")
        for i, labels in enumerate(ranks):
            for mode, value in passes:
                if value:
                    sample("cuda_graph_passes_total", dict(labels, mode=mode), _split(float(value), dp, i))
    realtime = [("prefill_compute", state.realtime_prefill_tokens), ("decode", state.realtime_decode_tokens)]
    if any(v for _, v in realtime):
        head("realtime_tokens_total", "counter", "Total number of tokens processed (updated on each log interval). mode: prefill_compute, prefill_cache, decode.")
        for i, labels in enumerate(ranks):
            for mode, value in realtime:
                if value:
                    sample("realtime_tokens_total", dict(labels, mode=mode), _split(float(value), dp, i))
    if at_least(version, 0, 5, 11) and static.device_timer and state.busy_seconds:
        head("forward_execution_seconds_total", "counter", "Total time that GPU is busy executing model forward passes.")
        for i, labels in enumerate(ranks):
            sample("forward_execution_seconds_total", dict(labels, category="decode"), state.busy_seconds)
    if at_least(version, 0, 5, 10) and static.enable_mfu_metrics and state.realtime_decode_tokens:
        tokens = state.realtime_decode_tokens + state.realtime_prefill_tokens
        for name, value, help_ in (
            ("estimated_flops_per_gpu_total", tokens * static.flops_per_token, "Estimated number of floating point operations per GPU."),
            ("estimated_read_bytes_per_gpu_total", state.decode_steps * static.read_bytes_per_step, "Estimated number of bytes read from memory per GPU."),
            ("estimated_write_bytes_per_gpu_total", tokens * 1.0e4, "Estimated number of bytes written to memory per GPU."),
        ):
            head(name, "counter", help_)
            for i, labels in enumerate(ranks):
                sample(name, labels, _split(float(value), dp, i))
