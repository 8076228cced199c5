"""model.config: config.json from a local directory, the HF cache, or the server's model_path."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.probe import Context
from gpu_runbook.target import Target
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


@pytest.mark.parametrize("qc, hf_quant, torch_dtype, expected", [
    (None, {"quantization": {"quant_algo": "NVFP4"}}, "bfloat16", "fp4"),  # modelopt NVFP4 (GLM-5-NVFP4: hf_quant_config.json)
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, None, "bfloat16", "fp8"),
    ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, None, "bfloat16", "fp8"),  # DeepSeek/Qwen FP8
    ({"quant_method": "mxfp4"}, None, "bfloat16", "mxfp4"),  # gpt-oss
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, None, "float16", "int4"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}, None, "bfloat16", "fp8"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}}, None, "bfloat16", "int4"),
    ({"quant_method": "some-new-scheme"}, None, "bfloat16", None),  # not recognised: its bytes are not guessed
    (None, None, "bfloat16", "bf16"),
    (None, None, None, None),
])  # fmt: skip
def test_the_weights_dtype_and_bytes_come_from_the_checkpoints_quantization(qc, hf_quant, torch_dtype, expected):
    from gpu_runbook.probes.model import config_values  # noqa: PLC0415

    cfg = {**GLM, "torch_dtype": torch_dtype, **({"quantization_config": qc} if qc else {})}
    v = config_values(cfg, hf_quant)
    assert v["weight_dtype"] == expected
    assert v["weight_bytes_per_param"] == {"fp4": 0.5625, "fp8": 1.0, "mxfp4": 0.53125, "int4": 0.53125, "bf16": 2.0, None: None}[expected]
    assert v["gemm_rows_per_request"] == 8 / 256  # 8 of 256 experts a token: each expert's GEMM sees 1/32 of the batch
    assert config_values({k: v for k, v in cfg.items() if k != "n_routed_experts"}, hf_quant)["gemm_rows_per_request"] == 1.0



def test_an_odd_expert_count_is_no_row_count_and_no_error():
    from gpu_runbook.probes.model import config_values  # noqa: PLC0415

    for odd in ("256", [256], True):
        assert config_values({**GLM, "n_routed_experts": odd}, None)["gemm_rows_per_request"] is None
