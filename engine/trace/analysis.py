"""Where a decode step's GPU time goes, per rank and over ranks, from streamed Kineto traces.

Definitions follow shared/reference/profiling.md §10: the step window is each `step[DECODE ...]`
span (SGLang 0.5.11+), else the capture's first-to-last GPU activity split into the number of
steps asked for; a bucket's share is its kernel time over the step wall; GPU idle is the step wall
minus the union of all kernel intervals (all streams); stragglers are the spread of per-rank
non-communication time, since under TP every rank waits in the all-reduce for the slowest.
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

STEP_SPAN = re.compile(r"^step\[\s*([A-Za-z_]+)", re.IGNORECASE)
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

    def notes(self) -> list[str]:
        """What a reader must know to trust the numbers: the format read, and the profiler's own overhead."""
        out = []
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
    def step_us(self) -> float:
        return self.window_us / self.steps if self.steps else 0.0

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
            "idle_ms_per_step": round(max(0.0, self.window_us - self.busy_us) / max(1, self.steps) / 1000, 3),
            "kernels_per_step": round(self.kernels / max(1, self.steps), 1),
            "median_kernel_us": None if self.median_kernel_us is None else round(self.median_kernel_us, 2),
            "unclassified_share": round(self.unclassified_us / kernel_us, 4) if kernel_us else 0.0,
            "non_comm_ms_per_step": round((kernel_us - self.bucket_us.get("communication", 0.0)) / max(1, self.steps) / 1000, 3),
            "top": self.top,
            "backends": sorted(self.backends, key=lambda b: -self.backends[b]),
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


def _gpu_windows(cpu: list[tuple[float, float]], starts: list[float], ends: list[float], corrs: list[int | None],
                 launches: dict[int, float]) -> list[tuple[float, float]]:
    """Each CPU step span's GPU extent: first start to last end of the kernels launched inside it."""
    cpu_starts = [w[0] for w in cpu]
    out: dict[int, list[float]] = {}
    for s, e, c in zip(starts, ends, corrs):
        t = launches.get(c) if c is not None else None
        if t is None:
            continue
        i = bisect.bisect_right(cpu_starts, t) - 1
        if i < 0 or t >= cpu[i][1]:
            continue
        w = out.setdefault(i, [s, e])
        w[0], w[1] = min(w[0], s), max(w[1], e)
    return [(w[0], w[1]) for _, w in sorted(out.items())]


class Pass(NamedTuple):
    """A forward pass on the GPU timeline (µs): a prefill (EXTEND) pass or not, a CUDA-graph replay or not."""

    start: float
    end: float
    extend: bool
    graphed: bool
    decode_only: bool = False  # ran a kernel only decode passes run (DECODE_KERNEL)


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
    return Pass(start, end, ext, graphed, any(DECODE_KERNEL.search(names[j]) for j in members))


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


def analyze_rank(path: str | Path, classifier: Classifier, steps_hint: int | None = None, rank: int | None = None) -> RankProfile:
    """Stream one rank's trace once; keep only (start, end, bucket) per GPU activity and per-name totals."""
    meta = TraceMeta()
    starts: list[float] = []
    ends: list[float] = []
    names: list[str] = []
    cats: list[str] = []
    gpu_spans: list[tuple[float, float]] = []
    cpu_spans: list[tuple[float, float]] = []
    interned: dict[str, str] = {}  # one string per kernel name, not one per event
    ext_spans = [0, 0]  # prefill-class step spans (GPU, CPU)
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
            m = STEP_SPAN.match(str(ev.get("name", "")))
            if m and m.group(1).upper() == "DECODE":
                (gpu_spans if cat == "gpu_user_annotation" else cpu_spans).append((float(ts), float(ts) + float(dur)))
            elif m and m.group(1).upper() in ("EXTEND", "MIXED", "PREFILL"):
                ext_spans[0 if cat == "gpu_user_annotation" else 1] += 1
    spans = gpu_spans or cpu_spans
    extend_passes = by_length = by_launch = by_decode_kernel = 0
    cpu_span_us = 0.0
    if not gpu_spans and cpu_spans and launches:
        # Only CPU-side step spans: measure each step on the GPU timeline, from the first to the last kernel
        # the step's launches ran (kernel correlation -> its cudaLaunchKernel inside the span). A capture with
        # Python stacks stretches the CPU span many times past the GPU's work (profiling.md §4).
        cpu_span_us = sum(e - s for s, e in _windows(cpu_spans))
        gpu_side = _gpu_windows(_windows(cpu_spans), starts, ends, corrs, launches)
        if gpu_side:
            spans = gpu_side
    if spans:
        windows, source, steps = _windows(spans), "spans", len(spans)
        extend_passes = ext_spans[0] if gpu_spans else ext_spans[1]
    elif starts:
        passes = _passes(starts, ends, names, corrs)
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
            windows, source, steps = decode, "gaps", len(decode)  # no decode pass at all: 0 steps, said by the caller
        else:
            windows, source, steps = [(min(starts), max(ends))], "window", max(1, steps_hint or 1)
    else:
        windows, source, steps = [], "window", 0
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
            {"name": n, "bucket": v[2], "ms_per_step": round(v[0] / max(1, steps) / 1000, 3),
             "share": round(v[0] / window_us, 4) if window_us else 0.0, "calls_per_step": round(v[1] / max(1, steps), 1),
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
    )


@dataclass
class Profile:
    ranks: list[RankProfile] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Per-rank summaries plus the over-ranks view the rules read (means; spread for stragglers)."""
        rs = [r for r in self.ranks if r.steps > 0]
        per_rank = [r.summary() for r in rs]
        if not rs:
            return {"ranks": 0, "per_rank": per_rank}
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
            "per_rank": per_rank,
        }


def prefill_split_note(s: dict[str, Any]) -> str:
    """How a capture's prefill passes were told apart from its decode passes (a rank's or a profile's summary),
    for every reader of the split: the profile probe's capture note and `runbook trace`."""
    if not s.get("extend_passes"):
        return ""
    out = f"{s['extend_passes']} prefill pass(es) left out"
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
