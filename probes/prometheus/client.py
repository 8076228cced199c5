"""The Prometheus HTTP API (VictoriaMetrics serves the same), and the base of the fleet probe family.

A fleet probe answers, for every host a Prometheus knows at once, what one host probe answers for one
host: it fills the same `Values` model from PromQL. The aggregation over the window runs in the engine
(`avg_over_time`, `quantile_over_time`, `increase`): one number per GPU or per server comes back, never
raw samples, so the number of queries depends on the runbook and the answer's size on the GPUs.
Hosts are keyed by a `HostKey` (which labels name a host), given by the caller: the probes group, the
fleet runner joins. (vllm-and-fleet.md §5-§7.)
"""

from __future__ import annotations

import asyncio
import base64
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from gpu_runbook import json_bounded
from gpu_runbook.fetch import BlockingFetcher, FetchError, fetch
from gpu_runbook.plugin import Values

from . import vector

VM_DEFAULT_LATENCY_OFFSET_S = 30.0  # VictoriaMetrics' -search.latencyOffset default (vllm-and-fleet.md §5.4)
QUERY_CONCURRENCY = 4  # queries in flight at once: enough to keep the engine busy while answers are read
HOST_KEY_CACHE = 1 << 18  # label sets whose host is remembered (10,000 hosts x 8 GPUs and their servers fit)
PROM_MAX_BODY_BYTES = 64 * 1024 * 1024  # one instant vector per GPU: ~200 B a series, 10,000 hosts x 8 GPUs ~16 MB


class PromError(Exception):
    """The server could not be reached or refused a query; the message says which and why."""


@dataclass
class PromSource:
    """Where the metrics are and how to authenticate. Credentials never appear in results."""

    url: str
    bearer_token: str | None = None
    basic_user: str | None = None
    basic_password: str | None = None
    ca_file: str | None = None
    insecure: bool = False
    timeout_s: float = 30.0  # per request, connect to last byte
    max_bytes: int = PROM_MAX_BODY_BYTES  # per answer, decompressed


@dataclass(slots=True)
class Sample:
    labels: dict[str, str]
    value: float


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """'15m' -> 900.0; PromQL's units (ms, s, m, h, d, w). Raises ValueError naming the text."""
    m = _DURATION.match(str(text).strip())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration (e.g. 30s, 15m, 2h)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def promql_duration(seconds: float) -> str:
    """A range selector PromQL accepts on every engine: whole seconds."""
    return f"{max(1, int(round(seconds)))}s"


