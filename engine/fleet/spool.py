"""Where forked workers put their hosts' results text: an unlinked temporary file per worker, opened by the
parent before the fork. A worker sends back only where each host's text lies; sending the text itself through
the pool's pipe (~100 KB a host, 1 GB for 10,000 hosts) cost ~4 s of pickling, copying and unpickling, and the
parent held it all in memory. The file disappears with its last handle; nothing is left on disk."""

from __future__ import annotations

import os
import tempfile
import weakref
from dataclasses import dataclass

_OPEN: "weakref.WeakValueDictionary[int, Spool]" = weakref.WeakValueDictionary()  # the parent's spools, by fd


class Spool:
    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()  # unlinked at once: nothing outlives the process
        self.fd = self._file.fileno()
        self._end = 0  # where the next text goes (only the worker that owns the spool writes)
        _OPEN[self.fd] = self

    def put(self, data: bytes) -> "Spooled":
        at, view = self._end, memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, self._end)
            self._end += written
            view = view[written:]
        return Spooled(self, at, len(data))

    def read(self, at: int, size: int) -> str:
        chunks, got = [], 0
        while got < size:
            chunk = os.pread(self.fd, size - got, at + got)
            if not chunk:
                raise OSError(f"results spool ended at {at + got} of {at + size}")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks).decode()

    def close(self) -> None:
        self._file.close()

    def __reduce__(self) -> tuple:
        return (_reopened, (self.fd,))  # the same descriptor in the parent, which forked the worker with it open


def _reopened(fd: int) -> Spool:
    spool = _OPEN.get(fd)
    if spool is None:
        raise OSError(f"no results spool open on descriptor {fd} in this process")
    return spool


@dataclass(frozen=True)
class Spooled:
    """One text in a spool: what a worker sends back in its place."""

    spool: Spool
    at: int
    size: int

    def text(self) -> str:
        return self.spool.read(self.at, self.size)


__all__ = ["Spool", "Spooled"]
