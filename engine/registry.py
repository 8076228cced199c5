"""Finds probes: the `runbook.probes` entry-point group (built-ins included) and probe files.

A plugin that fails to import is recorded, not raised: `runbook probes` lists it, and only a
runbook that names one of its probes fails to load.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .evidence import Evidence
from .probe import Probe

GROUP = "runbook.probes"
# The roles a runbook names instead of one server's probe (`server.metrics`): the family of the server found runs.
ROLES = ("server.config", "server.health", "server.metrics", "server.sweep", "server.profile")
DEFAULT_KIND = "sglang"  # whose probes a role runs where the server kind was not found: their errors say more
# The reason of a probe call that has no probe for the target's server kind: the runner skips what reads it.
NOT_FOR_SERVER = "not for this server kind"
# The same for a GPU job with no probe for the GPU vendor found (gpu.activity's GPM counters on an AMD host).
NOT_FOR_GPU = "not for this GPU vendor"
NOT_HERE = (NOT_FOR_SERVER, NOT_FOR_GPU)  # the reasons whose hypotheses are skipped, not inconclusive
DEFAULT_GPU_VENDOR = "nvidia"  # whose GPU probes run where no GPU library answered: NVML's reasons say more
GPU_VENDOR_TITLES = {"nvidia": "NVIDIA", "amd": "AMD"}


@dataclass
class PluginError:
    source: str
    message: str
    names: list[str] = field(default_factory=list)  # probe names it was meant to provide, when known


@dataclass
class Registry:
    probes: dict[str, type[Probe]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    errors: list[PluginError] = field(default_factory=list)

    @classmethod
    def discover(cls, probe_dirs: list[str | Path] = ()) -> "Registry":
        registry = cls()
        registry.load_entry_points()
        for directory in probe_dirs:
            registry.load_dir(directory)
        return registry

    def add(self, probe: type[Probe], source: str) -> None:
        self.probes[probe.name] = probe
        self.sources[probe.name] = source

    def load_entry_points(self) -> None:
        for ep in entry_points(group=GROUP):
            source = f"entry point {ep.name} = {ep.value}"
            try:
                obj = ep.load()
            except Exception as exc:  # noqa: BLE001 - any plugin import failure is reported, not raised
                self.errors.append(PluginError(source, f"{type(exc).__name__}: {exc}", [ep.name]))
                continue
            if not (inspect.isclass(obj) and issubclass(obj, Probe)):
                self.errors.append(PluginError(source, "is not a runbook Probe subclass", [ep.name]))
                continue
            if getattr(obj, "name", None) != ep.name:
                self.errors.append(PluginError(source, f"declares name {getattr(obj, 'name', None)!r}, expected {ep.name!r}", [ep.name]))
                continue
            if (wrong := _bad_values(obj)) is not None:
                self.errors.append(PluginError(source, wrong, [ep.name]))
                continue
            self.add(obj, source)

    def load_dir(self, directory: str | Path) -> None:
        path = Path(directory)
        if not path.is_dir():
            self.errors.append(PluginError(str(path), "probes directory does not exist"))
            return
        for file in sorted(path.glob("*.py")):
            if not file.name.startswith("_"):
                self.load_file(file)

    def load_file(self, file: str | Path) -> list[str]:
        """Import a probe file and register every Probe subclass it defines; returns their names."""
        file = Path(file).resolve()
        digest = hashlib.sha1(str(file).encode()).hexdigest()[:8]
        module_name = f"runbook_probe_files.{file.stem}_{digest}"
        if module_name in sys.modules:
            module = sys.modules[module_name]
        else:
            try:
                spec = importlib.util.spec_from_file_location(module_name, file)
                if spec is None or spec.loader is None:
                    raise ImportError("not a Python file")
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module
                spec.loader.exec_module(module)
            except Exception as exc:  # noqa: BLE001
                sys.modules.pop(module_name, None)
                self.errors.append(PluginError(str(file), f"{type(exc).__name__}: {exc}"))
                return []
        found = []
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, Probe) and obj.__module__ == module.__name__ and not inspect.isabstract(obj):
                if not isinstance(getattr(obj, "name", None), str):
                    self.errors.append(PluginError(str(file), f"class {obj.__name__} has no `name`"))
                    continue
                if (wrong := _bad_values(obj)) is not None:
                    self.errors.append(PluginError(str(file), f"{obj.name}: {wrong}", [obj.name]))
                    continue
                self.add(obj, str(file))
                found.append(obj.name)
        if not found and not any(e.source == str(file) for e in self.errors):
            self.errors.append(PluginError(str(file), "defines no Probe subclass"))
        return found

    def is_role(self, name: str) -> bool:
        """A role name (`server.metrics`) that no probe of its own claims, and some family fills."""
        return name in ROLES and name not in self.probes and any(getattr(p, "role", None) == name for p in self.probes.values())

    def knows(self, name: str) -> bool:
        return name in self.probes or self.is_role(name)

    def lookup(self, name: str) -> type[Probe] | None:
        """The probe class a name stands for before the server is known: itself, or for a role the default
        family's probe (its params, values and needs speak for the role: every family takes the same params)."""
        if name in self.probes:
            return self.probes[name]
        if self.is_role(name):
            return self.for_target(name, None)
        return None

    def role_of(self, name: str) -> str:
        """The role a name fills (`sglang.metrics` -> `server.metrics`, `amd.sample` -> `gpu.sample`), else the name:
        recorded evidence of one role answers a call of another name of it (a results file from before the roles, or
        another family)."""
        if name in ROLES:
            return name
        probe = self.probes.get(name)
        return getattr(probe, "role", None) or getattr(probe, "gpu_role", None) or name  # `amd.sample` does `gpu.sample`

    def families(self, name: str) -> list[type[Probe]]:
        """Every probe a name can run: the probes of its role across families (itself where it has no role)."""
        role = name if self.is_role(name) else getattr(self.probes.get(name), "role", None)
        if role is None or getattr(self.probes.get(name), "server_kind", "") is None:
            return [self.probes[name]] if name in self.probes else []
        return [p for p in self.probes.values() if getattr(p, "role", None) == role and getattr(p, "server_kind", None) is not None]

    def for_target(self, name: str, server_kind: str | None, gpu_vendor: str | None = None) -> type[Probe]:
        """The probe to run for `name` against a server of `server_kind` on GPUs of `gpu_vendor`: itself, or the
        probe of the same role for that kind (of the same GPU job for that vendor); where there is none, a stand-in
        that answers `unavailable` with the reason (starting NOT_FOR_SERVER / NOT_FOR_GPU: the runner skips the
        hypotheses that read it)."""
        return self.for_gpu(self._for_server(name, server_kind), gpu_vendor)

    def for_gpu(self, probe: type[Probe], gpu_vendor: str | None) -> type[Probe]:
        """`probe`, or the probe of its GPU job for `gpu_vendor` (None: the default vendor's, whose reasons say more)."""
        own = getattr(probe, "gpu_vendor", None)
        vendor = gpu_vendor or DEFAULT_GPU_VENDOR
        if own is None or own == vendor:
            return probe
        job = getattr(probe, "gpu_role", None) or probe.name
        for other in self.probes.values():
            if getattr(other, "gpu_vendor", None) == vendor and (getattr(other, "gpu_role", None) or other.name) == job:
                return other
        own_title, title = GPU_VENDOR_TITLES.get(own, own), GPU_VENDOR_TITLES.get(vendor, vendor)
        return _stand_in(probe, f"{NOT_FOR_GPU}: {probe.name} reads {own_title} GPUs only and no {title} probe does its job", job)

    def _for_server(self, name: str, server_kind: str | None) -> type[Probe]:
        if self.is_role(name):
            kind = DEFAULT_KIND if server_kind in (None, "unknown") else server_kind
            found = [p for p in self.probes.values() if getattr(p, "role", None) == name and getattr(p, "server_kind", None) == kind]
            if found:
                return found[0]
            default = next(p for p in self.probes.values() if getattr(p, "role", None) == name)
            return _stand_in(default, f"{NOT_FOR_SERVER}: no {kind} probe does the job of {name}", name)
        probe = self.probes[name]
        own = getattr(probe, "server_kind", None)
        # a server that is neither kind (or not asked) gets the probes the runbook names: their own errors (404,
        # 401, 5xx) say more about a broken or locked server than "neither" would
        if own is None or server_kind in (None, "unknown") or server_kind == own:
            return probe
        role = getattr(probe, "role", None)
        for other in self.probes.values():
            if role is not None and getattr(other, "role", None) == role and getattr(other, "server_kind", None) == server_kind:
                return other
        return _stand_in(probe, f"{NOT_FOR_SERVER}: {name} talks to {own} only and no {server_kind} probe does its job")

    def error_for(self, name: str) -> PluginError | None:
        return next((e for e in self.errors if name in e.names), None)


def _stand_in(probe: type[Probe], reason: str, name: str | None = None) -> type[Probe]:
    """A probe with `probe`'s name (or `name`), params and values that runs nothing and says why."""

    async def run(self: Probe, ctx: Any, params: Any) -> Evidence:
        return Evidence.unavailable(reason)

    return type(probe.__name__ + "NotHere", (Probe,), {
        "name": name or probe.name, "description": probe.description, "Params": probe.Params, "Values": probe.Values,
        "default_timeout_s": 5.0, "run": run, "__module__": __name__,
    })  # fmt: skip


def _bad_values(probe: type[Probe]) -> str | None:
    """A `Values` that is not a pydantic model would break `validate` and `runbook probes` later, far from its cause."""
    declared = getattr(probe, "Values", None)
    if declared is None or (inspect.isclass(declared) and issubclass(declared, BaseModel)):
        return None
    return f"its Values is {declared!r}, not a pydantic model (subclass gpu_runbook.plugin.Values)"
