"""Pass kinds as the servers define them (issue 35 item 1): decode, EXTEND, mixed, idle, capture, from SGLang's
`step[...]` spans and vLLM's per-release `execute_*` annotations (traces.md §1), else from the GPU timeline.

The traces are hand-made in Kineto's shape (traces.md §0): a CPU `user_annotation` per pass and one
`gpu_user_annotation` per stream it ran on (same "External id"), a `cuda_runtime` launch per eager kernel, and
for a CUDA-graph replay one `cudaGraphLaunch` whose correlation every replayed kernel carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_runbook.trace.analysis import analyze, analyze_rank, pass_label, prefill_split_note
from gpu_runbook.trace.rules import classifier
from tests.trace_helpers import write_trace

DECODE_LAYER = [("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", 8.0), ("_fwd_grouped_kernel_stage1", 6.0), ("fused_moe_kernel", 20.0),
                ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 10.0)]  # fmt: skip
PREFILL_LAYER = [("nvjet_tst_128x256_64x4_2x1_v_bz_TNN", 80.0), ("FmhaBatchPrefillWithPagedKVCacheKernel", 60.0),
                 ("fused_moe_kernel", 150.0), ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 40.0)]  # fmt: skip
SAMPLER = [("TopKTopPSamplingFromProbKernel", 15.0), ("argmax_kernel", 3.0)]


class Trace:
    """Kineto events for passes: `graph` pieces replay one cudaGraphLaunch, `eager` pieces launch each kernel."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 1000
        self.ext = 1

    def _launch(self, name: str, ts: float) -> int:
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 2.0,
                            "args": {"correlation": self.corr}})  # fmt: skip
        return self.corr

    def _kernel(self, name: str, ts: float, dur: float, corr: int, stream: int = 7) -> None:
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                            "args": {"device": 0, "stream": stream, "correlation": corr}})  # fmt: skip

    def add(self, name: str | None, t0: float, pieces: list[tuple[str, list[tuple[str, float]]]], *, cpu: bool = True,
            gpu_span: bool = True, side_stream: int | None = None, ext: bool = True) -> float:
        """One pass from t0 (CPU) with its GPU work from t0 + 20 µs; returns where its GPU work ends."""
        cpu_t, t = t0 + 1.0, t0 + 20.0
        extent: dict[int, list[float]] = {}
        for mode, ks in pieces:
            c = self._launch("cudaGraphLaunch", cpu_t) if mode == "graph" else 0
            cpu_t += 3.0
            for kn, d in ks:
                if mode == "eager":
                    c = self._launch("cudaLaunchKernel", cpu_t)
                    cpu_t += 3.0
                self._kernel(kn, t, d, c)
                w = extent.setdefault(7, [t, t + d])
                w[1] = t + d
                t += d + 1.0
        if side_stream is not None:  # a side stream's kernel (a second GPU span of the same annotation)
            c = self._launch("cudaLaunchKernel", cpu_t)
            self._kernel("vectorized_elementwise_kernel", t0 + 25.0, 5.0, c, stream=side_stream)
            extent[side_stream] = [t0 + 25.0, t0 + 30.0]
        if name is not None:
            x = self.ext
            self.ext += 1
            args = {"External id": x} if ext else {}
            if cpu:
                self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": t0,
                                    "dur": cpu_t + 5.0 - t0, "args": args})  # fmt: skip
            if gpu_span:
                for stream, (s, e) in extent.items():
                    self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": 0, "tid": stream,
                                        "ts": s - 0.001, "dur": e - s + 0.002, "args": args})  # fmt: skip
        return t

    def sampler(self, t0: float) -> float:
        """vLLM's sample_tokens: a separate worker call after execute_model, outside its annotation."""
        return self.add(None, t0, [("eager", SAMPLER)])

    def write(self, path: Path, rank: int = 0) -> Path:
        return write_trace(path, self.events, rank=rank)


def layers(kernels: list[tuple[str, float]], n: int) -> list[tuple[str, float]]:
    return kernels * n


def summary(path: Path) -> dict[str, Any]:
    return analyze_rank(path, classifier()).summary()


