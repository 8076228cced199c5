"""The simulated `/server_info` against real releases: fixture key sets, version families, resolved values, running cap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpu_runbook.loader import LoadError
from gpu_runbook.sim.host import SimulatedHost
from gpu_runbook.sim.scenario import load_scenario
from gpu_runbook.sim.sglang_info import effective_running_cap, is_refactored
from gpu_runbook.sim.sglang_server import SimServer, SimServerConfig

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "sglang"
GLM5 = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "hidden_size": 6144, "num_hidden_layers": 78,
    "num_attention_heads": 64, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048, "intermediate_size": 12288, "first_k_dense_replace": 3, "vocab_size": 154880,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_topk": 2048, "quantization_config": {"quant_algo": "NVFP4"},
}  # fmt: skip
FAST = dict(step_base_ms=2.0, step_per_req_ms=0.01, prefill_ms_per_1k_tokens=0.0)


def fixture(name: str) -> Any:
    path = FIXTURES / name
    if not path.is_file():
        pytest.skip(f"shared fixture {path} not found (fixtures are not shipped with the package)")
    return json.loads(path.read_text())


def info(**kw: Any) -> dict[str, Any]:
    cfg = SimServerConfig(**{**FAST, **kw})
    with SimServer(cfg) as srv:
        path = "/server_info" if cfg.version != "0.5.5.post3" else "/get_server_info"
        return httpx.get(srv.url + path, timeout=10).json()


def glm5(version: str, **args: Any) -> dict[str, Any]:
    return info(version=version, model_path="zai-org/GLM-5-NVFP4", model_type="glm_moe_dsa", architectures=["GlmMoeDsaForCausalLM"],
                hf_config=GLM5, context_len=202752, max_total_num_tokens=495488, max_running_requests=2048,
                server_args={"tp_size": 8, "quantization": "modelopt_fp4", "disable_cuda_graph": True, **args})  # fmt: skip


def test_0_5_5_post3_keys_equal_the_real_response() -> None:
    real = fixture("server_info_0.5.5.post3.json")
    sim = info(version="0.5.5.post3", server_args={"tp_size": 2})
    assert list(sim) == list(real)  # same keys, same order (dataclasses.asdict + scheduler info)
    assert set(sim["internal_states"][0]) == set(real["internal_states"][0])
    assert set(sim["internal_states"][0]["memory_usage"]) == set(real["internal_states"][0]["memory_usage"])
    assert sim["cuda_graph_bs"] == real["cuda_graph_bs"] and sim["chunked_prefill_size"] == real["chunked_prefill_size"]
    assert sim["max_running_requests"] == 1024 and "effective_max_running_requests_per_dp" not in sim["internal_states"][0]


def test_layout_boundaries_follow_the_releases() -> None:
    assert not is_refactored("0.5.13") and is_refactored("0.5.22") and is_refactored("0.5.23")
    classic = glm5("0.5.13")
    assert "launch_command" not in classic and classic["kv_events"] is None and "cuda_graph_config" not in classic
    assert classic["attention_backend"] == "dsa" and classic["dsa_prefill_backend"] == "trtllm" and "nsa_prefill_backend" not in classic
    new = glm5("0.5.23")
    for key in ("launch_command", "kv_events", "startup_time", "frontend", "attn_dp_size", "flashinfer_allreduce_fusion_backend"):
        assert key in new, key
    assert new["enable_flashinfer_allreduce_fusion"] is False
    assert new["cuda_graph_max_bs_decode"] is None  # null unless passed
    assert new["cuda_graph_config"]["decode"]["backend"] == "disabled" and new["cuda_graph_config"]["decode"]["max_bs"] == 512
    assert set(new["cuda_graph_config"]) == {"decode", "prefill"}
    state = new["internal_states"][0]
    assert state["world_size"] == 8 and state["effective_max_running_requests_per_dp"] == 2048
    assert isinstance(state["memory_usage"]["graph"], dict) and "startup_available" in state["memory_usage"]


def test_a_fused_allreduce_flag_on_0_5_23_resolves_to_a_backend() -> None:
    body = info(version="0.5.23", server_args={"enable_flashinfer_allreduce_fusion": True, "cuda_graph_max_bs": 128})
    assert body["enable_flashinfer_allreduce_fusion"] is False and body["flashinfer_allreduce_fusion_backend"] == "auto"
    assert body["cuda_graph_max_bs_decode"] == 128 and body["cuda_graph_config"]["decode"]["max_bs"] == 128


@pytest.mark.parametrize(
    ("version", "backend", "prefill", "decode"),
    [("0.5.9", "nsa", "flashmla_auto", "flashmla_kv"), ("0.5.10", "nsa", "trtllm", "trtllm"), ("0.5.12", "nsa", "trtllm", "trtllm"),
     ("0.5.13", "dsa", "trtllm", "trtllm"), ("0.5.23", "dsa", "flashinfer_sparse_mla", "flashinfer_sparse_mla")],
)  # fmt: skip
def test_glm5_on_sm120_resolves_dsa_per_version(version: str, backend: str, prefill: str, decode: str) -> None:
    body = glm5(version)
    key = "dsa" if backend == "dsa" else "nsa"
    assert body["attention_backend"] == backend and body["page_size"] == 64 and body["kv_cache_dtype"] == "fp8_e4m3"
    assert (body[f"{key}_prefill_backend"], body[f"{key}_decode_backend"]) == (prefill, decode)


def test_memory_usage_follows_the_model_and_layout() -> None:
    glm = glm5("0.5.10")["internal_states"][0]["memory_usage"]
    assert 45 <= glm["weight"] <= 60  # ~56 GB per GPU for GLM-5-NVFP4 at TP8 (reference §11.2)
    assert 25 <= glm["kvcache"] <= 32 and glm["token_capacity"] == 495488  # ~61 KB/token FP8 DSA
    assert glm["graph"] == 0  # graphs off
    qwen = info(version="0.5.10", server_args={"tp_size": 2})["internal_states"][0]["memory_usage"]
    assert qwen["weight"] != glm["weight"] and 28 <= qwen["weight"] <= 34


def test_fp8_kv_from_the_checkpoint_keeps_auto_in_the_args_but_halves_the_pool() -> None:
    cfg = {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
           "intermediate_size": 25600, "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}  # fmt: skip
    quant = {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    bf16 = info(version="0.5.9", server_args={"tp_size": 2}, hf_config=dict(cfg, quantization_config={}))
    fp8 = info(version="0.5.9", server_args={"tp_size": 2}, hf_config=cfg, hf_quant_config=quant)
    assert fp8["kv_cache_dtype"] == "auto" and fp8["internal_states"][0]["kv_cache_dtype"] == "auto"
    assert fp8["internal_states"][0]["memory_usage"]["kvcache"] == pytest.approx(bf16["internal_states"][0]["memory_usage"]["kvcache"] / 2, rel=0.01)


def test_effective_cap_is_reported_from_0_5_8_and_enforced_as_the_scheduler_does() -> None:
    assert effective_running_cap(None, max_total_num_tokens=495488, context_len=202752) == 2048  # req pool floor
    assert effective_running_cap(None, max_total_num_tokens=3000, context_len=40960) == 1500  # tokens // 2
    assert effective_running_cap(1024, max_total_num_tokens=389120, context_len=40960, dp_size=8) == 128
    unset_old = info(version="0.5.7", report_max_running_requests=False)
    assert unset_old["max_running_requests"] is None and "effective_max_running_requests_per_dp" not in unset_old["internal_states"][0]
    unset = info(version="0.5.8", report_max_running_requests=False, max_total_num_tokens=3000)
    assert unset["max_running_requests"] is None and unset["internal_states"][0]["effective_max_running_requests_per_dp"] == 1500


def test_dp_attention_gives_one_internal_state_per_rank_and_splits_the_cap() -> None:
    body = info(version="0.5.10", max_running_requests=1024, server_args={"tp_size": 8, "enable_dp_attention": True, "dp_size": 4})
    assert len(body["internal_states"]) == 4
    assert {s["effective_max_running_requests_per_dp"] for s in body["internal_states"]} == {256}
    new = info(version="0.5.23", max_running_requests=1024, server_args={"tp_size": 8, "attn_dp_size": 4})
    assert len(new["internal_states"]) == 4 and new["attn_dp_size"] == 4 and new["enable_dp_attention"] is True


GLM5_OLD = """
name: glm5-old
title: GLM-5 on a release that predates it
gpu:
  model: NVIDIA RTX PRO 6000 Blackwell Server Edition
  count: 8
  compute_capability: "12.0"
  architecture: blackwell
  memory_mib: 97887
  power: { limit_max_w: 600, limit_min_w: 300, idle_w: 85, loaded_w: 236 }
  clocks: { max_sm_mhz: 2430, max_mem_mhz: 12481, loaded_sm_mhz: 2400 }
