"""`runbook diff`: did the fix work? Two runs compared as conclusions, not only as numbers.

What it says, in order: whether the runs are comparable (and which difference is the change under
test, which a confounder); how each verdict moved (fixed, regressed, new, still present, became
unmeasurable), with the rule's inputs before -> after and the one that crossed its threshold; the
old and the new rules judged on both runs (so "the host changed" is told from "the rule changed");
the key figures, where a change within the runs' noise is `~`.

Noise: a figure with a per-sample series recorded in both runs (the probes' Series blocks) is
compared with a two-sided Mann-Whitney U test (normal approximation, tie-corrected, alpha 0.05, at
least 3 samples a side), as benchstat does, and moves only when its value (the mean) also shifts by at least 1 %
(samples a second apart are not independent, so the test alone calls a 0.1 % drift between two runs of
one box significant; 1 % is within NVML's stated +-5 W power accuracy on a board drawing
under 500 W, and under any fix worth a diff); a figure with one number a run (the load generator's
latency percentiles) counts as noise within +-5 %; a derived figure (energy per token) moves only
when one of its inputs does.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field

from .evidence import ProbeStatus
from .loader import LoadedRunbook
from .model import Severity, Verdict
from .registry import Registry
from .results import EvidenceRecord, HypothesisResult, Results
from .rules import evaluate, format_value, lookup, to_cel_data, with_value
from .judge import NOT_RECORDED, rule_data
from .target import probe_role

NOISE_TEST = "Noise test: " + " ".join(__doc__.split("Noise: ", 1)[1].split())
ALPHA = 0.05
MIN_SAMPLES = 3
SCALAR_TOLERANCE = 0.05  # relative; for figures with no per-sample series
MIN_EFFECT = 0.01  # relative; a significant shift smaller than this is still noise

Kind = Literal["fixed", "regressed", "new", "still present", "became unmeasurable"]
KIND_ORDER: list[str] = ["fixed", "regressed", "new", "still present", "became unmeasurable"]
SEVERITY_RANK = {Severity.critical: 0, Severity.warning: 1, Severity.info: 2}

# Keys of sglang.server's values that describe the running server, not how it was launched.
NOT_ARGS = {
    "version", "model_path", "served_model_name", "served_models", "info_endpoint", "last_gen_throughput",
    "weight_memory_gb", "kv_cache_memory_gb", "kv_token_capacity", "is_generation", "max_model_len",
    "kv_cache_dtype", "tp_size", "pp_size", "dp_size", "ep_size", "enable_dp_attention", "nnodes",
}  # the last ones have their own header rows
UNDER_TEST_BY_DEFAULT = ("server_arg:", "kv_dtype", "parallel")


class HeaderRow(BaseModel):
    key: str  # what --change names
    label: str
    before: str
    after: str
    differs: bool
    role: str = ""  # "change under test" | "confounder" | "" (same on both)


class RuleInput(BaseModel):
    path: str
    before: Any = None
    after: Any = None
    crossed: bool = False  # this input alone, moved to its after value, flips the rule

    @property
    def unchanged(self) -> bool:
        return self.before == self.after


class Transition(BaseModel):
    id: str
    title: str
    severity: Severity
    kind: Kind
    before: str  # verdict
    after: str
    before_reason: str = ""
    after_reason: str = ""
    rule: str = ""  # the confirm rule whose inputs are shown
    inputs: list[RuleInput] = Field(default_factory=list)
    crossed: list[str] = Field(default_factory=list)


class RulesRow(BaseModel):
    """One hypothesis judged by the old and the new rules on both runs."""

    id: str
    old_on_before: str
    old_on_after: str
    new_on_before: str
    new_on_after: str
    reading: str  # "host changed" | "rule changed" | "host and rule changed"


class Figure(BaseModel):
    name: str  # what --fail-on metric:NAME names
    label: str
    unit: str = ""
    before: float | None = None
    after: float | None = None
    before_spread: str = ""
    after_spread: str = ""
    delta_pct: float | None = None
    beyond_noise: bool = False
    change: str = "n/a"  # "~", "+12.3%", "-4.0%", "n/a"
    test: str = ""


class EstimateCheck(BaseModel):
    """A next step the first run estimated a gain for, against the throughput change the second run measured."""

    finding: str  # the hypothesis whose step it is
    step: str
    finding_after: str  # that hypothesis's verdict in the second run ("absent" when it has none)
    estimated_x: float | None = None  # output throughput after / before, at the first run's load (the estimate)
    potential_x: float | None = None  # the same with enough concurrent requests
    arithmetic: str = ""  # how the first run worked the estimate out
    throughput_before: float | None = None  # tok/s, as each run's report quotes it
    throughput_after: float | None = None
    measured_x: float | None = None
    reading: str = ""


class Diff(BaseModel):
    before_path: str = ""
    after_path: str = ""
    header: list[HeaderRow] = Field(default_factory=list)
    transitions: list[Transition] = Field(default_factory=list)
    unchanged: int = 0
    rules: list[RulesRow] = Field(default_factory=list)
    rules_note: str = ""
    figures: list[Figure] = Field(default_factory=list)
    estimates: list[EstimateCheck] = Field(default_factory=list)
    noise_test: str = Field(default_factory=lambda: NOISE_TEST)
    changed: bool = False  # any verdict transition (other than still present) or figure beyond noise

    def regressed(self) -> list[Transition]:
        return [t for t in self.transitions if t.kind == "regressed"]

    def figure(self, name: str) -> Figure | None:
        return next((f for f in self.figures if f.name == name), None)


# ---------------------------------------------------------------------------------------------
# the noise test


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test, normal approximation with tie and continuity correction."""
    n1, n2 = len(a), len(b)
    pooled = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    r1 = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0)
    u = r1 - n1 * (n1 + 1) / 2
    n = n1 + n2
    mean = n1 * n2 / 2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - mean) - 0.5) / math.sqrt(var)
    return max(0.0, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))))


