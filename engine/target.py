"""What is being investigated: the server's address, its key, and where GPU readings come from.

Its own module because the probe contract (Context) and the load generator both need it, and the
load generator must not depend on the probe contract.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SecretStr


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

    def secrets(self) -> list[str]:
        """What must never be written anywhere (gpu_runbook.scrub redacts it), a server's echo of it included."""
        from .scrub import secret_forms  # noqa: PLC0415

        return secret_forms(self.api_key.get_secret_value() if self.api_key is not None else None)
