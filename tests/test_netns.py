"""Emulated nodes: namespaces, veth + bridge, tc shaping, and their removal (also after a failure)."""

import os
import subprocess
import sys

import pytest

from conftest import FakeNodes, namespaces_left, need_system, sigint_default
from dlscale.distributed import netns
from dlscale.errors import UsageError

REASON = netns.unavailable_reason()


@pytest.fixture
def netns_available():
    """Skip where namespaces cannot be made here, or fail where DLSCALE_REQUIRE_NETNS=1 (CI)."""
    need_system("root and iproute2", None if REASON is None else f"network namespaces unavailable: {REASON}",
                "DLSCALE_REQUIRE_NETNS")


needs_netns = pytest.mark.usefixtures("netns_available")


def test_rate_and_latency_parsing():
    assert netns.parse_rate("10gbit") == 1e10
    assert netns.parse_rate("100mbit") == 1e8
    assert netns.parse_rate("1.5gbps") == 1.2e10
    assert netns.parse_latency("50us") == pytest.approx(50e-6)
    assert netns.parse_latency("2ms") == pytest.approx(2e-3)
    for bad in ("fast", "10", "-1gbit", "0gbit"):
        with pytest.raises(UsageError):
            netns.parse_rate(bad)
    with pytest.raises(UsageError):
        netns.parse_latency("soon")


def _qdiscs(ns, dev):
    return subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout


@needs_netns
def test_two_nodes_are_linked_shaped_and_removed():
    with netns.EmulatedNodes(2, "1gbit") as en:
        names = list(en.names)
        assert set(names) <= set(netns.list_namespaces())
        assert "tbf" in _qdiscs(names[0], netns.IFNAME) and "1Gbit" in _qdiscs(names[0], netns.IFNAME)
        server = subprocess.Popen(en.exec_prefix(1) + [sys.executable, "-c", (
            "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(('{en.address(1)}', 5000)); s.listen(); c, _ = s.accept(); c.sendall(b'ok')")])
        client = subprocess.run(en.exec_prefix(0) + [sys.executable, "-c", (
            "import socket, time\nfor _ in range(50):\n    try:\n"
            f"        c = socket.create_connection(('{en.address(1)}', 5000), timeout=2); break\n"
            "    except OSError: time.sleep(0.1)\nprint(c.recv(2).decode())")], capture_output=True, text=True, timeout=60)
        server.wait(timeout=30)
        assert client.stdout.strip() == "ok", client.stderr
    assert not set(names) & set(netns.list_namespaces())


@needs_netns
def test_namespaces_are_removed_after_a_failure():
    with pytest.raises(RuntimeError):
        with netns.EmulatedNodes(2) as en:
            names = list(en.names)
            raise RuntimeError("boom")
    assert not set(names) & set(netns.list_namespaces())


@needs_netns
def test_latency_without_netem_is_a_usage_error_and_leaves_nothing():
    before = set(netns.list_namespaces())
    has_netem = subprocess.run(["sh", "-c", "grep -qw sch_netem /proc/modules || modinfo sch_netem"],
                               capture_output=True).returncode == 0
    if has_netem:
        with netns.EmulatedNodes(2, "1gbit", "50us") as en:
            assert "netem" in _qdiscs(en.names[0], netns.IFNAME)
    else:
        with pytest.raises(UsageError, match="netem"):
            with netns.EmulatedNodes(2, "1gbit", "50us"):
                pass
    assert namespaces_left(before) == []


@needs_netns
def test_stale_namespaces_of_a_dead_process_are_removed():
    dead = 2**22 + 12345  # above the kernel's pid_max default: no such process
    ns = f"{netns.PREFIX}{dead}-test-n0"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        assert ns in netns.cleanup_stale()
        assert ns not in netns.list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@needs_netns
