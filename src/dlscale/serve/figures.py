"""A load point's figures from its requests' timestamps (derived in docs/METRICS.md, "LLM serving").

For a request i that completed: ``ttft_i = t_first_i - t_sent_i``; ``e2e_i = t_end_i - t_sent_i``;
``tpot_i = (t_last_i - t_first_i) / (out_i - 1)`` where ``out_i >= 2`` (the decode time per token
after the first); ITL is every gap between consecutive text events of every request. The window is
``T = max(t_end) - min(t_sent)`` over the point's requests. Request throughput ``completed / T``;
output tokens/s ``sum(out_i) / T``; total tokens/s ``sum(in_i + out_i) / T``; tokens/s per user the
median over requests of ``1 / tpot_i`` (AIPerf's per-request "output token throughput per user", its
p50: a mean of reciprocals is ruled by the few near-zero TPOTs of answers that arrive in one burst);
output tokens/s per user ``sum(out_i) / T / users`` (vLLM's tokens/s/user: the server's output over
the users in flight, the concurrency or cap, else the mean in flight ``sum(e2e_i) / T``); goodput the
completed requests whose ``ttft_i`` and ``tpot_i`` meet every bound given, per second of ``T``. Each
latency series is summarised by its mean, median, p90, p99 (``stats.percentile``, linear
interpolation) and sample standard deviation; ``too_few_for`` names the percentiles the point has too
few requests for (``search.needed``). ``two_speed`` tests the point's first part against the rest.
Pure functions: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from dlscale.serve.search import needed
from dlscale.stats import mean, percentile, stdev

SERIES = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "median", "p90", "p99", "std")
QUANTILES = {"median": 0.5, "p90": 0.9, "p99": 0.99}
# two-speed: the first fifth of a point's requests (at least TWO_SPEED_MIN) against the rest (as many)
TWO_SPEED_MIN, TWO_SPEED_P, TWO_SPEED_RATIO = 5, 0.01, 1.2


def summary(xs: Sequence[float]) -> dict[str, float | None]:
    """mean, median, p90, p99 and sample standard deviation of ``xs`` (None each for an empty series)."""
    if not xs:
        return dict.fromkeys(STATS)
    return {"mean": mean(xs), "median": percentile(xs, 50), "p90": percentile(xs, 90), "p99": percentile(xs, 99),
            "std": stdev(xs)}


def per_request(r: Any) -> dict[str, Any]:
    """One completed request's ttft, e2e, tpot and ITL gaps (None where its events do not define them)."""
    times = r.times
    ttft = times[0] - r.sent if times else None
    out = r.output_tokens or 0
    tpot = (times[-1] - times[0]) / (out - 1) if len(times) >= 2 and out >= 2 else None
    return {"ttft": ttft, "e2e": r.end - r.sent, "tpot": tpot,
            "itl": [b - a for a, b in zip(times, times[1:])], "out": out, "in": r.prompt_tokens or 0}


def meets(one: dict[str, Any], bounds: dict[str, float]) -> bool:
    """Whether one request meets every bound (a bound on a figure the request lacks, e.g. TPOT of a
    one-token answer, is met: there is nothing to miss)."""
    return all(one[k] is None or one[k] <= b for k, b in bounds.items())


def point_figures(results: Sequence[Any], bounds: dict[str, float] | None = None,
                  streamed: bool = True, users: float | None = None) -> dict[str, Any]:
    """Every figure of one load point (names as in docs/METRICS.md; seconds, requests/s, tokens/s);
    ``users``: the users in flight it was run at (a concurrency or a cap; None: the mean in flight)."""
    bounds = bounds or {}
    done = [r for r in results if r.ok]
    each = [per_request(r) for r in done]
    window = (max(r.end for r in results if r.end is not None) - min(r.sent for r in results)) if results else 0.0
    f: dict[str, Any] = {"requests_sent": len(results), "completed": len(done), "failed": len(results) - len(done),
                         "duration_s": window}
    series = {"ttft": [e["ttft"] for e in each if e["ttft"] is not None],
              "tpot": [e["tpot"] for e in each if e["tpot"] is not None],
              "itl": [g for e in each for g in e["itl"]], "e2e": [e["e2e"] for e in each]}
    if not streamed:  # one arrival per request: no first token apart from the last, no gaps
        series.update(ttft=[], tpot=[], itl=[])
    for name in SERIES:
        for stat, v in summary(series[name]).items():
            f[f"{name}_{stat}_s"] = v
    out_tokens = sum(e["out"] for e in each)
    in_tokens = sum(e["in"] for e in each)
    per_s = (lambda x: x / window) if window > 0 else (lambda x: None)
    good = sum(meets(e, bounds) for e in each) if bounds else None
    user = [1.0 / t for t in series["tpot"] if t > 0]
    f.update(output_tokens=out_tokens, prompt_tokens=in_tokens, request_throughput=per_s(len(done)),
             output_throughput=per_s(out_tokens), total_token_throughput=per_s(out_tokens + in_tokens),
             tokens_per_s_per_user=percentile(user, 50) if user else None,
             goodput=per_s(good) if good is not None else None,
             goodput_fraction=good / len(results) if good is not None and results else None)
    lags = [r.sent - r.scheduled for r in results if r.scheduled is not None]
    f.update(lag_mean_s=mean(lags) if lags else None, lag_p99_s=percentile(lags, 99) if lags else None,
             lag_max_s=max(lags) if lags else None)
    f.update(in_flight(results, window))
    users = users or f["in_flight_mean"]
    f["output_throughput_per_user"] = f["output_throughput"] / users if f["output_throughput"] and users else None
    f.update(_waits(results))
    f.update(two_speed(done, streamed))
    f["too_few_for"] = [k for k, q in QUANTILES.items() if len(done) < needed(q)]
    f["errors"] = dict(Counter(r.error for r in results if not r.ok))
    sources = Counter(r.count_source for r in done)
    f["token_count_source"] = ", ".join(f"{k}: {v}" for k, v in sorted(sources.items())) if sources else None
    events = sum(len(r.times) for r in done)
    f["tokens_per_event"] = out_tokens / events if events else None
    return f


