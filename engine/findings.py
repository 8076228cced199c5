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
from .target import probe_role

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
    confirmed = [h for h in results.hypotheses if h.verdict is Verdict.confirmed and h.limiting is not False]
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
        # a cause with a measured share of the step is a root cause in its own right, ranked by that share
        follows = [] if h.cost is not None else h.follows
        cause = next((f for f in follows if f in ids and f in nodes and f != h.id), None)
        if cause is not None and _not_circular(h.id, cause, nodes):
            nodes[cause].consequences.append(node)
        elif (up := confirmed_ancestor(h.id)) is not None:
            nodes[up].because.append(node)
        else:
            roots.append(node)
    order = {h.id: i for i, h in enumerate(results.hypotheses)}
    roots.sort(key=lambda f: (SEVERITY_ORDER[f.result.severity], order[f.id]))
    return rank_by_cost(roots)


def rank_by_cost(roots: list[Finding]) -> list[Finding]:
    """Where a profile measured what causes cost, the causes with a share of the step take the places they
    hold among themselves in order of that share (largest first); the others (the KV wall, the cap: they set the
    batch, not a share of the step) keep their places."""
    costed = sorted((f for f in roots if f.result.cost is not None), key=lambda f: -(f.result.cost or 0.0))
    it = iter(costed)
    return [next(it) if f.result.cost is not None else f for f in roots]


def ranking_basis(results: Results) -> tuple[str, str]:
    """("profile" | "configuration", why): what orders the root causes. A decode profile taken while the server ran
    (its profile probe, where the server was launched with its profiler) gives the causes it measured their share of
    the step, and those rank by it; where no root cause has a share, the order is the configuration's: severity,
    then the runbook's order, and the reason says why no profile ranked them."""
    if any(f.result.cost is not None for f in findings(results)):
        taken = next((p.probe for p in results.probes if probe_role(p.probe) == "server.profile" and p.status is ProbeStatus.ok), None)
        return "profile", f"the measured decode profile{f' ({taken})' if taken else ''}: each cause by its share of the step"
    profiles = [p for p in results.probes if probe_role(p.probe) == "server.profile"]
    if any(p.status is ProbeStatus.ok for p in profiles):
        why = "the decode profile gave no root cause a share of the step"
    elif profiles:
        p = profiles[0]
        why = f"no decode profile: {p.reason or p.status.value}"
    else:
        why = "no decode profile was taken"
    return "configuration", f"the configuration (severity, then the runbook's order); {why}"


def not_limiting(results: Results) -> list[HypothesisResult]:
    """Confirmed facts that change nothing at this load (each says the load at which it would start to matter)."""
    return [h for h in results.hypotheses if h.verdict is Verdict.confirmed and h.limiting is False]


