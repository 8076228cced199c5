"""The compiled CEL path (engine/cel_compiled.py) answers exactly as the bounded interpreter does, or not at all.

Each case is judged twice, compiled (the default) and interpreted (`RUNBOOK_CEL=interpreted`), and the two
Outcomes must be equal: the verdict, the missing values named, the error. Then the guards: the forms the Rust
evaluator would answer differently (int against double, null against a number, a string against a number) and
the rules past the budget never get a compiled answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpu_runbook import cel_compiled, rules

pytestmark = pytest.mark.skipif(not cel_compiled.enabled(), reason="common-expression-language is not installed (Python < 3.11)")


def both(source: str, data: dict) -> tuple[rules.Outcome, rules.Outcome, bool | None]:
    rule = rules.compile_rule(source)
    cel_data = rules.to_cel_data(data)
    fast = rules._compiled(rule, cel_data)
    interpreted = rules._interpreted(rule, rules.to_cel_data(data))
    return rules.evaluate(rule, cel_data), interpreted, fast


RULES = [
    "power.draw_w.mean < params.ratio * power.limit_w && power.util.mean >= 90.0",
    "power.gpus.all(g, g.limit_w >= params.ratio * g.max_w || g.draw_w.p95 < params.ratio * g.limit_w)",
    "power.gpus.exists(g, g.limit_w < params.ratio * g.max_w) && !(power.util.mean < 50.0)",
    "server.kind == 'sglang' && server.tp > 1.0 || server.kv_dtype.startsWith('fp8')",
    "server.kv_dtype in ['fp8_e4m3', 'fp8_e5m2', 'auto'] || server.tp != 8.0",
    "metrics.share != null ? metrics.share < 0.5 : server.graphs == false",
    "has(metrics.share) ? metrics.share >= 0.5 : power.util.mean > 10.0",
    "power.gpus.filter(g, g.draw_w.p95 > 300.0).map(g, g.limit_w).exists(x, x < 600.0)",
    "has_feature(server, 'pcie-ipc-allreduce') || server.tp / power.limit_w > 0.01",
    "(power.draw_w.mean < params.ratio && power.limit_w > 2.0) || power.gpus.exists(g, g.draw_w.p95 < params.ratio)",
    "(power.draw_w.mean >= params.ratio || power.limit_w <= 2.0) && power.gpus.all(g, g.max_w >= params.ratio || g.limit_w < 1.0)",
    "(server.kind != null ? server.kind : server.kv_dtype) != null && (server.kind != null ? server.kind : server.kv_dtype) == 'vllm'",
]

number = st.one_of(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False), st.integers(-5, 900), st.none())
text = st.sampled_from(["sglang", "vllm", "fp8_e4m3", "auto", "bf16", ""])
anything = st.one_of(number, text, st.booleans(), st.none())


def maybe(strategy):  # a value, null, or absent (None from the dict strategy below removes the key)
    return st.one_of(strategy, st.none(), st.just("__absent__"))


def clean(d):
    if isinstance(d, dict):
        return {k: clean(v) for k, v in d.items() if v != "__absent__"}
    if isinstance(d, list):
        return [clean(v) for v in d]
    return d


gpu = st.fixed_dictionaries({"limit_w": maybe(number), "max_w": maybe(number), "draw_w": st.fixed_dictionaries({"p95": maybe(number)})})


@st.composite
def alike_gpus(draw):
    """GPUs that lack the same fields (as an exporter without a counter leaves every GPU), each its own numbers."""
    kept = draw(st.fixed_dictionaries({"limit_w": st.booleans(), "max_w": st.booleans(), "p95": st.booleans()}))
    floats = st.floats(min_value=0, max_value=1e3, allow_nan=False)
    out = []
    for _ in range(draw(st.integers(1, 4))):
        g = {"draw_w": {"p95": draw(floats)} if kept["p95"] else {}}
        g.update({k: draw(floats) for k in ("limit_w", "max_w") if kept[k]})
        out.append(g)
    return out


data = st.fixed_dictionaries({
    "power": st.fixed_dictionaries({"draw_w": st.fixed_dictionaries({"mean": maybe(number)}), "limit_w": maybe(number),
                                    "util": st.fixed_dictionaries({"mean": maybe(anything)}), "gpus": st.one_of(st.lists(gpu, max_size=4), alike_gpus())}),
    "params": st.fixed_dictionaries({"ratio": maybe(number)}),
    "server": st.fixed_dictionaries({"kind": maybe(anything), "tp": maybe(anything), "kv_dtype": maybe(anything), "graphs": maybe(anything),
                                     "server_kind": st.sampled_from(["sglang", "vllm"]), "version": st.sampled_from(["0.5.10", "0.30.0", "dev"])}),
    "metrics": st.fixed_dictionaries({"share": maybe(anything)}),
})  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(source=st.sampled_from(RULES), raw=data)
# a macro over a macro's result reads members no path names: its data must not be cut to its paths (found by CI)
@example(source=RULES[7], raw={"power": {"gpus": [{"draw_w": {"p95": 301.0}, "limit_w": 0.0}]}})
def test_compiled_and_interpreted_agree_on_any_data(source, raw):
    got, want, _ = both(source, clean(raw))
    assert (got.value, got.missing, got.error) == (want.value, want.missing, want.error)


VALUES = [  # headline fields: numbers, texts and choices, as runbooks write them
    "power.draw_w.mean / power.limit_w",
    "power.draw_w.mean * params.ratio - power.limit_w",
    "has(metrics.share) && metrics.share != null ? metrics.share : 0.0",
    "server.kind",
    "server.kv_dtype + '/' + server.kind",
    "power.gpus.exists(g, g.limit_w < params.ratio * g.max_w)",
    "power.util.mean >= 90.0 ? 'busy' : 'idle'",
    "interp([[0.0, power.limit_w], [100.0, 2.0 * power.limit_w]], power.util.mean)",
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(source=st.sampled_from(VALUES), raw=data)
def test_a_headline_value_is_the_interpreters(source, raw):
    from gpu_runbook import headlines  # noqa: PLC0415

    rule = rules.compile_rule(source)
    fast = rules.compiled_value(rule, rules.to_cel_data(clean(raw)))
    want = headlines._value(rule, rules.to_cel_data(clean(raw)))
    assert fast is None or (fast == want and type(fast) is type(want)), (fast, want)


def test_a_headline_value_is_computed_compiled_where_it_can_be():
    rule = rules.compile_rule("power.draw_w.mean / power.limit_w")
    assert rules.compiled_value(rule, rules.to_cel_data({"power": {"draw_w": {"mean": 235.0}, "limit_w": 600.0}})) == 235.0 / 600.0
    assert rules.compiled_value(rule, rules.to_cel_data({"power": {"draw_w": {"mean": 235.0}, "limit_w": 0.0}})) is None  # inf
    assert rules.compiled_value(rule, rules.to_cel_data({"power": {"draw_w": {"mean": 235.0}}})) is None  # missing


def test_the_compiled_path_answers_the_common_cases():
    """Not a path that always steps aside: with full, well-typed data the Rust evaluator gives the answer."""
    d = {"power": {"draw_w": {"mean": 235.0}, "limit_w": 600.0, "util": {"mean": 100.0},
                   "gpus": [{"limit_w": 600.0, "max_w": 600.0, "draw_w": {"p95": 240.0}}] * 8},
         "params": {"ratio": 0.95}, "server": {"kind": "sglang", "tp": 8, "kv_dtype": "fp8_e4m3", "graphs": True,
                                                "server_kind": "vllm", "version": "0.30.0"}, "metrics": {"share": 0.3}}  # fmt: skip
    for source in RULES:
        got, want, fast = both(source, d)
        assert fast is not None, source
        assert got.value == want.value == fast, source


@pytest.mark.parametrize(("source", "data", "value"), [
    ("x == 8", {"x": 8.0}, None),  # int against double: cel-python refuses, Rust says true
    ("x in [4, 8]", {"x": 8.0}, None),
    ("x == 1.0", {"x": None}, None),  # null against a number, in a rule that does not say null: "x is missing"
    ("s == 1.0", {"s": "a"}, None),  # a string against a number
    ("size(l) == 2", {"l": [1.0, 2.0]}, True),  # size() gives an int: the interpreter, which agrees here
])  # fmt: skip
def test_forms_rust_answers_differently_go_to_the_interpreter(source, data, value):
    got, want, fast = both(source, data)
    assert fast is None
    assert got == want and got.value is value


def test_a_rule_past_the_budget_is_stopped_by_the_interpreter_not_answered():
    """Nested macros over a long list: the static bound exceeds MAX_CEL_STEPS, so the interpreter runs it and
    says which limit stopped it, as it did before the compiled path."""
    source = "l.all(a, l.all(b, l.all(c, a + b + c >= 0.0)))"
    got, _, fast = both(source, {"l": [float(i) for i in range(200)]})
    assert fast is None
    # which limit stops it first depends on the machine's speed: the steps, or the deadline on a busy one
    assert got.value is None and (got.error or "").startswith("rule stopped") and "MAX_CEL_" in got.error
    plan = rules.compile_rule(source).compiled
    assert plan is not None and plan.cost.on(rules.to_cel_data({"l": [0.0] * 200})) > cel_compiled.MAX_CEL_STEPS


def test_a_macro_over_a_computed_list_has_no_plan():
    assert rules.compile_rule("[1.0, 2.0].map(x, [x, x]).all(p, p.all(q, q > 0.0))").compiled is None


@pytest.mark.parametrize("scenario", ["seed-rtx-pro-6000-tp8", "healthy-h200-vllm"])
def test_a_run_is_judged_alike_by_both_evaluators(tmp_path, scenario):
    """A whole simulated run, re-judged from its results under each evaluator: every verdict and reason equal.
    RUNBOOK_CEL=check makes the compiled run also interpret each rule it answered and fail on any difference."""
    out = tmp_path / "r.json"
    env = {**os.environ, "RUNBOOK_CEL": "check", "NO_COLOR": "1"}
    run = subprocess.run([sys.executable, "-m", "gpu_runbook.cli", "run", "power-starvation", "--simulate", scenario,
                          "--depth", "quick", "--no-tui", "--json", str(out)], capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    judged = {}
    for mode in ("interpreted", "compiled"):
        dest = tmp_path / f"{mode}.json"
        env = {**os.environ, "RUNBOOK_CEL": mode, "NO_COLOR": "1"}
        proc = subprocess.run([sys.executable, "-m", "gpu_runbook.cli", "rejudge", str(out), "--json", str(dest)],
                              capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        judged[mode] = [(h["id"], h["verdict"], h.get("reason")) for h in json.loads(dest.read_text())["hypotheses"]]
    assert judged["compiled"] == judged["interpreted"]
    assert {v for _, v, _ in judged["compiled"]} & {"confirmed", "refuted"}


def test_a_function_failing_inside_the_compiled_path_prints_nothing(capfd, caplog):
    """Rust logs each Python function that raised; on a dev build that is every release-fact rule, and none of it
    may reach the terminal: the interpreter words the outcome."""
    got, want, fast = both("has_feature(server, 'pcie-ipc-allreduce') || server.tp > 100.0",
                           {"server": {"server_kind": "vllm", "version": "dev", "tp": 8.0}})
    assert fast is None and got == want
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert not [r for r in caplog.records if r.name.startswith("cel")]  # (pytest's capture would hide it from stderr)
