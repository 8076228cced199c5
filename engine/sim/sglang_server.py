"""A real HTTP server on 127.0.0.1 that speaks SGLang's API, with SGLang's scheduling model.

Used by `runbook run --simulate` (the simulated host) and by the tests. It serves the endpoints the
probes read, per SGLang version (`/get_server_info` only on 0.5.5; `/server_info` from 0.5.6), and a
scheduler loop that behaves like SGLang's (shared reference sglang-versions.md §7, §9):

* admission is optimistic: a new request must fit with its whole `max_new_tokens`, running ones are
  counted at `remaining x new_token_ratio` (0.7 decaying to 0.098 over 600 decode steps), within
  the effective running cap and the per-batch prefill budget (`max_prefill_tokens`);
* each decode step gives every running request one KV slot; when the pool is full the scheduler
  retracts requests back to the queue (fewest generated tokens first) and raises the ratio;
* gauges are written at each prefill batch and every `decode_log_interval` decode steps, token
  counters when a request finishes; `--num-continuous-decode-steps` is read by no covered release
  (only declared), so it changes nothing here either; `stream_interval` sets tokens per chunk.

Prefill runs as its own forward passes (EXTEND) between decode passes, as the release's scheduler
does (a new prefill batch goes first; with `--enable-mixed-chunk`, off by default, it runs together with the
running decodes as one MIXED pass; a prompt longer than
`chunked_prefill_size` runs as several EXTEND passes back to back). A decode pass lasts
`step_base_ms + step_per_req_ms * batch`, an EXTEND pass `prefill_ms_per_1k_tokens` per 1k tokens but
never less than `step_base_ms` (any forward pass reads the weights once: a one-request prefill is not free);
ITL, E2E, the gauges, the PCIe bytes and the profiler's traces all follow this one timeline. The live `SimState` is
what the simulated GPUs read. It runs in its own thread with its own event loop, so sync tests and
the async runner can both use it and its CPU time is measurable apart from the client's.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import deque
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from .sglang_info import (
    HostFacts,
    InfoInputs,
    decode_graph_enabled,
    dp_size_of,
    effective_running_cap,
    has_new_info_endpoints,
    is_refactored,
    model_info_body,
    models_body,
    resolve_server_args,
    server_info_body,
    version_tuple,
)
from .faults import SimFaults
from .profiler import add_profile_routes
from ..model_shape import kv_cache_quant_algo
from .sglang_metrics import MetricsStatic, render
from .sim_state import PassRecord, SimState

INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO (0.5.5.post3 environ.py:164-168)
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096


class SimServerConfig(BaseModel):
    """What the simulated SGLang server is, what it runs on, and how fast it generates."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    version: str = "0.5.5.post3"
    model_path: str = "Qwen/Qwen3-32B"
    served_model_name: str | None = None  # default: model_path
    model_type: str | None = "qwen3"
    architectures: list[str] | None = Field(default_factory=lambda: ["Qwen3ForCausalLM"])
    context_len: int = 40960
    server_args: dict[str, Any] = Field(default_factory=dict)  # the flags passed (0.5.5 names or the release's own)
    api_key: str | None = None
    enable_metrics: bool = True
    # The model and GPU start-up resolution looks at (defaults: Qwen3-32B TP2 on RTX PRO 6000, like the 0.5.5 fixture).
    hf_config: dict[str, Any] = Field(default_factory=lambda: dict(QWEN3_32B))
    hf_quant_config: dict[str, Any] | None = None
    gpu_compute_major: int = 12
    gpu_memory_mib: int = 97887
    env: dict[str, str] = Field(default_factory=dict)  # SGLANG_* variables the server was started with
    # Batch model.
    max_running_requests: int = 1024  # --max-running-requests
    report_max_running_requests: bool = True  # False: the flag is unset (server_info null; the scheduler's default cap)
    max_total_num_tokens: int = 389120  # KV capacity in tokens (per DP rank)
    step_base_ms: float = 20.0
    step_per_req_ms: float = 0.05
    prefill_ms_per_1k_tokens: float = 2.0
    num_continuous_decode_steps: int = 1  # reported only: no covered release reads it
    stream_interval: int | None = None  # tokens per stream chunk (default: the server_args value, 1)
    faults: SimFaults = Field(default_factory=SimFaults)
    host: str = "127.0.0.1"
    port: int = 0  # 0: ephemeral


QWEN3_32B = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64,
             "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600, "vocab_size": 151936}  # fmt: skip


