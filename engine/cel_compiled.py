"""Rules run compiled (common-expression-language, CEL in Rust) where they cannot outrun cel_budget's limits.

cel-python interprets a rule node by node in Python: 0.5-3 ms an evaluation, most of `runbook fleet`'s time on
a fleet whose every host reads its own numbers (issue 34). The Rust evaluator takes ~10-60 us, but it has no
step counter and no deadline. So a rule runs there only when, on this data, its worst case is known before it
starts and fits the interpreter's budget (`plan` and `_fits`), and only where the two evaluators cannot
disagree:

- no int anywhere (no int literal, `size()`, `int()`...): evidence numbers are doubles, and cel-python refuses
  `double == int` where Rust answers it;
- every `==`, `!=` and `in` compares values of one CEL type (cel-python refuses `'a' == 1.0`, and `null == 1.0`
  unless the rule says `null`, where Rust says false); an absent or null value elsewhere is an error to both,
  which `||` and `&&` absorb alike, and an error the interpreter words ("inconclusive: X is missing").

Anything else, any error, any answer that is not true or false, goes to the bounded interpreter, whose outcome
is then the answer: this path only ever says true or false where the interpreter says the same
(tests/test_cel_compiled.py holds every bundled rule to that on every bundled scenario's evidence).
`RUNBOOK_CEL=interpreted` turns it off (the benchmark's baseline); `RUNBOOK_CEL=check` runs both and raises
on a difference.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import celpy
from celpy import celtypes
from lark import Token, Tree

from .cel_budget import _RUN_DEADLINE, MAX_CEL_LIST, MAX_CEL_STEPS, MAX_CEL_STRING
from .values import EACH, INDEX

_MACROS = {"all", "exists", "exists_one", "map", "filter"}
_INT_FUNCTIONS = {"size", "int", "uint", "getHours", "getMinutes", "getSeconds", "getDayOfWeek", "getDayOfMonth",
                  "getDayOfYear", "getMonth", "getFullYear", "getMilliseconds"}  # fmt: skip
# what the engine's own functions give (rules.FUNCTIONS), and CEL's string predicates
_RESULT_TYPE = {"has_feature": "bool", "version_at_least": "bool", "version_known": "bool", "interp": "double",
                "feature_release": "string", "startsWith": "bool", "endsWith": "bool", "contains": "bool",
                "matches": "bool", "string": "string", "double": "double"}  # fmt: skip
_EQUALITY = {"relation_eq", "relation_ne", "relation_in"}

Size = Callable[[dict[str, Any]], "int | None"]  # a list's length on this data; None: cannot tell


@dataclass
class _Cost:
    """Nodes visited, as the interpreter counts them: `nodes` once, plus each macro's body per element."""

    nodes: int = 0
    loops: list[tuple[Size, "_Cost"]] = field(default_factory=list)
    ranges: list[tuple] = field(default_factory=list)  # (kept on the top one) the paths macros walk
    reads: list[tuple] = field(default_factory=list)  # (on a macro's body) the paths it reads, longest only
    opaque: bool = False  # some macro walks a computed list (x.filter(...).map(...)): its reads are not all paths

    def on(self, data: dict[str, Any]) -> int | None:
        total = self.nodes
        for size, body in self.loops:
            n, each = size(data), body.on(data)
            if n is None or each is None:
                return None
            total += n * (each + 1)
        return total


@dataclass
class Plan:
    """What one rule needs to run compiled; made once per rule (`plan`)."""

    source: str
    cost: _Cost
    joins: int  # its `+` operators: a list or string it builds is at most joins + 1 times the longest it reads
    nodes: int  # all its nodes: a list literal (or a map over one) is at most this long
    operands: list[tuple[tuple, tuple]]  # each ==, != and in: (kind, detail) of its two sides
    says_null: bool
    reads: list[tuple] = field(default_factory=list)  # the paths it reads (rules.Ref parts)
    ranges: list[tuple] = field(default_factory=list)  # the paths its macros walk, once a macro
    shape: dict[str, Any] | None = None  # what it reads, as a tree (pruned), made on first use
    program: Any = None  # the Rust program, compiled on first use
    cut: int | None = None  # which cut of the data `pruned` makes with it (cut_id), numbered on first use


class _Refused(Exception):
    """The rule has a form this path does not take (it goes to the interpreter)."""