server:
  version: VERSION
  model_path: zai-org/GLM-5-NVFP4
  architectures: [GlmMoeDsaForCausalLM]
"""


def test_a_version_that_cannot_serve_the_model_is_an_error_at_its_position(tmp_path: Path) -> None:
    f = tmp_path / "glm5-old.yaml"
    f.write_text(GLM5_OLD.replace("VERSION", "0.5.5.post3"))
    with pytest.raises(LoadError) as err:
        load_scenario(f)
    (line,) = [str(e) for e in err.value.errors]
    assert line.startswith(f"{f}:13:12: server.version:") and "GlmMoeDsaForCausalLM" in line and "0.5.9" in line
    f.write_text(GLM5_OLD.replace("VERSION", "0.0.0.dev0"))  # a dev build says nothing about its features
    assert load_scenario(f).server.version == "0.0.0.dev0"
    f.write_text(GLM5_OLD.replace("VERSION", '"0.5.9"'))
    assert load_scenario(f).server.version == "0.5.9"


def test_the_seed_box_reports_what_a_real_0_5_10_reports() -> None:
    with SimulatedHost.start("seed-rtx-pro-6000-tp8") as host:
        body = httpx.get(host.url + "/server_info", timeout=10).json()
    assert body["version"] == "0.5.10" and body["attention_backend"] == "nsa" and body["page_size"] == 64
    assert body["kv_cache_dtype"] == "fp8_e4m3" and body["moe_runner_backend"] == "flashinfer_cutlass"
    assert body["max_running_requests"] == 2048 and body["num_continuous_decode_steps"] == 8
    assert body["disable_cuda_graph"] is True and body["disable_radix_cache"] is True and body["max_total_num_tokens"] == 495488
    assert body["internal_states"][0]["effective_max_running_requests_per_dp"] == 2048


def test_releases_0_5_14_to_0_5_21_render_their_own_layouts():
    """sglang-versions.md "Corrections": per-phase graph flags from 0.5.14, the resolved layout with world_size and
    env_vars from 0.5.19, flashinfer_sparse_mla DSA backends for GLM FP8 KV on SM12x from 0.5.17."""
    b14 = info(version="0.5.14", server_args={"tp_size": 2, "disable_cuda_graph": True})
    assert "cuda_graph_max_bs_decode" in b14 and b14["disable_decode_cuda_graph"] is True
    assert "world_size" not in b14["internal_states"][0] and "cuda_graph_config" not in b14  # still the classic layout
    b13 = info(version="0.5.13", server_args={"tp_size": 2})
    assert "cuda_graph_max_bs_decode" not in b13 and "disable_decode_cuda_graph" not in b13
    b19 = info(version="0.5.19", server_args={"tp_size": 2}, env={"SGLANG_EXPOSE_OWN_ENV_VARS": "1", "SGLANG_X": "y"})
    st = b19["internal_states"][0]
    assert st["world_size"] == 2 and st["env_vars"] == {"SGLANG_EXPOSE_OWN_ENV_VARS": "1", "SGLANG_X": "y"}
    assert "cuda_graph_config" in b19
    b18 = info(version="0.5.18", server_args={"tp_size": 2})
    assert "world_size" not in b18["internal_states"][0]


def test_dsa_backends_on_sm120_follow_the_release():
    from gpu_runbook.sim.sglang_info import _dsa_backends

    assert _dsa_backends("0.5.16", 12, True) == ("trtllm", "trtllm")
    assert _dsa_backends("0.5.17", 12, True) == ("flashinfer_sparse_mla", "flashinfer_sparse_mla")
    assert _dsa_backends("0.5.17", 10, True) == ("trtllm", "trtllm")


def test_moe_ep_rank_label_from_0_5_7():
    from gpu_runbook.sim.sglang_metrics import render
    from gpu_runbook.sim.sim_state import SimState

    assert 'moe_ep_rank="0"' in render(SimState(), version="0.5.7", model_name="m", pid=1)
    assert 'moe_ep_rank="0"' not in render(SimState(), version="0.5.5.post3", model_name="m", pid=1)
