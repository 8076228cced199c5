"""`runbook trace --compare BEFORE AFTER`: two captures (before and after a change), bucket by bucket and
pass kind by pass kind, as `runbook diff` compares two runs.

Each side is one capture: a trace file, or a directory of its ranks' files, analysed over ranks as
`sglang.profile` analyses its own (`analysis.Profile.summary()`: shares are means over ranks). A file
in the directory that is not a readable trace (the `server_args.json` that `python -m sglang.profiler`
writes beside the traces, profiling.md §6.4) is left out and named in the notes. What it says, in order: whether the two are comparable (an inference capture on both sides, the
same passes broken down, the same number of ranks, the steps told apart the same way, the rules covering
both); the step time; pass kinds before -> after; each bucket's share of the step and its ms per step;
the kernels whose time moved most (among each side's top kernels); each side's coverage.

One capture a side carries no noise estimate (a capture is a few steps); the changes are the numbers,
not a verdict on them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .analysis import Profile, analyze_rank, rank_of
from .coverage import coverage, coverage_text
from .describe import ALWAYS_SHOWN, PASS_KINDS, PASS_WORDS, breakdown_label, clean, expand
from .parse import TraceError
from .rules import BUCKETS, Classifier
from .workload import workload

LOW_COVERAGE = 0.9  # below this, a share moving may be a kernel moving between known and unknown
MOVERS = 5


def side(path: str, cls: Classifier) -> dict[str, Any]:
    """One capture's summary over its ranks, with coverage and workload; `ok: false` with the reason."""
    files, bad = expand([path])
    if bad:
        return {"path": path, "ok": False, "reason": f"{path}: {bad[0]['reason']}"}
    ranks, skipped = [], []
    for f in files:
        try:
            ranks.append(analyze_rank(f, cls, None, rank_of(f)))
        except TraceError as exc:
            skipped.append(str(exc))
        except OSError as exc:
            skipped.append(f"{f}: {exc.strerror or exc}")
    if not ranks:
        return {"path": path, "ok": False, "reason": skipped[0] if len(skipped) == 1 else "; ".join(skipped[:3])}
    prof = Profile(sorted(ranks, key=lambda r: r.rank))
    files = [Path(r.path) for r in prof.ranks]
    s = prof.summary(decode_only=False)  # a capture without a decode pass: its mixed, else EXTEND passes (breakdown_of)
    base: dict[str, Any] = {"path": path, "files": [str(f) for f in files], "skipped": skipped}
    empty = [r.path for r in prof.ranks if r.kernels_seen == 0]
    if empty:  # a rank with no kernel rows would count as a rank with no GPU time in the means
        return {**base, "ok": False, "reason": f"{empty[0]}: no GPU kernel events found (a CPU-only capture, or a trace format this analysis does not know)"}
    work = workload(files)
    if not s.get("ranks") or not s.get("step_ms"):
        why = "; ".join(s.get("notes") or []) or "no decode, mixed or EXTEND pass with kernel time to break down"
        return {**base, "ok": False, "reason": f"{path}: {why}" + (f"; {work['says']}" if work["kind"] == "training" else ""), "workload": work}
    cov = coverage(s, cls)  # before per_rank goes: the unlisted unclassified time is read from the ranks
    s.pop("per_rank", None)
    return {**base, "ok": True, **s, **cov, "workload": work, "breakdown_label": breakdown_label(s, work)}


def _passes(s: dict[str, Any]) -> dict[str, Any]:
    """Pass kinds -> count: the analysis's `passes` where it counts them, else decode steps and prefill passes."""
    if isinstance(s.get("passes"), dict):
        return dict(s["passes"])
    return {"decode": s.get("steps", 0), "extend": s.get("extend_passes", 0)}


def compare(before: str, after: str, cls: Classifier) -> dict[str, Any]:
    b, a = side(before, cls), side(after, cls)
    doc: dict[str, Any] = {"before": b, "after": a, "ok": b["ok"] and a["ok"]}
    notes = [f"{name}: {clean(s['workload']['says'])}" for name, s in (("before", b), ("after", a))
             if (s.get("workload") or {}).get("kind") == "training"]  # fmt: skip
    if not doc["ok"]:
        doc.update(comparable=False, notes=notes + [f"{n}: {s['reason']}" for n, s in (("before", b), ("after", a)) if not s["ok"]])
        return doc
    kind_b, kind_a = b.get("breakdown_of") or "decode", a.get("breakdown_of") or "decode"
    if kind_b != kind_a:
        notes.append(f"before breaks down its {PASS_WORDS.get(kind_b, kind_b)} passes, after its {PASS_WORDS.get(kind_a, kind_a)} passes: not the same work")
    if b["ranks"] != a["ranks"]:
        notes.append(f"before has {b['ranks']} rank(s), after {a['ranks']}: shares are means over each side's ranks")
    if b["step_source"] != a["step_source"]:
        notes.append(f"steps told apart differently: before by {b['step_source']}, after by {a['step_source']}")
    for name, s in (("before", b), ("after", a)):
        if s["coverage"] < LOW_COVERAGE:
            notes.append(f"{name}: only {s['coverage'] * 100:.1f}% of kernel time is in a bucket; a share moving may be kernels moving in or out of 'other'")
    notes += [f"{name}: {n}" for name, s in (("before", b), ("after", a)) for n in s.get("notes") or []]  # the analysis's own caveats
    notes += [f"{name}: a file left out: {why}" for name, s in (("before", b), ("after", a)) for why in s.get("skipped") or []]
    comparable = not any((s["workload"] or {}).get("kind") == "training" for s in (b, a)) and kind_b == kind_a
    pb, pa = _passes(b), _passes(a)
    kinds = [k for k in PASS_KINDS if k in pb or k in pa] + sorted({*pb, *pa} - set(PASS_KINDS))
    buckets = []
    for bucket in (*BUCKETS, "idle"):
        sb = b["idle_share"] if bucket == "idle" else b["shares"][bucket]
        sa = a["idle_share"] if bucket == "idle" else a["shares"][bucket]
        mb, ma = round(sb * b["step_ms"], 3), round(sa * a["step_ms"], 3)
        buckets.append({"bucket": bucket, "before_share": sb, "after_share": sa, "change_share": round(sa - sb, 4),
                        "before_ms_per_step": mb, "after_ms_per_step": ma, "change_ms_per_step": round(ma - mb, 3)})  # fmt: skip
    doc.update(
        comparable=comparable,
        notes=notes,
        step_ms={"before": b["step_ms"], "after": a["step_ms"], "change": round(a["step_ms"] / b["step_ms"] - 1, 4) if b["step_ms"] else None},
        passes=[{"kind": k, "before": pb.get(k), "after": pa.get(k)} for k in kinds],
        buckets=buckets,
        coverage={"before": b["coverage"], "after": a["coverage"]},
        backends={"added": [x for x in a["backends"] if x not in b["backends"]], "gone": [x for x in b["backends"] if x not in a["backends"]]},
        kernels=_movers(b["top"], a["top"]),
    )
    return doc


