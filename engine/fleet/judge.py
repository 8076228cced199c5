"""`runbook fleet`: decide a runbook's hypotheses for every host a Prometheus (or VictoriaMetrics) knows.

No load and no request to any server: the fleet probe family (`gpu_runbook.probes.prometheus.client*`) fills,
for every host at once, the same values the host probes return, and the runner decides each host's tree
from them exactly as it re-judges a recorded run (`Runner(recorded=...)`): the rules are the runbook's
own. What the metrics cannot say is said: a probe with no fleet member (the server's config, the model,
a profile, NVML-only facts) makes the hypotheses that need it "needs a host run" with the command for
that host, and a value missing because the exporter lacks a field names the field.
GPU series and server series are joined per host by `HostKey`s the user can change; a host whose two
sides do not join is listed as such, never guessed.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr

from .. import __version__
from ..evidence import ProbeStatus, utcnow
from ..loader import LoadedRunbook
from ..model import resolve_refs
from ..registry import Registry
from ..depth import NOT_AT_DEPTH
from ..rules import FUNCTIONS, memoized, shown as shown_value
from ..results import EvidenceRecord, ProbeCallRecord, Results, sha256_text
from ..values import EACH, INDEX
from ..judge import Judge, rule_data
from ..runner import Recorded, Runner, call_key
from ..target import Target, probe_role
from .spool import Spool, Spooled
from gpu_runbook.probes.prometheus.client import (
    DEFAULT_GPU_HOST,
    DEFAULT_SERVER_HOST,
    FleetAnswer,
    HostKey,
    PromClient,
    PromError,
    Window,
    now,
    run_queries,
)
from gpu_runbook.probes.prometheus.amd import NOT_ON_AMD
from gpu_runbook.probes.prometheus.gpu import (DcgmFleet, GpuInventoryFleet, GpuReferenceFleet, GpuRows, GpuSampleFleet, gpu_queries,
                                                lacking_first_label, missing_reason, narrowed, value_fields)
from gpu_runbook.probes.prometheus.server import ServerMetricsFleet, server_queries

NEEDS_HOST_RUN = "needs a host run"
SERVER_URL_FLAG = "--server-url"  # the flag `runbook run` takes the server's address with
# host probes no metric answers, and why: their hypotheses need a host run
HOST_ONLY = {
    "server.config": "the server's configuration",
    "model.config": "the model's config.json",
    "server.profile": "a decode profile under load",
    "server.sweep": "a load sweep",
    "gpu.topology": "the GPU topology (peer-to-peer access)",
    "gpu.activity": "the GPUs' activity breakdown",
    "host.info": "the host's OS facts",
    "server.health": "a request to the server",
}
def _role(probe: str) -> str:
    """The fleet answers roles: a server probe's family name (`sglang.metrics`, a runbook written before the roles)
    is its role (target.probe_role); any other probe is itself."""
    return probe_role(probe) or probe


@dataclass
class FleetOptions:
    window_s: float = 900.0
    at: float | None = None  # unix seconds; None: now (less the engine's latency offset)
    matchers: str = ""
    gpu_key: HostKey = field(default_factory=lambda: HostKey.parse(DEFAULT_GPU_HOST))
    server_key: HostKey = field(default_factory=lambda: HostKey.parse(DEFAULT_SERVER_HOST))
    violation_unit: str = "auto"
    latency_offset_s: float | None = None  # None: ask the engine (VictoriaMetrics' -search.latencyOffset)
    params: dict[str, Any] = field(default_factory=dict)
    memo: bool = True  # decide hosts that read the same values once (FleetJudge); off: every host judged afresh
    workers: int | None = None  # processes that judge the hosts; None: one per CPU (up to MAX_WORKERS) for a large fleet


class FleetHost(BaseModel):
    """One host: how its series joined, its verdicts, the numbers the ranking uses, the command to dig in."""

    host: str
    join: str  # joined | gpu only | server only | exporter down | no data
    join_detail: str = ""
    gpu_count: int = 0
    gpu_model: str | None = None
    server_instance: str | None = None
    draw_w: float | None = None
    limit_w: float | None = None
    board_max_w: float | None = None
    reference_w: float | None = None
    draw_to_reference: float | None = None
    util_pct: float | None = None
    kv_usage_max: float | None = None
    queued_p50: float | None = None
    confirmed: list[str] = Field(default_factory=list)
    worst_severity: str | None = None
    needs_host_run: list[str] = Field(default_factory=list)
    missing_fields: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    command: str | None = None
    rank: int = 0
    results: Results | None = None
    # a forked worker's host comes back with its results as the text the fleet's file holds, in the worker's spool,
    # not as objects: rebuilding ~100 objects a host took longer than judging it; `judged()` reads them when asked
    _spooled: Spooled | None = PrivateAttr(default=None)

    def shipped(self, spool: Spool) -> "FleetHost":
        """This host with its results as the fleet file's text in `spool` (what a worker sends back)."""
        if self.results is not None:
            self._spooled, self.results = spool.put(placed_json(self.results)), None
        return self

    @property
    def has_results(self) -> bool:
        """Whether the host was judged (it had metrics to decide on), without reading shipped results back."""
        return self.results is not None or self._spooled is not None

    def judged(self) -> Results | None:
        """The host's results, read back from a worker's spool on first use."""
        if self.results is None and self._spooled is not None:
            self.results, self._spooled = Results.model_validate_json(self._spooled.text()), None
        return self.results

    def results_json(self) -> str | None:
        """The results as the fleet's file holds them (`placed_json`), without building them where a worker sent them."""
        if self._spooled is not None:
            return self._spooled.text()
        return None if self.results is None else placed_json(self.results).decode()


