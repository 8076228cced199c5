"""`gpu.reference` against the fake NVML: the memory-bound draw per GPU model, measured or labelled an estimate.

The numbers are the table's (shared/reference/nvml.md §5): the Server Edition draws 367 W copying
memory at a 600 W limit, the Workstation Edition 400 W; any other GPU gets 0.6 x its board maximum,
said to be an estimate.
"""

from __future__ import annotations

import pytest

from gpu_runbook import calibration
from gpu_runbook.evidence import ProbeStatus
from gpu_runbook.loader import LoadError
from gpu_runbook.nvml import Nvml
from gpu_runbook.probe import Context
from gpu_runbook.sim import fake_nvml as F
from gpu_runbook.target import Target
from gpu_runbook.probes.gpu.common import GpuSelection
from gpu_runbook.probes.gpu.reference import GpuReference
from gpu_runbook.probes.gpu_values import reference_for
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
    # one measured figure is a single point, called that: it is applied at every batch
    assert v["reference_kind"] == "single figure" and v["draw_curve"] == [[0.0, 367.0]]
    assert v["reference_source"].startswith("a single point, applied at every batch")


async def test_the_workstation_edition_has_its_own_measurement():
    v = await reference_on("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 600.0)
    assert (v["memory_bound_draw_w"], v["peak_dram_gbps"], v["reference_measured"]) == (400.0, 1792, True)
    assert "local-inference-lab/rtx6kpro" in v["reference_source"]


@pytest.mark.parametrize("name, board_max_w, draw", [
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 300.0, 180.0),  # no measurement of the 300 W card
    ("NVIDIA B200", 1000.0, 600.0),
    ("Tesla T4", 70.0, 42.0),  # not in the table at all
])  # fmt: skip
async def test_a_gpu_without_a_measurement_gets_a_labelled_estimate(name, board_max_w, draw):
    v = await reference_on(name, board_max_w)
    assert v["memory_bound_draw_w"] == draw and v["memory_bound_share"] == 0.6
    assert v["peak_dram_gbps"] is None and v["reference_measured"] is False and v["reference_kind"] == "estimate"
    assert v["reference_source"].startswith("estimate: 0.6 x board maximum")
    assert v["draw_curve"] == [[0.0, draw]]  # one point: the same yardstick at every batch


def test_no_board_maximum_means_no_estimate():
    ref = reference_for("Tesla T4", None)
    assert ref["memory_bound_draw_w"] is None and ref["reference_measured"] is False
    assert reference_for(None, 600.0)["memory_bound_draw_w"] == 360.0


def test_one_table_holds_every_figure_with_its_source():
    table = gpu_table()
    measured = {g.id: g.memory_bound_draw_w.value for g in table.gpus if g.memory_bound_draw_w is not None}
    assert measured == {"rtx-pro-6000-blackwell-server": 367.0, "rtx-pro-6000-blackwell-workstation": 400.0, "h200": 488.0}
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


H200_CURVE = [[0.0, 488.0], [1.0, 517.0], [8.0, 546.0], [32.0, 650.0], [64.0, 695.0], [128.0, 694.0], [256.0, 693.0], [512.0, 692.0]]


async def test_the_h200_row_holds_the_measured_curve_with_its_source():
    """nvml.md §5.x: a copy draws 488 W, decode-shaped bf16 GEMMs 517 W at batch 1 up to the 700 W limit from 64."""
    v = await reference_on("NVIDIA H200", 700.0)
    assert v["reference_kind"] == "measured curve" and v["reference_measured"] is True
    assert v["draw_curve"] == H200_CURVE and v["curve_limit_w"] == 700.0
    assert v["memory_bound_draw_w"] == 488.0 and v["peak_dram_gbps"] == 4800
    assert "nvml.md §5.x" in v["reference_source"] and "580.159.04" in v["reference_source"]
    row = gpu_model("NVIDIA H200")
    assert all(p.load for p in row.power_curve.points) and row.power_curve.source.strip()


