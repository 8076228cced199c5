"""used_values shows a list or map whole up to 200 characters of its text, and measures that text without
writing out a long one: the measure must be len(str(value)) exactly, for plain and CEL-typed values alike."""

from __future__ import annotations

from celpy import celtypes
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_runbook import rules

_scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
            | st.floats(allow_nan=False).map(celtypes.DoubleType) | st.text(max_size=8).map(celtypes.StringType)
            | st.booleans().map(celtypes.BoolType) | st.integers(-99, 99).map(celtypes.IntType))  # fmt: skip
_keys = st.text(max_size=6) | st.text(max_size=6).map(celtypes.StringType) | st.integers(-9, 9)
_values = st.recursive(
    _scalars,
    lambda inner: (st.lists(inner, max_size=6) | st.lists(inner, max_size=6).map(celtypes.ListType)
                   | st.dictionaries(_keys, inner, max_size=5) | st.dictionaries(_keys, inner, max_size=5).map(celtypes.MapType)),
    max_leaves=40,
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(_values, st.integers(0, 400))
def test_the_measure_is_the_texts_length(value, limit):
    assert rules._text_within(value, limit) == (len(str(value)) <= limit)


def test_a_long_series_is_named_and_a_short_one_shown():
    data = rules.to_cel_data({"power": {"gpus": [{"draw_w": float(i), "name": "NVIDIA H200"} for i in range(8)], "mean": 1.5,
                                        "pair": [1.0, 2.0]}})  # fmt: skip
    rule = rules.compile_rule("power.gpus.all(g, g.draw_w >= 0.0) && power.mean > 1.0 && size(power.pair) == 2")
    shown = rules.used_values(rule, data)
    assert shown["power.gpus"] in ("<list of 8>", "<ListType of 8>") and shown["power.mean"] == 1.5 and shown["power.pair"] == [1.0, 2.0]
