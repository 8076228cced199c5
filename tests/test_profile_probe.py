"""sglang.profile against the simulated host: a real /start_profile, real trace files on disk, under real load."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest

from gpu_runbook.evidence import Breakdown, ProbeStatus
from gpu_runbook.load import LoadConfig, LoadGenerator
from gpu_runbook.probe import Context
from gpu_runbook.target import Target
from gpu_runbook.sim.host import SimulatedHost
from gpu_runbook.sim.profiler import container_root
from gpu_runbook.sim.sglang_server import SimServer, SimServerConfig
from gpu_runbook.probes.sglang.profile import SglangProfile, find_traces, profile_body

CONTAINER = Path(__file__).parent / "data" / "scenarios" / "seed-in-container.yaml"


@contextlib.asynccontextmanager
async def loaded(scenario: str | Path, concurrency: int = 64) -> AsyncIterator[tuple[SimulatedHost, Context]]:
    with SimulatedHost.start(scenario) as host:
        target = Target(sglang_url=host.url, api_key=host.api_key, simulated=True, gpu_backend="simulated")
        async with httpx.AsyncClient() as http:
            load = LoadGenerator(target, LoadConfig(concurrency=concurrency, input_len=64, output_len=4096, ignore_eos=True), client=http)
            await load.start()
            try:
                yield host, Context(target=target, http=http, nvml=host.nvml, load=load)
            finally:
                await load.stop()


def params(**kw: Any) -> SglangProfile.Params:
    return SglangProfile.Params(**{"num_steps": 2, "wait_s": 30, **kw})


async def test_profile_of_the_seed_box_under_load(tmp_path):
    async with loaded("seed-rtx-pro-6000-tp8") as (host, ctx):
        ev = await SglangProfile().run(ctx, params(output_dir=str(tmp_path)))
    assert ev.ok, ev.reason
    v = ev.values
    # 0.5.10 has no step spans (0.5.11+): 2 x 2 + 1 passes of any mode, the decode ones told apart on the GPU timeline
    assert v["ranks"] == 8 and v["steps"] + v["extend_passes"] == 5 and v["steps"] >= 2 and v["step_source"] == "gaps"
    assert "no profile_by_stage" in v["capture"] and "GPU timeline" in v["capture"]
    assert v["unclassified_share"] < 0.05
    assert {"nccl", "flashinfer-cutlass-moe"} <= set(v["backends"])
    assert v["communication_share"] > 0.05 and v["moe_gemm_share"] > 0.2  # the split by batch: test_trace_analysis
    assert v["step_ms"] > 100  # the scenario's step: 100 ms + 0.45 ms per running request
    assert v["gpu_model"] == "rtx-pro-6000-blackwell-server" and v["peak_dram_gbps"] == 1597
    assert v["bandwidth_share"] is not None and 0 < v["bandwidth_share"] < 1
    assert v["allreduce_bytes_per_step_predicted"] > 0 and v["pcie_to_allreduce_ratio"] is not None
    assert v["export_pause_s"] is not None and v["export_pause_s"] >= 0
    assert "no quantized (FP8/FP4) all-reduce" in v["finding_allreduce"]
    assert len(find_traces(Path(v["trace_dir_local"]), False)) == 8
    bd = [b for b in ev.blocks if isinstance(b, Breakdown)][0]
    assert [r[0] for r in bd.rows] == [f"TP-{i}" for i in range(8)] and bd.segments[-1] == "idle"
    assert all(sum(shares) == pytest.approx(1.0, abs=0.03) for _, shares in bd.rows)


async def test_a_server_in_a_container_makes_the_probe_unavailable_with_the_path_and_the_param(tmp_path):
    async with loaded(CONTAINER) as (host, ctx):
        ev = await SglangProfile().run(ctx, params(output_dir=str(tmp_path), wait_s=3))
        assert ev.status is ProbeStatus.unavailable
        assert ev.values["trace_dir_server"] in ev.reason and "local_dir" in ev.reason
        # Mount the container's directory (here: its root on this host) and the same capture reads.
        root = container_root(host.state)
        assert root is not None
        written = root / ev.values["trace_dir_server"].lstrip("/")
        deadline = time.monotonic() + 60
        while len(find_traces(written, False)) < 8 and time.monotonic() < deadline:  # the first capture finishes
            await asyncio.sleep(0.1)
        assert len(find_traces(written, False)) == 8
        ev = await SglangProfile().run(ctx, params(output_dir=str(tmp_path), local_dir=str(root / str(tmp_path).lstrip("/"))))
    assert ev.ok, ev.reason
    assert ev.values["ranks"] == 8


async def test_h200_has_step_spans_and_nvlink_custom_allreduce(tmp_path):
    async with loaded("healthy-h200-nvlink") as (host, ctx):
        ev = await SglangProfile().run(ctx, params(output_dir=str(tmp_path)))
    assert ev.ok, ev.reason
    v = ev.values
    # 2 x 2 + 1 passes asked; the decode ones told apart by their step[DECODE] spans (0.5.11+)
    assert v["step_source"] == "spans" and v["steps"] + v["extend_passes"] == 5 and v["steps"] >= 2 and "step[DECODE] spans" in v["capture"]
    assert "custom-allreduce-v2" in v["backends"] and "nccl" not in v["backends"]  # 0.5.23 on full NVLink: V2 (sglang-versions.md §4.2)
    assert v["moe_gemm_share"] > v["communication_share"]


async def test_a_key_the_server_refuses_is_unavailable_with_the_reason(tmp_path):
    async with SimServer(SimServerConfig(api_key="admin-secret")) as srv, httpx.AsyncClient() as http:
        ctx = Context(target=Target(sglang_url=srv.url, api_key="wrong"), http=http, nvml=None)  # type: ignore[arg-type]
        ev = await SglangProfile().run(ctx, params(output_dir=str(tmp_path)))
    assert ev.status is ProbeStatus.unavailable and "401" in ev.reason


async def test_a_bad_user_rules_file_fails_the_probe_with_its_position(tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text("rules:\n  - bucket: nope\n    exact: [x]\n")
    ev = await SglangProfile().run(None, params(rules=[str(bad)]))  # type: ignore[arg-type]
    assert ev.status is ProbeStatus.failed and f"{bad}:2:" in ev.reason


def test_the_request_body_follows_the_version():
    old = profile_body("0.4.6", "/d", 5, activities=["GPU"], record_shapes=False, by_stage=True, prefix="rb")
    assert old == {"output_dir": "/d", "num_steps": 5, "activities": ["GPU"]}
    mid = profile_body("0.5.5.post3", "/d", 5, activities=["GPU"], record_shapes=False, by_stage=True, prefix="rb")
    assert mid["with_stack"] is False and mid["record_shapes"] is False and mid["profile_by_stage"] is True
    assert "profile_prefix" not in mid
    new = profile_body("0.5.23", "/d", 5, activities=["GPU"], record_shapes=True, by_stage=True, prefix="rb")
    assert new["profile_prefix"] == "rb" and new["record_shapes"] is True


async def test_without_load_no_step_runs_and_the_reason_says_so(tmp_path):
    with SimulatedHost.start("healthy-h200-nvlink") as host:
        async with httpx.AsyncClient() as http:
            ctx = Context(target=Target(sglang_url=host.url), http=http, nvml=host.nvml)
            ev = await SglangProfile().run(ctx, params(output_dir=str(tmp_path), wait_s=1))
            assert ev.status is ProbeStatus.unavailable
            assert "no decode step ran" in ev.reason and "/stop_profile" in ev.reason
            # disarmed: a second capture is accepted, not "already in progress"
            r = await http.post(host.url + "/start_profile", json={"output_dir": str(tmp_path), "num_steps": 1})
            assert r.status_code == 200


def test_find_traces_takes_decode_rank_files_only(tmp_path):
    for name in ("server_args.json", "merged-17.trace.json.gz", "rb-17-TP-0-EXTEND.trace.json.gz", "rb-17-TP-0-DECODE.trace.json.gz",
                 "rb-17-TP-1-DECODE.trace.json.gz", "17-TP-0-DP-1-DECODE.trace.json.gz", "17-TP-3-memory-DECODE.pickle",
                 "old-TP-2.trace.json.gz"):  # rank 2 without a stage, not 0.4.9-0.5.2's stage '-2'
        (tmp_path / name).write_bytes(b"x")
    for name in ():
        (tmp_path / name).write_bytes(b"x")
    found = find_traces(tmp_path, True)
    assert sorted(found) == ["TP-0", "TP-0-DP-1", "TP-1"]
    assert found["TP-0"].name == "rb-17-TP-0-DECODE.trace.json.gz"
    assert "TP-0-EXTEND" in find_traces(tmp_path, False)


async def test_sglang_with_mixed_chunks_writes_mixed_passes_and_the_analysis_names_them(tmp_path):
    """--enable-mixed-chunk (0.5.11+ spans): a new prefill batch runs with the running decodes as one MIXED pass,
    written `step[MIXED bs=N]` as model_runner._build_step_span_name does, and read back as a mixed pass."""
    from gpu_runbook.runbook_test import scenario_with  # noqa: PLC0415
    from gpu_runbook.trace.analysis import analyze  # noqa: PLC0415
    from gpu_runbook.trace.rules import classifier  # noqa: PLC0415

    from gpu_runbook.sim.scenario import load_scenario  # noqa: PLC0415

    args = {**load_scenario("healthy-h200-nvlink").server.server_args, "enable_mixed_chunk": True}
    scenario = scenario_with("healthy-h200-nvlink", {"server.server_args": args})
    with SimulatedHost.start(scenario) as host:
        target = Target(sglang_url=host.url, api_key=host.api_key, simulated=True, gpu_backend="simulated")
        async with httpx.AsyncClient() as http:
            # short outputs: requests finish and new ones arrive while others decode, so prefill meets decodes
            load = LoadGenerator(target, LoadConfig(concurrency=64, input_len=256, output_len=16, ignore_eos=True), client=http)
            await load.start()
            try:
                ctx = Context(target=target, http=http, nvml=host.nvml, load=load)
                ev = await SglangProfile().run(ctx, params(output_dir=str(tmp_path), num_steps=6))
            finally:
                await load.stop()
        assert host.server.state.extend_passes > 0
    files = sorted(p for p in tmp_path.rglob("*.trace.json*"))
    assert files, ev.reason
    text = "".join(p.read_text(errors="replace") if p.suffix == ".json" else __import__("gzip").open(p, "rt").read() for p in files)
    # a prefill batch that meets running decodes goes with them (an EXTEND pass stays where nothing was running)
    assert "step[MIXED bs=" in text
    s = analyze(files, classifier()).summary(decode_only=False)
    assert s["passes"]["mixed"] > 0 and s["pass_source"] == "SGLang step spans"
