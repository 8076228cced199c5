"""How much of a breakdown the bucket rules explain, and the kernels they do not.

Read from an analysis summary (a rank's `RankProfile.summary()` or the over-ranks `Profile.summary()`),
so the analysis itself stays as it is:

- `coverage`: the share of kernel time a bucket rule matched, 1 - `unclassified_share` (over ranks:
  the worst rank's, as `unclassified_share` is). Rules that file a known kernel under `other`
  (samplers, PyTorch elementwise kernels, kernel_buckets.yaml "classified, but none of the above")
  count as matched: the kernel is known, its bucket is `other` by choice.
- `top_unclassified`: the kernels no rule matched, most time first. A kernel no rule matches is counted
  in bucket `other` (rules.UNCLASSIFIED), as are the ones an `other` rule matched, so a `top` row in
  bucket `other` is asked of the classifier again. Only the summary's `top` rows (analysis.TOP_N per
  rank) are known by name; `unclassified_unlisted` is the unclassified kernel time outside them.

Shares: `share` is of the step wall, as every share in the breakdown; `kernel_share` is of kernel time,
as `coverage` is (kernels on several streams overlap, so the two differ).
"""

from __future__ import annotations

import statistics
from typing import Any

from .rules import UNCLASSIFIED, Classifier

TOP_UNCLASSIFIED = 5


def coverage(summary: dict[str, Any], classifier: Classifier) -> dict[str, Any]:
    """`coverage`, `top_unclassified` (name, ms_per_step, share, kernel_share) and `unclassified_unlisted`."""
    unclassified = float(summary.get("unclassified_share") or 0.0)
    kernel_over_wall = sum((summary.get("shares") or {}).values())  # kernel time over the step wall
    rows: list[dict[str, Any]] = []
    for t in summary.get("top") or []:
        if t.get("bucket") != UNCLASSIFIED or classifier.classify(str(t.get("name", ""))).classified:
            continue
        share = float(t.get("share") or 0.0)
        rows.append({"name": t["name"], "ms_per_step": t.get("ms_per_step"), "share": share,
                     "kernel_share": round(share / kernel_over_wall, 4) if kernel_over_wall > 0 else 0.0})  # fmt: skip
    per_rank = [float(p.get("unclassified_share") or 0.0) for p in summary.get("per_rank") or []]
    typical = statistics.fmean(per_rank) if per_rank else unclassified  # the listed shares are means over ranks
    listed = sum(r["kernel_share"] for r in rows)
    return {
        "coverage": round(max(0.0, 1.0 - unclassified), 4),
        "top_unclassified": rows[:TOP_UNCLASSIFIED],
        "unclassified_unlisted": round(max(0.0, typical - listed), 4) if unclassified > 0 else 0.0,
    }


def coverage_text(c: dict[str, Any], clean: Any = str) -> str:
    """One line: `coverage 93.1% of kernel time in a bucket; unclassified: a 4.0%, b 2.0% (+0.9% in kernels not listed)`.
    `clean` makes a kernel name safe for the output (names from a trace are data)."""
    out = f"coverage {c['coverage'] * 100:.1f}% of kernel time in a bucket"
    if c["coverage"] >= 1.0:
        return out + " (every kernel matched a rule)"
    names = ", ".join(f"{clean(r['name'])[:80]} {r['kernel_share'] * 100:.1f}%" for r in c["top_unclassified"])
    rest = c.get("unclassified_unlisted") or 0.0
    out += f"; unclassified: {names}" if names else "; unclassified kernels (none among the top kernels)"
    if names and rest >= 0.001:
        out += f" (+{rest * 100:.1f}% in kernels not listed)"
    return out
