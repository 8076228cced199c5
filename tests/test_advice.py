"""Advice an expert signs: causes ranked by what they cost, facts that do not limit at this load, steps whose
preconditions hold, on hand-made evidence shaped like the probes' values (the seeds' box at its KV wall).

The end-to-end numbers (shares of the simulated step) depend on the simulator's decode profile; these tests
hold the logic on its own: the rules and the ranking, whatever the simulator measures.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from gpu_runbook import findings
from gpu_runbook.headlines import render, value_of
from gpu_runbook.loader import load_path_or_name
from gpu_runbook.model import Severity, Verdict, headline_parts
from gpu_runbook.registry import Registry
from gpu_runbook.results import HypothesisResult, Results, StepResult
from gpu_runbook.rules import evaluate, to_cel_data

from test_power_starvation_rules import seed_box, stats, verdict, with_


@pytest.fixture(scope="module")
def runbook():
    return load_path_or_name("power-starvation", Registry.discover()).for_server("sglang")  # the seeds' box runs SGLang


def profiled(scope: dict[str, Any], **prof: Any) -> dict[str, Any]:
    """The seed box with a decode profile: MoE ~44 % at ~4 % of its roofline, communication ~41 %, ~3 % of peak DRAM bandwidth."""
    out = with_(scope)
    out["prof"] = {"communication_share": 0.41, "moe_gemm_share": 0.44, "moe_roofline_share": 0.04, "dominant_bucket": "moe",
                   "bandwidth_share": 0.03, "idle_share": 0.02, "attention_share": 0.05, **prof}  # fmt: skip
    out["model"] = {**out["model"], "hidden_size": 6144, "is_dsa": True}
    out["server"] = {**out["server"], "weight_gb_per_gpu": 52.0}
    out["inv"] = {**out["inv"], "memory_total_bytes": 97887 * 1024 * 1024}
    return out


def data_of(runbook, scope: dict[str, Any]) -> dict[str, Any]:
    params = {name: p.default for name, p in runbook.runbook.params.items()}
    return to_cel_data({**scope, "params": params, "load": {}})


def rule_value(runbook, hid: str, key: str, scope: dict[str, Any]) -> Any:
    """A rule's value: true/false/None (unknown) for a condition, the number for a gain factor."""
    rule = runbook.rule(hid, key)
    out = evaluate(rule, data_of(runbook, scope)).value
    return out if out is not None or key.endswith(".when") else value_of(rule, data_of(runbook, scope))


def test_co_dominant_communication_is_confirmed(runbook):
    s = profiled(seed_box())
    assert verdict(runbook, "communication-bound", s) == "confirmed"  # 41 %, second to MoE's 44 %
    assert verdict(runbook, "communication-bound", profiled(seed_box(), communication_share=0.2)) == "inconclusive"
    assert verdict(runbook, "communication-bound", profiled(seed_box(), communication_share=0.05)) == "refuted"


def test_memory_bound_decode_is_decided_from_the_profile_without_gpm_or_dcgm(runbook):
    assert verdict(runbook, "memory-bound-decode", profiled(seed_box())) == "refuted"  # ~3 % of peak DRAM bandwidth
    assert verdict(runbook, "memory-bound-decode", profiled(seed_box(), bandwidth_share=0.8)) == "confirmed"
    assert verdict(runbook, "memory-bound-decode", profiled(seed_box(), bandwidth_share=0.45)) == "inconclusive"


def test_custom_allreduce_off_is_not_limiting_above_its_size_limit(runbook):
    wall = profiled(seed_box(), )  # 1,935 running: 1,935 x 6,144 x 2 B = 23.8 MB > 8 MiB, and > the 512-row graph batch
    assert verdict(runbook, "custom-allreduce-off", wall) == "confirmed"
    assert rule_value(runbook, "custom-allreduce-off", "not_limiting.when", wall) is True
    mid = with_(wall, metrics__running_per_dp=stats(300))  # 3.7 MB: custom all-reduce would take it
    assert rule_value(runbook, "custom-allreduce-off", "not_limiting.when", mid) is False
    hyp = next(h for h, _ in runbook.runbook.walk() if h.id == "custom-allreduce-off")
    fields = [runbook.rule(hyp.id, f"not_limiting.says.{j}") for j in range(len(headline_parts(hyp.not_limiting.says)))]
    said = render(hyp.not_limiting.says, fields, data_of(runbook, wall))[0]
    assert "23.8 MB" in said and "8 MiB" in said and "~683 running per rank" in said  # where it would start to matter


