"""Deciding when a timing difference is real. Pure functions over lists of floats.

Medians with distribution-free confidence intervals (order statistics of the binomial), so a
few slow outliers neither move the estimate nor shrink the interval falsely.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """0-based ranks (lo, hi) of the sorted sample bounding the median with >= confidence.

    With too few samples for the confidence asked, the whole range is returned.
    """
    if n < 1:
        raise ValueError("no samples")
    alpha = (1.0 - confidence) / 2.0
    k = 0  # largest k with P(Binomial(n, 1/2) <= k - 1) <= alpha
    cumulative = 0.0
    for j in range(n):
        cumulative += math.comb(n, j) / 2.0**n
        if cumulative > alpha:
            break
        k = j + 1
    lo = max(k - 1, 0)
    return lo, n - 1 - lo


@dataclass(frozen=True)
class Summary:
    median: float
    ci_low: float
    ci_high: float
    n: int


def summarize(values: list[float], confidence: float = 0.95) -> Summary:
    """The median and its interval; NaN throughout where any value is NaN (a lost sample
    proves nothing, and sorting with one in the list orders nothing)."""
    if any(math.isnan(v) for v in values):
        if not values:
            raise ValueError("no samples")
        return Summary(math.nan, math.nan, math.nan, len(values))
    data = sorted(values)
    lo, hi = median_ci_ranks(len(data), confidence)
    return Summary(statistics.median(data), data[lo], data[hi], len(data))


@dataclass(frozen=True)
class Comparison:
    """Candidate against incumbent on one shape: latency ratio (< 1 is faster)."""

    ratio: float
    ci_low: float
    ci_high: float
    noise: float = 0.0  # what the same code timed twice in the same rounds differs by

    @property
    def gain(self) -> float:
        return 1.0 - self.ratio


def compare(incumbent_rounds: list[float], candidate_rounds: list[float],
            confidence: float = 0.95, noise: float = 0.0) -> Comparison:
    """Paired comparison of per-round medians measured in alternating rounds.

    Each round's ratio cancels drift that both variants saw in that round.
    """
    if len(incumbent_rounds) != len(candidate_rounds) or not incumbent_rounds:
        raise ValueError("need the same, non-zero number of rounds for both variants")
    ratios = summarize([c / i if i > 0 and c > 0 else math.nan  # (no time is 0 or less)
                        for c, i in zip(candidate_rounds, incumbent_rounds)], confidence)
    return Comparison(ratios.median, ratios.ci_low, ratios.ci_high, noise)


def real_gain(c: Comparison, min_gain: float = 0.0) -> bool:
    """The keep rule: a gain whose 95% interval excludes zero (the ratio's upper bound below 1)
    and which exceeds the incumbent's own noise and the smallest gain the rules count."""
    return c.ci_high < 1.0 and c.gain > max(c.noise, min_gain)


def noise_of(control: Comparison) -> float:
    """The noise an A/A control shows: how far the same code's ratio strays from 1, or the
    half-width of its interval, whichever is larger."""
    return max(abs(control.ratio - 1.0), (control.ci_high - control.ci_low) / 2.0)
