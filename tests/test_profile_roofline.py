"""Roofline and PCIe arithmetic against the seed box's worked figures (sglang-versions.md §11)."""

from __future__ import annotations

import pytest

from gpu_runbook.probes import roofline as rf
from gpu_runbook.probes.gpu_table import gpu_model, gpu_table


def test_gpu_table_rows_all_have_sources_and_match_nvml_names():
    table = gpu_table()
    for g in table.gpus:
        for fig in (g.dram_gbps, g.fp4_dense_tflops, g.fp8_dense_tflops, g.bf16_dense_tflops, g.max_w):
            assert fig.source.strip()
    names = {
        "NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtx-pro-6000-blackwell-server",
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "rtx-pro-6000-blackwell-workstation",
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": "rtx-pro-6000-blackwell-max-q",
        "NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA B200": "b200",
        "NVIDIA GeForce RTX 5090": "rtx-5090", "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
        # the PCIe/NVL cards are other rows (300 W / 600 W, 1,935 GB/s), not the SXM ones their names contain
        "NVIDIA A100 80GB PCIe": "a100-pcie-80gb", "NVIDIA H200 NVL": "h200-nvl",
    }  # fmt: skip
    for nvml_name, gid in names.items():
        assert gpu_model(nvml_name).id == gid
    assert gpu_model("Tesla T4") is None
    # the Server Edition's memory runs at 12,481 MHz: 1,597 GB/s, not the Workstation's 1,792
    assert gpu_model("NVIDIA RTX PRO 6000 Blackwell Server Edition").dram_gbps.value == 1597
    assert gpu_model("NVIDIA RTX PRO 6000 Blackwell Workstation Edition").dram_gbps.value == 1792
    assert gpu_model("NVIDIA A100 80GB PCIe").max_w.value == 300 and gpu_model("NVIDIA H200 NVL").max_w.value == 600
    assert gpu_model("NVIDIA GeForce RTX 5090").bf16_dense_tflops.value == 209.5  # FP32 accumulate, not FP16


def test_the_seed_box_allreduce_volume_and_pcie_ratio():
    # 1,935 tokens x 6,144 x 2 B = 23.8 MB per all-reduce; ring 2(N-1)/N at TP8; 156 all-reduces: ~6.5 GB.
    predicted = rf.allreduce_bytes_per_step(1935, 6144, 78, 8)
    assert predicted == pytest.approx(6.49e9, rel=0.01)
    out = rf.pcie_per_step(tx_bytes_window=predicted * 10, rx_bytes_window=predicted * 9, window_s=9.2, step_s=0.92,
                           tokens=1935, hidden=6144, layers=78, tp=8)  # fmt: skip
    assert out["decode_steps"] == pytest.approx(10.0)
    assert out["pcie_to_allreduce_ratio"] == pytest.approx(1.0, rel=0.01)  # ~1x: BF16 activations, as expected
    staged = rf.pcie_per_step(tx_bytes_window=predicted * 40, rx_bytes_window=None, window_s=9.2, decode_steps=10,
                              tokens=1935, hidden=6144, layers=78, tp=8)  # fmt: skip
    assert staged["pcie_to_allreduce_ratio"] == pytest.approx(4.0, rel=0.01)
    assert rf.allreduce_bytes_per_step(1935, 6144, 78, 1) == 0.0
    assert rf.pcie_per_step(tx_bytes_window=None, rx_bytes_window=None, window_s=None)["pcie_to_allreduce_ratio"] is None


