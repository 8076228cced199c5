"""Real Prometheus and VictoriaMetrics for the fleet tests: started on 127.0.0.1 (a free port each), with a
temporary data directory, scraping what the test says; stopped and deleted after.

Both are Debian packages (`prometheus`, `victoria-metrics`), installed by `.ci/run`. Readiness and data are
polled to deadlines, never slept for.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx

PROMETHEUS = shutil.which("prometheus")
VICTORIA = shutil.which("victoria-metrics")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.25) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            last = exc
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}" + (f" (last error: {last})" if last else ""))


@contextlib.contextmanager
def _process(argv: list[str], url: str, ready_path: str, log: Path, timeout_s: float = 60.0) -> Iterator[str]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{argv[0]} exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
            return httpx.get(url + ready_path, timeout=2.0).status_code == 200

        wait_for(ready, timeout_s, f"{argv[0]} to answer {url}{ready_path}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextlib.contextmanager
def prometheus(config: str) -> Iterator[str]:
    """A Prometheus scraping per `config` (YAML text); yields its base URL."""
    assert PROMETHEUS, "prometheus is not installed (apt-get install prometheus; .ci/run does)"
    tmp = Path(tempfile.mkdtemp(prefix="runbook-prom-"))
    try:
        (tmp / "prometheus.yml").write_text(config, encoding="utf-8")
        port = free_port()
        argv = [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]  # fmt: skip
        with _process(argv, f"http://127.0.0.1:{port}", "/-/ready", tmp / "log") as url:
            yield url
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def victoria_metrics(config: str | None = None, latency_offset: str | None = None, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """A single-node VictoriaMetrics (scraping per `config` when given; `extra`: more flags); yields its base URL."""
    assert VICTORIA, "victoria-metrics is not installed (apt-get install victoria-metrics; .ci/run does)"
    tmp = Path(tempfile.mkdtemp(prefix="runbook-vm-"))
    try:
        port = free_port()
        argv = [VICTORIA, f"-storageDataPath={tmp / 'data'}", f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=ERROR"]
        if config is not None:
            (tmp / "scrape.yml").write_text(config, encoding="utf-8")
            argv.append(f"-promscrape.config={tmp / 'scrape.yml'}")
        if latency_offset is not None:
            argv.append(f"-search.latencyOffset={latency_offset}")
        argv.extend(extra)
        with _process(argv, f"http://127.0.0.1:{port}", "/health", tmp / "log") as url:
            yield url
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def query(url: str, expr: str) -> list[dict]:
    body = httpx.post(url + "/api/v1/query", data={"query": expr}, timeout=10.0).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def hold_a_steady_window(engines: dict[str, str], members: list, window_s: int, live: int | None = None) -> None:
    """Once every simulated host's traffic is steady (its first requests finished and were replaced, as `runbook run`
    waits for), wait until each engine (`{"Prometheus": url, ...}`) holds a whole window of scrapes of every live
    host (`live`: how many export GPU series; all of `members` by default)."""
    for m in members:
        assert m.wait_steady(240), f"{m.name}: no request finished"
    steady = time.time()
    live = len(members) if live is None else live

    def filled(url: str) -> bool:
        rows = query(url, f'count_over_time(DCGM_FI_DEV_POWER_USAGE{{gpu="0"}}[{window_s}s]) >= {window_s - 3}')
        return time.time() > steady + window_s + 2 and len(rows) == live

    for name, url in engines.items():
        wait_for(lambda url=url: filled(url), 120, f"{name} to hold a steady window of every live host")
