"""The ranks meeting before their process group: addresses moved off loopback, pairs tried, failures shared."""

import json
import socket
import threading
import time

import pytest

from dlscale.distributed import peers
from dlscale.distributed.env import DistEnv
from dlscale.errors import RunFailure, UsageError


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """This process's join count and store, as a rank in its seventh join would have them."""
    monkeypatch.setattr(peers, "_state", {"store": None, "gen": 7})


def entry(rank, node, address, set_by="dlscale", how="route to MASTER_ADDR n0 (10.0.0.1)", interface="eth0",
          port=None, token="t", host=None):
    return {"rank": rank, "node": node, "host": host or f"n{node}", "interface": interface, "address": address,
            "set_by": set_by, "how": how, "loopback": address is not None and address.startswith("127."),
            "port": port, "token": token}


def dist_env(rank, node=None, world=2, nnodes=2):
    return DistEnv(rank=rank, local_rank=0, world_size=world, local_world_size=world // nnodes,
                   node_rank=rank if node is None else node, nnodes=nnodes, master_addr="n0", master_port=29500,
                   launcher="torchrun")


def test_a_loopback_route_to_the_master_moves_to_a_rank_of_another_node():
    # Debian's /etc/hosts on n0 puts n0 on 127.0.1.1: n0's ranks route MASTER_ADDR n0 to lo.
    entries = {0: entry(0, 0, "127.0.0.1", interface="lo"), 1: entry(1, 0, "127.0.0.1", interface="lo"),
               2: entry(2, 1, "10.0.0.2"), 3: entry(3, 1, "10.0.0.2")}
    moved = peers._to_move(entries, nnodes=2)
    assert {r: e["rank"] for r, e in moved.items()} == {0: 2, 1: 2}


def test_loopback_stays_where_it_is_right_or_the_users():
    one_node = {0: entry(0, 0, "127.0.0.1"), 1: entry(1, 0, "127.0.0.1")}
    assert peers._to_move(one_node, nnodes=1) == {}
    all_loopback = {0: entry(0, 0, "127.0.0.1"), 1: entry(1, 1, "127.0.0.1")}  # two "nodes" on one host
    assert peers._to_move(all_loopback, nnodes=2) == {}
    users = {0: entry(0, 0, "127.0.0.1", set_by="user"), 1: entry(1, 1, "10.0.0.2")}
    assert peers._to_move(users, nnodes=2) == {}


@pytest.fixture
def listeners():
    made = []

    def make(address="127.0.0.1"):
        made.append(peers._Listener(address))
        return made[-1]

    yield make
    for x in made:
        x.close()


def test_one_rank_per_node_and_address_tries_every_other(listeners):
    a, b = listeners(), listeners()
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
    entries = {0: entry(0, 0, "127.0.0.1", port=a.port, token=a.token),
               1: entry(1, 0, "127.0.0.1", port=a.port, token=a.token),  # same node and address as rank 0
               2: entry(2, 1, "127.0.0.1", port=b.port, token=b.token),
               3: entry(3, 2, "127.0.0.1", port=dead, token="x"),
               4: entry(4, 3, "127.0.0.1", port=b.port, token="not b's")}  # another process answers there
    assert peers._probe(1, entries) == []  # not the first of its node and address: rank 0 tries for it
    got = {f["to"]: f for f in peers._probe(0, entries)}
    assert set(got) == {3, 4}  # rank 2 answered with its token
    assert got[3]["error"] == "Connection refused" and got[3]["at"] == f"127.0.0.1:{dead}"
    assert got[4]["error"] == "another process answers there, not rank 4"


def room(store, rank, deadline_s=120.0, world=2):
    return peers._Room(store, dist_env(rank, world=world), time.monotonic() + deadline_s)


def test_gather_returns_every_ranks_entry_once_all_published():
    import torch.distributed as dist

    store = dist.HashStore()
    r0, r1 = room(store, 0), room(store, 1)
    r0.publish("a", entry(0, 0, "10.0.0.1"))
    r1.publish("a", entry(1, 1, "10.0.0.2"))
    got = r0.gather("a", 2)
    assert sorted(got) == [0, 1] and got[1]["address"] == "10.0.0.2"


