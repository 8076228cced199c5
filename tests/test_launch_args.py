"""The server's launch arguments read from the process tree of the processes on the GPUs (probes/server/launch_args.py).

vLLM's TP workers and engine core, SGLang's schedulers, are spawned processes whose command line is
multiprocessing's, not `vllm serve ...`: the server's command line is that of an ancestor. The trees here are real
processes read through this host's /proc; only the GPUs (which PIDs NVML lists) are stand-ins."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from gpu_runbook.probe import Context
from gpu_runbook.probes.server import launch_args as la
from gpu_runbook.registry import Registry

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

# A stand-in for `vllm serve`: its main process spawns an "engine core" (multiprocessing spawn, as vLLM does once
# CUDA is initialised), which spawns a "worker": the process that would hold a GPU. The worker writes its PID.
FAKE_VLLM = """\
import multiprocessing as mp
import os
import time


def worker(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(120)


def engine_core(path):
    w = mp.get_context("spawn").Process(target=worker, args=(path,))
    w.start()
    w.join()


if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=engine_core, args=(os.environ["FAKE_VLLM_PID_FILE"],))
    p.start()
    p.join()
"""


class ServerTree:
    """`<tmp>/vllm serve /models/x --tensor-parallel-size 4 ...` with a spawned engine core and worker; the whole
    session (one process group, started here) is killed on exit."""

    def __init__(self, tmp: Path, args: list[str]) -> None:
        script = tmp / "vllm"
        script.write_text(f"#!{sys.executable}\n{FAKE_VLLM}")
        script.chmod(0o755)
        self.pid_file = tmp / "worker.pid"
        env = {**os.environ, "FAKE_VLLM_PID_FILE": str(self.pid_file)}
        self.proc = subprocess.Popen([str(script), *args], env=env, start_new_session=True)
        self.worker = 0

    def __enter__(self) -> ServerTree:
        deadline = time.monotonic() + 60
        try:
            while not self.pid_file.exists():
                assert self.proc.poll() is None, f"the fake server exited: {self.proc.returncode}"
                assert time.monotonic() < deadline, "the spawned worker did not start within 60 s"
                time.sleep(0.05)
            self.worker = int(self.pid_file.read_text())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group of the process this test started
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def test_the_server_command_line_is_found_above_a_spawned_gpu_worker(tmp_path):
    with ServerTree(tmp_path, ["serve", "/models/x", "--tensor-parallel-size", "4", "--max-num-seqs", "64"]) as tree:
        worker_argv = la.read_cmdline(tree.worker)
        assert worker_argv is not None and la.parse_cmdline(worker_argv) is None  # the worker's own line says nothing
        args, why = la.find_server(tree.worker, "vllm")
        assert args is not None, why
        assert (args.kind, args.pid, args.gpu_pid, args.depth, args.model) == ("vllm", tree.proc.pid, tree.worker, 2, "/models/x")
        assert args.flags == {"tensor_parallel_size": "4", "max_num_seqs": "64"}
        assert args.source == f"cmdline of PID {tree.proc.pid}, found as an ancestor of GPU process PID {tree.worker} (2 parents up)"
        # the server itself on the GPU: the source stays the plain one
        top, _ = la.find_server(tree.proc.pid, "vllm")
        assert top is not None and top.source == f"cmdline of PID {tree.proc.pid}"
        # a server of another kind is not this one
        other, why = la.find_server(tree.worker, "sglang")
        assert other is None and f"PID {tree.proc.pid}" in why and "vllm, not sglang" in why
        # the walk is bounded
        short, why = la.find_server(tree.worker, "vllm", max_depth=1)
        assert short is None and "within 1 parents" in why


def test_no_server_above_a_process_says_so():
    args, why = la.find_server(os.getpid(), "vllm")  # pytest, its shell, ... init: none launches a server
    assert args is None and why.startswith("no server command line")


def test_a_process_that_is_gone_or_unreadable_gives_none_with_the_reason():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    pid = p.pid if not Path(f"/proc/{p.pid}").exists() else 1 << 30  # reused already: one above any pid_max
    args, why = la.find_server(pid)
    assert args is None and f"/proc/{pid}" in why and "not readable" in why
    assert la.read_stat(1 << 30) is None and la.read_cmdline(1 << 30) is None


def test_stat_is_read_past_a_command_name_with_spaces_and_parentheses():
    code = "import sys, time; open('/proc/self/comm', 'w').write('a) b (c'); print('ok', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ok"  # blocks until the name is set, or EOF
        stat = la.read_stat(p.pid)
        assert stat is not None and stat[0] == os.getpid()
        assert stat[1] >= la.read_stat(os.getpid())[1]  # type: ignore[index]  # a child starts after its parent
    finally:
        p.kill()
        p.wait(10)


def test_a_command_line_is_read_bounded():
    big = "x" * 100_000
    code = "import sys; print('ok', flush=True); sys.stdin.read()"
    p = subprocess.Popen([sys.executable, "-c", code, big, big, big], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ok"
        argv = la.read_cmdline(p.pid)
        assert argv is not None and len("\0".join(argv)) <= la.MAX_CMDLINE and argv[0] == sys.executable
        assert argv[3:] == []  # the first 100 kB argument does not fit: it is left out, not read in part
    finally:
        p.kill()
        p.wait(10)


class FakeProc:
    """A /proc made of a dict: pid -> (ppid, starttime, argv); stat reads may change between calls."""

    def __init__(self, monkeypatch, procs: dict[int, tuple[int, int, list[str]]]) -> None:
        self.procs = procs
        self.stat_reads: dict[int, int] = {}
        self.after: dict[int, tuple[int, int]] = {}  # pid -> the stat its second read gives
        monkeypatch.setattr(la, "read_stat", self.stat)
        monkeypatch.setattr(la, "read_cmdline", lambda pid: self.procs[pid][2] if pid in self.procs else None)

    def stat(self, pid: int) -> tuple[int, int] | None:
        if pid not in self.procs:
            return None
        n = self.stat_reads[pid] = self.stat_reads.get(pid, 0) + 1
        return self.after[pid] if n > 1 and pid in self.after else self.procs[pid][:2]


def test_the_walk_stops_at_loops_reused_pids_and_processes_that_change(monkeypatch):
    serve = ["vllm", "serve", "m", "-tp", "2"]
    fake = FakeProc(monkeypatch, {10: (11, 500, ["w"]), 11: (10, 400, ["w"])})
    args, why = la.find_server(10)
    assert args is None and "reached the top" in why  # 10 -> 11 -> 10: no PID twice
    fake.procs = {10: (11, 500, ["w"]), 11: (1, 900, serve)}  # the "parent" started after its child: a reused PID
    args, why = la.find_server(10)
    assert args is None and "reused" in why
    fake.procs = {10: (11, 500, ["w"]), 11: (1, 400, serve)}
    assert la.find_server(10)[0] is not None
    fake.after = {11: (1, 950)}  # PID 11 replaced between its stat and its command line
    args, why = la.find_server(10)
    assert args is None and "exited" in why

    def boom(pid: int) -> None:
        raise RuntimeError("weird /proc")

    monkeypatch.setattr(la, "read_stat", boom)
    args, why = la.find_server(10)
    assert args is None and "RuntimeError" in why  # never raises


def test_gpus_held_counts_the_servers_gpus_and_says_what_it_is():
    n, src = la.count_gpus_held([[10], [11], [99], []], server_pid=1, owner={10: 1, 11: 1})
    assert n == 2 and "server's processes" in src and "PID 1" in src and "TP x PP x DP" in src
    n, src = la.count_gpus_held([[10], [11], [99], []])  # no command line: any compute process counts
    assert n == 3 and "only if nothing else runs" in src
    n, why = la.count_gpus_held([[10], None])
    assert n is None and "1 of 2 GPUs" in why
    n, why = la.count_gpus_held([[], []])
    assert n is None and "no compute process" in why


def test_server_processes_on_the_simulated_host(tmp_path):
    """Through NVML (the simulated host lists the worker on every GPU): the launch arguments come from the worker's
    ancestor, and the GPUs its processes hold are counted; a PID /proc does not show leaves the count only."""
    from gpu_runbook.sim.host import SimulatedHost

    with ServerTree(tmp_path, ["serve", "/models/x", "--tensor-parallel-size", "4"]) as tree, \
            SimulatedHost.start("max-num-seqs-64-vllm") as host:  # fmt: skip
        ngpus = len(host.fake.gpus)

        async def go() -> tuple[la.ServerProcesses, la.LaunchArgs | None, dict]:
            async with httpx.AsyncClient() as http:
                ctx = Context(target=host.target(), http=http, nvml=host.nvml)
                sp = await la.server_processes(ctx, "vllm")
                launch = await la.server_process_args(ctx, "vllm")
                reg = Registry.discover([])
                ev = await reg.probes["vllm.server"]().run(ctx, reg.probes["vllm.server"].Params())
                return sp, launch, ev.values

        host.fake.compute_pids = [tree.worker]
        sp, launch, v = asyncio.run(go())
        assert sp.launch is not None and sp.reason is None and sp.gpu_pids == [tree.worker]
        assert launch is not None and (launch.pid, launch.flags["tensor_parallel_size"]) == (tree.proc.pid, "4")
        assert sp.gpus_held == ngpus and f"reaches PID {tree.proc.pid}" in (sp.gpus_held_source or "")
        assert (launch.gpus_held, launch.gpus_held_source) == (sp.gpus_held, sp.gpus_held_source)
        assert (v["dev_mode"], v["tp"]) == (False, 4)
        assert v["sources"]["tp"] == launch.source and f"ancestor of GPU process PID {tree.worker}" in launch.source

        host.fake.compute_pids = [1 << 30]  # a PID this host's /proc does not have (another PID namespace)
        sp, launch, _ = asyncio.run(go())
        assert sp.launch is None and launch is None and "not readable" in (sp.reason or "")
        assert sp.gpus_held == ngpus and "only if nothing else runs" in (sp.gpus_held_source or "")

        host.fake.compute_pids = []
        sp, _, _ = asyncio.run(go())
        assert (sp.launch, sp.gpus_held) == (None, None) and "no compute process" in (sp.gpus_held_reason or "")


def test_no_nvml_gives_reasons_not_an_exception():
    class NoNvml:
        async def call(self, fn):
            raise RuntimeError("no driver")

    ctx = SimpleNamespace(nvml=NoNvml())
    sp = asyncio.run(la.server_processes(ctx, "vllm"))  # type: ignore[arg-type]
    assert sp.launch is None and sp.gpus_held is None and "RuntimeError" in (sp.reason or "") and sp.gpus_held_reason
    assert asyncio.run(la.server_process_args(ctx)) is None  # type: ignore[arg-type]


def test_python_m_vllm_cli_main_serve_reads_the_model():
    a = la.parse_cmdline(["python", "-m", "vllm.entrypoints.cli.main", "serve", "m", "-tp", "2"])
    assert a is not None and (a.kind, a.model, a.flags) == ("vllm", "m", {"tensor_parallel_size": "2"})
