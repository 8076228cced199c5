"""The GPU backend a run's probes read: NVML (NVIDIA), amdsmi (AMD), or neither, chosen by what the host has.

A runbook names GPU jobs (`gpu.sample`); the registry runs the probe of that job for the vendor found
(`Registry.for_target`), as it does for server roles. `detect` looks for the libraries in order, NVML then amdsmi,
and says in words what it found for each, so a run on a host with neither says which libraries it looked for and
goes on (every GPU probe then reports NVML's own reason, as before there was a choice).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .amdsmi_lib import Amdsmi, AmdsmiUnavailable
from .amdsmi_lib import error_name as amd_error_name
from .nvml import Nvml
from .nvml import error_name as nvml_error_name

Vendor = Literal["nvidia", "amd"]
VENDOR_TITLES: dict[str, str] = {"nvidia": "NVIDIA", "amd": "AMD"}
DEFAULT_VENDOR: Vendor = "nvidia"  # whose probes a GPU job runs where no library answered: NVML's reasons say more


def vendor_title(vendor: str | None) -> str:
    return VENDOR_TITLES.get(vendor or "", "unknown")


@dataclass
class GpuBackend:
    """The libraries a run's GPU probes read: each opened lazily, once, by the probes that need it."""

    nvml: Nvml = field(default_factory=Nvml)
    amdsmi: Amdsmi = field(default_factory=Amdsmi)

    def shutdown(self) -> None:
        for lib in (self.nvml, self.amdsmi):
            try:
                lib.shutdown()
            except Exception:  # noqa: BLE001 - best effort at the end of a run
                pass


@dataclass(frozen=True)
class Found:
    vendor: Vendor | None
    words: str  # what was found, for the run's header and the report


def detect(backend: GpuBackend) -> Found:
    """NVML first, then amdsmi; the first that opens and lists a GPU decides. Never raises."""
    try:
        count = int(backend.nvml.ensure_init().nvmlDeviceGetCount())
        if count > 0:
            return Found("nvidia", f"{count} NVIDIA GPU{'s' if count != 1 else ''} through NVML")
        nvml_said = "no GPU"
    except Exception as exc:  # noqa: BLE001 - any failure is what was found
        nvml_said = nvml_error_name(exc)
    try:
        lib = backend.amdsmi.ensure_init()
        count = len(lib.amdsmi_get_processor_handles())
        if count > 0:
            return Found("amd", f"{count} AMD GPU{'s' if count != 1 else ''} through amdsmi (NVML: {nvml_said})")
        amd_said = "no GPU"
    except Exception as exc:  # noqa: BLE001
        amd_said = exc.found if isinstance(exc, AmdsmiUnavailable) else amd_error_name(exc)
    return Found(None, f"no GPU library answered; looked for NVML ({nvml_said}) and amdsmi ({amd_said})")
