"""`vllm.profile`: the decode profile's role on vLLM (`server.profile`), the same values `sglang.profile` fills.

vLLM registers `/start_profile` only when it was launched with its profiler, and a tool cannot switch it on
afterwards (shared/reference/profiling.md §7, engine/sim/profiler.py's vLLM section for the releases read):
`VLLM_TORCH_PROFILER_DIR` through 0.12 (vllm==0.11.0:vllm/entrypoints/openai/api_server.py:1192-1208,
vllm==0.12.0:…:1070-1083), `--profiler-config` from 0.13 (vllm==0.13.0:vllm/entrypoints/serve/profile/api_router.py:37-46;
vllm==0.34.0:…/api_router.py:59-68). So the probe first asks, without side effects, whether the route exists (a
GET answers 405 where the POST route is registered, 404 where it is not) and says the exact launch setting the
release reads when it does not.

Where it exists: the traces go to the directory the server was launched with (no request field names it, unlike
SGLang's `output_dir`): the probe's `output_dir`, else dev mode's `/server_info` (`profiler_config.torch_profiler_dir`,
0.13+; the `VLLM_TORCH_PROFILER_DIR` of `vllm_env`, 0.14+), else the launch arguments of the process on the GPUs.
From 0.32 the request names a `profile_prefix` and `max_iterations` (vllm==0.32.0:…/api_router.py:18-28) and the
workers stop by themselves; before, the probe counts the passes the server runs (`vllm:generation_tokens_total`
moves once per request and step) and asks `/stop_profile`, which answers once the workers wrote their traces.
Each worker writes `{name}.{time_ns}.pt.trace.json.gz`; the API server's `*.async_llm.*` trace (CPU only) is left
alone. The traces are read by `gpu_runbook.trace` as SGLang's are: the passes told apart by vLLM's own annotation
(`execute_context_N(T)_generation_M(T)` 0.14+, decode-only where no context request ran), by
`execute_new_N_cached_M` plus the kernels and launches on 0.11.1-0.13 (a cached request decodes or continues a
chunked prompt: the annotation alone cannot tell), or on the GPU timeline on 0.11.0 and older (no annotation).
vLLM's scheduler puts prefill chunks into the decode batch (chunked prefill): a capture whose passes are all
mixed holds no decode step, and the evidence says so rather than calling a mixed pass a decode step.
"""

from __future__ import annotations

import asyncio
import glob
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from gpu_runbook import json_bounded
from gpu_runbook.fetch import FetchError, fetch
from gpu_runbook.loader import LoadError
from gpu_runbook.plugin import Context, Evidence, Probe, value
from gpu_runbook.trace.analysis import analyze
from gpu_runbook.trace.parse import TraceError
from gpu_runbook.trace.rules import classifier

from .. import roofline as rf
from ..gpu_table import gpu_model
from ..server import window as w
from ..server.http import ProbeError, as_evidence, get_json
from ..server.launch_args import server_process_args
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
from . import facts
from .server import VllmScrape, parse_vllm_metrics, vllm_config

# /start_profile's JSON body (profile_prefix, delay_iterations, max_iterations) from 0.32 (vllm==0.32.0:
# vllm/entrypoints/serve/profile/api_router.py:18-28; vllm==0.34.0:…:20-31); before, it takes no body.
START_BODY_SINCE = "0.32.0"
TRACE_GLOB = ("*.pt.trace.json.gz", "*.pt.trace.json")  # torch.profiler.tensorboard_trace_handler's names
FRONTEND = ".async_llm."  # the API server's CPU-only trace (vllm==0.11.0:vllm/v1/engine/async_llm.py:167)
WEIGHT_SOURCE = "model config (parameters x bytes per parameter / TP; an estimate)"
# vLLM has a quantized all-reduce only on ROCm MI300 (quick all-reduce: vllm==0.34.0:vllm/distributed/
# device_communicators/quick_all_reduce.py:68-79); FlashInfer's PCIe-IPC all-reduce is opt-in from 0.30
# (VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC, shared/reference/vllm-and-fleet.md §10).
VLLM_ALLREDUCE_NOTE = (
    "vLLM has no quantized (FP8/FP4) all-reduce for CUDA (quick all-reduce is ROCm MI300 only): the TP all-reduce "
    "moves BF16 activations. What reduces the traffic: fewer GPUs per TP group (--tensor-parallel-size 4 "
    "--data-parallel-size 2), pipeline parallelism (--pipeline-parallel-size 2), or, on one PCIe node from 0.30, "
    "FlashInfer's PCIe-IPC all-reduce (VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1)."
)


