"""Is a shortfall real or noise? One-sided tests on the logarithms of rates (scipy.stats).

Rates are compared as ratios, so the tests run on ``log(rate)``: a ratio becomes a difference
and the 95% interval of the difference maps back to an interval of the ratio (``exp``). Each
test asks whether the measured rate is *lower* than the expected one (one-sided p-value), and
gives the two-sided 95% interval of measured / expected:

- ``vs_runs``: a figure against the same figure in the baseline's accepted runs. Two runs differ
  by more than the steps inside one run do (the machine's load, clocks and placement change
  between runs, and hold still within one), so the noise is the spread *between runs* of that
  figure on that class of device (``noise.between_runs``: the runs' own, pooled over the figure's
  peers of the same model, bounded where the history is short; the ``run_spread`` floor where it
  has none); a normal test of the new run's log value against their mean log value;
- ``vs_known``: a figure against a healthy figure whose spread among healthy systems is known
  (its tolerance): a normal test of the log ratio;
- ``vs_samples``: the figure's samples against its peers' in the same run (Welch's t-test,
  unequal variances): peers are measured in the same window, so the steps are their noise;
- ``vs_value``: the samples against a fixed value (a datasheet or reference figure), a one-sample
  t-test of the log samples against its log.

Fewer than two values on a side, or no spread at all, gives no sample test (None): then nothing
is significant, and a verdict never FAILs (docs/METRICS.md, "Acceptance: verdicts").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Test:
    p: float  # one-sided: probability of a shortfall this large or larger if there were none
    ratio_ci: tuple[float, float] | None  # two-sided 95% interval of measured / expected
    method: str
    runs: int | None = None  # vs_runs: the baseline runs (or peers)
    sigma: float | None = None  # vs_runs: the between-run spread used (log)
    against: str | None = None  # vs_runs: "1 baseline run", "3 peers"
    noise: dict | None = None  # vs_runs against a baseline: how sigma was found (noise.Spread.to_dict)

    def to_dict(self) -> dict:
        return {"p": self.p, "ratio_ci95": list(self.ratio_ci) if self.ratio_ci else None, "method": self.method,
                "runs": self.runs, "sigma": self.sigma, "against": self.against,
                **({"noise": self.noise} if self.noise else {})}

    def detectable(self, alpha: float) -> float | None:
        """vs_runs: the smallest shortfall that is significant at ``alpha`` with this spread and
        these runs, ``1 - exp(-z(1 - alpha) * sigma * sqrt(1 + 1/n))`` (the floor on what can FAIL)."""
        return detectable(self.runs, self.sigma, alpha) if self.runs and self.sigma is not None else None


def _logs(xs: Sequence[float]) -> list[float]:
    return [math.log(x) for x in xs if x is not None and x > 0]


def _spread(xs: Sequence[float]) -> bool:
    return len(xs) >= 2 and max(xs) > min(xs)


def _ci(res) -> tuple[float, float] | None:  # noqa: ANN001 - a scipy TtestResult
    lo, hi = res.confidence_interval(0.95)
    return (math.exp(lo), math.exp(hi)) if math.isfinite(lo) and math.isfinite(hi) else None


def vs_runs(value: float, runs: Sequence[float], floor: float, noun: str = "baseline run",
            spread: object = None) -> Test | None:
    """The new run's value m against n baseline runs' values b_i: with y_i = log b_i, their mean
    y and standard deviation s (n >= 2; none with one run), the between-run spread sigma is
    ``spread.sigma`` where the caller found it from the figure's history (``noise.Spread``: a
    baseline), else max(s, floor) (peers whose differences last a whole run, ``noun`` "peer":
    nodes' CPUs on one host); z = (log m - y) / (sigma * sqrt(1 + 1/n)) (the new run deviates by
    sigma, the mean of n runs by sigma / sqrt n); p = Phi(z), one-sided; sigma is taken as known."""
    from scipy.stats import norm

    ys = _logs(runs)
    if not ys or not value > 0:
        return None
    n = len(ys)
    y = sum(ys) / n
    s = math.sqrt(sum((v - y) ** 2 for v in ys) / (n - 1)) if n >= 2 else None
    given = getattr(spread, "sigma", None)
    sigma = given if given is not None else max(s or 0.0, floor)
    se = sigma * math.sqrt(1 + 1 / n)
    d = math.log(value) - y
    half = float(norm.ppf(0.975)) * se
    if given is not None:
        spread_text = str(getattr(spread, "basis", ""))
    else:
        spread_text = (f"their spread {s:.3f}" + (f" below the floor {floor:g}" if s < floor else "")) \
            if s is not None else f"the floor {floor:g}"
    against = f"{n} {noun}{'s' if n > 1 else ''}"
    method = f"{'between-run' if noun != 'peer' else 'between-peer'} test on log values: {against}, spread " \
             f"{sigma:.3f} ({spread_text})"
    noise = spread.to_dict() if given is not None and hasattr(spread, "to_dict") else None
    return Test(float(norm.cdf(d / se)), (math.exp(d - half), math.exp(d + half)), method, runs=n, sigma=sigma,
                against=against, noise=noise)


def vs_known(value: float, expected: float, sigma: float) -> Test | None:
    """A figure m against a healthy figure e whose spread among healthy systems is sigma (log):
    z = log(m / e) / sigma, p = Phi(z), one-sided; the ratio's 95% interval exp(log(m/e) -+ 1.96 sigma)."""
    from scipy.stats import norm

    if not value > 0 or not expected > 0 or not sigma > 0:
        return None
    d = math.log(value / expected)
    half = float(norm.ppf(0.975)) * sigma
    return Test(float(norm.cdf(d / sigma)), (math.exp(d - half), math.exp(d + half)),
                f"normal test of the log ratio against healthy systems' spread {sigma:.4f}", sigma=sigma,
                against="healthy systems")


def detectable(n: int, sigma: float, alpha: float) -> float:
    """The smallest shortfall ``vs_runs`` finds significant at ``alpha``: 1 - exp(-z(1 - alpha) sigma sqrt(1 + 1/n))."""
    from scipy.stats import norm

    return 1 - math.exp(-float(norm.ppf(1 - alpha)) * sigma * math.sqrt(1 + 1 / n))


def vs_samples(new: Sequence[float], base: Sequence[float]) -> Test | None:
    """Welch's t-test of log(new) < log(base)."""
    from scipy import stats

    a, b = _logs(new), _logs(base)
    if len(a) < 2 or len(b) < 2 or not (_spread(a) or _spread(b)):
        return None
    one = stats.ttest_ind(a, b, equal_var=False, alternative="less")
    two = stats.ttest_ind(a, b, equal_var=False)
    return Test(float(one.pvalue), _ci(two), f"Welch t-test on log rates ({len(a)} vs {len(b)} samples)")


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
