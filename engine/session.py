"""One `runbook run`: pick the target (real or simulated), run with a renderer, always write what was found."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from . import report
from .loader import LoadedRunbook
from .target import Target
from .progress import ProgressPrinter, summary
from .registry import Registry
from .results import Results
from .runner import Runner


@dataclass
class Outcome:
    results: Results
    json_path: Path | None
    report_path: Path | None


@contextlib.contextmanager
def target_for(server_url: str, api_key: str | None, simulate: str | None, server_kind: str | None = None,
               calibration: str | None = None) -> Iterator[tuple[Target, Any, Any]]:
    """(target, GPU backend, simulated host or None). A simulated host lives exactly as long as the run.

    The server kind is `server_kind` when given (--server-kind), else detected from what the server answers; the GPU
    vendor is whichever GPU library answers (NVML, then amdsmi: `gpu_backend.detect`), and the target says which
    libraries were looked for.
    A real host's GPUs are judged against their calibration in the user's directory unless `calibration` names
    another; a simulated host's only against one named (a file on this machine says nothing of simulated GPUs)."""
    if not simulate:
        from .calibration import default_dir  # noqa: PLC0415

        from .gpu_backend import GpuBackend, detect  # noqa: PLC0415

        backend = GpuBackend()
        found = detect(backend)
        target = Target(server_url=server_url, api_key=api_key, calibration=calibration or str(default_dir()),
                        gpu_vendor=found.vendor, gpu_found=found.words)
        try:
            yield with_server_kind(target, server_kind), backend, None
        finally:
            backend.shutdown()
        return
    from .sim.host import SimulatedHost  # noqa: PLC0415

    with SimulatedHost.start(simulate) as host:
        target = host.target().model_copy(update={"calibration": calibration})
        yield with_server_kind(target, server_kind), host.gpu, host


def with_server_kind(target: Target, override: str | None) -> Target:
    if not override and target.server_kind is not None:  # the simulated host knows what it runs
        return target
    if override:
        return target.model_copy(update={"server_kind": override, "server_found": f"{override} (--server-kind)"})
    from .server_kind import detect  # noqa: PLC0415

    found = detect(target.server_url, target.auth_headers())
    return target.model_copy(update={"server_kind": found.kind, "server_found": found.found})


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C or SIGTERM while the outputs are written takes effect once they are (a KeyboardInterrupt after
    the block): a half-written report is worth less than an exit a few milliseconds later."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: pending.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            raise KeyboardInterrupt


def write_outputs(results: Results, json_path: str | None, report_path: str | None) -> tuple[Path | None, Path | None]:
    """Write both; one that fails does not stop the other (the paths were checked before the run)."""
    written_json = written_report = None
    try:
        written_json = results.write_json(json_path) if json_path else None
    except OSError as exc:
        print(f"runbook: could not write {json_path}: {exc.strerror}", file=sys.stderr)
    try:
        written_report = report.write(results, report_path) if report_path != "-" else None  # "-": the caller prints it
    except OSError as exc:
        print(f"runbook: could not write the report {report_path or ''}: {exc.strerror}", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - evidence a renderer chokes on must not cost the results (a bug to report)
        print(f"runbook: could not render the report: {type(exc).__name__}: {exc}" + ("; the results are in the JSON" if written_json else ""), file=sys.stderr)
    return written_json, written_report


def rerun_lines(results: Results) -> list[str]:
    """What each re-run in the TUI changed, so the terminal says which verdicts were decided again and how."""
    out = []
    for r in results.reruns:
        how = "re-judged on recorded evidence" if r.mode == "rejudge" else "measured again"
        line = f"Re-run of {r.hypothesis} ({how}): {len(r.rejudged)} re-judged, {len(r.remeasured)} measured again"
        if r.interrupted:
            line += f"; stopped, {len(r.kept)} kept their earlier verdicts ({', '.join(r.kept)})"
        out.append(line)
    return out


def run_session(
    loaded: LoadedRunbook,
    registry: Registry,
    params: dict[str, Any],
    *,
    server_url: str,
    api_key: str | None = None,
    simulate: str | None = None,
    json_path: str | None = None,
    report_path: str | None = None,
    tui: bool = False,
    verbose: bool = False,
    record_all: bool = False,
    quiet: bool = False,
    depth: str = "standard",
    next_command: str | None = None,
    server_kind: str | None = None,
    calibration: str | None = None,
) -> Outcome:
    with target_for(server_url, api_key, simulate, server_kind, calibration) as (target, gpu, host):
        runner = Runner(loaded, registry, target, params, gpu=gpu, record_all=record_all, depth=depth)
        if tui:
            from .tui.app import run_app  # noqa: PLC0415 - Textual only when a terminal wants it

            results = run_app(runner, json_path=json_path, report_path=report_path)
        else:
            runner.subscribers.append(ProgressPrinter(verbose=verbose, quiet=quiet))
            try:
                results = asyncio.run(runner.run())
            except (KeyboardInterrupt, asyncio.CancelledError):
                results = runner.snapshot(interrupted=True)
            if runner.renderer_error is not None:
                print(f"runbook: the progress display failed ({runner.renderer_error}); the run was stopped", file=sys.stderr)
                if not results.interrupted:
                    results = runner.snapshot(interrupted=True)
        if host is not None:
            results.target["simulator"] = host.report()
        results.next_command = next_command
        results = results.scrubbed(target.secrets())  # the load's error examples too: no escapes, no key, in any output
    with signals_deferred():
        written_json, written_report = write_outputs(results, json_path, report_path)
        # printed after the TUI closes too, so the terminal keeps the findings and the paths
        print(summary(results, str(written_json) if written_json else None, str(written_report) if written_report else None), file=sys.stdout, flush=True)
        for line in rerun_lines(results):
            print(line, file=sys.stdout, flush=True)
    return Outcome(results, written_json, written_report)
