"""Bounded file reads for probes: a file another program wrote (a model's config.json, a profiler trace, a
results file) is read only if it is a regular file, never through a symlink when asked not to, and never
past a size cap, so a FIFO, a device, a 2 GB file or a link to /etc/shadow costs an error, not a hang.

`open_regular` is the one way in; `read_text_capped` reads a whole small file with it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

MAX_CONFIG_BYTES = 16 * 1024 * 1024  # a model's config.json is ~5 KB; 16 MB is already absurd


class FileLimitError(OSError):
    """A file refused before or while reading it; the message names the file and the limit."""


def open_regular(path: str | Path, *, follow_symlinks: bool = True, inside: str | Path | None = None) -> BinaryIO:
    """Open `path` for reading in binary, refusing anything but a regular file (FIFOs would block forever,
    devices never end). `follow_symlinks=False` refuses a symlink as the last component; `inside` refuses a
    file whose real path is outside that directory."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow_symlinks else getattr(os, "O_NOFOLLOW", 0))
    if inside is not None:
        real, root = os.path.realpath(path), os.path.realpath(inside)
        if os.path.commonpath([real, root]) != root:
            raise FileLimitError(f"{path}: outside {inside}; not read")
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if not follow_symlinks and os.path.islink(path):
            raise FileLimitError(f"{path}: a symbolic link; not followed") from None
        raise exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileLimitError(f"{path}: not a regular file (a FIFO, device or directory); not read")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes_capped(path: str | Path, limit: int, limit_name: str = "MAX_CONFIG_BYTES", **kw: object) -> bytes:
    with open_regular(path, **kw) as f:  # type: ignore[arg-type]
        data = f.read(limit + 1)  # counted as read: a file that grows meanwhile is bounded too
    if len(data) > limit:
        raise FileLimitError(f"{path}: larger than {_size(limit)} (limit: {limit_name} {_size(limit)}); not read")
    return data


def read_text_capped(path: str | Path, limit: int = MAX_CONFIG_BYTES, limit_name: str = "MAX_CONFIG_BYTES", **kw: object) -> str:
    """The whole file as UTF-8 text; FileLimitError past `limit` bytes or for anything not a regular file."""
    return read_bytes_capped(path, limit, limit_name, **kw).decode("utf-8")


def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"
