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


def test_the_draw_curve_with_this_runs_point_on_it():
    """gpu.reference's curve as a line, the run's draw as a bar at the run's intensity (2 x 128 rows / 2 bytes = 128)."""
    curve = [[0.0, 488.0], [1.0, 517.0], [8.0, 546.0], [32.0, 650.0], [64.0, 695.0], [512.0, 692.0]]
    ref = EvidenceRecord(alias="ref", probe="gpu.reference", status=ProbeStatus.ok,
                         values={"draw_curve": curve, "reference_kind": "measured curve"})
    power = EvidenceRecord(alias="power", probe="gpu.sample", status=ProbeStatus.ok, values={"power_draw_w": {"mean": 500.0}})
    metrics = EvidenceRecord(alias="metrics", probe="vllm.metrics", status=ProbeStatus.ok, values={"running_per_dp": {"p50": 128.0}})
    model = EvidenceRecord(alias="model", probe="model.config", status=ProbeStatus.ok,
                           values={"gemm_rows_per_request": 1.0, "weight_bytes_per_param": 2.0})
    chart = report.draw_curve_chart(_with([ref, power, metrics, model]))
    text = "\n".join(chart)
    assert "measured curve" in text and '"128 (this run)"' in text
    xs = text.split("x-axis [")[1].split("]")[0]
    assert xs.split(", ") == ['"0"', '"1"', '"8"', '"32"', '"64"', '"128 (this run)"', '"512"']
    bar = next(line for line in chart if line.strip().startswith("bar"))
    assert "500" in bar and bar.count("0") >= 6  # the run's draw at its own intensity, nothing elsewhere
    line = next(line for line in chart if line.strip().startswith("line"))
    assert line.strip() == "line [488, 517, 546, 650, 695, 695, 692]"  # read between 64 and 512 at 128: 694.6
    # without the run's shape, the curve alone; without a curve (a single figure), no chart
    assert '"128 (this run)"' not in "\n".join(report.draw_curve_chart(_with([ref, power])))
    single = ref.model_copy(update={"values": {"draw_curve": [[0.0, 367.0]], "reference_kind": "single figure"}})
    assert report.draw_curve_chart(_with([single, power, metrics, model])) == []



def test_a_draw_curve_of_the_wrong_shape_gives_no_chart_not_an_error():
    """A results file is data: a hand-edited curve of strings or triples is no chart, and the report still renders."""
    for curve in ([["a", "b"], ["c", "d"]], [[1, 2, 3], [4, 5, 6]], [[0, 488.0], None]):
        ref = EvidenceRecord(alias="ref", probe="gpu.reference", status=ProbeStatus.ok, values={"draw_curve": curve})
        power = EvidenceRecord(alias="power", probe="gpu.sample", status=ProbeStatus.ok, values={"power_draw_w": 500.0})
        assert report.draw_curve_chart(_with([ref, power])) == []
        assert report.render(_with([ref, power]))
