"""The runner on real probes (from tests/probe_files): scheduling, dedup, timeouts, cancellation, verdicts."""

from __future__ import annotations

import asyncio

import pytest

from gpu_runbook.events import RunFinished, VerdictReached
from gpu_runbook.model import Verdict
from gpu_runbook.target import Target
from gpu_runbook.runner import ParamError, Runner, resolve_params


def run(loaded, registry, params=None, subscribers=()):
    runner = Runner(loaded, registry, Target(), resolve_params(loaded, params or {}), subscribers=subscribers)
    return runner, asyncio.run(runner.run())


def verdicts(results):
    return {h.id: h.verdict.value for h in results.hypotheses}


def test_siblings_run_concurrently(load_runbook, registry, test_probes):
    loaded = load_runbook("""
        name: concurrent
        title: t
        hypotheses:
          - id: a
            title: A
            probes: { x: { probe: test.value, with: { delay_s: 0.3, tag: a, values: { v: 1 } } } }
            confirm: x.v == 1.0
          - id: b
            title: B
            probes: { y: { probe: test.value, with: { delay_s: 0.3, tag: b, values: { v: 2 } } } }
            confirm: y.v == 2.0
    """)
    _, results = run(loaded, registry)
    assert verdicts(results) == {"a": "confirmed", "b": "confirmed"}
    a, b = (next(c for c in test_probes.CALLS if c["tag"] == t) for t in "ab")
    assert a["start"] < b["end"] and b["start"] < a["end"], "the two probes did not overlap"


def test_identical_calls_run_once_and_are_shared(load_runbook, registry, test_probes):
    loaded = load_runbook("""
        name: dedup
        title: t
        hypotheses:
          - id: a
            title: A
            probes: { x: { probe: test.value, with: { tag: same, values: { v: 1 } } } }
            confirm: x.v == 1.0
            children:
              - id: b
                title: B
                probes: { again: { probe: test.value, with: { tag: same, values: { v: 1 } } } }
                confirm: again.v == 1.0 && x.v == 1.0
          - id: c
            title: C
            probes: { other: { probe: test.value, with: { tag: same, values: { v: 1 } } } }
            confirm: other.v == 1.0
    """)
    _, results = run(loaded, registry)
    assert verdicts(results) == {"a": "confirmed", "b": "confirmed", "c": "confirmed"}
    assert [c["tag"] for c in test_probes.CALLS] == ["same"]
    assert len(results.probes) == 1
    assert sorted(results.probes[0].used_by) == ["a:x", "b:again", "c:other"]


def test_timeout_marks_branch_error_and_run_goes_on(load_runbook, registry):
    loaded = load_runbook("""
        name: timeouts
        title: t
        hypotheses:
          - id: slow
            title: Slow
            probes: { s: { probe: test.sleep, with: { seconds: 5 }, timeout_s: 0.2 } }
            confirm: s.slept_s > 0.0
          - id: fine
            title: Fine
            probes: { x: { probe: test.value, with: { values: { v: 1 } } } }
            confirm: x.v == 1.0
    """)
    _, results = run(loaded, registry)
    slow = results.by_id("slow")
    assert slow.verdict is Verdict.error
    assert slow.reason == "test.sleep failed: timed out after 0.2 s"
    assert results.by_id("fine").verdict is Verdict.confirmed


def test_failing_probe_is_error_unless_rules_decide_without_it(load_runbook, registry):
    loaded = load_runbook("""
        name: failing
        title: t
        hypotheses:
          - id: needs-it
            title: Needs the failing probe
            probes: { f: { probe: test.fail, with: { message: "no such device" } } }
            confirm: f.v > 1.0
          - id: decides-anyway
            title: Decides on other evidence
            probes:
              f: { probe: test.fail }
              x: { probe: test.value, with: { values: { v: 1 } } }
            confirm: x.v == 1.0 || f.v > 1.0
    """)
    _, results = run(loaded, registry)
    assert results.by_id("needs-it").verdict is Verdict.error
    assert results.by_id("needs-it").reason == "test.fail failed: RuntimeError: no such device"
    assert results.by_id("decides-anyway").verdict is Verdict.confirmed


