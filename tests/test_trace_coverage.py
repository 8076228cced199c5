"""Coverage and honesty: every `runbook trace` result (text and JSON), every comparison side and the profile
probe's values and summary say how much kernel time fell into a bucket and which kernels did not."""

from __future__ import annotations

import json

import pytest

from gpu_runbook.cli import main
from gpu_runbook.trace.analysis import TOP_N, analyze, analyze_rank
from gpu_runbook.trace.coverage import coverage, coverage_text
from gpu_runbook.trace.rules import classifier
from tests.trace_helpers import kernel, span, write_trace

# one decode step of 200 µs: a known MoE GEMM, a vendor kernel no rule knows, a PyTorch elementwise kernel
# that a rule files under `other` on purpose (known, so covered), an unknown kernel with a newline and an OSC 52
HOSTILE = "evil_kernel\n  rank 9: 1 decode step(s) \x1b]52;c;aGk=\x07"
EVENTS = [
    span("step[DECODE bs=8]", 0.0, 200.0),
    kernel("fused_moe_kernel", 0.0, 80.0),
    kernel("vendorx_opaque_k17", 80.0, 60.0),
    kernel("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 140.0, 40.0),
    kernel(HOSTILE, 180.0, 20.0),
]


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["trace", *argv])
    return rc, capsys.readouterr().out


def test_every_json_result_has_its_coverage_and_top_unclassified_kernels(tmp_path, capsys):
    p = write_trace(tmp_path / "a.json.gz", EVENTS)
    rc, out = _run(capsys, "--json", str(p))
    t = json.loads(out)["traces"][0]
    assert rc == 0 and t["ok"]
    assert t["coverage"] == pytest.approx(1 - 80 / 200)  # the Tensile GEMM and the unknown kernel: 80 of 200 µs
    assert t["coverage"] == pytest.approx(1 - t["unclassified_share"])
    names = [r["name"] for r in t["top_unclassified"]]
    assert names == ["vendorx_opaque_k17", HOSTILE]  # not the elementwise kernel
    top = t["top_unclassified"][0]
    assert top["kernel_share"] == pytest.approx(60 / 200) and top["share"] == pytest.approx(60 / 200) and top["ms_per_step"] == 0.06
    assert t["unclassified_unlisted"] == 0.0


def test_the_text_says_the_coverage_and_a_kernel_name_cannot_fake_a_line(tmp_path, capsys):
    p = write_trace(tmp_path / "a.json.gz", EVENTS)
    rc, out = _run(capsys, str(p))
    assert rc == 0
    assert "coverage 60.0% of kernel time in a bucket; unclassified: vendorx_opaque_k17" in out
    assert "evil_kernel   rank 9: 1 decode step(s)  10.0%" in out  # folded onto the coverage line
    assert "\x1b" not in out and "\x07" not in out
    assert not any(line.lstrip().startswith("rank 9") for line in out.splitlines())
    assert sum(1 for line in out.splitlines() if line.startswith("  rank ")) == 1


def test_a_fully_covered_capture_says_so(tmp_path, capsys):
    p = write_trace(tmp_path / "a.json.gz", [span("step[DECODE bs=8]", 0.0, 100.0), kernel("fused_moe_kernel", 0.0, 100.0)])
    rc, out = _run(capsys, str(p))
    assert rc == 0 and "coverage 100.0% of kernel time in a bucket (every kernel matched a rule)" in out
    rc, out = _run(capsys, "--json", str(p))
    t = json.loads(out)["traces"][0]
    assert t["coverage"] == 1.0 and t["top_unclassified"] == []


def test_unclassified_time_outside_the_top_kernels_is_counted_not_lost(tmp_path):
    """The summary names only TOP_N kernels: many small unknown kernels below them still count against coverage."""
    events = [span("step[DECODE bs=8]", 0.0, 1000.0), kernel("fused_moe_kernel", 0.0, 500.0)]
    events += [kernel(f"mystery_{i}", 500.0 + i * 20, 20.0) for i in range(25)]
    s = analyze_rank(write_trace(tmp_path / "a.json.gz", events), classifier()).summary()
    c = coverage(s, classifier())
    assert c["coverage"] == pytest.approx(0.5)
    assert len(c["top_unclassified"]) == 5 and len(s["top"]) == TOP_N
    assert c["unclassified_unlisted"] == pytest.approx(0.5 - 9 * 0.02)  # 9 of the 25 are among the top 10
    assert "(+32.0% in kernels not listed)" in coverage_text(c)


def test_a_user_rule_that_files_a_kernel_under_other_covers_it(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nrules:\n  - bucket: other\n    prefix: [vendorx_]\n")
    s = analyze_rank(write_trace(tmp_path / "a.json.gz", EVENTS), classifier([rules])).summary()
    c = coverage(s, classifier([rules]))
    assert [r["name"] for r in c["top_unclassified"]] == [HOSTILE] and c["coverage"] == pytest.approx(0.9)


def test_over_ranks_coverage_is_the_worst_ranks(tmp_path):
    good = [span("step[DECODE bs=8]", 0.0, 100.0), kernel("fused_moe_kernel", 0.0, 100.0)]
    paths = [write_trace(tmp_path / "p-TP-0.trace.json.gz", good, rank=0), write_trace(tmp_path / "p-TP-1.trace.json.gz", EVENTS, rank=1)]
    s = analyze(paths, classifier()).summary()
    c = coverage(s, classifier())
    assert c["coverage"] == pytest.approx(0.6) and c["top_unclassified"][0]["name"].startswith("vendorx_")


def test_the_profile_probe_values_and_summary_carry_the_coverage(tmp_path):
    """sglang.profile builds its values from Profile.summary(): coverage and top_unclassified are there, declared,
    and its summary line says the coverage and the top unclassified kernel on one line."""
    from gpu_runbook.probes.server.profile import profile_values as _values, summary as _summary
    from gpu_runbook.probes.server.profile_values import ProfileValues
    from gpu_runbook.values import contract_errors

    s = analyze([write_trace(tmp_path / "p-TP-0.trace.json.gz", EVENTS)], classifier()).summary()
    values = _values(s)
    c = coverage(s, classifier())
    values.update(coverage=c["coverage"], top_unclassified=c["top_unclassified"])
    assert contract_errors(ProfileValues, values, complete=False) == []
    line = _summary({**values, "roofline_ratio": None})
    assert "; buckets cover 60% of kernel time (top unclassified: vendorx_opaque_k17 30%)" in line
    assert "\n" not in line
