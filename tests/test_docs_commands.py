"""Every `runbook ...` command in a fenced code block of README.md and docs/*.md runs here and exits as the page
says (issue 32 item 3), or the text right before its block says why not: an HTML comment starting
`<!-- not run` with the reason (a real GPU, a Prometheus, a fresh virtual environment, minutes of runs that
another test already makes).

How a block runs: its lines in order (a trailing `\\` continues a line; `#` lines are comments), each through
`bash -o pipefail -c` in one temporary directory per block (so outputs land there; `examples/` and `runbooks/`
are linked into it, so the pages' relative paths resolve), with the installed `runbook` first on PATH. A line
exits 0 unless it ends in `# exits N`. A `runbook simulate ... --port N` line is started in the background
with `--port 0` (an ephemeral port on 127.0.0.1); the address it prints replaces `http://127.0.0.1:N` in the
lines after it, as a reader's second terminal would use it, and it must end cleanly (exit 0) on SIGTERM."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELLS = {"bash", "sh", "shell", "console"}
COMMAND = re.compile(r"(?:^|[|;&]\s*|\$\(\s*)runbook\s")
EXITS = re.compile(r"#\s*exits\s+(\d+)\s*$")
SIMULATE = re.compile(r"^runbook simulate (?P<args>.*?)--port (?P<port>\d+)(?P<rest>.*)$")
LINE_TIMEOUT_S = 240


@dataclass
class Block:
    page: str
    line: int  # of the opening fence
    lang: str
    text: str
    before: str  # the last non-blank line before the fence

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def not_run(self) -> str | None:
        """The reason the text before the block gives for not running it, or None."""
        m = re.fullmatch(r"<!--\s*not run\b[:\s]*(.*?)\s*-->", self.before.strip(), flags=re.S)
        return m.group(1) if m else None

    def lines(self) -> list[str]:
        """Logical lines: continuations joined, blanks and comment lines dropped."""
        out: list[str] = []
        pending = ""
        for raw in self.text.splitlines():
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            line = (pending + raw).strip()
            pending = ""
            if line and not line.startswith("#"):
                out.append(line)
        return out

    def commands(self) -> list[str]:
        return [line for line in self.lines() if COMMAND.search(line)]


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = re.match(r"^(```+|~~~+)\s*([\w-]*)", lines[i])
            if not fence:
                i += 1
                continue
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1))), len(lines))
            before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            found.append(Block(page.relative_to(REPO).as_posix(), i + 1, fence.group(2).lower(), "\n".join(lines[i + 1 : end]), before))
            i = end + 1
    return found


ALL = blocks()
WITH_COMMANDS = [b for b in ALL if b.commands()]
TO_RUN = [b for b in WITH_COMMANDS if b.not_run is None]


def test_every_command_block_runs_here_or_says_why_not():
    assert len(TO_RUN) >= 8, [b.id for b in TO_RUN]  # the parser found the pages' blocks
    wrong = [f"{b.id}: a block of `runbook` commands in ```{b.lang or '(no language)'}: make it ```bash or mark it"
             for b in TO_RUN if b.lang not in SHELLS]  # fmt: skip
    wrong += [f"{b.id}: '<!-- not run -->' without a reason" for b in WITH_COMMANDS if b.not_run == ""]
    assert not wrong, "\n".join(wrong)


def test_the_readme_first_block_is_the_ci_commands():
    """The README's first screen: its two install-and-run commands are not run here (they make a virtual
    environment and install), so the marker must say who runs them: .ci/run."""
    first = next(b for b in ALL if b.page == "README.md")
    assert first.not_run and ".ci/run" in first.not_run
    assert first.line <= 25, "the first commands are on the README's first screen"


def environment(work: Path) -> dict[str, str]:
    runbook = Path(sys.executable).parent / "runbook"
    bindir = runbook.parent if runbook.exists() else Path(shutil.which("runbook") or "").parent
    assert (bindir / "runbook").exists(), "the `runbook` command is not installed beside this Python"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env.update(PATH=f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               NO_COLOR="1", XDG_CONFIG_HOME=str(work / ".config"), HOME=str(work))  # fmt: skip
    return env


def start_simulate(line: str, work: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str, str]:
    m = SIMULATE.match(line)
    assert m, f"a `runbook simulate` line in the docs names --port: {line}"
    argv = f"runbook simulate {m.group('args')}--port 0{m.group('rest')}"
    proc = subprocess.Popen(["bash", "-c", f"exec {argv}"], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()  # the first line it prints is its address
    assert url.startswith("http://127.0.0.1:"), f"{line}: printed {url!r} first ({proc.stderr.read() if proc.poll() is not None else ''})"
    return proc, f"http://127.0.0.1:{m.group('port')}", url


@pytest.mark.parametrize("block", TO_RUN, ids=lambda b: b.id)
def test_documented_commands_run(block: Block, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "runbooks"):
        (work / name).symlink_to(REPO / name, target_is_directory=True)
    env = environment(work)
    servers: list[subprocess.Popen] = []
    replace: dict[str, str] = {}
    try:
        for line in block.lines():
            if line.startswith("runbook simulate "):
                proc, documented, real = start_simulate(line, work, env)
                servers.append(proc)
                replace[documented] = real
                continue
            command = line
            for documented, real in replace.items():
                command = command.replace(documented, real)
            m = EXITS.search(line)
            expected = int(m.group(1)) if m else 0
            started = time.monotonic()
            done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=LINE_TIMEOUT_S)  # fmt: skip
            took = time.monotonic() - started
            assert done.returncode == expected, (
                f"{block.id}: `{line}` exited {done.returncode}, the page says {expected} ({took:.1f} s)\n"
                f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-3000:]}"
            )
            assert "Traceback" not in done.stderr, f"{block.id}: `{line}`\n{done.stderr[-3000:]}"
    finally:
        for proc in servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
            assert code == 0, f"{block.id}: `runbook simulate` ended with {code} on SIGTERM: {proc.stderr.read()[-2000:] if proc.stderr else ''}"
