"""The metrics window by concept, for every server family: a family's parser files each of its series under a
concept name below (running, queued, KV usage, ...), and the window's values are worked out here, once.

A scrape carries no write time, so gauge ages are placed at the first scrape that showed a value; counters
that go down are a restart and count from zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .values import gauges_current, written_in_window, written_together

# Concepts a family's parser fills (gauges, counters, labelled counters, histograms); a series a release lacks is absent.
RUNNING = "running"
QUEUED = "queued"
GEN_THROUGHPUT = "gen_throughput"
KV_USED_TOKENS = "kv_used_tokens"
RETRACTED_GAUGE = "retracted_gauge"
DECODE_SUM_SEQ_LENS = "decode_sum_seq_lens"
KV_USAGE = "kv_usage"
KV_CAPACITY = "kv_capacity_tokens"
CACHE_HIT_RATE_GAUGE = "cache_hit_rate"
NEW_TOKEN_RATIO = "new_token_ratio"
PROMPT_TOKENS = "prompt_tokens"
GENERATION_TOKENS = "generation_tokens"
REQUESTS_FINISHED = "requests_finished"
CACHED_TOKENS = "cached_tokens"
RETRACTIONS = "retractions"
FORWARD_SECONDS = "forward_seconds"
IDLE_SECONDS = "scheduler_idle_seconds"
EST_FLOPS = "est_flops_per_gpu"
EST_READ_BYTES = "est_read_bytes_per_gpu"
EST_WRITE_BYTES = "est_write_bytes_per_gpu"
GRAPH_PASSES = "graph_passes"
TTFT = "ttft"
ITL = "itl"
E2E = "e2e"
QUEUE_TIME = "queue_time"
GRAPH_DECODE_MODES = ("decode_cuda_graph", "decode_none")  # GRAPH_PASSES' label values: in a graph, eager


@dataclass
class Snapshot:
    """One scrape, aggregated across ranks: gauges, counters and histogram buckets (le -> count)."""

    t: float
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    labelled: dict[str, dict[str, float]] = field(default_factory=dict)  # counter -> label value -> value
    per_dp: dict[str, dict[str, float]] = field(default_factory=dict)  # gauge -> dp_rank -> value (DP attention)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # concept -> the series it was read from (its family's words)


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


def stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "max": None, "last": None}
    return {"mean": round(sum(values) / len(values), 4), "max": round(max(values), 4), "last": round(values[-1], 4)}



class WindowParams(BaseModel):
    """A metrics window's params, the same for every family's metrics probe."""

    model_config = ConfigDict(extra="forbid")
    duration_s: float = Field(10.0, gt=0, le=3600)
    interval_s: float = Field(1.0, gt=0, le=600)
    request_timeout_s: float = Field(5.0, gt=0, le=600)


def age_note(age: dict[str, Any]) -> str:
    """How old the series' last value is: the scheduler writes its gauges only at its logs."""
    if age["before_window"]:
        return " (last written before the window: the scheduler wrote no new value during it)"
    if age["written_s"] is not None:
        return f" (last written ~{age['written_s']:g} s into the window, {age['age_s']:g} s before its end)"
    return ""


def summarize_window(snaps: list[Snapshot], conf: dict[str, Any] | None = None) -> dict[str, Any]:
    """The metrics values (`MetricsValues`) from a list of scrapes. `conf` holds the family's configuration by
    concept: `max_running_requests` (the cap as the server reports it), `max_running_requests_total` (summed over
    DP groups where the cap is per group), `kv_capacity_tokens`, `attn_dp`, `running_cap` and its source."""
    conf = conf or {}
    first, last = snaps[0], snaps[-1]
    window = max(1e-9, last.t - first.t)

    def series(name: str) -> list[float]:
        return [s.gauges[name] for s in snaps if name in s.gauges]

    def rate(name: str) -> float | None:
        inc = counter_increase(first, last, name)
        return round(inc / window, 3) if inc is not None else None

    gen = stats(series(GEN_THROUGHPUT))
    values: dict[str, Any] = {
        "scrapes": len(snaps),
        "window_s": round(window, 3),
        "num_running_reqs": stats(series(RUNNING)),
        "num_queue_reqs": stats(series(QUEUED)),
        "token_usage": stats(series(KV_USAGE)),
        "num_used_tokens": stats(series(KV_USED_TOKENS)),
        "gen_throughput": {"mean": gen["mean"], "max": gen["max"]},
        "generation_tokens_per_s": rate(GENERATION_TOKENS),
        "prompt_tokens_per_s": rate(PROMPT_TOKENS),
        "requests_per_s": rate(REQUESTS_FINISHED),
    }
    done = counter_increase(first, last, REQUESTS_FINISHED)
    values["requests_completed"] = int(done) if done is not None else None
    prompt = counter_increase(first, last, PROMPT_TOKENS)
    cached = counter_increase(first, last, CACHED_TOKENS)
    values["cache_hit_rate"] = round(cached / prompt, 4) if prompt and cached is not None else None
    for hist, key in (
        (TTFT, "ttft_s"),
        (ITL, "itl_s"),
        (E2E, "e2e_s"),
        (QUEUE_TIME, "queue_time_s"),
    ):
        values[key] = window_quantiles(first, last, hist)
    cap = conf.get("max_running_requests")
    values["max_running_requests"] = cap
    kv = last.gauges.get(KV_CAPACITY)
    if kv is None and isinstance(conf.get("kv_capacity_tokens"), (int, float)):
        kv = conf["kv_capacity_tokens"]
    values["max_total_num_tokens"] = int(kv) if kv is not None and math.isfinite(kv) else None
    rmax = values["num_running_reqs"]["max"]
    # running is summed over DP groups; a per-DP cap must be summed the same way (the family says so)
    total_cap = conf.get("max_running_requests_total", cap)
    values["running_to_cap"] = round(rmax / total_cap, 4) if total_cap and rmax is not None else None
    values.update(window_concepts(snaps, conf))
    return values