def _spread(samples: list[float]) -> str:
    if not samples:
        return ""
    s = sorted(samples)
    q = lambda p: s[min(len(s) - 1, int(round(p * (len(s) - 1))))]  # noqa: E731
    return f"p10-p90 {format_value(float(q(0.1)))}-{format_value(float(q(0.9)))}, n={len(s)}"


def compare_figure(name: str, label: str, unit: str, before: float | None, after: float | None, sb: list[float], sa: list[float]) -> Figure:
    fig = Figure(name=name, label=label, unit=unit, before=before, after=after, before_spread=_spread(sb), after_spread=_spread(sa))
    if before is None or after is None:
        fig.test = "not in both runs"
        return fig
    fig.delta_pct = (after - before) / abs(before) * 100 if before else (0.0 if after == before else math.inf)
    if len(sb) >= MIN_SAMPLES and len(sa) >= MIN_SAMPLES:
        p = mann_whitney_p(sb, sa)
        fig.beyond_noise = p < ALPHA and abs(fig.delta_pct) >= MIN_EFFECT * 100
        fig.test = f"Mann-Whitney U p={p:.3g} (n={len(sb)}/{len(sa)})"
    else:
        fig.beyond_noise = abs(fig.delta_pct) > SCALAR_TOLERANCE * 100
        fig.test = f"one number a run: noise within +-{SCALAR_TOLERANCE:.0%}"
    fig.change = _signed(fig.delta_pct) if fig.beyond_noise else "~"
    return fig


def _signed(pct: float) -> str:
    return "new" if math.isinf(pct) else f"{pct:+.1f}%"


# ---------------------------------------------------------------------------------------------
# reading a run


def _evidence(results: Results, probe: str) -> EvidenceRecord | None:
    """The run's evidence of a probe: under load first (that is what the key figures are about)."""
    role = probe_role(probe)  # a server probe: whichever family ran it (`sglang.metrics` finds `vllm.metrics`)
    found = [ev for h in results.hypotheses for ev in h.evidence
             if (ev.probe == probe or (role is not None and probe_role(ev.probe) == role)) and ev.status is ProbeStatus.ok]  # fmt: skip
    found.sort(key=lambda ev: not ev.under_load)
    return found[0] if found else None


