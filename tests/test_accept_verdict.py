"""The acceptance verdict engine on hand-built records (no processes): rules, noise, peers, baselines,
datasheet expectations, explanations, energy and cost. Records are shaped like an 8-GPU H100 server
(tests/accept_records.py); every expected number is computed by hand in the comment beside it."""

from __future__ import annotations

import math

import pytest

import accept_records as ar
from dlscale.accept import datasheet, explain, figures, run, signif, spec
from dlscale.accept.expect import Baseline
from dlscale.accept.verdict import FAIL, NO_EXPECTATION, PASS, WARN, Expectation, Figure, Thresholds, compare


def judge(recs, base=None, refs=(), sp=None):
    return run.judge(recs, sp or spec.builtin(False), base, refs)


def bad(verdicts):
    return [v for v in verdicts if v.status in (FAIL, WARN)]


# -- the rules ---------------------------------------------------------------------------------------------
def fig(value, samples=(), cells=None):
    return Figure("gemm", "bf16 best rate", value, "TFLOP/s", "r1", samples=list(samples), cells=cells or {})


@pytest.mark.parametrize("value, status", [(96.0, PASS), (94.0, WARN), (85.0, FAIL)])
def test_thresholds_on_a_significant_shortfall(value, status):
    # samples 1% apart: any shortfall of a few % is significant; 4% < warn 5% -> PASS, 6% -> WARN, 15% -> FAIL
    v = compare(fig(value, ar.spread(value, 20)), Expectation("datasheet", 100.0, "sheet"), Thresholds())
    assert v.status == status
    assert v.ratio == pytest.approx(value / 100)
    assert (v.warn, v.fail) == (0.05, 0.10)


def test_a_fail_is_never_declared_inside_the_noise():
    # 15% below, but the samples spread +-40%: not significant at alpha 0.01 -> WARN, saying why
    noisy = compare(fig(85.0, ar.spread(85.0, 6, jitter=0.4)), Expectation("datasheet", 100.0, "sheet"), Thresholds())
    assert noisy.status == WARN and "inside the noise" in noisy.reason and noisy.test["p"] >= 0.01
    # no samples at all: the noise is unknown, so at most WARN
    blind = compare(fig(50.0), Expectation("datasheet", 100.0, "sheet"), Thresholds())
    assert blind.status == WARN and "no samples" in blind.reason and blind.test is None


def test_no_expectation_when_nothing_compares():
    vs = judge([ar.train()])
    assert [v.status for v in vs] == [NO_EXPECTATION]
    assert "baseline for next time" in vs[0].reason


def test_one_sample_test_against_a_value_matches_a_hand_computation():
    # log samples of 90 x (1 +- 1%) against log(100): t = (mean - log 100) / (s / sqrt n), one-sided
    xs = ar.spread(90.0, 10)
    t = signif.vs_value(xs, 100.0)
    logs = [math.log(x) for x in xs]
    m = sum(logs) / len(logs)
    s = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
    tstat = (m - math.log(100.0)) / (s / math.sqrt(len(logs)))
    from scipy.stats import t as student

    assert t.p == pytest.approx(student.cdf(tstat, len(logs) - 1))
    assert t.ratio_ci[0] < 0.9 < t.ratio_ci[1]


# -- peers: the 8-GPU server with one slow GPU and one weak link -------------------------------------------
def test_the_slow_gpu_is_named_against_its_peers_and_explained():
    vs = judge([ar.health(thermal=3), ar.memory(), ar.gemm(slow_gpu=3, slow=0.12), ar.p2p(weak_pair=(5, 6)),
                ar.alone(slow_gpu=3, slow=0.11), ar.train()])
    failing = {(v.check, v.subject, v.expectation) for v in vs if v.status == FAIL}
    assert ("train_alone", "GPU 3", "peers") in failing  # 1 - 0.89 = 11% below the median of 7 peers
    assert ("gemm", "GPU 3", "peers") in failing  # 12% below
    assert ("health", "GPU 3", None) in failing
    assert ("p2p", "GPU 5->6", "peers") in failing  # half its peers' rate
    assert not [v for v in vs if v.status == FAIL and v.subject not in ("GPU 3", "GPU 5->6")]
    train3 = next(v for v in vs if v.check == "train_alone" and v.subject == "GPU 3")
    assert train3.ratio == pytest.approx(0.89, rel=1e-3)
    assert train3.related == ["health: GPU 3 reports hw_thermal_slowdown",
                              "GEMM bf16 best rate on GPU 3 is 12% below its peers"]
    healthy = [v for v in vs if v.check == "train_alone" and v.subject == "GPU 0"]
    assert healthy[0].status == PASS and healthy[0].ratio == pytest.approx(1.0)  # the median of 7 peers: 6 healthy


