"""The one module that imports `pynvml` (NVIDIA's nvidia-ml-py).

Everything GPU goes through `Nvml`, so the tests' fake and the simulator put a stand-in module
underneath without patching any probe: `Nvml(module=fake)`.
"""

from __future__ import annotations

import asyncio
import threading
from types import ModuleType
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class Nvml:
    def __init__(self, module: ModuleType | Any | None = None) -> None:
        self._module = module
        self._lock = threading.Lock()
        self._initialised = False

    @property
    def lib(self) -> Any:
        """The pynvml module (or its stand-in). Raises ImportError when nvidia-ml-py is missing."""
        if self._module is None:
            import pynvml  # noqa: PLC0415 - lazy on purpose

            self._module = pynvml
        return self._module

    def ensure_init(self) -> Any:
        """nvmlInit once per process; raises the NVMLError NVML raised (LibraryNotFound on a GPU-less host)."""
        lib = self.lib
        with self._lock:
            if not self._initialised:
                lib.nvmlInit()
                self._initialised = True
        return lib

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(pynvml)` off the event loop: NVML calls block."""
        return await asyncio.to_thread(lambda: fn(self.ensure_init()))

    def shutdown(self) -> None:
        with self._lock:
            if self._initialised:
                try:
                    self.lib.nvmlShutdown()
                finally:
                    self._initialised = False