def _series(ev: EvidenceRecord | None, title: Callable[[str], bool]) -> list[float]:
    if ev is None:
        return []
    return [float(p[1]) for b in ev.blocks if b.kind == "series" and title(b.title) for p in b.points]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _get(values: dict[str, Any] | None, *path: str) -> Any:
    node: Any = values or {}
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def figures_of(results: Results) -> dict[str, tuple[str, str, float | None, list[float]]]:
    """name -> (label, unit, value, per-sample series) for the key figures this run recorded."""
    load = results.load or {}
    metrics = _evidence(results, "sglang.metrics")
    power = _evidence(results, "gpu.sample")
    mv = metrics.values if metrics else {}
    pv = power.values if power else {}
    limit = _num(pv.get("power_limit_enforced_w"))
    power_w = _series(power, lambda t: t.startswith("GPU ") and t.endswith(" power"))
    gen = _series(metrics, lambda t: t == "generation throughput")
    out: dict[str, tuple[str, str, float | None, list[float]]] = {
        "output_tokens_per_s": ("output throughput (load generator)", "tok/s", _num(load.get("output_tokens_per_s")), []),
        "gen_throughput": ("output throughput (server, gen_throughput)", "tok/s", _num(_get(mv, "gen_throughput", "mean")), gen),
    }
    for metric, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL")):
        for q in ("p50", "p99"):
            out[f"{metric.split('_')[0]}_{q}_ms"] = (f"{label} {q}", "ms", _num(_get(load, metric, q)), [])
    out["gpu_util_pct"] = ("GPU utilisation", "%", _num(_get(pv, "gpu_util_pct", "mean")), _series(power, lambda t: t.startswith("GPU utilisation")))
    out["power_draw_w"] = ("power draw per GPU", "W", _num(_get(pv, "power_draw_w", "mean")), power_w)
    out["power_to_limit"] = ("power / enforced limit", "", _num(_get(pv, "draw_to_enforced_limit", "mean")), [w / limit for w in power_w] if limit else [])
    out["running_reqs"] = ("running requests", "", _num(_get(mv, "num_running_reqs", "mean")), _series(metrics, lambda t: t == "running requests"))
    out["queued_reqs"] = ("queued requests", "", _num(_get(mv, "num_queue_reqs", "mean")), _series(metrics, lambda t: t == "queued requests"))
    out["kv_usage"] = ("KV token usage", "", _num(_get(mv, "token_usage", "mean")), _series(metrics, lambda t: t == "KV token usage"))
    draw, count, rate = out["power_draw_w"][2], _num(pv.get("gpu_count")), out["output_tokens_per_s"][2]
    out["energy_per_token_j"] = ("energy per output token (all GPUs)", "J", draw * count / rate if draw and count and rate else None, [])
    return out


def key_figures(before: Results, after: Results) -> list[Figure]:
    fb, fa = figures_of(before), figures_of(after)
    figures = []
    for name, (label, unit, vb, sb) in fb.items():
        _, _, va, sa = fa[name]
        if name == "energy_per_token_j":
            continue
        figures.append(compare_figure(name, label, unit, vb, va, sb, sa))
    label, unit, vb, _ = fb["energy_per_token_j"]
    energy = compare_figure("energy_per_token_j", label, unit, vb, fa["energy_per_token_j"][2], [], [])
    if energy.delta_pct is not None:
        inputs = [f for f in figures if f.name in ("power_draw_w", "output_tokens_per_s", "gen_throughput")]
        energy.beyond_noise = any(f.beyond_noise for f in inputs) and energy.after != energy.before
        energy.change = _signed(energy.delta_pct) if energy.beyond_noise else "~"
        energy.test = "derived: moves when power or throughput moves beyond noise"
    figures.append(energy)
    figures += breakdown_figures(before, after)
    return [f for f in figures if f.before is not None or f.after is not None]


def _buckets(results: Results) -> dict[str, tuple[float, list[float]]]:
    """The decode-step breakdown, when a probe recorded one: every mapping whose key names buckets
    (`buckets`, `bucket_us_per_step`, ...) from bucket to a number (or to per-rank numbers, whose
    mean is the figure and which are its samples). Named `probe:key:bucket`."""
    out: dict[str, tuple[float, list[float]]] = {}
    for h in results.hypotheses:
        for ev in h.evidence:
            if ev.status is not ProbeStatus.ok:
                continue
            for key, value in ev.values.items():
                if "bucket" not in key.lower() or not isinstance(value, dict):
                    continue
                for bucket, v in value.items():
                    samples = [float(x) for x in v if _num(x) is not None] if isinstance(v, list) else []
                    number = _num(v) if not samples else sum(samples) / len(samples)
                    if number is not None:
                        out.setdefault(f"{ev.probe}:{key}:{bucket}", (number, samples))
    return out