# ---- SGLang ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spans", [True, False])
def test_a_prefill_only_capture_says_it_holds_no_decode_pass_and_breaks_down_its_extend_pass(tmp_path, spans):
    """The issue's capture: one `step[EXTEND bs=15 toks=15360]` and a stray 3 µs `arange` kernel outside it, read
    as '1 decode step, 0.003 ms, 1 kernel, other 100 %'. With the span, or without (0.5.10), the stray is no pass."""
    tr = Trace()
    tr.add(None, 0.0, [("eager", [("void at::native::arange_kernel<long>", 3.0)])])
    end = tr.add("step[EXTEND bs=15 toks=15360]" if spans else None, 5_000.0, [("eager", layers(PREFILL_LAYER, 12))])
    p = tr.write(tmp_path / f"x-{spans}-TP-0.trace.json.gz")
    s = summary(p)
    assert s["steps"] == 0 and s["breakdown_of"] == "extend" and s["breakdown_passes"] == 1
    assert s["passes"] == {"decode": 0, "extend": 1, "mixed": 0, "idle": 0, "capture": 0, "other": 0, "decode_or_chunk": 0, "mixed_or_extend": 0}
    assert s["step_ms"] == pytest.approx((end - 1.0 - 5_020.0) / 1000, rel=0.01)  # the EXTEND pass, not the 3 µs stray
    assert s["kernels_per_step"] == 48 and all("arange" not in t["name"] for t in s["top"])
    assert s["shares"]["moe_gemm"] > 0.4 and s["shares"]["other"] == 0
    assert s["extend_passes"] == 1 and prefill_split_note(s) == ""  # the breakdown is of the prefill pass: its note says so
    note = next(n for n in s["notes"] if "no decode pass" in n)
    if spans:
        assert s["pass_source"] == "SGLang step spans" and s["step_source"] == "spans"
        assert "1 EXTEND pass(es) (15 request(s), 15360 token(s)) broken down instead" in note
    else:
        assert s["pass_source"].startswith("GPU timeline") and "1 EXTEND pass(es) broken down instead" in note
        assert any("1 group(s) of at most 3 kernels between passes" in n for n in s["notes"])
    # over ranks (the profile probe): still no decode step, and the summary says what the capture held
    prof = analyze([p], classifier())
    o = prof.summary()
    assert o["ranks"] == 0 and o["extend_passes"] == 1 and o["passes"]["extend"] == 1 and o["breakdown_of"] == "extend"
    assert any("no decode pass" in n for n in o["notes"])
    b = prof.summary(decode_only=False)
    assert b["ranks"] == 1 and b["breakdown_of"] == "extend" and b["steps"] == 0 and b["step_ms"] == s["step_ms"]


def test_sglang_decode_and_extend_spans_break_down_the_decode_passes_only(tmp_path):
    tr = Trace()
    t = 0.0
    for i in range(4):
        if i == 2:
            t = tr.add("step[EXTEND bs=4 toks=8192]", t, [("eager", layers(PREFILL_LAYER, 4))]) + 300.0
        else:  # a decode pass replays one graph, and writes a GPU span on each of its two streams
            t = tr.add("step[DECODE bs=64]", t, [("graph", layers(DECODE_LAYER, 4))], side_stream=21) + 50.0
        t = tr.add(None, t, [("eager", SAMPLER)]) + 300.0  # sampling after the forward: outside the span
    s = summary(tr.write(tmp_path / "d-TP-0.trace.json.gz"))
    assert (s["steps"], s["breakdown_of"], s["breakdown_passes"], s["extend_passes"]) == (3, "decode", 3, 1)
    assert s["passes"]["decode"] == 3 and s["passes"]["extend"] == 1 and s["pass_source"] == "SGLang step spans"
    assert s["kernels_per_step"] == 17  # 16 graph kernels + the side stream's, never the sampler's
    assert all("Sampling" not in t["name"] and "FmhaBatchPrefill" not in t["name"] for t in s["top"])
    assert s["mixed_tokens"] is None and prefill_split_note(s) == "1 prefill pass(es) left out"
    assert not any("no decode pass" in n for n in s["notes"])


