"""Where a forward pass's GPU time goes, per rank and over ranks, from streamed Kineto traces.

Definitions follow shared/reference/profiling.md §10. Passes and their kinds (decode, EXTEND, mixed, idle,
CUDA-graph capture) come from the servers' own annotations where the trace holds them (traces.md §1):
SGLang's `step[MODE ...]` spans (0.5.11+), vLLM's `execute_new_N_cached_M` (0.11.1-0.13, no token counts:
decodes and later prefill chunks look alike), `execute_context_N(T)_generation_M(T)` (0.14+) and
`execute_T_context_N(sq..)_generation_M(sq..)` (0.26+ detailed), vLLM's `capture_N_MODE`; else from the
capture's GPU timeline (gaps between passes; prefill passes by their kernels and launches). Kernels outside
every annotated pass (vLLM's sampler, a stray kernel before the first pass) belong to no pass.
The breakdown is of the decode passes; a capture without one breaks down its mixed passes, else its
EXTEND passes, and says so (`breakdown_of`). A bucket's share is its kernel time over the passes' wall;
GPU idle is that wall minus the union of all kernel intervals (all streams); stragglers are the spread of
per-rank non-communication time, since under TP every rank waits in the all-reduce for the slowest.
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .parse import GPU_CATS, LAUNCH_CATS, LEGACY_GPU_CATS, TraceMeta, iter_events
from .rules import BUCKETS, Classifier

# Kernels that only a prefill (EXTEND) pass launches: FlashInfer's prefill kernels and the Triton backend's
# extend kernels (profiling.md §8), DSA's sparse prefill (FlashMLA csrc/sm90/prefill/sparse/fwd.cu
# `sparse_attn_fwd_kernel`; flashinfer 0.7.4 sparse_mla_sm120 `sparse_mla_prefill_*`), the DSA indexer's
# unpaged logits over a prompt longer than index_topk (SGLang 0.5.10 nsa_indexer.py:601; DeepGEMM
# impls/sm{90,100,120}_fp8_mqa_logits.cuh). Without step spans (SGLang <= 0.5.10) they tell a pass's mode.
PREFILL_KERNEL = re.compile(r"BatchPrefillWith(Ragged|Paged)KVCache|^_fwd_kernel(_unified)?(_[0-9][0-9a-z]*)?$|flash_fwd_kernel|fmha.*Context"
                            r"|sparse_attn_fwd_kernel|sparse_mla_prefill_|deep_gemm::sm\d+_(?:fp8_|fp4_|bf16_)?mqa_logits")
# Kernels that only a decode pass launches: the DSA indexer scores the cached tokens with DeepGEMM's paged
# MQA logits (SGLang 0.5.10 nsa_indexer.py:472; DeepGEMM impls/sm{90,100,120}_fp8_paged_mqa_logits.cuh); an
# EXTEND pass runs the unpaged kernel or, for prompts within index_topk, none (:601, :1056). In a capture
# where some passes run it, the passes that do not are prefill passes, whatever their attention backend.
DECODE_KERNEL = re.compile(r"paged_(?:sparse_)?mqa_logits")
# For vLLM 0.11.1-0.13 passes whose annotation cannot tell decodes from later prefill chunks: kernels that
# prove a prefill chunk ran (PREFILL_KERNEL less FlashInfer's paged prefill kernel, which vLLM's FlashInfer
# decode wrapper also runs when it uses tensor cores) and kernels that prove decodes ran (FlashInfer's decode
# kernel, trtllm-gen's generation FMHA, FlashMLA's decode, the DSA indexer's paged logits; traces.md §2.3).
# Either one alone never makes a pass decode-only: decodes ride along with chunks in a mixed pass.
CHUNK_KERNEL = re.compile(r"BatchPrefillWithRaggedKVCache|^_fwd_kernel(_unified)?(_[0-9][0-9a-z]*)?$|flash_fwd_kernel|fmha.*Context"
                          r"|sparse_attn_fwd_kernel|sparse_mla_prefill_|deep_gemm::sm\d+_(?:fp8_|fp4_|bf16_)?mqa_logits")
DECODES_KERNEL = re.compile(r"paged_(?:sparse_)?mqa_logits|BatchDecodeWithPagedKVCache|fmhaSm\d+[af]?Kernel_.*ForGen|flash_fwd_splitkv_mla")

# The servers' per-pass annotations (traces.md §1). SGLang 0.5.11+ `step[MODE bs=N ...]`: sglang==0.5.11
# sglang/srt/model_executor/model_runner.py:3469-3476 (`step[EXTEND bs={bs} toks={n}]`, else `step[{mode.name}
# bs={bs}]`); 0.5.19 detailed suffix (MIXED: `c= g= c_sq= ... g_sq= ...`) sglang==0.5.19
# sglang/srt/utils/profile_utils.py:463-488, sglang/srt/model_executor/step_span_utils.py:102,114,116-136;
# 0.5.23 `VERIFY`/`DRAFT` labels and ` forward_id=` (sglang==0.5.23 sglang/srt/utils/profile_utils.py:462-506).
SGLANG_STEP = re.compile(r"^step\[\s*([A-Za-z_0-9]+)([^\]]*)\]?$")
SGLANG_KINDS = {"DECODE": "decode", "EXTEND": "extend", "PREFILL": "extend", "SPLIT_PREFILL": "extend", "DLLM_EXTEND": "extend",
                "MIXED": "mixed", "IDLE": "idle"}  # fmt: skip  # the rest (TARGET_VERIFY, VERIFY, DRAFT*, PREBUILT): "other"
# vLLM's worker annotation per execute_model: none up to 0.11.0; vllm==0.11.1 vllm/v1/worker/gpu_worker.py:522-533
# (and 0.13.0 :553-566) `execute_new_{N}_cached_{M}`; vllm==0.14.0 gpu_worker.py:548-572
# `execute_context_{Nc}({Tc})_generation_{Ng}({Tg})` (counts: vllm/v1/utils.py:433-466, a context request =
# no output token yet, any later chunk included); vllm==0.26.0 gpu_worker.py:967-1075 with
# detailed_trace_annotation: `execute_{T}_context_{Nc}(sq{Tc}sk..sqsq..sqsk..)_generation_{Ng}(sq{Tg}sk..)`.
VLLM_NEW_CACHED = re.compile(r"^execute_new_(\d+)_cached_(\d+)$")
VLLM_CONTEXT = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")
VLLM_DETAILED = re.compile(r"^execute_(\d+)_context_(\d+)\(sq(\d+)[^)]*\)_generation_(\d+)\(sq(\d+)[^)]*\)$")
# vLLM's CUDA-graph capture passes, `capture_{num_tokens}_{FULL|PIECEWISE}` (vllm==0.26.0
# vllm/v1/worker/gpu_model_runner.py:6877-6881, traced when profiler_config.capture_torch_profiler is set).
VLLM_CAPTURE = re.compile(r"^capture_(\d+)_([A-Z_]+)$")
PASS_KINDS = ("decode", "extend", "mixed", "idle", "capture", "other", "decode_or_chunk", "mixed_or_extend")
# which passes a breakdown is of, in order of preference: decode passes, else what is closest to one
BREAKDOWN_ORDER = ("decode", "decode_or_chunk", "mixed", "mixed_or_extend", "extend")
FAMILY_SOURCE = {
    "sglang": "SGLang step spans",
    "vllm-context": "vLLM execute_context annotations (0.14+)",
    "vllm-detailed": "vLLM detailed execute_T_context annotations (0.26+)",
    "vllm-new": "vLLM execute_new/cached annotations (0.11.1-0.13: decode and later prefill chunks not told apart)",
    "capture": "vLLM capture annotations (CUDA-graph capture only)",
}
STRAY_MAX_KERNELS = 3  # on the GPU timeline, a group of this few kernels next to real passes is not a forward pass


class Label(NamedTuple):
    """What a pass's annotation says: the server's family and mode, the pass kind, its requests and tokens (None: not given)."""

    family: str
    kind: str
    mode: str
    prefill_requests: int | None = None
    prefill_tokens: int | None = None
    decode_requests: int | None = None
    decode_tokens: int | None = None


def pass_label(name: str) -> Label | None:
    """The pass an annotation names, or None for any other annotation (`nccl:all_reduce`, `ProfilerStep#3`, ...)."""
    if name.startswith("step["):
        m = SGLANG_STEP.match(name)
        if not m:
            return None
        mode = m.group(1).upper()
        kv = {k: int(v) for k, v in re.findall(r"\b([a-z_]+)=(\d+)", m.group(2))}
        kind = SGLANG_KINDS.get(mode, "other")
        bs = kv.get("bs")
        if kind == "extend":
            return Label("sglang", kind, mode, bs, kv.get("toks", kv.get("c_sq")), 0, 0)
        if kind == "decode":
            return Label("sglang", kind, mode, 0, 0, bs, kv.get("g_sq"))
        if kind == "mixed" and "c" in kv and "g" in kv:  # detailed annotations (0.5.19+): decodes are the 1-token extends
            return Label("sglang", kind, mode, kv["c"], kv.get("c_sq"), kv["g"], kv.get("g_sq"))
        if kind == "idle":
            return Label("sglang", kind, mode, 0, 0, 0, 0)
        return Label("sglang", kind, mode)
    if not name.startswith(("execute_", "capture_")):
        return None
    if m := VLLM_CONTEXT.match(name):
        return _vllm_label("vllm-context", *(int(g) for g in m.groups()))
    if m := VLLM_DETAILED.match(name):
        _, nc, tc, ng, tg = (int(g) for g in m.groups())
        return _vllm_label("vllm-detailed", nc, tc, ng, tg)
    if m := VLLM_NEW_CACHED.match(name):
        new, cached = int(m.group(1)), int(m.group(2))
        # a new request is a prefill (its first chunk); a cached one decodes or continues a chunked prompt
        kind = ("extend" if not cached else "mixed_or_extend") if new else ("decode_or_chunk" if cached else "idle")
        return Label("vllm-new", kind, f"new_{new}_cached_{cached}", new, None, None, None)
    if m := VLLM_CAPTURE.match(name):
        return Label("capture", "capture", m.group(2), None, int(m.group(1)), None, None)
    return None


def _vllm_label(family: str, nc: int, tc: int, ng: int, tg: int) -> Label:
    kind = ("mixed" if ng else "extend") if nc else ("decode" if ng else "idle")
    return Label(family, kind, f"context_{nc}_generation_{ng}", nc, tc, ng, tg)


PASS_GAP_MIN_US = 500.0  # a GPU gap this long (and 20x the median launch gap) separates two forward passes
TRACE_NAME = re.compile(r"-TP-(\d+)(?:-DP-\d+)?(?:-PP-\d+)?(?:-EP-\d+)?(?:-(EXTEND|DECODE|-?\d+))?\.trace\.json(?:\.gz)?$")
TOP_N = 10


@dataclass
class RankProfile:
    """One rank's decode steps, as plain numbers (µs unless the name says otherwise)."""

    rank: int
    path: str
    steps: int
    step_source: str  # "spans", "gaps" (passes told apart on the GPU timeline) or "window"
    window_us: float
    bucket_us: dict[str, float]
    busy_us: float  # union of kernel intervals inside the windows
    kernels: int
    median_kernel_us: float | None
    unclassified_us: float
    top: list[dict[str, Any]]
    backends: dict[str, float]  # backend -> µs
    export_end_us: float | None = None  # last GPU activity end, relative to the trace base time
    base_time_ns: int | None = None
    fast_path: bool = True
    extend_passes: int = 0  # prefill passes in the capture, left out of the decode step
    extend_by_length: int = 0  # of which told apart by their length, not by a prefill kernel's name
    extend_by_launch: int = 0  # of which told apart as eager passes among CUDA-graph replays
    extend_by_decode_kernel: int = 0  # of which told apart as passes without the decode-only DSA indexer kernel
    python_functions: int = 0  # `python_function` events: recorded with Python stacks
    cpu_span_us: float = 0.0  # the CPU step spans' total, when the steps were measured on the GPU timeline instead
    legacy_kernels: int = 0  # GPU rows in Kineto's older categories (`Kernel`, `Memcpy`, `Memset`)
    kernels_seen: int = 0  # GPU activities in the whole file (in or out of the steps)
    passes: dict[str, int] = field(default_factory=dict)  # pass kind -> passes of that kind in the capture (PASS_KINDS)
    pass_source: str = ""  # how the kinds were told: the servers' annotations, or the GPU timeline and how
    breakdown_of: str | None = None  # the kind the windows (and every per-step figure) are of: "decode", else BREAKDOWN_ORDER
    breakdown_passes: int = 0  # passes broken down (= steps when breakdown_of is "decode")
    mixed_tokens: dict[str, Any] | None = None  # the mixed passes' prefill/decode requests and tokens, where annotated
    pass_notes: list[str] = field(default_factory=list)  # what the reader must know about the passes (no decode pass, ...)

    def notes(self) -> list[str]:
        """What a reader must know to trust the numbers: the format read, and the profiler's own overhead."""
        out = list(self.pass_notes)
        if self.legacy_kernels:
            out.append(f"older Kineto format: {self.legacy_kernels} GPU events in category 'Kernel'/'Memcpy'/'Memset' (read as kernel rows)")
        gpu_us = self.window_us
        if self.cpu_span_us and gpu_us and self.cpu_span_us > 3 * gpu_us:
            out.append(f"the CPU step spans last {self.cpu_span_us / gpu_us:.1f}x the steps on the GPU timeline; steps measured on the GPU")
        if self.python_functions and self.window_us > 0 and self.busy_us / self.window_us < 0.5:
            out.append(f"recorded with Python stacks ({self.python_functions} python_function events): the profiler's own overhead "
                       "stretches the step, so the idle share is the profiler's, not the server's")
        elif self.python_functions:
            out.append(f"recorded with Python stacks ({self.python_functions} python_function events): steps may run slower than unprofiled")
        return out

    @property
    def per_step(self) -> int:
        """The passes the per-step figures divide by: the passes broken down (the decode steps, or the
        mixed/EXTEND passes of a capture without a decode pass)."""
        return self.breakdown_passes or self.steps

    @property
    def step_us(self) -> float:
        return self.window_us / self.per_step if self.per_step else 0.0

    def share(self, us: float) -> float:
        return us / self.window_us if self.window_us > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        kernel_us = sum(self.bucket_us.values())
        return {
            "rank": self.rank,
            "steps": self.steps,
            "step_source": self.step_source,
            "extend_passes": self.extend_passes,
            "extend_by_length": self.extend_by_length,
            "extend_by_launch": self.extend_by_launch,
            "extend_by_decode_kernel": self.extend_by_decode_kernel,
            "notes": self.notes(),
            "step_ms": round(self.step_us / 1000, 3),
            "shares": {b: round(self.share(self.bucket_us.get(b, 0.0)), 4) for b in BUCKETS},
            "idle_share": round(max(0.0, 1.0 - self.share(self.busy_us)), 4),
            "idle_ms_per_step": round(max(0.0, self.window_us - self.busy_us) / max(1, self.per_step) / 1000, 3),
            "kernels_per_step": round(self.kernels / max(1, self.per_step), 1),
            "median_kernel_us": None if self.median_kernel_us is None else round(self.median_kernel_us, 2),
            "unclassified_share": round(self.unclassified_us / kernel_us, 4) if kernel_us else 0.0,
            "non_comm_ms_per_step": round((kernel_us - self.bucket_us.get("communication", 0.0)) / max(1, self.per_step) / 1000, 3),
            "top": self.top,
            "backends": sorted(self.backends, key=lambda b: -self.backends[b]),
            **self.pass_summary(),
        }

    def pass_summary(self) -> dict[str, Any]:
        """The pass kinds in the capture and which ones the breakdown is of (the keys `summary()` adds)."""
        return {
            "passes": {k: self.passes.get(k, 0) for k in PASS_KINDS},
            "pass_source": self.pass_source,
            "breakdown_of": self.breakdown_of,
            "breakdown_passes": self.breakdown_passes,
            "mixed_tokens": self.mixed_tokens,
        }


