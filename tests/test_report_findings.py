"""Findings a person acts on: causes before consequences, headline numbers, steps that apply, gains.

Runbooks here run on the `test.value` probe (tests/probe_files), so each verdict and number is fixed.
"""

from __future__ import annotations

import asyncio
import json
import textwrap

import pytest

from gpu_runbook import findings, progress, report
from gpu_runbook.loader import LoadError, load
from gpu_runbook.numbers import quantity
from gpu_runbook.target import Target
from gpu_runbook.results import Results
from gpu_runbook.runner import Runner

RUNBOOK = """\
name: findings-example
title: Findings example
hypotheses:
  - id: symptom
    title: GPUs underfed
    headline: "GPUs draw {{ p.draw_w | W }} of {{ p.max_w | W }} ({{ p.draw_w / p.max_w | share }})"
    probes:
      p: { probe: test.value, with: { values: { draw_w: 236.0, max_w: 600.0 } } }
      m: { probe: test.value, with: { values: { kv: 0.9997, running: 1935.0, queued: 3000.0, running_cap: 8192.0, kv_dtype: KV_DTYPE } } }
    confirm: "true"
    children:
      - id: wall
        title: The KV cache is full
        headline: "KV usage {{ m.kv | share }} with {{ m.running | count }} running"
        confirm: m.kv > 0.9
        next_steps:
          - text: Use an FP8 KV cache (`--kv-cache-dtype fp8_e4m3`).
            when: "!m.kv_dtype.startsWith('fp8')"
            gain: { kind: kv_capacity, factor: "2.0", assumes: an FP8 token takes half the bytes }
          - Raise `--mem-fraction-static` a little.
      - id: small-batches
        title: Small expert batches
        follows: [wall]
        confirm: "true"
        next_steps: |
          - Larger batches first.
      - id: topology
        title: No P2P
        confirm: "true"
        severity: critical
        next_steps: Run where the GPUs see each other.
"""


def _run(registry, tmp_path, kv_dtype="bf16") -> Results:
    path = tmp_path / "findings.yaml"
    path.write_text(RUNBOOK.replace("KV_DTYPE", kv_dtype))
    return asyncio.run(Runner(load(path, registry), registry, Target()).run())


def test_root_causes_lead_and_consequences_sit_under_their_cause(registry, tmp_path):
    results = _run(registry, tmp_path)
    assert [h.id for h in findings.symptoms(results)] == ["symptom"]
    roots = findings.findings(results)
    assert [f.id for f in roots] == ["topology", "wall"]  # most severe first
    wall = roots[1]
    assert [f.id for f in wall.consequences] == ["small-batches"]
    text = report.render(results)
    found = text[text.index("## Findings") : text.index("## What to do")]
    assert "- ● **KV usage 100% with 1,935 running** (`wall`, warning)" in found
    assert "  - follows from `wall`: ● **Small expert batches** (`small-batches`, warning)" in found
    summary = progress.summary(results, None, None)
    assert "    ● follows from wall: [warning] small-batches: Small expert batches" in summary


def test_a_step_that_does_not_apply_is_not_offered(registry, tmp_path):
    offered = _run(registry, tmp_path, kv_dtype="bf16")
    assert "Use an FP8 KV cache" in offered.by_id("wall").steps[0].text and offered.by_id("wall").steps[0].applies is True
    assert any("FP8 KV cache" in s.step.text for s in findings.ranked_steps(offered))

    fp8 = _run(registry, tmp_path, kv_dtype="fp8_e4m3")
    step = fp8.by_id("wall").steps[0]
    assert step.applies is False and step.reason.startswith("does not apply: !m.kv_dtype.startsWith('fp8')")
    assert not any("FP8 KV cache" in s.step.text for s in findings.ranked_steps(fp8))
    text = report.render(fp8)
    assert "FP8 KV cache" not in text[: text.index("## Details")]  # not in the TL;DR, not in What to do
    assert "~~Use an FP8 KV cache (`--kv-cache-dtype fp8_e4m3`).~~ (does not apply" in text  # struck out in the details
    assert "FP8 KV cache" not in progress.summary(fp8, None, None)


def test_rounding_is_the_same_in_the_summary_the_report_and_the_json(registry, tmp_path):
    results = _run(registry, tmp_path)
    path = results.write_json(tmp_path / "r.json")
    raw = json.loads(path.read_text())
    wall = next(h for h in raw["hypotheses"] if h["id"] == "wall")
    assert wall["headline"] == "KV usage 100% with 1,935 running"
    assert wall["headline_values"] == {"m.kv": 0.9997, "m.running": 1935.0}
    assert quantity(wall["headline_values"]["m.kv"], "share") == "100%"
    text = report.render(Results.read_json(path))
    summary = progress.summary(Results.read_json(path), None, None)
    for shown in (wall["headline"], "GPUs draw 236 W of 600 W (39.3%)"):
        assert shown in text and shown in summary
    assert "0.9997" not in text[: text.index("## Details")] and "0.9997" not in summary