def test_sglang_mixed_chunking_is_a_kind_of_its_own_with_the_detailed_token_split(tmp_path):
    """`--enable-mixed-chunk` runs `step[MIXED bs=N]` (prefill chunks with the running decodes); from 0.5.19 the
    detailed suffix splits it: c= context chunks, g= decodes, c_sq= / g_sq= their tokens."""
    tr = Trace()
    t = tr.add("step[DECODE bs=40]", 0.0, [("graph", layers(DECODE_LAYER, 4))]) + 300.0
    t = tr.add("step[MIXED bs=12 c=2 g=10 c_sq=4000 c_sk=4000 c_sqsq=8000000 c_sqsk=8000000 g_sq=10 g_sk=9000 g_sqsq=10 g_sqsk=9000]",
               t, [("eager", layers(PREFILL_LAYER, 4))]) + 300.0  # fmt: skip
    t = tr.add("step[MIXED bs=9]", t, [("eager", layers(PREFILL_LAYER, 4))]) + 300.0
    tr.add("step[DECODE bs=40]", t, [("graph", layers(DECODE_LAYER, 4))])
    s = summary(tr.write(tmp_path / "m-TP-0.trace.json.gz"))
    assert (s["passes"]["decode"], s["passes"]["mixed"], s["passes"]["extend"], s["breakdown_of"], s["steps"]) == (2, 2, 0, "decode", 2)
    assert s["extend_passes"] == 2 and prefill_split_note(s) == "2 prefill pass(es) left out (2 mixed)"
    m = s["mixed_tokens"]  # only the detailed span gives the split
    assert (m["passes"], m["of_passes"], m["prefill_requests"], m["prefill_tokens"], m["decode_requests"], m["decode_tokens"]) == (1, 2, 2, 4000, 10, 10)


def test_a_capture_of_mixed_passes_only_breaks_them_down_and_says_so(tmp_path):
    tr = Trace()
    t = tr.add("step[MIXED bs=12]", 0.0, [("eager", layers(PREFILL_LAYER, 4))]) + 300.0
    tr.add("step[EXTEND bs=2 toks=4096]", t, [("eager", layers(PREFILL_LAYER, 4))])
    s = summary(tr.write(tmp_path / "mo-TP-0.trace.json.gz"))
    assert (s["steps"], s["breakdown_of"], s["breakdown_passes"], s["passes"]["mixed"], s["passes"]["extend"]) == (0, "mixed", 1, 1, 1)
    note = next(n for n in s["notes"] if "no decode pass" in n)
    assert "1 mixed pass(es) (prefill chunks with decodes) broken down instead" in note and "not a decode step's" in note
    assert s["mixed_tokens"] is None  # `step[MIXED bs=12]` does not split its batch


def test_idle_and_speculative_passes_are_counted_and_left_out(tmp_path):
    tr = Trace()
    t = tr.add("step[DECODE bs=8]", 0.0, [("graph", layers(DECODE_LAYER, 2))]) + 300.0
    t = tr.add("step[VERIFY bs=8]", t, [("graph", layers(DECODE_LAYER, 2))]) + 300.0
    t = tr.add("step[DRAFT bs=8]", t, [("graph", layers(DECODE_LAYER, 1))]) + 300.0
    tr.add("step[IDLE bs=0]", t, [], gpu_span=False)  # a DP-attention rank with no work: no kernel, no GPU span
    s = summary(tr.write(tmp_path / "i-TP-0.trace.json.gz"))
    assert s["passes"]["decode"] == 1 and s["passes"]["idle"] == 1 and s["passes"]["other"] == 2 and s["steps"] == 1
    assert any("2 pass(es) of other modes" in n and "VERIFY x1" in n and "DRAFT x1" in n for n in s["notes"])


# ---- vLLM ------------------------------------------------------------------------------------------------


def _piecewise(layers_n: int, prefill: bool = True) -> list[tuple[str, list[tuple[str, float]]]]:
    """vLLM's piecewise graphs: a graph per piece between attention layers, attention launched eagerly."""
    attn = ("kernel_unified_attention_2d", 120.0 if prefill else 6.0)
    gemm = [("nvjet_tst_128x256_64x4_2x1_v_bz_TNN", 80.0 if prefill else 8.0), ("fused_moe_kernel", 150.0 if prefill else 20.0)]
    out: list[tuple[str, list[tuple[str, float]]]] = []
    for _ in range(layers_n):
        out += [("graph", gemm), ("eager", [attn])]
    return out + [("graph", gemm)]


