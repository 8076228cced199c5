"""What vLLM releases name and decide, as tables with their source (read in the released wheels).

Each row: the first release it holds for, the value, and where it was read (`vllm/...` paths inside the wheel
of the version named; shared/reference/vllm-and-fleet.md §1-§2). The vLLM probes and the simulated vLLM server
both read these, so a release boundary is written once.
"""

from __future__ import annotations

from gpu_runbook.rules import is_release_version


def release(version: str | None) -> tuple[int, ...] | None:
    """(major, minor, patch) of a release; None for a dev build or no version."""
    if not version or not is_release_version(version):
        return None
    parts: list[int] = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def at_least(version: str | None, first: str) -> bool | None:
    have, want = release(version), release(first)
    return None if have is None or want is None else have >= want


# KV-cache fill 0..1, by the first release that exports each name (loggers.py of each wheel):
KV_USAGE_NAMES = (
    # (name, first release, last release or None, source)
    ("vllm:gpu_cache_usage_perc", "0.6.0", "0.10.99", "0.8.5 v1/metrics/loggers.py:169; deprecated 0.9.2, hidden in 0.11 (0.11.0 :210-221)"),
    ("vllm:kv_cache_usage_perc", "0.9.2", None, "0.9.2 v1/metrics/loggers.py:188-217; 0.11.0 :252; 0.34.0 :620"),
)
# The `engine` label (DP engine index) joins `model_name` from 0.9.2 (0.9.2 loggers.py:159); 0.8.5 has it too
# on V1 (0.8.5 v1/metrics/loggers.py:141 labelnames = ["model_name", "engine"]).
ENGINE_LABEL_SINCE = "0.8.5"
# Inter-token latency: vllm:inter_token_latency_seconds from 0.10.2; before, only time_per_output_token_seconds
# (0.8.5 loggers.py:279; 0.11.0 :390-409); waiting by reason from 0.20 (0.20.0 loggers.py:472-478).
ITL_SINCE = "0.10.2"
WAITING_BY_REASON_SINCE = "0.20.0"
# vllm:time_per_output_token_seconds: "Deprecated in 0.11 - Renamed" (0.11.0 loggers.py:387-390), shown only with
# --show-hidden-metrics-for-version from 0.12.0 (0.12.0 loggers.py:690-694; 0.13.0 :704-708; 0.14.0 :718-723), gone in
# 0.16.0 (only request_time_per_output_token_seconds left, 0.16.0 loggers.py:785-787); 0.15.x has no sdist to read.
TPOT_HIDDEN_SINCE = "0.12.0"
TPOT_UNTIL = "0.15.99"
# cache_config_info adds kv_cache_size_tokens and kv_cache_max_concurrency in 0.24.0: CacheConfig's fields, every one a
# label (0.24.0 config/cache.py:150-154, metrics_info :226-229; absent in 0.23.0 config/cache.py; 0.34.0 :354-359)
KV_SIZE_LABELS_SINCE = "0.24.0"
# GB10 (DGX Spark, compute capability 12.1) stays on the small default tier from 0.33.0 (0.33.0 and 0.34.0
# engine/arg_utils.py `is_gb10`, 0.34.0 :2998-3023; absent in 0.32.0)
GB10_SMALL_TIER_SINCE = "0.33.0"
# Dev mode's /server_info: 0.8.5 answers {"vllm_config": str(config)} only (entrypoints/openai/api_server.py:689-693);
# 0.11.0 takes ?config_format=json and answers the config as JSON (api_server.py:965-985). Releases between are
# not checked: the boundary is the first release read with JSON.
SERVER_INFO_JSON_SINCE = "0.11.0"


def default_max_num_seqs(version: str | None, gpu_memory_gib: float | None, gpu_name: str = "") -> int | None:
    """`--max-num-seqs` when unset, for `vllm serve` (UsageContext.OPENAI_API_SERVER) on a CUDA GPU.

    0.8.5 engine/arg_utils.py:1596-1621: >= 70 GiB -> 1024, else 256; 0.11.0 arg_utils.py:1605-1682: the same with
    A100 on the small tier; 0.34.0 arg_utils.py:2995-3050: >= 160 GiB -> 1024, >= 70 GiB (not A100, not GB10)
    -> 1024, else 256 (GB10 by its name here, "NVIDIA GB10": the probes do not read the compute capability; from
    GB10_SMALL_TIER_SINCE). None where the GPU memory is unknown."""
    if gpu_memory_gib is None:
        return None
    name = gpu_name.lower()
    small_tier = ("a100" in name and at_least(version, "0.9.0") is not False) or (
        "gb10" in name and gpu_memory_gib < 160 and at_least(version, GB10_SMALL_TIER_SINCE) is not False)
    return 1024 if gpu_memory_gib >= 70 and not small_tier else 256


# The default capture sizes follow max_num_seqs from 0.10.0: through 0.9.2 SchedulerConfig.cuda_graph_sizes defaults to
# [512] (0.9.0 config.py:1972, 0.9.2 config.py:2133), in 0.10.0 to [] and then [min(max_num_seqs * 2, 512)]
# (0.10.0 config.py:2274, 2456; 0.10.1 config/scheduler.py:77, 244; 0.11.0 config/scheduler.py:222-227).
GRAPH_SIZES_FROM_MAX_NUM_SEQS_SINCE = "0.10.0"


