"""The acceptance verdict engine on hand-built records (no processes): rules, noise, peers, baselines,
datasheet expectations, explanations, energy and cost. Records are shaped like an 8-GPU H100 server
(tests/accept_records.py); every expected number is computed by hand in the comment beside it."""

from __future__ import annotations

import math

import pytest

import accept_records as ar
from dlscale import gpus
from dlscale.accept.sources import datasheet
from dlscale.accept.judging import explain
from dlscale.accept.figures import collect as figures
from dlscale.accept import acceptance as run
from dlscale.accept.judging import significance as signif
from dlscale.accept.plan import spec
from dlscale.accept.sources.baseline import Baseline
from dlscale.accept.judging.verdict import ERROR, FAIL, NO_EXPECTATION, PASS, WARN, Expectation, Figure, Thresholds, compare


def judge(recs, base=None, refs=(), sp=None, table=None):
    return run.judge(recs, sp or spec.builtin(False), base, refs, table=table)


def bad(verdicts):
    return [v for v in verdicts if v.status in (FAIL, WARN)]


# -- the rules ---------------------------------------------------------------------------------------------
def fig(value, samples=()):
    return Figure("gemm", "bf16 best rate", value, "TFLOP/s", "r1", samples=list(samples))


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
                              "GEMM bf16 best rate on GPU 3 is 12% below its healthy figure",  # 0.88 x 788
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
    # pairs 0-1 at 0.11 GB/s, 0-2 and 1-2 at 0.011: nodes 0 and 1 show 0.11 (their pair), node 2 0.011
    vs = judge([ar.links(slow_node=2, nodes=3)])
    slow = [v for v in vs if v.status == FAIL]
    assert [v.subject for v in slow] == ["node 2's link"]  # 0.1 x the median of its 2 peers
    assert slow[0].ratio == pytest.approx(0.1, rel=0.02)
    assert slow[0].related[0] == "node 2's link is below expectation, the other nodes' links are not"
    assert [v.status for v in vs if v.subject in ("node 0's link", "node 1's link")] == [PASS, PASS]


def test_the_weak_link_of_real_nodes_names_its_host():
    # on real nodes (a Slurm job) a node's index in the job says nothing: the link is its host's
    vs = judge([ar.links(slow_node=1, nodes=3, hosts=["gpu07", "gpu08", "gpu09"])])
    slow = [v for v in vs if v.status == FAIL]
    assert [(v.subject, v.subject_key) for v in slow] == [("gpu08's link", "link gpu08")]
    assert slow[0].related[0] == "gpu08's link is below expectation, the other nodes' links are not"


def test_the_slow_emulated_node_is_named():
    # two emulated nodes, a rank each on its node's CPU: node 1's steps take twice as long
    vs = judge([ar.alone(slow_gpu=1, slow=0.5, n=2, nodes=2, devices=["cpu", "cpu"])])
    assert [(v.subject, v.status) for v in vs] == [("node 0", PASS), ("node 1", FAIL)]
    assert vs[1].ratio == pytest.approx(0.5, rel=1e-3) and vs[1].nodes == [1]
    # nodes' CPUs differ by their host's scheduling for a whole run: the noise is between their values
    # (one peer: the run_spread floor, 0.15), not in their steps. z = log 0.5 / (0.15 sqrt 2) = -3.2675
    assert vs[1].test["against"] == "1 peer" and vs[1].test["p"] == pytest.approx(5.42e-4, rel=0.01)
    # 12.7% below the other node, steps 1% apart (a healthy pair of nodes under equal quotas on this
    # machine): inside the spread between nodes, a WARN that says what a FAIL needs
    close = judge([ar.alone(slow_gpu=1, slow=0.127, n=2, nodes=2, devices=["cpu", "cpu"])])[1]
    assert close.status == WARN and "against 1 peer with a spread of 0.15 a FAIL needs 39% or more" in close.reason


def test_cpu_ranks_on_one_node_are_one_device():
    # two ranks on one node's CPU, one 5.3% slower: the scheduler's choice, not a slow part; the CPU's
    # rate is the ranks' sum, step by step, and it has no peer
    r = ar.alone(slow_gpu=1, slow=0.053, n=2, devices=["cpu", "cpu"], steps=10)
    (f,) = figures.figures([r])
    assert f.subject.label == "cpu" and f.peer_group is not None
    assert f.value == pytest.approx(sum(r.metrics["rank_throughputs"]))
    t0, t1 = (r.raw["rank_step_times_s"][k][0] for k in (0, 1))
    assert f.samples == pytest.approx([128 / a + 128 / b for a, b in zip(t0, t1)])
    assert [(v.subject, v.status) for v in judge([r])] == [("cpu", NO_EXPECTATION)]
    # two ranks per emulated node: each node's CPU is one device, and the nodes are peers
    four = ar.alone(slow_gpu=3, slow=0.9, n=4, nodes=2, devices=["cpu"] * 4)  # node 1: (1 + 0.1) / 2 = 0.55
    assert [(v.subject, v.status) for v in judge([four])] == [("node 0", PASS), ("node 1", FAIL)]


