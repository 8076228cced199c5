"""model.config: config.json from a local directory, the HF cache, or the server's model_path."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.probe import Context, Target
from gpu_runbook.sim.sglang_server import SimServer, SimServerConfig
from gpu_runbook.probes.model import ModelConfig

GLM = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "hidden_size": 6144, "num_hidden_layers": 78,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "num_attention_heads": 64, "num_key_value_heads": 64,
}  # fmt: skip


def ctx(url: str = "http://127.0.0.1:9") -> Context:
    return Context(target=Target(sglang_url=url), http=httpx.AsyncClient(), nvml=None)  # type: ignore[arg-type]


async def test_local_directory_with_modelopt_quant(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(GLM))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    ev = await ModelConfig().run(ctx(), ModelConfig.Params(model_path=str(tmp_path)))
    assert ev.ok, ev.reason
    v = ev.values
    assert v["num_experts"] == 256 and v["num_experts_per_tok"] == 8 and v["is_moe"] is True
    assert v["hidden_size"] == 6144 and v["num_hidden_layers"] == 78 and v["quantization"] == "NVFP4"


async def test_hf_cache_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-30B-A3B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    cfg = {"model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "hidden_size": 2048, "num_hidden_layers": 48,
           "quantization_config": {"quant_method": "fp8"}}  # fmt: skip
    (snap / "config.json").write_text(json.dumps(cfg))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    # model_path comes from the server when not given.
    async with SimServer(SimServerConfig(model_path="Qwen/Qwen3-30B-A3B")) as srv:
        ev = await ModelConfig().run(ctx(srv.url), ModelConfig.Params())
    assert ev.ok, ev.reason
    assert ev.values["num_experts"] == 128 and ev.values["quantization"] == "fp8" and ev.values["model_path"] == "Qwen/Qwen3-30B-A3B"


async def test_not_on_this_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "none"))
    ev = await ModelConfig().run(ctx(), ModelConfig.Params(model_path="org/absent-model"))
    assert ev.status is ProbeStatus.unavailable and "not on this host" in (ev.reason or "")
    ev = await ModelConfig().run(ctx(), ModelConfig.Params())  # nothing listens on port 9
    assert ev.status is ProbeStatus.unavailable and "model_path" in (ev.reason or "")


async def test_dense_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 5120, "num_hidden_layers": 64}))
    ev = await ModelConfig().run(ctx(), ModelConfig.Params(model_path=str(tmp_path)))
    assert ev.ok and ev.values["is_moe"] is False and ev.values["num_experts"] is None and ev.values["quantization"] is None
