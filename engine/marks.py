"""Verdict marks shared by every renderer: a symbol and a word, so a verdict reads without colour."""

from __future__ import annotations

import math

SYMBOLS = {
    "pending": "·",
    "running": "…",
    "confirmed": "●",
    "refuted": "○",
    "inconclusive": "?",
    "skipped": "-",
    "error": "!",
}

COLOURS = {  # Rich/Textual colour names; renderers without colour ignore them
    "pending": "grey50",
    "running": "cyan",
    "confirmed": "red",
    "refuted": "green",
    "inconclusive": "yellow",
    "skipped": "grey50",
    "error": "magenta",
}


def mark(verdict: str) -> str:
    key = getattr(verdict, "value", verdict)
    return SYMBOLS.get(key, "?")


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 40) -> str:
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]  # a probe's inf/nan must not break the report
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [values[int(i * step)] for i in range(width)]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((v - low) / span * (len(SPARK) - 1)))] for v in values)
