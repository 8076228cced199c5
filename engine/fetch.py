"""Bounded HTTP for probes: every request a probe makes goes through `fetch` (probe families for SGLang,
vLLM, dcgm-exporter, Prometheus alike), so a hostile or broken server costs bounded time and memory.

What it bounds, each with a named limit in its error:
- the body, counted after decompression (`MAX_BODY_BYTES`): a gzip bomb stops at the cap, not at 3 GB;
  only identity, gzip and deflate are accepted, decoded here with `max_length`, never by the client;
- the whole exchange, connect to last byte (`timeout_s`): a server sending a byte a second ends at the
  deadline, not 68 s later (httpx's own timeout is per read);
- redirects: followed only to the same scheme, host and port, at most `MAX_REDIRECTS`; the headers (the
  API key) never go anywhere else;
- lines (`MAX_LINES`, see `check_lines`) for text formats parsed line by line (Prometheus exposition).

Synchronous callers (the fleet's Prometheus client) use `BlockingFetcher`: the same `fetch` on a private
event loop, so the limits are not written twice.
"""

from __future__ import annotations

import asyncio
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

if TYPE_CHECKING:
    import httpx

MAX_BODY_BYTES = 8 * 1024 * 1024  # /metrics with every rank exporting is ~1 MB; server_info ~50 KB
MAX_REDIRECTS = 3
MAX_LINES = 200_000  # a Prometheus page of 8 MB has ~100,000 series; parsing more costs seconds per scrape
REDIRECTS = (301, 302, 303, 307, 308)
_DROPPED_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


