"""Is a shortfall real or noise? One-sided t-tests on the logarithms of rates (scipy.stats).

Rates are compared as ratios, so the tests run on ``log(rate)``: a ratio becomes a difference
and the 95% interval of the difference maps back to an interval of the ratio (``exp``). Each
test asks whether the measured rate is *lower* than the expected one (one-sided p-value), and
gives the two-sided 95% interval of measured / expected:

- ``vs_samples``: the figure's samples against a baseline's or its peers' (Welch's t-test, unequal
  variances);
- ``vs_cells``: paired cells (the same collective size and mode in both runs), a one-sample
  t-test of the per-cell log ratios against 0;
- ``vs_value``: the samples against a fixed value (a datasheet or reference figure), a one-sample
  t-test of the log samples against its log.

Fewer than two values on a side, or no spread at all, gives no test (None): then nothing is
significant, and a verdict never FAILs (docs/METRICS.md, "Acceptance: verdicts").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Test:
    p: float  # one-sided: probability of a shortfall this large or larger if there were none
    ratio_ci: tuple[float, float] | None  # two-sided 95% interval of measured / expected
    method: str

    def to_dict(self) -> dict:
        return {"p": self.p, "ratio_ci95": list(self.ratio_ci) if self.ratio_ci else None, "method": self.method}


def _logs(xs: Sequence[float]) -> list[float]:
    return [math.log(x) for x in xs if x is not None and x > 0]


def _spread(xs: Sequence[float]) -> bool:
    return len(xs) >= 2 and max(xs) > min(xs)


def _ci(res) -> tuple[float, float] | None:  # noqa: ANN001 - a scipy TtestResult
    lo, hi = res.confidence_interval(0.95)
    return (math.exp(lo), math.exp(hi)) if math.isfinite(lo) and math.isfinite(hi) else None


def vs_samples(new: Sequence[float], base: Sequence[float]) -> Test | None:
    """Welch's t-test of log(new) < log(base)."""
    from scipy import stats

    a, b = _logs(new), _logs(base)
    if len(a) < 2 or len(b) < 2 or not (_spread(a) or _spread(b)):
        return None
    one = stats.ttest_ind(a, b, equal_var=False, alternative="less")
    two = stats.ttest_ind(a, b, equal_var=False)
    return Test(float(one.pvalue), _ci(two), f"Welch t-test on log rates ({len(a)} vs {len(b)} samples)")


def vs_cells(new: Mapping[str, float], base: Mapping[str, float]) -> Test | None:
    """Paired: the per-cell log ratios of the cells both have, against 0."""
    common = [k for k in new if k in base and new[k] > 0 and base[k] > 0]
    d = [math.log(new[k] / base[k]) for k in common]
    if len(d) < 2 or not _spread(d):
        return None
    return _one_sample(d, 0.0, f"paired t-test on log ratios ({len(d)} cells)")


def vs_value(new: Sequence[float], value: float) -> Test | None:
    """One-sample t-test of log(new) < log(value)."""
    a = _logs(new)
    if len(a) < 2 or not _spread(a) or not value > 0:
        return None
    return _one_sample(a, math.log(value), f"one-sample t-test on log rates ({len(a)} samples)")


def _one_sample(xs: list[float], mu: float, method: str) -> Test:
    from scipy import stats

    one = stats.ttest_1samp(xs, mu, alternative="less")
    two = stats.ttest_1samp(xs, mu)
    lo, hi = two.confidence_interval(0.95)
    ci = (math.exp(lo - mu), math.exp(hi - mu)) if math.isfinite(lo) and math.isfinite(hi) else None
    return Test(float(one.pvalue), ci, method)
