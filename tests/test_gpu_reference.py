"""`gpu.reference` against the fake NVML: the memory-bound draw per GPU model, measured or labelled an estimate.

The numbers are the table's (shared/reference/nvml.md §5): the Server Edition draws 367 W copying
memory at a 600 W limit, the Workstation Edition 400 W; any other GPU gets 0.6 x its board maximum,
said to be an estimate.
"""

from __future__ import annotations

import pytest

from engine.evidence import ProbeStatus
from engine.nvml import Nvml
from engine.probe import Context
from engine.sim import fake_nvml as F
from engine.target import Target
from probes.gpu import GpuSelection
from probes.gpu_reference import GpuReference, reference_for


async def reference_on(name: str, board_max_w: float) -> dict:
    host = F.rtx_pro_6000_pcie_box(2)
    for gpu in host.gpus:
        gpu.name, gpu.power_limit_max_w = name, board_max_w
    ctx = Context(target=Target(), http=None, nvml=Nvml(F.make_module(host)))  # type: ignore[arg-type]
    ev = await GpuReference().run(ctx, GpuSelection())
    assert ev.status == ProbeStatus.ok, ev.reason
    return ev.values


async def test_the_seed_box_draws_its_measured_367_w():
    v = await reference_on("NVIDIA RTX PRO 6000 Blackwell Server Edition", 600.0)
    assert v["memory_bound_draw_w"] == 367.0 and v["board_max_w"] == 600.0
    assert v["memory_bound_share"] == pytest.approx(367 / 600, abs=1e-4)
    assert v["peak_dram_gbps"] == 1792 and v["reference_measured"] is True
    assert "4 GB memcpy at a 600 W limit" in v["reference_source"] and "nvml.md §5" in v["reference_source"]


async def test_the_workstation_edition_has_its_own_measurement():
    v = await reference_on("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 600.0)
    assert (v["memory_bound_draw_w"], v["peak_dram_gbps"], v["reference_measured"]) == (400.0, 1792, True)
    assert "local-inference-lab/rtx6kpro" in v["reference_source"]


@pytest.mark.parametrize("name, board_max_w, draw", [
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 300.0, 180.0),  # no measurement of the 300 W card
    ("NVIDIA H200", 700.0, 420.0),
    ("Tesla T4", 70.0, 42.0),  # not in the table at all
])  # fmt: skip
async def test_a_gpu_without_a_measurement_gets_a_labelled_estimate(name, board_max_w, draw):
    v = await reference_on(name, board_max_w)
    assert v["memory_bound_draw_w"] == draw and v["memory_bound_share"] == 0.6
    assert v["peak_dram_gbps"] is None and v["reference_measured"] is False
    assert v["reference_source"].startswith("estimate: 0.6 x board maximum")


def test_no_board_maximum_means_no_estimate():
    ref = reference_for("Tesla T4", None)
    assert ref["memory_bound_draw_w"] is None and ref["reference_measured"] is False
    assert reference_for(None, 600.0)["memory_bound_draw_w"] == 360.0