def in_flight(results: Sequence[Any], window: float) -> dict[str, float | None]:
    """The most requests in flight at once (a sweep over the [t_sent, t_end) intervals, vLLM's
    max_concurrent_requests) and the mean in flight over the window (sum of e2e / T, Little's law)."""
    spans = [(r.sent, r.end) for r in results if r.end is not None]
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])  # an end before a start at one time
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return {"in_flight_max": most if spans else None,
            "in_flight_mean": sum(b - a for a, b in spans) / window if spans and window > 0 else None}


def _waits(results: Sequence[Any]) -> dict[str, float | None]:
    """At a rate with a cap in flight: each request's wait for a slot, ``scheduled - arrival``."""
    waits = [r.scheduled - r.arrival for r in results if r.arrival is not None and r.scheduled is not None]
    return {"queue_wait_mean_s": mean(waits) if waits else None,
            "queue_wait_p99_s": percentile(waits, 99) if waits else None,
            "queue_wait_max_s": max(waits) if waits else None}


def two_speed(done: Sequence[Any], streamed: bool = True) -> dict[str, Any]:
    """Whether a point ran at two speeds: its completed requests in send order, the first fifth (at least
    TWO_SPEED_MIN) against the rest (at least as many), per-request TPOT (e2e when not streamed): a
    two-sided Mann-Whitney U test with p < TWO_SPEED_P, and medians more than TWO_SPEED_RATIO apart. A
    slow start (a server's first requests compiling, filling caches) that a warm-up left in the point;
    None with fewer than 2 x TWO_SPEED_MIN requests that have the figure."""
    each = [per_request(r) for r in sorted(done, key=lambda r: r.sent)]
    xs = [e["tpot"] for e in each if e["tpot"] is not None] if streamed else [e["e2e"] for e in each]
    k = max(TWO_SPEED_MIN, len(xs) // 5)
    if len(xs) < k + TWO_SPEED_MIN:
        return {"two_speed": None, "two_speed_ratio": None, "two_speed_p": None, "two_speed_first": None}
    from scipy.stats import mannwhitneyu

    first, rest = xs[:k], xs[k:]
    ratio = percentile(first, 50) / percentile(rest, 50) if percentile(rest, 50) > 0 else None
    p = float(mannwhitneyu(first, rest, alternative="two-sided").pvalue)
    apart = ratio is not None and (ratio > TWO_SPEED_RATIO or ratio < 1 / TWO_SPEED_RATIO)
    return {"two_speed": bool(p < TWO_SPEED_P and apart), "two_speed_ratio": ratio, "two_speed_p": p,
            "two_speed_first": k}


def settled(before: Sequence[Any], last: Sequence[Any], streamed: bool = True) -> bool:
    """Whether a warm-up has settled: the median speed (per-request TPOT; e2e when not streamed) of its last
    round of requests is within TWO_SPEED_RATIO of the round before's (False where either has none)."""
    def median_speed(results: Sequence[Any]) -> float | None:
        each = [per_request(r) for r in results if r.ok]
        xs = [e["tpot"] for e in each if e["tpot"] is not None] if streamed else [e["e2e"] for e in each]
        return percentile(xs, 50) if xs else None

    a, b = median_speed(before), median_speed(last)
    return a is not None and b is not None and a > 0 and b > 0 and 1 / TWO_SPEED_RATIO <= b / a <= TWO_SPEED_RATIO


UNITS = {"requests_sent": "requests", "completed": "requests", "failed": "requests", "duration_s": "s",
         "output_tokens": "tokens", "prompt_tokens": "tokens", "request_throughput": "requests/s",
         "output_throughput": "tokens/s", "total_token_throughput": "tokens/s", "tokens_per_s_per_user": "tokens/s",
         "goodput": "requests/s", "goodput_fraction": "fraction", "lag_mean_s": "s", "lag_p99_s": "s",
         "lag_max_s": "s", "tokens_per_event": "tokens", "output_throughput_per_user": "tokens/s",
         "in_flight_max": "requests", "in_flight_mean": "requests", "queue_wait_mean_s": "s", "queue_wait_p99_s": "s",
         "queue_wait_max_s": "s", "two_speed_ratio": "ratio", "two_speed_p": "probability", "two_speed_first": "requests", **{f"{n}_{s}_s": "s" for n in SERIES for s in STATS}}


def goodput_slices(results: Sequence[Any], bounds: dict[str, float], k: int = 5) -> list[float]:
    """Goodput of ``k`` equal slices of a point's requests in send order, each over its own window: repeated
    measurements of the same rate, for a test of its noise (none for fewer than 2 requests per slice)."""
    rs = sorted(results, key=lambda r: r.sent)
    n = len(rs) // k
    if not bounds or n < 2:
        return []
    out = []
    for i in range(k):
        part = rs[i * n:(i + 1) * n]
        window = max(r.end for r in part if r.end is not None) - min(r.sent for r in part)
        good = sum(meets(per_request(r), bounds) for r in part if r.ok)
        if window > 0:
            out.append(good / window)
    return out
