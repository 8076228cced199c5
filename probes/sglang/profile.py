"""`sglang.profile`: capture a few decode steps with SGLang's profiler and say where the GPU time goes.

Under load it asks `/start_profile` for `num_steps` decode steps (GPU activities, no stack, no
shapes unless asked) into a fresh directory, waits a bounded time for every TP rank's
`*-TP-<r>[-DECODE].trace.json.gz`, streams them through `gpu_runbook.trace`, and adds the roofline and
the PCIe bytes per step (`gpu_runbook.probes.roofline`). The traces are written by the server on *its*
filesystem: `output_dir` is the server's path, `local_dir` where this host sees it (a container's
mounted volume); when nothing appears there the evidence is `unavailable` and says both.
Facts: shared/reference/profiling.md §1-§5, §10.
"""

from __future__ import annotations

import asyncio
import glob
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from gpu_runbook.fetch import FetchError, fetch
from gpu_runbook.loader import LoadError
from gpu_runbook.plugin import Context, Evidence, Probe
from gpu_runbook.trace.analysis import TRACE_NAME, analyze, prefill_split_note, rank_of
from gpu_runbook.trace.coverage import coverage
from gpu_runbook.trace.parse import TraceError
from gpu_runbook.trace.rules import classifier
from pydantic import BaseModel

from .. import roofline as rf
from ..gpu_table import gpu_model
from ..model import read_json_file
from ..server import window as w
from ..server.http import ProbeError
from ..server.profile import (
    PcieSampler,
    ProfileParams,
    blocks,
    export_pause_s,
    gpu_name,
    pcie_values,
    profile_values,
    summary,
)
from ..server.profile_values import ProfileValues
from .server import parse_metrics, server_info


def _version(v: str) -> tuple[int, ...]:
    out = []
    for part in str(v).split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out + [0] * (3 - len(out)))


def profile_body(version: str, out_dir: str, num_steps: int, *, activities: list[str], record_shapes: bool, by_stage: bool, prefix: str) -> dict[str, Any]:
    """The /start_profile body for this version: only fields it knows (profiling.md §1)."""
    v = _version(version)
    body: dict[str, Any] = {"output_dir": out_dir, "num_steps": num_steps, "activities": activities}
    if v >= (0, 4, 9):
        body.update(with_stack=False, record_shapes=record_shapes, profile_by_stage=by_stage)
    if v >= (0, 5, 7):
        body["profile_prefix"] = prefix
    return body


def find_traces(local_dir: Path, by_stage: bool) -> dict[str, Path]:
    """Rank label ('TP-0', 'TP-0-DP-1') -> its trace file; with `profile_by_stage` only the DECODE ones
    (0.4.9-0.5.2 named them '-2'). Merged files and anything else in the directory are left alone."""
    found: dict[str, Path] = {}
    for p in sorted(glob.glob(str(local_dir / "*-TP-*.trace.json.gz"))):
        name = os.path.basename(p)
        stage = TRACE_NAME.search(name)
        if by_stage and not (stage and stage.group(2) in ("DECODE", "2")):  # '-TP-2.trace.json.gz' is rank 2, not stage 2
            continue
        if name.startswith("merged-"):
            continue
        if rank_of(p) is not None:
            label = name[name.index("-TP-") + 1 :].split(".trace.json")[0]
            if by_stage and stage and stage.group(2):
                label = label[: -len(stage.group(2)) - 1]
            found.setdefault(label, Path(p))
    return found


