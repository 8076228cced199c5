"""Closed-loop load against the configured SGLang server, measured the way `bench_serving` does.

`concurrency` workers each send one streaming request at a time to `/generate` (default) or
`/v1/completions` and report request/token throughput, TTFT, ITL, TPOT and E2E latency. The runner
drives one while `under_load` probes sample; `sglang.sweep` runs one per concurrency level.

Every request gets its own prompt: `input_len` random token ids, drawn from a generator seeded with
(`seed`, request number), so requests share no prefix beyond chance (no radix-cache hits between
them, MoE routing not correlated across requests, as with real traffic) and a run is reproducible. Prompts are built when
the request is issued and dropped once sent: the client holds at most `concurrency` of them, and a
load shape whose prompts in flight (`concurrency` x `input_len`) exceed PROMPT_TOKENS_IN_FLIGHT_MAX
is refused when the config is built. `temperature` defaults to 0.0 (greedy, as bench_serving sends).

The hot path is kept cheap because 1024 streams share a couple of cores with the probes, and a
client that saturates its core would set the pace of the measurement instead of the server. Streams
go through one `aiohttp.ClientSession` per generator (`TCPConnector(limit=concurrency)`, keep-alive,
C HTTP parser): httpx/httpcore cost ~4x the CPU per token (pool bookkeeping scanning every
connection per request, several async layers per chunk). The response is read as raw bytes, split
on SSE event boundaries (blank line, LF or CRLF), and tokens are counted without json-parsing the
chunks (`/generate`: the last `"completion_tokens"` value of the read, since `text` is cumulative;
`/v1/completions`: one token per content chunk, `usage.completion_tokens` when it arrives). The
scan accepts any JSON whitespace (`"completion_tokens": 5`, pretty-printed events, `data:` lines
split per SSE); a fast path covers the compact JSON SGLang writes. When requests finish and no
token was counted, the stream format was not understood: `stream_problem()` says so and
`until_streaming()` stops waiting. Requests only ever go to `target.server_url`.

`benchmarks/load_generator.py` measures tokens per client CPU-second against a plain asyncio
streams client; `LoadReport.client_cpu_s` / `client_cpu_share` say, for every run, how much of a
core the process used (near 1.0: the client may have been the bottleneck).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from array import array
from collections import deque
from typing import TYPE_CHECKING, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from . import json_bounded

if TYPE_CHECKING:
    import aiohttp

    from .target import Target

# Prompt tokens in flight at once (concurrency x input_len). At most 6 bytes a token in the JSON
# body (ids below TOKEN_ID_END), that is about 48 MiB of request bodies held by the client, and what
# the server must hold of them. `--set load_input_len=200000` at 256 concurrent (51.2M) is refused.
PROMPT_TOKENS_IN_FLIGHT_MAX = 8 * 1024 * 1024
# Streams open at once: each holds a connection, a task and their buffers (~15 KB of client memory
# measured, ~250 MB at the bound) and a file descriptor.
CONCURRENCY_MAX = 16384
MAX_EVENT_BYTES = 1024 * 1024  # one SSE event (a token's JSON is ~300 bytes); past it the stream is broken
# Prompt token ids are drawn from [TOKEN_ID_START, TOKEN_ID_END): inside every common vocabulary
# (32k and up), above the low ids where most tokenizers keep their special tokens.
TOKEN_ID_START, TOKEN_ID_END = 1000, 31000


class LoadConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    endpoint: Literal["generate", "completions"] = "generate"
    concurrency: int = Field(64, ge=1)
    input_len: int = Field(128, ge=1)
    output_len: int = Field(128, ge=1)
    # Each request's output length is drawn (seeded per request) from [ratio x output_len, output_len], as
    # bench_serving's --random-range-ratio does for its random dataset. 1.0: every request the same length,
    # and a cohort admitted together also finishes together, so the batch empties and refills in waves (the
    # client must send a whole batch at once, and a window can fall on a refill); below 1 the finishes
    # spread and the batch holds its size, as production traffic does.
    output_range_ratio: float = Field(1.0, ge=0.0, le=1.0)
    ignore_eos: bool = True
    temperature: float = Field(0.0, ge=0.0)  # 0.0: greedy, what bench_serving sends
    seed: int = Field(0, ge=0)  # of the prompts' token ids: the same seed sends the same prompts
    duration_s: float | None = Field(None, gt=0)  # None: until stop()
    max_requests: int | None = Field(None, ge=1)
    model: str | None = None  # for /v1/completions; default: first of /v1/models or "default"
    request_timeout_s: float = Field(600, gt=0)  # longest wait for the answer or for the next chunk

    @field_validator("concurrency")
    @classmethod
    def _streams_within_budget(cls, concurrency: int) -> int:
        if concurrency > CONCURRENCY_MAX:
            raise PydanticCustomError(
                "load_budget",
                f"{concurrency} concurrent streams, over the load's budget of {CONCURRENCY_MAX:,} (each holds a connection, "
                "its buffers and a file descriptor); lower the concurrency",
            )
        return concurrency

    @field_validator("input_len")
    @classmethod
    def _within_budget(cls, input_len: int, info: ValidationInfo) -> int:
        concurrency = info.data.get("concurrency")
        if concurrency is not None and concurrency * input_len > PROMPT_TOKENS_IN_FLIGHT_MAX:
            message = (
                f"{concurrency} concurrent x {input_len} prompt tokens = {concurrency * input_len:,} prompt tokens in flight, "
                f"over the load's memory budget of {PROMPT_TOKENS_IN_FLIGHT_MAX:,} (about 48 MiB of request bodies); "
                "lower the concurrency or the input length"
            )
            raise PydanticCustomError("load_budget", message)
        return input_len


_ID_BYTES: list[bytes] = []
_LENGTH_MARK = 987654321  # where a request's output length goes in its body


def prompt_ids(seed: int, n: int, length: int) -> bytes:
    """Request `n`'s prompt: `length` token ids, comma-separated (the inside of a JSON array).

    Seeded with (seed, n): reproducible across runs, distinct across requests. Built from a table of
    the ids' decimal forms, so a prompt costs one `choices` and one `join`.
    """
    if not _ID_BYTES:
        _ID_BYTES.extend(b"%d" % i for i in range(TOKEN_ID_START, TOKEN_ID_END))
    return b",".join(random.Random(seed << 40 | n).choices(_ID_BYTES, k=length))


def output_len_for(seed: int, n: int, output_len: int, range_ratio: float) -> int:
    """Request `n`'s output length: uniform over [range_ratio x output_len, output_len], seeded with (seed, n)."""
    low = max(1, int(output_len * range_ratio))
    if low >= output_len:
        return output_len
    return random.Random(~(seed << 40 | n)).randint(low, output_len)