def _rust() -> Any:
    global _RUST
    if _RUST is None:
        try:
            import cel  # noqa: PLC0415  (common-expression-language; ~0.2 s to import, so only when rules run)

            # it logs each engine function that raised (has_feature on a dev build...) as a warning, which Python
            # would print on stderr: those are expected here (the interpreter then decides and words them)
            logging.getLogger("cel").setLevel(logging.CRITICAL)
            _RUST = cel
        except Exception:  # noqa: BLE001  (not installed, or no wheel for this Python: the interpreter decides)
            _RUST = False
    return _RUST


_RUST: Any = None


def enabled() -> bool:
    return os.environ.get("RUNBOOK_CEL", "").strip().lower() not in ("interpreted", "celpy", "off") and bool(_rust())


def checking() -> bool:
    """`RUNBOOK_CEL=check`: every rule the compiled path answers is also interpreted, and a different answer raises
    Disagreement (tests and the benchmark run the bundled scenarios so)."""
    return os.environ.get("RUNBOOK_CEL", "").strip().lower() == "check"


class Disagreement(AssertionError):
    """The compiled and the interpreted evaluator answered one rule differently (only under RUNBOOK_CEL=check)."""


def _ident(tree: Any) -> str | None:
    """The identifier a `member` chain starts from, when it is a plain name."""
    tree = _unwrap(tree)
    if isinstance(tree, Tree) and tree.data == "ident":
        return str(tree.children[0])
    return None


def _unwrap(tree: Any) -> Any:
    while isinstance(tree, Tree) and len(tree.children) == 1 and tree.data in (
            "expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary", "member", "primary"):  # fmt: skip
        tree = tree.children[0]
    return tree


def _path(tree: Any, env: dict[str, tuple | None]) -> tuple | None:
    """`a.b.c` as ("a", "b", "c"); a macro's variable `g` over `power.gpus` as ("power", "gpus", EACH)."""
    tree = _unwrap(tree)
    if isinstance(tree, Tree) and tree.data == "ident":
        name = str(tree.children[0])
        if name in env:
            return env[name]
        return (name,)
    if isinstance(tree, Tree) and tree.data == "member_dot":
        head = _path(tree.children[0], env)
        return None if head is None else (*head, str(tree.children[1]))
    return None


def _at(data: Any, parts: tuple) -> list[Any]:
    """Every value at `parts` (EACH fans out over a list's elements); a missing step gives a _Missing."""
    values = [data]
    for part in parts:
        nxt = []
        for v in values:
            if part == EACH:
                if not isinstance(v, list):
                    return [_MISSING]
                nxt.extend(v)
            elif isinstance(v, dict) and part in v:
                nxt.append(v[part])
            else:
                return [_MISSING]
        values = nxt
    return values


_MISSING = object()


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    return "other"  # an int (not made by to_cel_data), a list or a map: the interpreter decides


def _range_size(tree: Any, env: dict[str, tuple | None]) -> Size:
    """How many elements a macro walks, as a function of the data: a path the data holds, a list literal, or a
    map/filter of one of those. Anything else (a list a rule computes) is refused."""
    node = _unwrap(tree)
    if isinstance(node, Tree) and node.data == "list_lit":
        n = len(node.children[0].children) if node.children else 0
        return lambda _d, n=n: n
    if isinstance(node, Tree) and node.data == "member_dot_arg" and str(node.children[1]) in ("map", "filter"):
        return _range_size(node.children[0], env)
    parts = _path(node, env)
    if parts is None or EACH in parts:
        raise _Refused("a macro over a computed list")

    def size(data: dict[str, Any], parts: tuple = parts) -> int | None:
        found = _at(data, parts)
        value = found[0] if len(found) == 1 else None
        return len(value) if isinstance(value, (list, dict)) else None

    return size


def _operand(tree: Any, env: dict[str, tuple | None]) -> tuple:
    node = _unwrap(tree)
    if isinstance(node, Tree) and node.data == "paren_expr":
        return _operand(node.children[0], env)
    if isinstance(node, Tree) and node.data == "expr" and len(node.children) == 3:  # c ? a : b: either side's type
        return ("either", (_operand(node.children[1], env), _operand(node.children[2], env)))
    if isinstance(node, Tree) and node.data == "literal":
        text = str(node.children[0])
        if text == "null":
            return ("type", "null")
        if text in ("true", "false"):
            return ("type", "bool")
        if text[:1] in "\"'" or text[:2].lower() in ("r'", 'r"'):
            return ("type", "string")
        return ("type", "double")  # int literals are refused before this is asked
    if isinstance(node, Tree) and node.data == "list_lit":
        items = node.children[0].children if node.children else []
        kinds = {_operand(item, env) for item in items}
        if len(kinds) > 1 or any(k[0] != "type" for k in kinds):
            raise _Refused("a list literal of mixed or computed types")
        return ("list", next(iter(kinds))[1] if kinds else None)
    if isinstance(node, Tree) and node.data in ("addition", "multiplication", "unary") and len(node.children) > 1:
        return ("type", "double")  # arithmetic on doubles (no ints in the rule)
    if isinstance(node, Tree) and node.data in ("member_dot_arg", "ident_arg"):
        name = str(node.children[1] if node.data == "member_dot_arg" else node.children[0])
        if name in _RESULT_TYPE:
            return ("type", _RESULT_TYPE[name])
        raise _Refused(f"an equality on {name}()")
    parts = _path(node, env)
    if parts is None:
        raise _Refused("an equality on a computed value")
    return ("path", parts)