def test_verdict_precedence_and_reasons(load_runbook, registry):
    loaded = load_runbook("""
        name: precedence
        title: t
        params:
          limit: { type: float, default: 600.0 }
        hypotheses:
          - id: both-true
            title: confirm wins over refute
            probes: { p: { probe: test.value, with: { values: { draw_w: 235, max_w: 600 } } } }
            confirm: p.draw_w / p.max_w < 0.7
            refute: p.draw_w > 0.0
          - id: refuted
            title: refute
            probes: { p: { probe: test.value, with: { values: { draw_w: 590 } } } }
            confirm: p.draw_w < 0.7 * params.limit
            refute: p.draw_w >= 0.9 * params.limit
          - id: in-between
            title: neither
            probes: { p: { probe: test.value, with: { values: { draw_w: 500 } } } }
            confirm: p.draw_w < 0.7 * params.limit
            refute: p.draw_w >= 0.9 * params.limit
          - id: missing
            title: a value the probe did not report
            probes: { p: { probe: test.value, with: { values: { draw_w: 500, temp_c: null } } } }
            confirm: p.sm_clock_mhz < 1000.0
            refute: p.temp_c > 90.0
          - id: unavailable
            title: a probe whose subject is not there
            probes: { g: { probe: test.unavailable } }
            confirm: g.power_w > 1.0
    """)
    _, results = run(loaded, registry)
    assert verdicts(results) == {
        "both-true": "confirmed", "refuted": "refuted", "in-between": "inconclusive",
        "missing": "inconclusive", "unavailable": "inconclusive",
    }
    first = results.by_id("both-true")
    assert first.reason == "confirm: p.draw_w / p.max_w < 0.7 [p.draw_w=235, p.max_w=600]"
    assert first.rule == "p.draw_w / p.max_w < 0.7"
    assert first.rule_values == {"p.draw_w": 235.0, "p.max_w": 600.0}
    assert results.by_id("refuted").reason.startswith("refute: p.draw_w >= 0.9 * params.limit [p.draw_w=590, params.limit=600]")
    assert "neither rule held" in results.by_id("in-between").reason
    assert results.by_id("missing").reason == "cannot decide: p.sm_clock_mhz is missing, p.temp_c is missing"
    assert results.by_id("unavailable").reason == "test.unavailable unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"


def test_int_literal_in_arithmetic_is_an_error_that_says_how_to_fix(load_runbook, registry):
    loaded = load_runbook("""
        name: intlit
        title: t
        hypotheses:
          - id: a
            title: A
            probes: { p: { probe: test.value, with: { values: { w: 300 } } } }
            confirm: p.w / 2 > 100.0
    """)
    _, results = run(loaded, registry)
    assert results.by_id("a").verdict is Verdict.error
    assert "write numbers in rules with a decimal point (2.0, not 2)" in results.by_id("a").reason


def test_explore_policies_and_preconditions(load_runbook, registry):
    loaded = load_runbook("""
        name: explore
        title: t
        hypotheses:
          - id: refuted-root
            title: children not explored
            probes: { p: { probe: test.value, with: { values: { v: 0 } } } }
            confirm: p.v > 0.0
            refute: p.v == 0.0
            children:
              - id: hidden
                title: never runs
                probes: { q: { probe: test.value, with: { tag: hidden } } }
                confirm: "true"
                children:
                  - id: hidden-grandchild
                    title: never runs either
                    confirm: "true"
          - id: always-root
            title: children explored anyway
            explore: always
            probes: { p: { probe: test.value, with: { values: { v: 0 } } } }
            confirm: p.v > 0.0
            refute: p.v == 0.0
            children:
              - id: explored
                title: runs
                probes: { q: { probe: test.value, with: { values: { cc: 9 } } } }
                when: q.cc == 12.0
                confirm: "true"
              - id: explored-2
                title: runs, sees its parent's evidence
                confirm: p.v == 0.0
    """)
    _, results = run(loaded, registry)
    assert verdicts(results) == {
        "refuted-root": "refuted", "hidden": "skipped", "hidden-grandchild": "skipped",
        "always-root": "refuted", "explored": "skipped", "explored-2": "confirmed",
    }
    assert results.by_id("hidden").reason == "not explored: refuted-root is refuted"
    assert results.by_id("hidden-grandchild").parent == "hidden"
    assert results.by_id("explored").reason == "precondition false: q.cc == 12.0 [q.cc=9]"


def test_cancellation_keeps_what_was_found(load_runbook, registry):
    loaded = load_runbook("""
        name: cancel
        title: t
        hypotheses:
          - id: quick
            title: Quick
            probes: { x: { probe: test.value, with: { values: { v: 1 } } } }
            confirm: x.v == 1.0
          - id: slow
            title: Slow
            probes: { s: { probe: test.sleep, with: { seconds: 30 } } }
            confirm: s.slept_s > 0.0
    """)
    runner = Runner(loaded, registry, Target())

    async def main():
        quick_decided = asyncio.Event()
        runner.subscribers.append(lambda e: quick_decided.set() if isinstance(e, VerdictReached) and e.id == "quick" else None)
        task = asyncio.create_task(runner.run())
        await asyncio.wait_for(quick_decided.wait(), 30)  # then stop, with `slow` still sleeping
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    results = runner.snapshot(interrupted=True)
    assert results.interrupted
    assert results.by_id("quick").verdict is Verdict.confirmed
    assert results.by_id("slow").verdict is Verdict.inconclusive
    assert results.by_id("slow").reason == "interrupted"
    sleep_call = next(p for p in results.probes if p.probe == "test.sleep")
    assert sleep_call.reason == "interrupted"