class FetchError(Exception):
    """A request that did not give a usable answer. `kind`: connect, timeout, too_large, redirect,
    encoding or http (a transport error); `message` names the URL and, for a limit, the limit."""

    def __init__(self, kind: str, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.kind, self.message = kind, message
        self.detail = detail or message  # the transport error as `Type: text`, for a probe's own wording


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


async def fetch(
    http: "httpx.AsyncClient",
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    json: Any = None,
    data: dict[str, str] | None = None,
    timeout_s: float = 10.0,
    max_bytes: int = MAX_BODY_BYTES,
    limit_name: str = "MAX_BODY_BYTES",
) -> "httpx.Response":
    """One request, its body read whole within the limits above; any status comes back (the caller decides
    what a 404 means). `data`: a form body (Prometheus' POST /api/v1/query); `limit_name`: what the too-large
error calls `max_bytes` (the caller's setting). Raises FetchError."""
    try:
        return await asyncio.wait_for(_fetch(http, url, method, headers or {}, json, data, timeout_s, max_bytes, limit_name), timeout_s)
    except asyncio.TimeoutError:
        raise FetchError("timeout", f"{url}: no complete answer within {timeout_s:g} s (the call's deadline)") from None


async def _fetch(http: "httpx.AsyncClient", url: str, method: str, headers: dict[str, str], json: Any,
                 data: dict[str, str] | None, timeout_s: float, max_bytes: int, limit_name: str) -> "httpx.Response":
    import httpx  # noqa: PLC0415 - lazy, as everywhere in the engine

    home = origin(url)
    sent = {"Accept-Encoding": "gzip, deflate, identity", **headers}
    timeout = httpx.Timeout(timeout_s, connect=min(5.0, timeout_s))
    for _ in range(MAX_REDIRECTS + 1):
        try:
            async with http.stream(method, url, headers=sent, json=json, data=data, timeout=timeout, follow_redirects=False) as r:
                if r.status_code in REDIRECTS and "location" in r.headers:
                    target = urljoin(str(r.url), r.headers["location"])
                    if origin(target) != home:
                        raise FetchError("redirect", f"{url} redirects to another origin ({_clip(target)}); not followed: requests stay on the target")
                    url = target
                    if r.status_code == 303:
                        method, json, data = "GET", None, None
                    continue
                body = await _read(r, max_bytes, url, limit_name)
                kept = [(k, v) for k, v in r.headers.items() if k.lower() not in _DROPPED_HEADERS]
                return httpx.Response(r.status_code, headers=kept, content=body, request=r.request)
        except httpx.ConnectError as e:
            raise FetchError("connect", f"cannot connect to {url}: {e or 'connection refused'}", f"{type(e).__name__}: {e}") from e
        except httpx.TimeoutException as e:
            raise FetchError("timeout", f"{url}: no answer within {timeout_s:g} s", f"{type(e).__name__}: {e}") from e
        except httpx.HTTPError as e:
            raise FetchError("http", f"{url}: {type(e).__name__}: {e}", f"{type(e).__name__}: {e}") from e
    raise FetchError("redirect", f"{url}: more than {MAX_REDIRECTS} redirects (limit: MAX_REDIRECTS {MAX_REDIRECTS})")


async def _read(r: "httpx.Response", max_bytes: int, url: str, limit_name: str = "MAX_BODY_BYTES") -> bytes:
    """The body, decoded here so the cap counts decompressed bytes and no chunk inflates past it."""
    encoding = r.headers.get("content-encoding", "identity").strip().lower() or "identity"
    if encoding in ("gzip", "x-gzip"):
        decoder: Any = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        decoder = zlib.decompressobj()
    elif encoding == "identity":
        decoder = None
    else:
        raise FetchError("encoding", f"{url}: Content-Encoding {_clip(encoding)} is not read (only gzip, deflate or none)")
    out = bytearray()
    too_large = FetchError("too_large", f"{url} answered more than {max_bytes / 2**20:g} MiB (limit: {limit_name}, decompressed); not read further")
    async for chunk in r.aiter_raw():
        if decoder is None:
            out += chunk
        else:
            data = chunk
            while data:
                try:
                    out += decoder.decompress(data, max_bytes + 1 - len(out))
                except zlib.error as e:
                    raise FetchError("encoding", f"{url}: the {encoding} body is corrupt: {e}") from None
                if len(out) > max_bytes:
                    raise too_large
                data = decoder.unconsumed_tail
        if len(out) > max_bytes:
            raise too_large
    return bytes(out)


class BlockingFetcher:
    """`fetch` for synchronous code: an `httpx.AsyncClient` on an event loop of its own, run one request at a
    time. Not for use inside a running event loop (there, await `fetch`). `client_options` go to the
    AsyncClient (verify=...); credentials belong in the headers of each call, which `fetch` sends to the
    URL's own origin only."""

    def __init__(self, **client_options: Any) -> None:
        import httpx  # noqa: PLC0415

        self._loop = asyncio.new_event_loop()
        self._executor = ThreadPoolExecutor(thread_name_prefix="runbook-fetch")  # name lookups run here
        self._loop.set_default_executor(self._executor)
        self.http = httpx.AsyncClient(**client_options)

    def release_threads(self) -> None:
        """End the threads name lookups started (they stay idle otherwise): a process about to fork must have
        none. A later lookup starts a new one."""
        old, self._executor = self._executor, ThreadPoolExecutor(thread_name_prefix="runbook-fetch")
        self._loop.set_default_executor(self._executor)
        old.shutdown(wait=True)

    def fetch(self, url: str, **kwargs: Any) -> "httpx.Response":
        """As `fetch(http, url, **kwargs)`. Raises FetchError."""
        return self._loop.run_until_complete(fetch(self.http, url, **kwargs))

    def run(self, coro: Any) -> Any:
        """Run a coroutine that awaits `fetch(self.http, ...)` (several at once, say) on this fetcher's loop."""
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._loop.run_until_complete(self.http.aclose())
        finally:
            self._loop.close()
            self._executor.shutdown(wait=False)


def check_lines(text: str, what: str, limit: int = MAX_LINES) -> None:
    """Refuse a text of more than `limit` lines before a line parser spends seconds on it."""
    if text.count("\n", 0, None) > limit:
        raise FetchError("too_large", f"{what}: more than {limit:,} lines (limit: MAX_LINES {limit:,}); not parsed")


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
