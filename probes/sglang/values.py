"""What `sglang.server` and `sglang.health` return: their `Values` models (probes/sglang/server.py uses them).

`sglang.server` holds three kinds of value in one flat map:
- concepts (probes/sglang/config.py `config_concepts`): the names rules read, the same on every release, each
  always present (null where the server does not say);
- the raw flags of `/server_info` (`SERVER_KEYS`, `EXTRA_KEYS` in probes/sglang/server.py), as the server reports them,
  each missing when the release has no such field (shared/reference/sglang-versions.md §1);
- what /model_info and /v1/models add.
Seven raw names are also concepts (`version`, `quantization`, `attention_backend`, `decode_attention_backend`,
`page_size`, `context_length`, `mem_fraction_static`): the concept is written last, so they are always present
and carry the concept's value and type.
"""

from __future__ import annotations

from typing import Literal

from gpu_runbook.plugin import Values, value


class SglangServerValues(Values):
    """SGLang's configuration, by concept and by the server's own field names."""

    # ---- concepts (config_concepts): always present --------------------------------------------------
    server_kind: Literal["sglang", "vllm"] = value("the server kind (its probe family); steps name its flags", default=...)
    version: str | None = value("the server's `version` (a dev build reports e.g. 0.0.0.dev0)", default=...)
    version_known: bool = value("the version is a release that orders (not a dev build or unknown)", default=...)
    layout: Literal["classic", "refactored"] = value(
        "/server_info layout: classic `asdict` (<=0.5.13) or refactored `resolved_dict()` (0.5.22+)", default=...)
    tp: int = value("tensor-parallel size (tp_size, 1 when not reported)", default=...)
    pp: int = value("pipeline-parallel size (pp_size, 1 when not reported)", default=...)
    dp: int = value("data-parallel size (dp_size, 1 when not reported)", default=...)
    ep: int = value("expert-parallel size (ep_size | expert_parallel_size, 1 when not reported)", default=...)
    attn_dp: int = value("attention data-parallel width: attn_dp_size (0.5.22+), else dp with enable_dp_attention, else 1",
                         default=...)
    world_size: int = value("GPUs per server: internal_states[0].world_size (0.5.22+), else tp x pp (x dp without DP attention)",
                            default=...)
    quantization: str | None = value("weight quantization (`--quantization`), null for none", default=...)
    model_dtype: str | None = value("the server's `dtype` (`auto` unless set)", default=...)
    attention_backend: str | None = value("attention backend as resolved at start-up", default=...)
    decode_attention_backend: str | None = value(
        "decode attention backend: the server's decode_attention_backend, else attention_backend "
        "(the concept: it replaces the raw flag of the same name)", default=...)
    dsa_decode_backend: str | None = value("DSA/NSA decode backend (dsa_decode_backend 0.5.13+, nsa_decode_backend before)",
                                           default=...)
    moe_backend: str | None = value("MoE runner backend (moe_runner_backend)", default=...)
    page_size: int | None = value("KV cache page size", unit="tokens", default=...)
    context_length: int | None = value("`--context-length` (null: the model's own)", unit="tokens", default=...)
    continuous_decode_steps: int = value("num_continuous_decode_steps (1 when not reported)", default=...)
    radix_cache: bool | None = value("prefix (radix) cache on: not disable_radix_cache", default=...)
    custom_all_reduce_disabled: bool = value("disable_custom_all_reduce was set (false when not reported)", default=...)
    mem_fraction_static: float | None = value("share of GPU memory for weights and KV cache (0..1)", default=...)
    flashinfer_allreduce_fusion: bool | None = value(
        "FlashInfer all-reduce fusion on: a backend is set (0.5.22+), else enable_flashinfer_allreduce_fusion", default=...)
    kv_dtype: str | None = value("KV cache dtype: a rank's resolved kv_cache_dtype when it differs from the top level "
                                 "(FP8 chosen from the checkpoint), else the top-level flag", default=...)
    kv_dtype_source: Literal["internal_states[0].kv_cache_dtype", "kv_cache_dtype"] = value(
        "which field kv_dtype came from", default=...)
    cuda_graphs_decode: bool | None = value("decode CUDA graphs on (null: the server does not say)", default=...)
    graph_max_bs_decode: int | None = value("largest decode batch captured in a CUDA graph", unit="requests", default=...)
    graph_source: Literal["cuda_graph_config.decode", "cuda_graph_backend_decode", "disable_cuda_graph"] | None = value(
        "which fields cuda_graphs_decode came from", default=...)
    running_cap_per_dp: int | None = value("running-request cap of one DP rank", unit="requests", default=...)
    running_cap_source: Literal[
        "internal_states.effective_max_running_requests_per_dp", "max_running_requests flag", "default formula (estimate)"
    ] | None = value("where the cap came from: the scheduler (0.5.8+), the flag, or SGLang's default formula", default=...)
    running_cap: int | None = value("running-request cap of the whole server (per rank x ranks)", unit="requests",
                                    default=...)
    running_cap_flag: int | None = value("`--max-running-requests` as passed (null: not set)", unit="requests", default=...)
    kv_capacity_tokens_per_dp: int | None = value("KV cache capacity of one DP rank (max_total_num_tokens)", unit="tokens",
                                                  default=...)
    kv_capacity_tokens: int | None = value("KV cache capacity of the whole server", unit="tokens", default=...)
    weight_gb_per_gpu: float | None = value("weights per GPU (internal_states[0].memory_usage.weight; SGLang's GB are 2^30 B)",
                                            unit="GiB", default=...)
    kv_cache_gb_per_gpu: float | None = value("KV cache per GPU (internal_states[0].memory_usage.kvcache)", unit="GiB",
                                              default=...)
    env_exposed: bool = value("the server shows its environment (SGLANG_EXPOSE_OWN_ENV_VARS=1, 0.5.22+)", default=...)
    sglang_enable_pcie_ipc_allreduce: bool | None = value(
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE from internal_states[0].env_vars (null: not shown)", default=...)
    sglang_opt_use_custom_all_reduce_v2: bool | None = value(
        "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2 from internal_states[0].env_vars (null: not shown)", default=...)
    sglang_enable_metrics_device_timer: bool | None = value(
        "SGLANG_ENABLE_METRICS_DEVICE_TIMER from internal_states[0].env_vars (null: not shown)", default=...)

    # ---- where it was read, and which raw flags the server reported ---------------------------------
    info_endpoint: Literal["/server_info", "/get_server_info"] = value("the endpoint that answered (/server_info: 0.5.6+)",
                                                                       default=...)
    launch_args: list[str] = value("the raw flag names below that the server reported (what a diff compares)", default=...)

    # ---- raw /server_info flags (SERVER_KEYS): missing when the release lacks the field -------------
    tp_size: int | None = value("--tp-size")
    pp_size: int | None = value("--pp-size")
    dp_size: int | None = value("--dp-size")
    ep_size: int | None = value("--ep-size")
    dtype: str | None = value("--dtype")
    kv_cache_dtype: str | None = value("--kv-cache-dtype at the top level (classic servers: `auto` even when a rank runs FP8)")
    prefill_attention_backend: str | None = value("--prefill-attention-backend")
    moe_runner_backend: str | None = value("--moe-runner-backend (0.5.5+)")
    disable_cuda_graph: bool | None = value("--disable-cuda-graph (0.5.22+: no CLI of its own, see cuda_graph_backend_decode)")
    cuda_graph_max_bs: int | None = value(
        "largest CUDA-graph batch; 0.5.22+: copied from cuda_graph_max_bs_decode (null unless passed)", unit="requests")
    disable_radix_cache: bool | None = value("--disable-radix-cache")
    max_running_requests: int | None = value("--max-running-requests (null: auto)", unit="requests")
    max_total_num_tokens: int | None = value("KV cache capacity of one rank (scheduler info)", unit="tokens")
    chunked_prefill_size: int | None = value("--chunked-prefill-size (-1: chunking off)", unit="tokens")
    num_continuous_decode_steps: int | None = value("--num-continuous-decode-steps")
    disable_custom_all_reduce: bool | None = value("--disable-custom-all-reduce")
    enable_flashinfer_allreduce_fusion: bool | None = value(
        "FlashInfer all-reduce fusion; 0.5.22+: derived from flashinfer_allreduce_fusion_backend "
        "(the server's own is always false)")
    enable_metrics: bool | None = value("--enable-metrics (/metrics exported)")
    model_path: str | None = value("--model-path")

    # ---- raw flags passed through when present (EXTRA_KEYS) -----------------------------------------
    served_model_name: str | None = value("--served-model-name (defaults to model_path)")
    max_req_input_len: int | None = value("longest request input the scheduler accepts (scheduler info)", unit="tokens")
    max_prefill_tokens: int | None = value("--max-prefill-tokens", unit="tokens")
    schedule_policy: str | None = value("--schedule-policy")
    schedule_conservativeness: float | None = value("--schedule-conservativeness")
    cuda_graph_max_bs_decode: int | None = value("0.5.22+: --cuda-graph-max-bs-decode (null unless passed)", unit="requests")
    cuda_graph_max_bs_prefill: int | None = value("0.5.22+: --cuda-graph-max-bs-prefill (null unless passed)", unit="requests")
    flashinfer_allreduce_fusion_backend: str | None = value("0.5.22+: null, auto, trtllm, mnnvl or cutedsl")
    enforce_disable_flashinfer_allreduce_fusion: bool | None = value("0.5.10+: --enforce-disable-flashinfer-allreduce-fusion")
    enable_dp_attention: bool | None = value("DP attention on (0.5.22+: reported as attn_dp_size > 1)")
    attn_dp_size: int | None = value("0.5.22+: --attn-dp-size")
    moe_a2a_backend: str | None = value("MoE all-to-all backend (`none` unless set)")
    speculative_algorithm: str | None = value("--speculative-algorithm (null: none)")
    enable_torch_compile: bool | None = value("--enable-torch-compile")
    enable_mscclpp: bool | None = value("--enable-mscclpp")
    enable_torch_symm_mem: bool | None = value("--enable-torch-symm-mem")
    disable_overlap_schedule: bool | None = value("--disable-overlap-schedule")
    nnodes: int | None = value("--nnodes")
    cuda_graph_backend_decode: str | None = value("0.5.22+: decode CUDA-graph backend (`disabled` switches them off)")
    cuda_graph_backend_prefill: str | None = value("0.5.22+: prefill CUDA-graph backend")

    # ---- from internal_states[0] (the first DP rank's scheduler) ------------------------------------
    effective_max_running_requests: int | None = value(
        "the scheduler's running-request cap per DP rank (effective_max_running_requests_per_dp, 0.5.8+)", unit="requests")
    weight_memory_gb: float | None = value("memory_usage.weight", unit="GiB")
    kv_cache_memory_gb: float | None = value("memory_usage.kvcache", unit="GiB")
    kv_token_capacity: int | None = value("memory_usage.token_capacity", unit="tokens")
    last_gen_throughput: float | None = value("decode throughput at the scheduler's last log line", unit="tokens/s")

    # ---- /model_info (/get_model_info) and /v1/models ----------------------------------------------
    model_type: str | None = value("the model's HF model_type (/model_info, 0.5.6+)")
    architectures: list[str] | None = value("the model's HF architectures (/model_info, 0.5.6+)")
    is_generation: bool | None = value("a generative model (not an embedding one)")
    served_models: list[str] | None = value("ids in /v1/models (the served name, then LoRA adapters)")
    max_model_len: int | None = value("the first model's context length in /v1/models", unit="tokens")
