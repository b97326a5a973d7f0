"""Percentiles, median and spread over rounds, ratios to gannet."""

from __future__ import annotations

import pytest

from arena.stats import percentile, ratio, spread
from arena.summary import summarize
from results_data import build


def test_percentile_interpolates_between_ranks():
    data = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert percentile(data, 0) == 1
    assert percentile(data, 100) == 10
    assert percentile(data, 50) == pytest.approx(5.5)
    assert percentile(data, 90) == pytest.approx(9.1)
    assert percentile([7], 99) == 7
    assert percentile([3, 1, 2], 50) == 2
    with pytest.raises(ValueError):
        percentile([], 50)


def test_spread_ignores_missing_values():
    s = spread([3.0, None, 1.0, 2.0])
    assert (s.median, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)
    assert s.relative_range == pytest.approx(1.0)
    assert spread([None, None]) is None
    assert spread([4.0, 2.0]).median == 3.0


def test_ratio():
    assert ratio(5, 10) == 0.5
    assert ratio(None, 10) is None
    assert ratio(5, 0) is None
    assert ratio(5, None) is None


def test_summary_medians_and_ratios_to_gannet(tmp_path):
    results = build(tmp_path / "run", {"gannet": [900, 1000, 1100], "nginx": [400, 500, 700]})
    row = next(r for r in results["summary"] if r["server"] == "nginx" and r["point"] == "wrk/keepalive/c10")
    assert row["rounds"] == 3
    assert row["metrics"]["rps"] == {"median": 500, "min": 400, "max": 700, "n": 3}
    assert row["ratio_to_gannet"]["rps"] == pytest.approx(0.5)
    # CPU per 10k requests: server CPU s / requests * 10,000 (100 s / rps per 1000 requests here).
    assert row["metrics"]["cpu_per_10k"]["median"] == pytest.approx(100_000 / 500 / 1000 / 1000 * 10_000)
    assert row["ratio_to_gannet"]["cpu_per_10k"] == pytest.approx(2.0)
    assert row["bytes_ok"] is True and row["failures_total"] == 0
    gannet = next(r for r in results["summary"] if r["server"] == "gannet")
    assert gannet["ratio_to_gannet"]["rps"] == pytest.approx(1.0)


def test_summary_without_gannet_has_no_ratios():
    points = [{"key": "p", "series": "s", "x": 1, "params": {}}]
    samples = [{"point": "p", "server": "nginx", "rps": 10.0, "failures": 0, "requests": 5}]
    rows = summarize(points, samples, ["nginx"])
    assert rows[0]["ratio_to_gannet"]["rps"] is None