# -- datasheet expectations ----------------------------------------------------------------------------------
def test_datasheet_expectations_of_an_h100_sxm_server():
    vs = judge([ar.memory(), ar.gemm()], table=[])  # no healthy figures: the datasheet x fraction
    by = {(v.figure, v.expectation): v for v in vs if v.subject == "GPU 0"}
    # dense bf16 = 1979 / 2; Hopper SXM's measured fraction (the GPU facts' gemm_fractions), not the default 0.6
    assert by[("bf16 best rate", "datasheet")].expected == pytest.approx(0.80 * 989.5)
    assert "measured" in by[("bf16 best rate", "datasheet")].source
    assert by[("d2d", "datasheet")].expected == pytest.approx(0.8 * 3350)  # HBM3 3.35 TB/s
    gen5 = 32 * 16 / 8 * 128 / 130  # 63.015 GB/s per direction
    assert by[("h2d_pinned", "datasheet")].expected == pytest.approx(0.8 * gen5)
    assert all(v.status == PASS for v in vs)
    assert "NVIDIA H100 Tensor Core GPU datasheet" in by[("d2d", "datasheet")].source


def test_no_datasheet_figure_where_no_table_has_one():
    assert gpus.memory("NVIDIA GeForce RTX 4090") is None
    assert gpus.pcie_gbps(3, 16) == pytest.approx(8 * 16 / 8 * 128 / 130)  # 15.75 GB/s
    assert gpus.pcie_gbps(2, 16) == pytest.approx(5 * 16 / 8 * 0.8)  # 8b/10b: 8 GB/s
    cpu = ar.gemm()
    cpu.system = {"hostname": "x"}
    for row in cpu.raw["rows"]:
        row["device"] = "cpu"
    assert all(v.expectation != "datasheet" for v in judge([cpu]))


def test_every_fraction_names_its_source():
    for name, f in datasheet.FRACTIONS.items():
        assert 0 < f.value < 1 and len(f.source) > 40, name


# -- baselines and regressions --------------------------------------------------------------------------------
def baseline_of(*runs):
    """A baseline of accepted runs, newest first: each a list of records."""
    b = Baseline()
    for i, recs in enumerate(runs):
        b.add(figures.figures(recs), f"acceptance accept-old{i} (2026-11-{10 - i:02d})")
    return b


def test_the_between_run_test_matches_a_hand_computation():
    # one baseline run: sigma is the floor 0.10, se = 0.10 sqrt(1 + 1/1) = 0.141421; a run at 0.75 of it:
    # z = log 0.75 / se = -0.287682 / 0.141421 = -2.03421, p = Phi(z) = 0.020965
    t = signif.vs_runs(75.0, [100.0], 0.10)
    assert t.p == pytest.approx(0.020965, abs=1e-6) and (t.runs, t.sigma) == (1, 0.10)
    assert t.ratio_ci == pytest.approx((0.75 * math.exp(-1.959964 * 0.141421), 0.75 * math.exp(1.959964 * 0.141421)),
                                       rel=1e-5)
    # the floor on the detectable effect: 1 - exp(-z(0.99) se) = 1 - exp(-2.326348 x 0.141421) = 28.04%
    assert t.detectable(0.01) == pytest.approx(0.28035, abs=1e-5)
    # four runs 100, 120, 85, 100: mean log 4.610121, s = 0.140897 > the floor, se = s sqrt(1 + 1/4) = 0.157527;
    # a run at 70: z = (log 70 - 4.610121) / 0.157527 = -0.361626 / 0.157527 = -2.29564, p = 0.010848
    t = signif.vs_runs(70.0, [100.0, 120.0, 85.0, 100.0], 0.10)
    assert t.p == pytest.approx(0.010848, abs=1e-6) and t.sigma == pytest.approx(0.140897, abs=1e-6)
    assert signif.vs_runs(70.0, [100.0, 101.0, 99.0, 100.0], 0.10).sigma == 0.10  # a tighter spread: the floor


def test_a_regression_against_the_baseline_is_flagged_with_its_size_and_significance():
    old, new = ar.train(step=0.100), ar.train(step=0.200)  # half the throughput: ratio 0.5
    v = judge([new], baseline_of([old]))[0]
    assert v.status == FAIL and v.expectation == "baseline"
    assert v.ratio == pytest.approx(0.5, rel=1e-3)
    # one baseline run, the floor run_spread = 0.15: z = log 0.5 / (0.15 sqrt 2) = -3.2675, p = 5.42e-4
    assert v.test["p"] == pytest.approx(5.42e-4, rel=0.01) and "between-run" in v.test["method"]
    assert v.test["ratio_ci95"][0] < v.ratio < v.test["ratio_ci95"][1]
    assert "acceptance accept-old0" in v.source and "50.0% below the baseline" in v.reason


