"""The decode roofline and the PCIe bytes per step: pure functions over what the server and NVML say.

No probe of its own: `sglang.profile` calls these with the step time it measured, and a runbook can
get the same numbers without a profile from throughput and batch (`step_time_from_throughput`).
The GPU figures come from the one GPU table (`probes/gpu_table.py`), each with its source.
"""

from __future__ import annotations

from typing import Any

from gpu_runbook.calibration import WEIGHT_BYTES

from .gpu_table import GpuModel


def peak_tflops(gpu: GpuModel, quantization: str | None) -> tuple[float | None, str]:
    """The tensor peak for the weights' format: FP4 checkpoints on FP4 hardware, FP8, else BF16."""
    q = (quantization or "").lower()
    if "fp4" in q and gpu.fp4_dense_tflops.value:
        return gpu.fp4_dense_tflops.value, "fp4"
    if ("fp8" in q or "fp4" in q) and gpu.fp8_dense_tflops.value:
        return gpu.fp8_dense_tflops.value, "fp8"
    return gpu.bf16_dense_tflops.value, "bf16"


def weight_gb_per_gpu(server_info: dict[str, Any]) -> float | None:
    """`internal_states[0].memory_usage.weight` (GB per GPU) where the server reports it (0.5.x)."""
    states = server_info.get("internal_states") or []
    if states and isinstance(states[0], dict):
        mu = states[0].get("memory_usage") or {}
        w = mu.get("weight") if isinstance(mu, dict) else None
        if isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0:
            return float(w)
    return None


def kv_bytes_per_token_from_server(server_info: dict[str, Any]) -> float | None:
    """`memory_usage.kvcache` (GB per GPU) / `token_capacity`: the server's own bytes per KV token, per GPU."""
    states = server_info.get("internal_states") or []
    mu = states[0].get("memory_usage") if states and isinstance(states[0], dict) else None
    if not isinstance(mu, dict):
        return None
    kv, cap = mu.get("kvcache"), mu.get("token_capacity")
    if isinstance(kv, (int, float)) and isinstance(cap, (int, float)) and kv > 0 and cap > 0:
        return float(kv) * 1e9 / float(cap)
    return None


def pcie_reading(ratio: float | None) -> str | None:
    """What a PCIe / predicted decode all-reduce ratio means. The NVML byte counters run over the whole load
    window, so they count prefill's all-reduces (every prompt token crosses, not one token per request) and the
    logits all-gather as well as decode's all-reduces: a ratio well above 1 is what prefill and the logits cost
    before it is anything else (host staging or offload only where the decode-only split says so)."""
    if ratio is None:
        return None
    if ratio > 2.0:
        return ("above the decode all-reduce volume: the window's bytes include prefill's all-reduces (every prompt "
                "token) and the logits all-gather; not by itself a sign of host staging or offload")
    if ratio >= 0.5:
        return ("about the decode all-reduce volume: the activations cross PCIe in BF16, as expected (the window's "
                "bytes include prefill and the logits all-gather too)")
    return "below the all-reduce volume: the all-reduce does not cross PCIe (NVLink) or the counters do not see it"


