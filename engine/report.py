"""The Markdown findings report: the Results model rendered through templates/report.md.j2.

One page that answers: a five-line TL;DR, one findings list (root causes with their consequences),
the steps ranked by estimated gain, charts GitHub renders (Mermaid `xychart-beta`), then details
with refuted and skipped hypotheses folded away. Repeated evidence is written once: identical rows
collapse ("GPU 0-7 (8x)"), a uniform matrix becomes a sentence. Everything stays in the JSON.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from . import findings as fnd
from .depth import TIERS
from .evidence import Bars, Series, Table, without_status
from .loader import bundled_dir
from .marks import mark
from .model import split_steps
from . import markdown_safe as ms
from .numbers import number, piecewise, quantity
from .results import Results, load_outcome, safe_name
from .scales import describe, series_scale, sparkline
from .target import SERVER_KINDS, kind_title, load_path, probe_role, recorded_url

STAT_KEYS = ("mean", "min", "max", "p50", "p95", "p99", "last")


def fmt_value(value: Any) -> str:
    """A cell or a reading: numbers through gpu_runbook.numbers (one rounding everywhere), None as a dash."""
    return number(value)


def _cell(value: Any) -> str:
    return ms.text(fmt_value(value), table=True)


def flatten_values(values: dict[str, Any], limit: int = 40) -> list[tuple[str, str]]:
    """Evidence values as (name, text) rows: scalars as they are, stats dicts on one line, big lists summarised."""
    rows: list[tuple[str, str]] = []
    for key, value in values.items():
        if isinstance(value, dict) and value and set(value) <= set(STAT_KEYS) | {"n", "count"}:
            rows.append((key, ", ".join(f"{k} {fmt_value(v)}" for k, v in value.items())))
        elif isinstance(value, dict):
            flat = {k: v for k, v in value.items() if not isinstance(v, (dict, list))}
            if flat and len(flat) <= 12:
                rows.append((key, ", ".join(f"{k}: {fmt_value(v)}" for k, v in flat.items())))
            else:
                rows.append((key, f"{len(value)} entries"))
        elif isinstance(value, list):
            if all(not isinstance(v, (dict, list)) for v in value) and len(value) <= 12:
                rows.append((key, ", ".join(fmt_value(v) for v in value)))
            else:
                rows.append((key, f"{len(value)} items"))
        else:
            rows.append((key, fmt_value(value)))
        if len(rows) >= limit:
            rows.append(("…", f"{len(values) - limit} more in the JSON results"))
            break
    return rows


def first_step(text: str) -> str:
    """The first step of a next_steps text: its first paragraph or bullet, continuation lines joined."""
    steps = split_steps(text)
    return steps[0] if steps else ""


def decided(h: Any) -> str:
    """How the verdict was reached, its values in the one rounding: "Decided by `rule` with `x` = 1"
    (the reason the runner wrote, where no rule decided)."""
    if not h.rule:
        return ms.text(" ".join(str(h.reason or "").split()))
    label = str(h.reason or "").split(":", 1)[0]
    verb = {"confirm": "Confirmed by", "refute": "Refuted by"}.get(label, "Decided by")
    values = ", ".join(f"{ms.code(k)} = {_cell(v)}" for k, v in h.rule_values.items())
    return ms.Md(f"{verb} {ms.code(h.rule)}" + (f" with {values}" if values else "") + ".")


html_inline = ms.html  # text for an HTML element (a <details> summary, where Markdown is not read)


def _md_mark(verdict: str) -> str:
    """The verdict's symbol, escaped where Markdown would read it as syntax ("- -" is a nested list)."""
    symbol = mark(verdict)
    return ms.Md("\\" + symbol if symbol in "-*+#" else ms.text(symbol))


# -- repeated evidence, written once ------------------------------------------------------------


def _label_range(labels: list[Any]) -> str:
    """["GPU 0", ..., "GPU 7"] -> "GPU 0-7 (8x)"; labels that are not numbered are joined."""
    if len(labels) == 1:
        return ms.text(labels[0])
    texts = [ms.text(x) for x in labels]
    stem = texts[0].rstrip("0123456789")
    nums = [t[len(stem) :] for t in texts]
    if all(t.startswith(stem) and n.isdigit() for t, n in zip(texts, nums)):
        ints = [int(n) for n in nums]
        if ints == list(range(ints[0], ints[0] + len(ints))):
            return f"{stem}{ints[0]}-{ints[-1]} ({len(ints)}x)"
        return f"{stem}{', '.join(nums)} ({len(ints)}x)"
    return f"{', '.join(texts)} ({len(texts)}x)"


