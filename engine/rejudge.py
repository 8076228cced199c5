"""`runbook rejudge`: decide every verdict again from a run's recorded evidence, offline.

No probe runs and no load is driven: the runner walks the tree as it does live, but each probe call
is answered by the evidence the run recorded for the same probe with the same parameters (see
`Runner.recorded`). The verdict logic is the runner's own, so re-judging with the runbook that made
the run gives its verdicts back exactly; an edited runbook or `--set` gives what the edited rules
say about the same host. A call the run did not make (a new probe, new parameters, a branch it
skipped without `--record-all`) makes its verdict `inconclusive: not recorded`.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any, Callable

from .loader import LoadedRunbook, LoadError, available, load, load_path_or_name
from .yamlpos import SourceError
from .model import coerce_param
from .target import Target, recorded_url
from .registry import Registry
from .results import Results, safe_name, sha256_text
from .runner import ParamError, Recorded, Runner, call_key, resolve_params


def recorded_evidence(results: Results, role_of: Callable[[str], str] = str) -> Recorded:
    """Every piece of evidence the run kept, keyed by the call that produced it (probe, parameters, load), and
    again by the probe's role (`role_of`: `sglang.metrics` -> `server.metrics`), so a runbook that names the role
    finds what a run recorded under one server's probe name, before the roles or on another family.

    Evidence sits on the hypotheses that used it; each call's record says which (`used_by`), which is
    also how files of schema version 1 are read."""
    calls = {user: call for call in results.probes for user in call.used_by}
    out: dict[str, Any] = {}
    for hyp in results.hypotheses:
        for ev in hyp.evidence:
            call = calls.get(f"{hyp.id}:{ev.alias}")
            if call is None:
                continue
            out.setdefault(call_key(call.probe, call.params, call.under_load), (ev, call))
            out.setdefault(call_key(role_of(call.probe), call.params, call.under_load), (ev, call))
    return Recorded(evidence=out, load=results.load)


def runbook_of(results: Results, registry: Registry, where: str = "") -> LoadedRunbook:
    """The runbook that made the run: the text the results keep (schema 2), else (schema 1) the bundled
    runbook of that name, whatever it says now. Never a path named in the file: a results file is untrusted
    input, and its `runbook_path` could name /dev/zero, a 3 GB file or a binary one (pass --runbook FILE)."""
    if results.runbook_source:
        with tempfile.TemporaryDirectory(prefix="runbook-rejudge-") as tmp:
            copy = Path(tmp) / f"{safe_name(results.runbook)}.yaml"  # the loader's size limits apply to it
            copy.write_text(results.runbook_source, encoding="utf-8")
            loaded = load(copy, registry)
        loaded.path = results.runbook_path or loaded.path  # shown as where the run's runbook came from; never read
        return loaded
    name = safe_name(results.runbook)
    if name != results.runbook or name not in available():
        raise LoadError([SourceError(name, None, f"the results keep no runbook text and '{name}' is no bundled runbook (pass --runbook FILE)")])
    try:
        return load_path_or_name(name, registry)
    except LoadError as exc:
        raise LoadError(exc.errors) from None


def run_overrides(results: Results, registry: Registry) -> dict[str, Any]:
    """The params the run set away from its runbook's defaults (its `--set`s). Those stay when another
    runbook re-judges the run; the others follow that runbook's defaults (an edited threshold applies)."""
    try:
        original = runbook_of(results, registry)
    except LoadError:
        return dict(results.params)  # the runbook is gone: keep every value the run used
    defaults = {name: p.default for name, p in original.runbook.params.items()}
    return {name: value for name, value in results.params.items() if name not in defaults or defaults[name] != value}


def rejudge_params(loaded: LoadedRunbook, results: Results, overrides: dict[str, Any], registry: Registry | None = None) -> dict[str, Any]:
    """`loaded`'s defaults, then the run's own `--set`s (those this runbook declares, in its types), then `overrides`.
    With the runbook that made the run, that is exactly the run's params."""
    declared = loaded.runbook.params
    same = bool(results.runbook_sha256) and loaded.document is not None and sha256_text(loaded.document.text or "") == results.runbook_sha256
    kept = results.params if same or registry is None else run_overrides(results, registry)
    base: dict[str, Any] = {}
    for name, value in kept.items():
        if name in declared:
            try:
                base[name] = coerce_param(declared[name].type, value)
            except ValueError:
                pass  # the edited runbook changed the param's type: its default applies
    params = resolve_params(loaded, {})
    params.update(base)
    if overrides:
        extra = resolve_params(loaded, overrides)
        params.update({name: extra[name] for name in overrides})
    return params


def rejudge(results: Results, loaded: LoadedRunbook, registry: Registry, overrides: dict[str, Any] | None = None, source: str = "") -> Results:
    """New results: the recorded run, every verdict decided again by `loaded`'s rules. Raises ParamError."""
    params = rejudge_params(loaded, results, overrides or {}, registry)
    kind = results.target.get("server_kind")  # the recorded server's kind: its steps, not another's
    vendor = results.target.get("gpu_vendor")  # and the recorded GPUs' vendor: its tools, not another's
    target = Target(server_url=recorded_url(results.target) or "http://127.0.0.1:30000", label=str(results.target.get("label") or ""),
                    server_kind=kind if kind in ("sglang", "vllm", "unknown") else None,
                    gpu_vendor=vendor if vendor in ("nvidia", "amd") else None, gpu_found=str(results.target.get("gpu_found") or ""))  # fmt: skip
    # a --record-all run is re-judged as one: skipped branches keep their recorded evidence for the next rejudge
    runner = Runner(loaded, registry, target, params, recorded=recorded_evidence(results, registry.role_of), record_all=results.record_all, depth=results.depth)
    judged = asyncio.run(runner.run())
    return judged.model_copy(
        update={
            # what describes the run stays the run's; what describes the judgement is new
            "started_at": results.started_at,
            "finished_at": results.finished_at,
            "duration_s": results.duration_s,
            "interrupted": results.interrupted,
            "target": results.target,
            "load": results.load,
            "timings": results.timings,
            "record_all": results.record_all,
            "next_command": results.next_command,
            "rejudged_from": {
                "path": source,
                "runbook": results.runbook,
                "runbook_sha256": results.runbook_sha256,
                "engine_version": results.engine_version,
                "schema_version": results.schema_version,
            },
        }
    )


__all__ = ["ParamError", "recorded_evidence", "rejudge", "rejudge_params", "runbook_of"]
