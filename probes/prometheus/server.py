"""Fleet probes over the servers' `/metrics` series: the `server.metrics` values of every server at once, from PromQL,
SGLang's (`sglang:` series, as `sglang.metrics` fills them) and vLLM's (`vllm:` series, as `vllm.metrics` does).

The same concepts the host probes name (`running`, `queued`, `kv_usage`, `retractions`, token rates, graph passes),
read over the window by the engine: counts summed over DP ranks (SGLang) or DP engines (vLLM's `engine` label),
usage maxed over them. A median of a sum is not the sum of medians; with one DP rank (most servers) they are the same,
above one `running.p50` is the sum of the ranks' medians (said in the notes). SGLang's running-request cap lives in
`/server_info`, not in the metrics: `running_cap` and the ratios to it stay null (a host run reads them); vLLM's
`max_num_seqs` is in no series either, and a vLLM host's cap is measured as `vllm.metrics` measures it without dev
mode (running pinned at one number over the window's second half while requests wait and the KV cache has room).
A host is SGLang or vLLM by the series it has (`server_kind` in its values): the judge reads the runbook as that
server reads it. vLLM's KV gauge is asked under both its names (`vllm:kv_cache_usage_perc` from 0.9.2,
`vllm:gpu_cache_usage_perc` before and hidden from 0.11: probes/vllm/facts.py), the new name first, so every
release's host is read.
"""

from __future__ import annotations

from typing import Any, Iterator

from ..server.values import (
    MetricsValues,
    gauges_current,
    written_in_window,
    written_together,
)
from ..vllm import facts as vllm_facts
from ..vllm.values import VllmMetricsValues
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
    """Every server-side query of a fleet run: SGLang's, then vLLM's (their names prefixed `VLLM`)."""
    return {**sglang_queries(window, key), **{VLLM + name: q for name, q in vllm_queries(window, key).items()}}


def sglang_queries(window: Window, key: HostKey) -> dict[str, str]:
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



def _by_host(answers: dict[str, list[Sample]], key: HostKey, instances: dict[str, str]) -> Iterator[tuple[str, str, Sample]]:
    """Every answer's samples with the host their labels name (a sample no host label names is left out), noting
    each host's first server `instance` in `instances` (for the `runbook run` command)."""
    for name, samples in answers.items():
        for s in samples:
            host = key.of(s.labels)
            if host is None:
                continue
            if "instance" in s.labels:
                instances.setdefault(host, s.labels["instance"])
            yield name, host, s

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
        for name, host, s in _by_host(answers, key, instances):
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
                "server_kind": "sglang",
            }  # fmt: skip
            values["gauges_written_in_window"] = written_in_window(values["gauge_age"])
            values["gauges_current"] = gauges_current(values)
            ans.values[host] = values
            if dp > 1:
                ans.notes.setdefault(host, []).append(f"{dp} DP ranks: running.p50 is the sum of the ranks' medians")
        return ans, instances


# -- vLLM ----------------------------------------------------------------------------------------------------------