@pytest.mark.slow
def test_emulated_two_node_run(cli_subprocess, db_path):
    import json

    before = set(netns.list_namespaces())
    res = cli_subprocess("train", "tinycnn", "-b", "8", "--warmup-steps", "2", "--steps", "5", "--device", "cpu",
                         "--emulate-nodes", "2", "--link-bandwidth", "1gbit", "--timeout", "120", "--format", "json")
    assert res.code == 0, res.stderr[-3000:]
    rec = json.loads(res.stdout)
    c = rec["config"]
    assert (c["nodes"], c["devices_per_node"], c["world_size"], c["emulated_nodes"], c["link_bandwidth"]) == \
        (2, 1, 2, True, "1gbit")
    assert rec["metrics"]["nodes"] == 2 and rec["metrics"]["comm_fraction"] > 0
    # each node's gloo on dls0, from the route to the master (node 0's own address there)
    assert [(n["node"], n["interface"], n["address"], n["set_by"]) for n in c["rank_network"]] == \
        [(0, netns.IFNAME, "10.77.0.1", "dlscale"), (1, netns.IFNAME, "10.77.0.2", "dlscale")]
    assert namespaces_left(before) == [], "namespaces left behind"


def test_unavailable_reason_names_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in netns.unavailable_reason()


@needs_netns
@pytest.mark.slow
def test_ctrl_c_removes_namespaces_and_processes(db_path):
    import signal
    import time

    import psutil

    from dlscale.store import Store

    env = {**os.environ, "DLSCALE_DB": str(db_path), "PYTHONFAULTHANDLER": "1"}
    family: list = []
    p = subprocess.Popen([sys.executable, "-m", "dlscale.cli.app", "train", "tinycnn", "-b", "8", "--steps", "100000",
                          "--device", "cpu", "--emulate-nodes", "2", "--tag", "ctrlc"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=sigint_default)
    try:
        mine = f"{netns.PREFIX}{p.pid}-"
        def ranks() -> int:  # both nodes' ranks are up (each rank runs the dlscale.distributed.rank module)
            found = 0
            for q in psutil.Process(p.pid).children(recursive=True):
                try:
                    cmd = " ".join(q.cmdline())  # a rank, not the torchrun that starts it with the same arguments
                    found += "dlscale.distributed.rank" in cmd and "torch.distributed.run" not in cmd
                except psutil.Error:
                    pass
            return found

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and ranks() < 2:
            time.sleep(0.2)
        assert ranks() == 2, "the two emulated nodes' ranks did not start within 60 s"
        family = psutil.Process(p.pid).children(recursive=True)
        assert [n for n in netns.list_namespaces() if n.startswith(mine)]
        p.send_signal(signal.SIGINT)
        try:
            p.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # where it hangs: every thread's stack (PYTHONFAULTHANDLER), then fail
            p.send_signal(signal.SIGABRT)
            _, err = p.communicate(timeout=30)
            pytest.fail(f"Ctrl-C did not end the run within 60 s; its stderr:\n{err[-6000:]}")
        assert p.returncode == 130
        time.sleep(0.5)
        assert not [q for q in family if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]
        assert not [n for n in netns.list_namespaces() if n.startswith(mine)]
        with Store.open(db_path) as s:
            (rec,) = s.query(tag="ctrlc")
        assert rec.status == "failed" and "interrupted" in rec.error
    finally:
        leftover = [q for q in family if q.is_running()] if family else []
        if p.poll() is None:
            p.kill()
            p.wait()
        for q in leftover:  # nothing of the run outlives the test, whatever failed
            try:
                q.kill()
            except psutil.Error:
                pass
        for ns in [n for n in netns.list_namespaces() if n.startswith(mine)]:
            netns.remove_namespace(ns)


def _rate_of(ns, dev):
    import re

    m = re.search(r"rate (\S+)", _qdiscs(ns, dev))
    return m.group(1) if m else None


@needs_netns
def test_one_node_link_at_its_own_rate():
    with netns.EmulatedNodes(3, "1gbit", node_bandwidth={2: "100mbit"}) as en:
        # both ends of each link: the node's egress and the hub's egress towards it
        assert [_rate_of(en.names[k], netns.IFNAME) for k in range(3)] == ["1Gbit", "1Gbit", "100Mbit"]
        assert [_rate_of(en.hub, f"h{k}") for k in range(3)] == ["1Gbit", "1Gbit", "100Mbit"]
        assert en.describe()["node_link_bandwidth_bps"] == {"0": 1e9, "1": 1e9, "2": 1e8}
    with netns.EmulatedNodes(2, node_bandwidth={1: "10mbit"}) as en:  # only node 1 shaped
        assert _rate_of(en.names[0], netns.IFNAME) is None and _rate_of(en.names[1], netns.IFNAME) == "10Mbit"
    with pytest.raises(UsageError, match="--node-link-bandwidth"):
        netns.EmulatedNodes(2, node_bandwidth={2: "1gbit"})


def test_a_node_with_a_quota_starts_its_torchrun_inside_the_group(monkeypatch):
    """Without root: the launcher's commands, with the namespaces and the groups faked."""
    from dlscale.distributed import cgroup, launch
    from dlscale.layout import Layout

    made, left = [], []

    class FakeQuota:
        def __init__(self, cores):
            self.cores = cores
            made.append(cores)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            left.append(self.cores)

        def wrap(self, cmd):
            return ["join", str(self.cores), *cmd]

    seen = []
    monkeypatch.setattr(cgroup, "CpuQuota", FakeQuota)
    monkeypatch.setattr(netns, "EmulatedNodes", FakeNodes)
    monkeypatch.setattr(launch, "_supervise", lambda cmds, env, timeout: seen.extend(cmds) or launch.LaunchResult(0))
    launch.launch("m", [], Layout(emulate_nodes=3, node_cpu_quota="1=0.5,2=0.25"))
    assert [c[:2] for c in seen] == [["ip", "netns"], ["join", "0.5"], ["join", "0.25"]]
    assert seen[1][2:6] == ["ip", "netns", "exec", "node1"]  # the group first: ip, env and torchrun inherit it
    assert made == [0.5, 0.25] and sorted(left) == [0.25, 0.5]  # every group removed afterwards


# Each rank spins for the same CPU time and writes how long that took and which node it ran on.
PROBE = """
import json, os, time
wall, cpu = time.perf_counter(), time.process_time()
while time.process_time() - cpu < float(os.environ["PROBE_WORK"]):
    pass
out = {"node": int(os.environ["GROUP_RANK"]), "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
with open(os.path.join(os.environ["PROBE_DIR"], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(out, f)
"""


@needs_netns
@pytest.mark.slow
@pytest.mark.long
def test_a_node_under_half_the_cpu_quota_runs_its_ranks_slower(tmp_path):
    """Two emulated nodes, node 1's torchrun and rank under half node 0's CPU quota (0.25 against
    0.5 cores): the same CPU work takes node 1's rank about twice as long. Node 1 never gets more
    than its quota, whatever the load; the ratio shows where the machine lets node 0 use its own."""
    import json

    from dlscale.distributed import cgroup
    from dlscale.distributed.launch import launch
    from dlscale.layout import Layout

    need_system("a cgroup cpu controller", cgroup.unavailable_reason(), "DLSCALE_REQUIRE_NETNS")
    (tmp_path / "probe_mod.py").write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    before, groups = set(netns.list_namespaces()), set(cgroup.list_groups())
    cores = 0.5
    layout = Layout(emulate_nodes=2, node_cpu_quota={0: cores, 1: cores / 2}, threads_per_rank=1, timeout_s=120)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "PROBE_DIR": str(out), "PROBE_WORK": str(cores * 0.4)}
    res = launch("probe_mod", [], layout, timeout_s=300, extra_env=env)
    assert res.returncode == 0, "\n".join(res.log_tail[-30:])
    assert namespaces_left(before) == [] and set(cgroup.list_groups()) == groups
    ranks = {r["node"]: r for r in (json.loads(p.read_text()) for p in out.glob("*.json"))}
    assert sorted(ranks) == [0, 1]
    share = {k: r["cpu"] / r["wall"] for k, r in ranks.items()}
    assert share[1] < cores / 2 * 1.25, ranks  # the quota, and one period's worth of slack
    if share[0] < cores * 0.8:
        pytest.skip(f"the machine is too busy to show the quotas: node 0's rank got {share[0]:.2f} of its "
                    f"{cores} cores")
    assert ranks[1]["wall"] / ranks[0]["wall"] > 1.4, ranks
