"""A data-parallel run's efficiency against the same training alone (distributed/dpref.py): the formula against
hand-computed and published values, where a record's reference comes from (given, found in the store, none),
and what it notes about the two runs. Records are built by hand in a fresh store: nothing is measured here."""

from __future__ import annotations

import pytest

from dlscale.config import TrainConfig
from dlscale.distributed import dpref
from dlscale.errors import UsageError
from dlscale.record import RunRecord
from dlscale.store import Store

HOST, GPU = "gpu-node-07", "NVIDIA H200"


def run(throughput, *, parallel="none", world=1, launched=True, host=HOST, batch=128, device_name=GPU, threads=16,
        rank_throughputs=None, status="ok", **metrics):
    device = "cuda" if device_name == GPU else "cpu"  # a record's config: the resolved TrainConfig and the run's
    config = {**TrainConfig("resnet50", batch_size=batch, precision="bf16", channels_last=True,
                            parallel=parallel).resolve(device).to_dict(), "device_name": device_name}
    if launched:
        config.update(world_size=world, launcher="torchrun", threads_per_rank=threads)
    rec = RunRecord(kind="train", workload="resnet50", config=config, system={"hostname": host},
                    metrics={"throughput": throughput, "world_size": world, **metrics}, tag="t")
    if rank_throughputs is not None:
        rec.metrics["rank_throughputs"] = rank_throughputs
    rec.status = status
    return rec


def cfg(**kw):
    return TrainConfig("resnet50", batch_size=128, precision="bf16", channels_last=True, **kw).resolve("cuda")


def test_the_h200_figure_and_seed_001_in_node_figure_by_hand():
    # the H200's acceptance (issue 35): DDP over its one GPU 3,012 images/s, the same training alone 4,302
    got, _ = dpref.figures({"throughput": 3012.0, "world_size": 1}, {}, dpref.Reference("a", 4302.0, "given"))
    assert got["dp_efficiency"] == pytest.approx(3012 / 4302) and round(got["dp_efficiency"], 3) == 0.700
    # seed 001 Fig. 26: four P100-PCIe in one node 1,099 images/s, one alone 283: 1099 / (4 x 283) = 97.1%
    got, _ = dpref.figures({"throughput": 1099.0, "world_size": 4}, {}, dpref.Reference("a", 283.0, "given"))
    assert round(got["dp_efficiency"], 3) == 0.971
    assert got["dp_reference_throughput"] == 283.0 and got["dp_reference_run_id"] == "a"
    none, notes = dpref.figures({"throughput": 1099.0, "world_size": 4}, {}, dpref.Reference(None, None, "none: x"))
    assert none["dp_efficiency"] is None and none["dp_efficiency_source"] == "none: x" and notes == []


def test_a_reference_runs_one_device_figure():
    # several ranks each alone at once: the mean of their own rates (not the global figure over the slowest window)
    assert dpref.per_device(run(2400.0, world=2, rank_throughputs=[1300.0, 1100.0])) == pytest.approx(1200.0)
    assert dpref.per_device(run(4302.0, launched=False, parallel="ddp")) == 4302.0  # one plain process
    assert dpref.per_device(run(8000.0, parallel="ddp", world=2)) == 4000.0  # a DDP run: its rate over its ranks
    assert dpref.per_device(run(0.0)) is None
    assert dpref.trains_alone(run(1.0, launched=False, parallel="ddp")) and dpref.trains_alone(run(1.0, world=4))
    assert not dpref.trains_alone(run(1.0, parallel="ddp"))  # DDP over one rank is not training alone


