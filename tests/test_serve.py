"""The serving client's figures, search and configuration, against hand-computed values (no server)."""

from __future__ import annotations

import asyncio
import math
import random
import re
from pathlib import Path

import pytest

from dlscale.errors import UsageError
from dlscale.serve import figures as figs
from dlscale.serve import search
from dlscale.serve.client import Result
from dlscale.serve.config import SLO, SLO_PRESETS, Lengths, ServeConfig
from dlscale.serve.load import arrivals


def _r(i, sent, times, end, out, inp, error=None):
    return Result(index=i, sent=sent, times=list(times), end=end, output_tokens=out, prompt_tokens=inp, error=error,
                  count_source=None if error else "usage")


def test_point_figures_match_hand_computed_values():
    # docs/METRICS.md, "LLM serving": three requests, one failed, computed by hand
    rs = [_r(0, 0.0, [0.5, 0.7, 0.9, 1.1], 1.2, 4, 10), _r(1, 0.2, [1.0, 1.5], 1.6, 2, 20),
          _r(2, 0.4, [], 2.4, None, 30, error="timeout")]
    f = figs.point_figures(rs, {"ttft": 0.6, "tpot": 0.3})
    assert f["duration_s"] == pytest.approx(2.4)
    assert (f["completed"], f["failed"], f["errors"]) == (2, 1, {"timeout": 1})
    assert f["ttft_mean_s"] == pytest.approx(0.65)
    assert f["ttft_p99_s"] == pytest.approx(0.5 + 0.99 * 0.3)
    assert f["ttft_std_s"] == pytest.approx(math.sqrt(2 * 0.15 ** 2))
    assert f["tpot_mean_s"] == pytest.approx((0.2 + 0.5) / 2)  # (1.1 - 0.5) / 3 and (1.5 - 1.0) / 1
    assert f["itl_mean_s"] == pytest.approx((0.2 * 3 + 0.5) / 4)
    assert f["itl_median_s"] == pytest.approx(0.2)
    assert f["e2e_median_s"] == pytest.approx(1.3)
    assert f["request_throughput"] == pytest.approx(2 / 2.4)
    assert f["output_throughput"] == pytest.approx(6 / 2.4)
    assert f["total_token_throughput"] == pytest.approx(36 / 2.4)
    assert f["tokens_per_s_per_user"] == pytest.approx((1 / 0.2 + 1 / 0.5) / 2)
    assert f["goodput"] == pytest.approx(1 / 2.4)  # request 1's TTFT 0.8 s misses 0.6 s
    assert f["goodput_fraction"] == pytest.approx(1 / 3)
    assert f["tokens_per_event"] == pytest.approx(1.0)


def test_not_streamed_has_no_token_latencies():
    f = figs.point_figures([_r(0, 0.0, [1.0], 1.0, 5, 3)], streamed=False)
    assert f["ttft_median_s"] is None and f["itl_median_s"] is None and f["e2e_median_s"] == pytest.approx(1.0)


def test_generator_lag():
    rs = [_r(0, 0.01, [0.5], 0.6, 1, 1), _r(1, 1.03, [1.5], 1.6, 1, 1)]
    rs[0].scheduled, rs[1].scheduled = 0.0, 1.0
    f = figs.point_figures(rs)
    assert f["lag_mean_s"] == pytest.approx(0.02) and f["lag_max_s"] == pytest.approx(0.03)


def _binom_cdf(k, n, p):
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, k + 1))


@pytest.mark.parametrize("n", [100, 500, 1000])
def test_p99_interval_ranks_cover_the_quantile(n):
    xs = list(range(1, n + 1))  # the value is its rank
    lo, hi = search.p99_interval(xs)
    # the interval's ranks: P(B <= lo - 1) < 2.5% and, where hi is a real rank, P(B <= hi - 1) >= 97.5%
    assert _binom_cdf(int(lo) - 1, n, 0.99) < 0.025 <= _binom_cdf(int(lo), n, 0.99)
    if hi < n:
        assert _binom_cdf(int(hi) - 1, n, 0.99) >= 0.975 > _binom_cdf(int(hi) - 2, n, 0.99)
    assert (int(lo), int(hi)) == {100: (97, 100), 500: (490, 500), 1000: (983, 997)}[n]


