"""Faults against the simulated host: signals at each stage, the server dying mid-run, outputs that
cannot be written, and probes that misbehave. Each run ends with a written report (or a clear error
that nothing could be written), no process left behind, and the affected branch marked with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_runbook import report as report_module
from gpu_runbook.cli import main
from gpu_runbook.loader import load
from gpu_runbook.target import Target
from gpu_runbook.runner import Runner
from gpu_runbook.session import signals_deferred, write_outputs
from gpu_runbook.sim.host import SimulatedHost
from hostile_figures import FIGURES

TESTS = Path(__file__).parent
CLI = [sys.executable, "-m", "gpu_runbook.cli"]
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}, "PYTHONPATH": str(TESTS.parent)}

UNDER_LOAD = """
name: faults
title: A run to break
load:
  concurrency: 4
  input_len: 8
  output_len: 64
  warmup_s: {warmup}
hypotheses:
  - id: server-up
    title: The server reports its configuration
    probes:
      srv: {{ probe: sglang.server }}
    confirm: srv.tp_size >= 1.0
  - id: busy
    title: Requests queue under load
    probes:
      m: {{ probe: sglang.metrics, under_load: true, with: {{ duration_s: {duration}, interval_s: 0.5 }} }}
    confirm: m.num_queue_reqs.max > 0.0
    refute: m.num_queue_reqs.max == 0.0