def _full_graph(layers_n: int) -> list[tuple[str, list[tuple[str, float]]]]:
    return [("graph", [("kernel_unified_attention_2d", 6.0), ("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", 8.0), ("fused_moe_kernel", 20.0)] * layers_n)]


def test_vllm_0_11_0_has_no_annotation_and_is_split_on_the_gpu_timeline(tmp_path):
    """No per-step annotation up to 0.11.0: passes by their gaps; FULL_AND_PIECEWISE replays one full graph for a
    decode batch and runs prefill piecewise, so the eager/piecewise pass is the prefill one (as today)."""
    tr = Trace()
    t = 0.0
    for i in range(5):
        t = tr.add(None, t, _piecewise(4) if i == 2 else _full_graph(4)) + 50.0
        t = tr.sampler(t) + 2_000.0
    s = summary(tr.write(tmp_path / "v0110-TP-0.trace.json.gz"))
    assert s["pass_source"].startswith("GPU timeline") and "eager launches among CUDA-graph replays" in s["pass_source"]
    assert (s["steps"], s["extend_passes"], s["extend_by_launch"], s["breakdown_of"]) == (4, 1, 1, "decode")
    assert s["passes"]["decode"] == 4 and s["passes"]["extend"] == 1 and s["passes"]["mixed"] == 0


def test_vllm_0_13_new_cached_is_decode_or_chunk_unless_kernels_or_launches_tell(tmp_path):
    """`execute_new_N_cached_M` (0.11.1-0.13) gives no token counts, and a cached request decodes or continues a
    chunked prompt. New requests make a prefill pass; a cached-only pass that replays one full graph beside
    piecewise prefill passes is a uniform decode batch; one that ran a chunk's kernel holds prefill work."""
    tr = Trace()
    t = tr.add("execute_new_2_cached_0", 0.0, _piecewise(4)) + 300.0  # new prompts only: EXTEND
    t = tr.sampler(t) + 300.0
    t = tr.add("execute_new_0_cached_2", t, _piecewise(4)) + 300.0  # piecewise, no name to tell: decode or chunk
    t = tr.add("execute_new_0_cached_8", t, _full_graph(4)) + 300.0  # one full graph: decode-only
    t = tr.sampler(t) + 300.0
    t = tr.add("execute_new_0_cached_8", t, _full_graph(4)) + 300.0
    t = tr.add("execute_new_1_cached_8", t, _piecewise(4)) + 300.0  # a new prompt with cached requests: mixed or EXTEND
    tr.add("execute_new_0_cached_5", t, [("eager", [("BatchPrefillWithRaggedKVCacheKernel", 90.0), ("BatchDecodeWithPagedKVCacheKernel", 10.0)])])
    s = summary(tr.write(tmp_path / "v013-TP-0.trace.json.gz"))
    ps = s["passes"]
    assert (ps["extend"], ps["decode"], ps["decode_or_chunk"], ps["mixed_or_extend"], ps["mixed"]) == (1, 2, 1, 1, 1)
    assert s["pass_source"].startswith("vLLM execute_new/cached annotations (0.11.1-0.13: decode and later prefill chunks not told apart)")
    assert "1 by their kernels and 2 as full-graph replays beside piecewise prefill passes told apart" in s["pass_source"]
    assert (s["breakdown_of"], s["steps"], s["kernels_per_step"]) == ("decode", 2, 12)
    assert s["extend_passes"] == 3 and "mixed-or-EXTEND" in prefill_split_note(s)


def test_vllm_0_13_cached_passes_nothing_tells_apart_are_said_to_be_decode_or_chunk(tmp_path):
    tr = Trace()
    t = 0.0
    for m in (8, 8, 9):  # eager, FlashAttention's one kernel for both: neither launches nor names tell
        t = tr.add(f"execute_new_0_cached_{m}", t, [("eager", [("kernel_unified_attention_2d", 6.0), ("fused_moe_kernel", 20.0)] * 4)]) + 300.0
        t = tr.sampler(t) + 300.0
    s = summary(tr.write(tmp_path / "v013b-TP-0.trace.json.gz"))
    assert (s["passes"]["decode_or_chunk"], s["passes"]["decode"], s["steps"], s["breakdown_of"], s["breakdown_passes"]) == (3, 0, 0, "decode_or_chunk", 3)
    assert any("no pass is known to be decode-only: 3 decode-or-chunk pass(es)" in n for n in s["notes"])
    assert s["kernels_per_step"] == 8  # the sampler between the annotations is in no pass


