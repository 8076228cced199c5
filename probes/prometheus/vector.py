"""An instant vector read straight off the answer's text, where the answer has the shape Prometheus and
VictoriaMetrics write: compact JSON, each series `{"metric":{...},"value":[t,"v"]}`.

A fleet's GPU answer holds ~8,000 series per 1,000 hosts, and the same series (the same label set) come back
in every one of ~40 answers. `json.loads` builds every series' label map again for each answer, which took most
of a 10,000-host run's reading; here each item is matched by one regular expression, its label map parsed once
per distinct text and shared by every answer that carries it, and its value read with `float`. Anything else
(spaces, another key order, a label value holding a brace, an error envelope) answers None, and the caller
reads the answer with `json_bounded` as before, so the fast path never decides what an answer means.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from typing import Any, Callable

from gpu_runbook import json_bounded

_RESULT = b'"result":['
# one series: its label map (flat: no brace inside) and the value's string; the time is not kept
_ITEM = re.compile(rb'\{"metric":(\{[^{}]*\}),"value":\[[-+0-9.eE]+,"([^"\\]*)"\]\}')
LABEL_SETS = 1 << 18  # label maps kept per client (10,000 hosts x 8 GPUs and their servers fit)


def read(content: bytes, labels: dict[bytes, dict[str, str] | None], make: Callable[[dict[str, str], float], Any]) -> list[Any] | None:
    """The answer's series as `make(labels, value)`, finite values only, or None where the answer is not a
    successful instant vector in the usual shape. `labels`: label texts already parsed (the caller's, kept
    across answers; a text that is not a map of strings is remembered as None, and answers None)."""
    start = content.find(_RESULT)
    if start < 0:
        return None
    pos = start + len(_RESULT)
    out: list[Any] = []
    match = _ITEM.match
    if content[pos : pos + 1] != b"]":
        while True:
            m = match(content, pos)
            if m is None:
                return None
            text = m.group(1)
            found = labels.get(text, False)
            if found is False:
                found = _labels(text)
                if len(labels) >= LABEL_SETS:
                    labels.clear()
                labels[text] = found
            if found is None:
                return None
            try:
                value = float(m.group(2))
            except ValueError:
                return None
            if math.isfinite(value):
                out.append(make(found, value))
            pos = m.end()
            if content[pos : pos + 1] == b",":
                pos += 1
                continue
            break
    if content[pos : pos + 1] != b"]":
        return None
    # the envelope around the series, with a mark no answer can foresee where they were: it must say a successful
    # vector, and the series read must be its data's result (not a "result" of some other member)
    mark = secrets.token_hex(8)
    try:
        envelope = json_bounded.loads(content[:start] + b'"result":"' + mark.encode() + b'"' + content[pos + 1 :])
    except ValueError:
        return None
    if not isinstance(envelope, dict) or envelope.get("status") != "success":
        return None
    data = envelope.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector" or data.get("result") != mark:
        return None
    return out


def _labels(text: bytes) -> dict[str, str] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return None
    return value
