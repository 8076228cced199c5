"""Runbook files -> validated, compiled runbooks. Every problem is a `FILE:LINE:COL: message`.

Checks, in order: YAML syntax, the schema (pydantic), duplicate ids, probe names, probe
parameters, CEL syntax, that each rule reads only what it can see (its own probe aliases, its
ancestors', `params` and `load`), and that every value path it reads is one its probe returns (the
probe's `Values` model), pointing at the member that is wrong.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import yamlpos
from .load_config import load_config
from .model import Hypothesis, Runbook, headline_spans, resolve_refs, truthy, unknown_refs
from .numbers import UNITS
from .registry import DEFAULT_GPU_VENDOR, DEFAULT_KIND, ROLES, Registry
from .rules import Ref, Rule, RuleSyntaxError, compile_rule
from .values import PathProblem, check_path
from .yamlpos import Loc, SourceError

RULE_FIELDS = ("when", "confirm", "refute")


class LoadError(Exception):
    def __init__(self, errors: list[SourceError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@dataclass
class LoadedRunbook:
    path: str
    runbook: Runbook
    rules: dict[tuple[str, str], Rule] = field(default_factory=dict)  # (hypothesis id, field) -> rule
    locs: dict[str, Loc] = field(default_factory=dict)  # hypothesis id -> its path in the file
    document: yamlpos.Document | None = None
    # for_server's answers by kind: a fleet asks once per host (~3 ms each, 1,000 hosts)
    _as_read_by: dict[tuple[str, str], "LoadedRunbook"] = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.runbook.name

    def rule(self, hypothesis_id: str, field_name: str) -> Rule | None:
        return self.rules.get((hypothesis_id, field_name))

    def for_server(self, kind: str | None, gpu_vendor: str | None = None) -> "LoadedRunbook":
        """The runbook as a server of `kind` reads it: each hypothesis's `servers.<kind>` variant over its own
        fields, another server's steps left out, and the rules keyed as the runner asks for them. A kind not
        found (None, "unknown") is asked through the default family's probes (registry.DEFAULT_KIND), so it
        reads that family's variant: the rules always read the values of the probes that ran. On GPUs of
        `gpu_vendor` (None: none found, read as NVIDIA, whose probes then run) each hypothesis's `gpus.<vendor>`
        text is over that."""
        if kind in (None, "unknown"):
            kind = DEFAULT_KIND
        vendor = gpu_vendor or DEFAULT_GPU_VENDOR
        if (kind, vendor) not in self._as_read_by:
            self._as_read_by[(kind, vendor)] = self._read_by(kind, vendor)
        return self._as_read_by[(kind, vendor)]

    def _read_by(self, kind: str, vendor: str) -> "LoadedRunbook":
        runbook = self.runbook.model_copy(update={"hypotheses": [h.own(kind, vendor) for h in self.runbook.hypotheses]})
        by_id: dict[str, list[tuple[str, Rule]]] = {}
        for (hid, key), rule in self.rules.items():
            by_id.setdefault(hid, []).append((key, rule))
        rules: dict[tuple[str, str], Rule] = {}
        for hyp, _ in self.runbook.walk():
            variant = hyp.servers.get(kind)
            over = {f for f in variant.model_fields_set if getattr(variant, f) is not None} if variant is not None else set()
            gpu_variant = hyp.gpus.get(vendor)  # type: ignore[call-overload]
            gpu_over = set(gpu_variant.fields_over()) if gpu_variant is not None else set()
            kept = [i for i, st in enumerate(hyp.next_steps if not isinstance(hyp.next_steps, str) else [])
                    if isinstance(st, str) or st.server in (None, kind)]  # fmt: skip
            new_index = {old: new for new, old in enumerate(kept)}
            for key, rule in by_id.get(hyp.id, []):
                if key.startswith("gpus."):
                    _, owner, rest = key.split(".", 2)
                    if owner == vendor:
                        rules[(hyp.id, rest)] = rule  # the GPU variant's headline fields
                    continue
                if key.split(".")[0] in gpu_over or (key.startswith("servers.") and key.split(".")[2] in gpu_over):
                    continue  # the GPU variant's text replaced this field (its steps have no rules)
                if key.startswith("servers."):
                    _, owner, rest = key.split(".", 2)
                    if owner == kind:
                        rules[(hyp.id, rest)] = rule
                    continue
                field_name = key.split(".")[0]
                if field_name in over:
                    continue
                if field_name == "next_steps":
                    _, index, rest = key.split(".", 2)
                    if int(index) in new_index:
                        rules[(hyp.id, f"next_steps.{new_index[int(index)]}.{rest}")] = rule
                    continue
                rules[(hyp.id, key)] = rule
        return LoadedRunbook(path=self.path, runbook=runbook, rules=rules, locs=self.locs, document=self.document)


# ---------------------------------------------------------------------------------------------
# finding runbooks


def bundled_dir(kind: str) -> Path:
    """runbooks/ or templates/: inside the wheel (engine/_bundled) or at the top of a source checkout."""
    here = Path(__file__).resolve().parent
    installed = here / "_bundled" / kind
    return installed if installed.is_dir() else here.parent / kind


def search_dirs() -> list[Path]:
    dirs = [Path.cwd() / "runbooks"]
    dirs += [Path(p) for p in os.environ.get("RUNBOOK_PATH", "").split(os.pathsep) if p]
    dirs.append(bundled_dir("runbooks"))
    seen: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [s.resolve() for s in seen]:
            seen.append(d)
    return seen


def available() -> dict[str, Path]:
    """Runbook name -> file, earlier search directories winning (./runbooks shadows the bundled ones)."""
    found: dict[str, Path] = {}
    for directory in search_dirs():
        for file in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml")):
            if not file.stem.endswith(".tests"):  # `<runbook>.tests.yaml` holds a runbook's scenario tests
                found.setdefault(file.stem, file)
    return found


def find(name_or_path: str) -> Path:
    path = Path(name_or_path)
    try:
        is_file = path.is_file()
        exists = is_file or path.exists()
    except OSError as exc:  # a name longer than the OS allows (ENAMETOOLONG), a loop of links...
        raise SourceError(_clip_path(name_or_path), None, f"cannot open: {exc.strerror or exc}") from None
    if path.suffix in {".yaml", ".yml"} or exists:
        if not is_file:
            raise SourceError(_clip_path(name_or_path), None, "no such runbook file")
        return path
    runbooks = available()
    if name_or_path in runbooks:
        return runbooks[name_or_path]
    names = ", ".join(sorted(runbooks)) or "none"
    raise SourceError(name_or_path, None, f"no runbook named '{name_or_path}' (available: {names})")


def _clip_path(name: str, limit: int = 120) -> str:
    """A path as it goes into an error line: a 5,000-character name must not fill the terminal."""
    return name if len(name) <= limit else f"{name[:60]}...{name[-40:]} ({len(name)} characters)"


# ---------------------------------------------------------------------------------------------
# loading


UNION_TAGS = {"str", "NextStep"}  # pydantic names the branch of a union it tried in the error's path


def _without_union_tags(loc: tuple) -> tuple:
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in UNION_TAGS)))


def _union_noise(errors: list[dict]) -> list[dict]:
    """`next_steps` is a text or a list of steps: keep the error of the branch that was meant (the
    deepest one), not "Input should be a valid string" for every other branch."""
    cleaned = [_without_union_tags(tuple(e["loc"])) for e in errors]
    out = []
    for err, loc in zip(errors, cleaned):
        tagged = tuple(err["loc"]) != loc
        deeper = any(other[: len(loc)] == loc and len(other) > len(loc) for other in cleaned)
        if tagged and err["type"] == "string_type" and deeper:
            continue
        out.append({**err, "loc": loc})
    return out


def schema_errors(doc: yamlpos.Document, exc: ValidationError) -> list[SourceError]:
    errors = []
    for err in _union_noise(exc.errors()):
        loc = tuple(err["loc"])
        kind = err["type"]
        if kind == "extra_forbidden":
            errors.append(doc.error(loc, f"unknown key '{loc[-1]}'", key=True))
        elif kind == "missing":
            errors.append(doc.error(loc[:-1], f"missing required field '{loc[-1]}'"))
        elif kind == "string_pattern_mismatch" and loc and loc[-1] in ("id", "name"):
            errors.append(doc.error(loc, f"{loc[-1]} '{err['input']}' must be kebab-case: lower-case letters and digits joined by '-'"))
        else:
            where = ".".join(str(p) for p in loc) or "document"
            msg = err["msg"].removeprefix("Value error, ")
            errors.append(doc.error(loc, f"{where}: {msg}"))
    return errors


def load(path: str | Path, registry: Registry) -> LoadedRunbook:
    """Load and check one runbook file. Raises LoadError carrying every problem found."""
    try:
        doc = yamlpos.load(path)
    except SourceError as exc:
        raise LoadError([exc]) from None
    if not isinstance(doc.data, dict):
        raise LoadError([doc.error((), "a runbook must be a mapping with name, title and hypotheses")])
    try:
        runbook = Runbook.model_validate(doc.data)
    except ValidationError as exc:
        raise LoadError(schema_errors(doc, exc)) from None
    loaded = LoadedRunbook(path=str(path), runbook=runbook, document=doc)
    errors: list[SourceError] = []

    for rel in runbook.probe_files:
        file = (Path(path).parent / rel).resolve()
        before = len(registry.errors)
        registry.load_file(file)
        for err in registry.errors[before:]:
            errors.append(doc.error(("probe_files",), f"probe file {rel}: {err.message}"))

    defaults = {name: p.default for name, p in runbook.params.items()}
    if runbook.load is not None:
        unknown = unknown_refs(runbook.load.model_dump(), defaults)
        for name in unknown:
            errors.append(doc.error(("load",), f"load refers to unknown param '${{{name}}}'"))
        non_finite = [(key, value) for key, value in runbook.load.model_dump().items() if _non_finite(value)]
        for key, value in non_finite:
            errors.append(doc.error(("load", key), f"load.{key}: expected a finite number, got {value} (inf and nan are not accepted)"))
        if not unknown and not non_finite:
            resolved = resolve_refs(runbook.load.model_dump(), defaults)
            if truthy(resolved.get("enabled", True)):
                try:
                    load_config(resolved)
                except ValueError as exc:
                    field = str(exc).split(":")[1].strip() if str(exc).count(":") >= 2 else ""
                    where = ("load", field) if field in runbook.load.model_fields else ("load",)
                    errors.append(doc.error(where, f"{exc} (with the params' defaults)"))

    seen: dict[str, Loc] = {}

    def visit(hyp: Hypothesis, loc: Loc, visible: dict[str, str]) -> None:
        if hyp.id in seen:
            errors.append(doc.error(loc + ("id",), f"duplicate hypothesis id '{hyp.id}' (first at line {doc.pos(seen[hyp.id] + ('id',)).line})"))
        seen.setdefault(hyp.id, loc)
        loaded.locs.setdefault(hyp.id, loc)
        for alias, call in hyp.probes.items():
            errors.extend(_check_call(doc, registry, loc + ("probes", alias), call.probe, call.with_, defaults))
        in_scope = {**visible, **{alias: call.probe for alias, call in hyp.probes.items()}}  # alias -> probe name

        def check_rule(key: str, floc: Loc, source: str, label: str, host: tuple[str, int] | None = None,
                       kind: str | None = None) -> None:
            """`host`: the text the rule sits in and where it starts there (a headline's `{{ field }}`); `kind`: the
            server kind of a `servers.<kind>` variant, whose family's values the rule's paths are checked against."""

            def where(line: int, col: int) -> Any:
                if host is None:
                    return doc.inner_pos(floc, line, col, source)
                text, start = host
                offset = start + sum(len(part) + 1 for part in source.split("\n")[: line - 1]) + col - 1
                before = text[:offset]
                return doc.inner_pos(floc, before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1, text)

            try:
                rule = compile_rule(source)
            except RuleSyntaxError as exc:
                errors.append(SourceError(doc.path, where(exc.line, exc.col), f"{label}: {exc.message}"))
                return
            for name in sorted(rule.names - set(in_scope) - {"params", "load"}):
                choices = ", ".join(sorted(in_scope)) or "none"
                errors.append(doc.error(floc, f"{label}: '{name}' is not a probe alias this rule can see (visible: {choices})"))
            for p in rule.paths:
                parts = p.split(".")
                if parts[0] == "params" and (len(parts) < 2 or parts[1] not in defaults):
                    errors.append(doc.error(floc, f"{label}: unknown param '{parts[1] if len(parts) > 1 else ''}'"))
            for ref, problem in value_problems(rule, in_scope, registry, kind):
                errors.append(SourceError(doc.path, where(*ref.positions[1 + problem.index]), f"{label}: {problem.message}"))
            loaded.rules[(hyp.id, key)] = rule

        def check_fields(obj: Any, prefix: str, at: Loc, kind: str | None = None) -> None:
            """Every rule of a hypothesis (prefix "") or of one of its server variants (prefix "servers.<kind>.")."""
            tag = prefix.rstrip(".") + ": " if prefix else ""
            for field_name in RULE_FIELDS:
                source = getattr(obj, field_name)
                if source is not None:
                    check_rule(prefix + field_name, at + (field_name,), source, tag + field_name, kind=kind)
            if obj.next_steps is not None and not isinstance(obj.next_steps, str):
                for i, step in enumerate(obj.next_steps):
                    if isinstance(step, str):
                        continue
                    if step.when is not None:
                        check_rule(f"{prefix}next_steps.{i}.when", at + ("next_steps", i, "when"), step.when, f"{tag}next_steps[{i}].when", kind=kind)
                    for j, (expr, unit, start) in enumerate(headline_spans(step.text)):
                        if unit not in UNITS:
                            errors.append(doc.error(at + ("next_steps", i, "text"), f"{tag}next_steps[{i}].text: unknown unit '{unit}'"))
                        check_rule(f"{prefix}next_steps.{i}.text.{j}", at + ("next_steps", i, "text"), expr, f"{tag}next_steps[{i}].text field {j + 1}",
                                   host=(step.text, start), kind=kind)
                    if step.gain is not None:
                        check_rule(f"{prefix}next_steps.{i}.gain", at + ("next_steps", i, "gain", "factor"), step.gain.factor,
                                   f"{tag}next_steps[{i}].gain.factor", kind=kind)
            if obj.cost is not None:
                check_rule(prefix + "cost", at + ("cost",), obj.cost, tag + "cost", kind=kind)
            if obj.not_limiting is not None:
                nl = obj.not_limiting
                check_rule(prefix + "not_limiting.when", at + ("not_limiting", "when"), nl.when, tag + "not_limiting.when", kind=kind)
                for j, (expr, unit, start) in enumerate(headline_spans(nl.says)):
                    if unit not in UNITS:
                        errors.append(doc.error(at + ("not_limiting", "says"), f"{tag}not_limiting.says: unknown unit '{unit}'"))
                    check_rule(f"{prefix}not_limiting.says.{j}", at + ("not_limiting", "says"), expr, f"{tag}not_limiting.says field {j + 1}",
                               host=(nl.says, start), kind=kind)
            for j, (expr, unit, start) in enumerate(headline_spans(obj.headline or "")):
                if unit not in UNITS:
                    errors.append(doc.error(at + ("headline",), f"{tag}headline: unknown unit '{unit}' in '{{{{ {expr} | {unit} }}}}' (units: {', '.join(u for u in UNITS if u)})"))
                check_rule(f"{prefix}headline.{j}", at + ("headline",), expr, f"{tag}headline field {j + 1} ('{' '.join(expr.split())}')",
                           host=(obj.headline, start), kind=kind)

        check_fields(hyp, "", loc)
        for kind, variant in hyp.servers.items():
            check_fields(variant, f"servers.{kind}.", loc + ("servers", kind), kind)
        for vendor, gpu_variant in hyp.gpus.items():  # text only: a headline's fields are its one kind of rule
            at, tag = loc + ("gpus", vendor, "headline"), f"gpus.{vendor}: headline"
            for j, (expr, unit, start) in enumerate(headline_spans(gpu_variant.headline or "")):
                if unit not in UNITS:
                    errors.append(doc.error(at, f"{tag}: unknown unit '{unit}' in '{{{{ {expr} | {unit} }}}}' (units: {', '.join(u for u in UNITS if u)})"))
                check_rule(f"gpus.{vendor}.headline.{j}", at, expr, f"{tag} field {j + 1} ('{' '.join(expr.split())}')",
                           host=(gpu_variant.headline or "", start))
        for i, child in enumerate(hyp.children):
            visit(child, loc + ("children", i), in_scope)

    for i, root in enumerate(runbook.hypotheses):
        visit(root, ("hypotheses", i), {})

    errors.extend(_check_follows(doc, runbook, loaded.locs))
    for hyp, _ in runbook.walk():  # a step's `after:` names hypotheses of this runbook
        lists = [("", hyp.next_steps)] + [(f"servers.{k}.", v.next_steps) for k, v in hyp.servers.items()]
        for prefix, steps in lists:
            for i, step in enumerate(steps if isinstance(steps, list) else []):
                for j, other in enumerate(getattr(step, "after", []) or []):
                    if other not in loaded.locs:
                        where = tuple(prefix.rstrip(".").split(".")) if prefix else ()
                        at = loaded.locs[hyp.id] + where + ("next_steps", i, "after", j)
                        errors.append(doc.error(at, f"{prefix}next_steps[{i}].after: unknown hypothesis '{other}'"))

    for i, test in enumerate(runbook.tests):
        for hid in test.expect:
            if hid not in seen:
                errors.append(doc.error(("tests", i, "expect", hid), f"expected verdict for unknown hypothesis '{hid}'", key=True))
        for hid in test.limiting:
            if hid not in seen:
                errors.append(doc.error(("tests", i, "limiting", hid), f"limiting expected for unknown hypothesis '{hid}'", key=True))
        for hid in test.also:
            if hid not in test.expect:
                errors.append(doc.error(("tests", i, "also", hid), f"also: '{hid}' has no verdict under expect (also names a second one)", key=True))
        for name in test.set:
            if name not in defaults:
                errors.append(doc.error(("tests", i, "set", name), f"unknown param '{name}'", key=True))

    for depth, sets in runbook.depths.items():
        for name in sets:
            if name not in defaults:
                errors.append(doc.error(("depths", depth, name), f"depths.{depth}: unknown param '{name}'", key=True))

    if errors:
        raise LoadError(errors)
    return loaded


def value_problems(rule: Rule, in_scope: dict[str, str], registry: Registry, kind: str | None = None) -> list[tuple[Ref, PathProblem]]:
    """The paths of a rule that the probe behind their alias never returns (by its `Values` model), each once.

    A server probe is checked against the family of `kind` (a `servers.<kind>` variant's rule), else against every
    family of its role: a path one of them returns is valid. `load` is checked against the load report; a probe
    without a model, or one that failed to load, is not."""
    out: list[tuple[Ref, PathProblem]] = []
    seen: set[tuple[str, ...]] = set()  # the wrong part of each path reported: `x.bad` and `x.bad.y` once
    for ref in rule.refs:
        root, rest = ref.parts[0], ref.parts[1:]
        models: list[tuple[Any, str]] = [(_load_report_model(), "the load report")] if root == "load" else []
        if root in in_scope:
            name = in_scope[root]
            probes = [registry.for_target(name, kind)] if kind is not None and registry.knows(name) else registry.families(name)
            models = [(getattr(p, "Values", None), p.name) for p in probes]
            if any(m is None for m, _ in models):
                models = []  # a probe that declares nothing is not checked
        if not models or not rest:
            continue
        problems = [check_path(model, rest, owner) for model, owner in models]
        problem = None if any(p is None for p in problems) else problems[0]
        if problem is not None and ref.parts[: problem.index + 2] not in seen:
            seen.add(ref.parts[: problem.index + 2])
            out.append((ref, problem))
    return out


def _load_report_model() -> Any:
    from .load import RuleLoad  # lazily: the load generator is not needed to validate a file

    return RuleLoad


def _check_follows(doc: yamlpos.Document, runbook: Runbook, locs: dict[str, Loc]) -> list[SourceError]:
    """`follows:` names other hypotheses of this runbook, never itself, and never in a circle."""
    errors: list[SourceError] = []
    graph: dict[str, list[str]] = {}
    for hyp, _ in runbook.walk():
        for i, other in enumerate(hyp.follows):
            at = locs[hyp.id] + ("follows", i)
            if other == hyp.id:
                errors.append(doc.error(at, f"follows: '{other}' is this hypothesis itself"))
            elif other not in locs:
                errors.append(doc.error(at, f"follows: unknown hypothesis '{other}' (ids: {', '.join(sorted(locs))})"))
            else:
                graph.setdefault(hyp.id, []).append(other)
    reported: set[str] = set()
    for start in graph:
        path, stack = [start], [iter(graph.get(start, []))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                path.pop()
            elif nxt == start and start not in reported:
                reported.update(path)
                cycle = " -> ".join(path + [start])
                errors.append(doc.error(locs[start] + ("follows",), f"follows: a cycle ({cycle}): a consequence cannot be its own cause"))
            elif nxt not in path and nxt != start:
                path.append(nxt)
                stack.append(iter(graph.get(nxt, [])))
    return errors


def _check_call(doc: yamlpos.Document, registry: Registry, loc: Loc, probe: str, params: dict[str, Any], defaults: dict[str, Any]) -> list[SourceError]:
    if not registry.knows(probe):
        plugin = registry.error_for(probe)
        if plugin:
            return [doc.error(loc + ("probe",), f"probe '{probe}' failed to load ({plugin.source}): {plugin.message}")]
        known = ", ".join(sorted([*registry.probes, *(r for r in ROLES if registry.is_role(r))])) or "none"
        return [doc.error(loc + ("probe",), f"unknown probe '{probe}' (known: {known}; a probe in a file loads with --probes-dir DIR or the runbook's probe_files)")]
    missing = unknown_refs(params, defaults)
    if missing:
        return [doc.error(loc + ("with",), f"unknown param '${{{name}}}'") for name in missing]
    bad = [key for key, value in params.items() if _non_finite(value)]
    if bad:
        return [doc.error(loc + ("with", key), f"probe '{probe}' parameter '{key}': expected a finite number (inf and nan are not accepted)") for key in bad]
    try:
        registry.lookup(probe).Params.model_validate(resolve_refs(params, defaults))  # type: ignore[union-attr]
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            key = err["loc"][0] if err["loc"] else None
            at = loc + ("with", key) if key is not None else loc + ("with",)
            if err["type"] == "extra_forbidden":
                out.append(doc.error(at, f"probe '{probe}' has no parameter '{key}'", key=True))
            else:
                out.append(doc.error(at, f"probe '{probe}' parameter '{key}': {err['msg']}"))
        return out
    return []


def _non_finite(value: Any) -> bool:
    """inf or nan anywhere in a value: a timeout or window of `.inf` would never end, nan compares false."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    return False


def load_path_or_name(name_or_path: str, registry: Registry) -> LoadedRunbook:
    try:
        path = find(name_or_path)
    except SourceError as exc:
        raise LoadError([exc]) from None
    try:
        return load(path, registry)
    except SourceError as exc:
        raise LoadError([exc]) from None
