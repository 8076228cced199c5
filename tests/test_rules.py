"""CEL rules as runbook authors write them: numbers, nulls, versions, and what counts as missing."""

from __future__ import annotations

import pytest

from gpu_runbook.rules import RuleSyntaxError, compile_rule, evaluate, to_cel_data, version_tuple


def outcome(src: str, data: dict):
    return evaluate(compile_rule(src), to_cel_data(data))


def test_numbers_from_evidence_are_doubles_whatever_json_said():
    assert outcome("p.draw_w / p.max_w < 0.7", {"p": {"draw_w": 235, "max_w": 600}}).value is True


def test_a_null_reading_is_missing_unless_the_rule_asks_about_null():
    assert outcome("g.nvlink_links == 0.0", {"g": {"nvlink_links": None}}).missing == ["g.nvlink_links"]
    assert outcome("g.nvlink_links in [0.0]", {"g": {"nvlink_links": None}}).missing == ["g.nvlink_links"]
    assert outcome("g.nvlink_links == null", {"g": {"nvlink_links": None}}).value is True
    assert outcome("g.nvlink_links != null", {"g": {"nvlink_links": 18}}).value is True
    fallback = "(s.quantization != null ? s.quantization : m.quantization) == 'fp8'"
    assert outcome(fallback, {"s": {"quantization": None}, "m": {"quantization": "fp8"}}).value is True


def test_or_decides_without_a_missing_branch_and_names_what_is_missing_when_it_cannot():
    assert outcome("a.x > 1.0 || b.y > 1.0", {"a": {"x": 2}, "b": {}}).value is True
    undecided = outcome("(a.x > 1.0 && a.y < 2.0) || b.z > 1.0", {"a": {}, "b": {}})
    assert undecided.value is None and undecided.missing == ["a.x", "a.y", "b.z"]


def test_version_at_least_compares_versions_not_strings():
    assert version_tuple("0.5.10") > version_tuple("0.5.5.post3")
    assert outcome("version_at_least(s.v, '0.5.10')", {"s": {"v": "0.5.10"}}).value is True
    assert outcome("version_at_least(s.v, '0.5.10')", {"s": {"v": "0.5.5.post3"}}).value is False
    assert outcome("version_at_least(s.v, '0.5.8')", {"s": {"v": "v0.5.23"}}).value is True
    assert outcome("version_at_least(s.v, '0.5.8')", {"s": {"v": None}}).missing == ["s.v"]


def test_a_rule_must_give_a_boolean_and_int_arithmetic_says_how_to_fix_it():
    assert "rule must give true or false" in outcome("p.x + 1.0", {"p": {"x": 1}}).error
    assert "write numbers in rules with a decimal point" in outcome("p.x / 2 > 1.0", {"p": {"x": 4}}).error


def test_a_type_mismatch_is_said_in_the_rules_words():
    error = outcome("p.x + p.s > 1.0", {"p": {"x": 1, "s": "a"}}).error
    assert error == "rule error: cannot apply 'add' to double and string"


def test_an_unknown_function_fails_when_the_rule_compiles_not_when_it_runs():
    with pytest.raises(RuleSyntaxError, match="unknown function 'nosuchfn'") as info:
        compile_rule("p.x > 1.0 && nosuchfn(p.x)")
    assert (info.value.line, info.value.col) == (1, 14)
    for fine in ("size(p.l) > 0 && p.s.startsWith('a') && has(p.x)", "p.l.exists(v, v > 1.0) && int(p.x) == 1", "version_at_least(p.s, '1')"):
        compile_rule(fine)


def test_names_and_paths_a_rule_reads_exclude_macro_variables_and_functions():
    rule = compile_rule("power.gpus.all(g, g.ratio < 0.7) && version_at_least(server.version, '0.5.10') && params.t > 1.0")
    assert rule.names == {"power", "server", "params"}
    assert rule.paths == ["power.gpus", "server.version", "params.t"]


def test_too_deep_a_rule_is_a_syntax_error_not_a_crash():
    with pytest.raises(RuleSyntaxError, match="nests too deeply"):
        compile_rule("(" * 400 + "1.0" + ")" * 400 + " > 0.0")