def test_peers_are_the_same_device_model_only():
    r = ar.alone(n=4)
    r.raw["rank_devices"][2]["device_name"] = "NVIDIA H100 PCIe"  # a different board: no peer of the others
    vs = judge([r])
    assert [v.subject for v in vs if v.subject == "GPU 2"] == ["GPU 2"]
    assert next(v for v in vs if v.subject == "GPU 2").status == NO_EXPECTATION
    assert "3 peer(s)" not in next(v for v in vs if v.subject == "GPU 0").source  # 2 peers of its model
    assert "2 peer(s)" in next(v for v in vs if v.subject == "GPU 0").source


def test_the_weak_link_names_its_node():
    vs = judge([ar.links(slow_node=2, nodes=3)])
    slow = [v for v in vs if v.status == FAIL]
    assert sorted(v.subject for v in slow) == ["link 0-2", "link 1-2"]  # 0.1 x busbw against a peer median of 0.55
    assert slow[0].related[0] == "node 2's link: link 0-2, link 1-2 are below expectation, the other links are not"
    assert next(v for v in vs if v.subject == "link 0-1").status == PASS


def test_the_slow_emulated_node_is_named():
    vs = judge([ar.alone(slow_gpu=1, slow=0.5, n=2, nodes=2, devices=["cpu", "cpu"])])
    assert [(v.subject, v.status) for v in vs] == [("node 0 rank 0", PASS), ("node 1 rank 1", FAIL)]


# -- datasheet expectations ----------------------------------------------------------------------------------
def test_datasheet_expectations_of_an_h100_sxm_server():
    vs = judge([ar.memory(), ar.gemm()])
    by = {(v.figure, v.expectation): v for v in vs if v.subject == "GPU 0"}
    assert by[("bf16 best rate", "datasheet")].expected == pytest.approx(0.6 * 989.5)  # dense bf16 = 1979 / 2
    assert by[("d2d", "datasheet")].expected == pytest.approx(0.8 * 3350)  # HBM3 3.35 TB/s
    gen5 = 32 * 16 / 8 * 128 / 130  # 63.015 GB/s per direction
    assert by[("h2d_pinned", "datasheet")].expected == pytest.approx(0.8 * gen5)
    assert all(v.status == PASS for v in vs)
    assert "NVIDIA H100 Tensor Core GPU datasheet" in by[("d2d", "datasheet")].source


def test_no_datasheet_figure_where_no_table_has_one():
    assert datasheet.memory_gbps("NVIDIA GeForce RTX 4090") is None
    assert datasheet.pcie_gbps(3, 16) == pytest.approx(8 * 16 / 8 * 128 / 130)  # 15.75 GB/s
    assert datasheet.pcie_gbps(2, 16) == pytest.approx(5 * 16 / 8 * 0.8)  # 8b/10b: 8 GB/s
    cpu = ar.gemm()
    cpu.system = {"hostname": "x"}
    for row in cpu.raw["rows"]:
        row["device"] = "cpu"
    assert all(v.expectation != "datasheet" for v in judge([cpu]))


def test_every_fraction_names_its_source():
    for name, f in datasheet.FRACTIONS.items():
        assert 0 < f.value < 1 and len(f.source) > 40, name


# -- baselines and regressions --------------------------------------------------------------------------------
def baseline_of(recs):
    b = Baseline()
    b.add(figures.figures(recs), "acceptance accept-old (2026-11-01)")
    return b


def test_a_regression_against_the_baseline_is_flagged_with_its_size_and_significance():
    old, new = ar.train(step=0.100), ar.train(step=0.115)  # 1 - 0.100/0.115 = 13.0% lower throughput
    v = judge([new], baseline_of([old]))[0]
    assert v.status == FAIL and v.expectation == "baseline"
    assert v.ratio == pytest.approx(0.100 / 0.115, rel=1e-3)
    assert v.test["p"] < 1e-6 and "Welch" in v.test["method"]
    assert v.test["ratio_ci95"][0] < v.ratio < v.test["ratio_ci95"][1]
    assert "acceptance accept-old" in v.source


def test_a_shortfall_inside_the_noise_of_the_baseline_is_no_fail():
    old = ar.train(step=0.100, jitter=0.6, steps=8)
    new = ar.train(step=0.115, jitter=0.6, steps=8)
    v = judge([new], baseline_of([old]))[0]
    assert v.status == WARN and "inside the noise" in v.reason


def test_collectives_pair_their_sizes_with_the_baseline():
    def coll(scale):
        rows = [{"op": "all_reduce", "size": s, "in-place": {"busbw": scale * b}} for s, b in
                ((2**20, 5.0), (2**21, 7.0), (2**22, 9.0), (2**23, 10.0), (2**24, 10.5), (2**25, 10.0))]
        return ar.rec("micro", "collectives", {"world_size": 8, "nodes": 1}, {}, {"rows": rows})

    vs = judge([coll(0.8)], baseline_of([coll(1.0)]))
    v = next(v for v in vs if v.expectation == "baseline")
    # the large sizes (within 1/8 of 32 MiB: 4..32 MiB) against the same cells, 20% lower each
    assert v.ratio == pytest.approx(0.8)
    assert v.status == WARN and v.test is None  # every ratio is exactly 0.8: no spread, so no test, so no FAIL
    b = coll(1.0)
    b.raw["rows"][3]["in-place"]["busbw"] = 10.4  # a little spread: now the paired test is significant
    v = next(v for v in judge([coll(0.8)], baseline_of([b])) if v.expectation == "baseline")
    assert v.status == FAIL and v.test["p"] < 0.01 and "paired t-test on log ratios (4 cells)" in v.test["method"]