def test_judge_one():
    xs = [0.1] * 95 + [0.3] * 5
    assert search.judge_one(xs, 0.2) == "fails"  # the 97th of 100 is above
    assert search.judge_one(xs, 0.5) == "meets"
    assert search.judge_one([0.1] * 98 + [0.3] * 2, 0.2) == "unsure"  # only the 99th and 100th are above


def test_search_finds_the_highest_rate_and_the_binding_slo():
    # a server whose TTFT is 0.01 s per request/s of load and whose TPOT never binds
    async def measure(load, again):
        return {"ttft": [0.01 * load] * 200, "tpot": [0.001] * 200}, int(load * 100)

    ans = asyncio.run(search.find_max(measure, {"ttft": 0.1, "tpot": 0.2}, 1.0, None, False, 12))
    assert 10 / 1.1 <= ans.best <= 10
    assert ans.binding == ["ttft"]
    loads = [j.load for j in ans.points]
    assert loads[:5] == [1, 2, 4, 8, 16]


def test_search_rechecks_an_unsure_point_and_decides():
    calls = []

    async def measure(load, again):
        calls.append((load, again))
        rng = random.Random(int(load))
        return {"ttft": [0.1] * 98 + [0.3, 0.3], "tpot": [rng.random() * 0.01 for _ in range(100)]}, len(calls) - 1

    ans = asyncio.run(search.find_max(measure, {"ttft": 0.2}, 4, 4, True, 4))
    assert calls == [(4, False), (4, True)]
    assert ans.points[0].unsure and ans.best is None  # the point estimate (0.298 s) misses 0.2 s


def test_search_concurrency_integers_and_highest_given():
    async def measure(load, again):
        return {"tpot": [0.02 * load] * 400}, 0

    ans = asyncio.run(search.find_max(measure, {"tpot": 0.1}, 1, 64, True, 12))
    assert ans.best == 5 and ans.binding == ["tpot"]
    ans = asyncio.run(search.find_max(measure, {"tpot": 10.0}, 1, 8, True, 12))
    assert ans.best == 8 and ans.binding == [] and "no SLO binds" in ans.reason


def test_arrivals_poisson_and_gamma():
    n = 20000
    for shape in (1.0, 0.25):
        t = arrivals(10.0, shape, n, seed=1)
        gaps = [b - a for a, b in zip([0.0] + t, t)]
        m = sum(gaps) / n
        var = sum((g - m) ** 2 for g in gaps) / n
        assert m == pytest.approx(0.1, rel=0.05)
        assert var / m ** 2 == pytest.approx(1 / shape, rel=0.15)  # gamma: CV^2 = 1 / shape
    assert arrivals(math.inf, 1.0, 3, 0) == [0.0, 0.0, 0.0]


def test_lengths():
    rng = random.Random(0)
    assert Lengths.parse("64", "--x").sample(rng, 3) == [64, 64, 64]
    u = Lengths.parse("uniform:10:20", "--x").sample(rng, 500)
    assert min(u) >= 10 and max(u) <= 20
    ln = Lengths.parse("lognormal:100:0.5", "--x").sample(rng, 4000)
    assert sorted(ln)[2000] == pytest.approx(100, rel=0.1)  # the median of a log-normal is its scale
    nm = Lengths.parse("normal:50:5", "--x").sample(rng, 4000)
    assert sum(nm) / len(nm) == pytest.approx(50, rel=0.02)
    for bad in ("0", "uniform:5:2", "gauss:1:2", "normal:x:1", "lognormal:10:-1"):
        with pytest.raises(UsageError, match="--x"):
            Lengths.parse(bad, "--x")


