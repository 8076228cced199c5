"""The simulated server's `/start_profile` and `/stop_profile`, and a writer of Kineto-shaped traces.

Real SGLang (0.4.9+) answers `/start_profile` at once, profiles the next `num_steps` forward passes,
then each TP rank's scheduler writes `{prefix-}{profile_id}-TP-{r}[-DECODE].trace.json.gz` into
`output_dir` on the server's filesystem (shared/reference/profiling.md §1, §3). This module does
the same: it watches the simulated scheduler's steps (`SimState.last_step_at`, `step_time_s`,
`running`, `kv_used_tokens`) and writes one gzipped Chrome trace per rank whose kernels have the
names the scenario's backends really launch (§8) and durations that follow its physics
(`step_buckets`): the all-reduce over the scenario's interconnect, expert GEMMs by tokens per
expert, attention by KV bytes, launch gaps without CUDA graphs. The step's length stays the
simulator's; the physics decides how it divides. Step spans `step[DECODE bs=N]` appear from 0.5.11.

The simulated vLLM server's profiler lives here too (the section "vLLM" below): its routes only where the release's
profiler is on, each worker's trace named and annotated as the release writes it, mixed passes, full and
piecewise CUDA graphs, the sampler after the annotated span.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import re
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .sglang_info import version_tuple
from .sim_state import PassRecord
from .vllm_profiler_config import VLLM_CONTEXT_SINCE, VLLM_DETAILED_SINCE, VLLM_INSTANCE_NAME_SINCE, VLLM_NEW_CACHED_SINCE, VLLM_RANK_SUFFIX_SINCE, VLLM_SESSION_CONFLICT_SINCE, VLLM_START_BODY_SINCE, VLLM_VERSION_METADATA_SINCE, VLLM_WRAPPER_SINCE, VllmProfilerSetting, vllm_profiler_setting, vllm_release

if TYPE_CHECKING:
    from .scenario import Scenario

# The scenario of each running simulated host, by id(SimState): the HTTP engine only sees its config.
_SCENARIOS: dict[int, "Scenario"] = {}
_CONTAINER_ROOTS: dict[int, Path] = {}


def register_scenario(state: Any, scenario: "Scenario") -> None:
    _SCENARIOS[id(state)] = scenario


def unregister_scenario(state: Any) -> None:
    _SCENARIOS.pop(id(state), None)
    root = _CONTAINER_ROOTS.pop(id(state), None)
    if root is not None:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def container_root(state: Any) -> Path | None:
    """Where a 'containerised' simulated server's filesystem lives on this host (tests map it)."""
    return _CONTAINER_ROOTS.get(id(state))


# ---- physics --------------------------------------------------------------------------------

PEAK_GBPS = {"12": 1792.0, "9": 4000.0, "10": 8000.0, "8": 2039.0}  # by CC major, for a GPU the GPU table does not know


def _peak_gbps(scenario: "Scenario | None", cc: tuple[int, int]) -> float:
    """The GPU's DRAM peak from the one GPU table (probes/data/gpus.yaml, with sources): the RTX PRO 6000 Server
    Edition reads 1,597 GB/s, not its Workstation sibling's 1,792."""
    from gpu_runbook.probes.gpu_table import gpu_model  # noqa: PLC0415 - the table the roofline probe reads

    model = gpu_model(scenario.gpu.model) if scenario is not None else None
    if model is not None and model.dram_gbps.value:
        return float(model.dram_gbps.value)
    return PEAK_GBPS.get(str(cc[0]), 2000.0)


@dataclass
class Physics:
    """What the step's kernels are and how long each bucket takes, before scaling to the step time."""

    layers: int
    moe_layers: int
    hidden: int
    tp: int
    attention: str  # triton | fa3 | flashinfer
    moe: str | None  # None (dense) | triton | sgl-cutlass-fp4 | flashinfer-cutlass | trtllm-gen
    comm: str  # nccl | custom | none
    fp4: bool
    graphs: bool
    spans: bool
    sm: str
    peak_gbps: float
    allreduce_gbps: float
    allreduce_latency_us: float
    moe_efficiency: float
    attention_efficiency: float
    hf: dict[str, Any] = field(default_factory=dict)
    dsa_decode: str | None = None  # DSA (nsa/dsa) decode backend: the attention kernels and the MLA latent KV
    dsa_prefill: str | None = None  # DSA prefill backend: the EXTEND passes' attention kernel
    kv_bytes_per_elem: float = 2.0
    # GPU idle per decode pass (launch gaps), the scenario's throughput.eager_gap_ms / graph_gap_ms: the same figure
    # the fake GPUs' utilization reads, so the trace and NVML tell one story. None: 12 µs / 1.5 µs per kernel.
    pass_gap_ms: tuple[float, float] | None = None  # (eager, graph replay)
    graph_max_bs: int = 0  # decode batches above it run eagerly (0: every batch a graph may take)
    server: str = "sglang"  # whose kernels: "vllm" names vLLM's own custom all-reduce, norm and rotary ops (vllm_physics)


def physics(cfg: Any, args: dict[str, Any], scenario: "Scenario | None") -> Physics:
    hf = dict(scenario.hf_config) if scenario is not None else _read_config(cfg.model_path)
    v = version_tuple(cfg.version)
    tp = int(args.get("tp_size") or 1)
    cc = scenario.gpu.cc if scenario is not None else (9, 0)
    nvlink = bool(scenario and scenario.gpu.nvlink_links > 0 and scenario.gpu.nvlink_active)
    p2p_ok = scenario is None or scenario.gpu.p2p == "OK"
    layers = int(hf.get("num_hidden_layers") or 32)
    experts = hf.get("n_routed_experts") or hf.get("num_experts")
    dense_first = int(hf.get("first_k_dense_replace") or (3 if hf.get("n_routed_experts") else 0))
    quant = str(args.get("quantization") or (hf.get("quantization_config") or {}).get("quant_algo") or "").lower()
    fp4 = "fp4" in quant
    if not experts:
        moe = None
    elif fp4 and cc[0] == 12:
        # 0.5.13 picks flashinfer_cutlass on SM120 (sglang-versions.md §5); before, sgl-kernel's CUTLASS FP4 path.
        explicit = str(args.get("moe_runner_backend") or "auto")
        moe = "flashinfer-cutlass" if v >= (0, 5, 13) or explicit == "flashinfer_cutlass" else "sgl-cutlass-fp4"
    elif fp4 and cc[0] == 10:
        moe = "trtllm-gen"
    else:
        moe = "triton"
    if tp <= 1:
        comm = "none"
    elif args.get("disable_custom_all_reduce"):
        comm = "nccl"
    elif (nvlink and p2p_ok) or (tp == 2 and p2p_ok):
        comm = "custom"
    else:
        comm = "nccl"  # "not supported on more than two PCIe-only GPUs" / no P2P (sglang-versions.md §4.1)
    # Bus bandwidth and latency per all-reduce (estimates): NVLink custom AR; NCCL over NVLink; PCIe P2P;
    # no P2P (NCCL's SHM transport through host memory: the seeds' ~32 GB/s copies, written then read).
    if nvlink:
        bw, lat = (300.0, 8.0) if comm == "custom" else (200.0, 20.0)
    elif p2p_ok:
        bw, lat = (40.0, 10.0) if comm == "custom" else (20.0, 40.0)
    else:
        bw, lat = 10.0, 205.0  # 205 µs: a 12 KiB NCCL all-reduce on an 8x SM120 host (sglang-versions.md §4.3)
    attention = str(args.get("attention_backend") or ("fa3" if cc[0] == 9 else "flashinfer"))
    dsa_decode = str(args.get("dsa_decode_backend") or args.get("nsa_decode_backend") or "flashmla_kv") if attention in ("nsa", "dsa") else None
    # unset: 0.5.5's default (0.5.10 auto-detects; what it picks per GPU is not modelled)
    dsa_prefill = str(args.get("dsa_prefill_backend") or args.get("nsa_prefill_backend") or "flashmla_sparse") if attention in ("nsa", "dsa") else None
    if str(args.get("moe_runner_backend") or "") in ("deep_gemm", "cutlass", "triton") and experts and not fp4:
        moe = {"deep_gemm": "deep-gemm", "cutlass": "cutlass-fp8", "triton": "triton"}[str(args["moe_runner_backend"])]
    # all-reduce path: FlashInfer PCIe-IPC (0.5.21+, opt-in SGLANG_ENABLE_PCIE_IPC_ALLREDUCE, P2P, bf16, TP 2/4/8) on a
    # PCIe host; the JIT custom all-reduce V2 on full NVLink (0.5.13+; 0.5.12 unconditionally) (sglang-versions.md §4)
    env = dict(getattr(cfg, "env", {}) or {})
    if comm == "nccl" and not nvlink and p2p_ok and tp in (2, 4, 8) and v >= (0, 5, 21) and env.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE") in ("1", "true", "True"):
        comm = "pcie-ipc"
    elif comm == "custom" and nvlink and v >= (0, 5, 12) and env.get("SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2", "1") not in ("0", "false", "False"):
        comm = "custom-v2"
    kv_dtype = str(args.get("kv_cache_dtype") or "auto")
    sm120_untuned = cc[0] == 12 and (moe == "sgl-cutlass-fp4" or v < (0, 5, 13))
    return Physics(
        layers=layers, moe_layers=max(0, layers - dense_first) if experts else 0, hidden=int(hf.get("hidden_size") or 4096),
        tp=tp, attention=attention, moe=moe, comm=comm, fp4=fp4, graphs=not args.get("disable_cuda_graph"),
        spans=v >= (0, 5, 11), sm=f"sm{cc[0]}{cc[1]}", peak_gbps=_peak_gbps(scenario, cc),
        allreduce_gbps=bw, allreduce_latency_us=lat,
        # Share of peak DRAM bandwidth the expert GEMMs reach: the seeds measured 0.8-55 TFLOPS of ~2 PFLOPS
        # for 16-64 tokens/expert with untuned SM120 tiles; tuned grouped GEMMs stream weights near peak.
        moe_efficiency=0.12 if sm120_untuned else 0.55,
        attention_efficiency=0.35 if attention == "triton" else 0.7,
        hf=hf, dsa_decode=dsa_decode, dsa_prefill=dsa_prefill, kv_bytes_per_elem=1.0 if kv_dtype.startswith("fp8") else 2.0,
        pass_gap_ms=None if scenario is None else (scenario.server.throughput.eager_gap_ms, scenario.server.throughput.graph_gap_ms),
        graph_max_bs=int(args.get("cuda_graph_max_bs") or 0),
    )  # fmt: skip


