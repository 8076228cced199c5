"""An app already on screen waiting for the runner that `runbook run` is still building (launch.py).

Its own module, free of Textual and of the app, so the app can look for a waiting screen and the launcher
can register one without the two importing each other.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

_waiting: "Handoff | None" = None


class Handoff:
    """Between the main thread, which runs the app, and the thread that loads the runbook and starts the run."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.loop: asyncio.AbstractEventLoop | None = None  # the app's loop, known once it has painted
        self.closed = threading.Event()  # set once the app has returned and the terminal is restored

    def call(self, fn: Callable[..., Any], *args: Any) -> bool:
        """`fn(*args)` on the app's loop, without waiting: False when the app has already closed."""
        if self.loop is None or self.closed.is_set():
            return False
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed
            return False
        return True

    def hand_over(self, runner: Any, json_path: str | None, report_path: str | None) -> Any:
        """Give the app its runner, then wait until it closes; returns the app."""
        self.call(self.app.adopt, runner, json_path, report_path)
        self.closed.wait()
        return self.app


def on_screen() -> Handoff | None:
    """The app waiting for a runner, if `runbook run` started one first."""
    return _waiting


def register(handoff: Handoff | None) -> None:
    global _waiting
    _waiting = handoff
