"""Kernel bucket rules: ordered name patterns loaded from YAML, validated at FILE:LINE:COL.

The rules are data so a user can teach the analysis a kernel we have never seen (a new MoE runner,
a DSA attention backend) without a release: their file's rules are tried before the shipped ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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
    category: list[Category] | None = None
    exact: list[str] = Field(default_factory=list)
    prefix: list[str] = Field(default_factory=list)
    contains: list[str] = Field(default_factory=list)
    contains_nocase: list[str] = Field(default_factory=list)
    regex: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _has_a_pattern(self) -> "RuleSpec":
        if not (self.exact or self.prefix or self.contains or self.contains_nocase or self.regex or self.category):
            raise ValueError("a rule needs at least one of exact, prefix, contains, contains_nocase, regex or category")
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
    regex: re.Pattern[str] | None
    where: str  # FILE:LINE:COL of the rule, so a surprising classification can be traced to its rule

    def matches(self, name: str, lower: str, category: str) -> bool:
        if self.categories is not None and category not in self.categories:
            return False
        if not (self.exact or self.prefix or self.contains or self.contains_nocase or self.regex):
            return True  # a category-only rule
        return (
            name in self.exact
            or (bool(self.prefix) and name.startswith(self.prefix))
            or any(c in name for c in self.contains)
            or any(c in lower for c in self.contains_nocase)
            or (self.regex is not None and self.regex.search(name) is not None)
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


def load_rules(path: str | Path) -> list[Rule]:
    """One rules file, validated. Raises LoadError whose errors read FILE:LINE:COL: message."""
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
        compiled = None
        for j, pattern in enumerate(r.regex):
            try:
                re.compile(pattern)
            except re.error as exc:
                errors.append(doc.error(("rules", i, "regex", j), f"rules.{i}.regex.{j}: not a valid regular expression: {exc}"))
        if r.regex and not errors:
            compiled = re.compile("|".join(f"(?:{p})" for p in r.regex))
        pos = doc.pos(("rules", i))
        where = f"{doc.path}:{pos.line}:{pos.col}" if pos else doc.path
        rules.append(Rule(
            r.bucket, r.backend, frozenset(r.category) if r.category else None, frozenset(r.exact), tuple(r.prefix),
            tuple(r.contains), tuple(c.lower() for c in r.contains_nocase), compiled, where,
        ))  # fmt: skip
    if errors:
        raise LoadError(errors)
    return rules


def classifier(extra: list[str | Path] | tuple[str | Path, ...] = ()) -> Classifier:
    """The user's rule files first (in the order given), then the shipped rules."""
    rules: list[Rule] = []
    for path in extra:
        rules.extend(load_rules(path))
    rules.extend(load_rules(SHIPPED))
    return Classifier(rules)
