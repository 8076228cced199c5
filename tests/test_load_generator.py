"""The load generator and the sweep against the simulated server on 127.0.0.1."""

from __future__ import annotations

import time

import asyncio
from typing import Any

import httpx
import pytest

from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.load import LoadConfig, LoadGenerator, output_len_for
from gpu_runbook.probe import Context
from gpu_runbook.target import Target
from gpu_runbook.results import load_outcome
from gpu_runbook.sim.sglang_server import SimFaults, SimServer, SimServerConfig
from gpu_runbook.probes.server.sweep import diagnose
from gpu_runbook.probes.sglang.server import SglangSweep

FAST = dict(step_base_ms=2.0, step_per_req_ms=0.01, prefill_ms_per_1k_tokens=0.0)


def sim(**kw: Any) -> SimServer:
    return SimServer(SimServerConfig(**{**FAST, **kw}))


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
@pytest.mark.parametrize("version", ["0.5.5.post3", "0.5.23"])
async def test_counts_tokens_and_latencies(endpoint: str, version: str) -> None:
    async with sim(version=version) as srv:
        gen = LoadGenerator(Target(sglang_url=srv.url), LoadConfig(endpoint=endpoint, concurrency=8, input_len=32, output_len=12, max_requests=24))
        rep = await gen.run()
        # the server counts a request's tokens when it finishes it, which can be just after the client read its last chunk
        deadline = time.monotonic() + 10
        while srv.state.prompt_tokens_total < 24 * 32 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert srv.state.prompt_tokens_total == 24 * 32 or endpoint == "completions"
    assert rep.completed == 24 and rep.failed == 0 and rep.cancelled == 0
    assert rep.output_tokens == rep.completed_output_tokens == 24 * 12
    assert rep.input_tokens == 24 * 32
    assert rep.ttft_ms.p50 and rep.itl_ms.p50 and rep.tpot_ms.p50 and rep.e2e_ms.p99
    assert rep.e2e_ms.p50 >= rep.ttft_ms.p50
    assert rep.output_tokens_per_s > 0 and rep.request_throughput > 0
    assert gen.stats().in_flight == 0


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
async def test_spread_output_lengths_reach_the_server_as_drawn(endpoint: str) -> None:
    """Each request asks for its own length in [ratio x output_len, output_len]: the tokens the server generated
    are the sum of the lengths drawn for the requests sent, and they differ (a batch then finishes over time)."""
    cfg = LoadConfig(endpoint=endpoint, concurrency=4, input_len=8, output_len=40, output_range_ratio=0.5, max_requests=20, seed=3)
    drawn = [output_len_for(3, n, 40, 0.5) for n in range(1, 21)]  # requests are numbered from 1
    assert all(20 <= d <= 40 for d in drawn) and len(set(drawn)) > 5
    async with sim() as srv:
        rep = await LoadGenerator(Target(sglang_url=srv.url), cfg).run()
    assert rep.completed == 20 and rep.failed == 0
    assert rep.output_tokens == sum(drawn)
    assert output_len_for(3, 7, 40, 1.0) == 40 and output_len_for(3, 7, 1, 0.0) == 1


async def test_coalesced_decode_steps_are_counted_by_completion_tokens() -> None:
    async with sim(stream_interval=4) as srv:  # several tokens per chunk (--num-continuous-decode-steps is read by no release)
        rep = await LoadGenerator(Target(sglang_url=srv.url), LoadConfig(concurrency=2, output_len=10, max_requests=2)).run()
    assert rep.output_tokens == 20 and rep.completed == 2


async def test_sends_api_key_and_reports_401_without_it() -> None:
    async with sim(api_key="k1") as srv:
        bad = await LoadGenerator(Target(sglang_url=srv.url), LoadConfig(concurrency=2, output_len=4, max_requests=4)).run()
        good = await LoadGenerator(Target(sglang_url=srv.url, api_key="k1"), LoadConfig(endpoint="completions", concurrency=2, output_len=4, max_requests=4)).run()
    assert bad.completed == 0 and bad.errors_by_kind == {"http_401": 4}
    assert good.completed == 4 and good.failed == 0