def test_a_failed_rank_ends_the_others_wait_at_once():
    import torch.distributed as dist

    store = dist.HashStore()
    r0 = room(store, 0, deadline_s=600)  # the old way: waiting to the job's timeout
    peers._state["store"] = store
    fail = dist_env(1)

    def rank1_fails():
        time.sleep(0.3)
        peers.publish_failure(fail, "RuntimeError: Gloo connectFullMesh failed", "error")

    t = threading.Thread(target=rank1_fails)
    t.start()
    try:
        with pytest.raises(peers.PeerFailed, match=r"^rank 1 \(node 1, .*\) failed: RuntimeError: Gloo connectFullMesh"):
            r0.gather("a", 2)
    finally:
        t.join()


def test_a_peers_bad_input_is_bad_input_here_and_its_own_failure_is_not_news():
    import torch.distributed as dist

    store = dist.HashStore()
    store.append("dlscale/j7/failed", json.dumps({"rank": 0, "node": 0, "host": "n0", "cause": "mine",
                                                  "kind": "error", "time": 1.0}) + "\n")
    r0 = room(store, 0, deadline_s=0)
    with pytest.raises(TimeoutError):  # its own failure does not end rank 0's wait; the deadline does
        r0.gather("a", 2)
    store.append("dlscale/j7/failed", json.dumps({"rank": 1, "node": 1, "host": "n1", "kind": "usage", "time": 2.0,
                                                  "cause": "GLOO_SOCKET_IFNAME=eth9 names no interface"}) + "\n")
    with pytest.raises(UsageError, match=r"^rank 1 \(node 1, n1\): GLOO_SOCKET_IFNAME=eth9"):
        r0.gather("a", 2)


def test_the_deadline_names_the_ranks_that_never_came():
    import torch.distributed as dist

    store = dist.HashStore()
    r0 = room(store, 0, deadline_s=-1, world=4)
    r0.publish("a", entry(0, 0, "10.0.0.1"))
    with pytest.raises(TimeoutError, match=r"timed out waiting for ranks 1, 2, 3 to join the job"):
        r0.gather("a", 4)


def test_a_lost_store_ends_the_wait_naming_it():
    class Gone:
        def add(self, key, n):
            raise RuntimeError("Connection reset by peer")

    with pytest.raises(peers.PeerFailed, match=r"lost the job's store at n0:29500 \(Connection reset by peer\)"):
        room(Gone(), 1).gather("a", 2)


def test_the_unreachable_line_names_the_pair_the_cause_and_every_address():
    entries = {0: entry(0, 0, "127.0.0.1", set_by="user", how="GLOO_SOCKET_IFNAME=lo", interface="lo", port=4242),
               1: entry(1, 1, "127.0.0.1", set_by="user", how="GLOO_SOCKET_IFNAME=lo", interface="lo", port=4343)}
    failed = [{"from": 1, "to": 0, "at": "127.0.0.1:4242", "error": "Connection refused"},
              {"from": 0, "to": 1, "at": "127.0.0.1:4343", "error": "Connection refused"}]
    line = peers.unreachable_line(failed, entries, "gloo")
    assert line.startswith("ranks cannot reach each other: rank 0 (node 0, n0) could not connect to rank 1 "
                           "(node 1, n1) at 127.0.0.1:4343: Connection refused (and 1 more pair(s)); ")
    assert ("advertised: node 0 (n0) 127.0.0.1 on lo (set by the user: GLOO_SOCKET_IFNAME=lo), "
            "node 1 (n1) 127.0.0.1 on lo (set by the user: GLOO_SOCKET_IFNAME=lo)") in line
    assert "unset it for dlscale to take the route to MASTER_ADDR" in line and "\n" not in line
    derived = {r: {**e, "set_by": "dlscale", "how": "route to MASTER_ADDR n0"} for r, e in entries.items()}
    assert peers.unreachable_line(failed[:1], derived, "nccl").endswith(
        "dlscale took each node's route to MASTER_ADDR: set NCCL_SOCKET_IFNAME to each node's interface towards the others")


