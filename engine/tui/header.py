"""The one-line header: what runs against what, for how long, and in which state."""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from ..marks import COLOURS
from ..target import recorded_url, server_named
from .clock import clock_text

PORT = re.compile(r"(?<=:)\d{2,5}\b")
PHASE_STYLE = {"finished": "green", "interrupted": "yellow", "failed": "magenta", "cancelling": "yellow"}


def mask_ports(text: str) -> str:
    """Simulated hosts listen on random ports; stable renders hide them."""
    return PORT.sub("PORT", text)


def target_text(target: dict[str, Any], inventory: dict[str, Any], stable: bool = False) -> str:
    """The scenario (simulated), the server kind found with its version and address (`vLLM 0.11.0 at http://...`),
    then GPU count and model once evidence has told us."""
    if target.get("server_kind") or (inventory.get("server") or {}).get("server_kind"):
        server = server_named(target, inventory.get("server"))
        parts = [str(target["label"]), server] if target.get("label") else [server]
    else:  # the kind was not asked: where, as given
        parts = [str(target.get("label") or recorded_url(target) or "local host")]
    if stable:
        parts = [mask_ports(p) for p in parts]
    gpus = inventory.get("gpus") or {}
    if gpus.get("gpu_count"):
        parts.append(f"{gpus['gpu_count']}× {gpus.get('gpu_name') or 'GPU'}")
    model = _model_name(inventory)
    if model:
        parts.append(model)
    return " · ".join(parts)


def _model_name(inventory: dict[str, Any]) -> str:
    for section in ("model", "server"):
        values = inventory.get(section) or {}
        for key in ("served_model_name", "model_name", "model_path", "model", "name"):
            value = values.get(key)
            if isinstance(value, str) and value:
                return value.rstrip("/").rsplit("/", 1)[-1] if "/" in value and section == "server" else value
    return ""


class RunHeader(Horizontal):
    """Left: runbook and target (cut with an ellipsis when narrow). Right: elapsed time and state."""

    def compose(self) -> ComposeResult:
        yield Static("runbook", id="header-left", markup=False)
        yield Static("", id="header-right", markup=False)

    _last: tuple = ()

    def show(self, runbook: str, target: str, elapsed: float, phase: str, spinner: str) -> None:
        key = (runbook, target, int(elapsed), phase, spinner)
        if key == self._last:
            return
        self._last = key
        left = Text()
        left.append(" runbook ", style="bold reverse")
        left.append(f" {runbook}", style="bold")
        if target:
            left.append(f"  {target}", style="dim")
        right = Text()
        right.append(clock_text(elapsed), style="bold")
        right.append("  ")
        busy = not (phase in PHASE_STYLE and phase != "cancelling")
        right.append(f"{spinner} " if busy and phase != "starting" else "", style=COLOURS["running"])
        right.append(phase, style=PHASE_STYLE.get(phase, COLOURS["running"]))
        right.append(" ")
        self.query_one("#header-left", Static).update(left)
        self.query_one("#header-right", Static).update(right)
