"""What `sglang.profile` returns, declared (a `Values` model of gpu_runbook.values).

The breakdown comes from `gpu_runbook.trace.analysis` (Profile.summary), the roofline and PCIe figures
from `probes/roofline.py`. Shares are of the decode step's wall time, 0..1, mean over the TP ranks.
Unavailable evidence (no trace appeared) carries only trace_dir_server, trace_dir_local, ranks_found
and tp_size.
"""

from __future__ import annotations

from typing import Literal

from gpu_runbook.plugin import Values, value

Bucket = Literal["moe_gemm", "dense_gemm", "attention", "communication", "norm_act_rope", "quantization", "memcpy", "other"]


class BucketShares(Values):
    """Kernel time per bucket over the step wall (gpu_runbook.trace.rules.BUCKETS)."""

    moe_gemm: float = value("MoE expert GEMMs", default=...)
    dense_gemm: float = value("dense GEMMs", default=...)
    attention: float = value("attention kernels", default=...)
    communication: float = value("NCCL / custom all-reduce and other collectives", default=...)
    norm_act_rope: float = value("norms, activations, rotary embedding", default=...)
    quantization: float = value("(de)quantization kernels", default=...)
    memcpy: float = value("memory copies and sets", default=...)
    other: float = value("everything else", default=...)


class RankProfile(Values):
    rank: int = value("TP rank", default=...)
    step_ms: float = value("mean decode step on this rank", unit="ms", default=...)
    shares: BucketShares = value("share of the step per kernel bucket", default=...)
    idle_share: float = value("step wall with no kernel running on any stream", default=...)
    non_comm_ms_per_step: float = value("kernel time outside communication per step (the straggler measure)", unit="ms", default=...)


class UnclassifiedKernel(Values):
    """A kernel no bucket rule matched (counted in bucket `other`): gpu_runbook.trace.coverage."""

    name: str = value("the kernel's name as the trace has it", default=...)
    ms_per_step: float = value("its time per step, mean over ranks", unit="ms", default=...)
    share: float = value("its share of the step wall", default=...)
    kernel_share: float = value("its share of kernel time (as coverage is)", default=...)


