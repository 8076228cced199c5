"""Time as the UI shows it. Injectable so snapshot tests render fixed times and a still spinner."""

from __future__ import annotations

import time

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Clock:
    """Monotonic seconds since the app started; the spinner frame follows wall time."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def spinner(self) -> str:
        return SPINNER[int(time.monotonic() * 10) % len(SPINNER)]

    def duration(self, seconds: float) -> str:
        return f"{seconds:.1f}s"


class StableClock(Clock):
    """Always zero: elapsed times, durations and the spinner render the same in every run."""

    def elapsed(self) -> float:
        return 0.0

    def spinner(self) -> str:
        return SPINNER[0]

    def duration(self, seconds: float) -> str:
        return "-.-s"


def clock_text(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"
