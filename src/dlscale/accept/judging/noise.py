"""The spread between runs a figure is tested with against its baseline: measured on that figure, on
that class of device, not a global floor.

A figure's noise between runs is what its own history shows: the values of the same figure in the
baseline's accepted runs (``sources/baseline.py``'s ``Baseline``), pooled over the figure's *class* (the same check
and figure on every device of the same model: the eight GPUs of a server share one estimate, which
then rests on eight times the runs). With y_kj = log of device k's value in run j:

    s = sqrt( sum_k sum_j (y_kj - mean_k)^2 / df ),  df = sum_k (n_k - 1)

Few runs estimate a spread poorly (two runs 1% apart may come from a figure that moves 10%), so s
is not taken at its word while df is small: its upper confidence bound at the verdict's own level,
``u = s * sqrt(df / chi2_alpha(df))`` (chi-square's alpha quantile), is used, but never above a
*cap*: the figure's spread among healthy systems of its model where the healthy table has a row for
it (``refs.Row.sigma``: a GPU's GEMM is known to vary by a few %), else ``run_spread`` (0.15, the
spread of a shared CPU VM's runs, for a figure nothing is known of). A history that measures a
spread above the cap raises sigma to it: the cap limits what a short history may *assume*, not what
a long one *shows*. Below, sigma never goes under the figure's own noise within a run (the
standard error of its samples' log mean, the median over the runs), which a run-to-run difference
always carries:

    sigma = max(s, min(cap, u), within)          (df >= 1)
    sigma = max(cap, within)                     (no history: one baseline run, or none with a spread)

docs/METRICS.md ("Acceptance: noise between runs") derives it with numbers; ``significance.vs_runs`` uses it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spread:
    sigma: float  # the spread used (SD of the log of the rate between runs)
    basis: str  # how it was found, in words (the verdict's test method says it)
    measured: float | None = None  # s: the pooled SD between runs of the class
    df: int = 0  # its degrees of freedom
    upper: float | None = None  # u: s's upper confidence bound
    cap: float | None = None  # the most a short history may assume (healthy row's sigma, or run_spread)
    within: float | None = None  # the figure's own noise within a run (SE of its log mean)
    devices: int = 1  # devices pooled

    def to_dict(self) -> dict[str, Any]:
        return {"sigma": self.sigma, "measured": self.measured, "df": self.df, "upper": self.upper, "cap": self.cap,
                "within": self.within, "devices": self.devices, "basis": self.basis}


def within_run(samples: Sequence[float]) -> float | None:
    """The standard error of the mean log sample: SD(log x_i) / sqrt(n); None under two samples."""
    ys = [math.log(x) for x in samples if x and x > 0]
    return statistics.stdev(ys) / math.sqrt(len(ys)) if len(ys) >= 2 else None


def pooled(series: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """(s, df): the pooled SD of the log values, each series about its own mean; (None, 0) without df."""
    ss, df = 0.0, 0
    for values in series:
        ys = [math.log(v) for v in values if v and v > 0]
        if len(ys) >= 2:
            m = sum(ys) / len(ys)
            ss += sum((y - m) ** 2 for y in ys)
            df += len(ys) - 1
    return (math.sqrt(ss / df), df) if df else (None, 0)


def upper_bound(s: float, df: int, alpha: float) -> float:
    """The one-sided (1 - alpha) upper confidence bound of an SD s with df degrees of freedom."""
    from scipy.stats import chi2

    return s * math.sqrt(df / float(chi2.ppf(alpha, df)))


def between_runs(series: Sequence[Sequence[float]], samples: Sequence[Sequence[float]], floor: float,
                 alpha: float, prior: float | None = None, what: str = "") -> Spread:
    """The figure's spread between runs (the module doc's rule). ``series``: each device's values in the
    baseline runs (the figure's own first, then its class mates'); ``samples``: the figure's samples in
    each baseline run; ``prior``: its healthy row's sigma, if any; ``what``: the class in words."""
    within_all = [w for w in (within_run(x) for x in samples) if w is not None]
    within = statistics.median(within_all) if within_all else None
    cap = prior if prior is not None else floor
    capped_by = "the healthy spread of its model" if prior is not None else "run_spread, for a figure with no history"
    s, df = pooled(series)
    n_dev = sum(1 for x in series if len(x) >= 2) or 1
    if s is None:
        sigma = max(cap, within or 0.0)
        return Spread(sigma, f"no history of its own: {cap:.3g} ({capped_by})", None, 0, None, cap, within, n_dev)
    u = upper_bound(s, df, alpha)
    sigma = max(s, min(cap, u), within or 0.0)
    who = f" over {n_dev} devices{' of ' + what if what else ''}" if n_dev > 1 else ""
    basis = (f"measured between runs{who}: {s:.3g} on {df} df, its {1 - alpha:.0%} upper bound {u:.3g}"
             + (f" capped at {cap:.3g} ({capped_by})" if u > cap else "")
             + (f", never under its noise within a run {within:.3g}" if within and sigma == within else ""))
    return Spread(sigma, basis, s, df, u, cap, within, n_dev)
