"""Numbers for people: one rounding rule and one way to write each unit, used by every renderer.

The same value must print the same in the progress summary, the report, the TUI and the headline
text the results JSON keeps (0.9997 KV usage is "100%" everywhere, never "0.9997" in one place and
"1" in another). Three significant figures below 100, whole numbers above (1,684 tok/s, 3,051 ms:
nobody reads "3,050 ms" as rounder), thousands separated, trailing zeros dropped.
"""

from __future__ import annotations

import math
from typing import Any

SIGNIFICANT = 3

# unit name -> (scale, suffix); "share" values are fractions written as percent
UNITS: dict[str, tuple[float, str]] = {
    "": (1.0, ""),
    "count": (1.0, ""),
    "%": (1.0, "%"),
    "share": (100.0, "%"),
    "W": (1.0, " W"),
    "tok/s": (1.0, " tok/s"),
    "ms": (1.0, " ms"),
    "s": (1.0, " s"),
    "x": (1.0, "x"),
    "GB": (1.0, " GB"),
    "GB/s": (1.0, " GB/s"),
    "MHz": (1.0, " MHz"),
    "tokens": (1.0, " tokens"),
    "req": (1.0, " requests"),
    "text": (1.0, ""),  # words (a version, a backend, a reason) and yes/no: shown as they are
}


def rounded(value: float, significant: int = SIGNIFICANT) -> float:
    """`value` to `significant` figures, or to a whole number when it has more digits than that."""
    if value == 0 or not math.isfinite(value):
        return value
    digits = significant - int(math.floor(math.log10(abs(value)))) - 1
    return round(value, max(digits, 0)) if digits >= 0 else float(round(value))


def number(value: Any) -> str:
    """A plain number: booleans as yes/no, integers whole, floats to three significant figures."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        r = rounded(value)
        if abs(r) >= 10 ** (SIGNIFICANT - 1) or r == int(r):
            return f"{r:,.0f}" if abs(r) >= 1 or r == 0 else f"{r:g}"
        decimals = max(0, SIGNIFICANT - 1 - int(math.floor(math.log10(abs(r)))))
        return f"{r:,.{decimals}f}".rstrip("0").rstrip(".")
    return str(value)


def quantity(value: Any, unit: str = "") -> str:
    """A number with its unit: quantity(0.9997, "share") == "100%", quantity(236.01, "W") == "236 W"."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return number(value)
    scale, suffix = UNITS.get(unit, (1.0, f" {unit}" if unit else ""))
    scaled = value * scale if scale != 1.0 else value
    return f"{number(scaled)}{suffix}"


def share(part: float | None, whole: float | None) -> str:
    """part of whole as a percent ("39%"), or "—" when either is unknown."""
    if part is None or not whole:
        return "—"
    return quantity(part / whole, "share")


def piecewise(points: list[tuple[float, float]], x: float) -> float:
    """The piecewise-linear value of sorted (x, y) points at x, held at the end points beyond them; one point is a
    constant. A measured curve read between its measurements, without a model of it."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]
