"""`host.info`: what machine this is, so a report names its target and a runbook runs with no GPU."""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import socket
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from gpu_runbook.plugin import Context, Evidence, NoParams, Probe, Table, Values, value

KEY_PACKAGES = ("runbook", "nvidia-ml-py", "httpx", "pydantic", "cel-python", "textual", "sglang", "torch", "flashinfer-python")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _os_release() -> str | None:
    text = _read("/etc/os-release") or ""
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return fields.get("PRETTY_NAME", "").strip('"') or None


def _cpu() -> tuple[str | None, bool]:
    model, hypervisor = None, False
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if model is None and line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and " hypervisor" in f" {line.split(':', 1)[1]} ":
            hypervisor = True
    return model or platform.processor() or None, hypervisor


def virtualization() -> tuple[str, str]:
    """(kind, how we know): systemd-detect-virt when present, else DMI strings and the cpuinfo flag."""
    tool = shutil.which("systemd-detect-virt")
    if tool:
        try:
            out = subprocess.run([tool], capture_output=True, text=True, timeout=5)
            kind = out.stdout.strip() or "none"
            return kind, "systemd-detect-virt"
        except (OSError, subprocess.SubprocessError):
            pass
    dmi = " ".join(filter(None, (_read(f"/sys/class/dmi/id/{f}") for f in ("sys_vendor", "product_name")))).lower()
    for needle, kind in (("kvm", "kvm"), ("qemu", "qemu"), ("vmware", "vmware"), ("virtualbox", "oracle"), ("microsoft", "microsoft"), ("xen", "xen"), ("amazon ec2", "amazon")):
        if needle in dmi:
            return kind, "dmi"
    _, hypervisor = _cpu()
    if hypervisor:
        return "vm", "cpuinfo hypervisor flag"
    if Path("/.dockerenv").exists():
        return "docker", "/.dockerenv"
    return "none", "no sign of virtualization"


def _packages() -> dict[str, str]:
    out = {}
    for name in KEY_PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def collect() -> dict[str, Any]:
    cpu_model, _ = _cpu()
    virt, virt_source = virtualization()
    return {
        "hostname": socket.gethostname(),
        "os": _os_release() or platform.platform(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "virtualization": virt,
        "virtualization_source": virt_source,
        "is_virtualized": virt not in {"none", ""},
        "python": sys.version.split()[0],
        "packages": _packages(),
    }


class HostValues(Values):
    """host.info: what machine this is."""

    hostname: str = value("socket.gethostname()", default=...)
    os: str = value("PRETTY_NAME of /etc/os-release, else platform.platform()", default=...)
    kernel: str = value("kernel release (uname -r)", default=...)
    arch: str = value("machine architecture, e.g. 'x86_64'", default=...)
    cpu_model: str | None = value("CPU model name from /proc/cpuinfo (else platform.processor())")
    cpu_count: int | None = value("logical CPUs (os.cpu_count(); None where it cannot tell)", unit="CPUs")
    virtualization: str = value("systemd-detect-virt's word: none, kvm, qemu, docker, ... ('vm': the cpuinfo flag only)", default=...)
    virtualization_source: Literal["systemd-detect-virt", "dmi", "cpuinfo hypervisor flag", "/.dockerenv",
                                   "no sign of virtualization"] = value("how the virtualization was found", default=...)  # fmt: skip
    is_virtualized: bool = value("virtualization is not 'none'", default=...)
    python: str = value("Python version, e.g. '3.11.7'", default=...)
    packages: dict[str, str] = value("installed version of each key package (runbook, nvidia-ml-py, sglang, torch, ...)", default=...)


class HostInfo(Probe):
    """Hostname, OS, kernel, CPU, virtualization, Python and key package versions.

    The values are declared in `HostValues`.
    """

    name = "host.info"
    prefetch = True
    description = "Host facts: OS, kernel, CPU, virtualization, Python and package versions"
    Params = NoParams
    Values = HostValues
    default_timeout_s = 15.0

    async def run(self, ctx: Context, params: NoParams) -> Evidence:
        values = await asyncio.to_thread(collect)
        table = Table(title="Host", columns=["field", "value"], rows=[[k, str(v)] for k, v in values.items() if k != "packages"])
        pkgs = Table(title="Packages", columns=["package", "version"], rows=[[k, v] for k, v in values["packages"].items()])
        summary = f"{values['hostname']}: {values['os']}, kernel {values['kernel']}, {values['cpu_count']} CPUs, virtualization {values['virtualization']}"
        return Evidence(summary=summary, values=values, blocks=[table, pkgs])