_WORDS = [w.encode() for w in "the of and to in is was for on as with by at from that this it are be or an".split()]


def _host_facts(cfg: SimServerConfig) -> HostFacts:
    return HostFacts(sm_major=cfg.gpu_compute_major, gpu_memory_mib=cfg.gpu_memory_mib, hf_config=cfg.hf_config,
                     hf_quant_config=cfg.hf_quant_config, architectures=cfg.architectures)  # fmt: skip


def served_args(cfg: SimServerConfig) -> dict[str, Any]:
    """ServerArgs as the release resolves this server's flags on its host: what `/server_info` shows and
    the profiler's kernels follow."""
    passed = dict(cfg.server_args)
    passed["enable_metrics"] = cfg.enable_metrics
    passed["num_continuous_decode_steps"] = cfg.num_continuous_decode_steps
    passed["max_running_requests"] = cfg.max_running_requests if cfg.report_max_running_requests else None
    if cfg.stream_interval is not None:
        passed["stream_interval"] = cfg.stream_interval
    served = cfg.served_model_name or cfg.model_path
    args = resolve_server_args(cfg.version, passed, _host_facts(cfg), model_path=cfg.model_path, served_model_name=served, seed_name=served)
    args["_passed_max_running_requests"] = passed["max_running_requests"]
    return args


class _Req:
    __slots__ = (
        "rid", "kind", "stream", "input_len", "max_new", "model", "include_usage", "resp", "done",
        "generated", "text", "ids", "arrival", "admitted", "first", "last", "cut", "aborted", "transport",
        "retractions", "unsent", "ignore_eos",
    )  # fmt: skip

    def __init__(self, rid: str, kind: str, stream: bool, input_len: int, max_new: int, model: str, include_usage: bool) -> None:
        self.rid, self.kind, self.stream = rid, kind, stream
        self.input_len, self.max_new, self.model, self.include_usage = input_len, max_new, model, include_usage
        self.resp: web.StreamResponse | None = None
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.generated = 0
        self.text: list[bytes] = []
        self.ids: list[bytes] = []
        self.arrival = time.monotonic()
        self.admitted = self.first = self.last = 0.0
        self.cut = self.aborted = False
        self.retractions = 0
        self.unsent = 0  # tokens generated but not yet written to the stream (stream_interval)
        self.ignore_eos = True

    @property
    def slots(self) -> int:
        """KV slots this request holds while running: its prompt plus every token generated so far."""
        return self.input_len + self.generated


