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
    # the server's own strings in the report's HTML <summary>: they must stay inert there too
    headline: "Serving {{ srv.model_path | text }} at TP {{ srv.tp_size | count }}"
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
    # JSON nested 100,000 deep (Python's decoder raises RecursionError, not ValueError): the probe's error, named
    "json-100k-deep": ({p: (lambda r: _text("[" * 100_000 + "]" * 100_000)) for p in ("/server_info", "/get_server_info", "/model_info", "/v1/models")},
                       None, None, {"server-config": {"error"}}),  # fmt: skip
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
async def _to_moved(request: web.Request) -> web.Response:
    raise web.HTTPFound("/moved" + request.path)


async def _redirect_loop(request: web.Request) -> web.Response:
    raise web.HTTPFound(request.path)


# same-origin redirects are followed (a proxy that moved a path), at most MAX_REDIRECTS; the key goes along
CASES["same-origin-redirect"] = ({"/server_info": _to_moved, "/metrics": _to_moved, "/moved/server_info": DEFAULTS["/server_info"],
                                  "/moved/metrics": DEFAULTS["/metrics"]}, SECRET, SECRET, {"server-config": {"confirmed"}, "busy": {"refuted"}})  # fmt: skip
CASES["redirect-loop"] = ({"/server_info": _redirect_loop, "/get_server_info": _redirect_loop, "/metrics": _redirect_loop}, None, None,
                          {"server-config": BAD, "busy": BAD})  # fmt: skip
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
    if name == "json-100k-deep":  # named as what it is, in the probe's reason and in what detection saw
        assert "nested deeper than 64 levels" in verdicts["server-config"][1], verdicts["server-config"]
    for branch, (verdict, reason) in verdicts.items():
        assert verdict != "error" or reason, branch
        assert f"`{branch}`" in report or branch in report
    for text in (out, err, report, results_text):
        assert SECRET not in text and "sk-wrong-key-1234" not in text
    FIGURES.passed("hostile servers", name)


# ---- issue 25: markup, bombs, slowloris, endless streams, redirects, reflected keys -----------------

# What a server string may hold: HTML, Markdown structure, a link, terminal escapes (OSC 52 sets the
# clipboard), Rich markup (a malformed `[/]` crashed the TUI). Every output must show it as inert text.
PAYLOAD = (
    "<img src=x onerror=alert(1)><script>alert(2)</script> [x](javascript:alert(3)) ![i](http://127.0.0.1:1/i.png) </details>"
    "\n## TL;DR\n<details>\x1b]52;c;cHduZWQ=\x07\x1b[31mRED\x1b[0m\x07\x9b2J [bold red]rich[/] [link=file:///etc/passwd]l[/link] [@click=app.quit]q[/] [/]"
)
CONTROL = ("\x1b", "\x07", "\x9b")


def report_problems(markdown: str) -> list[str]:
    """What in a report is not inert when rendered (CommonMark with HTML, as GitHub reads it): raw HTML
    other than the report's own <details>/<summary>/<code>/<b>, links, images, a second TL;DR, unbalanced
    <details>, control characters."""
    from markdown_it import MarkdownIt

    problems = [f"control character {c!r}" for c in CONTROL if c in markdown]
    tokens = MarkdownIt("commonmark", {"html": True}).enable("table").parse(markdown)
    own = {"<details>", "</details>", "<summary>", "</summary>", "<code>", "</code>", "<b>", "</b>"}
    opened = closed = 0
    headings: list[str] = []
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            headings.append(tokens[i + 1].content)
        for t in [tok, *(tok.children or [])]:
            if t.type in ("html_inline", "html_block"):
                # some renderers read Markdown inside HTML: no bracket or script URL outside a <code> element
                bare_text = __import__("re").sub(r"<code>.*?</code>", "", t.content)
                if "[" in bare_text or "]" in bare_text or "javascript:" in bare_text.lower():
                    problems.append(f"unescaped bracket or script URL in HTML {bare_text[:60]!r}")
                for tag in __import__("re").findall(r"</?[A-Za-z][^>]*>", t.content):
                    bare = __import__("re").sub(r"\s.*", ">", tag) if not tag.endswith(">") else __import__("re").sub(r"\s[^>]*", "", tag)
                    if bare not in own:
                        problems.append(f"raw HTML {tag[:40]!r}")
                opened += t.content.count("<details>")
                closed += t.content.count("</details>")
            if t.type == "link_open" and not str(t.attrs.get("href", "")).startswith(("https://", "http://")):
                problems.append(f"link to {t.attrs.get('href')!r}")
            if t.type == "image":
                problems.append(f"image {t.attrs.get('src')!r}")
    if opened != closed:
        problems.append(f"{opened} <details> for {closed} </details>")
    if sum(h.strip() == "TL;DR" for h in headings) != 1:
        problems.append(f"{sum(h.strip() == 'TL;DR' for h in headings)} TL;DR headings")
    return problems


