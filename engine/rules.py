"""Verdict rules in CEL (cel-python): compiled when the runbook loads, evaluated against evidence.

CEL is side-effect free and not Turing-complete, which is what rules written by operators need.
The engine smooths its two sharp edges: every evidence number becomes a double (CEL refuses to mix
int and double in arithmetic), and a missing or null value becomes "inconclusive: X is missing"
instead of an evaluation error.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import celpy
from celpy import celtypes
from lark import Token, Tree

from . import cel_compiled, releases
from .cel_budget import MAX_CEL_LIST, MAX_CEL_STRING, CostLimit, check_input, evaluate_bounded
from .numbers import piecewise
from .releases import is_release_version, version_tuple
from .values import EACH, INDEX



def _cached_cel_parser() -> None:
    """celpy analyses its LALR grammar on first use: ~0.5 s on every start, before the TUI can paint. The same
    parser (celpy 0.5's own arguments) with lark's cache in the user's cache directory loads in ~0.05 s; lark keys
    the file by grammar, options and its version, and rebuilds when the file is missing or unreadable."""
    import lark  # noqa: PLC0415
    from celpy import celparser  # noqa: PLC0415

    if celparser.CELParser.CEL_PARSER is not None:
        return
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "gpu-runbook")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        grammar = (Path(celparser.__file__).parent / "cel.lark").read_text()
        celparser.CELParser.CEL_PARSER = lark.Lark(
            grammar, parser="lalr", start="expr", debug=True, g_regex_flags=re.M,
            lexer_callbacks={"IDENT": celparser.CELParser.ambiguous_literals}, propagate_positions=True,
            maybe_placeholders=False, priority="invert", tree_class=lark.Tree,
            cache=os.path.join(folder, f"cel-{lark.__version__}.lark"),
        )  # fmt: skip
    except (OSError, TypeError, ValueError):  # no cache directory, or a celpy that builds differently: it builds its own
        celparser.CELParser.CEL_PARSER = None


_cached_cel_parser()
_ENV = celpy.Environment()
_MACROS = {"all", "exists", "exists_one", "map", "filter"}
_MISSING = object()


class RuleSyntaxError(Exception):
    def __init__(self, message: str, line: int, col: int) -> None:
        super().__init__(message)
        self.message, self.line, self.col = message, line, col


def _unknown(fn: str, text: Any) -> Any:
    return celpy.CELEvalError(f"{fn}: {text!r} is not a version (a dev build or unknown release orders with none)", TypeError, None)


def _version_at_least(version: Any, minimum: Any) -> Any:
    """A null, dev-build or non-version input is an error (the verdict says the value is missing), never false."""
    for text in (version, minimum):
        if not is_release_version(text):
            return _unknown("version_at_least", text)
    strip = lambda t: str(t).strip().lstrip("v")  # noqa: E731
    return celtypes.BoolType(version_tuple(strip(version)) >= version_tuple(strip(minimum)))


def _version_known(version: Any) -> Any:
    return celtypes.BoolType(is_release_version(version))


_BASE_EQ = celpy.evaluation.base_functions["_==_"]
_BASE_NE = celpy.evaluation.base_functions["_!=_"]


def _eq(a: Any, b: Any) -> Any:
    """`x == null` works for every x (cel-python has no double-vs-null overload): rules test for missing readings."""
    if a is None or b is None:
        return celtypes.BoolType(a is None and b is None)
    return _BASE_EQ(a, b)


def _ne(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return celtypes.BoolType(not (a is None and b is None))
    return _BASE_NE(a, b)


def _member(cel_map: dict, name: str) -> Any:
    """A CEL map's member, or None (a CEL map's get() raises where the member is absent)."""
    key = celtypes.StringType(name)
    return cel_map[key] if key in cel_map else None


def _has_feature(server: Any, name: Any) -> Any:
    """`has_feature(server, 'pcie-ipc-allreduce')`: from the release table of the server found (its
    `server_kind` and `version`); `has_feature(server.version, ...)`, a bare version, reads SGLang's table (rules
    written before vLLM). A dev build or unknown version is an error (the verdict says what is missing), never "old"."""
    kind: str | None = None
    version = server
    if isinstance(server, dict):
        kind, version = _member(server, "server_kind"), _member(server, "version")
        kind = str(kind) if kind else None
    try:
        known = releases.has_feature(version, str(name), kind)
    except KeyError as exc:
        return celpy.CELEvalError(str(exc.args[0]), KeyError, None)
    return _unknown("has_feature", version) if known is None else celtypes.BoolType(known)


def _feature_release(*args: Any) -> Any:
    """`feature_release(server, 'pcie-ipc-allreduce')` -> '0.30.0' on vLLM: the first release of the server found
    with it, for a step's text; `feature_release('attn-dp-size-flag')`, without the server, reads SGLang's table."""
    server, name = (args[0], args[1]) if len(args) == 2 else (None, args[0] if args else "")
    kind = _member(server, "server_kind") if isinstance(server, dict) else None
    kind = str(kind) if kind else None
    try:
        return celtypes.StringType(releases.feature(str(name), kind).first)
    except KeyError as exc:
        return celpy.CELEvalError(str(exc.args[0]), KeyError, None)


def _interp(points: Any, x: Any) -> Any:
    """`interp(ref.draw_curve, 64.0)`: a measured curve of [x, y] pairs read at x (numbers.piecewise)."""
    try:
        pts = sorted((float(p[0]), float(p[1])) for p in points)
        at = float(x)
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        return celpy.CELEvalError(f"interp: needs a list of [x, y] pairs and a number ({exc})", TypeError, None)
    if not pts:
        return celpy.CELEvalError("interp: the curve is empty (no such member)", TypeError, None)
    return celtypes.DoubleType(piecewise(pts, at))


FUNCTIONS = {"version_at_least": _version_at_least, "version_known": _version_known,
             "has_feature": _has_feature, "feature_release": _feature_release, "interp": _interp}  # fmt: skip
FEATURE_FUNCTIONS = {"has_feature", "feature_release"}  # their last argument names a feature
# Only rules that say `null` get null-safe equality: elsewhere a null reading compared with a number must
# count as missing (inconclusive), not quietly as "not equal".
NULL_SAFE = {"_==_": _eq, "_!=_": _ne}


@dataclass(frozen=True)
class Ref:
    """One value a rule reads, as written: `m.token_usage.max` is ("m", "token_usage", "max"), each part
    with its (line, col) in the rule's text, so `validate` can point at the member that is wrong.

    A macro's variable stands for an element of what it iterates: in `inv.gpus.all(g, g.power_w > 0.0)`,
    `g.power_w` is ("inv", "gpus", EACH, "power_w"); `x[i]` adds INDEX."""

    parts: tuple[str, ...]
    positions: tuple[tuple[int, int], ...]


@dataclass
class Rule:
    source: str
    names: set[str]  # top-level identifiers the rule reads (aliases, `params`)
    paths: list[str]  # dotted member paths it reads, e.g. "power.draw_w.mean", for reasons
    program: Any = field(repr=False)
    refs: list[Ref] = field(default_factory=list)
    compiled: cel_compiled.Plan | None = field(default=None, repr=False)  # how it runs compiled, where it may


def _ident_name(tree: Tree) -> str | None:
    if tree.data == "primary" and tree.children and isinstance(tree.children[0], Tree):
        inner = tree.children[0]
        if inner.data == "ident" and inner.children:
            return str(inner.children[0])
    return None


def _collect(tree: Tree, bound: frozenset[str], names: set[str], paths: list[str]) -> None:
    """Walk the parse tree: record free identifiers and the longest member paths built on them."""
    if not isinstance(tree, Tree):
        return
    if tree.data == "member_dot_arg":
        target, method, args = tree.children[0], tree.children[1], tree.children[2] if len(tree.children) > 2 else None
        _collect(target, bound, names, paths)
        if str(method) in _MACROS and isinstance(args, Tree) and args.children:
            var = _first_ident(args.children[0])
            inner_bound = bound | {var} if var else bound
            for arg in args.children[1:]:
                _collect(arg, inner_bound, names, paths)
        elif isinstance(args, Tree):
            _collect(args, bound, names, paths)
        return
    if tree.data == "member_dot":
        chain = _dotted(tree)
        if chain is not None:
            root = chain.split(".")[0]
            if root not in bound:
                names.add(root)
                paths.append(chain)
            return
    name = _ident_name(tree)
    if name is not None:
        if name not in bound:
            names.add(name)
            paths.append(name)
        return
    for child in tree.children:
        _collect(child, bound, names, paths)


def _first_ident(tree: Any) -> str | None:
    if isinstance(tree, Tree):
        name = _ident_name(tree)
        if name:
            return name
        for child in tree.children:
            found = _first_ident(child)
            if found:
                return found
    return None


def _dotted(tree: Tree) -> str | None:
    """'a.b.c' for a pure member chain on an identifier, else None."""
    if tree.data == "member_dot":
        base = tree.children[0]
        field_name = str(tree.children[1])
        inner = _dotted(base) if isinstance(base, Tree) else None
        return f"{inner}.{field_name}" if inner else None
    if tree.data == "member" and tree.children:
        return _dotted(tree.children[0]) if isinstance(tree.children[0], Tree) else None
    return _ident_name(tree)


_Chain = tuple[tuple[str, ...], tuple[tuple[int, int], ...]]


def _pos(token: Any) -> tuple[int, int]:
    return (getattr(token, "line", None) or 1, getattr(token, "column", None) or 1)


def _first_token(tree: Any) -> Any:
    if isinstance(tree, Token):
        return tree
    for child in getattr(tree, "children", ()):
        found = _first_token(child)
        if found is not None:
            return found
    return None


def _chain(tree: Any, env: dict[str, _Chain | None]) -> _Chain | None:
    """The path a member expression reads, when it is built on an identifier; None otherwise (a call's result,
    a literal) and for a macro variable over something that is not a path."""
    if not isinstance(tree, Tree):
        return None
    if tree.data == "member" and len(tree.children) == 1:
        return _chain(tree.children[0], env)
    if tree.data == "primary" and tree.children and isinstance(tree.children[0], Tree) and tree.children[0].data == "ident":
        token = tree.children[0].children[0]
        if str(token) in env:
            bound = env[str(token)]
            return None if bound is None else (bound[0] + (EACH,), bound[1] + (_pos(token),))
        return (str(token),), (_pos(token),)
    if tree.data == "member_dot":
        base = _chain(tree.children[0], env)
        token = tree.children[1]
        return None if base is None else (base[0] + (str(token),), base[1] + (_pos(token),))
    if tree.data == "member_index":
        base = _chain(tree.children[0], env)
        return None if base is None else (base[0] + (INDEX,), base[1] + (_pos(_first_token(tree.children[1])),))
    return None


def _index_refs(tree: Any, env: dict[str, _Chain | None], out: list[Ref]) -> None:
    """The paths read inside the indexes along a chain's spine (`a.b[c.d].e`: `c.d`), in the chain's scope."""
    while isinstance(tree, Tree) and tree.data in ("member", "member_dot", "member_index") and tree.children:
        if tree.data == "member_index":
            _refs(tree.children[1], env, out)
        tree = tree.children[0]


def _refs(tree: Any, env: dict[str, _Chain | None], out: list[Ref]) -> None:
    """Every value path a rule reads, longest first-written form, macro variables resolved to what they iterate."""
    if not isinstance(tree, Tree):
        return
    if tree.data in ("member_dot", "member_index", "primary"):
        chain = _chain(tree, env)
        if chain is not None:
            out.append(Ref(*chain))
            _index_refs(tree, env, out)
            return
    if tree.data == "member_dot_arg":
        target, method = tree.children[0], tree.children[1]
        args = tree.children[2] if len(tree.children) > 2 else None
        _refs(target, env, out)
        if str(method) in _MACROS and isinstance(args, Tree) and args.children:
            var = _first_ident(args.children[0])
            inner = {**env, var: _chain(target, env)} if var else env
            for arg in args.children[1:]:
                _refs(arg, inner, out)
        elif isinstance(args, Tree):
            _refs(args, env, out)
        return
    for child in tree.children:
        _refs(child, env, out)


# What a rule may call: CEL's built-ins (size, contains, startsWith, int, double, ...), its macros,
# and ours. Anything else would only fail when the rule runs, after the probes did their work.
KNOWN_FUNCTIONS = (
    {name for name in celpy.evaluation.base_functions if not name.startswith(("_", "!", "-"))}
    | _MACROS
    | {"has", "dyn"}
    | set(FUNCTIONS)
)


def _check_functions(ast: Tree) -> None:
    for node in ast.iter_subtrees_topdown():
        if node.data == "ident_arg":
            name = node.children[0]
        elif node.data == "member_dot_arg":
            name = node.children[1]
        else:
            continue
        if str(name) in FEATURE_FUNCTIONS:
            _check_feature_name(node, str(name))
        if str(name) not in KNOWN_FUNCTIONS:
            line, col = getattr(name, "line", None) or 1, getattr(name, "column", None) or 1
            raise RuleSyntaxError(f"unknown function '{name}' (rules can call: {', '.join(sorted(KNOWN_FUNCTIONS))})", line, col)


def _check_feature_name(node: Tree, fn: str) -> None:
    """A feature is named by a string literal that the release table knows: a typo fails when the runbook loads."""
    exprlists = [c for c in node.children if isinstance(c, Tree) and c.data == "exprlist"]
    args = exprlists[0].children if exprlists else []
    pos = len(args) - 1
    token = _first_token(node)
    line, col = _pos(token) if token is not None else (1, 1)
    literal = next((t for t in args[pos].scan_values(lambda v: isinstance(v, Token))), None) if len(args) > pos else None
    if literal is None or literal.type not in ("STRING_LIT", "MLSTRING_LIT") or len(list(args[pos].scan_values(lambda v: isinstance(v, Token)))) != 1:
        raise RuleSyntaxError(f"{fn}: name the feature with a string literal (features: {', '.join(releases.feature_names('*'))})", line, col)
    name = str(literal)[1:-1]
    if name not in releases.feature_names("*"):
        raise RuleSyntaxError(f"{fn}: unknown feature '{name}' (the release tables have: {', '.join(releases.feature_names('*'))})", line, col)


def compile_rule(source: str) -> Rule:
    try:
        return _compile(source)
    except RecursionError:
        raise RuleSyntaxError("the rule nests too deeply; split it into simpler parts", 1, 1) from None


def _compile(source: str) -> Rule:
    try:
        ast = _ENV.compile(source)
    except celpy.CELParseError as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        message = "CEL syntax error" + (f" near: {lines[0].strip()}" if lines else "")
        raise RuleSyntaxError(message, getattr(exc, "line", 1) or 1, getattr(exc, "column", 1) or 1) from None
    _check_functions(ast)
    names: set[str] = set()
    paths: list[str] = []
    _collect(ast, frozenset(), names, paths)
    names -= {name for name in FUNCTIONS if not name.startswith('_')}
    unique = list(dict.fromkeys(paths))
    # keep only the longest paths ("a.b.c" makes "a.b" redundant)
    longest = [p for p in unique if not any(o != p and o.startswith(p + ".") for o in unique)]
    says_null = any(isinstance(tok, Token) and str(tok) == "null" for tok in ast.scan_values(lambda v: isinstance(v, Token)))
    functions = {**FUNCTIONS, **NULL_SAFE} if says_null else FUNCTIONS
    refs: list[Ref] = []
    _refs(ast, {}, refs)
    compiled = cel_compiled.plan(source, ast)
    if compiled is not None:
        compiled.reads = [r.parts for r in refs]
    return Rule(source=source, names=names, paths=longest, program=_ENV.program(ast, functions=functions), refs=refs,
                compiled=compiled)


class CelData(dict):
    """What `to_cel_data` returns for a mapping: walked once, so the CEL budget's size check is already known
    (`oversize`: the first value past a limit, or None) and evaluation need not walk the data again."""

    oversize: str | None = None
    # its top-level values in CEL types and as JSON, made as rules ask (rules._converted): kept with the data,
    # so data shared by many decisions (a fleet's hosts with the same evidence) is converted once
    # (a copy, copy.copy's, carries this along: the id says whose they are)
    converted: tuple[int, dict[str, Any], dict[str, str]] | None = None
    # the longest list (or map) and string anywhere in it: what bounds what a compiled rule can build (cel_compiled)
    longest: tuple[int, int] = (0, 0)
    # the compiled evaluator's answers by rule source (rules._compiled): a rule asked twice of the same data (a
    # precondition, then the verdict; a fifth of a fleet's evaluations) runs once. Owned by id, as `converted`
    answers: tuple[int, dict[str, Any]] | None = None
    # the Rust contexts made of it, by the names read and the cut (cel_compiled.cut_id): rules that cut it alike
    # share one (half of a fleet's conversions were the same GPUs cut alike for two to four rules). Owned by id
    contexts: tuple[int, dict[tuple, Any]] | None = None


def to_cel_data(value: Any) -> Any:
    """Numbers become floats (booleans stay booleans): rules never trip on int/double arithmetic. A mapping comes
    back as CelData, size-checked on the way (cel_budget's limits)."""
    if isinstance(value, dict):
        return to_cel_parts(value, {})
    return _to_cel(value, [], [0, 0])


def to_cel_parts(parts: dict[str, Any], cache: dict[int, tuple[Any, Any, tuple[int, int], bool]]) -> CelData:
    """As `to_cel_data(parts)`, each top-level value converted once per `cache` (by identity: a run's evidence
    records are read by many scopes, and a host's tree builds a dozen of them from the same few records)."""
    out = CelData()
    longest, big = [len(parts), 0], False
    for name, value in parts.items():
        found = cache.get(id(value))
        if found is None or found[0] is not value:
            one: list[bool] = []
            own = [0, 0]
            found = cache[id(value)] = (value, _to_cel(value, one, own), (own[0], own[1]), bool(one))  # kept alive: no id reuse
        out[str(name)] = found[1]
        longest = [max(longest[0], found[2][0]), max(longest[1], found[2][1])]
        big = big or found[3]
    out.longest = (longest[0], longest[1])
    if big or longest[0] > MAX_CEL_LIST:  # walk again for the message naming where (the rare case)
        try:
            check_input(parts)
        except CostLimit as exc:
            out.oversize = str(exc)
    return out


def _to_cel(value: Any, big: list[bool], longest: list[int]) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (str, bytes)):
        if len(value) > longest[1]:
            longest[1] = len(value)
            if len(value) > MAX_CEL_STRING:
                big.append(True)
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        if len(value) > longest[0]:
            longest[0] = len(value)
            if len(value) > MAX_CEL_LIST:
                big.append(True)
        if all(type(v) is float for v in value.values()) and all(type(k) is str for k in value):
            return dict(value)  # a reading's statistics (mean, p50, ...): nothing to convert or measure inside
        return {str(k): _to_cel(v, big, longest) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if len(value) > longest[0]:
            longest[0] = len(value)
            if len(value) > MAX_CEL_LIST:
                big.append(True)
        if all(type(v) is float for v in value):  # a series: nothing to convert or measure inside
            return list(value)
        return [_to_cel(v, big, longest) for v in value]
    return value


def with_value(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of a rule's data with one dotted path set (None removes it): what would the rule say if..."""
    out = copy.copy(data)  # keeps a CelData a CelData (converted and size-checked once)
    node = out
    parts = path.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        child = dict(child) if isinstance(child, dict) else {}
        node[part] = child
        node = child
    if value is None:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value
    return out


def lookup(data: dict[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return _MISSING
    return node


@dataclass
class Outcome:
    value: bool | None  # None: could not decide
    missing: list[str] = field(default_factory=list)  # paths absent or null
    error: str | None = None  # an authoring error (type mismatch...), not a missing value

    def describe(self) -> str:
        if self.missing:
            return ", ".join(p if "(not a release" in p else f"{p} is missing" for p in self.missing)
        return self.error or ""


# the last data dicts evaluated, with their names converted so far to CEL and to JSON (kept alive: no id reuse)
_CONVERTED: list[tuple[dict[str, Any], dict[str, Any], dict[str, str]]] = []
_MEMO: contextvars.ContextVar[dict[tuple, Outcome] | None] = contextvars.ContextVar("rule_memo", default=None)


def _converted(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The CEL and JSON forms made so far of `data`'s top-level values; the whole of `data` is size-checked on
    first sight."""
    if isinstance(data, CelData):
        # data past the CEL budget's size limits is refused before any rule reads it (to_cel_data checked it already)
        if data.oversize:
            raise CostLimit(data.oversize)
        if data.converted is None or data.converted[0] != id(data):
            data.converted = (id(data), {}, {})
        return data.converted[1], data.converted[2]
    for seen, cel, texts in _CONVERTED:
        if seen is data:
            return cel, texts
    check_input(data)
    entry: tuple[dict[str, Any], dict[str, Any], dict[str, str]] = (data, {}, {})
    _CONVERTED.insert(0, entry)
    del _CONVERTED[4:]
    return entry[1], entry[2]


def _read_by(data: dict[str, Any], names: Any) -> list[str]:
    """The top-level names of `data` a rule can read: its free identifiers (and a name a function also has)."""
    return [k for k in data if k in names or k in FUNCTIONS]


def activation(data: dict[str, Any], names: Any = None) -> Any:
    """`data` in CEL types; with `names` (a rule's free identifiers), only those: the rest cannot change the
    rule's outcome. Converting is most of a rule's cost, and the runner evaluates one data dict with several
    rules (confirm, refute, the headline's fields): the last few conversions are kept, by identity, per name
    (rule data is built fresh for each decision and never changed after)."""
    cel = _converted(data)[0]
    wanted = list(data) if names is None else _read_by(data, names)
    for k in wanted:
        if k not in cel:
            cel[k] = celpy.json_to_cel(data[k])
    return celtypes.MapType({celtypes.StringType(k): cel[k] for k in wanted})


@contextlib.contextmanager
def memoized() -> Iterator[None]:
    """Within, `evaluate` decides each rule once per distinct input: the values of the names it reads, exactly
    (JSON of them, in order). For judging many hosts at once (`runbook fleet`), where most share them."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def _part_missing(data: Any, parts: tuple[str, ...]) -> bool:
    if not parts:
        return data is None
    head, rest = parts[0], parts[1:]
    if head in (EACH, INDEX):
        return data is None if not isinstance(data, list) else any(_part_missing(x, rest) for x in data)
    return True if not isinstance(data, dict) else _part_missing(data.get(head), rest)


def element_missing(rule: Rule, data: dict[str, Any]) -> list[str]:
    """Values read through a list's elements (`power.gpus.all(g, g.power_limit_enforced_w ...)`) that are absent or
    null in some element, as `power.gpus[].power_limit_enforced_w`: a per-GPU value a device or exporter lacks."""
    out = []
    for ref in rule.refs:
        if any(p in (EACH, INDEX) for p in ref.parts) and _part_missing(data, ref.parts):
            out.append(".".join(p if p not in (EACH, INDEX) else "[]" for p in ref.parts).replace(".[]", "[]"))
    return list(dict.fromkeys(out))


def missing_paths(rule: Rule, data: dict[str, Any]) -> list[str]:
    """The values the rule reads that are absent or null, a list element's member included (a GPU without its
    limit, as `power.gpus[].power_limit_enforced_w`)."""
    return [p for p in rule.paths if lookup(data, p) is _MISSING or lookup(data, p) is None] + element_missing(rule, data)


def evaluate(rule: Rule, data: dict[str, Any]) -> Outcome:
    """Evaluate against already-normalised data (see `to_cel_data`); once per distinct input under `memoized`."""
    memo = _MEMO.get()
    if memo is None:
        return _evaluate(rule, data)
    fast = _compiled(rule, data)  # before the memo's key: JSON of the data, as dear as the rule compiled
    if fast is not None and not cel_compiled.checking():
        return _outcome(fast)
    try:
        texts = _converted(data)[1]
        read = _read_by(data, rule.names)
        for k in read:
            if k not in texts:
                texts[k] = json.dumps(data[k], allow_nan=True)
        key = (rule.source, *((k, texts[k]) for k in read))
    except CostLimit as exc:
        return Outcome(None, error=f"rule stopped: {exc}")
    except (TypeError, ValueError):  # not JSON data: decide it afresh
        return _evaluate(rule, data)
    if key not in memo:
        memo[key] = _evaluate(rule, data)
    found = memo[key]
    return Outcome(found.value, list(found.missing), found.error)


def _compiled(rule: Rule, data: dict[str, Any]) -> bool | list[str] | None:
    """The rule's answer from the compiled evaluator (the paths missing, where it cannot be decided for want of
    them), or None where the interpreter must decide (cel_compiled)."""
    plan = _compilable(rule, data)
    if plan is None:
        return None
    answers = _kept(data, "answers")
    if rule.source not in answers:
        answers[rule.source] = _compiled_afresh(rule, plan, data)
    found = answers[rule.source]
    return list(found) if isinstance(found, list) else found


def _kept(data: CelData, slot: str) -> dict[Any, Any]:
    """What `data` keeps in `slot` (answers, contexts), owned by its id: a copy (copy.copy carries the slot
    along) starts its own."""
    made = getattr(data, slot)
    if made is None or made[0] != id(data):
        made = (id(data), {})
        setattr(data, slot, made)
    return made[1]


def compiled_value(rule: Rule, data: dict[str, Any]) -> Any:
    """An expression's value from the compiled evaluator (a headline's field: cel_compiled.value), or None where
    the interpreter must compute it."""
    plan = _compilable(rule, data)
    if plan is None:
        return None
    return cel_compiled.value(plan, data, _context_of(rule, plan, data), data.longest)


def _compilable(rule: Rule, data: dict[str, Any]) -> cel_compiled.Plan | None:
    """The rule's plan where the compiled path may take it on this data (converted, within the size limits)."""
    plan = rule.compiled
    if plan is None or not isinstance(data, CelData) or data.oversize or not cel_compiled.enabled():
        return None
    return plan


def _context_of(rule: Rule, plan: cel_compiled.Plan, data: CelData) -> Callable[[], Any]:
    read = tuple(_read_by(data, rule.names))

    def context() -> Any:  # cut to what this rule reads, made once for every rule that cuts this data alike
        key = (read, cel_compiled.cut_id(plan))
        made = _kept(data, "contexts")
        if key not in made:
            made[key] = cel_compiled.context(cel_compiled.pruned(data, read, plan), FUNCTIONS)
        return made[key]

    return context


def _compiled_afresh(rule: Rule, plan: cel_compiled.Plan, data: CelData) -> bool | list[str] | None:
    context = _context_of(rule, plan, data)

    missing: list[str] = []

    def lacks() -> bool:  # asked only where the compiled run failed
        missing.extend(missing_paths(rule, data))
        return bool(missing)

    answer = cel_compiled.decide(plan, data, context, data.longest, lacks)
    return missing if answer == cel_compiled.MISSING else answer


def _evaluate(rule: Rule, data: dict[str, Any]) -> Outcome:
    fast = _compiled(rule, data)
    if fast is not None and not cel_compiled.checking():
        return _outcome(fast)
    outcome = _interpreted(rule, read_only(rule, data))
    if cel_compiled.checking():
        whole = _interpreted(rule, data)
        if outcome != whole:
            raise cel_compiled.Disagreement(f"{rule.source!r}: on the data it reads {outcome}, on all of it {whole}")
        if fast is not None and outcome != _outcome(fast):
            raise cel_compiled.Disagreement(f"{rule.source!r}: compiled {_outcome(fast)}, interpreted {outcome}")
    return outcome


def read_only(rule: Rule, data: dict[str, Any]) -> dict[str, Any]:
    """The data cut to what the rule reads (cel_compiled.pruned), where its plan found every read rooted at a name
    (its refs): converting evidence to CEL types was half of interpreting a rule, most of it series no rule
    reads. The interpreter answers the same on it: absent stays absent, null null (tests/test_cel_compiled.py)."""
    if rule.compiled is None or not isinstance(data, CelData) or data.oversize:
        return data
    cut = CelData(cel_compiled.pruned(data, tuple(_read_by(data, rule.names)), rule.compiled))
    cut.longest = data.longest
    for name, value in cut.items():  # a version names itself in "not a release version" reasons (_interpreted)
        if isinstance(value, dict) and isinstance(data[name], dict) and "version" in data[name]:
            cut[name] = {**value, "version": data[name]["version"]}
    return cut


def _outcome(answer: bool | list[str]) -> Outcome:
    return Outcome(None, missing=list(answer)) if isinstance(answer, list) else Outcome(answer)


def _interpreted(rule: Rule, data: dict[str, Any]) -> Outcome:
    try:
        result = evaluate_bounded(rule.program, data, activation(data, rule.names))
    except CostLimit as exc:  # a crafted rule (a results file's) or data past the budget: say which limit
        return Outcome(None, error=f"rule stopped: {exc}")
    except celpy.CELEvalError as exc:
        text = str(exc.args[0]) if exc.args else str(exc)
        missing = missing_paths(rule, data)
        # blame the missing values only when the error is about them (no such key, a null operand)
        about_missing = ("no such member", "NoneType", "undeclared reference", "not a version", "CELEvalError")  # the last: || or && of errors
        if missing and any(marker in text or marker in str(exc.args) for marker in about_missing):
            return Outcome(None, missing=missing)
        if "not a version" in text or "not a version" in str(exc.args):
            # a dev build or an unknown release: which fixes it has is unknown, so the verdict is too
            # the version read directly (`server.version`), or inside the server a function was given (`has_feature(server, ...)`)
            versions = [(p, lookup(data, p)) for p in rule.paths if "version" in p]
            versions += [(f"{n}.version", lookup(data, f"{n}.version")) for n in sorted(rule.names)
                         if isinstance(lookup(data, n), dict) and "version" in lookup(data, n)]  # fmt: skip
            versions = list(dict.fromkeys(versions))
            odd = [f"{p}={v!s} (not a release version: unknown, never old)" for p, v in versions
                   if isinstance(v, str) and not is_release_version(v)]  # fmt: skip
            if odd:
                return Outcome(None, missing=odd)
        return Outcome(None, error=f"rule error: {_plain(text)}")
    if isinstance(result, celpy.CELEvalError):  # returned rather than raised by some paths
        return Outcome(None, error=f"rule error: {result.args[0] if result.args else result}")
    if not isinstance(result, (bool, celtypes.BoolType)):
        return Outcome(None, error=f"rule must give true or false, gave {type(result).__name__} {result}")
    return Outcome(bool(result))


# celpy names the rule as a lark Token, or as a plain string when the parser came from lark's cache
_OVERLOAD = re.compile(r"no matching overload for (?:Token\('RULE', '(?P<op>\w+)'\)|'(?P<plain>\w+)') applied to '\((?P<types>[^)]*)\)'")
_CEL_TYPE = re.compile(r"celpy\.celtypes\.(\w+)Type")
_TYPE_WORDS = {"Int": "int", "Double": "double", "String": "string", "Bool": "bool", "List": "list", "Map": "map", "Uint": "uint"}


def _plain(text: str) -> str:
    """celpy's overload errors in the words of the rule: which operation, on which types."""
    m = _OVERLOAD.search(text)
    if not m:
        return text
    op = (m.group("op") or m.group("plain")).split("_")[-1]
    types = [_TYPE_WORDS.get(t, t.lower()) for t in _CEL_TYPE.findall(m.group("types"))]
    if sorted(types) == ["double", "int"]:
        return "CEL does not mix int and double in arithmetic: write numbers in rules with a decimal point (2.0, not 2)"
    return f"cannot apply '{op}' to {' and '.join(types) or 'these values'}"


def format_value(value: Any) -> str:
    if value is _MISSING:
        return "missing"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    if isinstance(value, (list, dict)):
        text = str(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return str(value)


SHOWN_WHOLE = 200  # characters of a list or map's text up to which used_values shows it whole


def _text_within(value: Any, limit: int) -> bool:
    """`len(str(value)) <= limit`, without writing out a long value (a GPU's series: most of used_values' time)."""
    left = [limit]

    def spend(x: Any) -> bool:  # False once the text is past the limit
        kind = type(x)
        if kind in _CONTAINERS:
            left[0] -= _CONTAINERS[kind] + 2 * max(len(x) - 1, 0)  # the brackets, and ", " between items
            is_map = isinstance(x, dict)
            for k, v in x.items() if is_map else ((None, e) for e in x):
                if is_map:
                    left[0] -= len(repr(k)) + 2  # "key: "
                if left[0] < 0 or not spend(v):
                    return False
            return left[0] >= 0
        left[0] -= len(repr(x))
        return left[0] >= 0

    return spend(value) if type(value) in _CONTAINERS else len(str(value)) <= limit


# the overhead of each container's repr around its items: [], {}, and celpy's ListType([...]) and MapType({...})
_CONTAINERS = {list: 2, dict: 2, celtypes.ListType: len("ListType([])"), celtypes.MapType: len("MapType({})")}


def used_values(rule: Rule, data: dict[str, Any]) -> dict[str, Any]:
    """The values a rule read, for the verdict's reason and the report."""
    out: dict[str, Any] = {}
    for path in rule.paths:
        value = lookup(data, path)
        if value is _MISSING:
            out[path] = None
        elif isinstance(value, dict) and "version" in value:  # a server given whole (has_feature(server, ...)): what it read
            out.update({f"{path}.{k}": value[k] for k in ("server_kind", "version") if k in value})
        else:
            out[path] = shown(value)
    return out


def shown(value: Any) -> Any:
    """A value as a reason shows it: a list or map past SHOWN_WHOLE characters of text only by its size."""
    if isinstance(value, (dict, list)) and not _text_within(value, SHOWN_WHOLE):
        return f"<{type(value).__name__} of {len(value)}>"
    return value
