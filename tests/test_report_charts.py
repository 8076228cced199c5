"""Charts in the report are Mermaid xychart-beta blocks (GitHub renders them), drawn from the evidence."""

from __future__ import annotations

from pathlib import Path

from gpu_runbook import report
from gpu_runbook.evidence import Bars, ProbeStatus, Series
from gpu_runbook.results import EvidenceRecord, Results

FIXED = Path(__file__).parent / "data" / "results-fixed.json"


def _with(evidence: list[EvidenceRecord]) -> Results:
    results = Results.read_json(FIXED)
    root = results.hypotheses[0]
    results.hypotheses[0] = root.model_copy(update={"evidence": evidence})
    return results


def test_power_per_gpu_against_its_limit_and_the_window_in_shares_of_range():
    power = EvidenceRecord(alias="power", probe="gpu.sample", status=ProbeStatus.ok, values={"power_limit_enforced_w": 600.0}, blocks=[
        Bars(title="Power draw vs enforced limit", unit="W", bars=[("GPU 0", 236.0, 600.0), ("GPU 1", 235.0, 600.0)]),
        Series(title="GPU 0 power", unit="W", points=[(0.0, 236.0), (1.0, 236.0)]),
        Series(title="GPU 1 power", unit="W", points=[(0.0, 234.0), (1.0, 234.0)]),
        Series(title="GPU utilisation (mean over GPUs)", unit="%", points=[(0.0, 100.0), (1.0, 100.0)]),
    ])  # fmt: skip
    metrics = EvidenceRecord(alias="m", probe="sglang.metrics", status=ProbeStatus.ok, values={"running_cap": 2048},
                             blocks=[Series(title="KV token usage", points=[(0.0, 0.9997), (1.0, 0.9997)])])  # fmt: skip
    text = report.render(_with([power, metrics]))
    charts = text[text.index("## Charts") : text.index("## Details")]
    assert charts.count("```mermaid\nxychart-beta\n") == 2
    assert '    x-axis ["GPU 0", "GPU 1"]\n    y-axis "W" 0 --> 600\n    bar [236, 235]\n    line [600, 600]' in charts
    assert "line 1 power % of limit, line 2 utilization %, line 3 KV usage %" in charts
    assert "    line [39.2, 39.2]\n    line [100, 100]\n    line [100, 100]" in charts  # mean power 235 W of 600 W, util, KV
    # and the same series as sparklines in the details: on their natural scales, identical GPUs once
    assert "*GPU 0-1 (2x) power*" not in text  # 236 vs 234 W read differently: not collapsed
    assert "*GPU utilisation (mean over GPUs)*: `██` flat at 100%" in text
    assert "*KV token usage*: `██` flat at 100%" in text


def test_the_sweep_charts_mark_the_knee_and_the_kv_wall():
    levels = [
        {"concurrency": 1, "output_tokens_per_s": 9.3, "itl_p50_ms": 102.0, "token_usage_max": 0.002, "queue_mean": 0.0},
        {"concurrency": 64, "output_tokens_per_s": 526.0, "itl_p50_ms": 130.0, "token_usage_max": 0.15, "queue_mean": 0.0},
        {"concurrency": 512, "output_tokens_per_s": 1761.0, "itl_p50_ms": 296.0, "token_usage_max": 1.0, "queue_mean": 82.0},
        {"concurrency": 1024, "output_tokens_per_s": 1400.0, "itl_p50_ms": 296.0, "token_usage_max": 1.0, "queue_mean": 594.0},
    ]
    sweep = EvidenceRecord(alias="sweep", probe="sglang.sweep", status=ProbeStatus.ok,
                           values={"levels": levels, "plateau_concurrency": 512, "limit": "kv-cache"})  # fmt: skip
    text = report.render(_with([sweep]))
    assert '    x-axis ["1", "64", "512 (knee, KV wall)", "1024"]\n    y-axis "tok/s"\n    bar [9.3, 526, 1761, 1400]' in text
    assert '    title "ITL p50 vs concurrency"' in text and "    line [102, 130, 296, 296]" in text
