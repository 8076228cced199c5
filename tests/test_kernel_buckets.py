"""Kernel-name table (issue 35 item 3, acceptance 2): a real kernel name of every MoE runner, dense GEMM library,
attention backend, collective library and norm / activation / quantization family, on NVIDIA and AMD, lands in its
bucket through its own family's rule (the expected backend says which rule), never through a substring of another
library's name (`fbgemm`, `deep_gemm`, `matmul_ogs`, `gemma`, CK's `Fmha...`); and every shipped rule cites where its
names come from.

Each row: (kernel name, bucket, backend, source). `<...>` / `(...)` stand for template and parameter lists that the
source does not spell out or that are kilobytes long; the rest is the name as the source has it. Source forms:
`pkg==ver:path[:line]` a file in that released wheel (kernel symbols of a `.so` have no line), `owner/repo@commit:path:line`
a repository snapshot, `[OBS] <trace>` a public trace that contains the name verbatim.
"""

from __future__ import annotations

import re

import pytest
import yaml
from gpu_runbook.loader import LoadError
from gpu_runbook.trace.rules import SHIPPED, classifier, load_rules

TL = "AMD-AGI/TraceLens@171dd747:tests/traces/inference"
VLLM = "vllm==0.34.0:vllm"
FI = "flashinfer-python==0.7.4:flashinfer/data"
AITER = "ROCm/aiter@e4048607:hsa/gfx942"
CUBLAS = "nvidia-cublas-cu12==12.9.3.13:nvidia/cublas/lib"
DG = f"{VLLM}/third_party/deep_gemm/include/deep_gemm"  # DeepGEMM 2.8.1 as vLLM ships it

# hipBLASLt, ROCm: [OBS] in vllm_prefilldecode_piecewise (MI300X, gfx942)
HIPBLASLT = ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_DTVA0"
             "_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA1024_LBSPPB256_LBSPPM0_LPA16_LPB16_LPM0_LRVW8"
             "_LWPMn1_MIAV0_MIWT8_6_MO40_NTn1_NTA0_NTB0_NTC0_NTD4_NTM0_NEPBS16_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO0_SRVW0"
             "_SSO0_SVW8_SK0_SKXCCM0_TLDS1_ULSGRO0_USL1_UIOFGRO0_USFGROn1_VSn1_VWA8_VWB2_WSGRA0_WSGRB0_WS64_WG32_8_1")
# CK FMHA batch prefill, kept mangled: [OBS] in sglang_prefilldecode (note FlashInfer's kernel name inside it)
CK_FMHA = ("_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40BlockFmhaBatchPrefillPipelineQRKSVSAsyncINS_36"
           "BlockFmhaBatchPrefillPipelineProblemIDF16bDF16bDF16bffDF16bhfDF16bfDF16bNS_13TileFmhaShapeINS_8sequenceIJLi128ELi128ELi32"
           "ELi128ELi32ELi128EEEENS5_IJLi4ELi1ELi1EEEENS5_IJLi32ELi32ELi16EEEES7_S8_Lb1EEELb1ENS_17ComposedAttentionILj0ELb1EEENS_30"
           "SimplifiedGenericAttentionMaskILb1EEELb0ELi1ENS_26TileFmhaBatchPrefillTraitsILb1ELb1ELb1ELb1ELb0ELNS_22BlockAttentionBias"
           "EnumE0ELb0ELb0ELb0ELNS_28BlockAttentionQuantScaleEnumE0ELin1ELb0ELb0ELi1ELNS_37BlockAttentionKVCacheMemoryLayoutEnumE1EL"
           "NS_36BlockAttentionKVCacheLookupTableEnumE1ELNS_33BlockAttentionKVCacheLoadModeEnumE0EEEEENS_53BlockFmhaBatchPrefillPipeline"
           "QRKSVSAsyncDefaultPolicyEEENS_17Default2DEpilogueINS_24Default2DEpilogueProblemIfDF16bLb1ELb1ELb1EEEvEEEEJNSS_21FmhaFwdGroup"
           "ModeKargsEEEEvDpT1_")
# CK tile RMSNorm, kept mangled: [OBS] in vllm_decode_full
CK_RMSNORM = ("_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwdPipelineOnePassINS_27Rmsnorm2dFwdPipelineProblemIDF16bDF16bf"
              "DF16bDF16bDF16bffNS_19Generic2dBlockShapeINS_8sequenceIJLi1ELi3072EEEENS5_IJLi1ELi128EEEENS5_IJLi1ELi8EEEEEENS_18Rmsnorm2d"
              "FwdTraitsILb1ELb0ELb0ELb0ELNS_21Rmsnorm2dFusedAddEnumE0ELNS_23Rmsnorm2dFusedQuantEnumE0ELNS_22Rmsnorm2dSensitiveEnumE0EEEEE"
              "NS_33Rmsnorm2dFwdPipelineDefaultPolicyEEENS_17Default2DEpilogueINS_24Default2DEpilogueProblemIfDF16bLb0ELb1ELb0EEEvEEEEJNSM"
              "_5KargsEEEEvDpT1_")

