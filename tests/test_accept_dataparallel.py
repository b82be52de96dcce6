"""The acceptance judges data-parallel efficiency (accept/sources/dataparallel.py) on hand-built records shaped like the
suite's (tests/accept_records.py): one GPU at the H200's 0.70 of training alone FAILs and a healthy one PASSes,
four GPUs against seed 001's published in-node figure, every node's ladder against its peers, and the verdicts
judged again from the store. Nothing is measured here; every expected number is worked out beside it."""

from __future__ import annotations

import pytest

import accept_records as ar
from dlscale import accept
from dlscale.accept.sources import dataparallel
from dlscale.accept import acceptance as run
from dlscale.accept.plan import spec
from dlscale.accept.judging.verdict import FAIL, NO_EXPECTATION, PASS

H200 = "NVIDIA H200"


def one_gpu(ddp_rate, alone_rate=4302.0, batch=128):
    """train_alone and train on one GPU at these rates (images/s): the steps 1% apart (ar.spread)."""
    alone = ar.alone(n=1, step=batch / alone_rate, batch=batch)
    ddp = ar.train(step=batch / ddp_rate, n=1, batch=batch)
    for r in (alone, ddp):
        r.config.update(device_name=H200, threads_per_rank=16)
    return alone, ddp


def dp_verdicts(verdicts):
    return [v for v in verdicts if v.figure == dataparallel.NAME]


def test_one_gpu_at_the_h200s_070_of_training_alone_fails_saying_why():
    alone, ddp = one_gpu(3012.0)
    ddp.config["threads_per_rank"] = 4  # what the record shows beside the figure
    (v,) = dp_verdicts(run.judge([alone, ddp], spec.builtin(True)))
    # 3012 / (1 x 4302) = 0.700 (to the steps' rounding): 26% short of the one-rank floor of 0.95
    assert v.measured == pytest.approx(3012 / 4302, rel=1e-3) and v.expected == 0.95
    assert v.status == FAIL and v.expectation == "rule" and v.ratio == pytest.approx(0.700 / 0.95, rel=1e-3)
    assert v.reason.startswith("26.3% below the one-rank minimum against training alone: past the minimum, "
                               "significant")
    assert "DDP's own per-step work" in v.reason and "threads per rank 4 (reference: 16)" in v.reason
    assert v.run_ids == [ddp.run_id, alone.run_id] and "DDP over one rank exchanges nothing" in v.source


@pytest.mark.parametrize("ddp_rate, status", [(4216.0, PASS), (4001.0, FAIL)])
def test_one_gpu_passes_at_098_and_fails_at_093(ddp_rate, status):
    # 4216 / 4302 = 0.980 keeps the floor of 0.95; 4001 / 4302 = 0.930 is 2.1% under it, significant over the
    # two runs' 30 + 30 steps 1% apart (Welch on the logs)
    (v,) = dp_verdicts(run.judge(list(one_gpu(ddp_rate)), spec.builtin(True)))
    assert v.status == status, v.reason
    assert v.measured == pytest.approx(ddp_rate / 4302, rel=1e-3)


def test_a_cpus_one_rank_figure_is_recorded_without_the_gpu_floor():
    """On a CPU gloo's reducer runs on the cores that compute: the same pair at 0.70 is no FAIL by the
    one-rank rule there, only a figure for the baseline (a fresh store: NO EXPECTATION)."""
    alone, ddp = one_gpu(3012.0)
    ddp.config["device"] = "cpu"
    (v,) = dp_verdicts(run.judge([alone, ddp], spec.builtin(True)))
    assert v.measured == pytest.approx(3012 / 4302, rel=1e-3)
    assert v.status == NO_EXPECTATION and v.expectation is None
    ddp.config["device"] = "cuda"
    (v,) = dp_verdicts(run.judge([alone, ddp], spec.builtin(True)))
    assert v.status == FAIL and v.expectation == "rule"


def test_four_gpus_against_seed_001_in_node_figure():
    def node(eff):
        alone = ar.alone(n=4, step=0.1)  # 1,280 images/s per H100 alone
        return [alone, ar.train(step=0.1 / eff, n=4)]  # 4 x 1280 x eff on all four

    (bad,) = dp_verdicts(run.judge(node(0.70), spec.builtin(True)))
    # no published figure of the H100: the lower of seed 001's two at 1x4, V100-SXM2's 2425 / (4 x 626) = 0.968
    assert bad.expected == pytest.approx(2425 / 2504) and bad.expectation == "reference"
    assert bad.source.startswith("seed 001, C4140-K-V100-SXM2: 2425 of the ideal 4 x 626 = 2504 images/s")
    assert "the lowest of 2" in bad.source and bad.status == FAIL  # 0.70 / 0.968: 28% short, past the 10% line
    (good,) = dp_verdicts(run.judge(node(0.975), spec.builtin(True)))
    assert good.status == PASS
    # eight GPUs: nothing published at 1x8, so no expectation of its own (its baseline next time)
    eight = dp_verdicts(run.judge([ar.alone(n=8, step=0.1), ar.train(step=0.12, n=8)], spec.builtin(True)))
    assert [v.status for v in eight] == [NO_EXPECTATION]


def test_seed_001_figure_of_the_same_gpu_wins():
    exp = dataparallel.seed_expectation("resnet50", 128, 1, 4, "Tesla P100-PCIE-16GB")
    assert round(exp.value, 3) == 0.971 and "C4130-P100-16GB-PCIe: 1099 of the ideal 4 x 283" in exp.source
    assert round(dataparallel.seed_expectation("resnet50", 128, 2, 4, "Tesla V100-SXM2-16GB").value, 3) == 0.899
    assert dataparallel.seed_expectation("resnet50", 64, 1, 4, "x") is None  # another batch: nothing published


def test_every_nodes_ladder_is_judged_against_its_peers():
    def ladder(host, eff):
        return ar.rec("scale", "resnet50", {"device": "cuda", "batch_size": 256}, {"efficiency_1x8": eff},
                      sys=ar.system(host=host))

    recs = [ladder("gpu01", 0.95), ladder("gpu02", 0.96), ladder("gpu03", 0.94), ladder("gpu04", 0.50)]
    vs = {v.subject: v for v in run.judge(recs, spec.builtin(True)) if v.figure == "efficiency 1x8"}
    assert vs["gpu01"].status == PASS and vs["gpu01"].expectation == "peers"
    low = vs["gpu04"]
    # against the median of the other three, 0.95: 47% below, over their spread (floor 0.15): FAIL
    assert low.expected == pytest.approx(0.95) and low.status == FAIL
    assert "in the same acceptance: gpu01, gpu02, gpu03" in low.source


def test_the_verdict_is_judged_again_from_the_store(db_path, tmp_path):
    acc = ar.recorded(db_path, list(one_gpu(3012.0)))
    (first,) = dp_verdicts(acc.verdicts)
    (second,) = dp_verdicts(accept.judge(acc.id, db=str(db_path)).verdicts)
    assert (first.status, second.status) == (FAIL, FAIL) and second.measured == pytest.approx(first.measured)
    # looser thresholds move the lines of comparisons, not the one-rank floor, which follows from what is measured
    loose = tmp_path / "loose.yaml"
    loose.write_text("checks:\n  train_alone: {}\n  train: {}\nthresholds: {warn: 0.4, fail: 0.5}\n")
    (third,) = dp_verdicts(accept.judge(acc.id, spec=str(loose), db=str(db_path)).verdicts)
    assert third.status == FAIL and third.expected == 0.95
