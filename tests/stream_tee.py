"""A reference client that reads the same streams the load generator reads, where it reads them.

While installed, every aiohttp request records when it was sent, and every chunk its response body yields is
timestamped and kept before the load generator sees it. The reference then parses those bytes the plain way
`vllm bench serve` does (`vllm/benchmarks/lib/endpoint_request_func.py`: json per SSE event; an event with text
is a token arrival, TTFT from the send, ITL between arrivals; `usage.completion_tokens` the count). The load
generator's own reading (no json, byte scans, coalesced chunks) is what is under test: the two read one stream
with one clock, so a difference is a difference in reading. Nothing is replaced: the load generator gets the
same bytes at the same moments. Used by tests/test_load_openai.py and benchmarks/load_openai_reference.py.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class Stream:
    start: float
    chunks: list[tuple[float, bytes]] = field(default_factory=list)


@dataclass
class ReferenceFigures:
    requests: int
    output_tokens: int
    duration_s: float
    output_tokens_per_s: float
    request_throughput: float
    ttft_ms_mean: float
    ttft_ms_p50: float
    itl_ms_mean: float
    itl_ms_p50: float


def read_stream(stream: Stream) -> tuple[list[float], int | None, float]:
    """(token arrival times, usage.completion_tokens, end) of one recorded SSE stream."""
    arrivals: list[float] = []
    tokens: int | None = None
    buf, end = b"", stream.start
    for t, chunk in stream.chunks:
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event.removeprefix(b"data:").strip()
            if not data:
                continue
            end = t
            if data == b"[DONE]":
                continue
            msg = json.loads(data)
            if any(c.get("text") for c in msg.get("choices") or []):
                arrivals.append(t)
            if isinstance(msg.get("usage"), dict):
                tokens = msg["usage"].get("completion_tokens")
    return arrivals, tokens, end


class ReferenceReader:
    """Install around a load: `with ReferenceReader() as ref: ...; ref.figures()`."""

    def __init__(self) -> None:
        self.streams: list[Stream] = []
        self._by_reader: dict[int, tuple[aiohttp.StreamReader, Stream]] = {}
        self._saved: Any = None

    def __enter__(self) -> "ReferenceReader":
        send, readany = aiohttp.ClientSession._request, aiohttp.StreamReader.readany
        self._saved = (send, readany)
        streams, by_reader = self.streams, self._by_reader

        async def request(session: aiohttp.ClientSession, method: str, url: Any, **kw: Any) -> aiohttp.ClientResponse:
            start = time.perf_counter()
            resp = await send(session, method, url, **kw)
            if str(url).endswith("/v1/completions"):
                rec = Stream(start=start)
                streams.append(rec)
                by_reader[id(resp.content)] = (resp.content, rec)  # the reader is kept: its id stays its own
            return resp

        async def recorded(reader: aiohttp.StreamReader) -> bytes:
            chunk = await readany(reader)
            entry = by_reader.get(id(reader))
            if chunk and entry is not None and entry[0] is reader:
                entry[1].chunks.append((time.perf_counter(), chunk))
            return chunk

        aiohttp.ClientSession._request = request  # type: ignore[method-assign]
        aiohttp.StreamReader.readany = recorded  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        aiohttp.ClientSession._request, aiohttp.StreamReader.readany = self._saved  # type: ignore[method-assign]

    def figures(self) -> ReferenceFigures:
        read = [(s, *read_stream(s)) for s in self.streams]
        done = [(s, arr, tok, end) for s, arr, tok, end in read if arr]
        tokens = sum(tok if tok is not None else len(arr) for _, arr, tok, _ in done)
        duration = max(end for *_, end in done) - min(s.start for s, *_ in done)
        ttft = [(arr[0] - s.start) * 1000 for s, arr, _, _ in done]
        itl = [(b - a) * 1000 for _, arr, _, _ in done for a, b in zip(arr, arr[1:])]
        return ReferenceFigures(
            requests=len(done), output_tokens=tokens, duration_s=duration, output_tokens_per_s=tokens / duration,
            request_throughput=len(done) / duration, ttft_ms_mean=statistics.fmean(ttft), ttft_ms_p50=statistics.median(ttft),
            itl_ms_mean=statistics.fmean(itl), itl_ms_p50=statistics.median(itl),
        )  # fmt: skip
