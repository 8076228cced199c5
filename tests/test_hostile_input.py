"""Hostile input: documents beyond the loader's bounds, scalars YAML cannot convert, over-long paths,
outputs aimed at inputs, non-finite params. Each is refused with a clear error (FILE:LINE:COL where a
file is at fault, the limit it hit where one was hit), exit 2, before anything runs; never a traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from gpu_runbook import yamlpos
from gpu_runbook.cli import main
from gpu_runbook.loader import LoadError, load
from hostile_figures import FIGURES

TESTS = Path(__file__).parent
BROKEN = TESTS / "broken"
SCENARIOS_BROKEN = TESTS / "scenarios_broken"
PROBE_FILES = TESTS / "probe_files"
CLI = [sys.executable, "-m", "gpu_runbook.cli"]
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}, "PYTHONPATH": str(TESTS.parent)}

QUICK = """
name: quick
title: A run that takes no time
hypotheses:
  - id: a
    title: A
    probes: { x: { probe: test.value, with: { values: { v: 1 } } } }
    confirm: x.v == 1.0
"""


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _refused(case: str, code: int, out: str, err: str, *must: str) -> None:
    """Exit 2 with every `must` text on stderr, no traceback, no internal error; counted in the figures."""
    FIGURES.tried("bad inputs", case)
    if code == 70 or "Traceback" in out + err or "internal error" in err:
        FIGURES.crash(f"input {case}")
    assert code == 2, (code, err)
    assert "Traceback" not in out + err and "internal error" not in err, err
    for text in must:
        assert text in err, (text, err)
    FIGURES.passed("bad inputs", case)


# ---- the broken corpus through the CLI -------------------------------------------------------------


def test_every_broken_runbook_is_refused_by_validate_with_a_position():
    """One `runbook validate` of the whole corpus: each file gets a FILE:LINE:COL line, exit 2, no traceback."""
    files = sorted(BROKEN.glob("*.yaml"))
    proc = subprocess.run(CLI + ["validate", "--probes-dir", str(PROBE_FILES), *map(str, files)],
                          capture_output=True, text=True, env=ENV, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout and "internal error" not in proc.stderr
    assert "ok:" not in proc.stdout
    for file in files:
        FIGURES.tried("bad inputs", file.name)
        lines = [line for line in proc.stderr.splitlines() if line.startswith(f"{file}:")]
        positioned = [line for line in lines if line[len(str(file)) + 1 :].split(":")[0].isdigit()]
        assert positioned, (file.name, lines)
        FIGURES.passed("bad inputs", file.name)


@pytest.mark.parametrize("name", ["10-alias-bomb.yaml", "11-bad-date.yaml", "12-deep-flow.yaml"])
def test_hostile_scenario_is_refused_with_a_position(name, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick.yaml").write_text(QUICK)
    path = SCENARIOS_BROKEN / name
    code, out, err = _run(["run", "quick.yaml", "--no-tui", "--probes-dir", str(PROBE_FILES), "--simulate", str(path)], capsys)
    _refused(f"scenario {name}", code, out, err, f"{path}:")
    assert not list(tmp_path.glob("reports/*")), "nothing may run"


def test_bound_hits_cost_little_memory(registry):
    """Each document beyond a bound is refused before it is expanded: a few MB, not the 1.9 GB a
    billion laughs used to take (memory, unlike time, does not depend on how busy the machine is)."""
    for file in sorted(BROKEN.glob("*.yaml")):
        tracemalloc.start()
        try:
            with pytest.raises(LoadError):
                load(file, registry)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 48 * 2**20, (file.name, peak)


# ---- bounds on generated documents too big to keep in the corpus ----------------------------------


def _big_runbook(path: Path, hypotheses: int) -> Path:
    with path.open("w") as f:
        f.write("name: big\ntitle: A runbook nobody wrote by hand\nhypotheses:\n")
        for i in range(hypotheses):
            f.write(f"  - id: h{i}\n    title: Hypothesis {i}\n    confirm: \"true\"\n    why: {'padding ' * 2}\n")
    return path


def test_a_10mb_runbook_with_150k_hypotheses_is_refused_by_size(tmp_path, capsys, registry):
    path = _big_runbook(tmp_path / "big.yaml", 150_000)
    assert path.stat().st_size > 10 * 2**20 * 0.7
    with pytest.raises(LoadError) as info:
        load(path, registry)
    assert f"(limit: MAX_FILE_BYTES {yamlpos.MAX_FILE_BYTES:,})" in str(info.value)
    code, out, err = _run(["run", str(path), "--no-tui", "--report", str(tmp_path / "r.md")], capsys)
    _refused("10 MB runbook, 150k hypotheses", code, out, err, f"{path}:1:1:", "MAX_FILE_BYTES")
    assert not (tmp_path / "r.md").exists()


def test_many_small_hypotheses_under_the_size_limit_hit_the_node_limit(tmp_path, registry):
    path = _big_runbook(tmp_path / "many.yaml", 6_000)
    assert path.stat().st_size < yamlpos.MAX_FILE_BYTES
    with pytest.raises(LoadError) as info:
        load(path, registry)
    FIGURES.tried("bad inputs", "6k hypotheses")
    [error] = info.value.errors
    assert error.pos is not None and f"(limit: MAX_NODES {yamlpos.MAX_NODES:,})" in error.message
    FIGURES.passed("bad inputs", "6k hypotheses")


def test_a_2000_deep_block_mapping_is_refused(tmp_path, registry):
    path = tmp_path / "deep.yaml"
    path.write_text("name: deep\ntitle: t\nx:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(2000)) + " " * 2001 + "end: 1\n")
    with pytest.raises(LoadError) as info:
        load(path, registry)
    FIGURES.tried("bad inputs", "2000-deep block mapping")
    assert "(limit: MAX_FILE_BYTES" in str(info.value) or "(limit: MAX_DEPTH" in str(info.value)
    FIGURES.passed("bad inputs", "2000-deep block mapping")


def test_limits_are_named_in_the_docs():
    page = (TESTS.parent / "docs" / "limits.md").read_text()
    for name in ("MAX_FILE_BYTES", "MAX_DEPTH", "MAX_NODES", "MAX_INT", "MAX_BODY_BYTES"):
        assert name in page, name


def test_show_on_an_alias_bomb_is_refused(capsys):
    path = BROKEN / "35-alias-bomb-unknown-key.yaml"
    code, out, err = _run(["show", str(path)], capsys)
    _refused("show alias bomb", code, out, err, f"{path}:8:9:", "MAX_NODES")


# ---- over-long paths ------------------------------------------------------------------------------

LONG_NAME = "r" * 300 + ".yaml"  # one name longer than NAME_MAX (255)
LONG_PATH = "/".join(["d" * 200] * 30) + "/r.yaml"  # longer than PATH_MAX (4096)


@pytest.mark.parametrize("command", ["validate", "show", "run", "test"])
@pytest.mark.parametrize("name", [LONG_NAME, LONG_PATH], ids=["name", "path"])
def test_over_long_runbook_path_is_a_clear_error(command, name, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _run([command, name] + (["--no-tui"] if command == "run" else []), capsys)
    _refused(f"{command} with an over-long {('name' if name == LONG_NAME else 'path')}", code, out, err, "characters)")
    assert len(err) < 600, "a path is shortened in the message"


@pytest.mark.parametrize(
    ("case", "args"),
    [
        ("--probes-dir", ["probes", "--probes-dir", "p" * 300]),
        ("--simulate name", ["run", "quick.yaml", "--no-tui", "--probes-dir", str(PROBE_FILES), "--simulate", "s" * 300]),
        ("--simulate file", ["run", "quick.yaml", "--no-tui", "--probes-dir", str(PROBE_FILES), "--simulate", "s" * 300 + ".yaml"]),
        ("validate --probes-dir", ["validate", "quick.yaml", "--probes-dir", LONG_PATH]),
        ("report of an over-long results path", ["report", "j" * 300 + ".json"]),
        ("report --out over-long", ["report", "r.json", "--out", LONG_NAME]),
    ],
)
def test_over_long_path_in_any_option_is_a_clear_error(case, args, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick.yaml").write_text(QUICK)
    (tmp_path / "r.json").write_text("{}")
    code, out, err = _run(args, capsys)
    _refused(f"over-long path: {case}", code, out, err, "characters)")
    assert len(err) < 600


@pytest.mark.parametrize("flag", ["--json", "--report"])
@pytest.mark.parametrize("name", [LONG_NAME, LONG_PATH], ids=["name", "path"])
def test_over_long_output_path_is_a_usage_error(flag, name, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick.yaml").write_text(QUICK)
    code, out, err = _run(["run", "quick.yaml", "--no-tui", "--probes-dir", str(PROBE_FILES), flag, name], capsys)
    _refused(f"{flag} over-long {('name' if name == LONG_NAME else 'path')}", code, out, err, flag)


# ---- outputs never overwrite inputs or each other -------------------------------------------------


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick.yaml").write_text(QUICK)
    probes = tmp_path / "probes"
    probes.mkdir()
    shutil.copy(PROBE_FILES / "test_probes.py", probes / "test_probes.py")
    return tmp_path


def _unchanged(path: Path, before: bytes) -> None:
    assert path.read_bytes() == before, f"{path} was overwritten"


@pytest.mark.parametrize(
    ("case", "extra", "victim", "message"),
    [
        ("json-is-runbook", ["--json", "quick.yaml"], "quick.yaml", "--json quick.yaml: is the runbook"),
        ("report-is-runbook", ["--report", "./quick.yaml"], "quick.yaml", "is the runbook"),
        ("json-is-probe-file", ["--json", "probes/test_probes.py"], "probes/test_probes.py", "is the probe file"),
        ("report-is-probe-file", ["--report", "probes/../probes/test_probes.py"], "probes/test_probes.py", "is the probe file"),
        ("json-is-report", ["--json", "out.txt", "--report", "./out.txt"], None, "--json and --report are the same file"),
        ("json-empty", ["--json", ""], None, "--json: the path is empty"),
        ("report-empty", ["--report", ""], None, "--report: the path is empty"),
        ("report-blank", ["--report", "  "], None, "--report: the path is empty"),
    ],
)
def test_output_aimed_at_an_input_or_the_other_output_is_refused(case, extra, victim, message, workdir, capsys):
    before = (workdir / victim).read_bytes() if victim else b""
    code, out, err = _run(["run", "quick.yaml", "--no-tui", "--probes-dir", "probes", *extra], capsys)
    _refused(f"output {case}", code, out, err, message)
    if victim:
        _unchanged(workdir / victim, before)
    assert not (workdir / "out.txt").exists() and not list(workdir.glob("reports/*")), "nothing may run"


def test_output_through_a_symlink_or_hard_link_to_the_runbook_is_refused(workdir, capsys):
    before = (workdir / "quick.yaml").read_bytes()
    (workdir / "link.json").symlink_to(workdir / "quick.yaml")
    os.link(workdir / "quick.yaml", workdir / "hard.json")
    for path in ("link.json", "hard.json"):
        code, out, err = _run(["run", "quick.yaml", "--no-tui", "--probes-dir", "probes", "--json", path], capsys)
        _refused(f"output {path} linked to the runbook", code, out, err, "is the runbook")
    _unchanged(workdir / "quick.yaml", before)


def test_output_aimed_at_the_runbooks_own_probe_file_is_refused(workdir, capsys):
    (workdir / "own.yaml").write_text("probe_files: [probes/test_probes.py]\n" + QUICK.replace("name: quick", "name: own"))
    before = (workdir / "probes" / "test_probes.py").read_bytes()
    code, out, err = _run(["run", "own.yaml", "--no-tui", "--report", "probes/test_probes.py"], capsys)
    _refused("output is the runbook's probe_files", code, out, err, "is the probe file")
    _unchanged(workdir / "probes" / "test_probes.py", before)


def test_output_aimed_at_the_scenario_file_is_refused(workdir, capsys):
    from gpu_runbook.sim.scenario import find_scenario

    shutil.copy(find_scenario("idle-gpus"), workdir / "idle.yaml")
    before = (workdir / "idle.yaml").read_bytes()
    code, out, err = _run(["run", "quick.yaml", "--no-tui", "--probes-dir", "probes", "--simulate", "idle.yaml", "--json", "idle.yaml"], capsys)
    _refused("output is the scenario file", code, out, err, "is the scenario file")
    _unchanged(workdir / "idle.yaml", before)


def test_report_out_aimed_at_its_results_file_is_refused(workdir, capsys):
    (workdir / "r.json").write_text("{}")
    code, out, err = _run(["report", "r.json", "--out", "r.json"], capsys)
    _refused("report --out is the results file", code, out, err, "is the results file")
    assert (workdir / "r.json").read_text() == "{}"


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_report_of_a_device_is_refused_not_read_forever(device, capsys):
    code, out, err = _run(["report", device], capsys)
    _refused(f"report {device}", code, out, err, "not a regular file")


def test_dash_is_not_refused_as_a_path(workdir, capsys):
    """`-` means stdout (issue 14): the output checks leave it alone; both outputs on stdout are refused."""
    code, out, err = _run(["run", "quick.yaml", "--no-tui", "--probes-dir", "probes", "--report", "r.md", "--json", "-"], capsys)
    assert code == 0, err  # `-` is no input's name
    assert "Traceback" not in out + err
    code, out, err = _run(["run", "quick.yaml", "--no-tui", "--probes-dir", "probes", "--report", "-", "--json", "-"], capsys)
    assert code == 2 and "both ask for standard output" in err


def test_report_into_a_directory_that_is_a_directory_is_a_usage_error(workdir, capsys):
    (workdir / "adir").mkdir()
    code, out, err = _run(["run", "quick.yaml", "--no-tui", "--probes-dir", "probes", "--report", "adir"], capsys)
    _refused("report path is a directory", code, out, err, "is a directory")


# ---- params ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["underfed_ratio=inf", "underfed_ratio=nan", "cap_margin=-inf", "cap_margin=1e999", "load_concurrency=" + "9" * 5000,
                                     "sample_seconds=1e9", "sample_seconds=-inf", "sample_seconds=0", "warmup_seconds=1e9", "steady_seconds=-5"])
def test_non_finite_and_huge_params_are_refused_before_the_run(setting, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["run", "power-starvation", "--no-tui", "--simulate", "idle-gpus", "--set", setting, "--report", "r.md"], capsys)
    name = setting.split("=")[0]
    _refused(f"--set {setting[:30]}", code, out, err, f"param '{name}'")
    assert len(err) < 400
    assert not (tmp_path / "r.md").exists()


def test_load_beyond_the_memory_budget_is_a_usage_error(registry):
    """256 concurrent prompts of 200,000 tokens each built at once took the client to 2.6 GB. Checked
    without running: on a branch without the bound the run itself would be the 2.6 GB."""
    from gpu_runbook.loader import load_path_or_name
    from gpu_runbook.runner import ParamError, resolve_params

    FIGURES.tried("bad inputs", "load beyond the memory budget")
    loaded = load_path_or_name("power-starvation", registry)
    try:
        resolve_params(loaded, {"load_input_len": "200000", "load_concurrency": "256"})
    except ParamError as exc:
        assert "load" in str(exc)
        FIGURES.passed("bad inputs", "load beyond the memory budget")
        return
    pytest.xfail("needs the load branch (engine/load.py bounds the load's memory)")


@pytest.mark.parametrize("setting, bound", [("sample_seconds=1e9", "less than or equal to 3600"), ("sample_seconds=0", "greater than 0"),
                                            ("warmup_seconds=1e9", "between 0 and 3600 s (limit: MAX_WAIT_S)")])
def test_out_of_range_params_name_their_bound(setting, bound, capsys, tmp_path, monkeypatch):
    """`--set sample_seconds=1e9` was accepted and the run never ended: now a usage error naming the probe field and its bound."""
    monkeypatch.chdir(tmp_path)
    FIGURES.tried("bad inputs", f"--set {setting} names its bound")
    code, out, err = _run(["run", "power-starvation", "--no-tui", "--simulate", "idle-gpus", "--set", setting, "--report", "r.md"], capsys)
    assert code == 2 and bound in err and "Traceback" not in err, err
    assert not (tmp_path / "r.md").exists()
    FIGURES.passed("bad inputs", f"--set {setting} names its bound")


# ---- crafted results files (issue 25): untrusted input --------------------------------------------

DATA = TESTS / "data"
HOSTILE = (
    "<img src=x onerror=alert(1)><script>alert(2)</script> [x](javascript:alert(3)) </details>\n## TL;DR\n"
    "<details>\x1b]52;c;cHduZWQ=\x07\x1b[31m [bold red]r[/] [link=file:///etc/passwd]l[/link] [/] | cell | `tick"
)
KEEP = {"id", "parent", "verdict", "severity", "status", "probe", "alias", "kind", "used_by", "follows", "rule", "unit", "started_at", "finished_at"}


def _fixed(**changes) -> dict:
    """results-fixed.json with its runbook's text recorded (schema 2), then `changes`."""
    import hashlib
    import json

    data = json.loads((DATA / "results-fixed.json").read_text())
    source = (DATA / "fixed-example.yaml").read_text()
    data.update(schema_version="2", runbook_source=source, runbook_sha256=hashlib.sha256(source.encode()).hexdigest())
    data.update(changes)
    return data