def cost_text(h: HypothesisResult) -> str:
    """"~44% of the measured decode step", or "" where no profile measured it."""
    return f"{quantity(h.cost, 'share')} of the measured decode step" if h.cost is not None else ""


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
    first (largest first), then by the finding's place in the summary. A step whose `when` was false, or
    could not be checked (a dev build's version, a value not measured), is not offered."""
    out: list[tuple[tuple, RankedStep]] = []
    for rank, f in enumerate(walk(findings(results))):
        for i, step in enumerate(steps_of(f.result)):
            if step.applies is not True:  # its precondition is false, or could not be checked: not offered
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
            if ev.status is ProbeStatus.ok and out["running"] is None and ("running" in ev.values or probe_role(ev.probe) == "server.metrics"):
                v = ev.values
                out["running"] = _stat(v.get("running")) or _stat(v.get("num_running_reqs"), "mean")
                out["queued"] = _stat(v.get("queued"))
                if out["queued"] is None:
                    out["queued"] = _stat(v.get("num_queue_reqs"), "mean")
                out["running_cap"] = _num(v.get("running_cap")) or _num(v.get("max_running_requests"))
                out["kv_tokens"] = _num(v.get("max_total_num_tokens"))
    # the running-request cap's flag in the words of the server found (the arithmetic names it)
    kind = (results.target or {}).get("server_kind")
    out["cap_flag"] = {"sglang": "`--max-running-requests`", "vllm": "`--max-num-seqs` (per engine)"}.get(kind or "")  # type: ignore[assignment]
    load = results.load or {}
    out["concurrency"] = _num((load.get("config") or {}).get("concurrency"))
    out["throughput"] = results.throughput.output_tokens_per_s if results.throughput else _num(load.get("output_tokens_per_s"))
    out["itl_ms"] = _num((load.get("itl_ms") or {}).get("p50"))
    sweep = next((ev for h in results.hypotheses for ev in h.evidence if probe_role(ev.probe) == "server.sweep" and ev.status is ProbeStatus.ok), None)
    levels = [lv for lv in (sweep.values.get("levels") or []) if isinstance(lv, dict)] if sweep is not None else []
    if levels and out["running"] is None:  # a sweep: start from its top level, and fit the step time along its curve
        top = levels[-1]
        out.update(running=_num(top.get("running_max")), queued=_num(top.get("queue_mean")), concurrency=_num(top.get("concurrency")),
                   throughput=_num(top.get("output_tokens_per_s")), itl_ms=_num(top.get("itl_p50_ms")),
                   running_cap=_num(sweep.values.get("max_running_requests")))  # fmt: skip
        out["curve"] = [(float(lv["running_mean"]), float(lv["itl_p50_ms"])) for lv in levels
                        if _num(lv.get("running_mean")) and _num(lv.get("itl_p50_ms"))]  # type: ignore[assignment]  # fmt: skip
        out["curve_sources"] = ["the sweep's levels"]  # type: ignore[assignment]
    windows = ramp_windows(load.get("decode_timeline") or [])
    if windows:
        out["ramp_fit"] = ramp_fit(windows)  # type: ignore[assignment]
    prof = next((ev for h in results.hypotheses for ev in h.evidence if probe_role(ev.probe) == "server.profile" and ev.status is ProbeStatus.ok), None)
    if prof is not None and _num(prof.values.get("batch")) and _num(prof.values.get("step_ms")):
        out["curve"] = list(out.get("curve") or []) + [(float(prof.values["batch"]), float(prof.values["step_ms"]))]  # type: ignore[assignment, operator]
        out["curve_sources"] = list(out.get("curve_sources") or []) + ["the profiled decode step"]  # type: ignore[assignment, operator]
        parts = {k: _num(prof.values.get(f"{k}_share")) for k in ("communication", "attention", "moe_gemm")}
        if all(v is not None for v in parts.values()):
            out["profile_parts"] = {"batch": float(prof.values["batch"]), "step_ms": float(prof.values["step_ms"]), **parts}  # type: ignore[assignment]
    return out


RAMP_WINDOW_S = 3.0  # several decode steps per window even at ~1 s a step


def ramp_windows(timeline: list[Any]) -> list[tuple[float, float, float, float]]:
    """(mean streaming batch, tokens, seconds, new streams) over consecutive windows of the load's samples of at
    least RAMP_WINDOW_S: the ramp passes through every batch size on its way to the steady state."""
    rows = [r[:4] for r in timeline if isinstance(r, (list, tuple)) and len(r) >= 4 and all(_num(v) is not None for v in r[:4])]
    out: list[tuple[float, float, float, float]] = []
    i = 0
    while i < len(rows) - 1:
        j = i + 1
        while j < len(rows) and rows[j][0] - rows[i][0] < RAMP_WINDOW_S:
            j += 1
        if j >= len(rows):
            break
        seg = rows[i:j]  # the batch each half second of the window started with
        batch = sum(r[1] for r in seg) / len(seg)
        tokens, seconds, started = rows[j][2] - rows[i][2], rows[j][0] - rows[i][0], rows[j][3] - rows[i][3]
        if batch >= 1.0 and tokens > 0 and seconds > 0:
            out.append((batch, tokens, seconds, max(started, 0.0)))
        i = j
    return out


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """m x = v by Gaussian elimination with partial pivoting; None when singular."""
    n = len(v)
    a = [row[:] + [v[k]] for k, row in enumerate(m)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-12 * max(1.0, max(abs(x) for row in a for x in row[:n])):
            return None
        a[col], a[piv] = a[piv], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
    return [a[k][n] / a[k][k] for k in range(n)]


def ramp_fit(windows: list[tuple[float, float, float, float]]) -> tuple[float, float, float, int, float, float] | None:
    """Decode step ~ a + c x batch, with the prefills the same windows carried, fitted to the load's windows:
    each window's time = decode steps x (a + c x batch) + new streams x q, where a new stream's first token
    comes from its prefill pass and every later token from a decode step that gives each streaming request one
    (decode steps = (tokens - new streams) / batch), by least squares in (a, c, q). Returns (a ms, c ms,
    standard error of c, windows, smallest batch, largest batch) over the windows that held a decode step.

    None with fewer than five windows, fewer than three that held a whole decode step, decode-step batches that
    do not spread (less than a fifth of the largest), or a fit that is not physical (a or c not positive, q
    negative). A ramp that only prefills (a real scheduler runs a new prefill batch before the decode batch, so
    under a burst of arrivals the batch climbs with no decode step at all) cannot tell a from c: no fit."""
    if len(windows) < 5:
        return None
    decode = [(b, max(t - s, 0.0), sec, s) for b, t, sec, s in windows]
    stepped = [b for b, d, _, _ in decode if d >= b]  # windows that held at least one whole decode step
    if len(stepped) < 3 or max(stepped) - min(stepped) < 0.2 * max(stepped):
        return None
    with_prefill = any(s > 0 for *_, s in decode)
    rows = [[d / b, d] + ([s] if with_prefill else []) for b, d, _, s in decode]
    y = [sec * 1000.0 for _, _, sec, _ in decode]
    k = len(rows[0])
    if len(rows) <= k:
        return None
    xtx = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    xty = [sum(r[i] * yy for r, yy in zip(rows, y)) for i in range(k)]
    coef = _solve(xtx, xty)
    if coef is None:
        return None
    a, c = coef[0], coef[1]
    if not (a > 0 and c > 0) or (with_prefill and coef[2] < 0):
        return None
    resid = sum((yy - sum(ci * ri for ci, ri in zip(coef, r))) ** 2 for r, yy in zip(rows, y))
    col = _solve(xtx, [1.0 if i == 1 else 0.0 for i in range(k)])  # the (X'X)^-1 column of c
    se = (resid / (len(rows) - k) * col[1]) ** 0.5 if col is not None and col[1] > 0 else 0.0
    return a, c, se, len(rows), min(stepped), max(stepped)


def parts_model(parts: dict[str, float]) -> tuple[tuple[float, float], list[tuple[float, float]], str] | None:
    """step ~ a + c x batch from the profiled step's parts at one batch: the all-reduces (activations) and attention
    (each request's KV) grow with the batch; weight reads (dense GEMMs, norms, the rest) do not; the MoE GEMMs are in
    between (a fixed tile while tokens per expert stay below it, growing past it), so they count half, and the range
    runs from fixed to growing. Returns (the model, the models at both ends, the model in words)."""
    b0, step = parts["batch"], parts["step_ms"]
    grows, moe = parts["communication"] + parts["attention"], parts["moe_gemm"]
    if b0 <= 0 or step <= 0 or not 0 < grows + moe <= 1.0:
        return None

    def model(share: float) -> tuple[float, float]:
        return step * (1.0 - share), step * share / b0

    text = (f"step ~a + c x batch from the profiled decode step's parts at batch {quantity(b0)}: communication "
            f"{quantity(parts['communication'], 'share')} and attention {quantity(parts['attention'], 'share')} grow with the batch, "
            f"the MoE GEMMs' {quantity(moe, 'share')} counted half (the range: fixed to growing), the rest fixed")  # fmt: skip
    return model(grows + moe / 2.0), [model(grows + moe), model(grows)], text


def ramp_points(timeline: list[Any]) -> list[tuple[float, float]]:
    """(batch, step ms) between consecutive load samples: each streaming request gets a token a step, so the step
    takes streaming / (tokens per second). The ramp passes through every batch size on its way to the steady state."""
    points = []
    rows = [r for r in timeline if isinstance(r, (list, tuple)) and len(r) >= 3 and all(_num(v) is not None for v in r[:3])]
    for (t0, b0, n0), (t1, b1, n1) in zip((r[:3] for r in rows), (r[:3] for r in rows[1:])):
        batch, dt, dn = (b0 + b1) / 2.0, t1 - t0, n1 - n0
        if batch >= 1.0 and dt > 0 and dn > 0:
            points.append((batch, batch / (dn / dt) * 1000.0))
    return points


def step_time_model(curve: list[tuple[float, float]]) -> tuple[float, float] | None:
    """ITL ~ a + c x batch, least squares over the measured (running, ITL) points: a decode step reads
    the weights once (a) and each running request's KV (c). None with fewer than two distinct batches."""
    fit = step_time_fit(curve)
    return (fit[0], fit[1]) if fit is not None else None


def step_time_fit(curve: list[tuple[float, float]]) -> tuple[float, float, float, int, float, float] | None:
    """(a, c, standard error of c, points, smallest batch, largest batch) of step ~ a + c x batch; None where the
    batches do not spread (less than a fifth of the largest) or the fit is not physical (a or c not positive)."""
    points = sorted(curve)
    batches = [b for b, _ in points]
    if len(set(batches)) < 2 or max(batches) - min(batches) < 0.2 * max(batches):
        return None
    n = len(points)
    mb, mt = sum(batches) / n, sum(t for _, t in points) / n
    sxx = sum((b - mb) ** 2 for b in batches)
    c = sum((b - mb) * (t - mt) for b, t in points) / sxx
    a = mt - c * mb
    if not (c > 0 and a > 0):
        return None
    resid = sum((t - a - c * b) ** 2 for b, t in points)
    se = (resid / (n - 2) / sxx) ** 0.5 if n > 2 else 0.0
    return a, c, se, n, min(batches), max(batches)


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
        fit = step_time_fit(ctx.get("curve") or [])  # type: ignore[arg-type]
        sources = ", ".join(ctx.get("curve_sources") or ["the measured points"])  # type: ignore[arg-type]
        if fit is None and ctx.get("ramp_fit") is not None:
            fit = ctx["ramp_fit"]  # type: ignore[assignment]
            sources = "the load's windows of at least 3 s (ramp and steady state), each window's prefills fitted alongside"
        model = (fit[0], fit[1]) if fit is not None else None

        def gain(b: float, m: tuple[float, float] | None = model) -> float:
            """Throughput at batch b over the measured: the fitted step time where one was fitted, else constant."""
            if m is None:
                return max(1.0, b / running)
            a, c = m
            return max(1.0, (b / (a + c * b)) / (running / (a + c * running)))

        x = gain(batch)
        est.throughput_x, est.potential_x = round(x, 3), round(gain(most), 3)
        if fit is not None:  # the slope +-2 standard errors, the line kept through the points' mean
            a, c, se, n, lo_b, hi_b = fit
            mb = (lo_b + hi_b) / 2.0
            mt = a + c * mb
            xs = [gain(batch, (mt - cc * mb, cc)) for cc in (max(c - 2 * se, 1e-9), c + 2 * se) if mt - cc * mb > 0]
            est.range_x = [round(min(xs + [x]), 3), round(max(xs + [x]), 3)]
            est.model = (f"step ~{quantity(a, 'ms')} + {quantity(c, 'ms')} x batch, least squares over {n} points "
                         f"(batch {quantity(lo_b)}-{quantity(hi_b)}) from {sources}")  # type: ignore[arg-type]  # fmt: skip
        elif ctx.get("profile_parts") and (pm := parts_model(ctx["profile_parts"])) is not None:  # type: ignore[arg-type]
            model, ends, est.model = pm
            x = gain(batch, model)
            est.throughput_x, est.potential_x = round(x, 3), round(gain(most, model), 3)
            xs = [gain(batch, m) for m in ends]
            est.range_x = [round(min(xs + [x]), 3), round(max(xs + [x]), 3)]
        else:
            est.upper_bound = True
        parts = [f"KV capacity x{quantity(factor)} -> room for ~{quantity(room)} running requests",
                 f"batch {quantity(running)} -> {quantity(batch)} (x{quantity(batch / running)}), held by {why}"]  # fmt: skip
        if most > batch * 1.001:
            parts.append(f"with more concurrent requests up to {quantity(most)}, held by {why_more}")
        if room > batch * 1.05:
            parts.append(f"to use the room, raise the load and {ctx.get('cap_flag') or 'the running-request cap'} with it")
        if model is not None and tput:
            a, c = model
            why = "within the fit's slope +-2 standard errors" if fit is not None else "with the MoE GEMMs fixed to growing"
            rng = f", x{quantity(est.range_x[0])}-{quantity(est.range_x[1])} {why}" if est.range_x else ""
            parts.append(f"{est.model}: ~{quantity(a + c * running, 'ms')} at {quantity(running)} -> ~{quantity(a + c * batch, 'ms')} "
                         f"at {quantity(batch)}, ~{quantity(tput * x, 'tok/s')} (x{quantity(x)}{rng})")  # fmt: skip
        elif tput:
            step = f" ~{quantity(itl, 'ms')}" if itl else ""
            parts.append(f"~{quantity(tput * x, 'tok/s')} (x{quantity(x)}) if the step time stayed{step}: an upper bound, "
                         "no step-time model could be fitted (the step grows with the batch)")  # fmt: skip
        elif model is None:
            parts.append("an upper bound: no step-time model could be fitted (the step grows with the batch)")
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
    """Work out every recorded step's gain from this run's numbers, and say what ranks the root causes (the runner
    calls it once)."""
    ctx = context(results)
    for h in results.hypotheses:
        for step in h.steps:
            if step.gain is not None:
                step.gain = estimate(step.gain.kind, step.gain.factor, step.gain.assumes, ctx)
    results.ranked_by, results.ranked_by_reason = ranking_basis(results)  # type: ignore[assignment]
    return results


def gain_short(step: StepResult, where: str = "under What to do") -> str:
    """The gain in a few words for the TL;DR: "x1.06 output throughput at this load (an estimate; up to x2.5 ...)"."""
    g = step.gain
    if g is None or g.throughput_x is None:
        return "not estimated for this step"
    more = f"; up to x{quantity(g.potential_x)} with more concurrent requests" if g.potential_x and g.potential_x > g.throughput_x * 1.01 else ""
    batch = next((p for p in g.arithmetic.split("; ") if p.startswith(("batch", "removing"))), "")
    if g.upper_bound:
        return (f"at most x{quantity(g.throughput_x)} output throughput at this load{': ' + batch if batch else ''} (an upper bound: "
                f"no step-time model could be fitted, and the step grows with the batch; the arithmetic is {where})")  # fmt: skip
    rng = f" (x{quantity(g.range_x[0])}-{quantity(g.range_x[1])})" if g.range_x else ""
    model = f"; model: {g.model}" if g.model else ""
    return f"x{quantity(g.throughput_x)}{rng} output throughput at this load{': ' + batch if batch else ''} (an estimate{more}{model}; the arithmetic is {where})"


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
