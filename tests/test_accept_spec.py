"""The acceptance spec (YAML, file:line errors) and the suite's plan on GPU servers, CPU machines and
under launchers (a ``MachineFacts`` built by hand: nothing here depends on this machine's devices)."""

from __future__ import annotations

import pytest

from dlscale.accept.plan import spec
from dlscale.accept.plan import suite
from dlscale.errors import UsageError

CPU = suite.MachineFacts(gpus=0, isa={"avx2": True})
GPU8 = suite.MachineFacts(gpus=8, capability=(9, 0))
SRUN = suite.MachineFacts(gpus=8, capability=(9, 0), launcher="srun", world_size=16, nodes=2)


def write(tmp_path, text):
    p = tmp_path / "node.yaml"
    p.write_text(text)
    return p


def test_a_spec_loads_with_its_thresholds(tmp_path):
    p = write(tmp_path, "name: node7\nchecks:\n  gemm: {precision: [fp32], fail: 0.2}\n  train_alone:\n"
                        "    model: tinycnn\n    steps: 5\nthresholds: {warn: 0.03, alpha: 0.05}\npeers: {fail: 0.15}\n"
                        "warn_fails: true\n")
    sp = spec.load(p)
    assert sp.name == "node7" and list(sp.checks) == ["gemm", "train_alone"]
    assert sp.checks["gemm"] == {"precision": ["fp32"]}
    assert (sp.thresholds.warn, sp.thresholds.fail, sp.thresholds.alpha) == (0.03, 0.10, 0.05)
    assert (sp.per_check["gemm"].fail, sp.per_check["gemm"].alpha) == (0.2, 0.05)
    assert (sp.peers.warn, sp.peers.fail) == (0.05, 0.15) and sp.warn_fails


@pytest.mark.parametrize("text, where, words", [
    ("checks:\n  gemm: {}\n  bogus: {}\n", ":3:", "unknown check 'bogus'"),
    ("checks:\n  gemm:\n    precision: [fp32]\n    nproc_per_node: 2\n", ":4:", "micro gemm does not read nproc_per_node"),
    ("checks:\n  train:\n    model: tinycnn\n    steps: -3\n", ":4:", "--steps must be > 0"),
    ("checks:\n  train_alone:\n    model: tinycnn\n    parallel: ddp\n", ":4:", "train_alone sets parallel itself"),
    ("checks:\n  gemm: {}\nthresholds: {warn: 0.2, fail: 0.1}\n", ":3:", "need 0 <= warn <= fail < 1"),
    ("checks:\n  gemm: {}\nthreshold: {}\n", ":3:", "unknown field 'threshold'"),
    ("checks:\n  scale:\n    model: tinycnn\n    devices: [0, 2]\n", ":4:", "device counts >= 1"),
    ("checks:\n  memory:\n    mem_mib: lots\n", ":3:", "expected an integer"),
    ("checks: [gemm]\n", ":1:", "must map check names"),
])
def test_a_bad_spec_names_its_line(tmp_path, text, where, words):
    p = write(tmp_path, text)
    with pytest.raises(UsageError) as e:
        suite.plan(spec.load(p), quick=True, m=CPU)
    assert f"{p}{where}" in str(e.value) and words in str(e.value), str(e.value)


def test_the_builtin_specs_plan_on_a_cpu_machine():
    full = suite.plan(spec.builtin(False), quick=False, m=CPU)
    ran = [p.check for p in full.checks]
    assert "health" not in ran and "p2p" not in ran
    assert dict(full.not_run)["p2p"] == "needs at least 2 GPUs; this machine has 0"
    quick = suite.plan(spec.builtin(True), quick=True, m=CPU)
    assert [p.check for p in quick.checks] == ["inventory", "memory", "gemm", "collectives", "train_alone", "train",
                                               "inference"]
    train_alone = next(p for p in quick.checks if p.check == "train_alone")
    cfg, layout = train_alone.configs
    assert cfg.parallel == "none" and layout.nproc_per_node == 2 and layout.threads_per_rank == 1
    inference = next(p for p in quick.checks if p.check == "inference").configs[0]
    assert inference.scenario == "offline"


def test_the_builtin_spec_plans_on_an_8_gpu_server():
    plan = suite.plan(spec.builtin(False), quick=False, m=GPU8)
    by = {p.check: p for p in plan.checks}
    assert set(by) == {"health", "inventory", "memory", "p2p", "gemm", "collectives", "train_alone", "train", "scale",
                       "inference", "burnin"}  # level 3: everything, the burn-in too
    assert "srun" in dict(plan.not_run)["collectives_nodes"]
    assert by["gemm"].configs[0].precisions == ("fp32", "tf32", "bf16", "fp16")
    assert by["collectives"].configs[1].nproc_per_node == 8
    assert by["scale"].options["devices"] == [1, 2, 4, 8]
    v100 = suite.plan(spec.builtin(True), quick=True, m=suite.MachineFacts(gpus=8, capability=(7, 0)))
    assert next(p for p in v100.checks if p.check == "train").configs[0].precision == "fp16"  # no bf16 before Ampere


