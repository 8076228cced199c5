"""The streamed trace analysis: step windows, idle, buckets, stragglers; both parser paths agree."""

from __future__ import annotations

import dataclasses
import gzip
import time
from pathlib import Path

import pytest

from gpu_runbook.sim.profiler import StepRecord, physics, write_traces
from gpu_runbook.sim.host import server_config
from gpu_runbook.sim.scenario import available_scenarios, load_scenario
from gpu_runbook.sim.sglang_info import default_server_args
from gpu_runbook.sim.sglang_server import served_args
from gpu_runbook.trace.analysis import analyze, analyze_rank, rank_of
from gpu_runbook.trace.parse import TraceError, TraceMeta, iter_events
from gpu_runbook.trace.rules import classifier
from tests.trace_helpers import kernel, span, write_trace

# Two decode steps of 100 µs each; kernels on two streams overlap in step 1.
EVENTS = [
    span("step[DECODE bs=64]", 0.0, 100.0),
    kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 0.0, 30.0),
    kernel("fused_moe_kernel", 20.0, 40.0, stream=9),  # overlaps the all-reduce by 10 µs
    kernel("_fwd_grouped_kernel_stage1", 70.0, 10.0),
    span("step[DECODE bs=64]", 200.0, 100.0),
    kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 200.0, 50.0),
    kernel("fused_moe_kernel", 260.0, 20.0),
    kernel("prefill_only_kernel", 150.0, 20.0),  # between the spans: not part of a decode step
    span("step[EXTEND bs=4 toks=512]", 400.0, 50.0),
    kernel("_fwd_kernel", 400.0, 50.0),
]


@pytest.mark.parametrize("kineto_layout", [True, False])
def test_step_spans_buckets_idle_and_counts(tmp_path, kineto_layout):
    p = write_trace(tmp_path / "a-TP-0-DECODE.trace.json.gz", EVENTS, kineto_layout=kineto_layout)
    r = analyze_rank(p, classifier())
    assert r.fast_path is kineto_layout  # sort_keys puts "args" first: the generic path decodes every event
    s = r.summary()
    assert (s["steps"], s["step_source"], s["step_ms"]) == (2, "spans", 0.1)
    assert s["shares"]["communication"] == pytest.approx(80 / 200)
    assert s["shares"]["moe_gemm"] == pytest.approx(60 / 200)
    assert s["shares"]["attention"] == pytest.approx(10 / 200)
    # union: step 1 covers 0-60 and 70-80 (70 µs), step 2 200-250 and 260-280 (70 µs)
    assert s["idle_share"] == pytest.approx(1 - 140 / 200)
    assert s["kernels_per_step"] == 2.5
    assert s["median_kernel_us"] == pytest.approx(30.0)
    assert s["top"][0]["name"].startswith("ncclDevKernel_AllReduce")
    assert s["backends"][0] == "nccl" and "triton-attention" in s["backends"]


def test_without_spans_the_window_is_split_into_the_steps_asked_for(tmp_path):
    events = [kernel("fused_moe_kernel", 0.0, 40.0), kernel("fused_moe_kernel", 60.0, 40.0)]
    p = write_trace(tmp_path / "a-TP-0.trace.json.gz", events)
    s = analyze_rank(p, classifier(), steps_hint=2).summary()
    assert (s["steps"], s["step_source"], s["step_ms"]) == (2, "window", 0.05)
    assert s["idle_share"] == pytest.approx(0.2)


def test_rank_comes_from_the_trace_and_stragglers_from_non_comm_time(tmp_path):
    fast = [kernel("fused_moe_kernel", 0.0, 20.0), kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 20.0, 80.0)]
    slow = [kernel("fused_moe_kernel", 0.0, 60.0), kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 60.0, 40.0)]
    paths = [write_trace(tmp_path / "p-TP-0.trace.json.gz", fast, rank=0), write_trace(tmp_path / "p-TP-1.trace.json.gz", slow, rank=1)]
    s = analyze(paths, classifier(), steps_hint=1).summary()
    assert s["ranks"] == 2 and s["slowest_rank"] == 1
    assert s["straggler_spread"] == pytest.approx((0.06 - 0.02) / 0.04)
    assert [p["rank"] for p in s["per_rank"]] == [0, 1]


def test_rank_of_reads_sglang_file_names():
    assert rank_of("/x/runbook-1733-TP-3-DECODE.trace.json.gz") == 3
    assert rank_of("1733.1-TP-0-DP-1-EP-2.trace.json.gz") == 0
    assert rank_of("merged-1733.trace.json.gz") is None


