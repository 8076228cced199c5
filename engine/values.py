"""What a probe's evidence `values` hold, declared in code: one pydantic model per probe, with units.

Rules name values by path (`power.gpu_util_pct.mean`). With the model, `runbook validate` refuses a path
the probe never returns, at its FILE:LINE:COL, instead of the run saying "missing" 21 s in, which reads
like a device that does not report the value; `runbook probes NAME` prints the names, types and units.
tests/test_probe_values.py runs every built-in probe on simulated hosts of several SGLang releases and
validates what it really returned against its model, so the model cannot drift from the code.

A probe without a model (a third-party plugin that declares none) is not checked: its paths are taken
on trust, as before.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

EACH = "<each>"  # a macro's variable: one element of the list it iterates (a map's key)
INDEX = "[]"  # `x[i]` / `x["k"]`: one element of a list, one value of a map


class Values(BaseModel):
    """Base of a probe's `Values`: a key the model does not name is refused, so the model is the whole truth.

    A field with no default (`...`) is there whenever the probe returns `ok`; a field that defaults to
    None may be missing or null (a device or release that does not report it).
    """

    model_config = ConfigDict(extra="forbid")


def value(description: str = "", *, unit: str | None = None, default: Any = None) -> Any:
    """A field of a `Values` model with its unit: `power_draw_w: Stats | None = value("board power", unit="W")`.

    `default=...` makes it required (always present in `ok` evidence)."""
    return Field(default, description=description or None, json_schema_extra={"unit": unit} if unit else None)


def unit_of(field: Any) -> str | None:
    extra = getattr(field, "json_schema_extra", None)
    return extra.get("unit") if isinstance(extra, dict) else None


# ---------------------------------------------------------------------------------------------
# checking a rule's path against a model


@dataclass(frozen=True)
class PathProblem:
    index: int  # the part of the path that is wrong (0 = the first member after the alias)
    message: str


def _strip(annotation: Any) -> list[Any]:
    """The branches a value may take: Optional and unions split, Annotated and None dropped."""
    return [b for b in _all_branches(annotation) if b is not type(None)]


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


_SCALARS = {int: "a number", float: "a number", str: "a string", bool: "a boolean"}


def _kind(t: Any) -> str:
    origin = typing.get_origin(t) or t
    if origin in (list, tuple, set, frozenset):
        return "a list"
    if origin is dict:
        return "a map"
    if typing.get_origin(t) is typing.Literal:
        return "a string" if all(isinstance(a, str) for a in typing.get_args(t)) else "a value"
    return _SCALARS.get(t, "a value")


def _step(t: Any, part: str, owner: str) -> tuple[list[Any] | None, str | None]:
    """Follow one member of a path from type `t` (reached as `owner`): (the types it may have, None) or
    (None, why not). ([Any], None) stops the check: nothing more is known below (`Any`, a plain `dict`)."""
    origin = typing.get_origin(t) or t
    if t is Any or t is object:
        return [Any], None
    if _is_model(t):
        if part in (EACH, INDEX):
            return [Any], None
        fields = t.model_fields
        if part in fields:
            return _strip(fields[part].annotation) or [Any], None
        if t.model_config.get("extra") == "allow":  # open-ended keys beside the declared ones (dcgm's prof_<field>)
            return [Any], None
        return None, f"{owner} has no value '{part}'{_hint(part, sorted(fields))}"
    if origin is dict:
        args = typing.get_args(t)
        if part == EACH:  # a macro over a map iterates its keys
            return [str], None
        return (_strip(args[1]) or [Any]) if len(args) == 2 else [Any], None
    if origin in (list, tuple, set, frozenset):
        if part in (EACH, INDEX):
            args = [a for a in typing.get_args(t) if a is not Ellipsis]
            if not args or (origin is tuple and len(args) != 1):  # a bare `list`, or a tuple of mixed items
                return [Any], None
            return _strip(args[0]) or [Any], None
        return None, f"{owner} is a list, '{part}' cannot be read from it: index it, or iterate it (`.all(x, x.{part} ...)`)"
    if typing.get_origin(t) is typing.Literal or t in _SCALARS:
        if part == EACH:
            return None, f"{owner} is {_kind(t)}: it cannot be iterated"
        if part == INDEX:
            return None, f"{owner} is {_kind(t)}: it cannot be indexed"
        return None, f"{owner} is {_kind(t)}, '{part}' cannot be read from it"
    return [Any], None  # a type this check does not know: do not guess


def _hint(part: str, names: list[str], shown: int = 12) -> str:
    close = difflib.get_close_matches(part, names, n=2, cutoff=0.6)
    if close:
        return " (did you mean " + " or ".join(f"'{c}'" for c in close) + "?)"
    listed = ", ".join(names[:shown]) + (f", ... {len(names) - shown} more" if len(names) > shown else "")
    return f" (it has: {listed})"


def check_path(model: type[BaseModel], parts: list[str] | tuple[str, ...], owner: str = "the probe") -> PathProblem | None:
    """Whether `alias.<parts>` can exist in evidence of this model; a union may take any of its branches.
    `owner` names the model's root in messages (the probe: "sglang.metrics has no value 'token_usag'")."""
    current: list[Any] = [model]
    for i, part in enumerate(parts):
        following: list[Any] = []
        problems: list[str] = []
        where = owner if i == 0 else _shown(parts, i - 1)
        for t in current:
            nxt, why = _step(t, part, where)
            if nxt is None:
                problems.append(why or "")
            else:
                following.extend(nxt)
        if not following:  # a scalar iterated or indexed: point at the scalar, not at the macro's variable
            return PathProblem(i - 1 if part in (EACH, INDEX) and i > 0 else i, problems[0])
        if any(t is Any for t in following):
            return None
        current = following
    return None