def test_addresses_per_node_ranks_where_a_node_differs_and_a_cap():
    same = [entry(r, r // 2, f"10.0.0.{r // 2 + 1}") for r in range(4)]
    assert peers.addresses(same) == ("node 0 (n0) 10.0.0.1 on eth0 (route to MASTER_ADDR n0 (10.0.0.1)), "
                                     "node 1 (n1) 10.0.0.2 on eth0 (route to MASTER_ADDR n0 (10.0.0.1))")
    split = [entry(0, 0, "10.0.0.1"), entry(1, 0, "192.168.0.1", interface="ib0")]
    assert peers.addresses(split).startswith("rank 0 (node 0, n0) 10.0.0.1 on eth0 (")
    assert "rank 1 (node 0, n0) 192.168.0.1 on ib0 (" in peers.addresses(split)
    many = [entry(r, r, f"10.0.0.{r + 1}") for r in range(peers.SHOWN_NODES + 3)]
    assert peers.addresses(many).endswith(" and 3 more node(s)")


def test_a_failure_before_the_store_was_reached_reaches_it_the_way_join_would(monkeypatch):
    import torch.distributed as dist

    store = dist.HashStore()
    seen = []
    monkeypatch.setattr(peers, "_state", {"store": None, "gen": 0})  # this process has not joined yet
    monkeypatch.setattr(peers, "_connect", lambda env: seen.append(env.rank) or store)
    peers.publish_failure(dist_env(1), "ValueError: no data on this node", "error")
    (f,) = [json.loads(x) for x in store.get("dlscale/j1/failed").decode().splitlines()]  # the join it would make
    assert seen == [1] and (f["rank"], f["node"], f["kind"], f["cause"]) == (1, 1, "error", "ValueError: no data on this node")


def test_in_place_a_rank_that_fails_before_any_record_tells_the_others_and_rank_0_records(monkeypatch, db_path):
    from dlscale.distributed import job
    from dlscale.layout import Layout
    from dlscale.store import Store

    told = []
    monkeypatch.setattr(peers, "publish_failure", lambda env, cause, kind: told.append((env.rank, cause, kind)))

    def fails(spec, env):
        raise RuntimeError("Gloo connectFullMesh failed")

    monkeypatch.setattr(job, "rank_function", lambda family: fails)
    with pytest.raises(RunFailure, match=r"^rank 1 \(node 1\): Gloo connectFullMesh failed$"):
        job.run_in_place("train", {"model": "tinycnn"}, Layout(), str(db_path), dist_env(1))
    with pytest.raises(RunFailure, match=r"^run \S+ failed: Gloo connectFullMesh failed$") as e:
        job.run_in_place("train", {"model": "tinycnn"}, Layout(), str(db_path), dist_env(0))
    assert told == [(1, "Gloo connectFullMesh failed", "error"), (0, "Gloo connectFullMesh failed", "error")]
    with Store.open(db_path) as s:
        rec = s.get(e.value.run_id)
    assert rec.status == "failed" and rec.error == "Gloo connectFullMesh failed"


def test_in_place_rank_0_records_with_a_failure_every_ranks_address_as_the_ranks_met(monkeypatch, db_path):
    from dlscale.distributed import job
    from dlscale.layout import Layout
    from dlscale.store import Store

    met = [{"rank": r, "node": r, "host": f"n{r}", "interface": "lo", "address": "127.0.0.1", "set_by": "user",
            "how": "GLOO_SOCKET_IFNAME=lo"} for r in range(2)]
    monkeypatch.setattr(peers, "publish_failure", lambda env, cause, kind: None)
    monkeypatch.setattr(peers, "JOINED", met)

    def unreachable(spec, env):
        raise peers.Unreachable("ranks cannot reach each other: rank 0 (node 0, n0) could not connect to ...")

    monkeypatch.setattr(job, "rank_function", lambda family: unreachable)
    with pytest.raises(RunFailure) as e:
        job.run_in_place("train", {"model": "tinycnn"}, Layout(), str(db_path), dist_env(0))
    with Store.open(db_path) as s:
        rec = s.get(e.value.run_id)
    assert rec.status == "failed" and rec.error.startswith("ranks cannot reach each other: rank 0")
    assert rec.config["rank_network"] == met


def published(store, rank, node, cause, kind, t):
    store.append("dlscale/j7/failed", json.dumps({"rank": rank, "node": node, "host": f"n{node}", "cause": cause,
                                                  "kind": kind, "time": t}) + "\n")


def test_a_lost_connection_is_explained_by_the_failure_published_on_another_node(tmp_path, monkeypatch):
    import torch.distributed as dist

    from dlscale.distributed import faults

    store = dist.HashStore()
    peers._state["store"] = store
    published(store, 2, 1, "RuntimeError: Connection reset by peer", "peer", 3.0)
    published(store, 1, 1, "out of memory: CUDA out of memory; lower --batch-size or --image-size", "error", 2.0)
    published(store, 0, 0, "mine", "peer", 4.0)
    elsewhere = peers.failures_elsewhere(0)
    assert [f["rank"] for f in elsewhere] == [1, 2] and store.timeout.total_seconds() == 300  # its own timeout back
    # node 0's job directory: rank 0's own report, then what node 1's ranks published
    faults.write_failure(str(tmp_path), 0, 0, "RuntimeError: Connection closed by peer [10.0.0.2]:4242")
    faults.note_elsewhere(str(tmp_path), elsewhere + [{"rank": 0, "node": 0, "cause": "x", "kind": "error", "time": 0}])
    failures = faults.read_failures(str(tmp_path))
    assert [f["rank"] for f in failures] == [1, 2, 0] and failures[-1]["cause"].startswith("RuntimeError: Connection closed")
    assert faults.diagnose(failures, 4) == ("rank 1 (node 1) failed: out of memory: CUDA out of memory; lower "
                                            "--batch-size or --image-size")


def test_in_place_rank_0s_record_names_the_other_nodes_cause_not_its_lost_connection(monkeypatch, db_path):
    import torch.distributed as dist

    from dlscale.distributed import job
    from dlscale.layout import Layout
    from dlscale.record import RunRecord
    from dlscale.store import Store

    store = dist.HashStore()
    peers._state["store"] = store
    published(store, 1, 1, "ValueError: bad shard on n1", "error", 1.0)
    with Store.open(db_path) as s:  # what execute recorded on rank 0: its own symptom
        rec = RunRecord(kind="train", workload="tinycnn", config={}, system={})
        rec.fail("RuntimeError: Connection closed by peer [10.77.0.2]:4242")
        s.insert(rec)

    def fails(spec, env):
        raise RunFailure(f"run {rec.run_id} failed", run_id=rec.run_id) from RuntimeError("Connection closed by peer")

    monkeypatch.setattr(job, "rank_function", lambda family: fails)
    with pytest.raises(RunFailure, match=r"failed: rank 1 \(node 1\) failed: ValueError: bad shard on n1$"):
        job.run_in_place("train", {"model": "tinycnn"}, Layout(), str(db_path), dist_env(0))
    with Store.open(db_path) as s:
        assert s.get(rec.run_id).error == "rank 1 (node 1) failed: ValueError: bad shard on n1"


def test_a_ranks_failure_handler_tells_the_store_and_keeps_the_other_nodes_cause(tmp_path, monkeypatch):
    import os

    import torch.distributed as dist

    from dlscale.distributed import faults, rank
    from dlscale.distributed.job import RankSpec

    store = dist.HashStore()
    peers._state["store"] = store
    published(store, 1, 1, "ValueError: bad shard on n1", "error", 1.0)
    monkeypatch.setattr(os, "_exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    spec = RankSpec(family="train", config={}, job_dir=str(tmp_path))
    with pytest.raises(SystemExit):
        rank._fail(spec, dist_env(0), RuntimeError("Connection closed by peer [10.77.0.2]:4242"))
    assert [(f["rank"], f["kind"]) for f in peers.failures_elsewhere(1)] == [(0, "peer")]  # told the others
    assert faults.diagnose(faults.read_failures(str(tmp_path)), 2) == "rank 1 (node 1) failed: ValueError: bad shard on n1"


def test_a_silent_address_is_no_answer_within_the_probe_time(monkeypatch):
    def silent(address, timeout):
        assert timeout == peers.PROBE_S
        raise socket.timeout("timed out")

    monkeypatch.setattr(socket, "create_connection", silent)
    assert peers._try(entry(1, 1, "10.77.0.9", port=4242)) == f"no answer within {peers.PROBE_S:g} s"