def _walk(tree: Any, env: dict[str, tuple | None], cost: _Cost, operands: list) -> None:
    if isinstance(tree, Token):
        if tree.type in ("INT_LIT", "UINT_LIT"):
            raise _Refused("an int literal")
        return
    cost.nodes += 1
    if tree.data in ("member_dot", "primary"):
        found = _path(tree, env)
        if found is not None:
            cost.reads.append(found)
    if tree.data in ("ident_arg", "member_dot_arg"):
        name = str(tree.children[0] if tree.data == "ident_arg" else tree.children[1])
        if name in _INT_FUNCTIONS:
            raise _Refused(f"{name}() gives an int")
        if tree.data == "member_dot_arg" and name in _MACROS:
            args = tree.children[2].children if len(tree.children) > 2 else []
            var = _ident(args[0]) if args else None
            if var is None or len(args) not in (2, 3):
                raise _Refused("a macro of an unusual form")
            _walk(tree.children[0], env, cost, operands)
            size = _range_size(tree.children[0], env)
            range_path = _path(tree.children[0], env)
            if range_path is not None:
                cost.ranges.append(range_path)
            else:
                cost.opaque = True  # a macro over a computed list: what its variable reads is no path of the data
            inner = {**env, var: (*range_path, EACH) if range_path is not None else None}
            body = _Cost()
            for arg in args[1:]:
                _walk(arg, inner, body, operands)
            cost.ranges += body.ranges
            cost.opaque = cost.opaque or body.opaque
            body.reads = [r for r in dict.fromkeys(body.reads) if not any(o != r and o[: len(r)] == r for o in body.reads)]
            body.nodes += 2  # the variable's expr and the exprlist
            cost.loops.append((size, body))
            return
    if tree.data == "relation" and len(tree.children) == 2 and isinstance(tree.children[0], Tree) and tree.children[0].data in _EQUALITY:
        left = tree.children[0].children[0]
        operands.append((_operand(left, env), _operand(tree.children[1], env), tree.children[0].data))
    for child in tree.children:
        _walk(child, env, cost, operands)


def plan(source: str, ast: Any) -> Plan | None:
    """The rule's cost and comparisons, or None when it has a form only the interpreter takes."""
    says_null = any(isinstance(tok, Token) and str(tok) == "null" for tok in ast.scan_values(lambda v: isinstance(v, Token)))
    cost, operands = _Cost(), []
    try:
        _walk(ast, {}, cost, operands)
    except (_Refused, RecursionError):
        return None
    total, joins = 0, 0
    for sub in ast.iter_subtrees():
        total += 1
        joins += sub.data == "addition_add"
    return Plan(source=source, cost=cost, joins=joins, nodes=total, operands=operands, says_null=says_null, ranges=cost.ranges)


def _same_types(p: Plan, data: dict[str, Any]) -> bool:
    for left, right, op in p.operands:
        if p.says_null and ("type", "null") in (left, right):
            continue  # `x != null`: the engine's null-safe equality answers it for any x, as Rust does
        a, b = _side_types(left, op, data), _side_types(right, op, data)
        if a is None or b is None:
            return False
        if p.says_null:
            a, b = a - {"null"}, b - {"null"}  # null == x is the engine's null-safe equality, as in Rust
        if len(a | b) > 1:
            return False
    return True


def _status(data: dict[str, Any], parts: tuple) -> str:
    """'present' (every value there, none null), 'missing' (none), or 'mixed'."""
    values = _at(data, parts)
    there = [v is not _MISSING and v is not None for v in values]
    if values == [_MISSING] or not any(there):
        return "missing"
    return "present" if all(there) else "mixed"


