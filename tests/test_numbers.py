"""One rounding rule for every renderer: the same value prints the same everywhere."""

from __future__ import annotations

from gpu_runbook.numbers import number, quantity, share


def test_three_significant_figures_below_100_whole_numbers_above():
    assert number(0.9997) == "1"
    assert number(0.0119) == "0.0119"
    assert number(12.345) == "12.3"
    assert number(236.005) == "236"
    assert number(1683.99) == "1,684"
    assert number(2048) == "2,048"
    assert number(495488) == "495,488"
    assert number(0.0) == "0"
    assert number(None) == "—" and number(True) == "yes"


def test_units():
    assert quantity(0.9997, "share") == "100%"
    assert quantity(0.39334, "share") == "39.3%"
    assert quantity(236.005, "W") == "236 W"
    assert quantity(1935.0, "tok/s") == "1,935 tok/s"
    assert quantity(3071.025, "ms") == "3,071 ms"
    assert quantity(113.0, "req") == "113 requests"
    assert quantity("fp8_e4m3", "") == "fp8_e4m3"
    assert share(236.0, 600.0) == "39.3%" and share(1.0, None) == "—"