class LoadStats(BaseModel):
    """Live counters, cheap to build: the TUI reads them several times a second."""

    concurrency: int
    in_flight: int
    completed: int
    errors: int
    elapsed_s: float
    output_tokens: int
    output_tokens_per_s: float  # over the last few seconds


class Latency(BaseModel):
    """Milliseconds; None when there were no samples."""

    mean: float | None = None
    p50: float | None = None
    p99: float | None = None


class LoadReport(BaseModel):
    """What bench_serving reports, for a time- or count-bounded closed loop. Goes into results JSON.

    Token rates count every streamed output token, including those of requests still running when
    the load stopped (a time-bounded load at high concurrency would otherwise under-report);
    `completed_output_tokens` is the bench_serving-style count over finished requests only.
    """

    config: LoadConfig
    duration_s: float
    completed: int
    failed: int
    cancelled: int  # in flight when the load stopped
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    error_examples: dict[str, str] = Field(default_factory=dict)  # first message per kind
    input_tokens: int
    output_tokens: int
    completed_output_tokens: int
    request_throughput: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    concurrency_achieved: float  # mean requests in flight: time spent in requests (any outcome) / duration
    ttft_ms: Latency
    itl_ms: Latency
    tpot_ms: Latency
    e2e_ms: Latency
    # Process CPU time (time.process_time) over the run, and its share of the wall-clock duration.
    # A share near 1.0 means the client used a whole core (it is single-threaded asyncio): the
    # server may have been faster than measured. Whole-process figures: with `runbook run
    # --simulate` the simulated server's thread is included (SimServer.cpu_seconds() has its own).
    client_cpu_s: float = 0.0
    client_cpu_share: float = 0.0
    # Requests that finished with no output token counted, and what was wrong, when none was counted
    # at all (the stream format was not understood): the token figures above are then meaningless.
    uncounted_requests: int = 0
    stream_problem: str | None = None
    # Every 0.5 s: [seconds since the start, requests streaming tokens, output tokens so far, requests that have
    # streamed a first token so far]. Each streaming request gets one token a decode step and each new stream had a
    # prefill, so over a few seconds time ~ steps x (a + c x batch) + prefills x q: the ramp passes through every
    # batch size on the way to the steady state (findings fits a, c and q to it).
    decode_timeline: list[list[float]] = Field(default_factory=list)


