"""The highest load whose p99 TTFT and p99 TPOT meet the SLOs, found by a search that accounts for noise.

A point is judged per bound with a distribution-free 95% interval of its p99 (``p99_interval``: order
statistics whose ranks come from the binomial law of the count below the true p99): it *fails* when
the interval's low end is above the bound, *meets* when its high end is at or below it (where n
samples are too few for a high end, the largest sample stands in: the p99 cannot be judged higher
than anything seen), and is *unsure* otherwise. An unsure point is measured once more and judged
on both samples together; still unsure, its point estimate decides and the point says so.

The search doubles the load from the lowest given until a point fails (or the highest given, or
the point budget, is reached), then bisects between the highest point that met and the lowest that
failed until they are within 10% (one request apart for concurrencies). The answer is the highest
load that met; the binding SLO is the one the lowest failing point missed (both when both did),
or none when no point failed.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

CONFIDENCE = 0.95
PRECISION = 0.10  # the search stops when the failing load is within 10% of the meeting one


def p99_interval(xs: Sequence[float], q: float = 0.99, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """(low, high): a distribution-free ``confidence`` interval of the ``q`` quantile from order statistics.

    With B ~ Binomial(n, q) the count of samples below the true quantile, ``X_(l) <= xi <= X_(u)``
    holds with probability ``P(l <= B <= u - 1)``; l is the largest rank with ``P(B <= l - 1) <=
    alpha/2`` and u the smallest with ``P(B <= u - 1) >= 1 - alpha/2``. Ranks outside 1..n take the
    smallest or largest sample. None for an empty series."""
    from scipy.stats import binom

    n = len(xs)
    if n == 0:
        return None
    s = sorted(xs)
    a = (1 - confidence) / 2
    lo = int(binom.ppf(a, n, q))  # smallest k with P(B <= k) >= a, so P(B <= k - 1) < a
    hi = int(binom.ppf(1 - a, n, q)) + 1
    return s[min(max(lo, 1), n) - 1], s[min(max(hi, 1), n) - 1]


def needed(q: float, confidence: float = CONFIDENCE) -> int:
    """The fewest samples whose ``p99_interval`` of the ``q`` quantile has both ends among them (ranks 1..n):
    ``(1 - q)^n < alpha/2`` (a sample below it, rank l >= 1) and ``1 - q^n >= 1 - alpha/2`` (one above,
    u <= n). Fewer, and the quantile is a point estimate with no interval: a p99 of one request is that
    request. q = 0.5: 6; 0.9: 36; 0.99: 368."""
    a = (1 - confidence) / 2
    n = max(1, math.floor(max(math.log(a) / math.log(q), math.log(a) / math.log(1 - q))))
    while not ((1 - q) ** n < a and 1 - q ** n >= 1 - a):
        n += 1
    return n


def judge_one(xs: Sequence[float], bound: float) -> str:
    """'meets', 'fails' or 'unsure' for the p99 of ``xs`` against ``bound`` (no samples: 'meets', nothing missed)."""
    iv = p99_interval(xs)
    if iv is None:
        return "meets"
    if iv[0] > bound:
        return "fails"
    return "meets" if iv[1] <= bound else "unsure"


@dataclass
class Judged:
    load: float
    verdict: str  # meets | fails
    per_bound: dict[str, str]
    p99: dict[str, float | None]
    unsure: bool = False  # decided by the point estimate after a second measurement
    index: int = -1  # which measured point (the pooled one for a remeasured load)


def judge(samples: dict[str, Sequence[float]], bounds: dict[str, float], load: float) -> Judged:
    from dlscale.stats import percentile

    per = {k: judge_one(samples.get(k, ()), b) for k, b in bounds.items()}
    p99 = {k: percentile(samples[k], 99) if samples.get(k) else None for k in bounds}
    verdict = "fails" if "fails" in per.values() else "meets" if all(v == "meets" for v in per.values()) else "unsure"
    return Judged(load, verdict, per, p99)


def missed(j: Judged, bounds: dict[str, float]) -> list[str]:
    """The bounds a failing point missed: judged so, or (decided by its point estimate) with a p99 above them."""
    return [k for k, v in j.per_bound.items()
            if v == "fails" or (v == "unsure" and j.p99.get(k) is not None and j.p99[k] > bounds[k])]


@dataclass
class Answer:
    best: float | None  # the highest load that met (None: not even the lowest)
    binding: list[str] = field(default_factory=list)  # the SLOs the lowest failing load missed
    points: list[Judged] = field(default_factory=list)
    reason: str = ""


Measure = Callable[[float, bool], Awaitable[tuple[dict[str, Sequence[float]], int]]]


async def find_max(measure: Measure, bounds: dict[str, float], lo: float, hi: float | None, integer: bool,
                   max_points: int) -> Answer:
    """Search the highest load meeting ``bounds``. ``measure(load, again)`` runs a point (``again``: a second
    measurement of the same load, pooled with the first) and returns its samples and point index."""
    ans = Answer(best=None)
    budget = [max_points]

    async def point(load: float) -> Judged:
        samples, idx = await measure(load, False)
        budget[0] -= 1
        j = judge(samples, bounds, load)
        if j.verdict == "unsure" and budget[0] > 0:
            samples, idx = await measure(load, True)
            budget[0] -= 1
            j = judge(samples, bounds, load)
        if j.verdict == "unsure":
            j.unsure = True
            j.verdict = "fails" if any(p is not None and p > bounds[k] for k, p in j.p99.items()) else "meets"
        j.index = idx
        ans.points.append(j)
        return j

    ok: Judged | None = None
    bad: Judged | None = None
    x = lo
    while budget[0] > 0:
        j = await point(x)
        if j.verdict == "fails":
            bad = j
            break
        ok = j
        if hi is not None and x >= hi:
            break
        x = min(x * 2, hi) if hi is not None else x * 2
    while ok is not None and bad is not None and budget[0] > 0 and not _close(ok.load, bad.load, integer):
        mid = math.floor((ok.load + bad.load) / 2) if integer else math.sqrt(ok.load * bad.load)
        j = await point(mid)
        if j.verdict == "fails":
            bad = j
        else:
            ok = j
    ans.best = ok.load if ok is not None else None
    if bad is not None:
        ans.binding = missed(bad, bounds) or [max(bad.p99, key=lambda k: (bad.p99[k] or 0) / bounds[k])]
    ans.reason = _reason(ans, ok, bad, hi, integer)
    return ans


def _close(a: float, b: float, integer: bool) -> bool:
    return b - a <= 1 if integer else b <= a * (1 + PRECISION)


def _reason(ans: Answer, ok: Judged | None, bad: Judged | None, hi: float | None, integer: bool) -> str:
    if ok is None:
        return f"even the lowest load ({bad.load:g}) misses the {' and '.join(ans.binding)} SLO" if bad else "no point measured"
    if bad is None:
        why = f"the highest load given ({hi:g})" if hi is not None and ok.load >= hi else "the point budget"
        return f"every load up to {ok.load:g} met the SLOs; the search stopped at {why}, so no SLO binds below it"
    how = ("within the search's precision" if _close(ok.load, bad.load, integer) else
           "the point budget ran out before the search's precision")
    return f"{ok.load:g} met and {bad.load:g} missed ({' and '.join(ans.binding)} binds); {how}"


def answer_dict(ans: Answer) -> dict[str, Any]:
    return {"best": ans.best, "binding": ans.binding, "reason": ans.reason,
            "points": [{"load": j.load, "verdict": j.verdict, "per_bound": j.per_bound, "p99": j.p99,
                        "unsure": j.unsure, "index": j.index} for j in ans.points]}
