"""Collectives: nccl-tests' bus-bandwidth factors and sizes by hand, the exact expected results,
and 2-rank gloo sweeps under torchrun (every op correct; a planted wrong element exits 1)."""

from __future__ import annotations

import json

import pytest
from conftest import requires_cuda

from dlscale import stats
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


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_reset_leaves_no_stale_result_that_could_pass(name, n, monkeypatch):
    """After a correct call, reset() and a collective that writes nothing must read as wrong."""
    import torch

    cpu = torch.device("cpu")
    for mode in COLLECTIVES[name].modes:
        for rank in range(n):
            b = Buffers(COLLECTIVES[name], 6 * n, mode, rank, n, cpu)
            if b.result() is None:  # reduce: only the root has a result
                continue
            b.result().copy_(b.expected())  # the previous call's correct result
            assert b.wrong() == 0
            b.reset()
            monkeypatch.setattr(b, "call", lambda: None)  # a collective that writes nothing
            b.call()
            no_op_is_right = name == "broadcast" and rank == b.root  # the root's data is the result
            assert (b.wrong() == 0) == no_op_is_right, (mode, rank)


@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_the_check_in_pieces_finds_what_the_whole_check_finds(name, monkeypatch):
    """The fill and the check build the expected result a piece at a time (a 16G sweep holds its buffers and a
    few pieces, not a full copy per rank): with pieces of 5 elements, straddling the ranks' blocks, the
    result is the whole one's, a correct result has no wrong element and a planted one is found."""
    import torch

    from dlscale.micro import collectives

    cpu, n = torch.device("cpu"), 3
    for mode in COLLECTIVES[name].modes:
        for rank in range(n):
            whole = Buffers(COLLECTIVES[name], 12 * n, mode, rank, n, cpu)
            if whole.result() is None:
                continue
            want, sent = whole.expected().tolist(), whole.send.tolist()
            monkeypatch.setattr(collectives, "PIECE", 5)
            b = Buffers(COLLECTIVES[name], 12 * n, mode, rank, n, cpu)
            assert b.send.tolist() == sent and b.expected().tolist() == want
            assert torch.cat([b.expected(lo, hi) for lo, hi in collectives.pieces(len(want))]).tolist() == want
            b.result().copy_(torch.tensor(want))
            assert b.wrong() == 0
            b.result().view(-1)[len(want) - 1] += 1
            assert b.wrong() == 1, (mode, rank)
            monkeypatch.undo()


def test_in_place_all_gather_rank0_poisons_the_other_slots():
    import torch

    b = Buffers(COLLECTIVES["all_gather"], 4, "in-place", 0, 2, torch.device("cpu"))
    b.recv.copy_(b.expected())
    b.reset()
    assert b.recv.tolist() == [1, 8, -1, -1]  # own slot: its values; rank 1's slot: poisoned
    assert b.wrong() == 2


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
    busbws: dict[str, list] = {}
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
                busbws.setdefault(name, []).append(cell["busbw"])
    assert doc["metrics"]["wrong"] == 0
    for name, busbws in busbws.items():  # per collective; no average across collectives
        assert doc["metrics"][f"avg_busbw_{name}"] == pytest.approx(sum(busbws) / len(busbws))
        assert doc["metrics"][f"max_busbw_{name}"] == pytest.approx(max(busbws))
    assert doc["metrics"]["avg_busbw"] is None


@pytest.mark.slow
@pytest.mark.long
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


def _cell(busbw: float, wrong: int = 0) -> dict:
    return {"time_us": 10.0, "algbw": busbw, "busbw": busbw, "wrong": wrong, "iters": 1}


def _row(op: str, size: int, in_place: float | None, out_of_place: float | None = None) -> dict:
    return {"op": op, "size": size, "count": size // 4, "type": "float", "redop": "sum", "root": -1,
            "out-of-place": None if out_of_place is None else _cell(out_of_place),
            "in-place": None if in_place is None else _cell(in_place)}


def _run_body(monkeypatch, rows, **opts):
    import torch

    from dlscale.micro import coll_worker
    from dlscale.micro.collectives import CollectiveOptions
    from dlscale.record import RunRecord

    def fake_sweep(o, rank, n, device, record=None):
        record.raw["rows"] = rows
        return coll_worker.summarize(rows, n)

    monkeypatch.setattr(coll_worker, "sweep", fake_sweep)
    rec = RunRecord(kind="micro", workload="collectives", config={})
    run = coll_worker.body(CollectiveOptions(**opts), 0, 2, torch.device("cpu"), "gloo")
    return run(rec), rec


