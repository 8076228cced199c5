"""`runbook trace PATH...`: the decode-step breakdown for traces someone already took.

The same analysis `sglang.profile` runs on its own captures (`analysis.analyze_rank`), on files or
directories the user names. A file the analysis cannot use says why, in one line: not a readable Chrome
trace, or no GPU kernel events in it (a CPU-only capture, or a format whose kernel rows it does not know).

Every result says how much it explains and whose capture it is: its coverage and the top unclassified
kernels (coverage.py), and, where the trace holds autograd backward or optimizer ops, that it is not an
inference capture, its breakdown labelled as a training timeline's (workload.py).
Strings from a trace are data: the text output prints them as plain text on one line each, never markup
or terminal control (the CLI's stream scrubs escape sequences; `clean` also folds newlines and tabs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..scrub import plain
from .analysis import analyze_rank, prefill_split_note
from .coverage import coverage, coverage_text
from .parse import TraceError
from .rules import BUCKETS, Classifier
from .workload import workload

TRACE_GLOBS = ("*.json", "*.json.gz")
# the analysis's pass kinds (RankProfile.summary()["passes"]), in the order the text names them; a kind not
# listed here is still shown (by its key), after these
PASS_KINDS = ("decode", "extend", "mixed", "idle", "capture", "other", "decode_or_chunk", "mixed_or_extend")
PASS_WORDS = {"decode": "decode", "extend": "EXTEND", "mixed": "mixed", "idle": "IDLE", "capture": "graph-capture", "other": "other",
              "decode_or_chunk": "decode-or-chunk", "mixed_or_extend": "mixed-or-EXTEND"}  # fmt: skip
ALWAYS_SHOWN = ("decode", "extend", "mixed")  # the rest only when the capture has some
STEP_NOUN = {"decode": "decode step(s)", "mixed": "mixed pass(es)", "extend": "prefill (EXTEND) pass(es)",
             "decode_or_chunk": "decode-or-prefill-chunk pass(es)", "mixed_or_extend": "mixed-or-EXTEND pass(es)"}  # fmt: skip
TRAINING_NOUN = "segment(s) of a training timeline, read as if decode steps"


def clean(text: Any) -> str:
    """A string from a trace as one line of plain text: no escape sequences, no newline or tab to fake a line."""
    return " ".join(plain(str(text)).replace("\t", " ").splitlines()) if text is not None else ""


def expand(paths: list[str]) -> tuple[list[Path], list[dict[str, Any]]]:
    """Files to read (a directory: its *.json and *.json.gz files, sorted) and the paths that are neither."""
    files: list[Path] = []
    missing: list[dict[str, Any]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted({f for g in TRACE_GLOBS for f in p.glob(g) if f.is_file()})
            if not found:
                missing.append({"path": raw, "ok": False, "reason": "directory holds no *.json or *.json.gz trace"})
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            missing.append({"path": raw, "ok": False, "reason": "no such file or directory"})
    return files, missing


def breakdown_label(s: dict[str, Any], work: dict[str, Any] | None) -> str:
    """What the breakdown's steps are: decode steps, or the passes the analysis broke down (`breakdown_of`),
    or, in a training capture, segments of its timeline that the inference reading calls steps."""
    if work and work.get("kind") == "training":
        return TRAINING_NOUN
    return STEP_NOUN.get(str(s.get("breakdown_of") or "decode"), "decode step(s)")


def describe_file(path: Path, cls: Classifier) -> dict[str, Any]:
    """One trace's breakdown, or `ok: false` with the reason."""
    try:
        rank = analyze_rank(path, cls)
    except TraceError as exc:
        return {"path": str(path), "ok": False, "reason": str(exc)}
    except OSError as exc:
        return {"path": str(path), "ok": False, "reason": f"{path}: {exc.strerror or exc}"}
    if rank.kernels_seen == 0:
        return {"path": str(path), "ok": False, "reason": (
            f"{path}: no GPU kernel events found (categories kernel, gpu_memcpy, gpu_memset, or the older Kernel/Memcpy/Memset): "
            "a CPU-only capture, or a trace format this analysis does not know; there is no step to break down")}  # fmt: skip
    work = workload([path])
    if rank.per_step == 0 or rank.window_us <= 0:  # per_step: the passes broken down (decode, else mixed, EXTEND)
        why = "only prefill (EXTEND) passes" if rank.extend_passes else "no decode step"
        out = {"path": str(path), "ok": False, "reason": f"{path}: {rank.kernels_seen} GPU events but {why} to break down", "workload": work}
        if work["kind"] == "training":
            out["reason"] += f"; {work['says']}"
        return out
    s = rank.summary()
    return {"path": str(path), "ok": True, **s, **coverage(s, cls), "workload": work, "breakdown_label": breakdown_label(s, work)}


