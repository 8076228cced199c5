"""The judge: verdicts from evidence. The runbook's rules over the values the probes returned decide each
hypothesis (confirmed, refuted, inconclusive, skipped, error) with the reason and the values that decided it,
and a confirmed finding's headline, cost and steps. It runs nothing: `runbook run` (the runner schedules the
probes and the load), `rejudge` (recorded evidence), `diff` (what a rule read) and `fleet` (a memo shared by
every host: probes/prometheus answers) all judge through it.
"""

from __future__ import annotations

from typing import Any

from . import depth as depths
from . import headlines
from .depth import NOT_AT_DEPTH
from .loader import LoadedRunbook
from .model import Hypothesis, Verdict, headline_parts
from .registry import NOT_HERE, Registry
from .results import EvidenceRecord, GainEstimate, HypothesisResult, StepResult
from .evidence import ProbeStatus
from .rules import Outcome, Rule, evaluate, format_value, to_cel_data, to_cel_parts, used_values

NOT_RECORDED = "not recorded"  # the reason a replayed call carries when the run did not record it


def rule_data(scope: dict[str, EvidenceRecord], params: dict[str, Any], load: dict[str, Any] | None,
              converted: dict[int, Any] | None = None) -> dict[str, Any]:
    """What a rule sees: each alias's values (empty unless the probe returned ok), `params`, `load`. `converted`:
    each record's values in CEL types, kept by the caller across the scopes of one walk (rules.to_cel_parts)."""
    data: dict[str, Any] = {alias: (rec.values if rec.status is ProbeStatus.ok else _EMPTY) for alias, rec in scope.items()}
    data["params"] = params
    data["load"] = load or _EMPTY
    return to_cel_data(data) if converted is None else to_cel_parts(data, converted)


_EMPTY: dict[str, Any] = {}  # never written: one object, so its conversion is kept too


