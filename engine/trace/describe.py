"""`runbook trace PATH...`: the decode-step breakdown for traces someone already took.

The same analysis `sglang.profile` runs on its own captures (`analysis.analyze_rank`), on files or
directories the user names. A file the analysis cannot use says why, in one line: not a readable Chrome
trace, or no GPU kernel events in it (a CPU-only capture, or a format whose kernel rows it does not know).
Strings from a trace are data: the text output prints them as plain text, never markup.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .analysis import analyze_rank, prefill_split_note
from .parse import TraceError
from .rules import BUCKETS, Classifier

TRACE_GLOBS = ("*.json", "*.json.gz")


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
    if rank.steps == 0 or rank.window_us <= 0:
        why = "only prefill (EXTEND) passes" if rank.extend_passes else "no decode step"
        return {"path": str(path), "ok": False, "reason": f"{path}: {rank.kernels_seen} GPU events but {why} to break down"}
    return {"path": str(path), "ok": True, **rank.summary()}


def describe(paths: list[str], cls: Classifier) -> dict[str, Any]:
    files, bad = expand(paths)
    results = [describe_file(f, cls) for f in files] + bad
    return {"traces": results, "ok": bool(results) and all(r["ok"] for r in results)}


def render_text(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    for r in doc["traces"]:
        lines.append(r["path"])
        if not r["ok"]:
            lines.append(f"  error: {r['reason']}")
            continue
        lines.append(f"  rank {r['rank']}: {r['steps']} decode step(s) ({r['step_source']}), {r['step_ms']:.3f} ms per step, "
                     f"{r['kernels_per_step']:g} kernels per step" + (f", {split}" if (split := prefill_split_note(r)) else ""))  # fmt: skip
        shares = ", ".join(f"{b} {r['shares'][b] * 100:.1f}%" for b in BUCKETS if r["shares"][b] >= 0.001)
        lines.append(f"  shares: {shares}; idle {r['idle_share'] * 100:.1f}%; unclassified {r['unclassified_share'] * 100:.1f}% of kernel time")
        for note in r.get("notes") or []:
            lines.append(f"  note: {note}")
        for t in r["top"][:5]:
            lines.append(f"    {t['share'] * 100:5.1f}%  {t['bucket']:<14} {t['name'][:100]}")
    return "\n".join(lines)
