"""What a rule author needs to know of a probe: its params (its pydantic Params) and the values it returns
(its `Values` model: names, types, units, whether always there), for `runbook probes NAME`.

A probe that declares no model (a third-party plugin) falls back to the "values:" section of its
docstring, which nothing checks.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from pydantic_core import PydanticUndefined

from .probe import Probe
from .values import describe as describe_values
from .values import nested_models


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
    out: dict[str, Any] = {"name": cls.name, "description": cls.description, "source": source, "params": params}
    model = getattr(cls, "Values", None)
    if model is not None:
        out["values_model"] = model.__name__
        out["values"] = describe_values(model)
        out["value_types"] = {sub.__name__: describe_values(sub) for sub in nested_models(model)}
    else:
        out["values_model"] = None
        out["values"] = []
        out["values_doc"] = values_section(cls.__doc__)
    out["units"] = {r["name"]: r["unit"] for r in out["values"] if r["unit"]}  # top-level value -> unit, as before the model
    return out


def _value_lines(rows: list[dict[str, Any]], indent: str) -> list[str]:
    width = min(max((len(r["name"]) for r in rows), default=0), 32)
    lines = []
    for r in rows:
        # a value that is not always there may be missing or null alike: rules read both as "missing"
        kind = (r["type"] if r["always"] else r["type"].removesuffix(" or null")) + (f", {r['unit']}" if r["unit"] else "")
        head = f"{indent}{r['name']:<{width}}  {kind}" + ("" if r["always"] else ", may be null")
        lines.append(head + (f": {r['description']}" if r["description"] else ""))
    return lines


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
    if info["values_model"]:
        lines.append(f"values ({info['values_model']}; rules read them as ALIAS.NAME, and `validate` checks every path):")
        lines.extend(_value_lines(info["values"], "  "))
        for name, rows in info["value_types"].items():
            lines.append("")
            lines.append(f"  {name}:")
            lines.extend(_value_lines(rows, "    "))
    elif info.get("values_doc"):
        lines.append("values (from the probe's docstring; not declared, so `validate` does not check them):")
        lines.extend(f"  {line}" for line in info["values_doc"].splitlines())
    else:
        lines.append("values: not declared (the probe has no Values model) and not documented")
    return "\n".join(lines)
