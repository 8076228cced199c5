"""No import circles in engine/ and probes/ (the developer guide): a static check over every import.

Every `import` and `from ... import` counts, wherever it is written: at the top, inside a function
(a lazy import), or under `if TYPE_CHECKING:`. A lazy import only hides a circle from the
interpreter; the two modules still cannot be understood, moved or tested apart. Relative imports are
resolved against the importing module's package. A strongly connected component of more than one
module is a circle; the failure names its modules and the import lines that close it.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# directory -> the package it installs as (pyproject's package-dir)
PACKAGES = {"engine": "gpu_runbook", "probes": "gpu_runbook.probes"}


def modules(root: Path, packages: dict[str, str] = PACKAGES) -> dict[str, tuple[Path, bool]]:
    """Dotted module name, as installed -> (file, is a package's __init__)."""
    found: dict[str, tuple[Path, bool]] = {}
    for directory, package in packages.items():
        for file in sorted((root / directory).rglob("*.py")):
            parts = package.split(".") + list(file.relative_to(root / directory).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (file, is_package)
    return found


def _owner(name: str, known: dict[str, tuple[Path, bool]]) -> str | None:
    """The longest known module `name` lies in (`gpu_runbook.probe.Target` -> `gpu_runbook.probe`)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(root: Path, packages: dict[str, str] = PACKAGES) -> dict[str, dict[str, str]]:
    """Module -> {module it imports: "file:line" of the first such import}, inside `packages` only."""
    known = modules(root, packages)
    graph: dict[str, dict[str, str]] = {name: {} for name in known}
    for name, (file, is_package) in known.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
            if isinstance(node, ast.Import):
                targets = [_owner(alias.name, known) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")
                    if node.level - 1 > len(base_parts) - 1:
                        continue  # beyond the top package: not one of ours
                    base = ".".join(base_parts[: len(base_parts) - (node.level - 1)] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from pkg import mod` imports the submodule; `from mod import Name` imports mod.
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else _owner(base, known) for alias in node.names]
            else:
                continue
            for target in targets:
                if target is not None and target != name:
                    graph[name].setdefault(target, f"{file.relative_to(root)}:{node.lineno}")
    return graph


def circles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe(graph: dict[str, dict[str, str]], component: list[str]) -> str:
    inside = set(component)
    lines = [f"{a} -> {b} ({where})" for a in component for b, where in sorted(graph[a].items()) if b in inside]
    return "import circle: " + " <-> ".join(component) + "\n    " + "\n    ".join(lines)


def test_engine_and_probes_have_no_import_circles():
    graph = import_graph(REPO)
    assert "gpu_runbook.runner" in graph and "gpu_runbook.probes.gpu.sample" in graph  # the scan found the packages
    found = circles(graph)
    assert not found, "\n".join(describe(graph, c) for c in found)


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_lazy_or_type_checking_circle_is_found_and_named(tmp_path):
    root = _package(tmp_path, {
        "engine/__init__.py": "",
        "engine/a.py": "from .b import B\n",
        "engine/b.py": "def f():\n    from .a import A  # lazy\n",
        "engine/sub/__init__.py": "",
        "engine/sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..d import D\n",
        "engine/d.py": "from gpu_runbook.sub import c\n",
        "engine/e.py": "from . import a\n",  # imports into the circle without closing one
        "probes/__init__.py": "",
        "probes/p.py": "from gpu_runbook.a import A\n",
    })  # fmt: skip
    graph = import_graph(root)
    assert graph["gpu_runbook.d"] == {"gpu_runbook.sub.c": "engine/d.py:1"}
    assert graph["gpu_runbook.sub.c"] == {"gpu_runbook.d": "engine/sub/c.py:3"}
    assert graph["gpu_runbook.probes.p"] == {"gpu_runbook.a": "probes/p.py:1"}
    found = circles(graph)
    assert found == [["gpu_runbook.a", "gpu_runbook.b"], ["gpu_runbook.d", "gpu_runbook.sub.c"]]
    assert "gpu_runbook.b -> gpu_runbook.a (engine/b.py:2)" in describe(graph, found[0])


def test_a_chain_without_a_way_back_is_no_circle(tmp_path):
    root = _package(tmp_path, {"engine/__init__.py": "", "engine/a.py": "import gpu_runbook.b\n", "engine/b.py": "from . import c\n",
                               "engine/c.py": "import json\n", "probes/__init__.py": ""})  # fmt: skip
    graph = import_graph(root)
    assert graph["gpu_runbook.a"] == {"gpu_runbook.b": "engine/a.py:1"} and graph["gpu_runbook.b"] == {"gpu_runbook.c": "engine/b.py:1"}
    assert circles(graph) == []


SERVER_FAMILIES = ("sglang", "vllm")  # probes/<family>/: one server kind's words each


def test_no_server_family_imports_another():
    """A server kind is a folder shaped like probes/vllm: it fills the concepts of probes/server from its own
    names and never reads another family's (vLLM's series were once filed under SGLang's)."""
    graph = import_graph(REPO)
    crossing = []
    for module, imports in graph.items():
        for family in SERVER_FAMILIES:
            if not module.startswith(f"gpu_runbook.probes.{family}."):
                continue
            for target, where in imports.items():
                other = [f for f in SERVER_FAMILIES if f != family and target.startswith(f"gpu_runbook.probes.{f}")]
                if other:
                    crossing.append(f"{module} imports {target} ({where})")
    assert graph.get("gpu_runbook.probes.vllm.server") and graph.get("gpu_runbook.probes.sglang.server")  # the scan saw them
    assert not crossing, "\n".join(crossing)


GPU_FAMILIES = ("gpu", "amd")  # NVML and amdsmi: each fills probes/gpu_values.py's concepts from its own library


def test_no_gpu_family_imports_another():
    """The NVML and AMD families share only the GPU concepts (probes/gpu_values.py), never each other's code."""
    graph = import_graph(REPO)
    crossing = [f"{m} imports {t} ({w})" for m, imports in graph.items() for family in GPU_FAMILIES
                if m.startswith(f"gpu_runbook.probes.{family}.") for t, w in imports.items()
                if any(t.startswith(f"gpu_runbook.probes.{o}.") or t == f"gpu_runbook.probes.{o}" for o in GPU_FAMILIES if o != family)]
    assert graph.get("gpu_runbook.probes.amd.sample") and graph.get("gpu_runbook.probes.gpu.sample")  # the scan saw them
    assert not crossing, "\n".join(crossing)


def test_the_shared_server_base_imports_no_family():
    graph = import_graph(REPO)
    bad = [f"{m} imports {t} ({w})" for m, imports in graph.items() if m.startswith("gpu_runbook.probes.server")
           for t, w in imports.items() if any(t.startswith(f"gpu_runbook.probes.{f}") for f in SERVER_FAMILIES)]
    assert not bad, "\n".join(bad)


# The layers, bottom first (README "The house"): a module imports only its own layer and the layers below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ()),  # every engine module not named below: the formats, rules, evidence, target, loader, registry
    ("trace", ("gpu_runbook.trace",)),
    ("probes", ("gpu_runbook.probes",)),
    ("simulator", ("gpu_runbook.sim",)),
    ("judge and walk", ("gpu_runbook.judge", "gpu_runbook.runner")),
    ("commands", ("gpu_runbook.rejudge", "gpu_runbook.diff", "gpu_runbook.fleet",
                  "gpu_runbook.runbook_test", "gpu_runbook.report", "gpu_runbook.progress", "gpu_runbook.calibrate")),
    ("interfaces", ("gpu_runbook.tui", "gpu_runbook.session", "gpu_runbook.fleet.cli", "gpu_runbook.cli", "gpu_runbook.__main__")),
]


def layer_of(module: str) -> int:
    for i, (_, prefixes) in reversed(list(enumerate(LAYERS))):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return 0


def test_nothing_imports_upward_across_the_layers():
    graph = import_graph(REPO)
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]}) at {where}"
              for m, imports in graph.items() for t, where in imports.items() if layer_of(t) > layer_of(m)]
    assert layer_of("gpu_runbook.probes.vllm.server") == 2 and layer_of("gpu_runbook.model") == 0  # the layers resolve
    assert not upward, "\n".join(upward)


def test_built_in_probes_import_the_plugin_api_as_a_third_party_probe_does():
    """Evidence, Probe, Context, Values and Target come from `gpu_runbook.plugin` in every built-in probe, the one path
    a third-party probe is told to use: the modules behind it can move without touching a probe."""
    graph = import_graph(REPO)
    behind = {"gpu_runbook.evidence", "gpu_runbook.probe", "gpu_runbook.values", "gpu_runbook.target"}
    direct = [f"{m} imports {t} ({w})" for m, imports in graph.items() if m.startswith("gpu_runbook.probes")
              for t, w in imports.items() if t in behind]
    assert any("gpu_runbook.plugin" in imports for m, imports in graph.items() if m.startswith("gpu_runbook.probes"))
    assert not direct, "\n".join(direct)
