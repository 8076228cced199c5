"""What runs `runbook calibrate`'s loads: the protocol a load follows, its window, the GPU it runs on.

Its own module so that the measurement (calibrate.py) and the real load (calibrate_torch.py, PyTorch) both
depend on it and not on each other: tests hand the measurement a fake load of the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol


class LoadUnavailable(Exception):
    """Nothing can put a load on the GPU here (no PyTorch, no CUDA device): exit 3, with what is missing."""


@dataclass
class Window:
    """How long a load runs: it calls `started()` once its setup is done, runs `warmup_s` more, then measures
    `seconds`. NVML samples before `started() + warmup_s` are dropped, so setup and ramp-up never count."""

    seconds: float
    warmup_s: float
    started: Callable[[], None] = lambda: None


class GpuLoad(Protocol):
    """What puts each load on the GPU and says how fast it went (bytes and FLOPs it counted itself)."""

    def describe(self) -> str:
        """What ran the loads, e.g. "torch 2.11.0+cu128": recorded as the calibration's `library`."""
        ...

    def dtypes(self) -> list[str]:
        """The weight dtypes this GPU runs natively, of calibration.WEIGHT_BYTES' names ("bf16", "fp8", "fp4")."""
        ...

    def notes(self) -> list[str]:
        """What was left out and why (FP4 on a GPU without it...), one line each."""
        ...

    def copy(self, window: Window) -> dict[str, float]:
        """A device-to-device copy: {"gbps": bytes read + written per second / 1e9}."""
        ...

    def decode_gemm(self, dtype: str, batch: int, window: Window) -> dict[str, float]:
        """`batch` rows times weights larger than the caches: {"gbps": weight bytes read /s / 1e9, "tflops": ...}."""
        ...

    def compute_gemm(self, dtype: str, window: Window) -> dict[str, float]:
        """A dense compute-bound GEMM: {"tflops": ..., "rows": M (its intensity is M rows over the weights)}."""
        ...

    def close(self) -> None:
        """Give the GPU's memory back."""
        ...


@dataclass
class GpuIdentity:
    index: int
    name: str
    uuid: str | None
    pci_bus_id: str | None
    board_part_number: str | None
    serial: str | None
    driver_version: str | None
    power_limit_w: float | None


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
