"""Sparkline scales: one test per rule (natural ranges, minimum span, flat series), for the report and the TUI."""

from __future__ import annotations

from gpu_runbook.marks import sparkline as tui_sparkline
from gpu_runbook.scales import SPARK, describe, free_scale, scale_for, series_scale, sparkline

BOTTOM, TOP = SPARK[0], SPARK[-1]


def test_utilization_is_drawn_on_0_to_100():
    scale = scale_for("GPU utilisation (mean over GPUs)", "%")
    assert (scale.low, scale.high, scale.fixed) == (0.0, 100.0, True)
    assert sparkline([100.0] * 10, scale) == TOP * 10  # min-max scaling drew this at the bottom
    assert sparkline([50.0] * 4, scale) == SPARK[4] * 4
    assert describe([100.0] * 10, scale) == "flat at 100%"


def test_kv_usage_is_drawn_on_0_to_1_and_read_as_percent():
    scale = scale_for("KV token usage", "")
    assert (scale.low, scale.high) == (0.0, 1.0)
    assert sparkline([0.9997] * 6, scale) == TOP * 6
    assert describe([0.9997] * 6, scale) == "flat at 100%"
    assert describe([0.5, 0.9], scale) == "min 50%, max 90% (scale 0-100%)"


def test_power_is_drawn_from_zero_to_its_limit():
    wiggle = [235.0, 236.0, 237.0, 236.0, 235.5]  # the seeds' ~1% wiggle
    scale = scale_for("GPU 0 power", "W", limit=600.0)
    assert (scale.low, scale.high) == (0.0, 600.0)
    line = sparkline(wiggle, scale)
    assert len(set(line)) == 1 and line[0] not in (BOTTOM, TOP)  # ~39% of the limit: one mid-low level, no swing
    assert describe(wiggle, scale, "W") == "min 235 W, max 237 W (scale 0-600 W)"


def test_running_requests_are_drawn_from_zero_to_the_cap():
    scale = scale_for("running requests", "req", cap=2048)
    assert (scale.low, scale.high) == (0.0, 2048.0)
    assert sparkline([1935.0] * 3, scale) == TOP * 3
    assert sparkline([64.0] * 3, scale) == BOTTOM * 3


def test_without_a_natural_range_a_small_wiggle_stays_small():
    wiggle = [235.0, 236.0, 237.0, 236.0]  # power without a known limit
    assert scale_for("GPU 0 power", "W") is None
    line = sparkline(wiggle, series_scale("GPU 0 power", "W", wiggle))
    assert BOTTOM not in line and len(set(line)) <= 2  # not a full swing from the lowest to the highest bar
    scale = free_scale(wiggle)
    assert scale.high - scale.low >= 0.2 * 237.0 - 1e-9  # the minimum span


def test_a_real_change_still_draws_as_one():
    ramp = [0.0, 25.0, 50.0, 75.0, 100.0]
    assert sparkline(ramp, free_scale(ramp)) == "▁▃▅▆█"
    assert describe(ramp) == "min 0, max 100"


def test_a_flat_series_draws_at_its_level_and_says_so():
    assert sparkline([113.0] * 5) == TOP * 5  # its own level is the top of its range, not the bottom
    assert describe([113.0] * 5, None, "req") == "flat at 113 requests"
    assert describe([0.0] * 3) == "flat at 0"
    assert sparkline([0.0] * 3) == BOTTOM * 3


def test_the_tui_sparkline_never_draws_a_constant_at_the_bottom_or_a_wiggle_as_a_swing():
    assert tui_sparkline([2100.0] * 8) == TOP * 8
    line = tui_sparkline([2090.0, 2100.0, 2110.0, 2100.0])
    assert BOTTOM not in line
