"""Nodes named as on a Debian cluster: each node's /etc/hosts puts its own name on 127.0.1.1 and the
other nodes at their addresses. The ranks' interface is taken from the route to the master, or, where
the ranks still cannot reach each other, every node ends at once with one line naming the addresses.

Each node is an emulated node (``netns.EmulatedNodes``: its own network namespace, 10.77.0.k+1 on
dls0) whose /etc/hosts is ``/etc/netns/NS/hosts`` (``ip netns exec`` mounts it over /etc/hosts) and
whose host name is its own (``unshare --uts``); the commands run on each node as a user would.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import need_system
from dlscale.distributed import netns

pytestmark = [pytest.mark.long, pytest.mark.slow]
TIMEOUT_S = 900  # the job's --timeout: the old behaviour waited to it; these end long before
RUN = ["train", "tinycnn", "-b", "8", "--warmup-steps", "1", "--steps", "3", "--device", "cpu",
       "--threads-per-rank", "1"]


@pytest.fixture
def debian_nodes():
    """Two emulated nodes n0 and n1, each with /etc/hosts as Debian writes it; every process inside
    them, their namespaces and their hosts files removed after."""
    reason = netns.unavailable_reason() or (None if shutil.which("unshare") else "unshare (util-linux) is not on PATH")
    need_system("root, iproute2 and unshare", None if reason is None else f"network namespaces unavailable: {reason}",
                "DLSCALE_REQUIRE_NETNS")
    made_root = not Path("/etc/netns").exists()
    with netns.EmulatedNodes(2) as en:
        dirs = [Path("/etc/netns") / ns for ns in en.names]
        try:
            for k, d in enumerate(dirs):
                d.mkdir(parents=True)
                others = [f"{en.address(j)}\tn{j}" for j in range(2) if j != k]
                (d / "hosts").write_text("\n".join(["127.0.0.1\tlocalhost", f"127.0.1.1\tn{k}", *others]) + "\n")
            yield en
        finally:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
            if made_root:  # only if empty: another process may have put its own namespaces' files there meanwhile
                try:
                    os.rmdir("/etc/netns")
                except OSError:
                    pass


def on_nodes(en, commands, env=None, timeout=TIMEOUT_S):
    """Run commands[k] on node k (its hosts file, host name nK) all at once; per node (exit code, stdout,
    stderr, seconds), once every node's command ended; then no process is left in any node."""
    procs, t0 = [], time.monotonic()
    for k, cmd in enumerate(commands):
        wrapped = ["ip", "netns", "exec", en.names[k], "unshare", "--uts", "sh", "-c", f'hostname n{k} && exec "$@"',
                   "sh", *cmd]
        procs.append(subprocess.Popen(wrapped, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, **(env[k] if env else {})}, start_new_session=True))
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
            out.append((p.returncode, o, e, time.monotonic() - t0))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for ns in en.names:  # nothing of the job runs on any node any more
        left = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        assert not left, f"processes left on {ns}: {left}"
    return out


def dlscale(*args):
    return [sys.executable, "-m", "dlscale.cli.app", *args]


def test_two_nodes_whose_names_are_on_loopback_at_home_find_their_interface(debian_nodes, db_path):
    runs = on_nodes(debian_nodes, [dlscale(*RUN, "--nnodes", "2", "--node-rank", str(k), "--master-addr", "n0",
                                           "--timeout", str(TIMEOUT_S), "--format", "json", "--db", str(db_path))
                                   for k in range(2)])
    assert [r[0] for r in runs] == [0, 0], runs[0][2][-3000:] + runs[1][2][-3000:]
    rec = json.loads(runs[0][1])
    net = rec["config"]["rank_network"]
    assert [(n["host"], n["interface"], n["address"], n["set_by"]) for n in net] == \
        [("n0", "dls0", "10.77.0.1", "dlscale"), ("n1", "dls0", "10.77.0.2", "dlscale")]
    # n0 resolves its own name to 127.0.1.1: its route to the master is loopback, so it took the route to n1
    assert net[0]["how"] == ("route to rank 1 (n1, 10.77.0.2); the route to MASTER_ADDR n0 (127.0.1.1) is "
                             "loopback here")
    assert net[1]["how"] == "route to MASTER_ADDR n0 (10.77.0.1)"


def test_ranks_that_cannot_reach_each_other_end_at_once_with_one_line(debian_nodes, db_path):
    """Under torchrun started by hand on each node (c10d rendezvous, as dlscale's Slurm executor starts
    it), with GLOO_SOCKET_IFNAME forced to loopback: every node ends well before the timeout, and rank
    0's record names the pair, the cause and every node's address."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", "n0:29400", "--rdzv-id", "debian", "--max-restarts", "0",
                "-m", "dlscale.cli.app", *RUN, "--timeout", str(TIMEOUT_S), "--db", str(db_path)]
    lo = {"GLOO_SOCKET_IFNAME": "lo"}
    runs = on_nodes(debian_nodes, [torchrun, torchrun], env=[lo, lo])
    assert [r[0] for r in runs] == [1, 1], runs[0][2][-3000:] + runs[1][2][-3000:]
    assert max(r[3] for r in runs) < TIMEOUT_S / 3, "a node waited towards the job's timeout"
    from dlscale.store import Store

    with Store.open(db_path) as s:
        (rec,) = s.query()
    assert rec.status == "failed"
    assert re.match(r"ranks cannot reach each other: rank \d \(node \d, n\d\) could not connect to rank \d "
                    r"\(node \d, n\d\) at 127\.0\.0\.1:\d+: Connection refused", rec.error), rec.error
    assert re.search(r"advertised: node 0 \(n\d\) 127\.0\.0\.1 on lo \(set by the user: GLOO_SOCKET_IFNAME=lo\), "
                     r"node 1 \(n\d\) 127\.0\.0\.1 on lo \(set by the user: GLOO_SOCKET_IFNAME=lo\)", rec.error)
    for _, _, err, _ in runs:  # every node's rank says the same one line
        assert "ranks cannot reach each other" in err and "timed out" not in err


def test_one_ranks_failure_ends_the_other_nodes_rank_at_once(debian_nodes, db_path):
    """dlscale's own torchrun on each node; node 1's rank refuses its GLOO_SOCKET_IFNAME (no such
    interface there) before it joins: node 0's rank, waiting for it, ends too, in that line."""
    runs = on_nodes(debian_nodes, [dlscale(*RUN, "--nnodes", "2", "--node-rank", str(k), "--master-addr", "n0",
                                           "--timeout", str(TIMEOUT_S), "--db", str(db_path)) for k in range(2)],
                    env=[{}, {"GLOO_SOCKET_IFNAME": "eth9"}])
    assert [r[0] for r in runs] == [2, 2], runs[0][2][-3000:] + runs[1][2][-3000:]
    assert max(r[3] for r in runs) < TIMEOUT_S / 3, "node 0 waited towards the job's timeout"
    errors = [[ln for ln in r[2].splitlines() if ln.startswith("error:")] for r in runs]
    assert errors[0] == [f"error: rank 1 (node 1, n1): {errors[1][0][len('error: '):]}"], errors
    assert errors[1][0].startswith("error: GLOO_SOCKET_IFNAME=eth9 names no interface with an address on n1 "
                                   "(here: lo, dls0)"), errors
