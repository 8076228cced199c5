"""Small real HTTP servers on 127.0.0.1 (ephemeral ports) that stream SSE the way a given server or
proxy writes it, for the load generator's and the runner's tests. Not a test module itself."""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serve(routes: dict[str, Handler]) -> AsyncIterator[str]:
    """Serve `routes` (path -> handler, any method) on 127.0.0.1; yields the base URL."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_route("*", path, handler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def dump(obj: Any, style: str) -> bytes:
    """One SSE event carrying `obj`, written in `style`:
    compact   what SGLang writes (orjson): `data: {"a":1}` + blank line
    spaced    Python's json.dumps defaults: `"completion_tokens": 5`
    pretty    indent=2 JSON after one `data: ` (raw newlines inside the event, as a careless proxy writes)
    multiline indent=2 JSON split over `data:` lines, as the SSE spec says a multi-line payload is sent
    crlf      spaced, with CRLF line ends
    """
    if style == "compact":
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
    if style == "spaced":
        return b"data: " + json.dumps(obj).encode() + b"\n\n"
    if style == "pretty":
        return b"data: " + json.dumps(obj, indent=2).encode() + b"\n\n"
    if style == "multiline":
        return b"".join(b"data: " + line.encode() + b"\n" for line in json.dumps(obj, indent=2).splitlines()) + b"\n"
    if style == "crlf":
        return b"data: " + json.dumps(obj).encode() + b"\r\n\r\n"
    raise ValueError(style)


def done(style: str) -> bytes:
    return b"data: [DONE]\r\n\r\n" if style == "crlf" else b"data: [DONE]\n\n"


def generate_events(n: int, style: str, per_event: int = 1) -> list[bytes]:
    """A /generate stream of `n` tokens, `per_event` tokens per event (cumulative text, as SGLang)."""
    out = []
    for k in range(per_event, n + per_event, per_event):
        k = min(k, n)
        meta = {"id": "r1", "finish_reason": {"type": "length", "length": n} if k == n else None, "prompt_tokens": 7,
                "completion_tokens": k, "cached_tokens": 0}  # fmt: skip
        out.append(dump({"text": "x" * k, "output_ids": [1] * k, "meta_info": meta}, style))
    return out + [done(style)]


def completion_events(n: int, style: str) -> list[bytes]:
    """A /v1/completions stream: one empty chunk (no token), `n` one-token chunks, the usage chunk."""

    def chunk(text: str, finish: str | None) -> bytes:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": None}
        return dump({"id": "c1", "object": "text_completion", "created": 1, "model": "m", "choices": [choice], "usage": None}, style)

    out = [chunk("", None)] + [chunk(" tok", "length" if i == n - 1 else None) for i in range(n)]
    usage = {"prompt_tokens": 7, "total_tokens": 7 + n, "completion_tokens": n}
    out.append(dump({"id": "c1", "object": "text_completion", "created": 1, "model": "m", "choices": [], "usage": usage}, style))
    return out + [done(style)]


def streaming(events_for: Callable[[dict[str, Any]], Iterable[bytes]], received: list[dict[str, Any]] | None = None) -> Handler:
    """A handler that reads the JSON body (kept in `received`) and writes `events_for(body)`."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if received is not None:
            received.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for event in events_for(body):
                await resp.write(event)
            await resp.write_eof()
        except ConnectionResetError:  # the client stopped the load mid-stream
            pass
        return resp

    return handler


def max_tokens(body: dict[str, Any]) -> int:
    """The output length a /generate or /v1/completions body asks for."""
    return int(body.get("max_tokens") or body["sampling_params"]["max_new_tokens"])
