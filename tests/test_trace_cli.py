"""`runbook trace PATH...`: traces someone else took; older formats, no kernels, Python stacks, other vendors' kernels."""

from __future__ import annotations

import json
import time

import pytest

from gpu_runbook.cli import main
from gpu_runbook.sim.host import server_config
from gpu_runbook.sim.profiler import StepRecord, physics, write_traces
from gpu_runbook.sim.scenario import load_scenario
from gpu_runbook.sim.sglang_info import default_server_args
from tests.trace_helpers import kernel, span, write_trace


def _launch(ts: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 4.0, "args": {"correlation": corr}}


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["trace", *argv])
    return rc, capsys.readouterr().out


def test_a_directory_of_simulated_traces_prints_the_breakdown(tmp_path, capsys):
    sc = load_scenario("healthy-h200-nvlink")
    cfg = server_config(sc, tmp_path)
    ph = physics(cfg, {**default_server_args(cfg.version), **cfg.server_args}, sc)
    now = time.time()
    passes = [StepRecord(now, 0.03, 64, 12800.0), StepRecord(now + 0.05, 0.02, 4, 2048.0, "EXTEND", 2048), StepRecord(now + 0.1, 0.03, 64, 12800.0)]
    write_traces(tmp_path / "t", "x", "", passes, ph, ranks=2)
    rc, out = _run(capsys, str(tmp_path / "t"))
    assert rc == 0, out
    assert out.count("rank ") == 2 and "2 decode step(s) (spans)" in out and "1 prefill pass(es) left out" in out
    rc, out = _run(capsys, "--json", str(tmp_path / "t"))
    doc = json.loads(out)
    assert rc == 0 and doc["ok"] and [t["rank"] for t in doc["traces"]] == [0, 1]
    assert all(t["steps"] == 2 and t["extend_passes"] == 1 for t in doc["traces"])


def test_a_file_with_no_kernel_events_says_so_and_exits_non_zero(tmp_path, capsys):
    p = write_trace(tmp_path / "cpu-only.json.gz", [span("step[DECODE bs=1]", 0.0, 10.0, cat="user_annotation")])
    rc, out = _run(capsys, str(p))
    assert rc == 1 and "no GPU kernel events found" in out
    rc, out = _run(capsys, "--json", str(p), str(tmp_path / "nope.json"))
    doc = json.loads(out)
    assert rc == 1 and not doc["ok"] and "no such file" in doc["traces"][1]["reason"]


def test_a_2021_trace_with_kernels_in_category_Kernel_is_read_and_says_its_format(tmp_path, capsys):
    events = [kernel("ncclKernel_AllReduce_RING_LL_Sum_half", 0.0, 30.0, cat="Kernel"),
              kernel("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", 40.0, 50.0, cat="Kernel"),
              kernel("Memcpy HtoD (Pageable -> Device)", 95.0, 5.0, cat="Memcpy")]  # fmt: skip
    p = write_trace(tmp_path / "2021.pt.trace.json.gz", events)
    rc, out = _run(capsys, "--json", str(p))
    t = json.loads(out)["traces"][0]
    assert rc == 0 and t["ok"] and t["steps"] == 1
    assert t["shares"]["communication"] > 0.25 and t["shares"]["dense_gemm"] > 0.45
    assert any("older Kineto format" in n and "'Kernel'" in n for n in t["notes"])


def test_python_stacks_make_the_idle_share_the_profilers_and_steps_are_measured_on_the_gpu(tmp_path, capsys):
    # A real SGLang decode capture with with_stack: a 465 ms CPU step span around 9.8 ms of kernels.
    events: list[dict] = [span("step[DECODE bs=8]", 0.0, 465_000.0, cat="user_annotation")]
    for i in range(98):
        t = 400_000.0 + i * 100.0
        events += [_launch(1000.0 + i * 4000.0, 10_000 + i), {**kernel("fused_moe_kernel", t, 100.0), "args": {"device": 0, "stream": 7, "correlation": 10_000 + i}}]
    events += [{"ph": "X", "cat": "python_function", "name": f"sglang/srt/layers/x.py({i}): forward", "pid": 1, "tid": 1, "ts": i * 10.0, "dur": 5.0,
                "args": {}} for i in range(50)]  # fmt: skip
    p = write_trace(tmp_path / "stack-TP-0.trace.json.gz", events)
    rc, out = _run(capsys, str(p))
    assert rc == 0, out
    assert "9.800 ms per step" in out  # the step on the GPU timeline, not the 465 ms CPU span
    assert "CPU step spans last 47.4x the steps on the GPU timeline" in out
    # the GPU-side step is fully busy here; the python_function count still says the capture ran with stacks
    assert "recorded with Python stacks" in out


