"""The Breakdown block as the TUI and the report draw it: one stacked bar per rank, shares as numbers."""

from __future__ import annotations

from rich.console import Console

from gpu_runbook.evidence import Breakdown, Evidence
from gpu_runbook.tui.blocks import render_block

BLOCK = Breakdown(title="Decode step", segments=["moe_gemm", "communication", "idle"],
                  rows=[("TP-0", [0.5, 0.25, 0.25]), ("TP-1", [0.25, 0.5, 0.25])])  # fmt: skip


def test_tui_draws_a_stacked_bar_per_rank_with_a_legend():
    console = Console(width=80, record=True, color_system=None)
    console.print(render_block(BLOCK))
    lines = console.export_text().splitlines()
    rows = [ln for ln in lines if ln.startswith("TP-")]
    assert len(rows) == 2 and all(ln.count("█") == 40 for ln in rows)  # 0.25 + 0.5 + 0.25 of 40 cells
    assert "moe_gemm" in lines[-1] and "idle" in lines[-1]


def test_the_block_round_trips_through_evidence_json():
    ev = Evidence(blocks=[BLOCK])
    back = Evidence.model_validate_json(ev.model_dump_json())
    assert isinstance(back.blocks[0], Breakdown) and back.blocks[0].rows[1][1] == [0.25, 0.5, 0.25]


def test_the_report_shows_the_breakdown_as_a_table_of_shares():
    from pathlib import Path

    from gpu_runbook import report
    from gpu_runbook.results import Results

    results = Results.read_json(Path(__file__).parent / "data" / "results-fixed.json")
    results.hypotheses[0].evidence[0].blocks.append(BLOCK)
    text = report.render(results)
    assert "*Decode step* (share of the step, %)" in text
    assert "| TP-1 | 25.0 | 50.0 | 25.0 |" in text
