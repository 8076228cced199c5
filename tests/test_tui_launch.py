"""`runbook run` with a terminal: the app paints before the runbook loads (gpu_runbook.tui.launch), then
the run fills it in; the outputs are written and the summary printed after it closes, and a usage error
found while loading is printed as always, after the terminal is restored."""

from __future__ import annotations

import os
import pty
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

import fcntl
import termios

from tests.test_cli_conventions import ENV, PROBE_FILES, QUICK

CLI = [sys.executable, "-m", "gpu_runbook.cli"]


class Terminal:
    """The command on a pseudo-terminal of 100x30 as stdin and stdout, like a person's."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        env = {**ENV, "TERM": "xterm-256color"}
        self.proc = subprocess.Popen(CLI + args, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
        os.close(slave)
        self.fd, self.seen = master, b""

    def read_until(self, marker: bytes, timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        while marker not in self.seen and time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # EIO: the child has closed the terminal
                    return marker in self.seen
                if not chunk:
                    break
                self.seen += chunk
        return marker in self.seen

    def finish(self, timeout: float = 60) -> int:
        self.read_until(b"\0never\0", timeout=timeout) if self.proc.poll() is None else None
        code = self.proc.wait(timeout=timeout)
        os.close(self.fd)
        return code


def test_the_app_runs_the_runbook_it_loaded_behind_the_first_screen(tmp_path: Path) -> None:
    (tmp_path / "quick.yaml").write_text(QUICK)
    term = Terminal(["run", "quick.yaml", "--probes-dir", str(PROBE_FILES), "--report", "r.md", "--json", "r.json"], tmp_path)
    try:
        assert term.read_until(b"hypotheses"), term.seen[-2000:]
        assert term.read_until(b"finished"), term.seen[-2000:]  # the runner came to the app on screen and ran
        os.write(term.fd, b"q")
        assert term.read_until(b"Verdicts: 2 confirmed"), term.seen[-2000:]  # the summary, once the app closed
        assert term.finish() == 0
        assert b"Traceback" not in term.seen
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    assert "warm" in (tmp_path / "r.md").read_text() and (tmp_path / "r.json").exists()


def test_a_usage_error_found_while_loading_closes_the_app_and_is_printed(tmp_path: Path) -> None:
    (tmp_path / "quick.yaml").write_text(QUICK)
    term = Terminal(["run", "quick.yaml", "--probes-dir", str(PROBE_FILES), "--set", "treshold=2", "--report", "r.md"], tmp_path)
    try:
        assert term.read_until(b"did you mean"), term.seen[-2000:]
        assert term.finish() == 2
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    assert not (tmp_path / "r.md").exists()
