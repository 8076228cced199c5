"""Probe discovery both ways: an installed entry point (like a third-party package) and --probes-dir."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from gpu_runbook.loader import LoadError, load
from gpu_runbook.target import Target
from gpu_runbook.registry import Registry
from gpu_runbook.runner import Runner

import pytest

REPO = Path(__file__).parent.parent
PLUGIN = REPO / "examples" / "probe-plugin"
PROBE_FILES = REPO / "examples" / "probe-files"


def _install_dist_info(root: Path, name: str, entry_points: str) -> None:
    """What pip leaves behind for an installed package: importlib.metadata finds it on sys.path."""
    info = root / f"{name}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_entry_point_plugin_is_discovered_and_used(tmp_path, monkeypatch):
    _install_dist_info(tmp_path, "runbook_example_probes", "[runbook.probes]\nexample.disk = runbook_example_probes.disk:DiskSpace\n")
    monkeypatch.syspath_prepend(str(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry.discover()
    assert "example.disk" in registry.probes
    assert registry.sources["example.disk"] == "entry point example.disk = runbook_example_probes.disk:DiskSpace"
    assert "host.info" in registry.probes  # built-ins come through the same group

    runbook = tmp_path / "disk.yaml"
    runbook.write_text(
        "name: disk\ntitle: disk\nhypotheses:\n  - id: disk-full\n    title: disk full\n"
        f"    probes: {{ d: {{ probe: example.disk, with: {{ path: '{tmp_path}' }} }} }}\n"
        "    confirm: d.free_fraction < 0.0001\n    refute: d.free_fraction >= 0.0001\n"
    )
    loaded = load(runbook, registry)
    results = asyncio.run(Runner(loaded, registry, Target()).run())
    assert results.by_id("disk-full").verdict.value == "refuted"
    assert results.by_id("disk-full").evidence[0].values["path"] == str(tmp_path)


def test_a_broken_plugin_is_reported_and_others_still_load(tmp_path, monkeypatch):
    _install_dist_info(tmp_path, "broken_plugin", "[runbook.probes]\nbroken.thing = no_such_module_anywhere:Thing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry.discover()
    assert "host.info" in registry.probes
    error = registry.error_for("broken.thing")
    assert error is not None and "ModuleNotFoundError" in error.message

    runbook = tmp_path / "uses-broken.yaml"
    runbook.write_text("name: uses-broken\ntitle: t\nhypotheses:\n  - id: a\n    title: A\n    probes: { x: { probe: broken.thing } }\n    confirm: 'true'\n")
    with pytest.raises(LoadError) as info:
        load(runbook, registry)
    assert str(info.value.errors[0]).startswith(f"{runbook}:6:27: probe 'broken.thing' failed to load (entry point broken.thing = no_such_module_anywhere:Thing): ModuleNotFoundError")


def test_probes_dir_lists_and_runs_a_probe_file(tmp_path):
    cli = [sys.executable, "-m", "gpu_runbook.cli"]
    listed = subprocess.run(cli + ["probes", "--probes-dir", str(PROBE_FILES)], capture_output=True, text=True, cwd=tmp_path)
    assert listed.returncode == 0
    assert f"host.loadavg       The 1, 5 and 15 minute load averages  [{PROBE_FILES / 'loadavg.py'}]" in listed.stdout

    run = subprocess.run(
        cli + ["run", str(REPO / "examples" / "cpu-saturated.yaml"), "--probes-dir", str(PROBE_FILES), "--no-tui",
               "--json", "r.json", "--report", "r.md", "--set", "busy_per_cpu=1000"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "refuted      cpu-saturated: refute: cpu.load_1m < params.busy_per_cpu / 2.0" in run.stdout
    assert (tmp_path / "r.json").exists() and (tmp_path / "r.md").exists()


def test_a_probe_file_that_fails_to_import_is_reported(tmp_path):
    (tmp_path / "bad.py").write_text("import not_a_real_module\n")
    (tmp_path / "_private.py").write_text("raise SystemExit('must not be imported')\n")
    registry = Registry.discover([tmp_path])
    assert [e.message for e in registry.errors] == ["ModuleNotFoundError: No module named 'not_a_real_module'"]
    assert "host.info" in registry.probes


def test_a_probe_whose_values_is_not_a_model_is_reported_not_registered(tmp_path):
    (tmp_path / "odd.py").write_text(
        "from gpu_runbook.plugin import Evidence, Probe\n\n"
        "class Odd(Probe):\n    name = 'odd.values'\n    description = 'x'\n    Values = {'a': float}\n\n"
        "    async def run(self, ctx, params):\n        return Evidence()\n"
    )
    registry = Registry.discover([tmp_path])
    assert "odd.values" not in registry.probes
    assert [e.message for e in registry.errors] == ["odd.values: its Values is {'a': <class 'float'>}, not a pydantic model (subclass gpu_runbook.plugin.Values)"]
    assert registry.error_for("odd.values") is not None  # a runbook naming it says why it is missing
