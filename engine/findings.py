"""What a person acts on, from the results: root causes with their consequences, the steps that
apply ranked by their estimated gain, and the load's throughput and latency in one line.

Plain functions over `Results`, shared by the progress summary, the TUI and the report, so each
says the same thing. Works on results written before `follows`, headlines and step conditions
existed (they are then derived from the tree and the next_steps text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .evidence import ProbeStatus
from .model import Verdict, split_steps
from .numbers import quantity
from .results import SEVERITY_ORDER, GainEstimate, HypothesisResult, Results, StepResult

THROUGHPUT_LABEL = "steady state"


@dataclass
class Finding:
    """A confirmed hypothesis in the summary: its explanations (confirmed children) and the
    consequences that follow from it (`follows`)."""

    result: HypothesisResult
    because: list["Finding"] = field(default_factory=list)
    consequences: list["Finding"] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.result.id


def headline(h: HypothesisResult) -> str:
    """The finding's first line: its headline with numbers; without one (older results, a runbook
    that gives none) its title alone: a rule's field names and unitless values are no headline (the
    values it read are in the finding's details)."""
    return h.headline or h.title


def symptoms(results: Results) -> list[HypothesisResult]:
    """Confirmed roots with a confirmed cause below them: the question the runbook answers."""
    with_cause = results.with_confirmed_descendant()
    return [h for h in results.hypotheses if h.parent is None and h.verdict is Verdict.confirmed and h.id in with_cause]


def symptom_line(results: Results) -> str:
    """The TL;DR's symptom: the confirmed question with its numbers, or what became of it."""
    roots = [h for h in results.hypotheses if h.parent is None]
    shown = symptoms(results) or [h for h in roots if h.verdict is Verdict.confirmed]
    if shown:
        return "; ".join(f"{headline(h)} (`{h.id}`)" for h in shown)
    return "not confirmed: " + ", ".join(f"`{h.id}` is {h.verdict.value}" for h in roots)


def findings(results: Results) -> list[Finding]:
    """Root causes first (most severe, then tree order), each with its explanations and consequences.

    A finding nested under another confirmed finding explains it ("because"); one whose `follows`
    names a confirmed finding is listed under that one as a consequence; the rest are root causes.
    """
    confirmed = [h for h in results.hypotheses if h.verdict is Verdict.confirmed]
    ids = {h.id for h in confirmed}
    symptom_ids = {h.id for h in symptoms(results)}
    parents = {h.id: h.parent for h in results.hypotheses}
    nodes = {h.id: Finding(h) for h in confirmed if h.id not in symptom_ids}

    def confirmed_ancestor(hid: str) -> str | None:
        parent = parents.get(hid)
        while parent is not None and parent not in nodes:
            parent = parents.get(parent)
        return parent

    roots: list[Finding] = []
    for h in confirmed:
        if h.id in symptom_ids:
            continue
        node = nodes[h.id]
        cause = next((f for f in h.follows if f in ids and f in nodes and f != h.id), None)
        if cause is not None and _not_circular(h.id, cause, nodes):
            nodes[cause].consequences.append(node)
        elif (up := confirmed_ancestor(h.id)) is not None:
            nodes[up].because.append(node)
        else:
            roots.append(node)
    order = {h.id: i for i, h in enumerate(results.hypotheses)}
    roots.sort(key=lambda f: (SEVERITY_ORDER[f.result.severity], order[f.id]))
    return roots


def _not_circular(hid: str, cause: str, nodes: dict[str, Finding]) -> bool:
    """The loader refuses cycles; results edited by hand must not hide a finding inside its own consequences."""
    seen, todo = set(), [nodes[hid]]
    while todo:
        f = todo.pop()
        if f.id == cause:
            return False
        if f.id not in seen:
            seen.add(f.id)
            todo.extend(f.consequences + f.because)
    return True


def walk(items: list[Finding]):
    for f in items:
        yield f
        yield from walk(f.because)
        yield from walk(f.consequences)


# -- next steps ---------------------------------------------------------------------------------