def collapse_rows(columns: list[str], rows: list[list[Any]]) -> tuple[list[str], list[list[Any]], list[str]]:
    """Rows equal but for their first cell become one row labelled "GPU 0-7 (8x)". Columns where every
    row differs (bus ids) are left out of the comparison and named in the returned notes."""
    if len(rows) < 3 or len(columns) < 2:
        return columns, rows, []
    unique = [j for j in range(1, len(columns)) if len({_cell(r[j]) for r in rows if j < len(r)}) == len(rows)]
    keep = [j for j in range(len(columns)) if j not in unique]
    groups: list[tuple[tuple[str, ...], list[Any], list[Any]]] = []  # (cells as shown, labels, first row)
    for r in rows:
        key = tuple(_cell(r[j]) if j < len(r) else "" for j in keep[1:])
        if groups and groups[-1][0] == key:
            groups[-1][1].append(r[0])
        else:
            groups.append((key, [r[0]], r))
    if len(groups) == len(rows):
        return columns, rows, []
    out_cols = [columns[j] for j in keep]
    out_rows = [[_label_range(labels), *(first[j] if j < len(first) else "" for j in keep[1:])] for _, labels, first in groups]
    notes = [f"{columns[j]}: one per row, in the JSON results" for j in unique]
    return out_cols, out_rows, notes


def matrix_sentence(block: Table) -> str | None:
    """A square GPU x GPU matrix with one value off the diagonal: that value in a sentence."""
    cols, rows = block.columns, block.rows
    if len(cols) < 3 or len(rows) != len(cols) - 1 or [str(r[0]) for r in rows] != [str(c) for c in cols[1:]]:
        return None
    off = {str(r[j]) for i, r in enumerate(rows) for j in range(1, len(r)) if j - 1 != i}
    if len(off) == 1:
        pairs = len(rows) * (len(rows) - 1) // 2
        return f"*{ms.text(block.title)}*: {ms.code(off.pop())} for all {pairs} pairs of {_label_range([r[0] for r in rows])}."
    return _grouped_matrix_sentence(block, off)


def _grouped_matrix_sentence(block: Table, off: set[str]) -> str | None:
    """Two values off the diagonal, one within groups of GPUs and one across them (two NUMA nodes, two
    PCIe switches): the groups in a sentence, e.g. "`NODE` within GPU0-3 and within GPU4-7, `SYS` across"."""
    if len(off) != 2:
        return None
    rows, n = block.rows, len(block.rows)
    for inner in sorted(off):
        outer = (off - {inner}).pop()
        groups: list[list[int]] = []
        for i in range(n):
            mine = {i} | {j for j in range(n) if j != i and str(rows[i][j + 1]) == inner}
            if any(mine == set(g) for g in groups):
                continue
            groups.append(sorted(mine))
        members = sorted(i for g in groups for i in g)
        cliques = all(str(rows[a][b + 1]) == inner for g in groups for a in g for b in g if a != b)
        if members == list(range(n)) and len(groups) > 1 and cliques:
            names = [" and ".join(_label_range([rows[i][0] for i in g]) for g in groups)]
            return f"*{ms.text(block.title)}*: {ms.code(inner)} within {names[0].replace(' and ', ' and within ')}, {ms.code(outer)} across them."
    return None


def _field_table_line(block: Table) -> str | None:
    """A two-column field/value table as one line: "version 0.5.5; tp_size 8; ..."."""
    if [c.lower() for c in block.columns] not in (["field", "value"], ["name", "value"]):
        return None
    return f"*{ms.text(block.title)}*: " + "; ".join(f"{ms.text(r[0])} {_cell(r[1])}" for r in block.rows if len(r) >= 2)


def series_lines(series: list[Series], limit: float | None = None, cap: float | None = None) -> list[str]:
    """One line per series on its natural scale; series that draw and read the same collapse."""
    out: list[tuple[str, list[str]]] = []
    for s in series:
        values = [p[1] for p in s.points]
        scale = series_scale(s.title, s.unit, values, limit if s.unit == "W" else None, cap) if values else None
        body = f"{ms.code(sparkline(values, scale))} {ms.text(describe(values, scale, s.unit))}" if values else "no samples"
        if out and out[-1][0] == body:
            out[-1][1].append(s.title)
        else:
            out.append((body, [s.title]))
    lines = []
    for body, titles in out:
        name = ms.text(titles[0] if len(titles) == 1 else _collapse_titles(titles))
        lines.append(f"*{name}*: {body}")
    return lines


