"""A runbook's `load:` drives the server while `under_load` probes sample, in one shared window."""

from __future__ import annotations

import asyncio
import time

from engine.model import Verdict
from engine.probe import Target
from engine.runner import Runner, resolve_params
from engine.sim.sglang_server import SimServer, SimServerConfig

RUNBOOK = """
name: load-window
title: t
params:
  concurrency: { type: int, default: 24 }
load:
  concurrency: ${concurrency}
  input_len: 16
  output_len: 4000
  warmup_s: 0.5
hypotheses:
  - id: batch-full
    title: the server runs the generated load as one batch
    probes:
      metrics: { probe: sglang.metrics, with: { duration_s: 1.0, interval_s: 0.2 }, under_load: true }
      seen: { probe: test.value, with: { tag: under-load, values: { ok: true } }, under_load: true }
      before: { probe: test.value, with: { tag: no-load, values: { ok: true } } }
    confirm: metrics.num_running_reqs.mean >= double(params.concurrency) * 0.9
    refute: metrics.num_running_reqs.mean < double(params.concurrency) * 0.5
"""


def test_load_runs_while_under_load_probes_sample(load_runbook, registry, test_probes):
    loaded = load_runbook(RUNBOOK)
    with SimServer(SimServerConfig(step_base_ms=5.0, step_per_req_ms=0.05)) as server:
        runner = Runner(loaded, registry, Target(sglang_url=server.url), resolve_params(loaded, {}))
        results = asyncio.run(runner.run())
        for _ in range(40):  # the server notices dropped streams at its next step
            if server.state.running == 0:
                break
            time.sleep(0.05)
        assert server.state.running == 0, "the load must stop when the window closes"
    hyp = results.by_id("batch-full")
    assert hyp.verdict is Verdict.confirmed, hyp.reason
    calls = {c["tag"]: c for c in test_probes.CALLS}
    assert calls["under-load"]["load"] is True and calls["no-load"]["load"] is False
    assert results.load is not None
    assert results.load["config"]["concurrency"] == 24
    assert results.load["output_tokens"] > 0
    assert results.timings["load_window_s"] >= 1.5  # warm-up + the longest under-load probe
    metrics_call = next(p for p in results.probes if p.probe == "sglang.metrics")
    assert metrics_call.under_load and metrics_call.started_at >= results.started_at


def test_generate_load_false_samples_without_load(load_runbook, registry, test_probes):
    text = RUNBOOK.replace("  concurrency: ${concurrency}\n", "  enabled: false\n  concurrency: ${concurrency}\n")
    loaded = load_runbook(text)
    with SimServer(SimServerConfig(step_base_ms=5.0)) as server:
        results = asyncio.run(Runner(loaded, registry, Target(sglang_url=server.url)).run())
    assert results.load is None
    assert results.by_id("batch-full").verdict is Verdict.refuted
    assert {c["tag"]: c["load"] for c in test_probes.CALLS}["under-load"] is False


def test_a_server_that_refuses_ends_the_wait_for_load_early(load_runbook, registry, test_probes, refused_port):
    """Nothing streams from a refused port: the window says why at once and samples anyway."""
    from engine.events import LogLine

    port = refused_port
    logged: list[LogLine] = []
    runner = Runner(load_runbook(RUNBOOK), registry, Target(sglang_url=f"http://127.0.0.1:{port}"))
    runner.subscribers.append(lambda e: logged.append(e) if isinstance(e, LogLine) else None)
    results = asyncio.run(runner.run())
    warning = next(e.message for e in logged if e.level == "warning" and "no tokens streamed" in e.message)
    assert "connect: cannot connect to" in warning
    assert results.timings["load_ramp_s"] < 10.0, results.timings
    assert results.load is not None and results.load["errors_by_kind"].get("connect", 0) > 0
    assert results.by_id("batch-full").verdict is Verdict.inconclusive  # the metrics could not be read
    assert {c["tag"]: c["load"] for c in test_probes.CALLS}["under-load"] is True
