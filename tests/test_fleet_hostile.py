"""`runbook fleet` against hostile Prometheus-like servers: real HTTP servers on 127.0.0.1 (ephemeral ports)
that redirect elsewhere, answer a gzip bomb, or never finish. The fleet's client goes through the bounded
HTTP layer (gpu_runbook.fetch): each run ends within its deadline with a clear error naming the limit, no
traceback, and the credentials reach no other origin.
"""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from typing import Awaitable, Callable

import pytest
from aiohttp import web

from gpu_runbook.cli import main
from gpu_runbook.probes.prometheus.client import PROM_MAX_BODY_BYTES, PromClient, PromError, PromSource

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SECRET = "prom-hostile-token-5c1e"
HANG_S = 60  # a hang detector on a busy 2-core machine, not a speed target: the deadlines below are 1-2 s


class PromLike:
    """An aiohttp server in a thread: `handler` answers every path; it records what reached it."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path, request.headers.get("Authorization")))
        return await self.handler(request)

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

    def __enter__(self) -> "PromLike":
        self._thread.start()
        assert self._ready.wait(10), "server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


async def prometheus_api(request: web.Request) -> web.Response:
    """Just enough of the API: buildinfo says Prometheus, every query answers an empty vector."""
    if request.path.endswith("/api/v1/status/buildinfo"):
        return web.json_response({"status": "success", "data": {"version": "3.0.0"}})
    if request.path.endswith("/api/v1/query"):
        form = await request.post()
        assert form.get("query"), "the query travels as form data"
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})
    return web.Response(status=404, text="not found")


_BOMB: bytes | None = None


def gzip_bomb() -> bytes:
    """Twice the fleet's body cap of JSON-ish text, gzipped to well under 1 MiB."""
    global _BOMB
    if _BOMB is None:
        z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        block = b'{"status":"success","data":{"resultType":"vector","result":[' + b" " * (1 << 20)
        _BOMB = b"".join(z.compress(block) for _ in range(2 * PROM_MAX_BODY_BYTES // len(block) + 1)) + z.flush()
    return _BOMB


async def bomb(request: web.Request) -> web.Response:
    return web.Response(body=gzip_bomb(), headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})


async def never_finishes(request: web.Request) -> web.StreamResponse:
    """Headers at once, then a byte every 0.2 s for minutes: each read is quick, the whole never ends."""
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    await resp.write(b'{"status": "success", "data": {"version": "')
    for _ in range(3000):
        await asyncio.sleep(0.2)
        await resp.write(b"a")
    return resp


def _fleet(url: str, *extra: str) -> list[str]:
    return ["fleet", "power-starvation", "--prometheus", url, "--at", "1764770700", "--latency-offset", "0", *extra]


@pytest.mark.parametrize("auth", [["--bearer-token", SECRET], ["--basic-auth", f"ops:{SECRET}"]], ids=["bearer", "basic"])
def test_a_redirect_to_another_port_sends_nothing_there(auth, capsys):
    """Every path answers 302 to another server: the run stops with an error saying so, and nothing (the
    credentials least of all) reaches the other server."""
    with PromLike(prometheus_api) as elsewhere:
        async def away(request: web.Request) -> web.Response:
            raise web.HTTPFound(elsewhere.url + request.path_qs)

        with PromLike(away) as server:
            code = main(_fleet(server.url, *auth))
        assert server.seen and all(a is not None and a.startswith(("Bearer ", "Basic ")) for _, _, a in server.seen)
        seen = list(elsewhere.seen)
    out, err = capsys.readouterr()
    assert seen == [], f"{len(seen)} requests reached the other origin"
    assert code == 3 and "Traceback" not in err, err
    assert "another origin" in err and "not followed" in err, err
    assert SECRET not in out + err


def test_a_redirect_on_the_same_origin_is_followed_with_the_credentials(capsys):
    """The control: a redirect to the same scheme, host and port is followed (form POST kept on 307), the
    credentials go with it, and the run completes."""

    async def moved(request: web.Request) -> web.StreamResponse:
        if not request.path.startswith("/prom/"):
            raise web.HTTPTemporaryRedirect("/prom" + request.path_qs)
        return await prometheus_api(request)

    with PromLike(moved) as server:
        code = main(_fleet(server.url, "--bearer-token", SECRET))
    out, err = capsys.readouterr()
    assert code == 3 and "Traceback" not in err and "runbook fleet:" not in err, err  # 3: an empty fleet, no error
    queries = [(m, p, a) for m, p, a in server.seen if p == "/prom/api/v1/query"]
    assert queries and all(m == "POST" and a == f"Bearer {SECRET}" for m, _, a in queries), server.seen[:5]


def test_a_gzip_bomb_stops_at_the_cap_with_an_error_naming_it(capsys):
    with PromLike(bomb) as server:
        code = main(_fleet(server.url))
    out, err = capsys.readouterr()
    assert code == 3 and "Traceback" not in err, err
    assert "PromSource.max_bytes" in err and "decompressed" in err and f"{PROM_MAX_BODY_BYTES / 2**20:g} MiB" in err, err


def test_a_query_answering_a_bomb_is_bounded_by_the_sources_cap():
    """The cap is the source's setting, counted after decompression, for the query path (form POST) too."""
    async def bomb_queries(request: web.Request) -> web.StreamResponse:
        return await (bomb(request) if request.path == "/api/v1/query" else prometheus_api(request))

    with PromLike(bomb_queries) as server:
        client = PromClient(PromSource(server.url, max_bytes=1 << 20))
        try:
            assert client.flavour() == ("prometheus", 0.0)
            with pytest.raises(PromError, match=r"more than 1 MiB \(limit: PromSource.max_bytes, decompressed\)"):
                client.query("up", 1764770700.0)
        finally:
            client.close()


def test_a_server_that_never_finishes_ends_at_the_deadline(capsys):
    with PromLike(never_finishes) as server:
        start = time.monotonic()
        code = main(_fleet(server.url, "--timeout", "1"))
        took = time.monotonic() - start
    out, err = capsys.readouterr()
    assert took < HANG_S, f"hung: {took:.0f} s"
    assert code == 3 and "Traceback" not in err, err
    assert "deadline" in err and "within 1 s" in err, err
