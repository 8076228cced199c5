"""scripts/device-check: its dry mode here, and its checks fed outputs shaped like a real H200's.

The device script runs only where a GPU is lent, so what it concludes there must be settled here: each
check gets the evidence the real probes return (run against the simulator's fake NVML set to the figures
measured on an H200 SXM, shared/reference/nvml.md §5.x), a calibration file in the real format, a
results file the real model validates, and the `runbook trace --json` document of a trace laid out as
PyTorch's profiler writes one; and each must fail on what should fail.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpu_runbook.calibration import Calibration, LoadPoint, flops_per_byte, save
from gpu_runbook.cli import main as runbook_main
from gpu_runbook.model import Severity, Verdict
from gpu_runbook.results import EvidenceRecord, HypothesisResult, ProbeCallRecord, Results
from gpu_runbook.sim import fake_nvml

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "device-check"


def _load_script():
    loader = importlib.machinery.SourceFileLoader("device_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("device_check", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


dc = _load_script()
COPY, GEMM = dc.H200_COPY.get(), dc.H200_GEMM.get()


def probes(reading, *, gpm: bool = True, host=None) -> dict[str, dict]:
    """The real probes' evidence, as the driver records it, on one fake H200 in `reading`'s state."""
    module = fake_nvml.make_module(host or dc.fake_h200(reading))
    return dc.read_probes(module, [0], sample_s=0.3, interval_s=0.05, gpm_s=0.2 if gpm else None, inventory=True)


@pytest.fixture(scope="module")
def copy_ev():
    return probes(COPY)


@pytest.fixture(scope="module")
def gemm_ev():
    return probes(GEMM)


# ---- dry mode ---------------------------------------------------------------------------------------------


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_dry_says_each_check_is_skipped_for_want_of_a_gpu_and_exits_0():
    proc = _run("--dry")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"skipped {name}: no GPU" for name in dc.CHECKS]
    assert len(dc.CHECKS) == 7


@pytest.mark.skipif(dc.find_gpu() is None, reason="this machine has a GPU: the script would run its checks")
def test_without_a_gpu_it_runs_dry_by_itself():
    proc = _run()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"skipped {name}: no GPU" for name in dc.CHECKS]
    assert "no GPU" in proc.stderr


def test_only_names_checks_and_refuses_unknown_ones():
    proc = _run("--dry", "--only", "copy,trace")
    assert proc.stdout.splitlines() == ["skipped copy: no GPU", "skipped trace: no GPU"]
    assert _run("--dry", "--only", "cpoy").returncode == 2


def test_the_children_that_need_a_gpu_are_at_least_python():
    """They run only on the device, where a syntax error would cost a whole run."""
    for name in ("LOAD_CHILD", "LOAD_CHILD_STANDIN", "TRACE_CHILD"):
        compile(getattr(dc, name), name, "exec")
    assert 'record_function("step[DECODE bs=4]")' in dc.TRACE_CHILD and "torch.cuda.graph(" in dc.TRACE_CHILD


def test_the_source_hash_is_stable_and_follows_the_tree(tmp_path):
    """A stale project wheel on the device is told by this hash, so it must change with the sources only."""
    assert dc.source_hash() == dc.source_hash()
    for top in ("engine", "probes", "runbooks", "templates"):
        (tmp_path / top).mkdir()
    (tmp_path / "pyproject.toml").write_text("x")
    (tmp_path / "engine" / "a.py").write_text("1")
    before = dc.source_hash(tmp_path)
    (tmp_path / "engine" / "__pycache__").mkdir()
    (tmp_path / "engine" / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0")
    assert dc.source_hash(tmp_path) == before
    (tmp_path / "engine" / "a.py").write_text("2")
    assert dc.source_hash(tmp_path) != before


def test_rehearsal_drives_the_probes_through_both_loads(tmp_path):
    """The driver's plumbing (children, readiness, probes, $OUT) without a GPU: stand-in loads, fake NVML."""
    proc = _run("--rehearse", "--only", "inventory,copy,copy-gpm,gemm", "--sample", "0.3", env={"OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == ["ok"] * 4, lines
    assert lines[1].startswith("ok    copy: 488 W of 700 W (0.70), util 100 %, SM 1980 MHz, no clock event reason")
    gathered = json.loads((tmp_path / "device-check.json").read_text())
    assert gathered["lines"] == lines
    assert gathered["copy"]["sample"]["status"] == "ok" and gathered["copy"]["load"]["kind"] == "copy"
    assert gathered["gemm"]["load"]["kind"] == "gemm"


# ---- the probes' readings: inventory, copy, GPM, GEMM ------------------------------------------------------


def test_inventory_reads_the_gpu_and_its_limit(copy_ev):
    status, text = dc.check_inventory(copy_ev["inventory"])
    assert status == "ok", text
    assert text == "inventory: 1x NVIDIA H200, driver 580.159.04, CC 9.0, limit 700 W (max 700 W), max SM 1980 MHz"


def test_inventory_without_a_driver_fails():
    ev = probes(None, host=fake_nvml.no_driver_box())["inventory"]
    status, text = dc.check_inventory(ev)
    assert status == "FAIL" and "gpu.inventory unavailable" in text and "LibraryNotFound" in text


def test_copy_at_the_h200s_figures_passes(copy_ev):
    assert dc.check_copy(copy_ev["sample"], {"gbps": 4291.0}) == (
        "ok", "copy: 488 W of 700 W (0.70), util 100 %, SM 1980 MHz, no clock event reason; the copy moved 4,291 GB/s")


def test_a_copy_at_95_percent_of_the_limit_fails():
    status, text = dc.check_copy(probes(dataclasses.replace(COPY, power_w=665), gpm=False)["sample"])
    assert status == "FAIL" and "draw 0.95 of the limit, outside 0.50-0.85" in text


def test_a_copy_under_the_power_cap_fails():
    status, text = dc.check_copy(probes(dataclasses.replace(COPY, event_reasons=GEMM.event_reasons), gpm=False)["sample"])
    assert status == "FAIL" and "sw_power_cap in 100 % of samples" in text


def test_an_idle_gpu_is_no_copy():
    status, text = dc.check_copy(probes(dc.H200_IDLE.get(), gpm=False)["sample"])
    assert status == "FAIL" and "utilization below 90 %" in text and "outside" in text


def test_the_gemm_is_not_a_copy_and_the_copy_not_a_gemm(copy_ev, gemm_ev):
    assert dc.check_copy(gemm_ev["sample"])[0] == "FAIL"
    status, text = dc.check_gemm(copy_ev["sample"])
    assert status == "FAIL"
    assert "draw below 0.90 of the limit" in text and "sw_power_cap in only 0 %" in text and "SM clock not below 0.95" in text


def test_gpm_under_the_copy_passes(copy_ev):
    assert dc.check_copy_gpm(copy_ev["activity"]) == ("ok", "copy-gpm: DRAM bandwidth 89.3 %, SM util 99.7 %, tensor 0.0 % over 0.2 s")


def test_gpm_with_idle_dram_or_busy_tensor_pipes_fails():
    idle_dram = dataclasses.replace(COPY, gpm={**COPY.gpm, fake_nvml._real.NVML_GPM_METRIC_DRAM_BW_UTIL: 30.0})
    status, text = dc.check_copy_gpm(probes(idle_dram)["activity"])
    assert status == "FAIL" and "DRAM bandwidth not above 50 %" in text
    status, text = dc.check_copy_gpm(probes(GEMM)["activity"])  # tensor 90 %, DRAM 20 %: not a copy
    assert status == "FAIL" and "tensor activity above 10 %" in text


def test_gpm_where_not_supported_is_skipped_with_the_reason():
    host = dc.fake_h200(COPY)
    host.gpus[0].gpm_supported = False
    status, text = dc.check_copy_gpm(probes(COPY, host=host)["activity"])
    assert status == "skipped" and text.startswith("copy-gpm: GPM metrics are not available on NVIDIA H200")


def test_gemm_at_the_h200s_figures_passes(gemm_ev):
    assert dc.check_gemm(gemm_ev["sample"]) == (
        "ok", "gemm: 692 W of 700 W (0.99), util 100 %, SM 1440 MHz (0.73 of 1980), clock event reasons sw_power_cap 100 %")


def test_a_gemm_without_sw_power_cap_fails():
    status, text = dc.check_gemm(probes(dataclasses.replace(GEMM, event_reasons=0), gpm=False)["sample"])
    assert status == "FAIL" and "sw_power_cap in only 0 % of samples" in text


def test_a_gemm_below_the_limit_or_at_full_clock_fails():
    status, text = dc.check_gemm(probes(dataclasses.replace(GEMM, power_w=600), gpm=False)["sample"])
    assert status == "FAIL" and "draw below 0.90 of the limit" in text
    status, text = dc.check_gemm(probes(dataclasses.replace(GEMM, sm_clock_mhz=1980), gpm=False)["sample"])
    assert status == "FAIL" and "SM clock not below 0.95 of its maximum" in text


def test_a_failed_probe_fails_its_check():
    failed = {"status": "failed", "reason": "TimeoutError: ", "summary": "failed: TimeoutError: ", "values": {}}
    for check in (dc.check_copy, dc.check_gemm, dc.check_copy_gpm, dc.check_inventory):
        assert check(failed)[0] == "FAIL"
        assert check(None)[0] == "FAIL"


# ---- calibrate --------------------------------------------------------------------------------------------


def _calibration(tmp_path: Path, points: list[tuple[str, int | None, float]], limit: float = 700.0) -> Path:
    """A calibration as `runbook calibrate` writes one: (kind, batch, draw W) per load, bf16 GEMMs."""
    loads = [LoadPoint(kind=k, dtype=None if k == "copy" else "bf16", batch=b,
                       flops_per_byte=0.0 if k == "copy" else flops_per_byte(b or 8192, "bf16"), draw_w=w, seconds=3.0)
             for k, b, w in points]  # fmt: skip
    cal = Calibration(gpu_name="NVIDIA H200", driver_version="580.159.04", power_limit_w=limit, measured_at="2026-12-04T12:00:00Z",
                      gpu_index=0, library="torch 2.11.0+cu130", loads=loads)  # fmt: skip
    return save(cal, tmp_path / "cal.json")


H200_CURVE = [("copy", None, 488.0), ("decode-gemm", 1, 517.0), ("decode-gemm", 32, 650.0), ("decode-gemm", 256, 693.0)]


def test_a_calibration_shaped_like_the_h200s_reads_back(tmp_path):
    status, text = dc.check_calibration(_calibration(tmp_path, H200_CURVE))
    assert status == "ok", text
    assert text == ("calibrate: 4 loads read back (NVIDIA H200, limit 700 W): copy 488 W, 3 GEMMs, "
                    "693 W at 256 FLOP/B (decode-gemm bs=256 bf16)")  # fmt: skip


def test_a_calibration_missing_points_or_falling_fails(tmp_path):
    status, text = dc.check_calibration(_calibration(tmp_path, H200_CURVE[:2]))
    assert status == "FAIL" and "1 GEMM points, 2 or more expected" in text
    status, text = dc.check_calibration(_calibration(tmp_path, H200_CURVE[1:]))
    assert status == "FAIL" and "no copy point" in text
    status, text = dc.check_calibration(_calibration(tmp_path, [("copy", None, 488.0), ("decode-gemm", 1, 480.0), ("decode-gemm", 32, 470.0)]))
    assert status == "FAIL" and "the highest intensity draws less than the copy" in text
    status, text = dc.check_calibration(_calibration(tmp_path, [(k, b, w * 1000) for k, b, w in H200_CURVE]))
    assert status == "FAIL" and "not watts" in text


def test_calibrate_exiting_nonzero_or_an_unreadable_file_fails(tmp_path):
    status, text = dc.check_calibration(tmp_path / "none.json", rc=3, output="runbook calibrate: no GPU here, nothing measured\n")
    assert status == "FAIL" and text == "calibrate: runbook calibrate failed: no GPU or no PyTorch (exit 3): runbook calibrate: no GPU here, nothing measured"
    assert dc.check_calibration(tmp_path / "none.json", rc=2, output="invalid choice: 'calibrate'")[0] == "FAIL"
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 1, "gpu_name": "NVIDIA H200", "measured_at": "x", "loads": []}')
    status, text = dc.check_calibration(bad)
    assert status == "FAIL" and "does not read back" in text and "loads" in text


# ---- power-starvation beside the GPU ---------------------------------------------------------------------------


def _results(sample: dict, verdicts: dict[str, str] | None = None, failed_probe: str | None = None) -> dict:
    """A results file as `runbook run power-starvation --json` writes one, with the GEMM's real gpu.sample evidence."""
    v = {"gpus-underfed": "refuted", "clocks-held-down": "refuted", "power-limit-capped": "refuted", **(verdicts or {})}
    power = EvidenceRecord(alias="power", probe="gpu.sample", status=sample["status"], reason=sample.get("reason"),
                           summary=sample["summary"], values=sample["values"], under_load=True)  # fmt: skip
    hyps = [HypothesisResult(id="gpus-underfed", parent=None, title="underfed", verdict=Verdict(v["gpus-underfed"]), reason="",
                             severity=Severity.info, evidence=[power])]  # fmt: skip
    hyps += [HypothesisResult(id=k, parent="gpus-underfed", depth=1, title=k, verdict=Verdict(v[k]), reason="", severity=Severity.critical)
             for k in ("power-limit-capped", "clocks-held-down")]  # fmt: skip
    calls = [ProbeCallRecord(probe=p, status="ok") for p in ("gpu.inventory", "gpu.reference", "gpu.sample", "sglang.server", "sglang.profile")]
    calls.append(ProbeCallRecord(probe="gpu.dcgm", status="unavailable", reason="dcgm-exporter not reachable"))
    if failed_probe:
        calls.append(ProbeCallRecord(probe=failed_probe, status="failed", reason="ValueError: bad data"))
    res = Results(runbook="power-starvation", started_at=datetime(2026, 12, 4, tzinfo=timezone.utc), hypotheses=hyps, probes=calls)
    return json.loads(res.model_dump_json())


def test_power_starvation_beside_a_gpu_at_its_cap_passes(gemm_ev):
    status, text = dc.check_power_starvation(_results(gemm_ev["sample"]))
    assert status == "ok", text
    assert text == ("power-starvation: gpu.sample 692 W of 700 W, sw_power_cap 100 %; gpus-underfed refuted, clocks-held-down refuted, "
                    "power-limit-capped refuted; 6 probe calls, 0 failed")  # fmt: skip


def test_power_starvation_with_a_confirmed_symptom_or_a_failed_probe_fails(gemm_ev):
    status, text = dc.check_power_starvation(_results(gemm_ev["sample"], {"gpus-underfed": "confirmed"}))
    assert status == "FAIL" and "gpus-underfed confirmed" in text
    status, text = dc.check_power_starvation(_results(gemm_ev["sample"], {"clocks-held-down": "confirmed"}))
    assert status == "FAIL" and "clocks-held-down confirmed" in text
    status, text = dc.check_power_starvation(_results(gemm_ev["sample"], failed_probe="sglang.metrics"))
    assert status == "FAIL" and "failed: sglang.metrics: ValueError: bad data" in text


def test_power_starvation_that_never_read_the_gpu_fails():
    """Nothing confirmed proves nothing when the GPU probes read nothing: the check wants gpu.sample ok."""
    unread = probes(None, host=fake_nvml.no_driver_box(), gpm=False)["sample"]
    status, text = dc.check_power_starvation(_results(unread, {"gpus-underfed": "inconclusive", "clocks-held-down": "inconclusive"}))
    assert status == "FAIL" and "gpu.sample did not read the GPU (unavailable" in text
    status, text = dc.check_power_starvation(None, rc=2, output="runbook: error: something\n")
    assert status == "FAIL" and text == "power-starvation: no results file (exit 2): runbook: error: something"


# ---- runbook trace on a profile laid out as PyTorch writes it -------------------------------------------------------


GRAPH_KERNELS = [  # what a bf16 Linear-GELU-Linear at batch 4 launches on Hopper (cuBLAS, then PyTorch's elementwise)
    ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", 9.0),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>", 2.0),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
     "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, "
     "std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)", 1.5),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNN", 8.0),
]


