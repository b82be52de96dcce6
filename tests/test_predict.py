"""`dlscale predict` end to end over hand-built records: records, links, contention, compare, report."""

from __future__ import annotations

import json

import pytest

from dlscale.record import RunRecord
from dlscale.store import Store
from test_predict_links import coll_record

TEST = {"batch_size": 16, "image_size": 32, "precision": "fp32", "channels_last": True, "optimizer": "sgd",
        "device": "cpu"}
HOST = {"hostname": "box"}


def train_record(per_node: int = 1, nodes: int = 1, tag: str = "measured", throughput: float = 160.0,
                 link: str | None = None, forward: float = 0.02, **extra) -> RunRecord:
    config = {"model": "tinycnn", **TEST, "nodes": nodes, "devices_per_node": per_node,
              "world_size": nodes * per_node, "emulated_nodes": link is not None, "link_bandwidth": link}
    step = 16 * nodes * per_node / throughput
    metrics = {"world_size": nodes * per_node, "throughput": throughput, "step_time_mean": step,
               "samples_per_step": 16 * nodes * per_node, "phase_forward": forward, "phase_backward": 0.06,
               "phase_optimizer": 0.02, "phase_h2d": 0.0, "phase_data_wait": 0.0, **extra}
    return RunRecord(kind="train", workload="tinycnn", config=config, metrics=metrics, system=HOST, tag=tag)


@pytest.fixture
def store_with_runs(db_path):
    base = train_record()  # 16 / 160 = 0.1 s per step on one device
    with Store.open(db_path) as s:
        s.insert(base)
        # forward+optimizer 0.05 vs 0.04: contention 1.25; its all-reduce took 50 ms per step in training
        s.insert(train_record(per_node=2, forward=0.03, allreduce_seconds_per_step=0.05))
        s.insert(train_record(nodes=2, link="1gbit", throughput=250.0))
        s.insert(coll_record(20e-6, 0.12e9, nodes=2, emulated=True, rate="1gbit"))
        s.insert(coll_record(5e-6, 2e9))
    return base


def test_predict_records_every_layout_with_links_and_contention(cli, db_path, store_with_runs):
    r = cli("predict", "tinycnn", "--from", store_with_runs.run_id[:-2], "--layouts", "1x2,2x1", "--inter",
            "measured:1gbit", "--intra", "measured", "--tag", "pred", "--format", "json")
    assert r.code == 0, r.stderr
    doc = {d["config"]["nodes"]: d for d in json.loads(r.stdout)}
    one_node, two_nodes = doc[1], doc[2]
    assert one_node["kind"] == "prediction" and one_node["config"]["from_run"] == store_with_runs.run_id
    # 2 ranks on this host: forward and optimizer of the 1x2 run over the 1x1 run's
    assert one_node["metrics"]["contention"] == pytest.approx(0.05 / 0.04)
    assert two_nodes["metrics"]["contention"] == pytest.approx(0.05 / 0.04)  # emulated nodes share the host
    assert two_nodes["config"]["emulated_nodes"] and two_nodes["config"]["link_bandwidth"] == "1gbit"
    assert two_nodes["config"]["inter_link"]["bandwidth"] == pytest.approx(0.12e9, rel=1e-6)
    for d in doc.values():
        m = d["metrics"]
        assert m["throughput"] == pytest.approx(2 * 16 / m["step_time"])
        assert m["efficiency"] == pytest.approx(m["throughput"] / (2 * 160.0))
        assert 0 <= m["comm_fraction"] < 1
    with Store.open(db_path) as s:
        assert len(s.query(kind="prediction", tag="pred")) == 2


def test_compare_and_report_put_prediction_beside_measurement(cli, db_path, store_with_runs):
    assert cli("predict", "--from", store_with_runs.run_id, "--layouts", "2x1", "--inter", "1gbit",
               "--tag", "pred").code == 0
    r = cli("compare", "kind:prediction,tag:pred", "tag:measured", "--by", "model,layout,link", "--format", "json")
    assert r.code == 0, r.stderr
    (row,) = [x for x in json.loads(r.stdout)["rows"] if x.get("layout") == "2x1"]
    assert row["link"] == "emulated 1gbit" and row["b"] == pytest.approx(250.0)
    from dlscale.report.predictions import matched, prediction_section

    with Store.open(db_path) as s:
        recs = s.query(status="ok")
    (m,) = matched(recs)
    assert m["measured"] == 250.0 and m["error"] == pytest.approx((m["predicted"] - 250.0) / 250.0)
    sec = prediction_section(recs)
    assert sec.figure.png[:4] == b"\x89PNG" and sec.tables[0].rows[0][2] == "emulated 1gbit"


