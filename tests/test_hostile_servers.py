"""Hostile SGLang servers: real HTTP servers on 127.0.0.1 that answer every way a broken or foreign
server might. For each, `runbook run` ends within its timeouts, writes results and report, marks the
branches whose data could not be read `error` or `inconclusive` with the reason, decides nothing on
data it could not parse, and prints no traceback.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
from aiohttp import web

from gpu_runbook.cli import main

from hostile_figures import FIGURES

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

RUNBOOK = """
name: hostile-sglang
title: The SGLang probes against a server that misbehaves
hypotheses:
  - id: server-config
    title: The server reports its configuration
    probes:
      srv: { probe: sglang.server, with: { request_timeout_s: 1 }, timeout_s: 8 }
    confirm: srv.tp_size >= 1.0
    refute: srv.tp_size < 1.0
  - id: health
    title: The server is unhealthy
    probes:
      h: { probe: sglang.health, with: { request_timeout_s: 1 }, timeout_s: 5 }
    confirm: "!h.healthy"
    refute: h.healthy
  - id: busy
    title: Requests queue on the server
    probes:
      m: { probe: sglang.metrics, with: { duration_s: 0.4, interval_s: 0.2, request_timeout_s: 1 }, timeout_s: 8 }
    confirm: m.num_queue_reqs.max > 0.0
    refute: m.num_queue_reqs.max == 0.0
  - id: slow-stream
    title: Generation is slow
    probes:
      sw: { probe: sglang.sweep, with: { levels: [1], seconds_per_level: 0.5, input_len: 4, output_len: 4, gpu_power: false }, timeout_s: 6 }
    confirm: sw.peak_output_tokens_per_s < 1.0
    refute: sw.peak_output_tokens_per_s >= 1.0
"""
BRANCHES = ("server-config", "health", "busy", "slow-stream")
# The branches run side by side, each bounded by its probe's timeout_s (8 s the longest): a run past the sum
# of all of them, plus start-up on a busy machine, has hung. A hang detector, not a speed target.
HANG_S = 8 + 5 + 8 + 6 + 15
SECRET = "sk-hostile-test-key-7f3a"

# ---- a server that answers correctly unless told otherwise ----------------------------------------

SERVER_INFO = {
    "version": "0.5.5.post3", "tp_size": 2, "dp_size": 1, "pp_size": 1, "model_path": "Qwen/Qwen3-8B",
    "max_total_num_tokens": 100000, "max_running_requests": 64, "internal_states": [{"last_gen_throughput": 10.0}],
}  # fmt: skip
METRICS = (
    "# HELP sglang:num_queue_reqs queued\n# TYPE sglang:num_queue_reqs gauge\n"
    'sglang:num_queue_reqs{model_name="m"} 0.0\n'
    "# HELP sglang:num_running_reqs running\n# TYPE sglang:num_running_reqs gauge\n"
    'sglang:num_running_reqs{model_name="m"} 1.0\n'
)


def _event(n: int, done: bool) -> bytes:
    body = {"text": "a" * n, "output_ids": list(range(n)), "meta_info": {"id": "r", "finish_reason": None, "prompt_tokens": 4, "completion_tokens": n}}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n" + (b"data: [DONE]\n\n" if done else b"")


async def good_generate(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for n in range(1, 5):
        await resp.write(_event(n, n == 4))
        await asyncio.sleep(0.01)
    return resp


DEFAULTS: dict[str, Handler] = {
    "/server_info": lambda r: _json(SERVER_INFO),
    "/model_info": lambda r: _json({"model_path": "Qwen/Qwen3-8B", "is_generation": True}),
    "/v1/models": lambda r: _json({"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "max_model_len": 4096}]}),
    "/health": lambda r: _text(""),
    "/metrics": lambda r: _text(METRICS),
    "/generate": good_generate,
}


async def _json(body: Any, indent: int | None = None) -> web.Response:
    return web.Response(text=json.dumps(body, indent=indent), content_type="application/json")


async def _text(body: str) -> web.Response:
    return web.Response(text=body, content_type="text/plain")


class HostileServer:
    """An aiohttp server in a thread on 127.0.0.1:<ephemeral>; `handlers` override the defaults per path."""

    def __init__(self, handlers: dict[str, Handler], api_key: str | None = None) -> None:
        self.handlers = {**DEFAULTS, **handlers}
        self.api_key = api_key
        self.seen_auth: list[str | None] = []
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.seen_auth.append(request.headers.get("Authorization"))
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        handler = self.handlers.get(request.path)
        if handler is None:
            return web.Response(status=404, text="not found")
        return await handler(request)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = "http://127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def __enter__(self) -> "HostileServer":
        self._thread.start()
        assert self._ready.wait(10), "hostile server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


# ---- the hostile behaviours -----------------------------------------------------------------------


async def status_500(request: web.Request) -> web.Response:
    return web.Response(status=500, text="Internal Server Error")


async def never_answers(request: web.Request) -> web.Response:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


async def half_then_close(request: web.Request) -> web.StreamResponse:
    """Promise a body, send half a chunk of it, drop the connection."""
    resp = web.StreamResponse(headers={"Content-Type": "application/json" if request.path != "/generate" else "text/event-stream"})
    resp.content_length = 4096
    await resp.prepare(request)
    await resp.write(b'data: {"text":"ab","meta_info":{"completion_tok' if request.path == "/generate" else b'{"version": "0.5.5", "tp_si')
    assert request.transport is not None
    request.transport.close()
    return resp


async def garbage_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(3):
        await resp.write(b"\x00\xff<html>not an event stream</html>\r\n\r\nrandom: bytes\n\n")
    return resp


async def no_done(request: web.Request) -> web.StreamResponse:
    """Tokens, then silence on an open connection: no [DONE], no close."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_event(1, False))
    await asyncio.sleep(3600)
    return resp


