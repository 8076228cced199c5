"""Render SGLang's config endpoints (`/server_info`, `/model_info`, `/v1/models`) as each release family does.

Three families (shared reference sglang-versions.md §1): up to 0.5.5 only `/get_server_info`; the
classic `dataclasses.asdict(ServerArgs)` layout through 0.5.13; the refactored `resolved_dict()`
layout from 0.5.22. Every key comes from the release's own ServerArgs defaults
(`engine/sim/data/server_args_<version>.json`, extracted from the wheels by
`gpu_runbook.sim.server_args_extract`); this module applies what a real server resolves at start-up
for the scenario's model and GPU (memory buckets, GLM-5/DSA on SM>=10, CUDA graph sizes) and the
scheduler's effective running cap (§7). 0.5.6 and 0.5.14-0.5.21 are not covered by the reference:
they use the nearest older data set.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..model_shape import DSA_ARCHITECTURES, ModelShape, shape_of

DATA = Path(__file__).parent / "data"
# Data set -> first version it stands for (the releases read for the reference).
DATA_SETS: list[tuple[tuple[int, int, int], str]] = [
    ((0, 5, 5), "0.5.5.post3"),
    ((0, 5, 9), "0.5.9"),
    ((0, 5, 10), "0.5.10"),
    ((0, 5, 13), "0.5.13"),
    ((0, 5, 22), "0.5.23"),
]
# GLM-5 (`GlmMoeDsaForCausalLM`) first appears in 0.5.9 (srt/configs/model_config.py:64).
ARCHITECTURE_SINCE: dict[str, tuple[int, int, int]] = {"GlmMoeDsaForCausalLM": (0, 5, 9)}


def version_tuple(version: str) -> tuple[int, int, int]:
    """"0.5.5.post3" -> (0, 5, 5); unknown parts become 0 so comparisons stay total."""
    nums = [int(n) for n in re.findall(r"\d+", version)[:3]]
    while len(nums) < 3:
        nums.append(0)
    return nums[0], nums[1], nums[2]


def is_known_release(version: str) -> bool:
    """A dev build (`0.0.0.dev0`, `0.5.9.dev3+g1234`) does not order with releases (reference §0)."""
    return "dev" not in version and version_tuple(version) != (0, 0, 0)


def at_least(version: str, *release: int) -> bool:
    """True for a release at or after `release`; a dev build counts as the newest covered release."""
    if not is_known_release(version):
        return True
    return version_tuple(version) >= tuple(release)


def has_new_info_endpoints(version: str) -> bool:
    """`/server_info` and `/model_info` appeared in 0.5.6 (older: `/get_*` only)."""
    return at_least(version, 0, 5, 6)


def is_refactored(version: str) -> bool:
    """The `resolved_dict()` layout with renamed fields: 0.5.22 and later (0.5.13 is still classic)."""
    return at_least(version, 0, 5, 22)


def resolved_info_layout(version: str) -> bool:
    """`/server_info` = `server_args.resolved_dict()` with `internal_states[i].world_size`: 0.5.19 and later
    (sglang-versions.md "Corrections": 0.5.19 `srt/entrypoints/http_server.py:811-835`)."""
    return at_least(version, 0, 5, 19)


def per_phase_graph_flags(version: str) -> bool:
    """`--cuda-graph-max-bs-decode`, `--disable-decode-cuda-graph`, ...: 0.5.14 and later (Corrections; 0.5.14 server_args.py:1918-1967)."""
    return at_least(version, 0, 5, 14)


def unsupported_architecture(version: str, architectures: list[str] | None) -> str | None:
    """Why `version` cannot serve the model, or None (dev builds are allowed: their version says nothing)."""
    if not is_known_release(version):
        return None
    for arch in architectures or []:
        since = ARCHITECTURE_SINCE.get(arch)
        if since is not None and version_tuple(version) < since:
            return f"SGLang {version} cannot serve {arch}: it first appears in {'.'.join(map(str, since))}"
    return None


@lru_cache(maxsize=None)
def _defaults(data_set: str) -> tuple[tuple[str, Any], ...]:
    doc = json.loads((DATA / f"server_args_{data_set}.json").read_text(encoding="utf-8"))
    return tuple(doc["fields"].items())


def data_set_for(version: str) -> str:
    if not is_known_release(version):
        return DATA_SETS[-1][1]
    vt = version_tuple(version)
    chosen = DATA_SETS[0][1]
    for since, name in DATA_SETS:
        if vt >= since:
            chosen = name
    return chosen


def default_server_args(version: str) -> dict[str, Any]:
    """The release's ServerArgs defaults, in its field order (a fresh copy)."""
    return json.loads(json.dumps(dict(_defaults(data_set_for(version)))))


