"""Many nodes, for real: sweeps, acceptances, the scale ladder and faults through a Slurm of three nodes.

The cluster is dlscale.cluster's (tests/slurmcluster.py): every node in its own network namespace with
its own address and host name, joined by shaped links, one slurmd per node; skipped with the reason
where slurm-wlm, munge, iproute2 or root are missing (failed under DLSCALE_REQUIRE_SLURM=1). The
suite runs one sweep with points of two and three nodes on a session-wide cluster whose every node's
/etc/hosts is as Debian writes it (its own name on 127.0.1.1), each rank's interface and address
checked. The rest are `long` (tens of seconds each): on that cluster, ranks forced onto loopback
(they end at once on every node, the sweep's other point ok), the scale ladder's four layouts and a
job past its time limit on several nodes; each on a cluster of its own (names in the shared
/etc/hosts): an acceptance across the nodes naming the node whose link is ten times slower, a node
lost mid-job, a node the health check drains. After each, no process of a job is left on any node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest

from conftest import wait_until
from dlscale.store import Store
from dlscale.sweep import spec, squeue

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TINY = "fixed: {model: tinycnn, image_size: 32, batch_size: 8, warmup_steps: 1, steps: 5, threads_per_rank: 1}\n"


def dlscale(cluster, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, **cluster.env(), squeue.POLL_ENV: "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "dlscale.cli.app", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


def records(db: Path) -> list:
    with Store.open(db) as s:
        return s.query(newest_first=False)


def nothing_left(cluster) -> bool:
    """No process of a job on any node (only each node's slurmd in its namespace), within a few seconds."""
    return wait_until(lambda: not any(cluster.processes_on(k) for k in range(len(cluster.names))), 30, 0.5)


def hosts_of(rec) -> list[str]:
    return [d["host"] for d in rec.raw["rank_devices"]]


def job_of(db: Path, sweep: str, rec) -> dict:
    """The sweep's state file's entry for the point of ``rec``: its Slurm job id, its folder."""
    return json.loads((db.parent / "sweeps" / f"{sweep}.json").read_text())["points"][rec.raw["sweep_point"]]


def task_logs(db: Path, sweep: str, rec) -> list[str]:
    """Each node's log of the point's job (submitit's ``<job>_<task>_log.err``; task k on the job's node k)."""
    entry = job_of(db, sweep, rec)
    folder = Path(entry["folder"].replace("%j", entry["job_id"]))
    return [p.read_text() for p in sorted(folder.glob(f"{entry['job_id']}_*_log.err"),
                                          key=lambda p: int(p.name.split("_")[1]))]


def ended_at(cluster, job_id: str) -> datetime:
    """When Slurm saw the job's last task end (its EndTime, this machine's local time)."""
    p = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                       env={**os.environ, **cluster.env()})
    return datetime.fromisoformat(re.search(r"\bEndTime=(\S+)", p.stdout).group(1)).astimezone()


def check_network(rec, cluster) -> None:
    """Every rank took its node's own interface and address from the route to the master, where its
    node's /etc/hosts puts its own name on 127.0.1.1: the master's node took the route to another node's rank."""
    net = rec.config["rank_network"]
    address = dict(zip(cluster.names, cluster.addresses))
    assert [(n["rank"], n["interface"], n["address"], n["set_by"]) for n in net] == \
        [(r, "dls0", address[d["host"]], "dlscale") for r, d in enumerate(rec.raw["rank_devices"])], net
    master = net[0]["host"]  # torchrun's MASTER_ADDR: rank 0's node, by its name
    peer = next(n for n in net if n["host"] != master)
    for n in net:
        assert n["how"] == (f"route to rank {peer['rank']} ({peer['host']}, {peer['address']}); the route to MASTER_ADDR "
                            f"{master} (127.0.1.1) is loopback here" if n["host"] == master else
                            f"route to MASTER_ADDR {master} ({address[master]})"), net


