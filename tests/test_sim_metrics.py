"""The simulated `/metrics` behaves like a real scheduler's: fixture names and types, stale gauges, counters at
completion, retractions at the KV wall, CUDA-graph pass counters, `dp_rank` labels. Polls to deadlines, no sleeps."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from gpu_runbook.sim.sglang_metrics import render
from gpu_runbook.sim.sglang_server import SimServer, SimServerConfig
from gpu_runbook.sim.sim_state import SimState

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "sglang"
FAST = dict(step_base_ms=2.0, step_per_req_ms=0.01, prefill_ms_per_1k_tokens=0.0)
# Labelled counters a prometheus_client registry exports only once a child exists (after the first .inc()).
LAZY = {"sglang:num_retracted_requests_total", "sglang:num_retracted_input_tokens_total", "sglang:num_retracted_output_tokens_total",
        "sglang:cuda_graph_passes_total", "sglang:realtime_tokens_total"}  # fmt: skip


def types_of(text: str) -> dict[str, str]:
    return {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")}


def samples(text: str, name: str) -> list[tuple[str, float]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            out.append((head, float(value)))
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    for head, v in samples(text, name):
        if all(f'{k}="{want}"' in head for k, want in labels.items()):
            return v
    return None


def sim(**kw: Any) -> SimServer:
    return SimServer(SimServerConfig(**{**FAST, **kw}))


async def until(check: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def send(client: httpx.AsyncClient, url: str, n: int, *, input_len: int = 32, max_new: int = 16) -> list[httpx.Response]:
    body = {"input_ids": list(range(input_len)), "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}}
    return await asyncio.gather(*(client.post(url + "/generate", json=body, timeout=120) for _ in range(n)))


@pytest.mark.parametrize("version", ["0.5.5.post3", "0.5.23"])
async def test_metric_names_and_types_equal_the_real_release(version: str) -> None:
    path = FIXTURES / f"metrics_{version}.txt"
    if not path.is_file():
        pytest.skip(f"shared fixture {path} not found (fixtures are not shipped with the package)")
    real = types_of(path.read_text())
    async with sim(version=version, server_args={"tp_size": 2}) as srv, httpx.AsyncClient() as client:
        fresh = types_of((await client.get(srv.url + "/metrics")).text)
        await send(client, srv.url, 4)
        loaded = types_of((await client.get(srv.url + "/metrics")).text)
    assert fresh == real
    extra = set(loaded) - set(real)
    assert loaded.items() >= real.items() and extra <= LAZY
    if version == "0.5.23":
        assert "sglang:cuda_graph_passes_total" in extra  # every decode pass counts from 0.5.7
    else:
        assert not extra  # 0.5.5.post3 has none of the 0.5.7 series


async def metrics_between_logs(client: httpx.AsyncClient, url: str, st: Any) -> tuple[str, float]:
    """/metrics and the gauge value the last log wrote, from a read no log happened during: the scheduler
    thread logs every few steps, so on a busy machine one can land between the scrape and the comparison."""
    for _ in range(100):
        count, used = st.logged.log_count, st.logged.num_used_tokens
        text = (await client.get(url + "/metrics")).text
        if st.logged.log_count == count:
            return text, used
    raise AssertionError("the scheduler logged during each of 100 /metrics reads")


async def test_gauges_are_what_the_last_log_wrote() -> None:
    # decode_log_interval 1000: after the prefill batch's log nothing rewrites the gauges while 8 requests decode.
    async with sim(version="0.5.10", server_args={"decode_log_interval": 1000}) as srv, httpx.AsyncClient() as client:
        st = srv.state
        task = asyncio.create_task(send(client, srv.url, 8, max_new=400))
        await until(lambda: st.decode_steps >= 30, "30 decode steps")
        text = (await client.get(srv.url + "/metrics")).text
        # The prompts as the last prefill batch saw them (the first arrival may have decoded a step by then).
        assert value(text, "sglang:num_used_tokens") == st.logged.num_used_tokens <= 8 * 32 + 8
        assert st.allocated_tokens >= 8 * (32 + 30)  # live: one slot per generated token
        assert value(text, "sglang:gen_throughput") == 0.0  # only a decode log writes it
        await task
    async with sim(version="0.5.10", server_args={"decode_log_interval": 10}) as srv, httpx.AsyncClient() as client:
        st = srv.state
        task = asyncio.create_task(send(client, srv.url, 8, max_new=400))
        await until(lambda: st.logged.log_count >= 3 and st.decode_steps >= 25, "two decode logs")
        text, logged = await metrics_between_logs(client, srv.url, st)
        used = value(text, "sglang:num_used_tokens")
        assert used == logged and used >= 8 * (32 + 10)  # rewritten at the decode logs
        assert (value(text, "sglang:gen_throughput") or 0) > 0
        await task


async def test_token_counters_grow_when_requests_finish() -> None:
    async with sim(version="0.5.23") as srv, httpx.AsyncClient() as client:
        st = srv.state
        task = asyncio.create_task(send(client, srv.url, 4, input_len=20, max_new=300))
        await until(lambda: st.decode_steps >= 20, "20 decode steps")
        during = (await client.get(srv.url + "/metrics")).text
        assert value(during, "sglang:generation_tokens_total") == 0.0 and value(during, "sglang:prompt_tokens_total") == 0.0
        assert value(during, "sglang:num_requests_total") == 0.0
        await task
        after = (await client.get(srv.url + "/metrics")).text
    assert value(after, "sglang:generation_tokens_total") == 4 * 300 and value(after, "sglang:prompt_tokens_total") == 4 * 20
    assert value(after, "sglang:num_requests_total") == 4


async def test_the_kv_wall_retracts_requests_and_counts_them() -> None:
    # 2,000 KV slots, 16 requests of 32 + 200 tokens: optimistic admission lets more run than fit at full length.
    async with sim(version="0.5.10", max_total_num_tokens=2000) as srv, httpx.AsyncClient() as client:
        st = srv.state
        seen = {"gauge": 0.0, "usage": 0.0}

        async def scrape() -> None:
            while True:
                text = (await client.get(srv.url + "/metrics")).text
                seen["gauge"] = max(seen["gauge"], value(text, "sglang:num_retracted_reqs") or 0.0)
                seen["usage"] = max(seen["usage"], value(text, "sglang:token_usage") or 0.0)
                await asyncio.sleep(0.005)

        scraper = asyncio.create_task(scrape())
        responses = await send(client, srv.url, 16, max_new=200)
        await until(lambda: seen["gauge"] > 0 or st.logged.log_count > 10_000, "a log with retractions")
        scraper.cancel()
        text = (await client.get(srv.url + "/metrics")).text
    assert all(r.status_code == 200 for r in responses)
    assert st.retracted_requests_total > 0 and st.peak_running > 2000 // 232
    assert value(text, "sglang:num_retracted_requests_total") == st.retracted_requests_total
    assert seen["gauge"] > 0 and seen["usage"] >= 0.9
    assert value(text, "sglang:generation_tokens_total") == 16 * 200  # retracted requests still finish
    retractions = value(text, "sglang:num_retractions_sum")
    assert retractions is not None and retractions >= st.retracted_requests_total


async def test_graph_pass_counters_follow_graphs_off_and_max_bs() -> None:
    async with sim(version="0.5.10", server_args={"disable_cuda_graph": True}) as srv, httpx.AsyncClient() as client:
        await send(client, srv.url, 2, max_new=10)
        off = (await client.get(srv.url + "/metrics")).text
    assert value(off, "sglang:cuda_graph_passes_total", mode="decode_none") == srv.state.decode_steps > 0
    assert value(off, "sglang:cuda_graph_passes_total", mode="decode_cuda_graph") is None
    assert value(off, "sglang:is_cuda_graph") == 0.0
    async with sim(version="0.5.10", server_args={"cuda_graph_max_bs": 4}) as srv, httpx.AsyncClient() as client:
        await send(client, srv.url, 8, max_new=10)  # 8 > max_bs 4: eager
        await send(client, srv.url, 2, max_new=10)  # 2 <= 4: graph replay
        on = (await client.get(srv.url + "/metrics")).text
    # 10 tokens each: the first comes from the request's EXTEND pass, the other 9 from decode passes
    assert (value(on, "sglang:cuda_graph_passes_total", mode="decode_none") or 0) >= 9
    assert (value(on, "sglang:cuda_graph_passes_total", mode="decode_cuda_graph") or 0) >= 9
    assert value(on, "sglang:is_cuda_graph") == 0.0  # declared, never set by any covered release


def test_newer_series_appear_where_the_version_has_them() -> None:
    st = SimState(decode_steps=5, eager_decode_passes=5, prefill_batches=1, realtime_decode_tokens=50, busy_seconds=1.0,
                  retracted_requests_total=2)  # fmt: skip
    from gpu_runbook.sim.sglang_metrics import MetricsStatic

    on = MetricsStatic(enable_mfu_metrics=True, device_timer=True, flops_per_token=1.0, read_bytes_per_step=1.0)

    def names(version: str) -> set[str]:
        return set(types_of(render(st, version=version, model_name="m", pid=1, static=on)))

    assert "sglang:num_retracted_requests_total" not in names("0.5.5.post3")
    assert {"sglang:num_retracted_requests_total", "sglang:cuda_graph_passes_total", "sglang:decode_sum_seq_lens"} <= names("0.5.9")
    assert "sglang:estimated_flops_per_gpu_total" not in names("0.5.9") and "sglang:estimated_flops_per_gpu_total" in names("0.5.10")
    assert "sglang:forward_execution_seconds_total" not in names("0.5.10") and "sglang:forward_execution_seconds_total" in names("0.5.11")
    assert "sglang:scheduler_idle_seconds_total" not in names("0.5.13") and "sglang:scheduler_idle_seconds_total" in names("0.5.23")
    assert 'mode="prefill_none"' not in render(st, version="0.5.9", model_name="m", pid=1)
    assert 'mode="prefill_none"' in render(st, version="0.5.10", model_name="m", pid=1)
    off = set(types_of(render(st, version="0.5.23", model_name="m", pid=1)))
    assert "sglang:estimated_flops_per_gpu_total" not in off and "sglang:forward_execution_seconds_total" not in off


async def test_dp_attention_labels_each_rank() -> None:
    async with sim(version="0.5.10", server_args={"tp_size": 4, "enable_dp_attention": True, "dp_size": 4}) as srv, httpx.AsyncClient() as client:
        await send(client, srv.url, 8, max_new=4)
        text = (await client.get(srv.url + "/metrics")).text
    ranks = {head.split('dp_rank="')[1].split('"')[0] for head, _ in samples(text, "sglang:num_running_reqs")}
    assert ranks == {"0", "1", "2", "3"}
    assert 'dp_rank="' not in "".join(h for h, _ in samples(text, "sglang:generation_tokens_total"))  # tokenizer-side series


async def _metrics_window_under_load(log_interval: int) -> Any:
    from gpu_runbook.probe import Context
    from gpu_runbook.probes.sglang.server import SglangMetrics
    from gpu_runbook.target import Target

    async with sim(version="0.5.10", server_args={"decode_log_interval": log_interval}, step_base_ms=20.0) as srv, httpx.AsyncClient() as client:
        load = asyncio.create_task(send(client, srv.url, 4, max_new=400))  # ~8 s of decode steps
        await until(lambda: srv.state.decode_steps >= 5, "decoding")
        ctx = Context(target=Target(sglang_url=srv.url), http=client, nvml=None)  # type: ignore[arg-type]
        ev = await SglangMetrics().run(ctx, SglangMetrics.Params(duration_s=2.0, interval_s=0.25))
        load.cancel()
        return ev


async def test_gauge_values_carry_when_they_were_written() -> None:
    # Logs every 1,000 decode steps (~20 s at 20 ms): the window only sees the value the prefill log wrote before it.
    ev = await _metrics_window_under_load(1000)
    age = ev.values["gauge_age"]
    assert age["running"]["before_window"] and age["running"]["written_s"] is None
    assert not ev.values["gauges_written_in_window"]
    assert not ev.values["gauges_current"]  # tokens were generated: the values from before the window may be stale
    assert "gauges written before the window" in ev.summary
    assert any("last written before the window" in b.label for b in ev.blocks)
    # Logs every 5 decode steps (~0.1 s): gen_throughput is rewritten inside the window, and says when.
    ev = await _metrics_window_under_load(5)
    age = ev.values["gauge_age"]["gen_throughput"]
    assert not age["before_window"] and 0 < age["written_s"] <= ev.values["window_s"] and age["age_s"] >= 0


def test_a_pinned_gauge_is_as_fresh_as_the_gauges_written_with_it() -> None:
    """The scheduler writes running, queued and KV usage in one call: a batch pinned at its cap shows the same
    running value while the queue moves, and that value was written with the queue's, inside the window."""
    from gpu_runbook.probes.server.window import Snapshot, window_concepts

    def snap(t: float, queued: float) -> Snapshot:
        return Snapshot(t=t, gauges={"running": 64.0, "queued": queued, "kv_usage": 0.41})

    moving = window_concepts([snap(0.0, 90), snap(1.0, 90), snap(2.0, 75), snap(3.0, 75)], {})
    assert moving["gauge_age"]["running"] == {"written_s": 2.0, "age_s": 1.0, "before_window": False}
    assert moving["gauge_age"]["kv_usage"]["written_s"] == 2.0 and moving["gauges_written_in_window"]
    # nothing of the group moved: all of it is from before the window, and says so
    still = window_concepts([snap(0.0, 90), snap(1.0, 90), snap(2.0, 90)], {})
    assert still["gauge_age"]["running"]["before_window"] and not still["gauges_written_in_window"]


async def test_a_small_prefill_pass_still_reads_the_weights() -> None:
    """An EXTEND pass is never shorter than the decode step's fixed part (the weights read once): a 32-token
    prompt at 1 ms per 1k tokens would take 0.03 ms, the pass lasts the 40 ms a forward pass costs at least."""
    async with sim(version="0.5.10", step_base_ms=40.0, prefill_ms_per_1k_tokens=1.0) as srv, httpx.AsyncClient() as client:
        passes: list = []
        srv.state.pass_listeners.append(passes.append)
        [resp] = await send(client, srv.url, 1, input_len=32, max_new=2)
        assert resp.status_code == 200
        extend = [p for p in passes if p.mode == "EXTEND"]
        assert extend and all(p.dur_s == pytest.approx(0.040) for p in extend), passes