def breakdown_figures(before: Results, after: Results) -> list[Figure]:
    """Per bucket, when both runs have a breakdown (the profile's decode step)."""
    bb, ba = _buckets(before), _buckets(after)
    return [compare_figure(name, f"decode step: {name.split(':')[-1]} ({name.split(':')[1]})", "", bb[name][0], ba[name][0], bb[name][1], ba[name][1]) for name in bb if name in ba]


def _text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def header_of(results: Results) -> dict[str, tuple[str, str]]:
    """key -> (label, text) of what makes two runs comparable."""
    inv = results.inventory()
    gpus, server, model = inv.get("gpus") or {}, inv.get("server") or {}, inv.get("model") or {}
    config = (results.load or {}).get("config") or {}
    out: dict[str, tuple[str, str]] = {
        "gpus": ("GPUs", f"{_text(gpus.get('gpu_count'))} x {_text(gpus.get('gpu_name'))}" if gpus else "—"),
        "driver": ("driver", _text(gpus.get("driver_version"))),
        "power_limits": ("power limit (enforced / max, W)", f"{_text(gpus.get('power_limit_enforced_w'))} / {_text(gpus.get('power_limit_max_w'))}" if gpus else "—"),
        "server_version": ("server version", _text(server.get("version"))),
        "model": ("model", _text(server.get("served_model_name") or model.get("model_type"))),
        "kv_dtype": ("KV cache dtype", _text(server.get("kv_cache_dtype"))),
        "parallel": ("parallel layout", " ".join(f"{k.split('_')[0]}={_text(server.get(k))}" for k in ("tp_size", "pp_size", "dp_size", "ep_size", "nnodes") if k in server)
                     + (" dp-attention" if server.get("enable_dp_attention") else "") if server else "—"),
        "load": ("load shape", f"{_text(config.get('concurrency'))} concurrent, {_text(config.get('input_len'))} in / {_text(config.get('output_len'))} out, {config.get('endpoint', '')}" if config else "no load"),
        "runbook": ("runbook (sha256)", f"{results.runbook} ({results.runbook_sha256[:12]})" if results.runbook_sha256 else f"{results.runbook} (schema {results.schema_version}: no hash)"),
    }
    launch = set(server["launch_args"]) if isinstance(server.get("launch_args"), list) else None  # newer runs say which values are flags
    for key in sorted(server):
        if key not in NOT_ARGS and key != "launch_args" and (launch is None or key in launch):
            out[f"server_arg:{key}"] = (f"server arg {key}", _text(server[key]))
    return out


def comparability(before: Results, after: Results, under_test: list[str]) -> list[HeaderRow]:
    """Rows of both runs; a difference is the change under test when `--change` names it (or, when
    nothing is named, when it is a server launch argument, KV dtype or parallel layout), else a confounder."""
    hb, ha = header_of(before), header_of(after)
    rows = []
    for key in list(hb) + [k for k in ha if k not in hb]:
        label = (hb.get(key) or ha[key])[0]
        vb, va = hb.get(key, (label, "—"))[1], ha.get(key, (label, "—"))[1]
        differs = vb != va
        if under_test:
            tested = key in under_test or (key.startswith("server_arg:") and key.split(":", 1)[1] in under_test)
        else:
            tested = key.startswith(UNDER_TEST_BY_DEFAULT)
        role = ("change under test" if tested else "confounder") if differs else ""
        if differs or not key.startswith("server_arg:"):  # unchanged server args would drown the header
            rows.append(HeaderRow(key=key, label=label, before=vb, after=va, differs=differs, role=role))
    args_b = {k for k in hb if k.startswith("server_arg:")}
    args_a = {k for k in ha if k.startswith("server_arg:")}
    if args_b or args_a:
        same = sum(1 for k in args_b & args_a if hb[k][1] == ha[k][1])
        at = next((i for i, r in enumerate(rows) if r.key.startswith("server_arg:")), len(rows))
        rows.insert(at, HeaderRow(key="server_args", label="server launch args", before=f"{len(args_b)} read", after=f"{len(args_a)} read; {same} the same", differs=False))
    return rows


