"""Kernel bucket rules: ordered name patterns loaded from YAML, validated at FILE:LINE:COL.

The rules are data so a user can teach the analysis a kernel we have never seen (a new MoE runner,
a DSA attention backend) without a release: their file's rules are tried before the shipped ones.
Every shipped rule says where its names come from (`source`: a file and line in a released wheel or
library, or a public trace); the loader refuses a shipped rule without one. A user's rule may omit it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .. import yamlpos
from ..loader import LoadError, schema_errors
from ..yamlpos import SourceError

BUCKETS = ("moe_gemm", "dense_gemm", "attention", "communication", "norm_act_rope", "quantization", "memcpy", "other")
Bucket = Literal["moe_gemm", "dense_gemm", "attention", "communication", "norm_act_rope", "quantization", "memcpy", "other"]
Category = Literal["kernel", "gpu_memcpy", "gpu_memset"]
SHIPPED = Path(__file__).with_name("kernel_buckets.yaml")
UNCLASSIFIED = "other"  # where a kernel no rule matches is counted (and reported as unclassified)


class RuleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bucket: Bucket
    backend: str | None = Field(None, description="Which implementation this name reveals (reported as a backend seen).")
    source: str | None = Field(None, description="Where the names come from: a file and line in a released wheel or library, or a public trace.")
    category: list[Category] | None = None
    exact: list[str] = Field(default_factory=list)
    prefix: list[str] = Field(default_factory=list)
    contains: list[str] = Field(default_factory=list)
    contains_nocase: list[str] = Field(default_factory=list)
    regex: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _has_a_pattern(self) -> RuleSpec:
        if not (self.exact or self.prefix or self.contains or self.contains_nocase or self.regex or self.category):
            raise ValueError("a rule needs at least one of exact, prefix, contains, contains_nocase, regex or category")
        if self.source is not None and not self.source.strip():
            raise ValueError("a rule's source, when given, must say where its names come from (it is empty)")
        return self


class RulesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    rules: list[RuleSpec] = Field(min_length=1)


@dataclass(frozen=True)
class Rule:
    bucket: str
    backend: str | None
    categories: frozenset[str] | None
    exact: frozenset[str]
    prefix: tuple[str, ...]
    contains: tuple[str, ...]
    contains_nocase: tuple[str, ...]
    regex: re.Pattern[str] | None  # the rule's unanchored regexes, one alternation, searched anywhere in the name
    where: str  # FILE:LINE:COL of the rule, so a surprising classification can be traced to its rule
    source: str | None = None  # where the rule's names come from (required of the shipped rules)
    # The `^`-anchored regexes apart, tried at the name's start only: one anchored branch in a searched
    # alternation makes the regex engine try every branch at every position of a (often kilobyte-long) name.
    anchored: re.Pattern[str] | None = None
    # Built once from the above (`__post_init__`): the substrings and the unanchored regexes as one searched
    # pattern, the case-blind substrings as another. Every kernel of a trace walks the rules until one matches,
    # so a rule costs one or two C-level searches, not a Python loop per substring.
    _find: Callable[[str], object] | None = field(default=None, init=False, repr=False, compare=False)
    _find_lower: Callable[[str], object] | None = field(default=None, init=False, repr=False, compare=False)
    _catch_all: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = [re.escape(c) for c in self.contains] + ([f"(?:{self.regex.pattern})"] if self.regex is not None else [])
        if parts:
            object.__setattr__(self, "_find", re.compile("|".join(parts)).search)
        if self.contains_nocase:
            object.__setattr__(self, "_find_lower", re.compile("|".join(re.escape(c) for c in self.contains_nocase)).search)
        catch_all = not (self.exact or self.prefix or self.contains or self.contains_nocase or self.regex or self.anchored)
        object.__setattr__(self, "_catch_all", catch_all)  # a category-only rule

    def matches(self, name: str, lower: str, category: str) -> bool:
        if self.categories is not None and category not in self.categories:
            return False
        if self._catch_all:
            return True
        return (
            name in self.exact
            or (bool(self.prefix) and name.startswith(self.prefix))
            or (self._find is not None and self._find(name) is not None)
            or (self._find_lower is not None and self._find_lower(lower) is not None)
            or (self.anchored is not None and self.anchored.match(name) is not None)
        )


@dataclass(frozen=True)
class Match:
    bucket: str
    backend: str | None
    classified: bool


class Classifier:
    """First matching rule wins; results are cached per (name, category): traces repeat names."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self._cache: dict[tuple[str, str], Match] = {}

    def classify(self, name: str, category: str = "kernel") -> Match:
        key = (name, category)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._first(name, category)
        return hit

    def _first(self, name: str, category: str) -> Match:
        lower = name.lower()
        for r in self.rules:
            if r.matches(name, lower, category):
                return Match(r.bucket, r.backend, True)
        return Match(UNCLASSIFIED, None, False)


