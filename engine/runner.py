"""The investigation: walk the hypothesis tree, run probes side by side, decide verdicts, emit events.

Scheduling, in one picture:
- every `under_load` probe call in the tree runs in ONE load window that opens at the start
  (load starts, warms up, all those probes sample together, load stops);
- meanwhile the walk begins at the roots; other probes run when their node is reached, siblings
  concurrently; identical calls (same probe, same parameters) run once and are shared;
- a node's children are explored when it is confirmed (or always, if it says so); otherwise they
  are `skipped` with the reason.
The runner keeps its state as it goes, so `snapshot()` gives the results found so far at any time
(an interrupted run still writes what it found).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
import sys
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable

from . import __version__
from .events import (
    Event,
    LoadFinished,
    LoadProgress,
    LoadStarted,
    LogLine,
    NodeStarted,
    PhaseChanged,
    ProbeFinished,
    ProbeStarted,
    RunFinished,
    RunStarted,
    Subscriber,
    VerdictReached,
)
from .evidence import Evidence, ProbeStatus, scrubbed, utcnow
from .scrub import plain
from .loader import LoadedRunbook
from . import findings, phases
from .model import PARAM_REF, Hypothesis, ProbeCall, Severity, Verdict, coerce_param, resolve_refs, truthy
from .load_config import LoadConfigError, load_config
from . import depth as depths
from .depth import params_for as depth_params
from .probe import Context
from .target import Target
from .registry import Registry
from .results import SEVERITY_ORDER, EvidenceRecord, HypothesisResult, ProbeCallRecord, RerunRecord, Results, Throughput, sha256_text
from .rules import Rule


class ParamError(ValueError):
    pass


from .judge import NOT_RECORDED, Judge
NOT_AT_DEPTH = depths.NOT_AT_DEPTH


def call_key(probe: str, params: dict[str, Any], under_load: bool) -> str:
    """Which recorded evidence answers a call: same probe, same parameters, same load condition."""
    return json.dumps([probe, params, under_load], sort_keys=True, default=str)


_PROBE = contextvars.ContextVar[str | None]("runbook_probe", default=None)  # the probe this task runs, if any


class _ProbeStdout:
    """sys.stdout while a run is on: what a probe prints goes to the run's log, never into the output
    (the progress lines, the TUI's screen, or a results file written to stdout)."""

    def __init__(self, real: Any, log: Any) -> None:
        self.real, self._log = real, log

    def write(self, text: str) -> int:
        probe = _PROBE.get()
        if probe is None:
            return self.real.write(text)
        if text.strip():
            self._log(f"{probe} printed to stdout (kept out of the output): {text.strip()[:200]}", "warning")
        return len(text)

    def flush(self) -> None:
        self.real.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class ProbeExited(Exception):
    """A probe called sys.exit(): that ends the probe, not the run."""


async def _contained(coro: Any) -> Any:
    """Runs a probe's coroutine so that sys.exit() inside it cannot stop the event loop (asyncio re-raises
    SystemExit out of a task into the loop)."""
    try:
        return await coro
    except SystemExit as exc:
        raise ProbeExited(f"the probe called sys.exit({exc.code!r})") from None


CANCEL_GRACE_S = 2.0  # how long a timed-out probe is cancelled again and again before it is left behind


class ProbeIgnoredCancel(Exception):
    """A timed-out probe that kept running through every cancellation (it catches CancelledError)."""


async def _within(coro: Any, timeout: float) -> Any:
    """asyncio.wait_for, except that a probe which swallows its cancellation (a bare `except:` around an
    await in a retry loop) cannot hold the run: it is cancelled again until it stops, up to CANCEL_GRACE_S."""
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        await _stop(task)
        raise
    if task in done:
        return task.result()
    if not await _stop(task):
        raise ProbeIgnoredCancel(f"timed out after {timeout:g} s and kept running through {CANCEL_GRACE_S:g} s of cancellations (it catches CancelledError): left behind")
    raise asyncio.TimeoutError


async def _stop(task: asyncio.Future) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CANCEL_GRACE_S
    while not task.done() and loop.time() < deadline:
        task.cancel()
        await asyncio.wait({task}, timeout=0.05)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: a probe's error after its timeout is not an "exception never retrieved" warning
    return task.done()
class RerunError(ValueError):
    """A re-run that cannot start (unknown node, or the runbook's tree changed on disk); says why."""


def resolve_params(
    loaded: LoadedRunbook, overrides: dict[str, Any], depth: str = "standard", registry: Registry | None = None
) -> dict[str, Any]:
    """Defaults overlaid with the params the depth sets (the runbook's `depths`), then with `--set` values,
    each type-checked against its declaration (and, given the registry, against the ranges of the probes it
    feeds: gpu_runbook.param_ranges)."""
    declared = loaded.runbook.params
    params = {name: p.default for name, p in declared.items()}
    overrides = {**depth_params(loaded.runbook.depths, depth), **overrides}
    for name, value in overrides.items():
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise ParamError(f"unknown param '{name}' for runbook {loaded.name} (params: {known})")
        try:
            params[name] = coerce_param(declared[name].type, value)
        except ValueError as exc:
            raise ParamError(f"param '{name}': {exc}") from None
    spec = loaded.runbook.load
    if spec is not None and overrides:
        resolved = resolve_refs(spec.model_dump(), params)
        if truthy(resolved.get("enabled", True)):
            try:
                load_config(resolved)
            except LoadConfigError as exc:
                # name the param that feeds the refused field, as param_ranges does for a probe's
                raw = getattr(spec, exc.field, None) if exc.field else None
                ref = PARAM_REF.match(raw.strip()) if isinstance(raw, str) else None
                fed = f"param '{ref.group(1)}' = {params[ref.group(1)]!r}: " if ref and ref.group(1) in params else ""
                raise ParamError(f"{fed}{exc} (with the params given)") from None
    if registry is not None:
        from .param_ranges import check  # noqa: PLC0415

        try:
            check(loaded, registry, params, set(overrides))
        except ValueError as exc:
            raise ParamError(str(exc)) from None
    return params


@dataclass
class Recorded:
    """A finished run's evidence, for re-judging: call_key -> (the evidence, the call's record), and its load report."""

    evidence: dict[str, tuple[EvidenceRecord, ProbeCallRecord | None]] = field(default_factory=dict)
    load: dict[str, Any] | None = None


@dataclass
class _Call:
    key: str
    probe: str
    params: dict[str, Any]
    under_load: bool
    timeout_s: float | None
    record: ProbeCallRecord
    task: asyncio.Task | None = None
    whole_needs: tuple[str, ...] = ()  # what its hypothesis declares for all its calls (`deep`: gpu_runbook.depth)
    users: list[str] = field(default_factory=list)


class Runner:
    def __init__(
        self,
        loaded: LoadedRunbook,
        registry: Registry,
        target: Target,
        params: dict[str, Any] | None = None,
        *,
        nvml: Any = None,
        gpu: Any = None,
        subscribers: Iterable[Subscriber] = (),
        http: Any = None,
        record_all: bool = False,
        recorded: Recorded | None = None,
        depth: str = "standard",
        judge: Judge | None = None,
    ) -> None:
        # the server and GPUs found read their own text, rules and steps
        self.loaded = loaded.for_server(target.server_kind, target.gpu_vendor)
        self.runbook = self.loaded.runbook
        self.registry = registry
        self.target = target
        self.params = params if params is not None else resolve_params(loaded, {})
        self.subscribers = list(subscribers)
        from .gpu_backend import GpuBackend  # noqa: PLC0415

        if isinstance(nvml, GpuBackend):  # a caller that hands the whole backend where NVML was asked for
            gpu, nvml = nvml, None
        self._nvml = nvml
        self._gpu = gpu  # the GPU backend (NVML and amdsmi); None: one around `nvml`
        self._http = http
        self.record_all = record_all  # also gather the evidence of branches the walk skips
        self.recorded = recorded  # re-judge: answer every call from a recorded run, run no probe, drive no load
        self.depth = depth
        self.tier = depths.tier(depth)  # what this depth runs: load, profile, sweep (gpu_runbook.depth)
        self._source = (loaded.document.text if loaded.document is not None else None) or ""
        self._calls: dict[str, _Call] = {}
        self._nodes: dict[str, HypothesisResult] = {}
        self._order: list[tuple[Hypothesis, str | None, int]] = [(h, p.id if p else None, 0) for h, p in self.runbook.walk()]
        self._depth: dict[str, int] = {}
        for hyp, parent, _ in self._order:
            self._depth[hyp.id] = 0 if parent is None else self._depth[parent] + 1
        self._scope: dict[str, dict[str, EvidenceRecord]] = {}
        self._window_open = asyncio.Event()
        self._load_done = asyncio.Event()
        self._window_task: asyncio.Task | None = None
        self.judge = judge if judge is not None else Judge(self.loaded, registry, self.params, depth)
        self.judge.loaded, self.judge.params, self.judge.depth = self.loaded, self.params, depth  # a fleet's judge too
        self._load_gen: Any = None
        self._live: asyncio.Task | None = None
        # LiveSample events while load runs (engine/live.py): a renderer that shows them turns this on; off, the
        # host sees no extra NVML reads or /metrics scrapes beyond the probes' own.
        self.live_readings = False
        self._ctx: Context | None = None
        self._generation = 0
        self.started_at = utcnow()
        self.finished_at = None
        self._t0 = time.monotonic()
        self._window_s = 0.0
        self.warmup_s = 0.0
        self.ramp_s = 0.0  # from asking for the load until it streams at full concurrency
        self._throughput: Throughput | None = None
        self.renderer_error: BaseException | None = None
        self._complete = False  # the whole tree was walked once: a stopped re-run leaves a complete result
        self.reruns: list[RerunRecord] = []
        self._reuse: dict[tuple[str, str], EvidenceRecord] = {}  # (node, alias) -> evidence a re-judge reads again
        self._measured: set[str] = set()  # nodes that ran a probe in the current re-run
        self._earlier: dict[str, HypothesisResult] = {}  # while a re-run goes: its branch's results from before
        # the phase the run is in (gpu_runbook.phases): its name, when it began, the numbers it was entered with
        self._stage: tuple[str, float, dict[str, Any]] = ("connecting", time.monotonic(), {})
        self._last_phase = ""
        self.phase_every_s = 1.0  # how often the current phase is said again with fresh numbers
        self._opened_at: float | None = None  # when the load window opened (sampling began); None before
        self._progress: dict[str, dict[str, Any]] = {}  # call key -> what a long probe said of its progress (a sweep's level)

    # -- events ----------------------------------------------------------------------------------
    @property
    def _load_report(self) -> dict[str, Any] | None:
        """The load generator's report (the judge reads it: `load.*` in rules)."""
        return self.judge.load_report

    @_load_report.setter
    def _load_report(self, report: dict[str, Any] | None) -> None:
        self.judge.load_report = report

    def emit(self, event: Event) -> None:
        for subscriber in list(self.subscribers):
            try:
                subscriber(event)
            except Exception as exc:  # a failing renderer stops the run cleanly, results are kept
                self.subscribers.remove(subscriber)
                self.renderer_error = exc
                task = asyncio.current_task()
                if task is not None and not isinstance(event, RunFinished):
                    task.cancel()

    def log(self, message: str, level: str = "info") -> None:
        self.emit(LogLine(plain(message, self.target.secrets()), level))

    # -- phases ----------------------------------------------------------------------------------
    def _enter(self, name: str, **numbers: Any) -> None:
        """A new phase begins: say so at once (the heartbeat repeats it with fresh numbers)."""
        self._stage = (name, time.monotonic(), numbers)
        self._emit_phase()

    def _running_calls(self) -> list[_Call]:
        return [c for c in self._calls.values() if c.record.started_at is not None and c.task is not None and not c.task.done()]

    def phase_now(self) -> tuple[str, dict[str, Any]]:
        """The current phase and its numbers, read from the load generator and the running probes."""
        now = time.monotonic()
        name, since, entered = self._stage
        n: dict[str, Any] = {**entered, "elapsed_s": now - since}
        gen = self._load_gen
        if gen is not None and name in ("connecting", "admitting", "steady", "warm-up", "sampling"):
            st = gen.stats()
            running = max(0, min(st.in_flight, gen.started_requests - st.completed))
            n.update(of=st.concurrency, open=st.in_flight, running=running, queued=max(0, st.in_flight - running), tok_per_s=st.output_tokens_per_s)
        if name == "warm-up":
            n["left_s"] = max(0.0, float(n.get("of_s", 0.0)) - n["elapsed_s"])
        if name == "sampling":
            n["left_s"] = max(0.0, float(n.get("of_s", 0.0)) - n["elapsed_s"])
            if n["left_s"] > 0:
                return name, n
        if name in ("sampling", "probing"):
            calls = self._running_calls()
            for call in calls:  # a long probe names the phase: a profile, a sweep and its level
                needs = getattr(self.registry.lookup(call.probe), "needs", None)
                started = call.record.started_at
                took = (utcnow() - started).total_seconds() if started is not None else 0.0
                if needs == "sweep" and call.key in self._progress:
                    return "sweeping", {**self._progress[call.key], "elapsed_s": took}
                if needs == "profile":
                    return "profiling", {"elapsed_s": took, "limit_s": call.params.get("wait_s")}
            samplers = [c for c in calls if c.params.get("duration_s")]
            if name == "probing" and samplers:  # no load of ours: the probes sample what the server has
                longest = max(samplers, key=lambda c: float(c.params["duration_s"]))
                took = (utcnow() - longest.record.started_at).total_seconds() if longest.record.started_at else 0.0
                of_s = float(longest.params["duration_s"])
                return "sampling", {"of_s": of_s, "left_s": max(0.0, of_s - took), "elapsed_s": took}
            name = "finishing" if name == "sampling" else name
            n["probes"] = sorted({c.probe for c in calls})
        return name, n

    def _emit_phase(self) -> None:
        name, numbers = self.phase_now()
        changed = name != self._last_phase
        self._last_phase = name
        self.emit(PhaseChanged(name, phases.text(name, numbers), numbers, changed))

    async def _heartbeat(self) -> None:
        """The phase with fresh numbers every `phase_every_s` (about once a second), for as long as the run goes."""
        while True:
            await asyncio.sleep(self.phase_every_s)
            self._emit_phase()

    # -- the run ---------------------------------------------------------------------------------
    async def run(self) -> Results:
        """Run the whole investigation. On cancellation the state found so far stays in `snapshot()`."""
        self.started_at = utcnow()
        self._t0 = time.monotonic()
        self.emit(RunStarted(self.runbook.name, self.runbook.title, self.target.public(), [(h.id, p, h.title) for h, p, _ in self._order]))
        try:
            await self._investigate([(root, None) for root in self.runbook.hypotheses])
        finally:
            self.finished_at = utcnow()
        self._complete = True
        results = self.snapshot(interrupted=False)
        self.emit(RunFinished(results))
        return results

    async def rerun(self, hypothesis_id: str, *, measure: bool = True) -> Results:
        """Decide one branch again; its ancestors' evidence is the evidence they were judged on.

        `measure=True` runs the branch's probes afresh. `measure=False` re-judges: the rules run on the
        evidence recorded before (call `reload()` first to judge with the runbook as it is on disk now);
        only nodes that have none (skipped before) run their probes. A re-run that is stopped leaves
        every node it did not decide again with its earlier verdict, so a complete result stays complete.
        """
        entry = next(((h, p) for h, p, _ in self._order if h.id == hypothesis_id), None)
        if entry is None:
            raise RerunError(f"no hypothesis '{hypothesis_id}' in runbook {self.runbook.name}")
        hyp, parent = entry
        branch = [node.id for node, _ in hyp.walk()]
        earlier = self._earlier = {hid: self._nodes[hid] for hid in branch if hid in self._nodes}
        self._reuse = {} if measure else {(hid, ev.alias): ev for hid, res in earlier.items() for ev in res.evidence}
        self._measured = set()
        load_before = self._load_report
        record = RerunRecord(hypothesis=hypothesis_id, mode="remeasure" if measure else "rejudge", started_at=utcnow())
        self.reruns.append(record)
        self._generation += 1  # new call keys: nothing cached is reused
        for hid in branch:
            self._nodes.pop(hid, None)
        try:
            await self._investigate([(hyp, parent)])
        except asyncio.CancelledError:
            record.interrupted = True
            raise
        finally:
            self._settle_rerun(record, branch, earlier)
            if record.interrupted and not record.remeasured:  # nothing was judged on the stopped window's load
                self._load_report = load_before
        self.finished_at = utcnow()
        results = self.snapshot()
        self.emit(RunFinished(results, extra={"rerun": hypothesis_id, "mode": record.mode}))
        return results

    def _settle_rerun(self, record: RerunRecord, branch: list[str], earlier: dict[str, HypothesisResult]) -> None:
        """Say, node by node, how the re-run decided it; a node it did not get to keeps its earlier result."""
        record.finished_at = utcnow()
        self._reuse, self._earlier = {}, {}
        for hid in branch:
            node = self._nodes.get(hid)
            if node is not None and (node.finished_at is not None or node.verdict is Verdict.skipped):
                how = "remeasured" if hid in self._measured else "rejudged"
                node.rerun = how
                (record.remeasured if how == "remeasured" else record.rejudged).append(hid)
            elif hid in earlier:
                self._nodes[hid] = earlier[hid]
                record.kept.append(hid)
                record.interrupted = True
        if record.interrupted:  # calls the stop cut short measured nothing: the earlier calls stand for them
            prefix = f"[{self._generation}, "
            self._calls = {k: c for k, c in self._calls.items() if not (k.startswith(prefix) and c.record.reason == "interrupted")}

    def reload(self) -> None:
        """Read the runbook from disk again (before a re-judge), so edited rules count."""
        self.adopt(self.read_fresh())

    def read_fresh(self) -> LoadedRunbook:
        """The runbook as it is on disk now; touches nothing of the runner, so it may run in a thread. The tree
        must be the one the evidence was recorded for. Raises the loader's error (FILE:LINE:COL) or RerunError."""
        from .loader import load  # noqa: PLC0415

        fresh = load(self.loaded.path, self.registry).for_server(self.target.server_kind, self.target.gpu_vendor)
        shape = [(h.id, p.id if p else None) for h, p in fresh.runbook.walk()]
        if shape != [(h.id, p) for h, p, _ in self._order]:
            raise RerunError(f"{self.loaded.path}: the hypothesis tree changed since the run; start a new run to use it")
        return fresh

    def adopt(self, fresh: LoadedRunbook) -> None:
        """Judge with `fresh` (from read_fresh) from now on."""
        self.loaded, self.runbook = fresh, fresh.runbook
        self.judge.loaded = fresh
        self._order = [(h, p.id if p else None, 0) for h, p in self.runbook.walk()]
        for name, declared in self.runbook.params.items():
            self.params.setdefault(name, declared.default)

    async def _investigate(self, starts: list[tuple[Hypothesis, str | None]]) -> None:
        """Walk the subtrees at `starts`, with one load window for every under_load call in them."""
        if self.recorded is not None:
            self._load_report = self.recorded.load
            self._window_open.set()
            self._load_done.set()
            try:
                await asyncio.gather(*(self._visit(hyp, parent, self._scope.get(hyp.id, {})) for hyp, parent in starts))
            finally:
                await self._cancel_outstanding()
            return
        import httpx  # noqa: PLC0415 - lazy: keeps the CLI's start-up fast

        from .nvml import Nvml  # noqa: PLC0415

        own_http = self._http is None
        stdout = sys.stdout
        sys.stdout = _ProbeStdout(stdout, self.log)
        # No default headers: the API key goes only with requests to the SGLang server (probes add it), never to
        # a dcgm-exporter or whatever else a plugin fetches.
        http = self._http or httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0))
        gpu = self._gpu or (self._ctx.gpu if self._ctx is not None else None)
        nvml = self._nvml or (gpu.nvml if gpu is not None else self._ctx.nvml if self._ctx is not None else Nvml())
        self._ctx = Context(target=self.target, http=http, nvml=nvml, log=self.log, gpu=gpu)
        self._window_open = asyncio.Event()
        # set once the runbook's load has stopped (or there is none): a probe that drives its own load waits for it
        self._load_done = asyncio.Event()
        self._window_task = None
        self._opened_at = None
        nodes = [node for hyp, _ in starts for node, _ in hyp.walk()]
        self._enter("connecting", target=self.target.public().get("label") or self.target.server_url)
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            under_load = [(h, a, c) for h in nodes for a, c in h.probes.items() if c.under_load and (h.id, a) not in self._reuse]
            if under_load:
                self._window_task = asyncio.create_task(self._load_window([self._call_for(h, a, c, use=False) for h, a, c in under_load]))
                # The warm-up is dead time: run the tree's quick checks (inventory, topology, config) meanwhile.
                # Their evidence is attached only to nodes the walk reaches.
                for hyp in nodes:
                    for alias, call in hyp.probes.items():
                        if not call.under_load and (hyp.id, alias) not in self._reuse and getattr(self.registry.lookup(call.probe), "prefetch", False):
                            self._call_for(hyp, alias, call, use=False)
            else:
                self._window_open.set()
                self._load_done.set()
                self._enter("probing")
            await asyncio.gather(*(self._visit(hyp, parent, self._scope.get(hyp.id, {})) for hyp, parent in starts))
            if self._window_task is not None:
                await self._window_task
        finally:
            heartbeat.cancel()
            try:
                await self._cancel_outstanding()
                if own_http:
                    await http.aclose()
            finally:
                sys.stdout = stdout

    async def _cancel_outstanding(self) -> None:
        tasks = [c.task for c in self._calls.values() if c.task is not None and not c.task.done()]
        if self._window_task is not None and not self._window_task.done():
            tasks.append(self._window_task)
        if self._live is not None and not self._live.done():
            tasks.append(self._live)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._load_gen is not None:
            gen, self._load_gen = self._load_gen, None
            try:
                report = await asyncio.shield(gen.stop())
                self._load_report = report.model_dump(mode="json")
            except BaseException:  # noqa: BLE001 - best effort while shutting down
                pass

    # -- probe calls -----------------------------------------------------------------------------
    def _call_for(self, hyp: Hypothesis, alias: str, call: ProbeCall, *, use: bool = True) -> _Call:
        params = resolve_refs(call.with_, self.params)
        cap = self.tier.sample_cap_s
        if cap is not None and call.under_load and isinstance(params.get("duration_s"), (int, float)) and params["duration_s"] > cap:
            params = {**params, "duration_s": cap}  # a look at what the server does now, not a measurement window
        whole = tuple(n for n in hyp.needs if n in depths.WHOLE)
        key = json.dumps([self._generation, call.probe, params, call.under_load, call.timeout_s, *([list(whole)] if whole else [])],
                         sort_keys=True, default=str)
        existing = self._calls.get(key)
        user = f"{hyp.id}:{alias}"
        if existing is None:
            record = ProbeCallRecord(probe=call.probe, params=params, under_load=call.under_load, status=ProbeStatus.ok)
            existing = self._calls[key] = _Call(key, call.probe, params, call.under_load, call.timeout_s, record, whole_needs=whole)
        if use and user not in existing.record.used_by:
            existing.record.used_by.append(user)
        if existing.task is None:
            existing.task = asyncio.create_task(self._execute(existing))
        return existing

    async def _execute(self, call: _Call) -> Evidence:
        if self.recorded is not None:
            return self._replay(call)
        probe_cls = self.registry.for_target(call.probe, self.target.server_kind, self.target.gpu_vendor)
        call.record.probe = probe_cls.name  # the probe that ran (a role's family: `vllm.metrics` for `server.metrics`)
        needs = depths.left_out(getattr(probe_cls, "needs", None), call.whole_needs, self.depth)
        if needs:
            return self._not_at_depth(call, needs)
        if call.under_load:
            await self._window_open.wait()
        elif getattr(probe_cls, "drives_load", False):
            await self._load_done.wait()  # one load at a time: a sweep measured beside the runbook's load measures both
        assert self._ctx is not None
        record = call.record
        record.started_at = utcnow()
        started = time.monotonic()
        self.emit(ProbeStarted(call.key, record.probe, call.under_load, dict(call.params)))
        _PROBE.set(record.probe)
        live = self._start_live(call.params.get("gpus")) if getattr(probe_cls, "drives_load", False) else None
        try:
            probe = probe_cls()
            params = probe_cls.Params.model_validate(call.params)
            timeout = call.timeout_s or probe.timeout_s(params)
            try:
                ctx = dataclasses.replace(self._ctx, load=self._load_gen if call.under_load else None,
                                          progress=lambda info, key=call.key: self._progress.__setitem__(key, dict(info)))
                evidence = await _within(_contained(probe.run(ctx, params)), timeout)
            except ProbeIgnoredCancel as exc:
                evidence = Evidence.failed(str(exc))
            except asyncio.TimeoutError as exc:
                if time.monotonic() - started < timeout * 0.99:  # the probe's own TimeoutError, not ours
                    raise RuntimeError(f"TimeoutError: {exc}") from exc
                evidence = Evidence.failed(f"timed out after {timeout:g} s")
            took = time.monotonic() - started
            if took > timeout and isinstance(evidence, Evidence) and evidence.status is ProbeStatus.ok:
                # Only a probe that held the event loop (time.sleep, blocking I/O) can finish past wait_for's deadline.
                evidence = Evidence.failed(f"ran {took:.1f} s, past its {timeout:g} s timeout, without yielding: it blocks the event loop (a blocking call in async code)")
            if not isinstance(evidence, Evidence):
                evidence = Evidence.failed(f"probe returned {type(evidence).__name__}, not Evidence")
            json.dumps(evidence.values)  # evidence must be JSON-able: fail here, not when writing results
        except asyncio.CancelledError:
            record.status, record.reason = ProbeStatus.failed, "interrupted"
            record.duration_s = time.monotonic() - started
            raise
        except Exception as exc:  # noqa: BLE001 - a failing probe marks its branch, the run goes on
            evidence = Evidence.failed(f"{type(exc).__name__}: {exc}")
            if os.environ.get("RUNBOOK_DEBUG"):  # the reason keeps the text; who debugs the probe needs where
                self.log(f"probe {record.probe} raised:\n{traceback.format_exc().rstrip()}", level="error")
        finally:
            if live is not None:
                live.cancel()
        evidence = scrubbed(evidence, self.target.secrets())  # server and trace strings are data: no escapes, no key
        evidence.started_at = evidence.started_at or record.started_at
        evidence.finished_at = evidence.finished_at or utcnow()
        record.finished_at = evidence.finished_at
        record.duration_s = round(time.monotonic() - started, 3)
        record.status, record.reason = evidence.status, evidence.reason
        self.emit(ProbeFinished(call.key, record.probe, evidence.status.value, evidence.summary, record.duration_s))
        return evidence

    def _not_at_depth(self, call: _Call, needs: str) -> Evidence:
        """A call this depth leaves out (a profile or a sweep at --depth quick): unavailable, saying which depth runs it."""
        deeper = depths.first_running(needs)
        what = f"--depth {deeper}" if needs in depths.WHOLE else f"a {needs}"
        evidence = Evidence.unavailable(f"{NOT_AT_DEPTH} {self.depth} (it needs {what}): --depth {deeper} runs it")
        record = call.record
        record.started_at = record.finished_at = utcnow()
        record.status, record.reason = evidence.status, evidence.reason
        self.emit(ProbeFinished(call.key, call.record.probe, evidence.status.value, evidence.reason, 0.0))
        return evidence

    def _replay(self, call: _Call) -> Evidence:
        """The recorded evidence of this call, as the probe returned it then; `not recorded` when the run has none."""
        assert self.recorded is not None
        record = call.record
        found = (self.recorded.evidence.get(call_key(call.probe, call.params, call.under_load))
                 or self.recorded.evidence.get(call_key(self.registry.role_of(call.probe), call.params, call.under_load)))
        if found is None:
            evidence = Evidence.unavailable(NOT_RECORDED)
            record.started_at = record.finished_at = utcnow()
        else:
            rec, original = found
            record.probe = rec.probe  # the probe that ran then (`sglang.metrics` for the role a runbook names now)
            evidence = Evidence(status=rec.status, reason=rec.reason, summary=rec.summary, values=rec.values, blocks=rec.blocks)
            if original is not None:
                record.started_at, record.finished_at, record.duration_s = original.started_at, original.finished_at, original.duration_s
            record.started_at = record.started_at or utcnow()
        record.status, record.reason = evidence.status, evidence.reason
        return evidence

    async def _load_window(self, calls: list[_Call]) -> None:
        """Start the load, warm up, let every under_load probe sample, stop the load."""
        spec = self.runbook.load
        gen = None
        window_started = time.monotonic()
        ticker: asyncio.Task | None = None
        live: asyncio.Task | None = None
        try:
            if spec is not None and not self.tier.drives_load:
                self.log(f"--depth {self.depth}: no load driven; under-load probes sample the server's own traffic"
                         + (f" for {self.tier.sample_cap_s:g} s" if self.tier.sample_cap_s else ""))
            elif spec is not None:
                resolved = resolve_refs(spec.model_dump(), self.params)
                if truthy(resolved.get("enabled", True)):
                    from .load import LoadGenerator  # noqa: PLC0415

                    self.warmup_s = float(resolved.get("warmup_s") or 0.0)
                    try:
                        config = load_config(resolved)
                        gen = LoadGenerator(self.target, config)
                        await gen.start()
                        self._load_gen = gen
                    except Exception as exc:  # noqa: BLE001
                        gen = None
                        self.emit(LoadFinished(None, error=f"load could not start: {exc}"))
                    if gen is not None:
                        self.emit(LoadStarted(gen.config.model_dump(mode="json"), self.warmup_s))  # the endpoint the server serves
                        ticker = asyncio.create_task(self._tick(gen, calls))
                        shown = sorted({i for c in calls for i in (c.params.get("gpus") or [])})
                        live = self._start_live(shown or None)
                        await self._until_load_arrives(gen, steady_s=float(resolved.get("steady_s") or 0.0))
                        if self.warmup_s > 0:
                            self._enter("warm-up", of_s=self.warmup_s)
                        await asyncio.sleep(self.warmup_s)
                else:
                    self.log("load generation disabled: under_load probes sample whatever traffic the server has")
            if gen is None:
                self._load_done.set()  # no load of ours runs: a probe that drives its own need not wait for the window
            self._opened_at = time.monotonic()
            self._enter("sampling" if gen is not None else "probing", of_s=_longest(calls))
            self._window_open.set()
            opened = (time.monotonic(), gen.stats().output_tokens) if gen is not None else None
            await asyncio.gather(*(c.task for c in calls if c.task is not None), return_exceptions=True)
            if opened is not None and gen is not None:
                self._steady_throughput(opened, (time.monotonic(), gen.stats().output_tokens))
        finally:
            self._window_open.set()
            if self._stage[0] != "probing":
                self._enter("probing")
            if ticker is not None:
                ticker.cancel()
            if live is not None:
                live.cancel()
            if gen is not None and self._load_gen is gen:
                self._load_gen = None
                report = await gen.stop()
                self._load_report = report.model_dump(mode="json")
                if self._throughput is not None:  # the progress line quotes the same figure as the report
                    self._load_report["steady_output_tokens_per_s"] = self._throughput.output_tokens_per_s
                    self._load_report["steady_window_s"] = self._throughput.window_s
                self.emit(LoadFinished(self._load_report))
            self._load_done.set()
            self._window_s = time.monotonic() - window_started

    def _steady_throughput(self, opened: tuple[float, int], closed: tuple[float, int]) -> None:
        """The one output throughput every renderer quotes: tokens the client counted while the
        under-load probes sampled (after the ramp and the warm-up), not the whole load's mean."""
        window = closed[0] - opened[0]
        if window <= 0:
            return
        self._throughput = Throughput(
            output_tokens_per_s=round((closed[1] - opened[1]) / window, 1),
            window_s=round(window, 3),
            definition=f"output tokens/s counted by the client over the {window:.0f} s sampling window, after the ramp and {self.warmup_s:g} s warm-up",
        )

    async def _until_load_arrives(self, gen: Any, limit_s: float = 30.0, steady_s: float = 0.0) -> None:
        """The warm-up counts from when the load runs, not from when it was asked for."""
        started = time.monotonic()
        self._enter("connecting", limit_s=limit_s)
        try:
            if await gen.until_streaming(limit_s):
                # then until the server has admitted what it will (the batch stops growing), however long prefill takes
                self._enter("admitting", limit_s=max(60.0, 6 * limit_s))
                if not await gen.until_admitted(limit_s=max(60.0, 6 * limit_s)):
                    self.log(f"load: the batch was still growing after {time.monotonic() - started:.0f} s; sampling anyway", "warning")
                elif steady_s > 0:  # and, where the runbook asks, until its first requests finished and were replaced
                    self._enter("steady", limit_s=steady_s)
                    if await gen.until_turnover(limit_s=steady_s):
                        self.log(f"load: steady after {time.monotonic() - started:.0f} s (the first requests finished and were replaced)")
                    else:
                        self.log(f"load: no request finished within {steady_s:.0f} s; sampling a load that is not yet steady", "warning")
                return
        finally:
            self.ramp_s = time.monotonic() - started
        stats = gen.stats()
        problem = gen.stream_problem()
        if problem is not None:  # answered, finished, and not a token read: say so now, not after the limit
            self.log(f"load: {problem}; sampling anyway", "warning")
        elif stats.output_tokens == 0:
            cause = gen.first_error()
            self.log(
                f"load: no tokens streamed after {self.ramp_s:.1f} s ({stats.errors} errors{'; ' + cause if cause else ''}); sampling anyway",
                "warning",
            )

    def _start_live(self, gpus: Any) -> asyncio.Task | None:
        """Live readings for the screen while load runs (one monitor at a time); the caller cancels it."""
        if not self.live_readings or (self._live is not None and not self._live.done()):
            return None
        from .live import LiveMonitor  # noqa: PLC0415

        assert self._ctx is not None
        only = [int(i) for i in gpus] if isinstance(gpus, list) and gpus else None
        url = self.target.server_url.rstrip("/") + "/metrics"
        amd = self._ctx.gpu.amdsmi if self.target.gpu_vendor == "amd" and self._ctx.gpu is not None else None
        monitor = LiveMonitor(self._ctx.nvml, self._ctx.http, url, self.target.auth_headers(), self.emit, only, amdsmi=amd)
        self._live = asyncio.create_task(monitor.run())
        return self._live

    async def _tick(self, gen: Any, calls: list[_Call]) -> None:
        longest = _longest(calls)
        while True:
            stats = gen.stats()
            # the window counts down only once it has opened: admission and the steady state take what they take
            left = None if self._opened_at is None else max(0.0, self._opened_at + longest - time.monotonic())
            self.emit(LoadProgress(stats.model_dump(mode="json"), left))
            await asyncio.sleep(0.5)

    # -- the walk --------------------------------------------------------------------------------
    async def _gather_evidence(self, hyp: Hypothesis, aliases: Iterable[str]) -> dict[str, EvidenceRecord]:
        aliases = list(aliases)
        out: dict[str, EvidenceRecord] = {a: self._reuse[(hyp.id, a)] for a in aliases if (hyp.id, a) in self._reuse}
        calls = {alias: self._call_for(hyp, alias, hyp.probes[alias]) for alias in aliases if alias not in out}
        if calls:
            self._measured.add(hyp.id)
        for alias, call in calls.items():
            evidence: Evidence = await asyncio.shield(call.task)  # shared tasks: one waiter's cancel must not kill another's
            out[alias] = EvidenceRecord(
                alias=alias,
                probe=call.record.probe,
                status=evidence.status,
                reason=evidence.reason,
                summary=evidence.summary,
                values=evidence.values,
                blocks=evidence.blocks,
                under_load=call.under_load,
            )
        return out


    async def _visit(self, hyp: Hypothesis, parent: str | None, inherited: dict[str, EvidenceRecord],
                     refuted_above: str | None = None) -> None:
        """Judge one node and walk its children. `refuted_above` names the refuted hypothesis above a fact (`fact: true`)
        judged anyway: confirmed, it is true but does not limit at this load."""
        self._scope[hyp.id] = inherited
        result = HypothesisResult(
            id=hyp.id,
            parent=parent,
            depth=self._depth[hyp.id],
            title=hyp.title,
            verdict=Verdict.inconclusive,
            reason="interrupted",
            severity=hyp.base_severity,
            why=hyp.why,
            next_steps=hyp.next_steps_text, follows=hyp.follows,
            references=hyp.references,
            started_at=utcnow(),
        )
        self._nodes[hyp.id] = result
        self.emit(NodeStarted(hyp.id))
        own: dict[str, EvidenceRecord] = {}
        rules = {f: self.loaded.rule(hyp.id, f) for f in ("when", "confirm", "refute")}
        if any(r is not None and "load" in r.names for r in rules.values()) and self._window_task is not None:
            await asyncio.shield(self._window_task)

        verdict: tuple[Verdict, str, Rule | None] | None = None
        when = rules["when"]
        if when is not None:
            own.update(await self._gather_evidence(hyp, [a for a in hyp.probes if a in when.names]))
            scope = {**inherited, **own}
            verdict = self.judge.precondition(hyp, when, scope)
            if verdict is not None and verdict[0] is Verdict.inconclusive and rules["refute"] is not None:
                own.update(await self._gather_evidence(hyp, [a for a in hyp.probes if a not in own]))
                verdict = self.judge.refuted_whatever(when, rules["refute"], {**inherited, **own}) or verdict
        if verdict is None:
            own.update(await self._gather_evidence(hyp, [a for a in hyp.probes if a not in own]))
            scope = {**inherited, **own}
            verdict = self.judge.decide(hyp, scope, rules["confirm"], rules["refute"])
        elif self.record_all:  # skipped by its precondition: its other probes still run, for later rules
            own.update(await self._gather_evidence(hyp, [a for a in hyp.probes if a not in own]))

        kind, reason, deciding = verdict
        result.needs, result.depth_note = self.judge.needs(hyp, rules, {**inherited, **own})
        if kind is Verdict.inconclusive and depths.left_out(None, hyp.needs, self.depth):
            kind, reason = Verdict.skipped, result.depth_note  # a deep-only question this depth does not ask
        if result.depth_note and kind is not Verdict.skipped:
            reason = f"{reason} [{result.depth_note}]"
        result.verdict, result.reason = kind, reason
        result.evidence = list(own.values())
        if deciding is not None:
            result.rule = deciding.source
            result.rule_values = self.judge.used_values(deciding, self.judge.data({**inherited, **own}))
        if kind is Verdict.confirmed:
            self.judge.findings(hyp, result, self.judge.data({**inherited, **own}))
            if refuted_above is not None:
                result.limiting = False
                result.not_limiting_note = (f"a fact of the configuration, but `{refuted_above}` is refuted at this load: it "
                                            f"would start to matter where `{refuted_above}` holds")
        result.finished_at = utcnow()
        self.emit(VerdictReached(hyp.id, kind, reason))

        if not hyp.children:
            return
        if kind is Verdict.confirmed or (hyp.explore == "always" and kind is not Verdict.skipped):
            scope = {**inherited, **own}
            await asyncio.gather(*(self._visit(child, hyp.id, scope, refuted_above) for child in hyp.children))
            if hyp.severity == "from-causes" and kind is Verdict.confirmed:
                result.severity = self._worst_cause(hyp)
        else:
            # a fact of the configuration is judged under a refuted parent too: true, but not limiting at this load
            facts = [c for c in hyp.children if c.fact and kind is Verdict.refuted]
            for child in hyp.children:
                if child not in facts:
                    self._skip_subtree(child, hyp.id, f"not explored: {hyp.id} is {kind.value}")
            if facts:
                scope = {**inherited, **own}
                await asyncio.gather(*(self._visit(child, hyp.id, scope, refuted_above or hyp.id) for child in facts))
            if self.record_all:
                await asyncio.gather(*(self._record_skipped(child) for child in hyp.children if child not in facts))


    async def _record_skipped(self, hyp: Hypothesis) -> None:
        """--record-all: run the probes of a skipped subtree anyway and keep their evidence on the skipped
        nodes (verdicts stay `skipped`), so a later rule can be judged against this run."""
        nodes = [node for node, _ in hyp.walk(None)]
        gathered = await asyncio.gather(*(self._gather_evidence(node, list(node.probes)) for node in nodes))
        for node, own in zip(nodes, gathered):
            result = self._nodes.get(node.id)
            if result is not None:  # re-judging: what the recorded run did not gather stays absent, as it was
                result.evidence = [rec for rec in own.values() if not (self.recorded is not None and rec.reason == NOT_RECORDED)]


    def _worst_cause(self, hyp: Hypothesis) -> Severity:
        """A symptom is as severe as the worst cause confirmed below it; alone it is only information."""
        found = [self._nodes[n.id].severity for n, _ in hyp.walk() if n is not hyp and n.id in self._nodes
                 and self._nodes[n.id].verdict is Verdict.confirmed]  # fmt: skip
        return min(found, key=lambda s: SEVERITY_ORDER[s], default=Severity.info)

    def _skip_subtree(self, hyp: Hypothesis, parent: str | None, reason: str) -> None:
        for node, node_parent in hyp.walk(None):
            self._nodes[node.id] = HypothesisResult(
                id=node.id,
                parent=parent if node_parent is None else node_parent.id,
                depth=self._depth[node.id],
                title=node.title,
                verdict=Verdict.skipped,
                reason=reason,
                severity=node.base_severity,
                why=node.why,
                next_steps=node.next_steps_text, follows=node.follows,
                references=node.references,
            )
            self.emit(VerdictReached(node.id, Verdict.skipped, reason))


    # -- results ---------------------------------------------------------------------------------
    def _built_on(self, hyp: Hypothesis, node: HypothesisResult) -> HypothesisResult:
        """A confirmed finding's steps that build on other hypotheses (`after:`) are offered only where one of those
        is confirmed: "larger batches first (see kv-cache-wall)" is no advice where the KV cache is not the wall."""
        if node.verdict is not Verdict.confirmed or not node.steps or not any(st.after for st in hyp.steps):
            return node
        steps = list(node.steps)
        for i, step in enumerate(hyp.steps[: len(steps)]):
            if not step.after or steps[i].applies is False:
                continue
            verdicts = {h: self._nodes[h].verdict.value if h in self._nodes else "not decided" for h in step.after}
            if "confirmed" not in verdicts.values():
                told = ", ".join(f"`{h}` {v}" for h, v in verdicts.items())
                steps[i] = steps[i].model_copy(update={"applies": False, "reason": f"builds on what is not confirmed: {told}"})
        return node.model_copy(update={"steps": steps})

    def snapshot(self, interrupted: bool = False) -> Results:
        """The results so far. `interrupted` while a re-run goes: nodes it has not decided keep their earlier
        results and the whole stays complete (the re-run's record says it was stopped)."""
        interrupted = interrupted and not self._complete
        hypotheses = []
        for hyp, parent, _ in self._order:
            node = self._nodes.get(hyp.id)
            if hyp.id in self._earlier and (node is None or (node.finished_at is None and node.verdict is not Verdict.skipped)):
                hypotheses.append(self._earlier[hyp.id])  # a re-run has not decided it yet: the earlier result stands
                continue
            if node is None or (interrupted and node.finished_at is None and node.verdict is not Verdict.skipped):
                reason = "interrupted" if interrupted else "not reached"
                node = node or HypothesisResult(
                    id=hyp.id, parent=parent, depth=self._depth[hyp.id], title=hyp.title, verdict=Verdict.inconclusive,
                    reason=reason, severity=hyp.base_severity, why=hyp.why, next_steps=hyp.next_steps_text, follows=hyp.follows, references=hyp.references,
                )
                node = node.model_copy(update={"verdict": Verdict.inconclusive, "reason": reason})
            hypotheses.append(self._built_on(hyp, node))
        probes = sorted((c.record for c in self._calls.values() if c.record.started_at), key=lambda r: r.started_at)
        finished = self.finished_at or utcnow()
        wall = time.monotonic() - self._t0
        timings = {
            "wall_s": round(wall, 3),
            "load_window_s": round(self._window_s, 3),
            "load_ramp_s": round(self.ramp_s, 3),
            "warmup_s": self.warmup_s,
            "longest_probe_s": round(max((p.duration_s for p in probes), default=0.0), 3),
            "probe_time_total_s": round(sum(p.duration_s for p in probes), 3),
        }
        results = Results(
            runbook=self.runbook.name,
            title=self.runbook.title,
            runbook_path=self.loaded.path,
            started_at=self.started_at,
            finished_at=finished,
            duration_s=round(wall, 3),
            interrupted=interrupted,
            target=self.target.public(),
            params=self.params,
            hypotheses=hypotheses,
            probes=probes,
            load=self._load_report,
            timings=timings,
            engine_version=__version__,
            runbook_sha256=sha256_text(self._source) if self._source else "",
            runbook_source=self._source,
            record_all=self.record_all,
            throughput=self._throughput,
            reruns=[r.model_copy(deep=True) for r in self.reruns],
            depth=self.depth,
        )
        return findings.fill_gains(results)


def _longest(calls: list[_Call]) -> float:
    """The sampling window: the longest `duration_s` of the calls that sample in it."""
    return max((float(c.params.get("duration_s", 0) or 0) for c in calls), default=0.0)