def test_summary_is_per_collective_by_hand():
    from dlscale.micro.coll_worker import summarize

    rows = [_row("all_reduce", 8, 1.0), _row("all_reduce", 64, 3.0),
            _row("all_gather", 8, 0.5, 1.5), _row("all_gather", 64, 2.5, 3.5)]
    m = summarize(rows, 2)
    assert m["avg_busbw_all_reduce"] == pytest.approx(2.0) and m["max_busbw_all_reduce"] == 3.0  # (1 + 3) / 2
    assert m["avg_busbw_all_gather"] == pytest.approx(2.0) and m["max_busbw_all_gather"] == 3.5  # (0.5+1.5+2.5+3.5)/4
    assert m["avg_busbw"] is None and m["max_busbw"] is None  # two collectives: no single average
    assert "avg_busbw_broadcast" not in m and m["wrong"] == 0 and m["rows"] == 4
    one = summarize(rows[:2], 2)  # a single collective keeps the plain figures
    assert one["avg_busbw"] == pytest.approx(2.0) and one["max_busbw"] == 3.0


def test_min_busbw_gates_every_collective(monkeypatch):
    from dlscale.micro import coll_worker

    rows = [_row("all_reduce", 8, 0.4), _row("all_reduce", 64, 0.424),  # avg 0.412
            _row("broadcast", 8, 5.0), _row("sendrecv", 8, None, 0.2)]
    with pytest.raises(coll_worker.BelowMinBusBw) as e:
        _run_body(monkeypatch, rows, min_busbw=1)
    assert str(e.value) == ("all_reduce average busbw 0.412 GB/s is below --min-busbw 1 GB/s; "
                            "sendrecv average busbw 0.200 GB/s is below --min-busbw 1 GB/s")
    # broadcast's 5 GB/s would have lifted a mixed average (1.85) above the gate: it must not
    out, rec = _run_body(monkeypatch, rows, min_busbw=0.1)
    assert out.metrics["avg_busbw"] is None and out.metrics["avg_busbw_broadcast"] == 5.0
    assert out.units["avg_busbw_sendrecv"] == "GB/s" and "avg_busbw_reduce" not in out.units


def test_footer_has_one_avg_busbw_line_per_collective():
    from dlscale.micro.coll_worker import summarize
    from dlscale.micro.report import collectives_footer
    from dlscale.record import RunRecord

    rows = [_row("all_reduce", 8, 0.4), _row("all_reduce", 64, 0.424), _row("broadcast", 8, 5.0)]
    rec = RunRecord(kind="micro", workload="collectives", config={"min_busbw": 1.0},
                    metrics=summarize(rows, 2), raw={"rows": rows})
    lines = collectives_footer(rec)
    assert lines[0].startswith("Out of bounds values (#wrong) : 0 OK")
    assert lines[1] == "all_reduce avg busbw          : 0.412 GB/s  below --min-busbw"
    assert lines[2] == "broadcast avg busbw           : 5.000 GB/s"
    assert lines[3] == "--min-busbw (per collective)  : 1 GB/s" and len(lines) == 4


def test_min_busbw_gate_and_wrong_count_fail_the_body(monkeypatch):
    from dlscale.micro import coll_worker

    rows = [_row("all_reduce", 8, 0.0008)]
    with pytest.raises(coll_worker.BelowMinBusBw, match="all_reduce average busbw 0.001 GB/s is below --min-busbw 0.5"):
        _run_body(monkeypatch, rows, min_busbw=0.5)
    out, _ = _run_body(monkeypatch, rows, min_busbw=0.0005)
    assert out.metrics["avg_busbw"] == 0.0008 and out.metrics["avg_busbw_all_reduce"] == 0.0008
    rows[0]["in-place"]["wrong"] = 3
    with pytest.raises(coll_worker.WrongResults, match="3 wrong element"):
        _run_body(monkeypatch, rows, min_busbw=0.0005)
    with pytest.raises(coll_worker.BelowMinBusBw, match="no collective was measured"):
        _run_body(monkeypatch, [], min_busbw=0.5)


@pytest.mark.slow
@pytest.mark.long
def test_all_reduce_over_two_emulated_nodes_and_a_1gbit_link(cli, db_path):
    from conftest import namespaces_left, need_system
    from dlscale.distributed import netns

    need_system("network namespaces (root, iproute2)", netns.unavailable_reason(), "DLSCALE_REQUIRE_NETNS")
    before = set(netns.list_namespaces())
    r = cli("micro", "collectives", "--emulate-nodes", "2", "--link-bandwidth", "1gbit", "--sizes", "1M:4M",
            "--ops", "all_reduce,all_gather", "--iters", "2", "--format", "json")
    assert r.code == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    m, c = doc["metrics"], doc["config"]
    assert m["world_size"] == 2 and m["wrong"] == 0
    assert (c["nodes"], c["devices_per_node"], c["emulated_nodes"], c["link_bandwidth"], c["backend"]) == \
        (2, 1, True, "1gbit", "gloo")
    assert m["link_rate"] == pytest.approx(0.125)  # 1 gbit/s = 0.125 GB/s
    for op in ("all_reduce", "all_gather"):
        # busbw is the per-link rate: over a 1 gbit link it cannot be much above 0.125 GB/s.
        assert 0 < m[f"avg_busbw_{op}"] < 0.125 * 1.5
        assert m[f"link_utilisation_{op}"] == pytest.approx(m[f"avg_busbw_{op}"] / 0.125)
    assert namespaces_left(before) == []  # no namespace of the run left behind