def test_under_a_launcher_only_the_checks_across_ranks_run():
    plan = suite.plan(spec.builtin(False), quick=False, m=SRUN)
    assert [p.check for p in plan.checks] == ["collectives_nodes", "links", "train_alone", "train"]
    quick = suite.plan(spec.builtin(True), quick=True, m=SRUN)  # across nodes, quick runs what crosses them too
    assert [p.check for p in quick.checks] == ["collectives_nodes", "links", "train_alone", "train"]
    one = suite.MachineFacts(gpus=8, capability=(9, 0), launcher="torchrun", world_size=8, nodes=1)
    assert dict(suite.plan(spec.builtin(False), quick=False, m=one).not_run)["links"] == \
        "torchrun started one node: nothing crosses a node"
    assert "links" not in {c for c, _ in suite.plan(spec.builtin(True), quick=True, m=one).not_run}
    lay = next(p for p in plan.checks if p.check == "train").configs[1]
    assert not lay.force and lay.nproc_per_node == 1  # the launcher's world, not one of dlscale's
    assert "per-node checks" in dict(plan.not_run)["gemm"]


def test_no_emulation_leaves_the_cross_node_collectives_out_with_the_reason():
    m = suite.MachineFacts(gpus=0, no_emulation="emulated nodes need root")
    plan = suite.plan(spec.builtin(False), quick=False, m=m)
    assert dict(plan.not_run)["collectives_nodes"] == "emulated nodes unavailable here: emulated nodes need root"


NODES = suite.EmulatedNodes(3, "1gbit", node_link_bandwidth="2=100mbit", node_cpu_quota=["1=0.5"])


def test_emulated_nodes_lay_out_every_check_on_nodes():
    plan = suite.plan(spec.builtin(True), quick=True, m=CPU, nodes=NODES)
    by = {p.check: p for p in plan.checks}
    assert list(by) == ["inventory", "memory", "gemm", "collectives", "collectives_nodes", "links", "train_alone",
                        "train", "inference"]
    for check in ("collectives_nodes", "links", "train_alone", "train"):
        lay = by[check].configs[-1]
        assert (lay.emulate_nodes, lay.link_bandwidth, lay.nproc_per_node) == (3, "1gbit", 1), check
        assert lay.node_link_bandwidth == ((2, "100mbit"),) and lay.node_cpu_quota == ((1, 0.5),), check
    assert by["collectives"].configs[1].emulate_nodes is None  # in the node: one node
    assert by["train_alone"].configs[0].parallel == "none"
    full = {p.check: p for p in suite.plan(spec.builtin(False), quick=False, m=CPU, nodes=NODES).checks}
    assert full["scale"].options["layouts"] == ["2x1", "3x1"] and full["scale"].options["node_cpu_quota"] == "1=0.5"
    # the spec's own options over the machine's defaults, the command line's nodes over both
    p = spec.Spec("s", {"train": {"model": "tinycnn", "nproc_per_node": 2, "emulate_nodes": 2}})
    (train,) = suite.plan(p, quick=True, m=CPU, nodes=NODES).checks
    assert (train.configs[1].nproc_per_node, train.configs[1].emulate_nodes) == (2, 3)


def test_a_node_set_apart_is_the_machines_state_not_the_suite():
    from dlscale.accept.acceptance import hash_of

    healthy = suite.plan(spec.builtin(True), quick=True, m=CPU, nodes=suite.EmulatedNodes(3, "1gbit"))
    faulty = suite.plan(spec.builtin(True), quick=True, m=CPU, nodes=NODES)
    other = suite.plan(spec.builtin(True), quick=True, m=CPU, nodes=suite.EmulatedNodes(3, "10gbit"))
    assert hash_of(healthy.checks) == hash_of(faulty.checks) != hash_of(other.checks)


@pytest.mark.parametrize("nodes, m, words", [
    (dict(node_cpu_quota="1=0.5"), CPU, "add --emulate-nodes K"),
    (dict(emulate_nodes=2, node_link_bandwidth="3=1gbit"), CPU, "names node 3, but --emulate-nodes 2 has nodes 0..1"),
    (dict(emulate_nodes=1), CPU, "need at least 2 nodes"),
    (dict(emulate_nodes=2, link_bandwidth="fast"), CPU, "fast"),
    (dict(emulate_nodes=2), SRUN, "under srun the nodes are the launcher's"),
    (dict(emulate_nodes=2), suite.MachineFacts(no_emulation="network namespaces need root"), "need root"),
    (dict(emulate_nodes=2, node_cpu_quota="1=0.5"), suite.MachineFacts(no_quota="CPU quotas need root"), "quotas need root"),
])
def test_bad_nodes_are_refused_before_anything_runs(nodes, m, words):
    with pytest.raises(UsageError, match=words):
        suite.plan(spec.builtin(True), quick=True, m=m, nodes=suite.EmulatedNodes(**nodes))


