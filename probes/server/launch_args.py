"""The launch arguments of the server process that holds the GPUs, on the same host: NVML's running compute
processes give the PIDs, `/proc/<pid>/cmdline` the literal `vllm serve ...` or `python -m sglang.launch_server ...`
(shared/reference/vllm-and-fleet.md §2). It is what a vLLM server without dev mode does not expose (TP size,
`max_num_seqs`, `enforce_eager`, `disable_custom_all_reduce`, ...), and every value read here says so
(`cmdline of PID N`). Nothing here is guessed: a flag that is absent is absent (the caller decides what the
release's default is), and a host that does not show the process (another PID namespace, no NVML) gives None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_runbook.plugin import Context

# vLLM's short spellings (engine/arg_utils.py: "-tp", "-pp", "-dp", "-O"; 0.11.0 :655-660, :934)
SHORT = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size", "O": "compilation_config"}
MAX_CMDLINE = 1 << 16


@dataclass
class LaunchArgs:
    kind: str  # "vllm" | "sglang"
    pid: int
    flags: dict[str, str | bool] = field(default_factory=dict)  # --max-num-seqs 64 -> {"max_num_seqs": "64"}
    model: str | None = None  # vllm serve's positional model

    @property
    def source(self) -> str:
        return f"cmdline of PID {self.pid}"


def parse_cmdline(argv: list[str], pid: int = 0) -> LaunchArgs | None:
    """The server kind and flags of a command line; None when it launches neither server."""
    kind, start = None, 0
    for i, a in enumerate(argv):
        base = a.rsplit("/", 1)[-1]
        if base == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            kind, start = "vllm", i + 2
            break
        if a in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main"):
            kind, start = "vllm", i + 1
            break
        if a in ("sglang.launch_server", "sglang.srt.server") or (base == "sglang" and i + 1 < len(argv) and argv[i + 1] == "serve"):
            kind, start = "sglang", i + (2 if base == "sglang" else 1)
            break
    if kind is None:
        return None
    out = LaunchArgs(kind=kind, pid=pid)
    rest = argv[start:]
    if kind == "vllm" and rest and argv[start - 1] == "serve" and not rest[0].startswith("-"):
        out.model, rest = rest[0], rest[1:]
    i = 0
    while i < len(rest):
        a = rest[i]
        if a.startswith("-") and len(a) > 1 and not _number(a):
            name, eq, value = a.lstrip("-").partition("=")
            key = SHORT.get(name, name).replace("-", "_")
            if eq:
                out.flags[key] = value
            elif i + 1 < len(rest) and (not rest[i + 1].startswith("-") or _number(rest[i + 1])):
                out.flags[key] = rest[i + 1]
                i += 1
            else:
                out.flags[key] = True
        i += 1
    return out


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_cmdline(pid: int) -> list[str] | None:
    try:
        raw = (Path("/proc") / str(pid) / "cmdline").read_bytes()[:MAX_CMDLINE]
    except OSError:
        return None
    return [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]


async def server_process_args(ctx: Context, kind: str | None = None) -> LaunchArgs | None:
    """The launch arguments of the first GPU process that runs a server (of `kind` when given), or None."""

    def pids(nv: Any) -> list[int]:
        from gpu_runbook.nvml import open_devices

        seen: list[int] = []
        for dev in open_devices(nv).devices:
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(dev.handle)
            except Exception:  # noqa: BLE001 - not supported, no permission: this GPU shows no process
                continue
            for p in procs or []:
                pid = getattr(p, "pid", None)
                if isinstance(pid, int) and pid not in seen:
                    seen.append(pid)
        return seen

    try:
        found = await ctx.nvml.call(pids)
    except Exception:  # noqa: BLE001 - no NVML: no process to read
        return None
    for pid in found:
        argv = read_cmdline(pid)
        args = parse_cmdline(argv, pid) if argv else None
        if args is not None and (kind is None or args.kind == kind):
            return args
    return None
