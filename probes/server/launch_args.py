"""The launch arguments of the server process that holds the GPUs, on the same host: NVML's running compute
processes give the PIDs, `/proc/<pid>/cmdline` the literal `vllm serve ...` or `python -m sglang.launch_server ...`
(shared/reference/vllm-and-fleet.md §2). It is what a vLLM server without dev mode does not expose (TP size,
`max_num_seqs`, `enforce_eager`, `disable_custom_all_reduce`, ...), and every value read here says so
(`cmdline of PID N`). Nothing here is guessed: a flag that is absent is absent (the caller decides what the
release's default is), and a host that does not show the process (another PID namespace, no NVML) gives None.

The process on a GPU is rarely the one launched: vLLM's engine core and TP workers, SGLang's schedulers are
spawned children (`python -c "from multiprocessing.spawn import spawn_main; ..." --multiprocessing-fork`, or a
`setproctitle` name such as `VLLM::Worker_TP0`), whose command line says nothing. So each GPU process's ancestors
are walked (`/proc/<pid>/stat`'s parent PID, at most MAX_DEPTH levels, no PID twice, a parent that started after
its child is a reused PID and ends the walk) to the first one whose command line launches a server; the source
then says which PID and that it was found above GPU process PID N.

Where no command line can be read (no NVML process list, /proc of another PID namespace: a container), what is
left is a count: how many GPUs hold memory of compute processes (`gpus_held`). That is the server's world size
(TP x PP x DP, one GPU per rank) only when the server's processes are the only ones on the GPUs and each rank has
its own GPU; it does not say TP, since PP or DP may be >1. When the server's command line was found, the count is
of the GPUs whose processes lead up to that server process, which excludes other jobs. Each value says where it
came from, and a value that cannot be had is None with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_runbook.plugin import Context

# vLLM's short spellings (engine/arg_utils.py: "-tp", "-pp", "-dp", "-O"; 0.11.0 :655-660, :934)
SHORT = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size", "O": "compilation_config"}
MAX_CMDLINE = 1 << 16  # bytes of one /proc/<pid>/cmdline read (untrusted data)
MAX_ARGS = 4096  # arguments of one command line kept
MAX_DEPTH = 8  # ancestors walked up from a GPU process
MAX_GPU_PIDS = 256  # GPU processes whose ancestry is walked
MAX_STAT = 4096  # bytes of one /proc/<pid>/stat read


@dataclass
class LaunchArgs:
    kind: str  # "vllm" | "sglang"
    pid: int
    flags: dict[str, str | bool] = field(default_factory=dict)  # --max-num-seqs 64 -> {"max_num_seqs": "64"}
    model: str | None = None  # vllm serve's positional model
    gpu_pid: int | None = None  # the GPU process (NVML) this server process was found from; == pid when it is that one
    depth: int = 0  # how many parents up from gpu_pid
    gpus_held: int | None = None  # GPUs holding memory of this server's processes (see ServerProcesses)
    gpus_held_source: str | None = None

    @property
    def source(self) -> str:
        if self.gpu_pid is None or self.gpu_pid == self.pid:
            return f"cmdline of PID {self.pid}"
        up = "its parent" if self.depth == 1 else f"{self.depth} parents up"
        return f"cmdline of PID {self.pid}, found as an ancestor of GPU process PID {self.gpu_pid} ({up})"


@dataclass
class ServerProcesses:
    """What the GPU processes of this host say about the server: its launch arguments (None with `reason` when no
    command line launching it was readable) and, separately, how many GPUs its processes hold (`gpus_held`, None
    with `gpus_held_reason`). `gpus_held` is a world size measurement (TP x PP x DP), never TP by itself."""

    launch: LaunchArgs | None = None
    reason: str | None = None
    gpus_held: int | None = None
    gpus_held_source: str | None = None
    gpus_held_reason: str | None = None
    gpu_pids: list[int] = field(default_factory=list)  # every compute process NVML listed, in order


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
    if kind == "vllm" and rest and rest[0] == "serve" and argv[start - 1] == "vllm.entrypoints.cli.main":
        rest, start = rest[1:], start + 1  # python -m vllm.entrypoints.cli.main serve MODEL ...
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


def _read_bounded(path: Path, limit: int) -> bytes | None:
    try:
        with path.open("rb") as f:
            return f.read(limit)
    except (OSError, ValueError):
        return None


def read_cmdline(pid: int) -> list[str] | None:
    """The arguments of a process (bounded: MAX_CMDLINE bytes, MAX_ARGS arguments); None when it cannot be read."""
    raw = _read_bounded(Path("/proc") / str(pid) / "cmdline", MAX_CMDLINE)
    if raw is None:
        return None
    parts = raw.split(b"\0")
    if len(raw) >= MAX_CMDLINE:
        parts = parts[:-1]  # cut at the limit: the last argument may be a part of one (a "2048" read as "20")
    return [p.decode("utf-8", "replace") for p in parts[:MAX_ARGS] if p]


def read_stat(pid: int) -> tuple[int, int] | None:
    """(parent PID, start time in clock ticks since boot) of a process, from /proc/<pid>/stat; None when gone or
    unreadable. The command name (field 2) is in parentheses and may hold spaces or ')': fields are counted after
    the last ')'."""
    raw = _read_bounded(Path("/proc") / str(pid) / "stat", MAX_STAT)
    if raw is None:
        return None
    _, paren, rest = raw.decode("ascii", "replace").rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 20:
        return None
    try:
        return int(fields[1]), int(fields[19])  # field 4 ppid, field 22 starttime (1-based, counting pid and comm)
    except ValueError:
        return None


def find_server(gpu_pid: int, kind: str | None = None, max_depth: int = MAX_DEPTH) -> tuple[LaunchArgs | None, str]:
    """The nearest process at or above `gpu_pid` (itself, its parent, ... at most `max_depth` parents up) whose
    command line launches a server (of `kind` when given), with an empty reason; or None and why not. Reads only
    this host's /proc and never raises."""
    try:
        return _find_server(gpu_pid, kind, max_depth)
    except Exception as exc:  # noqa: BLE001 - a probe helper: whatever /proc does, the answer is "not found"
        return None, f"reading the ancestry of PID {gpu_pid} failed: {type(exc).__name__}"


