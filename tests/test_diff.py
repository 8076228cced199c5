"""`runbook diff` and `run --baseline`: the README's loop on the simulated host, noise, --fail-on, old results."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_runbook import diff
from gpu_runbook.loader import load
from gpu_runbook.rejudge import rejudge
from gpu_runbook.results import read_results

TESTS = Path(__file__).parent
DATA = TESTS / "data"
REPO = TESTS.parent
CLI = [sys.executable, "-m", "gpu_runbook.cli"]
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}, "PYTHONPATH": str(REPO)}
SHORT = ["--set", "sample_seconds=3", "--set", "warmup_seconds=2", "--set", "load_output_len=32", "--set", "profile_wait_seconds=30"]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, env=ENV, cwd=cwd, timeout=300)


# -- the noise test ------------------------------------------------------------------------------


def test_mann_whitney_on_identical_separated_and_overlapping_samples():
    rng = random.Random(7)
    noisy = [100 + rng.gauss(0, 5) for _ in range(30)]
    assert diff.mann_whitney_p(noisy, noisy) == 1.0
    assert diff.mann_whitney_p([1.0] * 5, [1.0] * 5) == 1.0
    assert 0.02 < diff.mann_whitney_p([1, 2, 3, 4], [5, 6, 7, 8]) < 0.04  # exact two-sided p is 0.029
    assert diff.mann_whitney_p([100 + rng.gauss(0, 5) for _ in range(30)], [120 + rng.gauss(0, 5) for _ in range(30)]) < 1e-6
    assert diff.mann_whitney_p(noisy, [v + rng.gauss(0, 5) for v in noisy]) > 0.05


def test_a_figure_within_noise_is_tilde_and_beyond_it_is_signed():
    rng = random.Random(3)
    base = [500 + rng.gauss(0, 20) for _ in range(20)]
    same = diff.compare_figure("x", "x", "", 500.0, 503.0, base, [500 + rng.gauss(0, 20) for _ in range(20)])
    assert same.change == "~" and not same.beyond_noise
    moved = diff.compare_figure("x", "x", "", 500.0, 600.0, base, [600 + rng.gauss(0, 20) for _ in range(20)])
    assert moved.change == "+20.0%" and moved.beyond_noise
    scalar = diff.compare_figure("t", "t", "ms", 100.0, 103.0, [], [])
    assert scalar.change == "~" and "one number a run" in scalar.test
    assert diff.compare_figure("t", "t", "ms", 100.0, 110.0, [], []).change == "+10.0%"


def test_a_significant_but_tiny_shift_is_still_noise():
    """Power samples a second apart drift together: 0.1 % between two runs of one box passes the rank test
    (CI saw p=0.037) and is still no change; 2 % with the same spread is one."""
    rng = random.Random(5)
    base = [180 + rng.gauss(0, 0.05) for _ in range(56)]
    tiny = diff.compare_figure("p", "p", "W", 180.0, 180.2, base, [180.2 + rng.gauss(0, 0.05) for _ in range(56)])
    assert diff.mann_whitney_p(base, [180.2 + rng.gauss(0, 0.05) for _ in range(56)]) < diff.ALPHA
    assert tiny.change == "~" and not tiny.beyond_noise
    real = diff.compare_figure("p", "p", "W", 180.0, 183.6, base, [183.6 + rng.gauss(0, 0.05) for _ in range(56)])
    assert real.change == "+2.0%" and real.beyond_noise


def test_fail_on_specs():
    assert diff.parse_fail_on("regressed") == ("regressed", None, None)
    assert diff.parse_fail_on("metric:output_tokens_per_s:-5%") == ("metric", "output_tokens_per_s", -5.0)
    for bad in ("metric:x:5", "metric:x:0%", "improved", "metric::-5%x"):
        with pytest.raises(ValueError, match="expected 'regressed' or 'metric:NAME:-5%'"):
            diff.parse_fail_on(bad)


# -- a run against itself, and old results -------------------------------------------------------


@pytest.mark.parametrize("name", ["results-v1.json", "results-fixed.json"])
def test_a_run_against_itself_reports_no_change_and_passes_fail_on(name, tmp_path):
    path = str(DATA / name)
    extra = ["--probes-dir", str(TESTS / "probe_files")]
    if name == "results-fixed.json":  # its runbook is a test file, not a bundled one
        (tmp_path / "runbooks").mkdir()
        (tmp_path / "runbooks" / "fixed-example.yaml").write_text((DATA / "fixed-example.yaml").read_text())
    done = cli("diff", path, path, "--fail-on", "regressed", "--fail-on", "metric:output_tokens_per_s:-5%", *extra, cwd=tmp_path)
    if name == "results-fixed.json":
        # no load in that run: the metric gate names a figure it does not have, which is a usage error
        assert done.returncode == 2 and "no figure 'output_tokens_per_s'" in done.stderr
        done = cli("diff", path, path, "--fail-on", "regressed", *extra, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "**No change**" in done.stdout
    assert "Traceback" not in done.stderr
    as_json = json.loads(cli("diff", path, path, "--json", "-", *extra, cwd=tmp_path).stdout)
    assert as_json["changed"] is False
    assert {t["kind"] for t in as_json["transitions"]} <= {"still present"}
    assert all(f["change"] in ("~", "n/a") for f in as_json["figures"])
    assert not any(row["differs"] for row in as_json["header"])


def test_rules_changed_is_told_from_host_changed(registry, tmp_path):
    """The same recorded run, judged by two runbooks: the 2x2 says the rule changed, not the host."""
    original = load(DATA / "fixed-example.yaml", registry)
    before = rejudge(read_results(DATA / "results-fixed.json"), original, registry)
    stricter = tmp_path / "fixed-example.yaml"
    stricter.write_text((DATA / "fixed-example.yaml").read_text().replace("default: 0.7", "default: 0.3"))
    after = rejudge(before, load(stricter, registry), registry)
    d = diff.diff(before, after, registry)
    root = next(t for t in d.transitions if t.id == "gpus-underfed")
    assert (root.kind, root.before, root.after) == ("became unmeasurable", "confirmed", "inconclusive")
    assert root.crossed == ["params.underfed_ratio"]
    child = next(t for t in d.transitions if t.id == "kv-cache-wall")
    assert (child.kind, child.after) == ("became unmeasurable", "skipped")  # left unexplored, not fixed: its parent is undecided
    row = next(r for r in d.rules if r.id == "gpus-underfed")
    assert row.reading == "rule changed"
    assert (row.old_on_before, row.old_on_after, row.new_on_before, row.new_on_after) == ("confirmed", "confirmed", "inconclusive", "inconclusive")
    # the re-judged run never gathered its children's evidence: the old rules cannot answer there, which is no host change
    below = next(r for r in d.rules if r.id == "power-limit-capped")
    assert (below.old_on_after, below.reading) == ("not recorded", "rule changed")
    runbook_row = next(h for h in d.header if h.key == "runbook")
    assert runbook_row.differs and runbook_row.role == "confounder"


# -- the README loop: running-cap-64, apply the step, running-cap-1024, diff ---------------------


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("loop")
    # the same box twice at once (each run mostly waits on its simulated host's modelled time); then the changed box
    runs = [subprocess.Popen(CLI + ["run", "power-starvation", "--simulate", "running-cap-64", *SHORT, "--no-tui", "--json", f"{name}.json",
                                    "--report", f"{name}.md"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=work)
            for name in ("before", "again")]  # fmt: skip
    for proc in runs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    second = cli(
        "run", "power-starvation", "--simulate", "running-cap-1024", *SHORT, "--no-tui", "--json", "after.json", "--report", "after.md",
        "--baseline", "before.json", "--fail-on", "regressed", cwd=work,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    (work / "baseline-stdout.txt").write_text(second.stdout)
    return work


def test_the_same_box_twice_is_noise_not_a_change(loop):
    """Two runs of one scenario: no verdict moves, and the figures the GPUs and the scheduler set are `~`
    (throughput and latency depend on how busy this machine's CPUs were, so they are not asserted)."""
    d = diff.Diff.model_validate_json(cli("diff", "before.json", "again.json", "--json", "-", cwd=loop).stdout)
    assert {t.kind for t in d.transitions} == {"still present"}
    figures = {f.name: f for f in d.figures}
    for name in ("gpu_util_pct", "power_draw_w", "power_to_limit", "running_reqs", "queued_reqs", "kv_usage"):
        assert figures[name].change == "~", (name, figures[name])
    assert not any(row.differs for row in d.header)


def test_run_with_baseline_prints_the_diff(loop):
    out = (loop / "baseline-stdout.txt").read_text()
    assert out.index("Verdicts:") < out.index("# Diff: before.json -> after.json")
    assert "### Fixed (1)" in out and "**running-requests-capped**" in out


def test_the_loop_diff_shows_the_header_the_fixed_finding_and_noise(loop):
    done = cli("diff", "before.json", "after.json", "--json", "-", cwd=loop)
    assert done.returncode == 0, done.stderr
    d = diff.Diff.model_validate_json(done.stdout)
    differing = {row.key: row for row in d.header if row.differs}
    assert list(differing) == ["server_arg:max_running_requests"]
    assert (differing["server_arg:max_running_requests"].before, differing["server_arg:max_running_requests"].after) == ("64", "1024")
    assert differing["server_arg:max_running_requests"].role == "change under test"
    fixed = [t for t in d.transitions if t.kind == "fixed"]
    assert [t.id for t in fixed] == ["running-requests-capped"]
    assert "metrics.queued.p50" in fixed[0].crossed
    assert not d.regressed()
    figures = {f.name: f for f in d.figures}
    assert figures["output_tokens_per_s"].beyond_noise and figures["output_tokens_per_s"].delta_pct > 50
    assert figures["running_reqs"].after > figures["running_reqs"].before
    assert d.rules_note.startswith("Both runs were judged by the same runbook")
    markdown = cli("diff", "before.json", "after.json", cwd=loop).stdout
    assert markdown.index("## Comparability") < markdown.index("## Verdicts") < markdown.index("## Key figures")
    # here every figure moved (64 -> 1024 running); a change within the noise prints `~` (two runs of one box)
    assert "| ~ |" in cli("diff", "before.json", "again.json", cwd=loop).stdout


def test_fail_on_gates_only_changes_beyond_noise(loop):
    assert cli("diff", "before.json", "after.json", "--fail-on", "metric:output_tokens_per_s:-5%", cwd=loop).returncode == 0
    rose = cli("diff", "before.json", "after.json", "--fail-on", "metric:running_reqs:+5%", cwd=loop)
    assert rose.returncode == 1 and "fail-on: running_reqs +" in rose.stderr
    backwards = cli("diff", "after.json", "before.json", "--fail-on", "regressed", cwd=loop)
    assert backwards.returncode == 1 and "fail-on: regressed: running-requests-capped" in backwards.stderr


def test_the_first_reports_estimated_gain_is_set_against_the_measured_change(loop):
    """The diff closes the loop: each step the first report put a number on, next to the throughput change
    the second run measured (from the same quoted throughput the estimate started from)."""
    from gpu_runbook.findings import context, ranked_steps
    from gpu_runbook.results import GainEstimate

    before, after = read_results(str(loop / "before.json")), read_results(str(loop / "after.json"))
    assert diff.estimate_checks(before, after) == []  # the README loop's cap step carries no estimate
    capped = next(h for h in before.hypotheses if h.id == "running-requests-capped")
    capped.steps[0].gain = GainEstimate(kind="kv_capacity", factor=2.0, throughput_x=1.8, potential_x=2.5, arithmetic="batch 64 -> 115")
    verdicts_after = {h.id: h.verdict.value for h in after.hypotheses}
    still = next(r.finding for r in ranked_steps(before) if verdicts_after.get(r.finding.id) == "confirmed")  # a cause both runs confirm
    still.steps[0].gain = GainEstimate(kind="step_share", factor=0.1, throughput_x=1.11, potential_x=1.11)
    checks = diff.estimate_checks(before, after)
    assert [c.finding for c in checks] == ["running-requests-capped", still.id]  # the step that was taken first
    taken, other = checks
    tb, ta = context(before)["throughput"], context(after)["throughput"]
    assert (taken.throughput_before, taken.throughput_after, taken.measured_x) == (tb, ta, round(ta / tb, 3))
    assert taken.finding_after == "refuted" and taken.estimated_x == 1.8 and taken.arithmetic == "batch 64 -> 115"
    assert taken.reading.startswith("measured x") and "against an estimated x1.8" in taken.reading
    assert f"{still.id} is still confirmed, so this step was not taken" in other.reading
    after.load["config"]["concurrency"] = 1024
    moved = diff.estimate_checks(before, after)[0]
    assert "at a different load (256 -> 1,024 concurrent requests)" in moved.reading and "up to x2.5" in moved.reading
    d = diff.Diff(estimates=checks)
    text = diff.render_markdown(d)
    assert "## Estimated gains against the measured change" in text
    assert "- **running-requests-capped** (refuted after): Restart the server with a higher cap" in text
    assert "  - estimated: x1.8, up to x2.5 (batch 64 -> 115)" in text


def test_change_names_what_is_under_test(loop):
    d = diff.Diff.model_validate_json(cli("diff", "before.json", "after.json", "--json", "-", "--change", "server_version", cwd=loop).stdout)
    row = next(r for r in d.header if r.differs)
    assert row.role == "confounder"  # the cap changed, but the operator said the upgrade was under test


def test_diff_rejects_bad_input_with_a_clear_message(tmp_path):
    (tmp_path / "bad.json").write_text("not json")
    done = cli("diff", "bad.json", str(DATA / "results-v1.json"), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("bad.json: not a runbook results file") and "Traceback" not in done.stderr
    bad_gate = cli("diff", str(DATA / "results-v1.json"), str(DATA / "results-v1.json"), "--fail-on", "worse", cwd=tmp_path)
    assert bad_gate.returncode == 2 and "--fail-on worse" in bad_gate.stderr
    no_baseline = cli("run", "power-starvation", "--fail-on", "regressed", "--no-tui", cwd=tmp_path)
    assert no_baseline.returncode == 2 and "needs --baseline" in no_baseline.stderr


def test_the_readme_loop_is_the_one_tested_here():
    """The documented loop (docs/results.md) runs these commands (with the default windows; the tests shorten them)."""
    page = (REPO / "docs" / "results.md").read_text()
    section = page[page.index("## Did the fix work?") :]
    block = section[section.index("```bash\n") + 8 : section.index("```", section.index("```bash\n") + 8)]
    lines = block.strip().splitlines()
    assert lines[0] == "runbook run power-starvation --simulate running-cap-64 --no-tui --json before.json"
    assert lines[1] == "runbook run power-starvation --simulate running-cap-1024 --no-tui --json after.json --baseline before.json"
    assert lines[2].startswith("runbook diff before.json after.json --fail-on regressed")


def test_a_decode_step_breakdown_in_both_runs_is_compared_per_bucket(registry, tmp_path):
    """A probe's bucket mapping (as a profile probe reports the decode step) becomes one figure per bucket."""
    text = """
name: breakdown
title: A recorded breakdown
params: { moe_us: { type: float, default: 900 } }
hypotheses:
  - id: step
    title: Where the decode step goes
    probes: { prof: { probe: test.value, with: { values: { bucket_us_per_step: { moe: "${moe_us}", attention: 300.0 } } } } }
    confirm: prof.bucket_us_per_step.moe > 800.0
    refute: prof.bucket_us_per_step.moe <= 800.0
"""
    from gpu_runbook.target import Target
    from gpu_runbook.runner import Runner, resolve_params
    import asyncio

    (tmp_path / "b.yaml").write_text(text)
    loaded = load(tmp_path / "b.yaml", registry)
    runs = [asyncio.run(Runner(loaded, registry, Target(), resolve_params(loaded, {"moe_us": v})).run()) for v in ("900", "600")]
    d = diff.diff(runs[0], runs[1], registry)
    figures = {f.name: f for f in d.figures}
    assert figures["test.value:bucket_us_per_step:moe"].change == "-33.3%"
    assert figures["test.value:bucket_us_per_step:attention"].change == "~"
    assert [t.id for t in d.transitions if t.kind == "fixed"] == ["step"]
    assert d.transitions[0].crossed == ["prof.bucket_us_per_step.moe"]


@pytest.mark.parametrize(("measured", "says"), [
    (1.06, "against an estimated x2, 6% of the estimated gain; short of the estimate"),  # a gain, not a factor, is what was estimated
    (0.5, "throughput fell, against an estimated x2"),
    (1.02, "no gain beyond noise (+-5%), against an estimated x2"),
    (2.0, "against an estimated x2, 100% of the estimated gain"),
    (3.0, "more than even the potential x2.5: something else changed too"),
])  # fmt: skip
def test_the_estimate_reading_says_how_much_of_the_gain_came(measured, says):
    check = diff.EstimateCheck(finding="f", step="s", finding_after="refuted", estimated_x=2.0, potential_x=2.5,
                               throughput_before=1000.0, throughput_after=1000.0 * measured, measured_x=measured)  # fmt: skip
    reading = diff._estimate_reading(check, 64.0, 64.0)  # noqa: SLF001
    assert reading.startswith(f"measured x{measured:g} (1,000 tok/s -> ") and says in reading, reading
    if measured == 2.0:
        assert "short of" not in reading and "more than" not in reading