RESULTS_DEPTH = 6  # spaces before the closing brace of a host's results in the fleet's file: hosts[] > a host > results


def placed_json(results: Results) -> bytes:
    """`results.model_dump_json(indent=2)` as it sits in the fleet's file (FleetResults.model_dump_json(indent=2)),
    UTF-8: what a worker's spool holds (bytes throughout: no text object made and encoded again, ~0.1 ms a host)."""
    return type(results).__pydantic_serializer__.to_json(results, indent=2).replace(b"\n", b"\n" + b" " * RESULTS_DEPTH)


class FleetResults(BaseModel):
    runbook: str
    title: str
    engine_version: str = __version__
    prometheus: str
    engine: str  # prometheus | victoriametrics
    window_s: float
    at: float
    latency_offset_s: float
    matchers: str = ""
    gpu_host_labels: list[str]
    server_host_labels: list[str]
    runbook_sha256: str = ""
    queries: int
    query_errors: list[str] = Field(default_factory=list)
    started_at: Any = None
    duration_s: float = 0.0
    query_s: float = 0.0  # of which: asking the engine and reading its answers
    judge_s: float = 0.0  # of which: deciding every host's tree
    hosts: list[FleetHost]


SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


def _evidence_for(probe: str, host_values: dict[str, dict[str, Any]], reasons: dict[str, str]) -> tuple[ProbeStatus, str, dict[str, Any]]:
    probe = _role(probe)
    if probe in host_values:
        return ProbeStatus.ok, "", host_values[probe]
    if probe in HOST_ONLY:
        return ProbeStatus.unavailable, f"{NEEDS_HOST_RUN}: {HOST_ONLY[probe]} is not in the metrics", {}
    return ProbeStatus.unavailable, reasons.get(probe, f"no metrics fill {probe}"), {}


def call_plan(loaded: LoadedRunbook, params: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any], bool]]:
    """Every distinct probe call of the runbook, as the runner keys it: (key, alias, probe, params, under load).
    The same for every host of a fleet run: worked out once."""
    out: dict[str, tuple[str, str, str, dict[str, Any], bool]] = {}
    for hyp, _ in loaded.runbook.walk():
        for alias, call in hyp.probes.items():
            p = resolve_refs(call.with_, params)
            key = call_key(call.probe, p, call.under_load)
            if key not in out:
                out[key] = (key, alias, call.probe, p, call.under_load)
    return list(out.values())


def recorded_for(loaded: LoadedRunbook, params: dict[str, Any], host_values: dict[str, dict[str, Any]],
                 reasons: dict[str, str], plan: list[tuple[str, str, str, dict[str, Any], bool]] | None = None) -> Recorded:
    """Every probe call of the runbook answered from this host's metrics, keyed as the runner asks.
    `plan`: `call_plan(loaded, params)`, when the caller asks for many hosts."""
    out: dict[str, Any] = {}
    for key, alias, probe, p, under_load in plan if plan is not None else call_plan(loaded, params):
        status, reason, values = _evidence_for(probe, host_values, reasons)
        rec = EvidenceRecord(alias=alias, probe=probe, status=status, reason=reason or None,
                             summary="from Prometheus" if status is ProbeStatus.ok else "", values=values,
                             under_load=under_load)  # fmt: skip
        out[key] = (rec, ProbeCallRecord(probe=probe, params=p, under_load=under_load, status=status, reason=reason or None))
    return Recorded(evidence=out, load=None)


def _aliases(loaded: LoadedRunbook) -> dict[str, str]:
    return {alias: _role(call.probe) for hyp, _ in loaded.runbook.walk() for alias, call in hyp.probes.items()}


@dataclass
class _Why:
    """What `explain` needs of one hypothesis, the same for every host: its rules' read aliases that only a host
    run fills, each reference that reads an exporter field (with the fields it reads), and the aliases the metrics
    do fill (when one of those has nothing for a host, that is why it is undecided, whatever a host run would add)."""

    host_only: list[str]
    field_refs: list[tuple[tuple[str, ...], list[str]]]
    fleet_aliases: list[str] = field(default_factory=list)


