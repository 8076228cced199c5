"""`runbook trace --compare BEFORE AFTER`: two captures, bucket by bucket and pass kind by pass kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_runbook.cli import main
from gpu_runbook.trace.compare import _passes, compare
from gpu_runbook.trace.rules import classifier
from tests.test_trace_workload import training_events
from tests.trace_helpers import kernel, span, write_trace


def capture(directory: Path, moe_us: float, *, ranks: int = 2, extend: bool = False, extra: str | None = None) -> Path:
    """A TP capture: four 400 µs decode steps per rank (MoE GEMM, all-reduce, decode attention), optionally a
    prefill pass (an EXTEND step span) and an unknown kernel in each step."""
    directory.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        events: list[dict] = []
        for i in range(4):
            t0 = i * 1000.0
            events += [span("step[DECODE bs=64]", t0, 400.0), kernel("fused_moe_kernel", t0, moe_us),
                       kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t0 + moe_us, 100.0),
                       kernel("BatchDecodeWithPagedKVCacheKernel", t0 + moe_us + 100, 50.0)]  # fmt: skip
            if extra:
                events.append(kernel(extra, t0 + moe_us + 150, 40.0))
        if extend:
            events += [span("step[EXTEND bs=4 toks=512]", 5000.0, 300.0), kernel("BatchPrefillWithRaggedKVCacheKernel", 5000.0, 300.0)]
        write_trace(directory / f"x-TP-{r}.trace.json.gz", events, rank=r)
    return directory


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["trace", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_compare_prints_each_buckets_share_and_each_pass_kind_before_and_after(tmp_path, capsys):
    before = capture(tmp_path / "before", 200.0, extend=True)
    after = capture(tmp_path / "after", 120.0)
    rc, out, _ = _run(capsys, "--compare", str(before), str(after))
    assert rc == 0, out
    assert "comparable: yes" in out
    assert "(2 file(s), 2 rank(s))" in out
    assert "step: 0.400 ms -> 0.400 ms (+0.0%)  [decode step(s)]" in out
    lines = out.splitlines()
    assert any(ln.split() == ["decode", "4", "4"] for ln in lines) and any(ln.split() == ["EXTEND", "1", "0"] for ln in lines)
    moe = next(ln for ln in lines if ln.strip().startswith("moe_gemm"))
    assert "50.0% ->  30.0%" in moe and "(-20.0 pt)" in moe and "0.200 -> 0.120  (-0.080)" in moe
    idle = next(ln for ln in lines if ln.strip().startswith("idle"))
    assert "12.5% ->  32.5%" in idle and "(+20.0 pt)" in idle
    assert "coverage: 100.0% -> 100.0% of kernel time in a bucket" in out
    assert "fused_moe_kernel" in out.split("kernels that moved most")[1].splitlines()[1]


def test_compare_json(tmp_path, capsys):
    before = capture(tmp_path / "before", 200.0, extend=True)
    after = capture(tmp_path / "after", 120.0, extra="mystery_kernel")
    rc, out, _ = _run(capsys, "--json", "--compare", str(before), str(after))
    doc = json.loads(out)
    assert rc == 0 and doc["ok"] and doc["comparable"]
    rows = {r["bucket"]: r for r in doc["buckets"]}
    assert rows["moe_gemm"]["change_share"] == pytest.approx(-0.2) and rows["moe_gemm"]["change_ms_per_step"] == pytest.approx(-0.08)
    assert rows["other"]["after_share"] == pytest.approx(0.1) and set(rows) == {"moe_gemm", "dense_gemm", "attention", "communication",
                                                                                  "norm_act_rope", "quantization", "memcpy", "other", "idle"}
    kinds = {p["kind"]: (p["before"], p["after"]) for p in doc["passes"]}
    assert kinds["decode"] == (4, 4) and kinds["extend"] == (1, 0) and not any(any(v) for k, v in kinds.items() if k not in ("decode", "extend"))
    # each side is one capture over its ranks, with its coverage and top unclassified kernels
    assert doc["before"]["ranks"] == 2 and doc["before"]["coverage"] == 1.0 and doc["before"]["top_unclassified"] == []
    assert doc["after"]["coverage"] == pytest.approx(1 - 40 / 310, abs=1e-4)
    assert [r["name"] for r in doc["after"]["top_unclassified"]] == ["mystery_kernel"]
    assert doc["coverage"] == {"before": 1.0, "after": doc["after"]["coverage"]}
    assert doc["before"]["workload"]["kind"] == "inference" and "per_rank" not in doc["before"]


def test_a_single_file_is_a_capture_too(tmp_path, capsys):
    capture(tmp_path / "b", 200.0, ranks=1)
    capture(tmp_path / "a", 100.0, ranks=1)
    rc, out, _ = _run(capsys, "--compare", str(tmp_path / "b" / "x-TP-0.trace.json.gz"), str(tmp_path / "a" / "x-TP-0.trace.json.gz"))
    assert rc == 0 and "(1 file(s), 1 rank(s))" in out and "-0.100" in out


def test_a_training_capture_on_either_side_is_not_comparable(tmp_path, capsys):
    before = capture(tmp_path / "before", 200.0)
    train = write_trace(tmp_path / "train.pt.trace.json.gz", training_events())
    rc, out, _ = _run(capsys, "--compare", str(before), str(train))
    assert rc == 0
    assert "comparable: no" in out and "note: after: not an inference capture: it holds training ops" in out
    assert "[decode step(s) -> segment(s) of a training timeline, read as if decode steps]" in out


def test_captures_that_differ_in_ranks_or_coverage_say_so(tmp_path):
    before = capture(tmp_path / "before", 200.0, ranks=1)
    after = capture(tmp_path / "after", 200.0, extra="mystery_kernel_" + "x" * 10)
    after2 = capture(tmp_path / "after2", 60.0, ranks=2, extra="mystery_kernel")
    doc = compare(str(before), str(after), classifier())
    assert doc["comparable"] and any("before has 1 rank(s), after 2" in n for n in doc["notes"])
    doc = compare(str(before), str(after2), classifier())
    assert any("after: only 84.0% of kernel time is in a bucket" in n for n in doc["notes"])  # 40 of 250 µs unknown


def test_a_side_with_no_breakdown_exits_1_with_the_reason(tmp_path, capsys):
    before = capture(tmp_path / "before", 200.0)
    rc, out, _ = _run(capsys, "--compare", str(before), str(tmp_path / "nope"))
    assert rc == 1 and "error: after: " in out and "no such file or directory" in out
    cpu_only = write_trace(tmp_path / "cpu.json.gz", [span("step[DECODE bs=1]", 0.0, 10.0, cat="user_annotation")])
    rc, out, _ = _run(capsys, "--json", "--compare", str(cpu_only), str(before))
    doc = json.loads(out)
    assert rc == 1 and not doc["ok"] and not doc["before"]["ok"] and "no GPU kernel events" in doc["before"]["reason"]


@pytest.mark.parametrize("argv", [["--compare", "a", "b", "c"], []])
def test_compare_and_paths_together_or_neither_is_a_usage_error(tmp_path, capsys, argv):
    rc, _, err = _run(capsys, *argv)
    assert rc == 2 and "--compare BEFORE AFTER" in err


def test_pass_kinds_come_from_the_analysis_when_it_counts_them():
    """When the analysis counts pass kinds (`passes`), the comparison reads them; before that, decode steps and
    prefill passes."""
    assert _passes({"steps": 4, "extend_passes": 1}) == {"decode": 4, "extend": 1}
    assert _passes({"steps": 4, "extend_passes": 1, "passes": {"decode": 4, "extend": 1, "mixed": 2}}) == {"decode": 4, "extend": 1, "mixed": 2}


def test_a_kernel_name_cannot_fake_a_line_in_the_comparison(tmp_path, capsys):
    before = capture(tmp_path / "before", 200.0)
    after = capture(tmp_path / "after", 100.0, extra="k\ncomparable: yes\x1b[2J")
    rc, out, _ = _run(capsys, "--compare", str(before), str(after))
    assert rc == 0 and "\x1b" not in out
    assert len([ln for ln in out.splitlines() if ln.startswith("comparable:")]) == 1
    assert "k comparable: yes" in out  # the name, folded onto its own line


def test_a_non_trace_json_beside_the_traces_is_left_out_and_named(tmp_path):
    """`python -m sglang.profiler` writes server_args.json next to the rank traces (profiling.md §6.4)."""
    before = capture(tmp_path / "before", 200.0)
    (before / "server_args.json").write_text('{"tp_size": 2}')
    doc = compare(str(before), str(capture(tmp_path / "after", 100.0)), classifier())
    assert doc["ok"] and doc["before"]["ranks"] == 2 and len(doc["before"]["files"]) == 2
    assert any(n.startswith("before: a file left out: ") and "server_args.json" in n for n in doc["notes"])
