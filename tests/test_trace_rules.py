"""Bucket rules: the shipped file classifies the kernels SGLang really launches; bad files fail at FILE:LINE:COL."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_runbook.loader import LoadError
from gpu_runbook.trace.analysis import analyze_rank
from gpu_runbook.trace.rules import classifier, load_rules, SHIPPED
from tests.trace_helpers import kernel, write_trace


@pytest.mark.parametrize(
    ("name", "bucket", "backend"),
    [
        ("_fwd_grouped_kernel_stage1", "attention", "triton-attention"),
        ("_fwd_kernel_stage2", "attention", "triton-attention"),
        ("_fwd_kernel_0d1d2d3d4d5c6de", "attention", "triton-attention"),  # older Triton's suffix
        ("_fwd_kernel_unified", "attention", "triton-attention"),
        ("nvjet_sm90_tst_128x8_64x12_4x1_v_bz_TNT", "dense_gemm", "cublas"),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", "dense_gemm", "cublas"),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication", "nccl"),
        ("void sglang::cross_device_reduce_2stage<__nv_bfloat16, 8>(...)", "communication", "custom-allreduce"),
        ("void vllm::cross_device_reduce_1stage<float, 2>(...)", "communication", "custom-allreduce"),
        ("moefinalize_allreduce_fusion_kernel_oneshot_lamport", "communication", "flashinfer-allreduce"),
        ("fused_moe_kernel", "moe_gemm", "triton-moe"),
        ("expandInputRowsKernel", "moe_gemm", "flashinfer-cutlass-moe"),
        ("doActivationKernel", "moe_gemm", "flashinfer-cutlass-moe"),
        ("apply_shuffle_mul_sum_kernel", "moe_gemm", "sgl-kernel-moe"),
        ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<x>>>", "moe_gemm", "cutlass-grouped-gemm"),
        ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<x>>>", "attention", "flashattention"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", "dense_gemm", "cutlass"),
        ("BatchDecodeWithPagedKVCacheKernel", "attention", "flashinfer-attention"),
        ("cvt_fp16_to_fp4", "quantization", None),
        ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)", "norm_act_rope", None),
        ("TopKTopPSamplingFromProbKernel", "other", "flashinfer-sampling"),
    ],
)
def test_shipped_rules_classify_real_kernel_names(name, bucket, backend):
    m = classifier().classify(name)
    assert (m.bucket, m.backend, m.classified) == (bucket, backend, True)


def test_memcpy_by_category_and_unknown_names_are_unclassified():
    c = classifier()
    assert c.classify("Memcpy DtoD (Device -> Device)", "gpu_memcpy").bucket == "memcpy"
    m = c.classify("my_mystery_kernel")
    assert (m.bucket, m.classified) == ("other", False)


def test_shipped_file_loads_with_positions():
    rules = load_rules(SHIPPED)
    assert rules and all(r.where.startswith(str(SHIPPED) + ":") for r in rules)


@pytest.mark.parametrize(
    ("text", "line", "col", "needle"),
    [
        ("version: 1\nrules:\n  - bucket: attn\n    exact: [x]\n", 3, 13, "bucket"),
        ("version: 1\nrules:\n  - bucket: attention\n    regex: ['ok', '(unclosed']\n", 4, 19, "not a valid regular expression"),
        ("version: 1\nrules:\n  - bucket: attention\n    exakt: [x]\n", 4, 5, "unknown key 'exakt'"),
        ("version: 1\nrules:\n  - bucket: attention\n", 3, 5, "at least one of"),
    ],
)
def test_a_bad_rules_file_is_rejected_at_file_line_col(tmp_path, text, line, col, needle):
    p = tmp_path / "mine.yaml"
    p.write_text(text)
    with pytest.raises(LoadError) as err:
        load_rules(p)
    msg = str(err.value.errors[0])
    assert msg.startswith(f"{p}:{line}:{col}:"), msg
    assert needle in msg


def test_a_users_rule_comes_first_and_changes_the_breakdown(tmp_path: Path):
    trace = write_trace(tmp_path / "x-TP-0.trace.json.gz", [
        kernel("my_dsa_sparse_kernel", 0.0, 60.0), kernel("fused_moe_kernel", 60.0, 40.0),
    ])  # fmt: skip
    before = analyze_rank(trace, classifier()).summary()
    assert before["unclassified_share"] == pytest.approx(0.6)
    assert before["shares"]["attention"] == 0.0
    mine = tmp_path / "rules.yaml"
    mine.write_text("rules:\n  - bucket: attention\n    backend: dsa\n    prefix: [my_dsa_]\n")
    after = analyze_rank(trace, classifier([mine])).summary()
    assert after["unclassified_share"] == 0.0
    assert after["shares"]["attention"] == pytest.approx(0.6)
    assert "dsa" in after["backends"]