TABLE = [
    # ---- MoE: Triton-kernels (vLLM's and SGLang's gpt-oss runner) --------------------------------------------------------
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu", "moe_gemm", "triton-kernels-moe", f"[OBS] {TL}/vllm_decode_full/graph_execution.json.gz"),
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1", "moe_gemm", "triton-kernels-moe", f"[OBS] {TL}/vllm_prefilldecode_piecewise/graph_execution.json.gz"),
    ("_finalize_matmul_scatter_bf16", "moe_gemm", "triton-kernels-moe", f"[OBS] {TL}/vllm_decode_full/graph_execution.json.gz"),
    ("_combined_routing_compute", "moe_gemm", "triton-kernels-moe",
     f"[OBS] {TL}/vllm_decode_full/graph_execution.json.gz; {VLLM}/third_party/triton_kernels/routing_details/_routing_compute.py:85"),
    ("_p_matmul_ogs_NNT_bf16xbf16xmxfp4_128x256x128x1", "moe_gemm", "triton-kernels-moe",
     f"{VLLM}/third_party/triton_kernels/matmul_ogs_details/_p_matmul_ogs.py:78 (base), _common.py:57 (make_matmul_repr format)"),
    ("_p_matmul_NNT_bf16xbf16xmxfp4_128x256x128x1", "moe_gemm", "triton-kernels-moe",
     "triton-lang/triton python/triton_kernels/triton_kernels/matmul_details/_p_matmul.py make_matmul_repr(\"_p_matmul\") (sglang==0.5.23's API)"),
    # ---- MoE: Triton fused_moe (vLLM, SGLang) -------------------------------------------------------------------------
    ("fused_moe_kernel", "moe_gemm", "triton-moe", f"{VLLM}/model_executor/layers/fused_moe/fused_moe.py:298"),
    ("fused_moe_kernel_gptq_awq", "moe_gemm", "triton-moe", f"{VLLM}/model_executor/layers/fused_moe/fused_moe.py:65"),
    # ---- MoE: CUTLASS grouped FP8 / FP4 (vLLM cutlass_moe_mm, cutlass_fp4_group_mm; sgl-kernel) ---------------------------
    (("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, "
     "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm100ArrayTmaUmmaWarpSpecializedBlockScaled<9, 8, 2, "
     "cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cutlass::arch::Sm100>, ...> >(...)"), "moe_gemm", "cutlass-grouped-gemm",
     f"{VLLM}/_C_stable_libtorch.abi3.so kernel symbol _ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalINS1_17GroupProblemShape..."),
    (("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalINS1_17GroupProblemShapeIN4cute5tupleIJiiiEEEEENS1_10collective13Collective"
     "MmaINS1_47MainloopSm120ArrayTmaWarpSpecializedBlockScaledILi4ELi3ENS6_IJNS5_1CILi1EEESD_SD_EEENS1_59KernelPtrArrayTmaWarpSpecialized"
     "CooperativeBlockScaledSm120ILi3EEEEE"), "moe_gemm", "cutlass-grouped-gemm", f"{VLLM}/_C_stable_libtorch.abi3.so (mangled, truncated)"),
    ("compute_problem_sizes", "moe_gemm", "sgl-kernel-moe", f"{VLLM}/_C_stable_libtorch.abi3.so; sgl-kernel csrc/moe/prepare_moe_input.cu"),
    # ---- MoE: FlashInfer CUTLASS (TRT-LLM port) and trtllm-gen ----------------------------------------------------------
    ("void tensorrt_llm::kernels::cutlass_kernels::expandInputRowsKernel<...>(...)", "moe_gemm", "flashinfer-cutlass-moe",
     f"{FI}/csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh:78 (namespace), 1569"),
    ("void tensorrt_llm::kernels::cutlass_kernels::finalizeMoeRoutingKernel<...>(...)", "moe_gemm", "flashinfer-cutlass-moe",
     f"{FI}/csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh:1963"),
    ("bmm_Bfloat16_E2m1E2m1_Fp32_t128x16x256u2_et128x16_m128x16x64_cga1x1x1_16dp256b_TN_transOut_schedS_bN_dynBatch_sm100a",
     "moe_gemm", "trtllm-gen-moe",
     "NVIDIA/TensorRT-LLM@000a01de:cpp/tensorrt_llm/kernels/trtllmGenKernels/batchedGemm/trtllmGen_bmm_export/KernelMetaInfo.h (kernel name)"),
    ("void moe::dev::finalize::finalizeKernel<...>(moe::dev::finalize::KernelParams)", "moe_gemm", "trtllm-gen-moe",
     f"{FI}/csrc/fused_moe/trtllm_backend/trtllm_fused_moe_dev_kernel.cu:43, 669, 678"),
    ("void moe::dev::routing::routingDeepSeek::routingMainKernel<...>(...)", "moe_gemm", "trtllm-gen-moe",
     f"{FI}/csrc/fused_moe/trtllm_backend/trtllm_fused_moe_routing_deepseek.cu:36, 43, 125"),
    # ---- MoE: DeepGEMM grouped --------------------------------------------------------------------------------------------
    (("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(cute::UMMA::Major)0, 0u, 4096u, 7168u, 8u, 64u, 128u, 128u, 128u, 128u, 128u, 5u, 128u, "
     "256u, 1u, false, 132u, (deep_gemm::GemmType)1, cutlass::bfloat16_t, deep_gemm::epilogue::transform::EpilogueIdentity>"
     "(float*, int*, unsigned int, unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)"),
     "moe_gemm", "deep-gemm-moe", f"{DG}/impls/sm90_fp8_gemm_1d2d.cuh:37-48 (template), common/types.cuh:26-34 (GemmType 1 = MGroupedContiguous)"),
    (("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(cute::UMMA::Major)0, 0u, 4096u, 7168u, 8u, 64u, 128u, 128u, 128u, 128u, 128u, 5u, 128u, "
     "256u, 1u, false, 132u, (deep_gemm::GemmType)2, cutlass::bfloat16_t, deep_gemm::epilogue::transform::EpilogueIdentity>(...)"),
     "moe_gemm", "deep-gemm-moe", f"{DG}/common/types.cuh:29 (GemmType 2 = MGroupedMasked)"),
    ("void deep_gemm::sm100_fp8_fp4_mega_moe_impl<...>(...)", "moe_gemm", "deep-gemm-moe", f"{DG}/impls/sm100_fp8_fp4_mega_moe.cuh:60"),
    # ---- MoE: Marlin --------------------------------------------------------------------------------------------------------
    (("void marlin_moe_wna16::Marlin<1125899906909960l, 1125899906843648l, 1125899906909960l, 1125899906909960l, 128, 1, 4, 8, false, 4, 2, "
     "false>(int4 const*, int4 const*, int4*, int4*, int4 const*, int4 const*, float const*, int4 const*, int const*, int const*, int const*, "
     "float const*, int, bool, int, int, int, int*, bool, bool, bool)"), "moe_gemm", "marlin-moe", f"{VLLM}/_moe_C_stable_libtorch.abi3.so"),
    # ---- MoE: vLLM's own routing kernels ------------------------------------------------------------------------------------
    (("void vllm::moe::topkGating<1, 1, 4, 4, 32, int, float, (vllm::moe::ScoringFunc)0>(float const*, bool const*, float*, int, int*, int*, "
     "int, int, int, bool, float const*, double, bool const*)"), "moe_gemm", "vllm-moe", f"{VLLM}/_moe_C_stable_libtorch.abi3.so"),
    # ---- MoE: aiter / CK (ROCm) ---------------------------------------------------------------------------------------------
    ("_ZN5aiter47fmoe_bf16_blockscaleFp8_g1u1_vs_silu_1tg_32x128E", "moe_gemm", "aiter-moe", f"{AITER}/fmoe/silu/fmoe_bf16_blockscaleFp8_g1u1_silu.csv:2"),
    ("_ZN5aiter59fmoe_stage1_bf16_pertokenFp8_blockscale_g1u1_16x128_4tg_pf2E", "moe_gemm", "aiter-moe",
     f"{AITER}/fmoe_2stages/fmoe_stage1_bf16_pertokenFp8_blockscale_g1u1.csv:2"),
    ("_ZN5aiter19topksoftmax_4x128x4E", "moe_gemm", "aiter-moe", f"{AITER}/topksoftmax/topksoftmax.csv:2"),
    # ---- dense GEMM: cuBLAS / cuBLASLt ----------------------------------------------------------------------------------------
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "dense_gemm", "cublas", "[OBS H200, torch 2.11+cu130] traces.md §2.2"),
    ("sm90_xmma_gemm_bf16f32_bf16f32_f32_nt_n_tilesize64x256x64_cgasize1x1x1_warpgroupsize1x1x1_aligna2_alignc4_execute_split_k_kernel__5x_cublas",
     "dense_gemm", "cublas", f"{CUBLAS}/libcublasLt.so.12 (strings)"),
    ("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_32x3_nt", "dense_gemm", "cublas", f"{CUBLAS}/libcublasLt.so.12 (strings)"),
    (("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_fp8_e4m3, float, __nv_fp8_e4m3, true, float, __half, __half, true, false, "
     "false, false>(cublasLt::cublasSplitKParams<float>, ...)"), "dense_gemm", "cublas",
     f"{CUBLAS}/libcublasLt.so.12 (strings, _ZN8cublasLt19splitKreduce_kernelILi32ELi16Eif...); [OBS H200] traces.md §2.2"),
    ("_Z20gemv2T_kernel_64addrIffffLi128ELi16ELi4ELi4ELb1E18cublasGemvParamsExIl30cublasGemvTensorStridedBatchedIKfES3_S1_IfEfEEvT8_",
     "dense_gemm", "cublas", f"{CUBLAS}/libcublas.so.12 (strings)"),
    (("void gemv2T_kernel_64addr<float, float, float, float, 128, 16, 4, 4, true, cublasGemvParamsEx<long, cublasGemvTensorStridedBatched<float "
     "const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >(...)"), "dense_gemm", "cublas",
     f"{CUBLAS}/libcublas.so.12 (strings, the above demangled)"),
    # ---- dense GEMM: CUTLASS (vLLM scaled_mm, cuBLAS's CUTLASS kernels) ----------------------------------------------------------
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(...)", "dense_gemm", "cutlass",
     "vLLM docs nsys table (profiling.md §8); `cutlass_80_tensorop_bf16_s16816gemm_...` in libcublasLt.so.12 strings"),
    ("cutlass3x_sm100_tensorop_s256x256x16gemm_f16_f16_f32_f16_f16_256x256x64_0_ttn_align8_2sm_bias_f16_relu_aux_stream_k", "dense_gemm", "cutlass",
     f"{CUBLAS}/libcublasLt.so.12 (strings)"),
    (("_ZN7cutlass13device_kernelIN4vllm15cutlass_3x_gemmIaNS_10bfloat16_tENS1_3c3x14ScaledEpilogueEN4cute5tupleIJNS6_1CILi128EEES9_S9_EEENS7"
     "_IJNS8_ILi2EEENS8_ILi1EEESC_EEENS_4gemm32KernelTmaWarpSpecializedPingpongENS_8epilogue18TmaWarpSpecializedEE10GemmKernelEEEvNT_6Params"),
     "dense_gemm", "cutlass", f"{VLLM}/_C_stable_libtorch.abi3.so (cutlass_scaled_mm, mangled, truncated)"),
    ("void marlin::Marlin<1125899906909960l, 1125899906843648l, 1125899906909960l, 1125899906909960l, 128, 1, 4, 8, false, 4, 2, false>(...)",
     "dense_gemm", "marlin", f"{VLLM}/_C_stable_libtorch.abi3.so"),
    (("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(cute::UMMA::Major)0, 0u, 4096u, 1024u, 1u, 256u, 128u, 128u, 128u, 128u, 128u, 3u, 128u, "
     "256u, 2u, true, 132u, (deep_gemm::GemmType)0, deep_gemm::epilogue::transform::EpilogueIdentity>(...)"), "dense_gemm", "deep-gemm",
     f"{DG}/impls/sm90_fp8_gemm_1d2d.cuh:48, common/types.cuh:27 (GemmType 0 = Normal)"),
    ("_w8a8_triton_block_scaled_mm", "dense_gemm", "vllm-gemm", f"{VLLM}/model_executor/layers/quantization/utils/fp8_utils.py:841"),
    # ---- dense GEMM: hipBLASLt, rocBLAS, aiter, CK (ROCm) ----------------------------------------------------------------------
    (HIPBLASLT, "dense_gemm", "tensile", f"[OBS] {TL}/vllm_prefilldecode_piecewise/graph_execution.json.gz (hipBLASLt)"),
    ("Cijk_Alik_Bljk_BBS_BH_MT256x256x32_MI32x32x8x1_SN_FL0_GLS0_NTC3_NTD2_NEPBS0_NLCA1_ONLL1_SU32_SUS64_SPO0_SSO6_WGM4", "dense_gemm", "tensile",
     "ROCm/rocBLAS@b520bc83:library/src/blas3/Tensile/Logic/asm_full/aquavanjaram/aquavanjaram_Cijk_Alik_Bljk_BBS_BH.yaml:287 (rocBLAS)"),
    ("void rocblas_gemvt_kernel<256, float, float const*, float*>(...)", "dense_gemm", "rocblas",
     "ROCm/rocBLAS@b520bc83:library/src/blas2/gemv_device.hpp:1002"),
    ("_ZN5aiter43fp8gemm_bf16_blockscale_BpreShuffle_128x128E", "dense_gemm", "aiter-gemm",
     f"{AITER}/fp8gemm_blockscale/fp8gemm_bf16_blockscale.csv:2"),
    ("void ck::kernel_gemm_xdl_cshuffle_v3<...>(...)", "dense_gemm", "ck-gemm",
     "ROCm/composable_kernel@8e22e1ae:include/ck/tensor_operation/gpu/grid/gridwise_gemm_xdl_cshuffle_v3.hpp:35"),
    # ---- attention: FlashAttention 2 / 3 -----------------------------------------------------------------------------------------
    (("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, "
     "128, 4, cutlass::bfloat16_t> >, false, false, false, false, false, false, false, false>(...)"), "attention", "flashattention",
     f"{VLLM}/vllm_flash_attn/_vllm_fa2_C.abi3.so"),
    (("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, "
     "cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, 128, cutlass::bfloat16_t, float, cutlass::arch::Sm90, ...> > > >(...)"),
     "attention", "flashattention", f"{VLLM}/vllm_flash_attn/_vllm_fa3_C.abi3.so (_ZN7cutlass13device_kernelIN5flash20enable_sm90_or_laterINS1_16FlashAttnFwdSm90...)"),
    (("_ZN7cutlass13device_kernelIN5flash20enable_sm90_or_laterINS1_16FlashAttnFwdSm90INS1_25CollectiveMainloopFwdSm90ILi2EN4cute5tupleIJNS5"
     "_1CILi1EEES8_S8_EEENS6_IJNS7_ILi128EEESA_SA_EEELi128ENS_10bfloat16_tEfNS_4arch4Sm90ELb0ELb1ELb0ELb1ELb0"), "attention", "flashattention",
     f"{VLLM}/vllm_flash_attn/_vllm_fa3_C.abi3.so (mangled, truncated)"),
    # ---- attention: FlashInfer ----------------------------------------------------------------------------------------------------
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u, 8u, 16u, 1u, 8u, ...>(...)", "attention",
     "flashinfer-attention", f"{FI}/include/flashinfer/attention/decode.cuh:629"),
    ("void flashinfer::mla::BatchMLAPagedAttentionKernel<...>(...)", "attention", "flashinfer-attention", f"{FI}/include/flashinfer/attention/mla.cuh:976"),
    ("void flashinfer::PersistentVariableLengthMergeStatesKernel<...>(...)", "attention", "flashinfer-attention",
     f"{FI}/include/flashinfer/attention/cascade.cuh:378"),
    # ---- attention: FlashMLA ------------------------------------------------------------------------------------------------------
    (("void flash::flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8, cutlass::float_e4m3_t, cutlass::bfloat16_t, 512>, false, "
     "flash::SharedStorageMLA<Flash_fwd_kernel_traits_mla<576, 64, 64, 8, cutlass::float_e4m3_t, cutlass::bfloat16_t, 512> > >(...)"), "attention",
     "flashmla", f"{VLLM}/_flashmla_extension_C.abi3.so"),
    ("void smxx::decode::flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512, 8, 128, 256, false>(...)", "attention", "flashmla",
     f"{VLLM}/_flashmla_C.abi3.so"),
    ("void legacy::sm90::prefill::sparse_fwd::sparse_attn_fwd_small_heads_kernel<...>(...)", "attention", "flashmla", f"{VLLM}/_flashmla_C.abi3.so"),
    # ---- attention: trtllm-gen FMHA (FlashInfer, TRT-LLM) ------------------------------------------------------------------------
    ("fmhaSm100aKernel_QE4m3KvE2m1OE4m3H128PagedKvCausalP32VarSeqQ128Kv128PersistentContext", "attention", "trtllm-gen-fmha",
     "flashinfer tests/test_artifacts.py (profiling.md §8); cubins TRTLLM_GEN_FMHA flashinfer-python==0.7.4:flashinfer/artifacts.py:143"),
    # ---- attention: CUTLASS MLA (vLLM), cuDNN, Triton ----------------------------------------------------------------------------
    ("void cutlass::device_kernel<cutlass::fmha::kernel::Sm100FmhaMlaReductionKernel<cutlass::bfloat16_t, float, float, 128ul, 512ul, 256> >(...)",
     "attention", "cutlass-mla", f"{VLLM}/_C_stable_libtorch.abi3.so"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0", "attention", "cudnn-sdpa",
     "[OBS H200, torch 2.11] traces.md §2.3"),
    ("kernel_unified_attention_3d", "attention", "triton-attention", f"[OBS] {TL}/vllm_decode_full/graph_execution.json.gz"),
    ("reduce_segments", "attention", "triton-attention", f"[OBS] {TL}/vllm_decode_full/graph_execution.json.gz; {VLLM}/v1/attention/ops/triton_unified_attention.py:814"),
    # ---- attention: CK / aiter / vLLM ROCm -----------------------------------------------------------------------------------------
    (CK_FMHA, "attention", "ck-fmha", f"[OBS] {TL}/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz"),
    ("aiter::fmha_fwd_hd128_bf16_rtz", "attention", "aiter-attention", f"[OBS] {TL}/xdit_flux.1_aiter_sage/profile_trace_rank_0.json.gz"),
    ("_ZN5aiter43pa_bf16_pertokenFp8_gqa10_1tg_4w_qlen1_msk1E", "attention", "aiter-attention", f"{AITER}/pa/pa_asm.csv:53"),
    ("_ZN5aiter41mla_dec_stage1_bf16_a16w16_subQ128_mqa128E", "attention", "aiter-attention", f"{AITER}/mla/mla_asm.csv:2"),
    (("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0, 1, 128, 256, false, 4, 1, "
     "ck_tile::ComposedAttention<0u, false> >(...)"), "attention", "vllm-rocm-paged-attention",
     f"[OBS] {TL}/sglang_decode/sglang_Qwen3-8B_decode.json.gz"),
    # ---- communication: NCCL, RCCL ------------------------------------------------------------------------------------------------
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication", "nccl",
     "nvidia-nccl-cu12==2.27.5:nvidia/nccl/lib/libnccl.so.2 (traces.md §2.4)"),
    ("ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)", "communication", "nccl", "RCCL on MI300X, ROCm 6.0.1: ROCm/roctracer#101 (traces.md §2.4)"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "communication", "nccl",
     "[OBS] facebookresearch/HolisticTraceAnalysis@f4d0062c:tests/data/trace_diff/control/control.json.gz (NCCL < 2.19)"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(...)", "communication", "custom-allreduce", f"{VLLM}/_C_stable_libtorch.abi3.so"),
    # ---- norms, activations, rope -------------------------------------------------------------------------------------------------
    ("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi64ELi8ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib", "norm_act_rope", None,
     f"[OBS] {TL}/sglang_decode/sglang_Qwen3-8B_decode.json.gz; ROCm/aiter@e4048607:csrc/kernels/rmsnorm_quant_kernels.cu:19"),
    (CK_RMSNORM, "norm_act_rope", None, f"[OBS] {TL}/vllm_decode_full/graph_execution.json.gz"),
    ("void vllm::rms_norm_kernel<c10::Half, 16, 2, false>(...)", "norm_act_rope", None, f"{VLLM}/_C_stable_libtorch.abi3.so"),
    ("void vllm::rms_norm_static_fp8_quant_kernel<c10::Half, c10::Float8_e4m3fn, 16>(...)", "norm_act_rope", None,
     f"{VLLM}/_C_stable_libtorch.abi3.so (norm with a quantizing epilogue: counted as the norm)"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)", "norm_act_rope", None, f"{FI}/include/flashinfer/norm.cuh:424"),
    ("_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i", "norm_act_rope", None,
     f"[OBS] {TL}/sglang_decode/sglang_Qwen3-8B_decode.json.gz"),
    ("void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>(...)", "norm_act_rope", None, f"{FI}/include/flashinfer/activation.cuh:34"),
    (("void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, int, long, long, "
     "long, int, int, int)"), "norm_act_rope", None, f"[OBS] {TL}/vllm_decode_full/graph_execution.json.gz"),
    # ---- quantization ----------------------------------------------------------------------------------------------------------------
    ("void per_token_group_quant_8bit_kernel<c10::Half, c10::Float8_e4m3fn, false, false, float, false>(...)", "quantization", None,
     f"{VLLM}/_C_stable_libtorch.abi3.so"),
    ("void vllm::cvt_fp16_to_fp4<__nv_bfloat16, false, false>(...)", "quantization", None, f"{VLLM}/_C_stable_libtorch.abi3.so"),
    ("void fbgemm_gpu::(anonymous namespace)::_float_to_FP8rowwise_cuda_kernel<float>(...)", "quantization", "fbgemm-gpu",
     "pytorch/FBGEMM@71d6f8b2:fbgemm_gpu/src/quantize_ops/quantize_fp8_rowwise.cu:14, 20"),
    ("void deep_gemm::transpose_and_pack_fp32_into_ue8m0<...>(float*, unsigned int*, unsigned int, ...)", "quantization", "deep-gemm",
     f"{DG}/impls/smxx_layout.cuh:78"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "bucket", "backend", "source"), TABLE, ids=[f"{r[2] or r[1]}:{r[0][:48]}" for r in TABLE])
