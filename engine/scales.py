"""Honest sparklines: a fixed scale where the quantity has a natural range, a minimum span otherwise.

Min-max scaling lies: a constant 100% utilization or a full KV cache draws as the lowest bar, and a
1% power wiggle (235-237 W) as a full swing. Here utilization draws on 0-100, KV usage on 0-1, power
on 0-limit, running requests on 0-cap; anything else on its own range widened to at least
`MIN_SPAN` of its level. A flat series draws at its level and is described as "flat at 100%".
Shared by the TUI and the report, so both draw the same picture of the same numbers.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

from .numbers import UNITS, quantity

SPARK = "▁▂▃▄▅▆▇█"
MIN_SPAN = 0.2  # a free-scale series spans at least 20% of its level: a 1% wiggle stays a wiggle
FLAT = 0.005  # a relative spread below this is "flat"


@dataclass(frozen=True)
class Scale:
    low: float
    high: float
    unit: str = ""  # numbers.quantity's unit for the description
    fixed: bool = False  # a natural range, not the data's own


def scale_for(title: str, unit: str = "", limit: float | None = None, cap: float | None = None) -> Scale | None:
    """The natural range of a series from what it measures, or None (then `free_scale` applies).

    `limit` is the power limit for a power series, `cap` the running-request cap for a running one.
    """
    words = f"{title} {unit}".lower()
    if unit == "%" or "utilis" in words or "utiliz" in words:
        return Scale(0.0, 100.0, "%", True)
    if "kv" in words and ("usage" in words or "token" in words):
        return Scale(0.0, 1.0, "share", True)
    if unit == "W" and limit:
        return Scale(0.0, float(limit), "W", True)
    if "running" in words and cap:
        return Scale(0.0, float(cap), "", True)
    return None


def free_scale(values: list[float], unit: str = "") -> Scale:
    """The data's own range, widened downwards to at least MIN_SPAN of its level (never below zero
    for data that is not negative): the top is the series' maximum, so a flat series draws at the
    top and a 1% wiggle as a 1% wiggle."""
    low, high = min(values), max(values)
    level = max(abs(low), abs(high))
    span = max(high - low, MIN_SPAN * level, 1e-9)
    lo = high - span
    if low >= 0 > lo:
        lo = 0.0
    return Scale(lo, max(high, lo + 1e-9), unit, False)


def sparkline(values: list[float], scale: Scale | None = None, width: int = 40) -> str:
    """One character per value (resampled to `width`), placed on `scale` (free_scale when None)."""
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]  # a probe's inf/nan must not break a renderer
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [values[int(i * step)] for i in range(width)]
    scale = scale or free_scale(values)
    span = (scale.high - scale.low) or 1.0
    top = len(SPARK) - 1
    return "".join(SPARK[max(0, min(top, round((v - scale.low) / span * top)))] for v in values)


def is_flat(values: list[float]) -> bool:
    if not values:
        return False
    low, high = min(values), max(values)
    level = max(abs(low), abs(high))
    return (high - low) <= FLAT * level if level else high == low


def describe(values: list[float], scale: Scale | None = None, unit: str = "") -> str:
    """The words beside a sparkline: "flat at 100%", or "min 235 W, max 237 W (scale 0-600 W)"."""
    if not values:
        return "no samples"
    unit = scale.unit if scale is not None and scale.unit else unit
    if is_flat(values):
        return f"flat at {quantity(sum(values) / len(values), unit)}"
    text = f"min {quantity(min(values), unit)}, max {quantity(max(values), unit)}"
    if scale is not None and scale.fixed:
        suffix = UNITS.get(unit, (1.0, ""))[1]  # the unit once: "0-600 W"
        text += f" (scale {quantity(scale.low, unit).removesuffix(suffix)}-{quantity(scale.high, unit)})"
    return text


def series_scale(title: str, unit: str, values: list[float], limit: float | None = None, cap: float | None = None) -> Scale:
    """The scale a renderer draws a series on: natural when known, else the widened free one."""
    return scale_for(title, unit, limit, cap) or free_scale(values, unit)