def test_slo_presets_and_pairs():
    s = SLO.parse("mlperf-llama2-70b")
    assert (s.ttft_s, s.tpot_s) == (2.0, 0.2)
    assert SLO.parse("mlperf-llama2-70b", tpot=0.1).tpot_s == 0.1
    assert SLO.parse("ttft=0.5").bounds() == {"ttft": 0.5}
    for bad in ("ttft=abc", "latency=1", "ttft=-1", "nonsense"):
        with pytest.raises(UsageError, match="SLO|--slo"):
            SLO.parse(bad)


def test_slo_presets_match_loadgen_mlperf_conf():
    """MLPerf's bounds as built into the installed LoadGen (its mlperf.conf is compiled in)."""
    import mlperf_loadgen

    blob = Path(mlperf_loadgen.__file__).read_bytes()
    conf = dict(re.findall(rb"^([\w.-]+\.Server\.t[tp][fo]t_latency) = (\d+)", blob, re.M))
    if not conf:
        pytest.skip("this LoadGen build has no token latency bounds in its mlperf.conf")
    keys = {"mlperf-llama2-70b": "llama2-70b", "mlperf-llama2-70b-interactive": "llama2-70b-interactive",
            "mlperf-llama3.1-8b": "llama3_1-8b", "mlperf-llama3.1-8b-interactive": "llama3_1-8b-interactive",
            "mlperf-llama3.1-405b": "llama3_1-405b", "mlperf-mixtral-8x7b": "mixtral-8x7b"}
    for name, (ttft, tpot, source) in SLO_PRESETS.items():
        k = keys[name].encode()
        assert int(conf[k + b".Server.ttft_latency"]) == round(ttft * 1000), name
        assert int(conf[k + b".Server.tpot_latency"]) == round(tpot * 1000), name
        assert keys[name] in source


def test_config_validation():
    ok = ServeConfig(url="http://127.0.0.1:8000/v1", model="m")
    assert ok.base_url == "http://127.0.0.1:8000" and ok.concurrencies == (1,) and ok.mode == "concurrency"
    assert ServeConfig(url="http://h:1", model="m", rates="inf,2").rates == (2.0, math.inf)
    bad = [dict(url="ftp://x", model="m"), dict(url="http://h:1", model=""), dict(url="http://h:1", model="m", api="x"),
           dict(url="http://h:1", model="m", rates="1", concurrencies="2,4"),  # one cap in flight at every rate
           dict(url="http://h:1", model="m", rates="0"), dict(url="http://h:1", model="m", concurrencies="a"),
           dict(url="http://h:1", model="m", find_max=True), dict(url="http://h:1", model="m", requests=0),
           dict(url="http://h:1", model="m", timeout=0), dict(url="http://h:1", model="m", burstiness=-1)]
    for kw in bad:
        with pytest.raises(UsageError):
            ServeConfig(**kw)
    d = ServeConfig(url="http://h:1", model="m", slo="mlperf-llama2-70b").to_dict()
    assert d["slo_ttft"] == 2.0 and d["family"] == "llm-serving" and "mlperf.conf" in d["slo_source"]


class _TenJoulesPerRead:
    """A fake energy counter: every read finds 10 J more than the last."""

    source, poll_s, name, domain = "fake", None, "package-0", "package"

    def __init__(self):
        self.j = 0.0

    def total_j(self):
        self.j += 10.0
        return self.j

    def close(self):
        pass