def _uniform_bodies(p: Plan, data: dict[str, Any]) -> bool:
    """Each macro's body comes out alike for every element: all its element values missing (it then reads only
    what every element shares), or nothing it reads missing. cel-python's `exists` is true where one element is,
    whatever the others' errors, and Rust's is an error; with bodies alike the two agree, as without macros."""
    if p.cost.opaque:
        return False  # a macro over a computed list: its body's reads are not all known
    for _, body in p.cost.loops:
        if body.loops:
            return False  # a macro in a macro: not checked
        element = [r for r in body.reads if EACH in r]
        statuses = {_status(data, r) for r in element}
        if statuses == {"missing"}:
            continue
        if statuses - {"present"} or any(_status(data, r) != "present" for r in body.reads if EACH not in r):
            return False
    return True


def _plain_values(p: Plan, data: dict[str, Any]) -> bool:
    """Every value the rule reads is a double or null: an error then comes from a missing value, not from a type
    the rule did not expect (a rule error to the interpreter, or, as `false < 0.5`, an answer)."""
    return all(_type_of(v) in ("double", "null") for parts in p.reads if parts not in p.ranges  # (a list a macro walks)
               for v in _at(data, parts) if v is not _MISSING)


def _side_types(side: tuple, op: str, data: dict[str, Any]) -> set[str] | None:
    """The CEL types one side of ==, != or `in` has on this data (None: one the check does not take). An absent
    member is an error to both evaluators (alike under || and &&), so it adds no type; null does (above)."""
    if side[0] == "either":
        alternatives = [_side_types(alt, op, data) for alt in side[1]]
        return None if any(t is None for t in alternatives) else set().union(*alternatives)
    if side[0] == "path":
        found = {_type_of(v) for v in _at(data, side[1]) if v is not _MISSING}
        return None if "other" in found else found
    if side[0] == "list":
        return {side[1]} if op == "relation_in" and side[1] else (set() if op == "relation_in" else None)
    return {side[1]}


def _fits(p: Plan, data: dict[str, Any], limits: tuple[int, int]) -> bool:
    """Within the interpreter's budget whatever the rule does: its node visits, and the longest list or string it
    could build. Only `+` joins lists and strings, and a macro's result is no longer than what it walks, so
    nothing it builds outgrows (joins + 1) x the longest it reads or writes as a literal."""
    steps = p.cost.on(data)
    longest_list, longest_string = limits
    grow = p.joins + 1
    return (steps is not None and steps <= MAX_CEL_STEPS and grow * max(longest_list, p.nodes) <= MAX_CEL_LIST
            and grow * max(longest_string, len(p.source)) <= MAX_CEL_STRING)  # fmt: skip


def _native(value: Any) -> Any:
    if isinstance(value, celpy.CELEvalError):
        raise ValueError(str(value.args[0]) if value.args else "error")
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    return value


_WRAPPED: dict[int, dict[str, Callable[..., Any]]] = {}


def _rust_functions(functions: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The engine's functions (rules.FUNCTIONS) for the Rust evaluator: their errors raise (the interpreter then
    decides and words them), their CEL-typed answers become Python's."""
    if id(functions) not in _WRAPPED:

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            return lambda *args: _native(fn(*args))

        _WRAPPED[id(functions)] = {name: wrap(fn) for name, fn in functions.items() if not name.startswith("_")}
    return _WRAPPED[id(functions)]


def pruned(data: dict[str, Any], names: tuple[str, ...], p: Plan) -> dict[str, Any]:
    """`data`'s names, cut to the values the rule reads (its refs, each taken whole where it ends): evidence
    carries series no rule reads, and both evaluators convert what they are given. A list keeps all its elements
    (a macro walks every one), a map walked by a macro stays whole. A list a macro walks is read as its elements'
    members where the rule reads it only to walk it (`power.gpus.all(g, g.x ...)` needs no GPU's series)."""
    if p.cost.opaque:
        return {name: data[name] for name in names if name in data}  # reads it cannot name: all of it
    if p.shape is None:
        p.shape = _shape(p.reads, p.ranges)
    out: dict[str, Any] = {}
    for name in names:
        if name not in data:
            continue
        sub = p.shape.get(name)
        if sub is not None:
            out[name] = _cut(data[name], sub)
        elif not isinstance(data[name], dict):
            out[name] = data[name]  # a name read only through a function (has_feature(server, ...)) or not at all
    return out


_WHOLE = True
_CUTS: dict[str, int] = {}  # each distinct cut plans make (a shape, or all of what they name), numbered


def cut_id(p: Plan) -> int:
    """Which cut of the data `pruned` makes with this plan: plans that read the same members (a hypothesis's confirm
    and refute, whose macros walk the same GPUs) cut a data dict alike, so the Rust context made of it is shared."""
    if p.cut is None:
        if p.cost.opaque:
            key = "all of each name"
        else:
            if p.shape is None:
                p.shape = _shape(p.reads, p.ranges)
            key = json.dumps(p.shape, sort_keys=True)
        p.cut = _CUTS.setdefault(key, len(_CUTS))
    return p.cut