class VllmProfileValues(ProfileValues):
    """`vllm.profile`: `sglang.profile`'s values, with vLLM's sources."""

    version: str = value("vLLM version from /version", default=...)
    weight_gb: float | None = value("weights per GPU, estimated from the model's config.json (vLLM does not report it)", unit="GB", default=...)
    weight_gb_source: Literal["model config (parameters x bytes per parameter / TP; an estimate)"] | None = value(
        "where weight_gb came from", default=...)  # fmt: skip
    breakdown_of: str | None = value("the pass kind the breakdown is of: decode (the only kind this probe reports as a step)", default=None)
    passes: dict[str, int] | None = value("passes of each kind in the capture (decode, mixed, extend, decode_or_chunk, ...)", default=None)
    pass_source: str | None = value("how the pass kinds were told: vLLM's annotation of the release, or the GPU timeline", default=None)
    trace_files: int | None = value("worker trace files read (one per rank)", default=None)


class VllmProfile(Probe):
    name = "vllm.profile"
    server_kind, role = "vllm", "server.profile"
    description = ("vLLM decode profile through /start_profile where the server was launched with its profiler (else the launch "
                   "setting): the step by kernel bucket, with roofline and PCIe bytes per step")  # fmt: skip
    Params = ProfileParams  # the same params, so a runbook's `with:` holds for either server
    Values = VllmProfileValues
    default_timeout_s = 60.0
    needs = "profile"  # the profile's role: --depth quick leaves it out, as it does sglang.profile

    def timeout_s(self, params: Any) -> float:
        return self.default_timeout_s + 2 * float(getattr(params, "wait_s", 90.0))

    async def run(self, ctx: "Context", params: Any) -> Evidence:
        try:
            cls = classifier(params.rules)
        except LoadError as exc:
            return Evidence.failed("bucket rules rejected: " + "; ".join(str(e) for e in exc.errors))
        try:
            body = await get_json(ctx, "/version", 10)
        except ProbeError as e:
            return as_evidence(e)
        version = body.get("version") if isinstance(body, dict) and isinstance(body.get("version"), str) else None
        base = ctx.target.server_url.rstrip("/")
        try:
            r = await fetch(ctx.http, base + "/start_profile", headers=ctx.target.auth_headers(), timeout_s=10)
        except FetchError as e:  # the shared layer's limits (size, deadline, same-origin redirects) say what failed
            return Evidence.unavailable(f"/start_profile: {e.message}")
        setting = facts.profiler_launch_setting(version, params.output_dir or "/tmp/vllm-profile")
        if r.status_code == 404:
            return Evidence.unavailable(
                f"vLLM {version or '(version unknown)'} was not launched with its profiler (/start_profile is not "
                f"registered); relaunch with {setting} to profile decode steps")  # fmt: skip
        server_dir, dir_source = await _trace_dir(ctx, params.output_dir)
        if server_dir is None:
            return Evidence.unavailable(
                f"vLLM {version or '(version unknown)'} has its profiler on, but its trace directory is not known here: vLLM "
                "writes where it was launched to (VLLM_TORCH_PROFILER_DIR, or --profiler-config's torch_profiler_dir) and no "
                "request names another; set the probe param output_dir to it (and local_dir where this host sees it)")  # fmt: skip
        local_dir = Path(params.local_dir or server_dir)
        ev = Evidence.unavailable("no capture was made")
        passes = 4 * params.num_steps + 1  # vLLM mixes prefill chunks into most passes under arrivals: ask for more
        for attempt in range(2):
            retry, ev = await self._capture(ctx, params, cls, version, server_dir, dir_source, local_dir, passes, attempt)
            if not retry:
                break
            passes *= 3
        return ev

    async def _capture(self, ctx: "Context", params: Any, cls: Any, version: str | None, server_dir: str, dir_source: str,
                       local_dir: Path, passes: int, attempt: int) -> tuple[bool, Evidence]:
        """One /start_profile ... /stop_profile and its analysis; (ask again, evidence): again when no decode pass was caught."""
        base = ctx.target.server_url.rstrip("/")
        run_id = f"runbook-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        with_body = bool(facts.at_least(version, START_BODY_SINCE))
        before_files = set(_worker_traces(local_dir))
        before = await _scrape(ctx)
        pcie = PcieSampler(ctx, params.gpus)
        await pcie.start()
        t0 = time.monotonic()
        deadline = t0 + params.wait_s
        body = {"profile_prefix": run_id, "max_iterations": passes} if with_body else None
        try:
            r = await fetch(ctx.http, base + "/start_profile", method="POST", json=body, headers=ctx.target.auth_headers(), timeout_s=30)
        except FetchError as e:
            await pcie.stop()
            return False, Evidence.unavailable(f"/start_profile: {e.message}")
        if r.status_code != 200:
            await pcie.stop()
            return False, Evidence.unavailable(_refusal(r.status_code, r.text, version))
        ran = await _wait_passes(ctx, local_dir, before_files, run_id if with_body else None, passes, deadline, before)
        try:  # the workers export as they stop: the answer comes once every trace is written
            s = await fetch(ctx.http, base + "/stop_profile", method="POST", headers=ctx.target.auth_headers(),
                            timeout_s=params.wait_s + 30)  # fmt: skip
            stop_note = "" if s.status_code == 200 else f" (/stop_profile answered HTTP {s.status_code})"
        except FetchError as e:
            stop_note = f" (/stop_profile: {e.message})"
        window_s = time.monotonic() - t0
        pcie_rates = await pcie.stop()
        after = await _scrape(ctx)
        traces = await _settled(local_dir, before_files, run_id if with_body else None, time.monotonic() + min(10.0, params.wait_s))
        waited = time.monotonic() - t0
        dirs = {"trace_dir_server": server_dir, "trace_dir_local": str(local_dir), "ranks_found": len(traces)}
        if not traces:
            if ran == 0:
                return False, Evidence.unavailable(
                    f"no forward pass ran within {params.wait_s:g} s (the server had no running requests), so no trace was written; "
                    f"run the probe under load{stop_note}", values=dirs)  # fmt: skip
            hint = ("If the server runs in a container or on another host, mount that directory here and set the probe param "
                    "local_dir to where it is visible (and output_dir to the server's path of it)")  # fmt: skip
            return False, Evidence.unavailable(
                f"no worker trace appeared in {local_dir}; the server writes them to {server_dir} ({dir_source}) on its own "
                f"filesystem. {hint}{stop_note}", values=dirs)  # fmt: skip
        try:
            prof = await asyncio.to_thread(analyze, traces, cls, None)
        except TraceError as e:
            return False, Evidence.failed(str(e), values={"trace_dir_local": str(local_dir)})
        s = prof.summary()
        kinds = {k: v for k, v in (s.get("passes") or {}).items() if v}
        if not s.get("ranks"):
            why = "; ".join(s.get("notes") or []) or "the traces hold no decode pass"
            held = ", ".join(f"{v} {k}" for k, v in kinds.items()) or "no pass"
            if attempt == 0 and any(k in kinds for k in ("mixed", "extend", "decode_or_chunk", "mixed_or_extend")):
                return True, Evidence.unavailable(f"the capture held no decode pass ({held})", values=dirs)
            return False, Evidence.unavailable(
                f"vLLM {version}: no decode step to break down: {why} (the capture: {held}; {s.get('pass_source') or 'no annotation'})"
                + (" after a longer second capture" if attempt else ""),
                values={**dirs, "passes": kinds or None, "pass_source": s.get("pass_source") or None})  # fmt: skip
        if not s.get("step_ms"):
            return False, Evidence.failed(f"the traces in {local_dir} measure a decode step of 0 ms", values={"trace_dir_local": str(local_dir)})
        values = profile_values(s)
        values.update(_coverage(s, cls))
        values["capture"] = _capture_note(version, with_body, passes, s, dir_source) + (
            f" (attempt {attempt + 1}: the first capture held no decode pass)" if attempt else "") + stop_note
        conf = await _config(ctx)
        tp = int(conf.get("tp") or len(traces))
        values.update(trace_dir_server=server_dir, trace_dir_local=str(local_dir), version=version or "", tp_size=tp,
                      export_pause_s=export_pause_s(prof), capture_wall_s=round(waited, 2), trace_files=len(traces),
                      breakdown_of=s.get("breakdown_of"), passes=kinds or None, pass_source=s.get("pass_source"))  # fmt: skip
        hf = _model_config(conf.get("model_path"))
        gpu = gpu_model(await gpu_name(ctx, params.gpus))
        values.update(_roofline_values(conf, hf, gpu, s, before, after, tp))
        values.update(pcie_values(pcie_rates, window_s, s, hf, tp, values.get("batch"), None))
        values["finding_allreduce"] = VLLM_ALLREDUCE_NOTE
        return False, Evidence(summary=summary(values), values=values, blocks=blocks(s, values))


