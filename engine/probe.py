"""The probe contract: a named plugin with typed parameters that gathers evidence.

A probe is a class with a dotted `name`, a one-line `description`, a pydantic `Params` model, a
`Values` model of what it returns, and an async `run(ctx, params)` returning `Evidence`. It must not raise for conditions of the host (no
GPU, server down): those are `Evidence.unavailable(...)`. An exception it does raise becomes a
`failed` evidence in the runner, with the exception's text as the reason.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict

from .evidence import Evidence
from .target import Target

if TYPE_CHECKING:  # imported lazily: keep `runbook --help` fast
    import httpx

    from .gpu_backend import GpuBackend
    from .load import LoadGenerator
    from .nvml import Nvml


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass
class Context:
    """What a probe may use. Shared per run, so connection pools and GPU library init are paid once.

    `gpu` is the GPU backend (NVML and amdsmi, each opened by the probes that read it); `nvml` is its NVML, the
    seam NVIDIA probes and plugins written before AMD use. A Context made with `nvml` alone gets a backend around it."""

    target: Target
    http: "httpx.AsyncClient"
    nvml: "Nvml"
    load: "LoadGenerator | None" = None  # the load the runner drives while `under_load` probes sample
    log: Callable[[str], None] = field(default=lambda _msg: None)
    # how far a long probe got, for the run's phase line (a sweep: level, levels, concurrency)
    progress: Callable[[dict[str, Any]], None] = field(default=lambda _info: None)
    gpu: "GpuBackend | None" = None

    def __post_init__(self) -> None:
        if self.gpu is None:
            from .gpu_backend import GpuBackend  # noqa: PLC0415 - lazy: keep `runbook --help` fast

            self.gpu = GpuBackend(nvml=self.nvml)


class Probe(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams
    # What `Evidence.values` holds (a `gpu_runbook.values.Values` model): `validate` checks rules' paths
    # against it and `runbook probes NAME` prints it. None: not declared, paths are taken on trust.
    Values: ClassVar[type[BaseModel] | None] = None
    default_timeout_s: ClassVar[float] = 30.0
    # Cheap, read-only and independent of load: the runner may run it during the load's warm-up, before
    # the walk reaches its node (inventory, topology, configuration). Never for probes that drive load.
    prefetch: ClassVar[bool] = False
    # Drives its own load (a concurrency sweep): the runner shows live GPU and server readings while it runs.
    drives_load: ClassVar[bool] = False
    # What running it costs the server beyond a look: "profile" (it profiles the server) or "sweep" (it drives
    # load at several levels). A run's depth (--depth) decides which of these run; None: a look, always runs.
    needs: ClassVar[str | None] = None
    # A probe that talks to one server kind's API names it (a key of target.SERVER_KINDS) and its `role`, the
    # server-neutral job it does ("server.metrics"): a runbook that names `sglang.metrics` runs, against a vLLM
    # server, the vLLM probe of the same role, which fills the same values (Registry.for_target).
    server_kind: ClassVar[str | None] = None
    role: ClassVar[str | None] = None
    # A probe that reads one GPU vendor's library names the vendor ("nvidia", "amd") and the GPU job it does
    # (`gpu_role`, default its name): a runbook that names `gpu.sample` runs, on an AMD host, the AMD probe of the
    # job `gpu.sample`, which fills the same values (Registry.for_target).
    gpu_vendor: ClassVar[str | None] = None
    gpu_role: ClassVar[str | None] = None

    def timeout_s(self, params: BaseModel) -> float:
        """Wall-clock budget for one call; sampling probes add their window to it."""
        duration = getattr(params, "duration_s", 0) or 0
        return self.default_timeout_s + float(duration)

    @abstractmethod
    async def run(self, ctx: Context, params: Any) -> Evidence: ...
