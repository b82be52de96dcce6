"""The rehearsal Slurm cluster (dlscale.cluster, `dlscale cluster up|down`).

The first tests need nothing from the machine: the slurm.conf it writes, its options refused in one
line, its /etc/hosts lines (on a file of the test's own) added, removed and cleaned after a dead
owner, a node's Debian-style hosts file. The others start the real thing (root, slurm-wlm, munge,
iproute2; skipped with the reason where missing, failed under DLSCALE_REQUIRE_SLURM=1): `dlscale
cluster up` as a user runs it, every node taking jobs under its own name at its own address over a
shaped link, then stopped by Ctrl-C, by `dlscale cluster down`, or killed outright and cleaned by
the next start; each time nothing of it is left: no daemon, namespace, address, /etc/hosts line or file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import need_system, sigint_default, wait_until
from dlscale.cluster import ClusterOptions, hosts
from dlscale.cluster.conf import ConfSpec, slurm_conf
from dlscale.errors import UsageError


def test_the_slurm_conf_keeps_each_nodes_files_apart_and_wires_the_health_check(tmp_path):
    text = slurm_conf(ConfSpec(root=tmp_path, name="dlscale7", controller="vm", controller_addr="10.78.3.254",
                               nodes=(("n-0", "10.78.3.1"), ("n-1", "10.78.3.2")), cpus=2, memory_mib=1000,
                               ctld_port=6817, slurmd_port=6818, health_program=tmp_path / "hc.sh",
                               health_interval_s=300, slurmd_timeout_s=10))
    lines = text.splitlines()
    for line in ("SlurmctldHost=vm(10.78.3.254)", f"SlurmdSpoolDir={tmp_path}/spool/%n",
                 f"SlurmdPidFile={tmp_path}/run/slurmd-%n.pid", f"SlurmdLogFile={tmp_path}/log/slurmd-%n.log",
                 f"AuthInfo=socket={tmp_path}/munge/munge.socket", f"HealthCheckProgram={tmp_path}/hc.sh",
                 "HealthCheckInterval=300", "SlurmdTimeout=10", "ReturnToService=2",
                 "NodeName=n-0 NodeAddr=10.78.3.1 CPUs=2 RealMemory=1000 State=UNKNOWN",
                 "NodeName=n-1 NodeAddr=10.78.3.2 CPUs=2 RealMemory=1000 State=UNKNOWN",
                 "PartitionName=debug Nodes=n-0,n-1 Default=YES MaxTime=INFINITE State=UP"):
        assert line in lines, (line, text)


@pytest.mark.parametrize("fields, expect", [
    ({"nodes": 0}, "--nodes must be between 1 and 32, got 0"),
    ({"nodes": 2, "node_link_bandwidth": "2=100mbit"}, "--node-link-bandwidth names node 2, but the cluster has nodes 0..1"),
    ({"node_link_bandwidth": "1=fast"}, "--node-link-bandwidth 'fast': give a positive rate like 10gbit"),
    ({"link_bandwidth": "10 parsecs"}, "--link-bandwidth '10 parsecs': give a positive rate"),
    ({"cpus": 0}, "--cpus-per-node must be 1 or more, got 0"),
    ({"slurmd_timeout_s": 1}, "--slurmd-timeout must be a whole number of seconds >= 5, got 1"),
    ({"nodes": 2, "on_host": True}, "a cluster on the host itself has one node"),
])
def test_bad_options_are_one_line_naming_the_option(fields, expect):
    with pytest.raises(UsageError) as e:
        ClusterOptions(**fields)
    assert expect in str(e.value), str(e.value)


def test_one_node_may_have_its_own_link_rate():
    o = ClusterOptions(nodes=3, link_bandwidth="1gbit", node_link_bandwidth=["2=100mbit"])
    assert [o.rate_of(k) for k in range(3)] == ["1gbit", "1gbit", "100mbit"] and o.node_rates == {2: "100mbit"}


def test_hosts_lines_are_owned_removed_and_cleaned_after_a_dead_owner(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("127.0.0.1 localhost\n10.0.0.9 other  # a line of the administrator's")  # no final newline
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = os.getpid()
    hosts.add([("a-0", "10.78.1.1"), ("a-1", "10.78.1.2")], owner=f"{me}-a", path=f)
    hosts.add([("c-0", "10.78.3.1")], owner=f"{me}-c", path=f)  # a second cluster of the same process
    hosts.add([("b-0", "10.78.2.1")], owner=f"{dead.pid}-b", path=f)
    assert hosts.owned(f"{me}-a", path=f) == [("a-0", "10.78.1.1"), ("a-1", "10.78.1.2")]
    assert hosts.owned(dead.pid, path=f) == [("b-0", "10.78.2.1")]
    assert hosts.cleanup_stale(path=f) == [dead.pid]  # this process runs on: its lines stay
    assert hosts.owned(dead.pid, path=f) == [] and len(hosts.owned(me, path=f)) == 3
    assert hosts.remove(f"{me}-a", path=f) == 2 and hosts.owned(me, path=f) == [("c-0", "10.78.3.1")]
    assert hosts.remove(f"{me}-c", path=f) == 1
    assert f.read_text() == "127.0.0.1 localhost\n10.0.0.9 other  # a line of the administrator's\n"


def test_a_node_may_see_names_as_debian_writes_them():
    text = hosts.debian_hosts("n-1", [("n-0", "10.78.1.1"), ("n-1", "10.78.1.2")])
    assert text.splitlines() == ["127.0.0.1\tlocalhost", "127.0.1.1\tn-1", "10.78.1.1\tn-0"]


def test_down_without_a_cluster_up_and_bad_options_are_one_line(cli):
    r = cli("cluster", "up", "--nodes", "0")
    assert r.code == 2 and r.stderr.strip() == "error: --nodes must be between 1 and 32, got 0", r.stderr
    r = cli("cluster", "down", "/nowhere/slurm.conf")
    assert r.code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no rehearsal cluster" in r.stderr


# -- the real cluster ----------------------------------------------------------------------------------


def need_cluster() -> None:
    import slurmcluster

    need_system("a 2-node Slurm (slurm-wlm, munge, iproute2)", slurmcluster.missing(2), slurmcluster.REQUIRE_ENV)


def _sigint_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a script's background job


def _up(*args: str, preexec=sigint_default) -> tuple[subprocess.Popen, dict]:
    """`dlscale cluster up ARGS --format json` in the background; the process and what it printed."""
    p = subprocess.Popen([sys.executable, "-m", "dlscale.cli.app", "cluster", "up", *args, "--format", "json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
    lines = []
    for line in p.stdout:  # one JSON document, then nothing until it stops
        lines.append(line)
        if line.startswith("}"):
            return p, json.loads("".join(lines))
    p.wait()
    pytest.fail(f"dlscale cluster up exited {p.returncode}: {p.stderr.read()[-3000:]}")


def _left_of(pid: int, doc: dict) -> list[str]:
    """What of the cluster of process ``pid`` is still there."""
    from dlscale.distributed import netns

    left = [f"namespace {ns}" for ns in netns.list_namespaces() if ns.startswith(f"{netns.PREFIX}{pid}-")]
    left += [f"/etc/hosts {name}" for name, _ in hosts.owned(pid)]
    left += [f"folder {doc['folder']}"] if Path(doc["folder"]).exists() else []
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    left += [f"process {line.strip()}" for line in ps.splitlines() if doc["folder"] in line]
    addrs = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    subnet = doc["nodes"][0]["address"].rsplit(".", 1)[0] + "."
    left += [f"address {line.split()[3]}" for line in addrs.splitlines() if subnet in line]
    return left


@pytest.mark.slow
def test_up_runs_nodes_under_their_names_on_shaped_links_and_ctrl_c_removes_everything():
    need_cluster()
    # started with SIGINT ignored, as `dlscale cluster up &` in a script is: Ctrl-C must still stop it
    p, doc = _up("--nodes", "2", "--node-link-bandwidth", "1=100mbit", "--no-health-check", preexec=_sigint_ignored)
    try:
        env = {**os.environ, "SLURM_CONF": doc["slurm_conf"]}
        names = [n["name"] for n in doc["nodes"]]
        addrs = {n["name"]: n["address"] for n in doc["nodes"]}
        assert [n["link"] for n in doc["nodes"]] == ["1gbit", "100mbit"]
        # one task per node: its host name, its address, and how the other node's name resolves there
        r = subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "sh", "-c",
                            f"echo $(hostname) $(hostname -I) $(getent hosts {' '.join(names)} | tr '\\n' ' ')"],
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        seen = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()}
        assert set(seen) == set(names)
        for name, rest in seen.items():
            assert rest[0] == addrs[name]  # each node's only address is its own
            assert " ".join(rest[1:]).split() == [x for n in names for x in (addrs[n], n)]  # names resolve to nodes
        slow = subprocess.run(["srun", "-w", names[1], "tc", "qdisc", "show", "dev", "dls0"], env=env,
                              capture_output=True, text=True, timeout=60).stdout
        assert re.search(r"tbf .*rate 100Mbit", slow), slow
    finally:
        p.send_signal(signal.SIGINT)
        try:
            _, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.terminate()  # SIGTERM removes it all the same, so nothing is left behind when SIGINT failed
            _, err = p.communicate(timeout=120)
            pytest.fail(f"dlscale cluster up did not stop on SIGINT: {err[-2000:]}")
    assert p.returncode == 0, err[-2000:]
    assert "stopped; every daemon, namespace, address, /etc/hosts line and file removed" in " ".join(err.split())
    assert _left_of(p.pid, doc) == []


@pytest.mark.slow
def test_down_stops_it_and_a_killed_ones_leftovers_go_with_the_next_start():
    need_cluster()
    from dlscale.cluster import cleanup_stale

    p, doc = _up("--nodes", "2", "--no-health-check")
    try:
        r = subprocess.run([sys.executable, "-m", "dlscale.cli.app", "cluster", "down", doc["slurm_conf"]],
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0 and _left_of(p.pid, doc) == []
    killed, doc = _up("--nodes", "2", "--no-health-check")
    killed.kill()  # nothing of its clean-up runs: its daemons die with it, the rest stays until the next start
    killed.wait()
    assert wait_until(lambda: all("process" not in x for x in _left_of(killed.pid, doc)), 30)
    left = _left_of(killed.pid, doc)
    assert any(x.startswith("namespace") for x in left) and any(x.startswith("/etc/hosts") for x in left), left
    removed = cleanup_stale()
    assert doc["folder"] in removed["folders"] and killed.pid in removed["hosts_of"], removed
    assert _left_of(killed.pid, doc) == []


@pytest.mark.slow
def test_debian_hosts_give_each_node_its_own_name_on_127_0_1_1(make_slurm_nodes):
    cluster = make_slurm_nodes(2, debian_hosts=True)
    env = {**os.environ, **cluster.env()}
    r = subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "sh", "-c",
                        f"echo $(hostname) $(getent hosts {' '.join(cluster.names)} | tr '\\n' ' ')"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    seen = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()}
    for name in cluster.names:  # its own name on loopback, the other at its address
        assert seen[name] == [x for n, a in zip(cluster.names, cluster.addresses)
                              for x in ("127.0.1.1" if n == name else a, n)], seen
    assert hosts.owned(cluster.id) == list(zip(cluster.names, cluster.addresses))  # this machine resolves them all