# Classic name -> refactored name (value carried over unchanged).
RENAMED_REFACTORED = {
    "cuda_graph_max_bs": "cuda_graph_max_bs_decode",
    "cuda_graph_bs": "cuda_graph_bs_decode",
    "nsa_prefill_backend": "dsa_prefill_backend",
    "nsa_decode_backend": "dsa_decode_backend",
    "stream_output": "incremental_streaming_output",
}


@dataclass
class HostFacts:
    """What start-up resolution looks at besides the flags: the model and the GPU."""

    sm_major: int = 12
    gpu_memory_mib: int = 97887
    hf_config: dict[str, Any] = field(default_factory=dict)
    hf_quant_config: dict[str, Any] | None = None
    architectures: list[str] | None = None

    def shape(self) -> ModelShape:
        return shape_of({**self.hf_config, "architectures": self.architectures or self.hf_config.get("architectures")}, self.hf_quant_config)

    @property
    def dsa(self) -> bool:
        return bool(set(self.architectures or self.hf_config.get("architectures") or []) & DSA_ARCHITECTURES)


def _graph_cap_and_chunk(mem_mib: int, tp: int) -> tuple[int, int]:
    """Classic memory buckets (0.5.5.post3 server_args.py:703-784): decode graph cap and chunked prefill."""
    gib = mem_mib / 1024
    if gib < 20:
        return 8, 2048
    if gib < 35:
        return (24 if tp < 4 else 80), 2048
    if gib < 60:
        return (32 if tp < 4 else 160), 4096
    if gib < 160:
        return (256 if tp < 4 else 512), 8192
    return 512, 16384


def cuda_graph_batch_sizes(max_bs: int) -> list[int]:
    """0.5.5.post3 `_generate_cuda_graph_batch_sizes` (no speculative decoding, padding on)."""
    capture = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    return [bs for bs in capture if bs <= max_bs]


def piecewise_tokens(max_tokens: int) -> list[int]:
    sizes = list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(640, 4097, 128))
    sizes += list(range(4352, max_tokens + 1, 256))
    return [s for s in sizes if s <= max_tokens]


def _dsa_backends(version: str, sm_major: int, fp8_kv: bool) -> tuple[str | None, str | None]:
    """DSA prefill/decode backends a release picks for FP8 KV on SM major >= 10 (reference §2)."""
    if sm_major < 10 or not fp8_kv:
        return None, None
    if sm_major == 12 and at_least(version, 0, 5, 17):  # GLM FP8 KV on SM12x (Corrections: 0.5.17 overrides.py:1600-1616)
        return "flashinfer_sparse_mla", "flashinfer_sparse_mla"
    if at_least(version, 0, 5, 10):
        return "trtllm", "trtllm"
    return "flashmla_auto", "flashmla_kv"


def _classic_names(passed: dict[str, Any]) -> dict[str, Any]:
    """Scenario flags may use either family's names; resolution works on classic names."""
    inverse = {new: old for old, new in RENAMED_REFACTORED.items()}
    out = {inverse.get(k, k): v for k, v in passed.items()}
    if out.get("attn_dp_size", 1) and int(out.get("attn_dp_size", 1)) > 1:
        out.setdefault("enable_dp_attention", True)
        out.setdefault("dp_size", int(out["attn_dp_size"]))
    out.pop("attn_dp_size", None)
    return out


