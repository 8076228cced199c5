"""Every headline a bundled runbook can print reads as words and numbers with units: no raw field names,
no bare numbers (issue 26). Each field names its unit (`count` where the text says what is counted,
`text` for words); the text around the fields has no snake_case names outside `code`."""

from __future__ import annotations

import re

import pytest

from gpu_runbook import findings
from gpu_runbook.loader import available, find, load
from gpu_runbook.model import HEADLINE_FIELD, headline_parts
from gpu_runbook.numbers import UNITS, quantity
from gpu_runbook.registry import Registry
from gpu_runbook.results import HypothesisResult

RAW_NAME = re.compile(r"\b[a-z][a-z0-9]*_[a-z0-9_]+\b")  # communication_share, pcie_link_max_gbps


def _hypotheses():
    registry = Registry.discover([])
    for name in sorted(available()):
        for hyp, _ in load(find(name), registry).runbook.walk():
            yield pytest.param(hyp, id=f"{name}:{hyp.id}")


@pytest.mark.parametrize("hyp", list(_hypotheses()))
def test_each_bundled_headline_names_units_and_no_fields(hyp) -> None:
    assert hyp.headline, f"{hyp.id} has no headline: the summary would fall back to its title"
    for expr, unit in headline_parts(hyp.headline):
        assert unit and unit in UNITS, f"{hyp.id}: '{{{{ {expr} }}}}' has no unit"
    words = re.sub(r"`[^`]*`", "", HEADLINE_FIELD.sub("", hyp.headline))
    assert not RAW_NAME.findall(words), f"{hyp.id}: raw field names in the headline's text: {RAW_NAME.findall(words)}"


def test_a_headline_less_finding_shows_its_title_not_the_rule_values() -> None:
    h = HypothesisResult(id="x", parent=None, title="Communication bounds the step", verdict="confirmed", reason="", severity="warning",
                         rule_values={"prof.communication_share": 0.513, "power.pcie_tx_bytes_per_s.p95": 20347330178.0})  # fmt: skip
    assert findings.headline(h) == "Communication bounds the step"


def test_units_round_once_and_text_stays_text() -> None:
    assert quantity(20347330178.0 / 1e9, "GB/s") == "20.3 GB/s"
    assert quantity(0.513, "share") == "51.3%"
    assert quantity("flashinfer_cutlass", "text") == "flashinfer_cutlass" and quantity(False, "text") == "no"