def _torch_like_trace(path: Path, decode_steps: int) -> None:
    """One eager prefill step, then `decode_steps` CUDA-graph replays, each in its record_function span, with a
    sync between steps, as export_chrome_trace lays them out (CPU spans and their GPU annotations, launches
    carrying the correlation of the kernels they ran)."""
    ev: list[dict] = []
    corr, t = 100, 1_000.0

    def span(name: str, start: float, end: float, gpu: bool) -> None:
        ev.append({"ph": "X", "cat": "gpu_user_annotation" if gpu else "user_annotation", "name": name,
                   "pid": 0 if gpu else 4242, "tid": 7 if gpu else 4242, "ts": start, "dur": end - start, "args": {"External id": corr}})  # fmt: skip

    def kernel(name: str, start: float, dur: float, c: int) -> None:
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": start, "dur": dur,
                   "args": {"External id": c, "device": 0, "stream": 7, "correlation": c, "grid": [132, 1, 1], "block": [384, 1, 1]}})  # fmt: skip

    def launch(name: str, start: float, c: int) -> None:
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 4242, "tid": 4242, "ts": start, "dur": 6.0,
                   "args": {"External id": c, "correlation": c, "cbid": 311}})  # fmt: skip

    # the prefill pass, eager: one launch per kernel
    cpu0, g0 = t, None
    for name, us in GRAPH_KERNELS:
        corr += 1
        launch("cudaLaunchKernel", t, corr)
        k0 = t + 8.0 if g0 is None else max(t + 8.0, g_end)
        kernel(name, k0, us * 20, corr)
        g0, g_end = g0 if g0 is not None else k0, k0 + us * 20
        t += 10.0
    span("step[EXTEND bs=4 toks=256]", cpu0, t, gpu=False)
    span("step[EXTEND bs=4 toks=256]", g0, g_end, gpu=True)
    t = g_end + 30.0  # the sync
    for _ in range(decode_steps):
        corr += 1
        cpu0 = t
        launch("cudaGraphLaunch", t, corr)
        k = t + 12.0
        g0 = k
        for name, us in GRAPH_KERNELS:
            kernel(name, k, us, corr)
            k += us + 1.0
        t += 15.0
        span("step[DECODE bs=4]", cpu0, t, gpu=False)
        span("step[DECODE bs=4]", g0, k - 1.0, gpu=True)
        t = k + 25.0
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "computeMajor": 9, "computeMinor": 0}],
           "traceEvents": sorted(ev, key=lambda e: e["ts"]), "traceName": str(path), "displayTimeUnit": "ms",
           "baseTimeNanoseconds": 1733300000000000000}  # fmt: skip
    path.write_text(json.dumps(doc, indent=1))