VLLM = "vllm_"  # server_queries' prefix of the vLLM queries' names
# the KV gauge's names, the 0.9.2+ one first (facts.KV_USAGE_NAMES lists the old one first)
KV_NAMES = tuple(name for name, *_ in sorted(vllm_facts.KV_USAGE_NAMES, key=lambda row: row[0] != "vllm:kv_cache_usage_perc"))
VLLM_GAUGES = {"running": "vllm:num_requests_running", "queued": "vllm:num_requests_waiting"}  # summed over engines
VLLM_COUNTERS = {  # answer -> (metric, function, aggregation), as probes/vllm/server.py files them
    "retractions": ("vllm:num_preemptions_total", "increase", "sum"),
    "gen_tokens_per_s": ("vllm:generation_tokens_total", "rate", "sum"),
    "prompt_tokens_per_s": ("vllm:prompt_tokens_total", "rate", "sum"),
    "requests_per_s": ("vllm:request_success_total", "rate", "sum"),
    "requests_completed": ("vllm:request_success_total", "increase", "sum"),
    "dp_ranks": ("vllm:num_requests_running", "last_over_time", "count"),
    "scrapes": ("vllm:num_requests_running", "count_over_time", "max"),
    "gauge_changes": ("vllm:num_requests_running", "changes", "max"),
    "queued_changes": ("vllm:num_requests_waiting", "changes", "max"),
    # prefix-cache tokens: the 0.9.2+ pair, else the `gpu_` pair
    "hits_new": ("vllm:prefix_cache_hits_total", "increase", "sum"),
    "queries_new": ("vllm:prefix_cache_queries_total", "increase", "sum"),
    "hits_old": ("vllm:gpu_prefix_cache_hits_total", "increase", "sum"),
    "queries_old": ("vllm:gpu_prefix_cache_queries_total", "increase", "sum"),
}
VLLM_HISTOGRAMS = {  # values key -> the histogram's names (inter-token latency: time per output token before 0.10.2)
    "ttft_s": ("vllm:time_to_first_token_seconds",),
    "itl_s": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e_s": ("vllm:e2e_request_latency_seconds",),
    "queue_time_s": ("vllm:request_queue_time_seconds",),
}
KV_ROOM = 0.8  # as vllm.metrics' pinned cap: KV usage below which the cache still has room
PINNED_SOURCE = "measured: running pinned at one number while requests wait and the KV cache has room"  # vllm.metrics' words
VLLM_AGE_ANSWERS = {"running": "gauge_changes", "queued": "queued_changes", "kv_usage": "kv_usage_changes",
                    "num_used_tokens": None, "gen_throughput": None, "new_token_ratio": None}  # fmt: skip


def _either(agg: str, by: str, fn: str, window: Window, names: tuple[str, ...], rng: str | None = None) -> str:
    """One series under any of its names, the first name's where a host has several (`or`: the engine drops the
    metric name in a function, so a regex over both names would give two series of one labelset)."""
    return " or ".join(f"{agg} by ({by}) ({_fn(fn, window.sel(n), rng or window.range)})" for n in names)


def vllm_queries(window: Window, key: HostKey) -> dict[str, str]:
    by = ", ".join(dict.fromkeys([*key.labels(), "instance"]))
    out: dict[str, str] = {}
    for concept, metric in VLLM_GAUGES.items():
        for stat, fn in SPREAD.items():
            out[f"{concept}_{stat}"] = f"sum by ({by}) ({_fn(fn, window.sel(metric), window.range)})"
    for stat, fn in SPREAD.items():
        out[f"kv_usage_{stat}"] = _either("max", by, fn, window, KV_NAMES)
    out["kv_usage_changes"] = _either("max", by, "changes", window, KV_NAMES)
    for i, name in enumerate(KV_NAMES):  # which name each host exports (kv_usage_series)
        out[f"kv_series_{i}"] = f"count by ({by}) (last_over_time({window.sel(name)}[{window.range}]))"
    for name, (metric, fn, agg) in VLLM_COUNTERS.items():
        out[name] = f"{agg} by ({by}) ({_fn(fn, window.sel(metric), window.range)})"
    # KV capacity: num_gpu_blocks x block_size (kv_cache_size_tokens from 0.24) of cache_config_info's labels
    out["cache_config"] = (f"max by ({by}, num_gpu_blocks, block_size, kv_cache_size_tokens) "
                           f"(last_over_time({window.sel('vllm:cache_config_info')}[{window.range}]))")  # fmt: skip
    for key_, names in VLLM_HISTOGRAMS.items():
        for q in (0.5, 0.95):
            out[f"{key_}_p{int(q * 100)}"] = " or ".join(
                f"histogram_quantile({q}, sum by ({by}, le) (increase({window.sel(n + '_bucket')}[{window.range}])))" for n in names)
    # the pinned cap over the window's second half (vllm.metrics' pinned_cap): every engine's running count at one
    # number, requests waiting throughout, the KV cache with room
    half = Window(window.seconds / 2, window.at, window.matchers).range
    out["pin_running_min"] = f"sum by ({by}) (min_over_time({window.sel(VLLM_GAUGES['running'])}[{half}]))"
    out["pin_running_max"] = f"sum by ({by}) (max_over_time({window.sel(VLLM_GAUGES['running'])}[{half}]))"
    out["pin_queued_min"] = f"sum by ({by}) (min_over_time({window.sel(VLLM_GAUGES['queued'])}[{half}]))"
    out["pin_kv_max"] = _either("max", by, "max_over_time", window, KV_NAMES, half)
    return out