def _coverage(s: dict[str, Any], cls: Any) -> dict[str, Any]:
    """`coverage` and `top_unclassified` as sglang.profile fills them (gpu_runbook.trace.coverage)."""
    from gpu_runbook.trace.coverage import coverage  # noqa: PLC0415

    c = coverage(s, cls)
    return {"coverage": c["coverage"], "top_unclassified": c["top_unclassified"]}


def _capture_note(version: str | None, with_body: bool, passes: int, s: dict[str, Any], dir_source: str) -> str:
    how = (f"/start_profile with profile_prefix and max_iterations {passes} (0.32+)" if with_body
           else f"/start_profile, about {passes} forward passes, /stop_profile (no request fields before 0.32)")  # fmt: skip
    kinds = ", ".join(f"{v} {k}" for k, v in (s.get("passes") or {}).items() if v)
    out = f"{how}; traces from {dir_source}; passes: {kinds or '-'}; told apart by {s.get('pass_source') or s.get('step_source')}"
    v = facts.release(version)
    if v is not None and v < (0, 11, 1):
        out += " (vLLM <= 0.11.0 annotates no pass: a mixed pass is not told from a decode pass by its annotation)"
    elif v is not None and v < (0, 14, 0):
        out += " (vLLM 0.11.1-0.13 annotate new and cached requests only: a cached request decodes or continues a chunked prompt)"
    notes = [n for n in s.get("notes") or [] if n]
    return out + ("; " + "; ".join(notes) if notes else "")