def _read_config(model_path: str) -> dict[str, Any]:
    try:
        return json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def step_buckets(ph: Physics, batch: int, kv_tokens: float, mode: str = "DECODE", tokens: int | None = None,
                 max_seq: int = 0) -> list[tuple[str, float, int]]:
    """(kernel name, µs per pass, calls per pass) before scaling; names per backend (profiling.md §8).

    A decode pass computes one token per request; an EXTEND pass computes `tokens` prompt tokens (its
    GEMMs and all-reduces scale with them) and runs the backend's prefill attention kernel. `max_seq`,
    an extend pass's longest sequence, decides whether a DSA indexer computes its logits at all."""
    hf, h, tp, L = ph.hf, ph.hidden, ph.tp, ph.layers
    bw = ph.peak_gbps * 1e3  # bytes per µs
    extend = mode == "EXTEND"
    B = max(1, tokens if extend and tokens else batch)
    ks: list[tuple[str, float, int]] = []

    def add(name: str, us: float, calls: int) -> None:
        if calls > 0:
            ks.append((name, max(1.0, us) * calls, calls))

    # attention: KV read per layer
    heads = int(hf.get("num_attention_heads") or 32)
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    head_dim = h // heads
    kv_bytes = 2 * max(1.0, kv_heads / tp) * head_dim * 2 * kv_tokens  # per layer, BF16 KV
    att_us = kv_bytes / (bw * ph.attention_efficiency)
    mla = hf.get("kv_lora_rank")
    if mla:
        # MLA: one latent KV per token and layer (kv_lora_rank + rope dims), shared by all heads and not split by TP;
        # DSA reads only the top-k (index_topk) tokens per request, plus the indexer's key for every token
        latent = (int(mla) + int(hf.get("qk_rope_head_dim") or 64)) * ph.kv_bytes_per_elem
        topk = int(hf.get("index_topk") or 0)
        per_req = min(kv_tokens / max(1, batch), topk) if ph.dsa_decode and topk else kv_tokens / max(1, batch)
        read = latent * per_req * max(1, batch) + (132 * kv_tokens if ph.dsa_decode and extend else 0)
        att_us = read / (bw * ph.attention_efficiency)
    if mla and ph.dsa_decode:
        _dsa_indexer(ph, add, bw, extend, B, kv_tokens, max_seq)
        if ph.dsa_decode == "flashinfer_sparse_mla":
            # flashinfer 0.7.4 include/flashinfer/attention/sparse_mla_sm120/kernels/dsv32_fp8/decode.cuh:52, fp8_prefill/prefill_mg.cuh:891
            add("void flashinfer::sparse_mla_prefill_mg_dual_fulltile_kernel<...>(...)" if extend else "void flashinfer::sparse_mla_decode_dsv3_2_kernel<...>(...)", att_us * 0.85, L)
        elif extend and ph.dsa_prefill in ("flashmla_sparse", "flashmla_auto"):
            # FlashMLA's sparse prefill (deepseek-ai/FlashMLA csrc/sm90/prefill/sparse/fwd.cu `sparse_attn_fwd_kernel`),
            # what flashmla_sparse (0.5.5's --nsa-prefill-backend default) runs on a prompt's top-k tokens, and
            # flashmla_auto on a fresh prompt; flashmla_kv prefills with the decode kernel (below), as a trace shows it
            add("void sm90::sparse_attn_fwd_kernel<TmaParams<...> >(SparsePrefillParams, TmaParams<...>)", att_us * 0.85, L)
        else:
            # FlashMLA's split-KV MLA kernel (deepseek-ai/FlashMLA csrc/flash_fwd_mla_kernel.h, as vendored in
            # NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/flashMLA/flash_fwd_mla_kernel.h); the trtllm / fa3 /
            # tilelang DSA kernels' names are not verified against a trace, so the simulator does not invent them
            add("void flash::flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8, cutlass::float_e4m3_t, 512>, true, "
                "SharedStorageMLA<...> >(Flash_fwd_mla_params)", att_us * 0.85, L)  # noqa: E501
    elif mla and extend and ph.attention == "flashinfer" and (max_seq == 0 or max_seq <= B):
        # an EXTEND pass of fresh prompts (no prefix) runs FlashInfer's ragged prefill, not the MLA kernel: SGLang 0.5.10
        # flashinfer_mla_backend.py:321-340 (use_ragged unless --flashinfer-mla-disable-ragged or a prefix), :558-565
        add("void flashinfer::BatchPrefillWithRaggedKVCacheKernel<...>(...)", att_us, L)
    elif mla:
        # FlashInfer's MLA kernel (flashinfer include/flashinfer/attention/mla.cuh:976): decode, and an EXTEND pass
        # that continues a prefix (a chunked prompt's later chunks)
        add("void flashinfer::mla::BatchMLAPagedAttentionKernel<...>(...)", att_us, L)
    elif extend:
        # prefill attention is compute-bound: prompt tokens x their own context, not the whole pool's KV
        kv_bytes = 2 * max(1.0, kv_heads / tp) * head_dim * 2 * B
        att_us = kv_bytes / (bw * ph.attention_efficiency) + B * B * head_dim * max(1.0, heads / tp) * 4 / 2e9 / max(1, batch)
    if mla:
        pass
    elif extend and ph.attention == "triton":
        add("_fwd_kernel", att_us, L)  # srt/layers/attention/triton_ops/extend_attention.py (profiling.md §8)
    elif extend and ph.attention not in ("fa3",):
        add("void flashinfer::BatchPrefillWithRaggedKVCacheKernel<...>(...)", att_us, L)  # flashinfer include/flashinfer/attention/prefill.cuh
    elif ph.attention == "triton":
        add("_fwd_grouped_kernel_stage1", att_us * 0.85, L)
        add("_fwd_kernel_stage2", att_us * 0.15, L)
    elif ph.attention == "fa3":
        add("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, 128, cutlass::bfloat16_t, float, cutlass::arch::Sm90, false, false, false, true, true, false, true, false, false, true, true, false>, flash::CollectiveEpilogueFwd<cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cutlass::bfloat16_t, cutlass::arch::Sm90, 256, true, true, false, false>, flash::VarlenDynamicPersistentTileScheduler<128, 256, 128, false, true, true> > > >(flash::FlashAttnFwdSm90<...>::Params)", att_us * 0.9, L)  # noqa: E501
        add("void flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>, cute::C<128> >, 7, 256, 1, false, true, cutlass::bfloat16_t, float, cutlass::arch::Sm90>(flash::FlashAttnFwdCombine<...>::Params)", att_us * 0.1, L)  # noqa: E501
    else:
        add("void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u, 8u, 16u, 1u, 8u, flashinfer::DefaultAttention<false, false, false, false>, flashinfer::paged_kv_t<__nv_bfloat16, int>, __nv_bfloat16, __nv_bfloat16, int>(...)", att_us * 0.9, L)  # noqa: E501
        add("void flashinfer::MergeStatesKernel<8u, 16u, 2u, 4u, __nv_bfloat16, __nv_bfloat16>(...)", att_us * 0.1, L)
    # QKV / O projections (dense, BF16, TP-sharded)
    proj_bytes = 4 * h * h * 2 / tp
    add("nvjet_tst_128x64_64x6_2x1_v_bz_TNT", proj_bytes * 0.75 / (bw * 0.6), L)
    add("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", proj_bytes * 0.25 / (bw * 0.6), L)
    # MLP: experts or dense
    if ph.moe is not None:
        E = int(hf.get("n_routed_experts") or hf.get("num_experts"))
        k = int(hf.get("num_experts_per_tok") or 2)
        inter = int(hf.get("moe_intermediate_size") or hf.get("intermediate_size") or 4 * h)
        bpp = 0.5625 if ph.fp4 else 2.0
        touched = min(E, B * k)  # experts that get a token this step
        expert_bytes = touched * 3 * h * inter * bpp / tp
        moe_us = expert_bytes / (bw * ph.moe_efficiency)
        M = ph.moe_layers
        grouped = "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm120TmaWarpSpecializedBlockScaled<3, 2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> > >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, cute::tuple<cutlass::float_e2m1_t, cutlass::float_ue4m3_t>, ...> > >(...)"  # noqa: E501
        if ph.sm != "sm120":
            grouped = grouped.replace("Sm120", "Sm100").replace("sm120", "sm100")
        if ph.moe == "triton":
            add("fused_moe_kernel", moe_us * 0.9, 2 * M)
            add("moe_align_block_size_kernel", 6.0, M)
            add("count_and_sort_expert_tokens_kernel", 4.0, M)
            add("act_and_mul_kernel", moe_us * 0.05 / M if M else 0, M)
            add("_moe_sum_reduce_kernel", moe_us * 0.05 / M if M else 0, M)
        elif ph.moe == "sgl-cutlass-fp4":
            add(grouped, moe_us * 0.8 / 2, 2 * M)
            add("compute_problem_sizes", 3.0, M)
            add("compute_expert_offsets", 2.5, M)
            add("compute_expert_blockscale_offsets", 2.5, M)
            add("shuffleRowsKernel", moe_us * 0.04, M)
            add("apply_shuffle_mul_sum_kernel", moe_us * 0.16, M)  # "extremely time-consuming" (PR #19493)
        elif ph.moe == "flashinfer-cutlass":
            add(grouped, moe_us * 0.85 / 2, 2 * M)
            add("fusedBuildExpertMapsSortFirstTokenKernel", 4.0, M)  # FlashInfer CUTLASS MoE (profiling.md §8)
            add("expandInputRowsKernel", moe_us * 0.04, M)
            add("doActivationKernel", moe_us * 0.03, M)
            add("finalizeMoeRoutingKernel", moe_us * 0.08, M)
        elif ph.moe == "deep-gemm":
            # DeepGEMM's JIT kernels are one template for dense and grouped GEMMs; the GemmType argument tells them
            # apart (deepseek-ai/DeepGEMM deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh, sm100_fp8_gemm_1d1d.cuh;
            # GemmType: Normal, MGroupedContiguous, MGroupedMasked)
            impl = "sm100_fp8_gemm_1d1d_impl" if ph.sm.startswith("sm10") else "sm90_fp8_gemm_1d2d_impl"
            add(f"void deep_gemm::{impl}<(cute::UMMA::Major)0, (cute::UMMA::Major)0, 0u, 4096u, 7168u, 128u, 192u, 128u, "
                "(deep_gemm::GemmType)2, false, cutlass::bfloat16_t>(...)", moe_us * 0.9 / 2, 2 * M)  # noqa: E501
            add("void per_token_group_quant_8bit_kernel<__nv_bfloat16, __nv_fp8_e4m3>(...)", moe_us * 0.1 / M if M else 0, M)
        elif ph.moe == "cutlass-fp8":
            # sgl-kernel's FP8 blockwise grouped GEMM and its prepare kernels (csrc/moe/prepare_moe_input.cu)
            add(grouped.replace("float_e2m1_t", "float_e4m3_t").replace("float_ue4m3_t", "float"), moe_us * 0.85 / 2, 2 * M)
            add("compute_problem_sizes", 3.0, M)
            add("compute_expert_offsets", 2.5, M)
            add("shuffleRowsKernel", moe_us * 0.05, M)
            add("apply_shuffle_mul_sum_kernel", moe_us * 0.1, M)
        else:
            add("Bmm_Bfloat16_E2m1E2m1_Fp32_t128x16x256_s6_et128x16_m256x16x64_cga1x1x1_16dp256b_TN_transOut_schedS_sm100f", moe_us * 0.9 / 2, 2 * M)  # noqa: E501
            add("routingIndicesClusterKernel", 5.0, M)
            add("void moe::dev::finalize::finalizeKernel<...>(moe::dev::finalize::KernelParams)", moe_us * 0.1, M)  # flashinfer trtllm_fused_moe_dev_kernel.cu:678
        if ph.fp4:
            add("cvt_fp16_to_fp4", B * h / (bw * 0.5) + 2.0, 2 * M)
        dense_layers = L - M
        dense_inter = int(hf.get("intermediate_size") or 4 * h)
    else:
        dense_layers, dense_inter = L, int(hf.get("intermediate_size") or 4 * h)
    if dense_layers:
        mlp_bytes = 3 * h * dense_inter * 2 / tp
        add("nvjet_tst_256x128_64x4_2x1_v_bz_TNT", mlp_bytes * (2 / 3) / (bw * 0.6), dense_layers)
        add("nvjet_tst_128x128_64x5_2x1_v_bz_TNN", mlp_bytes * (1 / 3) / (bw * 0.6), dense_layers)
        add("void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>(...)", B * dense_inter * 6 / tp / bw + 2.0, dense_layers)
    # norms and rope
    if ph.server == "vllm" and ph.graphs:
        # compiled (the default): vLLM's custom ops are off under Inductor (custom_ops "none": vllm==0.34.0:vllm/config/
        # vllm.py:1771-1776; vllm==0.8.5:vllm/config.py:3891-3892), so RMSNorm and rotary are Inductor kernels of the
        # families traces.md §0 documents (triton_red_fused_* / triton_poi_fused_*); the fused op list in a real name
        # depends on the graph
        add("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", B * h * 6 / bw + 2.0, 2 * L)
        add("triton_poi_fused_add_cat_mul_sub_1", B * h * 4 / tp / bw + 2.0, L)
    elif ph.server == "vllm":
        # enforce_eager (custom_ops "all"): vLLM's own ops, as vllm==0.34.0 vllm/_C_stable_libtorch.abi3.so names them
        add("std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8, false>"
            "(c10::BFloat16*, long, c10::BFloat16*, c10::BFloat16 const*, float, int, int, long)", B * h * 6 / bw + 2.0, 2 * L)  # noqa: E501
        add("void vllm::rotary_embedding_kernel<c10::BFloat16, c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*, "
            "c10::BFloat16 const*, int, long, long, long, int, int, int, long, bool)", B * h * 4 / tp / bw + 2.0, L)
    else:
        add("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)", B * h * 6 / bw + 2.0, 2 * L)
        add("void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<true, 128u, 8u, 16u, __nv_bfloat16, long>(...)", B * h * 4 / tp / bw + 2.0, L)
    add("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul> >(int, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul>)", 2.0, L)  # noqa: E501
    # all-reduce: 2 per layer, message = tokens x hidden x 2 B, ring factor 2(N-1)/N
    if ph.comm != "none":
        msg = B * h * 2
        ar_us = ph.allreduce_latency_us + 2 * (tp - 1) / tp * msg / (ph.allreduce_gbps * 1e3)
        if ph.comm == "custom-v2" and msg < 8 * 1024 * 1024:
            # the JIT custom all-reduce V2 (0.5.23 sglang/kernels/jit/csrc/distributed/custom_all_reduce.cuh:139, 218)
            shot = "1shot" if msg < 512 * 1024 else "2shot"
            add(f"void sglang::all_reduce_{shot}_push_kernel<__nv_bfloat16, {tp}u, false>(sglang::AllReducePushParams<{tp}u>)", ar_us, 2 * L)
        elif ph.comm == "pcie-ipc" and B <= 512:
            # FlashInfer's PCIe-IPC all-reduce within its decode-sized workspace, else NCCL (sglang-versions.md §4.3);
            # names: flashinfer 0.7.4 include/flashinfer/comm/pcie_ipc_all_reduce.cuh:861, 1197, 1341, 1974
            kern = ("push_oneshot_param_kernel" if msg <= 64 * 1024 else
                    {2: "ipc_tp2_remote_push_kernel", 8: "ipc_topo_rsag8_push_param_kernel"}.get(tp, "ipc_rsag_push_param_kernel"))
            add(f"void flashinfer::comm::pcie_ipc::{kern}<__nv_bfloat16, {tp}>(...)", ar_us * 0.3, 2 * L)
        elif ph.comm == "custom" and msg < 8 * 1024 * 1024 and ph.server == "vllm":
            # vLLM's custom all-reduce (vllm==0.34.0 vllm/_C_stable_libtorch.abi3.so: vllm::cross_device_reduce_{1,2}stage)
            stage = "1" if msg < 512 * 1024 else "2"
            add(f"void vllm::cross_device_reduce_{stage}stage<__nv_bfloat16, {tp}>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
                "__nv_bfloat16*, int, int)", ar_us, 2 * L)
        elif ph.comm == "custom" and msg < 8 * 1024 * 1024:
            add(f"void sglang::cross_device_reduce_{'1' if msg < 512 * 1024 else '2'}stage<__nv_bfloat16, {tp}>(sglang::RankData*, sglang::RankSignals, sglang::Signal*, __nv_bfloat16*, int, int)", ar_us, 2 * L)  # noqa: E501
        else:
            add("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ar_us, 2 * L)
    # logits and sampling (once per step)
    vocab = int(hf.get("vocab_size") or 151936)
    add("nvjet_tst_192x8_64x3_1x2_h_bz_TNT", vocab * h * 2 / tp / (bw * 0.6), 1)
    add("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u, (cub::BlockScanAlgorithm)0, (cub::BlockReduceAlgorithm)2, 1u, true, float, int>(...)", 30.0, 1)  # noqa: E501
    add("Memcpy HtoD (Pinned -> Device)", 8.0, 2)
    return ks


def _dsa_indexer(ph: Physics, add: Callable[[str, float, int], None], bw: float, extend: bool, tokens: int, kv_tokens: float,
                 max_seq: int) -> None:
    """The DSA indexer's logits kernels (DeepGEMM), which tell a decode pass from a prefill pass by name.

    SGLang 0.5.10 `srt/layers/attention/nsa/nsa_indexer.py`: a decode pass scores every cached token with
    `deep_gemm.fp8_paged_mqa_logits` (:472), its schedule computed once per pass by
    `get_paged_mqa_logits_metadata` (`nsa_backend.py:624`); an EXTEND pass whose longest sequence exceeds
    `index_topk` runs `deep_gemm.fp8_mqa_logits` (:601), a shorter one only stores its keys
    (`_forward_cuda_k_only`, :1056). Kernel names: DeepGEMM `deep_gemm/include/deep_gemm/impls/
    sm{90,100}_fp8_{paged_,}mqa_logits.cuh` and `sm90_fp8_paged_mqa_logits.cuh:16`
    (`smxx_paged_mqa_logits_metadata`), as sglang-kernel 0.4.1 ships them. That DeepGEMM has no SM120
    kernels (its attention API dispatches arch 9 and 10, else "Unsupported architecture"), so a GLM-5 box
    on SM120 that serves at all runs a DeepGEMM with them: sgl-deep-gemm 0.2.3.post2 (0.5.23's pin) has
    `sm120_fp8_paged_mqa_logits` and `sm120_fp8_mqa_logits`, whose names are used there."""
    arch = {"sm90": "sm90", "sm120": "sm120", "sm121": "sm120"}.get(ph.sm, "sm100" if ph.sm.startswith("sm10") else "")
    if not arch:
        return  # DeepGEMM runs on SM90 and newer only
    heads = int(ph.hf.get("index_n_heads") or 64)  # DeepSeek-V3.2's 64 where the config does not say
    head_dim = int(ph.hf.get("index_head_dim") or 128)
    topk = int(ph.hf.get("index_topk") or 2048)
    if not extend:
        # reads each cached token's 132 B index key (128 x FP8 + an FP32 scale, sglang-versions.md §2)
        add(f"void deep_gemm::{arch}_fp8_paged_mqa_logits<...>(...)", 132 * kv_tokens / (bw * ph.attention_efficiency), ph.layers)
        add("void deep_gemm::smxx_paged_mqa_logits_metadata<...>(unsigned int, unsigned int const*, unsigned int*)", 3.0, 1)
    elif max_seq > topk:
        # every prompt token against its own context: tokens x ~max_seq/2 x heads x dim x 2 FLOPs at ~400 TFLOPS FP8
        flops = tokens * max_seq / 2 * heads * head_dim * 2
        add(f"void deep_gemm::{arch}_fp8_mqa_logits<...>(...)", flops / 4e8, ph.layers)


# ---- the trace writer -----------------------------------------------------------------------


SCHEDULER_GAP_US = 1000.0  # between decode steps: the scheduler picks the next batch (estimate, no overlap schedule)


StepRecord = PassRecord  # the old name: a decode pass unless `mode` says EXTEND


def _order(ks: list[tuple[str, float, int]], ph: Physics) -> list[tuple[str, float]]:
    """Per-call kernels in a plausible launch order: layer by layer, the per-layer kernels interleaved."""
    per_layer = [(n, us / c, c) for n, us, c in ks if c >= ph.layers - 3]
    once = [(n, us / c, c) for n, us, c in ks if c < ph.layers - 3]
    seq: list[tuple[str, float]] = []
    remaining = {n: c for n, _, c in per_layer}
    rounds = max((c for _, _, c in per_layer), default=0)
    for i in range(rounds):
        for n, us, c in per_layer:
            # spread the calls of a kernel that runs c times evenly over the rounds
            if remaining[n] > 0 and (i * c) // rounds != ((i + 1) * c) // rounds:
                seq.append((n, us))
                remaining[n] -= 1
    for n, us, c in once:
        seq.extend([(n, us)] * c)
    return seq


def write_traces(
    out_dir: Path, stem: str, suffix: str, steps: list[StepRecord], ph: Physics, seed: int = 0, cpu: bool = True, ranks: int | None = None,
) -> list[Path]:
    """One gzipped Kineto trace per TP rank, events in Kineto's key order ("ph", "cat" first).

    With the CPU activity each kernel has its `cudaLaunchKernel` and the step span its CPU-side
    `user_annotation`; GPU-only captures keep the kernels and the `gpu_user_annotation` span.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    # The base time puts the last modelled step's end at the real one, so mtime - end is the export time.
    modelled_us = sum(st.dur_s * 1e6 + SCHEDULER_GAP_US for st in steps) - SCHEDULER_GAP_US
    base_ns = int(steps[-1].t_end * 1e9 - modelled_us * 1e3) if steps else time.time_ns()
    for rank in range(ph.tp if ranks is None else min(ranks, ph.tp)):
        rng = random.Random(seed * 1000 + rank)
        path = out_dir / f"{stem}-TP-{rank}{suffix}.trace.json.gz"
        tmp = path.with_name(path.name + ".tmp")
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=1) as f:
            f.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {\n      "id": %d, "name": "simulated", "computeMajor": %s\n    }\n  ],\n'
                    % (rank, ph.sm[2:-1] or "0"))
            f.write('  "distributedInfo": {"backend": "nccl", "rank": %d, "world_size": %d},\n' % (rank, ph.tp))
            f.write('  "traceEvents": [\n')
            f.write('  {\n    "name": "process_name", "ph": "M", "ts": 0.000, "pid": %d, "tid": 0,\n    "args": {\n      "name": "GPU %d"\n    }\n  }' % (rank, rank))
            corr = 1
            cursor = 0.0
            for s in steps:
                # Steps back to back with a modelled scheduler gap, not the test machine's wall clock:
                # the trace follows the scenario, whatever else the CPU is doing.
                start_us = cursor
                cursor += s.dur_s * 1e6 + SCHEDULER_GAP_US
                mode = getattr(s, "mode", "DECODE")
                extend = mode in ("EXTEND", "MIXED")  # a MIXED pass runs the extend kernels over all its tokens
                ks = step_buckets(ph, s.batch, s.kv_tokens, mode="EXTEND" if extend else "DECODE", tokens=s.tokens or s.batch,
                                  max_seq=getattr(s, "max_seq", 0))
                # the span as model_runner._build_step_span_name writes it (0.5.11 model_runner.py:3469-3476)
                span = ("step[EXTEND bs=%d toks=%d]" % (s.batch, s.tokens)) if mode == "EXTEND" else ("step[%s bs=%d]" % (mode, s.batch))
                seq = _order(ks, ph)
                eager = not ph.graphs or extend or (ph.graph_max_bs > 0 and s.batch > ph.graph_max_bs)
                gap = 12.0 if eager else 1.5  # launch gap per kernel: Python launches vs a graph replay
                if ph.pass_gap_ms is not None and seq:
                    gap = ph.pass_gap_ms[0 if eager else 1] * 1000 / len(seq)
                total = sum(us for _, us in seq)
                step_us = s.dur_s * 1e6
                gaps = gap * len(seq)
                if gaps > 0.5 * step_us:
                    gap = 0.5 * step_us / max(1, len(seq))
                    gaps = gap * len(seq)
                scale = (step_us - gaps) / total if total > 0 else 0.0
                jitter = 1.0 + 0.02 * (rank - (ph.tp - 1) / 2) / max(1, ph.tp)  # ranks differ a little
                if ph.spans and cpu:
                    f.write(',\n  {\n    "ph": "X", "cat": "user_annotation", "name": "%s", "pid": 1, "tid": 1,\n'
                            '    "ts": %.3f, "dur": %.3f,\n    "args": {\n      "External id": %d\n    }\n  }' % (span, start_us, step_us, corr))
                if ph.spans:
                    f.write(',\n  {\n    "ph": "X", "cat": "gpu_user_annotation", "name": "%s", "pid": %d, "tid": 7,\n'
                            '    "ts": %.3f, "dur": %.3f,\n    "args": {\n      "External id": %d\n    }\n  }' % (span, rank, start_us, step_us, corr))
                t = start_us
                drawn = [(gap * (0.5 + rng.random()), us * scale * jitter * (0.97 + 0.06 * rng.random())) for _, us in seq]
                fit = min(1.0, step_us / max(1e-9, sum(g + d for g, d in drawn)))  # a pass never runs into the next one
                if not eager:
                    # A graph replay is one cudaGraphLaunch; every kernel it runs carries that launch's correlation
                    # (CUPTI; profiling.md "links" and "CUDA graphs").
                    corr += 1
                    if cpu:
                        f.write(',\n  {\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1,\n'
                                '    "ts": %.3f, "dur": 12.000,\n    "args": {\n      "correlation": %d\n    }\n  }' % (start_us, corr))
                for (name, _), (g, d) in zip(seq, drawn):
                    t += g * fit
                    d *= fit
                    cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
                    if eager:
                        corr += 1
                        if cpu:
                            f.write(',\n  {\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,\n'
                                    '    "ts": %.3f, "dur": 4.000,\n    "args": {\n      "correlation": %d\n    }\n  }' % (t - 5.0, corr))
                    f.write(',\n  {\n    "ph": "X", "cat": "%s", "name": %s, "pid": %d, "tid": 7,\n    "ts": %.3f, "dur": %.3f,\n'
                            '    "args": {\n      "External id": %d, "device": %d, "stream": 7, "correlation": %d\n    }\n  }'
                            % (cat, json.dumps(name), rank, t, d, corr, rank, corr))
                    t += d
            f.write('\n  ],\n  "traceName": "%s",\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": %d\n}\n' % (path.name, base_ns))
        os.replace(tmp, path)
        paths.append(path)
    return paths


# ---- HTTP -----------------------------------------------------------------------------------


class _Capture:
    """One armed /start_profile: which passes it records and what it writes, as the release's scheduler does.

    Without `profile_by_stage` the next `num_steps` forward passes of any mode go into one file per rank.
    With it (0.4.9+), the release's predicate (0.5.10 `scheduler_profiler_mixin._profile_batch_predicate`
    :340-362; 0.5.23 `profiler_manager.py:413-445`), applied before each pass runs:
    the first prefill pass starts an EXTEND capture, the (num_steps+1)-th prefill pass stops the capture
    in progress *as EXTEND*; the first decode pass flushes a running capture as EXTEND and starts the
    DECODE capture, the (num_steps+1)-th decode pass stops it as DECODE. So under steady admissions a
    prefill batch can end the decode capture and it is written `-EXTEND`, with no `-DECODE` file
    (sglang-versions.md "Corrections"). Prefill passes that run during the decode capture are in it.
    """

    def __init__(self, by_stage: bool, num_steps: int | None, v: tuple[int, ...]) -> None:
        self.by_stage, self.num_steps, self.v = by_stage, num_steps, v
        self.prefill_ct = self.decode_ct = 0
        self.passes: list[PassRecord] = []
        self.in_progress = not by_stage  # without by_stage the profiler starts at once
        self.finished: list[tuple[str, list[PassRecord]]] = []  # (stage suffix, passes) to write
        self.done = False

    def suffix(self, stage: str | None) -> str:
        if stage is None:
            return ""
        if self.v >= (0, 5, 5):
            return "-" + stage
        return "-1" if stage == "EXTEND" else "-2"  # IntEnum str() on Python >= 3.11 (profiling.md §3.1)

    def _stop(self, stage: str | None) -> None:
        if self.in_progress and self.passes:
            self.finished.append((self.suffix(stage), self.passes))
        self.passes, self.in_progress = [], False

    def on_pass(self, rec: PassRecord) -> None:
        if self.done:
            return
        if not self.by_stage:
            self.passes.append(rec)
            if self.num_steps and len(self.passes) >= self.num_steps:
                self._stop(None)
                self.done = True
            return
        target = self.num_steps or 0
        if rec.mode in ("EXTEND", "MIXED"):  # ForwardMode.is_prefill(): MIXED too (0.5.11 forward_batch_info.py:108-119)
            if self.prefill_ct == 0 and not self.in_progress:
                self.in_progress, self.stage = True, "EXTEND"
            self.prefill_ct += 1
            if target and self.prefill_ct > target and self.in_progress:
                self._stop("EXTEND")
        else:
            if self.decode_ct == 0:
                if self.in_progress:
                    self._stop("EXTEND")  # "force trace flush"
                self.in_progress, self.stage = True, "DECODE"
            self.decode_ct += 1
            if target and self.decode_ct > target and self.in_progress:
                self._stop("DECODE")
        if self.in_progress:
            self.passes.append(rec)
        if not self.in_progress and self.decode_ct > 0 and self.prefill_ct > 0:
            self.done = True

    def stop_now(self) -> None:
        self._stop(getattr(self, "stage", None) if self.by_stage else None)
        self.done = True


def server_path(state: Any, scenario: "Scenario | None", d: Path) -> Path:
    """Where the server's path `d` lies on this host: itself, or, for a server in a container, a directory this host
    does not tell the probe about (the container's "/")."""
    if scenario is None or not scenario.faults.profile_dir_hidden:
        return d
    root = _CONTAINER_ROOTS.get(id(state))
    if root is None:
        root = _CONTAINER_ROOTS[id(state)] = Path(tempfile.mkdtemp(prefix="runbook-sim-container-"))
    return root / str(d).lstrip("/")


class _Profiler:
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.active = False
        self.capture: _Capture | None = None
        self.writes: list[asyncio.Task[None]] = []
        self.last_error: str | None = None
        self.out: tuple[Path, str, bool, int] | None = None
        self.written: list[str] = []  # suffixes written by the last capture (tests read it)
        self.write_lock = asyncio.Lock()  # one export at a time: the EXTEND flush and an EXTEND stop share a file name

    @property
    def scenario(self) -> "Scenario | None":
        return _SCENARIOS.get(id(self.engine.state))

    def _dir(self, requested: str | None) -> Path:
        return server_path(self.engine.state, self.scenario, Path(requested or os.environ.get("SGLANG_TORCH_PROFILER_DIR") or tempfile.gettempdir()))

    async def start(self, request: web.Request) -> web.Response:
        try:
            body = await request.json() if request.can_read_body else {}
        except Exception:
            return web.json_response({"object": "error", "message": "invalid JSON body", "code": 400}, status=400)
        body = body if isinstance(body, dict) else {}
        if self.active:
            return web.Response(status=400, text="Profiling is already in progress. Call /stop_profile first.\n")
        v = version_tuple(self.engine.cfg.version)
        num_steps = body.get("num_steps")
        by_stage = bool(body.get("profile_by_stage")) and v >= (0, 4, 9)
        prefix = body.get("profile_prefix") if v >= (0, 5, 7) else None
        profile_id = str(body.get("profile_id") or time.time())
        out_dir = self._dir(body.get("output_dir"))
        activities = body.get("activities") or ["CPU", "GPU"]  # the tokenizer's default (profiling.md §1)
        stem = f"{prefix}-{profile_id}" if prefix else profile_id
        self.out = (out_dir, stem, "CPU" in activities, sum(map(ord, profile_id)))
        self.active = True
        self.written = []
        self.capture = _Capture(by_stage, int(num_steps) if num_steps else None, v)
        self.engine.state.pass_listeners.append(self._on_pass)
        return web.Response(text="Start profiling.\n")

    def _on_pass(self, rec: PassRecord) -> None:
        """Runs on the server's loop at the end of every pass: the capture decides, finished files are written."""
        cap = self.capture
        if cap is None:
            return
        cap.on_pass(rec)
        self._flush()
        if cap.done:
            self._end()

    def _flush(self) -> None:
        cap = self.capture
        if cap is None or self.out is None:
            return
        while cap.finished:
            suffix, passes = cap.finished.pop(0)
            self.written.append(suffix)
            self.writes.append(asyncio.get_running_loop().create_task(self._write(suffix, passes)))

    def _end(self) -> None:
        try:
            self.engine.state.pass_listeners.remove(self._on_pass)
        except ValueError:
            pass
        self.capture = None
        self.active = False

    async def _write(self, suffix: str, passes: list[PassRecord]) -> None:
        assert self.out is not None
        out_dir, stem, cpu, seed = self.out
        try:
            ph = physics(self.engine.cfg, self.engine.args, self.scenario)
            async with self.write_lock:
                await asyncio.to_thread(write_traces, out_dir, stem, suffix, passes, ph, seed, cpu)
        except Exception as exc:  # noqa: BLE001 - a failed export must not kill the server
            self.last_error = f"{type(exc).__name__}: {exc}"

    async def stop(self, request: web.Request) -> web.Response:
        if not self.active or self.capture is None:
            return web.Response(status=400, text="Profiling is not in progress. Call /start_profile first.\n")
        self.capture.stop_now()
        self._flush()
        self._end()
        # the tokenizer waits for the scheduler's reply, which comes after the export
        pending, self.writes = self.writes, []
        for t in pending:
            await asyncio.shield(t)
        return web.Response(text="Stop profiling. This will take some time.\n")


def add_profile_routes(app: web.Application, engine: Any) -> None:
    """Register /start_profile and /stop_profile (GET and POST, as SGLang routes them) on the sim's app."""
    prof = _Profiler(engine)
    for path, handler in (("/start_profile", prof.start), ("/stop_profile", prof.stop)):
        app.router.add_post(path, handler)
        app.router.add_get(path, handler)


# ---- vLLM: the profiler of the simulated vLLM server ------------------------------------------------------------
#
# What each release does, read in the released wheels (`vllm==V:path:line`; shared/reference/traces.md §1.1):
#
# * routes: `/start_profile` and `/stop_profile` (POST only) exist only where the profiler is on. Through 0.12 that is
#   the environment: `if envs.VLLM_TORCH_PROFILER_DIR:` (vllm==0.11.0:vllm/entrypoints/openai/api_server.py:1192-1208),
#   `if envs.VLLM_TORCH_PROFILER_DIR or envs.VLLM_TORCH_CUDA_PROFILE:` (vllm==0.12.0:…/api_server.py:1070-1083);
#   from 0.13 `ProfilerConfig.profiler is not None` (`--profiler-config`; vllm==0.13.0:
#   vllm/entrypoints/serve/profile/api_router.py:37-46, vllm==0.34.0:…/api_router.py:59-68), which 0.13-0.15 still
#   fill from the deprecated variables (vllm==0.13.0:vllm/config/profiler.py:124-160, vllm==0.15.0:…:139-174; gone
#   in vllm==0.16.0:vllm/config/profiler.py). Both answer an empty 200. From 0.32 `/start_profile` takes an optional
#   JSON body {profile_prefix, delay_iterations, max_iterations} (vllm==0.32.0:…/api_router.py:18-28; 0.34 adds
#   profiler_kwargs, vllm==0.34.0:…/api_router.py:20-31); 0.34 answers 409 to a second start before a stop
#   (vllm==0.34.0:vllm/v1/engine/async_llm.py:1159-1160, vllm/exceptions.py:192-200).
# * the capture: the torch profiler starts at once and records every pass until /stop_profile, or until
#   max_iterations passes (VLLM_PROFILER_MAX_ITERS, vllm==0.12.0:vllm/profiler/gpu_profiler.py:24-31,81-109;
#   profiler_config.max_iterations from 0.13, vllm==0.13.0:vllm/profiler/wrapper.py:26-31,81-111); each worker then
#   writes its own trace with CPU and CUDA activities (vllm==0.11.0:vllm/v1/worker/gpu_worker.py:84-94) through
#   `torch.profiler.tensorboard_trace_handler(dir, worker_name, use_gzip)`: `{worker_name}.{time_ns}.pt.trace.json[.gz]`.
#   worker_name: `{hostname}_{pid}` (the handler's default) on 0.11.0; `{instance_id}-rank-{rank}` 0.11.1-0.16
#   (vllm==0.11.1:vllm/v1/worker/gpu_worker.py:93, instance_id = str(time.time_ns()) vllm==0.11.1:vllm/config/vllm.py:346;
#   vllm==0.16.0:…/gpu_worker.py:108); `[{profile_prefix}_]dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_rank{r}` from 0.17
#   (vllm==0.17.0:vllm/v1/worker/gpu_worker.py:767-773, vllm/distributed/utils.py:623-625). The API server's
#   AsyncLLM writes a CPU-only trace beside them, `{hostname}_{pid}.async_llm` (vllm==0.11.0:vllm/v1/engine/
#   async_llm.py:167; 0.34 prefixes the profile_prefix, vllm==0.34.0:…/async_llm.py:1181-1184), unless
#   ignore_frontend (0.13+). From 0.28 the trace carries `vllm_version` metadata (vllm==0.28.0:vllm/profiler/wrapper.py).
# * the annotation around each `execute_model` (`torch.profiler.record_function`: a CPU `user_annotation` and,
#   from Kineto, a `gpu_user_annotation` over the kernels it launched, traces.md §0): none on 0.11.0;
#   `execute_new_{N}_cached_{M}` 0.11.1-0.13 (vllm==0.11.1:vllm/v1/worker/gpu_worker.py:522-533,
#   vllm==0.13.0:…:553-566); `execute_context_{Nc}({Tc})_generation_{Ng}({Tg})` from 0.14 (vllm==0.14.0:
#   …/gpu_worker.py:548-572, counts vllm/v1/utils.py:447-466: a context request has no output token yet); with
#   `detailed_trace_annotation` from 0.26 `execute_{T}_context_{Nc}(sq..sk..sqsq..sqsk..)_generation_..`
#   (vllm==0.34.0:vllm/v1/worker/gpu_worker.py:1340-1422). The sampler runs in `sample_tokens`, a separate worker
#   call outside the annotation (vllm==0.11.1:…/gpu_worker.py:536; vllm==0.34.0:…:1442-1446).
# * CUDA graphs: FULL_AND_PIECEWISE by default (vllm==0.11.0:vllm/config/__init__.py:358-366; vllm==0.34.0:
#   vllm/config/vllm.py:339, -O2): a decode-only batch up to the largest capture size replays one full graph; a mixed
#   or prefill batch up to it replays piecewise graphs with attention launched eagerly between the pieces; a larger
#   batch runs eagerly (vllm==0.34.0:vllm/v1/worker/gpu/cudagraph_utils.py:558-601). enforce_eager: NONE
#   (vllm==0.34.0:vllm/config/vllm.py:1697-1699). Replayed kernels carry the graph launch's correlation and no
#   External id (traces.md §0 [OBS]).
#
# Not written: python_function events (with_stack is on by default, vllm==0.11.0:vllm/envs.py:95; vllm==0.34.0:
# vllm/config/profiler.py:116-119), cpu_op events, and the sampler's own kernels beyond one (FlashInfer's sampler,
# VLLM_USE_FLASHINFER_SAMPLER on by default: vllm==0.34.0:vllm/envs.py:937-941).


@dataclass
class VllmPass(PassRecord):
    """One engine step of the simulated vLLM server as its worker sees the SchedulerOutput."""

    new_reqs: int = 0  # scheduled_new_reqs: scheduled for the first time
    cached_reqs: int = 0  # scheduled_cached_reqs: running decodes, later chunks of a prompt, resumed requests
    ctx_reqs: int = 0  # context requests (no output token yet) and their scheduled tokens
    ctx_tokens: int = 0
    gen_reqs: int = 0  # generation requests and their scheduled tokens
    gen_tokens: int = 0
    ctx_sk: int = 0  # detailed annotation: sums of seq_len, query_len^2, query_len x seq_len per phase
    ctx_sqsq: int = 0
    ctx_sqsk: int = 0
    gen_sk: int = 0
    gen_sqsq: int = 0
    gen_sqsk: int = 0
    graph: str = "NONE"  # FULL, PIECEWISE or NONE: how the pass ran


def vllm_annotation(v: tuple[int, ...], p: VllmPass, detailed: bool = False) -> str | None:
    """The worker's record_function name for this pass on release `v` (None: the release annotates nothing)."""
    if v < VLLM_NEW_CACHED_SINCE:
        return None
    if v < VLLM_CONTEXT_SINCE:
        return f"execute_new_{p.new_reqs}_cached_{p.cached_reqs}"
    if detailed and v >= VLLM_DETAILED_SINCE:
        return (f"execute_{p.ctx_tokens + p.gen_tokens}_context_{p.ctx_reqs}(sq{p.ctx_tokens}sk{p.ctx_sk}sqsq{p.ctx_sqsq}sqsk{p.ctx_sqsk})"
                f"_generation_{p.gen_reqs}(sq{p.gen_tokens}sk{p.gen_sk}sqsq{p.gen_sqsq}sqsk{p.gen_sqsk})")
    return f"execute_context_{p.ctx_reqs}({p.ctx_tokens})_generation_{p.gen_reqs}({p.gen_tokens})"


def vllm_worker_names(v: tuple[int, ...], tp: int, prefix: str | None, instance_id: str, hostname: str, pid: int) -> list[str]:
    """Each TP rank's trace name (tensorboard_trace_handler's worker_name) on release `v` (DP 1, PP 1, DCP 1)."""
    if v < VLLM_INSTANCE_NAME_SINCE:
        return [f"{hostname}_{pid + 1 + r}" for r in range(tp)]  # each worker its own process
    if v < VLLM_RANK_SUFFIX_SINCE:
        return [f"{instance_id}-rank-{r}" for r in range(tp)]
    # the EP group spans DP x TP ranks: at DP 1 its rank is the TP rank
    return [f"{prefix + '_' if prefix else ''}dp0_pp0_tp{r}_dcp0_ep{r}_rank{r}" for r in range(tp)]


ATTENTION_KERNEL = re.compile(r"FlashAttn|flash::|Attention|attention|_mla|mla::|_fwd_kernel|_fwd_grouped|mqa_logits|sparse_attn|fmha")
SAMPLER_KERNEL = re.compile(r"Sampling")


def vllm_physics(cfg: Any, scenario: "Scenario | None", graph_max: int = 0) -> Physics:
    """The kernels a simulated vLLM server's passes run: the common physics with vLLM's custom all-reduce, norm and
    rotary ops (not SGLang's). vLLM's MoE backend choice is not modelled per release: the MoE kernels are those the
    common physics picks for the model and GPU (its tuned FP4 path on SM120)."""
    from types import SimpleNamespace  # noqa: PLC0415

    s = cfg.spec
    args = {"tp_size": s.tensor_parallel_size, "quantization": s.quantization or "", "kv_cache_dtype": s.cache_dtype,
            "disable_cuda_graph": s.enforce_eager, "disable_custom_all_reduce": s.disable_custom_all_reduce}  # fmt: skip
    # the common physics by SGLang release: one whose FP4 MoE on SM120 is tuned, no SGLang-only all-reduce path
    ph = physics(SimpleNamespace(version="0.5.13", model_path=cfg.model_root, env={"SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2": "0"}), args, scenario)
    ph.server = "vllm"
    ph.spans = False
    ph.graph_max_bs = graph_max
    return ph


def _vllm_kernels(ph: Physics, p: VllmPass) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(execute_model's kernels in launch order, sample_tokens' kernels) for one pass."""
    tokens = p.ctx_tokens + p.gen_tokens
    reqs = p.ctx_reqs + p.gen_reqs
    decode_only = p.ctx_reqs == 0 and tokens == reqs
    ks = step_buckets(ph, max(1, reqs), p.kv_tokens, mode="DECODE" if decode_only else "EXTEND", tokens=max(1, tokens),
                      max_seq=p.max_seq)  # fmt: skip
    seq = _order(ks, ph)
    return [k for k in seq if not SAMPLER_KERNEL.search(k[0])], [k for k in seq if SAMPLER_KERNEL.search(k[0])]


def _ev(ph_: str, cat: str, name: str, pid: int, tid: int, ts: float, dur: float, args: dict[str, Any]) -> str:
    body = ", ".join(f'"{k}": {json.dumps(v)}' for k, v in args.items())
    return (',\n  {\n    "ph": "%s", "cat": "%s", "name": %s, "pid": %d, "tid": %d,\n    "ts": %.3f, "dur": %.3f,\n    "args": {\n      %s\n    }\n  }'
            % (ph_, cat, json.dumps(name), pid, tid, ts, dur, body))


def write_vllm_traces(out_dir: Path, names: list[str], passes: list[VllmPass], ph: Physics, version: str | None, *, seed: int = 0,
                      use_gzip: bool = True, detailed: bool = False, worker_pid: int = 4000) -> list[Path]:
    """One Kineto trace per TP rank as a vLLM worker's torch profiler writes it: CPU and CUDA activities, the release's
    annotation around each execute_model (CPU `user_annotation`, GPU `gpu_user_annotation` over the kernels launched in
    it), the sampler's kernels after it, graph replays as the pass's CUDA-graph mode has them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    v = vllm_release(version)
    paths: list[Path] = []
    modelled_us = 100.0 + sum(p.dur_s * 1e6 + SCHEDULER_GAP_US for p in passes) - SCHEDULER_GAP_US
    base_ns = int(passes[-1].t_end * 1e9 - modelled_us * 1e3) if passes else time.time_ns()
    for rank, stem in enumerate(names):
        rng = random.Random(seed * 1000 + rank)
        pid, tid, stream = worker_pid + rank, worker_pid + rank, 7
        path = out_dir / f"{stem}.{time.time_ns()}.pt.trace.json{'.gz' if use_gzip else ''}"
        tmp = path.with_name(path.name + ".tmp")
        opener = gzip.open(tmp, "wt", encoding="utf-8", compresslevel=1) if use_gzip else open(tmp, "w", encoding="utf-8")
        with opener as f:
            f.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {\n      "id": %d, "name": "simulated", "computeMajor": %s\n    }\n  ],\n'
                    % (rank, ph.sm[2:-1] or "0"))
            f.write('  "distributedInfo": {"backend": "nccl", "rank": %d, "world_size": %d},\n' % (rank, len(names)))
            if v >= VLLM_VERSION_METADATA_SINCE and version:  # add_metadata_json("vllm_version", json.dumps(version))
                f.write('  "vllm_version": %s,\n  "vllm_version_tuple": %s,\n' % (json.dumps(version), json.dumps(version.split("."))))
            f.write('  "traceEvents": [\n')
            f.write('  {\n    "name": "process_name", "ph": "M", "ts": 0.000, "pid": %d, "tid": 0,\n    "args": {\n      "name": "GPU %d"\n    }\n  }'
                    % (rank, rank))
            corr, ext = 0, 0
            cursor = 100.0  # the CPU enters the first execute_model a little before its first kernel
            for p in passes:
                start_us = cursor
                cursor += p.dur_s * 1e6 + SCHEDULER_GAP_US
                exec_seq, samp_seq = _vllm_kernels(ph, p)
                seq = exec_seq + samp_seq
                eager = p.graph == "NONE"
                gap = 12.0 if eager else 1.5
                if ph.pass_gap_ms is not None and seq:
                    gap = ph.pass_gap_ms[0 if eager else 1] * 1000 / len(seq)
                step_us = p.dur_s * 1e6
                if gap * len(seq) > 0.5 * step_us:
                    gap = 0.5 * step_us / max(1, len(seq))
                total = sum(us for _, us in seq)
                scale = (step_us - gap * len(seq)) / total if total > 0 else 0.0
                jitter = 1.0 + 0.02 * (rank - (len(names) - 1) / 2) / max(1, len(names))
                drawn = [(gap * (0.5 + rng.random()), us * scale * jitter * (0.97 + 0.06 * rng.random())) for _, us in seq]
                fit = min(1.0, step_us / max(1e-9, sum(g + d for g, d in drawn)))
                name = vllm_annotation(v, p, detailed)
                cpu_start = start_us - 30.0  # the CPU enters execute_model before its first kernel runs
                events: list[str] = []
                t = start_us
                launch_end = cpu_start + 20.0
                gpu_first = gpu_last = None
                piece = None  # the current piecewise graph's correlation
                for i, ((kname, _), (g, d)) in enumerate(zip(seq, drawn)):
                    sampler = i >= len(exec_seq)
                    t += g * fit
                    d *= fit
                    if sampler and i == len(exec_seq):
                        t += 20.0  # sample_tokens: a separate worker call after execute_model returns
                    graphed = not sampler and (p.graph == "FULL" or (p.graph == "PIECEWISE" and not ATTENTION_KERNEL.search(kname)))
                    args: dict[str, Any]
                    if graphed and (p.graph == "FULL" and i == 0 or p.graph == "PIECEWISE" and piece is None):
                        corr += 1
                        piece = corr
                        launch_end = max(launch_end, t - 5.0 + 12.0)
                        events.append(_ev("X", "cuda_runtime", "cudaGraphLaunch", pid, tid, t - 5.0, 12.0, {"correlation": corr}))
                    if graphed:
                        args = {"device": rank, "stream": stream, "correlation": piece}  # no External id: a graph replay
                    else:
                        piece = None
                        corr += 1
                        ext += 1
                        events.append(_ev("X", "cuda_runtime", "cudaLaunchKernel", pid, tid, t - 5.0, 4.0, {"External id": ext, "correlation": corr}))
                        if not sampler:
                            launch_end = max(launch_end, t - 1.0)
                        args = {"External id": ext, "device": rank, "stream": stream, "correlation": corr}
                    cat = "gpu_memcpy" if kname.startswith("Memcpy") else "kernel"
                    events.append(_ev("X", cat, kname, rank, stream, t, d, args))
                    if not sampler:
                        gpu_first = t if gpu_first is None else gpu_first
                        gpu_last = t + d
                    t += d
                if name is not None and gpu_first is not None and gpu_last is not None:
                    ext += 1
                    # CPU span: execute_model's host time; GPU span: its kernels, widened as Kineto exports it (ts -1 ns, dur +2 ns)
                    f.write(_ev("X", "user_annotation", name, pid, tid, cpu_start, launch_end + 10.0 - cpu_start, {"External id": ext}))
                    f.write(_ev("X", "gpu_user_annotation", name, rank, stream, gpu_first - 0.001, gpu_last - gpu_first + 0.002, {"External id": ext}))
                f.write("".join(events))
            f.write('\n  ],\n  "traceName": "%s",\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": %d\n}\n' % (path.name, base_ns))
        os.replace(tmp, path)
        paths.append(path)
    return paths


