"""The one module that imports `amdsmi` (AMD's Python interface to libamd_smi), as `nvml.py` is for pynvml.

amdsmi is never a dependency: the copy on PyPI must match the host's ROCm and ROCm's own install replaces it
(amd.md §1.1). Without ROCm, `import amdsmi` prints two lines to *stdout* and raises KeyError, not ImportError
(amdsmi 7.0.2 `amdsmi_wrapper.py:203-211`, read in the wheel), and a wheel newer than the library fails with
AttributeError. So the import is lazy, guarded against any exception, and its output is captured and reported,
never printed.

Everything AMD goes through `Amdsmi`, so the simulator puts a stand-in module underneath (`Amdsmi(module=fake)`).
The error policy every AMD probe shares (amdsmi 7.0.2 `amdsmi_exception.py`, status codes `amdsmi_wrapper.py:337-382`):

* import / init / enumeration errors make a probe `unavailable`, with what was found and what to do;
* the string "N/A" (amdsmi's `_validate_if_max_uint`, `amdsmi_interface.py:751`) and the statuses NOT_SUPPORTED,
  NOT_YET_IMPLEMENTED and NO_DATA mean "this device has no such value": None, never 0;
* NO_PERM on one device skips that device.
"""

from __future__ import annotations

import contextlib
import io
from types import ModuleType
from typing import Any

from .gpu_library import GpuLibrary

# amdsmi_status_t codes (amdsmi 7.0.2 amdsmi_wrapper.py:337-382), named as the library names them.
STATUS_NAMES: dict[int, str] = {
    1: "INVAL", 2: "NOT_SUPPORTED", 3: "NOT_YET_IMPLEMENTED", 4: "FAIL_LOAD_MODULE", 5: "FAIL_LOAD_SYMBOL",
    6: "DRM_ERROR", 7: "API_FAILED", 8: "TIMEOUT", 9: "RETRY", 10: "NO_PERM", 11: "INTERRUPT", 12: "IO",
    14: "FILE_ERROR", 15: "OUT_OF_RESOURCES", 17: "INPUT_OUT_OF_BOUNDS", 18: "INIT_ERROR", 30: "BUSY",
    31: "NOT_FOUND", 32: "NOT_INIT", 34: "DRIVER_NOT_LOADED", 40: "NO_DATA", 43: "UNEXPECTED_DATA",
}  # fmt: skip
# Statuses that mean "the device or driver does not have this value".
MISSING_STATUSES: frozenset[str] = frozenset({"AMDSMI_STATUS_NOT_SUPPORTED", "AMDSMI_STATUS_NOT_YET_IMPLEMENTED", "AMDSMI_STATUS_NO_DATA"})
SKIP_DEVICE_STATUSES: frozenset[str] = frozenset({"AMDSMI_STATUS_NO_PERM"})
NA = "N/A"  # what amdsmi returns for a value the device does not report

_ADVICE: dict[str, str] = {
    "ModuleNotFoundError": "amdsmi is not installed in this Python environment (ROCm installs it from /opt/rocm/share/amd_smi).",
    "KeyError": "libamd_smi.so could not be loaded: ROCm's amd-smi-lib is not installed, or not on ROCM_PATH / LD_LIBRARY_PATH.",
    "AttributeError": "this amdsmi does not match the host's libamd_smi.so (a PyPI wheel newer than ROCm): use ROCm's own copy.",
    "AMDSMI_STATUS_DRIVER_NOT_LOADED": "the amdgpu kernel driver is not loaded: check `lsmod | grep amdgpu` and `dmesg`.",
    "AMDSMI_STATUS_NO_PERM": "this user may not open /dev/kfd or /dev/dri: add it to the render and video groups, or run as root.",
    "AMDSMI_STATUS_INIT_ERROR": "amdsmi could not initialise: run `amd-smi list` on the host to see whether the driver works.",
}
_DEFAULT_ADVICE = "amdsmi could not be used; run `amd-smi list` on the host to see whether the driver works."


class AmdsmiUnavailable(ImportError):
    """`import amdsmi` failed (any exception) or printed: `found` says what happened, in words."""

    def __init__(self, cause: str, found: str, printed: str = "") -> None:
        super().__init__(found)
        self.cause = cause  # the exception's class name: ModuleNotFoundError, KeyError, AttributeError...
        self.found = found
        self.printed = printed


def import_amdsmi() -> ModuleType:
    """`import amdsmi` with its stdout captured; any exception becomes AmdsmiUnavailable saying what was found."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            import amdsmi  # noqa: PLC0415 - lazy on purpose: never a dependency

    except Exception as exc:  # noqa: BLE001 - KeyError without ROCm, AttributeError on a mismatched lib, anything else
        said = " / ".join(line.strip() for line in printed.getvalue().splitlines() if line.strip())
        if isinstance(exc, ModuleNotFoundError) and exc.name == "amdsmi":
            found = "not installed"
        else:
            found = f"{type(exc).__name__}: {exc}" + (f" (it printed: {said[:200]})" if said else "")
        raise AmdsmiUnavailable(type(exc).__name__, found, said) from None
    return amdsmi


def error_name(exc: BaseException) -> str:
    """`AMDSMI_STATUS_NOT_SUPPORTED` for a library error (its err_code), else the exception's class name."""
    code = getattr(exc, "err_code", None)
    if is_amdsmi_error(exc) and isinstance(code, int):
        return f"AMDSMI_STATUS_{STATUS_NAMES.get(code, f'CODE_{code}')}"
    if isinstance(exc, AmdsmiUnavailable):
        return exc.cause
    return type(exc).__name__


def is_amdsmi_error(exc: BaseException) -> bool:
    """True for any amdsmi AmdSmiException (the real ones or the simulator's copies)."""
    return any(c.__name__ == "AmdSmiException" for c in type(exc).__mro__)


def is_missing(exc: BaseException) -> bool:
    return is_amdsmi_error(exc) and error_name(exc) in MISSING_STATUSES


def is_unavailable_error(exc: BaseException) -> bool:
    """Errors opening amdsmi that describe the host, not a bug: these become `unavailable` evidence."""
    return is_amdsmi_error(exc) or isinstance(exc, (ImportError, OSError))


def unavailable_reason(exc: BaseException) -> str:
    """`amdsmi: KeyError: 'libamd_smi.so' (it printed: ...). <what to do>`."""
    name = error_name(exc)
    advice = _ADVICE.get(name, _DEFAULT_ADVICE)
    if isinstance(exc, AmdsmiUnavailable):
        return f"amdsmi: {exc.found}. {advice}"
    return f"amdsmi: {name}. {advice}"


def na(value: Any) -> Any:
    """amdsmi's "N/A" (a value the device does not report) as None."""
    return None if isinstance(value, str) and value.strip() == NA else value


class Amdsmi(GpuLibrary):
    """amdsmi, imported and initialised once per process (or the simulator's stand-in module)."""

    def _import(self) -> ModuleType:
        return import_amdsmi()  # AmdsmiUnavailable (an ImportError) says what was found

    def _init(self, lib: Any) -> None:
        lib.amdsmi_init(lib.AmdSmiInitFlags.INIT_AMD_GPUS)  # amdsmi 7.0.2 amdsmi_interface.py:1895

    def _shut_down(self, lib: Any) -> None:
        lib.amdsmi_shut_down()