def _kv_tokens(labels: dict[str, str]) -> int | None:
    """One engine's KV tokens from cache_config_info's labels (probes/vllm/server.py _kv_tokens)."""
    def num(name: str) -> int | None:
        try:
            return int(float(labels.get(name, "")))
        except ValueError:
            return None

    size = num("kv_cache_size_tokens")
    if size:
        return size
    blocks, block = num("num_gpu_blocks"), num("block_size")
    return blocks * block if blocks and block else None


class VllmMetricsFleet(FleetProbe):
    """`vllm.metrics`'s values from vLLM's series: running, waiting, KV usage (either name), preemptions, token rates,
    latency quantiles, the measured cap."""

    name = "prom.vllm.metrics"
    serves = "vllm.metrics"
    Values = VllmMetricsValues
    source = "server"

    def fill_servers(self, answers: dict[str, list[Sample]], key: HostKey, window: Window) -> tuple[FleetAnswer, dict[str, str]]:
        """Per-host values (`answers` keyed as `vllm_queries` names them), and each host's server `instance`."""
        per: dict[str, dict[str, float]] = {}
        caches: dict[str, int] = {}
        instances: dict[str, str] = {}
        for name, host, s in _by_host(answers, key, instances):
            if name == "cache_config":
                tokens = _kv_tokens(s.labels)
                if tokens is not None:
                    caches[host] = max(caches.get(host, 0), tokens)
            else:
                per.setdefault(host, {})[name] = s.value
        ans = FleetAnswer()
        for host, v in per.items():
            if "running_mean" not in v:
                continue  # other vllm: series but no scheduler gauges: not a server we can read
            ans.values[host] = self._values(v, caches.get(host), window)
            dp = ans.values[host]["dp_ranks"]
            if dp > 1:
                ans.notes.setdefault(host, []).append(f"{dp} DP engines: running.p50 is the sum of the engines' medians")
        return ans, instances

    @staticmethod
    def _values(v: dict[str, float], kv_tokens: int | None, window: Window) -> dict[str, Any]:
        unknown: dict[str, str] = {}
        dp = int(v.get("dp_ranks") or 1)
        running, queued, usage = _spread(v, "running"), _spread(v, "queued"), _spread(v, "kv_usage")
        per_dp = {k: (round(x / dp, 6) if x is not None else None) for k, x in running.items()}
        kv_series = next((name for i, name in enumerate(KV_NAMES) if f"kv_series_{i}" in v), None)
        if kv_series is None:
            unknown["kv_usage"] = "neither vllm:kv_cache_usage_perc nor vllm:gpu_cache_usage_perc is exported"
        hit_rate = None
        for pair in ("new", "old"):
            if f"hits_{pair}" in v and f"queries_{pair}" in v:
                q = v[f"queries_{pair}"]
                hit_rate = round(v[f"hits_{pair}"] / q, 4) if q else None
                break
        else:
            unknown["cache_hit_rate"] = "no prefix-cache counters (prefix caching off, or not exported)"
        # the cap: in no series (max_num_seqs is in dev mode's /server_info or the launch arguments: a host run reads
        # them); measured where running sat at one number over the window's second half while requests waited and the
        # KV cache had room, as vllm.metrics measures it
        pin = v.get("pin_running_min")
        cap = (int(pin) if pin and pin == v.get("pin_running_max") and v.get("pin_queued_min", 0.0) >= 1
               and v.get("pin_kv_max", 1.0) < KV_ROOM else None)  # fmt: skip
        if cap is None:
            unknown["running_cap"] = ("max_num_seqs is in no series (a host run reads it from dev mode's /server_info or the "
                                      "launch arguments) and running was not pinned below a KV cache with room")  # fmt: skip
        gen = v.get("gen_tokens_per_s")
        values: dict[str, Any] = {
            "scrapes": int(v.get("scrapes", 0)),
            "window_s": window.seconds,
            "num_running_reqs": {k: running[k] for k in ("mean", "max", "last")},
            "num_queue_reqs": {k: queued[k] for k in ("mean", "max", "last")},
            "token_usage": {k: usage[k] for k in ("mean", "max", "last")},
            "num_used_tokens": {"mean": None, "max": None, "last": None},
            # vLLM has no throughput gauge: its counter moves per engine step (vllm.metrics does the same)
            "gen_throughput": {"mean": gen, "max": gen},
            "generation_tokens_per_s": gen,
            "prompt_tokens_per_s": v.get("prompt_tokens_per_s"),
            "requests_per_s": v.get("requests_per_s"),
            "requests_completed": int(v["requests_completed"]) if "requests_completed" in v else None,
            "cache_hit_rate": hit_rate,
            **{k: {p: (round(v[f"{k}_{p}"], 4) if f"{k}_{p}" in v else None) for p in ("p50", "p95")} for k in VLLM_HISTOGRAMS},
            "max_running_requests": cap,
            "max_total_num_tokens": kv_tokens,
            "running_to_cap": round(running["max"] / cap, 4) if cap and running["max"] is not None else None,
            "running": running, "running_per_dp": per_dp, "dp_ranks": dp, "queued": queued, "kv_usage": usage,
            "new_token_ratio": {k: None for k in SPREAD},
            "gauge_refreshes": int(max(v.get(a, 0.0) for a in ("gauge_changes", "queued_changes", "kv_usage_changes"))),
            "gauge_age": written_together({c: _age(v, answer) for c, answer in VLLM_AGE_ANSWERS.items()}, None),
            # vLLM exports the counter from its start: absent, the host's series are not read (as vllm.metrics)
            "retractions": v.get("retractions"),
            "retractions_source": "vllm:num_preemptions_total" if "retractions" in v else None,
            "decode_graph_passes": None, "decode_eager_passes": None, "decode_passes": None, "decode_graph_share": None,
            "forward_busy_share": None, "scheduler_idle_share": None,
            "est_read_gb_per_s_per_gpu": None, "est_tflops_per_gpu": None,
            "running_cap": cap, "running_cap_source": PINNED_SOURCE if cap else None,
            "running_to_cap_p50": round(running["p50"] / cap, 4) if cap and running["p50"] is not None else None,
            "running_to_cap_max": round(running["max"] / cap, 4) if cap and running["max"] is not None else None,
            "kv_usage_series": kv_series,
            "waiting_by_reason": None,
            "server_kind": "vllm",
        }  # fmt: skip
        unknown["waiting_by_reason"] = "not read by the fleet (a host run reads vllm:num_requests_waiting_by_reason, 0.20+)"
        unknown["decode_graph_share"] = "vLLM exports no CUDA-graph pass counter (see vllm.server cuda_graphs_decode)"
        unknown["new_token_ratio"] = "a scheduler estimate vLLM does not make: its V1 scheduler allocates KV blocks on demand"
        values["gauges_written_in_window"] = written_in_window(values["gauge_age"])
        values["gauges_current"] = gauges_current(values)
        values["unknown"] = unknown
        return values


