"""A metrics store's instant vector read off its text (probes/prometheus/vector.py) gives the samples the JSON
decoder's reading gives, or declines (None) and leaves the answer to it: never a different answer."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_runbook import json_bounded
from gpu_runbook.probes.prometheus import vector
from gpu_runbook.probes.prometheus.client import Sample, samples_of

_label_text = st.text(alphabet='ab0_-:. "\\\\{}\u00e9\U0001f600', max_size=6)
_value = st.floats(allow_nan=True, allow_infinity=True).map(lambda f: str(f).replace("inf", "Inf").replace("nan", "NaN")) | st.sampled_from(["1", "x", ""])
_item = st.builds(lambda metric, t, v: {"metric": metric, "value": [t, v]}, st.dictionaries(_label_text, _label_text, max_size=4), st.floats(0, 2e9), _value)


def _answer(items: list, compact: bool, status: str = "success", kind: str = "vector") -> bytes:
    body = {"status": status, "data": {"resultType": kind, "result": items}}
    return json.dumps(body, separators=(",", ":") if compact else None, ensure_ascii=False).encode()


def _decoded(content: bytes) -> list[Sample]:
    return samples_of(json_bounded.loads(content)["data"]["result"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_item, max_size=6), st.booleans())
def test_the_quick_reading_is_the_decoders_or_none(items: list, compact: bool) -> None:
    content = _answer(items, compact)
    quick = vector.read(content, {}, Sample)
    assert quick is None or quick == _decoded(content)
    braces = any(c in "{}" for it in items for kv in it["metric"].items() for t in kv for c in t)
    numeric = all(_is_number(it["value"][1]) for it in items)
    if compact and not braces and numeric:
        assert quick is not None  # the shape the engines write is read quickly


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_label_maps_are_parsed_once_and_shared_across_answers() -> None:
    seen: dict = {}
    first = vector.read(b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"gpu":"0"},"value":[1,"2"]}]}}', seen, Sample)
    second = vector.read(b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"gpu":"0"},"value":[1,"3.5"]}]}}', seen, Sample)
    assert first == [Sample({"gpu": "0"}, 2.0)] and second == [Sample({"gpu": "0"}, 3.5)]
    assert first[0].labels is second[0].labels and len(seen) == 1


def test_other_shapes_are_left_to_the_decoder() -> None:
    item = {"metric": {"gpu": "0"}, "value": [1, "2"]}
    assert vector.read(_answer([item], True, status="error"), {}, Sample) is None
    assert vector.read(_answer([item], True, kind="matrix"), {}, Sample) is None
    assert vector.read(_answer([item], False), {}, Sample) is None  # spaces
    assert vector.read(_answer([{"value": [1, "2"], "metric": {"gpu": "0"}}], True), {}, Sample) is None  # key order
    assert vector.read(_answer([{"metric": {"gpu": 0}, "value": [1, "2"]}], True), {}, Sample) is None  # a label not a string
    assert vector.read(_answer([item], True)[:-3], {}, Sample) is None  # cut short
    # "result":[ before the data's own: the envelope's result is then not the one read
    decoy = b'{"status":"success","x":{"result":[{"metric":{},"value":[1,"9"]}]},"data":{"resultType":"vector","result":[]}}'
    assert vector.read(decoy, {}, Sample) is None
    # an envelope that is not an object (a list holding one): declined, not an error
    assert vector.read(b'[{"result":[{"metric":{},"value":[1,"2"]}]}]', {}, Sample) is None
    assert vector.read(_answer([], True), {}, Sample) == []