def test_nodes_with_no_check_on_nodes_are_refused(tmp_path):
    with pytest.raises(UsageError, match="has no check that runs on nodes"):
        suite.plan(spec.load(write(tmp_path, "checks:\n  gemm: {}\n")), quick=True, m=CPU, nodes=suite.EmulatedNodes(2))


def test_cli_refuses_bad_nodes_with_one_line(cli, db_path):
    r = cli("accept", "--quick", "--emulate-nodes", "2", "--node-cpu-quota", "5=0.5")
    assert r.code == 2 and "--node-cpu-quota names node 5" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("accept", "verify", "x", "--emulate-nodes", "2")
    assert r.code == 2 and "runs nothing" in r.stderr


def test_every_check_on_nodes_is_called_with_the_nodes(monkeypatch):
    from dlscale import api

    calls = {}
    monkeypatch.setattr(api, "scale", lambda model, **kw: calls.setdefault("scale", kw) and [])
    monkeypatch.setattr(api, "micro", lambda kind, **kw: calls.setdefault(kind, kw) and [])
    monkeypatch.setattr(api, "train", lambda **kw: calls.setdefault(kw["config"].parallel, kw["layout"]) and [])
    plan = {p.check: p for p in suite.plan(spec.builtin(False), quick=False, m=CPU, nodes=NODES).checks}
    for check in ("collectives_nodes", "links", "train_alone", "train", "scale"):
        suite.run_check(plan[check], "acc", None)
    assert calls["scale"]["layouts"] == [(2, 1), (3, 1)] and calls["scale"]["emulate_nodes"] == 3
    assert calls["scale"]["node_cpu_quota"] == ((1, 0.5),) and calls["scale"]["node_link_bandwidth"] == ((2, "100mbit"),)
    for lay in (calls["collectives"]["layout"], calls["links"]["layout"], calls["none"], calls["ddp"]):
        assert (lay.emulate_nodes, lay.node_cpu_quota, lay.node_link_bandwidth) == (3, ((1, 0.5),), ((2, "100mbit"),))


def test_a_checks_price_reaches_its_runs_and_a_bad_one_is_refused_at_its_line(monkeypatch, tmp_path):
    from dlscale import api

    calls = {}
    monkeypatch.setattr(api, "train", lambda **kw: calls.setdefault("train", kw) and [])
    monkeypatch.setattr(api, "micro", lambda kind, **kw: calls.setdefault(kind, kw) and [])
    monkeypatch.setattr(api, "infer", lambda **kw: calls.setdefault("infer", kw) and [])
    sp = spec.load(write(tmp_path, "checks:\n  train: {model: tinycnn, price_per_hour: 2.5}\n  gemm: {}\n"
                                   "  inference: {price_per_hour: 1.25}\n"))
    plan = {p.check: p for p in suite.plan(sp, quick=True, m=CPU).checks}
    for check in ("train", "gemm", "inference"):
        suite.run_check(plan[check], "acc", None)
    assert calls["train"]["price"].per_hour == 2.5 and calls["infer"]["price"].per_hour == 1.25
    assert calls["gemm"]["price"] is None  # no price given: none recorded
    with pytest.raises(UsageError, match=r"node.yaml:3:.*finite price per device-hour > 0, got inf"):
        suite.plan(spec.load(write(tmp_path, "checks:\n  train:\n    price_per_hour: .inf\n")), quick=True, m=CPU)


def test_a_specs_ddp_options_reach_its_runs_and_train_is_held_to_the_acceptances_train_alone(monkeypatch, tmp_path,
                                                                                            db_path):
    from dlscale import api
    from dlscale.record import RunRecord
    from dlscale.store import Store

    calls = {}
    monkeypatch.setattr(api, "train", lambda **kw: calls.setdefault("train", kw) and [])
    monkeypatch.setattr(api, "scale", lambda model, **kw: calls.setdefault("scale", kw) and [])
    sp = spec.load(write(tmp_path, "checks:\n  train: {model: tinycnn, ddp_broadcast_buffers: true, "
                                   "ddp_grad_as_bucket_view: false, ddp_bucket_mb: 5}\n"
                                   "  scale: {model: tinycnn, ddp_broadcast_buffers: true}\n"))
    plan = {p.check: p for p in suite.plan(sp, quick=True, m=CPU).checks}
    suite.run_check(plan["train"], "acc", str(db_path))  # no train_alone recorded: the run finds its own reference
    cfg = calls.pop("train")["config"]
    assert (cfg.ddp_broadcast_buffers, cfg.ddp_grad_as_bucket_view, cfg.ddp_bucket_mb) == (True, False, 5.0)
    assert cfg.dp_reference is None
    alone = RunRecord(kind="train", workload="tinycnn", config={"parallel": "none"}, metrics={"throughput": 1.0},
                      tag="acc")
    with Store.open(db_path) as s:
        s.insert(alone)
    suite.run_check(plan["train"], "acc", str(db_path))
    assert calls["train"]["config"].dp_reference == alone.run_id
    suite.run_check(plan["scale"], "acc", str(db_path))
    assert calls["scale"]["ddp_broadcast_buffers"] is True
