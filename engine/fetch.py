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
"""

from __future__ import annotations

import asyncio
import zlib
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
    timeout_s: float = 10.0,
    max_bytes: int = MAX_BODY_BYTES,
) -> "httpx.Response":
    """One request, its body read whole within the limits above; any status comes back (the caller decides
    what a 404 means). Raises FetchError."""
    try:
        return await asyncio.wait_for(_fetch(http, url, method, headers or {}, json, timeout_s, max_bytes), timeout_s)
    except asyncio.TimeoutError:
        raise FetchError("timeout", f"{url}: no complete answer within {timeout_s:g} s (the call's deadline)") from None


async def _fetch(http: "httpx.AsyncClient", url: str, method: str, headers: dict[str, str], json: Any, timeout_s: float, max_bytes: int) -> "httpx.Response":
    import httpx  # noqa: PLC0415 - lazy, as everywhere in the engine

    home = origin(url)
    sent = {"Accept-Encoding": "gzip, deflate, identity", **headers}
    timeout = httpx.Timeout(timeout_s, connect=min(5.0, timeout_s))
    for _ in range(MAX_REDIRECTS + 1):
        try:
            async with http.stream(method, url, headers=sent, json=json, timeout=timeout, follow_redirects=False) as r:
                if r.status_code in REDIRECTS and "location" in r.headers:
                    target = urljoin(str(r.url), r.headers["location"])
                    if origin(target) != home:
                        raise FetchError("redirect", f"{url} redirects to another origin ({_clip(target)}); not followed: requests stay on the target")
                    url = target
                    if r.status_code == 303:
                        method, json = "GET", None
                    continue
                body = await _read(r, max_bytes, url)
                kept = [(k, v) for k, v in r.headers.items() if k.lower() not in _DROPPED_HEADERS]
                return httpx.Response(r.status_code, headers=kept, content=body, request=r.request)
        except httpx.ConnectError as e:
            raise FetchError("connect", f"cannot connect to {url}: {e or 'connection refused'}", f"{type(e).__name__}: {e}") from e
        except httpx.TimeoutException as e:
            raise FetchError("timeout", f"{url}: no answer within {timeout_s:g} s", f"{type(e).__name__}: {e}") from e
        except httpx.HTTPError as e:
            raise FetchError("http", f"{url}: {type(e).__name__}: {e}", f"{type(e).__name__}: {e}") from e
    raise FetchError("redirect", f"{url}: more than {MAX_REDIRECTS} redirects (limit: MAX_REDIRECTS {MAX_REDIRECTS})")


async def _read(r: "httpx.Response", max_bytes: int, url: str) -> bytes:
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
    too_large = FetchError("too_large", f"{url} answered more than {max_bytes / 2**20:g} MiB (limit: MAX_BODY_BYTES, decompressed); not read further")
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


def check_lines(text: str, what: str, limit: int = MAX_LINES) -> None:
    """Refuse a text of more than `limit` lines before a line parser spends seconds on it."""
    if text.count("\n", 0, None) > limit:
        raise FetchError("too_large", f"{what}: more than {limit:,} lines (limit: MAX_LINES {limit:,}); not parsed")


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
