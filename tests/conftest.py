from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from engine.loader import LoadedRunbook, load
from engine.registry import Registry

TESTS = Path(__file__).parent
PROBE_FILES = TESTS / "probe_files"
REPO = TESTS.parent
SHARED = REPO.parent / "shared"


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