class _Engine:
    """The scheduler loop and the HTTP handlers; lives entirely on the server thread's loop."""

    def pending(self) -> list:
        """Requests not finished: aborted when the server stops."""
        return list(self.running) + list(self.queue)

    def __init__(self, cfg: SimServerConfig, state: SimState) -> None:
        self.cfg = cfg
        self.state = state
        self.served = cfg.served_model_name or cfg.model_path
        self.host_facts = _host_facts(cfg)
        self.args = served_args(cfg)
        self.dp = dp_size_of(self.args)
        self.flag = self.args["_passed_max_running_requests"]
        self.cap_per_dp = effective_running_cap(self.flag, max_total_num_tokens=cfg.max_total_num_tokens,
                                                context_len=cfg.context_len, dp_size=self.dp)  # fmt: skip
        self.capacity = cfg.max_total_num_tokens * self.dp
        self.cap = self.cap_per_dp * self.dp
        self.graphs = decode_graph_enabled(self.args)
        self.graph_max_bs = int(self.args.get("cuda_graph_max_bs") or 0) if self.graphs else 0
        self.log_interval = max(1, int(self.args.get("decode_log_interval") or 40))
        # One prefill batch takes at most a chunk (chunked_prefill_size), else max_prefill_tokens (schedule_policy.PrefillAdder).
        chunk = int(self.args.get("chunked_prefill_size") or 0)
        self.prefill_budget = max(1, chunk if chunk > 0 else int(self.args.get("max_prefill_tokens") or 16384))
        # --enable-mixed-chunk: a new prefill batch runs with the running decodes in one MIXED pass, and its chunk budget
        # leaves a token for each of them (0.5.11 scheduler.py:1068-1071, 2626, 2782-2797; schedule_batch.mix_with_running)
        self.mixed_chunk = bool(self.args.get("enable_mixed_chunk")) and chunk > 0
        self.stream_every = max(1, int(self.args.get("stream_interval") or 1))
        self.init_ratio = min(1.0, INIT_NEW_TOKEN_RATIO * float(self.args.get("schedule_conservativeness") or 1.0))
        self.min_ratio = self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self.ratio_decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        state.max_running_requests = self.cap
        state.max_total_num_tokens = self.capacity
        state.dp_size = self.dp
        state.cuda_graph_max_bs = self.graph_max_bs
        state.new_token_ratio = self.init_ratio
        self.shape = self.host_facts.shape()
        tp = int(self.args.get("tp_size") or 1)
        state.tp_size = tp
        state.mem_fraction_static = float(self.args.get("mem_fraction_static") or 0.88)
        state.allreduce_bytes_per_token = self.shape.allreduce_bytes_per_token()
        kv_bytes = 1.0 if str(self.args.get("kv_cache_dtype", "auto")).startswith("fp8") else 2.0
        if str(self.args.get("kv_cache_dtype")) == "auto" and (self.host_facts.hf_quant_config or self.cfg.hf_config.get("quantization_config")):
            if (kv_cache_quant_algo(cfg.hf_config, cfg.hf_quant_config) or "").upper() == "FP8":
                kv_bytes = 1.0  # the model runner picks FP8 from the checkpoint; the args still say auto (§3)
        attn_tp = max(1, tp // self.dp)
        self.weight_gb = self.shape.weight_gb_per_gpu(tp, attn_tp)
        self.kvcache_gb = self.shape.kv_bytes_per_token(kv_bytes, attn_tp) * cfg.max_total_num_tokens / (1 << 30)
        self.graph_gb = (0.87 * self.graph_max_bs / 256) if self.graphs else 0.0
        self.static = MetricsStatic(
            page_size=int(self.args.get("page_size") or 1), context_len=cfg.context_len, weight_gb=self.weight_gb,
            kvcache_gb=self.kvcache_gb, graph_gb=self.graph_gb, startup_available_gb=cfg.gpu_memory_mib / 1024 * 0.985,
            enable_mfu_metrics=bool(self.args.get("enable_mfu_metrics")),
            device_timer=cfg.env.get("SGLANG_ENABLE_METRICS_DEVICE_TIMER", "") in ("1", "true", "True"),
            flops_per_token=2.0 * self.shape.allreduce_bytes_per_token() * 1000 / max(1, tp),
            read_bytes_per_step=self.weight_gb * (1 << 30),
        )  # fmt: skip
        self.new_layout = is_refactored(cfg.version)
        self.queue: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.wake = asyncio.Event()
        self.started = time.monotonic()
        self.created = int(time.time())
        self.counter = 0
        self.tput_window: deque[tuple[float, int]] = deque()
        self.last_log = (time.monotonic(), 0)  # (time, live tokens) at the previous decode log
        self.task: asyncio.Task[None] | None = None

    # ---- scheduler -------------------------------------------------------------------------

    def hung(self) -> bool:
        after = self.cfg.faults.stop_answering_after_s
        return after is not None and time.monotonic() - self.started >= after

    async def loop(self) -> None:
        cfg, st = self.cfg, self.state
        spent = 0.0  # CPU time the last emit took: part of the step, so the modelled rate holds under load
        while True:
            if not self.running and not self.queue:
                st.gen_throughput = 0.0
                self._log(time.monotonic(), decode=True)  # the idle log re-writes the gauges (0 running)
                self.wake.clear()
                idle_from = time.monotonic()
                await self.wake.wait()
                st.idle_seconds += time.monotonic() - idle_from
                spent = 0.0
            if self.hung():
                await asyncio.sleep(3600)
                continue
            decoding = list(self.running)  # the running batch before this admission: what a MIXED pass carries along
            prefill, admitted = self._admit()
            if admitted and self.mixed_chunk and decoding:
                await self._mixed_pass(prefill, admitted, decoding)
                spent = 0.0
                continue
            if admitted:
                # A new prefill batch runs as its own EXTEND pass (scheduler.get_next_batch_to_run: a new
                # prefill batch goes before the running decode batch; mixed chunks are off by default), and
                # gives each request it prefilled its first token; the running requests wait through it.
                st.prefill_batches += 1
                st.extend_passes += 1
                st.realtime_prefill_tokens += prefill
                self._log(time.monotonic(), decode=False)  # prefill batch log
                # A prompt longer than the chunk runs as several EXTEND passes back to back (the chunked
                # request is continued first at the next iteration); the last one gives the first token.
                left = prefill
                longest = max(r.input_len for r in admitted)
                while left > 0:
                    part = min(left, self.prefill_budget)
                    left -= part
                    dur = max(cfg.step_base_ms, cfg.prefill_ms_per_1k_tokens * part / 1000)  # weights read once, at least
                    now, spent = await self._run_pass("EXTEND", dur, len(admitted), part, float(part), spent,
                                                      max_seq=min(longest, prefill - left))
                await self._emit(now, admitted)
                self._update_throughput(now)
                spent = time.monotonic() - now
                continue
            self._make_decode_room()
            batch = len(self.running)
            if not batch:
                continue
            dur = cfg.step_base_ms + cfg.step_per_req_ms * batch
            st.step_eager = not (self.graphs and batch <= self.graph_max_bs)
            now, spent = await self._run_pass("DECODE", dur, batch, batch, 0.75 * st.allocated_tokens, spent)
            st.decode_steps += 1
            if st.step_eager:
                st.eager_decode_passes += 1  # graphs off, or a batch above max_bs runs eagerly
            else:
                st.graph_decode_passes += 1
            st.new_token_ratio = max(self.min_ratio, st.new_token_ratio - self.ratio_decay)
            await self._emit(now, self.running)
            self._update_throughput(now)
            if st.decode_steps % self.log_interval == 0:
                self._log(now, decode=True)
            spent = time.monotonic() - now

    async def _mixed_pass(self, prefill: int, admitted: list[_Req], decoding: list[_Req]) -> None:
        """The new prefill batch mixed with the running decodes (--enable-mixed-chunk): one MIXED pass of its tokens and
        one token of every running request (set_extend_input_len(1)). `_admit` kept the batch within the chunk budget
        less a token a decode, so it is one pass (a prompt that does not fit waits, as a longer one waits unmixed).
        The pass reads the weights once and runs the prefill kernels over all its tokens, with each decode's
        attention over its KV on top; the decodes get their next token and the new requests their first."""
        cfg, st = self.cfg, self.state
        st.prefill_batches += 1
        st.extend_passes += 1
        st.realtime_prefill_tokens += prefill
        self._log(time.monotonic(), decode=False)
        n_dec = len(decoding)
        dur = max(cfg.step_base_ms, cfg.prefill_ms_per_1k_tokens * (prefill + n_dec) / 1000) + cfg.step_per_req_ms * n_dec
        now, _ = await self._run_pass("MIXED", dur, len(admitted) + n_dec, prefill + n_dec, 0.75 * st.allocated_tokens, 0.0,
                                      max_seq=max(r.input_len for r in admitted), prefill_tokens=prefill)
        await self._emit(now, decoding)
        await self._emit(now, admitted)
        self._update_throughput(now)

    async def _run_pass(self, mode: str, dur_ms: float, batch: int, tokens: int, kv_tokens: float, spent: float,
                        max_seq: int = 0, prefill_tokens: int | None = None) -> tuple[float, float]:
        """One forward pass of the modelled length: the live state says what runs, the listeners (the
        profiler) get its record. `spent` (CPU time the previous emit took) is part of the pass, so the
        modelled rate holds on a slow machine. Returns (end time, 0.0)."""
        st = self.state
        if st.step_scale_fn is not None:
            dur_ms *= st.step_scale_fn()
        st.step_time_s = dur_ms / 1000
        st.step_tokens = tokens
        st.pass_mode = mode
        st.prefill_tokens_last_step = prefill_tokens if prefill_tokens is not None else tokens if mode == "EXTEND" else 0
        if mode == "DECODE":
            st.decode_step_time_s = dur_ms / 1000
        await asyncio.sleep(max(0.0, dur_ms / 1000 - spent))
        now = time.monotonic()
        st.busy_seconds += dur_ms / 1000
        st.last_step_at = now
        if st.pass_listeners:
            rec = PassRecord(time.time(), dur_ms / 1000, batch, kv_tokens, mode, tokens, max_seq)
            for fn in list(st.pass_listeners):
                fn(rec)
        return now, 0.0

    def _admit(self) -> tuple[int, list[_Req]]:
        """Optimistic admission (schedule_policy.PrefillAdder): returns (prefill tokens, requests admitted)."""
        st, prefill, admitted = self.state, 0, []
        budget = self.prefill_budget - (len(self.running) if self.mixed_chunk else 0)  # PrefillAdder's mixed_with_decode_tokens
        ratio = st.new_token_ratio
        rem = self.capacity - st.allocated_tokens
        rem -= sum(min(r.max_new - r.generated, CLIP_MAX_NEW_TOKENS) * ratio for r in self.running)
        while self.queue and len(self.running) < self.cap:
            r = self.queue[0]
            if r.aborted:
                self.queue.popleft()
                continue
            extend = r.slots  # a retracted request recomputes its prompt and what it had generated
            need = extend + min(r.max_new - r.generated, CLIP_MAX_NEW_TOKENS) * (1.0 if r.ignore_eos else ratio)
            if self.running or admitted:
                if need > rem or prefill + extend > budget:
                    break  # the KV pool (as estimated) or this batch's prefill budget is used up
            self.queue.popleft()
            rem -= need
            if r.admitted == 0.0:
                r.admitted = time.monotonic()
                st.queue_time.observe(r.admitted - r.arrival)
            st.allocated_tokens += extend
            prefill += extend
            admitted.append(r)
            self.running.append(r)
        self._refresh()
        return prefill, admitted

    def _make_decode_room(self) -> None:
        """Every running request needs one more slot; when the pool cannot give it, retract (scheduler.py update_running_batch)."""
        st = self.state
        if st.allocated_tokens + len(self.running) <= self.capacity or len(self.running) <= 1:
            return
        # SGLang retracts the requests with the fewest output tokens (longest prompt first among equals).
        order = sorted(self.running, key=lambda r: (r.generated, -r.input_len), reverse=True)
        retracted: list[_Req] = []
        while len(order) > 1 and st.allocated_tokens + len(order) > self.capacity:
            r = order.pop()
            st.allocated_tokens -= r.slots
            st.retracted_input_tokens_total += r.input_len
            st.retracted_output_tokens_total += r.generated
            r.retractions += 1
            retracted.append(r)
        st.retracted_since_log += len(retracted)
        st.retracted_requests_total += len(retracted)
        gone = {id(r) for r in retracted}
        self.running = [r for r in self.running if id(r) not in gone]
        for r in reversed(retracted):
            self.queue.appendleft(r)
        decoded = sum(r.generated for r in self.running)
        max_new = sum(r.max_new for r in self.running) or 1
        st.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / max_new)
        self._refresh()

    def _log(self, now: float, *, decode: bool) -> None:
        """Write the gauges, as the scheduler's prefill/decode stats logs do; the retraction gauge restarts at 0."""
        st, lg = self.state, self.state.logged
        lg.num_running_reqs = st.running
        lg.num_queue_reqs = st.queued
        lg.num_used_tokens = st.allocated_tokens
        lg.token_usage = st.token_usage
        lg.new_token_ratio = st.new_token_ratio
        lg.decode_sum_seq_lens = sum(r.slots for r in self.running)
        lg.num_retracted_reqs = st.retracted_since_log
        st.retracted_since_log = 0
        if decode:
            t0, n0 = self.last_log
            lg.gen_throughput = (st.live_generated_tokens - n0) / (now - t0) if now > t0 and st.running else 0.0
            st.realtime_decode_tokens += st.live_generated_tokens - n0
            self.last_log = (now, st.live_generated_tokens)
        lg.logged_at = now
        lg.log_count += 1

    def _refresh(self) -> None:
        st = self.state
        st.running = len(self.running)
        st.queued = len(self.queue)
        st.peak_running = max(st.peak_running, st.running)
        st.peak_queued = max(st.peak_queued, st.queued)
        st.token_usage = min(1.0, st.allocated_tokens / self.capacity) if self.capacity else 0.0

    def _update_throughput(self, now: float) -> None:
        w = self.tput_window
        w.append((now, self.state.live_generated_tokens))
        while len(w) > 2 and now - w[0][0] > 1.0:
            w.popleft()
        t0, n0 = w[0]
        self.state.gen_throughput = (self.state.live_generated_tokens - n0) / (now - t0) if now > t0 else 0.0

    async def _emit(self, now: float, reqs: list[_Req]) -> None:
        """One token for each of `reqs` (the whole running batch after a decode pass, the requests just
        prefilled after an extend pass); finished and aborted requests leave the running batch."""
        st, cut_after = self.state, self.cfg.faults.cut_stream_after_tokens
        gone: set[int] = set()
        for r in list(reqs):
            if r.aborted:
                self._finish(r, now, completed=False)
                gone.add(id(r))
                continue
            i = r.generated
            r.generated += 1
            r.unsent += 1
            st.allocated_tokens += 1
            tid = 1000 + (i * 7919 + len(r.rid)) % 30000
            r.text.append(b" " + _WORDS[tid % len(_WORDS)])
            r.ids.append(str(tid).encode())
            st.live_generated_tokens += 1
            if r.first == 0.0:
                r.first = now
                st.ttft.observe(now - r.arrival)
            else:
                st.itl.observe_n(now - r.last, 1)
            r.last = now
            finished = r.generated >= r.max_new
            if r.stream and r.resp is not None and (finished or r.unsent >= self.stream_every):
                n, r.unsent = r.unsent, 0
                if cut_after is not None and r.generated >= cut_after and not finished:
                    r.cut = True
                    if r.transport is not None:
                        r.transport.abort()  # drop the connection mid-stream, no terminating chunk
                    self._finish(r, now, completed=False)
                    gone.add(id(r))
                    continue
                try:
                    await r.resp.write(self._chunk(r, n, finished, now))
                except Exception:  # the client went away
                    r.aborted = True
                    self._finish(r, now, completed=False)
                    gone.add(id(r))
                    continue
            if finished:
                self._finish(r, now, completed=True)
                gone.add(id(r))
        if gone:
            self.running = [r for r in self.running if id(r) not in gone]
        self._refresh()

    def _finish(self, r: _Req, now: float, *, completed: bool) -> None:
        """Free the request's slots; a finished request adds to the token counters all at once (§9)."""
        st = self.state
        st.allocated_tokens -= r.slots
        if completed:
            st.completed_requests += 1
            st.prompt_tokens_total += r.input_len
            st.generation_tokens_total += r.generated
            st.e2e.observe(now - r.arrival)
            st.retractions.observe(float(r.retractions))
            st.prompt_len.observe(float(r.input_len))
            st.output_len.observe(float(r.generated))
            if r.generated > 1 and r.first:
                st.tpot.observe((now - r.first) / (r.generated - 1))
        else:
            st.aborted_requests += 1
        if not r.done.done():
            r.done.set_result(None)

    # ---- wire formats ------------------------------------------------------------------------

    def _meta(self, r: _Req, finished: bool, now: float) -> bytes:
        fin = b'{"type":"length","length":%d}' % r.max_new if finished else b"null"
        retr = (b'"num_retractions":%d,"reasoning_tokens":0' if self.new_layout else b'"total_retractions":%d') % r.retractions
        tail = b',"e2e_latency":%.6f' % (now - r.arrival) if finished else b""
        return (
            b'{"id":"%s","finish_reason":%s,"prompt_tokens":%d,"weight_version":"default",%s,"completion_tokens":%d,"cached_tokens":0%s}'
            % (r.rid.encode(), fin, r.input_len, retr, r.generated, tail)
        )

    def _chunk(self, r: _Req, n: int, finished: bool, now: float) -> bytes:
        if r.kind == "generate":
            ids = r.ids if self.new_layout else r.ids[-n:]
            event = b'data: {"text":"%s","output_ids":[%s],"meta_info":%s}\n\n' % (
                b"".join(r.text), b",".join(ids), self._meta(r, finished, now))
            return event + (b"data: [DONE]\n\n" if finished else b"")
        head = b'data: {"id":"%s","object":"text_completion","created":%d,"model":"%s","choices":' % (
            r.rid.encode(), self.created, r.model.encode())
        fr = b'"length"' if finished else b"null"
        event = head + b'[{"index":0,"text":"%s","logprobs":null,"finish_reason":%s,"matched_stop":null}],"usage":null}\n\n' % (
            b"".join(r.text[-n:]), fr)
        if finished:
            if r.include_usage:
                event += head + b'[],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"reasoning_tokens":0}}\n\n' % (
                    r.input_len, r.input_len + r.generated, r.generated)
            event += b"data: [DONE]\n\n"
        return event

    # ---- HTTP ----------------------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        path, faults = request.path, self.cfg.faults
        if self.hung():
            await asyncio.sleep(3600)
        if (d := faults.delay_s.get(path)) is not None:
            await asyncio.sleep(d)
        if (code := faults.status_code.get(path)) is not None:
            return web.json_response({"object": "error", "message": f"simulated HTTP {code}", "code": code}, status=code)
        if self.cfg.api_key and not (path.startswith("/health") or path.startswith("/metrics")):
            if request.headers.get("Authorization") != f"Bearer {self.cfg.api_key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        if path in faults.malformed_json:
            return web.Response(text='{"version": "' + self.cfg.version + '", "tp_size": ', content_type="application/json")
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.middleware], client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/get_model_info", self.model_info)
        if has_new_info_endpoints(self.cfg.version):
            r.add_get("/server_info", self.server_info)
            r.add_get("/model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        if self.cfg.enable_metrics:
            r.add_get("/metrics", self.metrics)
        r.add_post("/generate", self.generate)
        r.add_put("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        # Every release read has /flush_cache (GET and POST); bench_serving --flush-cache POSTs it
        # (0.5.23 with ?timeout=60 and raise_for_status(), so a 404 ends the benchmark).
        r.add_get("/flush_cache", self.flush_cache)
        r.add_post("/flush_cache", self.flush_cache)
        add_profile_routes(app, self)
        return app

    async def flush_cache(self, request: web.Request) -> web.Response:
        """As `http_server.flush_cache`: 200 and its text when the scheduler is idle, else 400. From
        0.5.10 `?timeout=S` waits up to S seconds for idle (Scheduler._check_pending_flush)."""
        try:
            timeout = float(request.query.get("timeout", 0.0)) if version_tuple(self.cfg.version) >= (0, 5, 10) else 0.0
        except ValueError:
            return web.json_response({"detail": "timeout: Input should be a valid number"}, status=422)
        deadline = time.monotonic() + max(0.0, timeout)
        while self.running or self.queue:
            if time.monotonic() >= deadline:
                text = "Timed out waiting for idle state." if timeout > 0 else "Flush cache failed.\n"
                return web.Response(text=text, status=400)
            await asyncio.sleep(0.05)
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n"
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def server_info(self, request: web.Request) -> web.Response:
        inputs = InfoInputs(
            max_total_num_tokens=self.cfg.max_total_num_tokens,
            context_len=self.cfg.context_len,
            max_running_requests_flag=self.flag,
            effective_cap_per_dp=self.cap_per_dp,
            weight_gb=self.weight_gb,
            kvcache_gb=self.kvcache_gb,
            graph_gb=self.graph_gb,
            gpu_memory_gib=self.cfg.gpu_memory_mib / 1024,
            last_gen_throughput=self.state.logged.gen_throughput,
            launch_command=self._launch_command(),
            startup_time=round(self.started - time.monotonic() + time.time(), 3),
            env=dict(self.cfg.env),
        )
        return web.json_response(server_info_body(self.cfg.version, self.args, inputs))

    def _launch_command(self) -> str:
        parts = ["python", "-m", "sglang.launch_server", "--model-path", str(self.cfg.model_path)]
        for k, v in self.cfg.server_args.items():
            flag = "--" + k.replace("_", "-")
            if v is True:
                parts.append(flag)
            elif v not in (False, None):
                parts += [flag, str(v)]
        if self.flag is not None:
            parts += ["--max-running-requests", str(self.flag)]
        return " ".join(parts)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(model_info_body(version=self.cfg.version, args=self.args, model_type=self.cfg.model_type, architectures=self.cfg.architectures))

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(models_body(served_model_name=self.served, model_path=self.cfg.model_path, context_len=self.cfg.context_len, created=self.created))

    async def metrics(self, request: web.Request) -> web.Response:
        if self.cfg.faults.malformed_metrics:
            return web.Response(text='sglang:num_running_reqs{model_name="x" 12\n<html>oops', content_type="text/plain")
        text = render(self.state, version=self.cfg.version, model_name=self.served, pid=os.getpid(), static=self.static)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = await request.json()
        except Exception:
            return web.json_response({"object": "error", "message": "invalid JSON body", "code": 400}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"object": "error", "message": "body must be an object", "code": 400}, status=400)
        return body

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.StreamResponse):
            return body
        sp = body.get("sampling_params") or {}
        input_ids = body.pop("input_ids", None)  # not held while the request runs: 36 B a token parsed
        if input_ids is not None:
            input_len = len(input_ids)
        else:
            input_len = max(1, len(str(body.get("text", "")).split()))
        del input_ids
        return await self._serve(request, "generate", bool(body.get("stream")), input_len, int(sp.get("max_new_tokens", 128)), self.served, False,
                                 bool(sp.get("ignore_eos", False)))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.StreamResponse):
            return body
        prompt = body.pop("prompt", "")  # not held while the request runs
        input_len = len(prompt) if isinstance(prompt, list) else max(1, len(str(prompt).split()))
        del prompt
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        model = str(body.get("model", "default"))
        return await self._serve(request, "completions", bool(body.get("stream")), input_len, int(body.get("max_tokens", 16)), model, include_usage,
                                 bool(body.get("ignore_eos", False)))

    async def _serve(self, request: web.Request, kind: str, stream: bool, input_len: int, max_new: int, model: str, include_usage: bool,
                     ignore_eos: bool = False) -> web.StreamResponse:
        self.counter += 1
        r = _Req(f"{self.counter:032x}", kind, stream, input_len, max(1, max_new), model, include_usage)
        r.ignore_eos = ignore_eos
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            try:
                await resp.prepare(request)
            except ConnectionResetError:  # the client left before the headers went out (a load stopping): nothing to serve
                return resp  # aiohttp's finish_response meets the closed transport again and lets it go quietly
            r.resp = resp
            r.transport = request.transport  # type: ignore[assignment]
        self.queue.append(r)
        self.state.queued = len(self.queue)
        self.wake.set()
        try:
            await r.done
        except asyncio.CancelledError:
            r.aborted = True
            raise
        if stream:
            assert r.resp is not None
            if not r.cut and not r.aborted:
                try:
                    await r.resp.write_eof()
                except Exception:
                    pass
            return r.resp
        now = time.monotonic()
        if kind == "generate":
            meta = json.loads(self._meta(r, True, now))
            ids = [int(i) for i in r.ids]
            return web.json_response({"text": b"".join(r.text).decode(), "output_ids": ids, "meta_info": meta})
        usage = {"prompt_tokens": r.input_len, "total_tokens": r.input_len + r.generated, "completion_tokens": r.generated}
        choice = {"index": 0, "text": b"".join(r.text).decode(), "logprobs": None, "finish_reason": "length", "matched_stop": None}
        return web.json_response({"id": r.rid, "object": "text_completion", "created": self.created, "model": model, "choices": [choice], "usage": usage})


