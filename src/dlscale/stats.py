"""Statistics of timed steps. Pure Python, no torch: every formula is derived in docs/METRICS.md."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Two-sided 95% Student-t critical values t(0.975, df) for df = 1..30 (standard tables).
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)
_Z975 = 1.959963984540054


def t_critical_975(df: int) -> float:
    """t(0.975, df): the table for df <= 30, a Cornish-Fisher expansion beyond (error < 1e-4)."""
    if df < 1:
        raise ValueError("degrees of freedom must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def mean(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("mean of an empty sequence")
    return math.fsum(xs) / len(xs)


def stdev(xs: Sequence[float]) -> float:
    """Sample standard deviation (n - 1 in the denominator); 0.0 for a single value."""
    n = len(xs)
    if n < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (n - 1))


def cv(xs: Sequence[float]) -> float:
    """Coefficient of variation: sample stdev / mean."""
    m = mean(xs)
    return stdev(xs) / m if m else 0.0


def percentile(xs: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) by linear interpolation between order statistics.

    Position h = (n - 1) * q / 100 in the sorted data; the result is
    x[floor(h)] + (h - floor(h)) * (x[floor(h)+1] - x[floor(h)]) (Hyndman-Fan type 7,
    numpy's default).
    """
    if not xs:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    s = sorted(xs)
    h = (len(s) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (h - lo) * (s[hi] - s[lo])


def mean_ci95(xs: Sequence[float]) -> tuple[float, float] | None:
    """95% confidence interval of the mean: mean -/+ t(0.975, n-1) * s / sqrt(n).

    None for fewer than 2 values: one sample has no spread to estimate (s needs n - 1 >= 1), so
    there is no interval, not a zero-width one. n = 2 uses t(0.975, 1) = 12.7062.
    """
    n = len(xs)
    m = mean(xs)
    if n < 2:
        return None
    half = t_critical_975(n - 1) * stdev(xs) / math.sqrt(n)
    return (m - half, m + half)


def throughput(samples_per_step: float, step_times: Sequence[float]) -> float:
    """Samples per second over the window: samples_per_step * n / sum(step times)."""
    total = math.fsum(step_times)
    if total <= 0:
        raise ValueError("the measured window has no duration")
    return samples_per_step * len(step_times) / total


def throughput_ci95_from_steps(samples_per_step: float, step_times: Sequence[float]) -> tuple[float, float] | None:
    """95% CI of the throughput, mapped from the CI of the mean step time.

    [B / (mean_t + h), B / (mean_t - h)] where h is the half-width of the mean step
    time's t-interval; throughput B / t is monotonic in t, so the interval maps exactly.
    If mean_t - h <= 0 the upper bound is unbounded (inf). None for fewer than 2 steps.
    """
    ci = mean_ci95(step_times)
    if ci is None:
        return None
    lo_t, hi_t = ci
    upper = samples_per_step / lo_t if lo_t > 0 else math.inf
    return (samples_per_step / hi_t, upper)


def throughput_ci95_from_repeats(repeat_throughputs: Sequence[float]) -> tuple[float, float] | None:
    """95% CI of the mean throughput over independent repeats (t-interval); None for one repeat."""
    return mean_ci95(repeat_throughputs)