class SglangProfile(Probe):
    """Profile a few decode steps under load; the values are declared in `ProfileValues` (probes/server/profile_values.py)."""

    needs = "profile"  # --depth quick does not profile the server
    name = "sglang.profile"
    server_kind, role = "sglang", "server.profile"
    description = "Profile a few decode steps (/start_profile) and break the step down by kernel bucket, with roofline and PCIe bytes per step"
    default_timeout_s = 60.0
    Values = ProfileValues

    Params = ProfileParams

    def timeout_s(self, params: BaseModel) -> float:
        return self.default_timeout_s + float(getattr(params, "wait_s", 90.0))

    async def run(self, ctx: "Context", params: "SglangProfile.Params") -> Evidence:
        try:
            cls = classifier(params.rules)
        except LoadError as exc:
            return Evidence.failed("bucket rules rejected: " + "; ".join(str(e) for e in exc.errors))
        try:
            info, _ = await server_info(ctx)
        except ProbeError as e:
            return Evidence(status=e.status, reason=e.reason, summary=f"{e.status}: {e.reason}")
        version = str(info.get("version") or "0.0.0")
        tp = int(info.get("tp_size") or 1)
        ev = Evidence.unavailable("no capture was made")
        for attempt in range(3):
            retry, ev = await self._capture(ctx, params, cls, info, version, tp, attempt)
            if not retry:
                break
        return ev

    async def _capture(self, ctx: "Context", params: "SglangProfile.Params", cls: Any, info: dict[str, Any], version: str, tp: int,
                       attempt: int) -> tuple[bool, Evidence]:
        """One /start_profile and its analysis; (ask again, evidence): again when the capture held only prefill passes."""
        run_id = f"runbook-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        server_root = params.output_dir or tempfile.gettempdir()
        server_dir = str(Path(server_root) / run_id)
        local_dir = Path(params.local_dir or server_root) / run_id
        by_stage = bool(params.profile_by_stage) and _version(version) >= (0, 4, 9)
        passes_asked = params.num_steps if by_stage else 2 * params.num_steps + 1
        body = profile_body(version, server_dir, passes_asked, activities=list(params.activities),
                            record_shapes=params.record_shapes, by_stage=by_stage, prefix="runbook")  # fmt: skip
        before = await _scrape(ctx)
        pcie = PcieSampler(ctx, params.gpus)
        await pcie.start()
        t0 = time.monotonic()
        try:
            r = await fetch(ctx.http, ctx.target.server_url.rstrip("/") + "/start_profile", method="POST", json=body,
                            headers=ctx.target.auth_headers(), timeout_s=params.wait_s + 30)  # fmt: skip
        except FetchError as e:
            await pcie.stop()
            return False, Evidence.unavailable(f"/start_profile: {e.message}")
        if r.status_code != 200:
            await pcie.stop()
            return False, Evidence.unavailable(_refusal(r, version, bool(ctx.target.auth_headers())))
        traces, waited = await _wait_for(local_dir, tp, by_stage, t0 + params.wait_s)
        stopped_as_extend = False
        if by_stage and len(traces) < tp:
            extend = _extend_traces(local_dir)
            if len(extend) >= tp:  # the decode capture was ended by a prefill batch and written -EXTEND
                traces, stopped_as_extend = extend, True
        window_s = time.monotonic() - t0
        pcie_rates = await pcie.stop()
        after = await _scrape(ctx)
        if len(traces) < tp:
            disarmed = await _disarm(ctx)
            idle = all(x is not None and (_gauge(x[1], w.RUNNING) or 0) == 0 for x in (before, after))
            if idle and not traces:
                return False, Evidence.unavailable(
                    f"no decode step ran within {params.wait_s:g} s (the server had no running requests), so no trace was "
                    f"written; run the probe under load{disarmed}",
                    values={"trace_dir_server": server_dir, "trace_dir_local": str(local_dir), "ranks_found": 0, "tp_size": tp},
                )
            where = f"the server was asked to write them to {server_dir} on its own filesystem"
            got = f"{len(traces)} of {tp} rank traces" if traces else "no traces"
            hint = ("If the server runs in a container or on another host, mount that directory here and set the probe "
                    "param local_dir to where it is visible (and output_dir to the server's path of it)")  # fmt: skip
            return False, Evidence.unavailable(
                f"{got} appeared in {local_dir} within {params.wait_s:g} s; {where}. {hint}{disarmed}",
                values={"trace_dir_server": server_dir, "trace_dir_local": str(local_dir), "ranks_found": len(traces), "tp_size": tp},
            )
        try:
            prof = await asyncio.to_thread(analyze, [traces[k] for k in sorted(traces)], cls, passes_asked)
        except TraceError as e:
            return False, Evidence.failed(str(e), values={"trace_dir_local": str(local_dir)})
        s = prof.summary()
        if not s.get("ranks"):
            if s.get("extend_passes") or any(r.extend_passes for r in prof.ranks):
                return True, Evidence.unavailable(  # only prefill passes were captured: ask again
                    f"the captures in {local_dir} held only prefill (EXTEND) passes", values={"trace_dir_local": str(local_dir)})
            return False, Evidence.unavailable(f"the traces in {local_dir} hold no decode kernels (was the server under load?)",
                                        values={"trace_dir_local": str(local_dir)})  # fmt: skip
        if not s.get("step_ms"):  # a step of 0 ms: no time to break down, and every share would be a division by it
            return False, Evidence.failed(f"the traces in {local_dir} measure a decode step of 0 ms (a capture with no step span or kernel time)",
                                   values={"trace_dir_local": str(local_dir)})  # fmt: skip
        pause = export_pause_s(prof)
        values = profile_values(s)
        cov = coverage(s, cls)
        values.update(coverage=cov["coverage"], top_unclassified=cov["top_unclassified"])
        values["capture"] = _capture_note(by_stage, stopped_as_extend, passes_asked, s) + (
            f" (attempt {attempt + 1}: the earlier capture(s) held only prefill passes)" if attempt else "")
        values.update(trace_dir_server=server_dir, trace_dir_local=str(local_dir), version=version, tp_size=tp,
                      export_pause_s=pause, capture_wall_s=round(waited, 2))  # fmt: skip
        hf = _model_config(info)
        gpu = gpu_model(await gpu_name(ctx, params.gpus))
        values.update(_roofline_values(info, hf, gpu, s, before, after, tp))
        passes = _decode_passes(before, after)
        values.update(pcie_values(pcie_rates, window_s, s, hf, tp, values.get("batch"), passes, DECODE_PASSES_SOURCE))
        values["finding_allreduce"] = rf.QUANTIZED_ALLREDUCE_NOTE
        return False, Evidence(
            summary=summary(values),
            values=values,
            blocks=blocks(s, values),
        )


