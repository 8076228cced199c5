"""`runbook simulate SCENARIO`: the simulated SGLang server on its own, for other clients, until Ctrl-C."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from gpu_runbook.cli import main

from conftest import REPO

SCENARIO = "seed-rtx-pro-6000-tp8"


def _start(*args: str) -> tuple[subprocess.Popen[str], str]:
    """`runbook simulate ...` in a child; returns it and the first line of its stdout (60 s deadline)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    proc = subprocess.Popen([sys.executable, "-m", "gpu_runbook.cli", "simulate", *args], cwd=REPO, env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=60):
            proc.kill()
            pytest.fail(f"no URL line within 60 s; stderr: {proc.communicate()[1]}")
    return proc, proc.stdout.readline().strip()


def _stop(proc: subprocess.Popen[str], sig: int) -> tuple[int, str]:
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"still running 30 s after signal {sig}")
    return proc.returncode, err


def test_serves_until_ctrl_c_with_the_url_first() -> None:
    proc, url = _start(SCENARIO, "--port", "0")
    try:
        assert url.startswith("http://127.0.0.1:") and int(url.rsplit(":", 1)[1]) > 0, url
        with httpx.Client(base_url=url, timeout=30, trust_env=False) as client:
            assert client.get("/health").status_code == 200
            info = client.get("/get_model_info").json()
            assert info["model_path"]
            body = {"input_ids": [1000, 1001, 1002], "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True}, "stream": True}
            with client.stream("POST", "/generate", json=body) as resp:
                assert resp.status_code == 200
                events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            assert json.loads(events[-2])["meta_info"]["completion_tokens"] == 4
    finally:
        rc, err = _stop(proc, signal.SIGINT)
    assert rc in (0, 130), err
    assert "Traceback" not in err and SCENARIO in err


def test_sigterm_stops_it_cleanly_too() -> None:
    proc, url = _start(SCENARIO)
    assert url.startswith("http://127.0.0.1:")
    rc, err = _stop(proc, signal.SIGTERM)
    assert rc == 0 and "Traceback" not in err, err
    with pytest.raises(httpx.ConnectError):  # and the server went with it
        httpx.get(url + "/health", timeout=5, trust_env=False)


def test_a_given_port_is_used() -> None:
    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, url = _start(SCENARIO, "--port", str(port))
    try:
        assert url == f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/v1/models", timeout=30, trust_env=False).status_code == 200
    finally:
        rc, err = _stop(proc, signal.SIGINT)
    assert rc in (0, 130), err


def test_unknown_scenario_lists_the_available_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "no-such-scenario"]) == 2
    err = capsys.readouterr().err
    assert "no scenario named 'no-such-scenario'" in err and SCENARIO in err


def test_a_port_in_use_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["simulate", SCENARIO, "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot serve on 127.0.0.1:{port}" in err and "Traceback" not in err
    assert main(["simulate", SCENARIO, "--port", "70000"]) == 2
