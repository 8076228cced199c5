"""`runbook test`: run a runbook against simulated scenarios and compare verdicts with the expected ones.

A runbook is tested the way code is: each entry of its `tests:` section (or of a sidecar
`<stem>.tests.yaml` next to it, same format) names a scenario, param overrides (`set`) and the
verdict expected per hypothesis id. Every hypothesis is shown; only those with an expectation are
compared. Scenarios run one after another unless `-j N` asks for N at once, each in its own process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import yamlpos
from .loader import LoadedRunbook, LoadError, schema_errors
from .model import ScenarioTest
from .progress import clip
from .registry import Registry
from .results import HypothesisResult, Results
from .rules import RuleSyntaxError, compile_rule, evaluate, lookup, to_cel_data, with_value
from .judge import rule_data
from .sim.scenario import scenario_with
from .runner import ParamError, Runner, resolve_params
from .yamlpos import SourceError


class TestsFile(BaseModel):
    """A sidecar `<runbook stem>.tests.yaml`: only a `tests:` list."""

    model_config = ConfigDict(extra="forbid")
    tests: list[ScenarioTest] = Field(default_factory=list)


@dataclass
class Case:
    test: ScenarioTest
    where: str  # FILE:LINE:COL of the entry, for the table header


def sidecar_path(runbook_path: str | Path) -> Path:
    p = Path(runbook_path)
    return p.with_name(f"{p.stem}.tests.yaml")


def collect_cases(loaded: LoadedRunbook) -> list[Case]:
    """The runbook's own tests plus its sidecar's, checked: ids, params and scenario names. Raises LoadError."""
    from .sim.scenario import find_scenario  # noqa: PLC0415

    ids = {h.id for h, _ in loaded.runbook.walk()}
    defaults = loaded.runbook.params
    errors: list[SourceError] = []
    cases: list[Case] = []
    sources: list[tuple[yamlpos.Document | None, str, list[ScenarioTest]]] = [(loaded.document, loaded.path, list(loaded.runbook.tests))]
    side = sidecar_path(loaded.path)
    if side.is_file():
        try:
            doc = yamlpos.load(side)
        except SourceError as exc:
            raise LoadError([exc]) from None
        if not isinstance(doc.data, dict):
            raise LoadError([doc.error((), "a tests file must be a mapping with a 'tests' list")])
        try:
            sidecar = TestsFile.model_validate(doc.data)
        except ValidationError as exc:
            raise LoadError(schema_errors(doc, exc)) from None
        sources.append((doc, str(side), sidecar.tests))
    for doc, path, tests in sources:
        for i, test in enumerate(tests):

            def err(loc: tuple[Any, ...], msg: str, key: bool = False) -> SourceError:
                return doc.error(("tests", i) + loc, msg, key=key) if doc is not None else SourceError(path, None, msg)

            if doc is not None and doc is not loaded.document:  # the loader already checked the runbook's own
                for hid in test.expect:
                    if hid not in ids:
                        errors.append(err(("expect", hid), f"expected verdict for unknown hypothesis '{hid}'", True))
                for hid in test.limiting:
                    if hid not in ids:
                        errors.append(err(("limiting", hid), f"limiting expected for unknown hypothesis '{hid}'", True))
                for name in test.set:
                    if name not in defaults:
                        errors.append(err(("set", name), f"unknown param '{name}'", True))
            scenario_path = test.scenario
            if not Path(scenario_path).is_absolute() and (Path(path).parent / scenario_path).is_file():
                scenario_path = str(Path(path).parent / scenario_path)  # a scenario file next to the runbook
            try:
                find_scenario(scenario_path)
            except SourceError as exc:
                errors.append(err(("scenario",), exc.message))
                continue
            pos = doc.pos(("tests", i)) if doc is not None else None
            where = f"{path}:{pos.line}" if pos else path
            try:
                scenario_with(scenario_path, test.scenario_set)
            except LoadError as exc:
                errors.extend(exc.errors)
                continue
            except ValueError as exc:
                errors.append(err(("scenario_set",), str(exc)))
                continue
            cases.append(Case(ScenarioTest(scenario=scenario_path, set=test.set, scenario_set=test.scenario_set, expect=test.expect,
                                            also=test.also, limiting=test.limiting), where))
    if errors:
        raise LoadError(errors)
    return cases


def run_case(loaded: LoadedRunbook, registry: Registry, case: Case) -> Results:
    """One scenario: a fresh simulated host, the runbook's defaults + the entry's `set`, no renderer."""
    from .sim.host import SimulatedHost  # noqa: PLC0415

    params = resolve_params(loaded, case.test.set)
    with SimulatedHost.start(scenario_with(case.test.scenario, case.test.scenario_set)) as host:
        target = host.target()
        runner = Runner(loaded, registry, target, params, gpu=host.gpu)
        results = asyncio.run(runner.run())
        results.target["simulator"] = host.report()
    return results


def _outcomes(loaded: LoadedRunbook, registry: Registry, cases: list[Case], jobs: int, probe_dirs: Sequence[str | Path]) -> Iterator[Results | str]:
    """Each case's results (or why it cannot run), in the cases' order; with `jobs` > 1 from a process pool."""
    if jobs <= 1 or len(cases) <= 1:
        for case in cases:
            try:
                yield run_case(loaded, registry, case)
            except (LoadError, ParamError) as exc:
                yield str(exc)
        return
    everything = collect_cases(loaded)  # a child finds its case by its place in the file, as it loads it
    where = [next(i for i, c in enumerate(everything) if c.where == case.where) for case in cases]
    dirs = [str(d) for d in probe_dirs]
    with ProcessPoolExecutor(max_workers=min(jobs, len(cases)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_case_in_child, str(loaded.path), dirs, i) for i in where]
        try:
            for f in futures:
                yield f.result()
        finally:
            for f in futures:
                f.cancel()


def _case_in_child(path: str, probe_dirs: list[str], index: int) -> Results | str:
    from .loader import load  # noqa: PLC0415

    registry = Registry.discover(probe_dirs)
    try:
        loaded = load(path, registry)
        return run_case(loaded, registry, collect_cases(loaded)[index])
    except (LoadError, ParamError) as exc:
        return str(exc)


def compare(case: Case, results: Results, out: TextIO, loaded: LoadedRunbook | None = None) -> list[str]:
    """Print the table; return the ids whose verdict differs from the expectation."""
    mismatches: list[str] = []
    values: list[tuple[str, dict[str, Any]]] = []  # what a mismatched hypothesis's rule read, unclipped
    rows: list[tuple[str, str, str, str, str]] = []
    seen: set[str] = set()
    for h in results.hypotheses:
        seen.add(h.id)
        expected = case.test.expect.get(h.id)
        also = case.test.also.get(h.id)
        actual = h.verdict.value
        if expected is None:
            mark = " "
        elif actual in (expected.value, also.value if also else None) and (
                h.id not in case.test.limiting or actual != "confirmed" or h.limiting is case.test.limiting[h.id]):
            mark = "ok"
        else:
            mark = "XX"
            mismatches.append(h.id)
            values.append((h.id, {k: v for _, read in _judged(results, h, loaded) for k, v in read.items()}))
        shown = (expected.value + (f"|{also.value}" if also else "")) if expected else "-"
        if h.id in case.test.limiting:
            shown += "" if case.test.limiting[h.id] else " (not limiting)"
        if h.limiting is False:
            actual += " (not limiting)"
        rows.append((mark, "  " * h.depth + h.id, shown, actual, h.reason))
    for hid, expected in case.test.expect.items():
        if hid not in seen:  # not reached (the run was interrupted)
            mismatches.append(hid)
            rows.append(("XX", hid, expected.value, "missing", "no verdict"))
    width = max([len(r[1]) for r in rows] + [10])
    out.write(f"  {'':2} {'hypothesis':<{width}}  {'expected':<12} {'actual':<12} reason\n")
    for mark, hid, exp, act, reason in rows:
        out.write(f"  {mark:2} {hid:<{width}}  {exp:<12} {act:<12} {clip(reason, 100)}\n")
    for hid, read in values:
        shown = ", ".join(f"{k}={v!r}" for k, v in read.items() if isinstance(v, (bool, int, float, str)) or v is None)
        out.write(f"     {hid} read: {clip(shown, 400)}\n")
    return mismatches


CONFIG_ROOTS = {"server", "model", "inv", "topo", "params"}  # probe ids whose values are configuration, by convention
NEAR_SHARE = 0.20  # a deciding value this close to its threshold (relative) can flip under CPU load or noise
_CMP = re.compile(r"([A-Za-z_][\w.\[\]\"']*|-?\d+(?:\.\d+)?(?:[eE]-?\d+)?)\s*(<=|>=|<|>)\s*([A-Za-z_][\w.\[\]\"']*|-?\d+(?:\.\d+)?(?:[eE]-?\d+)?)")


def _number(token: str, values: dict[str, Any], params: dict[str, Any]) -> float | None:
    try:
        return float(token)
    except ValueError:
        pass
    v = values.get(token)
    if v is None and token.startswith("params."):
        v = params.get(token[len("params."):])
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def near_thresholds(results: Results, case: Case, loaded: LoadedRunbook | None = None) -> list[str]:
    """Comparisons in the deciding rules of the expected hypotheses whose value sits within 20 % of the
    threshold (for a bounded quantity, 20 % of the room between the threshold and the bound on the value's
    side): a scenario whose verdict rests on one is a scenario defect (move the scenario, not the rule).
    An inconclusive verdict where neither rule held rests on both (given the runbook): a value near either
    threshold would tip it."""
    out: list[str] = []
    for h in results.hypotheses:
        if h.id not in case.test.expect:
            continue
        for source, read in _judged(results, h, loaded):
            for lhs, op, rhs in _CMP.findall(source):
                a, b = _number(lhs, read, results.params), _number(rhs, read, results.params)
                if a is None or b is None or (lhs[0].isdigit() or lhs[0] == "-") and (rhs[0].isdigit() or rhs[0] == "-"):
                    continue
                value, threshold, name = (a, b, lhs) if not (lhs[0].isdigit() or lhs[0] == "-") else (b, a, rhs)
                if name.split(".", 1)[0] in CONFIG_ROOTS:
                    continue  # a configuration fact (tp, expert count), not a measurement that can drift
                span = _room(name, value, threshold)
                if span > 0 and abs(value - threshold) <= NEAR_SHARE * span and _decides(results, h, source, name, value, threshold):
                    out.append(f"{h.id}: {name} = {value:g} against {threshold:g} ({op}), within {NEAR_SHARE:.0%} of the threshold")
    return out


def _judged(results: Results, h: HypothesisResult, loaded: LoadedRunbook | None) -> list[tuple[str, dict[str, Any]]]:
    """The rules a verdict rests on, with the values each read: the deciding rule, or both where neither held."""
    if h.rule:
        return [(h.rule, h.rule_values)]
    if loaded is None or h.verdict.value != "inconclusive" or "neither rule held" not in h.reason:
        return []
    data = rule_data(results.scope(h.id), results.params, results.load)
    rules = [loaded.rule(h.id, f) for f in ("confirm", "refute")]
    return [(r.source, {p: lookup(data, p) for p in r.paths}) for r in rules if r]


def _decides(results: Results, h: HypothesisResult, source: str, name: str, value: float, threshold: float) -> bool:
    """Would the rule say otherwise with this value across its threshold (mirrored, the same distance on the other
    side)? A comparison in a branch the rule did not take (`a ? x > 1 : y > 2`), or one another term outweighs,
    decides nothing here. Where the rule cannot be re-judged from the recorded evidence, it is taken to decide."""
    if "[" in name:
        return True
    try:
        rule = compile_rule(source)
    except RuleSyntaxError:
        return True
    data = rule_data(results.scope(h.id), results.params, results.load)
    base = evaluate(rule, data)
    if base.value is None or type(lookup(data, name)) is object:
        return True
    return evaluate(rule, with_value(data, name, to_cel_data(2 * threshold - value))).value != base.value


# Measurements that sit at their bound when they are what their rule looks for: a clock at its maximum, a batch at its
# cap, a full KV cache (0..1), a busy GPU (0..100 %). A share of a step stays relative: it rarely nears 1.
_BOUNDED = ((("kv_usage", "sm_clock_ratio", "running_to_cap"), 1.0), (("_pct",), 100.0))


def _room(name: str, value: float, threshold: float) -> float:
    """How far the value could sit from its threshold on its side: the threshold's own size (relative), or less where
    the quantity's bound is nearer (a healthy GPU's clock ratio of 0.99 against 0.9 uses most of the 0.1 left below
    1.0); below the threshold the bound is 0, which is the relative measure again."""
    parts = name.replace("[", ".").split(".")
    for names, top in _BOUNDED:
        if any(n in part or part == n.strip("_") for part in parts for n in names) and 0 <= threshold <= top:
            return min(threshold, top - threshold) if value >= threshold else threshold
    return abs(threshold)


def run_tests(loaded: LoadedRunbook, registry: Registry, scenarios: list[str], out: TextIO | None = None, jobs: int = 1,
              probe_dirs: Sequence[str | Path] = ()) -> bool:
    """Run every test (or those whose scenario is in `scenarios`); True when all verdicts match.

    `jobs` > 1 runs that many scenarios at once, each in its own process (a simulated host runs in real time and
    mostly waits; its threads would share the interpreter lock with the others'), which reload the runbook from
    its path and the probes from the entry points and `probe_dirs`. Tables print in the file's order."""
    out = out or sys.stdout
    try:
        cases = collect_cases(loaded)
    except LoadError as exc:
        for e in exc.errors:
            print(str(e), file=sys.stderr)
        return False
    if scenarios:
        from .sim.scenario import find_scenario  # noqa: PLC0415

        matches = lambda c, name: name in (c.test.scenario, Path(c.test.scenario).stem)  # noqa: E731
        for name in scenarios:
            if not any(matches(c, name) for c in cases):
                try:
                    find_scenario(name)  # a typo is a usage error; a real scenario without tests is not
                except SourceError as exc:
                    raise LoadError([exc]) from None
        cases = [c for c in cases if any(matches(c, name) for name in scenarios)]
    if not cases:
        where = f" for scenario(s) {', '.join(scenarios)}" if scenarios else ""
        print(f"{loaded.path}: no tests{where} (add a 'tests:' section or {sidecar_path(loaded.path).name})", file=sys.stderr)
        return False
    failed: list[str] = []
    outcomes = _outcomes(loaded, registry, cases, jobs, probe_dirs)
    for case in cases:
        sets = ", ".join(f"{k}={v}" for k, v in case.test.set.items())
        out.write(f"\n{Path(case.test.scenario).stem}" + (f" (set {sets})" if sets else "") + f"  [{case.where}]\n")
        out.flush()
        results = next(outcomes)
        if isinstance(results, str):
            out.write(f"  XX cannot run: {results}\n")
            failed.append(f"{Path(case.test.scenario).stem}: cannot run")
            continue
        bad = compare(case, results, out, loaded)
        for warning in near_thresholds(results, case, loaded):
            out.write(f"  !! near threshold: {warning}\n")
        sim = results.target.get("simulator") or {}
        out.write(f"  (simulator: {sim.get('server_cpu_seconds', '?')} CPU-s, peak running {sim.get('peak_running', '?')}, peak queued {sim.get('peak_queued', '?')})\n")
        failed += [f"{Path(case.test.scenario).stem}: {hid}" for hid in bad]
        out.flush()
    n = len(cases)
    if failed:
        out.write(f"\nFAILED: {len(failed)} mismatch(es) in {n} test(s): {'; '.join(failed)}\n")
    else:
        out.write(f"\nOK: {n} test(s), every expected verdict matched\n")
    out.flush()
    return not failed
