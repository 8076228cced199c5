"""How deep a run goes (`--depth quick|standard|deep`): what each tier runs, and what it leaves out.

On a production server an operator first wants a passive look in seconds (is anything obviously wrong
right now?) and the full investigation only when that says so. Hypotheses declare what judging them
needs (`needs: [load, profile, sweep]`; the calls their rules read add theirs: an `under_load` call
needs load, a probe with `needs = "profile"` a profile); the tier decides what runs:

- quick: no load driven, no profile, no sweep; under-load probes sample the server's own traffic for
  a few seconds; a verdict that needs load says it was judged without one, and the run names the
  command for the next tier.
- standard: today's run (the runbook's load, its profile, its sweep).
- deep: standard with the runbook's `depths.deep` params (a longer profile, a longer window), plus the
  hypotheses that declare `needs: [deep]` (power-starvation's concurrency sweep): a need no call adds,
  only a hypothesis declares, and it holds for all of that hypothesis's calls. Below deep the runner
  leaves those calls out (`unavailable: not run at --depth standard`) and the hypothesis is `skipped`
  with a depth note naming `--depth deep`; so a standard run stays as short as before.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Iterable

DEPTHS = ("quick", "standard", "deep")
NOT_AT_DEPTH = "not run at --depth"  # the reason a call carries when the run's depth leaves it out
NEEDS = ("load", "profile", "sweep", "deep")
WHOLE = frozenset({"deep"})  # needs a hypothesis declares for every call it makes (no probe declares them)
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
    "deep": Tier("deep", True, frozenset({"profile", "sweep", "deep"}), None,
                 "standard with the runbook's deep params (a longer profile and window) and its deep-only hypotheses (the concurrency sweep)"),
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


def left_out(probe_needs: str | None, hypothesis_needs: Iterable[str], depth: str) -> str | None:
    """The need that keeps a call from running at this depth (None: it runs): a deep-only hypothesis's
    need first (it holds for all its calls), then the probe's own (a profile, a sweep)."""
    runs = tier(depth).runs
    whole = next((n for n in NEEDS if n in WHOLE and n in set(hypothesis_needs) and n not in runs), None)
    if whole is not None:
        return whole
    return probe_needs if probe_needs and probe_needs not in runs else None


def first_running(need: str) -> str:
    """The shallowest depth that runs `need`."""
    return next((d for d in DEPTHS if need in TIERS[d].runs), "standard")


def _lacks(need: str) -> str:
    return "the deep tier (not run)" if need in WHOLE else f"a {need} (not run)"


def note(needs: Iterable[str], depth: str, not_run: Iterable[str] = ()) -> str:
    """What a verdict at this depth lacks, in words ("" when nothing): it is shown with the verdict."""
    t = tier(depth)
    lacking = []
    if "load" in needs and not t.drives_load:
        lacking.append("load (judged on the server's own traffic)")
    missing = [n for n in NEEDS if n in set(needs) - {"load"} and (n not in t.runs or n in not_run)]
    lacking.extend(_lacks(n) for n in missing)
    if not lacking:
        return ""
    # the first deeper tier that runs all of it (a deep-only need skips standard)
    deeper = next((d for d in DEPTHS[DEPTHS.index(depth) + 1:] if all(n in TIERS[d].runs for n in missing)), None)
    deeper = deeper or next_depth(depth) or depth
    return f"needs {', '.join(lacking)} at --depth {depth}: --depth {deeper} measures it"


def params_for(runbook_depths: dict[str, dict[str, Any]], depth: str) -> dict[str, Any]:
    """The params a tier sets (the runbook's `depths` for it); `--set` still wins over them."""
    return dict(runbook_depths.get(depth) or {})


def next_command(runbook: str, depth: str, *, simulate: str | None = None, server_url: str | None = None,
                 sets: Iterable[str] = (), probes_dirs: Iterable[str] = ()) -> str | None:  # fmt: skip
    """The command for the next tier with the same target and params (never the API key), or None at the deepest."""
    deeper = next_depth(depth)
    if deeper is None:
        return None
    words = ["runbook", "run", runbook, "--depth", deeper]
    if simulate:
        words += ["--simulate", simulate]
    elif server_url:
        words += ["--server-url", server_url]
    for item in sets:
        words += ["--set", item]
    for d in probes_dirs:
        words += ["--probes-dir", d]
    return shlex.join(words)