def kv_bytes_per_token(hf: dict[str, Any], kv_dtype_bytes: float, tp: int) -> float | None:
    """KV bytes one token costs on one GPU, all layers: MLA latent (replicated) or K+V heads (sharded)."""
    layers = hf.get("num_hidden_layers")
    if not layers:
        return None
    if hf.get("kv_lora_rank"):
        per_layer = (hf["kv_lora_rank"] + (hf.get("qk_rope_head_dim") or 64)) * kv_dtype_bytes
        return per_layer * layers
    heads = hf.get("num_attention_heads")
    kv_heads = hf.get("num_key_value_heads") or heads
    hidden = hf.get("hidden_size")
    head_dim = hf.get("head_dim") or (hidden // heads if hidden and heads else None)
    if not (kv_heads and head_dim):
        return None
    local_heads = max(1.0, kv_heads / max(1, tp))
    return 2 * local_heads * head_dim * kv_dtype_bytes * layers


def experts_touched_share(experts: int, top_k: int, tokens: float) -> float:
    """The expected share of a layer's experts that a decode step's tokens route to: each token picks top_k of
    `experts`, so an expert is missed by all of them with probability (1 - top_k / experts) ** tokens. Uniform
    routing: a real router is skewed and touches fewer, so the bytes read from it are an upper bound. At 64
    tokens, top-8 of 256 touches ~87 % of the experts; from a few hundred on, all of them."""
    if experts <= 0 or top_k <= 0 or tokens <= 0:
        return 1.0
    return 1.0 - (1.0 - min(1.0, top_k / experts)) ** tokens


def _served_weight_dtype(quant: Any, hf: dict[str, Any]) -> str:
    """The expert weights' dtype: the server's quantization where it names one (modelopt_fp4, fp8, mxfp4, awq...),
    else the checkpoint's (model.weight_dtype), else bf16."""
    from .model import weight_dtype  # noqa: PLC0415 - one reading of a checkpoint's quantization

    q = str(quant or "").lower()
    if "mxfp4" in q:
        return "mxfp4"
    if "fp4" in q:
        return "fp4"
    if "fp8" in q:
        return "fp8"
    if q in ("awq", "gptq", "awq_marlin", "gptq_marlin", "marlin"):
        return "int4"
    qc = hf.get("quantization_config")
    return weight_dtype(qc if isinstance(qc, dict) else None, None, hf.get("torch_dtype")) or "bf16"


def weights_read_gb(hf: dict[str, Any], quant: Any, tp: int, running: float | None,
                    weight_gb: float | None) -> tuple[float | None, float | None, float | None]:
    """(GB of weights per GPU a decode step reads, GB of routed experts' weights per GPU, the share of them it
    touches): a MoE step reads only the experts its tokens route to (experts_touched_share)."""
    experts = hf.get("n_routed_experts") or hf.get("num_experts") or hf.get("num_local_experts")
    top_k = hf.get("num_experts_per_tok")
    if not isinstance(experts, int) or isinstance(experts, bool) or experts <= 0:
        return weight_gb, None, None
    h, inter = hf.get("hidden_size") or 0, hf.get("moe_intermediate_size") or hf.get("intermediate_size") or 0
    dense = hf.get("first_k_dense_replace")  # DeepSeek-style configs: the first k layers are dense (3 where unsaid)
    moe_layers = (hf.get("num_hidden_layers") or 0) - (int(dense) if isinstance(dense, int) else (3 if hf.get("n_routed_experts") else 0))
    bpp = WEIGHT_BYTES[_served_weight_dtype(quant, hf)]
    expert_gb = moe_layers * experts * 3 * h * inter * bpp / tp / 1e9
    touched = experts_touched_share(int(experts), int(top_k), running) if top_k and running else None
    if weight_gb and expert_gb and touched is not None and expert_gb < weight_gb:
        return weight_gb - expert_gb * (1.0 - touched), expert_gb, touched
    return weight_gb, expert_gb, touched


def step_time_from_throughput(running: float | None, gen_tok_s: float | None) -> float | None:
    """Seconds per decode step when every running request gains one token per step."""
    if not running or not gen_tok_s or gen_tok_s <= 0:
        return None
    return running / gen_tok_s


def roofline(
    *,
    gpu: GpuModel | None,
    step_s: float | None,
    weight_gb: float | None,
    kv_read_gb: float | None,
    flops_per_step: float | None = None,
    quantization: str | None = None,
) -> dict[str, Any]:
    """Achieved DRAM bandwidth and tensor throughput as a share of the GPU's peak, and the floor step.

    Bytes per step = the weights read once (the caller leaves out the experts no token routed to:
    `experts_touched_share`) + the KV read.
    `bandwidth_share` near 1 means the step is at the roofline: the hardware is doing what it can.
    """
    out: dict[str, Any] = {"gpu_model": gpu.id if gpu else None, "step_ms": None if step_s is None else round(step_s * 1000, 3)}
    bytes_gb = (weight_gb or 0.0) + (kv_read_gb or 0.0) if (weight_gb or kv_read_gb) else None
    out["bytes_per_step_gb"] = None if bytes_gb is None else round(bytes_gb, 3)
    out["weight_gb"] = weight_gb
    out["kv_read_gb"] = None if kv_read_gb is None else round(kv_read_gb, 3)
    peak_bw = gpu.dram_gbps.value if gpu else None
    out["peak_dram_gbps"] = peak_bw
    out["achieved_gbps"] = round(bytes_gb / step_s, 1) if bytes_gb and step_s else None
    out["bandwidth_share"] = round(out["achieved_gbps"] / peak_bw, 4) if out["achieved_gbps"] and peak_bw else None
    out["roofline_step_ms"] = round(bytes_gb / peak_bw * 1000, 3) if bytes_gb and peak_bw else None
    out["roofline_ratio"] = round(step_s * 1000 / out["roofline_step_ms"], 2) if step_s and out["roofline_step_ms"] else None
    peak_tf, fmt = peak_tflops(gpu, quantization) if gpu else (None, None)
    out["peak_tflops"], out["peak_format"] = peak_tf, fmt
    out["achieved_tflops"] = round(flops_per_step / step_s / 1e12, 2) if flops_per_step and step_s else None
    out["flops_share"] = round(out["achieved_tflops"] / peak_tf, 5) if out["achieved_tflops"] and peak_tf else None
    return out


def decode_flops_per_gpu(hf: dict[str, Any], tokens: float, tp: int) -> float | None:
    """2 x active parameters x tokens / TP: the matmul FLOPs of one decode step on one GPU (estimate)."""
    h, layers = hf.get("hidden_size"), hf.get("num_hidden_layers")
    if not h or not layers or not tokens:
        return None
    experts = hf.get("n_routed_experts") or hf.get("num_experts")
    if experts:
        k = hf.get("num_experts_per_tok") or 1
        inter = hf.get("moe_intermediate_size") or hf.get("intermediate_size") or 4 * h
        shared = hf.get("n_shared_experts") or 0
        mlp = 3 * h * inter * (k + shared)
    else:
        mlp = 3 * h * (hf.get("intermediate_size") or 4 * h)
    attn = 4 * h * h
    return 2.0 * (mlp + attn) * layers * tokens / max(1, tp)


def mfu_counters(metrics_text: str) -> dict[str, float]:
    """`sglang:estimated_*_per_gpu_total` counters (`--enable-mfu-metrics`), summed over their labels."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(metrics_text):
            for s in fam.samples:
                if s.name.startswith("sglang:estimated_") and "_per_gpu" in s.name and s.name.endswith("_total"):
                    out[s.name] = out.get(s.name, 0.0) + float(s.value)
    except (ValueError, KeyError, IndexError, TypeError):
        return {}
    return out


def decode_passes(metrics_text: str) -> float | None:
    """Sum of `sglang:cuda_graph_passes_total{mode=~"decode.*"}` (0.5.7+): one per decode pass, graph or not."""
    from prometheus_client.parser import text_string_to_metric_families

    total, seen = 0.0, False
    try:
        for fam in text_string_to_metric_families(metrics_text):
            for s in fam.samples:
                if s.name == "sglang:cuda_graph_passes_total" and str(s.labels.get("mode", "")).startswith("decode"):
                    total += float(s.value)
                    seen = True
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return total if seen else None


# ---- PCIe bytes per decode step -----------------------------------------------------------------


def allreduce_bytes_per_step(tokens: float, hidden: int, layers: int, tp: int, dtype_bytes: float = 2.0) -> float:
    """Bytes one GPU sends per decode step for TP all-reduce: message x ring factor 2(N-1)/N x 2 per layer."""
    if tp <= 1:
        return 0.0
    return tokens * hidden * dtype_bytes * 2 * (tp - 1) / tp * 2 * layers


def pcie_per_step(
    *,
    tx_bytes_window: float | None,
    rx_bytes_window: float | None,
    window_s: float | None,
    decode_steps: float | None = None,
    step_s: float | None = None,
    tokens: float | None = None,
    hidden: int | None = None,
    layers: int | None = None,
    tp: int = 1,
) -> dict[str, Any]:
    """PCIe bytes per GPU per decode step against the predicted BF16 all-reduce volume.

    Inputs are NVML byte counts per GPU over the load window (`gpu.sample`'s
    `pcie_tx_bytes_window` / `pcie_rx_bytes_window`, `pcie_counter_window_s`) and either the decode
    steps in that window (`sglang:cuda_graph_passes_total` decode modes) or the step time.
    ~1x: activations cross in BF16 as expected; well above: prefill and the logits all-gather are in the window too.
    """
    steps = decode_steps if decode_steps else (window_s / step_s if window_s and step_s else None)
    out: dict[str, Any] = {"decode_steps": None if steps is None else round(steps, 2)}
    per = {}
    for key, v in (("tx", tx_bytes_window), ("rx", rx_bytes_window)):
        per[key] = v / steps if v is not None and steps else None
        out[f"pcie_{key}_bytes_per_step"] = None if per[key] is None else round(per[key])
    predicted = allreduce_bytes_per_step(tokens, hidden, layers, tp) if tokens and hidden and layers else None
    out["allreduce_bytes_per_step_predicted"] = None if predicted is None else round(predicted)
    seen = max((v for v in per.values() if v is not None), default=None)
    out["pcie_to_allreduce_ratio"] = round(seen / predicted, 3) if seen is not None and predicted else None
    return out


QUANTIZED_ALLREDUCE_NOTE = (
    "SGLang (<= 0.5.23) has no quantized (FP8/FP4) all-reduce for CUDA (only ROCm quick-reduce), so "
    "\"make the activations NVFP4 too\" has no flag. What reduces the traffic: DP attention "
    "(--enable-dp-attention), fewer GPUs per TP group (--tp-size 4 --dp-size 2), or pipeline "
    "parallelism (--pp-size 2)."
)
