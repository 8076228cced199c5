"""What a model's config.json implies for memory and traffic: weight bytes, KV bytes per token, all-reduce bytes.

The simulator reports `memory_usage` and moves PCIe bytes the way a real server would for the
scenario's model, so both are derived from the model's shape (shared reference sglang-versions.md
§11.2) instead of being one constant for every model. All figures are estimates of the same kind
as the reference's back-of-envelope arithmetic; they only need to scale right with the model, the
quantization and the parallel layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = float(1 << 30)
# Architectures whose attention is DeepSeek Sparse Attention (a latent KV plus an indexer key).
DSA_ARCHITECTURES = frozenset({"GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM"})


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    experts: int  # routed experts (0: dense)
    shared_experts: int
    moe_intermediate: int
    dense_layers: int  # leading dense layers of an MoE model
    kv_lora_rank: int  # MLA latent (0: not MLA)
    rope_dim: int
    dsa: bool
    expert_bytes: float  # bytes per expert parameter (NVFP4 0.5625, FP8 1, BF16 2)
    other_bytes: float

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    def expert_params(self) -> float:
        return float(self.moe_layers * self.experts * 3 * self.hidden * self.moe_intermediate)

    def attention_params(self) -> float:
        return float(self.layers * 4 * self.hidden * self.hidden)

    def other_params(self) -> float:
        dense_mlp = (self.layers - self.moe_layers) * 3 * self.hidden * self.intermediate
        shared = self.moe_layers * self.shared_experts * 3 * self.hidden * self.moe_intermediate
        return float(dense_mlp + shared + 2 * self.vocab * self.hidden)

    def weight_gb_per_gpu(self, tp: int, attn_tp: int | None = None) -> float:
        """Weights per GPU in GiB: experts and MLPs sharded over TP, attention over the attention-TP group."""
        attn_tp = attn_tp or tp
        total = (self.expert_params() * self.expert_bytes + self.other_params() * self.other_bytes) / tp
        total += self.attention_params() * self.other_bytes / attn_tp
        return total / GIB

    def kv_bytes_per_token(self, kv_dtype_bytes: float, tp: int) -> float:
        """KV bytes one token occupies on one GPU (MLA latents are replicated over TP; MHA/GQA heads are sharded)."""
        if self.kv_lora_rank:
            if self.dsa and kv_dtype_bytes == 1:
                per_layer = 656 + 132  # FlashMLA FP8 latent + indexer key (reference §11.2)
            else:
                per_layer = (self.kv_lora_rank + self.rope_dim) * kv_dtype_bytes + (132 if self.dsa else 0)
            return float(per_layer * self.layers)
        heads_per_gpu = max(1, self.kv_heads // tp) if self.kv_heads >= tp else 1
        return float(2 * heads_per_gpu * self.head_dim * self.layers * kv_dtype_bytes)

    def allreduce_bytes_per_token(self) -> float:
        """One token's share of a step's TP all-reduces: hidden x 2 B (BF16), two per layer."""
        return float(self.hidden * 2 * 2 * self.layers)


def _quant_bytes(cfg: dict[str, Any], quant: dict[str, Any] | None) -> tuple[float, float]:
    algo = ""
    q = cfg.get("quantization_config") or {}
    algo = str(q.get("quant_algo") or q.get("quant_method") or "")
    if quant and isinstance(quant.get("quantization"), dict):
        algo = str(quant["quantization"].get("quant_algo") or algo)
    algo = algo.upper()
    if "FP4" in algo:
        return 0.5625, 2.0  # 4 bit + one FP8 scale per 16 values; the rest stays BF16
    if "FP8" in algo:
        return 1.0, 1.0
    return 2.0, 2.0


def shape_of(cfg: dict[str, Any], quant: dict[str, Any] | None = None) -> ModelShape:
    """The shape from a config.json (missing fields fall back to a Qwen3-32B-like dense model)."""
    hidden = int(cfg.get("hidden_size", 5120))
    heads = int(cfg.get("num_attention_heads", 64))
    expert_b, other_b = _quant_bytes(cfg, quant)
    archs = set(cfg.get("architectures") or [])
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or 0)
    return ModelShape(
        hidden=hidden,
        layers=int(cfg.get("num_hidden_layers", 64)),
        vocab=int(cfg.get("vocab_size", 151936)),
        heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads", heads)),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate=int(cfg.get("intermediate_size", 4 * hidden)),
        experts=experts,
        shared_experts=int(cfg.get("n_shared_experts") or 0),
        moe_intermediate=int(cfg.get("moe_intermediate_size") or 0),
        dense_layers=int(cfg.get("first_k_dense_replace") or 0) if experts else 0,
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
        rope_dim=int(cfg.get("qk_rope_head_dim") or 0),
        dsa=bool(archs & DSA_ARCHITECTURES) or "index_topk" in cfg,
        expert_bytes=expert_b,
        other_bytes=other_b,
    )


def kv_cache_quant_algo(cfg: dict[str, Any], quant: dict[str, Any] | None) -> str | None:
    """The checkpoint's KV quantization as SGLang's modelopt config reads it (hf_quant_config first)."""
    if quant and isinstance(quant.get("quantization"), dict):
        algo = quant["quantization"].get("kv_cache_quant_algo")
        if algo:
            return str(algo)
    q = cfg.get("quantization_config") or {}
    if q.get("kv_cache_quant_algo"):
        return str(q["kv_cache_quant_algo"])
    scheme = q.get("kv_cache_scheme") or {}
    if scheme.get("type") == "float" and scheme.get("num_bits") == 8:
        return "FP8"
    return None