def _collapse_titles(titles: list[str]) -> str:
    """["GPU 0 power", "GPU 1 power"] -> "GPU 0-1 (2x) power"."""
    words = [t.split() for t in titles]
    if all(len(w) == len(words[0]) for w in words):
        diff = [i for i in range(len(words[0])) if len({w[i] for w in words}) > 1]
        if len(diff) == 1:
            i = diff[0]
            label = _label_range([" ".join(w[: i + 1]) for w in words])
            return " ".join([label, *words[0][i + 1 :]])
    return ", ".join(titles)


def block_lines(blocks: list[Any], values: dict[str, Any]) -> list[str]:
    """Markdown for one evidence record's blocks, as list items under the record's own item (so they
    need no blank lines), each repeated picture written once. A table whose rows collapse to one or
    two becomes sentences ("GPU 0-7 (8x): ..."); a bigger one stays a table, after a blank line."""
    limit = values.get("power_limit_enforced_w") if isinstance(values.get("power_limit_enforced_w"), (int, float)) else None
    cap = values.get("running_cap") if isinstance(values.get("running_cap"), (int, float)) else None
    out: list[str] = []
    tables: list[str] = []
    series = [b for b in blocks if isinstance(b, Series)]
    for b in blocks:
        if isinstance(b, Table):
            sentence = matrix_sentence(b) or _field_table_line(b)
            if sentence:
                out.append(f"  - {sentence}")
                continue
            cols, rows, notes = collapse_rows(b.columns, b.rows)
            note = f" ({'; '.join(notes)})" if notes else ""
            if len(rows) <= 2:
                for r in rows:
                    cells = ", ".join(f"{_cell(c)} {_cell(v)}" for c, v in zip(cols[1:], r[1:]))
                    out.append(f"  - *{ms.text(b.title)}*{ms.text(note)}: {_cell(r[0])}: {cells}")
                continue
            tables.append("")
            tables.append(f"*{ms.text(b.title)}*{ms.text(note)}")
            tables.append("")
            tables.append("| " + " | ".join(_cell(c) for c in cols) + " |")
            tables.append("|" + "---|" * len(cols))
            tables.extend("| " + " | ".join(_cell(v) for v in r) + " |" for r in rows[:32])
            if len(rows) > 32:
                tables.append(f"| … {len(rows) - 32} more rows in the JSON results |")
            tables.append("")
        elif isinstance(b, Bars):
            cols, rows, _ = collapse_rows(["", b.unit or "value", "of"], [[label, value, top] for label, value, top in b.bars])
            out.append(f"  - *{ms.text(b.title)}*: " + "; ".join(f"{ms.text(r[0])} {_cell(r[1])} of {_cell(r[2])} {ms.text(b.unit)} ({quantity(r[1] / r[2], 'share') if r[2] else '—'})" for r in rows))
        elif isinstance(b, Series) and b is series[0]:
            out.extend(f"  - {line}" for line in series_lines(series, limit, cap))
    out.extend(tables)
    return ms.lines(out)  # other kinds: templates/blocks/<kind>.md.j2 draws them (see _evidence.md.j2)


KNOWN_BLOCKS = ("table", "bars", "series")


# -- charts -------------------------------------------------------------------------------------


def _q(text: Any) -> str:
    """A Mermaid label: one line (a newline would end the chart's fence), no quote or backtick to close it."""
    return '"' + ms.one_line(text).replace('"', "'").replace("`", "'").replace("%%", "%") + '"'


def _nums(values: list[float]) -> str:
    return "[" + ", ".join(number(float(v)).replace(",", "") for v in values) + "]"


def xychart(title: str, x: list[Any], y_label: str, y_max: float | None, bars: list[float] | None = None, lines: list[list[float]] | None = None) -> list[str]:
    """A Mermaid xychart-beta (GitHub renders it): categories on x, bars and/or lines on one y axis."""
    out = ["```mermaid", "xychart-beta", f"    title {_q(title)}", f"    x-axis [{', '.join(_q(v) for v in x)}]"]
    out.append(f"    y-axis {_q(y_label)} 0 --> {number(float(y_max)).replace(',', '')}" if y_max else f"    y-axis {_q(y_label)}")
    if bars is not None:
        out.append(f"    bar {_nums(bars)}")
    for line in lines or []:
        out.append(f"    line {_nums(line)}")
    out.append("```")
    return ms.lines(out)