def test_graphs_off_is_not_limiting_above_the_graph_batch(runbook):
    wall = profiled(seed_box())
    assert verdict(runbook, "cuda-graphs-disabled", wall) == "confirmed"
    assert rule_value(runbook, "cuda-graphs-disabled", "not_limiting.when", wall) is True
    small = with_(wall, metrics__running_per_dp=stats(200))
    assert rule_value(runbook, "cuda-graphs-disabled", "not_limiting.when", small) is False


def steps_for(runbook, hid: str, scope: dict[str, Any]) -> list[tuple[str, bool | None]]:
    """Each step's rendered text and whether its `when` holds on this evidence (True when it has none)."""
    hyp = next(h for h, _ in runbook.runbook.walk() if h.id == hid)
    data = data_of(runbook, scope)
    out = []
    for i, step in enumerate(hyp.steps):
        if step.server not in (None, "sglang"):  # these scopes are SGLang servers: the runner leaves vLLM's steps out
            continue
        applies = evaluate(runbook.rule(hid, f"next_steps.{i}.when"), data).value if step.when else True
        text = step.text
        if "{{" in text:
            fields = [runbook.rule(hid, f"next_steps.{i}.text.{j}") for j in range(len(headline_parts(text)))]
            text = render(text, fields, data)[0]
        out.append((text, applies))
    return out


def offered(runbook, hid: str, scope: dict[str, Any]) -> list[str]:
    return [t for t, applies in steps_for(runbook, hid, scope) if applies is True]


@pytest.mark.parametrize(("version", "flag"), [("0.5.10", "--enable-dp-attention --dp-size 8"), ("0.5.21", "--enable-dp-attention --dp-size 8"),
                                               ("0.5.22", "--attn-dp-size 8")])
def test_attention_dp_names_this_releases_flags_and_the_fp4_dispatch(runbook, version, flag):
    s = with_(profiled(seed_box()), server__version=version)
    steps = offered(runbook, "kv-replicated-across-tp", s)
    assert len(steps) == 1
    assert flag in steps[0] and "--ep-size 8" in steps[0] and "flashinfer_cutlass" in steps[0] and "modelopt_fp4" in steps[0]


def test_attention_dp_at_tp2_is_dp2_and_its_capacity_factor_at_most_2(runbook):
    s = with_(profiled(seed_box()), server__tp=2, server__version="0.5.23")
    steps = offered(runbook, "kv-replicated-across-tp", s)
    assert len(steps) == 1 and "--attn-dp-size 2 " in steps[0] and "--ep-size 2 " in steps[0]
    assert rule_value(runbook, "kv-replicated-across-tp", "next_steps.0.gain", s) == 2.0
    assert rule_value(runbook, "kv-replicated-across-tp", "next_steps.0.gain", profiled(seed_box())) == 2.5


def test_a_dev_build_gets_no_version_specific_flag(runbook):
    s = with_(profiled(seed_box()), server__version="0.0.0.dev0")
    assert offered(runbook, "kv-replicated-across-tp", s) == []
    assert all(applies is None for _, applies in steps_for(runbook, "kv-replicated-across-tp", s))


def test_a_tp_change_is_offered_only_where_the_weights_fit(runbook):
    fits = with_(profiled(seed_box()), server__weight_gb_per_gpu=30.0)  # 60 GB at TP4 of 95.6 GiB
    assert any("--tp-size 4 --dp-size 2" in t for t in offered(runbook, "communication-bound", fits))
    full = profiled(seed_box())  # 52 GB -> 104 GB per GPU: does not fit
    assert not any("--tp-size" in t for t in offered(runbook, "communication-bound", full))
    assert not any("--tp-size 2" in t for t in offered(runbook, "custom-allreduce-off", full))