class PromClient:
    """Instant queries (POST, so a long matcher fits) with the source's auth; counts what it issued.

    Every request goes through the bounded HTTP layer (`gpu_runbook.fetch`): the body is capped after
    decompression (`PromSource.max_bytes`), each request has a deadline (`timeout_s`, connect to last byte),
    and redirects are followed only to the same scheme, host and port, so the credentials (sent as headers,
    never as client-wide auth) reach no other origin."""

    def __init__(self, source: PromSource, fetcher: BlockingFetcher | None = None) -> None:
        self.source = source
        self.base = source.url.rstrip("/")
        self.queries = 0
        self.bytes_read = 0
        self._label_sets: dict[bytes, dict[str, str] | None] = {}  # label texts read so far (vector.read): every answer repeats them
        self.headers: dict[str, str] = {}
        if source.bearer_token:
            self.headers["Authorization"] = f"Bearer {source.bearer_token}"
        elif source.basic_user:
            pair = f"{source.basic_user}:{source.basic_password or ''}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        verify: Any = False if source.insecure else (source.ca_file or True)
        self.fetcher = fetcher if fetcher is not None else BlockingFetcher(verify=verify)

    def close(self) -> None:
        self.fetcher.close()

    def release_threads(self) -> None:
        """Before a fork: no idle lookup thread left behind (BlockingFetcher.release_threads)."""
        release = getattr(self.fetcher, "release_threads", None)
        if release is not None:
            release()

    def _request(self, path: str, **kwargs: Any) -> Any:
        try:
            return self.fetcher.fetch(self.base + path, headers=self.headers, timeout_s=self.source.timeout_s,
                                      max_bytes=self.source.max_bytes, limit_name="PromSource.max_bytes", **kwargs)  # fmt: skip
        except FetchError as exc:
            raise PromError(exc.message) from None

    def _get(self, path: str) -> Any:
        return self._request(path)

    def flavour(self) -> tuple[str, float]:
        """('prometheus' | 'victoriametrics', the latency offset its queries see). VictoriaMetrics' buildinfo
        is empty and its /flags lists the flags set away from their defaults."""
        resp = self._get("/api/v1/status/buildinfo")
        if resp.status_code in (401, 403):
            raise PromError(f"{self.source.url} refused the request: HTTP {resp.status_code} (credentials: --bearer-token, --basic-auth)")
        try:
            data = json_bounded.loads(resp.content).get("data") or {}
        except ValueError:
            data = {}
        if resp.status_code == 200 and data.get("version"):
            return "prometheus", 0.0
        flags = self._get("/flags")
        if flags.status_code != 200:
            return "prometheus", 0.0
        m = re.search(r'-search\.latencyOffset="?([0-9.]+[a-z]+)"?', flags.text)
        try:
            return "victoriametrics", parse_duration(m.group(1)) if m else VM_DEFAULT_LATENCY_OFFSET_S
        except ValueError:
            return "victoriametrics", VM_DEFAULT_LATENCY_OFFSET_S

    def query(self, expr: str, at: float) -> list[Sample]:
        """An instant vector at `at` (unix seconds). Raises PromError with the server's errorType and error."""
        return self.fetcher.run(self._query(expr, at))

    def query_all(self, queries: dict[Any, str], at: float, on_error: Callable[[Any, PromError], None] | None = None,
                  on_answer: Callable[[Any, list[Sample]], None] | None = None) -> dict[Any, list[Sample]]:
        """Each query once, up to `QUERY_CONCURRENCY` in flight: the engine computes the next answers while this
        process reads the last (reading ~8,000 series is as long as computing them). A refused query answers
        empty and goes to `on_error` (without it, the first refusal raises); the rest still count. `on_answer`
        sees each answer as soon as it and every answer before it (in the order of `queries`) are in, so the
        caller's work on them overlaps the engine's on the rest, in a fixed order."""
        names = list(queries)
        got: dict[int, list[Sample] | PromError] = {}
        done = 0
        failed: PromError | None = None

        def settle() -> None:
            nonlocal done, failed
            while done in got:
                answer = got[done]
                if isinstance(answer, PromError):
                    if on_error is None:
                        failed = failed or answer
                    else:
                        on_error(names[done], answer)
                    got[done] = answer = []
                if on_answer is not None and failed is None:
                    on_answer(names[done], answer)
                done += 1

        async def one(i: int, gate: asyncio.Semaphore) -> None:
            async with gate:
                try:
                    got[i] = await self._query(queries[names[i]], at)
                except PromError as exc:
                    got[i] = exc
            settle()

        async def every() -> None:
            gate = asyncio.Semaphore(QUERY_CONCURRENCY)
            await asyncio.gather(*(one(i, gate) for i in range(len(names))))

        self.fetcher.run(every())
        if failed is not None:
            raise failed
        return {name: got[i] for i, name in enumerate(names)}  # type: ignore[misc]

    async def _query(self, expr: str, at: float) -> list[Sample]:
        self.queries += 1
        try:
            resp = await fetch(self.fetcher.http, self.base + "/api/v1/query", method="POST", headers=self.headers,
                               data={"query": expr, "time": f"{at:.3f}"}, timeout_s=self.source.timeout_s,
                               max_bytes=self.source.max_bytes, limit_name="PromSource.max_bytes")  # fmt: skip
        except FetchError as exc:
            raise PromError(exc.message) from None
        self.bytes_read += len(resp.content)
        fast = vector.read(resp.content, self._label_sets, Sample) if resp.status_code == 200 else None
        if fast is not None:
            return fast
        try:
            body = json_bounded.loads(resp.content)
        except ValueError:
            raise PromError(f"{self.source.url} answered HTTP {resp.status_code} with no JSON (is it a Prometheus API?)") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            what = f"{body.get('errorType', 'error')}: {body.get('error', '')}" if isinstance(body, dict) else "not an API envelope"
            raise PromError(f"{self.source.url} refused a query (HTTP {resp.status_code}, {what}): {expr[:200]}")
        data = body.get("data") or {}
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
            raise PromError(f"{self.source.url}: expected an instant vector, got {got!r}")
        return samples_of(data.get("result"))


def samples_of(result: Any) -> list[Sample]:
    """An instant vector's items as Samples: finite values only; label names and values as strings (a JSON
    object's are already, the common case, kept as parsed rather than copied: ~8,000 series an answer)."""
    out = []
    for item in result if isinstance(result, list) else ():
        try:
            v = float(item["value"][1])
            metric = item.get("metric") or {}
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            continue
        if not math.isfinite(v) or not isinstance(metric, dict):
            continue
        try:
            "".join(metric.values())  # every value a string (the quickest test of ~8,000 small dicts)
        except TypeError:
            metric = {str(k): str(x) for k, x in metric.items()}
        out.append(Sample(metric, v))
    return out


# -- which labels name a host ---------------------------------------------------------------------