def _evidence(results: Results, probe: str) -> Any:
    """The first ok evidence of `probe`, or of a server probe of the same role whichever family ran it (`sglang.metrics`
    finds `vllm.metrics` on a vLLM run)."""
    role = probe_role(probe)
    return next((ev for h in results.hypotheses for ev in h.evidence
                 if (ev.probe == probe or (role is not None and probe_role(ev.probe) == role)) and ev.status.value == "ok"), None)  # fmt: skip


def server_kind_found(results: Results) -> str | None:
    """The server kind the run found: its configuration probe's own word, else the target's, else (results from before
    vLLM, whose target does not say) the family of the probe that read the configuration."""
    ev = next((e for h in results.hypotheses for e in h.evidence if probe_role(e.probe) == "server.config" and e.status.value == "ok"), None)
    said = [ev.values.get("server_kind") if ev else None, results.target.get("server_kind"), ev.probe.partition(".")[0] if ev else None]
    return next((k for k in said if k in SERVER_KINDS), None)


def server_line(results: Results, server: dict[str, Any]) -> str:
    """`vLLM 0.11.0, model M, TP 8, DP 1, quantization modelopt_fp4, KV cache fp8 (495,488 tokens)`: the kind found and
    what its configuration probe read, by the names every server family fills (tp, dp, kv_dtype, kv_capacity_tokens),
    else by SGLang's flag names (results written before those)."""

    def first(*keys: str) -> Any:
        return next((server[k] for k in keys if server.get(k) is not None), None)

    kind = server_kind_found(results)
    version = first("version")
    head = f"{kind_title(kind)} {version or '?'}" if kind else f"kind not known, version {version or '?'}"
    kv = f"KV cache {first('kv_dtype', 'kv_cache_dtype') or '?'}"
    capacity = first("kv_capacity_tokens", "max_total_num_tokens")
    if isinstance(capacity, (int, float)) and not isinstance(capacity, bool):
        kv += f" ({number(capacity)} tokens)"
    tp, dp = first("tp", "tp_size"), first("dp", "dp_size")
    return ", ".join([head, f"model {first('model_path', 'served_model_name') or '?'}", f"TP {'?' if tp is None else number(tp)}",
                      f"DP {'?' if dp is None else number(dp)}", f"quantization {first('quantization') or 'none'}", kv])  # fmt: skip


def load_endpoint_path(results: Results) -> str:
    """The path the run's load posted to ("/generate", "/v1/completions"), as recorded and as the target's kind serves it."""
    config = (results.load or {}).get("config") or {}
    return load_path(str(config.get("endpoint") or "generate"), results.target.get("server_kind"))


def _resample(points: list[tuple[float, float]], n: int = 12) -> list[tuple[float, float]]:
    if len(points) <= n:
        return points
    step = len(points) / n
    return [points[int(i * step)] for i in range(n)]


def run_intensity(results: Results) -> float | None:
    """The FLOPs per byte of weights this run's decode GEMMs did, as gpus-underfed computes it: 2 x the running
    requests per DP rank x the rows each GEMM gets per request / the bytes a weight takes (None where unknown)."""
    model = _evidence(results, "model.config")
    metrics = next((ev for h in results.hypotheses for ev in h.evidence if ev.alias == "metrics" and ev.status.value == "ok"
                    and isinstance(ev.values.get("running_per_dp"), dict)), None)  # fmt: skip
    if model is None or metrics is None:
        return None
    rows, per, size = metrics.values["running_per_dp"].get("p50"), model.values.get("gemm_rows_per_request"), model.values.get("weight_bytes_per_param")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (rows, per, size)) or not size:
        return None
    return 2.0 * rows * per / size


def draw_curve_chart(results: Results) -> list[str]:
    """What a well-fed GPU draws against the intensity of its work (gpu.reference's curve, a line), with this run's
    draw as a bar at this run's intensity: how far below the curve the GPUs sit, and why the yardstick is what it is.
    A results file is data: values of the wrong shape give no chart, never an error."""
    try:
        return _draw_curve_chart(results)
    except (TypeError, ValueError, AttributeError):
        return []