def _calibration(name: str = "NVIDIA H200", limit: float = 700.0, draws: tuple[float, ...] = (470.0, 505.0, 690.0)) -> calibration.Calibration:
    loads = [calibration.LoadPoint(kind="copy", flops_per_byte=0.0, draw_w=draws[0]),
             calibration.LoadPoint(kind="decode-gemm", dtype="bf16", batch=1, flops_per_byte=1.0, draw_w=draws[1]),
             calibration.LoadPoint(kind="decode-gemm", dtype="bf16", batch=64, flops_per_byte=64.0, draw_w=draws[2])]
    return calibration.Calibration(gpu_name=name, driver_version="580.159.04", power_limit_w=limit, host="h200-box",
                                   measured_at="2026-12-04T18:00:00Z", loads=loads)  # fmt: skip


@pytest.mark.parametrize("name, cal, kind, first", [
    ("NVIDIA H200", True, "calibration", 470.0),  # this GPU's own calibration wins over the table's curve
    ("NVIDIA H200", False, "measured curve", 488.0),  # the table's curve over its single figure
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", False, "single figure", 367.0),  # a single figure over the fallback
    ("Tesla T4", False, "estimate", 42.0),
])  # fmt: skip
def test_the_yardstick_prefers_a_calibration_then_the_curve_then_a_figure_then_the_estimate(name, cal, kind, first):
    ref = reference_for(name, 70.0 if name == "Tesla T4" else 700.0, _calibration(name) if cal else None)
    assert ref["reference_kind"] == kind and ref["draw_curve"][0][1] == first
    if cal:
        assert ref["draw_curve"] == [[0.0, 470.0], [1.0, 505.0], [64.0, 690.0]]
        assert ref["reference_source"].startswith("runbook calibrate: NVIDIA H200") and "h200-box" in ref["reference_source"]


async def _reference_with_calibration_at(where: str | None, limit_w: float = 700.0) -> dict:
    host = F.h100_sxm_nvlink_box(1)
    for gpu in host.gpus:
        gpu.name, gpu.power_limit_enforced_w = "NVIDIA H200", limit_w
    ctx = Context(target=Target(calibration=where), http=None, nvml=Nvml(F.make_module(host)))  # type: ignore[arg-type]
    ev = await GpuReference().run(ctx, GpuSelection())
    assert ev.status == ProbeStatus.ok, ev.reason
    return ev.values


async def test_the_probe_reads_this_hosts_calibration_for_its_model_and_limit(tmp_path):
    calibration.save(_calibration(), tmp_path)
    calibration.save(_calibration("NVIDIA H100 80GB HBM3", draws=(400.0, 420.0, 650.0)), tmp_path)
    v = await _reference_with_calibration_at(str(tmp_path))
    assert v["reference_kind"] == "calibration" and v["draw_curve"][0] == [0.0, 470.0] and v["calibration_note"] is None
    # measured at another power limit: not this GPU's curve now; the table's, and the note says why
    v = await _reference_with_calibration_at(str(tmp_path), limit_w=450.0)
    assert v["reference_kind"] == "measured curve" and "450 W limit" in v["calibration_note"]
    # no directory asked for (a simulated run without --calibration): the table, and nothing said
    v = await _reference_with_calibration_at(None)
    assert v["reference_kind"] == "measured curve" and v["calibration_note"] is None


async def test_an_unreadable_calibration_is_named_and_the_table_used(tmp_path):
    (tmp_path / "broken.json").write_text('{"format": 1, "gpu_name": "NVIDIA H200", "measured_at": "x", "loads": []}')
    v = await _reference_with_calibration_at(str(tmp_path))
    assert v["reference_kind"] == "measured curve"
    assert "broken.json" in v["calibration_note"] and "loads" in v["calibration_note"]