# ---------------------------------------------------------------------------------------------
# verdicts and rules


def ruled_out(results: Results, h: HypothesisResult) -> bool:
    """A skipped hypothesis whose premise is gone (its precondition is false, or an ancestor is refuted),
    rather than one left unexplored because an ancestor could not be decided."""
    node: HypothesisResult | None = h
    while node is not None and node.verdict is Verdict.skipped:
        if node.reason.startswith("precondition false"):
            return True
        node = results.by_id(node.parent) if node.parent else None
    return node is not None and node.verdict is Verdict.refuted


def transition_kind(before: str | None, after: str | None, after_ruled_out: bool = True) -> Kind | None:
    confirmed, refuted = Verdict.confirmed.value, Verdict.refuted.value
    unmeasured = (Verdict.inconclusive.value, Verdict.error.value, None)
    if before == confirmed and after == Verdict.skipped.value and not after_ruled_out:
        return "became unmeasurable"
    if before == confirmed and after in (refuted, Verdict.skipped.value):
        return "fixed"
    if before == confirmed and after == confirmed:
        return "still present"
    if after == confirmed:
        return "regressed" if before == refuted else "new"
    if before in (confirmed, refuted) and after in unmeasured:
        return "became unmeasurable"
    return None


def _read(data: dict[str, Any], path: str) -> Any:
    value = lookup(data, path)
    return None if type(value) is object else value  # lookup's "missing" marker


def rule_inputs(loaded: LoadedRunbook, hid: str, before: Results, after: Results, pb: dict[str, Any], pa: dict[str, Any]) -> tuple[str, list[RuleInput]]:
    """The confirm rule's inputs on both runs; `crossed` marks each input that alone flips the rule."""
    rule = loaded.rule(hid, "confirm")
    if rule is None:
        return "", []
    db = rule_data(before.scope(hid), pb, before.load)
    da = rule_data(after.scope(hid), pa, after.load)
    base = evaluate(rule, db).value
    inputs = []
    for path in rule.paths:
        vb, va = _read(db, path), _read(da, path)
        crossed = vb != va and evaluate(rule, with_value(db, path, to_cel_data(va))).value != base
        inputs.append(RuleInput(path=path, before=vb, after=va, crossed=crossed))
    return " ".join(rule.source.split()), inputs


def _rows_2x2(before: Results, after: Results, old: LoadedRunbook, new: LoadedRunbook, registry: Registry) -> list[RulesRow]:
    from .rejudge import rejudge  # noqa: PLC0415

    def cells(results: Results) -> dict[str, str]:
        """Verdicts, with "not recorded" for those the run cannot answer and for the branches they left unexplored."""
        out: dict[str, str] = {}
        for h in results.hypotheses:  # tree order: a parent comes before its children
            unanswered = h.reason.startswith(NOT_RECORDED) or (h.verdict is Verdict.skipped and out.get(h.parent or "") == NOT_RECORDED)
            out[h.id] = NOT_RECORDED if unanswered else h.verdict.value
        return out

    old_on_after, new_on_before = cells(rejudge(after, old, registry)), cells(rejudge(before, new, registry))
    ob, na = cells(before), cells(after)
    rows = []
    for hid in list(dict.fromkeys(list(ob) + list(na))):
        row = [ob.get(hid, "—"), old_on_after.get(hid, "—"), new_on_before.get(hid, "—"), na.get(hid, "—")]
        # a pair with a cell the run cannot answer ("not recorded", or the id is not in that runbook) tells nothing
        differ = lambda i, j: NOT_RECORDED not in (row[i], row[j]) and "—" not in (row[i], row[j]) and row[i] != row[j]  # noqa: E731
        host = differ(0, 1) or differ(2, 3)
        rule = differ(0, 2) or differ(1, 3) or (row[0] == "—") != (row[2] == "—")
        if host or rule or (row[0] != row[3] and not (host or rule)):
            reading = "host and rule changed" if host and rule else ("host changed" if host else ("rule changed" if rule else "cannot tell: evidence not recorded"))
            rows.append(RulesRow(id=hid, old_on_before=row[0], old_on_after=row[1], new_on_before=row[2], new_on_after=row[3], reading=reading))
    return rows


