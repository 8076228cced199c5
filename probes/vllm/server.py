"""vLLM probes: configuration, health, metrics over a window and a concurrency sweep, filling the server concepts
every family fills (probes/server), so the runbooks decide on either server.

Each probe names its `role` (server.config, server.health, server.metrics, server.sweep): a runbook that names
the role (`server.metrics`) runs `vllm.metrics` against a vLLM server (Registry.for_target). vLLM's whole
mapping is here and in probes/vllm/facts.py (release boundaries, with their sources):

* configuration: `/version`, `/v1/models` (max_model_len, root), `vllm:cache_config_info`'s labels (KV dtype,
  blocks, block size, memory fraction, prefix caching) always; `/server_info?config_format=json` only where the
  server runs with VLLM_SERVER_DEV_MODE=1 (TP/PP/DP, max_num_seqs, enforce_eager, CUDA graph sizes, custom
  all-reduce). Without dev mode those are read from the launch command line where this host shows it, else
  null, and `unknown` says why;
* metrics (vllm-and-fleet.md §1, §3): vLLM's series are filed under the concept they fill (probes/server/window.py):
  running, waiting, KV usage under either release's name, preemptions as retractions, token counters (they move
  per engine step in vLLM), TTFT/ITL/E2E/queue histograms; gauges are summed over the `engine` label (DP
  engines), KV usage maxed.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from gpu_runbook import json_bounded
from gpu_runbook.plugin import Context, Evidence, Probe, Series, Table, downsample
from gpu_runbook.releases import has_feature

from ..server import window as w
from ..server.health import HealthProbe
from ..server.http import NotFound, ProbeError, as_evidence, get, get_json
from ..server.launch_args import ServerProcesses, server_processes
from ..server.sweep import LoadSweep
from ..server.values import SweepValues
from ..server.window import (
    Snapshot,
    WindowParams,
    counter_increase,
    spread,
    summarize_window,
)
from . import facts
from .values import VllmMetricsValues, VllmServerValues

# Each vLLM series and the concept it fills (probes/server/window.py).
GAUGES = {
    "vllm:num_requests_running": w.RUNNING,
    "vllm:num_requests_waiting": w.QUEUED,
}
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # the 0.9.2+ name first (facts.KV_USAGE_NAMES)
COUNTERS = {
    "vllm:num_preemptions_total": w.RETRACTIONS,
    "vllm:prompt_tokens_total": w.PROMPT_TOKENS,
    "vllm:generation_tokens_total": w.GENERATION_TOKENS,
    "vllm:request_success_total": w.REQUESTS_FINISHED,
    "vllm:estimated_flops_per_gpu_total": w.EST_FLOPS,
    "vllm:estimated_read_bytes_per_gpu_total": w.EST_READ_BYTES,
}
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": w.TTFT,
    "vllm:inter_token_latency_seconds": w.ITL,
    "vllm:e2e_request_latency_seconds": w.E2E,
    "vllm:request_queue_time_seconds": w.QUEUE_TIME,
}
PREFIX_CACHE = {  # (hits, queries) in tokens: 0.9.2+ names first, the `gpu_` pair before (hidden in 0.11)
    "new": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    "old": ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
}
OLD_ITL = "vllm:time_per_output_token_seconds"  # before 0.10.2 the only per-token histogram
KV_ROOM = 0.8  # KV usage below which the cache still has room: a pinned running count is then a cap, not the KV wall


class VllmScrape(Snapshot):
    """One scrape of a vLLM /metrics, under the concept names, with the config-info labels and the KV gauge's name."""

    def __init__(self, t: float) -> None:
        super().__init__(t=t)
        self.cache_info: dict[str, str] = {}
        self.kv_series: str | None = None
        self.vllm_series = 0  # samples of vllm: series seen (0: not a vLLM /metrics)


