"""What NVML and amdsmi share as libraries a run opens: imported lazily (neither is a dependency), initialised
once per process under a lock, called off the event loop (their calls block and read sysfs), shut down at the end.
`nvml.Nvml` and `amdsmi_lib.Amdsmi` say how each is imported, initialised and shut down; a stand-in module (the
simulator's) goes underneath either as `module`."""

from __future__ import annotations

import asyncio
import threading
from types import ModuleType
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class GpuLibrary:
    def __init__(self, module: ModuleType | Any | None = None) -> None:
        self._module = module
        self._lock = threading.Lock()
        self._initialised = False
        self._unavailable: ImportError | None = None  # a failed import is tried once per run, not per probe

    def _import(self) -> ModuleType:
        raise NotImplementedError

    def _init(self, lib: Any) -> None:
        raise NotImplementedError

    def _shut_down(self, lib: Any) -> None:
        raise NotImplementedError

    @property
    def lib(self) -> Any:
        """The library's module (or its stand-in). Raises the ImportError its import raised."""
        if self._unavailable is not None:
            raise self._unavailable
        if self._module is None:
            try:
                self._module = self._import()
            except ImportError as exc:
                self._unavailable = exc
                raise
        return self._module

    def ensure_init(self) -> Any:
        """The library, initialised once per process; raises what its initialisation raised."""
        lib = self.lib
        with self._lock:
            if not self._initialised:
                self._init(lib)
                self._initialised = True
        return lib

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(library)` off the event loop."""
        return await asyncio.to_thread(lambda: fn(self.ensure_init()))

    def shutdown(self) -> None:
        with self._lock:
            if self._initialised:
                try:
                    self._shut_down(self.lib)
                finally:
                    self._initialised = False


class CallReader:
    """Calls a GPU library's functions by name: a value the device does not have becomes None and is named in
    `missing` (function -> why), any other error of the library's own is noted in `errors` and also gives None,
    anything else raises. Each library's subclass says which of its errors are which."""

    absent = "absent"  # what `missing` says of a function this version of the library lacks

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.missing: dict[str, str] = {}
        self.errors: dict[str, str] = {}

    @staticmethod
    def is_missing(exc: BaseException) -> bool:
        raise NotImplementedError

    @staticmethod
    def is_library_error(exc: BaseException) -> bool:
        raise NotImplementedError

    @staticmethod
    def error_name(exc: BaseException) -> str:
        raise NotImplementedError

    def q(self, name: str, *args: Any) -> Any:
        fn = getattr(self.lib, name, None)
        if fn is None:
            self.missing.setdefault(name, self.absent)
            return None
        try:
            return fn(*args)
        except Exception as exc:
            if self.is_missing(exc):
                self.missing.setdefault(name, self.error_name(exc))
                return None
            if self.is_library_error(exc):
                self.errors[name] = self.error_name(exc)
                return None
            raise
