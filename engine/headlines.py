"""A finding's first line with its numbers: `{{ CEL | unit }}` fields filled from the evidence.

The values are formatted once, here, with gpu_runbook.numbers, and the text is kept in the results, so
the summary, the report and the JSON say the same thing in the same rounding.
"""

from __future__ import annotations

from typing import Any

import celpy
from celpy import celtypes

from . import cel_compiled
from .model import HEADLINE_FIELD, headline_parts
from .numbers import quantity
from .rules import Rule, activation, compiled_value, read_only


def plain(value: Any) -> Any:
    """A CEL value as plain Python (numbers, text, lists, maps)."""
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, (celtypes.IntType, celtypes.UintType)):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, (list, celtypes.ListType)):
        return [plain(v) for v in value]
    if isinstance(value, (dict, celtypes.MapType)):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def value_of(rule: Rule, data: dict[str, Any]) -> Any:
    """The expression's value on normalised data (see rules.to_cel_data), or None where it cannot be
    computed (a missing value, a failed probe): a headline then says "?" rather than failing."""
    fast = compiled_value(rule, data)
    if fast is not None and not cel_compiled.checking():
        return fast
    value = _value(rule, read_only(rule, data))  # what the field reads, not the whole evidence, converted
    if cel_compiled.checking():
        if value != (whole := _value(rule, data)) and value == value:  # (NaN is not NaN)
            raise cel_compiled.Disagreement(f"{rule.source!r}: on the data it reads {value!r}, on all of it {whole!r}")
        if fast is not None and (fast != value or type(fast) is not type(value)):
            raise cel_compiled.Disagreement(f"{rule.source!r}: compiled {fast!r}, interpreted {value!r}")
    return value


def _value(rule: Rule, data: dict[str, Any]) -> Any:
    from .cel_budget import CostLimit, evaluate_bounded  # noqa: PLC0415

    try:
        result = evaluate_bounded(rule.program, data, activation(data, rule.names))
    except (Exception, CostLimit):  # noqa: BLE001 - celpy raises CELEvalError and friends for missing values
        return None
    if isinstance(result, celpy.CELEvalError):
        return None
    return plain(result)


def render(text: str, rules: list[Rule | None], data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The headline text with each field replaced by its formatted value, and the raw values by source."""
    parts = headline_parts(text)
    values: dict[str, Any] = {}
    shown: list[str] = []
    for (expr, unit), rule in zip(parts, rules):
        value = value_of(rule, data) if rule is not None else None
        values[expr] = value
        shown.append("?" if value is None else quantity(value, unit))
    it = iter(shown)
    return " ".join(HEADLINE_FIELD.sub(lambda _m: next(it), text).split()), values