# -- timing: one host-timed window on CPUs, K calls per event pair on GPUs ------------------------------
class _FakeBuffers:
    def __init__(self, op):
        self.call = op


def test_cpu_timing_is_one_window_of_the_iterations_as_before(monkeypatch):
    import types

    import torch.distributed as dist

    from dlscale.micro import coll_worker

    clock = [0.0]
    monkeypatch.setattr(coll_worker, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: None)
    calls = []

    def op():
        calls.append(1)
        clock[0] += 0.01

    times, timing = coll_worker.time_collective(_FakeBuffers(op), 3, 20, 0.5, lambda: None, lambda x: x)
    # first call 10 ms: 0.5 s fits 50, so 2 more warm-up calls and all 20 iterations, one window
    assert timing == {"iters": 20} and len(calls) == 1 + 2 + 20
    assert times == pytest.approx([0.01])
    coll = COLLECTIVES["all_reduce"]
    # the cell as before: the rank-mean time, algbw = size / t, busbw = algbw x 2(n-1)/n
    cell = coll_worker.cell(4096, [0.02 / 2], 0, timing, coll, 2)
    assert list(cell) == ["time_us", "algbw", "busbw", "wrong", "iters"]
    assert cell["time_us"] == pytest.approx(1e4) and cell["algbw"] == pytest.approx(4096 / 0.01 / 1e9)
    assert cell["busbw"] == pytest.approx(cell["algbw"])


def test_gpu_cell_reports_the_median_window_and_keeps_the_samples():
    from dlscale.micro import coll_worker

    timing = {"iters": 300, "calls_per_window": 100, "windows": 3, "timing": "cuda-events", "calibration": []}
    cell = coll_worker.cell(8, [10e-6, 30e-6, 11e-6], 0, timing, COLLECTIVES["all_reduce"], 2)
    assert cell["time_us"] == pytest.approx(11.0) and cell["samples_us"] == pytest.approx([10.0, 30.0, 11.0])
    assert cell["algbw"] == pytest.approx(8 / 11e-6 / 1e9) and cell["calls_per_window"] == 100


def test_gpu_ranks_agree_on_k_and_windows_from_the_slowest_rank(monkeypatch):
    """Two ranks in two threads, each with its own fake GPU (rank 1's calls twice as slow): every
    decision uses the all-reduced (max) window, so both make the same calls, and K puts the
    slowest rank's window at 1 ms or more."""
    import threading

    import torch.distributed as dist
    from fakes_gpu import FakeTimingCuda

    from dlscale.micro import coll_worker, gputiming

    meet = threading.Barrier(2, timeout=20)  # a rank that fails breaks it: the other raises, none hangs
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: meet.wait())
    box: list[float] = []

    def reduce_max(x):  # an all_reduce(MAX) over the two threads
        box.append(x)
        meet.wait()
        value = max(box[-2:])
        meet.wait()  # both have read before either adds the next value
        return value

    out: dict[int, tuple] = {}
    gpus = {0: FakeTimingCuda(), 1: FakeTimingCuda()}

    def rank_main(rank):
        gpu = gpus[rank]
        op = gpu.builder(lambda n: (6e-6 if rank == 0 else 12e-6))()
        out[rank] = coll_worker.cuda_windows(_FakeBuffers(op), 5, 0.5, lambda: None, reduce_max, "cuda:0", api=gpu)

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    (t0, info0), (t1, info1) = out[0], out[1]
    assert info0 == info1 and info0["windows"] == 5 and gpus[0].executed == gpus[1].executed
    k = info0["calls_per_window"]
    assert k * 12e-6 >= gputiming.TARGET_WINDOW_S > (k / 2.5) * 12e-6  # sized on the slow rank
    assert info0["iters"] == 5 * k and gpus[0].events_made == 5 + 1
    assert t0 == pytest.approx([6e-6] * 5) and t1 == pytest.approx([12e-6] * 5)
    assert [len(c) for c in gpus[1].windows(5)] == [k] * 5


@requires_cuda
@pytest.mark.gpu
@pytest.mark.slow
def test_nccl_small_sizes_get_many_calls_per_event_pair(cli, db_path):
    r = cli("micro", "collectives", "--device", "cuda", "--ops", "all_reduce", "--sizes", "8:1M:16", "--iters", "5",
            "--format", "json")
    assert r.code == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)["rows"]
    for x in rows:
        cell = x["in-place"]
        assert cell["timing"] == "cuda-events" and 1 <= cell["windows"] <= 5 and cell["wrong"] == 0
        assert cell["iters"] == cell["windows"] * cell["calls_per_window"]
        assert cell["time_us"] == pytest.approx(stats.percentile(cell["samples_us"], 50))  # the median window
    assert rows[0]["in-place"]["calls_per_window"] > 1  # 8 bytes: many calls make a 1 ms window
