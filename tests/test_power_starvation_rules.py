"""power-starvation's rules on hand-made evidence: each wrong verdict issue 11 found, and each
version-dependent rule on both sides of its boundary release.

The evidence dicts are shaped like the probes' values (concept names from probes/sglang/config.py and
the window concepts of sglang.metrics); the scenarios in runbooks/scenarios exercise the same rules
end to end on the simulated host.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_runbook.loader import load_path_or_name
from gpu_runbook.registry import Registry
from gpu_runbook.rules import evaluate, to_cel_data


@pytest.fixture(scope="module")
def runbook():
    return load_path_or_name("power-starvation", Registry.discover())


def verdict(runbook, hyp_id: str, scope: dict[str, Any]) -> str:
    """What the runner decides for one node from this evidence (precondition, then confirm, then refute), with the
    rules of the evidence's server kind (LoadedRunbook.for_server: SGLang's where the scope does not say)."""
    runbook = runbook.for_server((scope.get("server") or {}).get("server_kind"))
    params = {name: p.default for name, p in runbook.runbook.params.items()}
    data = to_cel_data({**scope, "params": params, "load": {}})
    when = runbook.rule(hyp_id, "when")
    if when is not None:
        outcome = evaluate(when, data)
        if outcome.value is False:
            return "skipped"
        if outcome.value is None:
            return "inconclusive"
    for field, name in (("confirm", "confirmed"), ("refute", "refuted")):
        rule = runbook.rule(hyp_id, field)
        if rule is not None and evaluate(rule, data).value is True:
            return name
    return "inconclusive"


def stats(v: float) -> dict[str, float]:
    return {"mean": v, "min": v, "max": v, "p50": v, "p95": v, "last": v}


def gpu(draw: float, enforced: float = 600.0, board_max: float = 600.0, sw_power_cap: float = 0.0, mem_clock_ratio: float = 1.0) -> dict[str, Any]:
    return {"power_draw_w": stats(draw), "power_limit_enforced_w": enforced, "power_limit_max_w": board_max,
            "event_reasons": {"sw_power_cap": sw_power_cap}, "mem_clock_ratio": stats(mem_clock_ratio)}


def seed_box() -> dict[str, Any]:
    """The seeds' 235 W state: LXC (P2P OK), SGLang 0.5.10, GLM-5-NVFP4 at TP8, the KV wall."""
    return {
        "inv": {"gpu_count": 8, "nvlink_active_links_total": 0, "compute_capability_major": 12,
                "pcie_link_max_gbps": 63.0, "gpus": [{"max_mem_clock_mhz": 12481}] * 8},
        "ref": {"memory_bound_draw_w": 367.0},
        "power": {
            "gpu_util_pct": stats(100), "power_draw_w": stats(235), "gpus": [gpu(235)] * 8,
            "event_reasons": {"sw_power_cap": 0.0, "applications_clocks_setting": 0.0},
            "sm_clock_ratio": stats(0.99), "throttled_fraction": 0.0, "slowdown_fraction": 0.0,
            "mem_clock_mhz": stats(12481), "pcie_tx_bytes_per_s": stats(7e9), "pcie_rx_bytes_per_s": stats(7e9),
        },
        "metrics": {"running_per_dp": stats(1935), "queued": stats(113), "kv_usage": {**stats(0.97), "max": 0.999},
                    "retractions": 12.0, "running_to_cap_p50": 0.94, "decode_graph_share": 0.0, "gauges_current": True},
        "server": {"server_kind": "sglang", "version": "0.5.10", "tp": 8, "pp": 1, "ep": 1, "attn_dp": 1, "quantization": "modelopt_fp4",
                   "model_dtype": "bfloat16", "kv_dtype": "fp8_e4m3", "moe_backend": "flashinfer_cutlass",
                   "custom_all_reduce_disabled": False, "sglang_enable_pcie_ipc_allreduce": None,
                   "sglang_opt_use_custom_all_reduce_v2": None, "cuda_graphs_decode": False, "graph_max_bs_decode": 512},
        "model": {"is_moe": True, "is_mla": True, "num_experts": 256, "num_experts_per_tok": 8,
                  "moe_intermediate_size": 2048, "quantization": "modelopt", "kv_dtype_from_checkpoint": None},
        "topo": {"any_pair_without_p2p": False},
    }


