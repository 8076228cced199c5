"""SGLang-shaped Prometheus exposition for the simulated server.

Written by hand (not through a prometheus_client registry) so the label sets, sample order and
histogram layout follow SGLang's multiprocess output per version (`_sum`, `_bucket`s, `_count`;
labels sorted, `le` among them; `pid` on two gauges), and so rendering stays cheap under load.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .sglang_info import version_tuple

if TYPE_CHECKING:
    from .sglang_server import SimState

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1,
    0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0, 600.0, 1200.0, 1800.0, 2400.0,
)  # fmt: skip
QUEUE_BUCKETS = (
    0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0,
    90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0, 1400.0,
    1600.0, 1800.0, 2000.0, 2500.0, 3000.0,
)  # fmt: skip


@dataclass
class Histogram:
    """Cumulative-on-render histogram; `observe_n` spreads one interval over n tokens like SGLang's ITL."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def observe_n(self, interval: float, n: int) -> None:
        self.counts[bisect_left(self.bounds, interval / n)] += n
        self.total += interval
        self.count += n


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{d[k]}"' for k in sorted(d)) + "}"


def _fmt(v: float) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return repr(float(v))


def render(state: "SimState", *, version: str, model_name: str, pid: int) -> str:
    """The `/metrics` body for `version` from the live scheduler state."""
    vt = version_tuple(version)
    sched = {"engine_type": "unified", "model_name": model_name, "pp_rank": "0", "tp_rank": "0"}
    if vt >= (0, 5, 8):
        sched["moe_ep_rank"] = "0"
    tok: dict[str, str] = {"model_name": model_name}
    if vt >= (0, 5, 12):
        tok["engine_type"] = "unified"
    streaming = dict(tok, is_streaming="true") if vt > (0, 5, 12) else tok
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, dict[str, str], float]]) -> None:
        out.append(f"# HELP sglang:{name} {help_}\n# TYPE sglang:{name} {kind}\n")
        for suffix, labels, value in samples:
            out.append(f"sglang:{name}{suffix}{_labels(labels)} {_fmt(value)}\n")

    def histogram(name: str, help_: str, h: Histogram, labels: dict[str, str]) -> None:
        samples: list[tuple[str, dict[str, str], float]] = [("_sum", labels, h.total)]
        running = 0
        for bound, c in zip(h.bounds, h.counts):
            running += c
            samples.append(("_bucket", dict(labels, le=repr(float(bound))), float(running)))
        samples.append(("_bucket", dict(labels, le="+Inf"), float(h.count)))
        samples.append(("_count", labels, float(h.count)))
        metric(name, "histogram", help_, samples)

    if vt >= (0, 5, 6):
        metric("max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.",
               [("", sched, float(state.max_total_num_tokens))])  # fmt: skip
    pid_labels = dict(sched, pid=str(pid))
    metric("num_retracted_reqs", "gauge", "The number of retracted requests.", [("", pid_labels, 0.0)])
    metric("num_paused_reqs", "gauge", "The number of paused requests by async weight sync.", [("", pid_labels, 0.0)])
    metric("prompt_tokens_total", "counter", "Number of prefill tokens processed.", [("", streaming, float(state.prompt_tokens_total))])
    metric("generation_tokens_total", "counter", "Number of generation tokens processed.",
           [("", streaming, float(state.generation_tokens_total))])  # fmt: skip
    metric("num_requests_total", "counter", "Number of requests processed.", [("", streaming, float(state.completed_requests))])
    cached = dict(tok, cache_source="total") if vt > (0, 5, 12) else tok
    metric("cached_tokens_total", "counter", "Number of cached prompt tokens.", [("", cached, float(state.cached_tokens_total))])
    histogram("queue_time_seconds", "Histogram of queueing time in seconds.", state.queue_time, sched)
    histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", state.ttft, streaming)
    histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", state.itl, tok)
    histogram("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", state.e2e, streaming)
    gauges = [
        ("num_running_reqs", "The number of running requests.", state.running),
        ("num_used_tokens", "The number of used tokens.", state.kv_used_tokens),
        ("token_usage", "The token usage.", round(state.token_usage, 4)),
        ("gen_throughput", "The generation throughput (token/s).", round(state.gen_throughput, 2)),
        ("num_queue_reqs", "The number of requests in the waiting queue.", state.queued),
        ("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", 0),
        ("cache_hit_rate", "The prefix cache hit rate.", 0.0),
        ("utilization", "The utilization.", 0.0),
        ("new_token_ratio", "The new token ratio.", round(state.token_usage, 4)),
        ("is_cuda_graph", "Whether the batch is using CUDA graph.", 1.0 if 0 < state.running <= state.cuda_graph_max_bs else 0.0),
    ]
    for name, help_, value in gauges:
        metric(name, "gauge", help_, [("", sched, float(value))])
    return "".join(out)
