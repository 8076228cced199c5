"""Whose capture: a training capture (backward and optimizer ops) is said not to be an inference capture and
its breakdown is labelled so; a capture without server annotations (SGLang <= 0.5.10) is not called training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_runbook.cli import main
from gpu_runbook.trace.workload import BACKWARD, OPTIMIZER, SERVER_STEP, scan, verdict, workload
from tests.trace_helpers import kernel, span, write_trace


def cpu(name: str, ts: float, dur: float, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {"External id": int(ts)}}


def training_events(cpu_cat: str = "cpu_op", annotation_cat: str = "user_annotation", kernel_cat: str = "kernel", suffix: str = "0") -> list[dict]:
    """Three iterations of a small training loop, as torch writes them: forward ops, the autograd engine's backward
    (evaluate_function wrapping each node, AccumulateGrad, ATen gradient ops), then SGD's step and zero_grad."""
    events: list[dict] = []
    for it in range(3):
        t0 = it * 10_000.0
        events += [
            cpu(f"ProfilerStep#{it}", t0, 9000.0, annotation_cat),
            cpu("aten::linear", t0, 100.0, cpu_cat), kernel("ampere_sgemm_128x64_tn", t0 + 10, 800.0, cat=kernel_cat),
            cpu(f"autograd::engine::evaluate_function: AddmmBackward{suffix}", t0 + 1000, 100.0, cpu_cat),
            cpu(f"AddmmBackward{suffix}", t0 + 1001, 90.0, cpu_cat),
            cpu("aten::threshold_backward", t0 + 1100, 10.0, cpu_cat),
            cpu("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t0 + 1200, 10.0, cpu_cat),
            cpu("torch::autograd::AccumulateGrad", t0 + 1201, 5.0, cpu_cat),
            kernel("ampere_sgemm_128x64_nt", t0 + 1010, 1500.0, cat=kernel_cat),
            kernel("void at::native::vectorized_elementwise_kernel<4>", t0 + 2600, 200.0, cat=kernel_cat),
            cpu("Optimizer.step#SGD.step", t0 + 4000, 500.0, annotation_cat),
            kernel("multi_tensor_apply_kernel", t0 + 4010, 300.0, cat=kernel_cat),
            cpu("Optimizer.zero_grad#SGD.zero_grad", t0 + 5000, 50.0, annotation_cat),
        ]  # fmt: skip
    return events


def sglang_059_events(passes: int = 6) -> list[dict]:
    """SGLang 0.5.9 under load: decode passes one after another, no step spans (<= 0.5.10 writes none), the
    CPU side only the ops of the forward and the launches; nothing autograd."""
    events: list[dict] = []
    for i in range(passes):
        t0 = i * 5000.0
        events += [cpu("aten::empty", t0, 5.0), cpu("sgl_kernel::moe_fused_gate", t0 + 10, 5.0),
                   kernel("fused_moe_kernel", t0, 1000.0), kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t0 + 1000, 500.0),
                   kernel("BatchDecodeWithPagedKVCacheKernel", t0 + 1500, 300.0), kernel("RMSNormKernel", t0 + 1800, 100.0)]  # fmt: skip
    return events


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["trace", *argv])
    return rc, capsys.readouterr().out


def test_a_training_capture_is_said_not_to_be_an_inference_capture(tmp_path, capsys):
    p = write_trace(tmp_path / "dlrm-like.pt.trace.json.gz", training_events())
    rc, out = _run(capsys, str(p))
    assert rc == 0, out
    assert "not an inference capture: it holds training ops (15 autograd backward op(s) and 6 optimizer op(s))" in out
    assert "Optimizer.step#SGD.step" in out and "autograd::engine::evaluate_function: AddmmBackward0" in out
    # the breakdown is labelled as the training timeline's, never "N decode step(s)"
    assert "decode step(s)" not in out and "3 segment(s) of a training timeline, read as if decode steps (gaps)" in out
    assert all(ln.startswith("  as an inference server's, passes:") for ln in out.splitlines() if "passes:" in ln)
    rc, out = _run(capsys, "--json", str(p))
    t = json.loads(out)["traces"][0]
    w = t["workload"]
    assert (w["kind"], w["inference_capture"], w["optimizer_ops"], w["server_steps"]) == ("training", False, 6, 0)
    assert w["backward_ops"] == 15  # 2 engine wrappers, AddmmBackward0, AccumulateGrad, threshold_backward; x3
    assert t["breakdown_label"].startswith("segment(s) of a training timeline")


def test_a_2021_training_trace_with_Operator_rows_and_no_digit_in_node_names(tmp_path, capsys):
    """Kineto before ~2022 wrote CPU ops and record_function ranges as cat "Operator" (the ResNet-50 traces of
    2021); torch before 1.10 named the nodes MmBackward, AddmmBackward (no 0)."""
    events = training_events(cpu_cat="Operator", annotation_cat="Operator", kernel_cat="Kernel", suffix="")
    p = write_trace(tmp_path / "resnet50-2021.pt.trace.json.gz", events)
    rc, out = _run(capsys, "--json", str(p))
    t = json.loads(out)["traces"][0]
    assert rc == 0 and t["workload"]["kind"] == "training"
    assert t["workload"]["backward_ops"] == 15 and t["workload"]["optimizer_ops"] == 6