"""

FAULT_PROBES = '''
"""Probes that break the probe contract, each in its own way (issue 15's fault suite)."""
import sys
import time

from gpu_runbook.evidence import Evidence
from gpu_runbook.probe import Probe


class Blocks(Probe):
    name = "fault.blocks"
    description = "blocks the event loop with time.sleep"
    default_timeout_s = 0.3

    async def run(self, ctx, params):
        time.sleep(1.0)
        return Evidence(summary="slept in the loop", values={"v": 1})


class RetriesThroughCancel(Probe):
    name = "fault.retries"
    description = "a retry loop whose bare except swallows the first cancellation"
    default_timeout_s = 0.3

    async def run(self, ctx, params):
        import asyncio

        while True:
            try:
                await asyncio.sleep(10)  # the request that never answers
            except:  # noqa: E722 - the bug under test: it catches CancelledError too
                await asyncio.sleep(0.2)  # back off, then retry


class Exits(Probe):
    name = "fault.exits"
    description = "calls sys.exit"

    async def run(self, ctx, params):
        sys.exit(3)


class Prints(Probe):
    name = "fault.prints"
    description = "prints to stdout"

    async def run(self, ctx, params):
        print("PROBE-NOISE-4242 {not json")
        return Evidence(summary="printed", values={"v": 1})


class WrongType(Probe):
    name = "fault.wrong_type"
    description = "returns a dict, not Evidence"

    async def run(self, ctx, params):
        return {"v": 1}


class NonFinite(Probe):
    name = "fault.non_finite"
    description = "returns nan and inf in its values and its series"

    async def run(self, ctx, params):
        from gpu_runbook.evidence import Series

        series = Series(title="junk", unit="W", points=[(0.0, float("inf")), (0.5, float("nan")), (1.0, 1.0), (1.5, float("-inf"))])
        return Evidence(summary="non-finite", values={"v": float("nan"), "w": float("inf")}, blocks=[series])


class NotJson(Probe):
    name = "fault.not_json"
    description = "returns values that are not JSON"

    async def run(self, ctx, params):
        return Evidence(summary="a set", values={"v": {1, 2}})
'''

MISBEHAVING = """
name: misbehaving
title: Probes that break their contract
hypotheses:
  - id: fine
    title: A probe that keeps the contract
    probes: { x: { probe: test.value, with: { values: { v: 1 } } } }
    confirm: x.v == 1.0
  - id: hangs
    title: A probe that hangs
    probes: { s: { probe: test.sleep, with: { seconds: 3600 }, timeout_s: 0.5 } }
    confirm: s.slept_s > 0.0
  - id: retries
    title: A probe whose retry loop swallows its cancellation
    probes: { r: { probe: fault.retries } }
    confirm: r.v == 1.0
  - id: blocks
    title: A probe that blocks the event loop
    probes: { b: { probe: fault.blocks } }
    confirm: b.v == 1.0
  - id: exits
    title: A probe that calls sys.exit
    probes: { e: { probe: fault.exits } }
    confirm: e.v == 1.0
  - id: prints
    title: A probe that prints to stdout
    probes: { p: { probe: fault.prints } }
    confirm: p.v == 1.0
  - id: wrong-type
    title: A probe that returns the wrong type
    probes: { w: { probe: fault.wrong_type } }
    confirm: w.v == 1.0
  - id: non-finite
    title: A probe whose numbers are nan and inf
    probes: { f: { probe: fault.non_finite } }
    confirm: f.v == 1.0
  - id: not-json
    title: A probe whose values are not JSON
    probes: { n: { probe: fault.not_json } }
    confirm: n.v == 1.0
"""


def _no_orphans(pgid: int) -> bool:
    """True when no process is left in the run's process group (it was started in a session of its own)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _start(args: list[str], cwd: Path, ignore_sigint: bool = False) -> subprocess.Popen:
    return subprocess.Popen(CLI + args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None)  # fmt: skip


def _wait_for_line(proc: subprocess.Popen, text: str, limit_s: float = 60) -> list[str]:
    seen = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"never saw {text!r}: {seen}")


def _record(case: str, ok_report: bool, crashed: bool, hung: bool) -> None:
    FIGURES.tried("faults", case)
    if crashed:
        FIGURES.crash(f"fault {case}")
    if hung:
        FIGURES.hang(f"fault {case}")
    if ok_report and not crashed and not hung:
        FIGURES.passed("faults", case)


# ---- signals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sig", "ignore_sigint"), [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGTERM, True)],
                         ids=["SIGINT", "SIGTERM", "SIGTERM-in-a-background-job"])  # a shell's `cmd &` ignores SIGINT
@pytest.mark.parametrize(
    ("stage", "warmup", "duration", "line"),
    [
        ("at-the-start", 30, 3, "runbook faults:"),  # the first line: the load is just asked for, its warm-up is long
        ("mid-sampling", 0.3, 60, "probe sglang.metrics started (under load)"),
    ],
)
def test_signal_ends_the_run_with_what_was_found(sig, ignore_sigint, stage, warmup, duration, line, tmp_path):
    (tmp_path / "faults.yaml").write_text(UNDER_LOAD.format(warmup=warmup, duration=duration))
    proc = _start(["run", "faults.yaml", "--no-tui", "-v", "--simulate", "idle-gpus", "--json", "r.json", "--report", "r.md"], tmp_path, ignore_sigint)
    try:
        _wait_for_line(proc, line)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _record(f"{sig.name} {stage}", False, False, True)
        raise
    case = f"{sig.name}{' (SIGINT ignored)' if ignore_sigint else ''} {stage}"
    crashed = "Traceback" in out + err or proc.returncode == 70
    written = (tmp_path / "r.json").exists() and (tmp_path / "r.md").exists()
    orphans = not _no_orphans(proc.pid)
    _record(case, written and not orphans, crashed, False)
    assert proc.returncode == 130, err
    assert not crashed, err
    assert not orphans, "a process of the run outlived it"
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["interrupted"] is True
    verdicts = {h["id"]: (h["verdict"], h["reason"]) for h in results["hypotheses"]}
    assert verdicts["busy"] == ("inconclusive", "interrupted")
    assert "Interrupted" in (tmp_path / "r.md").read_text()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_while_writing_outputs_waits_until_they_are_written(sig, tmp_path, monkeypatch, load_runbook, registry):
    """The signal arrives in the middle of rendering the report: both files are still written whole, then
    the interrupt takes effect."""
    loaded = load_runbook("""
        name: writing
        title: Interrupted while writing
        hypotheses:
          - id: a
            title: A
            probes: { x: { probe: test.value, with: { values: { v: 1 } } } }
            confirm: x.v == 1.0
    """)
    results = asyncio.run(Runner(loaded, registry, Target()).run())
    real_render = report_module.render

    def render_and_be_interrupted(res):
        signal.raise_signal(sig)
        return real_render(res)

    monkeypatch.setattr(report_module, "render", render_and_be_interrupted)
    interrupted = False
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)  # SIG_IGN in a background job
    try:
        with signals_deferred():
            json_path, report_path = write_outputs(results, str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    except KeyboardInterrupt:
        interrupted = True
    written = json_path is not None and report_path is not None and "confirmed" in (tmp_path / "r.md").read_text()
    _record(f"{sig.name} while writing outputs", written and interrupted, False, False)
    assert interrupted, "the signal is not lost, only deferred"
    assert written
    assert json.loads((tmp_path / "r.json").read_text())["hypotheses"][0]["verdict"] == "confirmed"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # the handlers are put back


# ---- the server dies, outputs cannot be written ---------------------------------------------------


def test_server_killed_mid_run_marks_what_it_took_down(tmp_path, registry, write_runbook):
    loaded = load(write_runbook(UNDER_LOAD.format(warmup=0.3, duration=3)), registry)
    with SimulatedHost.start("idle-gpus") as host:
        runner = Runner(loaded, registry, Target(sglang_url=host.url, simulated=True), nvml=host.nvml)

        async def run_and_kill():
            task = asyncio.create_task(runner.run())
            deadline = time.monotonic() + 30
            while not runner._window_open.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.6)  # a sample or two in
            await asyncio.to_thread(host.server.stop)
            return await asyncio.wait_for(task, 60)

        results = asyncio.run(run_and_kill())
    json_path, report_path = write_outputs(results, str(tmp_path / "r.json"), str(tmp_path / "r.md"))
    busy = results.by_id("busy")
    ok = json_path is not None and report_path is not None and busy.verdict.value in ("error", "inconclusive") and bool(busy.reason)
    _record("simulated server killed mid-run", ok, False, False)
    assert busy.verdict.value in ("error", "inconclusive"), (busy.verdict, busy.reason)
    assert busy.reason and busy.reason != "interrupted"
    assert results.by_id("server-up").verdict.value == "confirmed"
    assert "busy" in (tmp_path / "r.md").read_text()


def _read_only_dir(tmp_path: Path) -> Path:
    """A directory this process cannot write to: chmod for a normal user; root ignores modes, so for root
    a place on a read-only file system (sysfs)."""
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        return ro
    for candidate in (Path("/sys/kernel"), Path("/sys")):
        try:
            with open(candidate / "runbook-write-test", "a"):
                pass
        except OSError:
            return candidate
    pytest.skip("no read-only directory available to root here")


def test_read_only_report_directory_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "faults.yaml").write_text(UNDER_LOAD.format(warmup=0.3, duration=1))
    ro = _read_only_dir(tmp_path)
    code = main(["run", "faults.yaml", "--no-tui", "--simulate", "idle-gpus", "--report", str(ro / "r.md"), "--json", "r.json"])
    out, err = capsys.readouterr()
    clear = code == 2 and f"--report {ro / 'r.md'}: cannot write there" in err
    _record("read-only report directory", clear, "Traceback" in err or code == 70, False)
    assert code == 2, err
    assert clear, err
    assert not (tmp_path / "r.json").exists(), "nothing runs when an output cannot be written"


def test_report_directory_gone_during_the_run_says_what_was_not_written(tmp_path, capsys, monkeypatch, registry):
    """The check passed, then the directory was replaced by a file while the run went on: the JSON is
    still written, the report's failure is said in one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "gone.yaml").write_text(MISBEHAVING.split("  - id: hangs")[0].replace("name: misbehaving", "name: gone"))
    import gpu_runbook.session as session

    real = session.Runner.run

    async def run_then_lose_the_directory(self):
        results = await real(self)
        (tmp_path / "out").rmdir()
        (tmp_path / "out").write_text("a file now")
        return results

    monkeypatch.setattr(session.Runner, "run", run_then_lose_the_directory)
    code = main(["run", "gone.yaml", "--no-tui", "--probes-dir", str(TESTS / "probe_files"), "--report", "out/r.md", "--json", "r.json"])
    out, err = capsys.readouterr()
    clear = code == 2 and "could not write the report out/r.md" in err and (tmp_path / "r.json").exists()
    _record("report directory gone mid-run", clear, "Traceback" in err or code == 70, False)
    assert clear, (code, err)


# ---- probes that break the contract ---------------------------------------------------------------


def test_misbehaving_probes_mark_their_branch_and_the_run_goes_on(tmp_path):
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "fault_probes.py").write_text(FAULT_PROBES)
    (tmp_path / "misbehaving.yaml").write_text(MISBEHAVING)
    expected = {
        "hangs": ("error", "timed out after 0.5 s"),
        "blocks": ("error", "blocks the event loop"),
        "retries": ("error", "timed out after 0.3 s"),
        "exits": ("error", "the probe called sys.exit(3)"),
        "prints": ("confirmed", "confirm: p.v == 1.0"),
        "wrong-type": ("error", "probe returned dict, not Evidence"),
        "not-json": ("error", "not JSON serializable"),
        "non-finite": ("inconclusive", ""),
    }
    proc = _start(["run", "misbehaving.yaml", "--no-tui", "--probes-dir", str(TESTS / "probe_files"), "--probes-dir", str(probes),
                   "--json", "r.json", "--report", "r.md"], tmp_path)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        for case in expected:
            _record(f"probe {case}", False, False, True)
        raise
    crashed = "Traceback" in out + err or proc.returncode == 70
    orphans = not _no_orphans(proc.pid)
    results = json.loads((tmp_path / "r.json").read_text(), parse_constant=lambda c: pytest.fail(f"results JSON holds {c}")) if (tmp_path / "r.json").exists() else {"hypotheses": []}
    verdicts = {h["id"]: (h["verdict"], h["reason"]) for h in results["hypotheses"]}
    written = (tmp_path / "r.md").exists()
    for case, (verdict, reason) in expected.items():
        got = verdicts.get(case, ("missing", ""))
        _record(f"probe {case}", written and not orphans and got[0] == verdict and reason in got[1], crashed, False)
    assert proc.returncode == 0, err
    assert not crashed and not orphans
    assert verdicts["fine"][0] == "confirmed"
    for case, (verdict, reason) in expected.items():
        assert verdicts[case][0] == verdict and reason in verdicts[case][1], (case, verdicts[case])
    # what the probe printed went to the log, never raw into the output
    assert not any(line.startswith("PROBE-NOISE-4242") for line in out.splitlines())
    assert "fault.prints printed to stdout (kept out of the output): PROBE-NOISE-4242" in out
    assert "PROBE-NOISE-4242" not in (tmp_path / "r.json").read_text()


def test_probe_file_that_fails_to_import_is_a_positioned_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_probe.py").write_text("import no_such_module_anywhere\n")
    (tmp_path / "rb.yaml").write_text("probe_files: [broken_probe.py]\n" + MISBEHAVING.split("  - id: hangs")[0])
    code = main(["run", "rb.yaml", "--no-tui", "--probes-dir", str(TESTS / "probe_files"), "--report", "r.md"])
    out, err = capsys.readouterr()
    clear = code == 2 and "rb.yaml:1:14: probe file broken_probe.py: ModuleNotFoundError" in err
    _record("probe file fails to import", clear, "Traceback" in err or code == 70, False)
    assert clear, err
    assert not (tmp_path / "r.md").exists()
