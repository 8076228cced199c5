"""JSON from a server or a load's stream, parsed with a depth bound.

A server's answer is data, and a hostile one can nest 100,000 deep: Python's decoder then raises
RecursionError (not ValueError) from deep inside a probe or the server-kind detection, and a shallower
but still deep document breaks whatever walks it next (the rules' conversion, pydantic, json.dumps).
`loads` refuses both as `TooDeep`, a ValueError, so every caller's "malformed JSON" path names it.
"""

from __future__ import annotations

import json
import re
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
    if isinstance(value, (dict, list)) and text_depth(data, max_depth) > max_depth:
        raise TooDeep(f"JSON nested deeper than {max_depth} levels")
    return value


_ONLY_BRACKETS_AND_QUOTES = bytes(set(range(256)) - set(b'"[]{}'))
_STRING = re.compile(rb'"[^"]*"')
_ONE_KIND = bytes.maketrans(b"{}", b"[]")


def text_depth(text: str | bytes | bytearray, stop: int = MAX_DEPTH) -> int:
    """`depth` of the JSON text `text` (valid JSON: json.loads took it), read off the text rather than the parsed
    value, with the bytes methods only: a metrics store's answer is ~100,000 containers, and walking them took as
    long as parsing. Escapes go first (a backslash pairs with the next character, left to right, as the decoder
    reads them), then everything but brackets and quotes, then strings; each pass then removes the innermost
    pairs, so the passes count the depth (stops counting past `stop`)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _ONLY_BRACKETS_AND_QUOTES)
    raw = _STRING.sub(b"", raw).translate(_ONE_KIND)
    deepest = 0
    while raw and deepest <= stop:
        shorter = raw.replace(b"[]", b"")
        if len(shorter) == len(raw):  # not JSON after all (the decoder took it, so never): count it as too deep
            return stop + 1
        raw, deepest = shorter, deepest + 1
    return deepest


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