def _refusal(status: int, text: str, version: str | None) -> str:
    if status == 401:
        return "401 from /start_profile: the server needs an API key"
    if status == 409:  # vllm==0.34.0: ProfilerAlreadyActiveError (vllm/exceptions.py:192-200)
        return f"vLLM {version}: a profiling session is already active (409); /stop_profile ends it"
    return f"/start_profile answered HTTP {status}: {text.strip()[:200]}"


async def _trace_dir(ctx: "Context", given: str | None) -> tuple[str | None, str]:
    """Where the server writes its traces (its own filesystem), and where that was read."""
    if given:
        return given, "the probe's output_dir"
    try:
        body = await get_json(ctx, "/server_info?config_format=json", 10)
    except ProbeError:
        body = None
    if isinstance(body, dict):
        cfg = body.get("vllm_config")
        prof = cfg.get("profiler_config") if isinstance(cfg, dict) else None
        d = prof.get("torch_profiler_dir") if isinstance(prof, dict) else None
        if isinstance(d, str) and d:
            return d, "dev mode /server_info profiler_config.torch_profiler_dir"
        env = body.get("vllm_env")
        d = env.get("VLLM_TORCH_PROFILER_DIR") if isinstance(env, dict) else None
        if isinstance(d, str) and d:
            return d, "dev mode /server_info vllm_env"
    launch = await server_process_args(ctx, "vllm")
    if launch is not None:
        d = _dir_from_flags(launch.flags)
        if d:
            return d, f"--profiler-config ({launch.source})"
    return None, ""


