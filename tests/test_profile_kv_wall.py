"""sglang.profile at the KV wall: prefill runs as its own passes, the capture's decode step is the decode passes'.

Real load against the simulated host; the release's `profile_by_stage` predicate (0.5.10
`scheduler_profiler_mixin.py:340-362`) decides what the server writes. Polls to deadlines, no sleeps.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import httpx
import pytest

from gpu_runbook.load import LoadConfig, LoadGenerator
from gpu_runbook.probe import Context
from gpu_runbook.probes.sglang.profile import SglangProfile
from gpu_runbook.sim.host import SimulatedHost
from gpu_runbook.sim.profiler import _Capture
from gpu_runbook.sim.scenario import load_scenario
from gpu_runbook.sim.sim_state import PassRecord
from gpu_runbook.target import Target

KV40K = Path(__file__).parent / "data" / "scenarios" / "seed-kv-40k.yaml"


def _pass(mode: str) -> PassRecord:
    return PassRecord(time.time(), 0.5, 8, 1000.0, mode, 8)


@pytest.mark.parametrize("version,decode,extend", [((0, 5, 2), "-2", "-1"), ((0, 5, 10), "-DECODE", "-EXTEND"), ((0, 5, 23), "-DECODE", "-EXTEND")])
def test_by_stage_a_prefill_batch_stops_the_decode_capture_as_extend(version, decode, extend):
    # Prefill first, then strict alternation (the KV wall): the 3rd prefill (> num_steps 2) arrives during the
    # decode capture and stops it as EXTEND; the EXTEND flush came first, under the same name.
    cap = _Capture(True, 2, version)
    for mode in ("EXTEND", "DECODE", "EXTEND", "DECODE", "EXTEND", "DECODE", "DECODE"):
        cap.on_pass(_pass(mode))
    assert [s for s, _ in cap.finished] == [extend, extend] and cap.done
    assert [p.mode for p in cap.finished[1][1]] == ["DECODE", "EXTEND", "DECODE"]  # the decode capture, prefill included
    # Decode first: the decode capture reaches its count before the prefill count passes num_steps.
    cap = _Capture(True, 2, version)
    for mode in ("DECODE", "EXTEND", "DECODE", "EXTEND", "DECODE"):
        cap.on_pass(_pass(mode))
    assert [s for s, _ in cap.finished] == [decode]
    assert [p.mode for p in cap.finished[0][1]] == ["DECODE", "EXTEND", "DECODE", "EXTEND"]


def test_without_by_stage_the_next_passes_of_any_mode_are_captured():
    cap = _Capture(False, 3, (0, 5, 10))
    for mode in ("EXTEND", "DECODE", "EXTEND", "DECODE"):
        cap.on_pass(_pass(mode))
    assert [(s, [p.mode for p in ps]) for s, ps in cap.finished] == [("", ["EXTEND", "DECODE", "EXTEND"])] and cap.done


async def _at_the_kv_wall(host: SimulatedHost, http: httpx.AsyncClient, concurrency: int, input_len: int, output_len: int) -> LoadGenerator:
    target = Target(sglang_url=host.url, api_key=host.api_key, simulated=True, gpu_backend="simulated")
    load = LoadGenerator(target, LoadConfig(concurrency=concurrency, input_len=input_len, output_len=output_len, ignore_eos=True), client=http)
    await load.start()
    st = host.server.state
    deadline = time.monotonic() + 240
    # the wall: requests queue behind the KV estimate while the running batch decodes
    while not (st.queued > 0 and st.decode_steps >= 3) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert st.queued > 0 and st.decode_steps >= 3, "the KV wall did not form"
    return load


async def test_seed_box_at_the_kv_wall_profiled_step_is_the_clients_itl(tmp_path):
    """Acceptance: 2,048 x (256 + 128) on the seeds' box; the profiled decode step within 15 % of the client's ITL p50."""
    with SimulatedHost.start("seed-rtx-pro-6000-tp8") as host:
        async with httpx.AsyncClient(timeout=120) as http:
            load = await _at_the_kv_wall(host, http, 2048, 256, 128)
            ctx = Context(target=load.target, http=http, nvml=host.nvml, load=load)
            mark = len(load._itl)  # the client's inter-token gaps from here on (the ramp's long first waits left out)
            ev = await SglangProfile().run(ctx, SglangProfile.Params(num_steps=3, wait_s=60, output_dir=str(tmp_path)))
            itl = list(load._itl[mark:])
            extend_passes = host.server.state.extend_passes
            await load.stop()
    assert ev.ok, ev.reason
    v = ev.values
    assert extend_passes > 0  # prefill ran as its own passes
    p50_ms = statistics.median(itl) * 1000
    assert v["step_ms"] == pytest.approx(p50_ms, rel=0.15), (v["step_ms"], p50_ms, v["capture"])
    assert v["step_source"] == "gaps" and v["steps"] >= 3  # 0.5.10: no spans; decode passes told apart on the GPU timeline
    # the step is the decode model's (100 ms + 0.305 ms x running), not a decode pass with prefill folded in
    assert v["step_ms"] == pytest.approx(100 + 0.305 * v["batch"], rel=0.15)


@pytest.mark.parametrize("version", ["0.5.10", "0.5.13", "0.5.23"])
async def test_each_release_gets_a_decode_capture_at_the_kv_wall_and_says_how(tmp_path, version):
    sc = load_scenario(KV40K)
    sc = sc.model_copy(update={"server": sc.server.model_copy(update={"version": version})})
    with SimulatedHost.start(sc) as host:
        async with httpx.AsyncClient(timeout=120) as http:
            load = await _at_the_kv_wall(host, http, 512, 128, 32)
            ctx = Context(target=load.target, http=http, nvml=host.nvml, load=load)
            auto = await SglangProfile().run(ctx, SglangProfile.Params(num_steps=2, wait_s=60, output_dir=str(tmp_path / "a")))
            staged = await SglangProfile().run(ctx, SglangProfile.Params(num_steps=2, wait_s=20, output_dir=str(tmp_path / "s"), profile_by_stage=True))
            await load.stop()
    assert auto.ok, auto.reason
    spans = version != "0.5.10"  # step spans from 0.5.11
    assert auto.values["step_source"] == ("spans" if spans else "gaps") and auto.values["steps"] >= 1
    assert "no profile_by_stage" in auto.values["capture"]
    # with profile_by_stage the release writes -DECODE, or -EXTEND when a prefill batch stopped the decode capture; either
    # way the probe reads the decode passes and says which happened
    assert staged.ok, staged.reason
    assert staged.values["capture"].startswith("profile_by_stage")
    assert ("-EXTEND" in staged.values["capture"]) or ("-DECODE files" in staged.values["capture"])