def resolve_server_args(version: str, passed: dict[str, Any], host: HostFacts, *, model_path: str,
                        served_model_name: str, seed_name: str = "") -> dict[str, Any]:
    """ServerArgs after `__post_init__`, in classic names (the refactored rendering renames them)."""
    a = default_server_args(version)
    flags = _classic_names(passed)
    # A classic release has exactly its own fields (a real one rejects unknown flags); the refactored
    # rendering picks what it knows from the classic names later.
    for k, v in flags.items():
        if k in a or is_refactored(version):
            a[k] = v
    a["_passed_cuda_graph_max_bs"] = flags.get("cuda_graph_max_bs")
    a["_passed_cuda_graph_bs"] = flags.get("cuda_graph_bs")
    a["model_path"] = model_path
    a["tokenizer_path"] = flags.get("tokenizer_path", model_path)
    a["served_model_name"] = served_model_name
    a["host"] = flags.get("host", "127.0.0.1")
    a["device"] = a.get("device") or "cuda"
    if a.get("random_seed") is None:
        a["random_seed"] = zlib.crc32((seed_name or model_path).encode()) % (1 << 30)
    tp = int(a.get("tp_size") or 1)
    pp = int(a.get("pp_size") or 1)
    cap, chunk = _graph_cap_and_chunk(host.gpu_memory_mib, tp)
    if a.get("chunked_prefill_size") is None:
        a["chunked_prefill_size"] = chunk
    if a.get("cuda_graph_max_bs") is None:
        if a.get("cuda_graph_bs"):
            cap = max(a["cuda_graph_bs"])
        elif is_refactored(version) and a.get("max_running_requests"):
            cap = min(cap, int(a["max_running_requests"]))  # 0.5.23 memory_hook clamps to the flag
        a["cuda_graph_max_bs"] = cap
    if a.get("cuda_graph_bs") is None:
        a["cuda_graph_bs"] = cuda_graph_batch_sizes(int(a["cuda_graph_max_bs"]))
    if "piecewise_cuda_graph_tokens" in a and a.get("piecewise_cuda_graph_tokens") is None:
        a["piecewise_cuda_graph_tokens"] = piecewise_tokens(int(a.get("piecewise_cuda_graph_max_tokens") or 4096))
    if a.get("page_size") is None:
        a["page_size"] = 1
    if a.get("attention_backend") is None:
        a["attention_backend"] = "fa3" if host.sm_major == 9 else "flashinfer"
    for key, value in (("sampling_backend", "flashinfer"), ("grammar_backend", "xgrammar")):
        if key in a and a[key] is None:
            a[key] = value
    if host.dsa and at_least(version, 0, 5, 9):
        # GLM-5 / DSA (0.5.9 server_args.py:1142-1258; 0.5.13 renames nsa -> dsa).
        a["attention_backend"] = "dsa" if at_least(version, 0, 5, 13) else "nsa"
        a["page_size"] = 64
        if a.get("kv_cache_dtype", "auto") == "auto":
            a["kv_cache_dtype"] = "fp8_e4m3" if host.sm_major >= 10 else "bfloat16"
        prefill, decode = _dsa_backends(version, host.sm_major, a["kv_cache_dtype"].startswith("fp8"))
        pre_key, dec_key = ("dsa_prefill_backend", "dsa_decode_backend") if at_least(version, 0, 5, 13) else ("nsa_prefill_backend", "nsa_decode_backend")
        if prefill is not None and (at_least(version, 0, 5, 10) or a.get(pre_key) in (None, "flashmla_sparse")):
            a[pre_key], a[dec_key] = prefill, decode
    if a.get("mem_fraction_static") is None:
        reserved = 512 + max(int(a["chunked_prefill_size"]), 2048) * 1.5 + int(a["cuda_graph_max_bs"]) * 2 + tp * pp / 8 * 1024
        if a.get("enable_dp_attention"):
            reserved += int(a["cuda_graph_max_bs"]) * int(a.get("dp_size") or 1) * 3
        if host.gpu_memory_mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        a["mem_fraction_static"] = round((host.gpu_memory_mib - reserved) / host.gpu_memory_mib, 3)
    a["api_key"] = None  # never echo the secret
    return a