def parse_vllm_metrics(text: str, t: float) -> VllmScrape:
    from prometheus_client.parser import text_string_to_metric_families

    snap = VllmScrape(t)
    per_engine: dict[str, dict[str, float]] = {}
    kv: dict[str, dict[str, float]] = {}
    old_itl: dict[float, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                name, labels, value = s.name, s.labels, float(s.value)
                if not math.isfinite(value):
                    continue
                if name.startswith("vllm:"):
                    snap.vllm_series += 1
                engine = labels.get("engine", "0")
                if name in GAUGES:
                    per_engine.setdefault(GAUGES[name], {})[engine] = value
                elif name == "vllm:num_requests_waiting_by_reason":  # 0.20+: capacity | deferred (sum = waiting)
                    group = snap.labelled.setdefault("waiting_by_reason", {})
                    reason = labels.get("reason", "")
                    group[reason] = group.get(reason, 0.0) + value
                elif name in KV_USAGE:
                    kv.setdefault(name, {})[engine] = value
                elif name in COUNTERS:
                    key = COUNTERS[name]
                    snap.counters[key] = snap.counters.get(key, 0.0) + value
                    snap.names[key] = name.removeprefix("vllm:")
                elif name in PREFIX_CACHE["new"] or name in PREFIX_CACHE["old"]:
                    snap.counters[name] = snap.counters.get(name, 0.0) + value
                elif name == "vllm:cache_config_info":
                    snap.cache_info = {k: v for k, v in labels.items() if k not in ("engine", "model_name")}
                elif name.endswith("_bucket") and (name[:-7] in HISTOGRAMS or name[:-7] == OLD_ITL):
                    le = float(labels["le"])
                    if name[:-7] == OLD_ITL:
                        old_itl[le] = old_itl.get(le, 0.0) + value
                    else:
                        b = snap.buckets.setdefault(HISTOGRAMS[name[:-7]], {})
                        b[le] = b.get(le, 0.0) + value
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise ProbeError("failed", f"malformed metrics text from /metrics: {e}") from e
    if w.ITL not in snap.buckets and old_itl:
        snap.buckets[w.ITL] = old_itl  # before 0.10.2: time per output token
    for key, group in per_engine.items():
        snap.gauges[key] = sum(group.values())
        snap.per_dp[key] = dict(group)
    for name in KV_USAGE:
        if name in kv:
            snap.gauges[w.KV_USAGE] = max(kv[name].values())
            snap.kv_series = name
            break
    kv_tokens = _kv_tokens(snap.cache_info)
    if kv_tokens is not None:
        snap.gauges[w.KV_CAPACITY] = float(kv_tokens)
    return snap


def _int(v: Any) -> int | None:
    try:
        n = float(v)
    except (TypeError, ValueError):
        return None
    return int(n) if math.isfinite(n) else None


def _float(v: Any) -> float | None:
    try:
        n = float(v)
    except (TypeError, ValueError):
        return None
    return n if math.isfinite(n) else None


def _bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    return None


def _kv_tokens(cache: dict[str, Any]) -> int | None:
    size = _int(cache.get("kv_cache_size_tokens"))  # 0.24+ (facts.KV_SIZE_LABELS_SINCE)
    if size:
        return size
    blocks, block = _int(cache.get("num_gpu_blocks")), _int(cache.get("block_size"))
    return blocks * block if blocks and block else None


async def scrape_vllm(ctx: "Context", t: float, timeout_s: float) -> VllmScrape:
    try:
        r = await get(ctx, "/metrics", timeout_s)
    except NotFound as e:
        raise ProbeError("unavailable", "/metrics answered 404 (vLLM always mounts it: is this a vLLM server?)") from e
    return parse_vllm_metrics(r.text, t)


async def gpu_memory(ctx: "Context") -> tuple[float, str] | None:
    """(GiB, name) of the first GPU, for a release's default max_num_seqs; None without NVML."""
    from gpu_runbook.nvml import open_devices  # noqa: PLC0415

    def read(nv: Any) -> tuple[float, str] | None:
        for dev in open_devices(nv).devices:
            try:
                name = nv.nvmlDeviceGetName(dev.handle)
                return nv.nvmlDeviceGetMemoryInfo(dev.handle).total / 2**30, name.decode() if isinstance(name, bytes) else str(name)
            except nv.NVMLError:
                continue
        return None

    try:
        return await ctx.nvml.call(read)
    except Exception:  # noqa: BLE001 - no NVML: the default cap is unknown, not an error
        return None


DEV_MODE = "not exposed without VLLM_SERVER_DEV_MODE=1 (/server_info) on this server"


async def vllm_config(ctx: "Context", timeout_s: float = 10.0) -> dict[str, Any]:
    """The `vllm.server` values: the server concepts, each with its source or why it is null."""
    version_body = await get_json(ctx, "/version", timeout_s)  # the one call that must answer: it says "vLLM"
    version = version_body.get("version") if isinstance(version_body, dict) else None
    sources: dict[str, str] = {"version": "/version"}
    unknown: dict[str, str] = {}
    v: dict[str, Any] = {"server_kind": "vllm", "version": version if isinstance(version, str) else None,
                         "version_known": facts.release(version if isinstance(version, str) else None) is not None}  # fmt: skip
    models: list[dict[str, Any]] = []
    try:
        body = await get_json(ctx, "/v1/models", timeout_s)
        data = body.get("data") if isinstance(body, dict) else None
        models = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    except ProbeError as e:
        ctx.log(f"vllm.server: /v1/models: {e.reason}")
    v["served_models"] = [str(m.get("id")) for m in models] or None
    v["max_model_len"] = _int(models[0].get("max_model_len")) if models else None
    v["model_path"] = str(models[0].get("root") or models[0].get("id")) if models else None
    v["context_length"] = v["max_model_len"]
    if v["max_model_len"] is not None:
        sources["context_length"] = "/v1/models max_model_len"
    cache: dict[str, str] = {}
    try:
        cache = (await scrape_vllm(ctx, 0.0, timeout_s)).cache_info
    except ProbeError as e:
        ctx.log(f"vllm.server: /metrics: {e.reason}")
    cfg: dict[str, Any] = {}
    dev_mode_text = False
    try:
        r = await get(ctx, "/server_info?config_format=json", timeout_s)
        body = json_bounded.loads(r.content)
        cfg = body.get("vllm_config") if isinstance(body, dict) and isinstance(body.get("vllm_config"), dict) else {}
        dev_mode_text = isinstance(body, dict) and isinstance(body.get("vllm_config"), str)
        env = body.get("vllm_env") if isinstance(body, dict) and isinstance(body.get("vllm_env"), dict) else {}
    except (ProbeError, ValueError):
        cfg, env = {}, {}
    dev_mode_why = (f"this release's dev-mode /server_info gives the configuration as text only (JSON from "
                    f"{facts.SERVER_INFO_JSON_SINCE})") if dev_mode_text else DEV_MODE  # fmt: skip
    v["dev_mode"] = bool(cfg)
    config_source = "/server_info (dev mode)"
    held: ServerProcesses | None = None
    if not cfg:  # on the same host, the launch arguments of the process on the GPUs say what dev mode would
        held = await server_processes(ctx, "vllm")
        launch = held.launch
        if launch is not None:
            cfg, config_source = config_from_flags(launch.flags), launch.source
            sources["launch_args"] = launch.source
    model_c, cache_c, par, sched, comp = (cfg.get(k) if isinstance(cfg.get(k), dict) else {} for k in
                                          ("model_config", "cache_config", "parallel_config", "scheduler_config", "compilation_config"))  # fmt: skip
    cache_all = {**{k: str(x) for k, x in cache_c.items()}, **cache}  # the metric's labels win: they are what runs

    # KV cache (cache_config_info: always there)
    v["kv_dtype"] = cache_all.get("cache_dtype")
    v["kv_dtype_source"] = "vllm:cache_config_info cache_dtype" if "cache_dtype" in cache else ("/server_info cache_config" if v["kv_dtype"] else None)
    v["page_size"] = _int(cache_all.get("block_size"))
    v["num_gpu_blocks"] = _int(cache_all.get("num_gpu_blocks"))
    v["kv_capacity_tokens"] = v["max_total_num_tokens"] = _kv_tokens(cache_all)
    v["radix_cache"] = _bool(cache_all.get("enable_prefix_caching"))
    v["mem_fraction_static"] = _float(cache_all.get("gpu_memory_utilization"))
    v["kv_cache_max_concurrency"] = _float(cache_all.get("kv_cache_max_concurrency"))
    for key in ("kv_dtype", "page_size", "kv_capacity_tokens", "radix_cache", "mem_fraction_static"):
        if v[key] is not None:
            sources[key] = "vllm:cache_config_info" if cache else "/server_info cache_config"
        else:
            unknown[key] = "vllm:cache_config_info was not read (no /metrics)"

    # Parallelism, scheduler, graphs: dev mode only
    tp, pp, dp = _int(par.get("tensor_parallel_size")), _int(par.get("pipeline_parallel_size")), _int(par.get("data_parallel_size"))
    v["tp"], v["pp"], v["dp"] = tp, pp, dp
    ep_on = _bool(par.get("enable_expert_parallel"))
    v["ep"] = (tp or 1) * (dp or 1) if ep_on else (1 if par else None)
    v["attn_dp"] = dp
    v["world_size"] = tp * (pp or 1) * (dp or 1) if tp else None
    # without a configuration, the GPUs the server's processes hold measure its world size (TP x PP x DP: never TP alone)
    v["gpus_held"] = held.gpus_held if held is not None else None
    if held is not None and held.gpus_held is not None:
        sources["gpus_held"] = held.gpus_held_source or "NVML compute processes"
    elif held is not None:
        unknown["gpus_held"] = held.gpus_held_reason or "no GPU lists a process of the server"
    quant = model_c.get("quantization")
    v["quantization"] = str(quant) if quant not in (None, "", "None") else None
    dtype = model_c.get("dtype")
    v["model_dtype"] = str(dtype).removeprefix("torch.") if dtype is not None else None
    # the MoE kernels' setting: --moe-backend (0.17+), read where dev mode or the launch says it, else its default
    # `auto`; the kernel `auto` runs for a GPU and quantization is a release fact the rules read
    # (engine/vllm_releases.yaml flashinfer-cutlass-nvfp4-moe-sm120)
    kernel_c = cfg.get("kernel_config") if isinstance(cfg.get("kernel_config"), dict) else {}
    moe = kernel_c.get("moe_backend")
    if isinstance(moe, str) and moe:
        v["moe_backend"], v["moe_backend_source"] = moe.lower().replace("-", "_"), (
            "kernel_config.moe_backend" if v["dev_mode"] else f"--moe-backend ({config_source})")
    elif not has_feature(v["version"], "moe-backend-flag", "vllm"):
        v["moe_backend"], v["moe_backend_source"] = "auto", (
            "this release has no --moe-backend: vLLM picks the MoE kernels in code (auto)"
            if v["version_known"] else None)
        if not v["version_known"]:
            v["moe_backend"] = None
            unknown["moe_backend"] = "the release is not known, so neither is whether it reads --moe-backend"
    elif v["dev_mode"] or cfg:
        v["moe_backend"], v["moe_backend_source"] = "auto", f"--moe-backend not set ({config_source}): its default"
    else:
        v["moe_backend"], v["moe_backend_source"] = "auto", "the release's default `auto` (an estimate: --moe-backend may be set)"
    if v["moe_backend_source"]:
        sources["moe_backend"] = v["moe_backend_source"]
    # the flag only: vLLM also turns it off at start-up on > 2 GPUs without NVLink (facts.custom_all_reduce_off_on_pcie),
    # which the rules judge from the topology they read
    v["custom_all_reduce_disabled"] = _bool(par.get("disable_custom_all_reduce")) if par else None
    eager = _bool(model_c.get("enforce_eager"))
    mode = str(comp.get("cudagraph_mode", "")).upper()
    if cfg:
        v["cuda_graphs_decode"] = not (eager or mode.endswith("NONE"))
        v["graph_source"] = "model_config.enforce_eager, compilation_config.cudagraph_mode"
    else:
        v["cuda_graphs_decode"], v["graph_source"] = None, None
    max_seqs = _int(sched.get("max_num_seqs"))
    if max_seqs is not None:
        v["running_cap_per_dp"] = max_seqs
        v["running_cap_source"] = "scheduler_config.max_num_seqs" if v["dev_mode"] else f"--max-num-seqs ({config_source})"
    else:
        mem = await gpu_memory(ctx)
        est = facts.default_max_num_seqs(v["version"], mem[0] if mem else None, mem[1] if mem else "")
        v["running_cap_per_dp"] = est
        v["running_cap_source"] = "the release's default max_num_seqs for this GPU (an estimate: --max-num-seqs may be set)" if est else None
    v["running_cap"] = v["running_cap_per_dp"] * (dp or 1) if v["running_cap_per_dp"] else None
    if v["running_cap"] is not None:
        sources["running_cap"] = v["running_cap_source"]
    graph_max = _int(comp.get("max_cudagraph_capture_size")) or _int(comp.get("max_capture_size"))
    sizes = comp.get("cudagraph_capture_sizes")
    if graph_max is None and isinstance(sizes, list) and sizes:
        graph_max = max(int(x) for x in sizes if isinstance(x, (int, float)))
    if graph_max is None and cfg and v["cuda_graphs_decode"]:
        graph_max = facts.default_graph_max_bs(v["version"], v["running_cap_per_dp"])  # the release's default sizes
    # what the same launch would capture with graphs on (an eager server reports 0 above): a positive size set at
    # launch, 0.10-0.11's scheduler_config.cuda_graph_sizes (filled with the default even under enforce_eager), or
    # the release's default from max_num_seqs (facts.graph_max_bs_if_enabled)
    sched_sizes = sched.get("cuda_graph_sizes")
    explicit = graph_max or (max((int(x) for x in sched_sizes if isinstance(x, (int, float))), default=None)
                             if isinstance(sched_sizes, list) else _int(sched_sizes))  # fmt: skip
    if_enabled, if_enabled_source = facts.graph_max_bs_if_enabled(v["version"], v["running_cap_per_dp"], explicit)
    if v["cuda_graphs_decode"] is False:
        graph_max = 0
    v["graph_max_bs_decode"] = graph_max if cfg else None
    v["graph_max_bs_if_enabled"] = (graph_max if v["cuda_graphs_decode"] else if_enabled) if cfg else None
    if v["graph_max_bs_if_enabled"] is not None:
        sources["graph_max_bs_if_enabled"] = (config_source if v["cuda_graphs_decode"] or explicit else
                                              f"{if_enabled_source} ({v['running_cap_source']})")  # fmt: skip
    else:
        unknown["graph_max_bs_if_enabled"] = (dev_mode_why if not cfg else
                                              "max_num_seqs (the default capture size's input) is not known")  # fmt: skip
    for key in ("tp", "pp", "dp", "ep", "attn_dp", "world_size", "model_dtype", "custom_all_reduce_disabled",
                "cuda_graphs_decode", "graph_max_bs_decode"):  # fmt: skip
        if v[key] is None:
            unknown[key] = dev_mode_why
        else:
            sources[key] = config_source
    if v["quantization"] is None and not cfg:
        unknown["quantization"] = dev_mode_why + "; the model's own config is read by model.config"
    if v["running_cap"] is None:
        unknown["running_cap"] = dev_mode_why + ", and the GPU's memory (the default's input) was not read"
    # FlashInfer's PCIe-IPC all-reduce (0.30.0+, opt-in): the variable from dev mode's `vllm_env` (0.29.0+)
    ipc = env.get(facts.PCIE_IPC_VAR) if env else None
    v["vllm_allreduce_use_flashinfer_pcie_ipc"] = _bool(ipc) if isinstance(ipc, bool) else (str(ipc).strip() in ("1", "true", "True") if ipc is not None else None)
    if v["vllm_allreduce_use_flashinfer_pcie_ipc"] is not None:
        sources["vllm_allreduce_use_flashinfer_pcie_ipc"] = "/server_info vllm_env (dev mode)"
    else:
        unknown["vllm_allreduce_use_flashinfer_pcie_ipc"] = (f"{facts.PCIE_IPC_VAR} is read from dev mode's /server_info (vllm_env), "
                                                             "which this server does not give")  # fmt: skip
    # VLLM_USE_FLASHINFER_MOE_FP4 (0.10-0.23): read from dev mode's vllm_env; unset there is its default, 0
    reads_fp4_var = has_feature(v["version"], "flashinfer-moe-fp4-env", "vllm")
    if env and reads_fp4_var:
        raw = env.get(facts.FLASHINFER_MOE_FP4_VAR)
        v["vllm_use_flashinfer_moe_fp4"] = (raw if isinstance(raw, bool) else str(raw).strip() in ("1", "true", "True")) if raw is not None else False
        sources["vllm_use_flashinfer_moe_fp4"] = "/server_info vllm_env (dev mode)" + ("" if raw is not None else ": not set (default 0)")
    else:
        v["vllm_use_flashinfer_moe_fp4"] = None
        unknown["vllm_use_flashinfer_moe_fp4"] = (f"{facts.FLASHINFER_MOE_FP4_VAR} is read from dev mode's /server_info (vllm_env), "
                                                  "which this server does not give" if reads_fp4_var else
                                                  f"this release does not read {facts.FLASHINFER_MOE_FP4_VAR}")  # fmt: skip
    v["flashinfer_pcie_ipc_available"] = None
    unknown["flashinfer_pcie_ipc_available"] = ("whether the server's FlashInfer build has PcieIpcAllReduceWorkspace is not read "
                                                "(the log says `Initialized FlashInfer PCIe IPC all-reduce`)")  # fmt: skip
    v["launch_args"] = sorted(f"{sec}.{k}" for sec, d in (("model_config", model_c), ("cache_config", cache_c), ("parallel_config", par),
                                                         ("scheduler_config", sched)) for k in d)[:400]  # fmt: skip
    v["sources"], v["unknown"] = sources, unknown
    return v


class VllmServer(Probe):
    """vLLM's configuration by concept (`VllmServerValues`): the server concepts every family fills."""

    name = "vllm.server"
    server_kind, role = "vllm", "server.config"
    Values = VllmServerValues
    prefetch = True
    description = "vLLM server configuration (/version, /v1/models, cache_config_info; /server_info in dev mode)"

    async def run(self, ctx: "Context", params: Any) -> Evidence:
        try:
            values = await vllm_config(ctx)
        except ProbeError as e:
            return as_evidence(e)
        rows = [[k, values[k], values["sources"].get(k) or values["unknown"].get(k, "")]
                for k in ("version", "tp", "dp", "kv_dtype", "kv_capacity_tokens", "running_cap", "cuda_graphs_decode", "graph_max_bs_decode",
                          "graph_max_bs_if_enabled")]  # fmt: skip
        summary = (
            f"vLLM {values['version'] or '?'} serving {values['model_path'] or '?'}: TP{values['tp'] or '?'} DP{values['dp'] or '?'}, "
            f"KV {values['kv_capacity_tokens'] or '?'} tokens ({values['kv_dtype'] or '?'}), max_num_seqs {values['running_cap_per_dp'] or '?'}"
            + ("" if values["dev_mode"] else " (no dev mode: parallelism and graphs unknown)")
        )
        return Evidence(summary=summary, values=values, blocks=[Table(title="vLLM server", columns=["concept", "value", "from"], rows=rows)])


class VllmHealth(HealthProbe):
    """`/health` (vLLM answers 200 with no body while the engine is alive)."""

    name = "vllm.health"
    server_kind, role = "vllm", "server.health"
    description = "vLLM /health: status and latency"


def vllm_window(snaps: list[VllmScrape], conf: dict[str, Any]) -> dict[str, Any]:
    """`MetricsValues` from vLLM scrapes and the server's concepts (the cap, DP engines)."""
    values = summarize_window(snaps, {})
    last = snaps[-1]
    unknown: dict[str, str] = {}
    ranks = max((len(s.per_dp.get(w.RUNNING, {})) for s in snaps), default=0) or conf.get("dp") or 1
    running = [s.gauges[w.RUNNING] for s in snaps if w.RUNNING in s.gauges]
    values["dp_ranks"] = ranks
    values["running_per_dp"] = spread([r / ranks for r in running])
    values["new_token_ratio"] = spread([])
    unknown["new_token_ratio"] = "a scheduler estimate vLLM does not make: its V1 scheduler allocates KV blocks on demand"
    values["retractions_source"] = "vllm:num_preemptions_total" if values.get("retractions") is not None else None
    first = snaps[0]
    for pair in (PREFIX_CACHE["new"], PREFIX_CACHE["old"]):
        hits, queries = counter_increase(first, last, pair[0]), counter_increase(first, last, pair[1])
        if hits is not None and queries is not None:
            values["cache_hit_rate"] = round(hits / queries, 4) if queries else None
            break
    else:
        unknown["cache_hit_rate"] = "no prefix-cache counters (prefix caching off, or not exported)"
    reasons = sorted({r for sn in snaps for r in sn.labelled.get("waiting_by_reason", {})})
    values["waiting_by_reason"] = {r: spread([sn.labelled["waiting_by_reason"][r] for sn in snaps
                                              if r in sn.labelled.get("waiting_by_reason", {})]) for r in reasons} or None  # fmt: skip
    if values["waiting_by_reason"] is None:
        unknown["waiting_by_reason"] = f"vllm:num_requests_waiting_by_reason is exported from {facts.WAITING_BY_REASON_SINCE}"
    values["kv_usage_series"] = last.kv_series
    if last.kv_series is None:
        unknown["kv_usage"] = "neither vllm:kv_cache_usage_perc nor vllm:gpu_cache_usage_perc is exported"
    for key in ("decode_graph_passes", "decode_eager_passes", "decode_passes", "decode_graph_share"):
        values[key] = None
    unknown["decode_graph_share"] = "vLLM exports no CUDA-graph pass counter (see vllm.server cuda_graphs_decode)"
    for key in ("forward_busy_share", "scheduler_idle_share"):
        unknown[key] = "no vLLM series"
    gen = values["gen_throughput"]
    if gen["mean"] is None and values["generation_tokens_per_s"] is not None:  # vLLM has no gauge: its counter moves per step
        values["gen_throughput"] = {"mean": values["generation_tokens_per_s"], "max": values["generation_tokens_per_s"]}
    cap, source = conf.get("running_cap"), conf.get("running_cap_source")
    if not reported_cap(conf):
        measured = pinned_cap(snaps)
        if measured is not None:
            cap, source = measured, "measured: running pinned at one number while requests wait and the KV cache has room"
    values["max_running_requests"] = conf.get("running_cap_per_dp") if reported_cap(conf) and source == conf.get("running_cap_source") else cap
    values["running_cap"], values["running_cap_source"] = cap, source
    r = values["running"]
    values["running_to_cap"] = round(r["max"] / cap, 4) if cap and r["max"] is not None else None
    values["running_to_cap_p50"] = round(r["p50"] / cap, 4) if cap and r["p50"] is not None else None
    values["running_to_cap_max"] = round(r["max"] / cap, 4) if cap and r["max"] is not None else None
    if cap is None:
        unknown["running_cap"] = "max_num_seqs is not exposed without dev mode and running was not pinned below a KV cache with room"
    if values["max_total_num_tokens"] is None and conf.get("kv_capacity_tokens"):
        values["max_total_num_tokens"] = conf["kv_capacity_tokens"]
    values["unknown"] = unknown
    return values


def reported_cap(conf: dict[str, Any]) -> bool:
    """max_num_seqs was read (dev mode's scheduler_config, or the launch arguments), not estimated."""
    return str(conf.get("running_cap_source") or "").startswith(("scheduler_config.max_num_seqs", "--max-num-seqs"))


def config_from_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The `/server_info` sections a launch command line says, with vLLM's defaults for flags it omits where the
    default does not depend on the release (TP/PP/DP 1, expert parallel, custom all-reduce and eager off)."""
    def flag(name: str) -> Any:
        return flags.get(name)

    comp: dict[str, Any] = {}
    raw = flag("compilation_config")
    if isinstance(raw, str) and raw.strip().startswith("{"):
        try:
            comp = dict(json_bounded.loads(raw))
        except ValueError:
            comp = {}
    if flag("max_cudagraph_capture_size") is not None:
        comp["max_cudagraph_capture_size"] = flag("max_cudagraph_capture_size")
    sizes = flag("cuda_graph_sizes")
    if isinstance(sizes, str) and sizes.strip().isdigit():
        comp["max_cudagraph_capture_size"] = int(sizes)  # 0.11: one N captures 1, 2, 4, 8, ... N
    return {
        "model_config": {"dtype": flag("dtype") or "auto", "quantization": flag("quantization"), "enforce_eager": flag("enforce_eager") is True},
        "parallel_config": {"tensor_parallel_size": flag("tensor_parallel_size") or 1, "pipeline_parallel_size": flag("pipeline_parallel_size") or 1,
                            "data_parallel_size": flag("data_parallel_size") or 1, "enable_expert_parallel": flag("enable_expert_parallel") is True,
                            "disable_custom_all_reduce": flag("disable_custom_all_reduce") is True},
        "scheduler_config": {"max_num_seqs": flag("max_num_seqs")} if flag("max_num_seqs") is not None else {},
        "compilation_config": comp,
        "kernel_config": {"moe_backend": flag("moe_backend")} if isinstance(flag("moe_backend"), str) else {},  # --moe-backend (0.17+)
    }  # fmt: skip


def pinned_cap(snaps: list[VllmScrape]) -> int | None:
    """The running count where it sat at one number over the second half of the window while requests waited and
    the KV cache had room: a cap no endpoint reports, measured."""
    half = snaps[len(snaps) // 2 :]
    run = [s.gauges.get(w.RUNNING) for s in half]
    wait = [s.gauges.get(w.QUEUED) for s in half]
    usage = [s.gauges.get(w.KV_USAGE) for s in half]
    if len(half) < 2 or any(x is None for x in run + wait + usage):
        return None
    if len(set(run)) == 1 and run[0] and min(wait) >= 1 and max(usage) < KV_ROOM:  # type: ignore[type-var]
        return int(run[0])  # type: ignore[arg-type]
    return None


class VllmMetrics(Probe):
    """vLLM's Prometheus metrics over a window, as `MetricsValues` (`VllmMetricsValues`)."""

    name = "vllm.metrics"
    server_kind, role = "vllm", "server.metrics"
    description = "vLLM /metrics over a window: load, KV usage, preemptions, throughput, latency quantiles"
    Values = VllmMetricsValues
    Params = WindowParams

    async def run(self, ctx: "Context", params: WindowParams) -> Evidence:
        t0 = time.perf_counter()
        n = max(2, int(params.duration_s / params.interval_s) + 1)
        snaps: list[VllmScrape] = []
        try:
            for i in range(n):
                if i:
                    await asyncio.sleep(max(0.0, t0 + i * params.duration_s / (n - 1) - time.perf_counter()))
                snaps.append(await scrape_vllm(ctx, time.perf_counter() - t0, params.request_timeout_s))
                if not snaps[0].vllm_series:  # said at the first scrape, not after a whole window
                    return Evidence.unavailable("/metrics carries no vllm: series: not a vLLM server")
        except ProbeError as e:
            if len(snaps) < 2:
                return as_evidence(e)
            return as_evidence(ProbeError(e.status, f"the window was cut short after {len(snaps)} of {n} scrapes: {e.reason}"))
        try:
            conf = await vllm_config(ctx, params.request_timeout_s)
        except ProbeError:
            conf = {}
        values = vllm_window(snaps, conf)
        blocks = []
        for key, title, unit, series in ((w.RUNNING, "running requests", "req", "vllm:num_requests_running"),
                                         (w.QUEUED, "waiting requests", "req", "vllm:num_requests_waiting"),
                                         (w.KV_USAGE, "KV cache usage", "", values["kv_usage_series"])):  # fmt: skip
            pts = [(round(s.t, 2), s.gauges[key]) for s in snaps if key in s.gauges]
            if pts:
                blocks.append(Series(title=title, unit=unit, label=str(series), points=downsample(pts)))
        run_ = values["running"]
        summary = (
            f"running {run_['p50']} (max {run_['max']}), waiting {values['queued']['p50']}, KV usage max {values['kv_usage']['max']}, "
            f"{values['retractions']} preemptions, {values['generation_tokens_per_s']} gen tok/s"
        )
        return Evidence(summary=summary, values=values, blocks=blocks)


class VllmSweep(LoadSweep):
    """The concurrency sweep over `/v1/completions` (vLLM has no `/generate`), read from vLLM's /metrics."""

    name = "vllm.sweep"
    server_kind, role = "vllm", "server.sweep"
    description = "Throughput and latency at increasing concurrency on vLLM, and what stops the scaling"
    Values = SweepValues

    async def running_cap(self, ctx: "Context") -> int | None:
        conf = await vllm_config(ctx)
        return conf.get("running_cap") if reported_cap(conf) else None

    async def scrape(self, ctx: "Context", t: float, timeout_s: float) -> Snapshot:
        return await scrape_vllm(ctx, t, timeout_s)
