"""Fleet probe over SGLang's `/metrics` series: `sglang.metrics` values for every server at once, from PromQL.

The same concepts the host probe names (`running`, `queued`, `kv_usage`, `retractions`, graph passes), read
over the window by the engine: counts summed over DP ranks, usage maxed over them, as `sglang.metrics` does.
A median of a sum is not the sum of medians; with one DP rank (most servers) they are the same, above one
`running.p50` is the sum of the ranks' medians (said in the notes). The running-request cap lives in
`/server_info`, not in the metrics: `running_cap` and the ratios to it stay null (a host run reads them).
"""

from __future__ import annotations

from typing import Any

from ..server.values import (
    MetricsValues,
    gauges_current,
    written_in_window,
    written_together,
)
from .client import FleetAnswer, FleetProbe, HostKey, Sample, Window

SPREAD = {"mean": "avg_over_time", "min": "min_over_time", "p50": "quantile:0.5", "max": "max_over_time", "last": "last_over_time"}
GAUGES = {"running": ("sglang:num_running_reqs", "sum"), "queued": ("sglang:num_queue_reqs", "sum"),
          "kv_usage": ("sglang:token_usage", "max"), "used_tokens": ("sglang:num_used_tokens", "sum")}  # fmt: skip
COUNTERS = {  # answer -> (metric, function, aggregation)
    "retractions": ("sglang:num_retracted_requests_total", "increase", "sum"),
    "gen_tokens_per_s": ("sglang:generation_tokens_total", "rate", "sum"),
    "prompt_tokens_per_s": ("sglang:prompt_tokens_total", "rate", "sum"),
    "requests_per_s": ("sglang:num_requests_total", "rate", "sum"),
    "requests_completed": ("sglang:num_requests_total", "increase", "sum"),
    "max_total_num_tokens": ("sglang:max_total_num_tokens", "last_over_time", "sum"),
    "dp_ranks": ("sglang:num_running_reqs", "last_over_time", "count"),
    "scrapes": ("sglang:num_running_reqs", "count_over_time", "max"),
    "gauge_changes": ("sglang:num_running_reqs", "changes", "max"),
    # whether each gauge the rules read was written in the window (sglang.metrics' gauge_age): a gauge the
    # scheduler last wrote before the window opened shows no change in it
    "queued_changes": ("sglang:num_queue_reqs", "changes", "max"),
    "kv_usage_changes": ("sglang:token_usage", "changes", "max"),
    "used_tokens_changes": ("sglang:num_used_tokens", "changes", "max"),
}
# sglang.metrics' gauge_age concepts -> the answer that says whether the gauge changed in the window (None: not read)
AGE_ANSWERS = {"running": "gauge_changes", "queued": "queued_changes", "kv_usage": "kv_usage_changes",
               "num_used_tokens": "used_tokens_changes", "gen_throughput": None, "new_token_ratio": None}


def _fn(fn: str, sel: str, rng: str) -> str:
    if fn.startswith("quantile:"):
        return f"quantile_over_time({fn.split(':')[1]}, {sel}[{rng}])"
    return f"{fn}({sel}[{rng}])"


def server_queries(window: Window, key: HostKey) -> dict[str, str]:
    by = ", ".join(dict.fromkeys([*key.labels(), "instance"]))
    out: dict[str, str] = {}
    for concept, (metric, agg) in GAUGES.items():
        for stat, fn in SPREAD.items():
            out[f"{concept}_{stat}"] = f"{agg} by ({by}) ({_fn(fn, window.sel(metric), window.range)})"
    for name, (metric, fn, agg) in COUNTERS.items():
        out[name] = f"{agg} by ({by}) ({_fn(fn, window.sel(metric), window.range)})"
    out["graph_passes"] = f"sum by ({by}, mode) (increase({window.sel('sglang:cuda_graph_passes_total')}[{window.range}]))"
    return out


def _spread(v: dict[str, float], concept: str) -> dict[str, float | None]:
    return {stat: (round(v[f"{concept}_{stat}"], 6) if f"{concept}_{stat}" in v else None) for stat in SPREAD}


def _age(v: dict[str, float], answer: str | None) -> dict[str, Any]:
    """A gauge's age as PromQL can tell it: whether it changed in the window, not when (written_s and age_s
    stay null); a gauge the fleet does not read was not read before the window either."""
    changed = v.get(answer, 0.0) > 0 if answer else True
    return {"written_s": None, "age_s": None, "before_window": not changed}