@pytest.mark.slow
def test_points_of_two_and_three_nodes_run_one_rank_on_each_node(slurm_nodes, tmp_path):
    """On nodes whose /etc/hosts is as Debian writes it, each rank's interface and address recorded; the
    point's time is its job's; each node other than rank 0's says which rank and node it was."""
    f = write(tmp_path, "name: nodes\n" + TINY + "slurm: {time: 10}\nmatrix:\n  nnodes: [2, 3]\n")
    db = tmp_path / "runs.db"
    r = dlscale(slurm_nodes, "sweep", str(f), "--executor", "slurm", "--db", str(db), "--format", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    by_nodes = {rec.config["nodes"]: rec for rec in records(db)}
    assert sorted(by_nodes) == [2, 3] and all(rec.status == "ok" for rec in by_nodes.values())
    for n, rec in by_nodes.items():  # one rank per node, each on a node of its own, named as Slurm names it
        assert rec.metrics["world_size"] == n and rec.config["launcher"] == "torchrun"
        assert len(set(hosts_of(rec))) == n and set(hosts_of(rec)) <= set(slurm_nodes.names), hosts_of(rec)
        check_network(rec, slurm_nodes)
    assert set(hosts_of(by_nodes[3])) == set(slurm_nodes.names)
    for point in json.loads(r.stdout):  # Slurm's run time of the job, at least the run's own
        rec = by_nodes[point["options"]["nnodes"]]
        assert point["seconds"] >= rec.seconds > 0, (point, rec.seconds)
        assert rec.system["slurm"]["job_id"] == job_of(db, "nodes", rec)["job_id"]  # the record names its job
    net = by_nodes[3].config["rank_network"]
    logs = task_logs(db, "nodes", by_nodes[3])
    assert len(logs) == 3
    for k in (1, 2):  # off the job's first node (task k on node k): its rank and node as c10d numbered them
        rank = next(n for n in net if n["host"] == slurm_nodes.names[k])
        assert rank["rank"] == 0 or f"rank {rank['rank']} (node {rank['node']}): done (rank 0 records" in logs[k], logs[k]
    assert nothing_left(slurm_nodes)


@pytest.mark.slow
@pytest.mark.long
def test_ranks_that_cannot_reach_each_other_end_at_once_on_every_node_and_the_sweep_goes_on(slurm_nodes, tmp_path):
    """GLOO_SOCKET_IFNAME=lo forced in the jobs' environment: the three-node point's ranks advertise
    loopback. Every node's rank ends with one line naming the pair, the cause and every rank's address,
    the job well before the point's timeout_per_run; the one-node point, which loopback serves, is ok."""
    timeout_s = 600
    f = write(tmp_path, f"name: wrong-if\ntimeout_per_run: {timeout_s}\n" + TINY + "slurm: {time: 10, setup: "
                        "['export GLOO_SOCKET_IFNAME=lo']}\ninclude:\n  - {nnodes: 3}\n  - {nnodes: 1, nproc_per_node: 2}\n")
    unreachable, local = spec.load(f).points
    db = tmp_path / "runs.db"
    r = dlscale(slurm_nodes, "sweep", str(f), "--executor", "slurm", "--db", str(db), "--format", "json")
    assert r.returncode == 1 and "1 of 2 points failed" in r.stderr, r.stderr[-3000:]
    points = {p["hash"]: p for p in json.loads(r.stdout)}
    assert points[local.hash]["status"] == "ok" and points[unreachable.hash]["status"] == "failed"
    assert 0 < points[unreachable.hash]["seconds"] < timeout_s / 3, points  # the job, every node's task in it
    rec = {rec.raw["sweep_point"]: rec for rec in records(db)}[unreachable.hash]
    failed_at = datetime.fromisoformat(rec.finished_at)  # rank 0 recorded the line as the ranks met
    assert (ended_at(slurm_nodes, job_of(db, "wrong-if", rec)["job_id"]) - failed_at).total_seconds() < timeout_s / 10
    hosts = r"\(node \d, (?:" + "|".join(map(re.escape, slurm_nodes.names)) + r")\)"
    assert rec.status == "failed" and re.match(rf"ranks cannot reach each other: rank \d {hosts} could not connect to "
                                               rf"rank \d {hosts} at 127\.0\.0\.1:\d+: Connection refused", rec.error), rec.error
    assert rec.error.count("127.0.0.1 on lo (set by the user: GLOO_SOCKET_IFNAME=lo)") == 3, rec.error
    assert [(n["interface"], n["address"], n["set_by"]) for n in rec.config["rank_network"]] == \
        [("lo", "127.0.0.1", "user")] * 3
    for log in task_logs(db, "wrong-if", rec)[1:]:  # the other nodes' ranks ended with the same line
        assert "ranks cannot reach each other: rank" in log and "timed out" not in log, log[-3000:]
    assert nothing_left(slurm_nodes)


@pytest.mark.slow
@pytest.mark.long
def test_an_acceptance_across_the_nodes_names_the_node_whose_link_is_ten_times_slower(make_slurm_nodes, tmp_path,
                                                                                      db_path):
    cluster = make_slurm_nodes(3, link_bandwidth="1gbit", node_link_bandwidth="2=100mbit")
    r = dlscale(cluster, "accept", "--executor", "slurm", "--nodes", "3", "--spec", str(EXAMPLES / "accept-links.yaml"),
                "--time", "10", "--out", str(tmp_path / "out"), "--format", "json")
    assert r.returncode == 1, r.stderr[-3000:]
    verdicts = json.loads(r.stdout)["verdicts"]
    bad = [(v["check"], v["subject"]) for v in verdicts if v["status"] == "FAIL"]
    slow = f"{cluster.names[2]}'s link"
    assert bad == [("links", slow)], verdicts
    (v,) = [v for v in verdicts if v["status"] == "FAIL"]
    assert v["ratio"] < 0.3 and v["related"][0] == f"{slow} is below expectation, the other nodes' links are not"
    assert {v["subject"] for v in verdicts if v["check"] == "links" and v["status"] == "PASS"} == {
        f"{n}'s link" for n in cluster.names[:2]}
    coll = [v for v in verdicts if v["check"] == "collectives_nodes"]
    assert coll and all(v["status"] != "ERROR" for v in coll)  # the collectives across the three nodes ran
    assert nothing_left(cluster)


@pytest.mark.slow
@pytest.mark.long
def test_the_scale_ladders_layouts_run_through_slurm_and_analyse_as_one_ladder(slurm_nodes, tmp_path):
    f = write(tmp_path, "name: ladder\ntag: ladder\n" + TINY + "slurm: {cpus_per_task: 2, time: 10}\ninclude:\n"
                        "  - {nproc_per_node: 1}\n  - {nproc_per_node: 2}\n  - {nproc_per_node: 1, nnodes: 2}\n"
                        "  - {nproc_per_node: 1, nnodes: 3}\n")
    db = tmp_path / "runs.db"
    r = dlscale(slurm_nodes, "sweep", str(f), "--executor", "slurm", "--db", str(db))
    assert r.returncode == 0, r.stderr[-3000:]
    r = dlscale(slurm_nodes, "scale", "--from-store", "--tag", "ladder", "--db", str(db), "--format", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    (ladder,) = json.loads(r.stdout)["ladders"]
    rows = {row["layout"]: row for row in ladder["efficiency"]}
    assert sorted(rows) == ["1x1", "1x2", "2x1", "3x1"] and ladder["link"] == "real network"
    for layout in ("2x1", "3x1"):  # spread over nodes: efficiency against n times the 1x1 point
        row = rows[layout]
        assert row["inter_node_efficiency"] == pytest.approx(row["throughput"] / (row["nodes"] * rows["1x1"]["throughput"]))
    assert rows["1x2"]["intra_node_efficiency"] is not None
    assert nothing_left(slurm_nodes)


def _running_on(cluster, job_id: str) -> list[str]:
    p = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %N"], capture_output=True, text=True,
                       env={**os.environ, **cluster.env()})
    state, _, nodes = p.stdout.strip().partition(" ")
    from dlscale.distributed.env import expand_hostlist

    return expand_hostlist(nodes) if state == "RUNNING" and nodes else []


def _ranks_on(cluster, k: int) -> list[int]:
    from conftest import cmdline

    return [pid for pid in cluster.processes_on(k) if b"dlscale.cli.app" in cmdline(pid)
            and b"torch.distributed.run" not in cmdline(pid)]


@pytest.mark.slow
@pytest.mark.long
def test_a_node_lost_mid_job_fails_its_point_with_slurms_reason_and_resume_runs_it_again(make_slurm_nodes, tmp_path):
    cluster = make_slurm_nodes(3)
    f = write(tmp_path, "name: lost\ntag: lost\n" + TINY + "slurm: {time: 10}\ninclude:\n"
                        "  - {nnodes: 2, steps: 4000}\n  - {nnodes: 1}\n")
    lost, other = spec.load(f).points
    db, state = tmp_path / "runs.db", tmp_path / "sweeps" / "lost.json"
    result: dict = {}
    sweep = threading.Thread(target=lambda: result.update(r=dlscale(cluster, "sweep", str(f), "--executor", "slurm",
                                                                    "--db", str(db))))
    sweep.start()
    try:
        def job() -> str | None:
            return json.loads(state.read_text())["points"][lost.hash]["job_id"] if state.exists() else None

        assert wait_until(lambda: job() and len(_running_on(cluster, job())) == 2, 120), "the 2-node job never ran"
        victim = cluster.names.index(_running_on(cluster, job())[1])  # not the node the point records from
        assert wait_until(lambda: _ranks_on(cluster, victim), 120), "no rank started on the second node"
        cluster.kill_node(victim)  # its slurmd, its job step, its rank: the node is gone
        sweep.join(timeout=300)
    finally:
        sweep.join(timeout=300)
    r = result["r"]
    assert r.returncode == 1 and "1 of 2 points failed" in r.stderr, r.stderr[-3000:]
    recs = {rec.raw["sweep_point"]: rec for rec in records(db)}
    assert recs[other.hash].status == "ok"  # the other point went on
    assert recs[lost.hash].status == "failed" and recs[lost.hash].raw["slurm_state"] == "NODE_FAIL"
    assert recs[lost.hash].error.startswith(f"Slurm job {recs[lost.hash].raw['slurm_job_id']} NODE_FAIL: lost a node")
    assert nothing_left(cluster)  # the surviving node's ranks ended with the job
    cluster.start_node(victim)  # the node comes back (ReturnToService=2)
    r = dlscale(cluster, "sweep", str(f), "--executor", "slurm", "--db", str(db), "--resume", "--format", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert [p["status"] for p in json.loads(r.stdout)] == ["ok", "skipped"]
    latest = [rec for rec in records(db) if rec.raw.get("sweep_point") == lost.hash]
    assert [rec.status for rec in latest] == ["failed", "ok"]  # run again in a new job, on the nodes there are
    assert nothing_left(cluster)


@pytest.mark.slow
@pytest.mark.long
def test_a_node_the_health_check_drains_gets_no_job_until_a_pass_returns_it(make_slurm_nodes, tmp_path, db_path):
    cluster = make_slurm_nodes(3)
    sick = cluster.names[2]
    too_many = write(tmp_path, f"checks:\n  inventory: {{cpus: {(os.cpu_count() or 1) + 1000}}}\n", "sick.yaml")
    try:
        cluster.set_health_check(cluster.health_check_command("--spec", str(too_many), "--drain-on-fail",
                                                              "--resume-on-pass", db=db_path), node=sick)
        assert wait_until(lambda: "DRAIN" in cluster.node_state(sick)[0], 120, 1.0), cluster.node_state(sick)
        assert cluster.node_state(sick)[1].startswith("dlscale: FAIL inventory logical CPUs: ")
        assert all("DRAIN" not in cluster.node_state(n)[0] for n in cluster.names[:2])
        f = write(tmp_path, "name: drained\n" + TINY + "slurm: {time: 10}\nmatrix:\n  nnodes: [2]\n  seed: [0, 1]\n")
        db = tmp_path / "runs.db"
        r = dlscale(cluster, "sweep", str(f), "--executor", "slurm", "--db", str(db))
        assert r.returncode == 0, r.stderr[-3000:]
        recs = records(db)
        assert len(recs) == 2 and all(set(hosts_of(rec)) == set(cluster.names[:2]) for rec in recs)
        cluster.set_health_check(cluster.health_check_command("--level", "1", "--drain-on-fail", "--resume-on-pass",
                                                              db=db_path), node=sick)
        assert wait_until(lambda: "DRAIN" not in cluster.node_state(sick)[0], 120, 1.0), cluster.node_state(sick)
        assert "resumed node" in cluster.health_log(sick).read_text()
    finally:
        cluster.set_health_check(None, node=sick)


@pytest.mark.slow
@pytest.mark.long
def test_a_job_past_its_time_limit_on_several_nodes_ends_as_a_timeout(slurm_nodes, tmp_path):
    f = write(tmp_path, "name: overtime-nodes\n" + TINY + "slurm: {time: 1}\nmatrix:\n  nnodes: [3]\n  steps: [1000000]\n")
    db = tmp_path / "runs.db"
    r = dlscale(slurm_nodes, "sweep", str(f), "--executor", "slurm", "--db", str(db))
    assert r.returncode == 1, r.stderr[-3000:]
    (rec,) = records(db)
    assert rec.status == "failed" and rec.raw["slurm_state"] == "TIMEOUT"
    assert rec.error.startswith(f"Slurm job {rec.raw['slurm_job_id']} TIMEOUT: ran past its time limit (00:01:00)")
    assert nothing_left(slurm_nodes)  # every node's torchrun and rank ended with the job