def steps_of(h: HypothesisResult) -> list[StepResult]:
    """The hypothesis' steps as recorded, or (older results) one per bullet of its next_steps text."""
    if h.steps:
        return h.steps
    return [StepResult(text=t) for t in split_steps(h.next_steps)]


@dataclass
class RankedStep:
    finding: HypothesisResult
    step: StepResult


def ranked_steps(results: Results) -> list[RankedStep]:
    """The steps that apply, of every confirmed cause and consequence: those with an estimated gain
    first (largest first), then by the finding's place in the summary. A step whose `when` was false
    is not offered."""
    out: list[tuple[tuple, RankedStep]] = []
    for rank, f in enumerate(walk(findings(results))):
        for i, step in enumerate(steps_of(f.result)):
            if step.applies is False:
                continue
            gain = step.gain.throughput_x if step.gain and step.gain.throughput_x is not None else None
            potential = (step.gain.potential_x or gain or 0.0) if step.gain else 0.0
            key = (0 if gain is not None else 1, -(gain or 0.0), -potential, rank, i)
            out.append((key, RankedStep(f.result, step)))
    return [r for _, r in sorted(out, key=lambda kv: kv[0])]


def do_first(results: Results) -> RankedStep | None:
    steps = ranked_steps(results)
    return steps[0] if steps else None


# -- the arithmetic of a gain -------------------------------------------------------------------


def context(results: Results) -> dict[str, float | None]:
    """The measured numbers a gain estimate starts from: batch, queue, cap, load, throughput, step time."""
    out: dict[str, float | None] = {"running": None, "queued": None, "running_cap": None, "kv_tokens": None}
    for h in results.hypotheses:
        for ev in h.evidence:
            # evidence named by concept (running, queued, running_cap): any server kind's probe can fill it
            if ev.status is ProbeStatus.ok and out["running"] is None and ("running" in ev.values or ev.probe == "sglang.metrics"):
                v = ev.values
                out["running"] = _stat(v.get("running")) or _stat(v.get("num_running_reqs"), "mean")
                out["queued"] = _stat(v.get("queued"))
                if out["queued"] is None:
                    out["queued"] = _stat(v.get("num_queue_reqs"), "mean")
                out["running_cap"] = _num(v.get("running_cap")) or _num(v.get("max_running_requests"))
                out["kv_tokens"] = _num(v.get("max_total_num_tokens"))
    load = results.load or {}
    out["concurrency"] = _num((load.get("config") or {}).get("concurrency"))
    out["throughput"] = results.throughput.output_tokens_per_s if results.throughput else _num(load.get("output_tokens_per_s"))
    out["itl_ms"] = _num((load.get("itl_ms") or {}).get("p50"))
    sweep = next((ev for h in results.hypotheses for ev in h.evidence if ev.probe == "sglang.sweep" and ev.status is ProbeStatus.ok), None)
    levels = [lv for lv in (sweep.values.get("levels") or []) if isinstance(lv, dict)] if sweep is not None else []
    if levels and out["running"] is None:  # a sweep: start from its top level, and fit the step time along its curve
        top = levels[-1]
        out.update(running=_num(top.get("running_max")), queued=_num(top.get("queue_mean")), concurrency=_num(top.get("concurrency")),
                   throughput=_num(top.get("output_tokens_per_s")), itl_ms=_num(top.get("itl_p50_ms")),
                   running_cap=_num(sweep.values.get("max_running_requests")))  # fmt: skip
        out["curve"] = [(float(lv["running_mean"]), float(lv["itl_p50_ms"])) for lv in levels
                        if _num(lv.get("running_mean")) and _num(lv.get("itl_p50_ms"))]  # type: ignore[assignment]  # fmt: skip
    return out


