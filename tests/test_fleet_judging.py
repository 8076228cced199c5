"""Judging a fleet fast without changing a verdict: a rule is evaluated once per distinct input
(`rules.memoized`), on only the names it reads (`rules.activation(data, names)`). Each outcome must be
the one evaluating afresh on the whole data gives. (The fleet end to end, memo on and off, with the same
verdicts and reasons: test_fleet.py::test_the_shared_memo_changes_no_verdict and benchmarks/fleet_scale.py.)"""

from __future__ import annotations

from gpu_runbook import rules
from gpu_runbook.cel_budget import MAX_CEL_LIST
from gpu_runbook.rules import compile_rule, evaluate, memoized, to_cel_data

CASES = [
    ("p.draw_w / p.max_w < 0.7", {"p": {"draw_w": 235, "max_w": 600}, "other": {"x": [1, 2, 3]}}),
    ("p.draw_w / p.max_w < 0.7", {"p": {"draw_w": 580, "max_w": 600}, "other": {}}),
    ("p.draw_w / p.max_w < 0.7", {"p": {"draw_w": None, "max_w": 600}}),  # missing
    ("p.draw_w / p.max_w < 0.7", {"other": {"draw_w": 1}}),  # the alias absent
    ("p.draw_w + 1 > 0.0", {"p": {"draw_w": 1}}),  # an authoring error (int and double)
    ("p.gpus.all(g, g.util > params.busy)", {"p": {"gpus": [{"util": 99}, {"util": 97}]}, "params": {"busy": 90}}),
    ("p.gpus.all(g, g.util > params.busy)", {"p": {"gpus": [{"util": 99}, {"util": 10}]}, "params": {"busy": 90}}),
    ("version_at_least(s.version, '0.5.5')", {"s": {"version": "0.5.5.post3"}, "p": {}}),
    ("version_at_least(s.version, '0.5.5')", {"s": {"version": "main-dev"}}),
]


def _as_tuple(o: rules.Outcome) -> tuple:
    return (o.value, o.missing, o.error)


def test_reading_only_the_rules_names_gives_the_whole_datas_outcome(monkeypatch) -> None:
    projected = [_as_tuple(evaluate(compile_rule(s), to_cel_data(d))) for s, d in CASES]
    real = rules.activation
    monkeypatch.setattr(rules, "activation", lambda data, names=None: real(data))  # every name converted, as before
    whole = [_as_tuple(evaluate(compile_rule(s), to_cel_data(d))) for s, d in CASES]
    assert projected == whole


def test_the_memo_gives_each_outcome_evaluating_afresh_gives() -> None:
    afresh = [_as_tuple(evaluate(compile_rule(s), to_cel_data(d))) for s, d in CASES]
    with memoized():
        twice = [[_as_tuple(evaluate(compile_rule(s), to_cel_data(d))) for s, d in CASES] for _ in range(2)]
    assert twice[0] == twice[1] == afresh
    assert {a[0] for a in afresh} == {True, False, None}  # the cases cover every kind of outcome


def test_the_memo_keys_on_the_values_read_and_ignores_the_rest(monkeypatch) -> None:
    # the memo saves interpreting a rule again; a rule the compiled path answers skips it (cel_compiled)
    monkeypatch.setenv("RUNBOOK_CEL", "interpreted")
    calls: list[str] = []
    real = rules._evaluate
    monkeypatch.setattr(rules, "_evaluate", lambda rule, data: calls.append(rule.source) or real(rule, data))
    rule = compile_rule("p.draw_w / p.max_w < 0.7")
    with memoized():
        first = evaluate(rule, to_cel_data({"p": {"draw_w": 235, "max_w": 600}, "q": {"noise": 1}}))
        same = evaluate(rule, to_cel_data({"p": {"draw_w": 235, "max_w": 600}, "q": {"noise": 2}}))
        other = evaluate(rule, to_cel_data({"p": {"draw_w": 590, "max_w": 600}, "q": {"noise": 1}}))
    assert (first.value, same.value, other.value) == (True, True, False)
    assert len(calls) == 2  # the second host read the same: not evaluated again
    evaluate(rule, to_cel_data({"p": {"draw_w": 235, "max_w": 600}}))
    assert len(calls) == 3  # outside `memoized`, nothing is remembered


def test_data_past_the_budget_is_refused_even_when_the_memo_knows_the_rule() -> None:
    rule = compile_rule("p.draw_w > 1.0")
    with memoized():
        assert evaluate(rule, to_cel_data({"p": {"draw_w": 2}})).value is True
        huge = to_cel_data({"p": {"draw_w": 2}, "q": {"xs": list(range(MAX_CEL_LIST + 1))}})
        refused = evaluate(rule, huge)
    assert refused.value is None and "rule stopped" in (refused.error or "") and "MAX_CEL_LIST" in refused.error
