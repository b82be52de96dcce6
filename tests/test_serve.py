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
           dict(url="http://h:1", model="m", rates="1", concurrencies="2"),
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
    from dlscale.harness.energy import EnergyMeter
    from dlscale.monitor.energy import Found
    from dlscale.serve import run
    from dlscale.serve.instant import InstantServer

    monkeypatch.setattr(run, "energy_meter", lambda cfg: EnergyMeter(found=Found([_TenJoulesPerRead()])))
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
