"""Strings from a server, a trace or a results file are data, never terminal control: the one place that
strips control characters (ESC/CSI/OSC sequences, BEL, C1, bidi overrides) and redacts secrets.

Used where data enters (the runner scrubs each probe's evidence, `read_results` each results file), where
results are written (JSON and report), and on the CLI's stdout/stderr (`ScrubbedStream`), so a server
string that sets the terminal's clipboard through OSC 52 or echoes the API key reaches no output.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, TextIO

# Whole escape sequences first (so their parameters do not survive as text), then any lone control char.
# Kept: \t and \n. C1 (0x80-0x9f) includes the 8-bit CSI/OSC introducers; U+202A-E/2066-9 reorder text.
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC (clipboard, title, hyperlinks) up to BEL or ST
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC
    r"|\x1b.?"  # any other escape
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]",
    re.DOTALL,
)
REDACTED = "***"
# Shorter secrets are not redacted by substring (a 2-char "key" would blank out half the report); they are
# still never sent anywhere but the target (see gpu_runbook.fetch).
MIN_SECRET_LEN = 4


_SGR = re.compile(r"\x1b\[[0-9;]*m")
_SGR_SPLIT = re.compile(r"(\x1b\[[0-9;]*m)")


def plain(text: str, secrets: Iterable[str] = (), keep_colour: bool = False) -> str:
    """`text` with control characters and escape sequences removed and every secret replaced by ***.
    `keep_colour`: SGR colour sequences stay (the CLI's own coloured verdict marks); they set no clipboard,
    title or cursor, and data reaching the stream was scrubbed whole before."""
    if keep_colour and _has_control(text):
        out = "".join(part if _SGR.fullmatch(part) else _CONTROL.sub("", part) for part in _SGR_SPLIT.split(text))
    else:
        out = _CONTROL.sub("", text) if _has_control(text) else text
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_LEN and secret in out:
            out = out.replace(secret, REDACTED)
    return out


def _has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


def scrub_tree(value: Any, secrets: Iterable[str] = ()) -> Any:
    """A JSON-like value (dicts, lists, tuples, strings) with `plain` applied to every string, keys included."""
    keys = tuple(s for s in secrets if s)
    return _walk(value, keys)


def _walk(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return plain(value, secrets)
    if isinstance(value, dict):
        return {(plain(k, secrets) if isinstance(k, str) else k): _walk(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, secrets) for v in value]
    if isinstance(value, tuple):
        return tuple(_walk(v, secrets) for v in value)
    return value


def secret_forms(key: str | None) -> list[str]:
    """The forms in which a key can come back from a server: as is, and as the header that carried it."""
    if not key:
        return []
    return [f"Bearer {key}", key]


class ScrubbedStream:
    """A text stream that writes through `plain`: the CLI's stdout and stderr while a command runs."""

    def __init__(self, stream: TextIO, secrets: Iterable[str] = ()) -> None:
        self._stream = stream
        self._secrets = tuple(s for s in secrets if s)

    def write(self, text: str) -> int:
        self._stream.write(plain(text, self._secrets, keep_colour=True))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, buffer...
        return getattr(self._stream, name)