def _poison(value, key: str = ""):
    """Every string a results file holds (ids and enums aside) with HOSTILE added."""
    if isinstance(value, dict):
        return {k: (v if k in KEEP else _poison(v, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_poison(v, key) for v in value]
    if isinstance(value, str):
        return value + " " + HOSTILE
    return value


def _write(path: Path, data: dict) -> Path:
    import json

    path.write_text(json.dumps(data))
    return path


def test_a_report_from_a_hostile_results_file_renders_inert_with_its_structure(tmp_path, capsys, monkeypatch):
    """HTML, Markdown structure, escape sequences and Rich markup in every string: the report renders as
    inert text, one TL;DR, <details> balanced, no control character, no link but the runbook's references."""
    from test_hostile_servers import report_problems

    monkeypatch.chdir(tmp_path)
    data = _fixed()
    data["hypotheses"] = _poison(data["hypotheses"])
    data["target"] = _poison(data["target"])
    data["title"] = data["title"] + HOSTILE
    FIGURES.tried("crafted results files", "strings with HTML, Markdown, escapes and Rich markup")
    code, out, err = _run(["report", str(_write(tmp_path / "r.json", data)), "--out", "r.md"], capsys)
    report = (tmp_path / "r.md").read_text()
    problems = report_problems(report) + [f"control character on the terminal: {c!r}" for c in ("\x1b", "\x07") if c in out + err]
    if problems:
        FIGURES.injection("results file: hostile strings")
    assert code == 0, err
    assert not problems, problems
    assert "onerror=alert(1)" in report and "gpus-underfed" in report  # the data is shown, as text
    FIGURES.passed("crafted results files", "strings with HTML, Markdown, escapes and Rich markup")


@pytest.mark.parametrize("command", ["report", "rejudge"])
def test_a_crafted_runbook_name_writes_nothing_outside_the_working_directory(command, tmp_path, capsys, monkeypatch):
    """`report`, `rejudge` built default paths (and the recorded runbook's copy) from the file's runbook name."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    case = f"{command}: runbook name ../escaped/PWNED"
    FIGURES.tried("crafted results files", case)
    results = _write(work / "r.json", _fixed(runbook="../../escaped/PWNED"))
    args = [command, str(results)] + (["--probes-dir", str(PROBE_FILES)] if command == "rejudge" else [])
    code, out, err = _run(args, capsys)
    outside = [p for p in tmp_path.rglob("*") if work not in p.parents and p != work]
    escaped = list(Path(tempfile_root()).glob("escaped")) + list(tmp_path.rglob("*PWNED*"))
    if outside or any("PWNED" in str(p) and work not in p.parents for p in escaped):
        FIGURES.wrote_outside(case)
    assert code == 0, err
    assert outside == [], outside
    written = [p for p in work.rglob("*.md")]
    assert written and all(p.parent == work / "reports" and ".." not in p.name and "/" not in p.name for p in written), written
    FIGURES.passed("crafted results files", case)


def tempfile_root() -> str:
    import tempfile

    return tempfile.gettempdir()


@pytest.mark.parametrize("kind", ["fifo", "sparse-3gb", "binary", "dev-zero"])
def test_a_recorded_runbook_path_is_never_read(kind, tmp_path, capsys, monkeypatch):
    """Re-judged from the recorded text; with none, a bundled runbook by name or a usage error: never the path."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "victim.yaml"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "sparse-3gb":
        with open(target, "wb") as f:
            f.truncate(3 << 30)
    elif kind == "binary":
        target.write_bytes(bytes(range(256)) * 64)
    else:
        target = Path("/dev/zero")
    case = f"recorded runbook_path: {kind}"
    FIGURES.tried("crafted results files", case)
    with_text = _write(tmp_path / "a.json", _fixed(runbook_path=str(target)))
    code, out, err = _run(["rejudge", str(with_text), "--probes-dir", str(PROBE_FILES), "--json", "a2.json", "--report", "a2.md"], capsys)
    assert code == 0, err  # judged from runbook_source
    without = _write(tmp_path / "b.json", _fixed(runbook_path=str(target), runbook_source="", runbook_sha256="", runbook="not-bundled"))
    code, out, err = _run(["rejudge", str(without), "--probes-dir", str(PROBE_FILES), "--json", "b2.json", "--report", "b2.md"], capsys)
    _refused(case, code, out, err, "no bundled runbook", "--runbook FILE")
    FIGURES.passed("crafted results files", case)


def test_recorded_rules_that_loop_are_stopped_by_the_cost_budget(tmp_path, capsys, monkeypatch):
    """cel-python has no cost budget: a recorded rule nesting macros over big lists ran past 100 s."""
    import hashlib
    import time

    monkeypatch.chdir(tmp_path)
    big = "[" + ",".join(str(i) for i in range(400)) + "]"
    rule = f"{big}.all(a, {big}.all(b, {big}.all(c, a + b + c >= 0.0 || power.util_pct > 0.0)))"
    source = (DATA / "fixed-example.yaml").read_text().replace("confirm: power.util_pct > 80.0 && power.draw_w_mean < params.underfed_ratio * power.max_w", f"confirm: '{rule}'")
    assert rule in source
    data = _fixed(runbook_source=source, runbook_sha256=hashlib.sha256(source.encode()).hexdigest())
    FIGURES.tried("crafted results files", "recorded rule: nested macros over 400-element lists")
    started = time.monotonic()
    code, out, err = _run(["rejudge", str(_write(tmp_path / "r.json", data)), "--probes-dir", str(PROBE_FILES), "--json", "o.json", "--report", "o.md"], capsys)
    took = time.monotonic() - started
    if took > 60:
        FIGURES.hang("results file: looping rule")
    assert code == 0, err
    import json

    root = next(h for h in json.loads((tmp_path / "o.json").read_text())["hypotheses"] if h["id"] == "gpus-underfed")
    assert root["verdict"] in ("error", "inconclusive") and "limit: MAX_CEL_" in root["reason"], root
    assert took < 60, took
    FIGURES.passed("crafted results files", "recorded rule: nested macros over 400-element lists")


def test_a_results_file_past_the_size_cap_is_refused_by_name(tmp_path, capsys):
    from gpu_runbook.results import MAX_RESULTS_BYTES

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_RESULTS_BYTES + 1)
    code, out, err = _run(["report", str(big), "--out", str(tmp_path / "r.md")], capsys)
    _refused("results file past MAX_RESULTS_BYTES", code, out, err, "MAX_RESULTS_BYTES")


# ---- crafted traces (issue 25) ---------------------------------------------------------------------


def _trace(events: int = 3, extra: str = "") -> str:
    import json

    evs = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": i * 10.0, "dur": 5.0, "args": {"device": 0}} for i in range(events)]
    return '{"schemaVersion": 1, "deviceProperties": [], "traceEvents": [' + extra + ", ".join(json.dumps(e) for e in evs) + "]}"


def _read_trace(path: Path):
    from gpu_runbook.trace.parse import iter_events

    return list(iter_events(path))


def _refused_trace(case: str, path: Path, *must: str) -> None:
    import time

    from gpu_runbook.trace.parse import TraceError

    FIGURES.tried("crafted traces", case)
    started = time.monotonic()
    tracemalloc.start()
    try:
        with pytest.raises(TraceError) as caught:
            _read_trace(path)
        peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    took = time.monotonic() - started
    FIGURES.memory(f"trace {case} (Python allocations)", peak_mb)
    assert peak_mb < 500, peak_mb
    if took > 30:
        FIGURES.hang(f"trace {case}")
    for text in must:
        assert text in str(caught.value), (text, str(caught.value))
    assert took < 30, took
    FIGURES.passed("crafted traces", case)


def test_a_symlink_in_the_trace_directory_is_not_followed(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$SECRETHASH:19000:0:99999:7:::\n")
    link = tmp_path / "x-TP-0.trace.json.gz"
    link.symlink_to(secret)
    _refused_trace("symlink to a secret file", link, "symbolic link")


def test_a_fifo_in_the_trace_directory_is_refused_at_once(tmp_path):
    fifo = tmp_path / "x-TP-0.trace.json"
    os.mkfifo(fifo)
    _refused_trace("FIFO as a trace", fifo, "not a regular file")


def test_a_sparse_trace_past_the_file_cap_is_refused(tmp_path):
    sparse = tmp_path / "x-TP-0.trace.json"
    with open(sparse, "wb") as f:
        f.truncate(2 << 30)
    _refused_trace("sparse 2 GB trace", sparse, "MAX_TRACE_FILE_BYTES")


def test_a_gzip_bomb_of_spaces_stops_at_the_decompressed_cap(tmp_path, monkeypatch):
    import gzip

    from gpu_runbook.trace import parse

    monkeypatch.setattr(parse, "MAX_TRACE_TEXT_CHARS", 64 << 20)  # the cap scaled down, so the test stays quick
    bomb = tmp_path / "x-TP-0.trace.json.gz"
    with gzip.open(bomb, "wb", compresslevel=1) as f:
        f.write(b'{"traceEvents": [')
        block = b" " * (1 << 20)
        for _ in range(80):
            f.write(block)
    _refused_trace("gzip bomb of spaces", bomb, "MAX_TRACE_TEXT_CHARS")


def test_one_endless_string_in_a_trace_stops_at_the_event_cap(tmp_path):
    from gpu_runbook.trace import parse

    long = tmp_path / "x-TP-0.trace.json"
    long.write_text(_trace(2, extra='{"ph": "X", "cat": "kernel", "name": "' + "A" * (parse.MAX_EVENT_CHARS + (3 << 20))))
    _refused_trace("one string longer than an event may be", long, "MAX_EVENT_CHARS")


def test_too_many_events_stop_at_the_event_count_cap(tmp_path, monkeypatch):
    from gpu_runbook.trace import parse

    monkeypatch.setattr(parse, "MAX_TRACE_EVENTS", 1000)  # scaled down: the real cap is a million
    many = tmp_path / "x-TP-0.trace.json"
    many.write_text(_trace(2000))
    _refused_trace("more events than MAX_TRACE_EVENTS", many, "MAX_TRACE_EVENTS")
    few = tmp_path / "y-TP-0.trace.json"
    few.write_text(_trace(10))
    assert len(_read_trace(few)) == 10  # a normal trace still reads


def test_a_2gb_model_config_is_refused_not_read(tmp_path):
    from gpu_runbook.files import FileLimitError, read_text_capped

    cfg = tmp_path / "config.json"
    with open(cfg, "wb") as f:
        f.truncate(2 << 30)
    FIGURES.tried("bad inputs", "2 GB config.json")
    with pytest.raises(FileLimitError, match="MAX_CONFIG_BYTES"):
        read_text_capped(cfg)
    FIGURES.passed("bad inputs", "2 GB config.json")


@pytest.mark.parametrize("command", ["report", "rejudge"])
def test_a_results_file_just_under_the_cap_costs_bounded_memory(command, tmp_path):
    """A 500 MB results file cost 1.5 GB; one just under MAX_RESULTS_BYTES, in a fresh interpreter, stays under the limit."""
    import json

    from gpu_runbook.results import MAX_RESULTS_BYTES
    from hostile_figures import PEAK_MB_LIMIT
    from test_hostile_servers import _run_measured

    data = _fixed()
    ev = data["hypotheses"][0]["evidence"][0]
    ev["values"]["junk"] = []
    size = len(json.dumps(data))
    item = "x" * 100
    ev["values"]["junk"] = [item] * ((MAX_RESULTS_BYTES - size - 4096) // (len(item) + 4))
    path = _write(tmp_path / "big.json", data)
    assert MAX_RESULTS_BYTES * 0.9 < path.stat().st_size <= MAX_RESULTS_BYTES
    case = f"{command}: results file just under MAX_RESULTS_BYTES"
    FIGURES.tried("crafted results files", case)
    args = [command, str(path)] + (["--out", "r.md"] if command == "report" else ["--probes-dir", str(PROBE_FILES), "--json", "o.json", "--report", "o.md"])
    code, out, err, took, peak = _run_measured(args, tmp_path, timeout=300)
    FIGURES.memory(f"results {case}", peak)
    if took > 120:
        FIGURES.hang(f"results {case}")
    assert code == 0 and "Traceback" not in err, err[-2000:]
    assert 0 < peak < PEAK_MB_LIMIT, peak
    FIGURES.passed("crafted results files", case)


def test_a_diff_of_hostile_results_files_renders_inert(tmp_path, capsys, monkeypatch):
    from test_hostile_servers import report_problems

    monkeypatch.chdir(tmp_path)
    data = _fixed()
    data["hypotheses"] = _poison(data["hypotheses"])
    data["target"] = _poison(data["target"])
    path = _write(tmp_path / "a.json", data)
    FIGURES.tried("crafted results files", "diff of results files with hostile strings")
    code, out, err = _run(["diff", str(path), str(path), "--probes-dir", str(PROBE_FILES), "--out", "d.md"], capsys)
    assert code == 0, err
    problems = [p for p in report_problems((tmp_path / "d.md").read_text()) if "TL;DR" not in p]  # a diff has no TL;DR
    if problems:
        FIGURES.injection("results file: hostile strings in a diff")
    assert not problems, problems
    FIGURES.passed("crafted results files", "diff of results files with hostile strings")
