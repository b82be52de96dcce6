"""Scaling analysis against the seed papers' published figures, and the data-parallel arithmetic."""

import json

import pytest

from dlscale.analysis.scaling import analyse, efficiency_rows, ladders, layout_rows
from dlscale.distributed.ladder import parse_layouts, plan
from dlscale.distributed.aggregate import allreduce_busbw, global_figures
from dlscale.distributed.comm import union_length
from dlscale.errors import UsageError
from dlscale.record import RunRecord
from dlscale.store import Store


def rec(thr, nodes, per_node, link=None, model="resnet50", comm=None, **cfg):
    config = {"batch_size": 64, "image_size": 224, "precision": "fp32", "device": "cuda", "nodes": nodes,
              "devices_per_node": per_node, "world_size": nodes * per_node, "emulated_nodes": link is not None,
              "link_bandwidth": link, **cfg}
    return RunRecord(kind="train", workload=model, config=config,
                     metrics={"throughput": float(thr), "world_size": nodes * per_node, "comm_fraction": comm})


def rows_by_layout(records):
    (lad,) = ladders(records)
    return {r["layout"]: r for r in efficiency_rows(lad)}, layout_rows(lad.points)


def test_seed001_fig26_p100_intra_and_inter_node():
    # 283 img/s on 1 P100; 1099 on 4 in one node (97%); 2075 on 8 across two nodes of 4 (92%).
    rows, _ = rows_by_layout([rec(283, 1, 1), rec(1099, 1, 4), rec(2075, 2, 4)])
    assert round(rows["1x4"]["efficiency"] * 100) == 97
    assert round(rows["2x4"]["efficiency"] * 100) == 92
    assert rows["1x4"]["speedup"] == pytest.approx(1099 / 283)
    # The split: a node keeps 1099 / (4 * 283); two nodes keep 2075 / (2 * 1099) of that; product = total.
    assert rows["2x4"]["intra_node_efficiency"] == pytest.approx(1099 / 1132)
    assert rows["2x4"]["inter_node_efficiency"] == pytest.approx(2075 / 2198)
    assert rows["2x4"]["intra_node_efficiency"] * rows["2x4"]["inter_node_efficiency"] == pytest.approx(rows["2x4"]["efficiency"])
    assert rows["1x4"]["inter_node_efficiency"] == pytest.approx(1.0)


def test_seed001_fig28_v100():
    rows, _ = rows_by_layout([rec(626, 1, 1), rec(2425, 1, 4), rec(4500, 2, 4)])
    assert round(rows["1x4"]["efficiency"] * 100) == 97
    assert round(rows["2x4"]["efficiency"] * 100) == 90


@pytest.mark.parametrize("sn, mn, pct", [(4852, 4500, 7.81), (3077, 2845, 8.16), (7894, 8754, -9.82),
                                         (16977, 12145, 39.79)])
def test_seed001_table5_scale_up_vs_scale_out(sn, mn, pct):
    # Table 5: 8x V100 in one server (A) vs 2 x 4 V100 multi-node (B), % Diff = (A - B) / B.
    _, layouts = rows_by_layout([rec(sn, 1, 8), rec(mn, 2, 4, link="100gbit")])
    (row,) = layouts
    assert (row["scale_up"], row["scale_out"]) == ("1x8", "2x4")
    assert row["pct_difference"] * 100 == pytest.approx(pct, abs=0.015)  # the paper rounds loosely


def test_ladders_split_by_link_and_share_single_node_points():
    recs = [rec(100, 1, 1), rec(190, 1, 2), rec(150, 2, 1, link="1gbit"), rec(185, 2, 1, link="10gbit"),
            rec(50, 1, 1, model="vgg16")]
    lads = ladders(recs)
    assert len(lads) == 3
    resnet = [lad for lad in lads if lad.workload == "resnet50"]
    assert {lad.link for lad in resnet} == {"emulated 1gbit", "emulated 10gbit"}
    for lad in resnet:
        assert {p.layout for p in lad.points} == {"1x1", "1x2", "2x1"}
    result = analyse(recs)
    (comp,) = result["comparisons"]
    slow = next(r for r in comp["rows"] if r["link"] == "emulated 1gbit")
    assert (slow["scale_up"], slow["scale_out"]) == ("1x2", "2x1")
    assert slow["pct_difference"] == pytest.approx((190 - 150) / 150)
    assert len(comp["rows"]) == 2  # 1x2 against each link


def test_nodes_set_apart_make_their_own_ladder():
    recs = [rec(100, 1, 1), rec(150, 2, 1, link="1gbit"),
            rec(60, 2, 1, link="1gbit", node_link_bandwidth={"1": "100mbit"}),
            rec(90, 2, 1, link="1gbit", node_cpu_quota={"1": 0.5})]
    assert {lad.link for lad in ladders(recs)} == {"emulated 1gbit", "emulated 1gbit, node 1 at 100mbit",
                                                   "emulated 1gbit, node 1 on 0.5 cores"}


def test_table5_across_two_systems():
    # Seed 001 Table 5 sets one 8-GPU server against two 4-GPU servers: two systems, one comparison.
    recs = [rec(4852, 1, 8, system="SN_8X-V100"), rec(4500, 2, 4, system="C4140-K")]
    result = analyse(recs)
    assert len(result["ladders"]) == 2
    (comp,) = result["comparisons"]
    (row,) = comp["rows"]
    assert (row["scale_up_system"], row["scale_out_system"]) == ("SN_8X-V100", "C4140-K")
    assert row["pct_difference"] == pytest.approx((4852 - 4500) / 4500)