def test_a_truncated_trace_is_a_clear_error(tmp_path):
    p = write_trace(tmp_path / "t-TP-0.trace.json.gz", EVENTS)
    raw = gzip.decompress(p.read_bytes())
    with gzip.open(p, "wb") as f:
        f.write(raw[: len(raw) // 2])
    with pytest.raises(TraceError, match="truncated|ends inside"):
        list(iter_events(p))
    with gzip.open(p, "wb") as f:  # cut inside a CPU-side event the analysis does not decode
        f.write(raw[: raw.index(b"_call_impl") + 4])
    with pytest.raises(TraceError, match="truncated|ends inside"):
        list(iter_events(p))
    p.write_bytes(b"not gzip at all")
    with pytest.raises(TraceError, match="cannot read"):
        list(iter_events(p))


def test_events_split_across_read_chunks_are_all_found(tmp_path, monkeypatch):
    import gpu_runbook.trace.parse as parse

    monkeypatch.setattr(parse, "CHUNK", 97)  # far smaller than one event: every event straddles chunks
    p = write_trace(tmp_path / "c-TP-0.trace.json.gz", EVENTS)
    meta = TraceMeta()
    names = [e["name"] for e in iter_events(p, meta=meta)]
    assert len(names) == len(EVENTS) and meta.rank == 0 and meta.base_time_ns == 1_700_000_000_000_000_000


def _sim_traces(tmp_path: Path, name: str, batch: int = 256, ranks: int = 2) -> list[Path]:
    sc = load_scenario(name)
    cfg = server_config(sc, tmp_path)
    args = {**default_server_args(cfg.version), **cfg.server_args}
    ph = physics(cfg, args, sc)
    step_s = (sc.server.throughput.step_base_ms + sc.server.throughput.step_per_req_ms * batch) / 1000
    now = time.time()
    steps = [StepRecord(now + i * step_s, step_s, batch, batch * 200.0) for i in range(2)]
    return write_traces(tmp_path / name, "sim", "-DECODE", steps, ph, ranks=ranks)


# SGLang's traces (the simulated vLLM server's own captures are read in tests/test_vllm_profile.py)
@pytest.mark.parametrize("name", sorted(n for n in available_scenarios() if load_scenario(n).server.kind == "sglang"))
def test_every_bundled_scenario_is_classified_to_under_5_percent_unclassified(tmp_path, name):
    s = analyze(_sim_traces(tmp_path, name), classifier(), steps_hint=2).summary()
    assert s["ranks"] == 2
    assert s["unclassified_share"] < 0.05
    assert sum(s["shares"].values()) + s["idle_share"] == pytest.approx(1.0, abs=0.02)


def test_scenarios_break_down_differently_and_by_their_physics(tmp_path):
    seed = analyze(_sim_traces(tmp_path, "seed-rtx-pro-6000-tp8", batch=1935), classifier(), 2).summary()
    h200 = analyze(_sim_traces(tmp_path, "healthy-h200-nvlink", batch=256), classifier(), 2).summary()
    # TP8 over PCIe, ~24 MB messages (past custom all-reduce's 8 MiB): NCCL's all-reduce leads the seeds' step
    assert seed["shares"]["communication"] > 0.4 and "nccl" in seed["backends"]
    assert max(seed["shares"], key=seed["shares"].get) == "communication"
    assert "flashinfer-cutlass-moe" in seed["backends"]  # --moe-runner-backend flashinfer_cutlass
    # NVLink custom all-reduce and CUDA graphs: the experts dominate, communication is small
    assert h200["shares"]["moe_gemm"] > h200["shares"]["communication"]
    assert "custom-allreduce-v2" in h200["backends"]  # 0.5.23 on full NVLink: the JIT V2 (sglang-versions.md §4.2) and "flashattention" in h200["backends"]
    assert seed["step_source"] == "gaps" and h200["step_source"] == "spans"  # 0.5.10 has no step spans (0.5.11+): passes by GPU gaps


ATTENTION = [("flashinfer", None, False), ("fa3", None, False), ("triton", None, False), ("flashinfer", None, True),
             ("nsa", "flashinfer_sparse_mla", True), ("dsa", "flashmla_kv", True), ("dsa", "trtllm", True)]  # fmt: skip
MOE = [None, "triton", "sgl-cutlass-fp4", "flashinfer-cutlass", "trtllm-gen", "deep-gemm", "cutlass-fp8"]
COMM = ["none", "nccl", "custom", "custom-v2", "pcie-ipc"]


@pytest.mark.parametrize("attention,dsa,mla", ATTENTION)
def test_every_kernel_the_simulator_emits_is_bucketed_by_a_rule(tmp_path, attention, dsa, mla):
    """Attention backend x MoE runner x all-reduce path, decode and extend passes: every kernel name the simulator can
    write matches a rule of the shipped table, and only sampling/fill kernels land in `other`."""
    import dataclasses

    from gpu_runbook.sim.profiler import step_buckets

    sc = load_scenario("seed-rtx-pro-6000-tp8")
    cfg = server_config(sc, tmp_path)
    base = physics(cfg, {**default_server_args(cfg.version), **cfg.server_args}, sc)
    hf = dict(base.hf) if mla else {k: v for k, v in base.hf.items() if k not in ("kv_lora_rank", "index_topk")}
    cls = classifier()
    for moe in MOE:
        for comm in COMM:
            ph = dataclasses.replace(base, attention=attention, dsa_decode=dsa, moe=moe, comm=comm, hf=hf,
                                     moe_layers=base.moe_layers if moe else 0, fp4=moe in ("sgl-cutlass-fp4", "flashinfer-cutlass", "trtllm-gen"))  # fmt: skip
            for mode, batch, tokens in (("DECODE", 64, 64), ("EXTEND", 4, 2048)):
                seen = {}
                for name, _, _ in step_buckets(ph, batch, 64 * 300.0, mode=mode, tokens=tokens):
                    m = cls.classify(name, "gpu_memcpy" if name.startswith("Memcpy") else "kernel")
                    assert m.classified, (attention, dsa, moe, comm, mode, name)
                    assert m.bucket != "other" or any(w in name for w in ("Sampling", "FillFunctor")), (name, m.bucket)
                    seen[name] = m
                names = " ".join(seen)
                if moe:
                    assert any(m.bucket == "moe_gemm" for m in seen.values()), (moe, names)
                assert any(m.bucket == "attention" for m in seen.values()), (attention, dsa, names)
                if comm != "none":
                    assert any(m.bucket == "communication" for m in seen.values()), (comm, names)
                expected = {"flashinfer-sparse-mla" if dsa == "flashinfer_sparse_mla" else "flashmla"} if dsa else set()
                expected |= {"deep-gemm-moe"} if moe == "deep-gemm" else set()
                expected |= {"deep-gemm-indexer"} if dsa and mode == "DECODE" else set()  # a 2,048-token prompt is within index_topk
                # a 2,048-token reduction is past custom all-reduce's 8 MiB and PCIe-IPC's decode-sized workspace: NCCL
                expected |= {"custom-allreduce-v2"} if comm == "custom-v2" and mode == "DECODE" else set()
                expected |= {"pcie-ipc-allreduce"} if comm == "pcie-ipc" and mode == "DECODE" else set()
                assert expected <= {m.backend for m in seen.values()}, (expected, names)


def _passes_of(lengths: list[float]) -> list[dict]:
    """Passes of two kernels each, 2 ms apart, with no prefill kernel known by name (told apart by length)."""
    events, t = [], 0.0
    for n in lengths:
        events += [kernel("fused_moe_kernel", t, n / 2 - 5), kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t + n / 2 + 5, n / 2 - 5)]
        t += n + 2000.0
    return events


def test_ranks_that_split_a_boundary_pass_differently_are_counted_by_the_majority(tmp_path):
    # A prefill pass near half a decode pass: two ranks read it as prefill (ratio 2.2), the third as decode (1.8).
    shapes = [[1000, 1000, 450, 1000, 1000], [1000, 1000, 455, 1000, 1000], [1000, 1000, 555, 1000, 1000]]
    paths = [write_trace(tmp_path / f"p-TP-{i}.trace.json.gz", _passes_of(lens), rank=i) for i, lens in enumerate(shapes)]
    prof = analyze(paths, classifier(), steps_hint=2)
    assert [(r.steps, r.extend_passes) for r in prof.ranks] == [(4, 1), (4, 1), (5, 0)]
    s = prof.summary()
    # five passes were captured: never 5 decode steps from one rank plus 1 prefill pass from another
    assert (s["steps"], s["extend_passes"], s["extend_by_length"], s["ranks_split_otherwise"]) == (4, 1, 1, 1)


@pytest.mark.parametrize("cpu", [True, False])
def test_a_prefill_pass_as_long_as_a_decode_pass_is_told_apart_by_its_eager_launches(tmp_path, cpu):
    """0.5.9 writes no step spans and fa3's prefill kernels share decode's names, so neither a name nor a length
    tells a 28 ms prefill pass from a 28 ms decode pass; the decode passes replay a CUDA graph (one launch, one
    correlation for all their kernels), the prefill pass launches each kernel."""
    sc = load_scenario("fp8-kv-checkpoint")
    cfg = server_config(sc, tmp_path)
    ph = physics(cfg, {**default_server_args(cfg.version), **cfg.server_args}, sc)
    assert ph.graphs and ph.attention == "fa3" and not ph.spans
    now, step_s = time.time(), 0.028
    passes = [StepRecord(now + i * step_s, step_s, 200, 200 * 300.0) for i in range(5)]
    passes[2] = StepRecord(now + 2 * step_s, step_s, 2, 2048.0, mode="EXTEND", tokens=2048)
    paths = write_traces(tmp_path / "t", "sim", "", passes, ph, cpu=cpu, ranks=2)
    s = analyze(paths, classifier(), steps_hint=2).summary()
    assert (s["steps"], s["extend_passes"], s["extend_by_launch"], s["extend_by_length"]) == (4, 1, 1, 0)
    # the decode steps' idle is the graph replay's, not the eager prefill pass's launch gaps
    assert s["idle_share"] < 0.03  # 0.05 with the prefill pass counted as a decode step
    eager = dataclasses.replace(ph, graphs=False)
    s = analyze(write_traces(tmp_path / "e", "sim", "", passes, eager, cpu=cpu, ranks=2), classifier(), steps_hint=2).summary()
    assert s["extend_by_launch"] == 0  # every pass eager: nothing to tell them apart by


@pytest.mark.parametrize("prompt", [256, 4096])
def test_a_dsa_prefill_pass_is_told_apart_by_the_indexer_kernel_it_does_not_run(tmp_path, prompt):
    """The seeds' box: 0.5.10 writes no step spans, graphs are off (every pass eager) and trtllm's DSA prefill
    shares decode's attention kernel. A 100 ms prefill pass among 184 ms decode passes is within 2x, so length
    cannot tell it; only decode passes score the cache with the indexer's paged logits. A prompt past
    index_topk (2,048) also runs the unpaged logits, a prefill-only name."""
    sc = load_scenario("seed-rtx-pro-6000-tp8")
    cfg = server_config(sc, tmp_path)
    ph = physics(cfg, served_args(cfg), sc)  # as the simulated server resolves its flags: nsa, trtllm DSA backends
    assert not ph.graphs and not ph.spans and ph.dsa_decode == "trtllm" and ph.sm == "sm120"
    now = time.time()
    passes = [StepRecord(now + i, 0.184, 512, 512 * 384.0) for i in range(5)]
    passes[2] = StepRecord(now + 2, 0.100, 16, 4096.0, mode="EXTEND", tokens=4096, max_seq=prompt)
    paths = write_traces(tmp_path / "t", "sim", "", passes, ph, ranks=2)
    s = analyze(paths, classifier(), steps_hint=2).summary()
    by_kernel = 1 if prompt <= 2048 else 0  # a long prompt's pass is already marked by its own kernel's name
    assert (s["steps"], s["extend_passes"], s["extend_by_decode_kernel"], s["extend_by_length"]) == (4, 1, by_kernel, 0)
    assert s["step_ms"] == pytest.approx(184, rel=0.02)  # the decode passes only
    assert "deep-gemm-indexer" in s["backends"]


def test_a_flashinfer_mla_prefill_of_fresh_prompts_runs_the_ragged_prefill_kernel(tmp_path):
    """SGLang's FlashInfer MLA backend prefills prompts without a prefix with the ragged prefill wrapper (0.5.10
    flashinfer_mla_backend.py:321-340), a prefill-only name; a chunk that continues a prefix runs the MLA kernel."""
    from gpu_runbook.sim.profiler import step_buckets
    from gpu_runbook.trace.analysis import PREFILL_KERNEL

    sc = load_scenario("tp2-mla-kv-wall")
    cfg = server_config(sc, tmp_path)
    ph = physics(cfg, served_args(cfg), sc)
    assert ph.attention == "flashinfer" and ph.hf.get("kv_lora_rank") and not ph.dsa_decode

    def names(mode: str, tokens: int, max_seq: int) -> str:
        return " ".join(n for n, _, _ in step_buckets(ph, 8, 8 * 300.0, mode=mode, tokens=tokens, max_seq=max_seq))

    fresh, continued, decode = names("EXTEND", 2048, 512), names("EXTEND", 2048, 6144), names("DECODE", 8, 0)
    assert PREFILL_KERNEL.search(fresh) and "BatchMLAPagedAttentionKernel" not in fresh
    assert "BatchMLAPagedAttentionKernel" in continued and not PREFILL_KERNEL.search(continued)
    assert "BatchMLAPagedAttentionKernel" in decode and not PREFILL_KERNEL.search(decode)
