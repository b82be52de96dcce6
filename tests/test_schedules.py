"""LR arithmetic against hand-computed values: the seeds' piecewise syntax, warm-up, scaling, decay."""

from __future__ import annotations

import math

import pytest

from dlscale.errors import UsageError
from dlscale.tta.schedules import Schedule, build_schedule, lr_rule, parse_piecewise, scaled_lr


def test_linear_scaling_rule():
    assert scaled_lr(0.1, 256) == pytest.approx(0.1)
    assert scaled_lr(0.1, 1024) == pytest.approx(0.4)
    assert scaled_lr(0.1, 8192) == pytest.approx(3.2)  # Goyal et al.: 8k minibatch, lr 3.2
    assert scaled_lr(0.1, 8192, "none") == 0.1
    with pytest.raises(UsageError):
        scaled_lr(0.1, 256, "sqrt")


def test_seed_piecewise_schedule():
    # seed 001: 0.4 for the first 10 epochs, 0.04 until 60, then 0.004 until 90
    pw = parse_piecewise("0.4;10;0.04;60;0.004")
    assert pw.values == (0.4, 0.04, 0.004) and pw.boundaries == (10, 60)
    s = build_schedule("0.4;10;0.04;60;0.004", base_lr=99, global_batch=256, scaling="none", total_epochs=90)
    spe = 100  # steps per epoch
    expected = {0: 0.4, 999: 0.4, 1000: 0.04, 5999: 0.04, 6000: 0.004, 8999: 0.004}
    for step, lr in expected.items():
        assert s.lr(step, spe) == pytest.approx(lr), step


def test_piecewise_scaled_and_warmed_up():
    # global batch 1024 under the linear rule multiplies every value by 4; 5 warm-up epochs of 100 steps
    s = build_schedule("0.4;10;0.04", base_lr=0.1, global_batch=1024, scaling="linear", total_epochs=20, warmup_epochs=5)
    assert s.lr(0, 100) == pytest.approx(1.6 * 1 / 500)
    assert s.lr(249, 100) == pytest.approx(1.6 * 250 / 500)
    assert s.lr(499, 100) == pytest.approx(1.6)
    assert s.lr(500, 100) == pytest.approx(1.6)
    assert s.lr(1000, 100) == pytest.approx(0.16)


def test_warmup_then_constant():
    s = Schedule("constant", peak=1.0, total_epochs=10, warmup_epochs=2)
    assert [s.lr(i, 10) for i in (0, 9, 19, 20, 99)] == pytest.approx([0.05, 0.5, 1.0, 1.0, 1.0])


def test_cosine_decay():
    s = Schedule("cosine", peak=1.0, total_epochs=10)
    assert s.lr(0, 1) == pytest.approx(1.0)
    assert s.lr(5, 1) == pytest.approx(0.5)  # (1 + cos(pi/2)) / 2
    assert s.lr(10, 1) == pytest.approx(0.0)
    s = Schedule("cosine", peak=1.0, total_epochs=6, warmup_epochs=2, end_lr=0.1)
    assert s.lr(3, 1) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2)


def test_polynomial_decay_mlperf_lars():
    # peak 2, end 1e-4, power 2, 2 warm-up epochs of 10: epochs 2..10 decay
    s = Schedule("poly", peak=2.0, total_epochs=10, warmup_epochs=2, end_lr=0.0001, power=2)
    assert s.lr(19, 10) == pytest.approx(2.0)  # the last warm-up step reaches the peak
    assert s.lr(20, 10) == pytest.approx(2.0)
    assert s.lr(60, 10) == pytest.approx(0.0001 + (2 - 0.0001) * 0.5**2)  # 0.500075
    assert s.lr(100, 10) == pytest.approx(0.0001)


def test_named_schedule_peaks_at_scaled_base():
    s = build_schedule("poly", base_lr=2.0, global_batch=64, scaling="linear", total_epochs=5)
    assert s.peak == pytest.approx(0.5)


@pytest.mark.parametrize("spec", ["0.4;10", "0.4;x;0.04", "0.4;60;0.04;10;0.004", "-1", "0.4;;0.04", "step"])
def test_bad_specs_are_usage_errors(spec):
    with pytest.raises(UsageError):
        build_schedule(spec, base_lr=0.1, global_batch=256, scaling="linear", total_epochs=90)


def test_bad_schedule_values():
    with pytest.raises(UsageError, match="warmup"):
        Schedule("cosine", peak=1.0, total_epochs=5, warmup_epochs=5)
    with pytest.raises(UsageError, match="end-lr"):
        Schedule("poly", peak=1.0, total_epochs=5, end_lr=2.0)
    with pytest.raises(UsageError, match="learning rate"):
        Schedule("constant", peak=0.0, total_epochs=5)


def test_lr_rule_states_the_applied_peak():
    # --lr 0.1 on a global batch of 32 under the linear rule: 0.1 * 32 / 256 = 0.0125 (the example)
    assert lr_rule("cosine", 0.1, 32) == ("linear scaling: peak lr = --lr 0.1 x global batch 32 / 256 = 0.0125 "
                                          "(--lr-scaling none to use --lr as given)")
    assert "= 0.4 (" in lr_rule("poly", 0.1, 1024)  # 0.1 * 1024 / 256
    assert lr_rule("cosine", 0.1, 32, "none") == ("no scaling: peak lr = --lr 0.1, as given "
                                                  "(--lr-scaling linear to scale it by global batch / 256)")
    # a piecewise schedule peaks at its first value, scaled like the rest: 0.4 * 512 / 256 = 0.8
    assert lr_rule("0.4;10;0.04", 99, 512) == (
        "linear scaling: peak lr = the --lr-schedule's first value 0.4 x global batch 512 / 256 = 0.8 "
        "(--lr-scaling none to use the --lr-schedule values as given)")
    assert "first value 0.4, as given" in lr_rule("0.4;10;0.04", 99, 512, "none")
