"""Small statistics: percentiles, and median with min-max spread over rounds."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def percentile(values: list[float], pct: float, presorted: bool = False) -> float:
    """The pct-th percentile by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    data = values if presorted else sorted(values)
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


@dataclass
class Spread:
    """Median and range of one figure over the rounds of a point."""
    median: float
    low: float
    high: float
    n: int

    def to_dict(self) -> dict:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}

    @property
    def relative_range(self) -> float:
        """(max - min) / median: how noisy the rounds were."""
        return (self.high - self.low) / self.median if self.median else 0.0


def spread(values: list[float | None]) -> Spread | None:
    """Median and min-max of the values that are present; None if none are."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    return Spread(statistics.median(present), min(present), max(present), len(present))


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference, or None when either is missing or the reference is zero."""
    if value is None or reference in (None, 0):
        return None
    return value / reference