def _find_server(gpu_pid: int, kind: str | None, max_depth: int) -> tuple[LaunchArgs | None, str]:
    pid, seen, child_start = gpu_pid, set(), None
    for depth in range(max_depth + 1):
        if pid <= 0 or pid in seen:
            return None, f"no server command line above GPU process PID {gpu_pid} (the walk reached the top at depth {depth})"
        seen.add(pid)
        stat = read_stat(pid)
        if stat is None:
            what = "GPU process" if depth == 0 else f"the ancestor {depth} up of GPU process PID {gpu_pid},"
            return None, f"/proc/{pid} of {what} PID {pid} is not readable here (gone, or another PID namespace)"
        ppid, start = stat
        if child_start is not None and start > child_start:
            return None, f"PID {pid} started after its child: the parent of that child exited and its PID was reused"
        argv = read_cmdline(pid)
        if read_stat(pid) != stat:  # gone or replaced between the two reads: its command line is not this process's
            return None, f"PID {pid} exited while its command line was read"
        args = parse_cmdline(argv, pid) if argv else None
        if args is not None:
            if kind is not None and args.kind != kind:
                return None, f"PID {pid} above GPU process PID {gpu_pid} launches {args.kind}, not {kind}"
            args.gpu_pid, args.depth = gpu_pid, depth
            return args, ""
        child_start, pid = start, ppid
    return None, f"no server command line within {max_depth} parents of GPU process PID {gpu_pid}"


def find_server_for(pids: list[int], kind: str | None = None) -> tuple[LaunchArgs | None, str, dict[int, int]]:
    """The server found from the first of `pids` that leads to one, why none was found otherwise, and for every
    PID walked the server PID it leads to (the processes of the same server share it)."""
    first: LaunchArgs | None = None
    reasons: list[str] = []
    owner: dict[int, int] = {}
    for pid in pids[:MAX_GPU_PIDS]:
        args, why = find_server(pid, kind)
        if args is None:
            if why not in reasons:
                reasons.append(why)
            continue
        owner[pid] = args.pid
        if first is None:
            first = args
    if first is not None:
        return first, "", owner
    if not pids:
        return None, "NVML lists no compute process on any GPU (none runs, or another PID namespace hides them)", owner
    return None, "; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else ""), owner


