"""`runbook calibrate`: measure this GPU's power curve, one load at a time on the idle GPU, NVML sampled beside it.

A figure measured elsewhere may not hold for this board, driver, power limit or cooling (calibration.py says
why), so each load runs alone: a device-to-device copy, decode-shaped GEMMs (a batch of rows times weights far
larger than the caches) from batch 1 to a few thousand for every weight dtype the GPU runs natively, and a
compute-bound GEMM. Each point is keyed by its arithmetic intensity (FLOPs per byte of weights), so any GEMM
shape and dtype can be placed on the curve.

The load runs through a `GpuLoad` (gpu_load.py); `TorchLoad` (calibrate_torch.py) is the real one (PyTorch, imported only when
asked: it is never a dependency of the base install). Tests and tools hand `calibrate_main` a fake NVML
module and a fake load instead.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, TextIO

from .gpu_load import GpuIdentity, GpuLoad, LoadUnavailable, Window, one_line
from .scrub import plain
from .nvml import CLOCK_EVENT_REASONS, Nvml, error_name, is_missing, is_unavailable_error, query, unavailable_reason

if TYPE_CHECKING:  # pydantic is imported when a calibration is made, not when the parser is built
    from .calibration import Calibration, LoadPoint

EXIT_OK, EXIT_USAGE, EXIT_NO_GPU, EXIT_BUSY = 0, 2, 3, 4
BATCHES: tuple[int, ...] = (1, 8, 32, 64, 128, 256, 512, 1024, 2048)
MAX_BATCH = 65536
SECONDS = 4.0  # measured per load, after the warm-up
WARMUP_S = 2.0  # nvmlDeviceGetPowerUsage is a 1 s average (Ampere+): the first samples still read the last load
INTERVAL_S = 0.1
BUSY_GRACE_S = 2.0  # a process that has just exited can stay in NVML's list a moment: look again before refusing
EVENT_FN = "nvmlDeviceGetCurrentClocksEventReasons"
THROTTLE_FN = "nvmlDeviceGetCurrentClocksThrottleReasons"  # the name before R535
_GONE_FOR_GOOD = frozenset({"NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_Deprecated"})


class UsageProblem(Exception):
    """Bad input (a batch that is not a number, an output path that cannot be written): the CLI's exit 2."""


class NothingMeasured(Exception):
    """Every load failed: there is no curve to write."""


# --- what runs the loads ---------------------------------------------------------------------------


# --- NVML beside the load --------------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # monotonic s, taken before the reads
    power_w: float | None
    sm_mhz: int | None
    mem_mhz: int | None
    reasons: int | None  # clock event reasons bitmask
    util_pct: int | None


class _Reader:
    """One GPU's dynamic readings; a call the device lacks is not asked again (as gpu.sample does)."""

    def __init__(self, lib: Any, handle: Any) -> None:
        self.lib, self.handle = lib, handle
        self.dead: set[str] = set()
        self.reasons_fn = EVENT_FN

    def _q(self, name: str, *args: Any) -> Any:
        if name in self.dead:
            return None
        fn = getattr(self.lib, name, None)
        if fn is None:
            self.dead.add(name)
            return None
        try:
            return fn(self.handle, *args)
        except Exception as exc:
            if not is_missing(exc):
                raise
            if error_name(exc) in _GONE_FOR_GOOD:
                self.dead.add(name)
            return None

    def read(self) -> Sample:
        t = time.monotonic()
        power = self._q("nvmlDeviceGetPowerUsage")
        util = self._q("nvmlDeviceGetUtilizationRates")
        reasons = self._q(self.reasons_fn)
        if reasons is None and self.reasons_fn == EVENT_FN and EVENT_FN in self.dead:
            self.reasons_fn = THROTTLE_FN  # a driver older than R535 has only the deprecated name
            reasons = self._q(THROTTLE_FN)
        return Sample(
            t=t,
            power_w=None if power is None else power / 1000.0,
            sm_mhz=self._q("nvmlDeviceGetClockInfo", self.lib.NVML_CLOCK_SM),
            mem_mhz=self._q("nvmlDeviceGetClockInfo", self.lib.NVML_CLOCK_MEM),
            reasons=None if reasons is None else int(reasons),
            util_pct=None if util is None else int(util.gpu),
        )


