"""Params set with `--set` have ranges: a value is refused before the run when a probe it feeds would refuse
it (each probe's `Params` declares its bounds: finite, positive, an upper limit a person would use) or when
it sets the load's warm-up or steady-state wait past `MAX_WAIT_S`. `--set sample_seconds=1e9` is a usage
error naming the bound, not a run that never ends."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .loader import LoadedRunbook
from .model import PARAM_REF, resolve_refs
from .registry import Registry

MAX_WAIT_S = 3600.0  # the load's warm-up and steady-state wait


def _refs(value: Any) -> set[str]:
    if isinstance(value, str):
        m = PARAM_REF.match(value.strip())
        return {m.group(1)} if m else set()
    if isinstance(value, list):
        return set().union(*(_refs(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return set().union(*(_refs(v) for v in value.values())) if value else set()
    return set()


def check(loaded: LoadedRunbook, registry: Registry, params: dict[str, Any], changed: set[str]) -> None:
    """Raise ValueError naming the param, the probe field it feeds and the bound, for the first value in
    `changed` that a probe call or the load would refuse."""
    if not changed:
        return
    for hyp, _ in loaded.runbook.walk():
        for call in hyp.probes.values():
            used = _refs(call.with_) & changed
            probe = registry.lookup(call.probe)
            if not used or probe is None:
                continue
            try:
                probe.Params.model_validate(resolve_refs(call.with_, params))
            except ValidationError as exc:
                err = exc.errors()[0]
                field = str(err["loc"][0]) if err["loc"] else ""
                feeding = _refs(call.with_.get(field)) & changed if field in call.with_ else set()
                name = sorted(feeding or used)[0]
                raise ValueError(f"param '{name}' = {params[name]!r}: {call.probe} {field}: {err['msg']}") from None
    spec = loaded.runbook.load
    if spec is None:
        return
    for field in ("warmup_s", "steady_s"):
        raw = getattr(spec, field)
        used = _refs(raw) & changed
        if used:
            value = resolve_refs(raw, params)
            if isinstance(value, (int, float)) and not 0 <= float(value) <= MAX_WAIT_S:
                name = sorted(used)[0]
                raise ValueError(f"param '{name}' = {value!r}: the load's {field} must be between 0 and {MAX_WAIT_S:g} s (limit: MAX_WAIT_S)")
