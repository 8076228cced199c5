"""Release facts as data: the table's rows, has_feature() in rules, and no version literal in a bundled runbook.

The markers themselves are checked against the released wheels by scripts/check-release-facts (it needs PyPI);
these tests hold what can be held offline: the table's shape, its answers on both sides of each boundary, a
dev build answered as unknown, and the runbooks asking by feature name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpu_runbook import releases
from gpu_runbook.rules import RuleSyntaxError, compile_rule, evaluate, to_cel_data

REPO = Path(__file__).resolve().parent.parent
VERSION_LITERAL = re.compile(r"(?<![\w.])v?0\.\d+\.\d+(\.post\d+)?(?![\w])")


def test_every_row_has_a_source_and_a_marker_in_the_wheel():
    table = releases.release_table()
    assert table.package == "sglang" and len(table.features) >= 9
    for f in table.features:
        assert f.source.strip() and f.marker.path.startswith("sglang/") and f.marker.text.strip()
        assert releases.is_release_version(f.first)
        assert (f.last is None) == (f.gone is None)


@pytest.mark.parametrize(("name", "before", "first"), [
    ("pcie-ipc-allreduce", "0.5.20", "0.5.21"),
    ("cuda-graph-decode-flags", "0.5.13.post1", "0.5.14"),
    ("expose-own-env-vars", "0.5.18", "0.5.19"),
    ("attn-dp-size-flag", "0.5.21", "0.5.22"),
    ("flashinfer-cutlass-moe-autotune", "0.5.12.post1", "0.5.13"),
    ("glm5-model", "0.5.8.post1", "0.5.9"),
])
def test_a_feature_is_absent_before_its_first_release_and_present_from_it(name, before, first):
    assert releases.has_feature(before, name) is False
    assert releases.has_feature(first, name) is True
    assert releases.has_feature("0.5.23", name) is True


def test_a_removed_feature_is_present_only_between_first_and_last():
    name = "custom-allreduce-v2-without-fallback"
    assert [releases.has_feature(v, name) for v in ("0.5.11", "0.5.12", "0.5.12.post1", "0.5.13")] == [False, True, True, False]


@pytest.mark.parametrize("version", ["0.0.0.dev0", "0.5.8.dev12+g1a2b3c4", None, "main"])
def test_a_dev_or_unknown_version_is_unknown_never_old(version):
    assert releases.has_feature(version, "pcie-ipc-allreduce") is None
    out = evaluate(compile_rule("has_feature(server.version, 'pcie-ipc-allreduce')"), to_cel_data({"server": {"version": version}}))
    assert out.value is None  # the verdict says inconclusive, never "absent"


def test_rules_name_features_the_table_knows():
    rule = compile_rule("has_feature(server.version, 'attn-dp-size-flag') && feature_release('attn-dp-size-flag') == '0.5.22'")
    assert evaluate(rule, to_cel_data({"server": {"version": "0.5.22"}})).value is True
    assert evaluate(rule, to_cel_data({"server": {"version": "0.5.21"}})).value is False
    with pytest.raises(RuleSyntaxError, match="unknown feature 'attn-dp'"):
        compile_rule("has_feature(server.version, 'attn-dp')")
    with pytest.raises(RuleSyntaxError, match="string literal"):
        compile_rule("has_feature(server.version, server.name)")


def _strings(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, path + (str(k),))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, path + (str(i),))
    elif isinstance(node, str):
        yield path, node


@pytest.mark.parametrize("path", sorted((REPO / "runbooks").glob("*.yaml")), ids=lambda p: p.name)
def test_no_version_literal_in_a_bundled_runbook(path):
    """Rules, steps, headlines and explanations ask for a feature by name (engine/sglang_releases.yaml): a
    version written into a runbook is a boundary nobody checks against the releases. The `tests:` entries
    (scenario settings) are data about the simulated host, not claims, and comments are not read."""
    doc = yaml.safe_load(path.read_text())
    found = [f"{'.'.join(p)}: {m.group(0)}" for p, text in _strings({k: v for k, v in doc.items() if k != "tests"})
             for m in VERSION_LITERAL.finditer(text)]  # fmt: skip
    assert not found, f"{path.name} names versions instead of features: {found}"


def test_the_literal_check_catches_a_version_in_a_rule_and_in_a_step(tmp_path):
    text = "hypotheses:\n  - id: a\n    confirm: version_at_least(server.version, '0.5.22')\n    next_steps: ['upgrade to 0.5.13']\n"
    doc = yaml.safe_load(text)
    found = [m.group(0) for _, t in _strings(doc) for m in VERSION_LITERAL.finditer(t)]
    assert found == ["0.5.22", "0.5.13"]
