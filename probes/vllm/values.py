"""What the vLLM probes return: the SAME concept names the SGLang probes fill, so the runbooks' rules decide on
either server; plus what only vLLM says, and where each value came from.

`vllm.server` fills the concept half of `SglangServerValues` (probes/sglang/values.py): a concept vLLM cannot
report on a release, or without dev mode, is null and `unknown[name]` says why; `sources[name]` says where a
value was read (`/server_info` in dev mode, `vllm:cache_config_info`, `/v1/models`, `/version`, a release's
default). `vllm.metrics` and `vllm.sweep` return `MetricsValues` and `SweepValues` themselves
(probes/server/values.py), with the source literals widened to vLLM's series.
"""

from __future__ import annotations

from typing import Literal

from gpu_runbook.plugin import Values, value

from ..server.values import MetricsValues, Spread


class VllmServerValues(Values):
    """vLLM's configuration by concept (the names rules read) and by vLLM's own names."""

    server_kind: Literal["vllm"] = value("the server kind (its probe family); steps name its flags", default=...)
    version: str | None = value("`/version`", default=...)
    version_known: bool = value("the version is a release that orders (not a dev build or unknown)", default=...)
    dev_mode: bool = value("`/server_info` answered (VLLM_SERVER_DEV_MODE=1): the full configuration is known", default=...)
    tp: int | None = value("tensor-parallel size (dev mode only; null: not exposed)", default=...)
    pp: int | None = value("pipeline-parallel size (dev mode only)", default=...)
    dp: int | None = value("data-parallel size (dev mode only)", default=...)
    ep: int | None = value("expert-parallel width: tp x dp with --enable-expert-parallel, else 1 (dev mode only)", default=...)
    attn_dp: int | None = value("attention data-parallel width: vLLM's DP engines each hold their own KV (dev mode only)", default=...)
    world_size: int | None = value("GPUs per server: tp x pp x dp (dev mode only)", default=...)
    gpus_held: int | None = value(
        "GPUs whose memory the server's processes hold (NVML compute processes, read where dev mode gives no "
        "configuration): its world size, tp x pp x dp, never TP by itself; null where it cannot be counted", unit="GPUs")
    quantization: str | None = value("weight quantization (model_config.quantization), null for none", default=...)
    model_dtype: str | None = value("model dtype as `bfloat16` / `float16` (dev mode), else null", default=...)
    kv_dtype: str | None = value("KV cache dtype: cache_config_info's cache_dtype (`auto`, `fp8`, ...)", default=...)
    kv_dtype_source: str | None = value("where kv_dtype came from", default=...)
    moe_backend: str | None = value(
        "--moe-backend (0.17+, KernelConfig.moe_backend: `auto`, `flashinfer_cutlass`, `cutlass`, `marlin`, ...): dev "
        "mode's kernel_config or the launch arguments, else `auto` (the default; an estimate where the launch is not "
        "read); `auto` on a release without the flag, where vLLM picks the MoE kernels in code", default=...)  # fmt: skip
    moe_backend_source: str | None = value("where moe_backend came from", default=...)
    vllm_use_flashinfer_moe_fp4: bool | None = value(
        "VLLM_USE_FLASHINFER_MOE_FP4 (0.10-0.23; removed in 0.24): from dev mode's /server_info vllm_env, false where "
        "vllm_env is read and does not set it (its default, 0); null where it is not readable or the release does not "
        "read it", default=...)  # fmt: skip
    page_size: int | None = value("KV block size (cache_config_info block_size)", unit="tokens", default=...)
    context_length: int | None = value("max_model_len (/v1/models)", unit="tokens", default=...)
    radix_cache: bool | None = value("prefix caching on (cache_config_info enable_prefix_caching)", default=...)
    mem_fraction_static: float | None = value("--gpu-memory-utilization (cache_config_info)", default=...)
    custom_all_reduce_disabled: bool | None = value(
        "custom all-reduce off: --disable-custom-all-reduce, or vLLM's own rule (more than two GPUs without NVLink "
        "turn it off at start-up); null without dev mode", default=...)  # fmt: skip
    vllm_allreduce_use_flashinfer_pcie_ipc: bool | None = value(
        "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC (0.30.0+, opt-in): FlashInfer's PCIe-IPC all-reduce; from dev mode's "
        "/server_info vllm_env, null where it is not readable", default=...)  # fmt: skip
    flashinfer_pcie_ipc_available: bool | None = value(
        "the server's FlashInfer build has PcieIpcAllReduceWorkspace (null: not read)", default=...)
    cuda_graphs_decode: bool | None = value("decode runs CUDA graphs: not enforce_eager and cudagraph_mode not NONE", default=...)
    graph_max_bs_decode: int | None = value("largest captured batch (max_cudagraph_capture_size, else the release's default)",
                                            unit="requests", default=...)
    graph_max_bs_if_enabled: int | None = value(
        "largest decode batch this launch would capture with CUDA graphs on: graph_max_bs_decode where they are on; "
        "under --enforce-eager (0 above) a capture size set at launch, else the release's default from max_num_seqs "
        "(min(2 x max_num_seqs, 512) from 0.10, 512 before)", unit="requests", default=...)  # fmt: skip
    graph_source: str | None = value("which fields cuda_graphs_decode came from", default=...)
    running_cap: int | None = value("the running-request cap: max_num_seqs x DP engines", unit="requests", default=...)
    running_cap_per_dp: int | None = value("max_num_seqs of one engine", unit="requests", default=...)
    running_cap_source: str | None = value(
        "scheduler_config.max_num_seqs (dev mode), or the release's default for this GPU (an estimate)", default=...)
    kv_capacity_tokens: int | None = value("KV tokens: num_gpu_blocks x block_size (cache_config_info)", unit="tokens", default=...)
    max_total_num_tokens: int | None = value("the same, under SGLang's name", unit="tokens", default=...)
    served_models: list[str] | None = value("ids in /v1/models", default=...)
    max_model_len: int | None = value("the first model's max_model_len in /v1/models", unit="tokens", default=...)
    model_path: str | None = value("the first model's `root` in /v1/models (its path or repo)", default=...)
    num_gpu_blocks: int | None = value("cache_config_info num_gpu_blocks", default=...)
    kv_cache_max_concurrency: float | None = value("0.24+: cache_config_info kv_cache_max_concurrency (requests at max_model_len)",
                                                   default=...)
    launch_args: list[str] = value("the vLLM configuration fields read (what a diff compares)", default=...)
    sources: dict[str, str] = value("concept -> where its value was read", default=...)
    unknown: dict[str, str] = value("concept -> why it is null on this server", default=...)


class VllmMetricsValues(MetricsValues):
    """`vllm.metrics`: `MetricsValues` filled from vLLM's series (vllm-and-fleet.md §1, §3)."""

    retractions_source: Literal["vllm:num_preemptions_total"] | None = value(
        "preemptions (recompute) stand for SGLang's retractions: the KV cache ran out mid-decode", default=...)  # fmt: skip
    running_cap_source: str | None = value(
        "where running_cap came from: max_num_seqs (dev mode), the release's default, or measured (running pinned "
        "at one number while requests wait and the KV cache has room)", default=...)  # fmt: skip
    kv_usage_series: str | None = value("the KV usage gauge this release exports (renamed in 0.9.2)", default=...)
    waiting_by_reason: dict[str, Spread] | None = value(
        "waiting requests by reason (`capacity`: no room, `deferred`), 0.20+; null before", unit="requests", default=...)  # fmt: skip
    unknown: dict[str, str] = value("value -> why it is null on this release", default=...)