class Sampler:
    """Reads NVML every `interval_s` in a thread while the load runs in the caller's; an NVML error that is
    not "no such value" (the GPU fell off the bus) stops it and is raised by `stop()`."""

    def __init__(self, reader: _Reader, interval_s: float) -> None:
        self.reader, self.interval_s = reader, interval_s
        self.samples: list[Sample] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="runbook-calibrate-nvml", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.reader.read())
            except Exception as exc:  # noqa: BLE001 - handed to the caller by stop()
                self.error = exc
                return
            self._stop.wait(self.interval_s)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.samples


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _median(values: Sequence[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return statistics.median(present) if present else None


def reason_shares(samples: Sequence[Sample]) -> dict[str, float]:
    """Share of the samples (that read reasons at all) with each reason set; only the reasons seen."""
    read = [s.reasons for s in samples if s.reasons is not None]
    if not read:
        return {}
    shares = {name: sum(1 for r in read if r & bit) / len(read) for name, bit in CLOCK_EVENT_REASONS.items()}
    return {name: round(share, 3) for name, share in shares.items() if share > 0}


# --- the GPU's identity ----------------------------------------------------------------------------


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return text.strip() or None


def _optional(fn: Callable[..., Any], *args: Any) -> Any:
    """An identity field: any NVML error (NotSupported, NoPermission...) leaves it out, it never stops the run."""
    try:
        return query(fn, *args)
    except Exception as exc:
        if is_unavailable_error(exc):
            return None
        raise


def read_identity(lib: Any, handle: Any, index: int) -> GpuIdentity:
    pci = _optional(lib.nvmlDeviceGetPciInfo, handle)
    limit_mw = _optional(lib.nvmlDeviceGetEnforcedPowerLimit, handle)
    return GpuIdentity(
        index=index,
        name=_text(lib.nvmlDeviceGetName(handle)) or f"GPU {index}",
        uuid=_text(_optional(lib.nvmlDeviceGetUUID, handle)),
        pci_bus_id=_text(getattr(pci, "busId", None)) if pci is not None else None,
        board_part_number=_text(_optional(lib.nvmlDeviceGetBoardPartNumber, handle)),
        serial=_text(_optional(lib.nvmlDeviceGetSerial, handle)),
        driver_version=_text(_optional(lib.nvmlSystemGetDriverVersion)),
        power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
    )


def compute_processes(lib: Any, handle: Any) -> list[tuple[int, str | None]]:
    """(pid, name) of every compute process on the GPU but this one. NVML gives the host's PIDs: the name comes from
    /proc only where this process sees the host's PID namespace (in a container the same number is another process),
    and as plain text (a process names itself)."""
    found = _optional(lib.nvmlDeviceGetComputeRunningProcesses, handle) or []
    out: list[tuple[int, str | None]] = []
    own_namespace = _host_pid_namespace()
    for proc in found:
        pid = int(getattr(proc, "pid", 0) or 0)
        if pid == os.getpid():
            continue
        name: str | None = None
        if own_namespace:
            try:
                name = one_line(plain(Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace"))) or None
            except OSError:
                name = None
        out.append((pid, name))
    return out


def _host_pid_namespace() -> bool:
    """This process sees the host's PIDs (NVML's): /proc/self/ns/pid is init's."""
    try:
        return os.readlink("/proc/self/ns/pid") == os.readlink("/proc/1/ns/pid")
    except OSError:
        return True  # no namespaces to tell apart (or no /proc): take the PIDs as they are


# --- the measurement -------------------------------------------------------------------------------


@dataclass
class _Plan:
    kind: str  # calibration.LoadKind
    dtype: str | None = None
    batch: int | None = None

    @property
    def label(self) -> str:
        if self.kind == "copy":
            return "copy"
        if self.kind == "decode-gemm":
            return f"decode {self.dtype} x{self.batch}"
        return f"compute {self.dtype}"


def plan(dtypes: Sequence[str], batches: Sequence[int]) -> list[_Plan]:
    """The copy, then each dtype's decode GEMMs by batch, then the compute GEMMs: lowest intensity first."""
    return [_Plan("copy")] + [_Plan("decode-gemm", d, b) for d in dtypes for b in batches] + [_Plan("compute-gemm", d) for d in dtypes]


@dataclass
class Skipped:
    label: str
    why: str


def _run_one(reader: _Reader, load: GpuLoad, item: _Plan, seconds: float, warmup_s: float, interval_s: float) -> "LoadPoint":
    from .calibration import LoadPoint, flops_per_byte  # noqa: PLC0415

    began = [time.monotonic()]
    window = Window(seconds=seconds, warmup_s=warmup_s, started=lambda: began.__setitem__(0, time.monotonic()))
    sampler = Sampler(reader, interval_s).start()
    try:
        if item.kind == "copy":
            result = load.copy(window)
        elif item.kind == "decode-gemm":
            assert item.dtype is not None and item.batch is not None
            result = load.decode_gemm(item.dtype, item.batch, window)
        else:
            assert item.dtype is not None
            result = load.compute_gemm(item.dtype, window)
    finally:
        samples = sampler.stop()
    kept = [s for s in samples if s.t >= began[0] + warmup_s]
    if not any(s.power_w for s in kept):
        kept = [reader.read()]  # a sampler starved by a busy CPU: the load's state still holds right after it
    draws = [s.power_w for s in kept if s.power_w]
    if not draws:
        raise RuntimeError("NVML gave no power reading during it")
    if item.kind == "copy":
        intensity = 0.0
    elif item.kind == "decode-gemm":
        intensity = flops_per_byte(item.batch or 1, item.dtype or "bf16")
    else:
        intensity = flops_per_byte(float(result.get("rows", 8192)), item.dtype or "bf16")
    return LoadPoint(
        kind=item.kind,  # type: ignore[arg-type]
        dtype=item.dtype,
        batch=item.batch,
        flops_per_byte=intensity,
        draw_w=round(statistics.median(draws), 1),
        draw_p95_w=round(_p95(draws), 1),
        sm_mhz=_median([s.sm_mhz for s in kept]),
        mem_mhz=_median([s.mem_mhz for s in kept]),
        util_pct=_median([s.util_pct for s in kept]),
        clock_event_reasons=reason_shares(kept),
        gbps=_rounded(result.get("gbps")),
        tflops=_rounded(result.get("tflops")),
        seconds=_rounded(result.get("seconds", seconds)),
        samples=len(kept),
    )


def _rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), digits)


def calibrate(
    nvml: Nvml,
    load: GpuLoad,
    gpu_index: int = 0,
    *,
    seconds: float = SECONDS,
    batches: Sequence[int] = BATCHES,
    warmup_s: float = WARMUP_S,
    interval_s: float = INTERVAL_S,
    on_point: Callable[["LoadPoint"], None] | None = None,
    on_skip: Callable[[Skipped], None] | None = None,
) -> "Calibration":
    """Run every load on GPU `gpu_index` (NVML's index) and return the curve. The caller checks first that the
    GPU is idle (`compute_processes`): another process's work would be measured with ours. A load that fails
    (out of memory, a kernel the GPU lacks) is skipped and said; NothingMeasured when all of them did."""
    from .calibration import Calibration  # noqa: PLC0415

    lib = nvml.ensure_init()
    handle = lib.nvmlDeviceGetHandleByIndex(gpu_index)
    ident = read_identity(lib, handle, gpu_index)
    reader = _Reader(lib, handle)
    began = datetime.now(timezone.utc).isoformat(timespec="seconds")
    points: list[LoadPoint] = []
    skipped: list[Skipped] = []
    for item in plan(load.dtypes(), batches):
        try:
            point = _run_one(reader, load, item, seconds, warmup_s, interval_s)
        except Exception as exc:  # noqa: BLE001 - one load failing (OOM, no such kernel) leaves the others' points
            skip = Skipped(item.label, f"{type(exc).__name__}: {one_line(exc)}")
            skipped.append(skip)
            if on_skip is not None:
                on_skip(skip)
            continue
        points.append(point)
        if on_point is not None:
            on_point(point)
    if not points:
        raise NothingMeasured("; ".join(f"{s.label}: {s.why}" for s in skipped) or "no load ran")
    return Calibration(
        gpu_name=ident.name,
        board_part_number=ident.board_part_number,
        serial=ident.serial,
        driver_version=ident.driver_version,
        power_limit_w=ident.power_limit_w,
        host=socket.gethostname() or None,
        measured_at=began,
        gpu_index=gpu_index,
        library=load.describe(),
        loads=points,
    )


# --- the command -----------------------------------------------------------------------------------


def parse_batches(text: str | None) -> tuple[int, ...]:
    if text is None:
        return BATCHES
    found: list[int] = []
    for word in text.split(","):
        word = word.strip()
        try:
            n = int(word)
        except ValueError:
            n = 0
        if not 1 <= n <= MAX_BATCH:
            raise UsageProblem(f"--batches {text}: {word!r} is not a batch (a whole number from 1 to {MAX_BATCH}); e.g. --batches 1,8,64")
        if n not in found:
            found.append(n)
    return tuple(sorted(found))


def _check_seconds(value: float | None, default: float, flag: str, *, zero_ok: bool) -> float:
    seconds = default if value is None else float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_ok) or seconds > 600:
        raise UsageProblem(f"{flag} {seconds:g}: expected seconds, {'0' if zero_ok else 'more than 0'} to 600")
    return seconds


def check_out(path: str | None) -> Path | None:
    """Fail before measuring, and without creating anything: the output is a .json file or a directory, and the
    nearest directory that exists is writable."""
    if path is None:
        return None
    if not path.strip():
        raise UsageProblem("--out: the path is empty (give a .json file or a directory, or leave --out out)")
    target = Path(path).expanduser()
    try:
        if target.exists() and not target.is_dir() and target.suffix != ".json":
            raise UsageProblem(f"--out {path}: not a directory and not a .json file")
        if target.is_dir() and target.suffix == ".json":
            raise UsageProblem(f"--out {path}: is a directory named .json (give a file name or another directory)")
        probe = target if target.suffix != ".json" else target.parent
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
    except OSError as exc:  # a name longer than the OS allows
        raise UsageProblem(f"--out {path[:120]}: {exc.strerror or exc}") from None
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise UsageProblem(f"--out {path}: cannot write under {probe}")
    return target


def _say(stream: TextIO, line: str) -> None:
    print(line, file=stream, flush=True)


def describe_point(p: "LoadPoint") -> str:
    """One load's line: what ran, what it drew, at which clocks and why they were held, how fast it went."""
    label = _Plan(p.kind, p.dtype, p.batch).label
    clocks = f"SM {p.sm_mhz:.0f} MHz" if p.sm_mhz is not None else "SM ? MHz"
    clocks += f", mem {p.mem_mhz:.0f} MHz" if p.mem_mhz is not None else ""
    reasons = ", ".join(f"{k} {v:.0%}" for k, v in sorted(p.clock_event_reasons.items(), key=lambda kv: -kv[1])) or "no clock event reason"
    rates = "  ".join(x for x in (f"{p.gbps:,.0f} GB/s" if p.gbps is not None else "", f"{p.tflops:,.1f} TFLOP/s" if p.tflops is not None else "") if x)
    return f"{label:<18} {p.flops_per_byte:>7g} FLOP/B  {p.draw_w:>6.1f} W  {clocks}  {reasons:<21}  {rates}".rstrip()


def calibrate_main(
    args: argparse.Namespace,
    nvml_module: Any = None,
    load: GpuLoad | None = None,
    *,
    interval_s: float = INTERVAL_S,
    busy_grace_s: float = BUSY_GRACE_S,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """`runbook calibrate` after parsing: the exit code. `nvml_module` (a fake pynvml) and `load` (a fake
    GpuLoad) are how tests run it without a GPU; by default the real pynvml and PyTorch."""
    out_stream = stdout or sys.stdout
    err_stream = stderr or sys.stderr
    batches = parse_batches(args.batches)
    seconds = _check_seconds(args.seconds, SECONDS, "--seconds", zero_ok=False)
    warmup_s = _check_seconds(args.warmup, WARMUP_S, "--warmup", zero_ok=True)
    out = check_out(args.out)
    progress = err_stream if args.json else out_stream  # with --json, standard output carries only the JSON

    nvml = Nvml(nvml_module)
    try:
        lib = nvml.ensure_init()
    except Exception as exc:
        if not is_unavailable_error(exc):
            raise
        _say(err_stream, f"runbook calibrate: no GPU here, nothing measured: NVML is unavailable ({unavailable_reason(exc)})")
        return EXIT_NO_GPU
    try:
        return _measure(nvml, lib, args, load, batches, seconds, warmup_s, interval_s, busy_grace_s, out, progress, out_stream, err_stream)
    finally:
        nvml.shutdown()


def _measure(nvml: Nvml, lib: Any, args: argparse.Namespace, load: GpuLoad | None, batches: tuple[int, ...], seconds: float,
             warmup_s: float, interval_s: float, busy_grace_s: float, out: Path | None, progress: TextIO, out_stream: TextIO,
             err_stream: TextIO) -> int:
    from . import calibration  # noqa: PLC0415

    count = lib.nvmlDeviceGetCount()
    if count == 0:
        _say(err_stream, "runbook calibrate: no GPU here, nothing measured: NVML sees no device")
        return EXIT_NO_GPU
    if not 0 <= args.gpu < count:
        raise UsageProblem(f"--gpu {args.gpu}: NVML sees {count} GPU{'s' if count > 1 else ''} (index 0{f' to {count - 1}' if count > 1 else ''})")
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(args.gpu)
        ident = read_identity(lib, handle, args.gpu)
    except Exception as exc:
        if not is_unavailable_error(exc):
            raise
        _say(err_stream, f"runbook calibrate: GPU {args.gpu} cannot be opened, nothing measured: {unavailable_reason(exc)}")
        return EXIT_NO_GPU
    busy = compute_processes(lib, handle)
    deadline = time.monotonic() + busy_grace_s
    while busy and time.monotonic() < deadline:
        time.sleep(0.25)
        busy = compute_processes(lib, handle)
    if busy:
        who = ", ".join(f"pid {pid} ({name or 'name not readable here'})" for pid, name in busy)
        _say(err_stream, f"runbook calibrate: GPU {args.gpu} ({ident.name}) is not idle: {who} hold{'s' if len(busy) == 1 else ''} it; "
                         "stop them and run it again (their work would be measured with ours)")
        return EXIT_BUSY
    if query(lib.nvmlDeviceGetPowerUsage, handle) is None:
        _say(err_stream, f"runbook calibrate: GPU {args.gpu} ({ident.name}) reports no power draw to NVML: nothing to calibrate")
        return EXIT_NO_GPU
    if load is None:
        try:
            from .calibrate_torch import TorchLoad  # noqa: PLC0415 - PyTorch only when a calibration runs

            load = TorchLoad.open(ident)
        except LoadUnavailable as exc:
            _say(err_stream, f"runbook calibrate: nothing measured: {exc}")
            return EXIT_NO_GPU
    # this process's own CUDA context, as NVML sees it (in a container its PID is not os.getpid()): not "another process"
    own_context = {pid for pid, _ in compute_processes(lib, handle)}
    try:
        dtypes = load.dtypes()
        board = f", board {ident.board_part_number}" if ident.board_part_number else ""
        limit = f", {ident.power_limit_w:g} W limit" if ident.power_limit_w else ""
        loads = len(plan(dtypes, batches))
        _say(progress, f"calibrating GPU {args.gpu}: {ident.name}{board}, driver {ident.driver_version or '?'}{limit}, with {load.describe()}: "
                       f"{loads} loads of {warmup_s:g} + {seconds:g} s (about {_duration(loads * (warmup_s + seconds))}); {', '.join(dtypes)}")
        for note in load.notes():
            _say(progress, f"  {note}")
        try:
            cal = calibrate(nvml, load, args.gpu, seconds=seconds, batches=batches, warmup_s=warmup_s, interval_s=interval_s,
                            on_point=lambda p: _say(progress, describe_point(p)),
                            on_skip=lambda s: _say(err_stream, f"{s.label:<18} not measured: {s.why}"))
        except NothingMeasured as exc:
            _say(err_stream, f"runbook calibrate: nothing measured: every load failed ({exc})")
            return EXIT_NO_GPU
    finally:
        load.close()
    late = [p for p in compute_processes(lib, handle) if p[0] not in own_context]
    if late:
        _say(err_stream, "runbook calibrate: warning: " + ", ".join(f"pid {pid} ({name or '?'})" for pid, name in late)
             + " started on the GPU while it was measured: the figures may include their work")
    try:
        path = calibration.save(cal, out)
    except OSError as exc:  # the disk filled, or the directory went read-only, while it measured
        if args.json:
            out_stream.write(cal.model_dump_json(indent=2) + "\n")
        _say(err_stream, f"runbook calibrate: measured, but cannot write {out or calibration.default_dir()}: {exc.strerror or exc}")
        return EXIT_USAGE
    if args.json:
        out_stream.write(cal.model_dump_json(indent=2) + "\n")
        out_stream.flush()
    _say(progress, f"Calibration: {path}")
    return EXIT_OK


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