def step_time_model(curve: list[tuple[float, float]]) -> tuple[float, float] | None:
    """ITL ~ a + c x batch, least squares over the measured (running, ITL) points: a decode step reads
    the weights once (a) and each running request's KV (c). None with fewer than two distinct batches."""
    points = sorted(set(curve))
    if len({b for b, _ in points}) < 2:
        return None
    n = len(points)
    mb, mt = sum(b for b, _ in points) / n, sum(t for _, t in points) / n
    c = sum((b - mb) * (t - mt) for b, t in points) / sum((b - mb) ** 2 for b, _ in points)
    a = mt - c * mb
    return (a, c) if c > 0 and a > 0 else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _stat(value: Any, key: str = "p50") -> float | None:
    if isinstance(value, dict):
        return _num(value.get(key))
    return _num(value)


def estimate(kind: str, factor: float | None, assumes: str, ctx: dict[str, float | None]) -> GainEstimate:
    """The arithmetic from the measured numbers to an estimated throughput factor, in words."""
    est = GainEstimate(kind=kind, factor=factor, assumes=assumes)
    if factor is None:
        est.arithmetic = "could not be estimated: a value it needs was not measured"
        return est
    running, tput, itl = ctx.get("running"), ctx.get("throughput"), ctx.get("itl_ms")
    if kind == "kv_capacity":
        if not running:
            est.arithmetic = f"KV capacity x{quantity(factor)}; the running batch was not measured, so its effect is unknown"
            return est
        room = running * factor
        limits = [("the KV cache", room)]
        queued = ctx.get("queued")
        if queued is not None:
            limits.append((f"the requests this load offers ({quantity(running)} running + {quantity(queued)} queued)", running + queued))
        if ctx.get("running_cap"):
            limits.append((f"the running cap ({quantity(ctx['running_cap'])})", float(ctx["running_cap"])))  # type: ignore[arg-type]
        why, batch = min(limits, key=lambda kv: kv[1])
        server_limits = [kv for kv in limits if not kv[0].startswith("the requests")]
        why_more, most = min(server_limits, key=lambda kv: kv[1])
        model = step_time_model(ctx.get("curve") or [])  # type: ignore[arg-type]

        def gain(b: float) -> float:
            """Throughput at batch b over the measured: the fitted step time where a sweep gave one, else constant."""
            if model is None:
                return max(1.0, b / running)
            a, c = model
            return max(1.0, (b / (a + c * b)) / (running / (a + c * running)))

        x = gain(batch)
        est.throughput_x, est.potential_x = round(x, 3), round(gain(most), 3)
        parts = [f"KV capacity x{quantity(factor)} -> room for ~{quantity(room)} running requests",
                 f"batch {quantity(running)} -> {quantity(batch)} (x{quantity(batch / running)}), held by {why}"]  # fmt: skip
        if most > batch * 1.001:
            parts.append(f"with more concurrent requests up to {quantity(most)}, held by {why_more}")
        if room > batch * 1.05:
            parts.append("to use the room, raise the load and `--max-running-requests` with it")
        if model is not None and tput:
            a, c = model
            parts.append(f"step time fitted to the sweep, ITL ~{quantity(a, 'ms')} + {quantity(c, 'ms')} x batch: "
                         f"~{quantity(a + c * batch, 'ms')} at {quantity(batch)} -> ~{quantity(tput * x, 'tok/s')} (x{quantity(x)})")  # fmt: skip
        elif tput:
            step = f" ~{quantity(itl, 'ms')}" if itl else ""
            parts.append(f"~{quantity(tput * x, 'tok/s')} (x{quantity(x)}) if the step time stays{step} (it grows with the batch: an upper bound)")
        est.arithmetic = "; ".join(parts)
        return est
    if kind == "step_share":
        share = min(max(factor, 0.0), 0.95)
        x = 1.0 / (1.0 - share)
        est.throughput_x = est.potential_x = round(x, 3)
        step = f"the ~{quantity(itl, 'ms')} step -> ~{quantity(itl * (1 - share), 'ms')}" if itl else "the step"
        est.arithmetic = f"removing {quantity(share, 'share')} of {step} -> throughput x{quantity(x)}" + (f", ~{quantity(tput * x, 'tok/s')}" if tput else "")
        return est
    est.arithmetic = f"unknown gain kind '{kind}'"
    return est