def _draw_curve_chart(results: Results) -> list[str]:
    ref = _evidence(results, "gpu.reference")
    power = _evidence(results, "gpu.sample")
    curve = ref.values.get("draw_curve") if ref is not None else None
    if not isinstance(curve, list) or len(curve) < 2:
        return []
    points = sorted((float(x), float(y)) for x, y in curve)
    at = run_intensity(results)
    draw = (power.values.get("power_draw_w") or {}).get("mean") if power is not None else None
    xs = [x for x, _ in points]
    if at is not None and draw is not None and not any(abs(x - at) < 1e-9 for x in xs):
        xs = sorted([*xs, at])

    def label(x: float) -> str:
        return f"{number(x)} (this run)" if at is not None and draw is not None and abs(x - at) < 1e-9 else number(x)

    top = max([y for _, y in points] + ([draw] if isinstance(draw, (int, float)) else []))
    bars = [float(draw) if at is not None and isinstance(draw, (int, float)) and abs(x - at) < 1e-9 else 0.0 for x in xs]
    kind = ref.values.get("reference_kind") or "curve"
    return xychart(f"A well-fed GPU's draw (line, {kind}) against FLOPs per byte of weights; bar: this run (W)", [label(x) for x in xs], "W",
                   top, bars=bars if any(bars) else None, lines=[[piecewise(points, x) for x in xs]])  # fmt: skip


def charts(results: Results) -> list[list[str]]:
    """Power per GPU against its limit; power, utilization and KV usage over the window (each as a share
    of its natural range, so one axis fits all); throughput and ITL against concurrency for a sweep."""
    out: list[list[str]] = []
    power = _evidence(results, "gpu.sample")
    if power is not None:
        bars = next((b for b in power.blocks if isinstance(b, Bars)), None)
        if bars is not None and bars.bars:
            top = max(t for _, _, t in bars.bars) or None
            chart = xychart(f"{bars.title}: bars draw, line the limit ({bars.unit})", [label for label, _, _ in bars.bars], bars.unit or "value", top,
                            bars=[v for _, v, _ in bars.bars], lines=[[t for _, _, t in bars.bars]])  # fmt: skip
            out.append(chart)
    metrics = _evidence(results, "sglang.metrics")
    lines: list[tuple[str, list[tuple[float, float]], float]] = []
    if power is not None:
        watts = [b for b in power.blocks if isinstance(b, Series) and b.unit == "W"]
        limit = power.values.get("power_limit_enforced_w")
        if watts and isinstance(limit, (int, float)) and limit:
            n = min(len(s.points) for s in watts)
            mean = [(watts[0].points[i][0], sum(s.points[i][1] for s in watts) / len(watts)) for i in range(n)]
            lines.append(("power % of limit", mean, 100.0 / float(limit)))
        util = next((b for b in power.blocks if isinstance(b, Series) and b.unit == "%"), None)
        if util is not None and util.points:
            lines.append(("utilization %", util.points, 1.0))
    if metrics is not None:
        kv = next((b for b in metrics.blocks if isinstance(b, Series) and "KV" in b.title), None)
        if kv is not None and kv.points:
            lines.append(("KV usage %", kv.points, 100.0))
    if lines:
        n = min(12, min(len(p) for _, p, _ in lines))
        xs = [f"{number(t)} s" for t, _ in _resample(lines[0][1], n)]
        chart = xychart("Over the window, in % of range: " + ", ".join(f"line {i + 1} {name}" for i, (name, _, _) in enumerate(lines)), xs, "%", 100.0,
                        lines=[[v * k for _, v in _resample(p, n)][: len(xs)] for _, p, k in lines])  # fmt: skip
        out.append(chart)
    curve = draw_curve_chart(results)
    if curve:
        out.append(curve)
    sweep = _evidence(results, "sglang.sweep")
    if sweep is not None and sweep.values.get("levels"):
        levels = sweep.values["levels"]
        plateau = sweep.values.get("plateau_concurrency")
        # the KV wall: the first level where requests wait on a full KV cache (or the top level, when the sweep says so)
        at_wall = [lv for lv in levels if (lv.get("token_usage_max") or 0) >= 0.9 and (lv.get("queue_mean") or 0) >= 1]
        wall = at_wall[0] if at_wall else (levels[-1] if sweep.values.get("limit") == "kv-cache" else None)

        def label(lv: dict[str, Any]) -> str:
            tags = (["knee"] if lv["concurrency"] == plateau else []) + (["KV wall"] if lv is wall else [])
            return f"{lv['concurrency']}" + (f" ({', '.join(tags)})" if tags else "")

        xs = [label(lv) for lv in levels]
        out.append(xychart("Output throughput (steady state) vs concurrency", xs, "tok/s", None, bars=[lv["output_tokens_per_s"] or 0 for lv in levels]))
        if any(lv.get("itl_p50_ms") is not None for lv in levels):
            out.append(xychart("ITL p50 vs concurrency", xs, "ms", None, lines=[[lv.get("itl_p50_ms") or 0 for lv in levels]]))
    return out


