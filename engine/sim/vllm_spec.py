"""How a simulated vLLM server was launched: a scenario's `server.vllm` (its own module: the scenario model and the
server both read it, and the scenario model must not import the server)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
    disable_custom_all_reduce: bool = False
    quantization: str | None = None
    dtype: str = "bfloat16"
    dev_mode: bool = Field(False, description="VLLM_SERVER_DEV_MODE=1: /server_info answers with the whole config")
    show_hidden_metrics_for_version: str | None = Field(None, description="--show-hidden-metrics-for-version (0.11: 0.10 shows the old names)")