def test_a_real_kernel_name_lands_in_its_bucket_through_its_own_family_rule(name, bucket, backend, source):
    assert source.strip()
    m = classifier().classify(name)
    assert (m.bucket, m.backend, m.classified) == (bucket, backend, True), source


def test_the_table_covers_every_runner_and_vendor_the_issue_names():
    backends = {r[2] for r in TABLE}
    needed = {
        "triton-kernels-moe", "cutlass-grouped-gemm", "flashinfer-cutlass-moe", "trtllm-gen-moe", "deep-gemm-moe", "marlin-moe",
        "triton-moe", "aiter-moe",  # MoE runners
        "cublas", "cutlass", "tensile", "rocblas",  # dense GEMMs (tensile: hipBLASLt's and rocBLAS's Cijk_ kernels)
        "flashattention", "flashinfer-attention", "flashmla", "trtllm-gen-fmha", "ck-fmha", "aiter-attention",  # attention
        "nccl",  # NCCL and RCCL (same kernel names)
    }  # fmt: skip
    assert needed <= backends, needed - backends
    assert {"norm_act_rope", "quantization"} <= {r[1] for r in TABLE}


NOT_THROUGH_ANOTHER_NAME = [
    # (name, bucket, backend, where): each holds another library's name, or a GEMM-like word, inside its own; it lands
    # by its own family's rule (or stays unclassified), never as a dense GEMM through that substring
    ("void fbgemm_gpu::permute_2D_data_kernel<int, long>(...)", "other", "fbgemm-gpu", "FBGEMM fbgemm_gpu/src/sparse_ops/sparse_permute_2d.cu:25"),
    ("void fbgemm_gpu::embedding_inplace_update_kernel_1<float, 8>(...)", "other", "fbgemm-gpu",
     "FBGEMM fbgemm_gpu/src/embedding_inplace_ops/embedding_inplace_update.cu:105"),
    ("void fbgemm_gpu::(anonymous namespace)::_float_to_FP8rowwise_cuda_kernel<float>(...)", "quantization", "fbgemm-gpu",
     "FBGEMM quantize_fp8_rowwise.cu:20"),
    ("void fbgemm_gpu::(anonymous namespace)::index_shuffling_kernel<...>(...)", "moe_gemm", "fbgemm-moe",
     "FBGEMM fbgemm_gpu/experimental/gen_ai/src/moe/index_shuffling.cu:251"),
    ("void deep_gemm::transpose_fp32<128u, 4u>(float const*, float*, unsigned int)", "quantization", "deep-gemm", "DeepGEMM smxx_layout.cuh:13"),
    ("void deep_gemm::smxx_clean_logits<...>(...)", "attention", "deep-gemm-indexer", "DeepGEMM smxx_clean_logits.cuh"),
    ("void vllm::silu_mul_fp8_quant_deep_gemm_kernel<4224, 1024, c10::Float8_e4m3fn, float, 32, long, false, 128, 2>(...)", "norm_act_rope", None,
     "vllm==0.34.0 _C"),
    ("_silu_mul_fp8_quant_deep_gemm", "norm_act_rope", None, "vllm==0.34.0 fused_moe/experts/batched_deep_gemm_moe.py:58"),
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1", "moe_gemm", "triton-kernels-moe", "TraceLens vllm_decode_full"),
    ("_finalize_matmul_scatter_bf16", "moe_gemm", "triton-kernels-moe", "TraceLens vllm_decode_full"),
    ("_gemma_rmsnorm_kernel", "norm_act_rope", None, "vllm==0.34.0 models/minimax_m3/amd/ops/gemma_rmsnorm.py:42 (gemma holds gemm)"),
    ("triton_poi_fused_addmm_gelu_view_15", "norm_act_rope", None, "TraceLens xdit_sd_3.5 (Inductor; addmm holds mm)"),
    (CK_FMHA, "attention", "ck-fmha", "TraceLens sglang_prefilldecode (holds FlashInfer's BatchPrefillWithPagedKVCacheKernel)"),
    ("void vllm::moe::topkGating<1, 1, 4, 4, 32, int, float, (vllm::moe::ScoringFunc)0>(...)", "moe_gemm", "vllm-moe",
     "vllm==0.34.0 _moe_C (holds `topk`, an `other` keyword)"),
    ("_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i", "norm_act_rope", None,
     "TraceLens sglang_decode"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "bucket", "backend", "where"), NOT_THROUGH_ANOTHER_NAME, ids=[n[0][:48] for n in NOT_THROUGH_ANOTHER_NAME])