class SglangMetricsFleet(FleetProbe):
    """`sglang.metrics`'s values from the server's series: batch, queue, KV usage, retractions, graph passes."""

    name = "prom.sglang.metrics"
    serves = "sglang.metrics"
    Values = MetricsValues
    source = "server"

    def fill_servers(self, answers: dict[str, list[Sample]], key: HostKey, window: Window) -> tuple[FleetAnswer, dict[str, str]]:
        """Per-host values, and each host's server `instance` (for the `runbook run` command)."""
        per: dict[str, dict[str, float]] = {}
        passes: dict[str, dict[str, float]] = {}
        instances: dict[str, str] = {}
        for name, samples in answers.items():
            for s in samples:
                host = key.of(s.labels)
                if host is None:
                    continue
                if "instance" in s.labels:
                    instances.setdefault(host, s.labels["instance"])
                if name == "graph_passes":
                    passes.setdefault(host, {})[s.labels.get("mode", "")] = s.value
                else:
                    per.setdefault(host, {})[name] = s.value
        ans = FleetAnswer()
        for host, v in per.items():
            if "running_mean" not in v:
                continue  # a host with other sglang series but no scheduler gauges: not a server we can read
            dp = int(v.get("dp_ranks") or 1)
            running, queued, usage = _spread(v, "running"), _spread(v, "queued"), _spread(v, "kv_usage")
            per_dp = {k: (round(x / dp, 6) if x is not None else None) for k, x in running.items()}
            p = passes.get(host, {})
            graph, eager = p.get("decode_cuda_graph"), p.get("decode_none")
            decode = (graph or 0.0) + (eager or 0.0) if p else None
            values: dict[str, Any] = {
                "scrapes": int(v.get("scrapes", 0)),
                "window_s": window.seconds,
                "num_running_reqs": {k: running[k] for k in ("mean", "max", "last")},
                "num_queue_reqs": {k: queued[k] for k in ("mean", "max", "last")},
                "token_usage": {k: usage[k] for k in ("mean", "max", "last")},
                "num_used_tokens": {k: _spread(v, "used_tokens")[k] for k in ("mean", "max", "last")},
                "gen_throughput": {"mean": None, "max": None},
                "generation_tokens_per_s": v.get("gen_tokens_per_s"),
                "prompt_tokens_per_s": v.get("prompt_tokens_per_s"),
                "requests_per_s": v.get("requests_per_s"),
                "requests_completed": int(v["requests_completed"]) if "requests_completed" in v else None,
                "cache_hit_rate": None,
                "ttft_s": {"p50": None, "p95": None}, "itl_s": {"p50": None, "p95": None},
                "e2e_s": {"p50": None, "p95": None}, "queue_time_s": {"p50": None, "p95": None},
                "max_running_requests": None,
                "max_total_num_tokens": int(v["max_total_num_tokens"]) if "max_total_num_tokens" in v else None,
                "running_to_cap": None,
                "running": running, "running_per_dp": per_dp, "dp_ranks": dp, "queued": queued, "kv_usage": usage,
                "new_token_ratio": {k: None for k in SPREAD},
                "gauge_refreshes": int(v.get("gauge_changes", 0)),
                "gauge_age": written_together({c: _age(v, answer) for c, answer in AGE_ANSWERS.items()}, None),
                # the 0.5.7+ counter appears at the first retraction: absent counts as none (its source then null;
                # a release before 0.5.7 has no counter, and a host run reads its gauge)
                "retractions": v.get("retractions", 0.0),
                "retractions_source": "num_retracted_requests_total" if "retractions" in v else None,
                "decode_graph_passes": graph, "decode_eager_passes": eager, "decode_passes": decode,
                "decode_graph_share": round(graph / decode, 6) if graph is not None and decode else None,
                "forward_busy_share": None, "scheduler_idle_share": None,
                "est_read_gb_per_s_per_gpu": None, "est_tflops_per_gpu": None,
                "running_cap": None, "running_cap_source": None, "running_to_cap_p50": None, "running_to_cap_max": None,
            }  # fmt: skip
            values["gauges_written_in_window"] = written_in_window(values["gauge_age"])
            values["gauges_current"] = gauges_current(values)
            ans.values[host] = values
            if dp > 1:
                ans.notes.setdefault(host, []).append(f"{dp} DP ranks: running.p50 is the sum of the ranks' medians")
        return ans, instances


SERVER_FAMILY = (SglangMetricsFleet,)
