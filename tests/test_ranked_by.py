"""Issue 33, item 1: the ranking of root causes says what it used. Where the server was launched with its profiler,
the decode profile's measured shares of the step order the causes it costed (`ranked_by: profile`); where no profile
was taken, the configuration does (severity, then the runbook's order: `ranked_by: configuration`), and the reason
says why no profile ranked them. The JSON, the Markdown report's summary and the closing summary all say it.

Two real runs on the simulated host: the SGLang seed (launched with its profiler: sglang.profile measures the
step) and the vLLM seed twin (vLLM 0.34.0 launched without `--profiler-config`: vllm.profile is unavailable).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_runbook import findings, progress, report as report_md
from gpu_runbook.cli import main
from gpu_runbook.results import Results

SEED_SMALL = Path(__file__).parent / "data" / "scenarios" / "seed-kv-80k.yaml"
FAST = ["sample_seconds=3", "warmup_seconds=1", "steady_seconds=60", "load_output_len=32", "profile_wait_seconds=30"]


def run(out: Path, scenario: str, *settings: str) -> tuple[Results, str]:
    argv = ["run", "power-starvation", "--simulate", scenario, "--no-tui", "--json", str(out / "r.json"), "--report", str(out / "r.md")]
    for item in settings:
        argv += ["--set", item]
    assert main(argv) == 0
    return Results.model_validate(json.loads((out / "r.json").read_text())), (out / "r.md").read_text()


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> tuple[Results, str]:
    # the runbook's own seed test settings (tests/test_report_seed.py)
    return run(tmp_path_factory.mktemp("profiled"), str(SEED_SMALL), *FAST, "load_concurrency=1920", "load_input_len=32")


@pytest.fixture(scope="module")
def unprofiled(tmp_path_factory) -> tuple[Results, str]:
    # the vLLM seed twin at the SGLang main command's load: the KV wall, no profiler
    return run(tmp_path_factory.mktemp("unprofiled"), "seed-rtx-pro-6000-tp8-vllm", *FAST, "load_concurrency=2048", "load_input_len=256")


def summary_line(report: str) -> str:
    return next(line for line in report.splitlines() if line.startswith("- **Root causes:**"))


def test_a_profiled_run_ranks_by_the_measured_shares_and_says_so(profiled: tuple[Results, str]) -> None:
    r, report = profiled
    roots = findings.findings(r)
    costed = [f.result.cost for f in roots if f.result.cost is not None]
    assert costed, [f.id for f in roots]  # the profile measured a share of the step for some root cause
    assert costed == sorted(costed, reverse=True)  # and those rank by it
    assert r.ranked_by == "profile" and "sglang.profile" in r.ranked_by_reason, r.ranked_by_reason
    assert (r.ranked_by, r.ranked_by_reason) == findings.ranking_basis(r)
    assert "ranked by the measured decode profile (sglang.profile)" in summary_line(report)
    closing = progress.summary(r, None, None, colour=False)
    assert "ranked by the measured decode profile" in closing


def test_an_unprofiled_run_ranks_by_the_configuration_and_says_why(unprofiled: tuple[Results, str]) -> None:
    r, report = unprofiled
    roots = findings.findings(r)
    assert roots and all(f.result.cost is None for f in roots)
    assert r.ranked_by == "configuration", r.ranked_by
    # the reason is the profile probe's own: this vLLM was not launched with its profiler
    assert "no decode profile" in r.ranked_by_reason and "not launched with its profiler" in r.ranked_by_reason, r.ranked_by_reason
    line = summary_line(report)
    assert "ranked by the configuration (severity, then the runbook's order)" in line and "not launched with its profiler" in line, line
    assert "SGLang" not in line  # one vocabulary: the reason is in vLLM's words
    closing = progress.summary(r, None, None, colour=False)
    assert "most severe first (ranked by the configuration: no decode profile" in closing


def test_results_from_before_the_field_still_read_and_render(unprofiled: tuple[Results, str]) -> None:
    r, report = unprofiled
    old = json.loads(r.model_dump_json())
    del old["ranked_by"], old["ranked_by_reason"]
    again = Results.model_validate(old)
    assert again.ranked_by is None  # nothing invented for a file that did not say it
    assert summary_line(report) in report_md.render(again)  # the report works it out from the results