def diff(before: Results, after: Results, registry: Registry, *, under_test: list[str] | None = None, before_path: str = "", after_path: str = "") -> Diff:
    from .rejudge import rejudge_params, runbook_of  # noqa: PLC0415

    out = Diff(before_path=before_path, after_path=after_path)
    out.header = comparability(before, after, under_test or [])
    new = runbook_of(after, registry)
    same_rules = bool(before.runbook_sha256) and before.runbook_sha256 == after.runbook_sha256
    old = new if same_rules else runbook_of(before, registry)
    # the params each verdict was reached with (a threshold changed between the runs shows as an input that moved)
    pb, pa = rejudge_params(new, before, {}), rejudge_params(new, after, {})

    vb = {h.id: h for h in before.hypotheses}
    va = {h.id: h for h in after.hypotheses}
    for hid in list(dict.fromkeys(list(va) + list(vb))):
        hb, ha = vb.get(hid), va.get(hid)
        kind = transition_kind(hb.verdict.value if hb else None, ha.verdict.value if ha else None, ha is None or ruled_out(after, ha))
        if kind is None:
            out.unchanged += 1
            continue
        shown = ha or hb
        assert shown is not None
        in_new = ha is not None
        rule, inputs = rule_inputs(new if in_new else old, hid, before, after, pb if in_new else before.params, pa if in_new else after.params)
        out.transitions.append(Transition(
            id=hid, title=shown.title, severity=shown.severity, kind=kind,
            before=hb.verdict.value if hb else "absent", after=ha.verdict.value if ha else "absent",
            before_reason=hb.reason if hb else "", after_reason=ha.reason if ha else f"not in {after.runbook}'s runbook",
            rule=rule, inputs=inputs, crossed=[i.path for i in inputs if i.crossed],
        ))  # fmt: skip
    out.transitions.sort(key=lambda t: (KIND_ORDER.index(t.kind), SEVERITY_RANK[t.severity]))

    if same_rules:
        out.rules_note = "Both runs were judged by the same runbook (same sha256): any verdict change is the host's."
    else:
        out.rules = _rows_2x2(before, after, old, new, registry)
        out.rules_note = (
            "The runbooks differ: each run re-judged by the other's rules. A row changes along a line (same rules, two runs) "
            "when the host changed, down a column (same run, two rule sets) when the rule changed."
        )
    out.figures = key_figures(before, after)
    out.estimates = estimate_checks(before, after)
    out.changed = any(t.kind != "still present" for t in out.transitions) or any(f.beyond_noise for f in out.figures)
    return out


# ---------------------------------------------------------------------------------------------
# the first report's estimated gains against what the second run measured


def estimate_checks(before: Results, after: Results) -> list[EstimateCheck]:
    """Each step the first run put a number on, with the throughput change the second run measured.

    The steps of findings that the second run no longer confirms come first: those are the steps that
    were most likely taken. The throughput is the one each report quotes (`findings.context`), so the
    estimate and the measurement start from the same number."""
    from .findings import context, ranked_steps  # noqa: PLC0415

    verdicts = {h.id: h.verdict.value for h in after.hypotheses}
    tb, ta = context(before), context(after)
    cb, ca = tb.get("concurrency"), ta.get("concurrency")
    measured = round(ta["throughput"] / tb["throughput"], 3) if tb.get("throughput") and ta.get("throughput") else None
    out = []
    for ranked in ranked_steps(before):
        gain = ranked.step.gain
        if gain is None or (gain.throughput_x is None and gain.potential_x is None):
            continue
        check = EstimateCheck(finding=ranked.finding.id, step=ranked.step.text, finding_after=verdicts.get(ranked.finding.id, "absent"),
                              estimated_x=gain.throughput_x, potential_x=gain.potential_x, arithmetic=gain.arithmetic,
                              throughput_before=tb.get("throughput"), throughput_after=ta.get("throughput"), measured_x=measured)  # fmt: skip
        check.reading = _estimate_reading(check, cb, ca)
        out.append(check)
    out.sort(key=lambda c: c.finding_after == "confirmed")  # stable: the report's ranking within each group
    return out