def test_vllm_0_14_execute_context_generation_tells_decode_prefill_and_mixed(tmp_path):
    tr = Trace()
    t = tr.add("execute_context_0(0)_generation_16(16)", 0.0, _full_graph(4), side_stream=142) + 50.0
    t = tr.sampler(t) + 300.0
    t = tr.add("execute_context_2(4096)_generation_0(0)", t, _piecewise(4)) + 50.0
    t = tr.sampler(t) + 300.0
    t = tr.add("execute_context_9(8155)_generation_37(37)", t, _piecewise(4)) + 50.0
    t = tr.sampler(t) + 300.0
    t = tr.add("execute_context_0(0)_generation_16(16)", t, _full_graph(4), side_stream=158) + 50.0
    t = tr.sampler(t) + 300.0
    tr.add("execute_context_0(0)_generation_0(0)", t, [], gpu_span=False)  # an empty step
    s = summary(tr.write(tmp_path / "v014-TP-0.trace.json.gz"))
    assert s["pass_source"] == "vLLM execute_context annotations (0.14+)"
    ps = s["passes"]
    assert (ps["decode"], ps["extend"], ps["mixed"], ps["idle"]) == (2, 1, 1, 1)
    assert (s["steps"], s["breakdown_of"], s["kernels_per_step"]) == (2, "decode", 13)  # 12 graph kernels + a side stream's
    assert {k: s["mixed_tokens"][k] for k in ("prefill_requests", "prefill_tokens", "decode_requests", "decode_tokens")} == {
        "prefill_requests": 9, "prefill_tokens": 8155, "decode_requests": 37, "decode_tokens": 37}  # fmt: skip
    assert prefill_split_note(s) == "2 prefill pass(es) left out (1 EXTEND, 1 mixed)"


@pytest.mark.parametrize("gpu_spans", [True, False])
def test_a_vllm_piecewise_capture_of_one_mixed_pass_is_not_a_decode_step(tmp_path, gpu_spans):
    """The issue's vLLM capture: one mixed pass of 9 prefill requests with 8,155 tokens and 37 decodes, piecewise
    graphs (25 replays, 24 eager attention launches), annotated `execute_8192_context_9(...)_generation_37(...)`
    (0.26+ detailed form), with the sampler after it. Read once as '1 decode step, 156 ms'. Without GPU-side
    spans (ROCm writes none) the pass is measured from its launches."""
    tr = Trace()
    name = "execute_8192_context_9(sq8155sk8155sqsq7400000sqsk7400000)_generation_37(sq37sk51000sqsq37sqsk51000)"
    end = tr.add(name, 0.0, _piecewise(24), gpu_span=gpu_spans)
    tr.sampler(end + 50.0)
    p = tr.write(tmp_path / "v026-TP-0.trace.json.gz")
    s = summary(p)
    assert s["pass_source"] == "vLLM detailed execute_T_context annotations (0.26+)"
    assert (s["steps"], s["breakdown_of"], s["breakdown_passes"], s["passes"]["mixed"], s["passes"]["decode"]) == (0, "mixed", 1, 1, 0)
    assert s["step_ms"] == pytest.approx((end - 1.0 - 20.0) / 1000, rel=0.01) and s["kernels_per_step"] == 74
    assert (s["mixed_tokens"]["prefill_tokens"], s["mixed_tokens"]["decode_requests"]) == (8155, 37)
    note = next(n for n in s["notes"] if "no decode pass" in n)
    assert "1 mixed pass(es) (prefill chunks with decodes: 9 prefill request(s) with 8155 token(s) and 37 decode(s)) broken down instead" in note
    o = analyze([p], classifier()).summary()
    assert o["ranks"] == 0 and o["passes"]["mixed"] == 1 and o["mixed_tokens"]["prefill_requests"] == 9


def test_vllm_detailed_decode_only_and_the_gpu_spans_of_one_pass_on_three_streams(tmp_path):
    """torch 2.11 wrote 3 GPU spans (streams 7, 142, 158) for one execute_* annotation (traces.md §0): one pass."""
    tr = Trace()
    t = 0.0
    for _ in range(3):
        t = tr.add("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk40000sqsq32sqsk40000)", t, _full_graph(2), side_stream=142) + 50.0
        t = tr.sampler(t) + 300.0
    s = summary(tr.write(tmp_path / "v026d-TP-0.trace.json.gz"))
    assert (s["steps"], s["breakdown_of"], s["passes"]["decode"], s["mixed_tokens"]) == (3, "decode", 3, None)