def test_an_sglang_059_capture_without_step_spans_is_not_called_training(tmp_path, capsys):
    p = write_trace(tmp_path / "1733-TP-0.trace.json.gz", sglang_059_events())
    rc, out = _run(capsys, str(p))
    assert rc == 0, out
    assert "not an inference capture" not in out and "training" not in out
    assert "6 decode step(s) (gaps)" in out
    rc, out = _run(capsys, "--json", str(p))
    w = json.loads(out)["traces"][0]["workload"]
    assert (w["kind"], w["inference_capture"], w["backward_ops"], w["optimizer_ops"]) == ("unknown", None, 0, 0)
    assert "not an inference capture" not in w["says"] and "write no step annotations" in w["says"]


def test_step_spans_make_it_an_inference_capture(tmp_path):
    events = [span("step[DECODE bs=8]", 0.0, 100.0, cat="user_annotation"), span("step[DECODE bs=8]", 0.0, 100.0),
              kernel("fused_moe_kernel", 0.0, 50.0)]  # fmt: skip
    w = workload([write_trace(tmp_path / "a.json.gz", events)])
    assert (w["kind"], w["inference_capture"], w["server_steps"]) == ("inference", True, 1)  # CPU and GPU copy: one step


def test_profiler_steps_alone_are_not_training(tmp_path):
    """`ProfilerStep#N` only says a schedule ran (vLLM 0.34 runs the torch profiler with one too)."""
    events = [cpu("ProfilerStep#7", 0.0, 100.0, "user_annotation"), cpu("aten::mm", 1.0, 5.0), kernel("fused_moe_kernel", 0.0, 50.0)]
    assert workload([write_trace(tmp_path / "a.json.gz", events)])["kind"] == "unknown"


def test_a_training_capture_whose_passes_read_as_prefill_is_still_labelled_training(tmp_path, capsys):
    """Flash-attention forward kernels read as prefill passes to the inference reading: the breakdown is still
    labelled a training timeline's, not 'prefill passes', and says it is not an inference capture."""
    events = [ev for ev in training_events() if ev["cat"] != "kernel"]
    events += [kernel("flash_fwd_kernel", 0.0, 50.0), kernel("flash_fwd_kernel", 9000.0, 50.0)]
    p = write_trace(tmp_path / "t.json.gz", events)
    rc, out = _run(capsys, "--json", str(p))
    t = json.loads(out)["traces"][0]
    assert t["workload"]["kind"] == "training"
    if t["ok"]:
        assert t["breakdown_label"].startswith("segment(s) of a training timeline")
    else:  # nothing the analysis would break down: the reason still says whose capture it is
        assert rc == 1 and "not an inference capture" in t["reason"]
    rc, out = _run(capsys, str(p))
    assert "not an inference capture" in out and "prefill (EXTEND) pass(es)" not in out


@pytest.mark.parametrize("name", [
    "autograd::engine::evaluate_function: MmBackward0", "MmBackward0", "AddmmBackward", "torch::autograd::AccumulateGrad",
    "struct torch::autograd::AccumulateGrad", "aten::convolution_backward", "aten::_softmax_backward_data",
    "aten::native_batch_norm_backward", "aten::embedding_dense_backward", "CompiledFunctionBackward",
])  # fmt: skip
def test_backward_names(name):
    assert BACKWARD.match(name) and not OPTIMIZER.match(name)


@pytest.mark.parametrize("name", ["Optimizer.step#SGD.step", "Optimizer.zero_grad#AdamW.zero_grad", "Optimizer.step#MuonAdamW.step", "aten::_fused_adamw_"])
def test_optimizer_names(name):
    assert OPTIMIZER.match(name) and not BACKWARD.match(name)


@pytest.mark.parametrize("name", [
    "aten::linear", "aten::mm", "ProfilerStep#3", "step[DECODE bs=8]", "triton_poi_fused_add_mul_silu_0", "cudaGraphLaunch",
    "## Call CompiledFxGraph abc ##", "Torch-Compiled Region: 0/0", "sglang::cross_device_reduce_1stage", "backward_hook",
    "aten::_foreach_add_",
])  # fmt: skip
def test_inference_names_are_no_training_sign(name):
    assert not BACKWARD.match(name) and not OPTIMIZER.match(name)


@pytest.mark.parametrize("name", ["step[DECODE bs=8]", "step[EXTEND bs=4 toks=512]", "execute_new_1_cached_7",
                                  "execute_context_0(0)_generation_8(8)", "execute_12_context_1(sq4sk4sqsq16sqsk16)_generation_8(sq8)",
                                  "gpu_model_runner: forward"])  # fmt: skip
def test_server_step_names(name):
    assert SERVER_STEP.match(name)


def test_training_wins_over_server_annotations_and_says_both():
    v = verdict({"backward_ops": 4, "optimizer_ops": 0, "server_steps": 2, "examples": [], "read_fully": True})
    assert v["kind"] == "training" and v["inference_capture"] is False and "2 server step annotation(s)" in v["says"]


def test_an_unreadable_tail_keeps_what_was_counted(tmp_path):
    import gzip

    p = write_trace(tmp_path / "t.json.gz", training_events())
    text = gzip.open(p, "rt").read()
    cut = tmp_path / "cut.json.gz"
    with gzip.open(cut, "wt") as f:
        f.write(text[: len(text) // 2])
    s = scan(cut)
    assert not s["read_fully"] and s["backward_ops"] > 0
    assert "could not be read to its end" in verdict(s)["says"]


def test_paths_are_strings_or_paths(tmp_path):
    p = write_trace(tmp_path / "a.json.gz", sglang_059_events(2))
    assert workload([str(p)]) == workload([Path(p)])