def _estimate_reading(c: EstimateCheck, concurrency_before: float | None, concurrency_after: float | None) -> str:
    from .numbers import quantity  # noqa: PLC0415

    if c.measured_x is None:
        return "no output throughput in both runs: nothing to compare the estimate with"
    est = c.estimated_x if c.estimated_x is not None else c.potential_x
    assert est is not None
    said = f"measured x{quantity(c.measured_x)} ({quantity(c.throughput_before, 'tok/s')} -> {quantity(c.throughput_after, 'tok/s')})"
    if c.finding_after == "confirmed":
        return f"{said}; {c.finding} is still confirmed, so this step was not taken or did not remove the cause"
    if concurrency_before and concurrency_after and concurrency_before != concurrency_after:
        return (f"{said} at a different load ({quantity(concurrency_before)} -> {quantity(concurrency_after)} concurrent requests): "
                f"the estimate x{quantity(est)} was for the first run's load; with enough requests it was up to x{quantity(c.potential_x)}")  # fmt: skip
    if abs(c.measured_x - 1.0) <= SCALAR_TOLERANCE:
        return f"{said}: no gain beyond noise (+-{SCALAR_TOLERANCE:.0%}), against an estimated x{quantity(est)}"
    if c.measured_x < 1.0:
        return f"{said}: throughput fell, against an estimated x{quantity(est)}: the change cost more than the step gave (see the verdicts above)"
    # the share of the estimated gain that was realised: x1.06 of an estimated x2.0 is 6 %, not 53 %
    share = (c.measured_x - 1.0) / (est - 1.0) if est > 1.0 else None
    tail = ""
    if c.potential_x and c.measured_x > c.potential_x * (1 + SCALAR_TOLERANCE):
        tail = f"; more than even the potential x{quantity(c.potential_x)}: something else changed too"
    elif share is not None and share < 1 - SCALAR_TOLERANCE:
        tail = "; short of the estimate: another limit binds now (see the verdicts above)"
    realised = f", {share:.0%} of the estimated gain" if share is not None else ""
    return f"{said} against an estimated x{quantity(est)}{realised}{tail}"


# ---------------------------------------------------------------------------------------------
# --fail-on


def parse_fail_on(spec: str) -> tuple[str, str | None, float | None]:
    """'regressed' or 'metric:NAME:-5%' -> (kind, name, percent). Raises ValueError."""
    if spec == "regressed":
        return "regressed", None, None
    parts = spec.split(":")
    if len(parts) == 3 and parts[0] == "metric" and parts[2].endswith("%"):
        try:
            pct = float(parts[2][:-1])
        except ValueError:
            pct = None
        if pct is not None and pct != 0:
            return "metric", parts[1], pct
    raise ValueError(f"--fail-on {spec}: expected 'regressed' or 'metric:NAME:-5%' (a signed, non-zero percent; on `runbook run` also 'confirmed', 'warning' or 'critical')")


def failures(d: Diff, specs: list[str]) -> list[str]:
    """What each --fail-on found, beyond noise only. Raises ValueError on a bad spec or unknown metric."""
    found = []
    for spec in specs:
        kind, name, pct = parse_fail_on(spec)
        if kind == "regressed":
            found += [f"regressed: {t.id}" for t in d.regressed()]
            continue
        fig = d.figure(name or "")
        if fig is None:
            known = ", ".join(f.name for f in d.figures) or "none recorded"
            raise ValueError(f"--fail-on {spec}: no figure '{name}' in both runs (figures: {known})")
        assert pct is not None
        if fig.beyond_noise and fig.delta_pct is not None and (fig.delta_pct <= pct if pct < 0 else fig.delta_pct >= pct):
            found.append(f"{fig.name} {fig.change} (limit {pct:+g}%)")
    return found


def render_markdown(d: Diff) -> str:
    from .report import _environment  # noqa: PLC0415 - the report's Jinja setup and filters

    groups = {kind: [t for t in d.transitions if t.kind == kind] for kind in KIND_ORDER}
    return _environment().get_template("diff.md.j2").render(d=d, groups=groups, fmt=_text)
