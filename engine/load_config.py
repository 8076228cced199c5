"""A runbook's `load:` section, params substituted, becomes the load generator's config.

Its own module because both the loader (checking a runbook with its params' defaults) and the runner
(driving the load) build one, and the loader must not depend on the runner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .model import truthy

if TYPE_CHECKING:
    from .load import LoadConfig


class LoadConfigError(ValueError):
    """A load field the config refuses; `field` names it (None when the error is not one field's)."""

    def __init__(self, message: str, field: str | None) -> None:
        super().__init__(message)
        self.field = field


def load_config(resolved: dict[str, Any]) -> "LoadConfig":
    """The load generator's config from a runbook's `load:` with params substituted. Raises LoadConfigError."""
    from .load import LoadConfig  # noqa: PLC0415 - aiohttp stays unimported for `runbook validate` and --help

    try:
        float(resolved.get("warmup_s") or 0.0)
        return LoadConfig(
            endpoint=resolved["endpoint"],
            concurrency=int(resolved["concurrency"]),
            input_len=int(resolved["input_len"]),
            output_len=int(resolved["output_len"]),
            output_range_ratio=float(resolved.get("output_range_ratio", 1.0)),
            ignore_eos=truthy(resolved["ignore_eos"]),
            temperature=float(resolved["temperature"]),
            max_requests=int(resolved["max_requests"]) if resolved.get("max_requests") not in (None, "") else None,
        )
    except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        first = exc.errors()[0] if hasattr(exc, "errors") else None
        field = str(first["loc"][0]) if first and first.get("loc") else None
        detail = f"{field}: {first['msg']}" if field else str(exc).splitlines()[0]
        raise LoadConfigError(f"load: {detail}", field) from None