def write_vllm_frontend_trace(out_dir: Path, stem: str, use_gzip: bool = True) -> Path:
    """The API server's AsyncLLM trace: CPU only, no kernels (its worker_name ends in `.async_llm`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}.{time.time_ns()}.pt.trace.json{'.gz' if use_gzip else ''}"
    tmp = path.with_name(path.name + ".tmp")
    text = ('{\n  "schemaVersion": 1,\n  "traceEvents": [\n  {\n    "name": "process_name", "ph": "M", "ts": 0.000, "pid": %d, "tid": 0,\n'
            '    "args": {\n      "name": "python"\n    }\n  }\n  ],\n  "traceName": "%s",\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": %d\n}\n'
            % (os.getpid(), path.name, time.time_ns()))
    if use_gzip:
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=1) as f:
            f.write(text)
    else:
        tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


class _VllmProfiler:
    """The simulated vLLM server's `/start_profile` and `/stop_profile`, as its release serves them."""

    def __init__(self, engine: Any, setting: VllmProfilerSetting) -> None:
        self.engine, self.setting = engine, setting
        self.v = vllm_release(engine.cfg.version)
        self.active = False  # between /start_profile and /stop_profile (the worker wrapper's _active)
        self.running = False  # the torch profiler records (stops by itself after max_iterations)
        self.passes: list[VllmPass] = []
        self.max_iters = setting.max_iterations
        self.prefix: str | None = None
        self.writes: list[asyncio.Task[None]] = []
        self.last_error: str | None = None
        self.written: list[Path] = []  # the files the last capture wrote (tests read it)
        self.instance_id = str(time.time_ns())  # VllmConfig.instance_id: fixed at launch (0.11.1-0.16)
        self.hostname = socket.gethostname()
        self.lock = asyncio.Lock()

    @property
    def scenario(self) -> "Scenario | None":
        return _SCENARIOS.get(id(self.engine.state))

    def _dir(self) -> Path:
        return server_path(self.engine.state, self.scenario, Path(self.setting.directory or tempfile.gettempdir()))

    async def start(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = {}
        if self.v >= VLLM_START_BODY_SINCE and request.can_read_body:
            try:
                raw = await request.json()
            except Exception:  # noqa: BLE001 - FastAPI answers 422 to a body it cannot parse
                return web.json_response({"detail": [{"type": "json_invalid", "msg": "JSON decode error"}]}, status=422)
            body = raw if isinstance(raw, dict) else {}
        if self.active:
            if self.v >= VLLM_SESSION_CONFLICT_SINCE:
                msg = "A profiling session is already active. Call /stop_profile before starting another session."
                return web.json_response({"error": {"message": msg, "type": "Conflict", "param": None, "code": 409}}, status=409)
            return web.Response(status=200)  # "start_profile received when profiler is already active. Ignoring request."
        self.active = self.running = True
        self.passes = []
        self.written = []
        self.prefix = body.get("profile_prefix") if isinstance(body.get("profile_prefix"), str) else None
        self.max_iters = int(body["max_iterations"]) if isinstance(body.get("max_iterations"), int) else self.setting.max_iterations
        if self.v < VLLM_WRAPPER_SINCE:
            self.max_iters = 0
        self.engine.state.pass_listeners.append(self._on_pass)
        return web.Response(status=200)

    def _on_pass(self, rec: PassRecord) -> None:
        if not self.running or not isinstance(rec, VllmPass):
            return
        self.passes.append(rec)
        if self.max_iters and len(self.passes) >= self.max_iters:  # WorkerProfiler.step(): "Max profiling iterations reached"
            self._stop_workers()

    def _stop_workers(self) -> None:
        """The workers' profilers stop and export (the trace files appear)."""
        if not self.running:
            return
        self.running = False
        try:
            self.engine.state.pass_listeners.remove(self._on_pass)
        except ValueError:
            pass
        passes, self.passes = self.passes, []
        if self.setting.kind == "torch" and passes:
            self.writes.append(asyncio.get_running_loop().create_task(self._write(passes)))

    async def _write(self, passes: list[VllmPass]) -> None:
        try:
            cfg = self.engine.cfg
            ph = vllm_physics(cfg, self.scenario, self.engine.graph_max)
            names = vllm_worker_names(self.v, cfg.spec.tensor_parallel_size, self.prefix, self.instance_id, self.hostname, os.getpid())
            async with self.lock:
                paths = await asyncio.to_thread(write_vllm_traces, self._dir(), names, passes, ph, cfg.version,
                                                seed=len(passes), use_gzip=self.setting.use_gzip, detailed=self.setting.detailed)
            self.written.extend(paths)
        except Exception as exc:  # noqa: BLE001 - a failed export must not kill the server
            self.last_error = f"{type(exc).__name__}: {exc}"

    async def stop(self, request: web.Request) -> web.Response:
        if not self.active:
            return web.Response(status=200)  # "stop_profile received when profiler is not active. Ignoring request."
        self._stop_workers()
        self.active = False
        pending, self.writes = self.writes, []
        for t in pending:
            await asyncio.shield(t)
        if self.setting.kind == "torch" and self.setting.frontend:
            stem = f"{self.hostname}_{os.getpid()}.async_llm"
            if self.prefix and self.v >= VLLM_SESSION_CONFLICT_SINCE:
                stem = f"{self.prefix}_{stem}"
            try:
                self.written.append(await asyncio.to_thread(write_vllm_frontend_trace, self._dir(), stem, self.setting.use_gzip))
            except OSError as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
        return web.Response(status=200)


def vllm_server_cwd(cfg: Any) -> str | None:
    """The simulated vLLM server's working directory: its model directory (a temporary one under a simulated host)."""
    root = str(getattr(cfg, "model_root", "") or "")
    return root if root and os.path.isdir(root) else None


def add_vllm_profile_routes(app: web.Application, engine: Any) -> _VllmProfiler | None:
    """Register /start_profile and /stop_profile (POST) where the release's profiler is on; None where it is not."""
    setting = vllm_profiler_setting(engine.cfg.version, engine.cfg.spec, vllm_server_cwd(engine.cfg))
    if setting is None:
        return None
    prof = _VllmProfiler(engine, setting)
    app.router.add_post("/start_profile", prof.start)
    app.router.add_post("/stop_profile", prof.stop)
    return prof
