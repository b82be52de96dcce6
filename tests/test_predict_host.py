"""The CPU host's cores in a prediction: ranks that outnumber them, the host's other work, nodes on one machine.

By hand-built records (no runs): a one-rank CPU run with its threads, its host's usable cores and
its monitor's CPU figures; the contention `dlscale predict` derives from them (docs/METRICS.md,
"Contention and the records").
"""

from __future__ import annotations

import pytest

from dlscale.predict import fitted
from dlscale.record import RunRecord
from dlscale.store import Store
from test_predict import train_record
from test_predict_links import coll_record

TWO_CORES = {"hostname": "box", "cpu": {"logical_cpus": 4, "affinity": [0, 1]}}  # the affinity wins


def one_rank(threads: int | None = 1, own: float | None = 1.0, total: float | None = 50.0,
             device: str = "cpu", system: dict = TWO_CORES) -> RunRecord:
    rec = train_record()
    rec.config.update({"threads_per_rank": threads, "device": device})
    rec.metrics.update({"monitor_proc_cpu_cores_mean": own, "monitor_cpu_total_pct_mean": total})
    rec.system = system
    return rec


@pytest.mark.parametrize("per_host, factor", [(1, 1.0), (2, 1.0), (3, 1.5), (4, 2.0)])
def test_ranks_that_outnumber_an_idle_host_s_cores_take_them_in_turn(per_host, factor):
    # one thread each on 2 cores: 3 ranks get 2/3 of a core, 4 ranks half a core
    got, why = fitted.oversubscription(one_rank(), per_host)
    assert got == pytest.approx(factor)
    assert "2 usable cores" in why and ("in turn" in why) == (factor > 1)


def test_threads_per_rank_count_against_the_cores():
    # 2 threads per rank on 2 cores: the source rank had them all; two such ranks get half each
    assert fitted.oversubscription(one_rank(threads=2), 2)[0] == pytest.approx(2.0)
    # 4 threads on 2 cores already took turns alone: 2 ranks of 4 threads take twice as long again
    assert fitted.oversubscription(one_rank(threads=4, own=2.0, total=100.0), 2)[0] == pytest.approx(2.0)


def test_a_loaded_host_s_other_work_is_read_from_the_one_rank_run_s_monitor():
    # saturated host, the rank got a quarter core: 1 x 2 / 0.25 - 1 = 7 threads' worth of other work
    rec = one_rank(own=0.25, total=100.0)
    assert fitted.others_on_host(rec, 1, 2) == pytest.approx(7.0)
    # its rank had 2/8 of a core; 3 ranks get 2/10 each, 4 ranks 2/11
    assert fitted.oversubscription(rec, 3)[0] == pytest.approx((2 / 8) / (2 / 10))
    assert fitted.oversubscription(rec, 4)[0] == pytest.approx((2 / 8) / (2 / 11))
    assert "7.00 threads' worth of other work" in fitted.oversubscription(rec, 3)[1]
    # not saturated: 75% of 2 cores busy, 1 of them the rank's own: half a core of other work
    part = one_rank(own=1.0, total=75.0)
    assert fitted.others_on_host(part, 1, 2) == pytest.approx(0.5)
    assert fitted.oversubscription(part, 2)[0] == pytest.approx(1 / (2 / 2.5))


@pytest.mark.parametrize("rec, why", [
    (one_rank(device="cuda"), "not a CPU run"),
    (one_rank(threads=None), "not recorded"),
    (one_rank(system={"hostname": "box"}), "not recorded"),
])
def test_no_core_count_no_default(rec, why):
    factor, said = fitted.oversubscription(rec, 3)
    assert factor is None and why in said


def test_a_measured_run_of_the_ranks_wins_over_the_core_count(db_path):
    base = one_rank()
    with Store.open(db_path) as s:
        s.insert(base)
        assert fitted.contention(s, base, 3)[0] == pytest.approx(1.5)
        s.insert(train_record(per_node=3, forward=0.03))  # forward+optimizer 0.05 vs 0.04 measured with 3 ranks
        factor, why = fitted.contention(s, base, 3)
    assert factor == pytest.approx(0.05 / 0.04) and why.startswith("forward+optimizer of")


def _predict_store(db_path, link: RunRecord) -> tuple[RunRecord, RunRecord]:
    base = one_rank()
    with Store.open(db_path) as s:
        s.insert(base)
        s.insert(link)
    return base, link


