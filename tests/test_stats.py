"""The statistics against hand-computed values."""

import math

import pytest

from dlscale import stats


def test_percentile_linear_interpolation_by_hand():
    xs = [1.0, 2.0, 3.0, 4.0]
    # h = (n-1) q/100: q=50 -> 1.5 -> 2 + 0.5*(3-2) = 2.5; q=90 -> 2.7 -> 3 + 0.7 = 3.7; q=99 -> 2.97 -> 3.97
    assert stats.percentile(xs, 50) == pytest.approx(2.5)
    assert stats.percentile(xs, 90) == pytest.approx(3.7)
    assert stats.percentile(xs, 99) == pytest.approx(3.97)
    assert stats.percentile(xs, 0) == 1.0 and stats.percentile(xs, 100) == 4.0
    assert stats.percentile([5.0], 99) == 5.0
    assert stats.percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)  # order does not matter


def test_percentile_matches_numpy_default():
    np = pytest.importorskip("numpy")
    xs = [0.3, 0.1, 0.7, 0.25, 0.9, 0.4, 0.55]
    for q in (10, 50, 90, 99):
        assert stats.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_mean_stdev_cv_by_hand():
    xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]
    assert stats.mean(xs) == 5.0
    # sum of squared deviations = 32, n-1 = 7
    assert stats.stdev(xs) == pytest.approx(math.sqrt(32 / 7))
    assert stats.cv(xs) == pytest.approx(math.sqrt(32 / 7) / 5)
    assert stats.stdev([3.0]) == 0.0


def test_t_critical_values():
    assert stats.t_critical_975(1) == pytest.approx(12.706, abs=1e-3)
    assert stats.t_critical_975(9) == pytest.approx(2.262, abs=1e-3)
    assert stats.t_critical_975(30) == pytest.approx(2.042, abs=1e-3)
    # beyond the table: published t(0.975, 60) = 2.0003, t(0.975, 99) = 1.9842, t(0.975, 120) = 1.9799
    assert stats.t_critical_975(60) == pytest.approx(2.0003, abs=2e-4)
    assert stats.t_critical_975(99) == pytest.approx(1.9842, abs=2e-4)
    assert stats.t_critical_975(120) == pytest.approx(1.9799, abs=2e-4)
    assert stats.t_critical_975(10**6) == pytest.approx(1.95996, abs=1e-4)
    with pytest.raises(ValueError):
        stats.t_critical_975(0)


def test_mean_ci95_by_hand():
    xs = [10.0, 12.0, 14.0]  # mean 12, s = 2, n = 3, t(0.975, 2) = 4.3027
    lo, hi = stats.mean_ci95(xs)
    half = 4.3027 * 2 / math.sqrt(3)
    assert lo == pytest.approx(12 - half) and hi == pytest.approx(12 + half)


def test_no_interval_from_one_sample():
    # one value has no spread to estimate: no interval at all, not a zero-width one
    assert stats.mean_ci95([0.25]) is None
    assert stats.throughput_ci95_from_steps(32, [0.1]) is None
    assert stats.throughput_ci95_from_repeats([320.0]) is None


def test_ci_edge_of_the_t_table_at_two_samples():
    # n = 2 -> df = 1, t(0.975, 1) = 12.7062 (the first table entry): xs 1, 3 -> mean 2, s = sqrt(2),
    # h = 12.7062 * sqrt(2) / sqrt(2) = 12.7062
    assert stats.t_critical_975(1) == pytest.approx(12.7062, abs=1e-4)
    lo, hi = stats.mean_ci95([1.0, 3.0])
    assert lo == pytest.approx(2 - 12.7062) and hi == pytest.approx(2 + 12.7062)
    # steps 0.1, 0.3 s of batch 10: mean 0.2, h = 12.7062 * 0.1 = 1.27 > mean -> [10 / 1.4706, inf)
    lo, hi = stats.throughput_ci95_from_steps(10, [0.1, 0.3])
    assert lo == pytest.approx(10 / (0.2 + 1.27062)) and hi == math.inf


def test_throughput_and_its_ci_from_steps():
    # 4 steps of batch 32: 0.1, 0.1, 0.1, 0.1 s -> 32*4/0.4 = 320 samples/s, zero-width interval
    assert stats.throughput(32, [0.1] * 4) == pytest.approx(320)
    lo, hi = stats.throughput_ci95_from_steps(32, [0.1] * 4)
    assert lo == pytest.approx(320) and hi == pytest.approx(320)
    # steps 0.1, 0.2, 0.3: mean 0.2, s 0.1, h = 4.3027*0.1/sqrt(3) = 0.24842
    lo, hi = stats.throughput_ci95_from_steps(10, [0.1, 0.2, 0.3])
    h = 4.3027 * 0.1 / math.sqrt(3)
    assert lo == pytest.approx(10 / (0.2 + h))
    assert hi == math.inf  # mean - h < 0: the upper bound is unbounded, not negative
    assert stats.throughput(10, [0.1, 0.2, 0.3]) == pytest.approx(50.0)


def test_empty_inputs_raise():
    with pytest.raises(ValueError):
        stats.mean([])
    with pytest.raises(ValueError):
        stats.percentile([], 50)
    with pytest.raises(ValueError):
        stats.throughput(1, [0.0])
