"""JSON from a server or a load's stream, parsed with a depth bound.

A server's answer is data, and a hostile one can nest 100,000 deep: Python's decoder then raises
RecursionError (not ValueError) from deep inside a probe or the server-kind detection, and a shallower
but still deep document breaks whatever walks it next (the rules' conversion, pydantic, json.dumps).
`loads` refuses both as `TooDeep`, a ValueError, so every caller's "malformed JSON" path names it.
"""

from __future__ import annotations

import json
from typing import Any

# deeper than any answer of SGLang, vLLM or Prometheus (server_info's configuration nests 4-5 levels)
MAX_DEPTH = 64


class TooDeep(ValueError):
    """JSON nested deeper than MAX_DEPTH levels."""


def loads(data: str | bytes | bytearray, max_depth: int = MAX_DEPTH) -> Any:
    try:
        value = json.loads(data)
    except RecursionError:
        raise TooDeep(f"JSON nested deeper than {max_depth} levels (deeper than the decoder can follow)") from None
    if depth(value, max_depth) > max_depth:
        raise TooDeep(f"JSON nested deeper than {max_depth} levels")
    return value


def depth(value: Any, stop: int = MAX_DEPTH) -> int:
    """How deep lists and objects nest (a scalar is 0), counted without recursion; stops counting past `stop`."""
    if not isinstance(value, (dict, list)):
        return 0
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if level > deepest:
            deepest = level
            if deepest > stop:
                return deepest
        # only containers go on the stack: a metrics store's answer is mostly [time, "value"] pairs of scalars
        stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node) if isinstance(child, (dict, list)))
    return deepest
