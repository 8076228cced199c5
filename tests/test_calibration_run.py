"""A calibration on this host is what the next run on that GPU model judges against, and the report names it;
a simulated run (and so `runbook test`) reads one only where a file is named."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_runbook import calibration
from gpu_runbook.cli import main
from gpu_runbook.session import target_for
from gpu_runbook.sim.host import SimulatedHost

SCENARIO = "healthy-h200-nvlink"  # 8x "NVIDIA H200" at a 700 W limit


def h200_calibration(draws: tuple[float, float, float] = (455.0, 470.0, 610.0)) -> calibration.Calibration:
    loads = [calibration.LoadPoint(kind="copy", flops_per_byte=0.0, draw_w=draws[0]),
             calibration.LoadPoint(kind="decode-gemm", dtype="bf16", batch=1, flops_per_byte=1.0, draw_w=draws[1]),
             calibration.LoadPoint(kind="decode-gemm", dtype="bf16", batch=64, flops_per_byte=64.0, draw_w=draws[2])]
    return calibration.Calibration(gpu_name="NVIDIA H200", driver_version="590.48.01", power_limit_w=700.0, host="calibrated-box",
                                   measured_at="2026-12-04T19:00:00Z", loads=loads)  # fmt: skip


def quick_run(tmp_path: Path, *extra: str) -> tuple[dict, str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    argv = ["run", "power-starvation", "--simulate", SCENARIO, "--depth", "quick", "--no-tui", "-q",
            "--json", str(out / "r.json"), "--report", str(out / "r.md"), *extra]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "r.json").read_text())
    ref = next(ev for h in results["hypotheses"] for ev in h["evidence"] if ev["probe"] == "gpu.reference")
    return ref, (out / "r.md").read_text()


def test_a_named_calibration_is_the_yardstick_and_the_report_names_it(tmp_path):
    path = calibration.save(h200_calibration(), tmp_path / "cal")
    ref, report = quick_run(tmp_path, "--calibration", str(path))
    assert ref["values"]["reference_kind"] == "calibration"
    assert ref["values"]["draw_curve"] == [[0.0, 455.0], [1.0, 470.0], [64.0, 610.0]]
    assert "runbook calibrate: NVIDIA H200" in report and "calibrated-box" in report


def test_a_simulated_run_ignores_the_users_calibrations(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    calibration.save(h200_calibration())
    assert any(calibration.default_dir().glob("*.json"))
    ref, _ = quick_run(tmp_path)
    assert ref["values"]["reference_kind"] == "measured curve" and ref["values"]["calibration_note"] is None
    # `runbook test` runs its scenarios on SimulatedHost.target(): no calibration either
    with SimulatedHost.start(SCENARIO) as host:
        assert host.target().calibration is None


def test_a_real_host_looks_in_the_users_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    with target_for("http://127.0.0.1:9", None, None, server_kind="sglang") as (target, _nvml, _host):
        assert target.calibration == str(tmp_path / "config" / "gpu-runbook" / "calibration")
    with target_for("http://127.0.0.1:9", None, None, server_kind="sglang", calibration="/elsewhere/cal.json") as (target, _nvml, _host):
        assert target.calibration == "/elsewhere/cal.json"


def test_a_named_calibration_that_is_missing_or_broken_is_a_usage_error(tmp_path, capsys):
    argv = ["run", "power-starvation", "--simulate", SCENARIO, "--no-tui", "--json", str(tmp_path / "r.json")]
    assert main([*argv, "--calibration", str(tmp_path / "nope.json")]) == 2
    assert "--calibration" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 1, "gpu_name": "NVIDIA H200", "measured_at": "2026-12-04", "loads": [{"kind": "copy"}]}))
    assert main([*argv, "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "loads.0" in err and not (tmp_path / "r.json").exists()


def test_a_calibration_that_does_not_span_decode_batches_is_not_the_yardstick(tmp_path):
    """`--batches 1` on an H200 would read its batch-1 draw at every batch above it: the table's curve instead, said why."""
    cal = h200_calibration()
    cal.loads = [p for p in cal.loads if p.batch != 64]
    path = calibration.save(cal, tmp_path / "cal")
    ref, _ = quick_run(tmp_path, "--calibration", str(path))
    assert ref["values"]["reference_kind"] == "measured curve"
    assert "not used: it holds 1-1 FLOPs a byte" in ref["values"]["calibration_note"]