def test_gains_rank_the_steps_and_show_their_arithmetic():
    ctx = {"running": 1935.0, "queued": 113.0, "running_cap": 2048.0, "concurrency": 2048.0, "throughput": 1935.0, "itl_ms": 972.0}
    est = findings.estimate("kv_capacity", 2.0, "half the bytes", ctx)
    assert est.throughput_x == pytest.approx(2048 / 1935, abs=1e-3)
    assert "KV capacity x2 -> room for ~3,870 running requests" in est.arithmetic
    assert "batch 1,935 -> 2,048" in est.arithmetic and "an upper bound" in est.arithmetic
    roomy = findings.estimate("kv_capacity", 2.0, "", {**ctx, "queued": 3000.0, "running_cap": 8192.0})
    assert roomy.throughput_x == pytest.approx(2.0)
    share = findings.estimate("step_share", 0.25, "", ctx)
    assert share.throughput_x == pytest.approx(1 / 0.75, abs=1e-3)
    assert "removing 25% of the ~972 ms step -> ~729 ms" in share.arithmetic
    unknown = findings.estimate("kv_capacity", None, "", ctx)
    assert unknown.throughput_x is None and "could not be estimated" in unknown.arithmetic


def test_estimated_steps_come_first_and_say_they_are_estimates(registry, tmp_path):
    results = _run(registry, tmp_path)
    ranked = findings.ranked_steps(results)
    assert ranked[0].step.text.startswith("Use an FP8 KV cache") and ranked[0].step.gain.throughput_x == pytest.approx(2.0)
    assert ranked[1].finding.id == "topology"  # then the rest, most severe first
    text = report.render(results)
    tldr = text[text.index("## TL;DR") : text.index("## Findings")]
    assert "- **Do first:** (`wall`) Use an FP8 KV cache" in tldr
    # no load ran, so no step-time model: the constant-step figure is an upper bound, and the TL;DR says so
    assert ("- **Expected gain:** at most x2 output throughput at this load: batch 1,935 -> 3,870 (x2), held by the KV cache "
            "(an upper bound: no step-time model could be fitted") in tldr


def _broken(tmp_path, text: str):
    path = tmp_path / "broken.yaml"
    path.write_text(textwrap.dedent(text))
    return path


BASE = """\
name: broken
title: Broken
hypotheses:
  - id: a
    title: A
    probes:
      p: { probe: test.value, with: { values: { x: 1.0 } } }
    confirm: "true"
    children:
      - id: b
        title: B
        confirm: "true"
        FIELD
      - id: c
        title: C
        confirm: "true"
        follows: [b]
"""


@pytest.mark.parametrize(
    "field, line_col, message",
    [
        ("follows: [nope]", "13:19", "follows: unknown hypothesis 'nope'"),
        ("follows: [b]", "13:19", "follows: 'b' is this hypothesis itself"),
        ("follows: [c]", "13:18", "follows: a cycle (b -> c -> b)"),
        ('headline: "{{ p.x | furlongs }}"', "13:19", "headline: unknown unit 'furlongs'"),
        ('headline: "{{ q.x | W }}"', "13:19", "'q' is not a probe alias this rule can see"),
        ('next_steps: [{ text: t, when: "p.x >" }]', "13:44", "next_steps[0].when: CEL syntax error"),
        ('next_steps: [{ text: t, gain: { kind: kv_capacity, factor: "r.x" } }]', "13:68", "next_steps[0].gain.factor: 'r' is not a probe alias"),
        ("next_steps: [{ text: t, gain: { kind: doubling, factor: '2.0' } }]", "13:47", "next_steps.0.gain.kind: Input should be 'kv_capacity' or 'step_share'"),
    ],
)
def test_the_new_fields_are_checked_at_file_line_col(registry, tmp_path, field, line_col, message):
    path = _broken(tmp_path, BASE.replace("FIELD", field))
    with pytest.raises(LoadError) as info:
        load(path, registry)
    lines = [str(e) for e in info.value.errors]
    assert any(line.startswith(f"{path}:{line_col}: ") and message in line for line in lines), lines


def test_plain_markdown_next_steps_stay_valid(registry, tmp_path):
    path = _broken(tmp_path, BASE.replace("FIELD", "next_steps: |\n          - One.\n          - Two,\n            continued."))
    loaded = load(path, registry)
    hyp = next(h for h, _ in loaded.runbook.walk() if h.id == "b")
    assert [s.text for s in hyp.steps] == ["One.", "Two, continued."]


def test_along_a_sweep_the_gain_follows_the_fitted_step_time():
    """With a measured curve the step time grows with the batch (ITL ~ a + c x batch), so doubling the
    KV capacity gives far less than double the throughput."""
    curve = [(1.0, 101.5), (64.0, 130.0), (430.0, 295.9)]
    a, c = findings.step_time_model(curve)
    assert a == pytest.approx(101.4, abs=0.5) and c == pytest.approx(0.4525, abs=0.005)
    ctx = {"running": 430.0, "queued": 594.0, "running_cap": 2048.0, "throughput": 1400.0, "itl_ms": 295.7, "curve": curve}
    est = findings.estimate("kv_capacity", 2.0, "", ctx)
    assert est.throughput_x == pytest.approx((860 / (a + c * 860)) / (430 / (a + c * 430)), abs=1e-3)
    assert 1.1 < est.throughput_x < 1.3
    assert "step ~101 ms + 0.453 ms x batch, least squares over 3 points (batch 1-430)" in est.arithmetic
    assert "~491 ms at 860" in est.arithmetic and est.model and not est.upper_bound
    assert est.range_x is not None and est.range_x[0] <= est.throughput_x <= est.range_x[1]
    assert findings.step_time_model([(430.0, 295.9)]) is None  # one batch size: no model, the upper bound is said instead
