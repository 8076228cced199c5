"""`gpu.reference` against the fake NVML: the memory-bound draw per GPU model, measured or labelled an estimate.

The numbers are the table's (shared/reference/nvml.md §5): the Server Edition draws 367 W copying
memory at a 600 W limit, the Workstation Edition 400 W; any other GPU gets 0.6 x its board maximum,
said to be an estimate.
"""

from __future__ import annotations

import pytest

from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.loader import LoadError
from gpu_runbook.nvml import Nvml
from gpu_runbook.probe import Context
from gpu_runbook.sim import fake_nvml as F
from gpu_runbook.target import Target
from gpu_runbook.probes.gpu_common import GpuSelection
from gpu_runbook.probes.gpu_reference import GpuReference, reference_for
from gpu_runbook.probes.gpu_table import GPU_TABLE, gpu_model, gpu_table


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
    assert v["peak_dram_gbps"] == 1597 and v["reference_measured"] is True
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


def test_one_table_holds_every_figure_with_its_source():
    table = gpu_table()
    measured = {g.id: g.memory_bound_draw_w.value for g in table.gpus if g.memory_bound_draw_w is not None}
    assert measured == {"rtx-pro-6000-blackwell-server": 367.0, "rtx-pro-6000-blackwell-workstation": 400.0}
    for g in table.gpus:
        if g.memory_bound_draw_w is not None:
            assert g.memory_bound_draw_w.source.strip()
    assert table.memory_bound_fallback.share == 0.6 and table.memory_bound_fallback.source.strip()
    # gpu.reference's peak DRAM bandwidth is the roofline's figure, not a second copy of it
    assert reference_for("NVIDIA RTX PRO 6000 Blackwell Server Edition", 600.0)["peak_dram_gbps"] == gpu_model("NVIDIA RTX PRO 6000 Blackwell Server Edition").dram_gbps.value


def test_a_bad_table_names_file_line_and_field(tmp_path):
    bad = tmp_path / "gpus.yaml"
    text = GPU_TABLE.read_text(encoding="utf-8").replace("      value: 367\n", "      value: lots\n", 1)
    bad.write_text(text, encoding="utf-8")
    line = text.splitlines().index("      value: lots") + 1
    with pytest.raises(LoadError) as err:
        gpu_table(str(bad))
    message = str(err.value)
    assert f"{bad}:{line}:" in message and "memory_bound_draw_w" in message