# -- rendering ----------------------------------------------------------------------------------


def breakdown_rows(rows: list[Any], close: float = 0.02) -> list[tuple[str, list[float]]]:
    """A breakdown's rows as a person reads them: the mean over ranks, then only the ranks that differ
    from it (a straggler) by more than `close` of the step in some bucket; alike ranks are one line."""
    rows = [(str(label), [float(v) for v in shares]) for label, shares in rows]
    if len(rows) <= 1:
        return rows
    n = len(rows[0][1])
    mean = [sum(r[1][i] for r in rows) / len(rows) for i in range(n)]
    odd = [r for r in rows if any(abs(r[1][i] - mean[i]) > close for i in range(n))]
    alike = len(rows) - len(odd)
    label = f"all {len(rows)} ranks (mean)" if not odd else f"mean of {len(rows)} ranks ({alike} within {close:.0%} of it)"
    return [(label, mean), *odd]


def _environment():
    import jinja2  # noqa: PLC0415 - lazy: not needed for `runbook --help`

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(bundled_dir("templates"))),
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.ChainableUndefined,
        finalize=ms.text,  # every {{ value }} is data, escaped, unless the report built it (ms.Md)
    )
    env.filters.update(
        mark=_md_mark, load_outcome=load_outcome, without_status=without_status, fmt=fmt_value, first_step=first_step, cell=_cell,
        flatten=flatten_values, oneline=lambda text: " ".join(str(text or "").split()), q=quantity, blocks=block_lines,
        gain=fnd.gain_text, gain_short=fnd.gain_short, breakdown_rows=breakdown_rows, decided=decided, html=ms.html, code=ms.code, link=ms.link, built=ms.Md, load_counts=fnd.load_counts, headline=fnd.headline, steps_of=fnd.steps_of,
    )  # fmt: skip
    env.globals["KNOWN_BLOCKS"] = KNOWN_BLOCKS
    return env


def render(results: Results, template: str = "report.md.j2") -> str:
    children: dict[str | None, list] = {}
    for h in results.hypotheses:
        children.setdefault(h.parent, []).append(h)
    found = fnd.findings(results)
    steps = fnd.ranked_steps(results)
    quiet = fnd.not_limiting(results)
    decided = {f.id for f in fnd.walk(found)} | {h.id for h in fnd.symptoms(results)} | {h.id for h in quiet}
    details = [h for h in results.hypotheses if h.id in decided or h.verdict.value == "error"]
    first_seen: dict[str, str] = {}
    repeats: dict[str, str] = {}  # "hypothesis-id:alias" -> the hypothesis whose details show the same evidence
    for h in details:
        for ev in h.evidence:
            key = ev.probe + json.dumps(ev.values, sort_keys=True, default=str)
            if key in first_seen:
                repeats[f"{h.id}:{ev.alias}"] = first_seen[key]
            else:
                first_seen[key] = h.id
    inventory = results.inventory()
    text = _environment().get_template(template).render(
        r=results,
        confirmed=results.confirmed(),
        causes=results.causes(),
        counts=results.counts(),
        children=children,
        inventory=inventory,
        server_line=server_line(results, inventory.get("server") or {}),
        load_path=load_endpoint_path(results),
        target_url=recorded_url(results.target),
        symptoms=fnd.symptoms(results),
        symptom=fnd.symptom_line(results),
        findings=found,
        ranking=fnd.ranking_basis(results),
        not_limiting=quiet,
        steps=steps,
        depth_what=TIERS[results.depth].what if results.depth in TIERS else results.depth,
        throughput=fnd.throughput_text(results),
        latency=fnd.latency_text(results.load),
        outlived=fnd.outlived_note(results.load),
        charts=charts(results),
        details=details,
        repeats=repeats,
        folded=[h for h in results.hypotheses if h.id not in decided and h.verdict.value != "error"],
    )
    return re.sub(r"\n{3,}", "\n\n", text)  # one blank line between blocks, whatever the template's branches left


def default_path(results: Results, directory: str | Path = "reports") -> Path:
    stamp = (results.started_at or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return Path(directory) / f"{safe_name(results.runbook)}-{stamp}.md"  # the name may come from a crafted results file


def write(results: Results, path: str | Path | None = None) -> Path:
    target = Path(path) if path else default_path(results)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(results), encoding="utf-8")
    return target