def _movers(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kernels whose ms per step moved most, among each side's top kernels; a kernel outside one side's
    top list has no number there (null): it ran less than that side's last listed kernel, or not at all."""
    tb, ta = {t["name"]: t for t in before}, {t["name"]: t for t in after}
    rows = []
    for name in dict.fromkeys([*tb, *ta]):
        mb = tb[name]["ms_per_step"] if name in tb else None
        ma = ta[name]["ms_per_step"] if name in ta else None
        bucket = (tb.get(name) or ta[name])["bucket"]
        change = round(ma - mb, 3) if mb is not None and ma is not None else None
        rows.append({"name": name, "bucket": bucket, "before_ms_per_step": mb, "after_ms_per_step": ma, "change_ms_per_step": change})
    rows.sort(key=lambda r: -abs(r["change_ms_per_step"] if r["change_ms_per_step"] is not None else (r["before_ms_per_step"] or r["after_ms_per_step"] or 0.0)))
    return rows[:MOVERS]


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def render_text(doc: dict[str, Any]) -> str:
    b, a = doc["before"], doc["after"]
    lines = [f"before: {clean(b['path'])}" + (f" ({len(b['files'])} file(s), {b['ranks']} rank(s))" if b["ok"] else ""),
             f"after:  {clean(a['path'])}" + (f" ({len(a['files'])} file(s), {a['ranks']} rank(s))" if a["ok"] else "")]  # fmt: skip
    if not doc["ok"]:
        lines += [f"  error: {clean(n)}" for n in doc["notes"]]
        return "\n".join(lines)
    lines.append("comparable: " + ("yes" if doc["comparable"] else "no") + ("" if doc["notes"] else " (no caveat)"))
    lines += [f"  note: {clean(n)}" for n in doc["notes"]]
    st = doc["step_ms"]
    change = f" ({st['change'] * 100:+.1f}%)" if st["change"] is not None else ""
    noun_b, noun_a = b["breakdown_label"], a["breakdown_label"]
    lines.append(f"step: {st['before']:.3f} ms -> {st['after']:.3f} ms{change}  [{noun_b}" + ("" if noun_a == noun_b else f" -> {noun_a}") + "]")
    lines.append("passes:        before    after")
    for p in doc["passes"]:
        if p["kind"] not in ALWAYS_SHOWN and not p["before"] and not p["after"]:
            continue
        lines.append(f"  {PASS_WORDS.get(p['kind'], clean(p['kind'])):<12}{_cnt(p['before']):>7}  {_cnt(p['after']):>7}")
    lines.append("bucket          share before -> after  (change)     ms/step before -> after  (change)")
    for r in doc["buckets"]:
        if max(r["before_share"], r["after_share"]) < 0.001:
            continue
        pt = f"({r['change_share'] * 100:+.1f} pt)"
        lines.append(f"  {r['bucket']:<14}{_pct(r['before_share']):>7} -> {_pct(r['after_share']):>6}  {pt:<11}"
                     f"  {r['before_ms_per_step']:>9.3f} -> {r['after_ms_per_step']:.3f}  ({r['change_ms_per_step']:+.3f})")  # fmt: skip
    lines.append(f"coverage: {_pct(doc['coverage']['before'])} -> {_pct(doc['coverage']['after'])} of kernel time in a bucket")
    for name, s in (("before", b), ("after", a)):
        if s["top_unclassified"]:
            lines.append(f"  {name}: {coverage_text(s, clean)}")
    if doc["backends"]["added"] or doc["backends"]["gone"]:
        lines.append("backends: " + ", ".join([f"+{clean(x)}" for x in doc["backends"]["added"]] + [f"-{clean(x)}" for x in doc["backends"]["gone"]]))
    if doc["kernels"]:
        lines.append("kernels that moved most (ms per step; '-': not among that side's top kernels):")
        for k in doc["kernels"]:
            ch = f" ({k['change_ms_per_step']:+.3f})" if k["change_ms_per_step"] is not None else ""
            lines.append(f"  {_ms(k['before_ms_per_step']):>8} -> {_ms(k['after_ms_per_step']):<8}{ch:<11} {k['bucket']:<14} {clean(k['name'])[:90]}")
    return "\n".join(lines)


def _cnt(v: Any) -> str:
    return "-" if v is None else (f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else clean(v))
