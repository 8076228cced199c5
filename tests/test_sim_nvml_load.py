"""The fake NVML follows the simulated workload: TP all-reduce PCIe bytes, field-value counters, power, util, memory."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpu_runbook.load import LoadConfig, LoadGenerator
from gpu_runbook.probe import Context
from gpu_runbook.target import Target
from gpu_runbook.sim.coupling import LoadCoupling
from gpu_runbook.sim.host import SimulatedHost, build_fake_host
from gpu_runbook.sim.scenario import load_scenario
from gpu_runbook.sim.sim_state import SimState
from gpu_runbook.probes.gpu.sample import GpuSample, SampleParams

GLM5_ALLREDUCE_BYTES_PER_TOKEN = 6144 * 2 * 2 * 78  # hidden x BF16 x 2 per layer x layers


def coupled(name: str, running: int, step_s: float) -> tuple[LoadCoupling, SimState, list]:
    sc = load_scenario(name)
    state = SimState(tp_size=8, allreduce_bytes_per_token=GLM5_ALLREDUCE_BYTES_PER_TOKEN, mem_fraction_static=0.88)
    coupling = LoadCoupling(sc, state, t0=time.monotonic() - 100)
    gpus = build_fake_host(sc).gpus
    coupling.bind(gpus)
    state.running = state.step_tokens = running
    state.step_time_s = step_s
    state.last_step_at = time.monotonic()
    return coupling, state, gpus


def test_pcie_bytes_follow_the_tp_allreduce_volume() -> None:
    # The seeds' KV wall: 1,935 running at ~0.92 s per step -> ~41.6 MB x 156 all-reduces ~ 6.5 GB per step per GPU.
    coupling, state, gpus = coupled("seed-rtx-pro-6000-tp8", 1935, 0.92)
    want = 1935 * GLM5_ALLREDUCE_BYTES_PER_TOKEN * 2 * 7 / 8 / 0.92
    assert coupling.allreduce_bytes_per_s(time.monotonic()) == pytest.approx(want)
    r = gpus[0].reading(time.monotonic())
    assert 5e9 < r.pcie_tx_bytes_per_s < 9e9 and r.pcie_rx_bytes_per_s == r.pcie_tx_bytes_per_s
    assert 3e6 < r.pcie_tx_kbps < 12e6  # the 20 ms snapshot in KB/s around the same rate
    vm, _, vm_gpus = coupled("seed-rtx-pro-6000-tp8-vm", 1935, 0.92)
    assert vm_gpus[0].reading(time.monotonic()).pcie_tx_bytes_per_s > r.pcie_tx_bytes_per_s  # staged through host memory
    nvlink, _, nv_gpus = coupled("healthy-h200-nvlink", 1935, 0.92)
    assert nvlink.allreduce_bytes_per_s(time.monotonic()) == 0.0  # the all-reduce goes over NVLink
    assert nv_gpus[0].reading(time.monotonic()).pcie_tx_bytes_per_s < 0.25 * r.pcie_tx_bytes_per_s
    state.running = 0
    idle = gpus[0].reading(time.monotonic())
    assert idle.pcie_tx_bytes_per_s < 1e8 and idle.pstate == 8 and idle.mem_clock_mhz < 1000


def test_util_shows_launch_gaps_and_memory_the_preallocation() -> None:
    _, state, gpus = coupled("seed-rtx-pro-6000-tp8", 1, 0.1)
    small = gpus[0].reading(time.monotonic())
    state.running = state.step_tokens = 1935
    state.step_time_s = 0.92
    big = gpus[0].reading(time.monotonic())
    assert small.gpu_util_pct < big.gpu_util_pct <= 100 and small.gpu_util_pct <= 95
    assert big.pstate == 0 and big.mem_clock_mhz == 12481
    total = 97887 * (1 << 20)
    assert 0.88 * total < big.memory_used_bytes < 0.92 * total


def test_field_values_have_nvml_struct_semantics() -> None:
    coupling, state, gpus = coupled("seed-rtx-pro-6000-tp8", 1935, 0.92)
    from gpu_runbook.sim.fake_nvml import make_module

    host = build_fake_host(coupling.scenario)
    coupling.bind(host.gpus)
    clock = [1000.0]
    state.last_step_at = clock[0]
    host.clock = lambda: clock[0]
    lib = make_module(host)
    lib.nvmlInit()
    h = lib.nvmlDeviceGetHandleByIndex(0)
    ids = [lib.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, (lib.NVML_FI_DEV_POWER_INSTANT, 0), lib.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 9999]
    first = lib.nvmlDeviceGetFieldValues(h, ids)
    assert [v.nvmlReturn for v in first] == [lib.NVML_SUCCESS] * 3 + [lib.NVML_ERROR_NOT_SUPPORTED]
    assert first[0].valueType == lib.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG and first[1].valueType == lib.NVML_VALUE_TYPE_UNSIGNED_INT
    assert 150_000 < first[1].value.uiVal < 300_000  # instant power in mW
    state.last_step_at = clock[0] = 1002.0
    second = lib.nvmlDeviceGetFieldValues(h, ids)
    rate = (second[0].value.ullVal - first[0].value.ullVal) / 2.0
    assert rate == pytest.approx(coupling.allreduce_bytes_per_s(clock[0]) + coupling.link_kbps * 1000 * 0.002, rel=0.02)
    assert second[2].value.ullVal > first[2].value.ullVal


async def test_gpu_sample_reports_gigabytes_per_second_under_load_on_the_seed_box() -> None:
    with SimulatedHost.start("seed-rtx-pro-6000-tp8") as host:
        gen = LoadGenerator(Target(sglang_url=host.url), LoadConfig(concurrency=256, input_len=128, output_len=128))
        await gen.start()
        try:
            end = time.monotonic() + 60
            while host.state.running < 200 or host.state.last_step_at == 0.0:
                assert time.monotonic() < end, "the load never reached 200 running"
                await asyncio.sleep(0.05)
            ctx = Context(target=Target(sglang_url=host.url), http=None, nvml=host.nvml)  # type: ignore[arg-type]
            ev = await GpuSample().run(ctx, SampleParams(duration_s=1.0, interval_s=0.25))
        finally:
            await gen.stop()
    assert ev.ok, ev.reason
    v = ev.values
    assert v["pcie_counter_window_s"] and v["pcie_counter_window_s"] > 0.5
    # Decode alone moves ~1.7 MB x 1.75 per token; prefill chunks during the ramp move more, never beyond the link.
    assert 1e9 < v["pcie_tx_bytes_per_s"]["mean"] < 57e9 and 1e9 < v["pcie_rx_bytes_per_s"]["mean"] < 57e9
    assert v["pcie_tx_bytes_window"]["min"] > 0.5e9
    assert v["power_instant_w"] is not None and 150 < v["power_instant_w"]["mean"] < 300
    assert all(g["pcie_tx_bytes_per_s"] > 1e9 for g in v["gpus"])
