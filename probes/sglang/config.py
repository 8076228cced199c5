"""SGLang's server info, named by concept: what the rules need to know, whatever the release calls it.

SGLang renamed and moved its configuration fields between releases (classic `dataclasses.asdict`
layout through 0.5.13, the refactored `resolved_dict()` from 0.5.22; see
shared/reference/sglang-versions.md §1). Rules read these concept names (`running_cap`, `kv_dtype`,
`cuda_graphs_decode`, `attn_dp`, ...) so the same rule decides on every release, and a second server
kind can later fill the same names. Each value that had to be derived says where it came from
(`*_source`), because a value read from the server is worth more than one computed from a formula.
"""

from __future__ import annotations

import math
from typing import Any

from gpu_runbook.rules import is_release_version

# Environment variables that change an all-reduce path and that SGLang declares in its Envs registry, so
# `SGLANG_EXPOSE_OWN_ENV_VARS=1` (0.5.22+) shows them in internal_states[i].env_vars.
ENV_KEYS = ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2", "SGLANG_ENABLE_METRICS_DEVICE_TIMER")


def _num(v: Any) -> float | None:
    """A finite number, else None: a server that reports Infinity or NaN has said nothing usable."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _int(v: Any) -> int | None:
    n = _num(v)
    return int(n) if n is not None else None


def _flag(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
        return v.strip().lower() in {"1", "true", "yes", "on"}
    return None


def _states(info: dict[str, Any]) -> list[dict[str, Any]]:
    states = info.get("internal_states")
    return [s for s in states if isinstance(s, dict)] if isinstance(states, list) else []


def _first_known(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def default_running_cap(max_total_num_tokens: int | None, context_len: int | None) -> int | None:
    """The scheduler's cap when `--max-running-requests` is unset (§7): min(KV tokens // 2, request pool)."""
    if not max_total_num_tokens or not context_len:
        return None
    pool = min(max(int(max_total_num_tokens / context_len * 512), 2048), 4096)
    return min(max_total_num_tokens // 2, pool)


def graph_config(info: dict[str, Any]) -> tuple[bool | None, int | None, str | None]:
    """Decode CUDA graphs on?, their largest batch, and which fields said so."""
    cfg = info.get("cuda_graph_config")
    if isinstance(cfg, dict) and isinstance(cfg.get("decode"), dict):  # 0.5.22+: the resolved per-phase config
        dec = cfg["decode"]
        backend = dec.get("backend")
        on = None if backend is None else str(backend).lower() != "disabled"
        if info.get("disable_decode_cuda_graph") is True or info.get("disable_cuda_graph") is True:
            on = False
        return on, _int(dec.get("max_bs")) or _int(info.get("cuda_graph_max_bs_decode")), "cuda_graph_config.decode"
    if "cuda_graph_backend_decode" in info:  # a layout between the two: per-phase flags without the record
        backend = info.get("cuda_graph_backend_decode")
        off = backend == "disabled" or info.get("disable_cuda_graph") is True or info.get("disable_decode_cuda_graph") is True
        return (not off), _int(info.get("cuda_graph_max_bs_decode")), "cuda_graph_backend_decode"
    if "disable_cuda_graph" in info:
        off = _flag(info.get("disable_cuda_graph"))
        return (None if off is None else not off), _int(info.get("cuda_graph_max_bs")), "disable_cuda_graph"
    return None, None, None


def config_concepts(info: dict[str, Any]) -> dict[str, Any]:
    """Concept-named configuration from a `/server_info` (or `/get_server_info`) body."""
    states = _states(info)
    st = states[0] if states else {}
    refactored = isinstance(info.get("cuda_graph_config"), dict) or "launch_command" in info or "attn_dp_size" in info
    tp = _int(info.get("tp_size")) or 1
    pp = _int(info.get("pp_size")) or 1
    dp = _int(info.get("dp_size")) or 1
    ep = _int(info.get("ep_size")) or _int(info.get("expert_parallel_size")) or 1
    if refactored and _int(info.get("attn_dp_size")):
        attn_dp = _int(info.get("attn_dp_size")) or 1
    else:
        attn_dp = dp if info.get("enable_dp_attention") is True else 1
    version = info.get("version")
    v: dict[str, Any] = {
        "version": version,
        "version_known": is_release_version(version),
        "layout": "refactored" if refactored else "classic",
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "ep": ep,
        "attn_dp": attn_dp,
        "world_size": _int(st.get("world_size")) or tp * pp * (dp if attn_dp == 1 else 1),
        "quantization": info.get("quantization"),
        "model_dtype": info.get("dtype"),
        "attention_backend": info.get("attention_backend"),
        "decode_attention_backend": _first_known(info.get("decode_attention_backend"), info.get("attention_backend")),
        "dsa_decode_backend": _first_known(info.get("dsa_decode_backend"), info.get("nsa_decode_backend")),
        "moe_backend": info.get("moe_runner_backend"),
        "page_size": _int(info.get("page_size")),
        "context_length": _int(info.get("context_length")),
        "continuous_decode_steps": _int(info.get("num_continuous_decode_steps")) or 1,
        "radix_cache": None if info.get("disable_radix_cache") is None else not bool(info.get("disable_radix_cache")),
        "custom_all_reduce_disabled": bool(info.get("disable_custom_all_reduce")),
        "mem_fraction_static": _num(info.get("mem_fraction_static")),
    }
    # FlashInfer all-reduce fusion: a bool through 0.5.13; from 0.5.22 a backend name (the bool stays, always false).
    if "flashinfer_allreduce_fusion_backend" in info:
        v["flashinfer_allreduce_fusion"] = info.get("flashinfer_allreduce_fusion_backend") not in (None, "", "none")
    else:
        v["flashinfer_allreduce_fusion"] = _flag(info.get("enable_flashinfer_allreduce_fusion"))

    # KV dtype: the scheduler resolves a checkpoint's FP8 KV (§3), so prefer what a rank reports over the top level.
    top_kv, rank_kv = info.get("kv_cache_dtype"), st.get("kv_cache_dtype")
    if rank_kv not in (None, "auto") and rank_kv != top_kv:
        v["kv_dtype"], v["kv_dtype_source"] = rank_kv, "internal_states[0].kv_cache_dtype"
    else:
        v["kv_dtype"], v["kv_dtype_source"] = top_kv, "kv_cache_dtype"

    on, max_bs, source = graph_config(info)
    v["cuda_graphs_decode"], v["graph_max_bs_decode"], v["graph_source"] = on, max_bs, source

    # Running-request cap: what the scheduler enforces (0.5.8+), else the flag, else the default formula (an estimate).
    kv_tokens = _int(info.get("max_total_num_tokens")) or _int((st.get("memory_usage") or {}).get("token_capacity"))
    per_dp = _int(st.get("effective_max_running_requests_per_dp"))
    flag = _int(info.get("max_running_requests"))
    ranks = max(len(states), attn_dp) if per_dp is not None else attn_dp
    if per_dp is not None:
        v["running_cap_per_dp"], v["running_cap_source"] = per_dp, "internal_states.effective_max_running_requests_per_dp"
    elif flag is not None:
        v["running_cap_per_dp"], v["running_cap_source"] = (flag // attn_dp if attn_dp > 1 else flag), "max_running_requests flag"
    else:
        est = default_running_cap(kv_tokens, _int(info.get("context_length")) or _int(info.get("max_req_input_len")))
        v["running_cap_per_dp"], v["running_cap_source"] = est, ("default formula (estimate)" if est is not None else None)
    v["running_cap"] = v["running_cap_per_dp"] * ranks if v["running_cap_per_dp"] is not None else None
    v["running_cap_flag"] = flag

    v["kv_capacity_tokens_per_dp"] = kv_tokens
    v["kv_capacity_tokens"] = kv_tokens * attn_dp if kv_tokens is not None else None
    mu = st.get("memory_usage") if isinstance(st.get("memory_usage"), dict) else {}
    v["weight_gb_per_gpu"] = _num(mu.get("weight"))
    v["kv_cache_gb_per_gpu"] = _num(mu.get("kvcache"))

    env = st.get("env_vars") if isinstance(st.get("env_vars"), dict) else None
    v["env_exposed"] = env is not None
    for key in ENV_KEYS:
        v[key.lower()] = _flag(env.get(key)) if env is not None and key in env else None
    return v
