"""The one module that imports `pynvml` (NVIDIA's nvidia-ml-py).

Everything GPU goes through `Nvml`, so the tests' fake and the simulator put a stand-in module
underneath without patching any probe: `Nvml(module=fake)`.

It also holds the error policy every GPU probe shares (nvml.md §2.9):

* init/enumeration errors (and a missing binding) make a probe `unavailable`, with the error's class
  name and a sentence a person can act on (`unavailable_reason`);
* per-query NotSupported / FunctionNotFound / NoData / NotReady / InvalidArgument / Deprecated mean
  "this device has no such value": `query` returns None, never 0;
* per-device NoPermission / GpuIsLost skip that device (`open_devices`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, TypeVar

from .gpu_library import GpuLibrary

T = TypeVar("T")

# Clock-event reason bits (nvml.h 13.x), named as nvidia-smi's clocks_event_reasons.* fields: the probes
# decode them, the simulator sets them.
CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# Errors that mean "the device or driver does not have this value": report it missing, never 0.
MISSING_ERRORS: frozenset[str] = frozenset(
    {
        "NVMLError_NotSupported",
        "NVMLError_FunctionNotFound",
        "NVMLError_NoData",
        "NVMLError_NotReady",
        "NVMLError_InvalidArgument",
        "NVMLError_Deprecated",
    }
)
# Errors that make one device unreadable while others may still answer.
SKIP_DEVICE_ERRORS: frozenset[str] = frozenset({"NVMLError_NoPermission", "NVMLError_GpuIsLost"})

_ADVICE: dict[str, str] = {
    "ImportError": "nvidia-ml-py is not installed in this Python environment: `pip install nvidia-ml-py`.",
    "NVMLError_LibraryNotFound": (
        "libnvidia-ml.so.1 could not be loaded: no NVIDIA driver is installed on this host, or it is not "
        "visible in this container (run it with the NVIDIA container toolkit, e.g. `--gpus all`)."
    ),
    "NVMLError_DriverNotLoaded": (
        "the NVIDIA kernel driver is not loaded: check `lsmod | grep nvidia` and `dmesg`, then load or reinstall it."
    ),
    "NVMLError_NoPermission": (
        "this user may not open /dev/nvidia*: run as root or grant the user access to the GPU device nodes."
    ),
    "NVMLError_LibRmVersionMismatch": (
        "the NVML library and the loaded kernel driver differ (driver upgraded without a reload): "
        "reboot or reload the nvidia kernel modules."
    ),
    "NVMLError_Uninitialized": "NVML was not initialised; this is a bug in the caller, please report it.",
    "NVMLError_GpuIsLost": "a GPU fell off the bus: check `dmesg` for Xid 79 and reset or reboot.",
}
_DEFAULT_ADVICE = "NVML could not be used; run `nvidia-smi` on the host to see whether the driver works."


def error_name(exc: BaseException) -> str:
    """`NVMLError_NotSupported`, `ImportError`...: the stable name rules and people see."""
    return type(exc).__name__


def is_nvml_error(exc: BaseException) -> bool:
    """True for any pynvml.NVMLError (real or the fake's copies, which are the same classes)."""
    return any(c.__name__ == "NVMLError" for c in type(exc).__mro__)


def is_missing(exc: BaseException) -> bool:
    return is_nvml_error(exc) and error_name(exc) in MISSING_ERRORS


def unavailable_reason(exc: BaseException) -> str:
    """`NVMLError_LibraryNotFound: NVML Shared Library Not Found. <what to do>`."""
    name = error_name(exc)
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - str() of an NVMLError may itself call NVML
        text = ""
    advice = _ADVICE.get(name, _DEFAULT_ADVICE)
    return f"{name}: {text.rstrip('.')}. {advice}" if text else f"{name}: {advice}"


def is_unavailable_error(exc: BaseException) -> bool:
    """Errors opening NVML that describe the host, not a bug: these become `unavailable` evidence."""
    return is_nvml_error(exc) or isinstance(exc, (ImportError, OSError))


def query(fn: Callable[..., T], *args: Any, default: Any = None) -> T | Any:
    """Call an NVML function; a missing value (NotSupported, FunctionNotFound...) gives `default`."""
    try:
        return fn(*args)
    except Exception as exc:
        if is_missing(exc):
            return default
        raise


@dataclass(frozen=True)
class Device:
    index: int
    handle: Any


@dataclass
class Devices:
    """The devices NVML let us open, and the indices it refused (with the error's name)."""

    devices: list[Device]
    skipped: dict[int, str]


def open_devices(lib: Any) -> Devices:
    """Handles for every device; NoPermission / GpuIsLost on one index skips it, not the whole run."""
    devices: list[Device] = []
    skipped: dict[int, str] = {}
    for i in range(lib.nvmlDeviceGetCount()):
        try:
            devices.append(Device(i, lib.nvmlDeviceGetHandleByIndex(i)))
        except Exception as exc:
            if is_nvml_error(exc) and error_name(exc) in SKIP_DEVICE_ERRORS:
                skipped[i] = error_name(exc)
                continue
            raise
    return Devices(devices, skipped)


class Nvml(GpuLibrary):
    """pynvml, imported and initialised once per process (or the simulator's stand-in module). Initialising raises
    the NVMLError NVML raised (LibraryNotFound on a GPU-less host); importing, ImportError (nvidia-ml-py missing)."""

    def _import(self) -> ModuleType:
        import pynvml  # noqa: PLC0415 - lazy on purpose

        return pynvml

    def _init(self, lib: Any) -> None:
        lib.nvmlInit()

    def _shut_down(self, lib: Any) -> None:
        lib.nvmlShutdown()
