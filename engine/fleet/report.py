"""Rendering a fleet triage: the ranked host table (terminal), the Markdown fleet report, the JSON.

Host names and labels come from the metrics: they are data, escaped for Markdown and stripped of control
characters for the terminal, never markup.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

from .judge import FleetHost, FleetResults
from gpu_runbook.probes.prometheus.gpu import FIELDS, missing_reason
from ..numbers import number, quantity
from ..report import xychart

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~])")


def plain(text: Any) -> str:
    """For the terminal: no escape sequences or control characters from a label."""
    return _CONTROL.sub("?", str(text if text is not None else ""))


def md(text: Any) -> str:
    """For Markdown: every character Markdown or HTML would read escaped."""
    return _MD_SPECIAL.sub(r"\\\1", plain(text))


def causes(h: FleetHost, roots: set[str]) -> list[str]:
    return [c for c in h.confirmed if c not in roots]


def symptom(h: FleetHost) -> str:
    if h.draw_w is None:
        return "—"
    ref = f" / ref {quantity(h.reference_w, 'W')}" if h.reference_w else ""
    util = f" at {quantity(h.util_pct, '%')}" if h.util_pct is not None else ""
    return f"{quantity(h.draw_w, 'W')}{ref}{util}"


def table_rows(fr: FleetResults) -> list[list[str]]:
    roots = _roots(fr)
    rows = []
    for h in fr.hosts:
        found = [c for c in h.confirmed if c in roots]
        quiet = h.has_results and h.join == "joined" and h.worst_severity not in ("critical", "warning")
        status = ", ".join(found) if found else ("no warning" if quiet else "")
        if h.join != "joined":
            status = (status + "; " if status else "") + h.join
        rows.append([str(h.rank), plain(h.host), plain(h.gpu_model or "—") + (f" x{h.gpu_count}" if h.gpu_count else ""), symptom(h),
                     ", ".join(causes(h, roots)) or "—", status, plain(h.command or "—")])  # fmt: skip
    return rows


def _missing(fr: FleetResults) -> tuple[list[str], list[str]]:
    """What some hosts' exporters lack: dcgm-exporter's fields, and what the AMD exporter lacks (said in its words)."""
    missing = sorted({f for h in fr.hosts for f in h.missing_fields})
    return [m for m in missing if m in FIELDS], [m for m in missing if m not in FIELDS]


def _roots(fr: FleetResults) -> set[str]:
    for h in fr.hosts:
        results = h.judged()
        if results is not None:
            return {x.id for x in results.hypotheses if x.parent is None}
    return set()


HEADER = ["#", "host", "GPUs", "draw / reference at util", "confirmed causes", "symptom / join", "next"]


def table_text(fr: FleetResults) -> str:
    rows = [HEADER, *table_rows(fr)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    head = (f"{fr.runbook} over {len(fr.hosts)} hosts from {plain(fr.prometheus)} ({fr.engine}): window {number(fr.window_s)} s"
            f" ending {_when(fr.at)}, {fr.queries} queries, {number(fr.duration_s)} s")  # fmt: skip
    out = [head, *lines]
    for err in fr.query_errors:
        out.append(f"query error: {plain(err)}")
    dcgm, other = _missing(fr)
    if dcgm:
        out.append(f"missing dcgm-exporter fields (some hypotheses inconclusive): {', '.join(dcgm)}; `runbook fleet --dcgm-counters` prints a counters file")
    if other:
        out.append(f"on AMD hosts (some hypotheses inconclusive): {missing_reason(other)}")
    return "\n".join(out) + "\n"


def _when(ts: float) -> str:
    from datetime import datetime, timezone  # noqa: PLC0415

    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _label(text: str) -> str:
    """A chart category: only characters a host name needs (a label is data, never Mermaid or HTML)."""
    return re.sub(r"[^A-Za-z0-9._:/@=-]", "_", plain(text))[:60]


def power_chart(fr: FleetResults, limit: int = 40) -> list[str]:
    """Mean draw per host (bars) against its enforced limit (else the board maximum) and its memory-bound reference (lines)."""
    hosts = [h for h in fr.hosts if h.draw_w is not None][:limit]
    if not hosts:
        return []
    limits = [h.limit_w or h.board_max_w or 0.0 for h in hosts]
    refs = [h.reference_w or 0.0 for h in hosts]
    top = max([*limits, *refs, *(h.draw_w or 0.0 for h in hosts)]) or None
    return xychart("GPU draw per host (bars, W) against the limit, else the board maximum (first line), and the memory-bound reference (second line)",
                   [_label(h.host) for h in hosts], "W", top,
                   bars=[h.draw_w or 0.0 for h in hosts], lines=[limits, refs])  # fmt: skip


def markdown(fr: FleetResults) -> str:
    roots = _roots(fr)
    out = [f"# Fleet triage: {md(fr.title)}", "",
           f"`{fr.runbook}` decided for {len(fr.hosts)} hosts from the metrics of {md(fr.prometheus)} ({fr.engine}), "
           f"over {number(fr.window_s)} s ending {_when(fr.at)}"
           + (f" (less {number(fr.latency_offset_s)} s: the engine's latency offset)" if fr.latency_offset_s else "")
           + f". No load was put on any host; {fr.queries} queries.", ""]  # fmt: skip
    out += ["## Hosts, most in need first", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row, h in zip(table_rows(fr), fr.hosts):
        cells = [row[0], md(h.host), md(row[2]), row[3], md(row[4]), md(row[5]), f"`{plain(h.command)}`" if h.command else "—"]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    chart = power_chart(fr)
    if chart:
        out += ["## Power against limit", "", *chart, ""]
    odd = [h for h in fr.hosts if h.join != "joined"]
    if odd:
        out += ["## Hosts whose series did not join", ""]
        out += [f"- **{md(h.host)}**: {h.join}: {md(h.join_detail)}" for h in odd]
        out.append("")
    dcgm, other = _missing(fr)
    if dcgm or other:
        out += ["## What the metrics cannot say", ""]
    if dcgm:
        out += [f"dcgm-exporter does not export {', '.join(f'`{m}`' for m in dcgm)} on some hosts: the hypotheses that read them are "
                "inconclusive. `runbook fleet --dcgm-counters` prints a counters file with every field the runbooks use.", ""]  # fmt: skip
    if other:
        out += [f"On AMD hosts: {md(missing_reason(other))}. The hypotheses that read them are inconclusive.", ""]
    out += ["## Per host", ""]
    for h in fr.hosts:
        out.append(f"### {h.rank}. {md(h.host)}")
        out.append("")
        results = h.judged()
        if results is None:
            out += [f"No metrics to decide on: {md(h.join_detail)}", ""]
            continue
        for x in results.hypotheses:
            if x.verdict.value == "confirmed":
                out.append(f"- ✅ **{x.id}** ({x.severity.value}): {md(x.headline or x.title)}")
        needs = h.needs_host_run
        if needs:
            out.append(f"- needs a host run ({len(needs)}: {', '.join(needs)}): `{plain(h.command)}`" if h.command else f"- needs a host run: {', '.join(needs)}")
        for note in h.notes:
            out.append(f"- note: {md(note)}")
        out.append("")
    del roots
    return "\n".join(out) + "\n"


def to_json(fr: FleetResults) -> str:
    return "".join(json_chunks(fr))


def json_chunks(fr: FleetResults) -> Iterator[str]:
    """`fr.model_dump_json(indent=2)`, the same text, a host at a time: a large fleet's file (~100 KB a host) is
    written as it is made, and a worker's host's results go in as the JSON it sent (FleetHost.results_json)."""
    if not fr.hosts:
        yield fr.model_dump_json(indent=2)
        return
    head = fr.model_dump_json(indent=2, exclude={"hosts"})
    yield head[: head.rindex("\n}")] + ',\n  "hosts": [\n'
    for i, h in enumerate(fr.hosts):
        text = h.model_dump_json(indent=2, exclude={"results"}).replace("\n", "\n    ")
        body = h.results_json()
        yield (("    " if i == 0 else ",\n    ") + text[: text.rindex("\n    }")] + ',\n      "results": '
               + ("null" if body is None else body) + "\n    }")  # fmt: skip
    yield "\n  ]\n}"


__all__ = ["json_chunks", "markdown", "power_chart", "table_text", "to_json"]