def dp_size_of(args: dict[str, Any]) -> int:
    """Attention-DP ranks (one scheduler, one internal_states entry, one dp_rank label each)."""
    return int(args.get("dp_size") or 1) if args.get("enable_dp_attention") else 1


def effective_running_cap(flag: int | None, *, max_total_num_tokens: int, context_len: int, dp_size: int = 1) -> int:
    """The scheduler's cap per DP rank (reference §7): the req_to_token pool bounds it, the flag is split over DP."""
    pool = min(max(int(max_total_num_tokens / context_len * 512), 2048), 4096)
    if flag is None:
        return max(1, min(max_total_num_tokens // 2, pool))
    return max(1, min(flag // dp_size if dp_size > 1 else flag, pool))


def decode_graph_enabled(args: dict[str, Any]) -> bool:
    return not bool(args.get("disable_cuda_graph"))


def _refactored(args: dict[str, Any], version: str) -> dict[str, Any]:
    """Classic resolved args -> 0.5.23's `resolved_dict()` (every field of the release, renamed fields filled).
    0.5.19-0.5.21 render with 0.5.23's field set (the closest release read in full)."""
    out = default_server_args(version if is_refactored(version) else "0.5.23")
    known = set(out)
    for k, v in args.items():
        k = RENAMED_REFACTORED.get(k, k)
        if k in known:
            out[k] = v
    passed_cap = args.get("_passed_cuda_graph_max_bs")
    out["cuda_graph_max_bs_decode"] = passed_cap  # null unless passed (exec_.py:606-633)
    out["cuda_graph_bs_decode"] = args.get("_passed_cuda_graph_bs")
    fused = bool(args.get("enable_flashinfer_allreduce_fusion"))
    out["enable_flashinfer_allreduce_fusion"] = False  # kept and always resolved false (serving_hook.py:284-302)
    out["flashinfer_allreduce_fusion_backend"] = args.get("flashinfer_allreduce_fusion_backend") or ("auto" if fused else None)
    dp = dp_size_of(args)
    out["attn_dp_size"] = dp
    out["dp_size"] = 1 if args.get("enable_dp_attention") else int(args.get("dp_size") or 1)
    out["enable_dp_attention"] = dp > 1  # resolved_dict reports the width (server_args.py:316-333)
    off = not decode_graph_enabled(args)
    out["disable_decode_cuda_graph"] = off
    phase = {"tc_compiler": "eager", "max_context_size": None, "full_prefill_max_req": None,
             "full_prefill_prefix_chunk_tokens": None, "max_seq_len": None}  # fmt: skip
    out["cuda_graph_config"] = {
        "decode": {"backend": "disabled" if off else "full", "max_bs": int(args["cuda_graph_max_bs"]),
                   "bs": list(args["cuda_graph_bs"]), **phase},
        "prefill": {"backend": "disabled" if off else "breakable", "max_bs": None, "bs": None, **phase},
    }  # fmt: skip
    return out


@dataclass
class InfoInputs:
    """Everything `/server_info` needs besides the resolved args."""

    max_total_num_tokens: int
    context_len: int
    max_running_requests_flag: int | None
    effective_cap_per_dp: int
    weight_gb: float
    kvcache_gb: float
    graph_gb: float
    gpu_memory_gib: float
    last_gen_throughput: float
    launch_command: str = ""
    startup_time: float = 0.0
    env: dict[str, str] | None = None  # the server's SGLANG_* environment (internal_states[i].env_vars, 0.5.19+ when exposed)


def server_info_body(version: str, args: dict[str, Any], inputs: InfoInputs) -> dict[str, Any]:
    """`/server_info` (or `/get_server_info`) for `version`: args + scheduler_info + internal_states (one per DP rank)."""
    dp = dp_size_of(args)
    max_req_input_len = min(inputs.context_len - 1, inputs.max_total_num_tokens - 1) - 5
    public = {k: v for k, v in args.items() if not k.startswith("_")}
    public["max_running_requests"] = inputs.max_running_requests_flag
    sched = {"status": "ready", "max_total_num_tokens": inputs.max_total_num_tokens, "max_req_input_len": max_req_input_len}
    if per_phase_graph_flags(version) and not resolved_info_layout(version):
        public.setdefault("cuda_graph_max_bs_decode", args.get("_passed_cuda_graph_max_bs"))
        public.setdefault("disable_decode_cuda_graph", not decode_graph_enabled(args))
    if resolved_info_layout(version):
        flat = _refactored(public | {k: v for k, v in args.items() if k.startswith("_passed")}, version)
        body: dict[str, Any] = dict(flat)
        body["launch_command"] = inputs.launch_command
        body.update(sched)
        body["kv_events"] = None
        body["startup_time"] = inputs.startup_time
        states = []
        for _ in range(dp):
            state = dict(flat)
            state["world_size"] = int(flat.get("tp_size") or 1) * int(flat.get("pp_size") or 1) * int(flat.get("dp_size") or 1)
            state["startup_time"] = inputs.startup_time
            state["effective_max_running_requests_per_dp"] = inputs.effective_cap_per_dp
            state["last_gen_throughput"] = round(inputs.last_gen_throughput, 2)
            graph = {"decode": round(inputs.graph_gb, 3)} if inputs.graph_gb else {}
            state["memory_usage"] = {
                "weight": round(inputs.weight_gb, 3), "kvcache": round(inputs.kvcache_gb, 3),
                "startup_available": round(inputs.gpu_memory_gib * 0.985, 3), "token_capacity": inputs.max_total_num_tokens,
                "token_capacity_swa": None, "graph": graph,
            }  # fmt: skip
            state["disaggregation_mode"] = "null"
            state["decode_cuda_graph_bs"] = flat["cuda_graph_config"]["decode"]["bs"] if graph else []
            state["decode_cuda_graph_memory_gb"] = round(inputs.graph_gb, 3)
            env = inputs.env or {}
            if env.get("SGLANG_EXPOSE_OWN_ENV_VARS") in ("1", "true", "True"):  # 0.5.19 environ.py:330, scheduler.py:4813-4814
                state["env_vars"] = {k: v for k, v in env.items() if k.startswith("SGLANG_")}
            states.append(state)
        body["internal_states"] = states
        body["version"] = version
        body["frontend"] = "python"
        return body
    body = dict(public)
    body.update(sched)
    states = []
    for _ in range(dp):
        state = dict(public)  # the scheduler's vars(server_args): FP8-from-checkpoint stays `auto` here too
        state["last_gen_throughput"] = round(inputs.last_gen_throughput, 2)
        state["memory_usage"] = {"weight": round(inputs.weight_gb, 2), "kvcache": round(inputs.kvcache_gb, 2),
                                 "token_capacity": inputs.max_total_num_tokens, "graph": round(inputs.graph_gb, 2)}  # fmt: skip
        if at_least(version, 0, 5, 8):
            state["effective_max_running_requests_per_dp"] = inputs.effective_cap_per_dp
        states.append(state)
    body["internal_states"] = states
    if at_least(version, 0, 5, 13):
        body["kv_events"] = None
    body["version"] = version
    return body


def model_info_body(*, version: str, args: dict[str, Any], model_type: str | None, architectures: list[str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model_path": args.get("model_path"),
        "tokenizer_path": args.get("tokenizer_path", args.get("model_path")),
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
    }
    if has_new_info_endpoints(version):
        body["model_type"] = model_type
        body["architectures"] = architectures
    if is_refactored(version):
        body.update(
            served_model_name=args.get("served_model_name"),
            load_format=args.get("load_format", "auto"),
            reasoning_parser=None,
            tool_call_parser=None,
            disaggregation_mode="null",
        )
    return body


def models_body(*, served_model_name: str, model_path: str, context_len: int, created: int) -> dict[str, Any]:
    card = {
        "id": served_model_name,
        "object": "model",
        "created": created,
        "owned_by": "sglang",
        "root": model_path,
        "parent": None,
        "max_model_len": context_len,
    }
    return {"object": "list", "data": [card]}
