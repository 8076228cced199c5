"""The Markdown findings report: the Results model rendered through templates/report.md.j2."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from .evidence import without_status
from .loader import bundled_dir
from .marks import mark, sparkline
from .results import Results, load_outcome

STAT_KEYS = ("mean", "min", "max", "p50", "p95", "p99", "last")


def fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        return f"{value:.3g}" if abs(value) < 0.01 else f"{value:,.2f}".rstrip("0").rstrip(".")
    if value is None:
        return "—"
    return str(value)


def _cell(value: Any) -> str:
    return fmt_value(value).replace("|", "\\|").replace("\n", " ")


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
    lines = text.strip().splitlines()
    if not lines:
        return ""
    out = [lines[0].strip().lstrip("-*").strip()]
    bullet = lines[0].lstrip().startswith(("-", "*"))
    for line in lines[1:]:
        if not line.strip() or line.lstrip().startswith(("-", "*")) or (bullet and not line.startswith((" ", "\t"))):
            break
        out.append(line.strip())
    return " ".join(out)


def _md_mark(verdict: str) -> str:
    """The verdict's symbol, escaped where Markdown would read it as syntax ("- -" is a nested list)."""
    symbol = mark(verdict)
    return "\\" + symbol if symbol in "-*+#" else symbol


def _environment():
    import jinja2  # noqa: PLC0415 - lazy: not needed for `runbook --help`

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(bundled_dir("templates"))),
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.ChainableUndefined,
    )
    env.filters.update(mark=_md_mark, load_outcome=load_outcome, without_status=without_status, fmt=fmt_value, first_step=first_step, cell=_cell, flatten=flatten_values, sparkline=lambda pts: sparkline([p[1] for p in pts]))
    return env


def render(results: Results, template: str = "report.md.j2") -> str:
    children: dict[str | None, list] = {}
    for h in results.hypotheses:
        children.setdefault(h.parent, []).append(h)
    return _environment().get_template(template).render(
        r=results,
        confirmed=results.confirmed(),
        causes=results.causes(),
        counts=results.counts(),
        children=children,
        inventory=results.inventory(),
    )


def default_path(results: Results, directory: str | Path = "reports") -> Path:
    stamp = (results.started_at or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return Path(directory) / f"{results.runbook}-{stamp}.md"


def write(results: Results, path: str | Path | None = None) -> Path:
    target = Path(path) if path else default_path(results)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(results), encoding="utf-8")
    return target