def spread(values: list[float]) -> dict[str, float | None]:
    """{mean, min, p50, max, last}: gauges are refreshed only at scheduler logs, so a rule wants the median too."""
    if not values:
        return {"mean": None, "min": None, "p50": None, "max": None, "last": None}
    ordered = sorted(values)
    return {"mean": round(sum(values) / len(values), 4), "min": round(ordered[0], 4), "p50": round(ordered[len(ordered) // 2], 4),
            "max": round(ordered[-1], 4), "last": round(values[-1], 4)}  # fmt: skip


def refreshes(snaps: list[Snapshot], names: tuple[str, ...]) -> int:
    """How many scrapes saw a new value of any of `names`: a real scheduler writes its gauges only at its logs."""
    seen, prev = 0, None
    for s in snaps:
        cur = tuple(s.gauges.get(n) for n in names)
        if prev is not None and cur != prev:
            seen += 1
        prev = cur
    return seen


GAUGE_CONCEPTS = {"running": RUNNING, "queued": QUEUED, "kv_usage": KV_USAGE,
                  "num_used_tokens": KV_USED_TOKENS, "gen_throughput": GEN_THROUGHPUT,
                  "new_token_ratio": NEW_TOKEN_RATIO}  # fmt: skip


def gauge_age(snaps: list[Snapshot], metric: str) -> dict[str, Any]:
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


def window_concepts(snaps: list[Snapshot], conf: dict[str, Any]) -> dict[str, Any]:
    """The window named by concept (running, queued, KV usage, retractions, graph passes); `conf` as in
    `summarize_window`."""
    first, last = snaps[0], snaps[-1]
    window = max(1e-9, last.t - first.t)

    def series(name: str) -> list[float]:
        return [s.gauges[name] for s in snaps if name in s.gauges]

    ranks = max((len(s.per_dp.get(RUNNING, {})) for s in snaps), default=0) or conf.get("attn_dp") or 1
    running = series(RUNNING)
    out: dict[str, Any] = {
        "running": spread(running),
        "running_per_dp": spread([r / ranks for r in running]),
        "dp_ranks": ranks,
        "queued": spread(series(QUEUED)),
        "kv_usage": spread(series(KV_USAGE)),
        "new_token_ratio": spread(series(NEW_TOKEN_RATIO)),
        "gauge_refreshes": refreshes(snaps, (RUNNING, QUEUED, KV_USAGE)),
        "gauge_age": written_together({concept: gauge_age(snaps, metric) for concept, metric in GAUGE_CONCEPTS.items()}, snaps[-1].t - snaps[0].t),
    }
    out["gauges_written_in_window"] = written_in_window(out["gauge_age"])
    out["gauges_current"] = gauges_current(out)
    # Retractions: the counter (0.5.7+) is exact; the gauge counts since the previous log and resets, so sum its refreshes.
    inc = counter_increase(first, last, RETRACTIONS)
    if inc is not None:
        out["retractions"], out["retractions_source"] = inc, last.names.get(RETRACTIONS, RETRACTIONS)
    else:
        readings = series(RETRACTED_GAUGE)
        if readings:
            total, prev = 0.0, None
            for r in readings:
                if r != prev and r > 0:
                    total += r
                prev = r
            out["retractions"], out["retractions_source"] = total, f"{last.names.get(RETRACTED_GAUGE, RETRACTED_GAUGE)} gauge (sum of its log values)"
        else:
            out["retractions"], out["retractions_source"] = None, None
    # Which decode passes ran in a CUDA graph (0.5.7+, counted on every decode pass); is_cuda_graph is never set.
    pa, pb = first.labelled.get(GRAPH_PASSES), last.labelled.get(GRAPH_PASSES)
    if pb is not None:
        pa = pa or {}
        d = {k: max(0.0, v - pa.get(k, 0.0)) for k, v in pb.items()}
        graph, eager = (d.get(mode, 0.0) for mode in GRAPH_DECODE_MODES)
        out["decode_graph_passes"], out["decode_eager_passes"] = graph, eager
        out["decode_passes"] = graph + eager
        out["decode_graph_share"] = round(graph / (graph + eager), 4) if graph + eager else None
    else:
        out.update(decode_graph_passes=None, decode_eager_passes=None, decode_passes=None, decode_graph_share=None)
    for counter, key, scale in (
        (FORWARD_SECONDS, "forward_busy_share", 1.0),
        (IDLE_SECONDS, "scheduler_idle_share", 1.0),
        (EST_READ_BYTES, "est_read_gb_per_s_per_gpu", 1e-9),
        (EST_FLOPS, "est_tflops_per_gpu", 1e-12),
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

