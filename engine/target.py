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

# The load generator's endpoints (LoadConfig.endpoint) and the paths they post to.
LOAD_PATHS = {"generate": "/generate", "completions": "/v1/completions"}

# A server probe's server-neutral job (Probe.role) by the second half of a family's probe name: `sglang.server`
# and `vllm.server` both read the server's configuration (`server.config`).
_ROLES = {"server": "server.config", "config": "server.config", "metrics": "server.metrics", "profile": "server.profile",
          "sweep": "server.sweep", "health": "server.health"}  # fmt: skip


def kind_title(kind: str | None) -> str:
    """A server kind in prose ("vLLM", "SGLang"; "the server" where the kind is not known)."""
    known = SERVER_KINDS.get(kind or "")
    return known.title if known is not None else "the server"


def endpoint_for(wanted: str, server_kind: str | None) -> str:
    """The endpoint the load generator drives on a server of `server_kind` (None: not asked, taken as SGLang):
    `/generate` only where the kind serves it, else the OpenAI API's completions."""
    kind = SERVER_KINDS.get(server_kind or "sglang")
    return wanted if wanted != "generate" or (kind is not None and kind.native_generate) else "completions"


def load_path(endpoint: str, server_kind: str | None = None) -> str:
    """The path the load really posts to for LoadConfig.endpoint `endpoint` on a server of `server_kind`
    ("/generate", "/v1/completions"): what every output that names the load's endpoint says."""
    used = endpoint_for(endpoint, server_kind)
    return LOAD_PATHS.get(used, "/" + used)


# The GPU probe families (NVML's `gpu.*`, amdsmi's `amd.*`) and the jobs they share: `amd.sample` does `gpu.sample`.
GPU_FAMILIES = ("gpu", "amd")
GPU_JOBS = ("inventory", "sample", "topology", "reference", "activity")


def probe_role(probe: str) -> str | None:
    """The neutral job of the probe an evidence record names: a server family's own probe (`sglang.server`,
    `vllm.metrics`) or a role name itself (`server.config`), a GPU family's (`amd.sample` does `gpu.sample`); None
    for a probe that is neither."""
    family, _, job = probe.partition(".")
    if family == "server":
        return _ROLES.get(job, probe)
    if family in GPU_FAMILIES:
        return f"gpu.{job}" if job in GPU_JOBS else None
    return _ROLES.get(job) if family in SERVER_KINDS else None


def server_named(target: dict[str, Any], server: dict[str, Any] | None = None) -> str:
    """`vLLM 0.11.0 at http://127.0.0.1:8000`: the server kind found (the server probe's own word where one ran,
    else the target's), its version where a probe read it, and its address. `target` is Target.public()."""
    server = server or {}
    kind = server.get("server_kind") if server.get("server_kind") in SERVER_KINDS else target.get("server_kind")
    title, version = kind_title(kind), server.get("version")
    words = title if not version else (f"{title} {version}" if kind in SERVER_KINDS else f"{title}, version {version}")
    url = recorded_url(target)
    return f"{words} at {url}" if url else words


class Target(BaseModel):
    """What is being investigated. The API key never leaves this object (excluded from dumps)."""

    # `sglang_url` is its name before vLLM: still accepted here (Target(sglang_url=...)), read by the property
    # below, and written beside it in results (tools that read the JSON's target.sglang_url keep working).
    server_url: str = Field("http://127.0.0.1:30000", validation_alias=AliasChoices("server_url", "sglang_url"))
    api_key: SecretStr | None = None
    label: str = ""  # e.g. "simulated: seed-rtx-pro-6000-tp8"
    simulated: bool = False
    gpu_backend: str = "nvml"  # "nvml" (the host's driver) or "simulated" (the scenario's fake NVML or amdsmi)
    dcgm_url: str | None = None  # a dcgm-exporter /metrics, when the host runs one (the simulated host may)
    # The server kind (a key of SERVER_KINDS, "unknown" when it is neither; None: not asked): it picks the probe
    # family a runbook's server probes resolve to (Registry.for_target). `server_found` says how it was decided.
    server_kind: Literal["sglang", "vllm", "unknown"] | None = None
    server_found: str = ""
    # The GPU vendor whose library answered (None: neither, or not asked): it picks the GPU probes a runbook's GPU
    # jobs resolve to (Registry.for_target). `gpu_found` says which libraries were looked for and what each said.
    gpu_vendor: Literal["nvidia", "amd"] | None = None
    gpu_found: str = ""
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
        return kind_title(self.server_kind)

    def load_endpoint(self, wanted: str) -> str:
        """The endpoint the load generator can drive on this server: `/generate` only where the kind serves it."""
        return endpoint_for(wanted, self.server_kind)

    def load_path(self, wanted: str) -> str:
        """The path the load posts to on this server ("/generate", "/v1/completions")."""
        return load_path(wanted, self.server_kind)

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