def test_emulated_nodes_share_the_host_s_cores(db_path):
    from dlscale import api

    base, lk = _predict_store(db_path, coll_record(20e-6, 0.12e9, nodes=2, emulated=True, rate="1gbit"))
    recs = {r.config["nodes"]: r for r in api.predict(base.run_id, [(2, 1), (3, 1)], inter=f"run:{lk.run_id}",
                                                        db=str(db_path))}
    assert recs[2].metrics["contention"] == pytest.approx(1.0) and recs[3].metrics["contention"] == pytest.approx(1.5)
    assert recs[3].config["shared_host"] is True
    assert any("take the cores in turn, 1.500x" in n for n in recs[3].raw["notes"])
    # 1.5x the compute, and a ring over 3 ranks: slower per rank than 2x1
    assert recs[3].metrics["step_time"] > 1.5 * base.metrics["step_time_mean"]


def test_nodes_of_a_cluster_on_one_machine_are_said_to_share_it(db_path, cli):
    import json

    # a collectives run across 2 real (Slurm) nodes: its link says nothing of where they run
    base, lk = _predict_store(db_path, coll_record(20e-6, 0.12e9, nodes=2))
    args = ("predict", "tinycnn", "--from", base.run_id, "--layouts", "3x1", "--inter", f"run:{lk.run_id}",
            "--format", "json")
    own = json.loads(cli(*args).stdout)[0]
    shared = json.loads(cli(*args, "--shared-host").stdout)[0]
    assert own["metrics"]["contention"] == pytest.approx(1.0) and own["config"]["shared_host"] is False
    assert shared["metrics"]["contention"] == pytest.approx(1.5) and shared["config"]["shared_host"] is True
    assert shared["metrics"]["efficiency"] < own["metrics"]["efficiency"]


def test_the_host_s_own_all_reduce_work_takes_the_cores_from_backward_by_hand():
    from dlscale.predict.links import Link
    from dlscale.predict.model import Compute, predict_step

    # F = 1, Bw = 2, O = 0.5, E = 0.25 s; buckets 1e6, 2e6, 1e6 B ready at 1/4, 3/4, 1 of backward;
    # 1x2 over a 2e6 B/s link (wire W = S / 2e6: 0.5, 1, 0.5 s) and a host of 2e6 B/s (H the same):
    # each bucket flies W + H = 1, 2, 1 s, and backward runs at W / (W + H) = 1/2 meanwhile.
    compute = Compute(1.0, 2.0, 0.5, 0.25)
    lk = Link("l", 0.0, 2e6, "hand")
    got = predict_step(compute, [1_000_000, 2_000_000, 1_000_000], 1, 2, lk, None, host_bandwidth=2e6)
    # bucket 1 ready at 1.5 s, flies to 2.5 (backward does 0.5 s of work meanwhile), bucket 2 ready at
    # 3.0, flies to 5.0; backward's last 0.5 s at half speed ends at 4.0; bucket 3 flies 5.0 -> 6.0
    assert [b["start_s"] for b in got.schedule] == pytest.approx([1.5, 3.0, 5.0])
    assert [b["end_s"] for b in got.schedule] == pytest.approx([2.5, 5.0, 6.0])
    assert got.overlap_loss_s == pytest.approx(1.0) and got.exposed_s == pytest.approx(2.0)
    assert got.step_s == pytest.approx(4.0 + 2.0 + 0.75)
    # the transfer alone (no host cost) leaves backward its speed: buckets fly 1.5-2.0, 2.5-3.5, 3.5-4.0
    free = predict_step(compute, [1_000_000, 2_000_000, 1_000_000], 1, 2, lk, None)
    assert free.overlap_loss_s == 0.0 and free.step_s == pytest.approx(3.0 + 1.0 + 0.75)


def test_the_host_cost_comes_from_a_loopback_collectives_run_of_this_host(db_path):
    from dlscale import api

    base = one_rank()
    loop = coll_record(0.0, 0.25e9)  # 2 ranks on one node: 0.25 GB/s with no wire at all
    loop.system = {"hostname": "box"}  # the source run's host
    link = coll_record(20e-6, 0.12e9, nodes=2, emulated=True, rate="1gbit")
    with Store.open(db_path) as s:
        for r in (base, loop, link):
            s.insert(r)
    (rec,) = api.predict(base.run_id, [(2, 1)], inter=f"run:{link.run_id}", db=str(db_path))
    assert rec.config["host_bandwidth"] == pytest.approx(0.25e9, rel=1e-6)
    assert any(n.startswith(f"host cost: 0.250 GB/s, the loopback all-reduce rate of {loop.run_id}")
               for n in rec.raw["notes"])
    # another host's loopback says nothing of this one's
    other = coll_record(0.0, 0.25e9)
    other.system = {"hostname": "elsewhere"}
    with Store.open(db_path) as s:
        s.insert(other)
    (rec,) = api.predict(base.run_id, [(2, 1)], inter=f"run:{link.run_id}", intra=f"run:{other.run_id}",
                         db=str(db_path))
    assert rec.config["host_bandwidth"] is None