def test_a_shortfall_inside_the_noise_between_runs_is_no_fail():
    # 20% below one baseline run: its steps are tight (1%), but two runs differ by more than steps do
    old, new = ar.train(step=0.100), ar.train(step=0.125)
    v = judge([new], baseline_of([old]))[0]
    assert v.status == WARN and "inside the noise" in v.reason
    assert "against 1 baseline run with a spread of 0.15 a FAIL needs 39% or more" in v.reason  # 1 - exp(-2.3263 x 0.2121)
    # against ten accepted runs as tight as the floor, a third below is a FAIL; against runs that
    # themselves spread by +-30%, the same run is inside their noise
    tight = [[ar.train(step=0.100 * (1 + 0.1 * x))] for x in ar.PATTERN]
    v = judge([ar.train(step=0.150)], baseline_of(*tight))[0]
    assert v.status == FAIL and "10 accepted runs" in v.source and v.test["runs"] == 10
    geo = math.exp(sum(math.log(128 * 8 / (0.100 * (1 + 0.1 * x))) for x in ar.PATTERN) / 10)
    assert v.expected == pytest.approx(geo, rel=1e-3)  # the geometric mean of the runs
    wide = [[ar.train(step=0.100 * (1 + 0.3 * x))] for x in ar.PATTERN]
    v = judge([ar.train(step=0.150)], baseline_of(*wide))[0]
    assert v.status == WARN and v.test["sigma"] > 0.15


def test_reference_figures_match_model_devices_and_batch():
    from dlscale.importers.records import reference_records

    refs = reference_records("seed001-scaling")  # ResNet-50, batch 128 per GPU: 1x1 283 images/s (P100), ...
    mine = ar.alone(n=2, batch=128, step=128 / 290.0, devices=["cuda:0", "cuda:1"])
    vs = judge([mine], refs=refs)
    ref = [v for v in vs if v.expectation == "reference"]
    assert ref and all(v.expected == pytest.approx((283 + 626) / 2) for v in ref)  # the two 1x1 rows' mean


# -- outcome, energy, explanations -------------------------------------------------------------------------------
def test_outcome_and_exit_code():
    from dlscale.accept.acceptance import Acceptance

    vs = judge([ar.alone(slow_gpu=1, slow=0.07, n=4)])  # 7% below: WARN only
    acc = Acceptance("a", ar.rec("accept", "quick", {}), [], vs, [])
    assert acc.outcome == WARN and acc.exit_code == 0
    acc.warn_fails = True
    assert acc.exit_code == 1


def test_energy_and_cost_ride_beside_end_to_end_checks():
    from dlscale.accept.outputs.report import energy_text

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
        ("train", ERROR, "the run failed: RuntimeError: rank 3 was killed")]  # nothing sound measured


def test_a_system_verdict_lists_its_parts():
    old = ar.train(step=0.100)
    vs = judge([ar.train(step=0.2), ar.alone(slow_gpu=3)], baseline_of([old]))
    v = next(v for v in vs if v.check == "train" and v.status == FAIL)
    assert v.related == ["training alone throughput on GPU 3 is 11% below its peers"]
    assert explain.phrase(v) == "training on all devices throughput is 50% below the baseline"


def test_the_collectives_across_nodes_name_the_slow_nodes_link():
    def coll(scale):
        rows = [{"op": "all_reduce", "size": s, "in-place": {"busbw": scale * b}, "out-of-place": {"busbw": scale * b}}
                for s, b in ((2**20, 0.09), (2**21, 0.1), (2**22, 0.11), (2**23, 0.11))]
        return ar.rec("micro", "collectives", {"world_size": 3, "nodes": 3, "emulated_nodes": True}, {}, {"rows": rows})

    # the healthy links 8% below a faster baseline WARN beside node 2's FAIL: node 2 is still the one named
    vs = judge([coll(0.1), ar.links(slow_node=2), ar.train(step=0.5)],
               baseline_of([coll(1.0), ar.links(busbw=0.12), ar.train(step=0.1)]))
    assert {v.subject for v in vs if v.check == "links" and v.status == WARN} == {"node 0's link", "node 1's link"}
    v = next(v for v in vs if v.check == "collectives_nodes")
    assert v.status == FAIL and v.ratio == pytest.approx(0.1)
    assert v.related[0] == "node 2's link is below expectation, the other nodes' links are not"
    assert "links between nodes busbw on node 2's link is 90% below its peers" in v.related
    train = next(v for v in vs if v.check == "train")  # training on all nodes: the link leads its explanation
    assert train.status == FAIL and train.related[0] == v.related[0]


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
                             "GEMM bf16 best rate on gpu-b GPU 3 is 12% below its healthy figure",
                             "GEMM bf16 best rate on gpu-b GPU 3 is 12% below its peers"]
    assert {v.key for v in vs if v.check == "gemm" and v.subject.endswith("GPU 3")} == {
        "gemm|bf16 best rate|gpu-a cuda:3", "gemm|bf16 best rate|gpu-b cuda:3"}  # each node's own baseline