def explain_plan(loaded: LoadedRunbook) -> tuple[dict[str, str], dict[str, _Why]]:
    """The runbook's part of `explain`, worked out once per fleet run rather than once per host."""
    aliases = _aliases(loaded)
    exported = value_fields()
    plan: dict[str, _Why] = {}
    for hyp, _ in loaded.runbook.walk():
        rules = [r for r in (loaded.rule(hyp.id, f) for f in ("when", "confirm", "refute")) if r is not None]
        read = set().union(*(r.names for r in rules)) if rules else set()
        field_refs = []
        for rule in rules:
            for ref in rule.refs:
                norm = ".".join(p if p not in (EACH, INDEX) else "[]" for p in ref.parts).replace(".[]", "[]")
                fields = list(dict.fromkeys(f for vpath, f in exported if norm == vpath or norm.startswith(vpath + ".")))
                if fields:
                    field_refs.append((ref.parts, fields))
        plan[hyp.id] = _Why(sorted({aliases[a] for a in read if aliases.get(a) in HOST_ONLY}), field_refs,
                            sorted(a for a in read if a in aliases and aliases[a] not in HOST_ONLY))
    return aliases, plan


def explain(loaded: LoadedRunbook, results: Results, host_values: dict[str, dict[str, Any]],
            missing: list[str], command: str | None,
            plan: tuple[dict[str, str], dict[str, _Why]] | None = None) -> tuple[list[str], list[str]]:
    """Say why each undecided hypothesis is undecided: the exporter fields it lacks, or that it needs a host run.
    Returns (hypotheses needing a host run, fields missing for some hypothesis). `plan`: `explain_plan(loaded)`."""
    aliases, why = plan or explain_plan(loaded)
    data = {alias: host_values.get(probe, {}) for alias, probe in aliases.items()}
    needs: list[str] = []
    fields: list[str] = []
    for res in results.hypotheses:
        if res.verdict.value != "inconclusive":
            continue
        w = why[res.id]
        host_only = w.host_only
        absent: list[str] = []
        for parts, candidates in w.field_refs:
            if _ref_missing(data, parts):
                absent.extend(f for f in candidates if f in missing)
        absent = list(dict.fromkeys(absent))
        if absent:
            res.reason = missing_reason(absent) + (f"; also {NEEDS_HOST_RUN}: {', '.join(host_only)}" if host_only else "")
            fields.extend(absent)
        elif host_only and all(data.get(a) for a in w.fleet_aliases):
            res.reason = f"{NEEDS_HOST_RUN} ({', '.join(host_only)} not in the metrics)" + (f": {command}" if command else "")
            needs.append(res.id)
    return needs, list(dict.fromkeys(fields))


def _ref_missing(data: Any, parts: tuple[str, ...]) -> bool:
    """A value a rule reads is absent or null (for a list's elements: in any element)."""
    if not parts:
        return data is None
    head, rest = parts[0], parts[1:]
    if head in (EACH, INDEX):
        if not isinstance(data, list):
            return data is None
        return any(_ref_missing(x, rest) for x in data) if data else False
    if not isinstance(data, dict):
        return True
    return _ref_missing(data.get(head), rest)


def _at(values: Any, parts: tuple[str, ...]) -> Any:
    """The raw value a rule reference reads (a macro's element: the list of every element's value)."""
    if not parts:
        return values
    head, rest = parts[0], parts[1:]
    if head in (EACH, INDEX):
        return [_at(x, rest) for x in values] if isinstance(values, list) else None
    return _at(values.get(head), rest) if isinstance(values, dict) else None


# what Runner._findings_text sets on a confirmed hypothesis (test_fleet's memo test compares every field)
SHARED_DATA = 256  # distinct rule-data dicts kept for the whole fleet run (a few per distinct host)
FINDINGS_FIELDS = ("headline", "headline_values", "cost", "limiting", "not_limiting_note", "steps")


MAX_WORKERS = 8  # processes judging a fleet at most
HOSTS_PER_WORKER = 100  # hosts a forked worker must have to pay for itself

MEMO_TRIAL = 64  # hosts a hypothesis's verdict memo is tried on before it is judged by what it finds
MEMO_PAYS = 8  # it is kept while at least one in this many of them is found there


def memo_pays(memo: dict[Any, Any], what: Any) -> bool:
    """Whether the memo for `what` (a hypothesis's verdicts, the shared rule data, whole hosts) is worth its keys:
    a fleet whose hosts each read their own numbers never finds anything there, and the keys (JSON of the values)
    cost more than they save. Tried on MEMO_TRIAL lookups, then kept while one in MEMO_PAYS finds something.
    Either way each host gets the verdicts judging it afresh gives."""
    stats = memo.get(("memo stats", what))
    return stats is None or stats[0] < MEMO_TRIAL or stats[1] * MEMO_PAYS >= stats[0]


def memo_tried(memo: dict[Any, Any], what: Any, found: bool) -> None:
    stats = memo.setdefault(("memo stats", what), [0, 0])
    stats[0] += 1
    stats[1] += found