def describe(paths: list[str], cls: Classifier) -> dict[str, Any]:
    files, bad = expand(paths)
    results = [describe_file(f, cls) for f in files] + bad
    return {"traces": results, "ok": bool(results) and all(r["ok"] for r in results)}


def passes_text(s: dict[str, Any]) -> str:
    """`passes: 6 decode, 1 EXTEND, 0 mixed (SGLang step spans); breakdown of the decode passes`, where the
    analysis counts pass kinds (`passes`, `pass_source`, `breakdown_of`); empty where it does not."""
    passes = s.get("passes")
    if not isinstance(passes, dict) or not passes:
        return ""
    kinds = [k for k in PASS_KINDS if k in passes] + [k for k in passes if k not in PASS_KINDS]
    parts = [f"{_count(passes[k])} {PASS_WORDS.get(k, clean(k))}" for k in kinds if k in ALWAYS_SHOWN or passes[k]]
    out = "passes: " + ", ".join(parts)
    if s.get("pass_source"):
        out += f" ({clean(s['pass_source'])})"
    if s.get("breakdown_of"):
        out += f"; breakdown of the {PASS_WORDS.get(str(s['breakdown_of']), clean(s['breakdown_of']))} passes"
    tokens = s.get("mixed_tokens")
    if isinstance(tokens, dict) and tokens.get("passes"):  # analysis._tokens: sums over the passes annotated with all four
        out += (f"; the mixed passes carried {_count(tokens.get('prefill_tokens'))} prefill token(s) of {_count(tokens.get('prefill_requests'))} "
                f"request(s) and {_count(tokens.get('decode_tokens'))} decode token(s) of {_count(tokens.get('decode_requests'))} request(s)"
                f" ({_count(tokens['passes'])} of {_count(tokens.get('of_passes'))} passes annotated with them)")  # fmt: skip
    elif isinstance(tokens, (int, float)) and not isinstance(tokens, bool) and tokens:
        out += f"; {tokens:g} token(s) in the mixed passes"
    return out


def _count(v: Any) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else clean(v)


def render_text(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    for r in doc["traces"]:
        lines.append(clean(r["path"]))
        if not r["ok"]:
            lines.append(f"  error: {clean(r['reason'])}")
            continue
        work = r.get("workload") or {}
        if work.get("kind") == "training":
            ex = "; e.g. " + ", ".join(clean(e)[:80] for e in work.get("examples") or []) if work.get("examples") else ""
            lines.append(f"  {clean(work['says'])}{ex}")
            lines.append("  the breakdown below reads its GPU timeline as an inference server's: its steps are not decode steps")
        noun = r.get("breakdown_label") or "decode step(s)"
        unit = "step" if noun in (STEP_NOUN["decode"], TRAINING_NOUN) else "pass"
        lines.append(f"  rank {r['rank']}: {r.get('breakdown_passes') or r['steps']} {noun} ({clean(r['step_source'])}), {r['step_ms']:.3f} ms per {unit}, "
                     f"{r['kernels_per_step']:g} kernels per {unit}" + (f", {split}" if (split := prefill_split_note(r)) else ""))  # fmt: skip
        if kinds := passes_text(r):
            lines.append(f"  {kinds}" if work.get("kind") != "training" else f"  as an inference server's, {kinds}")
        shares = ", ".join(f"{b} {r['shares'][b] * 100:.1f}%" for b in BUCKETS if r["shares"][b] >= 0.001)
        lines.append(f"  shares: {shares}; idle {r['idle_share'] * 100:.1f}%")
        lines.append(f"  {coverage_text(r, clean)}")
        for note in r.get("notes") or []:
            lines.append(f"  note: {clean(note)}")
        for t in r["top"][:5]:
            lines.append(f"    {t['share'] * 100:5.1f}%  {t['bucket']:<14} {clean(t['name'])[:100]}")
    return "\n".join(lines)