def test_no_name_lands_through_a_substring_of_another_librarys_name(name, bucket, backend, where):
    m = classifier().classify(name)
    assert (m.bucket, m.backend) == (bucket, backend), where
    assert m.bucket != "dense_gemm"


def test_the_names_that_used_to_fall_through_now_land_where_they_belong():
    """The issue's cases: Triton-kernels MoE read as dense GEMM, fbgemm_gpu kernels as dense GEMM, CK's FMHA as
    FlashInfer, DeepGEMM's layout kernels and vLLM's DeepGEMM-feeding activation as DeepGEMM GEMMs."""
    c = classifier()
    assert c.classify("_finalize_matmul_scatter_bf16").bucket == "moe_gemm"
    assert (c.classify("void fbgemm_gpu::permute_2D_data_kernel<int, long>(...)").bucket,
            c.classify("void fbgemm_gpu::permute_2D_data_kernel<int, long>(...)").backend) == ("other", "fbgemm-gpu")  # fmt: skip
    assert c.classify(CK_FMHA).backend == "ck-fmha"  # its name holds FlashInfer's BatchPrefillWithPagedKVCacheKernel
    assert c.classify("void deep_gemm::transpose_fp32<128u, 4u>(float const*, float*, unsigned int)").bucket == "quantization"
    m = c.classify("void vllm::silu_mul_fp8_quant_deep_gemm_kernel<4224, 1024, c10::Float8_e4m3fn, float, 32, long, false, 128, 2>(...)")
    assert (m.bucket, m.backend) == ("norm_act_rope", None)
    assert c.classify(HIPBLASLT).bucket == "dense_gemm"
    # a DeepGEMM kernel of no known family stays unclassified rather than a dense GEMM by its namespace
    assert c.classify("void deep_gemm::some_future_kernel<...>(...)").classified is False


