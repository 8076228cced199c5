"""Render SGLang's config endpoints (`/server_info`, `/model_info`, `/v1/models`) per version.

The simulated server must look like the real one a probe meets, including the field-name drift
between the monolithic 0.5.x `ServerArgs` and the 0.5.23 refactor (see shared reference §1.4, §7).
Only the fields a probe reads plus a few neighbours are rendered: the real body has ~280-540 keys.
"""

from __future__ import annotations

import re
from typing import Any


def version_tuple(version: str) -> tuple[int, int, int]:
    """"0.5.5.post3" -> (0, 5, 5); unknown parts become 0 so comparisons stay total."""
    nums = [int(n) for n in re.findall(r"\d+", version)[:3]]
    while len(nums) < 3:
        nums.append(0)
    return nums[0], nums[1], nums[2]


def has_new_info_endpoints(version: str) -> bool:
    """`/server_info` and `/model_info` appeared in 0.5.6 (older: `/get_*` only)."""
    return version_tuple(version) >= (0, 5, 6)


def is_refactored(version: str) -> bool:
    """The msgspec/arg_groups layout with renamed fields (0.5.23 is the one read; boundary after 0.5.12)."""
    return version_tuple(version) > (0, 5, 12)


# Resolved ServerArgs as 0.5.5.post3 reports them for the reference scenario (Qwen3-32B, TP2, RTX PRO 6000).
DEFAULT_SERVER_ARGS: dict[str, Any] = {
    "model_path": "Qwen/Qwen3-32B",
    "tokenizer_path": "Qwen/Qwen3-32B",
    "load_format": "auto",
    "trust_remote_code": False,
    "context_length": None,
    "host": "127.0.0.1",
    "port": 30000,
    "dtype": "auto",
    "quantization": None,
    "kv_cache_dtype": "auto",
    "mem_fraction_static": 0.861,
    "max_running_requests": None,
    "max_queued_requests": None,
    "max_total_tokens": None,
    "chunked_prefill_size": 8192,
    "max_prefill_tokens": 16384,
    "schedule_policy": "fcfs",
    "schedule_conservativeness": 1.0,
    "page_size": 1,
    "device": "cuda",
    "tp_size": 2,
    "pp_size": 1,
    "stream_interval": 1,
    "stream_output": False,
    "enable_metrics": True,
    "decode_log_interval": 40,
    "api_key": None,
    "served_model_name": "Qwen/Qwen3-32B",
    "weight_version": "default",
    "dp_size": 1,
    "load_balance_method": "round_robin",
    "nnodes": 1,
    "attention_backend": "flashinfer",
    "decode_attention_backend": None,
    "prefill_attention_backend": None,
    "sampling_backend": "flashinfer",
    "grammar_backend": "xgrammar",
    "nsa_prefill_backend": "flashmla_sparse",
    "nsa_decode_backend": "fa3",
    "speculative_algorithm": None,
    "ep_size": 1,
    "moe_a2a_backend": "none",
    "moe_runner_backend": "auto",
    "enable_flashinfer_allreduce_fusion": False,
    "disable_radix_cache": False,
    "cuda_graph_max_bs": 256,
    "cuda_graph_bs": [1, 2, 4, 8, 16, 24, 32, 64, 128, 256],
    "disable_cuda_graph": False,
    "disable_custom_all_reduce": False,
    "enable_mscclpp": False,
    "enable_torch_symm_mem": False,
    "disable_overlap_schedule": False,
    "enable_dp_attention": False,
    "enable_torch_compile": False,
    "num_continuous_decode_steps": 1,
}

# 0.5.5 name -> 0.5.23 name (value carried over unchanged).
_RENAMED_0_5_23 = {
    "cuda_graph_max_bs": "cuda_graph_max_bs_decode",
    "cuda_graph_bs": "cuda_graph_bs_decode",
    "nsa_prefill_backend": "dsa_prefill_backend",
    "nsa_decode_backend": "dsa_decode_backend",
    "stream_output": "incremental_streaming_output",
}


def render_server_args(args: dict[str, Any], version: str) -> dict[str, Any]:
    """The flat ServerArgs dict under `version`'s field names."""
    out = dict(args)
    if not is_refactored(version):
        return out
    for old, new in _RENAMED_0_5_23.items():
        if old in out:
            out[new] = out.pop(old)
    out.setdefault("cuda_graph_max_bs_prefill", None)
    # The boolean became a backend choice; an enabled fusion resolves to a backend name.
    fused = out.pop("enable_flashinfer_allreduce_fusion", False)
    out["flashinfer_allreduce_fusion_backend"] = "auto" if fused else None
    out["enforce_disable_flashinfer_allreduce_fusion"] = False
    dp_attn = out.get("enable_dp_attention", False)
    out["attn_dp_size"] = out.get("dp_size", 1) if dp_attn else 1
    out["enable_dp_attention"] = bool(dp_attn)  # synthesized in 0.5.23's resolved_dict
    out["enable_mfu_metrics"] = False
    return out


def server_info_body(
    *,
    version: str,
    args: dict[str, Any],
    max_total_num_tokens: int,
    effective_max_running_requests: int,
    context_len: int,
    last_gen_throughput: float,
) -> dict[str, Any]:
    """`/server_info` (or `/get_server_info`) for `version`: args + scheduler_info + internal_states."""
    flat = render_server_args(args, version)
    max_req_input_len = min(context_len - 1, max_total_num_tokens - 1) - 5
    state: dict[str, Any] = dict(flat)
    state["last_gen_throughput"] = round(last_gen_throughput, 2)
    memory = {"weight": 30.59, "kvcache": 47.5, "token_capacity": max_total_num_tokens, "graph": 0.87}
    body: dict[str, Any] = dict(flat)
    if is_refactored(version):
        memory = {**memory, "startup_available": 94.12, "token_capacity_swa": 0, "graph": {"decode": 0.87}}
        state["world_size"] = int(flat.get("tp_size", 1)) * int(flat.get("pp_size", 1))
        state["effective_max_running_requests_per_dp"] = effective_max_running_requests
        state["disaggregation_mode"] = "null"
        body["launch_command"] = f"python -m sglang.launch_server --model-path {flat.get('model_path')}"
    state["memory_usage"] = memory
    body.update({"status": "ready", "max_total_num_tokens": max_total_num_tokens, "max_req_input_len": max_req_input_len})
    if is_refactored(version):
        body["kv_events"] = None
        body["startup_time"] = {"load_weight": 41.2, "kv_cache_allocation": 3.1, "scheduler_e2e": 88.0}
    body["internal_states"] = [state]
    body["version"] = version
    if is_refactored(version):
        body["frontend"] = "python"
    return body


def model_info_body(*, version: str, args: dict[str, Any], model_type: str | None, architectures: list[str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model_path": args.get("model_path"),
        "tokenizer_path": args.get("tokenizer_path", args.get("model_path")),
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
    }
    if has_new_info_endpoints(version):
        body["model_type"] = model_type
        body["architectures"] = architectures
    if is_refactored(version):
        body.update(
            served_model_name=args.get("served_model_name"),
            load_format=args.get("load_format", "auto"),
            reasoning_parser=None,
            tool_call_parser=None,
            disaggregation_mode="null",
        )
    return body


def models_body(*, served_model_name: str, model_path: str, context_len: int, created: int) -> dict[str, Any]:
    card = {
        "id": served_model_name,
        "object": "model",
        "created": created,
        "owned_by": "sglang",
        "root": model_path,
        "parent": None,
        "max_model_len": context_len,
    }
    return {"object": "list", "data": [card]}