class FleetJudge(Judge):
    """The judge, with one memo shared by every host of a fleet run: a verdict is a function of the values its
    rules read (exactly, no rounding) and of the read probes' status, so hosts that read the same (the
    hypotheses that need a host run read nothing the metrics fill) are decided once."""

    def __init__(self, loaded: LoadedRunbook, registry: Registry, params: dict[str, Any], *, memo: dict[Any, Any],
                 server_kind: str | None = None) -> None:
        super().__init__(loaded, registry, params)
        self._memo = memo
        self._server_kind = server_kind  # a finding's steps are per server kind
        self._texts: dict[tuple, tuple[Any, int | None]] = {}  # a record's values' members -> (the values, their content id)
        self._data_cache: dict[tuple, tuple[list[EvidenceRecord], dict[str, Any]]] = {}
        self._data_keys: dict[int, tuple] = {}  # id(rule data) -> its content key (the data kept alive by _data_cache)
        self._converted: dict[int, Any] = {}  # each record's values in CEL types, for every scope that holds it

    # -- what a host's evidence holds, as small keys: equal content, equal key, across hosts --------------------
    def _content_id(self, text: str) -> int:
        ids = self._memo.setdefault(("content ids",), {})
        return ids.setdefault(text, len(ids))

    def _values_id(self, rec: EvidenceRecord) -> int | None:
        """The record's values as a content id (their exact JSON, key order included), once per probe answer of
        this host; None when they are not JSON. The records of one answer are copies (pydantic copies a dict)
        holding the same members, so the members' identities find an answer already seen."""
        values = rec.values
        members = (tuple(values), tuple(map(id, values.values())))
        found = self._texts.get(members)
        if found is None:
            try:
                text: str | None = json.dumps(values, allow_nan=True)
            except (TypeError, ValueError):
                text = None
            found = self._texts[members] = (values, None if text is None else self._content_id(text))  # kept alive: no id reuse
        return found[1]

    def _scope_key(self, aliases: Any, scope: dict[str, EvidenceRecord]) -> tuple | None:
        """What `aliases` of the scope hold (status, reason, values) and the params, as a key; None: not JSON."""
        params = self.__dict__.get("_params_id")
        if params is None:
            last = self._memo.get(("params id",))  # every host's params are alike (a copy each): one JSON for the run
            if last is not None and last[0] == self.params:
                params = self._params_id = last[1]
            else:
                try:
                    params = self._params_id = self._content_id(json.dumps(self.params, allow_nan=True))
                except (TypeError, ValueError):
                    return None
                self._memo[("params id",)] = (copy.deepcopy(self.params), params)
        parts: list[tuple] = [("params", params)]
        for a in aliases:
            rec = scope.get(a)
            if rec is None:
                parts.append((a,))
                continue
            vid = self._values_id(rec)
            if vid is None:
                return None
            parts.append((a, rec.status.value, rec.reason, vid))
        return tuple(parts)

    def data(self, scope: dict[str, EvidenceRecord], rule: Any = None) -> dict[str, Any]:
        """One rule-data dict per distinct scope: the same records in this host, the same content across the
        fleet's hosts (up to SHARED_DATA of them), so its CEL form is converted once (rules.activation) for
        every hypothesis, and every host, that sees it."""
        key = tuple((alias, id(rec)) for alias, rec in scope.items())
        found = self._data_cache.get(key)
        if found is not None:
            return found[1]
        content = self._scope_key(list(scope), scope) if self.load_report is None and memo_pays(self._memo, "shared data") else None
        shared = self._memo.setdefault(("shared data",), {})
        data = shared.get(content) if content is not None else None
        if content is not None:
            memo_tried(self._memo, "shared data", data is not None)
        if data is None:
            data = rule_data(scope, self.params, self.load_report, self._converted)
            if content is not None and len(shared) < SHARED_DATA:
                shared[content] = data
        self._data_cache[key] = (list(scope.values()), data)  # the records kept alive: no id reuse
        if content is not None:
            self._data_keys[id(data)] = content
        return data

    def needs(self, hyp: Any, rules: dict[str, Any], scope: dict[str, EvidenceRecord]) -> tuple[list[str], str]:
        """As the runner's, once per hypothesis and kind of evidence read (which probe, under load, run or not)."""
        read = self._memo.get(("read", hyp.id))
        if read is None:
            read = self._memo[("read", hyp.id)] = sorted(set().union(*(r.names for r in rules.values() if r is not None)))
        key = ("needs", hyp.id, tuple((a, scope[a].probe, scope[a].under_load, (scope[a].reason or "").startswith(NOT_AT_DEPTH))
                                      for a in read if a in scope))  # fmt: skip
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = super().needs(hyp, rules, scope)
        return list(found[0]), found[1]

    def used_values(self, rule: Any, data: dict[str, Any]) -> dict[str, Any]:
        content = self._data_keys.get(id(data))
        if content is None:
            return super().used_values(rule, data)
        key = ("used", rule.source, content)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = super().used_values(rule, data)
        return dict(found)

    def decide(self, hyp: Any, scope: dict[str, EvidenceRecord], confirm: Any, refute: Any) -> Any:
        if not memo_pays(self._memo, hyp.id):
            return super().decide(hyp, scope, confirm, refute)
        found = self._decide_remembered(hyp, scope, confirm, refute)
        memo_tried(self._memo, hyp.id, found[1])
        return found[0]

    def _decide_remembered(self, hyp: Any, scope: dict[str, EvidenceRecord], confirm: Any, refute: Any) -> tuple[Any, bool]:
        rules = [r for r in (confirm, refute) if r is not None]
        read = sorted(set().union(*(r.names for r in rules))) if rules else []
        # first by the whole values of what the rules read (content ids: cheap where hosts' records repeat, and
        # skipped where they do not), then by the very values they read
        by_whole = ("whole", hyp.id)
        whole = self._scope_key(read, scope) if memo_pays(self._memo, by_whole) else None
        if whole is not None:
            whole = ("decided", hyp.id, whole)
            found = self._memo.get(whole)
            memo_tried(self._memo, by_whole, found is not None)
            if found is not None:
                return found, True
        raw = {a: scope[a].values for a in scope} | {"params": self.params}
        # what the rules read (each reference, elements included) and what the reason shows (used_values' own form)
        refs = sorted({ref.parts for r in rules for ref in r.refs})
        shown = sorted({p for r in rules for p in r.paths})
        try:
            key = json.dumps([hyp.id, [(a, scope[a].status.value, scope[a].reason) for a in read if a in scope],
                              [[p, _at(raw, p)] for p in refs], [[p, shown_value(_at(raw, tuple(p.split("."))))] for p in shown]],
                             sort_keys=True, default=str)  # fmt: skip
        except (TypeError, ValueError):
            return super().decide(hyp, scope, confirm, refute), False
        hit = key in self._memo
        if not hit:
            self._memo[key] = super().decide(hyp, scope, confirm, refute)
        if whole is not None:
            self._memo[whole] = self._memo[key]
        return self._memo[key], hit

    def findings(self, hyp: Any, result: Any, data: dict[str, Any]) -> None:
        """A confirmed finding's texts (headline, cost, steps...), once per distinct value of the names any rule
        of the hypothesis reads, and per server kind (steps are per server); every host gets its own copy."""
        kind = self._server_kind
        if not memo_pays(self._memo, ("findings", hyp.id)):
            return super().findings(hyp, result, data)
        content = self._data_keys.get(id(data))
        whole = ("findings", hyp.id, kind, content) if content is not None else None
        found = self._memo.get(whole) if whole is not None else None
        if found is None:
            names = self._memo.get(("names", hyp.id))
            if names is None:
                names = self._memo[("names", hyp.id)] = set().union(*(r.names for (h, _), r in self.loaded.rules.items() if h == hyp.id))
            try:
                key = json.dumps(["findings", hyp.id, kind,
                                  [[k, v] for k, v in data.items() if k in names or k in FUNCTIONS]], allow_nan=True)  # fmt: skip
            except (TypeError, ValueError):
                return super().findings(hyp, result, data)
            memo_tried(self._memo, ("findings", hyp.id), key in self._memo)
            if key not in self._memo:
                super().findings(hyp, result, data)
                self._memo[key] = {f: copy.deepcopy(getattr(result, f)) for f in FINDINGS_FIELDS if f in type(result).model_fields}
                if whole is not None:
                    self._memo[whole] = self._memo[key]
                return
            found = self._memo[key]
            if whole is not None:
                self._memo[whole] = found
        for f, value in found.items():
            setattr(result, f, copy.deepcopy(value))


