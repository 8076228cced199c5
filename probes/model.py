"""`model.config`: the served model's shape from its `config.json` (experts, layers, quantization).

The server only reports its `model_path`; the architecture facts that explain MoE and KV behaviour
live in the checkpoint's config, which is on this host when the path is a local directory or the
model sits in the local Hugging Face cache. Nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from gpu_runbook import json_bounded
from gpu_runbook.calibration import WEIGHT_BYTES
from gpu_runbook.files import read_text_capped
from gpu_runbook.model_shape import GIB, shape_of
from gpu_runbook.plugin import Context, Evidence, Probe, Table, Values, value
from pydantic import BaseModel, ConfigDict

from .server.http import ProbeError, served_model_path


def hf_hub_dirs() -> list[Path]:
    """Where the Hugging Face cache may be, in the library's order of precedence."""
    out: list[Path] = []
    if os.environ.get("HF_HUB_CACHE"):
        out.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        out.append(Path(os.environ["HUGGINGFACE_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        out.append(Path(os.environ["HF_HOME"]) / "hub")
    out.append(Path.home() / ".cache" / "huggingface" / "hub")
    return out


def read_json_file(path: Path) -> Any:
    """A checkpoint's JSON file (config.json, hf_quant_config.json): size-capped (gpu_runbook.files) and depth-bounded
    (json_bounded), so a huge or deeply nested one is a ValueError, never a RecursionError or gigabytes read."""
    return json_bounded.loads(read_text_capped(path))


def find_config_dir(model_path: str) -> Path | None:
    """The directory holding config.json: the path itself, or the cached snapshot of `org/name`."""
    p = Path(model_path).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return p
    if "/" not in model_path or model_path.startswith(("/", ".", "~")):
        return None
    repo = "models--" + model_path.strip("/").replace("/", "--")
    for hub in hf_hub_dirs():
        snaps = hub / repo / "snapshots"
        ref = hub / repo / "refs" / "main"
        if ref.is_file():
            cand = snaps / ref.read_text().strip()
            if (cand / "config.json").is_file():
                return cand
        if snaps.is_dir():
            found = sorted((d for d in snaps.iterdir() if (d / "config.json").is_file()), key=lambda d: d.stat().st_mtime, reverse=True)
            if found:
                return found[0]
    return None


def _first(cfg: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


def kv_cache_quant_algo(cfg: dict[str, Any], hf_quant: dict[str, Any] | None) -> str | None:
    """modelopt's KV-cache quantization: hf_quant_config.json (nested or flat), else config.json's
    quantization_config; `kv_cache_scheme {type: float, num_bits: 8}` also means FP8 (compressed-tensors)."""
    sources: list[Any] = []
    if hf_quant:
        sources += [hf_quant.get("quantization"), hf_quant]
    sources.append(cfg.get("quantization_config"))
    for src in sources:
        if isinstance(src, dict):
            algo = src.get("kv_cache_quant_algo")
            if isinstance(algo, str) and algo:
                return algo
            scheme = src.get("kv_cache_scheme")
            if isinstance(scheme, dict) and scheme.get("type") == "float" and scheme.get("num_bits") == 8:
                return "FP8"
    return None


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


_INT_QUANT_METHODS = {"awq", "gptq", "awq_marlin", "gptq_marlin", "marlin", "auto-round", "gptq_marlin_24", "moe_wna16"}


def weight_dtype(qc: dict[str, Any] | None, hf_quant: dict[str, Any] | None, torch_dtype: Any) -> str | None:
    """What the weights a GEMM reads are stored as (a key of calibration.WEIGHT_BYTES): the quantization's
    algorithm where the checkpoint names one (modelopt's NVFP4/FP8, fp8, MXFP4, AWQ/GPTQ bits, compressed-tensors'
    weight groups), else the checkpoint dtype. None where a scheme is not recognised: the bytes stay unknown."""
    qc = qc if isinstance(qc, dict) else {}
    hq = hf_quant.get("quantization", hf_quant) if isinstance(hf_quant, dict) else {}
    hq = hq if isinstance(hq, dict) else {}
    method = str(qc.get("quant_method") or "").lower()
    algo = " ".join(str(x) for x in (qc.get("quant_algo"), hq.get("quant_algo")) if x).upper()
    if "MXFP4" in algo or method == "mxfp4":
        return "mxfp4"
    if "FP4" in algo:
        return "fp4"
    if "FP8" in algo or method in ("fp8", "fbgemm_fp8", "ptpc_fp8", "w8a8_fp8", "modelopt_fp8"):
        return "fp8"
    if method in _INT_QUANT_METHODS:
        bits = qc.get("bits") or qc.get("w_bit")
        return {4: "int4", 8: "int8"}.get(bits) if isinstance(bits, int) else None
    if method == "bitsandbytes":
        return "int4" if qc.get("load_in_4bit") else "int8" if qc.get("load_in_8bit") else None
    if method == "compressed-tensors":
        groups = qc.get("config_groups") if isinstance(qc.get("config_groups"), dict) else {}
        for group in groups.values():
            w = group.get("weights") if isinstance(group, dict) else None
            if isinstance(w, dict) and w.get("num_bits") in (4, 8):
                return {(4, "float"): "fp4", (8, "float"): "fp8", (4, "int"): "int4", (8, "int"): "int8"}.get((w["num_bits"], w.get("type")))
        return None
    if method or algo:
        return None  # a scheme not listed here: its bytes are not guessed
    return {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}.get(str(torch_dtype or "").lower())


def config_values(cfg: dict[str, Any], hf_quant: dict[str, Any] | None) -> dict[str, Any]:
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    merged = {**text, **{k: v for k, v in cfg.items() if v is not None}}
    experts = _first(merged, "n_routed_experts", "num_experts", "num_local_experts")
    quant = None
    qc = merged.get("quantization_config")
    if isinstance(qc, dict):
        quant = qc.get("quant_method") or qc.get("quant_algo")
    if quant is None and hf_quant:
        q = hf_quant.get("quantization", hf_quant)
        if isinstance(q, dict):
            quant = q.get("quant_algo") or q.get("quant_method")
    kv_algo = kv_cache_quant_algo(merged, hf_quant)
    wdt = weight_dtype(qc if isinstance(qc, dict) else None, hf_quant, merged.get("torch_dtype") or merged.get("dtype"))
    per_tok = merged.get("num_experts_per_tok")
    archs = merged.get("architectures") or []
    arch_text = " ".join(str(a) for a in archs) if isinstance(archs, list) else str(archs)
    is_dsa = "Dsa" in arch_text or "DeepseekV32" in arch_text or merged.get("index_topk") is not None
    is_mla = is_dsa or merged.get("kv_lora_rank") is not None or "Deepseek" in arch_text or "KimiK2" in arch_text
    return {
        "kv_cache_quant_algo": kv_algo,
        # SGLang with --kv-cache-dtype auto runs an FP8 KV cache when the checkpoint says FP8 (sglang-versions.md §3).
        "kv_dtype_from_checkpoint": "fp8_e4m3" if isinstance(kv_algo, str) and kv_algo.upper() == "FP8" else None,
        "is_mla": bool(is_mla),
        "is_dsa": bool(is_dsa),
        "moe_intermediate_size": merged.get("moe_intermediate_size"),
        "intermediate_size": merged.get("intermediate_size"),
        "n_shared_experts": merged.get("n_shared_experts"),
        "kv_lora_rank": merged.get("kv_lora_rank"),
        "architectures": merged.get("architectures"),
        "model_type": merged.get("model_type"),
        "num_experts": experts,
        "num_experts_per_tok": merged.get("num_experts_per_tok"),
        "is_moe": bool(experts),
        "hidden_size": merged.get("hidden_size"),
        "num_hidden_layers": merged.get("num_hidden_layers"),
        "num_attention_heads": merged.get("num_attention_heads"),
        "num_key_value_heads": merged.get("num_key_value_heads"),
        "max_position_embeddings": merged.get("max_position_embeddings"),
        "torch_dtype": merged.get("torch_dtype") or merged.get("dtype"),
        "quantization": quant,
        "weight_dtype": wdt,
        "weight_bytes_per_param": WEIGHT_BYTES.get(wdt) if wdt else None,
        # the rows each weight GEMM gets per running request: one expert sees experts_per_token / experts of them
        "gemm_rows_per_request": (per_tok / experts) if _number(experts) and _number(per_tok) and per_tok > 0 else (None if experts else 1.0),
        **_weights_gib(merged, hf_quant),
        **_latent_kv_bytes(merged, hf_quant),
    }


def _latent_kv_bytes(cfg: dict[str, Any], hf_quant: dict[str, Any] | None) -> dict[str, float | None]:
    """A latent-KV (MLA/DSA) model's KV bytes per token on each GPU, all layers, in an FP8 and a 16-bit cache: the same on
    every TP rank (replicated), so the KV pool per GPU is the server's KV tokens times it (engine/model_shape.py: FP8
    DSA is the 656-byte fp8_ds_mla row plus the indexer's 132-byte key; null for a model that is not MLA)."""
    if not cfg.get("kv_lora_rank") or not cfg.get("num_hidden_layers"):
        return {"latent_kv_bytes_per_token_fp8": None, "latent_kv_bytes_per_token_bf16": None}
    try:
        shape = shape_of(cfg, hf_quant)
        return {"latent_kv_bytes_per_token_fp8": shape.kv_bytes_per_token(1, 1), "latent_kv_bytes_per_token_bf16": shape.kv_bytes_per_token(2, 1)}
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return {"latent_kv_bytes_per_token_fp8": None, "latent_kv_bytes_per_token_bf16": None}


def _weights_gib(cfg: dict[str, Any], hf_quant: dict[str, Any] | None) -> dict[str, float | None]:
    """The weights as served, in GiB, split where parallelism splits them: the routed experts (sharded over EP or
    TP) and the rest (attention, dense and shared layers, embeddings): what a TP or DP step's weight-fit check reads."""
    if not cfg.get("hidden_size") or not cfg.get("num_hidden_layers"):
        return {"expert_weights_gib": None, "dense_weights_gib": None}
    try:
        shape = shape_of(cfg, hf_quant)
        experts = shape.expert_params() * shape.expert_bytes / GIB
        rest = (shape.other_params() + shape.attention_params()) * shape.other_bytes / GIB
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return {"expert_weights_gib": None, "dense_weights_gib": None}
    return {"expert_weights_gib": round(experts, 2), "dense_weights_gib": round(rest, 2)}


class ModelConfigValues(Values):
    """The served model's shape from its config.json (a multimodal model's `text_config` under the top level)."""

    model_path: str = value("the path looked up: the param, else the server's model_path", default=...)
    config_dir: str = value("the directory config.json was read from (a local path or a Hugging Face cache snapshot)",
                            default=...)
    architectures: list[str] | None = value("config.json `architectures`", default=...)
    model_type: str | None = value("config.json `model_type`", default=...)
    num_experts: int | None = value("routed experts: n_routed_experts | num_experts | num_local_experts (null: dense)",
                                    default=...)
    num_experts_per_tok: int | None = value("experts each token is routed to", default=...)
    is_moe: bool = value("a mixture of experts (num_experts is set and non-zero)", default=...)
    n_shared_experts: int | None = value("shared experts (DeepSeek-style MoE)", default=...)
    moe_intermediate_size: int | None = value("FFN width of one expert", default=...)
    intermediate_size: int | None = value("FFN width of the dense layers", default=...)
    hidden_size: int | None = value("hidden size", default=...)
    num_hidden_layers: int | None = value("decoder layers", default=...)
    num_attention_heads: int | None = value("attention heads", default=...)
    num_key_value_heads: int | None = value("KV heads (GQA)", default=...)
    max_position_embeddings: int | None = value("the model's longest context", unit="tokens", default=...)
    kv_lora_rank: int | None = value("latent KV rank (MLA models)", default=...)
    torch_dtype: str | None = value("checkpoint dtype: torch_dtype | dtype", default=...)
    quantization: str | None = value(
        "quantization_config.quant_method | quant_algo, else hf_quant_config.json's quant_algo | quant_method (null: none)",
        default=...)
    kv_cache_quant_algo: str | None = value("the checkpoint's KV-cache quantization, e.g. FP8 (modelopt, compressed-tensors)",
                                            default=...)
    kv_dtype_from_checkpoint: Literal["fp8_e4m3"] | None = value(
        "the KV dtype SGLang's `--kv-cache-dtype auto` takes from the checkpoint (null: the model dtype)", default=...)
    is_mla: bool = value("latent KV attention (DeepSeek, Kimi-K2, DSA): the KV cache is replicated on every TP rank",
                         default=...)
    is_dsa: bool = value("DeepSeek sparse attention (GLM-5, DeepSeek-V3.2)", default=...)
    weight_dtype: str | None = value(
        "what the weights are stored as: fp4 (NVFP4), mxfp4, fp8, int8, int4, bf16, fp16, fp32 (null: a scheme not recognised)", default=...)
    weight_bytes_per_param: float | None = value("bytes a weight takes in memory, block scales included (fp4: 0.5625)", unit="bytes", default=...)
    gemm_rows_per_request: float | None = value(
        "rows each weight GEMM gets per running request: experts_per_token / experts for a MoE's expert GEMMs, 1 for dense", default=...)
    expert_weights_gib: float | None = value(
        "the routed experts' weights as served (sharded over EP, else TP), from the shape and quantization: an estimate", unit="GiB")
    dense_weights_gib: float | None = value(
        "every other weight (attention, dense and shared layers, embeddings) as served: an estimate", unit="GiB")
    latent_kv_bytes_per_token_fp8: float | None = value(
        "a latent-KV (MLA/DSA) model's KV per token on each GPU in an FP8 cache, all layers (DSA: fp8_ds_mla's 656 B row plus "
        "the indexer's 132 B key per layer; null: not MLA): an estimate", unit="bytes")
    latent_kv_bytes_per_token_bf16: float | None = value(
        "the same in a 16-bit cache (null: not MLA): an estimate", unit="bytes")


class ModelConfig(Probe):
    """The model's config.json, read from a local path or the local Hugging Face cache.

    values: declared in `ModelConfigValues`; unavailable or failed evidence carries only model_path.
    """

    name = "model.config"
    Values = ModelConfigValues
    prefetch = True
    description = "Model architecture from config.json (experts, layers, quantization)"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        model_path: str | None = None  # default: the served model's path (/server_info, else /v1/models)

    async def run(self, ctx: "Context", params: "ModelConfig.Params") -> Evidence:
        path = params.model_path
        if not path:
            try:
                path = await served_model_path(ctx, 10)
            except ProbeError as e:
                return Evidence.unavailable(f"no model_path given and the server's was not readable: {e.reason}")
        d = find_config_dir(path)
        if d is None:
            return Evidence.unavailable(
                f"config.json for {path} is not on this host (not a local directory, not in the Hugging Face cache)",
                values={"model_path": path},
            )
        try:
            cfg = read_json_file(d / "config.json")
            hq_path = d / "hf_quant_config.json"
            hf_quant = read_json_file(hq_path) if hq_path.is_file() else None
        except (OSError, ValueError) as e:
            return Evidence.failed(f"cannot read {d / 'config.json'}: {e}", values={"model_path": path})
        if not isinstance(cfg, dict):
            return Evidence.failed(f"{d / 'config.json'} is not a JSON object", values={"model_path": path})
        values = {"model_path": path, "config_dir": str(d), **config_values(cfg, hf_quant if isinstance(hf_quant, dict) else None)}
        moe = f"MoE {values['num_experts']} experts, {values['num_experts_per_tok']} per token" if values["is_moe"] else "dense"
        summary = f"{values['model_type'] or '?'}: {values['num_hidden_layers']} layers, hidden {values['hidden_size']}, {moe}, quantization {values['quantization'] or 'none'}"
        rows = [[k, v] for k, v in values.items()]
        return Evidence(summary=summary, values=values, blocks=[Table(title="model config", columns=["field", "value"], rows=rows)])