def _shown(parts: list[str] | tuple[str, ...], i: int) -> str:
    """How messages name the value `parts[i]`: a field by its name, an element by what holds it."""
    if parts[i] in (EACH, INDEX):
        return f"an element of {_shown(parts, i - 1)}" if i > 0 else "an element"
    return f"'{parts[i]}'"


# ---------------------------------------------------------------------------------------------
# checking evidence against a model (the contract test, and authors of new probes)


def contract_errors(model: type[BaseModel], values: dict[str, Any], *, complete: bool) -> list[str]:
    """What in `values` the model does not allow: an undeclared key, a wrong type, a required key absent.

    `complete` is for `ok` evidence; unavailable or failed evidence may carry any part of the values.
    Strict: a number where a string is declared, or a bool where a number is, is an error."""
    try:
        (model if complete else _partial(model)).model_validate(values, strict=True)
    except ValidationError as exc:
        return [f"{'.'.join(str(p) for p in e['loc']) or '(values)'}: {e['msg']} (got {_short(e.get('input'))})" for e in exc.errors()]
    return []


_PARTIAL: dict[type[BaseModel], type[BaseModel]] = {}


def _partial(model: type[BaseModel]) -> type[BaseModel]:
    """The model with every top-level field optional: what unavailable evidence may carry."""
    if model not in _PARTIAL:
        from pydantic import create_model

        fields = {name: (f.annotation | None, None) for name, f in model.model_fields.items()}  # type: ignore[operator]
        _PARTIAL[model] = create_model(f"Partial{model.__name__}", __base__=Values, **fields)  # type: ignore[call-overload]
    return _PARTIAL[model]


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# describing a model for people (`runbook probes NAME`)


def _type_text(annotation: Any) -> str:
    branches = _strip(annotation)
    optional = len(branches) < len(_all_branches(annotation))
    parts = []
    for t in branches:
        origin = typing.get_origin(t)
        if _is_model(t):
            parts.append(t.__name__)
        elif origin in (list, tuple, set):
            args = typing.get_args(t)
            parts.append(f"list of {_type_text(args[0])}" if args else "list")
        elif origin is dict:
            args = typing.get_args(t)
            parts.append(f"map of {_type_text(args[1])}" if len(args) == 2 else "map")
        elif origin is typing.Literal:
            parts.append(" | ".join(repr(a) for a in typing.get_args(t)))
        elif t is Any:
            parts.append("any")
        else:
            parts.append({int: "int", float: "number", str: "string", bool: "bool"}.get(t, getattr(t, "__name__", str(t))))
    text = " or ".join(parts) or "null"
    return f"{text} or null" if optional else text


def _all_branches(annotation: Any) -> list[Any]:
    """A union's branches, None included, with Annotated taken off."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _all_branches(typing.get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [b for arg in typing.get_args(annotation) for b in _all_branches(arg)]
    return [annotation]


def _nested(annotation: Any) -> list[type[BaseModel]]:
    out: list[type[BaseModel]] = []
    for t in _strip(annotation):
        if _is_model(t):
            out.append(t)
        for arg in typing.get_args(t):
            out.extend(_nested(arg))
    return out


def describe(model: type[BaseModel]) -> list[dict[str, Any]]:
    """One entry per value: name, type, unit, whether always present, description; nested models follow
    as `of` (each model once, by name, so a shared `Stats` is printed once)."""
    rows: list[dict[str, Any]] = []
    for name, f in model.model_fields.items():
        rows.append({"name": name, "type": _type_text(f.annotation), "unit": unit_of(f), "always": f.is_required(),
                     "description": f.description or ""})  # fmt: skip
    return rows


def nested_models(model: type[BaseModel]) -> list[type[BaseModel]]:
    """The models a model's fields are made of, depth first, each once."""
    seen: list[type[BaseModel]] = []

    def walk(m: type[BaseModel]) -> None:
        for f in m.model_fields.values():
            for sub in _nested(f.annotation):
                if sub not in seen and sub is not m:
                    seen.append(sub)
                    walk(sub)

    walk(model)
    return seen