def _anchored(pattern: str) -> bool:
    """True when the regex can only match at the start of the name: it begins with `^` and has no top-level `|`
    (`^a|b` matches `b` anywhere)."""
    if not pattern.startswith("^"):
        return False
    depth, i, in_class = 0, 1, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "^":
                i += 1
            if pattern[i + 1 : i + 2] == "]":  # `[]...]`, `[^]...]`: a literal `]` first in the class
                i += 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            return False
        i += 1
    return True


def load_rules(path: str | Path, *, require_source: bool = False) -> list[Rule]:
    """One rules file, validated. Raises LoadError whose errors read FILE:LINE:COL: message.

    `require_source`: every rule must carry a non-empty `source` (the shipped file's contract)."""
    try:
        doc = yamlpos.load(path)
    except SourceError as exc:
        raise LoadError([exc]) from None
    try:
        spec = RulesFile.model_validate(doc.data)
    except ValidationError as exc:
        raise LoadError(schema_errors(doc, exc)) from None
    rules, errors = [], []
    for i, r in enumerate(spec.rules):
        compiled = anchored = None
        if require_source and r.source is None:
            errors.append(doc.error(("rules", i), f"rules.{i}: a shipped rule needs a `source`: where its names come from "
                                                  "(a file and line in a released wheel or library, or a public trace)"))
        for j, pattern in enumerate(r.regex):
            try:
                re.compile(f"(?:{pattern})")  # as it is joined with the rule's others (a global `(?i)` must be scoped: `(?i:...)`)
            except re.error as exc:
                errors.append(doc.error(("rules", i, "regex", j), f"rules.{i}.regex.{j}: not a valid regular expression: {exc}"))
        if r.regex and not errors:
            starts = [p for p in r.regex if _anchored(p)]
            rest = [p for p in r.regex if not _anchored(p)]
            anchored = re.compile("|".join(f"(?:{p})" for p in starts)) if starts else None
            compiled = re.compile("|".join(f"(?:{p})" for p in rest)) if rest else None
        pos = doc.pos(("rules", i))
        where = f"{doc.path}:{pos.line}:{pos.col}" if pos else doc.path
        rules.append(Rule(
            r.bucket, r.backend, frozenset(r.category) if r.category else None, frozenset(r.exact), tuple(r.prefix),
            tuple(r.contains), tuple(c.lower() for c in r.contains_nocase), compiled, where,
            r.source.strip() if r.source else None, anchored,
        ))  # fmt: skip
    if errors:
        raise LoadError(errors)
    return rules


def classifier(extra: list[str | Path] | tuple[str | Path, ...] = ()) -> Classifier:
    """The user's rule files first (in the order given), then the shipped rules."""
    rules: list[Rule] = []
    for path in extra:
        rules.extend(load_rules(path))
    rules.extend(load_rules(SHIPPED, require_source=True))
    return Classifier(rules)