def test_gpu_spans_without_external_ids_merge_by_name_and_overlap(tmp_path):
    tr = Trace()
    t = 0.0
    for _ in range(2):
        t = tr.add("execute_context_0(0)_generation_8(8)", t, _full_graph(2), side_stream=142, ext=False) + 300.0
    s = summary(tr.write(tmp_path / "noid-TP-0.trace.json.gz"))
    assert s["steps"] == 2 and s["passes"]["decode"] == 2


def test_vllm_graph_capture_passes_are_counted_never_broken_down(tmp_path):
    """`capture_{num_tokens}_{FULL|PIECEWISE}` (0.26+, profiler_config.capture_torch_profiler)."""
    tr = Trace()
    t = tr.add("capture_512_PIECEWISE", 0.0, [("eager", [("vectorized_elementwise_kernel", 2.0)])]) + 300.0
    tr.add("capture_256_FULL", t, [("eager", [("vectorized_elementwise_kernel", 2.0)])])
    s = summary(tr.write(tmp_path / "cap-TP-0.trace.json.gz"))
    assert s["passes"]["capture"] == 2 and s["breakdown_of"] is None and s["breakdown_passes"] == 0 and s["steps"] == 0
    assert s["pass_source"].startswith("vLLM capture annotations")
    assert any("nothing to break down" in n for n in s["notes"])


@pytest.mark.parametrize(
    ("name", "kind", "tokens"),
    [
        ("step[DECODE bs=64]", "decode", (0, 0, 64, None)),
        ("step[EXTEND bs=15 toks=15360]", "extend", (15, 15360, 0, 0)),
        ("step[EXTEND bs=2 toks=100 c_sq=100 c_sqsq=5000 c_sqsk=5000 c_sk=100 forward_id=7]", "extend", (2, 100, 0, 0)),
        ("step[DECODE bs=8 g_sq=8 g_sqsq=8 g_sqsk=9000 g_sk=9000]", "decode", (0, 0, 8, 8)),
        ("step[MIXED bs=9]", "mixed", (None, None, None, None)),
        ("step[MIXED bs=12 c=2 g=10 c_sq=4000 c_sk=4000 c_sqsq=1 c_sqsk=1 g_sq=10 g_sk=1 g_sqsq=1 g_sqsk=1]", "mixed", (2, 4000, 10, 10)),
        ("step[IDLE bs=0]", "idle", (0, 0, 0, 0)),
        ("step[TARGET_VERIFY bs=4]", "other", (None, None, None, None)),
        ("step[DRAFT bs=4 toks=64]", "other", (None, None, None, None)),
        ("execute_new_0_cached_64", "decode_or_chunk", (0, None, None, None)),
        ("execute_new_3_cached_0", "extend", (3, None, None, None)),
        ("execute_new_1_cached_30", "mixed_or_extend", (1, None, None, None)),
        ("execute_context_0(0)_generation_16(16)", "decode", (0, 0, 16, 16)),
        ("execute_context_2(4096)_generation_0(0)", "extend", (2, 4096, 0, 0)),
        ("execute_context_9(8155)_generation_37(37)", "mixed", (9, 8155, 37, 37)),
        ("execute_context_0(0)_generation_0(0)", "idle", (0, 0, 0, 0)),
        ("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq64sk4000sqsq128sqsk8000)", "decode", (0, 0, 32, 64)),
        ("capture_512_FULL", "capture", (None, 512, None, None)),
    ],
)
def test_pass_label_reads_each_release_form(name, kind, tokens):
    label = pass_label(name)
    assert label is not None and label.kind == kind
    assert (label.prefill_requests, label.prefill_tokens, label.decode_requests, label.decode_tokens) == tokens


@pytest.mark.parametrize("name", ["nccl:all_reduce", "ProfilerStep#3", "execute_model", "gpu_model_runner: forward", "capture_traces", "stepper[x]"])
def test_other_annotations_are_no_pass(name):
    assert pass_label(name) is None
