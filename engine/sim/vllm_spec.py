"""How a simulated vLLM server was launched: a scenario's `server.vllm` (its own module: the scenario model and the
server both read it, and the scenario model must not import the server)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# CompilationConfig.cudagraph_mode (vllm==0.34.0:vllm/config/compilation.py:699-733)
CudagraphMode = Literal["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]


class VllmSpec(BaseModel):
    """What a vLLM server was launched with (a scenario's `server.vllm`), beside the common server fields."""

    model_config = ConfigDict(extra="forbid")

    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    enable_expert_parallel: bool = False
    max_num_seqs: int | None = Field(None, ge=1, description="--max-num-seqs (None: the release's default for the GPU)")
    max_num_batched_tokens: int = Field(8192, ge=1)
    block_size: int = Field(16, ge=1)
    cache_dtype: str = "auto"
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    max_cudagraph_capture_size: int | None = Field(None, ge=0, description="None: the release's default")
    cudagraph_mode: CudagraphMode | None = Field(
        None, description=("--compilation-config cudagraph_mode (None: the release's default, FULL_AND_PIECEWISE on V1: "
                           "vllm==0.11.0:vllm/config/__init__.py:358-366, vllm==0.34.0:vllm/config/vllm.py:339; NONE with enforce_eager)"))
    disable_custom_all_reduce: bool = False
    quantization: str | None = None
    moe_backend: str = Field("auto", description=(
        "--moe-backend (0.17+: vllm==0.17.0:vllm/engine/arg_utils.py:1236-1238; KernelConfig.moe_backend, "
        "vllm==0.34.0:vllm/config/kernel.py:122-147): `auto` lets the release pick the MoE kernels"))
    dtype: str = "bfloat16"
    dev_mode: bool = Field(False, description="VLLM_SERVER_DEV_MODE=1: /server_info answers with the whole config")
    show_hidden_metrics_for_version: str | None = Field(None, description="--show-hidden-metrics-for-version (0.11: 0.10 shows the old names)")
    env: dict[str, str] = Field(default_factory=dict, description=(
        "VLLM_* environment the server runs with: VLLM_TORCH_PROFILER_DIR turns the torch profiler on through 0.12 "
        "(vllm==0.11.0:vllm/envs.py:835-838; 0.13-0.15 still read it, deprecated), VLLM_PROFILER_MAX_ITERS (0.12+) ..."))
    profiler_config: dict[str, Any] | None = Field(None, description=(
        "--profiler-config as JSON (0.13+: vllm/config/profiler.py), e.g. {profiler: torch, torch_profiler_dir: /tmp/p}; "
        "/start_profile exists only with a profiler (engine/sim/profiler.py vllm_profiler_setting)"))