async def markup_info(request: web.Request) -> web.Response:
    return web.json_response({**SERVER_INFO, "model_path": PAYLOAD, "served_model_name": PAYLOAD})


async def markup_metrics(request: web.Request) -> web.Response:
    return web.Response(status=500, text=PAYLOAD)


async def reflect_key(request: web.Request) -> web.Response:
    """Echo the request's Authorization header back: in server_info, in an error body."""
    auth = request.headers.get("Authorization", "")
    if request.path in ("/server_info", "/get_server_info"):
        return web.json_response({**SERVER_INFO, "model_path": f"/models/{auth}", "api_key_seen": auth})
    return web.Response(status=400, text=f"bad request; you sent Authorization: {auth}")


async def slowloris(request: web.Request) -> web.StreamResponse:
    """Headers at once, then one byte every 0.5 s, forever: each read is quick, the whole never ends."""
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    await resp.write(b'{"version": "0.5.5", "tp_size": 2, "x": "')
    for _ in range(600):
        await asyncio.sleep(0.5)
        await resp.write(b"a")
    return resp


_BOMB: bytes | None = None


def gzip_bomb(mib: int = 512) -> bytes:
    """`mib` MiB of exposition text gzipped to well under 1 MiB."""
    global _BOMB
    if _BOMB is None:
        import zlib

        z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        block = b"sglang:num_queue_reqs 0\n" * (1 << 16)
        parts = [z.compress(block) for _ in range(mib * (1 << 20) // len(block))]
        _BOMB = b"".join(parts) + z.flush()
    return _BOMB


async def bomb_metrics(request: web.Request) -> web.Response:
    return web.Response(body=gzip_bomb(), headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})


async def million_series(request: web.Request) -> web.Response:
    return web.Response(body=b"a 1\n" * 1_000_000, content_type="text/plain")  # 4 MB: under the size cap, over the line cap


async def endless_generate(request: web.Request) -> web.StreamResponse:
    """A /generate stream that never sends an event separator."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    chunk = b"data: " + b"x" * 65536
    for _ in range(20000):
        await resp.write(chunk)
    return resp


HOSTILE_CASES: dict[str, tuple[dict[str, Handler], dict[str, set[str]]]] = {
    "markup-and-escapes-in-strings": ({"/server_info": markup_info, "/metrics": markup_metrics}, {"server-config": {"confirmed"}, "busy": BAD}),
    "gzip-bomb-metrics": ({"/metrics": bomb_metrics}, {"busy": BAD, "server-config": {"confirmed"}}),
    "million-series-metrics": ({"/metrics": million_series}, {"busy": BAD}),
    "slowloris-server-info": ({"/server_info": slowloris, "/get_server_info": slowloris}, {"server-config": BAD}),
    "endless-generate-without-separator": ({"/generate": endless_generate}, {"slow-stream": BAD}),
    "200mb-metrics": ({"/metrics": huge_metrics}, {"busy": BAD}),
}

_MEASURED = (
    "import resource, sys\n"
    "from gpu_runbook.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print(f'PEAK_RSS_KB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}', file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def _run_measured(args: list[str], cwd: Path, env_key: str | None = None, timeout: float = HANG_S + 30) -> tuple[int, str, str, float, float]:
    """`runbook ARGS` in a fresh interpreter: exit code, stdout, stderr, seconds, peak RSS in MB."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RUNBOOK_API_KEY"}
    if env_key:
        env["RUNBOOK_API_KEY"] = env_key
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _MEASURED, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    took = time.monotonic() - started
    peak = next((int(line.split()[1]) / 1024 for line in done.stderr.splitlines() if line.startswith("PEAK_RSS_KB")), -1.0)
    return done.returncode, done.stdout, done.stderr, took, peak