def _strip_port(value: str) -> str:
    if value.startswith("["):  # [ipv6]:port
        return value[1:].split("]")[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


@dataclass(frozen=True)
class HostKey:
    """An ordered list of ways to name a host from a series' labels; the first that the series carries wins.

    Each way is a label name, or several joined by '/' (`namespace/pod`). Label names match without regard
    to case (dcgm-exporter renamed `Hostname` to `hostname`); `instance` loses its port, so a host's
    exporter (:9400) and its server (:30000) name the same host."""

    ways: tuple[str, ...]
    # labels seen -> the host they name: a GPU's series carry the same labels in every answer (~20 of them)
    _named: dict[tuple, str | None] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)
    # the same, by the label map itself (vector.read hands every answer the one map of a label text): id -> (it, host)
    _by_map: dict[int, tuple[dict[str, str], str | None]] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    @classmethod
    def parse(cls, text: str) -> "HostKey":
        ways = tuple(w.strip() for w in text.split(",") if w.strip())
        if not ways:
            raise ValueError(f"{text!r}: name at least one label (e.g. host,Hostname,instance)")
        return cls(ways)

    def labels(self) -> list[str]:
        """Every label name involved, as written (for `by (...)` clauses; the case variants added)."""
        out: list[str] = []
        for way in self.ways:
            for name in way.split("/"):
                for variant in (name, name.lower(), name[:1].upper() + name[1:]):
                    if variant not in out:
                        out.append(variant)
        return out

    def of(self, labels: dict[str, str]) -> str | None:
        known = self._by_map.get(id(labels))
        if known is not None and known[0] is labels:  # (the map is kept in the entry: its id is not reused)
            return known[1]
        seen = tuple(labels.items())
        host = self._named.get(seen, False)
        if host is False:
            if len(self._named) >= HOST_KEY_CACHE:
                self._named.clear()
            host = self._named[seen] = self._of(labels)
        if len(self._by_map) >= HOST_KEY_CACHE:
            self._by_map.clear()
        self._by_map[id(labels)] = (labels, host)
        return host

    def _of(self, labels: dict[str, str]) -> str | None:
        lower = {k.lower(): v for k, v in labels.items() if v != ""}
        for way in self.ways:
            parts = []
            for name in way.split("/"):
                v = lower.get(name.lower())
                if v is None:
                    break
                parts.append(_strip_port(v) if name.lower() == "instance" else v)
            else:
                return "/".join(parts)
        return None


DEFAULT_GPU_HOST = "host,Hostname,instance"
DEFAULT_SERVER_HOST = "host,instance"
K8S_HOST = "namespace/pod"


# -- the fleet probe family ------------------------------------------------------------------------


@dataclass
class Window:
    """What every query of one fleet run shares: the window, where it ends, the series selector."""

    seconds: float
    at: float  # unix seconds: the window's end
    matchers: str = ""  # e.g. 'job="dcgm",cluster="a"' (no braces)

    @property
    def range(self) -> str:
        return promql_duration(self.seconds)

    def sel(self, names: tuple[str, ...] | list[str] | str) -> str:
        """A selector for one field under any of its names (old and DCGM 4.6 names)."""
        names = [names] if isinstance(names, str) else list(names)
        name = names[0] if len(names) == 1 else None
        if name is not None:
            return f"{name}{{{self.matchers}}}" if self.matchers else name
        alt = "|".join(re.escape(n) for n in names)
        return "{" + ",".join(x for x in (f'__name__=~"{alt}"', self.matchers) if x) + "}"


@dataclass
class FleetAnswer:
    """What a fleet probe found: per-host values (for the host probe it serves), and per host what is missing."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    missing: dict[str, list[str]] = field(default_factory=dict)  # host -> exporter fields its series lack
    notes: dict[str, list[str]] = field(default_factory=dict)  # host -> how a value was read (units, fallbacks)


class FleetProbe:
    """A member of the fleet probe family: for every host at once, the values of the host probe named by
    `serves` (declared by that probe's `Values`). The queries are module functions of each side
    (`prometheus_gpu.gpu_queries`, `prometheus_sglang.server_queries`): one set per side, shared by its
    members, so their number depends on the runbook, not on the hosts. A GPU-side member fills from the
    answers grouped per host and GPU (`fill(rows, window)`); the server-side one from the server answers."""

    name: ClassVar[str]
    serves: ClassVar[str]
    Values: ClassVar[type[Values]]
    source: ClassVar[str] = "gpu"  # which side of the join its series come from: "gpu" or "server"


def run_queries(client: PromClient, queries: dict[Any, str], at: float,
                on_error: Callable[[Any, PromError], None] | None = None,
                on_answer: Callable[[Any, list[Sample]], None] | None = None) -> dict[Any, list[Sample]]:
    """Each query once (a few in flight at once); a refused one answers empty (and is reported), the rest still
    count. `on_answer`: as `PromClient.query_all`'s."""
    return client.query_all(queries, at, on_error, on_answer)


def now() -> float:
    return time.time()