def rank_of(path: str | Path) -> int | None:
    m = TRACE_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


def _windows(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


class Pass(NamedTuple):
    """A forward pass on the GPU timeline (µs): a prefill (EXTEND) pass or not, a CUDA-graph replay or not."""

    start: float
    end: float
    extend: bool
    graphed: bool
    decode_only: bool = False  # ran a kernel only decode passes run (DECODE_KERNEL)
    kernels: int = 0  # GPU activities in the pass


def _passes(starts: list[float], ends: list[float], names: list[str], corrs: list[int | None]) -> list[Pass]:
    """Forward passes on the GPU timeline of a capture without step spans.

    Passes are separated by the scheduler's gap between them (longer than PASS_GAP_MIN_US and 20x the
    median gap between kernels); a pass that runs a prefill-only kernel is an EXTEND pass. A pass most of
    whose kernels carry one correlation is a CUDA-graph replay: one `cudaGraphLaunch` ran them all."""
    order = sorted(range(len(starts)), key=starts.__getitem__)
    gaps = []
    end = None
    for i in order:
        if end is not None:
            gaps.append(max(0.0, starts[i] - end))
        end = ends[i] if end is None else max(end, ends[i])
    limit = max(PASS_GAP_MIN_US, 20 * statistics.median(gaps)) if gaps else PASS_GAP_MIN_US
    out: list[Pass] = []
    members: list[int] = []
    cur_e = 0.0
    for i in order:
        if members and starts[i] - cur_e > limit:
            out.append(_pass_of(members, starts[members[0]], cur_e, names, corrs))
            members = []
        cur_e = ends[i] if not members else max(cur_e, ends[i])
        members.append(i)
    if members:
        out.append(_pass_of(members, starts[members[0]], cur_e, names, corrs))
    return out


def _pass_of(members: list[int], start: float, end: float, names: list[str], corrs: list[int | None]) -> Pass:
    ext = any(PREFILL_KERNEL.search(names[j]) for j in members)
    shared = Counter(corrs[j] for j in members if corrs[j] is not None).most_common(1)
    graphed = bool(shared) and shared[0][1] >= 2 and 2 * shared[0][1] > len(members)
    return Pass(start, end, ext, graphed, any(DECODE_KERNEL.search(names[j]) for j in members), len(members))


def _strays(passes: list[Pass]) -> tuple[list[Pass], int]:
    """Groups of a few kernels next to passes of many (a 3 µs `arange` before a prefill pass): no forward pass
    runs so few kernels, so they are left out rather than counted as a pass of their own."""
    most = max((p.kernels for p in passes), default=0)
    keep = [p for p in passes if not (p.kernels <= STRAY_MAX_KERNELS and p.kernels * 10 < most)]
    return keep, len(passes) - len(keep)


def _by_decode_kernel(passes: list[Pass]) -> tuple[list[Pass], int]:
    """Where some passes ran a decode-only kernel (the DSA indexer's paged logits), the passes that did not
    are prefill passes, also where their attention kernels share decode's names and graphs are off. Returns
    the passes relabelled and how many were marked beyond those a prefill kernel's name marked."""
    if not any(p.decode_only for p in passes):
        return passes, 0
    out = [p._replace(extend=p.extend or not p.decode_only) for p in passes]
    return out, sum(1 for p, q in zip(passes, out) if q.extend and not p.extend)


def _by_launch(passes: list[Pass]) -> tuple[list[Pass], int]:
    """Where no pass ran a prefill kernel known by name but some passes are CUDA-graph replays and others
    ran eagerly: SGLang replays graphs for decode batches only (prefill runs eagerly unless piecewise
    graphs are on), so the eager passes are the prefill ones. A decode batch above the graph limit runs
    eagerly too, but then every decode pass of a capture does, and no pass is a replay. Returns the
    passes relabelled and how many were marked."""
    if any(p.extend for p in passes) or not any(p.graphed for p in passes) or all(p.graphed for p in passes):
        return passes, 0
    out = [p._replace(extend=not p.graphed) for p in passes]
    return out, sum(1 for p in out if p.extend)


PASS_LENGTH_SPLIT = 2.0  # passes this many times longer than the next shorter ones are of another kind


def _by_length(passes: list[Pass]) -> tuple[list[Pass], int]:
    """Where no pass ran a prefill kernel known by name (a backend whose prefill kernels we cannot name, e.g.
    trtllm's DSA kernels), passes of two lengths are two kinds: the scheduler runs at most one prefill batch
    between decode passes (a chunked prompt continues in the next), so in a steady capture the decode passes
    are the larger group (the longer one on a tie). Returns the passes relabelled and how many were marked."""
    if len(passes) < 3 or any(p.extend for p in passes):
        return passes, 0
    lengths = sorted(p.end - p.start for p in passes)
    ratio, cut = max(((b / a if a > 0 else float("inf")), i) for i, (a, b) in enumerate(zip(lengths, lengths[1:])))
    if ratio < PASS_LENGTH_SPLIT:
        return passes, 0
    edge = lengths[cut + 1]  # the shortest pass of the longer group
    longer = len(lengths) - cut - 1
    decode_long = longer >= len(lengths) - longer
    out = [p._replace(extend=(p.end - p.start < edge) == decode_long) for p in passes]
    return out, sum(1 for p in out if p.extend)


class Mark(NamedTuple):
    """A pass annotation as the trace holds it: CPU-side (`user_annotation`) or GPU-side (`gpu_user_annotation`)."""

    start: float
    end: float
    label: Label
    ext: int | None  # Kineto's "External id": a GPU span's is its CPU annotation's
    gpu: bool
    name: str


class APass(NamedTuple):
    """An annotated pass: its label, its extent on the GPU timeline (None: no kernel of it seen), its CPU span."""

    label: Label
    window: tuple[float, float] | None
    cpu_us: float = 0.0


class Facts(NamedTuple):
    """What a pass's kernels say about it."""

    kernels: int = 0
    chunk: bool = False  # ran a kernel only prefill work runs (CHUNK_KERNEL)
    decodes: bool = False  # ran a kernel only decodes run (DECODES_KERNEL)
    graphed: bool = False  # one CUDA-graph replay ran most of its kernels (a full graph, not piecewise)


def _family(marks: list[Mark]) -> str | None:
    """The annotation family the passes are read from: one server's, in this order where a trace holds two
    (TraceLens' patched SGLang writes `execute_*` next to SGLang's own `step[...]`, traces.md §1.4)."""
    fams = {m.label.family for m in marks}
    return next((f for f in ("sglang", "vllm-detailed", "vllm-context", "vllm-new", "capture") if f in fams), None)


def _annotated_passes(marks: list[Mark], starts: list[float], ends: list[float], corrs: list[int | None],
                      launches: dict[int, float]) -> tuple[list[APass], str]:
    """One pass per annotation, placed on the GPU timeline.

    GPU-side spans first: Kineto writes one per stream a pass ran on (traces.md §0), so those of one CPU
    annotation (same External id; without ids, same name and overlapping) are one pass; a CPU annotation
    with an id but no GPU span is a pass that ran no kernel (an IDLE pass). Only CPU-side spans: each pass is
    measured on the GPU from the first to the last kernel its launches ran (kernel correlation -> its launch
    inside the span); a capture with Python stacks stretches the CPU span far past the GPU's work
    (profiling.md §4). Without launches either, the CPU spans themselves."""
    gpu = sorted((m for m in marks if m.gpu), key=lambda m: m.start)
    cpu = sorted((m for m in marks if not m.gpu), key=lambda m: m.start)
    if gpu:
        groups: dict[tuple[str, int], list[Any]] = {}
        last_of: dict[str, tuple[str, int]] = {}
        for m in gpu:
            if m.ext is not None:
                key = ("id", m.ext)
            else:
                prev = last_of.get(m.name)
                key = prev if prev is not None and m.start < groups[prev][2] else ("span", len(groups))
                last_of[m.name] = key
            g = groups.get(key)
            if g is None:
                groups[key] = [m.label, m.start, m.end]
            else:
                g[1], g[2] = min(g[1], m.start), max(g[2], m.end)
        out = [APass(g[0], (g[1], g[2])) for g in groups.values()]
        ids = {k[1] for k in groups if k[0] == "id"}
        if ids:
            out += [APass(m.label, None, m.end - m.start) for m in cpu if m.ext is not None and m.ext not in ids]
        return out, "gpu"
    if cpu and launches:
        cpu_starts = [m.start for m in cpu]
        ext: dict[int, list[float]] = {}
        for s, e, c in zip(starts, ends, corrs):
            t = launches.get(c) if c is not None else None
            if t is None:
                continue
            i = bisect.bisect_right(cpu_starts, t) - 1
            if i < 0 or t >= cpu[i].end:
                continue
            w = ext.setdefault(i, [s, e])
            w[0], w[1] = min(w[0], s), max(w[1], e)
        if ext:
            return [APass(m.label, (ext[i][0], ext[i][1]) if i in ext else None, m.end - m.start) for i, m in enumerate(cpu)], "cpu-launches"
    return [APass(m.label, (m.start, m.end), m.end - m.start) for m in cpu], "cpu"


def _facts(windows: list[tuple[float, float] | None], starts: list[float], names: list[str], corrs: list[int | None]) -> list[Facts]:
    """Each pass's kernel facts. A GPU activity in no pass (vLLM's sampler runs after `execute_model`, outside
    its annotation; a stray kernel before the first pass) is in none of them."""
    order = sorted((w[0], w[1], i) for i, w in enumerate(windows) if w is not None)
    w_starts = [w[0] for w in order]
    members: dict[int, list[int]] = {}
    for j, s in enumerate(starts):
        k = bisect.bisect_right(w_starts, s) - 1
        if k > 0 and s >= order[k][1] and s < order[k - 1][1]:  # two windows overlap: the earlier one holds it
            k -= 1
        if k >= 0 and s < order[k][1]:
            members.setdefault(order[k][2], []).append(j)
    unique = set(names)  # names are interned: each is matched once, not once per kernel
    chunk = {n for n in unique if CHUNK_KERNEL.search(n)}
    decodes = {n for n in unique if DECODES_KERNEL.search(n)}
    out = []
    for i in range(len(windows)):
        js = members.get(i, [])
        shared = Counter(corrs[j] for j in js if corrs[j] is not None).most_common(1)
        out.append(Facts(len(js), any(names[j] in chunk for j in js), any(names[j] in decodes for j in js),
                         bool(shared) and shared[0][1] >= 2 and 2 * shared[0][1] > len(js)))  # fmt: skip
    return out


def _decide_new_cached(passes: list[APass], facts: list[Facts]) -> tuple[list[APass], int, int]:
    """vLLM 0.11.1-0.13's `execute_new_N_cached_M` says how many requests are new, not whether a cached one
    decodes or continues a chunked prompt. Where the kernels tell, decide:
    - a chunk's prefill-only kernel and a decode-only kernel in one pass: mixed; a chunk's kernel alone: the
      pass holds prefill work (mixed or EXTEND); a decode kernel in a pass with new requests: mixed;
    - launches: under FULL_AND_PIECEWISE (vLLM's default) a uniform decode batch replays one full graph while
      a batch with prefill runs piecewise (traces.md §1.3). Where some pass with new requests ran piecewise or
      eagerly, a decode-or-chunk pass that is one full-graph replay is decode-only.
    Returns the passes relabelled and how many each way decided."""
    piecewise_prefill = any(p.label.prefill_requests and f.kernels and not f.graphed for p, f in zip(passes, facts))
    graphed_prefill = any(p.label.prefill_requests and f.graphed for p, f in zip(passes, facts))
    out, by_kernel, by_launch = [], 0, 0
    for p, f in zip(passes, facts):
        kind = p.label.kind
        if kind == "decode_or_chunk" and f.chunk:
            kind, by_kernel = ("mixed" if f.decodes else "mixed_or_extend"), by_kernel + 1
        elif kind == "decode_or_chunk" and f.graphed and piecewise_prefill and not graphed_prefill:
            kind, by_launch = "decode", by_launch + 1
        elif kind == "mixed_or_extend" and f.decodes:
            kind, by_kernel = "mixed", by_kernel + 1
        out.append(p._replace(label=p.label._replace(kind=kind)) if kind != p.label.kind else p)
    return out, by_kernel, by_launch


def _tokens(labels: list[Label]) -> dict[str, Any] | None:
    """Requests and tokens over passes whose annotation gives all four figures; None where none does."""
    full = [x for x in labels if None not in (x.prefill_requests, x.prefill_tokens, x.decode_requests, x.decode_tokens)]
    if not full:
        return None
    keys = ("prefill_requests", "prefill_tokens", "decode_requests", "decode_tokens")
    return {"passes": len(full), "of_passes": len(labels), **{k: sum(getattr(x, k) for x in full) for k in keys},
            "per_pass": [{k: getattr(x, k) for k in keys} for x in full[:16]]}  # fmt: skip


def _no_decode_note(kind: str | None, labels: list[Label], had_kernels: bool) -> str:
    """What a capture without a decode pass had broken down instead."""
    n = len(labels)
    if kind is None:
        return ("the capture holds no decode, mixed or EXTEND pass that ran a kernel: nothing to break down" if had_kernels
                else "the capture holds no decode pass")  # fmt: skip
    t = _tokens(labels)
    if kind == "extend":
        reqs = [x.prefill_requests for x in labels if x.prefill_requests is not None]
        toks = [x.prefill_tokens for x in labels if x.prefill_tokens is not None]
        what = f"{n} EXTEND pass(es)" + (f" ({sum(reqs)} request(s), {sum(toks)} token(s))" if len(reqs) == len(toks) == n else "")
        return f"the capture holds no decode pass: {what} broken down instead (prefill work, not a decode step)"
    if kind == "mixed":
        tok = (f": {t['prefill_requests']} prefill request(s) with {t['prefill_tokens']} token(s) and {t['decode_requests']} decode(s)"
               + (f" in {t['passes']} of them" if t["passes"] < n else "")) if t else ""
        return (f"the capture holds no decode pass: {n} mixed pass(es) (prefill chunks with decodes{tok}) broken down instead; "
                "their time includes the prefill chunks, so it is not a decode step's")  # fmt: skip
    if kind == "decode_or_chunk":
        return (f"no pass is known to be decode-only: {n} decode-or-chunk pass(es) broken down (vLLM 0.11.1-0.13 "
                "execute_new_0_cached_M: its cached requests decode or continue a chunked prompt, and neither the annotation "
                "nor the kernels tell which); any of them may hold prefill work")  # fmt: skip
    return (f"the capture holds no decode pass: {n} pass(es) of new requests with cached ones broken down instead (vLLM 0.11.1-0.13 "
            "execute_new_N_cached_M: mixed or EXTEND, not told apart); their time includes prefill work")  # fmt: skip


def _timeline_source(extend: int, by_length: int, by_launch: int, by_decode_kernel: int) -> str:
    if not extend:
        return "GPU timeline: passes split at the gaps between them; none ran a prefill-only kernel, all read as decode"
    how = []
    if extend - by_length - by_launch - by_decode_kernel > 0:
        how.append("their prefill-only kernels")
    if by_decode_kernel:
        how.append("lacking the DSA indexer's decode-only kernel")
    if by_launch:
        how.append("eager launches among CUDA-graph replays")
    if by_length:
        how.append("their length")
    return ("GPU timeline: passes split at the gaps between them; prefill passes told by " + ", ".join(how)
            + " (a mixed pass is not told from an EXTEND pass here)")


def analyze_rank(path: str | Path, classifier: Classifier, steps_hint: int | None = None, rank: int | None = None) -> RankProfile:
    """Stream one rank's trace once; keep only (start, end, bucket) per GPU activity and per-name totals."""
    meta = TraceMeta()
    starts: list[float] = []
    ends: list[float] = []
    names: list[str] = []
    cats: list[str] = []
    marks: list[Mark] = []
    labels: dict[str, Label | None] = {}  # one parse per annotation name
    interned: dict[str, str] = {}  # one string per kernel name, not one per event
    launches: dict[int, float] = {}  # correlation -> CPU time of the launch
    corrs: list[int | None] = []
    legacy = 0
    for ev in iter_events(path, meta=meta):
        cat = ev.get("cat")
        ts, dur = ev.get("ts"), ev.get("dur")
        if ev.get("ph") != "X" or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        if cat in LAUNCH_CATS:
            c = (ev.get("args") or {}).get("correlation") if isinstance(ev.get("args"), dict) else None
            if isinstance(c, int):
                launches[c] = float(ts)
            continue
        if cat in LEGACY_GPU_CATS:
            cat, legacy = LEGACY_GPU_CATS[cat], legacy + 1
        if cat in GPU_CATS:
            starts.append(float(ts))
            ends.append(float(ts) + float(dur))
            n = str(ev.get("name", ""))
            names.append(interned.setdefault(n, n))
            cats.append(cat)
            a = ev.get("args")
            c = a.get("correlation") if isinstance(a, dict) else None
            corrs.append(c if isinstance(c, int) else None)
        else:
            n = str(ev.get("name", ""))
            if n not in labels:
                labels[n] = pass_label(n)
            label = labels[n]
            if label is not None:
                a = ev.get("args")
                x = a.get("External id") if isinstance(a, dict) else None
                marks.append(Mark(float(ts), float(ts) + float(dur), label, x if isinstance(x, int) else None,
                                  cat == "gpu_user_annotation", n))  # fmt: skip
    extend_passes = by_length = by_launch = by_decode_kernel = 0
    cpu_span_us = 0.0
    kinds: Counter[str] = Counter()
    notes: list[str] = []
    mixed_tokens: dict[str, Any] | None = None
    breakdown_of: str | None = None
    family = _family(marks)
    if family:
        apasses, how = _annotated_passes([m for m in marks if m.label.family in (family, "capture")], starts, ends, corrs, launches)
        facts = _facts([p.window for p in apasses], starts, names, corrs)
        pass_source = FAMILY_SOURCE[family]
        if family == "vllm-new":
            apasses, by_k, by_l = _decide_new_cached(apasses, facts)
            if by_k or by_l:
                told = [f"{by_k} by their kernels"] * bool(by_k) + [f"{by_l} as full-graph replays beside piecewise prefill passes"] * bool(by_l)
                pass_source += "; " + " and ".join(told) + " told apart"
        kinds = Counter(p.label.kind for p in apasses)
        breakdown_of = next((k for k in BREAKDOWN_ORDER if any(p.label.kind == k and p.window for p in apasses)), None)
        chosen = [p for p in apasses if p.label.kind == breakdown_of and p.window]
        windows, source = _windows([p.window for p in chosen if p.window]), "spans"
        steps = len(chosen) if breakdown_of == "decode" else 0
        breakdown_passes = len(chosen)
        extend_passes = kinds["extend"] + kinds["mixed"] + kinds["mixed_or_extend"]
        if how == "cpu-launches":
            cpu_span_us = sum(p.cpu_us for p in chosen)
        if kinds["mixed"]:
            mixed_tokens = _tokens([p.label for p in apasses if p.label.kind == "mixed"])
        if breakdown_of != "decode":
            notes.append(_no_decode_note(breakdown_of, [p.label for p in chosen], any(f.kernels for f in facts)))
        if breakdown_of == "decode" and kinds["decode_or_chunk"]:
            notes.append(f"{kinds['decode_or_chunk']} decode-or-chunk pass(es) (cached requests only: decodes or later chunks of a "
                         "chunked prompt, not told apart) left out of the decode breakdown")  # fmt: skip
        if kinds["other"]:
            modes = Counter(p.label.mode for p in apasses if p.label.kind == "other")
            note = (f"{kinds['other']} pass(es) of other modes left out of the breakdown ("
                    + ", ".join(f"{m} x{c}" for m, c in modes.most_common()) + ")")
            if "TARGET_VERIFY" in modes and kinds["decode"]:  # 0.5.20+ labels the draft model's steps DRAFT (profile_utils.py:486-488)
                note += "; before SGLang 0.5.20 a draft model's steps carry their own mode, so decode passes here may include draft passes"
            notes.append(note)
    elif starts:
        passes, strays = _strays(_passes(starts, ends, names, corrs))
        if strays:
            notes.append(f"{strays} group(s) of at most {STRAY_MAX_KERNELS} kernels between passes read as no forward pass; left out")
        if any(p.decode_only for p in passes):
            passes, by_decode_kernel = _by_decode_kernel(passes)
        else:
            passes, by_launch = _by_launch(passes)
            if not by_launch:
                passes, by_length = _by_length(passes)
        decode = [(p.start, p.end) for p in passes if not p.extend]
        extend_passes = len(passes) - len(decode)
        # one segment with no prefill kernel: no boundary seen, so split the window into the steps asked for
        if (len(passes) > 1 or extend_passes) and (steps_hint is None or len(passes) <= 4 * steps_hint + 4):
            kinds = Counter(decode=len(decode), extend=extend_passes)
            pass_source = _timeline_source(extend_passes, by_length, by_launch, by_decode_kernel)
            if decode:
                windows, source, steps, breakdown_of = decode, "gaps", len(decode), "decode"
            else:  # no decode pass at all: 0 steps, the EXTEND passes broken down, and said so
                windows, source, steps, breakdown_of = [(p.start, p.end) for p in passes], "gaps", 0, "extend"
                notes.append(f"the capture holds no decode pass: {extend_passes} EXTEND pass(es) broken down instead (prefill work, not a decode step)")
            breakdown_passes = len(windows)
        else:
            steps = max(1, steps_hint or 1)
            windows, source, breakdown_passes, breakdown_of = [(min(starts), max(ends))], "window", steps, "decode"
            kinds = Counter(decode=steps)
            why = "no gap between passes" if len(passes) <= 1 else f"{len(passes)} segments, far more than the {steps_hint} passes asked for"
            pass_source = f"GPU timeline: passes not told apart ({why}); the capture's whole window split into {steps} step(s), read as decode"
    else:
        windows, source, steps, breakdown_passes, pass_source = [], "window", 0, 0, "no GPU activity"
    w_starts = [w[0] for w in windows]

    def inside(t: float) -> int:
        i = bisect.bisect_right(w_starts, t) - 1
        return i if i >= 0 and t < windows[i][1] else -1

    bucket_us = dict.fromkeys(BUCKETS, 0.0)
    per_name: dict[str, list[Any]] = {}
    backends: dict[str, float] = {}
    unclassified = 0.0
    kept: list[tuple[float, float]] = []
    durs: list[float] = []
    for s, e, n, c in zip(starts, ends, names, cats):
        wi = inside(s)
        if wi < 0:
            continue
        e = min(e, windows[wi][1])
        d = e - s
        match = classifier.classify(n, c)
        bucket_us[match.bucket] += d
        if not match.classified:
            unclassified += d
        if match.backend:
            backends[match.backend] = backends.get(match.backend, 0.0) + d
        entry = per_name.get(n)
        if entry is None:
            entry = per_name[n] = [0.0, 0, match.bucket]
        entry[0] += d
        entry[1] += 1
        kept.append((s, e))
        durs.append(d)
    kept.sort()
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in kept:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        busy += cur_e - cur_s
    window_us = sum(e - s for s, e in windows)
    top = sorted(per_name.items(), key=lambda kv: -kv[1][0])[:TOP_N]
    return RankProfile(
        rank=rank if rank is not None else (meta.rank if meta.rank is not None else (rank_of(path) or 0)),
        path=str(path),
        steps=steps,
        step_source=source,
        window_us=window_us,
        bucket_us=bucket_us,
        busy_us=busy,
        kernels=len(kept),
        median_kernel_us=statistics.median(durs) if durs else None,
        unclassified_us=unclassified,
        top=[
            {"name": n, "bucket": v[2], "ms_per_step": round(v[0] / max(1, breakdown_passes) / 1000, 3),
             "share": round(v[0] / window_us, 4) if window_us else 0.0, "calls_per_step": round(v[1] / max(1, breakdown_passes), 1),
             "mean_us": round(v[0] / v[1], 2)}
            for n, v in top
        ],  # fmt: skip
        backends=backends,
        export_end_us=max(ends) if ends else None,
        base_time_ns=meta.base_time_ns,
        fast_path=meta.fast_path,
        extend_passes=extend_passes,
        extend_by_length=by_length,
        extend_by_launch=by_launch,
        extend_by_decode_kernel=by_decode_kernel,
        python_functions=meta.python_functions,
        cpu_span_us=cpu_span_us,
        legacy_kernels=legacy,
        kernels_seen=len(starts),
        passes=dict(kinds),
        pass_source=pass_source,
        breakdown_of=breakdown_of,
        breakdown_passes=breakdown_passes,
        mixed_tokens=mixed_tokens,
        pass_notes=notes,
    )


@dataclass
class Profile:
    ranks: list[RankProfile] = field(default_factory=list)

    def summary(self, decode_only: bool = True) -> dict[str, Any]:
        """Per-rank summaries plus the over-ranks view the rules read (means; spread for stragglers).

        Of the ranks with decode steps; where none has one, `ranks` is 0 and the summary says what the
        capture held (`passes`, `notes`). With `decode_only=False`, a capture without a decode pass on any
        rank is summarised from the passes its ranks broke down instead (`breakdown_of`: BREAKDOWN_ORDER after decode)."""
        rs = [r for r in self.ranks if r.steps > 0]
        if not rs and not decode_only:
            broke = [r for r in self.ranks if r.breakdown_passes > 0 and r.window_us > 0]
            kind = Counter(r.breakdown_of for r in broke).most_common(1)
            rs = [r for r in broke if kind and r.breakdown_of == kind[0][0]]
        per_rank = [r.summary() for r in rs]
        if not rs:
            out: dict[str, Any] = {"ranks": 0, "per_rank": per_rank}
            if self.ranks:
                split = _majority_split(self.ranks)
                out.update(extend_passes=split.extend_passes, **split.pass_summary(), notes=list(split.pass_notes))
            return out
        shares = {b: round(statistics.fmean(p["shares"][b] for p in per_rank), 4) for b in BUCKETS}
        non_comm = [p["non_comm_ms_per_step"] for p in per_rank]
        mean_nc = statistics.fmean(non_comm)
        slow = max(per_rank, key=lambda p: p["non_comm_ms_per_step"])
        merged: dict[str, list[float]] = {}
        for r in rs:
            for t in r.top:
                merged.setdefault(t["name"], [0.0, 0.0, t["bucket"]])
                merged[t["name"]][0] += t["ms_per_step"]
                merged[t["name"]][1] += t["share"]
        top = sorted(merged.items(), key=lambda kv: -kv[1][0])[:TOP_N]
        backends: dict[str, float] = {}
        for r in rs:
            for b, us in r.backends.items():
                backends[b] = backends.get(b, 0.0) + us
        split = _majority_split(rs)
        return {
            "ranks": len(rs),
            "steps": split.steps,
            "step_source": split.step_source,
            "extend_passes": split.extend_passes,
            "extend_by_length": split.extend_by_length,
            "extend_by_launch": split.extend_by_launch,
            "extend_by_decode_kernel": split.extend_by_decode_kernel,
            "ranks_split_otherwise": sum(1 for r in rs if (r.steps, r.extend_passes) != (split.steps, split.extend_passes)),
            "step_ms": round(statistics.fmean(p["step_ms"] for p in per_rank), 3),
            "shares": shares,
            "idle_share": round(statistics.fmean(p["idle_share"] for p in per_rank), 4),
            "idle_ms_per_step": round(statistics.fmean(p["idle_ms_per_step"] for p in per_rank), 3),
            "kernels_per_step": round(statistics.fmean(p["kernels_per_step"] for p in per_rank), 1),
            "median_kernel_us": _median([p["median_kernel_us"] for p in per_rank]),
            "unclassified_share": round(max(p["unclassified_share"] for p in per_rank), 4),
            "straggler_spread": round((max(non_comm) - min(non_comm)) / mean_nc, 4) if mean_nc > 0 else 0.0,
            "slowest_rank": slow["rank"],
            "top": [
                {"name": n, "bucket": v[2], "ms_per_step": round(v[0] / len(rs), 3), "share": round(v[1] / len(rs), 4)}
                for n, v in top
            ],  # fmt: skip
            "backends": sorted(backends, key=lambda b: -backends[b]),
            **split.pass_summary(),
            "notes": list(split.pass_notes),
            "per_rank": per_rank,
        }


def prefill_split_note(s: dict[str, Any]) -> str:
    """How a capture's prefill passes were told apart from its decode passes (a rank's or a profile's summary),
    for every reader of the split: the profile probe's capture note and `runbook trace`."""
    if not s.get("extend_passes") or s.get("breakdown_of") not in (None, "decode"):
        return ""  # a breakdown of the prefill passes themselves: its note says so
    out = f"{s['extend_passes']} prefill pass(es) left out"
    kinds = s.get("passes") or {}
    if kinds.get("mixed") or kinds.get("mixed_or_extend"):
        parts = [f"{kinds[k]} {w}" for k, w in (("extend", "EXTEND"), ("mixed", "mixed"), ("mixed_or_extend", "mixed-or-EXTEND")) if kinds.get(k)]
        out += f" ({', '.join(parts)})"
    if s.get("extend_by_length"):
        out += (f" ({s['extend_by_length']} told apart by their length: this backend's prefill kernels are not known by name,"
                " and passes of two lengths are two kinds)")
    if s.get("extend_by_launch"):
        out += (f" ({s['extend_by_launch']} told apart as eager passes among CUDA-graph replays: the decode passes replay a graph,"
                " prefill runs eagerly)")
    if s.get("extend_by_decode_kernel"):
        out += (f" ({s['extend_by_decode_kernel']} told apart as passes without the DSA indexer's paged logits kernel,"
                " which only decode passes run)")
    return out


def _majority_split(ranks: list[RankProfile]) -> RankProfile:
    """The rank whose split of the capture into decode and prefill passes most ranks share.

    The ranks of a TP group run the same passes, but each is told apart on its own timeline: a pass whose
    length sits at the by-length boundary can fall on either side on different ranks. Counts taken
    rank by rank (the most steps from one rank, the most prefill passes from another) would describe
    more passes than were captured."""
    votes = Counter((r.steps, r.extend_passes) for r in ranks)
    best = max(votes.values())
    return next(r for r in ranks if votes[(r.steps, r.extend_passes)] == best)


def _median(values: list[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return round(statistics.median(vs), 2) if vs else None


def analyze(paths: list[str | Path], classifier: Classifier, steps_hint: int | None = None) -> Profile:
    """One streamed pass per rank file, one rank at a time (memory is one rank's kernels, not all ranks')."""
    ranks = [analyze_rank(p, classifier, steps_hint, rank_of(p)) for p in paths]
    ranks.sort(key=lambda r: r.rank)
    return Profile(ranks)
