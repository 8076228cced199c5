"""What a rule author needs to know of a probe: its params (from its pydantic Params) and the values it returns.

The values come from the "values:" section of the probe's docstring, as written by its author: probes
do not declare their values in code yet (issue 14 item 6), so this is documentation, not a checked
contract. Units are read off the value names' suffixes (`power_draw_w`, `itl_s`, ...).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from pydantic_core import PydanticUndefined

from .probe import Probe

# name suffix -> unit, longest first so `_ms` wins over `_s`
UNITS = {
    "_per_s": "per second",
    "_bytes": "bytes",
    "_gbps": "GB/s",
    "_mhz": "MHz",
    "_mib": "MiB",
    "_pct": "%",
    "_ms": "ms",
    "_w": "W",
    "_c": "°C",
    "_s": "s",
}


def unit_of(name: str) -> str | None:
    return next((unit for suffix, unit in UNITS.items() if name.endswith(suffix)), None)


def values_section(doc: str | None) -> str:
    """The docstring from its "values:" line (any case) on, indentation normalised; '' when it has none."""
    text = inspect.cleandoc(doc or "")
    match = re.search(r"^[ \t]*values\b[^:\n]*:", text, flags=re.I | re.M)
    if not match:
        return ""
    return inspect.cleandoc(text[match.end():].strip("\n"))


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    return text or str(annotation).replace("typing.", "")


def describe(cls: type[Probe], source: str = "") -> dict[str, Any]:
    params = []
    for name, info in cls.Params.model_fields.items():
        default = None if info.default is PydanticUndefined else info.default
        if info.default_factory is not None:
            default = info.default_factory()
        params.append({
            "name": name,
            "type": _type_name(info.annotation),
            "default": default,
            "required": info.is_required(),
            "description": info.description or "",
        })  # fmt: skip
    values = values_section(cls.__doc__)
    names = sorted(set(re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", values)))
    units = {n: u for n in names if (u := unit_of(n))}
    return {"name": cls.name, "description": cls.description, "source": source, "params": params, "values": values, "units": units}


def render(info: dict[str, Any]) -> str:
    lines = [f"{info['name']}: {info['description']}"]
    if info["source"]:
        lines.append(f"from: {info['source']}")
    lines.append("")
    if info["params"]:
        lines.append("params (`with:`):")
        for p in info["params"]:
            default = "required" if p["required"] else f"default {p['default']!r}"
            lines.append(f"  {p['name']}: {p['type']}, {default}" + (f": {p['description']}" if p["description"] else ""))
    else:
        lines.append("params: none")
    lines.append("")
    if info["values"]:
        lines.append("values (from the probe's docstring):")
        lines.extend(f"  {line}" for line in info["values"].splitlines())
    else:
        lines.append("values: not documented (the probe's docstring has no \"values:\" section)")
    if info["units"]:
        lines.append("")
        lines.append("units (from the names): " + ", ".join(f"{n} {u}" for n, u in info["units"].items()))
    return "\n".join(lines)
