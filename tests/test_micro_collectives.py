"""Collectives: nccl-tests' bus-bandwidth factors and sizes by hand, the exact expected results,
and 2-rank gloo sweeps under torchrun (every op correct; a planted wrong element exits 1)."""

from __future__ import annotations

import json

import pytest

from dlscale.errors import UsageError
from dlscale.micro.collectives import COLLECTIVES, Buffers, count_for, parse_sizes, value, values


@pytest.mark.parametrize("n, factors", [
    # nccl-tests doc/PERFORMANCE.md: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; others 1
    (2, {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5,
         "broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0}),
    (4, {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "all_to_all": 0.75,
         "broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0}),
    (8, {"all_reduce": 1.75, "all_gather": 0.875, "reduce_scatter": 0.875, "all_to_all": 0.875,
         "broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0}),
])
def test_busbw_factors_by_hand(n, factors):
    assert set(factors) == set(COLLECTIVES)
    for name, f in factors.items():
        # 1 GiB in 0.5 s: algbw = 2^30 / 0.5 / 1e9 = 2.147483648 GB/s; busbw = algbw * factor
        algbw = 2**30 / 0.5 / 1e9
        assert algbw == pytest.approx(2.147483648)
        assert COLLECTIVES[name].busbw(algbw, n) == pytest.approx(2.147483648 * f)


def test_sizes_and_counts():
    sweep = parse_sizes("8:128M")
    assert sweep[0] == 8 and sweep[-1] == 128 * 2**20 and len(sweep) == 25  # 2^3 .. 2^27
    assert parse_sizes("1K,2M") == [1024, 2 * 2**20]
    assert parse_sizes("8:4K:8") == [8, 64, 512, 4096]
    for bad in ("8:4:1", "x", "0", "8:4"):
        with pytest.raises(UsageError):
            parse_sizes(bad)
    # sharded collectives round the count down to a multiple of the ranks (nccl-tests' rule)
    assert count_for(COLLECTIVES["all_gather"], 40, 3) == 9
    assert count_for(COLLECTIVES["all_reduce"], 40, 3) == 10


def test_expected_results_by_hand():
    import torch

    cpu = torch.device("cpu")
    # value(r, i) = (7i + 13r) mod 31 + 1: rank 0 -> 1, 8, 15, 22; rank 1 -> 14, 21, 28, 4
    assert value(0, torch.arange(4)).tolist() == [1, 8, 15, 22]
    assert value(1, torch.arange(4)).tolist() == [14, 21, 28, 4]
    for rank, lo, hi in ((0, 0, 4), (1, 0, 100), (3, 29, 95), (2, 62, 63)):  # the tiled form agrees
        assert values(rank, lo, hi, cpu).tolist() == value(rank, torch.arange(lo, hi)).tolist()

    def exp(name, count, rank, mode="out-of-place"):
        mode = mode if mode in COLLECTIVES[name].modes else COLLECTIVES[name].modes[0]
        return Buffers(COLLECTIVES[name], count, mode, rank, 2, cpu).expected().tolist()

    assert exp("all_reduce", 2, 0) == [15, 29]
    assert exp("reduce", 2, 0) == [15, 29]
    assert exp("broadcast", 2, 1) == [1, 8]  # root 0's data
    assert exp("all_gather", 4, 1) == [1, 8, 14, 21]  # each rank's 2-element shard, in rank order
    assert exp("reduce_scatter", 4, 1) == [15 + 28, 22 + 4]  # rank 1 owns elements 2, 3 of the sum
    assert exp("all_to_all", 4, 0) == [1, 8, 14, 21]  # block 0 of every rank's send buffer
    assert exp("all_to_all", 4, 1) == [15, 22, 28, 4]
    assert exp("sendrecv", 2, 0) == [14, 21]  # ring: from rank n-1


def test_in_place_layouts_follow_nccl_tests():
    import torch

    cpu = torch.device("cpu")
    ag = Buffers(COLLECTIVES["all_gather"], 4, "in-place", 1, 2, cpu)
    assert ag.send.data_ptr() == ag.recv[2:].data_ptr()  # send = own slot of the output
    rs = Buffers(COLLECTIVES["reduce_scatter"], 4, "in-place", 1, 2, cpu)
    assert rs.recv.data_ptr() == rs.send[2:].data_ptr()  # recv = own slot of the input
    b = Buffers(COLLECTIVES["all_reduce"], 4, "in-place", 0, 2, cpu)
    assert b.wrong() == 4  # before the collective runs, nothing matches the sum


def _rows_by_op(rows):
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault(r["op"], []).append(r)
    return out


@pytest.mark.slow
def test_two_rank_gloo_sweep_every_op_correct(cli, db_path):
    r = cli("micro", "collectives", "--nproc-per-node", "2", "--sizes", "8:4K:8", "--iters", "3",
            "--warmup", "1", "--format", "json")
    assert r.code == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "ok" and doc["config"]["backend"] == "gloo" and doc["metrics"]["world_size"] == 2
    by_op = _rows_by_op(doc["rows"])
    assert set(by_op) == set(COLLECTIVES)
    busbws = []
    for name, rows in by_op.items():
        coll = COLLECTIVES[name]
        assert [x["size"] for x in rows] == [8, 64, 512, 4096]
        for x in rows:
            assert x["count"] == x["size"] // 4 and x["type"] == "float"
            for mode in ("out-of-place", "in-place"):
                cell = x[mode]
                if mode not in coll.modes:
                    assert cell is None
                    continue
                assert cell["wrong"] == 0, (name, x["size"], mode)
                assert cell["algbw"] == pytest.approx(x["size"] / (cell["time_us"] * 1e-6) / 1e9)
                assert cell["busbw"] == pytest.approx(cell["algbw"] * coll.factor(2))
                busbws.append(cell["busbw"])
    assert doc["metrics"]["wrong"] == 0
    assert doc["metrics"]["avg_busbw"] == pytest.approx(sum(busbws) / len(busbws))


@pytest.mark.slow
def test_planted_wrong_result_exits_1_and_is_recorded(cli, db_path):
    r = cli("micro", "collectives", "--ops", "all_reduce,reduce", "--sizes", "8,64", "--iters", "2",
            "--warmup", "0", "--plant-wrong", "reduce")
    assert r.code == 1
    assert "wrong element" in r.stderr and "reduce" in r.stderr
    assert "FAILED" in r.stdout  # the footer: #wrong is not 0
    from dlscale.store import Store

    with Store.open(db_path) as s:
        (rec,) = s.query(kind="micro", workload="collectives")
    assert rec.status == "failed" and "2 wrong element(s) in reduce" in rec.error
    wrong = {(x["op"], x["size"]): x["in-place"]["wrong"] for x in rec.raw["rows"]}
    assert wrong == {("all_reduce", 8): 0, ("all_reduce", 64): 0, ("reduce", 8): 1, ("reduce", 64): 1}


def test_min_busbw_gate_and_wrong_count_fail_the_body(monkeypatch):
    import torch

    from dlscale.micro import coll_worker
    from dlscale.record import RunRecord

    row = {"op": "all_reduce", "size": 8, "count": 2, "type": "float", "redop": "sum", "root": -1,
           "out-of-place": None, "in-place": {"time_us": 10.0, "algbw": 0.0008, "busbw": 0.0008, "wrong": 0, "iters": 1}}

    def fake_sweep(args, rank, n, device, record=None):
        record.raw["rows"] = [row]
        return coll_worker.summarize([row], n)

    monkeypatch.setattr(coll_worker, "sweep", fake_sweep)
    cpu = torch.device("cpu")
    args = coll_worker.parse_args(["--min-busbw", "0.5"])
    with pytest.raises(coll_worker.BelowMinBusBw, match="0.001 GB/s is below --min-busbw 0.5"):
        coll_worker.body(args, 0, 2, cpu, "gloo")(RunRecord(kind="micro", workload="collectives", config={}))
    ok = coll_worker.body(coll_worker.parse_args(["--min-busbw", "0.0005"]), 0, 2, cpu, "gloo")
    assert ok(RunRecord(kind="micro", workload="collectives", config={})).metrics["avg_busbw"] == 0.0008
    row["in-place"]["wrong"] = 3
    with pytest.raises(coll_worker.WrongResults, match="3 wrong element"):
        ok(RunRecord(kind="micro", workload="collectives", config={}))


@pytest.mark.slow
def test_emulated_nodes_pass_through(cli, db_path):
    from dlscale.distributed import netns

    why = netns.unavailable_reason()
    if why is not None:
        pytest.skip(f"network namespaces unavailable: {why}")
    r = cli("micro", "collectives", "--emulate-nodes", "2", "--nproc-per-node", "1", "--link-bandwidth", "1gbit",
            "--ops", "all_reduce", "--sizes", "8:64K:8", "--iters", "2", "--format", "json")
    assert r.code == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["metrics"]["world_size"] == 2 and doc["metrics"]["wrong"] == 0
    assert doc["config"]["launch"] == {"nproc_per_node": 1, "emulate_nodes": 2, "link_bandwidth": "1gbit",
                                       "link_latency": None}