def _extend_traces(local_dir: Path) -> dict[str, Path]:
    """Rank label -> its `-EXTEND` trace (0.4.9-0.5.2: `-1`): what a decode capture stopped by a prefill batch is written as."""
    found: dict[str, Path] = {}
    for p in sorted(glob.glob(str(local_dir / "*-TP-*.trace.json.gz"))):
        name = os.path.basename(p)
        stage = TRACE_NAME.search(name)
        if name.startswith("merged-") or not (stage and stage.group(2) in ("EXTEND", "1")):
            continue
        if rank_of(p) is not None:
            label = name[name.index("-TP-") + 1 :].split(".trace.json")[0]
            label = label[: -len(stage.group(2)) - 1]
            found.setdefault(label, Path(p))
    return found


def _capture_note(by_stage: bool, stopped_as_extend: bool, passes: int, s: dict[str, Any]) -> str:
    """How the decode passes were obtained: the request's fields, what the server wrote, how they were told apart."""
    how = {"spans": "by their step[DECODE] spans", "gaps": "on the GPU timeline (gaps between passes; prefill passes by their prefill-only kernels)",
           "window": "not at all (no step spans and no gap between passes: the whole capture counts as decode steps)"}[s["step_source"]]  # fmt: skip
    split = prefill_split_note(s)
    ext = f"; {split}" if split else ""
    if s.get("ranks_split_otherwise"):
        ext += (f"; {s['ranks_split_otherwise']} of {s['ranks']} ranks split the passes otherwise (a pass at the length boundary);"
                " the counts are the majority's")
    if not by_stage:
        return f"{passes} forward passes of any mode (no profile_by_stage); decode passes told apart {how}{ext}"
    if stopped_as_extend:
        return ("profile_by_stage: a prefill batch ended the decode capture and the server wrote it -EXTEND with no -DECODE file "
                f"(the release's behaviour under steady admissions); decode passes in it told apart {how}{ext}")
    return f"profile_by_stage: the -DECODE files; decode passes told apart {how}{ext}"


