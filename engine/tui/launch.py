"""`runbook run` in a terminal: the screen first, then the runbook.

Reading the runbook (YAML, CEL), discovering the probes and starting a simulated host take a second or
more on a busy machine; a person should see the app at once. So the app starts empty, saying what it
loads, and the rest of the command runs in a thread, unchanged: when it reaches `run_app`, the runner is
handed to the app already on screen. A usage error found on the way closes the app and is printed as
always, after the terminal is restored.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

from .app import RunbookApp
from .handoff import Handoff, register


def run_tui_first(work: Callable[[], int], loading: str) -> int:
    """Paint the app, then run `work` (the rest of the command) in a thread; returns what `work` returns,
    or raises what it raised. `loading`: the runbook's name, shown until the runbook is read."""
    app = RunbookApp(None, loading=loading)
    handoff = Handoff(app)
    outcome: dict[str, object] = {}

    def body() -> None:
        try:
            outcome["code"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, raised there
            outcome["error"] = exc
        finally:
            handoff.call(app.exit)  # ended without a run (a usage error): close the app, if still open

    worker = threading.Thread(target=body, name="runbook-load", daemon=True)

    def painted() -> None:
        handoff.loop = asyncio.get_running_loop()
        worker.start()

    app.when_painted = painted
    register(handoff)
    try:
        app.run()
    finally:
        handoff.closed.set()
        if worker.is_alive() or worker.ident is not None:
            worker.join()
        register(None)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return int(outcome.get("code", 1))  # type: ignore[arg-type] # (1: the app failed before it painted)