def default_graph_max_bs(version: str | None, max_num_seqs: int | None) -> int | None:
    """Largest decode batch captured in a CUDA graph when the capture sizes are not set (graphs on).

    0.8.5 config.py:4033-4036 (V1): [1, 2, 4] + range(8, 513, 8) -> 512; 0.9.0 config.py:1972 and 0.9.2 config.py:2133:
    cuda_graph_sizes [512] -> 512; 0.10.0 config.py:2456, 0.11.0 config/scheduler.py:222-227: min(max_num_seqs * 2,
    512), then 1, 2, 4, 8, 16, ... up to it (0.11.0 config/__init__.py:590-600); 0.12.0 config/vllm.py:1035-1040:
    the same min as max_cudagraph_capture_size; 0.34.0 config/vllm.py:2398-2406: min(max_num_seqs * 2, 512), 1024
    on SM100 (not modelled here: the probes do not read the compute capability). Every release also drops sizes
    above max_num_batched_tokens (0.8.5 config.py:4042-4046, 0.11.0 config/__init__.py:606-610, 0.12.0
    config/vllm.py:1041-1042), 2048 or more on a `vllm serve` default, which leaves these sizes as they are.
    None where max_num_seqs is unknown."""
    if at_least(version, GRAPH_SIZES_FROM_MAX_NUM_SEQS_SINCE) is False:
        return 512
    return min(max_num_seqs * 2, 512) if max_num_seqs else None


def graph_max_bs_if_enabled(version: str | None, max_num_seqs: int | None, explicit: int | None) -> tuple[int | None, str | None]:
    """(largest decode batch the server would capture with CUDA graphs on, where that number comes from).

    `--enforce-eager` (or cudagraph_mode NONE, or -O0) captures nothing, so the size a running server reports is 0
    (0.11.0 config/__init__.py:589-592: no capture list under enforce_eager; 0.12.0 config/vllm.py:1028-1032 and
    0.34.0 config/vllm.py:2371-2375: sizes set only without enforce_eager and with a cudagraph_mode other than NONE);
    what the same launch would capture with graphs on is an explicit size where one was set (a positive
    max_cudagraph_capture_size, or 0.10-0.11's scheduler_config.cuda_graph_sizes, which that release fills with its
    default even under enforce_eager: 0.11.0 config/scheduler.py:226-227), else the release's default sizes
    (`default_graph_max_bs`)."""
    if explicit:
        return explicit, "the capture size set at launch"
    size = default_graph_max_bs(version, max_num_seqs)
    if size is None:
        return None, None
    if at_least(version, GRAPH_SIZES_FROM_MAX_NUM_SEQS_SINCE) is False:
        return size, "this release's default capture sizes (1, 2, 4, 8, ... 512)"
    return size, f"this release's default: min(2 x max_num_seqs {max_num_seqs}, 512)"


def custom_all_reduce_off_on_pcie(world_size: int, nvlink: bool) -> bool:
    """vLLM turns its custom all-reduce off on more than two GPUs that are not all NVLink-connected:
    0.8.5 distributed/device_communicators/custom_all_reduce.py:135, 0.11.0 :143, 0.34.0 :268
    (`world_size > 2 and not fully_connected`)."""
    return world_size > 2 and not nvlink

# The torch profiler: /start_profile and /stop_profile are registered only when the server was launched with it
# (profiling.md §7): env VLLM_TORCH_PROFILER_DIR through 0.12 (0.8.5 api_server.py:763, 0.11.0 :1192); from 0.13
# `--profiler-config '{"profiler":"torch","torch_profiler_dir":...}'` (0.34.0 engine/arg_utils.py:1939; the env is
# deprecated in 0.13 and gone by 0.20).
PROFILER_CONFIG_SINCE = "0.13.0"


def profiler_launch_setting(version: str | None, directory: str = "/tmp/vllm-profile") -> str:
    """The exact launch setting that enables vLLM's profiler on this release."""
    if at_least(version, PROFILER_CONFIG_SINCE):
        return f"""--profiler-config '{{"profiler": "torch", "torch_profiler_dir": "{directory}"}}'"""
    if at_least(version, PROFILER_CONFIG_SINCE) is False:
        return f"VLLM_TORCH_PROFILER_DIR={directory} in the server's environment"
    return (f"VLLM_TORCH_PROFILER_DIR={directory} (releases up to 0.12) or --profiler-config "
            f"""'{{"profiler": "torch", "torch_profiler_dir": "{directory}"}}' (0.13+); the version is unknown""")

# FlashInfer's PCIe-IPC all-reduce switch (opt-in, default off): vllm==0.30.0 vllm/envs.py:268, 1863-1868; absent in
# 0.29.0. Its release boundary is engine/vllm_releases.yaml's `pcie-ipc-allreduce`.
PCIE_IPC_VAR = "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC"
# 0.10.0-0.23.0 (engine/vllm_releases.yaml flashinfer-moe-fp4-env)
FLASHINFER_MOE_FP4_VAR = "VLLM_USE_FLASHINFER_MOE_FP4"

# `-O`: through 0.11 the short form of `--compilation-config` (0.11.0 engine/arg_utils.py:934; `-O0`, `-O 0` set its
# level 0, NO_COMPILATION, under which cudagraph_mode defaults to NONE: 0.11.0 utils/__init__.py:1891-1901,
# config/__init__.py:359-376); from 0.12.0 `--optimization-level` (0.12.0 engine/arg_utils.py:1137-1139, `-O<n>`
# rewritten to it by utils/argparse_utils.py:247-259; O0 = "no compilation, no cudagraphs", config/vllm.py:64-66,
# 103-116, and enforce_eager forces O0, :596-602), `--compilation-config` then shortened to `-cc` (:1128). Its release
# boundary is engine/vllm_releases.yaml's `optimization-level-flag`.
OPTIMIZATION_LEVEL_SINCE = "0.12.0"