class ServerMetricsFleet:
    """The `server.metrics` role of a fleet: each host's values from SGLang's series or vLLM's, by the ones it has.
    A host with both (two servers behind one host label) is read as SGLang, and its notes say so."""

    serves = "server.metrics"

    def fill_servers(self, answers: dict[str, list[Sample]], key: HostKey, window: Window) -> tuple[FleetAnswer, dict[str, str]]:
        sglang = {k: a for k, a in answers.items() if not k.startswith(VLLM)}
        vllm = {k.removeprefix(VLLM): a for k, a in answers.items() if k.startswith(VLLM)}
        ans, instances = SglangMetricsFleet().fill_servers(sglang, key, window)
        v_ans, v_instances = VllmMetricsFleet().fill_servers(vllm, key, window)
        for host, values in v_ans.values.items():
            if host in ans.values:
                ans.notes.setdefault(host, []).append("vllm: series too under this host's label: read as SGLang (its sglang: series)")
                continue
            ans.values[host] = values
            ans.notes[host] = v_ans.notes.get(host, [])
            if host in v_instances:
                instances[host] = v_instances[host]
        for host, inst in v_instances.items():
            instances.setdefault(host, inst)
        return ans, instances


SERVER_FAMILY = (SglangMetricsFleet, VllmMetricsFleet)
