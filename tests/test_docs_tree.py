"""The docs stay inside the repository and true to it: docs/architecture.md's tree is the repository's tree,
and nothing in README.md or docs/ points outside the checkout (issue 32 item 3).

A clone has no `shared/` folder and no one else's absolute paths, so a page must not send a newcomer there:
every Markdown link or image is a web address or a path inside the repository that exists, and every
repository path a page names in backticks exists."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
IGNORED_TOP = {".git", "__pycache__"}


def page_id(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


# -- the tree -----------------------------------------------------------------------------------------------


def documented_tree() -> list[str]:
    """The paths of docs/architecture.md's "## The tree" block: two spaces of indent per level, a folder ends in /."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index("## The tree") :]
    block = re.search(r"```text\n(.*?)```", section, flags=re.S)
    assert block, "docs/architecture.md: the tree section has no ```text block"
    paths: list[str] = []
    stack: list[str] = []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0, f"odd indent: {line!r}"
        level = indent // 2
        name = line.strip().split()[0]
        assert level <= len(stack), f"indented past its parent: {line!r}"
        stack = stack[:level]
        paths.append("".join(stack) + name)
        if name.endswith("/"):
            stack.append(name)
    return paths


def repository_files() -> list[str]:
    """The files a clone holds (tracked or new, not ignored); without git, the files on disk outside ignored folders."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
        files = [f for f in out.splitlines() if f and (REPO / f).exists()]
        if files:
            return files
    except (OSError, subprocess.SubprocessError):
        pass
    patterns = [p.strip().strip("/") for p in (REPO / ".gitignore").read_text().splitlines() if p.strip() and not p.startswith("#")]
    found = []
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if path.is_file() and not any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in patterns) \
                and rel.parts[0] not in IGNORED_TOP and not (rel.parts[0].startswith(".") and rel.parts[0] != ".ci"):  # fmt: skip
            found.append(rel.as_posix())
    return found


def test_every_path_in_the_tree_exists():
    listed = documented_tree()
    assert len(listed) > 20
    missing = [p for p in listed if not ((REPO / p).is_dir() if p.endswith("/") else (REPO / p).is_file())]
    assert not missing, f"docs/architecture.md's tree lists what the repository does not have: {missing}"


def test_the_tree_lists_every_top_level_folder_probe_folder_and_engine_package():
    listed = set(documented_tree())
    files = repository_files()
    top = {f.split("/")[0] + "/" for f in files if "/" in f}
    probes = {"probes/" + f.split("/")[1] + "/" for f in files if f.startswith("probes/") and f.count("/") >= 2}
    engine = {p.parent.relative_to(REPO).as_posix() + "/" for p in (REPO / "engine").glob("*/__init__.py")}
    assert "engine/" in top and "probes/gpu/" in probes and "engine/sim/" in engine  # the walk found the repository
    unlisted = sorted((top | probes | engine) - listed)
    assert not unlisted, f"docs/architecture.md's tree does not list {unlisted}: add them to its ```text block"


def test_the_layers_page_names_every_layer_the_import_test_checks():
    from test_import_graph import LAYERS

    text = (REPO / "docs" / "architecture.md").read_text()
    layers = text[text.index("## The layers") : text.index("## The tree")]
    for name, prefixes in LAYERS:
        assert f"| {name} |" in layers, f"docs/architecture.md: no row for the layer {name!r}"
        for prefix in prefixes:
            module = prefix.removeprefix("gpu_runbook.").replace(".", "/")
            if prefix == "gpu_runbook.probes":
                assert "`probes/`" in layers
            elif (REPO / "engine" / f"{module}.py").exists():
                assert module.split("/")[-1] + ".py`" in layers, f"{prefix} ({name}) is not named on the layers page"
            elif (REPO / "engine" / module).is_dir():
                assert f"`engine/{module}/`" in layers, f"{prefix} ({name}) is not named on the layers page"


# -- nothing points outside the repository -------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
OUTSIDE = [
    (re.compile(r"(?<![\w.-])shared/"), "the shared/ folder (a clone has none)"),
    (re.compile(r"\.\./"), "a path above the file's folder"),
    (re.compile(r"(?<![\w.:/-])/(?:work|home|Users|root|mnt|workspace)/"), "an absolute local path"),
    (re.compile(r"file://"), "a file:// link"),
]
TOP = ("engine", "probes", "runbooks", "templates", "tests", "benchmarks", "examples", "scripts", "docs", ".ci")
PATH_IN_CODE = re.compile(r"`((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./-]*)`")


def test_pages_hold_no_path_outside_the_repository():
    found = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for pattern, what in OUTSIDE:
                if pattern.search(line):
                    found.append(f"{page_id(page)}:{n}: {what}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


def test_links_are_web_addresses_or_files_in_the_repository():
    bad = []
    web = 0
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for target in LINK.findall(line):
                if target.startswith(("https://", "http://")):
                    web += 1
                    continue
                path, _, anchor = target.partition("#")
                resolved = (page.parent / path).resolve() if path else page.resolve()
                if not resolved.is_relative_to(REPO) or not resolved.exists():
                    bad.append(f"{page_id(page)}:{n}: {target} (not a file in the repository)")
                elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                    bad.append(f"{page_id(page)}:{n}: {target} (no heading #{anchor} in {page_id(resolved)})")
    assert not bad, "\n".join(bad)
    assert web <= 5, f"{web} web links: keep references to upstream sources few"


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def test_repository_paths_the_pages_name_exist():
    missing = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for path in PATH_IN_CODE.findall(line):
                if any(c in path for c in "*<") or path.endswith("."):
                    continue
                if not (REPO / path.rstrip("/")).exists():
                    missing.append(f"{page_id(page)}:{n}: `{path}`")
    assert not missing, "pages name paths the repository does not have:\n" + "\n".join(missing)


def test_the_readme_links_every_page_and_the_tui_picture():
    readme = (REPO / "README.md").read_text()
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"(docs/{page.name}" in readme, f"README.md does not link docs/{page.name}"
    assert "](docs/tui.svg)" in readme and (REPO / "docs" / "tui.svg").read_text().lstrip().startswith("<svg")
