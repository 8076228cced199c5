"""How deep a run goes (`--depth quick|standard|deep`): what each tier runs, and what it leaves out.

On a production server an operator first wants a passive look in seconds (is anything obviously wrong
right now?) and the full investigation only when that says so. Hypotheses declare what judging them
needs (`needs: [load, profile, sweep]`; the calls their rules read add theirs: an `under_load` call
needs load, a probe with `needs = "profile"` a profile); the tier decides what runs:

- quick: no load driven, no profile, no sweep; under-load probes sample the server's own traffic for
  a few seconds; a verdict that needs load says it was judged without one, and the run names the
  command for the next tier.
- standard: today's run (the runbook's load, its profile, its sweep).
- deep: standard with the runbook's `depths.deep` params (a longer profile, a longer window).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Iterable

DEPTHS = ("quick", "standard", "deep")
NEEDS = ("load", "profile", "sweep")
QUICK_SAMPLE_S = 3.0  # how long under-load probes sample at quick: a look, not a measurement window


@dataclass(frozen=True)
class Tier:
    name: str
    drives_load: bool  # the runbook's load runs
    runs: frozenset[str]  # which probe needs run (a probe with no `needs` always runs)
    sample_cap_s: float | None  # under-load sampling is cut to this (None: as the runbook says)
    what: str  # for the report: what this tier did


TIERS = {
    "quick": Tier("quick", False, frozenset(), QUICK_SAMPLE_S,
                  f"a passive look: no load driven, no profile, no sweep; {QUICK_SAMPLE_S:g} s of sampling of the server's own traffic"),
    "standard": Tier("standard", True, frozenset({"profile", "sweep"}), None,
                     "the runbook's load, steady state, sampling window, profile and sweep"),
    "deep": Tier("deep", True, frozenset({"profile", "sweep"}), None,
                 "standard with the runbook's deep params (a longer profile and window)"),
}


def tier(name: str) -> Tier:
    if name not in TIERS:
        raise ValueError(f"unknown depth '{name}' (depths: {', '.join(DEPTHS)})")
    return TIERS[name]


def next_depth(name: str) -> str | None:
    """The tier after `name`, or None at the deepest."""
    i = DEPTHS.index(name)
    return DEPTHS[i + 1] if i + 1 < len(DEPTHS) else None


def call_need(under_load: bool, probe_needs: str | None) -> set[str]:
    """What one probe call needs: a profile or a sweep as its probe declares, load when it samples under load."""
    out = {probe_needs} if probe_needs else set()
    if under_load:
        out.add("load")
    return out


def note(needs: Iterable[str], depth: str, not_run: Iterable[str] = ()) -> str:
    """What a verdict at this depth lacks, in words ("" when nothing): it is shown with the verdict."""
    t = tier(depth)
    lacking = []
    if "load" in needs and not t.drives_load:
        lacking.append("load (judged on the server's own traffic)")
    lacking.extend(f"a {n} (not run)" for n in sorted(set(needs) - {"load"}) if n not in t.runs or n in not_run)
    if not lacking:
        return ""
    deeper = next_depth(depth) or depth
    return f"needs {', '.join(lacking)} at --depth {depth}: --depth {deeper} measures it"


def params_for(runbook_depths: dict[str, dict[str, Any]], depth: str) -> dict[str, Any]:
    """The params a tier sets (the runbook's `depths` for it); `--set` still wins over them."""
    return dict(runbook_depths.get(depth) or {})


def next_command(runbook: str, depth: str, *, simulate: str | None = None, sglang_url: str | None = None,
                 sets: Iterable[str] = (), probes_dirs: Iterable[str] = ()) -> str | None:  # fmt: skip
    """The command for the next tier with the same target and params (never the API key), or None at the deepest."""
    deeper = next_depth(depth)
    if deeper is None:
        return None
    words = ["runbook", "run", runbook, "--depth", deeper]
    if simulate:
        words += ["--simulate", simulate]
    elif sglang_url:
        words += ["--server-url", sglang_url]
    for item in sets:
        words += ["--set", item]
    for d in probes_dirs:
        words += ["--probes-dir", d]
    return shlex.join(words)
