"""Whose capture is this: an inference server's, a training job's, or not known from the trace.

The breakdown reads a capture as an inference server's forward passes. A training capture (DLRM on
A100/V100 in HTA's test data, a 2021 ResNet-50, a ROCm toy) has passes too, and used to be labelled
"N decode steps" with no word that its GPU time is forward, backward and optimizer work. So a capture
is called a training one only on positive signs that PyTorch itself writes when autograd runs a
backward pass or a `torch.optim` optimizer steps; a capture with none of them is not called training
(and a capture without a server's step annotations is not either: SGLang <= 0.5.10 and vLLM <= 0.11.0
write none, shared/reference/traces.md §1.1, §1.4).

Signs and where their names come from (shared/reference/traces.md §3):

- `autograd::engine::evaluate_function: <Node>`: the autograd engine wraps every backward node it
  runs in `RECORD_FUNCTION(c10::str("autograd::engine::evaluate_function: ", fn->name()))`
  (pytorch/pytorch torch/csrc/autograd/engine.cpp, Engine::thread_main; the string is in
  torch==2.9.0 torch/lib/libtorch_cpu.so). [OBS] HTA's trace_diff/control training trace.
- `<Op>Backward0` / `<Op>Backward` (before torch 1.10 no digit), `torch::autograd::AccumulateGrad`: the
  backward node itself, recorded by `Node::operator()` with scope BACKWARD_FUNCTION under its name()
  (torch/csrc/autograd/function.h; generated names from tools/autograd/templates/Functions.h, e.g.
  `AddBackward0`); AccumulateGrad is the node that writes `.grad` (torch/csrc/autograd/functions/
  accumulate_grad.h; torch/csrc/profiler/collection.cpp keeps it as "an important marker for
  profile analysis"). [OBS] HTA trace_diff/control: 1554 AccumulateGrad.
- `aten::<op>_backward*` (`aten::convolution_backward`, `aten::native_batch_norm_backward`,
  `aten::_softmax_backward_data`, `aten::embedding_dense_backward` ...): ATen's gradient kernels
  (aten/src/ATen/native/native_functions.yaml), called from derivatives.yaml formulas in a backward pass.
- `Optimizer.step#<Class>.step`, `Optimizer.zero_grad#<Class>.zero_grad`: `record_function` names that
  torch.optim's `profile_hook_step` and `zero_grad` open (torch==2.9.0 torch/optim/optimizer.py:501,550).
  `aten::_fused_adam_` / `_fused_adamw_` / `_fused_sgd_` / `_fused_adagrad_`: the fused optimizers'
  ops (native_functions.yaml; torch/optim/adam.py `_fused_adam`).

Not signs: `ProfilerStep#N` (only that `prof.step()` ran a schedule; vLLM 0.34 does that too,
traces.md §3), an absent step annotation, `triton_*` / Inductor names (compiled inference has them).

CPU ops are `cat: "cpu_op"`; Kineto before ~2022 (the 2021 ResNet-50 traces) wrote them, and
record_function ranges, as `cat: "Operator"` (pytorch/kineto libkineto/src/output_json.cpp of that
time, ChromeTraceLogger::handleCpuActivity); `record_function` ranges are `user_annotation` now.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .parse import TraceError, iter_events

CPU_CATS = ("cpu_op", "Operator", "user_annotation")
GPU_SPAN_CAT = "gpu_user_annotation"
SCAN_CATS = CPU_CATS + (GPU_SPAN_CAT,)

ENGINE_PREFIX = "autograd::engine::evaluate_function: "
BACKWARD = re.compile(
    r"^(?:autograd::engine::evaluate_function: .+"  # the engine running a backward node
    r"|(?:struct )?torch::autograd::AccumulateGrad"  # the node that writes .grad ("struct " on Windows)
    r"|[A-Za-z_][A-Za-z0-9_]*Backward\d*"  # a backward node by its own name (AddmmBackward0, MmBackward)
    r"|aten::_?\w*_backward\w*)$"  # ATen gradient ops
)
OPTIMIZER = re.compile(r"^(?:Optimizer\.(?:step|zero_grad)#[\w.]+\.(?:step|zero_grad)|aten::_fused_(?:adam|adamw|sgd|adagrad)_?)$")
# An inference server's own step annotations (traces.md §1.1, §1.2, §1.4): SGLang `step[DECODE bs=8]`
# (0.5.11+), vLLM `execute_new_1_cached_7` (0.11.1-0.13), `execute_context_0(0)_generation_8(8)` (0.14+),
# `execute_8_context_...` (0.26+ detailed), vLLM's opt-in `gpu_model_runner: forward` scopes.
SERVER_STEP = re.compile(r"^(?:step\[|execute_(?:new_\d+_cached_\d+|context_\d|\d+_context_)|gpu_model_runner: )")
EXAMPLES = 3


def _blank() -> dict[str, Any]:
    return {"backward_ops": 0, "optimizer_ops": 0, "server_steps": 0, "examples": [], "read_fully": True}


def scan(path: str | Path) -> dict[str, Any]:
    """The signs in one trace file: counts of backward ops, optimizer ops and server step annotations.

    One streamed pass over its CPU ops and annotations (the GPU analysis does not read cpu_op events). A
    file that cannot be read to its end keeps what was counted, with `read_fully: false`."""
    out = _blank()
    gpu_steps = 0
    seen: set[str] = set()
    try:
        for ev in iter_events(path, SCAN_CATS):
            name = ev.get("name")
            if not isinstance(name, str):
                continue
            if ev.get("cat") == GPU_SPAN_CAT:  # the GPU copy of a record_function range: counted only for server steps
                gpu_steps += bool(SERVER_STEP.match(name))
                continue
            if SERVER_STEP.match(name):
                out["server_steps"] += 1
            elif BACKWARD.match(name):
                out["backward_ops"] += 1
                _example(out, seen, name)
            elif OPTIMIZER.match(name):
                out["optimizer_ops"] += 1
                _example(out, seen, name)
    except TraceError:
        out["read_fully"] = False
    # ROCm writes no gpu_user_annotation, a hand-made trace may carry only those: the larger count is the steps'
    out["server_steps"] = max(out["server_steps"], gpu_steps)
    return out


def _example(out: dict[str, Any], seen: set[str], name: str) -> None:
    """One example of each kind first (a backward op, an optimizer op), then more, up to EXAMPLES."""
    kind = "optimizer" if OPTIMIZER.match(name) else ("engine" if name.startswith(ENGINE_PREFIX) else "backward")
    if kind in seen or len(out["examples"]) >= EXAMPLES:
        return
    seen.add(kind)
    out["examples"].append(name[:160])


def merge(scans: list[dict[str, Any]]) -> dict[str, Any]:
    """The signs of one capture made of several files (one per rank)."""
    out = _blank()
    for s in scans:
        for k in ("backward_ops", "optimizer_ops", "server_steps"):
            out[k] += s[k]
        out["read_fully"] = out["read_fully"] and s["read_fully"]
        out["examples"] += [e for e in s["examples"] if e not in out["examples"]][: max(0, EXAMPLES - len(out["examples"]))]
    return out


def verdict(signs: dict[str, Any]) -> dict[str, Any]:
    """`kind`: training (a backward or optimizer op: not an inference capture), inference (a server's step
    annotations and no training op), unknown (neither: older servers write no annotations, so this is
    not a sign of training). `inference_capture`: false, true, or null when the trace does not tell."""
    b, o, s = signs["backward_ops"], signs["optimizer_ops"], signs["server_steps"]
    out = {**signs}
    if b or o:
        what = [f"{b} autograd backward op(s)"] * bool(b) + [f"{o} optimizer op(s)"] * bool(o)
        also = f"; it also holds {s} server step annotation(s) (a trainer and a server in one capture?)" if s else ""
        out.update(kind="training", inference_capture=False,
                   says=f"not an inference capture: it holds training ops ({' and '.join(what)}){also}")  # fmt: skip
    elif s:
        out.update(kind="inference", inference_capture=True, says=f"an inference server's capture ({s} step annotation(s) of the server)")
    else:
        out.update(kind="unknown", inference_capture=None,
                   says=("no training op (autograd backward, optimizer step) and no server step annotation: read as an inference "
                         "capture (SGLang <= 0.5.10 and vLLM <= 0.11.0 write no step annotations)"))  # fmt: skip
    if not signs["read_fully"]:
        out["says"] += " (the file could not be read to its end for these signs)"
    return out


def workload(paths: list[str | Path]) -> dict[str, Any]:
    """The verdict for one capture: one file, or the files of its ranks."""
    return verdict(merge([scan(p) for p in paths]))