def with_(scope: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy with `alias__key=value` changes."""
    out = copy.deepcopy(scope)
    for path, value in changes.items():
        alias, key = path.split("__", 1)
        out[alias][key] = value
    return out


def test_seed_box_verdicts(runbook):
    s = seed_box()
    assert verdict(runbook, "gpus-underfed", s) == "confirmed"
    assert verdict(runbook, "power-limit-capped", s) == "refuted"
    assert verdict(runbook, "clocks-held-down", s) == "refuted"
    assert verdict(runbook, "p2p-unavailable", s) == "refuted"
    assert verdict(runbook, "running-requests-capped", s) == "refuted"
    assert verdict(runbook, "kv-cache-wall", s) == "confirmed"
    assert verdict(runbook, "kv-replicated-across-tp", s) == "confirmed"
    assert verdict(runbook, "custom-allreduce-off", s) == "confirmed"
    assert verdict(runbook, "kv-cache-bf16", s) == "refuted"
    assert verdict(runbook, "communication-bound", s) != "refuted"  # idle-looking links are not evidence
    assert verdict(runbook, "sm120-untuned", s) == "confirmed"  # flashinfer_cutlass autotune skipped before 0.5.13


def test_a_lowered_limit_that_does_not_bind_is_only_information(runbook):
    s = with_(seed_box(), power__gpus=[gpu(235, enforced=500)] * 8)
    assert verdict(runbook, "power-limit-capped", s) == "refuted"
    assert verdict(runbook, "power-limit-lowered", s) == "confirmed"
    bound = with_(seed_box(), power__gpus=[gpu(497, enforced=500)] * 8)
    assert verdict(runbook, "power-limit-capped", bound) == "confirmed"
    assert verdict(runbook, "power-limit-lowered", bound) == "refuted"


def test_a_gpu_drawing_at_its_board_maximum_is_not_capped(runbook):
    """The healthy compute-bound box: at its 700 W board maximum, with the power cap active, nothing can be raised."""
    s = with_(seed_box(), power__gpus=[gpu(695, enforced=700, board_max=700)] * 8, power__event_reasons={"sw_power_cap": 0.6, "applications_clocks_setting": 0.0})
    assert verdict(runbook, "power-limit-capped", s) == "refuted"


def test_a_mixed_sku_host_is_judged_per_gpu(runbook):
    """A 300 W Max-Q at 240 W beside a 600 W card at 240 W: neither limit binds, none is lowered."""
    s = with_(seed_box(), power__gpus=[gpu(240, 300, 300), gpu(240, 600, 600)])
    assert verdict(runbook, "power-limit-capped", s) == "refuted"
    assert verdict(runbook, "power-limit-lowered", s) == "refuted"


def test_locked_clocks_hold_the_clock_down_without_a_thermal_reason(runbook):
    s = with_(seed_box(), power__sm_clock_ratio=stats(0.6))
    assert verdict(runbook, "clocks-held-down", s) == "confirmed"
    capped = with_(seed_box(), power__sm_clock_ratio=stats(0.6), power__throttled_fraction=0.9)  # the power cap does it
    assert verdict(runbook, "clocks-held-down", capped) == "refuted"
    mem = with_(seed_box(), power__gpus=[gpu(235, mem_clock_ratio=0.4)] * 8)
    assert verdict(runbook, "clocks-held-down", mem) == "confirmed"


def test_each_gpu_memory_clock_is_compared_with_its_own_maximum(runbook):
    """A mixed host: a GPU whose maximum is lower than GPU 0's, running at its own maximum, is not held down."""
    mixed = with_(seed_box(), power__gpus=[gpu(235, mem_clock_ratio=1.0), gpu(235, mem_clock_ratio=0.98)],
                  power__mem_clock_mhz=stats(9000))  # pooled mean far below GPU 0's 12,481 MHz maximum
    assert verdict(runbook, "clocks-held-down", mixed) == "refuted"
    held = with_(mixed, power__gpus=[gpu(235), gpu(235, mem_clock_ratio=0.5)])
    assert verdict(runbook, "clocks-held-down", held) == "confirmed"


def test_the_power_cap_counts_on_the_gpu_whose_limit_is_lowered(runbook):
    """GPU 1 capped at its 600 W board maximum (sw_power_cap active) beside GPU 0 with a lowered 400 W limit it does
    not reach: the lowered limit does not bind, whatever GPU 1's reason says."""
    s = with_(seed_box(), power__gpus=[gpu(235, enforced=400), gpu(598, sw_power_cap=0.9)],
              power__event_reasons={"sw_power_cap": 0.45, "applications_clocks_setting": 0.0})
    assert verdict(runbook, "power-limit-capped", s) == "refuted"
    capped = with_(s, power__gpus=[gpu(235, enforced=400, sw_power_cap=0.9), gpu(598)])
    assert verdict(runbook, "power-limit-capped", capped) == "confirmed"


def test_tp2_without_p2p_has_no_custom_allreduce(runbook):
    vm_tp2 = with_(seed_box(), server__tp=2, topo__any_pair_without_p2p=True)
    assert verdict(runbook, "custom-allreduce-off", vm_tp2) == "confirmed"
    lxc_tp2 = with_(seed_box(), server__tp=2)
    assert verdict(runbook, "custom-allreduce-off", lxc_tp2) == "refuted"


@pytest.mark.parametrize(("version", "expected"), [("0.5.11", "refuted"), ("0.5.12", "confirmed"),
                                                   ("0.5.12.post1", "confirmed"), ("0.5.13", "refuted")])
def test_custom_allreduce_v2_trap_is_0_5_12_only(runbook, version, expected):
    s = with_(seed_box(), server__tp=2, server__version=version)
    assert verdict(runbook, "custom-allreduce-off", s) == expected


def test_the_v2_workaround_when_the_server_exposes_its_env(runbook):
    s = with_(seed_box(), server__tp=2, server__version="0.5.12", server__sglang_opt_use_custom_all_reduce_v2=False)
    assert verdict(runbook, "custom-allreduce-off", s) == "refuted"


@pytest.mark.parametrize(("version", "expected"), [("0.5.13", "confirmed"), ("0.5.20", "confirmed"), ("0.5.21", "refuted"),
                                                   ("0.5.22", "refuted"), ("0.5.23", "refuted")])
def test_pcie_ipc_allreduce_counts_from_0_5_21_with_p2p(runbook, version, expected):
    s = with_(seed_box(), server__version=version, server__sglang_enable_pcie_ipc_allreduce=True)
    assert verdict(runbook, "custom-allreduce-off", s) == expected
    no_p2p = with_(s, topo__any_pair_without_p2p=True)
    assert verdict(runbook, "custom-allreduce-off", no_p2p) == "confirmed"


def test_fp8_kv_from_the_checkpoint_is_not_bf16(runbook):
    s = with_(seed_box(), server__kv_dtype="auto", model__kv_dtype_from_checkpoint="fp8_e4m3")
    assert verdict(runbook, "kv-cache-bf16", s) == "refuted"
    bf16 = with_(seed_box(), server__kv_dtype="auto")
    assert verdict(runbook, "kv-cache-bf16", bf16) == "confirmed"


@pytest.mark.parametrize(("version", "backend", "expected"), [
    ("0.5.12", "flashinfer_cutlass", "confirmed"),  # explicit backend, autotune still skipped
    ("0.5.12", "auto", "confirmed"),
    ("0.5.13", "flashinfer_cutlass", "refuted"),
    ("0.5.13", "auto", "confirmed"),  # auto left unresolved: not the tuned runner
    ("0.5.23", "flashinfer_cutlass", "refuted"),
])
def test_sm120_moe_autotune_boundary_is_0_5_13(runbook, version, backend, expected):
    s = with_(seed_box(), server__version=version, server__moe_backend=backend)
    assert verdict(runbook, "sm120-untuned", s) == expected


@pytest.mark.parametrize("version", ["0.0.0.dev0", "0.5.8.dev12+g1a2b3c4"])
def test_a_dev_build_is_an_unknown_version_never_an_old_one(runbook, version):
    s = with_(seed_box(), server__version=version, server__moe_backend="flashinfer_cutlass")
    assert verdict(runbook, "sm120-untuned", s) == "inconclusive"


def test_graphs_on_but_the_batch_above_max_bs_runs_eagerly(runbook):
    counted = with_(seed_box(), server__cuda_graphs_decode=True, metrics__decode_graph_share=0.0)
    assert verdict(runbook, "cuda-graphs-disabled", counted) == "confirmed"
    uncounted = with_(counted, metrics__decode_graph_share=None, metrics__running_per_dp=stats(600))
    assert verdict(runbook, "cuda-graphs-disabled", uncounted) == "confirmed"
    small = with_(uncounted, metrics__running_per_dp=stats(200))
    assert verdict(runbook, "cuda-graphs-disabled", small) == "refuted"


def test_low_concurrency_counts_per_dp_rank(runbook):
    s = with_(seed_box(), metrics__running_per_dp=stats(25), metrics__queued=stats(0))
    assert verdict(runbook, "low-concurrency", s) == "confirmed"


def test_kv_wall_held_by_reservations_below_0_9(runbook):
    s = with_(seed_box(), metrics__kv_usage={**stats(0.85), "max": 0.87}, metrics__retractions=0.0,
              metrics__running_to_cap_p50=0.4)
    assert verdict(runbook, "kv-cache-wall", s) == "confirmed"
    assert verdict(runbook, "running-requests-capped", s) == "refuted"


def test_running_cap_binds_with_room_in_the_kv_cache(runbook):
    s = with_(seed_box(), metrics__running_per_dp=stats(64), metrics__queued=stats(192),
              metrics__kv_usage=stats(0.03), metrics__retractions=0.0, metrics__running_to_cap_p50=1.0)
    assert verdict(runbook, "running-requests-capped", s) == "confirmed"
    assert verdict(runbook, "kv-cache-wall", s) == "refuted"


def test_p2p_matters_to_model_parallel_groups_not_dp_replicas(runbook):
    replicas = with_(seed_box(), server__tp=1, topo__any_pair_without_p2p=True)
    assert verdict(runbook, "p2p-unavailable", replicas) == "skipped"
    ep = with_(replicas, server__ep=8)
    assert verdict(runbook, "p2p-unavailable", ep) == "confirmed"


def test_a_healthy_memory_bound_box_is_not_underfed(runbook):
    s = with_(seed_box(), power__power_draw_w=stats(390))
    assert verdict(runbook, "gpus-underfed", s) == "refuted"


def test_one_stale_dcgm_reading_decides_nothing(runbook):
    idle = {"readings_distinct": 1, "prof_dram_active": stats(0.0), "prof_pipe_tensor_active": stats(0.0)}
    assert verdict(runbook, "memory-bound-decode", {**seed_box(), "act": {}, "dcgm": idle}) == "inconclusive"
    window = {"readings_distinct": 3, "prof_dram_active": stats(0.7), "prof_pipe_tensor_active": stats(0.05)}
    assert verdict(runbook, "memory-bound-decode", {**seed_box(), "act": {}, "dcgm": window}) == "confirmed"


def test_gauges_from_before_the_window_decide_nothing_but_a_retraction(runbook):
    """A queue and a full cache written before the window opened, with the server generating since, are not
    measured in it: the KV wall and the cap stay undecided, unless the scheduler retracted (a counter)."""
    stale = with_(seed_box(), metrics__gauges_current=False, metrics__retractions=0.0)
    assert verdict(runbook, "kv-cache-wall", stale) == "inconclusive"
    assert verdict(runbook, "running-requests-capped", stale) == "inconclusive"
    assert verdict(runbook, "kv-cache-wall", with_(stale, metrics__retractions=3.0)) == "confirmed"


H200_CURVE = [[0.0, 488.0], [1.0, 517.0], [8.0, 546.0], [32.0, 650.0], [64.0, 695.0], [128.0, 694.0], [256.0, 693.0], [512.0, 692.0]]


def h200_dense_bf16(running_per_rank: float, draw_w: float) -> dict[str, Any]:
    """One H200 decoding a dense bf16 model: the rows of every weight GEMM are the running requests of its rank."""
    s = with_(seed_box(), power__power_draw_w=stats(draw_w), power__gpus=[gpu(draw_w, 700, 700)],
              metrics__running_per_dp=stats(running_per_rank))
    s["ref"] = {"memory_bound_draw_w": 488.0, "draw_curve": H200_CURVE, "reference_kind": "measured curve"}
    s["model"] = {"is_moe": False, "weight_dtype": "bf16", "weight_bytes_per_param": 2.0, "gemm_rows_per_request": 1.0}
    return s


def test_the_yardstick_follows_the_batch_an_h200_decodes(runbook):
    """Issue 36's acceptance 2: 500 W at batch 128 a rank is underfed (a well-fed H200 is at its 700 W limit
    there), 500 W at batch 1 is not (a well-fed one draws ~517 W, and 500 is within 15 % of it)."""
    assert verdict(runbook, "gpus-underfed", h200_dense_bf16(128, 500.0)) == "confirmed"
    assert verdict(runbook, "gpus-underfed", h200_dense_bf16(1, 500.0)) == "refuted"


def test_an_unknown_shape_judges_against_the_copy_floor(runbook):
    """No config.json on this host: the intensity is unknown, so the floor (a copy's 488 W) is the yardstick."""
    s = h200_dense_bf16(128, 500.0)
    s["model"] = {}
    assert verdict(runbook, "gpus-underfed", s) == "refuted"  # 500 >= 0.85 x 488
    assert verdict(runbook, "gpus-underfed", with_(s, power__power_draw_w=stats(400.0))) == "confirmed"


def test_an_fp8_moe_reads_its_expert_rows(runbook):
    """An FP8 MoE with 8 of 128 experts a token at 256 running a rank: 16 rows an expert, 32 FLOPs a byte (650 W)."""
    s = h200_dense_bf16(256, 560.0)
    s["model"] = {"is_moe": True, "weight_dtype": "fp8", "weight_bytes_per_param": 1.0, "gemm_rows_per_request": 8 / 128}
    assert verdict(runbook, "gpus-underfed", s) == "refuted"  # 560 >= 0.85 x 650 = 552.5
    assert verdict(runbook, "gpus-underfed", with_(s, power__power_draw_w=stats(500.0))) == "confirmed"


def test_results_recorded_before_the_curve_still_judge_on_their_single_figure(runbook):
    s = seed_box()
    assert "draw_curve" not in s["ref"]
    assert verdict(runbook, "gpus-underfed", s) == "confirmed"
    assert verdict(runbook, "gpus-underfed", with_(s, power__power_draw_w=stats(340.0))) == "refuted"


def test_a_window_without_a_running_median_judges_against_the_floor(runbook):
    """No scrape carried the running gauge (spread([]): p50 null): the shape is unknown, the copy floor decides."""
    s = h200_dense_bf16(128, 500.0)
    s["metrics"]["running_per_dp"] = {"mean": None, "min": None, "max": None, "p50": None, "p95": None, "last": None}
    assert verdict(runbook, "gpus-underfed", s) == "refuted"  # 500 >= 0.85 x 488, not inconclusive


def vllm_box(version: str, **server: Any) -> dict[str, Any]:
    """The seeds' box on vLLM: GLM-5-NVFP4 (the checkpoint's weights are NVFP4) at TP8 on SM120."""
    s = with_(seed_box(), server__server_kind="vllm", server__version=version, server__version_known=True, server__moe_backend="auto",
              server__vllm_use_flashinfer_moe_fp4=None, server__cuda_graphs_decode=True, model__weight_dtype="fp4")
    return with_(s, **{f"server__{k}": v for k, v in server.items()})


@pytest.mark.parametrize(("version", "server", "expected"), [
    # through 0.15.0 `auto` runs vLLM's own CUTLASS NVFP4 grouped GEMM on SM120 (FlashInfer's CUTLASS MoE: SM90/SM100 only)
    ("0.11.0", {}, "confirmed"),
    ("0.15.0", {}, "confirmed"),
    ("0.15.0", {"vllm_use_flashinfer_moe_fp4": True}, "inconclusive"),  # opted into FlashInfer: not judged from the release
    # 0.15.1 adds SM120 to FlashInfer's CUTLASS MoE and `auto` picks it, autotuned at start-up ...
    ("0.15.1", {}, "refuted"),
    ("0.16.0", {}, "refuted"),
    ("0.16.0", {"cuda_graphs_decode": False}, "confirmed"),  # ... but --enforce-eager lowers 0.16 to O0: no autotune
    ("0.17.0", {"cuda_graphs_decode": False}, "refuted"),  # from 0.17 eager mode keeps the autotune
    ("0.20.0", {"vllm_use_flashinfer_moe_fp4": False}, "confirmed"),  # =0 removes FlashInfer's kernels from `auto`
    ("0.34.0", {}, "refuted"),
    ("0.34.0", {"moe_backend": "cutlass"}, "confirmed"),
    ("0.34.0", {"moe_backend": "marlin"}, "confirmed"),
    ("0.34.0", {"moe_backend": "b12x"}, "refuted"),  # an SM12x kernel of its own
    ("0.8.5", {}, "skipped"),  # no NVFP4 MoE in this release (modelopt.py has none)
])
def test_sm120_fp4_moe_on_vllm_follows_its_release_facts(runbook, version, server, expected):
    assert verdict(runbook, "sm120-untuned", vllm_box(version, **server)) == expected


def test_sm120_fp4_moe_on_vllm_is_not_judged_for_a_checkpoint_that_is_not_nvfp4(runbook):
    s = vllm_box("0.11.0", quantization=None)
    assert verdict(runbook, "sm120-untuned", with_(s, model__weight_dtype="fp8")) == "refuted"
    assert verdict(runbook, "sm120-untuned", with_(s, model__weight_dtype=None)) == "inconclusive"


def test_sm120_fp4_moe_on_a_vllm_dev_build_is_undecided_not_skipped(runbook):
    s = vllm_box("0.35.0.dev3+g1a2b3c4", version_known=False)
    assert verdict(runbook, "sm120-untuned", s) == "inconclusive"