async def huge_metrics(request: web.Request) -> web.StreamResponse:
    """50 MB of well-formed exposition text, streamed without a length."""
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await resp.prepare(request)
    line = b'sglang:num_queue_reqs{model_name="m",junk="%s"} 1.0\n' % (b"x" * 200)
    block = line * 4096
    sent = 0
    while sent < 50 * 1024 * 1024:
        await resp.write(block)
        sent += len(block)
    return resp


async def malformed_metrics(request: web.Request) -> web.Response:
    return web.Response(text='sglang:num_queue_reqs{model_name="m" 12\n<html>oops</html>\n# TYPE x gauge gauge\n', content_type="text/plain")


JUNK_INFO = {
    "version": ["0", 5], "tp_size": "eight", "dp_size": None, "pp_size": {"nested": {"deeper": [1, [2, [3]]]}},
    "model_path": 12, "max_total_num_tokens": "lots", "max_running_requests": [64],
    "internal_states": "not a list", "disable_cuda_graph": "maybe",
}  # fmt: skip
NULL_INFO = {key: None for key in SERVER_INFO}
DEEP_INFO = {"tp_size": 2, "internal_states": [{"effective_max_running_requests_per_dp": {"a": [None, {"b": []}]}}]}


PRETTY = {
    "/server_info": lambda r: _json(SERVER_INFO, indent=2),
    "/model_info": lambda r: _json({"model_path": "Qwen/Qwen3-8B", "is_generation": True}, indent=2),
    "/v1/models": lambda r: _json({"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "max_model_len": 4096}]}, indent=2),
}


async def pretty_generate(request: web.Request) -> web.StreamResponse:
    """What a server that pretty-prints its stream JSON sends (`"completion_tokens": 1`, one line)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for n in range(1, 5):
        body = {"text": "a" * n, "meta_info": {"finish_reason": None, "completion_tokens": n}}
        await resp.write(b"data: " + json.dumps(body, separators=(", ", ": ")).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


ALL_PATHS = ("/server_info", "/get_server_info", "/model_info", "/v1/models", "/health", "/metrics", "/generate")

# name -> (handlers, api key the server wants, api key given, {branch: allowed verdicts}); a branch not
# listed must end in any verdict but must not crash the run.
BAD = {"error", "inconclusive"}
CASES: dict[str, tuple[dict[str, Handler], str | None, str | None, dict[str, set[str]]]] = {
    "5xx-everywhere": ({p: status_500 for p in ALL_PATHS}, None, None, {"server-config": BAD, "busy": BAD, "slow-stream": BAD, "health": {"confirmed"}}),
    "garbage-instead-of-sse": ({"/generate": garbage_sse}, None, None, {"slow-stream": BAD}),
    "stream-without-done": ({"/generate": no_done}, None, None, {"server-config": {"confirmed"}}),
    "accepts-never-answers": ({p: never_answers for p in ALL_PATHS}, None, None, {b: BAD for b in BRANCHES}),
    "half-a-chunk-then-close": ({"/server_info": half_then_close, "/generate": half_then_close, "/metrics": half_then_close}, None, None,
                                {"server-config": BAD, "busy": BAD, "slow-stream": BAD}),  # fmt: skip
    "50mb-metrics": ({"/metrics": huge_metrics}, None, None, {"busy": BAD, "server-config": {"confirmed"}}),
    "malformed-prometheus": ({"/metrics": malformed_metrics}, None, None, {"busy": BAD}),
    "server-info-junk-types": ({"/server_info": lambda r: _json(JUNK_INFO)}, None, None, {"server-config": BAD}),
    "server-info-nulls": ({"/server_info": lambda r: _json(NULL_INFO)}, None, None, {"server-config": BAD}),
    # junk in a field no rule reads spoils nothing else: tp_size is still 2
    "server-info-nested-junk": ({"/server_info": lambda r: _json(DEEP_INFO)}, None, None, {"server-config": {"confirmed"}, "busy": {"refuted"}}),
    "server-info-int-states": ({"/server_info": lambda r: _json({**SERVER_INFO, "internal_states": 5})}, None, None, {"server-config": {"confirmed"}}),
    "non-finite-json-and-junk-lists": ({
        "/server_info": lambda r: _text('{"version": "0.5.5", "tp_size": NaN, "max_running_requests": Infinity, "max_total_num_tokens": -Infinity}'),
        "/model_info": lambda r: _json(["not", "a", "mapping"]),
        "/v1/models": lambda r: _json({"data": "not a list"}),
        "/metrics": lambda r: _text('sglang:num_queue_reqs{model_name="m"} NaN\nsglang:num_running_reqs{model_name="m"} +Inf\n'),
    }, None, None, {"server-config": BAD, "busy": BAD, "health": {"refuted"}}),  # fmt: skip
    "malformed-json": ({"/server_info": lambda r: _text('{"version": "0.5.5", "tp_size": ')}, None, None, {"server-config": BAD}),
    "compact-json": ({}, None, None, {"server-config": {"confirmed"}, "health": {"refuted"}, "busy": {"refuted"}, "slow-stream": {"refuted"}}),
    "pretty-json": (PRETTY, None, None, {"server-config": {"confirmed"}, "health": {"refuted"}}),
    "401-without-api-key": ({}, SECRET, None, {"server-config": BAD, "slow-stream": BAD}),
    "401-with-wrong-api-key": ({}, SECRET, "sk-wrong-key-1234", {"server-config": BAD, "slow-stream": BAD}),
    "api-key-accepted": ({}, SECRET, SECRET, {"server-config": {"confirmed"}, "slow-stream": {"refuted"}}),
    # refuted once the load branch reads `"completion_tokens": N`; until then an error, never "slow" confirmed
    "pretty-json-stream": ({"/generate": pretty_generate}, None, None, {"slow-stream": {"refuted"} | BAD}),
    # the key given by the environment, and a key given to servers that fail: it must not show up in any output
    "api-key-env-accepted": ({}, SECRET, SECRET, {"server-config": {"confirmed"}, "slow-stream": {"refuted"}}),
    "api-key-5xx-everywhere": ({p: status_500 for p in ALL_PATHS}, SECRET, SECRET, {"server-config": BAD, "busy": BAD, "slow-stream": BAD}),
    "api-key-half-a-chunk": ({"/server_info": half_then_close, "/generate": half_then_close, "/metrics": half_then_close}, SECRET, SECRET,
                             {"server-config": BAD, "busy": BAD, "slow-stream": BAD}),  # fmt: skip
}
KEY_FROM_ENVIRONMENT = {"401-with-wrong-api-key", "api-key-env-accepted", "api-key-half-a-chunk"}
NEEDS_LOAD_BRANCH: set[str] = set()  # cases that can only pass with another engineer's branch merged


def _cases() -> list:
    return [
        pytest.param(name, marks=pytest.mark.xfail(reason="needs the load branch: pretty-printed stream JSON", strict=False))
        if name in NEEDS_LOAD_BRANCH else name
        for name in sorted(CASES)
    ]  # fmt: skip


@pytest.mark.parametrize("name", _cases())
def test_hostile_server_run_ends_with_written_report_and_honest_marks(name, tmp_path, capsys, monkeypatch, registry):
    handlers, server_key, given_key, expected = CASES[name]
    (tmp_path / "hostile.yaml").write_text(RUNBOOK)
    monkeypatch.chdir(tmp_path)
    args = ["run", "hostile.yaml", "--no-tui", "-v", "--json", "r.json", "--report", "r.md"]
    with HostileServer(handlers, api_key=server_key) as server:
        if given_key and name in KEY_FROM_ENVIRONMENT:
            monkeypatch.setenv("RUNBOOK_API_KEY", given_key)  # the environment's key: must stay as secret as --api-key
        elif given_key:
            args += ["--api-key", given_key]
        started = time.monotonic()
        code = main(args + ["--sglang-url", server.url])
        took = time.monotonic() - started
    out, err = capsys.readouterr()
    FIGURES.tried("hostile servers", name)
    results_text = Path("r.json").read_text() if Path("r.json").exists() else ""
    report = Path("r.md").read_text() if Path("r.md").exists() else ""
    if code == 70 or "Traceback" in out + err or "internal error" in err:
        FIGURES.crash(f"server {name}")
    if took > HANG_S:
        FIGURES.hang(f"server {name}")
    if given_key:
        FIGURES.secret_checks(1)
        if any(SECRET in text or "sk-wrong-key-1234" in text for text in (out, err, report, results_text)):
            FIGURES.leak(f"server {name}")
    # 3: nothing could be measured (every probe unavailable or failed), which a dead server can make true
    assert code in (0, 3), err
    assert "Traceback" not in out + err and "internal error" not in err
    assert took < HANG_S, took
    results = json.loads(results_text, parse_constant=lambda c: pytest.fail(f"results JSON holds {c}: not JSON"))
    assert results["interrupted"] is False and report
    verdicts = {h["id"]: (h["verdict"], h["reason"]) for h in results["hypotheses"]}
    for branch, allowed in expected.items():
        verdict, reason = verdicts[branch]
        assert verdict in allowed, (branch, verdict, reason)
        if verdict in BAD:
            assert reason and reason not in ("interrupted", "not reached"), (branch, reason)
    for branch, (verdict, reason) in verdicts.items():
        assert verdict != "error" or reason, branch
        assert f"`{branch}`" in report or branch in report
    for text in (out, err, report, results_text):
        assert SECRET not in text and "sk-wrong-key-1234" not in text
    FIGURES.passed("hostile servers", name)