async def _disarm(ctx: "Context") -> str:
    """POST /stop_profile so a capture still waiting for steps does not block the next one ("already in progress")."""
    try:
        r = await fetch(ctx.http, ctx.target.server_url.rstrip("/") + "/stop_profile", method="POST", headers=ctx.target.auth_headers(), timeout_s=10)
    except FetchError:
        return ""
    return " (sent /stop_profile so the server's profiler is not left armed)" if r.status_code == 200 else ""


def _refusal(r: httpx.Response, version: str, had_key: bool) -> str:
    text = r.text.strip()[:200]
    if r.status_code == 401:
        if had_key:
            return ("401 from /start_profile: the key was refused; from 0.5.8 a server with --admin-api-key accepts only "
                    "the admin key there (set the target's api_key to it)")  # fmt: skip
        return "401 from /start_profile: the server needs an API key (the admin key when --admin-api-key is set, 0.5.8+)"
    if r.status_code == 404:
        return f"/start_profile not found (404) on SGLang {version}"
    return f"/start_profile answered HTTP {r.status_code}: {text}"


async def _wait_for(local_dir: Path, tp: int, by_stage: bool, deadline: float) -> tuple[dict[int, Path], float]:
    """Poll until every rank's file exists and its size is steady (the writer is done), or the deadline."""
    t0 = time.monotonic()
    sizes: dict[Path, int] = {}
    while True:
        found = find_traces(local_dir, by_stage)
        if len(found) >= tp:
            now = {p: p.stat().st_size for p in found.values() if p.exists()}
            if now == sizes and all(v > 0 for v in now.values()):
                return found, time.monotonic() - t0
            sizes = now
        if time.monotonic() >= deadline:
            return found, time.monotonic() - t0
        await asyncio.sleep(0.25)


async def _scrape(ctx: "Context") -> tuple[float, str] | None:
    try:
        r = await fetch(ctx.http, ctx.target.server_url.rstrip("/") + "/metrics", headers=ctx.target.auth_headers(), timeout_s=10)
    except FetchError:
        return None
    return (time.monotonic(), r.text) if r.status_code == 200 else None


def _gauge(text: str, name: str) -> float | None:
    """A concept's gauge (probes/server/window.py) from one /metrics text."""

    try:
        snap = parse_metrics(text, 0.0)
    except ProbeError:
        return None
    return snap.gauges.get(name)


def _model_config(info: dict[str, Any]) -> dict[str, Any]:
    path = info.get("model_path")
    if not path:
        return {}
    try:
        return read_json_file(Path(str(path)) / "config.json")
    except (OSError, ValueError):
        return {}


def _arg(info: dict[str, Any], key: str) -> Any:
    """A server arg as the scheduler resolved it (classic layout: internal_states[0]), else the top level."""
    states = info.get("internal_states") or []
    st = states[0] if states and isinstance(states[0], dict) else {}
    return st.get(key) if st.get(key) is not None else info.get(key)


DECODE_PASSES_SOURCE = "sglang:cuda_graph_passes_total (decode modes)"  # where the PCIe bytes' decode steps were counted


