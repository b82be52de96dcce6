"""A load point's figures from its requests' timestamps (derived in docs/METRICS.md, "LLM serving").

For a request i that completed: ``ttft_i = t_first_i - t_sent_i``; ``e2e_i = t_end_i - t_sent_i``;
``tpot_i = (t_last_i - t_first_i) / (out_i - 1)`` where ``out_i >= 2`` (the decode time per token
after the first); ITL is every gap between consecutive text events of every request. The window is
``T = max(t_end) - min(t_sent)`` over the point's requests. Request throughput ``completed / T``;
output tokens/s ``sum(out_i) / T``; total tokens/s ``sum(in_i + out_i) / T``; tokens/s per user the
mean of ``1 / tpot_i``; goodput the completed requests whose ``ttft_i`` and ``tpot_i`` meet every
bound given, per second of ``T``. Each latency series is summarised by its mean, median, p90, p99
(``stats.percentile``, linear interpolation) and sample standard deviation. Pure functions: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from dlscale.stats import mean, percentile, stdev

SERIES = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "median", "p90", "p99", "std")


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
                  streamed: bool = True) -> dict[str, Any]:
    """Every figure of one load point (names as in docs/METRICS.md; seconds, requests/s, tokens/s)."""
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
             tokens_per_s_per_user=mean(user) if user else None,
             goodput=per_s(good) if good is not None else None,
             goodput_fraction=good / len(results) if good is not None and results else None)
    lags = [r.sent - r.scheduled for r in results if r.scheduled is not None]
    f.update(lag_mean_s=mean(lags) if lags else None, lag_p99_s=percentile(lags, 99) if lags else None,
             lag_max_s=max(lags) if lags else None)
    f["errors"] = dict(Counter(r.error for r in results if not r.ok))
    sources = Counter(r.count_source for r in done)
    f["token_count_source"] = ", ".join(f"{k}: {v}" for k, v in sorted(sources.items())) if sources else None
    events = sum(len(r.times) for r in done)
    f["tokens_per_event"] = out_tokens / events if events else None
    return f


UNITS = {"requests_sent": "requests", "completed": "requests", "failed": "requests", "duration_s": "s",
         "output_tokens": "tokens", "prompt_tokens": "tokens", "request_throughput": "requests/s",
         "output_throughput": "tokens/s", "total_token_throughput": "tokens/s", "tokens_per_s_per_user": "tokens/s",
         "goodput": "requests/s", "goodput_fraction": "fraction", "lag_mean_s": "s", "lag_p99_s": "s",
         "lag_max_s": "s", "tokens_per_event": "tokens", **{f"{n}_{s}_s": "s" for n in SERIES for s in STATS}}


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
