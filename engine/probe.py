"""The probe contract: a named plugin with typed parameters that gathers evidence.

A probe is a class with a dotted `name`, a one-line `description`, a pydantic `Params` model and an
async `run(ctx, params)` returning `Evidence`. It must not raise for conditions of the host (no
GPU, server down): those are `Evidence.unavailable(...)`. An exception it does raise becomes a
`failed` evidence in the runner, with the exception's text as the reason.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, SecretStr

from .evidence import Evidence

if TYPE_CHECKING:  # imported lazily: keep `runbook --help` fast
    import httpx

    from .load import LoadGenerator
    from .nvml import Nvml


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Target(BaseModel):
    """What is being investigated. The API key never leaves this object (excluded from dumps)."""

    sglang_url: str = "http://127.0.0.1:30000"
    api_key: SecretStr | None = None
    label: str = ""  # e.g. "simulated: seed-rtx-pro-6000-tp8"
    simulated: bool = False
    gpu_backend: str = "nvml"  # "nvml" (the host's driver) or "simulated" (the scenario's fake NVML)
    dcgm_url: str | None = None  # a dcgm-exporter /metrics, when the host runs one (the simulated host may)

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude={"api_key"}, mode="json")

    def auth_headers(self) -> dict[str, str]:
        if self.api_key is None or not self.api_key.get_secret_value():
            return {}
        return {"Authorization": f"Bearer {self.api_key.get_secret_value()}"}


@dataclass
class Context:
    """What a probe may use. Shared per run, so connection pools and NVML init are paid once."""

    target: Target
    http: "httpx.AsyncClient"
    nvml: "Nvml"
    load: "LoadGenerator | None" = None  # the load the runner drives while `under_load` probes sample
    log: Callable[[str], None] = field(default=lambda _msg: None)


class Probe(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams
    default_timeout_s: ClassVar[float] = 30.0
    # Cheap, read-only and independent of load: the runner may run it during the load's warm-up, before
    # the walk reaches its node (inventory, topology, configuration). Never for probes that drive load.
    prefetch: ClassVar[bool] = False
    # Drives its own load (a concurrency sweep): the runner shows live GPU and server readings while it runs.
    drives_load: ClassVar[bool] = False

    def timeout_s(self, params: BaseModel) -> float:
        """Wall-clock budget for one call; sampling probes add their window to it."""
        duration = getattr(params, "duration_s", 0) or 0
        return self.default_timeout_s + float(duration)

    @abstractmethod
    async def run(self, ctx: Context, params: Any) -> Evidence: ...
