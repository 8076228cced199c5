"""What a probe returns: values for the rules, a line for people, typed blocks for renderers.

Probes know nothing of rules or rendering. They fill an `Evidence`; the rules read `values`, the
TUI and the report decide how `blocks` look (Robusta-style findings).
"""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class ProbeStatus(str, Enum):
    ok = "ok"
    unavailable = "unavailable"  # the thing to measure is not there (no GPU, no /metrics, server down)
    failed = "failed"  # the probe itself broke (bad data, timeout, exception)


class Table(BaseModel):
    """Rows for a renderer to show as a table; cells are plain JSON values."""

    kind: Literal["table"] = "table"
    title: str
    columns: list[str]
    rows: list[list[Any]] = Field(default_factory=list)


class Series(BaseModel):
    """A time series (seconds since the probe started, value); renderers draw sparklines or charts.

    Keep it bounded: probes downsample before they return (see `downsample`).
    """

    kind: Literal["series"] = "series"
    title: str
    unit: str = ""
    label: str = ""
    points: list[tuple[float, float]] = Field(default_factory=list)


class Bars(BaseModel):
    """Values against a maximum, one bar each (per-GPU power against its limit)."""

    kind: Literal["bars"] = "bars"
    title: str
    unit: str = ""
    bars: list[tuple[str, float, float]] = Field(default_factory=list)  # (label, value, max)


class Breakdown(BaseModel):
    """Shares stacked into one bar per row (a decode step per rank): where the time goes, as a picture."""

    kind: Literal["breakdown"] = "breakdown"
    title: str
    segments: list[str]  # stack order, left to right
    rows: list[tuple[str, list[float]]] = Field(default_factory=list)  # (label, share per segment, 0..1)


Block = Annotated[Union[Table, Series, Bars, Breakdown], Field(discriminator="kind")]


def without_status(summary: str, status: str) -> str:
    """The summary without the "unavailable: " / "failed: " that `Evidence.unavailable` and `.failed`
    put first, for renderers that print the status next to it anyway."""
    return summary.removeprefix(f"{status}: ")


class Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: ProbeStatus = ProbeStatus.ok
    reason: str | None = None
    summary: str = ""
    values: dict[str, Any] = Field(default_factory=dict)
    blocks: list[Block] = Field(default_factory=list)
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def unavailable(cls, reason: str, **kw: Any) -> "Evidence":
        return cls(status=ProbeStatus.unavailable, reason=reason, summary=kw.pop("summary", f"unavailable: {reason}"), **kw)

    @classmethod
    def failed(cls, reason: str, **kw: Any) -> "Evidence":
        return cls(status=ProbeStatus.failed, reason=reason, summary=kw.pop("summary", f"failed: {reason}"), **kw)

    @property
    def ok(self) -> bool:
        return self.status is ProbeStatus.ok


def downsample(points: list[tuple[float, float]], limit: int = 120) -> list[tuple[float, float]]:
    """Keep at most `limit` points by averaging neighbours, so evidence stays small whatever the rate."""
    if len(points) <= limit:
        return list(points)
    step = len(points) / limit
    out = []
    for i in range(limit):
        chunk = points[int(i * step) : int((i + 1) * step)] or [points[int(i * step)]]
        out.append((chunk[0][0], sum(p[1] for p in chunk) / len(chunk)))
    return out


def scrubbed(evidence: Evidence, secrets: list[str] | tuple[str, ...] = ()) -> Evidence:
    """`evidence` with control characters stripped from, and `secrets` redacted in, every string it holds."""
    from .scrub import scrub_tree  # noqa: PLC0415

    data = evidence.model_dump()
    clean = scrub_tree(data, secrets)
    return evidence if clean == data else Evidence.model_validate(clean)