def test_fp8_kv_is_offered_only_where_the_kv_is_not_fp8_and_a_dsa_model_gets_1_63(runbook):
    fp8 = profiled(seed_box())
    assert not any("fp8_e4m3" in t for t in offered(runbook, "kv-cache-bf16", fp8))
    bf16 = with_(fp8, server__kv_dtype="bfloat16")
    assert any("fp8_e4m3" in t for t in offered(runbook, "kv-cache-bf16", bf16))
    assert rule_value(runbook, "kv-cache-bf16", "next_steps.0.gain", bf16) == 1.63


def test_the_sm120_upgrade_names_every_flag_it_needs(runbook):
    old = offered(runbook, "sm120-untuned", profiled(seed_box()))
    assert any("0.5.13 or later" in t and "--quantization modelopt_fp4" in t and "--moe-runner-backend flashinfer_cutlass" in t for t in old)
    new = offered(runbook, "sm120-untuned", with_(profiled(seed_box()), server__version="0.5.13", server__moe_backend="auto"))
    assert not any("Upgrade" in t for t in new) and any("--quantization modelopt_fp4" in t for t in new)


def test_no_step_anywhere_recommends_num_continuous_decode_steps():
    for name in ("power-starvation", "throughput-plateau"):
        rb = load_path_or_name(name, Registry.discover())
        for hyp, _ in rb.runbook.walk():
            for step in hyp.steps:
                assert "--num-continuous-decode-steps" not in step.text, (hyp.id, step.text)


# -- ranking ---------------------------------------------------------------------------------------


def hyp(hid: str, parent: str | None, *, cost: float | None = None, limiting: bool | None = None, follows=(), steps=()) -> HypothesisResult:
    return HypothesisResult(id=hid, parent=parent, title=hid, verdict=Verdict.confirmed, reason="", severity=Severity.warning,
                            cost=cost, limiting=limiting, follows=list(follows), steps=[StepResult(text=t) for t in steps])  # fmt: skip


def results_of(*hyps: HypothesisResult) -> Results:
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    return Results(runbook="power-starvation", started_at=now, finished_at=now, hypotheses=list(hyps))


def test_root_causes_rank_by_their_measured_share_and_not_limiting_facts_drop_out():
    r = results_of(
        hyp("gpus-underfed", None),
        hyp("kv-cache-wall", "gpus-underfed", steps=["attention DP"]),
        hyp("communication-bound", "gpus-underfed", cost=0.41),
        hyp("custom-allreduce-off", "gpus-underfed", limiting=False, steps=["PCIe-IPC"]),
        hyp("moe-small-expert-batches", "gpus-underfed", cost=0.44, follows=["kv-cache-wall"]),
        hyp("sm120-untuned", "gpus-underfed", follows=["moe-small-expert-batches"]),
        hyp("cuda-graphs-disabled", "gpus-underfed", limiting=False, steps=["graphs"]),
    )
    roots = findings.findings(r)
    assert [f.id for f in roots] == ["kv-cache-wall", "moe-small-expert-batches", "communication-bound"]
    assert [f.id for f in roots[1].consequences] == ["sm120-untuned"]
    assert [h.id for h in findings.not_limiting(r)] == ["custom-allreduce-off", "cuda-graphs-disabled"]
    texts = [s.step.text for s in findings.ranked_steps(r)]
    assert "PCIe-IPC" not in texts and "graphs" not in texts and texts[0] == "attention DP"


# -- gains from a measured step-time model ---------------------------------------------------------


def test_the_ramp_gives_a_step_time_model_and_the_gain_comes_with_its_range():
    """A load's half-second samples on its way to the KV wall, admissions (each with a 30 ms prefill, which gives the
    stream its first token) interleaved with decode steps of 100 ms + 0.35 ms per running request: the fit separates
    the two and finds the step."""
    timeline, tokens, started, t = [], 0.0, 0.0, 0.0
    for i in range(160):
        batch = min(1283.0, 16.0 * i)
        new = 16.0 if batch < 1283.0 else 2.0  # the ramp admits, the steady state replaces a few
        step_s = (100.0 + 0.35 * batch) / 1000.0
        timeline.append([t, batch, tokens, started])
        decode_s = 0.5 - new * 0.03 * 0.5  # part of each half second goes to prefill
        t += 0.5
        tokens += batch * decode_s / step_s + new * 0.5  # the client counts each stream's first token too
        started += new * 0.5
    fit = findings.ramp_fit(findings.ramp_windows(timeline))
    a, c = fit[0], fit[1]
    assert a == pytest.approx(100.0, rel=0.1) and c == pytest.approx(0.35, rel=0.1)
    results = Results(runbook="power-starvation", started_at=datetime.now(timezone.utc), load={"decode_timeline": timeline})
    ctx = {**findings.context(results), "running": 1283.0, "queued": 737.0, "running_cap": 2048.0, "throughput": 2320.0, "itl_ms": 549.0}
    est = findings.estimate("kv_capacity", 2.5, "", ctx)
    assert 1.0 < est.throughput_x < 1.3 and not est.upper_bound  # not the x1.57 of a constant step
    assert est.range_x[0] <= est.throughput_x <= est.range_x[1] and "the load's windows" in est.model
    assert "upper bound" not in findings.gain_short(StepResult(text="attention DP", gain=est))