def _trace_doc(tmp_path: Path, decode_steps: int, capsys) -> dict:
    """What the driver reads: `runbook trace --json DIR`'s standard output."""
    d = tmp_path / "trace"
    d.mkdir()
    _torch_like_trace(d / "device-check.pt.trace.json", decode_steps)
    runbook_main(["trace", "--json", str(d)])
    return json.loads(capsys.readouterr().out)


def test_trace_of_the_profiled_program_passes(tmp_path, capsys):
    doc = _trace_doc(tmp_path, 8, capsys)
    status, text = dc.check_trace(doc, decode_steps=8, extend_steps=1)
    assert status == "ok", text
    assert text.startswith("trace: 8 decode steps (spans) of 8 run, 1 prefill pass(es) of 1, ")
    assert "4 kernels per step" in text


def test_trace_with_the_wrong_step_count_or_no_kernels_fails(tmp_path, capsys):
    doc = _trace_doc(tmp_path, 8, capsys)
    status, text = dc.check_trace(doc, decode_steps=7, extend_steps=1)
    assert status == "FAIL" and "8 decode steps found, 7 run" in text
    status, text = dc.check_trace(doc, decode_steps=8, extend_steps=0)
    assert status == "FAIL" and "1 prefill passes found, 0 run" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "cpu-only.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=4]", "ts": 1, "dur": 5}]}))
    runbook_main(["trace", "--json", str(empty)])
    status, text = dc.check_trace(json.loads(capsys.readouterr().out), decode_steps=8, extend_steps=1)
    assert status == "FAIL" and "no GPU kernel events found" in text
    assert dc.check_trace(None, 8)[0] == "FAIL"