class RuleLoad(LoadReport):
    """What rules read as `load`: the report, plus the steady-state throughput the runner measured over
    the sampling window (the one every renderer quotes), when it measured one."""

    steady_output_tokens_per_s: float | None = None
    steady_window_s: float | None = None


def _percentile(sorted_vals: "array[float] | list[float]", q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on pre-sorted values."""
    n = len(sorted_vals)
    pos = (n - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def summarize_ms(values_s: "array[float] | list[float]") -> Latency:
    if not values_s:
        return Latency()
    vals = sorted(values_s)
    return Latency(
        mean=round(sum(vals) / len(vals) * 1000, 3),
        p50=round(_percentile(vals, 50) * 1000, 3),
        p99=round(_percentile(vals, 99) * 1000, 3),
    )


_CT = b'"completion_tokens"'
_EMPTY_TEXT = re.compile(rb'"text"(?:[ \t\r\n]|data:)*:(?:[ \t\r\n]|data:)*""')  # a /v1/completions chunk without text
_EVENT_SPLIT = re.compile(rb"\r?\n\r?\n")


def _skip_ws(block: bytes, j: int, n: int) -> int:
    """Past JSON whitespace, and past the `data:` that starts each line of an event sent over several."""
    while j < n:
        c = block[j]
        if c == 32 or c == 10 or c == 13 or c == 9:
            j += 1
            if c == 10 and block.startswith(b"data:", j):
                j += 5
        else:
            break
    return j


def _number_after(block: bytes, i: int) -> int:
    """The non-negative integer that a JSON key ending at `block[i]` maps to; -1 when it is not one.

    `:5` is the fast path (SGLang writes compact JSON); `: 5`, ` :\n  5` and an event split over
    several `data:` lines are accepted too.
    """
    n = len(block)
    if i + 1 < n and block[i] == 58 and 48 <= block[i + 1] <= 57:
        j = i + 1
    else:
        j = _skip_ws(block, i, n)
        if j >= n or block[j] != 58:
            return -1
        j = _skip_ws(block, j + 1, n)
    k = j
    while k < n and 48 <= block[k] <= 57:
        k += 1
    return int(block[j:k]) if k > j else -1


def _payloads(block: bytes) -> list[bytes]:
    """The data of each SSE event in `block` (slow path: errors and messages only). Lenient: a line
    without a field name is taken as data, as a server that pretty-prints after `data: ` writes it."""
    out = []
    for event in _EVENT_SPLIT.split(block):
        parts = []
        for line in event.splitlines():
            if line.startswith(b"data:"):
                line = line[6:] if line.startswith(b"data: ") else line[5:]
            elif line[:1] == b":" or line.startswith((b"event:", b"id:", b"retry:")):
                continue
            parts.append(line)
        if parts:
            out.append(b"\n".join(parts))
    return out


def _error_event(block: bytes) -> str | None:
    """The first event of `block` whose JSON has a top-level "error", compacted; None when none has."""
    for data in _payloads(block):
        try:
            obj = json_bounded.loads(data)
        except ValueError:
            continue
        if isinstance(obj, dict) and "error" in obj:
            return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)[:300]
    return None


FAILURES_BEFORE_GIVING_UP = 3  # per worker, with nothing streamed: the server is not answering


class _StreamError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


TIMELINE_MAX = 4800  # 40 minutes of 0.5 s samples: the ramp and a long window, bounded


class LoadGenerator:
    """`start()` spawns the workers and returns; `stop()` cancels them and returns the report.

    The streams use the generator's own aiohttp session (opened in `start()`, closed in `stop()`).
    `client`, when given, is only used for the `/v1/models` lookup of the completions model name
    and is left open; without it that lookup goes through the aiohttp session too.
    """

    def __init__(self, target: "Target", config: LoadConfig, client: httpx.AsyncClient | None = None) -> None:
        self.target = target
        endpoint = target.load_endpoint(config.endpoint)  # a server without /generate (vLLM) gets the OpenAI API
        self.config = config = config if endpoint == config.endpoint else config.model_copy(update={"endpoint": endpoint})
        self._base = target.server_url.rstrip("/")
        self._headers = {"Content-Type": "application/json", **target.auth_headers()}
        self._client = client
        self._session: aiohttp.ClientSession | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._ticker: asyncio.Task[None] | None = None
        self._all_done = asyncio.Event()
        self._stopping = False
        self._report: LoadReport | None = None
        self._t0 = 0.0
        self._t_end: float | None = None
        self._cpu0 = 0.0
        self._cpu_end: float | None = None
        self._issued = 0
        self._live_workers = 0
        # live counters
        self._in_flight = 0
        self._completed = 0
        self._failed = 0
        self._cancelled = 0
        self._output_tokens = 0
        self._completed_output_tokens = 0
        self._busy_s = 0.0  # seconds spent inside requests, whatever their outcome
        self._window: deque[tuple[float, int]] = deque(maxlen=12)
        self._decoding = 0  # requests that have streamed a token and not finished
        self._streams_started = 0  # requests that have streamed their first token (each one a prefill behind it)
        self._timeline: list[list[float]] = []
        # samples (seconds)
        self._ttft: array[float] = array("d")
        self._itl: array[float] = array("d")
        self._tpot: array[float] = array("d")
        self._e2e: array[float] = array("d")
        self._errors: dict[str, int] = {}
        self._error_examples: dict[str, str] = {}
        self._uncounted = 0  # requests that finished with no token counted
        self._uncounted_example: str | None = None  # the first event of the first of them
        self._path = "/generate" if config.endpoint == "generate" else "/v1/completions"
        self._url = self._base + self._path
        self._body_head = b""
        self._body_tail = b""  # up to the output length where it varies per request, else to the end
        self._body_end = b""  # after the output length (empty when the tail holds it)

    # ---- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        import aiohttp  # noqa: PLC0415 - when load runs: `runbook validate` and `runbook fleet` read runbooks (LoadConfig) without it

        cfg = self.config
        self._cpu0 = time.process_time()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=cfg.concurrency, limit_per_host=0),
            # No sock_read: aiohttp re-arms that timer on every chunk (a TimerHandle and a heap
            # push per token). request_timeout_s is enforced by _watch, one timer per request.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0),
            headers=self._headers,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
            auto_decompress=False,
            trust_env=False,  # straight to the server, never through an HTTP(S)_PROXY
        )
        # Each request's body is head + its prompt ids + tail, built when it is issued (_one).
        if cfg.endpoint == "completions":
            model = cfg.model or await self._first_model()
            body = {
                "model": model, "prompt": [0], "max_tokens": _LENGTH_MARK, "temperature": cfg.temperature,
                "stream": True, "ignore_eos": cfg.ignore_eos, "stream_options": {"include_usage": True},
            }  # fmt: skip
            marker = b'"prompt":[0]'
        else:
            sp = {"temperature": cfg.temperature, "max_new_tokens": _LENGTH_MARK, "ignore_eos": cfg.ignore_eos}
            body = {"input_ids": [0], "sampling_params": sp, "stream": True}
            marker = b'"input_ids":[0]'
        raw = json.dumps(body, separators=(",", ":")).encode()
        head, tail = raw.split(marker)
        self._body_head = head + marker[:-2]
        before, after = tail.split(b"%d" % _LENGTH_MARK)
        if cfg.output_range_ratio < 1.0:
            self._body_tail, self._body_end = b"]" + before, after
        else:
            self._body_tail, self._body_end = b"]" + before + b"%d" % cfg.output_len + after, b""
        self._t0 = time.perf_counter()
        self._window.append((self._t0, 0))
        self._live_workers = cfg.concurrency
        self._workers = [asyncio.create_task(self._worker(), name=f"load-{i}") for i in range(cfg.concurrency)]
        self._ticker = asyncio.create_task(self._tick())

    async def wait(self) -> None:
        """Until the duration or request budget is reached (or stop() is called)."""
        d = self.config.duration_s
        if d is None:
            await self._all_done.wait()
            return
        remaining = d - (time.perf_counter() - self._t0)
        if remaining > 0:
            try:
                await asyncio.wait_for(self._all_done.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def stop(self) -> LoadReport:
        if self._report is not None:
            return self._report
        self._stopping = True
        self._mark_end()
        for t in self._workers:
            t.cancel()
        if self._ticker is not None:
            self._ticker.cancel()
        await asyncio.gather(*self._workers, *( [self._ticker] if self._ticker else []), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        self._all_done.set()
        self._report = self._build_report()
        return self._report

    async def run(self) -> LoadReport:
        await self.start()
        try:
            await self.wait()
        finally:
            report = await self.stop()
        return report

    def stats(self) -> LoadStats:
        now = time.perf_counter()
        elapsed = (self._t_end or now) - self._t0 if self._t0 else 0.0
        rate = 0.0
        if self._window:
            t_old, n_old = self._window[0]
            if now - t_old > 1e-3:
                rate = (self._output_tokens - n_old) / (now - t_old)
        return LoadStats(
            concurrency=self.config.concurrency,
            in_flight=self._in_flight,
            completed=self._completed,
            errors=self._failed,
            elapsed_s=round(elapsed, 3),
            output_tokens=self._output_tokens,
            output_tokens_per_s=round(rate, 1),
        )

    @property
    def done(self) -> bool:
        return self._all_done.is_set()

    async def until_streaming(self, limit_s: float = 30.0, poll_s: float = 0.05) -> bool:
        """Wait until the load streams at (nearly) full concurrency: opening thousands of streams takes
        seconds on a small client, so a warm-up or a measurement counts from here.

        False on time-out, and early when nothing streamed while every worker failed a few times
        (refused, 401, 5xx), or when requests finish and no token is counted (`stream_problem()`):
        waiting the whole limit on a dead server or an unreadable stream only delays the evidence.
        """
        deadline = time.perf_counter() + limit_s
        while time.perf_counter() < deadline and not self.done:
            stats = self.stats()
            if stats.output_tokens > 0 and stats.in_flight + stats.completed + stats.errors >= 0.95 * self.config.concurrency:
                return True
            if self.failing or self.stream_problem() is not None:
                return False
            await asyncio.sleep(poll_s)
        return False

    @property
    def started_requests(self) -> int:
        """Requests that received their first token (finished ones included)."""
        return len(self._ttft)

    async def until_admitted(self, limit_s: float = 180.0, settle_s: float = 3.0, poll_s: float = 0.25) -> bool:
        """Wait until the server has admitted what it will: every request streams, or the count of
        requests that got their first token stops growing (the rest wait behind the running cap or the
        KV cache). Prefill admits a chunk of requests at a time, so on a big box this takes tens of
        seconds; a window sampled during that ramp sees a batch that is still growing.

        False on time-out or when nothing streams.
        """
        deadline = time.perf_counter() + limit_s
        history: list[tuple[float, int]] = []
        while time.perf_counter() < deadline and not self.done:
            now, started = time.perf_counter(), self.started_requests
            if started >= 0.98 * self.config.concurrency:
                return True
            history.append((now, started))
            while history and now - history[0][0] > settle_s:
                past = history.pop(0)
                if started > 0 and started - past[1] <= max(1.0, 0.005 * self.config.concurrency * settle_s):
                    return True
            if self.failing or self.stream_problem() is not None:
                return False
            await asyncio.sleep(poll_s)
        return False

    async def until_turnover(self, limit_s: float = 240.0, poll_s: float = 0.25) -> bool:
        """Wait until the first requests finish and are replaced: a closed loop is in its steady state
        after one request lifetime. Before that every request is young, the KV cache holds only what
        they have generated so far, and a KV wall that forms when they are old is not yet there.
        False on time-out."""
        deadline = time.perf_counter() + limit_s
        while time.perf_counter() < deadline and not self.done:
            if self._completed > 0:
                return True
            if self.failing or self.stream_problem() is not None:
                return False
            await asyncio.sleep(poll_s)
        return False

    def stream_problem(self) -> str | None:
        """Why requests finish without a token counted, once one has and none has been counted at all."""
        if not self._uncounted or self._output_tokens:
            return None
        return (f"{self._uncounted} request{'s' if self._uncounted != 1 else ''} finished but no tokens were counted: "
                f"the stream format was not understood (first event: {self._uncounted_example!r})")  # fmt: skip

    @property
    def failing(self) -> bool:
        """Nothing streamed, nothing completed, and each worker failed FAILURES_BEFORE_GIVING_UP times on average."""
        return self._output_tokens == 0 and self._completed == 0 and self._failed >= FAILURES_BEFORE_GIVING_UP * self.config.concurrency

    def first_error(self) -> str | None:
        """The first message of the most frequent error kind, for a log line."""
        if not self._errors:
            return None
        kind = max(self._errors, key=self._errors.__getitem__)
        return f"{kind}: {self._error_examples.get(kind, '')}"

    # ---- internals --------------------------------------------------------------------------------

    def _mark_end(self) -> None:
        if self._t_end is None:
            self._t_end = time.perf_counter()
            self._cpu_end = time.process_time()

    async def _first_model(self) -> str:
        import aiohttp  # noqa: PLC0415 - see start()

        try:
            if self._client is not None:
                r = await self._client.get(self._base + "/v1/models", headers=self._headers, timeout=10)
                status, payload = r.status_code, json_bounded.loads(r.content)
            else:
                assert self._session is not None
                async with self._session.get(self._base + "/v1/models", timeout=aiohttp.ClientTimeout(total=10), allow_redirects=False) as resp:
                    body = b""
                    async for chunk in resp.content.iter_any():
                        body += chunk
                        if len(body) > MAX_EVENT_BYTES:
                            return "default"
                    status, payload = resp.status, json_bounded.loads(body)
            data = payload.get("data") or []
            if status == 200 and data and data[0].get("id"):
                return str(data[0]["id"])
        except Exception:
            pass
        return "default"

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.perf_counter()
            self._window.append((now, self._output_tokens))
            if len(self._timeline) < TIMELINE_MAX:
                self._timeline.append([round(now - self._t0, 3), float(self._decoding), float(self._output_tokens),
                                       float(self._streams_started)])

    def _take_budget(self) -> bool:
        cfg = self.config
        if self._stopping:
            return False
        if cfg.duration_s is not None and time.perf_counter() - self._t0 >= cfg.duration_s:
            return False
        if cfg.max_requests is not None and self._issued >= cfg.max_requests:
            return False
        self._issued += 1
        return True

    async def _worker(self) -> None:
        backoff = 0.0
        try:
            while self._take_budget():
                ok = await self._one(self._issued)
                if ok:
                    backoff = 0.0
                else:  # don't spin on a dead server
                    backoff = min(1.0, backoff * 2 or 0.05)
                    await asyncio.sleep(backoff)
        finally:
            self._live_workers -= 1
            if self._live_workers == 0 and not self._stopping:
                self._mark_end()
                self._all_done.set()

    def _watch(self, task: "asyncio.Task[None]", act: list) -> None:
        """request_timeout_s without an answer or a new event: cancel the request as a timeout.

        `act` is [last activity (perf_counter), timed out, timer handle]; the hot loop only stores
        the time, and the timer is re-armed lazily when it fires early.
        """
        idle = time.perf_counter() - act[0]
        limit = self.config.request_timeout_s
        if idle < limit:
            act[2] = asyncio.get_running_loop().call_later(limit - idle, self._watch, task, act)
            return
        act[1] = True
        task.cancel()

    def _error(self, kind: str, message: str) -> None:
        self._failed += 1
        self._errors[kind] = self._errors.get(kind, 0) + 1
        self._error_examples.setdefault(kind, message[:300])

    async def _one(self, n: int) -> bool:
        """One request; True when it completed. Samples go straight into the arrays."""
        import aiohttp  # noqa: PLC0415 - see start(); a dictionary lookup once imported

        session = self._session
        assert session is not None
        cfg = self.config
        generate = cfg.endpoint == "generate"
        body = self._body_head + prompt_ids(cfg.seed, n, cfg.input_len) + self._body_tail
        if self._body_end:
            body += b"%d" % output_len_for(cfg.seed, n, cfg.output_len, cfg.output_range_ratio) + self._body_end
        tokens = 0
        first = 0.0
        first_block: bytes | None = None
        self._in_flight += 1
        start = time.perf_counter()
        last = start
        task = asyncio.current_task()
        assert task is not None
        act: list = [start, False, None]
        act[2] = asyncio.get_running_loop().call_later(cfg.request_timeout_s, self._watch, task, act)
        streaming = False
        try:
            async with session.post(self._url, data=body, allow_redirects=False) as resp:  # never off the target
                del body  # sent: the client holds no prompt past this point
                act[0] = time.perf_counter()
                if resp.status != 200:
                    text = (await resp.content.read(300)).decode("utf-8", "replace")  # not the whole body: it may not end
                    raise _StreamError(f"http_{resp.status}", f"HTTP {resp.status} from {self._path}: {text}")
                buf = b""
                sep = b""
                finished = False
                usage_tokens = -1
                itl = self._itl
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    if len(buf) > MAX_EVENT_BYTES:  # a stream that never sends a separator must not grow without end
                        raise _StreamError("oversized_event", f"{self._path} sent {len(buf) // 1024} KiB without an event separator (limit: MAX_EVENT_BYTES {MAX_EVENT_BYTES // 1024} KiB)")
                    if not sep:  # raw CR in an SSE body only ever ends lines: CRLF events
                        sep = b"\r\n\r\n" if b"\r" in buf else b"\n\n"
                    end = buf.rfind(sep)
                    if end < 0:
                        continue
                    block = buf[:end]
                    buf = buf[end + len(sep) :]
                    now = act[0] = time.perf_counter()
                    i = block.rfind(_CT)
                    if generate:
                        new = _number_after(block, i + 19) - tokens if i >= 0 else 0
                    else:
                        new = block.count(b'"finish_reason"')
                        if new:
                            new -= len(_EMPTY_TEXT.findall(block))
                        if i >= 0:
                            usage_tokens = _number_after(block, i + 19)
                    if new > 0:
                        if tokens == 0:
                            first = now
                            self._ttft.append(now - start)
                            if not streaming:
                                streaming = True
                                self._decoding += 1
                                self._streams_started += 1
                        else:
                            gap = (now - last) / new
                            if new == 1:
                                itl.append(gap)
                            else:
                                itl.extend([gap] * new)
                        tokens += new
                        self._output_tokens += new
                        last = now
                    elif first_block is None:
                        first_block = block
                    if b'"error"' in block:
                        error = _error_event(block)
                        if error is not None:
                            raise _StreamError("server_error", error)
                    if block.endswith(b"[DONE]"):
                        finished = True
                        break
                if not finished and buf.rstrip().endswith(b"[DONE]"):  # no blank line after the last event
                    finished = True
                    last = time.perf_counter()
                if not finished:
                    raise _StreamError("incomplete", f"stream from {self._path} ended without [DONE] after {tokens} tokens")
            if usage_tokens > tokens:  # coalesced chunks: trust the server's count
                self._output_tokens += usage_tokens - tokens
                tokens = usage_tokens
            if tokens == 0:  # answered and finished, yet nothing counted: a format this parser does not read
                self._uncounted += 1
                if self._uncounted_example is None:
                    self._uncounted_example = (first_block or buf)[:200].decode("utf-8", "replace")
            e2e = last - start
            self._e2e.append(e2e)
            if tokens > 1 and first:
                self._tpot.append((e2e - (first - start)) / (tokens - 1))
            self._completed += 1
            self._completed_output_tokens += tokens
            return True
        except asyncio.CancelledError:
            if act[1] and not self._stopping:  # cancelled by _watch, not by stop()
                uncancel = getattr(task, "uncancel", None)  # 3.11+
                if uncancel is not None:
                    uncancel()
                self._error("timeout", f"no answer within {cfg.request_timeout_s:g} s after {tokens} tokens")
                return False
            self._cancelled += 1
            raise
        except _StreamError as e:
            self._error(e.kind, str(e))
        except aiohttp.ClientConnectorError as e:  # before ClientOSError, its base
            self._error("connect", f"cannot connect to {self._base}: {e}")
        except asyncio.TimeoutError as e:  # sock_connect: aiohttp.ConnectionTimeoutError is one
            self._error("timeout", f"no answer within {cfg.request_timeout_s:g} s: {type(e).__name__}")
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as e:
            self._error("stream_cut", f"stream cut after {tokens} tokens: {type(e).__name__}: {e}")
        except aiohttp.ClientError as e:
            self._error("http", f"{type(e).__name__}: {e}")
        finally:
            act[2].cancel()
            self._in_flight -= 1
            if streaming:
                self._decoding -= 1
            self._busy_s += min(time.perf_counter(), self._t_end or float("inf")) - start
        return False

    def _build_report(self) -> LoadReport:
        cfg = self.config
        dur = max(1e-9, (self._t_end or time.perf_counter()) - self._t0)
        cpu = max(0.0, (self._cpu_end if self._cpu_end is not None else time.process_time()) - self._cpu0)
        in_tok = self._completed * cfg.input_len
        out_tok = self._output_tokens
        return LoadReport(
            config=cfg,
            duration_s=round(dur, 3),
            completed=self._completed,
            failed=self._failed,
            cancelled=self._cancelled,
            errors_by_kind=dict(self._errors),
            error_examples=dict(self._error_examples),
            input_tokens=in_tok,
            output_tokens=out_tok,
            completed_output_tokens=self._completed_output_tokens,
            request_throughput=round(self._completed / dur, 3),
            input_tokens_per_s=round(in_tok / dur, 2),
            output_tokens_per_s=round(out_tok / dur, 2),
            total_tokens_per_s=round((in_tok + out_tok) / dur, 2),
            concurrency_achieved=round(self._busy_s / dur, 2),
            ttft_ms=summarize_ms(self._ttft),
            itl_ms=summarize_ms(self._itl),
            tpot_ms=summarize_ms(self._tpot),
            e2e_ms=summarize_ms(self._e2e),
            client_cpu_s=round(cpu, 3),
            client_cpu_share=round(cpu / dur, 3),
            uncounted_requests=self._uncounted,
            stream_problem=self.stream_problem(),
            decode_timeline=list(self._timeline),
        )


__all__ = ["Latency", "LoadConfig", "LoadGenerator", "LoadReport", "LoadStats"]