def test_systems_are_separate_ladders():
    # Fig. 26 (P100) and Fig. 28 (V100) share a model and batch but not a baseline.
    recs = [rec(283, 1, 1, system="P100"), rec(1099, 1, 4, system="P100"), rec(626, 1, 1, system="V100"),
            rec(2425, 1, 4, system="V100")]
    effs = {lad.test["system"]: efficiency_rows(lad)[-1]["efficiency"] for lad in ladders(recs)}
    assert round(effs["P100"] * 100) == 97 and round(effs["V100"] * 100) == 97


def test_repeated_points_are_averaged_and_failed_runs_ignored():
    bad = rec(10, 1, 2)
    bad.fail("boom")
    rows, _ = rows_by_layout([rec(100, 1, 1), rec(180, 1, 2), rec(200, 1, 2), bad])
    assert rows["1x2"]["throughput"] == 190 and rows["1x2"]["runs"] == 2
    assert rows["1x2"]["efficiency"] == pytest.approx(0.95)


def test_no_baseline_leaves_efficiency_empty():
    rows, _ = rows_by_layout([rec(180, 1, 2)])
    assert rows["1x2"]["efficiency"] is None


def test_plan_and_layout_parsing():
    assert plan([1, 2], parse_layouts("1x2,2x1")) == [(1, 1), (1, 2), (2, 1)]
    assert plan([1, 2, 4, 8], parse_layouts("1x8,2x4")) == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 4)]
    with pytest.raises(UsageError):
        parse_layouts("2by4")


def test_global_throughput_uses_the_common_window():
    # Rank 0: window 0.2 s, rank 1: 0.25 s; per-rank batch 8, 2 steps: 2 * 8 * 2 / 0.25 = 128 samples/s.
    per_rank = [{"step_times": [[0.1, 0.1]], "comm_s": [[0.02, 0.02]], "bytes": [[100, 100]]},
                {"step_times": [[0.1, 0.15]], "comm_s": [[0.01, 0.01]], "bytes": [[100, 100]]}]
    m, warnings, raw = global_figures(per_rank, 8)
    assert m["throughput"] == pytest.approx(128.0)
    assert m["rank_throughputs"] == pytest.approx([80.0, 64.0])
    assert (m["rank_throughput_min"], m["rank_throughput_max"]) == (pytest.approx(64.0), pytest.approx(80.0))
    assert m["rank_comm_fractions"] == pytest.approx([0.2, 0.08])
    assert m["comm_fraction"] == pytest.approx(0.14)
    assert m["allreduce_seconds_per_step"] == pytest.approx(0.015)
    assert m["allreduce_bytes_per_step"] == 100
    assert raw["step_times_s"] == [[0.1, 0.15]]
    assert any("slowest rank" in w for w in warnings)


def test_busbw_and_interval_union():
    assert allreduce_busbw(1e9, 1.0, 2) == pytest.approx(1e9)  # 2(n-1)/n = 1 for two ranks
    assert allreduce_busbw(1e9, 1.0, 1) is None
    assert union_length([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4.0)
    assert union_length([]) == 0.0


def test_scale_from_store_prints_tables(cli, db_path):
    from dlscale.store import Store

    with Store.open(db_path) as s:
        for r in (rec(283, 1, 1), rec(1099, 1, 4), rec(2075, 2, 4, link="100gbit")):
            r.tag = "p100"
            s.insert(r)
    res = cli("scale", "--from-store", "--tag", "p100")
    assert res.code == 0, res.stderr
    assert "97.08%" in res.stdout and "91.65%" in res.stdout
    res = cli("scale", "--from-store", "--tag", "p100", "--format", "json")
    doc = json.loads(res.stdout)
    assert doc["ladders"][0]["efficiency"][-1]["layout"] == "2x4"
    assert doc["comparisons"] == []
    assert cli("scale", "--from-store", "--tag", "nothing").code == 2


def test_scale_summary_record_holds_the_tables(db_path):
    from dlscale.distributed.ladder import summary_record
    from dlscale.layout import Layout

    recs = [rec(100, 1, 1), rec(190, 1, 2), rec(150, 2, 1, link="1gbit")]
    layout = Layout(nproc_per_node=1, emulate_nodes=2, link_bandwidth="1gbit", threads_per_rank=1)
    s = summary_record("resnet50", "t", [(1, 1), (1, 2), (2, 1)], layout, recs, str(db_path))
    with Store.open(db_path) as store:
        assert store.get(s.run_id).metrics == s.metrics and s.status == "ok"
    assert s.kind == "scale" and s.tag == "t"
    assert s.metrics["efficiency_1x2"] == pytest.approx(0.95)
    assert s.metrics["efficiency_2x1"] == pytest.approx(0.75)
    assert s.metrics["pct_difference_1x2_vs_2x1@emulated 1gbit"] == pytest.approx(40 / 150)
    assert s.config["link_bandwidth"] == "1gbit" and len(s.raw["run_ids"]) == 3


def test_scale_over_imported_seed_figures(cli, db_path):
    # The seed papers' own figures, imported as records, give the papers' efficiencies and Table 5.
    assert cli("import", "--ref", "seed001-scaling", "--tag", "seed").code == 0
    assert cli("import", "--ref", "seed001-table5", "--tag", "seed").code == 0
    doc = json.loads(cli("scale", "--from-store", "--tag", "seed", "--format", "json").stdout)
    effs = sorted(round(r["efficiency"] * 100) for lad in doc["ladders"] for r in lad["efficiency"]
                  if r["efficiency"] is not None and r["devices"] > 1)
    assert effs == [90, 92, 97, 97]
    resnet = next(c for c in doc["comparisons"] if c["workload"] == "resnet50")
    assert [round(r["pct_difference"] * 100, 1) for r in resnet["rows"]] == [7.8]