def test_energy_and_cost_per_million_output_tokens(db_path, monkeypatch):
    """Each point's J per output token from the server's counters, and $ per 10^6 output tokens at a price."""
    from dlscale import api
    from dlscale.harness.energy_meter import EnergyMeter
    from dlscale.monitor.energy_counters import DeviceCounters
    from dlscale.serve import serving_run
    from dlscale.serve.instant import InstantServer

    monkeypatch.setattr(serving_run, "energy_meter", lambda cfg: EnergyMeter(found=DeviceCounters([_TenJoulesPerRead()])))
    with InstantServer(model="m") as srv:
        rec = api.serve_bench(srv.url, "m", requests=5, warmup=0, calibrate=False, output_len="4", prompt_len="4",
                              price=3.6, server_devices=2)
    m = rec.metrics
    assert m["output_tokens"] == 20
    assert m["energy_j"] == pytest.approx(10.0)  # one read at each edge of the point
    assert m["energy_per_unit_j"] == pytest.approx(10.0 / 20)
    assert m["kwh_per_million_output_tokens"] == pytest.approx(0.5 * 1e6 / 3.6e6)
    assert rec.units["energy_per_unit_j"] == "J/tokens"
    # 3.6 $/h per device x 2 devices = 0.002 $/s; / output tokens/s, x 10^6
    assert m["cost_per_million_units"] == pytest.approx(0.002 * 1e6 / m["output_throughput"])


def test_goodput_slices():
    # ten requests 0.1 s apart, each taking 0.05 s; the odd ones miss a 0.02 s TTFT bound
    rs = [_r(i, 0.1 * i, [0.1 * i + (0.03 if i % 2 else 0.01)], 0.1 * i + 0.05, 1, 1) for i in range(10)]
    assert figs.goodput_slices(rs, {"ttft": 0.02}) == pytest.approx([1 / 0.15] * 5)
    assert figs.goodput_slices(rs, {}) == [] and figs.goodput_slices(rs[:9], {"ttft": 1}) == []


# -- tokens/s per user, in flight, too few requests, two speeds, the load's own options ----------------------

def test_tokens_per_s_per_user_is_the_median_of_per_request_1_over_tpot():
    """docs/METRICS.md, "Tokens/s per user": AIPerf's per-request 1/TPOT at its p50, and vLLM's server output per
    user. Request 0's two tokens arrive 10 ms apart (a burst): its 100 tok/s would rule a mean (39.3)."""
    rs = [_r(0, 0.0, [0.5, 0.51], 0.52, 2, 1), _r(1, 0.1, [0.3, 0.4, 0.5], 0.5, 3, 1),
          _r(2, 0.2, [0.4, 0.525, 0.65, 0.775, 0.9], 1.0, 5, 1)]
    f = figs.point_figures(rs)  # TPOT 0.01, 0.1, 0.125: per user 100, 10, 8
    assert f["tokens_per_s_per_user"] == pytest.approx(10.0)
    assert f["output_throughput"] == pytest.approx(10 / 1.0)
    assert f["in_flight_max"] == 3  # at t = 0.2 all three are in flight
    assert f["in_flight_mean"] == pytest.approx((0.52 + 0.4 + 0.8) / 1.0)
    assert f["output_throughput_per_user"] == pytest.approx(10 / 1.72)  # an uncapped rate: the mean in flight
    assert figs.point_figures(rs, users=2)["output_throughput_per_user"] == pytest.approx(5.0)  # concurrency 2


def test_the_requests_each_percentile_needs():
    from scipy.stats import binom

    for q, n in ((0.5, 6), (0.9, 36), (0.99, 368)):
        assert search.needed(q) == n
        for m, inside in ((n, True), (n - 1, False)):  # both ranks of p99_interval's interval within 1..m, or not
            lo, hi = int(binom.ppf(0.025, m, q)), int(binom.ppf(0.975, m, q)) + 1
            assert (lo >= 1 and hi <= m) == inside, (q, m, lo, hi)