def _dir_from_flags(flags: dict[str, Any]) -> str | None:
    """torch_profiler_dir from `--profiler-config '{...}'` or `--profiler-config.torch_profiler_dir=...`."""
    dotted = flags.get("profiler_config.torch_profiler_dir")
    if isinstance(dotted, str) and dotted:
        return dotted
    raw = flags.get("profiler_config")
    if isinstance(raw, str):
        try:
            cfg = json_bounded.loads(raw)  # a process's command line is data
        except ValueError:
            return None
        d = cfg.get("torch_profiler_dir") if isinstance(cfg, dict) else None
        return d if isinstance(d, str) and d else None
    return None


def _worker_traces(local_dir: Path, prefix: str | None = None) -> dict[Path, int]:
    """The workers' trace files in the directory (not the API server's `.async_llm.` one) -> size."""
    out: dict[Path, int] = {}
    for pattern in TRACE_GLOB:
        for p in glob.glob(str(local_dir / pattern)):
            name = os.path.basename(p)
            if FRONTEND in name or (prefix is not None and not name.startswith(prefix + "_")):
                continue
            try:
                out[Path(p)] = os.stat(p).st_size
            except OSError:
                continue
    return out


async def _wait_passes(ctx: "Context", local_dir: Path, before_files: set[Path], prefix: str | None, passes: int, deadline: float,
                       before: VllmScrape | None) -> int:
    """Wait until about `passes` forward passes ran (0.32+: until the workers wrote their traces after max_iterations).
    Passes are counted from the token counter: vLLM adds one generation token per running request per step, so
    the counter's increase over the running requests is the steps run. Returns the passes counted (-1: not counted)."""
    start_tokens = before.counters.get(w.GENERATION_TOKENS) if before else None
    running: list[float] = []
    counted = -1
    await asyncio.sleep(0.2)
    while time.monotonic() < deadline:
        if prefix is not None and any(p not in before_files for p in _worker_traces(local_dir, prefix)):
            return max(counted, passes)
        snap = await _scrape(ctx)
        if snap is not None and start_tokens is not None:
            running.append(snap.gauges.get(w.RUNNING) or 0.0)
            mean = statistics.fmean(running)
            gained = (snap.counters.get(w.GENERATION_TOKENS) or 0.0) - start_tokens
            counted = int(gained / mean) if mean > 0 else 0
            if prefix is None and counted >= passes:
                return counted
        await asyncio.sleep(0.25)
    return counted


async def _settled(local_dir: Path, before_files: set[Path], prefix: str | None, deadline: float) -> list[Path]:
    """The new worker traces once their sizes stop changing (the server's writer is done), or at the deadline."""
    sizes: dict[Path, int] = {}
    while True:
        now = {p: n for p, n in _worker_traces(local_dir, prefix).items() if p not in before_files}
        if now and now == sizes and all(n > 0 for n in now.values()):
            return sorted(now)
        if time.monotonic() >= deadline:
            return sorted(p for p, n in now.items() if n > 0)
        sizes = now
        await asyncio.sleep(0.25)


async def _scrape(ctx: "Context") -> VllmScrape | None:
    try:
        r = await fetch(ctx.http, ctx.target.server_url.rstrip("/") + "/metrics", headers=ctx.target.auth_headers(), timeout_s=10)
    except FetchError:
        return None
    if r.status_code != 200:
        return None
    try:
        return parse_vllm_metrics(r.text, time.monotonic())
    except ProbeError:
        return None


async def _config(ctx: "Context") -> dict[str, Any]:
    """vllm.server's concepts (TP, KV dtype, quantization, model path), each null where this server does not say."""
    try:
        return await vllm_config(ctx)
    except ProbeError:
        return {}


def _model_config(model_path: Any) -> dict[str, Any]:
    if not model_path:
        return {}
    from ..model import find_config_dir, read_json_file  # noqa: PLC0415

    d = find_config_dir(str(model_path))
    if d is None:
        return {}
    try:
        return read_json_file(d / "config.json")
    except (OSError, ValueError):
        return {}