async def test_stream_cut_midway_is_an_error_kind() -> None:
    async with sim(faults=SimFaults(cut_stream_after_tokens=3)) as srv:
        rep = await LoadGenerator(Target(sglang_url=srv.url), LoadConfig(concurrency=2, output_len=10, max_requests=4)).run()
    assert rep.completed == 0 and rep.errors_by_kind.get("stream_cut") == 4
    assert rep.output_tokens >= 4  # tokens before the cut still count as streamed


async def test_server_down_and_timeout(refused_port: int) -> None:
    port = refused_port
    rep = await LoadGenerator(Target(sglang_url=f"http://127.0.0.1:{port}"), LoadConfig(concurrency=2, max_requests=2)).run()
    assert rep.errors_by_kind == {"connect": 2}
    async with sim(faults=SimFaults(delay_s={"/generate": 5.0})) as srv:
        rep = await LoadGenerator(Target(sglang_url=srv.url), LoadConfig(concurrency=2, max_requests=2, request_timeout_s=0.3)).run()
    assert rep.errors_by_kind == {"timeout": 2}


async def test_until_streaming_gives_up_on_a_server_that_only_fails(refused_port: int) -> None:
    """A refused port or a 401 on every request ends the wait well before its limit, with the cause."""
    port = refused_port
    gen = LoadGenerator(Target(sglang_url=f"http://127.0.0.1:{port}"), LoadConfig(concurrency=4))
    await gen.start()
    t0 = asyncio.get_running_loop().time()
    try:
        assert await gen.until_streaming(limit_s=20.0) is False
        waited = asyncio.get_running_loop().time() - t0
        assert gen.failing and (gen.first_error() or "").startswith("connect: cannot connect to")
    finally:
        await gen.stop()
    assert waited < 10.0, f"waited {waited:.1f} s on a refused port"
    async with sim(api_key="k1") as srv:
        gen = LoadGenerator(Target(sglang_url=srv.url), LoadConfig(concurrency=4))
        await gen.start()
        try:
            assert await gen.until_streaming(limit_s=20.0) is False
            assert (gen.first_error() or "").startswith("http_401: HTTP 401")
        finally:
            await gen.stop()


async def test_until_streaming_waits_for_a_slow_first_token() -> None:
    """A server that is slow but answering is not 'failing': the wait ends when tokens flow."""
    async with sim(step_base_ms=5.0, faults=SimFaults(delay_s={"/generate": 0.4})) as srv:
        gen = LoadGenerator(Target(sglang_url=srv.url), LoadConfig(concurrency=4, output_len=2000))
        await gen.start()
        try:
            assert await gen.until_streaming(limit_s=20.0) is True
            assert not gen.failing and gen.first_error() is None
        finally:
            await gen.stop()


async def test_stream_stalling_midway_is_a_timeout() -> None:
    async with sim(step_base_ms=5.0, faults=SimFaults(stop_answering_after_s=1.0)) as srv:
        t0 = asyncio.get_running_loop().time()
        rep = await LoadGenerator(Target(sglang_url=srv.url), LoadConfig(concurrency=2, output_len=100000, max_requests=2, request_timeout_s=0.4)).run()
        assert asyncio.get_running_loop().time() - t0 < 8.0  # the stall ends the requests, not their 100k tokens
    assert rep.errors_by_kind == {"timeout": 2} and rep.cancelled == 0
    assert rep.output_tokens > 0 and "after" in rep.error_examples["timeout"]