def test_roofline_of_the_seed_box_and_of_a_step_at_the_roofline():
    gpu = gpu_model("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    seed = rf.roofline(gpu=gpu, step_s=0.92, weight_gb=56, kv_read_gb=23, flops_per_step=19e12, quantization="modelopt_fp4")
    assert seed["roofline_step_ms"] == pytest.approx(79 / 1597 * 1000, rel=1e-3)  # ~49 ms against 920 ms measured
    assert seed["bandwidth_share"] == pytest.approx(79 / 0.92 / 1597, rel=1e-2)
    assert seed["peak_format"] == "fp4" and seed["flops_share"] == pytest.approx(19e12 / 0.92 / 1e12 / 2015, rel=1e-2)
    fast = rf.roofline(gpu=gpu, step_s=0.05, weight_gb=56, kv_read_gb=23)
    assert fast["bandwidth_share"] > 0.85
    assert rf.roofline(gpu=None, step_s=0.05, weight_gb=56, kv_read_gb=None)["bandwidth_share"] is None


def test_server_figures_and_model_arithmetic():
    assert rf.weight_gb_per_gpu({"internal_states": [{"memory_usage": {"weight": 55.8}}]}) == 55.8
    assert rf.weight_gb_per_gpu({"internal_states": []}) is None
    assert rf.step_time_from_throughput(1935, 2095) == pytest.approx(0.924, rel=1e-3)
    mla = {"num_hidden_layers": 78, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert rf.kv_bytes_per_token(mla, 1.0, 8) == 576 * 78  # latent replicated under TP
    gqa = {"num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    assert rf.kv_bytes_per_token(gqa, 2.0, 8) == 2 * 1 * 128 * 2 * 2
    text = ('# TYPE sglang:estimated_flops_per_gpu_total counter\nsglang:estimated_flops_per_gpu_total{tp_rank="0"} 5e12\n'
            '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n')  # fmt: skip
    assert rf.mfu_counters(text) == {"sglang:estimated_flops_per_gpu_total": 5e12}


def test_decode_passes_count_only_decode_modes():
    text = ('# TYPE sglang:cuda_graph_passes counter\n'
            'sglang:cuda_graph_passes_total{mode="decode_cuda_graph"} 40\n'
            'sglang:cuda_graph_passes_total{mode="decode_none"} 2\n'
            'sglang:cuda_graph_passes_total{mode="prefill_none"} 7\n')  # fmt: skip
    assert rf.decode_passes(text) == 42
    assert rf.decode_passes("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n") is None


def test_kv_bytes_per_token_from_what_the_server_says_and_the_pcie_reading():
    info = {"internal_states": [{"memory_usage": {"weight": 56.0, "kvcache": 30.0, "token_capacity": 495488}}]}
    assert rf.kv_bytes_per_token_from_server(info) == pytest.approx(30e9 / 495488)
    assert rf.kv_bytes_per_token_from_server({"internal_states": [{}]}) is None
    assert "BF16" in rf.pcie_reading(1.1) and "include prefill" in rf.pcie_reading(3.0) and "not by itself" in rf.pcie_reading(3.0) and "NVLink" in rf.pcie_reading(0.1)
    assert rf.pcie_reading(None) is None


def test_a_small_batch_reads_only_the_experts_its_tokens_route_to():
    """Top-8 of 256 experts: one token reaches 8/256, 64 tokens ~87 %, a few hundred all of them; a dense model
    (no experts) reads every weight whatever the batch."""
    assert rf.experts_touched_share(256, 8, 1) == pytest.approx(8 / 256)
    assert rf.experts_touched_share(256, 8, 64) == pytest.approx(1 - (248 / 256) ** 64) and 0.86 < rf.experts_touched_share(256, 8, 64) < 0.88
    assert rf.experts_touched_share(256, 8, 1440) > 0.9999
    assert rf.experts_touched_share(0, 8, 64) == 1.0 and rf.experts_touched_share(256, 0, 64) == 1.0


def test_the_profile_roofline_counts_the_experts_routed_to():
    """The seeds' GLM-5 (75 MoE layers x 256 experts of 3 x 6,144 x 2,048 in NVFP4, top-8) at TP8 with 56 GB of
    weights a GPU: at 64 running ~13 % of the experts' bytes go unread; at 1,440 every expert is read."""
    from gpu_runbook.probes.sglang.profile import _roofline_values

    gpu = gpu_model("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    hf = {"n_routed_experts": 256, "num_experts_per_tok": 8, "hidden_size": 6144, "moe_intermediate_size": 2048,
          "num_hidden_layers": 78, "first_k_dense_replace": 3}  # fmt: skip
    info = {"internal_states": [{"memory_usage": {"weight": 56.0}, "quantization": "modelopt_fp4"}]}
    expert_gb = 75 * 256 * 3 * 6144 * 2048 * 0.5625 / 8 / 1e9

    def at(running: int) -> dict:
        metrics = f"sglang:num_running_reqs {running}\nsglang:num_used_tokens 0\n"
        s = {"step_ms": 130.0, "shares": {"moe_gemm": 0.5}}
        return _roofline_values(info, hf, gpu, s, None, (0.0, metrics), 8)

    small, large = at(64), at(1440)
    unread = expert_gb * (248 / 256) ** 64
    assert small["weight_gb"] == 56.0 and small["weight_read_gb"] == pytest.approx(56.0 - unread, abs=1e-3)
    assert small["bandwidth_share"] == pytest.approx((56.0 - unread) / 0.130 / 1597, rel=1e-2)
    assert small["moe_roofline_ms"] == pytest.approx(expert_gb * (1 - (248 / 256) ** 64) / 1597 * 1000, rel=1e-3)
    assert large["weight_read_gb"] == pytest.approx(56.0, abs=1e-3) and large["experts_touched_share"] > 0.9999