class Judge:
    """Decides a hypothesis from the evidence in its scope (its ancestors' and its own, by alias). The runner
    owns the walk; a fleet's judge (engine/fleet/judge.py FleetJudge) remembers what alike hosts read."""

    def __init__(self, loaded: LoadedRunbook, registry: Registry, params: dict[str, Any], depth: str = "standard") -> None:
        self.loaded = loaded  # as the server found reads it (LoadedRunbook.for_server)
        self.registry = registry
        self.params = params
        self.depth = depth
        self.load_report: dict[str, Any] | None = None  # the load generator's report, once the load has run

    def refuted_whatever(self, when: Rule, refute: Rule | None, scope: dict[str, EvidenceRecord]) -> tuple[Verdict, str, Rule | None] | None:
        """A precondition that cannot be told for want of a value (TP unknown) does not hold back a refutation that
        reads none of what is missing and holds (every GPU pair has P2P): it holds whatever the missing value is, so
        the hypothesis is refuted, and the reason says so. None where that is not the case."""
        if refute is None:
            return None
        data = self.data(scope)
        outcome = evaluate(when, data)
        missing = [m.split("=", 1)[0].split(" ", 1)[0] for m in outcome.missing]
        if outcome.value is not None or outcome.error or not missing:
            return None
        if any(p == m or p.startswith(m + ".") or m.startswith(p + ".") for p in refute.paths for m in missing):
            return None
        if evaluate(refute, data).value is not True:
            return None
        return Verdict.refuted, f"refute: {_show(refute, data)}; it holds whatever {', '.join(missing)} is (the precondition could not be told)", refute

    def precondition(self, hyp: Hypothesis, when: Rule, scope: dict[str, EvidenceRecord]) -> tuple[Verdict, str, Rule | None] | None:
        """A `when` that is false skips the hypothesis; one that cannot be told says why; true: None (go on)."""
        data = self.data(scope)
        outcome = evaluate(when, data)
        if outcome.value is False:
            return Verdict.skipped, f"precondition false: {_show(when, data)}", when
        if outcome.value is None:
            return self.undecided(hyp, scope, [when], [outcome], "precondition")
        return None


    def data(self, scope: dict[str, EvidenceRecord], rule: Rule | None = None) -> dict[str, Any]:
        return rule_data(scope, self.params, self.load_report)

    def used_values(self, rule: Rule, data: dict[str, Any]) -> dict[str, Any]:
        """What the deciding rule read, for the verdict (a subclass may remember it: `runbook fleet`)."""
        return used_values(rule, data)

    def needs(self, hyp: Hypothesis, rules: dict[str, Rule | None], scope: dict[str, EvidenceRecord]) -> tuple[list[str], str]:
        """What judging `hyp` needs (its declaration and the calls its rules read), and what this depth did not give it."""
        needs = set(hyp.needs)
        not_run = set()
        read = set().union(*(r.names for r in rules.values() if r is not None))
        if "load" in read:  # the load report: only a load we drive has one
            needs.add("load")
        for alias in read & set(scope):
            rec = scope[alias]
            probe_needs = getattr(self.registry.lookup(rec.probe), "needs", None)
            needs |= depths.call_need(rec.under_load, probe_needs)
            if (rec.reason or "").startswith(NOT_AT_DEPTH):
                gate = depths.left_out(probe_needs, hyp.needs, self.depth) or probe_needs
                if gate:
                    not_run.add(gate)
        ordered = [n for n in depths.NEEDS if n in needs]
        return ordered, depths.note(ordered, self.depth, not_run)

    def decide(self, hyp: Hypothesis, scope: dict[str, EvidenceRecord], confirm: Rule | None, refute: Rule | None) -> tuple[Verdict, str, Rule | None]:
        data = self.data(scope)
        outcomes: list[Outcome] = []
        rules: list[Rule] = []
        for rule, kind, label in ((confirm, Verdict.confirmed, "confirm"), (refute, Verdict.refuted, "refute")):
            if rule is None:
                continue
            outcome = evaluate(rule, data)
            if outcome.value is True:
                return kind, f"{label}: {_show(rule, data)}", rule
            outcomes.append(outcome)
            rules.append(rule)
        return self.undecided(hyp, scope, rules, outcomes, "rules")

    def undecided(self, hyp: Hypothesis, scope: dict[str, EvidenceRecord], rules: list[Rule], outcomes: list[Outcome], what: str) -> tuple[Verdict, str, Rule | None]:
        """Neither rule held: say why (a probe failed, a value is missing, or the evidence sits between)."""
        read = set().union(*(r.names for r in rules)) if rules else set()
        failed = [rec for alias, rec in scope.items() if alias in read and rec.status is ProbeStatus.failed]
        if failed:
            return Verdict.error, "; ".join(f"{rec.probe} failed: {rec.reason}" for rec in failed), None
        authoring = [o.error for o in outcomes if o.error]
        if authoring:
            return Verdict.error, authoring[0], None
        unavailable = [rec for alias, rec in scope.items() if alias in read and rec.status is ProbeStatus.unavailable]
        unrecorded = [f"{rec.probe} ({alias})" for alias, rec in scope.items() if alias in read and rec.status is ProbeStatus.unavailable and rec.reason == NOT_RECORDED]
        if unrecorded:
            return Verdict.inconclusive, f"{NOT_RECORDED}: " + ", ".join(unrecorded), None
        # a probe this server kind has none of (the hypothesis exists for the other server only): skipped, unless the
        # rules also miss something else
        not_here = {alias for alias, rec in scope.items() if alias in read and rec.status is ProbeStatus.unavailable and (rec.reason or "").startswith(NOT_HERE)}
        missing_elsewhere = [p for o in outcomes for p in o.missing if p.split(".")[0].split("[")[0] not in not_here]
        if not_here and len(not_here) == len(unavailable) and not missing_elsewhere:
            return Verdict.skipped, "; ".join(dict.fromkeys(scope[a].reason or "" for a in sorted(not_here))), None
        if not_here and len(not_here) == len(unavailable):
            return Verdict.inconclusive, "cannot decide: " + ", ".join(dict.fromkeys(f"{p} is missing" for p in missing_elsewhere)), None
        if unavailable:
            return Verdict.inconclusive, "; ".join(f"{rec.probe} unavailable: {rec.reason}" for rec in unavailable), None
        missing = list(dict.fromkeys(p for o in outcomes for p in o.missing))
        if missing:
            return Verdict.inconclusive, "cannot decide: " + ", ".join(p if "(not a release" in p else f"{p} is missing" for p in missing), None
        if what == "precondition":
            return Verdict.inconclusive, "precondition could not be evaluated", None
        shown = "; ".join(f"{'confirm' if i == 0 else 'refute'} false: {_show(r, self.data(scope))}" for i, r in enumerate(rules))
        generic = f"neither rule held ({shown})" if len(rules) > 1 else f"confirm did not hold and there is no refute rule ({shown})"
        return Verdict.inconclusive, f"{hyp.inconclusive.strip()}: {generic}" if hyp.inconclusive.strip() else generic, None

    def findings(self, hyp: Hypothesis, result: HypothesisResult, data: dict[str, Any]) -> None:
        """A confirmed finding's headline numbers and its steps: which apply, and each one's gain factor
        (the arithmetic is done on the whole run's numbers in `snapshot`)."""
        if hyp.headline:
            fields = [self.loaded.rule(hyp.id, f"headline.{j}") for j in range(len(headline_parts(hyp.headline)))]
            result.headline, result.headline_values = headlines.render(hyp.headline, fields, data)
        if hyp.cost is not None:
            cost = headlines.value_of(self.loaded.rule(hyp.id, "cost"), data) if self.loaded.rule(hyp.id, "cost") is not None else None
            result.cost = float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None
        if hyp.not_limiting is not None and (nl := self.loaded.rule(hyp.id, "not_limiting.when")) is not None:
            outcome = evaluate(nl, data)
            result.limiting = (not outcome.value) if isinstance(outcome.value, bool) else None
            if outcome.value is True:
                fields = [self.loaded.rule(hyp.id, f"not_limiting.says.{j}") for j in range(len(headline_parts(hyp.not_limiting.says)))]
                result.not_limiting_note = headlines.render(hyp.not_limiting.says, fields, data)[0]
        steps = []
        for i, step in enumerate(hyp.steps):
            text = step.text.strip()
            if "{{" in text:
                fields = [self.loaded.rule(hyp.id, f"next_steps.{i}.text.{j}") for j in range(len(headline_parts(step.text)))]
                text = headlines.render(step.text, fields, data)[0] if all(f is not None for f in fields) else text
            record = StepResult(text=text, when=step.when)
            when = self.loaded.rule(hyp.id, f"next_steps.{i}.when") if step.when else None
            if when is not None:
                outcome = evaluate(when, data)
                record.applies = outcome.value
                if outcome.value is not True:
                    record.reason = f"does not apply: {_show(when, data)}" if outcome.value is False else f"cannot tell: {outcome.describe()}"
            if step.gain is not None:
                factor_rule = self.loaded.rule(hyp.id, f"next_steps.{i}.gain")
                factor = headlines.value_of(factor_rule, data) if factor_rule is not None else None
                number = float(factor) if isinstance(factor, (int, float)) and not isinstance(factor, bool) else None
                record.gain = GainEstimate(kind=step.gain.kind, factor=number, assumes=step.gain.assumes.strip())
            steps.append(record)
        result.steps = steps


def _show(rule: Rule, data: dict[str, Any]) -> str:
    values = used_values(rule, data)
    shown = ", ".join(f"{path}={format_value(v) if v is not None else 'missing'}" for path, v in values.items())
    source = " ".join(rule.source.split())
    return f"{source} [{shown}]" if shown else source