def _roofline_values(info: dict[str, Any], hf: dict[str, Any], gpu: Any, s: dict[str, Any], before: Any, after: Any, tp: int) -> dict[str, Any]:
    text = after[1] if after else (before[1] if before else "")
    running = _gauge(text, w.RUNNING) if text else None
    kv_tokens = _gauge(text, w.KV_USED_TOKENS) if text else None
    kv_dtype = str(_arg(info, "kv_cache_dtype") or "auto")
    kv_b = 1.0 if "fp8" in kv_dtype else 2.0
    per_tok = rf.kv_bytes_per_token_from_server(info)
    kv_source = "server_info memory_usage.kvcache / token_capacity" if per_tok else None
    if per_tok is None:
        per_tok = rf.kv_bytes_per_token(hf, kv_b, tp)
        kv_source = "model config (layers x KV heads x head dim)" if per_tok else None
    weight_gb = rf.weight_gb_per_gpu(info)
    step_s = s["step_ms"] / 1000 if s.get("step_ms") else None
    quant = _arg(info, "quantization") or (hf.get("quantization_config") or {}).get("quant_algo")
    flops = rf.decode_flops_per_gpu(hf, running or 0, tp) if running else None
    read_gb, expert_gb, touched = rf.weights_read_gb(hf, quant, tp, running, weight_gb)  # MoE: only the experts its tokens route to
    out = rf.roofline(gpu=gpu, step_s=step_s, weight_gb=read_gb,
                      kv_read_gb=(kv_tokens * per_tok / 1e9) if kv_tokens and per_tok else None,
                      flops_per_step=flops, quantization=str(quant) if quant else None)  # fmt: skip
    out["weight_gb"] = weight_gb
    out["weight_read_gb"] = None if read_gb is None else round(read_gb, 3)
    out["experts_touched_share"] = None if touched is None else round(touched, 4)
    out["batch"] = running
    mfu = {}
    if before and after:
        a, b = rf.mfu_counters(before[1]), rf.mfu_counters(after[1])
        dt = after[0] - before[0]
        for name in b:
            if name in a and dt > 0:
                mfu[name] = (b[name] - a[name]) / dt
    if "sglang:estimated_flops_per_gpu_total" in mfu:
        out["mfu_tflops"] = round(mfu["sglang:estimated_flops_per_gpu_total"] / 1e12, 3)
        if out.get("peak_tflops"):
            out["mfu_flops_share"] = round(out["mfu_tflops"] / out["peak_tflops"], 5)
    if "sglang:estimated_read_bytes_per_gpu_total" in mfu:
        out["mfu_read_gbps"] = round(mfu["sglang:estimated_read_bytes_per_gpu_total"] / 1e9, 2)
        if out.get("peak_dram_gbps"):
            out["mfu_bandwidth_share"] = round(out["mfu_read_gbps"] / out["peak_dram_gbps"], 4)
    # the MoE GEMMs against their own roofline: expert weight bytes at peak vs the measured MoE time
    moe_ms = s["shares"]["moe_gemm"] * s["step_ms"]
    if expert_gb and gpu and gpu.dram_gbps.value and moe_ms > 0:
        out["moe_roofline_ms"] = round(expert_gb * (1.0 if touched is None else touched) / gpu.dram_gbps.value * 1000, 3)
        out["moe_roofline_share"] = round(out["moe_roofline_ms"] / moe_ms, 4)
    out["weight_gb_source"] = "server_info internal_states[0].memory_usage.weight" if weight_gb else None
    out["kv_bytes_per_token"] = round(per_tok) if per_tok else None
    out["kv_source"] = kv_source
    return out


def _decode_passes(before: Any, after: Any) -> tuple[float, float] | None:
    """(decode passes, seconds) between the two scrapes, where the server counts passes (0.5.7+)."""
    if not before or not after:
        return None
    a, b = rf.decode_passes(before[1]), rf.decode_passes(after[1])
    if a is None or b is None or b <= a:
        return None
    return b - a, after[0] - before[0]


