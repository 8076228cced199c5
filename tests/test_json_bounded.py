"""JSON from a server is parsed with a depth bound: too deep is a ValueError naming the bound, never RecursionError."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_runbook import json_bounded
from gpu_runbook.server_kind import detect
from tests.test_hostile_servers import HostileServer, _text


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000, "[" * 65 + "]" * 65])
def test_too_deep_is_a_value_error_naming_the_bound(text):
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        json_bounded.loads(text)


def test_ordinary_answers_parse_as_json_does():
    assert json_bounded.loads('{"a": [1, {"b": null}], "c": "x"}') == {"a": [1, {"b": None}], "c": "x"}
    assert json_bounded.loads(b"[" * 64 + b"]" * 64) is not None
    assert json_bounded.depth(5) == 0 and json_bounded.depth([[], {"a": [1]}]) == 3


def test_detection_says_a_too_deep_answer_and_goes_on():
    deep = lambda r: _text("[" * 100_000 + "]" * 100_000)  # noqa: E731
    with HostileServer({p: deep for p in ("/v1/models", "/server_info", "/get_server_info", "/version", "/metrics")}) as server:
        with httpx.Client(trust_env=False) as client:
            found = detect(server.url, client=client)
    assert found.kind == "unknown" and "nested deeper than 64 levels" in found.found


_json = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(alphabet='[]{}"\\\\ax\n\u00e9\U0001f600', max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='[]{}"\\\\k', max_size=4), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_json, st.booleans(), st.booleans())
def test_the_text_is_as_deep_as_the_value(value, as_bytes, ascii_only):
    """The depth read off the text (escapes, quotes and brackets inside strings included) is the parsed value's."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert json_bounded.text_depth(text.encode() if as_bytes else text, 1000) == json_bounded.depth(json.loads(text), 1000)