def _shape(reads: list[tuple], ranges: list[tuple]) -> dict[str, Any]:
    """The tree of what the rule reads: a member's subtree, or _WHOLE where a read ends; EACH for a list's elements."""
    walked = {r: ranges.count(r) for r in ranges}
    elements = {r[:-1] for r in reads if len(r) > 1 and r[-1] == EACH}  # a macro's variable read whole
    members = {r[: r.index(EACH)] for r in reads if EACH in r}
    bare: dict[tuple, int] = {}
    for r in reads:
        bare[r] = bare.get(r, 0) + 1
    tree: dict[str, Any] = {}
    for parts in reads:
        if not parts or parts in walked and bare[parts] <= walked[parts] and parts in members and parts not in elements:
            continue  # only walked: its elements' members (other reads) are what is read
        node = tree
        for i, part in enumerate(parts):
            key = EACH if part == INDEX else part
            if i == len(parts) - 1:
                node[key] = _WHOLE
                break
            child = node.get(key)
            if child is _WHOLE:
                break
            if child is None:
                child = node[key] = {}
            node = child
    return tree


def _cut(value: Any, sub: Any) -> Any:
    if sub is _WHOLE:
        return value
    if isinstance(value, dict):
        if EACH in sub:
            return value  # a map walked by a macro, or indexed: all of it
        return {k: _cut(value[k], s) for k, s in sub.items() if k in value}
    if isinstance(value, list) and EACH in sub:
        each = sub[EACH]
        if each is _WHOLE or not all(isinstance(v, dict) for v in value):
            return value  # whole elements, or a list of plain values
        return [_cut(v, each) for v in value]
    return value  # a scalar, null, or a list read by a member name (an error either way, as on all of it)


def context(variables: dict[str, Any], functions: dict[str, Callable[..., Any]]) -> Any:
    """The Rust evaluator's context: `variables` (CEL data: doubles, strings, lists, maps) and the engine's functions."""
    return _rust().Context(variables=variables, functions=_rust_functions(functions))


MISSING = "missing"  # decide's answer: the rule cannot be decided for the values it lacks


def value(p: Plan, data: dict[str, Any], context: Callable[[], Any], limits: tuple[int, int]) -> Any:
    """An expression's value (a headline's field), or None: the interpreter computes it. Only a finite double, a
    string or a bool is taken: the forms whose value the two evaluators compute alike (a list, a map, an error,
    an infinity from a division by zero go to the interpreter, which says them in its own terms)."""
    if not _may_run(p, data, limits):
        return None
    try:
        result = _program(p).execute(context())
    except Exception:  # noqa: BLE001  (the interpreter's outcome, missing values included)
        return None
    kind = type(result)
    if kind is float:
        return result if math.isfinite(result) else None
    return result if kind is str or kind is bool else None


def decide(p: Plan, data: dict[str, Any], context: Callable[[], Any], limits: tuple[int, int],
           lacks: Callable[[], bool] = lambda: False) -> bool | str | None:
    """True or false from the compiled rule, MISSING, or None: the interpreter decides (see the module's
    docstring). `context` makes the Rust context of the names the rule reads; `lacks()`: some value it reads is
    absent or null (asked only when the run fails). Without a macro, an error no `||` or `&&` absorbed, where values are missing, is the
    interpreter's "X is missing" (cel-python's error semantics are CEL's: tests/test_cel_compiled.py)."""
    if not _may_run(p, data, limits):
        return None
    try:
        result = _program(p).execute(context())
    except (KeyError, TypeError):
        return MISSING if lacks() and _uniform_bodies(p, data) and _plain_values(p, data) else None
    except Exception:  # noqa: BLE001  (any other error: the interpreter's outcome, in its words)
        return None
    return result if isinstance(result, bool) else None


def _may_run(p: Plan, data: dict[str, Any], limits: tuple[int, int]) -> bool:
    """Whether the compiled path may answer: within the budget, the evaluators agree on the types, and the run's
    deadline has not passed (past it, the interpreter says which limit)."""
    if not _fits(p, data, limits) or not _same_types(p, data):
        return False
    deadline = _RUN_DEADLINE.get()
    return deadline is None or time.monotonic() <= deadline


def _program(p: Plan) -> Any:
    if p.program is None:
        p.program = _rust().compile(p.source)
    return p.program