async def _raw_server(handler: Any) -> tuple[asyncio.AbstractServer, str]:
    """A bare HTTP server on 127.0.0.1: reads one request, lets `handler` write the answer, closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        n = int(next((ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")), b"0"))
        await reader.readexactly(n)
        await handler(writer)
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"


async def test_close_delimited_stream_and_error_bodies() -> None:
    async def sse(writer: asyncio.StreamWriter) -> None:  # no Content-Length, no chunking: ends at close
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for i in range(1, 6):
            writer.write(b'data: {"text":"x","meta_info":{"id":"a","completion_tokens":%d}}\n\n' % i)
            await writer.drain()
            await asyncio.sleep(0.002)
        writer.write(b"data: [DONE]\n\n")

    async def unavailable(writer: asyncio.StreamWriter) -> None:
        body = b'{"error":"overloaded"}'
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))

    async def truncated(writer: asyncio.StreamWriter) -> None:  # clean close, but no [DONE]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        writer.write(b'data: {"text":"x","meta_info":{"completion_tokens":1}}\n\n')

    srv, url = await _raw_server(sse)
    async with srv:
        rep = await LoadGenerator(Target(sglang_url=url), LoadConfig(concurrency=3, output_len=5, max_requests=6)).run()
    assert rep.completed == 6 and rep.failed == 0 and rep.output_tokens == 30 and rep.itl_ms.p50
    srv, url = await _raw_server(unavailable)
    async with srv:
        rep = await LoadGenerator(Target(sglang_url=url), LoadConfig(concurrency=2, max_requests=2)).run()
    assert rep.errors_by_kind == {"http_503": 2} and "overloaded" in rep.error_examples["http_503"]
    srv, url = await _raw_server(truncated)
    async with srv:
        rep = await LoadGenerator(Target(sglang_url=url), LoadConfig(concurrency=1, max_requests=1)).run()
    assert rep.errors_by_kind == {"incomplete": 1} and rep.output_tokens == 1


async def test_reports_client_cpu() -> None:
    async with sim() as srv:
        rep = await LoadGenerator(Target(sglang_url=srv.url), LoadConfig(concurrency=8, output_len=50, duration_s=0.5)).run()
    assert rep.completed > 0
    assert 0 < rep.client_cpu_s and rep.client_cpu_share == pytest.approx(rep.client_cpu_s / rep.duration_s, abs=0.01)
    assert rep.client_cpu_share < 4  # one process; the simulated server's thread is in it here


async def test_duration_and_clean_stop() -> None:
    async with sim(step_base_ms=5.0) as srv:
        gen = LoadGenerator(Target(sglang_url=srv.url), LoadConfig(concurrency=32, output_len=1000))
        await gen.start()
        await asyncio.sleep(0.5)
        live = gen.stats()
        assert live.in_flight == 32 and live.output_tokens > 0 and live.output_tokens_per_s > 0
        rep = await gen.stop()
        assert await gen.stop() is rep  # idempotent
        for _ in range(100):  # the server sees the disconnects at its next step
            if srv.state.running == 0:
                break
            await asyncio.sleep(0.02)
        assert srv.state.running == 0  # the server saw the disconnects and freed the batch
    assert rep.cancelled == 32 and rep.failed == 0 and rep.completed == 0 and rep.output_tokens > 0
    assert gen.stats().in_flight == 0
    # 32 streams ran the whole time though none finished: the mean in flight counts them
    assert 16 < rep.concurrency_achieved <= 32
    # ...and the line says that none finishing is the window's length, not a failure
    assert load_outcome(rep.model_dump()).startswith("0 requests completed, 32 still in flight at the end (each outlived the window: not a failure), 0 failed, ")
    async with sim() as srv:
        t0 = asyncio.get_running_loop().time()
        rep = await LoadGenerator(Target(sglang_url=srv.url), LoadConfig(concurrency=4, output_len=20, duration_s=0.4)).run()
        assert asyncio.get_running_loop().time() - t0 < 5.0
    assert rep.completed > 0 and 0.35 < rep.duration_s < 3.0


async def test_shared_client_is_left_open() -> None:
    async with sim() as srv, httpx.AsyncClient() as client:
        rep = await LoadGenerator(Target(sglang_url=srv.url), LoadConfig(concurrency=2, max_requests=2, output_len=3), client=client).run()
        assert rep.completed == 2 and not client.is_closed


def test_config_is_strict() -> None:
    with pytest.raises(ValueError):
        LoadConfig(concurrency=0)
    with pytest.raises(ValueError):
        LoadConfig(bogus=1)  # type: ignore[call-arg]


# ---- sglang.sweep ----------------------------------------------------------------------------------

async def _sweep(**sim_kw: Any) -> Any:
    async with sim(step_base_ms=5.0, step_per_req_ms=0.2, **sim_kw) as srv:
        ctx = Context(target=Target(sglang_url=srv.url), http=httpx.AsyncClient(), nvml=None)  # type: ignore[arg-type]
        params = SglangSweep.Params(levels=[2, 8, 32, 64], seconds_per_level=0.8, input_len=32, output_len=64, metrics_interval_s=0.1)
        return await SglangSweep().run(ctx, params)


async def test_sweep_finds_the_kv_cache_wall() -> None:
    ev = await _sweep(max_total_num_tokens=960, max_running_requests=1024)  # 96 tokens/request -> 10 fit
    assert ev.ok, ev.reason
    v = ev.values
    assert [lv["concurrency"] for lv in v["levels"]] == [2, 8, 32, 64]
    assert v["limit"] == "kv-cache", v["limit_reason"]
    # (where the plateau starts depends on a few hundred ms of throughput per level: timing, not asserted)
    top = v["levels"][-1]
    # the cache holds 10: admission reserves each new request's whole output (ignore_eos), so usage (allocated
    # slots) can read anywhere from the prompts' share (32 of 96 tokens) up to full while the queue waits
    assert top["running_max"] == 10 and top["token_usage_max"] >= 32 / 96 * 0.9 and top["queue_mean"] > 20


async def test_sweep_finds_the_running_requests_cap() -> None:
    ev = await _sweep(max_running_requests=10)
    assert ev.ok, ev.reason
    assert ev.values["limit"] == "running-requests-cap", ev.values["limit_reason"]
    assert ev.values["max_running_requests"] == 10


def test_diagnose_still_scaling_and_unknown() -> None:
    def lv(c: int, t: float, **kw: Any) -> dict[str, Any]:
        return {"concurrency": c, "output_tokens_per_s": t, "queue_mean": 0.0, "token_usage_max": 0.2, "running_max": c, **kw}

    assert diagnose([lv(1, 100), lv(4, 400)], None, True)["limit"] == "none"
    flat = diagnose([lv(1, 100), lv(4, 390), lv(16, 400)], None, True)
    assert flat["limit"] == "unknown" and flat["plateau_concurrency"] == 4
    assert diagnose([lv(1, 100), lv(4, 390), lv(16, 400)], None, False)["limit"] == "unknown"


def test_diagnose_takes_a_pinned_batch_with_a_queue_as_the_plateau_whatever_the_client_counted() -> None:
    """A capped server (64 running) whose throughput the client counted 12 % higher at the top level than at
    the one before (short levels on a busy client): the batch stopped growing at 256, so that is the plateau."""
    levels = [
        {"concurrency": 1, "output_tokens_per_s": 60.0, "queue_mean": 0.0, "token_usage_max": 0.01, "running_max": 1},
        {"concurrency": 16, "output_tokens_per_s": 700.0, "queue_mean": 0.0, "token_usage_max": 0.05, "running_max": 16},
        {"concurrency": 256, "output_tokens_per_s": 1500.0, "queue_mean": 190.0, "token_usage_max": 0.2, "running_max": 64},
        {"concurrency": 1024, "output_tokens_per_s": 1680.0, "queue_mean": 950.0, "token_usage_max": 0.2, "running_max": 64},
    ]
    v = diagnose(levels, 64, True)
    assert v["limit"] == "running-requests-cap" and v["plateau_concurrency"] == 256
    assert v["peak_concurrency"] == 1024  # what the client counted stays what it counted
    rising = [{**lv, "queue_mean": 0.0, "running_max": lv["concurrency"]} for lv in levels]  # no queue, batch growing
    assert diagnose(rising, None, True)["plateau_concurrency"] is None


async def test_sweep_server_down_is_unavailable(refused_port: int) -> None:
    port = refused_port
    ctx = Context(target=Target(sglang_url=f"http://127.0.0.1:{port}"), http=httpx.AsyncClient(), nvml=None)  # type: ignore[arg-type]
    ev = await SglangSweep().run(ctx, SglangSweep.Params(levels=[1], seconds_per_level=0.2))
    assert ev.status is ProbeStatus.unavailable