@pytest.mark.parametrize("name", sorted(HOSTILE_CASES))
def test_hostile_server_is_bounded_and_inert(name, tmp_path):
    """Each run: a written report, honest marks, no control character or markup through, in bounded time
    and under PEAK_MB_LIMIT of memory (measured in a fresh interpreter)."""
    from hostile_figures import PEAK_MB_LIMIT

    handlers, expected = HOSTILE_CASES[name]
    if name == "gzip-bomb-metrics":
        gzip_bomb()  # built before the clock starts
    (tmp_path / "hostile.yaml").write_text(RUNBOOK)
    FIGURES.tried("hostile servers", name)
    with HostileServer(handlers) as server:
        code, out, err, took, peak = _run_measured(["run", "hostile.yaml", "--no-tui", "-v", "--json", "r.json", "--report", "r.md", "--sglang-url", server.url], tmp_path)
    FIGURES.memory(f"server {name}", peak)
    report = (tmp_path / "r.md").read_text() if (tmp_path / "r.md").exists() else ""
    results_text = (tmp_path / "r.json").read_text() if (tmp_path / "r.json").exists() else ""
    if "Traceback" in out + err or code == 70:
        FIGURES.crash(f"server {name}")
    if took > HANG_S:
        FIGURES.hang(f"server {name}")
    problems = report_problems(report) + [f"control character in stdout/stderr: {c!r}" for c in CONTROL if c in out + err]
    problems += [f"control character in the JSON: {c!r}" for c in ("\\u001b", "\\u0007", "\\u009b") if c in results_text]
    if problems:
        FIGURES.injection(f"server {name}")
    assert code in (0, 3) and "Traceback" not in err, err[-2000:]
    assert took < HANG_S, took
    assert not problems, problems
    assert 0 < peak < PEAK_MB_LIMIT, peak
    verdicts = {h["id"]: (h["verdict"], h["reason"]) for h in json.loads(results_text)["hypotheses"]}
    for branch, allowed in expected.items():
        assert verdicts[branch][0] in allowed, (branch, verdicts[branch])
    if name == "markup-and-escapes-in-strings":
        assert "onerror=alert(1)" in report and "&lt;script>" in report  # shown, as text
        summary = next(line for line in report.splitlines() if "<summary><code>server-config</code>" in line)
        assert "onerror=alert(1)" in summary and "&#91;x&#93;(<code>javascript:alert(3</code>))" in summary  # text, no link
    FIGURES.passed("hostile servers", name)


def test_redirect_to_another_port_sends_nothing_there(tmp_path, capsys, monkeypatch):
    """Every path answers 302 to another server (another port): nothing reaches it, the key least of all."""
    (tmp_path / "hostile.yaml").write_text(RUNBOOK)
    monkeypatch.chdir(tmp_path)
    FIGURES.tried("hostile servers", "redirect-off-origin")
    with HostileServer({}) as elsewhere:
        async def away(request: web.Request) -> web.Response:
            raise web.HTTPFound(elsewhere.url + request.path_qs)

        with HostileServer({p: away for p in ALL_PATHS}) as server:
            code = main(["run", "hostile.yaml", "--no-tui", "--json", "r.json", "--report", "r.md", "--api-key", SECRET, "--sglang-url", server.url])
        seen = list(elsewhere.seen_auth)
    out, err = capsys.readouterr()
    FIGURES.secret_checks(1)
    if seen:
        FIGURES.leak("redirect-off-origin")
    assert code in (0, 3) and "Traceback" not in err, err
    assert seen == [], f"{len(seen)} requests reached the other server"
    results = json.loads(Path("r.json").read_text())
    reasons = " ".join(str(h["reason"]) for h in results["hypotheses"])
    assert "another origin" in reasons or "HTTP 302" in reasons, reasons
    FIGURES.passed("hostile servers", "redirect-off-origin")


def test_a_server_reflecting_the_key_gets_it_redacted_everywhere(tmp_path, capsys, monkeypatch):
    """The README's promise: the API key never appears in results or reports, even when the server echoes it."""
    (tmp_path / "hostile.yaml").write_text(RUNBOOK)
    monkeypatch.chdir(tmp_path)
    FIGURES.tried("hostile servers", "reflected-api-key")
    with HostileServer({p: reflect_key for p in ALL_PATHS}, api_key=SECRET) as server:
        code = main(["run", "hostile.yaml", "--no-tui", "-v", "--json", "r.json", "--report", "r.md", "--api-key", SECRET, "--sglang-url", server.url])
    out, err = capsys.readouterr()
    texts = {"stdout": out, "stderr": err, "report": Path("r.md").read_text(), "json": Path("r.json").read_text()}
    FIGURES.secret_checks(1)
    leaked = [where for where, text in texts.items() if SECRET in text]
    if leaked:
        FIGURES.leak("reflected-api-key")
    assert code in (0, 3) and not leaked, leaked
    assert "***" in texts["json"]  # the reflected copy is there, redacted
    FIGURES.passed("hostile servers", "reflected-api-key")
