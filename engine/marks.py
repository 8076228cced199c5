"""Verdict marks shared by every renderer: a symbol and a word, so a verdict reads without colour."""

from __future__ import annotations

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


def sparkline(values: list[float], width: int = 40) -> str:
    """A sparkline on the series' own range widened to a minimum span (gpu_runbook.scales): a constant
    series draws at its level, a 1% wiggle stays small. Series with a natural range (utilization,
    KV usage, power against its limit) should use gpu_runbook.scales with that range instead."""
    from .scales import sparkline as scaled  # noqa: PLC0415 - scales imports numbers, not marks

    return scaled(values, None, width)