def test_bad_input_exits_2_with_one_line(cli, db_path, store_with_runs):
    run = store_with_runs.run_id
    for args, words in [(["--layouts", "0x4"], "NODESxDEVICES"), (["--layouts", "2x"], "NODESxDEVICES"),
                        (["--layouts", "4x1", "--inter", "warp-drive"], "unknown link"),
                        (["--layouts", "1x2", "--intra", "measured:10gbit"], "no intra-node"),
                        (["--layouts", "1x2", "--intra", "run:nope"], "no run 'nope'")]:
        r = cli("predict", "--from", run, *args)
        assert r.code == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert words.lower() in r.stderr.lower(), (args, r.stderr)
    r = cli("predict", "resnet50", "--from", run, "--layouts", "1x2", "--intra", "nvlink4")
    assert r.code == 2 and "tinycnn run" in r.stderr


def test_without_any_link_a_multi_node_layout_says_what_to_give(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCALE_DB", str(tmp_path / "empty.db"))
    base = train_record()
    with Store.open(str(tmp_path / "empty.db")) as s:
        s.insert(base)
    r = cli("predict", "--from", base.run_id, "--layouts", "2x1")
    assert r.code == 2 and "--inter LINK" in r.stderr


def test_links_listing(cli):
    r = cli("predict", "--links", "--format", "json")
    assert r.code == 0 and json.loads(r.stdout)["ib-edr"]["bandwidth"] == 12.5e9


def test_host_cost_is_fitted_from_the_measured_one_node_run(cli, db_path, store_with_runs):
    from dlscale.predict.fitted import fit_host_bandwidth
    from dlscale.predict.grads import ddp_buckets, profile
    from dlscale.predict.links import link

    r = cli("predict", "--from", store_with_runs.run_id, "--layouts", "2x1", "--inter", "1gbit", "--intra",
            "10gbit", "--format", "json")
    assert r.code == 0, r.stderr
    (doc,) = json.loads(r.stdout)
    buckets = ddp_buckets(profile("tinycnn", "fp32", {"image_size": 32}).nbytes)
    expected = fit_host_bandwidth(0.05, buckets, 2, link("10gbit"))
    assert doc["config"]["host_bandwidth"] == pytest.approx(expected)
    assert any("host cost" in n and "fitted from" in n for n in doc["raw"]["notes"])
    off = json.loads(cli("predict", "--from", store_with_runs.run_id, "--layouts", "2x1", "--inter", "1gbit",
                         "--intra", "10gbit", "--no-host-cost", "--format", "json").stdout)[0]
    assert off["config"]["host_bandwidth"] is None and off["metrics"]["throughput"] > doc["metrics"]["throughput"]


def test_a_layout_given_twice_is_predicted_and_recorded_once(cli, db_path, store_with_runs):
    r = cli("predict", "--from", store_with_runs.run_id, "--layouts", "1x2,2x1,1x2", "--intra", "10gbit", "--inter",
            "1gbit", "--tag", "twice", "--format", "json")
    assert r.code == 0, r.stderr
    assert [(d["config"]["nodes"], d["config"]["devices_per_node"]) for d in json.loads(r.stdout)] == [(1, 2), (2, 1)]
    with Store.open(db_path) as s:
        assert len(s.query(kind="prediction", tag="twice")) == 2


def test_cpu_runs_keep_free_overlap_and_say_so(cli, db_path, store_with_runs):
    (doc,) = json.loads(cli("predict", "--from", store_with_runs.run_id, "--layouts", "2x1", "--inter", "1gbit",
                            "--format", "json").stdout)
    assert doc["config"]["overlap_cost"] == 0.0 and doc["metrics"]["overlap_loss"] == 0.0
    assert any(n.startswith("overlap cost 0: a CPU run") for n in doc["raw"]["notes"])


def gpu_record(per_node: int = 1, throughput: float = 400.0, forward: float = 0.1, **extra) -> RunRecord:
    """A measured ResNet-18 short test on GPUs of one host ("gpubox"), with its phase breakdown."""
    config = {"model": "resnet18", "batch_size": 64, "image_size": 64, "precision": "bf16", "channels_last": True,
              "optimizer": "sgd", "device": "cuda", "nodes": 1, "devices_per_node": per_node, "world_size": per_node}
    metrics = {"world_size": per_node, "throughput": throughput, "step_time_mean": 64 * per_node / throughput,
               "samples_per_step": 64 * per_node, "phase_forward": forward, "phase_backward": 0.2,
               "phase_optimizer": 0.02, "phase_h2d": 0.0, "phase_data_wait": 0.0, **extra}
    return RunRecord(kind="train", workload="resnet18", config=config, metrics=metrics, system={"hostname": "gpubox"},
                     tag="gpu")


def test_the_overlap_cost_is_fitted_from_a_measured_one_node_gpu_run(cli, db_path):
    from dlscale.predict.fitted import fit_overlap
    from dlscale.predict.grads import bucket_plan, profile
    from dlscale.predict.links import link
    from dlscale.predict.model import compute_from_record

    base = gpu_record()  # 64 / 400 = 0.16 s per step
    # contention (0.11+0.02)/(0.1+0.02); at that contention the model gives 1x2 736.3/s with free overlap and
    # 732.1/s with none over PCIe Gen4 (46.8 MB of gradients, 1.5 ms per step): 734.0/s is in between
    two = gpu_record(per_node=2, throughput=734.0, forward=0.11)
    with Store.open(str(db_path)) as s:
        s.insert(base)
        s.insert(two)
    r = cli("predict", "--from", base.run_id, "--layouts", "1x2,2x2", "--intra", "pcie4", "--inter", "100gbe",
            "--format", "json")
    assert r.code == 0, r.stderr
    docs = {d["config"]["nodes"]: d for d in json.loads(r.stdout)}
    prof = profile("resnet18", "bf16", {"image_size": 64})
    compute = compute_from_record(base, prof.backward_ratio)
    cost, c, _ = fit_overlap(compute, bucket_plan(prof.grads), 2, link("pcie4"), 128 / 734.0, 0.13 / 0.12)
    assert 0.4 < cost < 0.7 and c == pytest.approx(0.13 / 0.12)
    for d in docs.values():
        assert d["config"]["overlap_cost"] == pytest.approx(cost) and d["config"]["overlap_fitted_from"] == two.run_id
    assert docs[1]["metrics"]["throughput"] == pytest.approx(734.0, rel=1e-6)  # the layout it was fitted from
    assert any("fitted, not predicted" in n for n in docs[1]["raw"]["notes"])
    assert docs[2]["metrics"]["overlap_loss"] > 0
    given = json.loads(cli("predict", "--from", base.run_id, "--layouts", "2x2", "--intra", "pcie4", "--inter",
                           "100gbe", "--overlap-cost", "0", "--format", "json").stdout)[0]
    assert given["config"]["overlap_fitted_from"] is None and given["metrics"]["overlap_loss"] == 0.0
    assert given["metrics"]["throughput"] > docs[2]["metrics"]["throughput"]


def test_new_options_refuse_bad_values_in_one_line(cli, db_path, store_with_runs):
    run = store_with_runs.run_id
    for args, words in [(["--overlap-cost", "1.5"], "--overlap-cost"), (["--nics-per-node", "0"], "--nics-per-node"),
                        (["--inter", "measured:1gbit", "--nics-per-node", "8"], "drop --nics-per-node")]:
        r = cli("predict", "--from", run, "--layouts", "2x1", "--inter", "1gbit", *args)
        assert r.code == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert words in r.stderr, (args, r.stderr)


def test_find_unused_parameters_and_nics_reach_the_record(cli, db_path, store_with_runs):
    run = store_with_runs.run_id
    (plain,) = json.loads(cli("predict", "--from", run, "--layouts", "2x2", "--intra", "10gbit", "--inter", "1gbit",
                              "--algorithm", "hierarchical", "--format", "json").stdout)
    (rails,) = json.loads(cli("predict", "--from", run, "--layouts", "2x2", "--intra", "10gbit", "--inter", "1gbit",
                              "--algorithm", "hierarchical", "--nics-per-node", "2", "--find-unused-parameters",
                              "--format", "json").stdout)
    assert plain["config"]["buckets_rebuilt"] and not plain["config"]["find_unused_parameters"]
    assert not rails["config"]["buckets_rebuilt"] and rails["config"]["nics_per_node"] == 2
    assert rails["metrics"]["inter_node_efficiency"] > plain["metrics"]["inter_node_efficiency"]