def test_idle_under_python_stacks_is_called_the_profilers(tmp_path, capsys):
    events: list[dict] = []
    for i in range(10):  # kernels 1 ms apart, 10 µs each: 99 % of the window idle
        events.append(kernel("fused_moe_kernel", i * 1000.0, 10.0))
    events += [{"ph": "X", "cat": "python_function", "name": "f", "pid": 1, "tid": 1, "ts": i * 10.0, "dur": 5.0, "args": {}} for i in range(20)]
    p = write_trace(tmp_path / "idle.json.gz", events)
    rc, out = _run(capsys, str(p))
    assert rc == 0 and "the idle share is the profiler's, not the server's" in out


def test_other_vendors_kernels_are_unclassified_with_their_share_never_guessed(tmp_path, capsys):
    events = [span("step[DECODE bs=8]", 0.0, 100.0),
              kernel("_ZN7vendorx12opaque_op_k17Ev", 0.0, 60.0),  # a (mangled) kernel no rule knows (Tensile's Cijk_ names have a rule now)
              kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 60.0, 40.0)]  # fmt: skip
    p = write_trace(tmp_path / "amd.json.gz", events)
    rc, out = _run(capsys, "--json", str(p))
    t = json.loads(out)["traces"][0]
    assert rc == 0 and t["unclassified_share"] == pytest.approx(0.6) and t["shares"]["other"] == pytest.approx(0.6)


def test_a_spanless_capture_says_how_its_prefill_passes_were_told_apart(tmp_path, capsys):
    """The seeds' box on 0.5.10 writes no step spans: `runbook trace` says which passes it left out as prefill and
    why (here: they lack the DSA indexer's decode-only kernel), as the profile probe's capture note does."""
    from gpu_runbook.sim.sglang_server import served_args

    sc = load_scenario("seed-rtx-pro-6000-tp8")
    cfg = server_config(sc, tmp_path)
    ph = physics(cfg, served_args(cfg), sc)
    now = time.time()
    passes = [StepRecord(now + i, 0.184, 512, 512 * 384.0) for i in range(4)]
    passes[1] = StepRecord(now + 1, 0.100, 16, 4096.0, mode="EXTEND", tokens=4096, max_seq=256)
    write_traces(tmp_path / "t", "sim", "", passes, ph, ranks=1)
    assert main(["trace", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "3 decode step(s) (gaps)" in out
    assert "1 prefill pass(es) left out (1 told apart as passes without the DSA indexer's paged logits kernel" in out


def test_pass_kinds_are_rendered_where_the_analysis_counts_them(tmp_path, capsys):
    """The analysis counts pass kinds (`passes`, `pass_source`, `breakdown_of`, `mixed_tokens`): the text says
    them, and calls the steps what was broken down; a summary without them has no such line."""
    from gpu_runbook.trace.describe import breakdown_label, passes_text, render_text

    p = write_trace(tmp_path / "a.json.gz", [span("step[DECODE bs=8]", 0.0, 100.0), kernel("fused_moe_kernel", 0.0, 100.0)])
    rc, out = _run(capsys, "--json", str(p))
    doc = json.loads(out)
    r = doc["traces"][0]
    assert rc == 0
    r.update(passes={"decode": 6, "extend": 1, "mixed": 0, "idle": 0, "capture": 0}, pass_source="SGLang step spans", breakdown_of="decode")
    assert passes_text(r) == "passes: 6 decode, 1 EXTEND, 0 mixed (SGLang step spans); breakdown of the decode passes"
    assert "\n  passes: 6 decode, 1 EXTEND, 0 mixed" in render_text(doc)
    tokens = {"passes": 2, "of_passes": 5, "prefill_requests": 3, "prefill_tokens": 900, "decode_requests": 40, "decode_tokens": 40, "per_pass": []}
    r.update(passes={"decode": 0, "extend": 1, "mixed": 5, "idle": 2, "other": 0}, breakdown_of="mixed", mixed_tokens=tokens, pass_source="x\ny")
    assert passes_text(r) == ("passes: 0 decode, 1 EXTEND, 5 mixed, 2 IDLE (x y); breakdown of the mixed passes; the mixed passes carried "
                              "900 prefill token(s) of 3 request(s) and 40 decode token(s) of 40 request(s) (2 of 5 passes annotated with them)")
    assert breakdown_label(r, r["workload"]) == "mixed pass(es)"
    for k in ("passes", "pass_source", "breakdown_of", "mixed_tokens"):
        r.pop(k)
    assert passes_text(r) == "" and "passes:" not in render_text(doc)
