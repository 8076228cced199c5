"""A runbook's `load:` drives the server while `under_load` probes sample, in one shared window."""

from __future__ import annotations

import asyncio
import time

from gpu_runbook.model import Verdict
from gpu_runbook.probe import Target
from gpu_runbook.runner import Runner, resolve_params
from gpu_runbook.sim.sglang_server import SimServer, SimServerConfig

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
    from gpu_runbook.events import LogLine

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


# ---- streams written unlike SGLang's (issue 10 acceptance 3) -------------------------------------

GATED = """
name: gated-load
title: t
load:
  concurrency: 4
  input_len: 16
  output_len: 5
  max_requests: 4
  warmup_s: 0
hypotheses:
  - id: streamed
    title: the warm-up ended on the first counted tokens, before any request finished
    probes:
      gate: { probe: test.open_gate, under_load: true }
    confirm: gate.tokens_at_start > 0.0 && gate.completed_at_start == 0.0
    refute: gate.tokens_at_start == 0.0
"""


def _registry_with_gate():
    from gpu_runbook.registry import Registry

    from conftest import PROBE_FILES

    reg = Registry.discover([PROBE_FILES, PROBE_FILES.parent / "load_probe_files"])
    assert "test.open_gate" in reg.probes, reg.errors
    return reg


async def test_spaced_json_is_counted_and_the_warm_up_starts_on_the_first_token(write_runbook):
    """A server writing `"completion_tokens": 5` (json.dumps defaults): every token counted, and the
    ramp ends when the first ones are, while every stream is held at the server's gate."""
    from aiohttp import web

    from gpu_runbook.events import LogLine
    from gpu_runbook.loader import load
    from sse_servers import dump, serve

    gate = asyncio.Event()

    async def generate(request: web.Request) -> web.StreamResponse:
        n = (await request.json())["sampling_params"]["max_new_tokens"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for k in range(1, n + 1):
            await resp.write(dump({"text": "x" * k, "meta_info": {"id": "a", "completion_tokens": k}}, "spaced"))
            if k == 1:
                await asyncio.wait_for(gate.wait(), 60)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def open_gate(request: web.Request) -> web.Response:
        gate.set()
        return web.Response(text="open")

    reg = _registry_with_gate()
    loaded = load(write_runbook(GATED), reg)
    logged: list[LogLine] = []
    async with serve({"/generate": generate, "/gate": open_gate}) as url:
        runner = Runner(loaded, reg, Target(sglang_url=url), resolve_params(loaded, {}))
        runner.subscribers.append(lambda e: logged.append(e) if isinstance(e, LogLine) else None)
        results = await runner.run()
    assert results.load is not None
    assert results.load["completed"] == 4 and results.load["failed"] == 0, results.load["error_examples"]
    assert results.load["output_tokens"] == results.load["completed_output_tokens"] == 4 * 5
    hyp = results.by_id("streamed")
    assert hyp.verdict is Verdict.confirmed, hyp.reason
    assert not [e.message for e in logged if e.level == "warning"]
    assert results.timings["load_ramp_s"] < 15.0, results.timings  # generous: the wait's limit is 30 s


def test_a_stream_format_not_understood_is_said_and_ends_the_wait(load_runbook, registry, test_probes):
    """Requests finish but no token is counted: one clear warning, and sampling starts at once."""
    from aiohttp import web

    from gpu_runbook.events import LogLine
    from sse_servers import dump, serve

    async def generate(request: web.Request) -> web.StreamResponse:  # TGI-like events, no completion_tokens
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for _ in range(3):
                await resp.write(dump({"token": {"id": 5, "text": "x"}, "generated_text": None}, "spaced"))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:  # the load stopped mid-stream
            pass
        return resp

    logged: list[LogLine] = []

    async def main():
        async with serve({"/generate": generate}) as url:
            runner = Runner(load_runbook(RUNBOOK), registry, Target(sglang_url=url), resolve_params(load_runbook(RUNBOOK), {}))
            runner.subscribers.append(lambda e: logged.append(e) if isinstance(e, LogLine) else None)
            return await runner.run()

    results = asyncio.run(main())
    warnings = [e.message for e in logged if e.level == "warning" and e.message.startswith("load:")]
    assert len(warnings) == 1 and "no tokens were counted: the stream format was not understood" in warnings[0], warnings
    assert '"generated_text"' in warnings[0]
    assert results.timings["load_ramp_s"] < 15.0, results.timings  # generous: the wait's limit is 30 s
    assert results.load is not None and results.load["stream_problem"] and results.load["output_tokens"] == 0
    assert {c["tag"]: c["load"] for c in test_probes.CALLS}["under-load"] is True


def test_the_runbook_passes_its_temperature_to_the_load(load_runbook):
    import pytest

    from gpu_runbook.model import resolve_refs
    from gpu_runbook.runner import ParamError, load_config

    text = RUNBOOK.replace("  warmup_s: 0.5\n", "  warmup_s: 0.5\n  temperature: ${temp}\n")
    text = text.replace("params:\n", "params:\n  temp: { type: float, default: 0.6 }\n")
    loaded = load_runbook(text)
    assert load_config(resolve_refs(loaded.runbook.load.model_dump(), resolve_params(loaded, {}))).temperature == 0.6
    assert load_config(resolve_refs(load_runbook(RUNBOOK).runbook.load.model_dump(), {"concurrency": 2})).temperature == 0.0
    with pytest.raises(ParamError, match="load: temperature: "):
        resolve_params(loaded, {"temp": "-1"})