def test_events_in_order_and_failing_renderer_stops_cleanly(load_runbook, registry):
    text = """
        name: events
        title: t
        hypotheses:
          - id: a
            title: A
            probes: { x: { probe: test.value, with: { values: { v: 1 } } } }
            confirm: x.v == 1.0
            children:
              - id: b
                title: B
                probes: { s: { probe: test.sleep, with: { seconds: SECONDS } } }
                confirm: s.slept_s > 0.0
    """
    seen = []
    _, results = run(load_runbook(text.replace("SECONDS", "0.1")), registry, subscribers=[seen.append])
    kinds = [type(e).__name__ for e in seen]
    assert kinds[0] == "RunStarted" and kinds[-1] == "RunFinished"
    assert kinds.index("ProbeFinished") < kinds.index("VerdictReached")
    assert isinstance(seen[-1], RunFinished)

    def broken_renderer(event):
        if isinstance(event, VerdictReached):
            raise RuntimeError("renderer died")

    runner = Runner(load_runbook(text.replace("SECONDS", "30")), registry, Target(), subscribers=[broken_renderer])

    async def main():
        with pytest.raises(asyncio.CancelledError):
            await runner.run()

    asyncio.run(main())
    assert isinstance(runner.renderer_error, RuntimeError)
    partial = runner.snapshot(interrupted=True)
    assert partial.by_id("a").verdict is Verdict.confirmed


def test_params_are_type_checked(load_runbook):
    loaded = load_runbook("""
        name: params
        title: t
        params:
          seconds: { type: float, default: 15 }
          generate_load: { type: bool, default: true }
        hypotheses:
          - id: a
            title: A
            confirm: "true"
    """)
    assert resolve_params(loaded, {"seconds": "2.5", "generate_load": "false"}) == {"seconds": 2.5, "generate_load": False}
    with pytest.raises(ParamError, match="param 'seconds': expected float, got 'soon'"):
        resolve_params(loaded, {"seconds": "soon"})
    with pytest.raises(ParamError, match="unknown param 'secs'"):
        resolve_params(loaded, {"secs": "1"})


def test_rerun_runs_the_branch_again(load_runbook, registry, test_probes):
    loaded = load_runbook("""
        name: rerun
        title: t
        hypotheses:
          - id: a
            title: A
            probes: { x: { probe: test.value, with: { tag: a, values: { v: 1 } } } }
            confirm: x.v == 1.0
            children:
              - id: b
                title: B
                probes: { y: { probe: test.value, with: { tag: b, values: { v: 2 } } } }
                confirm: y.v == 2.0
    """)
    runner = Runner(loaded, registry, Target())

    async def main():
        await runner.run()
        return await runner.rerun("b")

    results = asyncio.run(main())
    assert [c["tag"] for c in test_probes.CALLS] == ["a", "b", "b"]
    assert verdicts(results) == {"a": "confirmed", "b": "confirmed"}


def test_a_step_that_builds_on_a_refuted_hypothesis_is_not_offered(load_runbook, registry, test_probes):
    """`after:` names what a step builds on ("larger batches first (see kv-cache-wall)"): with none of those
    confirmed the step is left out, saying why; with one confirmed it is offered."""
    text = """
        name: after
        title: t
        hypotheses:
          - id: wall
            title: the wall
            probes: { x: { probe: test.value, with: { values: { v: WALL } } } }
            confirm: x.v == 1.0
            refute: x.v == 0.0
          - id: small
            title: small batches
            probes: { y: { probe: test.value, with: { values: { v: 1 } } } }
            confirm: y.v == 1.0
            next_steps:
              - text: larger batches first (see `wall`)
                after: [wall]
              - a step of its own
    """
    for wall, offered in ((0, False), (1, True)):
        _, results = run(load_runbook(text.replace("WALL", str(wall))), registry)
        steps = next(h for h in results.hypotheses if h.id == "small").steps
        assert steps[0].applies is offered and steps[1].applies is True
        if not offered:
            assert steps[0].reason == "builds on what is not confirmed: `wall` refuted"


def test_a_step_after_an_unknown_hypothesis_is_a_load_error(load_runbook):
    from gpu_runbook.loader import LoadError

    with pytest.raises(LoadError, match=r"next_steps\[0\]\.after: unknown hypothesis 'nope'"):
        load_runbook("""
            name: after
            title: t
            hypotheses:
              - id: small
                title: small batches
                probes: { y: { probe: test.value, with: { values: { v: 1 } } } }
                confirm: y.v == 1.0
                next_steps:
                  - { text: larger batches first, after: [nope] }
        """)
