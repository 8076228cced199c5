"""The simulated scheduler's live state, shared by the server (writes), `/metrics` (reads) and the fake GPUs (read).

Its own module so neither the metrics renderer nor the server imports the other for it. Two kinds of
values live here, as in a real SGLang scheduler (shared reference sglang-versions.md §9):

* live values (`running`, `allocated_tokens`, ...) change at every step; the fake GPUs follow them;
* `logged` holds the gauges as the scheduler last *wrote* them, at a prefill batch or every
  `decode_log_interval` decode steps; `/metrics` renders those, so a scrape between logs is stale.

Token counters grow when a request finishes (the whole request at once), not per step.
Plain attributes: read them from any thread.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Callable

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
RETRACTION_BUCKETS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 75.0, 100.0)
TOKENS_BUCKETS = (
    100.0, 300.0, 500.0, 700.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0, 7000.0, 8000.0,
    9000.0, 10000.0, 12500.0, 15000.0, 17500.0, 20000.0, 22500.0, 25000.0, 27500.0, 30000.0, 35000.0,
    40000.0, 60000.0, 80000.0, 100000.0, 200000.0, 300000.0, 400000.0, 600000.0, 800000.0, 1e6, 1.1e6,
)  # fmt: skip
TPOT_BUCKETS = ITL_BUCKETS


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


@dataclass
class LoggedGauges:
    """Scheduler gauges as last written (prefill batch log or decode log)."""

    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    num_used_tokens: int = 0
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    new_token_ratio: float = 0.0
    num_retracted_reqs: int = 0  # since the previous log
    decode_sum_seq_lens: int = 0
    cache_hit_rate: float = 0.0
    logged_at: float = 0.0  # monotonic time of the write
    log_count: int = 0


@dataclass
class PassRecord:
    """One forward pass as the scheduler ran it: what the profiler records and the trace writer draws."""

    t_end: float  # time.time() at the end of the pass
    dur_s: float  # modelled duration (the scenario's physics, not the test machine's clock)
    batch: int  # requests in the pass (decode: running; extend: requests prefilled)
    kv_tokens: float  # KV slots the pass reads (attention)
    mode: str = "DECODE"  # ForwardMode name: DECODE, EXTEND or MIXED (--enable-mixed-chunk)
    tokens: int = 0  # tokens computed: the batch for a decode pass, the prefill tokens for an extend pass
    max_seq: int = 0  # an extend pass's longest sequence (prefix + tokens so far): the DSA indexer's logits need it


@dataclass
class SimState:
    """Live scheduler state plus what the scheduler last logged."""

    max_running_requests: int = 0  # the effective cap, all DP ranks together
    max_total_num_tokens: int = 0  # KV capacity in tokens (all DP ranks together)
    dp_size: int = 1
    cuda_graph_max_bs: int = 0  # 0: decode graphs off
    # What the fake GPUs need of the resolved server (set at start-up).
    tp_size: int = 1
    mem_fraction_static: float = 0.0
    allreduce_bytes_per_token: float = 0.0  # hidden x 2 B x 2 all-reduces per layer x layers
    running: int = 0
    queued: int = 0
    allocated_tokens: int = 0  # KV slots held by running requests: prompt + generated so far
    token_usage: float = 0.0  # allocated_tokens / max_total_num_tokens (live)
    new_token_ratio: float = 0.0
    gen_throughput: float = 0.0  # tokens/s over the last second (live)
    step_time_s: float = 0.0  # duration of the last forward pass (decode or extend)
    step_tokens: int = 0  # tokens the last pass computed (the decode batch, or an extend pass's prefill tokens)
    pass_mode: str = "DECODE"  # the last pass: DECODE, EXTEND or MIXED
    decode_step_time_s: float = 0.0  # duration of the last decode pass
    extend_passes: int = 0
    step_eager: bool = True  # the last decode step ran without a CUDA graph
    last_step_at: float = 0.0  # time.monotonic() of the last step (0: never)
    prefill_tokens_last_step: int = 0
    decode_steps: int = 0  # forward_ct_decode
    eager_decode_passes: int = 0
    graph_decode_passes: int = 0
    prefill_batches: int = 0
    live_generated_tokens: int = 0  # every token emitted (the throughput meter; not a Prometheus counter)
    retracted_since_log: int = 0
    retracted_requests_total: int = 0
    retracted_input_tokens_total: int = 0
    retracted_output_tokens_total: int = 0
    busy_seconds: float = 0.0  # time spent in forward steps (forward_execution_seconds_total)
    idle_seconds: float = 0.0  # time with no runnable or queued work
    realtime_prefill_tokens: int = 0
    realtime_decode_tokens: int = 0
    # Counters that grow when a request finishes.
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    cached_tokens_total: int = 0
    completed_requests: int = 0
    aborted_requests: int = 0
    logged: LoggedGauges = field(default_factory=LoggedGauges)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(QUEUE_BUCKETS))
    retractions: Histogram = field(default_factory=lambda: Histogram(RETRACTION_BUCKETS))
    prompt_len: Histogram = field(default_factory=lambda: Histogram(TOKENS_BUCKETS))
    output_len: Histogram = field(default_factory=lambda: Histogram(TOKENS_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    peak_running: int = 0  # highest `running` seen (the simulated host reports it)
    peak_queued: int = 0
    # Optional hook: a factor on each step's duration (the simulated host slows steps while GPUs throttle).
    step_scale_fn: Callable[[], float] | None = None
    # Called at the end of every forward pass, on the server's thread (the profiler records passes here,
    # so a capture never misses one however busy the test machine is).
    pass_listeners: list[Callable[[PassRecord], None]] = field(default_factory=list)

    @property
    def kv_used_tokens(self) -> int:
        """Kept for readers of the old name: the allocated KV slots."""
        return self.allocated_tokens