def count_gpus_held(per_gpu: list[list[int] | None], server_pid: int | None = None,
                    owner: dict[int, int] | None = None) -> tuple[int | None, str]:
    """How many GPUs hold memory of the server's processes, with its source; or None and why.

    `per_gpu` is each GPU's NVML compute PIDs (None: that GPU did not say). With `server_pid` (and `owner`, the
    server PID each GPU process leads up to) only GPUs holding a process of that server count; without it, every
    GPU with any compute process counts, which is the server's only when nothing else runs there."""
    if any(p is None for p in per_gpu):
        missing = sum(p is None for p in per_gpu)
        return None, f"{missing} of {len(per_gpu)} GPUs did not list their compute processes (NVML): a count would be short"
    if server_pid is not None and owner is not None:
        n = sum(any(owner.get(pid) == server_pid for pid in pids or []) for pids in per_gpu)
        return n, (f"{n} GPUs hold memory of the server's processes (NVML compute processes whose ancestry reaches "
                   f"PID {server_pid}): TP x PP x DP when each rank has its own GPU")
    n = sum(bool(pids) for pids in per_gpu)
    if n == 0:
        return None, "NVML lists no compute process on any GPU (none runs, or another PID namespace hides them)"
    return n, (f"{n} GPUs hold memory of compute processes (NVML); whose they are could not be read here, so this is "
               f"the server's world size (TP x PP x DP) only if nothing else runs on these GPUs")


async def server_processes(ctx: Context, kind: str | None = None) -> ServerProcesses:
    """The server's launch arguments and the GPUs its processes hold, from NVML's compute processes and this host's
    /proc; never raises (every missing value carries its reason)."""

    def per_gpu(nv: Any) -> list[list[int] | None]:
        from gpu_runbook.nvml import open_devices

        devs = open_devices(nv)
        out: list[list[int] | None] = [None] * len(devs.skipped)  # a device NVML would not open lists nothing
        for dev in devs.devices:
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(dev.handle)
            except Exception:  # noqa: BLE001 - not supported, no permission: this GPU shows no process
                out.append(None)
                continue
            pids: list[int] = []
            for p in list(procs or [])[:MAX_GPU_PIDS]:
                pid = getattr(p, "pid", None)
                if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and pid not in pids:
                    pids.append(pid)
            out.append(pids)
        return out

    out = ServerProcesses()
    try:
        gpus = await ctx.nvml.call(per_gpu)
    except Exception as exc:  # noqa: BLE001 - no NVML: no process to read
        out.reason = out.gpus_held_reason = f"NVML gave no process list: {type(exc).__name__}"
        return out
    try:
        for pids in gpus:
            for pid in pids or []:
                if pid not in out.gpu_pids:
                    out.gpu_pids.append(pid)
        out.launch, why, owner = find_server_for(out.gpu_pids, kind)
        out.reason = why or None
        n, text = count_gpus_held(gpus, out.launch.pid if out.launch else None, owner)
        out.gpus_held, out.gpus_held_source, out.gpus_held_reason = n, (text if n is not None else None), (None if n is not None else text)
        if out.launch is not None:
            out.launch.gpus_held, out.launch.gpus_held_source = out.gpus_held, out.gpus_held_source
    except Exception as exc:  # noqa: BLE001 - never raise out of a probe
        return ServerProcesses(reason=f"reading the GPU processes failed: {type(exc).__name__}",
                               gpus_held_reason=f"reading the GPU processes failed: {type(exc).__name__}")
    return out


async def server_process_args(ctx: Context, kind: str | None = None) -> LaunchArgs | None:
    """The launch arguments of the server (of `kind` when given) that a GPU process is, or descends from; or None.
    `server_processes` says why not, and how many GPUs the server's processes hold."""
    return (await server_processes(ctx, kind)).launch
