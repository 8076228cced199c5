"""The live Textual UI for `runbook run` in a terminal. Only engine/session.py imports it, lazily."""

from __future__ import annotations

__all__ = ["RunbookApp", "run_app"]


def __getattr__(name: str):  # lazy: importing the package must not pull Textual in by itself
    if name in __all__:
        from . import app  # noqa: PLC0415

        return getattr(app, name)
    raise AttributeError(name)