def test_a_given_reference_is_used_and_named_and_a_bad_one_refused(db_path):
    alone = run(4302.0)
    failed = run(10.0, status="failed")
    with Store.open(db_path) as s:
        s.insert(alone)
        s.insert(failed)
        ref = dpref.resolve(s, cfg(dp_reference=alone.run_id[:20]), HOST, GPU, 1, 16)
        assert (ref.run_id, ref.per_device) == (alone.run_id, 4302.0)
        assert ref.source == f"given: run {alone.run_id} (1 rank each training alone at once, tag t, " \
                             f"{alone.created_at[:10]})"
        with pytest.raises(UsageError, match=r"^--dp-reference .*: run .* is a failed train run with no throughput"):
            dpref.resolve(s, cfg(dp_reference=failed.run_id), HOST, GPU, 1, 16)
        with pytest.raises(UsageError, match=r"^no run 'nosuchrun'"):
            dpref.resolve(s, cfg(dp_reference="nosuchrun"), HOST, GPU, 1, 16)
        asked = dpref.resolve(s, cfg(dp_reference="none"), HOST, GPU, 1, 16)
    assert (asked.run_id, asked.source) == (None, "none: not asked for (--dp-reference none)")


def test_the_store_gives_the_newest_run_of_the_same_test_alone_on_this_host(db_path):
    wanted = run(4302.0, launched=False, parallel="ddp")  # a plain process: ddp is only the option's default
    others = [run(1.0, batch=256), run(2.0, parallel="ddp"), run(3.0, host="gpu-node-08"),
              run(4.0, device_name="NVIDIA H100 80GB HBM3"), run(5.0, status="failed")]
    with Store.open(db_path) as s:
        assert dpref.resolve(s, cfg(), HOST, GPU, 8, 16).source.startswith("none: no ok run of the same test")
        s.insert(wanted)
        for r in others:  # newer, and each differs in one thing that makes it no reference
            s.insert(r)
        ref = dpref.resolve(s, cfg(), HOST, GPU, 8, 16)
    assert ref.run_id == wanted.run_id and ref.source.startswith(f"found in the store: run {wanted.run_id} (one "
                                                                 "process training alone")


def test_on_a_cpu_the_reference_shares_the_device_as_the_ranks_do(db_path):
    cpu = "Intel(R) Xeon(R) Processor"
    c = TrainConfig("resnet50", batch_size=128, precision="bf16", channels_last=True).resolve("cpu")
    one_thread = run(30.0, world=2, threads=1, device_name=cpu, rank_throughputs=[15.0, 15.0])
    with Store.open(db_path) as s:
        s.insert(one_thread)
        s.insert(run(50.0, world=2, threads=2, device_name=cpu, rank_throughputs=[25.0, 25.0]))  # other threads
        s.insert(run(40.0, world=1, threads=1, device_name=cpu))  # one rank: the CPU to itself
        ref = dpref.resolve(s, c, HOST, cpu, 2, 1)
        none = dpref.resolve(s, c, HOST, cpu, 4, 1)
    assert (ref.run_id, ref.per_device) == (one_thread.run_id, 15.0)
    assert none.run_id is None and "with 4 ranks of 1 thread(s)" in none.source


def test_notes_name_what_else_differs_between_the_two_runs():
    ref = run(4302.0, monitor_gpu_sm_clock_MHz_mean=1980.0, monitor_gpu_util_pct_mean=99.0)
    ref.config.update(rank_cpus=["0-15"], cpu_binding="torchrun")
    mine = {"monitor_gpu_sm_clock_MHz_mean": 1755.0, "monitor_gpu_util_pct_mean": 97.0}
    config = {**ref.config, "threads_per_rank": 4, "rank_cpus": ["0-3"], "parallel": "ddp"}
    got = dpref.notes(mine, config, ref)
    assert got == ["threads per rank 4 (reference: 16)", "rank 0's CPUs 0-3 (reference: 0-15)",
                   "mean GPU SM clock 1,755 MHz (reference: 1,980)"]  # utilisation 2% apart: within its 5%
    assert dpref.notes({}, {**ref.config, "batch_size": 64}, ref) == ["batch_size 128 in the reference (this run: 64)"]
