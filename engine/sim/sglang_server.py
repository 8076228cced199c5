"""A real HTTP server on 127.0.0.1 that speaks SGLang's API, with a continuous-batching model.

Used by `runbook run --simulate` (the simulated host) and by the tests. It serves the endpoints the
probes read, per SGLang version (`/get_server_info` only on 0.5.5; `/server_info` from 0.5.6), and a
scheduler loop that admits queued requests while `running < max_running_requests` and the KV
reservation (input + output tokens per request) fits in `max_total_num_tokens`. Each step emits one
token to every running request and lasts `step_base_ms + step_per_req_ms * batch` (+ prefill cost),
so throughput is batch / step time and plateaus where KV capacity or the request cap stops the batch
from growing. The live `SimState` is what the simulated GPUs read.

It runs in its own thread with its own event loop, so sync tests and the async runner can both use
it and its CPU time is measurable apart from the client's (`cpu_seconds()`).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from .sglang_info import (
    DEFAULT_SERVER_ARGS,
    has_new_info_endpoints,
    is_refactored,
    model_info_body,
    models_body,
    server_info_body,
    version_tuple,
)
from .profiler import add_profile_routes
from .sglang_metrics import E2E_BUCKETS, ITL_BUCKETS, QUEUE_BUCKETS, TTFT_BUCKETS, Histogram, render


class SimFaults(BaseModel):
    """Ways to make the simulated server misbehave, per path where it makes sense."""

    model_config = ConfigDict(extra="forbid")

    status_code: dict[str, int] = Field(default_factory=dict)  # path -> forced HTTP status
    delay_s: dict[str, float] = Field(default_factory=dict)  # path -> delay before answering
    malformed_json: list[str] = Field(default_factory=list)  # paths answering broken JSON
    malformed_metrics: bool = False  # /metrics answers text the exposition parser rejects
    cut_stream_after_tokens: int | None = None  # streams are dropped mid-way after N tokens
    stop_answering_after_s: float | None = None  # after N s nothing answers and nothing is generated


class SimServerConfig(BaseModel):
    """What the simulated SGLang server is and how fast it generates."""

    model_config = ConfigDict(extra="forbid")

    version: str = "0.5.5.post3"
    model_path: str = "Qwen/Qwen3-32B"
    served_model_name: str | None = None  # default: model_path
    model_type: str | None = "qwen3"
    architectures: list[str] | None = Field(default_factory=lambda: ["Qwen3ForCausalLM"])
    context_len: int = 40960
    server_args: dict[str, Any] = Field(default_factory=dict)  # overrides DEFAULT_SERVER_ARGS (0.5.5 names)
    api_key: str | None = None
    enable_metrics: bool = True
    # Batch model.
    max_running_requests: int = 1024  # the effective cap the scheduler applies
    report_max_running_requests: bool = True  # False: server_info says null (auto), like an unset flag
    max_total_num_tokens: int = 389120  # KV capacity in tokens
    step_base_ms: float = 20.0
    step_per_req_ms: float = 0.05
    prefill_ms_per_1k_tokens: float = 2.0
    num_continuous_decode_steps: int = 1
    faults: SimFaults = Field(default_factory=SimFaults)
    host: str = "127.0.0.1"
    port: int = 0  # 0: ephemeral


@dataclass
class SimState:
    """Live scheduler state. Plain attributes: read them from any thread (the simulated GPUs do)."""

    max_running_requests: int = 0
    max_total_num_tokens: int = 0
    cuda_graph_max_bs: int = 256
    running: int = 0
    queued: int = 0
    kv_used_tokens: int = 0  # reserved by running requests (input + max output)
    token_usage: float = 0.0  # kv_used_tokens / max_total_num_tokens
    gen_throughput: float = 0.0  # tokens/s over the last second
    step_time_s: float = 0.0  # duration of the last step
    last_step_at: float = 0.0  # time.monotonic() of the last step (0: never)
    prefill_tokens_last_step: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    cached_tokens_total: int = 0
    completed_requests: int = 0
    aborted_requests: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(QUEUE_BUCKETS))
    peak_running: int = 0  # highest `running` seen (the simulated host reports it)
    peak_queued: int = 0
    # Optional hook: a factor on each step's duration (the simulated host slows steps while GPUs throttle).
    step_scale_fn: Callable[[], float] | None = None


_WORDS = [w.encode() for w in "the of and to in is was for on as with by at from that this it are be or an".split()]


class _Req:
    __slots__ = (
        "rid", "kind", "stream", "input_len", "max_new", "model", "include_usage", "resp", "done",
        "generated", "text", "ids", "arrival", "admitted", "first", "last", "reserve", "cut", "aborted", "transport",
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
        self.reserve = input_len + max_new
        self.cut = self.aborted = False


class _Engine:
    """The scheduler loop and the HTTP handlers; lives entirely on the server thread's loop."""

    def __init__(self, cfg: SimServerConfig, state: SimState) -> None:
        self.cfg = cfg
        self.state = state
        self.args = {**DEFAULT_SERVER_ARGS, **cfg.server_args}
        self.args["model_path"] = cfg.model_path
        self.args.setdefault("tokenizer_path", cfg.model_path)
        self.args["tokenizer_path"] = cfg.server_args.get("tokenizer_path", cfg.model_path)
        self.served = cfg.served_model_name or cfg.model_path
        self.args["served_model_name"] = self.served
        self.args["enable_metrics"] = cfg.enable_metrics
        self.args["max_running_requests"] = cfg.max_running_requests if cfg.report_max_running_requests else None
        self.args["num_continuous_decode_steps"] = cfg.num_continuous_decode_steps
        self.args["api_key"] = None  # never echo the secret
        state.max_running_requests = cfg.max_running_requests
        state.max_total_num_tokens = cfg.max_total_num_tokens
        state.cuda_graph_max_bs = int(self.args.get("cuda_graph_max_bs") or 256)
        self.new_layout = is_refactored(cfg.version)
        self.queue: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.wake = asyncio.Event()
        self.started = time.monotonic()
        self.created = int(time.time())
        self.counter = 0
        self.tput_window: deque[tuple[float, int]] = deque()
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
                self.wake.clear()
                await self.wake.wait()
                spent = 0.0
            if self.hung():
                await asyncio.sleep(3600)
                continue
            prefill = self._admit()
            k = max(1, cfg.num_continuous_decode_steps)
            step = (cfg.step_base_ms + cfg.step_per_req_ms * len(self.running)) * k + cfg.prefill_ms_per_1k_tokens * prefill / 1000
            if st.step_scale_fn is not None:
                step *= st.step_scale_fn()
            st.step_time_s = step / 1000
            st.prefill_tokens_last_step = prefill
            await asyncio.sleep(max(0.0, step / 1000 - spent))
            now = time.monotonic()
            st.last_step_at = now
            await self._emit(now, k)
            self._update_throughput(now)
            spent = time.monotonic() - now

    def _admit(self) -> int:
        st, prefill = self.state, 0
        while self.queue and len(self.running) < self.cfg.max_running_requests:
            r = self.queue[0]
            if r.aborted:
                self.queue.popleft()
                continue
            if st.kv_used_tokens + r.reserve > self.cfg.max_total_num_tokens and self.running:
                break  # KV cache is full: wait for a request to finish (a lone oversize request still runs)
            self.queue.popleft()
            r.admitted = time.monotonic()
            st.queue_time.observe(r.admitted - r.arrival)
            st.kv_used_tokens += r.reserve
            st.prompt_tokens_total += r.input_len
            prefill += r.input_len
            self.running.append(r)
        self._refresh()
        return prefill

    def _refresh(self) -> None:
        st = self.state
        st.running = len(self.running)
        st.queued = len(self.queue)
        st.peak_running = max(st.peak_running, st.running)
        st.peak_queued = max(st.peak_queued, st.queued)
        st.token_usage = min(1.0, st.kv_used_tokens / self.cfg.max_total_num_tokens) if self.cfg.max_total_num_tokens else 0.0

    def _update_throughput(self, now: float) -> None:
        w = self.tput_window
        w.append((now, self.state.generation_tokens_total))
        while len(w) > 2 and now - w[0][0] > 1.0:
            w.popleft()
        t0, n0 = w[0]
        self.state.gen_throughput = (self.state.generation_tokens_total - n0) / (now - t0) if now > t0 else 0.0

    async def _emit(self, now: float, k: int) -> None:
        st, cut_after = self.state, self.cfg.faults.cut_stream_after_tokens
        keep: list[_Req] = []
        for r in self.running:
            if r.aborted:
                self._finish(r, now, completed=False)
                continue
            n = min(k, r.max_new - r.generated)
            start = r.generated
            r.generated += n
            for i in range(start, start + n):
                tid = 1000 + (i * 7919 + len(r.rid)) % 30000
                r.text.append(b" " + _WORDS[tid % len(_WORDS)])
                r.ids.append(str(tid).encode())
            st.generation_tokens_total += n
            if r.first == 0.0:
                r.first = now
                st.ttft.observe(now - r.arrival)
            else:
                st.itl.observe_n(now - r.last, n)
            r.last = now
            finished = r.generated >= r.max_new
            if r.stream and r.resp is not None:
                if cut_after is not None and r.generated >= cut_after and not finished:
                    r.cut = True
                    if r.transport is not None:
                        r.transport.abort()  # drop the connection mid-stream, no terminating chunk
                    self._finish(r, now, completed=False)
                    continue
                try:
                    await r.resp.write(self._chunk(r, n, finished, now))
                except Exception:  # the client went away
                    r.aborted = True
                    self._finish(r, now, completed=False)
                    continue
            if finished:
                self._finish(r, now, completed=True)
            else:
                keep.append(r)
        self.running = keep
        self._refresh()

    def _finish(self, r: _Req, now: float, *, completed: bool) -> None:
        st = self.state
        st.kv_used_tokens -= r.reserve
        if completed:
            st.completed_requests += 1
            st.e2e.observe(now - r.arrival)
        else:
            st.aborted_requests += 1
        if not r.done.done():
            r.done.set_result(None)

    # ---- wire formats ------------------------------------------------------------------------

    def _meta(self, r: _Req, finished: bool, now: float) -> bytes:
        fin = b'{"type":"length","length":%d}' % r.max_new if finished else b"null"
        retr = b'"num_retractions":0,"reasoning_tokens":0' if self.new_layout else b'"total_retractions":0'
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
        add_profile_routes(app, self)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def server_info(self, request: web.Request) -> web.Response:
        body = server_info_body(
            version=self.cfg.version,
            args=self.args,
            max_total_num_tokens=self.cfg.max_total_num_tokens,
            effective_max_running_requests=self.cfg.max_running_requests,
            context_len=self.cfg.context_len,
            last_gen_throughput=self.state.gen_throughput,
        )
        return web.json_response(body)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(model_info_body(version=self.cfg.version, args=self.args, model_type=self.cfg.model_type, architectures=self.cfg.architectures))

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(models_body(served_model_name=self.served, model_path=self.cfg.model_path, context_len=self.cfg.context_len, created=self.created))

    async def metrics(self, request: web.Request) -> web.Response:
        if self.cfg.faults.malformed_metrics:
            return web.Response(text='sglang:num_running_reqs{model_name="x" 12\n<html>oops', content_type="text/plain")
        text = render(self.state, version=self.cfg.version, model_name=self.served, pid=os.getpid())
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
        if body.get("input_ids") is not None:
            input_len = len(body["input_ids"])
        else:
            input_len = max(1, len(str(body.get("text", "")).split()))
        return await self._serve(request, "generate", bool(body.get("stream")), input_len, int(sp.get("max_new_tokens", 128)), self.served, False)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.StreamResponse):
            return body
        prompt = body.get("prompt", "")
        input_len = len(prompt) if isinstance(prompt, list) else max(1, len(str(prompt).split()))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        model = str(body.get("model", "default"))
        return await self._serve(request, "completions", bool(body.get("stream")), input_len, int(body.get("max_tokens", 16)), model, include_usage)

    async def _serve(self, request: web.Request, kind: str, stream: bool, input_len: int, max_new: int, model: str, include_usage: bool) -> web.StreamResponse:
        self.counter += 1
        r = _Req(f"{self.counter:032x}", kind, stream, input_len, max(1, max_new), model, include_usage)
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
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

    async def _serve(self) -> None:
        self._stop_event = asyncio.Event()
        engine = _Engine(self.config, self.state)
        runner = web.AppRunner(engine.app(), access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port, backlog=4096)
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
            for r in list(engine.running) + list(engine.queue):
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
