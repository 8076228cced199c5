"""What is being investigated: the server's address, its key, and where GPU readings come from.

Its own module because the probe contract (Context) and the load generator both need it, and the
load generator must not depend on the probe contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr


@dataclass(frozen=True)
class ServerKind:
    """What the engine needs to know of a server kind: its name in prose, and whether it serves SGLang's native
    `/generate` (else the load goes through the OpenAI API's `/v1/completions`). Everything else a server kind
    says, it says through its probe family (probes/<kind>*.py)."""

    title: str
    native_generate: bool


SERVER_KINDS: dict[str, ServerKind] = {
    "sglang": ServerKind("SGLang", native_generate=True),
    "vllm": ServerKind("vLLM", native_generate=False),
}


class Target(BaseModel):
    """What is being investigated. The API key never leaves this object (excluded from dumps)."""

    # `sglang_url` is its name before vLLM: still accepted here (Target(sglang_url=...)), read by the property
    # below, and written beside it in results (tools that read the JSON's target.sglang_url keep working).
    server_url: str = Field("http://127.0.0.1:30000", validation_alias=AliasChoices("server_url", "sglang_url"))
    api_key: SecretStr | None = None
    label: str = ""  # e.g. "simulated: seed-rtx-pro-6000-tp8"
    simulated: bool = False
    gpu_backend: str = "nvml"  # "nvml" (the host's driver) or "simulated" (the scenario's fake NVML)
    dcgm_url: str | None = None  # a dcgm-exporter /metrics, when the host runs one (the simulated host may)
    # The server kind (a key of SERVER_KINDS, "unknown" when it is neither; None: not asked): it picks the probe
    # family a runbook's server probes resolve to (Registry.for_target). `server_found` says how it was decided.
    server_kind: Literal["sglang", "vllm", "unknown"] | None = None
    server_found: str = ""
    # Where gpu.reference looks for this host's own power curve (`runbook calibrate`): a file or a directory; None:
    # nowhere. A real run looks in the user's directory, a simulated one only where a file is named.
    calibration: str | None = None

    @property
    def sglang_url(self) -> str:
        """Deprecated: `server_url` (plugins written before vLLM read this name)."""
        return self.server_url

    @property
    def server_title(self) -> str:
        """The server kind in prose ("vLLM", "SGLang"; "the server" where the kind is not known)."""
        kind = SERVER_KINDS.get(self.server_kind or "")
        return kind.title if kind is not None else "the server"

    def load_endpoint(self, wanted: str) -> str:
        """The endpoint the load generator can drive on this server: `/generate` only where the kind serves it."""
        kind = SERVER_KINDS.get(self.server_kind or "sglang")
        return wanted if wanted != "generate" or (kind is not None and kind.native_generate) else "completions"

    def public(self) -> dict[str, Any]:
        out = self.model_dump(exclude={"api_key"}, mode="json")
        out["sglang_url"] = out["server_url"]  # the JSON's name before vLLM, kept for the tools that read it
        return out

    def auth_headers(self) -> dict[str, str]:
        if self.api_key is None or not self.api_key.get_secret_value():
            return {}
        return {"Authorization": f"Bearer {self.api_key.get_secret_value()}"}

    def secrets(self) -> list[str]:
        """What must never be written anywhere (gpu_runbook.scrub redacts it), a server's echo of it included."""
        from .scrub import secret_forms  # noqa: PLC0415

        return secret_forms(self.api_key.get_secret_value() if self.api_key is not None else None)


def recorded_url(target: dict[str, Any]) -> str:
    """The server address of a results file's `target`, whichever name it was recorded under."""
    return str(target.get("server_url") or target.get("sglang_url") or "")

