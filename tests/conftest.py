from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_runbook.loader import LoadedRunbook, load
from gpu_runbook.registry import Registry

TESTS = Path(__file__).parent
PROBE_FILES = TESTS / "probe_files"
REPO = TESTS.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(autouse=True)
def _no_runbook_environment(monkeypatch):
    """RUNBOOK_PATH, RUNBOOK_API_KEY, RUNBOOK_SGLANG_URL... on the machine must not change what a test sees."""
    import os

    for name in [k for k in os.environ if k.startswith("RUNBOOK_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def registry() -> Registry:
    reg = Registry.discover([PROBE_FILES])
    assert "test.value" in reg.probes, reg.errors
    return reg


@pytest.fixture
def test_probes(registry):
    module = next(m for name, m in sys.modules.items() if name.startswith("runbook_probe_files.test_probes"))
    module.CALLS.clear()
    return module


@pytest.fixture
def write_runbook(tmp_path):
    def write(text: str, name: str = "rb.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
        return path

    return write


@pytest.fixture
def load_runbook(write_runbook, registry):
    def _load(text: str) -> LoadedRunbook:
        return load(write_runbook(text), registry)

    return _load


@pytest.fixture
def refused_port():
    """A port on 127.0.0.1 that refuses every connection for the whole test: bound but never
    listening, so (unlike a port bound and closed again) nothing else can take it meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def pytest_terminal_summary(terminalreporter):
    """Issue 15's figures (bad inputs, hostile servers, faults, hangs, crashes, leaks), when those tests ran."""
    from hostile_figures import FIGURES

    if FIGURES.tried_:
        terminalreporter.write_sep("-", "hostile input, servers and faults")
        for line in FIGURES.lines():
            terminalreporter.write_line(line)