def fill_gains(results: Results) -> Results:
    """Work out every recorded step's gain from this run's numbers (the runner calls it once)."""
    ctx = context(results)
    for h in results.hypotheses:
        for step in h.steps:
            if step.gain is not None:
                step.gain = estimate(step.gain.kind, step.gain.factor, step.gain.assumes, ctx)
    return results


def gain_short(step: StepResult, where: str = "under What to do") -> str:
    """The gain in a few words for the TL;DR: "x1.06 output throughput at this load (an estimate; up to x2.5 ...)"."""
    g = step.gain
    if g is None or g.throughput_x is None:
        return "not estimated for this step"
    more = f"; up to x{quantity(g.potential_x)} with more concurrent requests" if g.potential_x and g.potential_x > g.throughput_x + 1e-6 else ""
    batch = next((p for p in g.arithmetic.split("; ") if p.startswith(("batch", "removing"))), "")
    return f"x{quantity(g.throughput_x)} output throughput at this load{': ' + batch if batch else ''} (an estimate{more}; the arithmetic is {where})"


def gain_text(step: StepResult) -> str:
    """"estimate: x1.06 throughput (arithmetic; assumes ...)", or "" without an estimate."""
    g = step.gain
    if g is None:
        return ""
    head = f"estimate: x{quantity(g.throughput_x)} output throughput" if g.throughput_x is not None else "estimate"
    tail = f"; assumes {g.assumes.strip().rstrip('.')}" if g.assumes.strip() else ""
    return f"{head} ({g.arithmetic}{tail})"


# -- throughput and latency ---------------------------------------------------------------------


def throughput_text(results: Results) -> str:
    """The one output throughput, labelled with what it is."""
    if results.throughput is not None:
        t = results.throughput
        return f"{quantity(t.output_tokens_per_s, 'tok/s')} output ({THROUGHPUT_LABEL}: {t.definition})"
    load = results.load or {}
    if load.get("output_tokens_per_s") is not None:
        return f"{quantity(float(load['output_tokens_per_s']), 'tok/s')} output (mean over the whole load, ramp included)"
    return ""


def latency_text(load: dict[str, Any] | None) -> str:
    """TTFT, ITL, TPOT and E2E p50/p99 in one line; "not measured" where no request got that far."""
    if not load:
        return ""
    parts = []
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        lat = load.get(key) or {}
        if lat.get("p50") is None:
            parts.append(f"{name} not measured")
        else:
            parts.append(f"{name} p50 {quantity(float(lat['p50']), 'ms')} / p99 {quantity(float(lat.get('p99') or lat['p50']), 'ms')}")
    return ", ".join(parts)


def load_counts(load: dict[str, Any] | None) -> str:
    """"1,024 requests completed, 0 still streaming at the end, 0 failed"."""
    if not load:
        return ""
    return (f"{quantity(int(load.get('completed') or 0))} requests completed, {quantity(int(load.get('cancelled') or 0))} still streaming "
            f"at the end, {quantity(int(load.get('failed') or 0))} failed")  # fmt: skip


def outlived_note(load: dict[str, Any] | None) -> str:
    """When no request finished inside the window: say so, and what it means for the numbers."""
    if not load or int(load.get("completed") or 0) > 0 or int(load.get("cancelled") or 0) == 0:
        return ""
    cfg = load.get("config") or {}
    out_len = cfg.get("output_len")
    itl = (load.get("itl_ms") or {}).get("p50")
    need = f" (each needs {quantity(int(out_len))} tokens at ~{quantity(float(itl), 'ms')} a token: ~{quantity(int(out_len) * float(itl) / 1000, 's')})" if out_len and itl else ""
    return (f"No request finished within the {quantity(float(load.get('duration_s') or 0), 's')} the load ran{need}: "
            "throughput and TTFT/ITL are measured on the streams, but TPOT, E2E and requests/s are not (0 completed is not a failure).")  # fmt: skip
