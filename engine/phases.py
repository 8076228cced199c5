"""The run's phases in words: one line per phase, with its numbers, the same in every renderer.

A run that waits (for streams to open, the server to admit, the steady state, a profile) must say
what it waits for and how far it got, or a person cannot tell a slow server from a hung tool. The
runner fills the numbers; this module only writes them out.
"""

from __future__ import annotations

from typing import Any

from .numbers import quantity

# name -> what a person reads before the numbers
LABELS = {
    "connecting": "connecting",
    "admitting": "admitting",
    "steady": "waiting for the steady state",
    "warm-up": "warm-up",
    "sampling": "sampling",
    "profiling": "profiling",
    "sweeping": "sweeping",
    "probing": "probing",
    "finishing": "finishing",
}

# the phases in which nothing is measured yet: no countdown of the sampling window belongs here
BEFORE_WINDOW = ("connecting", "admitting", "steady", "warm-up")


def _s(value: Any) -> str:
    """Seconds: whole from 10 s, tenths below (a 1.5 s window is not "2 s")."""
    if value is None:
        return quantity(None, "s")
    v = float(value)
    return quantity(round(v) if v >= 10 else round(v, 1), "s")


def _load(n: dict[str, Any]) -> str:
    """`1,424 streaming, 624 queued of 2,048 requests` (client-side counts of the load we drive)."""
    return f"{quantity(n.get('running', 0), 'count')} streaming, {quantity(n.get('queued', 0), 'count')} queued of {quantity(n.get('of', 0), 'req')}"


def text(name: str, n: dict[str, Any]) -> str:
    """The phase's line, e.g. `admitting: 1,424 streaming, 624 queued of 2,048 requests (12 s, up to 180 s)`."""
    label = LABELS.get(name, name)
    elapsed = n.get("elapsed_s")
    if name == "connecting":
        if "of" in n:
            return f"{label}: opening {quantity(n['of'], 'req')}: {quantity(n.get('open', 0), 'count')} open, {quantity(n.get('running', 0), 'count')} streaming ({_s(elapsed)})"
        return f"{label} to {n.get('target', 'the server')} ({_s(elapsed)})"
    if name == "admitting":
        return f"{label}: {_load(n)} ({_s(elapsed)}, up to {_s(n.get('limit_s'))})"
    if name == "steady":
        return f"{label} (the first requests finish and are replaced): {_s(elapsed)} of at most {_s(n.get('limit_s'))}; {_load(n)}"
    if name == "warm-up":
        return f"{label}: {_s(n.get('left_s'))} left of {_s(n.get('of_s'))}; {_load(n)}"
    if name == "sampling":
        where = f"under {quantity(n['of'], 'req')}, {quantity(n.get('tok_per_s', 0.0), 'tok/s')}" if n.get("of") else "the server's own traffic"
        return f"{label} {where}: {_s(n.get('left_s'))} left of {_s(n.get('of_s'))}"
    if name == "profiling":
        return f"{label} the decode step: {_s(elapsed)} (waits up to {_s(n.get('limit_s'))} for every rank's trace)"
    if name == "sweeping":
        return f"{label}: level {n.get('level', '?')} of {n.get('levels', '?')} (concurrency {quantity(n.get('concurrency'), 'count')}), {_s(elapsed)} in"
    if name in ("probing", "finishing"):
        probes = n.get("probes") or []
        shown = ", ".join(probes[:4]) + (f" and {len(probes) - 4} more" if len(probes) > 4 else "")
        if not shown:
            return f"{label} ({_s(elapsed)})" if name == "probing" else f"{label}: deciding the verdicts ({_s(elapsed)})"
        return f"{label}: {shown} ({_s(elapsed)})"
    return f"{label} ({_s(elapsed)})"
