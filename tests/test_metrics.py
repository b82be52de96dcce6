"""summarize_steps and MFU against hand-computed values."""

import math

import pytest

from dlscale.harness.metrics import CV_WARN, mfu, summarize_steps


def test_one_repeat_by_hand():
    times = [0.10, 0.11, 0.09, 0.10]  # sum 0.40
    m, warnings = summarize_steps(16, [times])
    assert m["throughput"] == pytest.approx(16 * 4 / 0.40)
    assert m["throughput_ci_method"] == "steps"
    assert m["step_time_p50"] == pytest.approx(0.10)
    assert m["step_time_p99"] == pytest.approx(0.1097)  # h = 2.97 -> 0.10 + 0.97 * 0.01
    sd = math.sqrt((0 + 0.01**2 + 0.01**2 + 0) / 3)
    assert m["cv"] == pytest.approx(sd / 0.10)
    assert m["cv"] > CV_WARN and not m["stable"] and len(warnings) == 1 and "2%" in warnings[0]
    assert m["measured_steps"] == 4 and m["window_seconds"] == pytest.approx(0.40)
    lo, hi = m["throughput_ci95"]
    assert lo < m["throughput"] < hi


def test_repeats_use_the_interval_over_repeat_throughputs():
    # repeat throughputs: 8/0.4 = 20, 8/0.5 = 16, 8/0.3 = 26.667 (batch 2, 4 steps each, constant steps)
    reps = [[0.1] * 4, [0.125] * 4, [0.075] * 4]
    m, warnings = summarize_steps(2, reps)
    xs = [20.0, 16.0, 8 / 0.3]
    mean = sum(xs) / 3
    s = math.sqrt(sum((x - mean) ** 2 for x in xs) / 2)
    half = 4.3027 * s / math.sqrt(3)
    assert m["throughput"] == pytest.approx(mean)
    assert m["throughput_ci95"] == pytest.approx([mean - half, mean + half])
    assert m["throughput_ci_method"] == "repeats"
    assert m["cv"] == 0.0 and m["stable"] and warnings == []
    assert m["cv_repeats"] == pytest.approx(s / mean)


def test_one_step_has_no_interval_and_says_why():
    m, warnings = summarize_steps(8, [[0.2]])
    assert m["throughput"] == pytest.approx(40.0)
    assert m["throughput_ci95"] is None and m["throughput_ci_method"] is None
    assert warnings == ["one measured step: no confidence interval; use --steps >= 2"]
    # two steps do have one (df = 1): 0.1, 0.3 s -> h = 12.7062 * 0.1414 / 1.4142 = 1.27062
    m, warnings = summarize_steps(8, [[0.1, 0.3]])
    assert m["throughput_ci95"][0] == pytest.approx(8 / (0.2 + 1.27062)) and m["throughput_ci95"][1] == math.inf
    assert m["throughput_ci_method"] == "steps" and not any("confidence" in w for w in warnings)


def test_one_step_per_repeat_still_has_the_interval_over_repeats():
    m, warnings = summarize_steps(2, [[0.1], [0.125]])  # 20 and 16 samples/s
    half = 12.7062 * math.sqrt(8) / math.sqrt(2)
    assert m["throughput_ci95"] == pytest.approx([18 - half, 18 + half])
    assert warnings == []


def test_mfu():
    # ResNet-50 at ~24.3 GFLOP/sample fwd+bwd, 1000 img/s = 24.3 TFLOP/s on a 125 TFLOP/s V100 (fp16) = 19.44%
    assert mfu(24.3e9 * 1000, 125e12) == pytest.approx(0.1944)
    assert mfu(1e12, None) is None
    assert mfu(None, 1e12) is None


def test_rejects_empty_repeat():
    with pytest.raises(ValueError):
        summarize_steps(1, [[]])
