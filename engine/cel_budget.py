"""A cost budget for CEL evaluation, which cel-python does not have.

A rule is not Turing-complete, but nested macros over lists multiply (`l.all(a, l.all(b, l.all(c, ...)))`),
and `rejudge` and `diff` evaluate rules recorded in a results file, which anyone can write. Every rule is
therefore evaluated by an interpreter that counts the nodes it visits, watches the clock, and refuses lists
and strings past a size; the one that hits says which limit, with its name and value.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Any, Iterator

import celpy
import celpy.evaluation
from celpy import celtypes
from celpy.evaluation import Evaluator

# cel-python's evaluator writes `cast(Tuple[List[Result], Result], ...)` in its hot paths (every relation,
# sum, product, variable): each such subscript hashes the `Result` union of a dozen types, which typing does
# not cache, ~40 % of an evaluation (measured: 200 fleet hosts with distinct values judged in 9.0 s, not
# 16.2 s, identical results). Run time reads that name only there and in cast(), which ignores its type.
if getattr(celpy.evaluation, "Result", None) is not None:
    celpy.evaluation.Result = Any  # type: ignore[misc,assignment]

MAX_CEL_STEPS = 200_000  # expression nodes visited in one evaluation; the bundled rules take < 2,000
MAX_CEL_SECONDS = 2.0  # wall time for one evaluation
MAX_CEL_RUN_SECONDS = 20.0  # wall time for all evaluations of one rejudge or diff (`run_budget`)
MAX_CEL_LIST = 100_000  # elements of any list a rule reads or builds (evidence lists are downsampled to ~120)
MAX_CEL_STRING = 64 * 1024  # characters of any string a rule reads or builds


class CostLimit(BaseException):
    """An evaluation past its budget. A BaseException, so cel-python's error handling (which turns
    exceptions into values that `||` may then discard) cannot swallow it."""


_RUN_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("cel_run_deadline", default=None)


@contextlib.contextmanager
def run_budget(seconds: float = MAX_CEL_RUN_SECONDS) -> Iterator[None]:
    """All evaluations inside share `seconds`: 500 crafted rules at 2 s each must not make a 1,000 s rejudge."""
    token = _RUN_DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _RUN_DEADLINE.reset(token)


class _Budget:
    def __init__(self) -> None:
        self.steps = 0
        now = time.monotonic()
        run = _RUN_DEADLINE.get()
        self.deadline, self.limit = now + MAX_CEL_SECONDS, f"MAX_CEL_SECONDS {MAX_CEL_SECONDS:g}"
        if run is not None and run < self.deadline:
            self.deadline, self.limit = run, f"MAX_CEL_RUN_SECONDS {MAX_CEL_RUN_SECONDS:g}, for all rules of the run"
        if now > self.deadline:
            raise CostLimit(f"no time left (limit: {self.limit})")


def _check_size(value: Any) -> None:
    if isinstance(value, (str, bytes)) and len(value) > MAX_CEL_STRING:
        raise CostLimit(f"a string of {len(value):,} characters (limit: MAX_CEL_STRING {MAX_CEL_STRING:,})")
    if isinstance(value, (list, dict)) and len(value) > MAX_CEL_LIST:
        raise CostLimit(f"a list or map of {len(value):,} elements (limit: MAX_CEL_LIST {MAX_CEL_LIST:,})")


class _Bounded(Evaluator):
    budget: _Budget

    def sub_evaluator(self, ast: Any) -> "Evaluator":
        sub = _Bounded(ast, activation=self.activation)
        sub.budget = self.budget
        return sub

    def visit_children(self, tree: Any) -> list:
        budget = self.budget
        budget.steps += 1
        if budget.steps > MAX_CEL_STEPS:
            raise CostLimit(f"more than {MAX_CEL_STEPS:,} steps (limit: MAX_CEL_STEPS {MAX_CEL_STEPS:,})")
        if not budget.steps % 256 and time.monotonic() > budget.deadline:
            raise CostLimit(f"out of time (limit: {budget.limit})")
        values = super().visit_children(tree)
        for value in values:
            _check_size(value)
        return values


def check_input(value: Any, path: str = "") -> None:
    """Refuse data a rule would read past the list/string limits before evaluating at all."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        try:
            _check_size(item)
        except CostLimit as exc:
            raise CostLimit(f"{where or 'the data'}: {exc}") from None
        if isinstance(item, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))


def evaluate_bounded(program: Any, data: dict[str, Any], converted: Any = None) -> celtypes.Value:
    """`program.evaluate(json_to_cel(data))` under the budget above; raises CostLimit past it. `converted` is
    `data` already checked and in CEL types (rules.activation keeps it for the rules that read the same data)."""
    budget = _Budget()
    if converted is None:
        check_input(data)
        converted = celpy.json_to_cel(data)
    evaluator = _Bounded(ast=program.ast, activation=program.new_activation())
    evaluator.budget = budget
    return evaluator.evaluate(converted)