def test_a_ramp_that_only_prefills_gives_no_ramp_fit():
    """A burst of 2,048 arrivals: the scheduler runs prefill batches (32 requests, ~1 s each) until the KV cache is
    full, so the batch climbs to 1,531 with no decode step, then decodes at that one batch (a seed run's windows).
    The climb says what a prefill costs, nothing of how the decode step grows: no fit, whatever the numbers."""
    windows = [(21.6 + 96.0 * i, 96.0, 3.0, 96.0) for i in range(15)]
    windows += [(1531.0, 7655.0 + 450.0 * (i % 3), 3.0, 0.0) for i in range(11)]
    windows += [(1431.0 - 2.0 * i, 2900.0 + 300.0 * (i % 2), 3.0, 45.0) for i in range(6)]
    assert findings.ramp_fit(windows) is None


def test_a_load_that_never_leaves_one_batch_gives_no_ramp_fit():
    timeline = [[0.5 * i, 500.0, 1000.0 * i, 0.0] for i in range(60)]
    assert findings.ramp_fit(findings.ramp_windows(timeline)) is None


def test_without_a_model_the_gain_is_called_an_upper_bound():
    ctx = {"running": 1283.0, "queued": 737.0, "running_cap": 2048.0, "throughput": 2320.0, "itl_ms": 549.0, "curve": [(1283.0, 549.0)]}
    est = findings.estimate("kv_capacity", 2.5, "", ctx)
    assert est.upper_bound and est.range_x is None
    assert findings.gain_short(StepResult(text="attention DP", gain=est)).startswith("at most x1.57")


def test_without_a_fit_the_profiled_steps_parts_give_the_model_and_its_range():
    """The seeds' box at its KV wall: communication ~41 % and attention ~12 % of the profiled step grow with the batch,
    the MoE GEMMs' ~44 % sit between fixed and growing: attention DP's x2.5 KV capacity (1,283 -> 2,020 running) gives
    about x1.1, not the x1.57 of a constant step."""
    parts = {"batch": 1279.0, "step_ms": 1464.0, "communication": 0.409, "attention": 0.122, "moe_gemm": 0.439}
    ctx = {"running": 1283.0, "queued": 737.0, "running_cap": 2048.0, "throughput": 794.0, "itl_ms": 548.0,
           "curve": [(1283.0, 548.0)], "profile_parts": parts}  # fmt: skip
    est = findings.estimate("kv_capacity", 2.5, "", ctx)
    assert 1.0 < est.range_x[0] <= est.throughput_x <= est.range_x[1] < 1.3 and not est.upper_bound
    assert est.throughput_x == pytest.approx(1.10, abs=0.02)
    assert "profiled decode step's parts" in est.model and "communication 40.9%" in est.model
    assert "x1.1 (x1.01-1.21)" in findings.gain_short(StepResult(text="attention DP", gain=est))


def test_the_kv_walls_mla_pointer_is_offered_where_it_applies(runbook):
    steps = steps_for(runbook, "kv-cache-wall", profiled(seed_box()))
    assert any("latent KV" in t and applies is True for t, applies in steps)  # MLA at TP8 without attention DP
    on_dp = with_(profiled(seed_box()), server__attn_dp=8)
    assert not any("latent KV" in t and applies is True for t, applies in steps_for(runbook, "kv-cache-wall", on_dp))