def _weight_gb(hf: dict[str, Any], tp: int) -> float | None:
    """Weights per GPU in GB (1e9 B), from the model's shape and its quantization (gpu_runbook.model_shape)."""
    if not hf.get("hidden_size") or not hf.get("num_hidden_layers"):
        return None
    from gpu_runbook.model_shape import shape_of  # noqa: PLC0415 - the one model-shape arithmetic

    try:
        gib = shape_of(hf, None).weight_gb_per_gpu(max(1, tp))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return round(gib * (1 << 30) / 1e9, 3) if gib > 0 else None


def _roofline_values(conf: dict[str, Any], hf: dict[str, Any], gpu: Any, s: dict[str, Any], before: VllmScrape | None,
                     after: VllmScrape | None, tp: int) -> dict[str, Any]:
    """sglang.profile's roofline from what vLLM says: running and KV usage from /metrics, KV bytes per token from the
    model's config and cache_config_info's dtype, the weights estimated from the model's config."""
    snap = after or before
    running = snap.gauges.get(w.RUNNING) if snap else None
    usage, capacity = (snap.gauges.get(w.KV_USAGE), snap.gauges.get(w.KV_CAPACITY)) if snap else (None, None)
    kv_tokens = usage * capacity if usage is not None and capacity else None
    kv_b = 1.0 if "fp8" in str(conf.get("kv_dtype") or "") else 2.0
    per_tok = rf.kv_bytes_per_token(hf, kv_b, tp)
    weight_gb = _weight_gb(hf, tp)
    step_s = s["step_ms"] / 1000 if s.get("step_ms") else None
    quant = conf.get("quantization") or (hf.get("quantization_config") or {}).get("quant_method")
    flops = rf.decode_flops_per_gpu(hf, running or 0, tp) if running else None
    read_gb, expert_gb, touched = rf.weights_read_gb(hf, quant, tp, running, weight_gb)
    out = rf.roofline(gpu=gpu, step_s=step_s, weight_gb=read_gb, kv_read_gb=(kv_tokens * per_tok / 1e9) if kv_tokens and per_tok else None,
                      flops_per_step=flops, quantization=str(quant) if quant else None)  # fmt: skip
    out["weight_gb"] = weight_gb
    out["weight_read_gb"] = None if read_gb is None else round(read_gb, 3)
    out["experts_touched_share"] = None if touched is None else round(touched, 4)
    out["batch"] = running
    if before is not None and after is not None and after.t > before.t:  # --enable-mfu-metrics (0.20+), filed under their concepts
        dt = after.t - before.t
        for key, name, scale in (("mfu_tflops", w.EST_FLOPS, 1e12),
                                 ("mfu_read_gbps", w.EST_READ_BYTES, 1e9)):  # fmt: skip
            a, b = before.counters.get(name), after.counters.get(name)
            if a is not None and b is not None and b >= a:
                out[key] = round((b - a) / dt / scale, 3)
        if out.get("mfu_tflops") is not None and out.get("peak_tflops"):
            out["mfu_flops_share"] = round(out["mfu_tflops"] / out["peak_tflops"], 5)
        if out.get("mfu_read_gbps") is not None and out.get("peak_dram_gbps"):
            out["mfu_bandwidth_share"] = round(out["mfu_read_gbps"] / out["peak_dram_gbps"], 4)
    moe_ms = s["shares"]["moe_gemm"] * s["step_ms"]
    if expert_gb and gpu and gpu.dram_gbps.value and moe_ms > 0:
        out["moe_roofline_ms"] = round(expert_gb * (1.0 if touched is None else touched) / gpu.dram_gbps.value * 1000, 3)
        out["moe_roofline_share"] = round(out["moe_roofline_ms"] / moe_ms, 4)
    out["weight_gb_source"] = WEIGHT_SOURCE if weight_gb else None
    out["kv_bytes_per_token"] = round(per_tok) if per_tok else None
    out["kv_source"] = "model config (layers x KV heads x head dim)" if per_tok else None
    return out


__all__ = ["VllmProfile", "VllmProfileValues"]
