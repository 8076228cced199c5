"""Release facts: which release of a server first (and last) has a feature, from one sourced table per server
kind (engine/sglang_releases.yaml, engine/vllm_releases.yaml).

Rules and next steps ask for a feature by name (`has_feature(server, 'pcie-ipc-allreduce')`: the table of the
server found; `has_feature(server.version, ...)`, written before vLLM, reads SGLang's), so a boundary is written
once, with the marker in the released wheel that proves it (scripts/check-release-facts checks every marker on
both sides of its boundary). A dev build or an unknown version has no answer: it is "unknown" (None), never "old".
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import yamlpos

RELEASE_TABLE = Path(__file__).with_name("sglang_releases.yaml")
TABLES = {"sglang": RELEASE_TABLE, "vllm": Path(__file__).with_name("vllm_releases.yaml")}  # server kind -> its table
DEFAULT_KIND = "sglang"  # whose table a bare version string reads (rules written before vLLM)
_RELEASE = re.compile(r"^v?\d+(\.\d+){1,3}((\.?post|rc|a|b)\d+)?$")


def version_tuple(text: str) -> tuple:
    """'0.5.5.post3' -> ((0, 0), (0, 5), (0, 5), (-1, 'post'), (0, 3)): numbers compare as numbers, so 0.5.10 > 0.5.5."""
    return tuple((0, int(p)) if p.isdigit() else (-1, p) for p in re.findall(r"\d+|[a-zA-Z]+", str(text)))


def is_release_version(text: Any) -> bool:
    """A released version orders; a dev build (`0.0.0.dev0`, `0.5.8.dev12+g1a2b3c`) or anything else does not.

    SGLang 0.5.7 reports `0.0.0.dev0` without its build-generated `_version.py`, and a source tree reports a
    setuptools-scm dev version: neither says which release's code runs, so it is unknown, never "old".
    """
    t = str(text).strip() if text is not None else ""
    return bool(_RELEASE.match(t)) and not re.match(r"^v?0+(\.0+)*$", t.split("rc")[0].split("post")[0].rstrip("."))


def _key(version: str) -> tuple:
    return version_tuple(str(version).strip().lstrip("v"))


class Marker(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="A file inside the wheel, e.g. sglang/srt/environ.py.")
    text: str = Field(min_length=1, description="A string the file holds from the boundary's release on.")


class Feature(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")
    what: str
    first: str
    last: str | None = None
    marker: Marker
    gone: Marker | None = None  # where `last` is set: a string the release after `last` holds and `last` does not
    source: str = Field(min_length=1)

    @field_validator("first", "last")
    @classmethod
    def _a_release(cls, v: str | None) -> str | None:
        if v is not None and not is_release_version(v):
            raise ValueError(f"'{v}' is not a release version")
        return v

    def present_in(self, version: str) -> bool:
        key = _key(version)
        return key >= _key(self.first) and (self.last is None or key <= _key(self.last))


class ReleaseTable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = 1
    package: str
    features: list[Feature]


class ReleaseTableError(ValueError):
    """A bad table: every problem with file:line:col."""


@lru_cache(maxsize=4)
def release_table(path: str = str(RELEASE_TABLE)) -> ReleaseTable:
    try:
        doc = yamlpos.load(path)
    except yamlpos.SourceError as exc:
        raise ReleaseTableError(str(exc)) from None
    try:
        table = ReleaseTable.model_validate(doc.data)
    except ValidationError as exc:
        msgs = [str(doc.error(tuple(e["loc"]), f"{'.'.join(str(p) for p in e['loc'])}: {e['msg'].removeprefix('Value error, ')}")) for e in exc.errors()]
        raise ReleaseTableError("\n".join(msgs)) from None
    names = [f.name for f in table.features]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ReleaseTableError(f"{path}: feature names must be unique: {', '.join(dup)}")
    for i, f in enumerate(table.features):
        if (f.last is None) != (f.gone is None):
            raise ReleaseTableError(str(doc.error(("features", i), f"feature '{f.name}': `last` and `gone` go together (a removal needs its marker)")))
    return table


def table_for(kind: str | None) -> ReleaseTable:
    """The release table of a server kind; KeyError for a kind that has none."""
    path = TABLES.get(kind or DEFAULT_KIND)
    if path is None:
        raise KeyError(f"no release table for server kind '{kind}' (tables: {', '.join(TABLES)})")
    return release_table(str(path))


def feature(name: str, kind: str | None = None) -> Feature:
    """The row of that name in the kind's table; KeyError naming the known ones otherwise."""
    table = table_for(kind)
    for f in table.features:
        if f.name == name:
            return f
    raise KeyError(f"unknown {table.package} feature '{name}' (known: {', '.join(f.name for f in table.features)})")


def feature_names(kind: str | None = None) -> list[str]:
    """The features of one kind's table; of every table where `kind` is "*"."""
    if kind == "*":
        return sorted({f.name for k in TABLES for f in table_for(k).features})
    return [f.name for f in table_for(kind).features]


def has_feature(version: Any, name: str, kind: str | None = None) -> bool | None:
    """Whether a server of `kind` reporting `version` has the feature; None where the version does not order (a
    dev build, `0.0.0.dev0`, unknown): the answer is unknown, never "old"."""
    row = feature(name, kind)
    if not is_release_version(version):
        return None
    return row.present_in(str(version))
