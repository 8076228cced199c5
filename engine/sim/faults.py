"""The ways a simulated server can be made to misbehave (status codes, delays, broken bodies, cut streams).

Its own module because a scenario names them (its `server:` field) and the server obeys them, and
the server must not depend on the scenario model.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SimFaults(BaseModel):
    """Ways to make the simulated server misbehave, per path where it makes sense."""

    model_config = ConfigDict(extra="forbid")

    status_code: dict[str, int] = Field(default_factory=dict)  # path -> forced HTTP status
    delay_s: dict[str, float] = Field(default_factory=dict)  # path -> delay before answering
    malformed_json: list[str] = Field(default_factory=list)  # paths answering broken JSON
    malformed_metrics: bool = False  # /metrics answers text the exposition parser rejects
    cut_stream_after_tokens: int | None = None  # streams are dropped mid-way after N tokens
    stop_answering_after_s: float | None = None  # after N s nothing answers and nothing is generated