class ProfileValues(Values):
    """`sglang.profile`: where a decode step's GPU time goes, the DRAM/tensor roofline, and PCIe bytes per step."""

    # the breakdown (trace analysis, mean over ranks)
    moe_gemm_share: float = value("MoE expert GEMMs' share of the step", default=...)
    dense_gemm_share: float = value("dense GEMMs' share of the step", default=...)
    attention_share: float = value("attention's share of the step", default=...)
    communication_share: float = value("collectives' share of the step", default=...)
    norm_act_rope_share: float = value("norm/activation/rotary share of the step", default=...)
    quantization_share: float = value("(de)quantization share of the step", default=...)
    memcpy_share: float = value("memory copies' share of the step", default=...)
    other_share: float = value("unbucketed kernels' share of the step", default=...)
    ranks: int = value("ranks whose trace held decode steps", default=...)
    steps: int = value("decode steps analysed (most over ranks)", default=...)
    step_source: Literal["spans", "gaps", "window"] = value(
        "`spans`: step[DECODE] annotations (0.5.11+); `gaps`: forward passes told apart on the GPU timeline, prefill ones "
        "by their prefill-only kernels (<= 0.5.10); `window`: first-to-last GPU activity / steps asked", default=...)  # fmt: skip
    extend_passes: int = value("prefill (EXTEND) passes in the capture, left out of the decode step and its shares", default=0)
    capture: str | None = value("how the decode passes were captured and told apart (request fields used, what the server wrote)", default=None)
    step_ms: float = value("decode step, mean over ranks (as the roofline rounds it)", unit="ms", default=...)
    idle_share: float = value("GPU idle share of the step (no kernel on any stream)", default=...)
    idle_ms_per_step: float = value("GPU idle time per step", unit="ms", default=...)
    kernels_per_step: float = value("kernels launched per step (launch-boundness)", default=...)
    median_kernel_us: float | None = value("median kernel duration", unit="µs", default=...)
    unclassified_share: float = value("kernel time no bucket rule matched (worst rank), over all kernel time", default=...)
    coverage: float = value("share of kernel time a bucket rule matched: 1 - unclassified_share (worst rank)", default=...)
    top_unclassified: list[UnclassifiedKernel] = value(
        "the kernels no bucket rule matched, most time first (up to 5, among the top kernels by time)", default=...)  # fmt: skip
    straggler_spread: float = value("(max - min) / mean of the ranks' non-communication time per step", default=...)
    slowest_rank: int = value("the rank with the most non-communication time per step", default=...)
    backends: list[str] = value("kernel backends seen (flashinfer, triton, cutlass ...), most time first", default=...)
    dominant_bucket: Bucket = value("the bucket with the largest share", default=...)
    dominant_share: float = value("its share of the step", default=...)
    top_kernel: str | None = value("the kernel with the most time per step", default=...)
    top_kernel_share: float | None = value("its share of the step", default=...)
    per_rank: list[RankProfile] = value("the breakdown per rank", default=...)
    # the capture
    trace_dir_server: str = value("where the server was asked to write the traces (its filesystem)", default=...)
    trace_dir_local: str = value("where this host read them", default=...)
    ranks_found: int | None = value("rank traces that appeared (unavailable evidence only)")
    version: str = value("SGLang version from server_info", default=...)
    tp_size: int = value("TP size: rank traces expected", default=...)
    export_pause_s: float | None = value("how long the server paused writing the traces (file mtime - last GPU activity)", unit="s", default=...)
    capture_wall_s: float = value("time from /start_profile until every trace was complete", unit="s", default=...)
    # the roofline (roofline.roofline with _roofline_values)
    gpu_model: str | None = value("GPU table id of the GPU (null when NVML or the table does not know it)", default=...)
    bytes_per_step_gb: float | None = value("weights + KV read per step per GPU", unit="GB", default=...)
    weight_gb: float | None = value("weights per GPU (server_info memory_usage.weight)", unit="GB", default=...)
    weight_read_gb: float | None = value("weights read per step per GPU: weight_gb less the experts no token routed to", unit="GB")
    experts_touched_share: float | None = value("expected share of the routed experts a step's tokens reach: 1 - (1 - top_k / experts) ^ batch (uniform routing, an upper bound)")
    kv_read_gb: float | None = value("KV read per step per GPU (tokens in use x bytes per token)", unit="GB", default=...)
    peak_dram_gbps: float | None = value("the GPU's DRAM bandwidth peak (GPU table)", unit="GB/s", default=...)
    achieved_gbps: float | None = value("bytes per step / step time", unit="GB/s", default=...)
    bandwidth_share: float | None = value("achieved / peak DRAM bandwidth (near 1: at the roofline)", default=...)
    roofline_step_ms: float | None = value("the step at peak DRAM bandwidth", unit="ms", default=...)
    roofline_ratio: float | None = value("measured step / roofline step", default=...)
    peak_tflops: float | None = value("tensor peak for the weights' format", unit="TFLOP/s", default=...)
    peak_format: Literal["fp4", "fp8", "bf16"] | None = value("which peak: the weights' format on this GPU", default=...)
    achieved_tflops: float | None = value("estimated matmul FLOPs per step / step time", unit="TFLOP/s", default=...)
    flops_share: float | None = value("achieved / peak tensor throughput", default=...)
    batch: float | None = value("running requests from /metrics (tokens per decode step)", unit="requests", default=...)
    mfu_tflops: float | None = value("sglang:estimated_flops_per_gpu_total rate over the capture (--enable-mfu-metrics)", unit="TFLOP/s")
    mfu_flops_share: float | None = value("mfu_tflops / peak_tflops")
    mfu_read_gbps: float | None = value("sglang:estimated_read_bytes_per_gpu_total rate over the capture", unit="GB/s")
    mfu_bandwidth_share: float | None = value("mfu_read_gbps / peak_dram_gbps")
    moe_roofline_ms: float | None = value("the experts routed to (experts_touched_share) at peak DRAM bandwidth, per step (MoE models)", unit="ms")
    moe_roofline_share: float | None = value("moe_roofline_ms / measured MoE GEMM time (near 1: the MoE GEMMs are at their roofline)")
    weight_gb_source: Literal["server_info internal_states[0].memory_usage.weight"] | None = value("where weight_gb came from", default=...)
    kv_bytes_per_token: int | None = value("KV bytes per token per GPU, all layers", unit="bytes", default=...)
    kv_source: Literal["server_info memory_usage.kvcache / token_capacity", "model config (layers x KV heads x head dim)"] | None = value(
        "where kv_bytes_per_token came from", default=...)  # fmt: skip
    # PCIe per decode step (roofline.pcie_per_step)
    decode_steps: float | None = value("decode steps in the PCIe window", default=...)
    pcie_tx_bytes_per_step: int | None = value("PCIe bytes sent per GPU per decode step", unit="bytes", default=...)
    pcie_rx_bytes_per_step: int | None = value("PCIe bytes received per GPU per decode step", unit="bytes", default=...)
    allreduce_bytes_per_step_predicted: int | None = value("predicted BF16 TP all-reduce bytes per GPU per step", unit="bytes", default=...)
    pcie_to_allreduce_ratio: float | None = value("larger PCIe direction / predicted all-reduce bytes (~1: as expected)", default=...)
    pcie_reading: str | None = value("what the ratio means, in words", default=...)
    decode_steps_source: Literal["sglang:cuda_graph_passes_total (decode modes)", "window / measured step time"] = value(
        "how the decode steps were counted", default=...)  # fmt: skip
    pcie_source: Literal["nvmlDeviceGetPcieThroughput x window (mean per GPU)"] | None = value(
        "where the PCIe bytes came from (null without NVML)", default=...)  # fmt: skip
    finding_allreduce: str = value("a fixed note: SGLang has no quantized all-reduce for CUDA, and what reduces the traffic", default=...)
