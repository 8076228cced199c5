"""SGLang probes against real HTTP servers on 127.0.0.1: the simulator and a fixture server."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.probe import Context
from gpu_runbook.target import Target
from gpu_runbook.sim.sglang_server import SimFaults, SimServer, SimServerConfig
from gpu_runbook.probes.server.window import histogram_quantile
from gpu_runbook.probes.sglang.server import (
    SERVER_KEYS,
    SglangHealth,
    SglangMetrics,
    SglangServer,
    parse_metrics,
    server_values,
)

SHARED = Path(__file__).resolve().parents[2] / "shared"
FIXTURES = SHARED / "fixtures" / "sglang"
FAST = dict(step_base_ms=2.0, step_per_req_ms=0.01, prefill_ms_per_1k_tokens=0.0)


def needs_fixtures() -> None:
    if not FIXTURES.is_dir():
        pytest.skip(f"shared fixtures not found at {FIXTURES} (they are not shipped with the package)")


def sim(**kw: Any) -> SimServer:
    return SimServer(SimServerConfig(**{**FAST, **kw}))


async def ctx_for(url: str, api_key: str | None = None) -> Context:
    return Context(target=Target(sglang_url=url, api_key=api_key), http=httpx.AsyncClient(), nvml=None)  # type: ignore[arg-type]


# ---- sglang.server ---------------------------------------------------------------------------------

async def test_server_values_same_for_sim_0_5_5_and_0_5_23() -> None:
    args = {"tp_size": 8, "quantization": "modelopt_fp4", "kv_cache_dtype": "fp8_e4m3", "enable_flashinfer_allreduce_fusion": True,
            "cuda_graph_max_bs": 512, "moe_runner_backend": "flashinfer_cutlass"}  # fmt: skip
    out = {}
    for version in ("0.5.5.post3", "0.5.23"):
        async with sim(version=version, server_args=args, max_running_requests=64, max_total_num_tokens=495488) as srv:
            ev = await SglangServer().run(await ctx_for(srv.url), SglangServer.Params())
        assert ev.ok, ev.reason
        out[version] = ev.values
    old, new = out["0.5.5.post3"], out["0.5.23"]
    assert old["info_endpoint"] == "/get_server_info" and new["info_endpoint"] == "/server_info"
    for k in SERVER_KEYS:
        if k != "version":
            assert old[k] == new[k], k
    assert old["tp_size"] == 8 and old["max_running_requests"] == 64 and old["max_total_num_tokens"] == 495488
    assert old["enable_flashinfer_allreduce_fusion"] is True and old["cuda_graph_max_bs"] == 512
    # 0.5.23 keeps the raw renamed fields and reports the scheduler's effective cap.
    assert new["flashinfer_allreduce_fusion_backend"] == "auto" and new["cuda_graph_max_bs_decode"] == 512
    assert new["effective_max_running_requests"] == 64 and "effective_max_running_requests" not in old
    assert new["model_type"] == "qwen3" and "model_type" not in old  # /get_model_info (0.5.5) has no model_type
    assert old["served_models"] == ["Qwen/Qwen3-32B"] and old["max_model_len"] == 40960


def _fixture_app(routes: dict[str, Any]) -> web.Application:
    app = web.Application()
    for path, body in routes.items():
        async def handler(request: web.Request, body: Any = body) -> web.Response:
            return web.json_response(body)
        app.router.add_get(path, handler)
    return app


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def build_0_5_23_server_info(info_055: dict[str, Any]) -> dict[str, Any]:
    """The same server as 0.5.23 would report it (reference §1.4, §2.1, §7 drift)."""
    body = {k: v for k, v in info_055.items() if k not in ("internal_states", "version")}
    for old, new in (("cuda_graph_max_bs", "cuda_graph_max_bs_decode"), ("cuda_graph_bs", "cuda_graph_bs_decode"),
                     ("nsa_prefill_backend", "dsa_prefill_backend"), ("nsa_decode_backend", "dsa_decode_backend")):  # fmt: skip
        body[new] = body.pop(old)
    fused = body.pop("enable_flashinfer_allreduce_fusion")
    body.update(flashinfer_allreduce_fusion_backend="trtllm" if fused else None, cuda_graph_max_bs_prefill=None,
                attn_dp_size=1, launch_command="python -m sglang.launch_server --model-path Qwen/Qwen3-32B --tp 2",
                kv_events=None, startup_time={"load_weight": 40.0})  # fmt: skip
    state = copy.deepcopy(info_055["internal_states"][0])
    state.update(effective_max_running_requests_per_dp=4096, world_size=2)
    body.update(internal_states=[state], version="0.5.23", frontend="python")
    return body


async def test_fixture_shapes_report_identical_values() -> None:
    """Acceptance 1: the real 0.5.5.post3 body and its 0.5.23 counterpart give the same values."""
    needs_fixtures()
    info_055 = json.loads((FIXTURES / "server_info_0.5.5.post3.json").read_text())
    models = {"object": "list", "data": [{"id": "Qwen/Qwen3-32B", "object": "model", "created": 1764680000, "owned_by": "sglang",
                                          "root": "Qwen/Qwen3-32B", "parent": None, "max_model_len": 40960}]}  # fmt: skip
    mi_055 = {"model_path": "Qwen/Qwen3-32B", "tokenizer_path": "Qwen/Qwen3-32B", "is_generation": True, "preferred_sampling_params": None,
              "weight_version": "default", "has_image_understanding": False, "has_audio_understanding": False}  # fmt: skip
    mi_0523 = {**mi_055, "served_model_name": "Qwen/Qwen3-32B", "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    servers = {
        "0.5.5.post3": {"/get_server_info": info_055, "/get_model_info": mi_055, "/v1/models": models},
        "0.5.23": {"/server_info": build_0_5_23_server_info(info_055), "/get_server_info": build_0_5_23_server_info(info_055),
                   "/model_info": mi_0523, "/get_model_info": mi_0523, "/v1/models": models},  # fmt: skip
    }
    values = {}
    for version, routes in servers.items():
        runner, url = await _serve(_fixture_app(routes))
        try:
            ev = await SglangServer().run(await ctx_for(url), SglangServer.Params())
        finally:
            await runner.cleanup()
        assert ev.ok, ev.reason
        values[version] = ev.values
    old, new = values["0.5.5.post3"], values["0.5.23"]
    assert old["version"] == "0.5.5.post3" and new["version"] == "0.5.23"
    for k in SERVER_KEYS:
        assert k in old, k  # every contract field exists in the 0.5.5.post3 body
        if k != "version":
            assert old[k] == new[k], (k, old[k], new[k])
    assert old["tp_size"] == 2 and old["max_total_num_tokens"] == 389120 and old["cuda_graph_max_bs"] == 256
    assert old["max_running_requests"] is None and new["effective_max_running_requests"] == 4096
    assert old["enable_flashinfer_allreduce_fusion"] is False and new["flashinfer_allreduce_fusion_backend"] is None


def test_sim_server_info_carries_the_fixture_keys_the_probe_reads() -> None:
    needs_fixtures()
    fixture = json.loads((FIXTURES / "server_info_0.5.5.post3.json").read_text())
    with sim(version="0.5.5.post3") as srv:
        body = httpx.get(srv.url + "/get_server_info").json()
        assert httpx.get(srv.url + "/server_info").status_code == 404  # 0.5.5 has only the get_ name
    wanted = {k for k in SERVER_KEYS if k in fixture}
    assert wanted <= set(body), wanted - set(body)
    assert server_values(body).keys() >= wanted
    assert set(body["internal_states"][0]) >= {"last_gen_throughput", "memory_usage"}


# ---- failures -------------------------------------------------------------------------------------

async def test_server_down_is_unavailable(refused_port: int) -> None:
    ev = await SglangServer().run(await ctx_for(f"http://127.0.0.1:{refused_port}"), SglangServer.Params())
    assert ev.status is ProbeStatus.unavailable and "cannot connect" in (ev.reason or "")
    ev = await SglangHealth().run(await ctx_for(f"http://127.0.0.1:{refused_port}"), SglangHealth.Params())
    assert ev.status is ProbeStatus.unavailable


async def test_api_key_required() -> None:
    async with sim(api_key="sekrit") as srv:
        ev = await SglangServer().run(await ctx_for(srv.url), SglangServer.Params())
        assert ev.status is ProbeStatus.unavailable and "401" in (ev.reason or "") and "API key" in (ev.reason or "")
        ev = await SglangServer().run(await ctx_for(srv.url, api_key="sekrit"), SglangServer.Params())
        assert ev.ok
        health = await SglangHealth().run(await ctx_for(srv.url), SglangHealth.Params())  # /health needs no key
        assert health.ok and health.values["healthy"] is True


async def test_slow_server_times_out() -> None:
    async with sim(faults=SimFaults(delay_s={"/get_server_info": 2.0, "/health": 2.0})) as srv:
        ev = await SglangServer().run(await ctx_for(srv.url), SglangServer.Params(request_timeout_s=0.3))
        assert ev.status is ProbeStatus.unavailable and "did not answer" in (ev.reason or "")
        h = await SglangHealth().run(await ctx_for(srv.url), SglangHealth.Params(request_timeout_s=0.3))
        assert h.status is ProbeStatus.failed and h.values["timed_out"] is True


async def test_malformed_json_fails() -> None:
    async with sim(faults=SimFaults(malformed_json=["/get_server_info"])) as srv:
        ev = await SglangServer().run(await ctx_for(srv.url), SglangServer.Params())
    assert ev.status is ProbeStatus.failed and "malformed JSON" in (ev.reason or "")


async def test_unhealthy_503() -> None:
    async with sim(faults=SimFaults(status_code={"/health": 503})) as srv:
        ev = await SglangHealth().run(await ctx_for(srv.url), SglangHealth.Params())
    assert ev.ok and ev.values["healthy"] is False and ev.values["status_code"] == 503


# ---- sglang.metrics -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["metrics_0.5.5.post3.txt", "metrics_0.5.23.txt"])
def test_parse_fixture_metrics(name: str) -> None:
    needs_fixtures()
    snap = parse_metrics((FIXTURES / name).read_text(), 0.0)
    assert snap.gauges["running"] == 48 and snap.gauges["queued"] == 5
    assert snap.gauges["kv_usage"] == pytest.approx(0.41)
    assert snap.counters["generation_tokens"] == 113500
    assert snap.counters["cached_tokens"] == 29696
    ttft = snap.buckets["ttft"]
    assert ttft[float("inf")] == 200
    assert 0.6 < histogram_quantile(0.5, ttft) < 0.8  # 100th of 200 lies in the (0.6, 0.8] bucket


def test_metrics_sum_dp_ranks_and_max_usage() -> None:
    text = "".join(
        f'sglang:num_running_reqs{{dp_rank="{dp}",tp_rank="{tp}"}} {10 + dp}\n'
        f'sglang:token_usage{{dp_rank="{dp}",tp_rank="{tp}"}} {0.5 + dp / 10}\n'
        for dp in range(2) for tp in range(2)
    )  # fmt: skip
    snap = parse_metrics(text, 0.0)
    assert snap.gauges["running"] == 21  # tp ranks of one DP group see the same batch
    assert snap.gauges["kv_usage"] == pytest.approx(0.6)


async def test_metrics_window_under_load() -> None:
    from gpu_runbook.load import LoadConfig, LoadGenerator

    async with sim(version="0.5.23", max_running_requests=8) as srv:
        ctx = await ctx_for(srv.url)
        # requests of 200 decode steps (~0.4 s): the scheduler writes its gauges every 40 decode steps, and between the
        # writes 8 requests wait; with 16-step requests every write could fall just after an admission emptied the
        # queue, and a busy machine's slow client re-sent after it (seen in CI: queue max 0)
        gen = LoadGenerator(ctx.target, LoadConfig(concurrency=16, input_len=16, output_len=200))
        await gen.start()
        ev = await SglangMetrics().run(ctx, SglangMetrics.Params(duration_s=1.0, interval_s=0.25))
        await gen.stop()
    assert ev.ok, ev.reason
    v = ev.values
    assert v["scrapes"] >= 2 and v["num_running_reqs"]["max"] == 8 and v["num_queue_reqs"]["max"] >= 1
    assert v["max_running_requests"] == 8 and v["running_to_cap"] == 1.0
    assert v["generation_tokens_per_s"] > 100 and v["requests_completed"] > 0
    assert v["ttft_s"]["p50"] is not None and v["itl_s"]["p95"] is not None and v["e2e_s"]["p50"] is not None
    assert v["max_total_num_tokens"] == 389120


async def test_metrics_disabled_is_unavailable() -> None:
    async with sim(enable_metrics=False) as srv:
        ev = await SglangMetrics().run(await ctx_for(srv.url), SglangMetrics.Params(duration_s=0.2, interval_s=0.1))
    assert ev.status is ProbeStatus.unavailable and "--enable-metrics" in (ev.reason or "")


async def test_malformed_metrics_fails() -> None:
    async with sim(faults=SimFaults(malformed_metrics=True)) as srv:
        ev = await SglangMetrics().run(await ctx_for(srv.url), SglangMetrics.Params(duration_s=0.2, interval_s=0.1))
    assert ev.status is ProbeStatus.failed and "malformed metrics" in (ev.reason or "")


def test_config_concepts_take_a_non_finite_number_as_unreported():
    """JSON from a server can carry Infinity or NaN (Python's json writes them); int(inf) would raise."""
    from gpu_runbook.probes.sglang.config import config_concepts

    v = config_concepts({"version": "0.5.9", "tp_size": float("inf"), "max_total_num_tokens": float("nan"), "context_length": 4096})
    assert v["tp"] == 1 and v["kv_capacity_tokens"] is None and v["running_cap"] is None


async def test_launch_args_list_only_flags_that_keep_the_servers_value() -> None:
    """A diff compares the `launch_args` values as the server's flags: a concept that took a flag's name with a
    derived value (decode_attention_backend, unset, falls back to attention_backend) is not one of them."""
    info = {"version": "0.5.9", "tp_size": 2, "attention_backend": "fa3", "decode_attention_backend": None, "page_size": 1}
    runner, url = await _serve(_fixture_app({"/server_info": info, "/model_info": {}, "/v1/models": {"data": []}}))
    try:
        ev = await SglangServer().run(await ctx_for(url), SglangServer.Params())
    finally:
        await runner.cleanup()
    assert ev.ok, ev.reason
    assert ev.values["decode_attention_backend"] == "fa3"  # the concept rules read
    assert "decode_attention_backend" not in ev.values["launch_args"]
    assert {"tp_size", "attention_backend", "page_size"} <= set(ev.values["launch_args"])