def _shipped_rules() -> list[dict]:
    return yaml.safe_load(SHIPPED.read_text())["rules"]


def test_every_shipped_rule_cites_where_its_names_come_from():
    rules = _shipped_rules()
    missing = [i for i, r in enumerate(rules) if not isinstance(r.get("source"), str) or not r["source"].strip()]
    assert not missing, f"rules without a source: {missing}"
    assert all(r.source for r in load_rules(SHIPPED, require_source=True))


GENERIC = {"gemm", "gemv", "matmul", "bmm", "mma", "wgmma", "mm", "gemm_", "_gemm", "matmul_", "_matmul", "flashinfer", "flashinfer::", "flash"}


def test_no_shipped_rule_matches_a_bare_gemm_or_library_word():
    """`matmul` took Triton-kernels' MoE, `gemm` took fbgemm and deep_gemm: such substrings (and bare vendor names,
    which span several buckets) are not rules; a regex that is only such a word is not either."""
    for i, r in enumerate(_shipped_rules()):
        words = [w.lower() for w in r.get("contains", []) + r.get("contains_nocase", []) + r.get("prefix", [])]
        assert not GENERIC & set(words), (i, r.get("bucket"), GENERIC & set(words))
        for p in r.get("regex", []):
            assert p.lower().strip("^$") not in GENERIC, (i, p)