class SimServer:
    """Owns the server thread. `start()` returns the base URL; `stop()` shuts it down.

    Also usable as `with SimServer(cfg) as srv:` and `async with SimServer(cfg) as srv:`.
    """

    def __init__(self, config: SimServerConfig | None = None) -> None:
        self.config = config or SimServerConfig()
        self.state = SimState()
        self.url = ""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop_event: asyncio.Event | None = None
        self._final_cpu: float | None = None

    @property
    def version(self) -> str:
        return self.config.version

    def start(self) -> str:
        if self._thread is not None:
            return self.url
        self._thread = threading.Thread(target=self._main, name="sglang-sim", daemon=True)
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("simulated SGLang server did not start within 15 s")
        if self._error is not None:
            raise RuntimeError(f"simulated SGLang server failed to start: {self._error}") from self._error
        return self.url

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        if self._stop_event is not None:
            self._loop.call_soon_threadsafe(self._stop_event.set)
        self._thread.join(15)
        self._thread = None

    def cpu_seconds(self) -> float:
        """CPU time spent by the server thread (its own clock; the client's CPU is separate)."""
        if self._final_cpu is not None:
            return self._final_cpu
        t = self._thread
        if t is None or t.ident is None:
            return 0.0
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (AttributeError, OSError):  # non-Linux: ask the thread itself
            assert self._loop is not None

            async def sample() -> float:
                return time.thread_time()

            return asyncio.run_coroutine_threadsafe(sample(), self._loop).result(5)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:  # noqa: BLE001 - reported to start()
            self._error = e
            self._ready.set()
        finally:
            self._final_cpu = time.thread_time()
            loop.close()

    def _engine(self) -> Any:
        """The server kind's engine: its app, its scheduling loop, its running and waiting requests."""
        return _Engine(self.config, self.state)

    def _address(self) -> tuple[str, int]:
        return self.config.host, self.config.port

    async def _serve(self) -> None:
        self._stop_event = asyncio.Event()
        engine = self._engine()
        runner = web.AppRunner(engine.app(), access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, *self._address(), backlog=4096)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        engine.task = asyncio.create_task(engine.loop())
        self._ready.set()
        try:
            await self._stop_event.wait()
        finally:
            engine.task.cancel()
            for r in engine.pending():
                if not r.done.done():
                    r.aborted = True
                    r.done.set_result(None)
            await runner.cleanup()

    def __enter__(self) -> "SimServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> "SimServer":
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)


__all__ = ["SimFaults", "SimServer", "SimServerConfig", "SimState", "version_tuple"]
