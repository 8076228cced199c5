"""Results JSON round trip, and the Markdown report rendered from a fixed results file."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from gpu_runbook import report
from gpu_runbook.loader import load
from gpu_runbook.target import Target
from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.model import Verdict
from gpu_runbook.results import Results
from gpu_runbook.runner import Runner

DATA = Path(__file__).parent / "data"
FIXED = DATA / "results-fixed.json"

CONTRACT_FIELDS = {"schema_version", "runbook", "started_at", "finished_at", "target", "params", "hypotheses", "probes"}
HYPOTHESIS_FIELDS = {"id", "parent", "title", "verdict", "reason", "severity", "evidence", "next_steps"}
EVIDENCE_FIELDS = {"alias", "probe", "status", "summary", "values", "blocks"}


def test_fresh_run_round_trips_through_json(registry, tmp_path):
    loaded = load(DATA / "fixed-example.yaml", registry)
    results = asyncio.run(Runner(loaded, registry, Target(api_key="sk-secret-key")).run())
    path = results.write_json(tmp_path / "r.json")
    raw = json.loads(path.read_text())
    assert CONTRACT_FIELDS <= set(raw)
    assert raw["schema_version"] == "2"  # 2: runbook_source, runbook_sha256, record_all, rejudged_from
    assert [h["id"] for h in raw["hypotheses"]] == ["gpus-underfed", "power-limit-capped", "kv-cache-wall", "deeper", "broken"]
    assert [h["parent"] for h in raw["hypotheses"]] == [None, "gpus-underfed", "gpus-underfed", "kv-cache-wall", "gpus-underfed"]
    for h in raw["hypotheses"]:
        assert HYPOTHESIS_FIELDS <= set(h)
        for ev in h["evidence"]:
            assert EVIDENCE_FIELDS <= set(ev)
    assert {p["probe"] for p in raw["probes"]} == {"test.value", "test.fail"}
    assert "sk-secret-key" not in path.read_text()
    again = Results.read_json(path)
    assert again.model_dump() == results.model_dump()
    assert report.render(again) == report.render(results)


def test_report_from_fixed_results_matches_the_reviewed_copy():
    rendered = report.render(Results.read_json(FIXED))
    assert rendered == (DATA / "report-fixed.md").read_text()


def test_report_leads_with_findings_by_severity():
    text = report.render(Results.read_json(FIXED))
    lines = text.splitlines()
    assert lines[0] == "# GPUs underfed (fixed example): findings"
    assert text.index("## TL;DR") < text.index("## Findings") < text.index("## What to do") < text.index("## Details")
    tldr = text[text.index("## TL;DR") : text.index("## Findings")]
    # results written before headlines and follows: the symptom is the confirmed root, the cause its confirmed child
    # without a headline, the title alone: a rule's field names and unitless values are no headline
    assert "- **Symptom:** Busy GPUs draw well below their board's maximum power (`gpus-underfed`)." in tldr
    # and what ranked them (issue 33): a file from before `ranked_by` has no profile, so the configuration did
    assert "- **Root causes:** `kv-cache-wall`; ranked by the configuration (severity, then the runbook's order); no decode profile was taken." in tldr
    assert "- **Do first:** (`kv-cache-wall`) Use an FP8 KV cache (`--kv-cache-dtype fp8_e4m3`)." in tldr
    assert "- **Not measured:** `test.fail` (failed)." in tldr
    found = text[text.index("## Findings") : text.index("## What to do")]
    assert "- ● **The KV cache caps the batch** (`kv-cache-wall`, warning)" in found
    assert "gpus-underfed" not in found  # the symptom is not listed again as a finding
    # refuted hypotheses are folded away, without a severity
    folded = text[text.index("<details><summary>Refuted, skipped") :]
    assert "- ○ **refuted** `power-limit-capped`: The enforced limit is below the board maximum. Refuted by `lim.enforced_w >= lim.max_w` with `lim.enforced_w` = 600, `lim.max_w` = 600." in folded
    assert "refuted (warning)" not in text and "refuted** (warning" not in text
    assert "- ? **inconclusive** `deeper`" in folded
    assert "*power*: GPU0 235 of 600 W (39.2%); GPU1 240 of 600 W (40%)" in text
    assert "<code>broken</code>: <b>error</b> (info)" in text and "test.fail failed: RuntimeError: connection refused" in text


def test_report_command_rerenders_and_rejects_bad_files(tmp_path):
    cli = [sys.executable, "-m", "gpu_runbook.cli", "report"]
    ok = subprocess.run(cli + [str(FIXED), "--out", str(tmp_path / "out.md")], capture_output=True, text=True)
    assert ok.returncode == 0
    assert (tmp_path / "out.md").read_text() == (DATA / "report-fixed.md").read_text()
    (tmp_path / "bad.json").write_text('{"runbook": "x"}')
    bad = subprocess.run(cli + [str(tmp_path / "bad.json")], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "not a runbook results file: started_at: Field required" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_skipped_node_in_the_folded_list_is_one_list_item_not_two():
    """The skipped mark is '-': unescaped, "- - **skipped**" would be an empty nested bullet."""
    results = Results.read_json(FIXED)
    deeper = results.by_id("deeper")
    results.hypotheses[results.hypotheses.index(deeper)] = deeper.model_copy(update={"verdict": Verdict.skipped, "reason": "not explored"})
    text = report.render(results)
    assert "- \\- **skipped** `deeper`" in text
    assert "- - **skipped**" not in text


def test_what_could_not_be_measured_is_in_the_summary(registry, tmp_path):
    """A run with no GPU and no server says so up front, with each probe's reason and the --simulate hint."""
    results = Results.read_json(FIXED)
    assert [c.probe for c in results.unmeasured()] == ["test.fail"]
    assert not results.no_gpu_seen()
    nvml_missing = "NVMLError_LibraryNotFound: NVML Shared Library Not Found. libnvidia-ml.so.1 could not be loaded"
    calls = results.probes + [p.model_copy(update={"probe": "gpu.sample", "status": ProbeStatus.unavailable, "reason": nvml_missing}) for p in results.probes[:1]]
    no_gpu = results.model_copy(update={"probes": calls})
    assert no_gpu.no_gpu_seen()
    text = report.render(no_gpu)
    summary = text[text.index("## TL;DR") : text.index("## Findings")]
    assert "- **Not measured:** `test.fail` (failed), `gpu.sample` (unavailable)." in summary
    assert "--simulate seed-rtx-pro-6000-tp8" in summary
    assert f"`gpu.sample` unavailable ({nvml_missing}) in 0.5 s" in text  # the reason in full, in the probe calls
    simulated = no_gpu.model_copy(update={"target": {**no_gpu.target, "simulated": True}})
    assert not simulated.no_gpu_seen()


def test_a_matrix_of_two_gpu_groups_reads_as_one_sentence():
    from gpu_runbook.evidence import Table
    from gpu_runbook.report import matrix_sentence

    cols = ["", "GPU0", "GPU1", "GPU2", "GPU3"]
    rows = [["GPU0", "X", "NODE", "SYS", "SYS"], ["GPU1", "NODE", "X", "SYS", "SYS"],
            ["GPU2", "SYS", "SYS", "X", "NODE"], ["GPU3", "SYS", "SYS", "NODE", "X"]]  # fmt: skip
    assert matrix_sentence(Table(title="PCIe", columns=cols, rows=rows)) == "*PCIe*: `NODE` within GPU0-1 (2x) and within GPU2-3 (2x), `SYS` across them."
    rows[0][3] = "PHB"  # three values: left as a table
    assert matrix_sentence(Table(title="PCIe", columns=cols, rows=rows)) is None
