"""A real HTTP server on 127.0.0.1 that speaks vLLM's API, with the V1 scheduler's behaviour, per release.

Endpoints (shared/reference/vllm-and-fleet.md §2): `/version`, `/v1/models` (owned_by vllm, root, max_model_len),
`/health`, `/ping`, `/metrics` (always mounted), `/v1/completions` (streaming, `stream_options.include_usage`,
`ignore_eos`), and `/server_info?config_format=json` only in dev mode (VLLM_SERVER_DEV_MODE=1). No `/generate`.

The scheduler is V1's (vllm/v1/core/sched/scheduler.py): running requests are scheduled first, each with the tokens
it has not computed yet up to the step's token budget (`max_num_batched_tokens`): one for a decode, the rest of a
prompt for a request whose prefill was chunked; a request whose tokens need a KV block when none is free preempts the
last-admitted running request (its blocks freed, it goes back to the front of the waiting queue and is recomputed
later: `num_preemptions`); then waiting requests are admitted while fewer than `max_num_seqs` run, the budget lasts
and their blocks are free, the last one chunked to what the budget leaves (chunked prefill, on in V1). So a pass
holds new prompt tokens and decodes together (a mixed pass) whenever requests arrive; a request samples its next
token only in the step that computes its last prompt token or its last token. KV is allocated on demand by block: no
reservation for the tokens a request will still generate (unlike SGLang's admission estimate). Token counters move
every engine step; gauges are written every step. A pass runs as its CUDA-graph mode says (FULL_AND_PIECEWISE by
default: a decode-only batch up to the largest capture size in a full graph, a mixed one in piecewise graphs, a larger
one eagerly; every pass eagerly with `enforce_eager`).

`/start_profile` and `/stop_profile` exist only where the release's profiler is on (`VLLM_TORCH_PROFILER_DIR` through
0.12, `--profiler-config` from 0.13) and write what the release writes (engine/sim/profiler.py, the vLLM section).

Metric names and labels by release come from probes/vllm/facts.py: the KV usage gauge's rename (0.9.2) and the
old name hidden in 0.11 (`show_hidden_metrics_for_version`), `engine` labels, `cache_config_info` (and its 0.24
labels), inter-token latency from 0.10.2, waiting by reason from 0.20.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import deque
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from gpu_runbook.probes.vllm import facts
from .faults import SimFaults
from ..model_shape import shape_of
from .sglang_server import SimServer
from .profiler import VllmPass, add_vllm_profile_routes, vllm_server_cwd
from .vllm_profiler_config import vllm_profiler_setting, vllm_release
from .vllm_spec import VllmSpec
from .sim_state import E2E_BUCKETS, ITL_BUCKETS, QUEUE_BUCKETS, TTFT_BUCKETS, Histogram, SimState


class VllmSimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    version: str = "0.11.0"
    model_root: str = "Qwen/Qwen3-32B"  # the model's directory (the simulated host's temp dir) or repo
    served_model_name: str = "Qwen/Qwen3-32B"
    max_model_len: int = 40960
    kv_tokens: int = 389120  # per DP engine
    spec: VllmSpec = Field(default_factory=VllmSpec)
    gpu_memory_mib: int = 97887
    gpu_name: str = ""
    nvlink: bool = False
    hf_config: dict[str, Any] = Field(default_factory=dict)
    hf_quant_config: dict[str, Any] | None = None
    step_base_ms: float = 20.0
    step_per_req_ms: float = 0.05
    prefill_ms_per_1k_tokens: float = 2.0
    api_key: str | None = None
    faults: SimFaults = Field(default_factory=SimFaults)
    host: str = "127.0.0.1"
    port: int = 0


class _Req:
    __slots__ = ("rid", "input_len", "max_new", "generated", "blocks", "arrival", "admitted", "first", "last", "resp",
                 "done", "aborted", "include_usage", "model", "preemptions", "computed", "scheduled_before")  # fmt: skip

    def __init__(self, rid: str, input_len: int, max_new: int, model: str, include_usage: bool) -> None:
        self.rid, self.input_len, self.max_new, self.model, self.include_usage = rid, input_len, max_new, model, include_usage
        self.generated = 0
        self.blocks = 0
        self.arrival = time.monotonic()
        self.admitted = 0.0
        self.first = 0.0
        self.last = 0.0
        self.resp: web.StreamResponse | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.aborted = False
        self.preemptions = 0
        self.computed = 0  # tokens whose KV is computed (num_computed_tokens); 0 again after a preemption
        self.scheduled_before = False  # a later schedule sends it as a cached request (scheduled_cached_reqs)


class _VllmEngine:
    """The V1 scheduler loop and the HTTP handlers, on the server thread's loop."""

    def pending(self) -> list:
        """Requests not finished: aborted when the server stops."""
        return list(self.running) + list(self.waiting)

    def __init__(self, cfg: VllmSimConfig, state: SimState) -> None:
        self.cfg, self.state, s = cfg, state, cfg.spec
        self.max_num_seqs = s.max_num_seqs or facts.default_max_num_seqs(cfg.version, cfg.gpu_memory_mib / 1024, cfg.gpu_name) or 256
        self.num_blocks = max(1, cfg.kv_tokens // s.block_size)
        self.free_blocks = self.num_blocks
        graphs_on = not s.enforce_eager
        default_graph = facts.default_graph_max_bs(cfg.version, self.max_num_seqs) or 512
        self.graph_max = (s.max_cudagraph_capture_size if s.max_cudagraph_capture_size is not None else default_graph) if graphs_on else 0
        # enforce_eager: NONE (vllm==0.34.0:vllm/config/vllm.py:1697-1699); unset: FULL_AND_PIECEWISE on V1 from 0.11
        # (vllm==0.11.0:vllm/config/__init__.py:358-366; vllm==0.34.0:vllm/config/vllm.py:339, -O2 the default level),
        # PIECEWISE before (vllm==0.10.2:vllm/config/__init__.py:3389-3393; vllm==0.8.5:vllm/config.py:3893 piecewise graphs)
        default_mode = "FULL_AND_PIECEWISE" if vllm_release(cfg.version) >= (0, 11, 0) else "PIECEWISE"
        self.cudagraph_mode = "NONE" if s.enforce_eager else (s.cudagraph_mode or default_mode)
        if self.cudagraph_mode == "NONE":
            self.graph_max = 0
        self.profiler = None  # the release's profiler, where the launch settings turn it on (app())
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.wake = asyncio.Event()
        self.created = int(time.time())
        self.counter = 0
        self.preemptions = 0
        self.prompt_tokens = 0
        self.success = 0
        self.task: asyncio.Task[None] | None = None
        self.ttft, self.itl, self.e2e, self.queue = (Histogram(TTFT_BUCKETS), Histogram(ITL_BUCKETS), Histogram(E2E_BUCKETS),
                                                      Histogram(QUEUE_BUCKETS))  # fmt: skip
        shape = shape_of({**cfg.hf_config}, cfg.hf_quant_config) if cfg.hf_config else None
        state.max_running_requests = self.max_num_seqs * s.data_parallel_size
        state.max_total_num_tokens = self.num_blocks * s.block_size
        state.dp_size = s.data_parallel_size
        state.cuda_graph_max_bs = self.graph_max
        state.tp_size = s.tensor_parallel_size
        state.mem_fraction_static = s.gpu_memory_utilization
        state.allreduce_bytes_per_token = shape.allreduce_bytes_per_token() if shape is not None else 0.0

    # ---- scheduler ---------------------------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.cfg.spec.block_size)

    def _preempt(self) -> None:
        """Free the last-admitted running request's blocks; it waits again at the front and recomputes (V1 `_preempt_request`)."""
        r = self.running.pop()
        self.free_blocks += r.blocks
        r.blocks = 0
        r.computed = 0  # vllm==0.11.0:vllm/v1/core/sched/scheduler.py:268 `num_computed_tokens = 0`
        r.preemptions += 1
        self.preemptions += 1
        self.state.retracted_requests_total += 1
        self.waiting.appendleft(r)

    def _schedule(self) -> list[tuple[_Req, int, bool]]:
        """One step's schedule (V1 `Scheduler.schedule`, vllm==0.11.0:vllm/v1/core/sched/scheduler.py:179-546): the running
        requests first, each `min(tokens not computed yet, budget left)` tokens (one for a decode, the rest of a chunked
        prompt), preempting the last-admitted request when a block is missing; then waiting requests, chunked to the
        budget left (chunked prefill, on by default in V1: :431-437). Returns (request, tokens, first time scheduled)."""
        budget = self.cfg.spec.max_num_batched_tokens
        preempted_before = self.preemptions
        out: list[tuple[_Req, int, bool]] = []
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = min(r.input_len + r.generated - r.computed, budget)
            if n <= 0:
                i += 1
                continue
            need = self._blocks_for(r.computed + n + 1) - r.blocks
            while need > self.free_blocks and len(self.running) > i + 1:
                self._preempt()
            if need > self.free_blocks:  # it is the last one itself: preempt it
                self._preempt()
                break
            self.free_blocks -= need
            r.blocks += need
            budget -= n
            out.append((r, n, False))
            i += 1
        # V1 admits no waiting request in a step that preempted one (scheduler.py: `if not preempted_reqs`)
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0 and self.preemptions == preempted_before:
            r = self.waiting[0]
            if r.aborted:
                self.waiting.popleft()
                continue
            n = min(r.input_len + r.generated - r.computed, budget)  # a preempted request recomputes what it had
            blocks = self._blocks_for(r.computed + n + 1) - r.blocks
            if blocks > self.free_blocks:
                break
            self.waiting.popleft()
            self.free_blocks -= blocks
            r.blocks += blocks
            budget -= n
            if r.admitted == 0.0:
                r.admitted = time.monotonic()
                self.queue.observe(r.admitted - r.arrival)
            self.running.append(r)
            out.append((r, n, not r.scheduled_before))
        self.prompt_tokens += sum(n for r, n, _ in out if r.computed < r.input_len)
        return out

    def _pass_record(self, sched: list[tuple[_Req, int, bool]], dur_s: float) -> VllmPass:
        """What the worker's annotation reads of this step (SchedulerOutput), and how the pass runs (CUDA-graph mode)."""
        rec = VllmPass(time.time(), dur_s, len(sched), float(self.state.allocated_tokens))
        for r, n, first in sched:
            seq = r.computed + n
            if first:
                rec.new_reqs += 1
            else:
                rec.cached_reqs += 1
            if r.generated == 0:  # a context request: no output token yet (vllm==0.14.0:vllm/v1/utils.py:447-466)
                rec.ctx_reqs, rec.ctx_tokens, rec.ctx_sk = rec.ctx_reqs + 1, rec.ctx_tokens + n, rec.ctx_sk + seq
                rec.ctx_sqsq, rec.ctx_sqsk = rec.ctx_sqsq + n * n, rec.ctx_sqsk + n * seq
            else:
                rec.gen_reqs, rec.gen_tokens, rec.gen_sk = rec.gen_reqs + 1, rec.gen_tokens + n, rec.gen_sk + seq
                rec.gen_sqsq, rec.gen_sqsk = rec.gen_sqsq + n * n, rec.gen_sqsk + n * seq
            rec.max_seq = max(rec.max_seq, seq)
        tokens = rec.ctx_tokens + rec.gen_tokens
        rec.tokens = tokens
        decode_only = rec.ctx_reqs == 0 and tokens == len(sched)
        rec.mode = "DECODE" if decode_only else ("EXTEND" if rec.gen_reqs == 0 else "MIXED")
        mode, fits = self.cudagraph_mode, 0 < tokens <= self.graph_max
        if mode == "FULL_AND_PIECEWISE":
            rec.graph = ("FULL" if decode_only else "PIECEWISE") if fits else "NONE"
        elif mode == "FULL_DECODE_ONLY":
            rec.graph = "FULL" if decode_only and fits else "NONE"
        elif mode in ("FULL", "PIECEWISE"):
            rec.graph = mode if fits else "NONE"
        return rec

    def _refresh(self) -> None:
        st = self.state
        st.running, st.queued = len(self.running), len(self.waiting)
        st.peak_running, st.peak_queued = max(st.peak_running, st.running), max(st.peak_queued, st.queued)
        used = self.num_blocks - self.free_blocks
        st.allocated_tokens = used * self.cfg.spec.block_size
        st.token_usage = used / self.num_blocks

    async def loop(self) -> None:
        cfg, st = self.cfg, self.state
        spent = 0.0
        while True:
            if not self.running and not self.waiting:
                self._refresh()
                self.wake.clear()
                await self.wake.wait()
                spent = 0.0
            sched = self._schedule()
            self._refresh()
            batch = len(self.running)
            prefill = sum(n for r, n, _ in sched if n > 1 or r.generated == 0)  # prompt chunks and recomputes
            step = cfg.step_base_ms + cfg.step_per_req_ms * batch + cfg.prefill_ms_per_1k_tokens * prefill / 1000
            if st.step_scale_fn is not None:
                step *= st.step_scale_fn()
            st.step_time_s, st.step_tokens, st.prefill_tokens_last_step = step / 1000, sum(n for _, n, _ in sched), prefill
            await asyncio.sleep(max(0.0, step / 1000 - spent))
            now = time.monotonic()
            st.busy_seconds += step / 1000
            st.last_step_at = now
            if batch:
                st.decode_steps += 1
                st.step_eager = not (self.graph_max and batch <= self.graph_max)
                if st.step_eager:
                    st.eager_decode_passes += 1
                else:
                    st.graph_decode_passes += 1
            if sched and st.pass_listeners:
                rec = self._pass_record(sched, step / 1000)
                for fn in list(st.pass_listeners):
                    fn(rec)
            await self._emit(now, sched)
            self._refresh()
            spent = time.monotonic() - now

    async def _emit(self, now: float, sched: list[tuple[_Req, int, bool]]) -> None:
        """The step's outputs: a request whose tokens are all computed now samples one (a chunk short of its prompt's end
        samples nothing); aborted requests leave."""
        st = self.state
        done: set[int] = set()
        for r, n, _ in sched:
            r.computed += n
            r.scheduled_before = True
            if r.aborted:
                self._finish(r, now, completed=False)
                done.add(id(r))
                continue
            if r.computed < r.input_len + r.generated:
                continue  # a chunk of a longer prompt: its next chunk goes first in the next step
            r.generated += 1
            st.live_generated_tokens += 1
            st.generation_tokens_total += 1  # vLLM counts tokens per engine step
            if r.first == 0.0:
                r.first = now
                self.ttft.observe(now - r.arrival)
            else:
                self.itl.observe(now - r.last)
            r.last = now
            finished = r.generated >= r.max_new
            if r.resp is not None:
                try:
                    await r.resp.write(self._chunk(r, finished))
                except Exception:  # noqa: BLE001 - the client went away
                    r.aborted = True
                    self._finish(r, now, completed=False)
                    done.add(id(r))
                    continue
            if finished:
                self._finish(r, now, completed=True)
                done.add(id(r))
        for r in self.running:
            if r.aborted and id(r) not in done:
                self._finish(r, now, completed=False)
                done.add(id(r))
        self.running = [r for r in self.running if id(r) not in done]

    def _finish(self, r: _Req, now: float, *, completed: bool) -> None:
        self.free_blocks += r.blocks
        r.blocks = 0
        if completed:
            self.success += 1
            self.state.completed_requests += 1
            self.e2e.observe(now - r.arrival)
        else:
            self.state.aborted_requests += 1
        if not r.done.done():
            r.done.set_result(None)

    def _chunk(self, r: _Req, finished: bool) -> bytes:
        head = b'data: {"id":"cmpl-%s","object":"text_completion","created":%d,"model":"%s","choices":' % (
            r.rid.encode(), self.created, r.model.encode())
        fr = b'"length"' if finished else b"null"
        event = head + b'[{"index":0,"text":" tok","logprobs":null,"finish_reason":%s,"stop_reason":null}],"usage":null}\n\n' % fr
        if finished:
            if r.include_usage:
                event += head + b'[],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}\n\n' % (
                    r.input_len, r.input_len + r.generated, r.generated)
            event += b"data: [DONE]\n\n"
        return event

    # ---- /metrics -----------------------------------------------------------------------------------

    def metrics(self) -> str:
        v, s = self.cfg.version, self.cfg.spec
        lines: list[str] = []
        labels = f'engine="0",model_name="{self.cfg.served_model_name}"'

        def metric(name: str, kind: str, help_: str, value: float, extra: str = "") -> None:
            base = name.removesuffix("_total") if kind == "counter" else name
            lines.append(f"# HELP {base} {help_}")
            lines.append(f"# TYPE {base} {kind}")
            lines.append(f"{name}{{{labels}{extra}}} {value!r}")

        def histogram(name: str, h: Histogram, help_: str) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} histogram")
            total = 0
            for bound, count in zip(list(h.bounds) + [math.inf], h.counts):
                total += count
                le = "+Inf" if math.isinf(bound) else repr(float(bound))
                lines.append(f'{name}_bucket{{{labels},le="{le}"}} {float(total)!r}')
            lines.append(f"{name}_count{{{labels}}} {float(h.count)!r}")
            lines.append(f"{name}_sum{{{labels}}} {h.total!r}")

        st = self.state
        metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", float(st.running))
        metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", float(st.queued))
        if facts.at_least(v, facts.WAITING_BY_REASON_SINCE):
            metric("vllm:num_requests_waiting_by_reason", "gauge", "Waiting requests by reason.", float(st.queued), ',reason="capacity"')
        usage = (self.num_blocks - self.free_blocks) / self.num_blocks
        old_name, new_name = facts.KV_USAGE_NAMES[0][0], facts.KV_USAGE_NAMES[1][0]
        hidden = facts.at_least(v, "0.11.0")  # deprecated in 0.9.2, hidden in 0.11, gone after
        if not hidden or (not facts.at_least(v, "0.12.0") and s.show_hidden_metrics_for_version == "0.10"):
            metric(old_name, "gauge", "GPU KV-cache usage. 1 means 100 percent usage.", usage)
        if facts.at_least(v, facts.KV_USAGE_NAMES[1][1]):
            metric(new_name, "gauge", "KV-cache usage. 1 means 100 percent usage.", usage)
        if s.enable_prefix_caching:  # random prompts share no prefix: queries grow, hits stay 0
            if not hidden or (not facts.at_least(v, "0.12.0") and s.show_hidden_metrics_for_version == "0.10"):
                metric("vllm:gpu_prefix_cache_queries_total", "counter", "GPU prefix cache queries, in tokens.", float(self.prompt_tokens))
                metric("vllm:gpu_prefix_cache_hits_total", "counter", "GPU prefix cache hits, in tokens.", 0.0)
            if facts.at_least(v, facts.KV_USAGE_NAMES[1][1]):  # renamed with the KV usage gauge (0.9.2)
                metric("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in tokens.", float(self.prompt_tokens))
                metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens.", 0.0)
        metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", float(self.preemptions))
        metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", float(self.prompt_tokens))
        metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", float(st.generation_tokens_total))
        metric("vllm:request_success_total", "counter", "Count of successfully processed requests.", float(self.success),
               ',finished_reason="length"')
        histogram("vllm:time_to_first_token_seconds", self.ttft, "Histogram of time to first token in seconds.")
        itl_name = "vllm:inter_token_latency_seconds" if facts.at_least(v, facts.ITL_SINCE) else "vllm:time_per_output_token_seconds"
        histogram(itl_name, self.itl, "Histogram of inter-token latency in seconds.")
        histogram("vllm:e2e_request_latency_seconds", self.e2e, "Histogram of e2e request latency in seconds.")
        histogram("vllm:request_queue_time_seconds", self.queue, "Histogram of time spent in WAITING phase for request.")
        info = {"block_size": str(s.block_size), "cache_dtype": s.cache_dtype, "enable_prefix_caching": str(s.enable_prefix_caching),
                "gpu_memory_utilization": str(s.gpu_memory_utilization), "num_gpu_blocks": str(self.num_blocks),
                "num_cpu_blocks": "None", "swap_space": "4", "sliding_window": "None"}  # fmt: skip
        if facts.at_least(v, facts.KV_SIZE_LABELS_SINCE):
            info["kv_cache_size_tokens"] = str(self.num_blocks * s.block_size)
            info["kv_cache_max_concurrency"] = f"{self.num_blocks * s.block_size / self.cfg.max_model_len:.2f}"
        extra = "".join(f',{k}="{val}"' for k, val in info.items())
        metric("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", 1.0, extra)
        return "\n".join(lines) + "\n"

    # ---- HTTP ------------------------------------------------------------------------------------------

    def server_info(self) -> dict[str, Any]:
        s = self.cfg.spec
        body: dict[str, Any] = {"vllm_config": {
            "model_config": {"model": self.cfg.model_root, "dtype": f"torch.{s.dtype}", "quantization": s.quantization,
                             "max_model_len": self.cfg.max_model_len, "enforce_eager": s.enforce_eager,
                             "served_model_name": self.cfg.served_model_name},
            "cache_config": {"block_size": s.block_size, "cache_dtype": s.cache_dtype, "gpu_memory_utilization": s.gpu_memory_utilization,
                             "num_gpu_blocks": self.num_blocks, "enable_prefix_caching": s.enable_prefix_caching},
            "parallel_config": {"tensor_parallel_size": s.tensor_parallel_size, "pipeline_parallel_size": s.pipeline_parallel_size,
                                "data_parallel_size": s.data_parallel_size, "enable_expert_parallel": s.enable_expert_parallel,
                                "disable_custom_all_reduce": s.disable_custom_all_reduce},
            "scheduler_config": {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens},
            "compilation_config": {"cudagraph_mode": self.cudagraph_mode, "max_cudagraph_capture_size": self.graph_max},
        }}
        v = vllm_release(self.cfg.version)
        if v >= (0, 17, 0):  # KernelConfig.moe_backend, --moe-backend (vllm==0.17.0:vllm/engine/arg_utils.py:1236-1238)
            body["vllm_config"]["kernel_config"] = {"moe_backend": s.moe_backend}
        if v >= (0, 13, 0):  # VllmConfig.profiler_config (vllm==0.13.0:vllm/v1/worker/gpu_worker.py:98), as resolved
            prof = vllm_profiler_setting(self.cfg.version, s, vllm_server_cwd(self.cfg))
            body["vllm_config"]["profiler_config"] = {
                "profiler": prof.kind if prof else None, "torch_profiler_dir": (prof.directory or "") if prof else "",
                "max_iterations": prof.max_iterations if prof else 0, "torch_profiler_use_gzip": prof.use_gzip if prof else True,
                "ignore_frontend": not prof.frontend if prof else False}
        if v >= (0, 14, 0):  # the VLLM_* environment (vllm==0.14.0:vllm/entrypoints/serve/instrumentator/server_info.py:22-48)
            body["vllm_env"] = dict(sorted({**s.env, "VLLM_SERVER_DEV_MODE": "1"}.items()))
        return body  # fmt: skip

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        faults = self.cfg.faults
        if (code := faults.status_code.get(request.path)) is not None:
            return web.json_response({"object": "error", "message": f"simulated HTTP {code}"}, status=code)
        if self.cfg.api_key and request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {self.cfg.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.middleware], client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.ok)
        r.add_get("/ping", self.ok)
        r.add_get("/version", self.version)
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.metrics_handler)
        r.add_post("/v1/completions", self.completions)
        if self.cfg.spec.dev_mode:
            r.add_get("/server_info", self.server_info_handler)
        self.profiler = add_vllm_profile_routes(app, self)  # only where the release's profiler is on
        return app

    async def ok(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.cfg.version})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.cfg.served_model_name, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": self.cfg.model_root, "parent": None, "max_model_len": self.cfg.max_model_len, "permission": []}]})  # fmt: skip

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics(), content_type="text/plain")

    async def server_info_handler(self, request: web.Request) -> web.Response:
        body = self.server_info()
        if not facts.at_least(self.cfg.version, facts.SERVER_INFO_JSON_SINCE) or request.query.get("config_format") != "json":
            body = {**body, "vllm_config": str(body["vllm_config"])}  # the text form (the only one before config_format)
        return web.json_response(body)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.json_response({"object": "error", "message": "invalid JSON"}, status=400)
        prompt = body.get("prompt")
        n_in = len(prompt) if isinstance(prompt, list) else max(1, len(str(prompt).split()))
        max_new = int(body.get("max_tokens") or 16)
        if n_in + max_new > self.cfg.max_model_len:
            return web.json_response({"object": "error", "message": "too long", "code": 400}, status=400)
        self.counter += 1
        req = _Req(str(self.counter), n_in, max_new, str(body.get("model") or self.cfg.served_model_name),
                   bool((body.get("stream_options") or {}).get("include_usage")))  # fmt: skip
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            try:
                await resp.prepare(request)
            except ConnectionResetError:  # the client left before the headers went out (a load stopping)
                return resp  # aiohttp's finish_response meets the closed transport again and lets it go quietly
            req.resp = resp
        self.waiting.append(req)
        self.wake.set()
        try:
            await req.done
        except asyncio.CancelledError:
            req.aborted = True
            raise
        if req.resp is not None:
            return req.resp
        return web.json_response({"id": f"cmpl-{req.rid}", "object": "text_completion", "choices": [
            {"index": 0, "text": " tok" * req.generated, "finish_reason": "length"}],
            "usage": {"prompt_tokens": n_in, "completion_tokens": req.generated, "total_tokens": n_in + req.generated}})  # fmt: skip


class VllmSimServer(SimServer):
    """The simulated vLLM server on its own thread (the thread and lifecycle of SimServer, vLLM's engine and app)."""

    def __init__(self, config: VllmSimConfig) -> None:
        super().__init__()
        self.vllm_config = config

    @property
    def version(self) -> str:
        return self.vllm_config.version

    def _engine(self) -> "_VllmEngine":
        return _VllmEngine(self.vllm_config, self.state)

    def _address(self) -> tuple[str, int]:
        return self.vllm_config.host, self.vllm_config.port