@contextlib.contextmanager
def _fewer_collections() -> Any:
    """Fewer collector passes while a fleet is judged. A run builds millions of small objects that live to its end
    (every answer, the per-host values), and at the default threshold (a pass every 700 allocations) the collector
    walked them again and again (judging 1,000 hosts in two processes took 5.2 s at the default, 4.4 s at
    GC_YOUNG). What exists when the run starts (the runbook, the modules) is frozen: never walked, and left
    untouched in forked workers' shared pages."""
    old = gc.get_threshold()
    gc.freeze()  # what exists now (the runbook, the modules) is never walked again; forked workers share it untouched
    gc.set_threshold(GC_YOUNG, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


GC_YOUNG = 50_000  # allocations between the collector's passes over young objects while a fleet is judged (default 700)
_FORKED: tuple | None = None  # (the fleet, its judging inputs, the workers' spools), set while forked workers run


def _judge_hosts(fleet: "Fleet", hosts: list[str], inputs: tuple, ship: Spool | None = None) -> list[FleetHost]:
    with memoized() if fleet.options.memo else contextlib.nullcontext():
        return asyncio.run(fleet._judge(hosts, *inputs, ship=ship))


def _judge_share(hosts: list[str], worker: int) -> list[FleetHost]:
    """A forked worker's share of the hosts, their results text in the worker's own spool."""
    assert _FORKED is not None
    fleet, inputs, spools = _FORKED
    return _judge_hosts(fleet, hosts, inputs, ship=spools[worker])


def _own_hypotheses(results: Results) -> Results:
    """A copy of `results` whose hypothesis results are copies too (their fields shared: nothing changes them
    in place), so a reason reworded for one host is not another's."""
    return results.model_copy(update={"hypotheses": [h.model_copy() for h in results.hypotheses]})


class Fleet:
    """One fleet triage: queries (a fixed set per runbook), the join, one verdict tree per host."""

    def __init__(self, loaded: LoadedRunbook, registry: Registry, client: PromClient, options: FleetOptions) -> None:
        self.loaded, self.registry, self.client, self.options = loaded, registry, client, options
        self.errors: list[str] = []
        self._failed = 0

    def _on_error(self, name: tuple[str, str], exc: PromError) -> None:
        side, what = name
        self.errors.append(f"{what}: {exc}")
        self._failed += side != "up"  # the metrics' own queries (not the exporters' `up`)

    def run(self) -> FleetResults:
        with _fewer_collections():
            return self._run()

    def _run(self) -> FleetResults:
        started, t0 = utcnow(), time.monotonic()
        o = self.options
        engine, offset = self.client.flavour()
        if o.latency_offset_s is not None:
            offset = o.latency_offset_s
        at = o.at if o.at is not None else now() - offset
        window = Window(o.window_s, at, o.matchers)
        # every query of the run in one batch (a few in flight at once): GPU side, server side, exporters' `up`
        asked = {"gpu": gpu_queries(window, self._gpu_grouping(window, at)), "server": server_queries(window, o.server_key),
                 "up": self._up_queries(window, o.gpu_key)}  # fmt: skip
        # the GPU answers go into rows as they come in, and the GPU family fills once the last is in, while the
        # engine still computes the server side's
        gpu_rows, last_gpu = GpuRows(o.gpu_key), ("gpu", list(asked["gpu"])[-1])
        answers: list[FleetAnswer] = []
        failed: list[BaseException] = []

        def arrived(name: tuple[str, str], samples: list[Any]) -> None:
            if name[0] != "gpu" or failed:
                return
            try:
                gpu_rows.add(name[1], samples)
                if name == last_gpu:
                    rows = gpu_rows.rows
                    answers.extend([GpuSampleFleet(o.violation_unit).fill(rows, window), GpuInventoryFleet().fill(rows, window),
                                    GpuReferenceFleet().fill(rows, window), DcgmFleet().fill(rows, window)])  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - raised below, once the batch is in, as it would have been after it
                failed.append(exc)

        flat = run_queries(self.client, {(side, name): expr for side, qs in asked.items() for name, expr in qs.items()}, at,
                           self._on_error, arrived)  # fmt: skip
        if failed:
            raise failed[0]
        gpu_answers, server_answers, up_answers = ({name: flat[(side, name)] for name in qs} for side, qs in asked.items())
        if self.errors and self._failed >= len(gpu_answers) + len(server_answers):
            raise PromError(f"every query failed; the first: {self.errors[0]}")
        rows = gpu_rows.rows
        server, instances = ServerMetricsFleet().fill_servers(server_answers, o.server_key, window)
        down = self._exporters_down(up_answers, o.gpu_key)
        families = {"gpu.sample": answers[0], "gpu.inventory": answers[1], "gpu.reference": answers[2], "gpu.dcgm": answers[3],
                    "server.metrics": server}  # fmt: skip
        params = dict(self._params())
        hosts_all = sorted(set(rows) | set(server.values) | set(down))
        query_s = time.monotonic() - t0
        hosts = self._judge_all(hosts_all, (rows, server, instances, down, families, params))
        self._rank(hosts)
        return FleetResults(
            runbook=self.loaded.name, title=self.loaded.runbook.title, prometheus=self.client.source.url, engine=engine,
            window_s=o.window_s, at=at, latency_offset_s=offset if o.at is None else 0.0, matchers=o.matchers,
            gpu_host_labels=list(o.gpu_key.ways), server_host_labels=list(o.server_key.ways),
            runbook_sha256=self._runbook_sha256() if any(h.has_results for h in hosts) else "",
            queries=self.client.queries, query_errors=self.errors, started_at=started,
            duration_s=round(time.monotonic() - t0, 3), query_s=round(query_s, 3),
            judge_s=round(time.monotonic() - t0 - query_s, 3), hosts=hosts,
        )  # fmt: skip

    def _gpu_grouping(self, window: Window, at: float) -> HostKey:
        """The host labels the GPU queries group by: the first of the host key's ways alone where every GPU series
        has it (one query says so: the answers then carry one host label rather than all of the key's), else all
        of them. Either way each series names the same host (HostKey.of: the first way present wins)."""
        key = self.options.gpu_key
        lacking = lacking_first_label(window, key)
        if lacking is None:
            return key
        try:
            return narrowed(key) if self.client.query(lacking, at) == [] else key
        except PromError:  # refused (too many series lacking it, say): group by all of them, as without the question
            return key

    def _runbook_sha256(self) -> str:
        """What every host's results say (Runner: the hash of the runbook's text), without reading them back."""
        text = (self.loaded.document.text if self.loaded.document is not None else None) or ""
        return sha256_text(text) if text else ""

    def _params(self) -> dict[str, Any]:
        from ..runner import resolve_params  # noqa: PLC0415

        return resolve_params(self.loaded, self.options.params)

    @staticmethod
    def _up_queries(window: Window, key: HostKey) -> dict[str, str]:
        by = ", ".join(dict.fromkeys([*key.labels(), "instance", "job"]))
        sel = window.sel("up")
        return {
            "up_last": f"max by ({by}) (last_over_time({sel}[{window.range}]))",
            "gpu_jobs": f"count by (job) (last_over_time({window.sel(['DCGM_FI_DEV_GPU_UTIL', 'DCGM_FI_DEV_POWER_USAGE', 'gpu_gfx_activity', 'gpu_package_power'])}[{window.range}]))",
        }  # fmt: skip

    @staticmethod
    def _exporters_down(ups: dict[str, list[Any]], key: HostKey) -> dict[str, str]:
        """GPU-exporter targets whose last scrape in the window failed: host -> the target's instance.
        A job counts as a GPU exporter's when it carries DCGM or AMD exporter series, or its name says dcgm, gpu or
        device-metrics (the AMD Device Metrics Exporter's)."""
        gpu_jobs = {s.labels.get("job") for s in ups["gpu_jobs"]}
        out: dict[str, str] = {}
        for s in ups["up_last"]:
            job = s.labels.get("job", "")
            if s.value >= 1 or not (job in gpu_jobs or any(w in job.lower() for w in ("dcgm", "gpu", "device-metrics"))):
                continue
            host = key.of(s.labels)
            if host is not None:
                out[host] = s.labels.get("instance", "")
        return out

    def workers(self, hosts: int) -> int:
        """How many processes judge `hosts` hosts: the option, else one per CPU this process may use (at most
        MAX_WORKERS) where each gets HOSTS_PER_WORKER hosts or more to pay for its fork, and one where processes
        are not forked (not Linux)."""
        if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
            return 1
        if self.options.workers is not None:
            return max(1, min(self.options.workers, hosts))
        if hosts < HOSTS_PER_WORKER:
            return 1
        return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS, hosts // HOSTS_PER_WORKER))

    def _judge_all(self, hosts: list[str], inputs: tuple) -> list[FleetHost]:
        """Every host's tree, in this process or split over forked workers. A host is judged alone either way (the
        memo only finds what an alike host decided), so the split changes no verdict: each worker takes every n-th
        host (each sees a share of every kind of host, so each memo pays) and the hosts come back in order."""
        n = self.workers(len(hosts))
        if n <= 1:
            return _judge_hosts(self, hosts, inputs)
        global _FORKED  # noqa: PLW0603 - what the forked workers inherit (never pickled: the fleet's answers are large)
        spools = [Spool() for _ in range(n)]  # each worker writes its hosts' results text to its own
        _FORKED = (self, inputs, spools)
        self.client.release_threads()  # the answers are in: fork with no other thread alive (a lookup's would be)
        try:
            # this process waits: the workers also write their hosts' results as the file's JSON, side by side
            with multiprocessing.get_context("fork").Pool(n) as pool:
                parts = pool.starmap(_judge_share, [(hosts[i::n], i) for i in range(n)])
        finally:
            _FORKED = None
        judged = {h.host: h for part in parts for h in part}
        return [judged[h] for h in hosts]

    async def _judge(self, hosts: list[str], rows: dict[str, Any], server: FleetAnswer, instances: dict[str, str],
                     down: dict[str, str], families: dict[str, FleetAnswer], params: dict[str, Any], ship: Spool | None = None) -> list[FleetHost]:
        """Each host's tree. `ship` (a worker's spool): each host's results become the file's text there as soon as
        they are judged, so the objects of thousands of hosts are not kept (nor walked by the collector) to the end."""
        out = []
        memos: dict[tuple[str | None, str | None], dict[str, Any]] = {}  # one per server kind and GPU vendor: each reads its own text
        plan = explain_plan(self.loaded)
        calls = call_plan(self.loaded, params)
        for host in hosts:
            kind = server.values.get(host, {}).get("server_kind")  # SGLang or vLLM, by the series the host has
            has_gpu, has_server = host in rows, host in server.values
            vendor = next((g.vendor for g in rows[host].values()), None) if has_gpu else None  # NVIDIA or AMD, likewise
            memo = memos.setdefault((kind, vendor), {}) if self.options.memo else {}
            if has_gpu and has_server:
                join, detail = "joined", ""
            elif has_gpu:
                join, detail = "gpu only", "GPU series, but no server series joined to this host (check the host label mapping: --server-host-label)"
            elif host in down:
                join, detail = "exporter down", f"its GPU exporter target {down[host]} is down (up == 0): no GPU series"
            else:
                join, detail = "server only", "server series, but no GPU series joined to this host (check --gpu-host-label, or is its GPU exporter scraped?)"
            if host in down and has_gpu:
                detail = f"its GPU exporter target {down[host]} is down now (up == 0); the window still holds earlier GPU series"
            values = {probe: ans.values[host] for probe, ans in families.items() if host in ans.values}
            reasons = {p: f"no dcgm-exporter series (nor the AMD Device Metrics Exporter's) for this host ({join})" for p in ("gpu.sample", "gpu.inventory", "gpu.reference", "gpu.dcgm")}
            reasons["server.metrics"] = f"no server series for this host ({join})"
            if vendor == "amd":
                reasons["gpu.dcgm"] = NOT_ON_AMD
            instance = instances.get(host)
            command = f"runbook run {self.loaded.name} {SERVER_URL_FLAG} http://{instance}" if instance else None
            fh = FleetHost(host=host, join=join, join_detail=detail, server_instance=instance, command=command)
            notes = [n for ans in families.values() for n in ans.notes.get(host, [])]
            fh.notes = list(dict.fromkeys(notes))
            if values:
                # a host whose every probe answer equals an earlier host's (and joined alike) is decided alike: its
                # results are that host's, each hypothesis its own copy (explain below words reasons per host)
                same = self._evidence_key(memo, join, instance is not None, values) if memo_pays(memo, "hosts") else None
                earlier = memo.get(same) if same is not None else None
                if same is not None:
                    memo_tried(memo, "hosts", earlier is not None)
                if earlier is None:
                    target = Target(server_url=f"http://{instance}" if instance else "http://unknown", label=f"fleet: {host}",
                                    server_kind=kind, gpu_vendor=vendor)  # fmt: skip
                    host_params = dict(params)
                    judge = FleetJudge(self.loaded, self.registry, host_params, memo=memo, server_kind=target.server_kind)
                    runner = Runner(self.loaded, self.registry, target, host_params, judge=judge,
                                    recorded=recorded_for(self.loaded, params, values, reasons, calls))
                    results = await runner.run()
                    if same is not None:
                        memo[same] = _own_hypotheses(results)
                else:
                    results = _own_hypotheses(earlier)
                missing = families["gpu.sample"].missing.get(host, [])
                fh.needs_host_run, fh.missing_fields = explain(self.loaded, results, values, missing, command, plan)
                # the runbook's text once for the fleet (FleetResults.runbook_sha256), not once per host
                results = results.model_copy(update={"target": {"label": f"fleet: {host}", "prometheus": self.client.source.url},
                                                     "runbook_source": ""})  # fmt: skip
                fh.results = results
                self._figures(fh, values, results)
            out.append(fh.shipped(ship) if ship is not None else fh)
        return out

    @staticmethod
    def _evidence_key(memo: dict[Any, Any], join: str, has_instance: bool, values: dict[str, dict[str, Any]]) -> tuple | None:
        """What decides a host's tree, as a key: how it joined and each probe's answer (its exact JSON, as a
        content id); None when an answer is not JSON."""
        ids = memo.setdefault(("host answers",), {})
        parts: list[Any] = ["host", join, has_instance]
        for probe in sorted(values):
            try:
                text = json.dumps(values[probe], allow_nan=True)
            except (TypeError, ValueError):
                return None
            parts.append((probe, ids.setdefault(text, len(ids))))
        return tuple(parts)

    @staticmethod
    def _figures(fh: FleetHost, values: dict[str, dict[str, Any]], results: Results) -> None:
        sample, ref, inv, metrics = (values.get(k, {}) for k in ("gpu.sample", "gpu.reference", "gpu.inventory", "server.metrics"))
        fh.gpu_count = int(sample.get("gpu_count") or 0)
        fh.gpu_model = inv.get("gpu_name")
        fh.draw_w = (sample.get("power_draw_w") or {}).get("mean")
        fh.util_pct = (sample.get("gpu_util_pct") or {}).get("mean")
        fh.limit_w = sample.get("power_limit_enforced_w")
        fh.board_max_w = sample.get("power_limit_max_w") or ref.get("board_max_w")
        fh.reference_w = ref.get("memory_bound_draw_w")
        if fh.draw_w is not None and fh.reference_w:
            fh.draw_to_reference = round(fh.draw_w / fh.reference_w, 4)
        fh.kv_usage_max = (metrics.get("kv_usage") or {}).get("max")
        fh.queued_p50 = (metrics.get("queued") or {}).get("p50")
        confirmed = [h for h in results.hypotheses if h.verdict.value == "confirmed"]
        fh.confirmed = [h.id for h in confirmed]
        sev = [h.severity.value for h in confirmed if h.severity.value in SEVERITY_RANK]
        fh.worst_severity = min(sev, key=lambda s: SEVERITY_RANK[s]) if sev else None

    def _rank(self, hosts: list[FleetHost]) -> None:
        """The symptom first (the root hypotheses confirmed), most underfed first; then other warnings by
        severity; then hosts with nothing to say; then hosts that did not join or have no data."""
        roots = {h.id for h in self.loaded.runbook.hypotheses}

        def key(h: FleetHost) -> tuple:
            if not h.has_results:
                return (4, 0.0, h.host)
            if roots & set(h.confirmed):
                return (0, h.draw_to_reference if h.draw_to_reference is not None else 1.0, h.host)
            if h.worst_severity in ("critical", "warning"):
                return (1, SEVERITY_RANK[h.worst_severity], h.host)
            return (2 if h.join == "joined" else 3, 0.0, h.host)

        hosts.sort(key=key)
        for i, h in enumerate(hosts, 1):
            h.rank = i


__all__ = ["Fleet", "FleetHost", "FleetOptions", "FleetResults", "NEEDS_HOST_RUN", "explain", "recorded_for"]