def test_a_point_with_too_few_requests_is_marked_with_what_each_percentile_needs():
    from dlscale.serve.config import ServeConfig
    from dlscale.serve.load import Point
    from dlscale.serve.outcome import point_warnings

    one = [_r(0, 0.0, [0.2, 0.3], 0.4, 2, 1)]  # the case: a p99 and 2.5 requests/s of one request
    f = figs.point_figures(one)
    assert f["too_few_for"] == ["median", "p90", "p99"] and f["ttft_p99_s"] == pytest.approx(0.2)
    assert figs.point_figures(one * 6)["too_few_for"] == ["p90", "p99"]
    assert figs.point_figures(one * 368)["too_few_for"] == []
    cfg = ServeConfig(url="http://h:1", model="m", rates="1")
    (w,) = point_warnings(cfg, {}, [Point("rate", 1.0, one)], [f])
    assert w == ("too few requests for their percentiles at load point(s) 1 (1 completed: median, p90, p99): a median "
                 "needs 6, a p90 36, a p99 368 for a 95% interval inside the sample (more --requests)")


def _speeds(tpots, start=0.0):
    """One request per TPOT, sent one after another, 3 tokens each."""
    out, t = [], start
    for i, tp in enumerate(tpots):
        out.append(_r(i, t, [t + 0.1, t + 0.1 + tp, t + 0.1 + 2 * tp], t + 0.1 + 2 * tp, 3, 1))
        t += 0.1 + 2 * tp
    return out


def test_a_two_speed_point_is_its_first_part_apart_from_the_rest():
    jitter = [1 + 0.02 * ((i * 7) % 5 - 2) for i in range(50)]  # a fixed +-4% spread
    slow_start = [(0.05 if i < 10 else 0.01) * j for i, j in enumerate(jitter)]
    f = figs.two_speed(_speeds(slow_start))
    assert f["two_speed"] is True and f["two_speed_first"] == 10 and f["two_speed_ratio"] == pytest.approx(5.0, rel=0.1)
    assert f["two_speed_p"] < 1e-5
    assert figs.two_speed(_speeds([0.01 * j for j in jitter]))["two_speed"] is False
    small = [0.01 * (1.1 if i < 10 else 1.0) * j for i, j in enumerate(jitter)]  # apart, but by less than 1.2x
    assert figs.two_speed(_speeds(small))["two_speed"] is False
    assert figs.two_speed(_speeds(slow_start[:9]))["two_speed"] is None  # 9 requests: too few to split
    assert figs.settled(_speeds([0.05] * 8), _speeds([0.01] * 8)) is False
    assert figs.settled(_speeds([0.011] * 8), _speeds([0.01] * 8)) is True


def test_rates_with_one_concurrency_are_a_cap_in_flight_and_concurrencies_stop_at_requests(monkeypatch):
    c = ServeConfig(url="http://h:1", model="m", rates="2,4", concurrencies="8", requests=100)
    assert (c.mode, c.rates, c.cap) == ("rate", (2.0, 4.0), 8) and c.to_dict()["max_concurrency"] == 8
    big = ServeConfig(url="http://h:1", model="m", concurrencies="10,100000000", requests=100)
    assert big.concurrencies == (10, 100) and big.concurrency_asked == (10, 100000000)
    assert big.to_dict()["concurrency_asked"] == [10, 100000000] and big.to_dict()["max_concurrency"] is None
    assert ServeConfig(url="http://h:1", model="m", rates="1", concurrencies="500", requests=20).cap == 20
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(UsageError, match="--api-key-env NO_SUCH_KEY_VAR: the variable is not set"):
        ServeConfig(url="http://h:1", model="m", api_key_env="NO_SUCH_KEY_VAR")
    monkeypatch.setenv("NO_SUCH_KEY_VAR", "sk-1")
    assert ServeConfig(url="http://h:1", model="m", api_key_env="NO_SUCH_KEY_VAR").key_env == "NO_SUCH_KEY_VAR"
    assert ServeConfig(url="http://h:1", model="m").key_env == "OPENAI_API_KEY"  # where set; none needed
    with pytest.raises(UsageError, match="--warmup-duration"):
        ServeConfig(url="http://h:1", model="m", warmup_duration=100, duration=10)
