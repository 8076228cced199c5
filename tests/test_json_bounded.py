"""JSON from a server is parsed with a depth bound: too deep is a ValueError naming the bound, never RecursionError."""

from __future__ import annotations

import httpx
import pytest

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
