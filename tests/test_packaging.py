"""What `pip install .` puts on a machine: one top-level package, `gpu_runbook`, with its data and the plugin API.

The repository keeps engine/ and probes/ at the top; pyproject's package-dir maps them to `gpu_runbook` and
`gpu_runbook.probes`. These tests hold the three places that must agree (the directories, pyproject's
package list, every import) to it, and build the real wheel to see what it installs.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGE_DIRS = {"gpu_runbook": "engine", "gpu_runbook.probes": "probes", "gpu_runbook._bundled.runbooks": "runbooks",
                "gpu_runbook._bundled.templates": "templates"}  # fmt: skip


def tracked(*dirs: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *dirs], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (an sdist): every file on disk counts
        return [str(p.relative_to(REPO)) for d in dirs for p in (REPO / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return out.stdout.split()


def source_dir(package: str) -> Path:
    """The directory pyproject maps a package to (the longest mapped prefix wins, as setuptools does)."""
    best = max((p for p in PACKAGE_DIRS if package == p or package.startswith(p + ".")), key=len)
    return REPO / PACKAGE_DIRS[best] / Path(*package[len(best) + 1 :].split(".")) if package != best else REPO / PACKAGE_DIRS[best]


def test_pyproject_maps_the_repository_layout_to_one_package():
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert setuptools["package-dir"] == PACKAGE_DIRS
    assert PYPROJECT["project"]["name"] == "gpu-runbook"
    assert PYPROJECT["project"]["scripts"] == {"runbook": "gpu_runbook.cli:main"}
    listed = set(setuptools["packages"])
    assert {p.split(".")[0] for p in listed} == {"gpu_runbook"}
    # every directory of Python code is a listed package: a new subpackage nobody listed would be left out of the wheel
    for top in ("engine", "probes"):
        for init in (REPO / top).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / top)
            name = ".".join(["gpu_runbook"] + ([] if top == "engine" else ["probes"]) + list(rel.parts))
            assert name in listed, f"{init.parent.relative_to(REPO)} has an __init__.py but pyproject does not list {name}"
    for name in listed:
        assert source_dir(name).is_dir(), f"pyproject lists {name}, but {source_dir(name).relative_to(REPO)} does not exist"


def test_every_entry_point_names_a_module_of_the_package():
    for name, target in PYPROJECT["project"]["entry-points"]["runbook.probes"].items():
        module, _, attr = target.partition(":")
        assert module.startswith("gpu_runbook.probes."), f"{name} = {target}"
        path = source_dir(module.rsplit(".", 1)[0]) / (module.rsplit(".", 1)[1] + ".py")
        assert path.is_file(), f"{name} = {target}: no {path.relative_to(REPO)}"
        assert f"class {attr}" in path.read_text(), f"{name} = {target}: {path.name} defines no class {attr}"


def _top_level_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_nothing_imports_the_repository_directories_by_their_own_names():
    """`import engine` would work from a checkout's root and nowhere else (and load a second copy of every module)."""
    bad = []
    for rel in tracked("engine", "probes", "tests", "benchmarks", "examples", "scripts"):
        path = REPO / rel
        if path.suffix != ".py" and not (rel.startswith("scripts/") and path.read_bytes()[:40].startswith(b"#!") and b"python" in path.read_bytes()[:40]):
            continue
        for line, module in _top_level_imports(path):
            if module.split(".")[0] in ("engine", "probes"):
                bad.append(f"{rel}:{line}: import {module}")
    assert not bad, "import gpu_runbook..., not the directory names:\n" + "\n".join(bad)


def test_the_plugin_api_is_one_import():
    from gpu_runbook import plugin

    for name in ("Probe", "Context", "Target", "NoParams", "Evidence", "ProbeStatus", "Table", "Series", "Bars", "Breakdown", "downsample"):
        assert name in plugin.__all__ and getattr(plugin, name) is not None
    from gpu_runbook.evidence import Evidence
    from gpu_runbook.probe import Probe

    assert plugin.Probe is Probe and plugin.Evidence is Evidence  # the same classes the engine checks against


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The real wheel, built from a copy of the tracked files (a build must not write into the checkout)."""
    src = tmp_path_factory.mktemp("src")
    for rel in tracked():
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (whl,) = out.glob("gpu_runbook-*.whl")
    return zipfile.ZipFile(whl)


def test_the_wheel_installs_one_top_level_package_with_all_its_data(wheel):
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"gpu_runbook"}
    dist_info = next(t for t in tops if t.endswith(".dist-info"))
    assert wheel.read(f"{dist_info}/top_level.txt").decode().split() == ["gpu_runbook"]
    # every tracked file of the four directories is in the wheel, at its mapped place (data files too)
    expected = set()
    for package, directory in PACKAGE_DIRS.items():
        prefix = package.replace(".", "/")
        for rel in tracked(directory):
            inner = rel[len(directory) + 1 :]
            if package == "gpu_runbook" and inner.startswith("probes/"):
                continue
            expected.add(f"{prefix}/{inner}")
    missing = sorted(expected - set(names))
    assert not missing, f"tracked files the wheel leaves out: {missing[:10]}"
    for must in ("gpu_runbook/plugin.py", "gpu_runbook/py.typed", "gpu_runbook/_bundled/runbooks/power-starvation.yaml",
                 "gpu_runbook/_bundled/runbooks/scenarios/seed-rtx-pro-6000-tp8.yaml", "gpu_runbook/_bundled/templates/report.md.j2"):  # fmt: skip
        assert must in names
    entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
    assert "runbook = gpu_runbook.cli:main" in entry_points
    assert "gpu.sample = gpu_runbook.probes." in entry_points