def test_the_rules_are_fast_on_long_template_names():
    """Every kernel of a large trace walks the rules until one matches (results are cached per name, but a capture of
    a CUTLASS-heavy model has thousands of distinct kilobyte-long names): a few hundred microseconds per name at most."""
    import time

    c = classifier()
    names = [CK_FMHA + str(i) for i in range(50)] + [HIPBLASLT + str(i) for i in range(50)] + [f"unknown_kernel_{i}" * 40 for i in range(50)]
    t0 = time.perf_counter()
    for n in names:
        c._first(n, "kernel")
    per_name = (time.perf_counter() - t0) / len(names)
    assert per_name < 2e-3, per_name  # measured ~0.1 ms on a 2-core CI machine; generous against a slow box


def test_a_shipped_rule_without_a_source_is_refused_at_file_line_col(tmp_path):
    p = tmp_path / "shipped.yaml"
    p.write_text("version: 1\nrules:\n  - bucket: attention\n    source: flashinfer decode.cuh:629\n    contains: [A]\n"
                 "  - bucket: moe_gemm\n    prefix: [fused_moe_kernel]\n")  # fmt: skip
    with pytest.raises(LoadError) as err:
        load_rules(p, require_source=True)
    msg = str(err.value.errors[0])
    assert msg.startswith(f"{p}:6:5:"), msg
    assert "source" in msg
    assert load_rules(p)  # a user's rules file may leave it out


