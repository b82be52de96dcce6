"""The comparison arithmetic against the seed papers' own published numbers."""

import pytest

from dlscale.analysis.formulas import (
    ideal_throughput, pct_difference, relative_score, scaling_efficiency, speedup,
)


def test_seed001_fig26_p100_efficiency():
    # 283 img/s on 1 GPU; 1099 on 4 in a node (ideal 1132) = ~97%; 2075 on 8 over 2 nodes (ideal 2264) = ~92%.
    assert ideal_throughput(283, 4) == 1132
    assert scaling_efficiency(1099, 283, 4) == pytest.approx(0.9708, abs=1e-4)
    assert round(scaling_efficiency(1099, 283, 4) * 100) == 97
    assert scaling_efficiency(2075, 283, 8) == pytest.approx(0.9165, abs=1e-4)
    assert round(scaling_efficiency(2075, 283, 8) * 100) == 92


def test_seed001_fig28_v100_efficiency():
    # 626 img/s on 1 GPU; 2425 on 4 (ideal 2504) = ~97%; 4500 on 8 (ideal 5008) = ~90%.
    assert scaling_efficiency(2425, 626, 4) == pytest.approx(2425 / 2504)
    assert round(scaling_efficiency(2425, 626, 4) * 100) == 97
    assert round(scaling_efficiency(4500, 626, 8) * 100) == 90


def test_speedup_and_pct_difference():
    assert speedup(1099, 283) == pytest.approx(3.8834, abs=1e-4)
    assert pct_difference(110, 100) == pytest.approx(0.10)
    assert pct_difference(90, 100) == pytest.approx(-0.10)
    with pytest.raises(ValueError):
        pct_difference(1, 0)


def test_relative_score_time_and_throughput():
    # MLPerf v0.5 style: reference time / system time.
    assert relative_score(50.0, 100.0, higher_is_better=False) == 2.0
    assert relative_score(200.0, 100.0) == 2.0
    with pytest.raises(ValueError):
        relative_score(0, 1)