def test_a_calibrations_curve_is_its_gemms_by_intensity_from_its_lowest_draw():
    """The real H200's randn copy drew 556 W, above its batch-1 bf16 GEMM (534 W): the floor is the lowest draw;
    bf16 at batch 64 and FP8 at batch 32 both do 64 FLOPs a byte and are averaged."""
    L = calibration.LoadPoint
    cal = calibration.Calibration(gpu_name="NVIDIA H200", power_limit_w=700.0, measured_at="2026-12-04T18:28:08+00:00", loads=[
        L(kind="copy", flops_per_byte=0.0, draw_w=556.0), L(kind="decode-gemm", dtype="bf16", batch=1, flops_per_byte=1.0, draw_w=534.0),
        L(kind="decode-gemm", dtype="bf16", batch=64, flops_per_byte=64.0, draw_w=695.5),
        L(kind="decode-gemm", dtype="fp8", batch=32, flops_per_byte=64.0, draw_w=640.6),
        L(kind="compute-gemm", dtype="bf16", flops_per_byte=8192.0, draw_w=691.2)])  # fmt: skip
    assert cal.curve() == [(0.0, 534.0), (1.0, 534.0), (64.0, 668.0), (8192.0, 691.2)]
    ref = reference_for("NVIDIA H200", 700.0, cal)
    assert ref["memory_bound_draw_w"] == 534.0 and ref["reference_kind"] == "calibration"


# amd.md §3 (AMD CDNA 3 white paper; CDNA 4 through a transcription): board power, HBM, peaks, clocks, XGMI
INSTINCT = {
    "mi300x": (750, 5300, 2614.9, 1307.4, 2100, 896),
    "mi325x": (1000, 6000, 2614.9, 1307.4, 2100, 896),
    "mi355x": (1400, 8000, 5033.2, 2516.6, 2400, 1075.2),
}


@pytest.mark.parametrize("reported, row_id", [
    ("AMD Instinct MI300X", "mi300x"),  # amdsmi market_name
    ("AMD Instinct MI300X VF", "mi300x"),  # the same under SR-IOV
    ("MI300X", "mi300x"),  # the AMD exporter's card_model, as its own tests write it
    ("0x74a1", "mi300x"),  # a PCI device id, where a tool reports that
    ("AMD Instinct MI325X", "mi325x"),
    ("AMD Instinct MI355X", "mi355x"),
    ("0x75a3", "mi355x"),
    ("AMD Instinct MI308X", None),  # another part (0x74a2): no figures of its own, none borrowed
    ("AMD Instinct MI350X", None),  # the 1000 W air-cooled part: not the MI355X's 1400 W
])  # fmt: skip
def test_instinct_rows_are_found_by_the_names_amdsmi_and_the_exporter_report(reported, row_id):
    row = gpu_model(reported)
    assert (row.id if row else None) == row_id


@pytest.mark.parametrize("row_id", sorted(INSTINCT))
def test_instinct_rows_carry_their_figures_with_sources(row_id):
    row = next(g for g in gpu_table().gpus if g.id == row_id)
    figures = (row.max_w, row.dram_gbps, row.fp8_dense_tflops, row.bf16_dense_tflops, row.max_sm_clock_mhz, row.peer_link_gbps)
    assert tuple(f.value for f in figures) == INSTINCT[row_id]
    assert all("amd.md §3" in f.source for f in figures)
    assert (row.pcie.gen, row.pcie.width) == (5, 16)
    # AMD publishes no draw under memory-bound work: no figure, so the yardstick is the labelled estimate
    assert row.memory_bound_draw_w is None and row.power_curve is None


def test_an_instinct_gpu_gets_the_labelled_estimate_of_its_board_maximum():
    ref = reference_for("AMD Instinct MI300X", 750.0)
    assert ref["memory_bound_draw_w"] == 450.0 and ref["reference_kind"] == "estimate" and ref["reference_measured"] is False
    assert ref["reference_source"].startswith("estimate: 0.6 x board maximum")