def test_an_empty_source_is_refused_even_in_a_users_file(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("rules:\n  - bucket: attention\n    source: '  '\n    prefix: [my_]\n")
    with pytest.raises(LoadError) as err:
        load_rules(p)
    msg = str(err.value.errors[0])
    assert msg.startswith(f"{p}:2:5:") and "source" in msg, msg


def test_an_anchored_regex_with_a_top_level_alternative_still_matches_anywhere(tmp_path):
    """`^a|b` is tried at the start only for its first branch: rules split `^`-anchored regexes out for speed, and
    must not change what such a pattern matches."""
    p = tmp_path / "mine.yaml"
    p.write_text("rules:\n  - bucket: attention\n    regex: ['^mine_|deep_in_the_name', '^(?:void )?only_at_start']\n")
    r = load_rules(p)[0]
    assert r.matches("x deep_in_the_name", "x deep_in_the_name", "kernel")
    assert r.matches("void only_at_start<1>", "", "kernel")
    assert not r.matches("x only_at_start", "", "kernel")
    assert re.compile(r.anchored.pattern).match("mine_x") is None  # `^mine_|...` went to the searched pattern


def test_a_regex_that_cannot_be_joined_with_the_rules_others_is_refused_at_file_line_col(tmp_path):
    """A rule's regexes are compiled as one alternation: a global `(?i)` inside it would raise there, after validation;
    the loader says so at the regex instead (`(?i:...)` is the scoped form that works)."""
    p = tmp_path / "mine.yaml"
    p.write_text("rules:\n  - bucket: attention\n    regex: ['(?i)mine']\n")
    with pytest.raises(LoadError) as err:
        load_rules(p)
    assert str(err.value.errors[0]).startswith(f"{p}:3:13:"), err.value.errors[0]
    p.write_text("rules:\n  - bucket: attention\n    regex: ['(?i:mine)']\n")
    assert load_rules(p)[0].matches("MINE_kernel", "mine_kernel", "kernel")