def test_reference_figures_match_model_devices_and_batch():
    from dlscale.importers.records import reference_records

    refs = reference_records("seed001-scaling")  # ResNet-50, batch 128 per GPU: 1x1 283 images/s (P100), ...
    mine = ar.alone(n=2, batch=128, step=128 / 290.0, devices=["cuda:0", "cuda:1"])
    vs = judge([mine], refs=refs)
    ref = [v for v in vs if v.expectation == "reference"]
    assert ref and all(v.expected == pytest.approx((283 + 626) / 2) for v in ref)  # the two 1x1 rows' mean


# -- outcome, energy, explanations -------------------------------------------------------------------------------
def test_outcome_and_exit_code():
    from dlscale.accept.run import Acceptance

    vs = judge([ar.alone(slow_gpu=1, slow=0.07, n=4)])  # 7% below: WARN only
    acc = Acceptance("a", ar.rec("accept", "quick", {}), [], vs, [])
    assert acc.outcome == WARN and acc.exit_code == 0
    acc.warn_fails = True
    assert acc.exit_code == 1


def test_energy_and_cost_ride_beside_end_to_end_checks():
    from dlscale.accept.report import energy_text

    v = judge([ar.train(energy=True)])[0]
    assert v.energy["energy_per_unit_j"] == {"value": 0.5, "unit": "J/image"}
    assert energy_text(v.energy) == "0.5 J/image, 5,600.0 W, $2.73 per 10^6 images"
    assert judge([ar.train()])[0].energy == {}  # absent where the record has no counter: never 0


def test_failed_runs_and_health_are_verdicts():
    dead = ar.train()
    dead.fail("RuntimeError: rank 3 was killed")
    vs = judge([dead, ar.health()])
    assert [(v.check, v.status) for v in vs if v.check == "health"] == [("health", PASS)] * 8
    assert [(v.check, v.status, v.reason) for v in vs if v.check == "train"] == [
        ("train", FAIL, "the run failed: RuntimeError: rank 3 was killed")]


def test_a_system_verdict_lists_its_parts():
    old = ar.train(step=0.100)
    vs = judge([ar.train(step=0.13), ar.alone(slow_gpu=3)], baseline_of([old]))
    v = next(v for v in vs if v.check == "train" and v.status == FAIL)
    assert v.related == ["training alone throughput on GPU 3 is 11% below its peers"]
    assert explain.phrase(v) == "training on all devices throughput is 23% below the baseline"


def test_on_two_hosts_every_per_node_verdict_names_its_host_and_the_slow_gpu_is_explained():
    # a Slurm acceptance of two 8-GPU nodes: health and GEMM on each, the short test on all 16 GPUs alone;
    # gpu-b's GPU 3 is hot, 12% slow in GEMM and 11% slow in training (rank 11 = node 1, local rank 3)
    def on(host, r):
        r.system = ar.system(host=host)
        return r

    alone = ar.alone(n=16, nodes=2, slow_gpu=11)
    for ident in alone.raw["rank_devices"]:
        ident["host"] = ("gpu-a", "gpu-b")[ident["node"]]
    vs = judge([on("gpu-a", ar.health()), on("gpu-a", ar.gemm()), on("gpu-b", ar.health(thermal=3)),
                on("gpu-b", ar.gemm(slow_gpu=3, slow=0.12)), alone])
    assert {(v.check, v.subject) for v in vs if v.status == FAIL} == {
        ("health", "gpu-b GPU 3"), ("gemm", "gpu-b GPU 3"), ("train_alone", "gpu-b GPU 3")}
    assert len({v.subject for v in vs if v.check == "gemm"}) == 16  # gpu-a's GPU 3 is not gpu-b's
    assert next(v for v in vs if v.check == "gemm" and v.subject == "gpu-a GPU 3").status == PASS
    train = next(v for v in vs if v.check == "train_alone" and v.subject == "gpu-b GPU 3")
    assert train.related == ["health: gpu-b GPU 3 reports hw_thermal_slowdown",
                             "GEMM bf16 best rate on gpu-b GPU 3 is 12% below its peers"]
    assert {v.key for v in vs if v.check == "gemm" and v.subject.endswith("GPU 3")} == {
        "gemm|bf16 best rate|gpu-a cuda:3", "gemm|bf16 best rate|gpu-b cuda:3"}  # each node's own baseline
