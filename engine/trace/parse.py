"""Stream the GPU events out of a gzipped Kineto Chrome trace without loading the whole JSON.

Why not `json.load`: a 100 MB trace becomes ~600 MB of Python objects, most of them CPU-side events
(`python_function`, `cpu_op`, `cuda_runtime`) the GPU analysis never reads. Why not ijson: it still
builds every event, and it is one more dependency for the GPU box. The stdlib does it in two steps:
a regular expression finds each `"cat": "<wanted>"` in the decompressed text, and
`json.JSONDecoder.raw_decode` (the C scanner) decodes only the event around it. That relies on
Kineto writing `ph` and `cat` before an event's other keys (`libkineto/src/output_json.cpp`); when a
file is laid out otherwise (a merger, `json.dump(sort_keys=True)`) every event is decoded in turn
instead, still streaming. Memory is bounded by one read chunk plus the events kept.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# Kineto before ~2022 (PyTorch 1.8-1.10) wrote GPU rows as category `Kernel`, `Memcpy`, `Memset`.
LEGACY_GPU_CATS = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}
SPAN_CATS = ("gpu_user_annotation", "user_annotation")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")  # the CPU side of each kernel launch (args.correlation)
WANTED = GPU_CATS + tuple(LEGACY_GPU_CATS) + SPAN_CATS + LAUNCH_CATS
_PYFN = re.compile(r'"cat"\s*:\s*"python_function"')
CHUNK = 1 << 20  # decompressed characters per read
_DECODER = json.JSONDecoder()
_RANK = re.compile(r'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
_BASE = re.compile(r'"baseTimeNanoseconds"\s*:\s*(\d+)')
_EVENTS = re.compile(r'"traceEvents"\s*:\s*\[')
_SKIP = re.compile(r"[ \t\r\n,]*")


class TraceError(Exception):
    """The file is not a readable Chrome trace (truncated gzip, not JSON, no traceEvents)."""


class _Layout(Exception):
    """The fast path met a key order it cannot trust: decode every event instead."""


@dataclass
class TraceMeta:
    rank: int | None = None
    base_time_ns: int | None = None
    events_decoded: int = 0
    fast_path: bool = True
    python_functions: int = 0  # `python_function` events (a capture with Python stacks: with_stack)
    extra: dict[str, int] = field(default_factory=dict)


def _marker(cats: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r'"cat"\s*:\s*"(' + "|".join(re.escape(c) for c in cats) + r')"')


MAX_TRACE_FILE_BYTES = 1 << 30  # on disk; SGLang's per-rank traces of a few decode steps are 5-100 MB
MAX_TRACE_TEXT_CHARS = 1 << 30  # decompressed (a gzip bomb, a sparse file of spaces stop here)
MAX_EVENT_CHARS = 4 << 20  # one event's JSON; a kernel event is ~500 characters
MAX_TRACE_EVENTS = 1_000_000  # GPU events kept from one file (~300 bytes each downstream); five decode steps on one rank are ~50,000


def _open_text(path: str | Path) -> IO[str]:
    """The trace as text, only if it is a regular file reached without a symlink (a link in the trace
    directory to /etc/shadow, a FIFO that blocks forever, a device are refused) and under its size caps."""
    from ..files import FileLimitError, open_regular  # noqa: PLC0415

    try:
        raw = open_regular(path, follow_symlinks=False)
    except FileLimitError as exc:
        raise TraceError(str(exc)) from None
    size = os.fstat(raw.fileno()).st_size
    if size > MAX_TRACE_FILE_BYTES:
        raw.close()
        raise TraceError(f"{path}: {size / 2**20:.0f} MiB on disk (limit: MAX_TRACE_FILE_BYTES {MAX_TRACE_FILE_BYTES / 2**20:.0f} MiB); not read")
    stream: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if str(path).endswith(".gz") else raw  # type: ignore[assignment]
    return io.TextIOWrapper(stream, encoding="utf-8")


def _chunks(path: str | Path) -> Iterator[str]:
    read = 0
    try:
        with _open_text(path) as f:
            while True:
                text = f.read(CHUNK)
                if not text:
                    return
                read += len(text)
                if read > MAX_TRACE_TEXT_CHARS:
                    raise TraceError(f"{path}: more than {MAX_TRACE_TEXT_CHARS / 2**20:g} Mi characters decompressed (limit: MAX_TRACE_TEXT_CHARS); not read further")
                yield text
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc}") from None


def _check_event(path: str | Path, chars: int) -> None:
    if chars > MAX_EVENT_CHARS:  # re-decoding an ever longer event would be quadratic
        raise TraceError(f"{path}: an event of more than {MAX_EVENT_CHARS >> 20} Mi characters (limit: MAX_EVENT_CHARS); not a profiler trace")


def _check_count(path: str | Path, n: int) -> None:
    if n > MAX_TRACE_EVENTS:
        raise TraceError(f"{path}: more than {MAX_TRACE_EVENTS:,} events (limit: MAX_TRACE_EVENTS {MAX_TRACE_EVENTS:,}); not read further")


def iter_events(path: str | Path, cats: tuple[str, ...] = WANTED, meta: TraceMeta | None = None) -> Iterator[dict]:
    """Events whose `cat` is in `cats`, in file order. Fills `meta` (rank, base time) on the way."""
    meta = meta if meta is not None else TraceMeta()
    try:
        yield from _fast(path, cats, meta)
    except _Layout:
        meta.fast_path = False
        meta.events_decoded = 0
        meta.python_functions = 0
        yield from _generic(path, set(cats), meta)


def _scan_meta(buf: str, meta: TraceMeta, head: bool) -> None:
    if head and meta.rank is None:
        events_at = _EVENTS.search(buf)
        m = _RANK.search(buf, 0, events_at.start() if events_at else len(buf))
        if m:
            meta.rank = int(m.group(1))
    if meta.base_time_ns is None:
        m = _BASE.search(buf)
        if m:
            meta.base_time_ns = int(m.group(1))


def _fast(path: str | Path, cats: tuple[str, ...], meta: TraceMeta) -> Iterator[dict]:
    mark = _marker(cats)
    carry, head, seen_events = "", True, False
    emitted = 0
    for text in _chunks(path):
        meta.python_functions += len(_PYFN.findall(text))
        buf = carry + text
        _scan_meta(buf, meta, head)
        if not seen_events and _EVENTS.search(buf):
            seen_events = True
        head = not seen_events
        pos, broke = 0, False
        for m in mark.finditer(buf):
            if m.start() < pos:
                continue
            start = buf.rfind("{", pos, m.start())
            if start < 0:
                raise _Layout()
            try:
                obj, end = _DECODER.raw_decode(buf, start)
            except json.JSONDecodeError as exc:
                if exc.pos >= len(buf) - 1 or "Unterminated" in exc.msg:
                    carry, broke = buf[start:], True  # the event continues in the next chunk
                    _check_event(path, len(carry))
                    break
                raise _Layout() from None
            if not isinstance(obj, dict) or obj.get("cat") != m.group(1) or end <= m.end():
                if emitted:  # events already handed out: a mixed layout is not something to guess about
                    raise TraceError(f"{path}: events laid out in more than one way; cannot stream it")
                raise _Layout()
            pos = end
            emitted += 1
            meta.events_decoded += 1
            _check_count(path, emitted)
            yield obj
        if not broke:
            last = buf.rfind("{", pos)
            # from the last "{" (an event may start there), but never more than an event may hold: the
            # root object's "{" before a GB of spaces must not make the carry, and each re-scan, grow
            k = max(pos, min(last if last >= 0 else len(buf), len(buf) - 64), len(buf) - MAX_EVENT_CHARS)
            carry = buf[k:]
    if not seen_events:
        raise TraceError(f"{path}: no traceEvents array (not a Chrome trace)")
    if mark.search(carry) or not carry.rstrip().endswith("}"):
        raise TraceError(f"{path}: the trace ends inside an event (truncated file)")


def _generic(path: str | Path, cats: set[str], meta: TraceMeta) -> Iterator[dict]:
    """Every element of traceEvents decoded in turn (any key order), still chunk by chunk."""
    chunks = _chunks(path)
    buf, i, started, head = "", 0, False, True
    kept = 0
    while True:
        if not started:
            try:
                text = next(chunks)
            except StopIteration:
                raise TraceError(f"{path}: no traceEvents array (not a Chrome trace)") from None
            buf = buf[-64:] + text if buf else text
            _scan_meta(buf, meta, head)
            m = _EVENTS.search(buf)
            if m:
                started, head, i = True, False, m.end()
            continue
        i = _SKIP.match(buf, i).end()  # a regex, not a loop per character: a GB of spaces takes a second
        if i < len(buf) and buf[i] == "]":
            rest = buf[i:]
            for text in chunks:
                rest += text
                if len(rest) > CHUNK:
                    rest = rest[-CHUNK:]
            _scan_meta(rest, meta, False)
            return
        try:
            obj, end = _DECODER.raw_decode(buf, i)
        except json.JSONDecodeError:
            try:
                text = next(chunks)
            except StopIteration:
                raise TraceError(f"{path}: the trace ends inside an event (truncated file)") from None
            buf, i = buf[i:] + text, 0
            _check_event(path, len(buf) - len(text))
            continue
        i = end
        meta.events_decoded += 1
        if isinstance(obj, dict) and obj.get("cat") == "python_function":
            meta.python_functions += 1
        if isinstance(obj, dict) and obj.get("cat") in cats:
            kept += 1
            _check_count(path, kept)
            yield obj
        if i > CHUNK:
            buf, i = buf[i:], 0
