"""A Slurm cluster of K nodes on this machine: ``SlurmCluster``, what ``dlscale cluster up`` runs.

Each node is an emulated node (``distributed.netns``: its own network namespace, its address on a
subnet of its own, a tbf-shaped link to a bridge, one node's link at its own rate where asked)
with its own UTS host name, named in /etc/hosts as a real cluster's DNS would (``cluster.hosts``).
The root namespace joins the bridge too (an unshaped veth at ``<subnet>.254``), and there run one
munged and slurmctld; one slurmd per node runs in its node's namespace, entered with ``nsenter
--net`` (``ip netns exec`` would remount /sys, hiding the cgroup filesystem slurmd reads), under
``slurmd -N NAME``. Every file is under one temporary folder: slurm.conf (``cluster.conf``), the
munge key and socket, state, spool, pid and log files. ``env()`` is what a client needs
(``SLURM_CONF``); a job submitted with it runs on the nodes, in their namespaces, and reaches the
store through the shared filesystem.

``with SlurmCluster(nodes=3, link_bandwidth="1gbit") as c:`` starts it and, on leaving (an error,
Ctrl-C), cancels every job and removes every daemon, namespace, address, /etc/hosts line and file.
What a process killed outright left (its folder, daemons, namespaces, lines) is removed by the next
start (``cleanup_stale``). ``on_host=True`` makes the one node this machine itself (127.0.0.1, its
own host name, no namespace): the tests' single-node cluster, whose jobs see the host as it is.

For the tests and for rehearsing faults: ``set_health_check`` (what the health check runs, on every
node or one), ``node_state``, ``kill_node`` / ``start_node`` (a node lost: its slurmd and every
process in its namespace killed, then back), ``stop_controller`` / ``start_controller``,
``processes_on`` (what runs on a node besides its slurmd). No torch.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from dlscale.cluster import daemons, hosts
from dlscale.cluster.conf import ConfSpec, slurm_conf
from dlscale.cluster.options import ClusterOptions
from dlscale.errors import UsageError

SUBNET_BASE = "10.78"  # node k of a cluster at 10.78.X.(k+1), X free in the root namespace
NAME_PREFIX = "dlsn"
UPLINK_PREFIX = "dlc"  # the root namespace's veth to a cluster's bridge: dlc<pid>-<id>
NODE_SLOT = "@NODE@"  # where a node's name goes in a path its health check builds in the shell


class SlurmCluster:
    """One controller and ``nodes`` compute nodes on this machine (the module doc)."""

    def __init__(self, options: ClusterOptions | None = None, **fields: Any):
        self.options = options or ClusterOptions(**fields)
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:3]}"  # its /etc/hosts lines' owner; a process may run several
        self.short = short = self.id.replace("-", "")  # in names: nodes, cluster, root veth
        self.root: Path | None = None
        self.net: Any = None  # the EmulatedNodes of the nodes' namespaces
        self.daemons = daemons.Daemons()
        if self.options.on_host:
            self.names = [daemons.short_hostname()]
            self.addresses = ["127.0.0.1"]
        else:
            self.names = [f"{NAME_PREFIX}{short}-{k}" for k in range(self.options.nodes)]
            self.addresses = []

    # -- what a client needs ------------------------------------------------------------------------

    @property
    def conf(self) -> Path:
        return self._root / "slurm.conf"

    @property
    def _root(self) -> Path:
        if self.root is None:
            raise RuntimeError("the cluster has not been started")
        return self.root

    def env(self) -> dict[str, str]:
        """The variables a Slurm client (sbatch, squeue, scontrol, submitit, dlscale) needs to reach it."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self, message_timeout_s: int) -> dict[str, str]:
        """Like ``env()``, for a client that gives up on an unreachable controller after
        ``message_timeout_s`` (its own copy of slurm.conf; the daemons keep theirs)."""
        conf = self._root / f"client-{message_timeout_s}.conf"
        conf.write_text(re.sub(r"MessageTimeout=\d+", f"MessageTimeout={message_timeout_s}", self.conf.read_text()))
        return {"SLURM_CONF": str(conf)}

    @property
    def host(self) -> str:
        """The first node's name (the only one of a single-node cluster)."""
        return self.names[0]

    @property
    def cpus(self) -> int:
        return self.options.cpus_per_node

    @property
    def partition(self) -> str:
        return self.options.partition

    def describe(self) -> dict[str, Any]:
        """The cluster as ``dlscale cluster up`` prints it."""
        o = self.options
        return {"slurm_conf": str(self.conf), "folder": str(self._root), "partition": o.partition,
                "nodes": [{"name": n, "address": a, "link": o.rate_of(k) or "unshaped", "cpus": o.cpus_per_node}
                          for k, (n, a) in enumerate(zip(self.names, self.addresses))]}

    # -- start and stop -------------------------------------------------------------------------------

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 120.0) -> "SlurmCluster":
        """Start munged, slurmctld and every node's slurmd; return once every node takes jobs (else
        stop what started and raise RuntimeError with the daemons' logs)."""
        why = daemons.missing(self.options.on_host)
        if why:
            raise UsageError(why)
        cleanup_stale()
        self.root = daemons.make_folder(self.id)
        try:
            if not self.options.on_host:
                self._network()
            self._write_conf()
            self.daemons.start_munge(self._root)
            self.daemons.start_controller(self.conf)
            for k in range(len(self.names)):
                self.start_node(k, wait=False)
            self._wait(self._all_idle, timeout_s, "the nodes did not become idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        from dlscale.distributed.netns import EmulatedNodes

        o = self.options
        with hosts.locked():  # the subnet is chosen and taken in one step: clusters may start at once
            subnet = f"{SUBNET_BASE}.{daemons.free_subnet(SUBNET_BASE)}"
            self.net = EmulatedNodes(o.nodes, o.link_bandwidth, node_bandwidth=o.node_rates,
                                     subnet=subnet, uplink=f"{UPLINK_PREFIX}{self.id}"[:15])
            self.net.__enter__()
        self.addresses = [self.net.address(k) for k in range(o.nodes)]
        hosts.add(list(zip(self.names, self.addresses)), owner=self.id)
        if o.debian_hosts:
            for name in self.names:
                (self._root / "hosts" / name).write_text(hosts.debian_hosts(name, list(zip(self.names, self.addresses))))

    def _write_conf(self) -> None:
        o, r = self.options, self._root
        program = r / "healthcheck.sh"
        program.write_text("#!/bin/sh\n"
                           f'node="${{SLURMD_NODENAME:-$(hostname -s)}}"\nf="{r}/healthcheck-$node.cmd"\n'
                           f'[ -f "$f" ] || f="{r}/healthcheck.cmd"\n[ -f "$f" ] || exit 0\nexec /bin/sh "$f"\n')
        program.chmod(0o755)
        if o.health_check is not None:
            self.set_health_check(o.health_check)
        controller = daemons.short_hostname()
        ctl_addr = "127.0.0.1" if o.on_host else self.net.root_address
        self.conf.write_text(slurm_conf(ConfSpec(
            root=r, name=f"dlscale{self.short}", controller=controller, controller_addr=ctl_addr,
            nodes=tuple(zip(self.names, self.addresses)), cpus=o.cpus_per_node, memory_mib=daemons.memory_mib(),
            ctld_port=daemons.free_port(), slurmd_port=daemons.free_port(), partition=o.partition,
            health_program=program, health_interval_s=o.health_check_interval_s,
            slurmd_timeout_s=o.slurmd_timeout_s)))

    def stop(self) -> None:
        """Cancel every job, end every daemon (SIGTERM, then SIGKILL), kill what still runs on the
        nodes, remove the namespaces, the /etc/hosts lines and the folder. Safe to call twice."""
        if self.root is not None and self.daemons.controller_running():
            daemons.slurm_cmd(["scancel", "--full", "--user", "root"], self.env(), timeout=20)
        self.daemons.stop_all()
        if self.net is not None:
            self.net.close()
            self.net = None
        if not self.options.on_host:
            hosts.remove(owner=self.id)
        if self.root is not None:
            daemons.remove_folder(self.root)
            self.root = None

    # -- nodes ------------------------------------------------------------------------------------------

    def node_cmd(self, k: int, cmd: list[str]) -> list[str]:
        """``cmd`` as it runs on node k: in its network namespace (``nsenter --net``), under its own host
        name (a UTS namespace) and, with ``debian_hosts``, its own /etc/hosts (a mount namespace)."""
        if self.options.on_host:
            return cmd
        name, setup = self.names[k], 'hostname "$0"'
        unshare = ["unshare", "--uts"]
        if self.options.debian_hosts:
            unshare += ["--mount", "--propagation", "private"]
            setup += f" && mount --bind {shlex.quote(str(self._root / 'hosts' / name))} /etc/hosts"
        return ["nsenter", f"--net=/run/netns/{self.net.names[k]}", *unshare,
                "sh", "-c", setup + ' && exec "$@"', name, *cmd]

    def start_node(self, k: int, wait: bool = True, timeout_s: float = 120.0) -> None:
        """Start node k's slurmd (again, after ``kill_node``); ``wait``: until the node takes jobs."""
        self.daemons.start_slurmd(self.names[k], self.node_cmd(k, ["slurmd", "-D", "-N", self.names[k], "-f",
                                                                    str(self.conf)]), self.env())
        if wait:
            self._wait(lambda: self.node_state(self.names[k])[0].rstrip("*").split("+")[0] in ("IDLE", "MIXED",
                                                                                                "ALLOCATED"),
                       timeout_s, f"node {self.names[k]} did not take jobs again")

    def kill_node(self, k: int) -> list[int]:
        """Node k lost: SIGKILL its slurmd and every process in its namespace (its job steps, ranks);
        the pids killed. The controller finds the node unresponsive after ``SlurmdTimeout``."""
        killed = self.daemons.kill_slurmd(self.names[k])
        for pid in self.processes_on(k):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        return killed

    def processes_on(self, k: int) -> list[int]:
        """The processes running in node k's namespace besides its slurmd (a job's, or what one left)."""
        if self.options.on_host or self.net is None:
            return []
        p = subprocess.run(["ip", "netns", "pids", self.net.names[k]], capture_output=True, text=True)
        own = self.daemons.slurmd_pid(self.names[k])
        return [int(x) for x in p.stdout.split() if x.isdigit() and int(x) != own]

    def node_state(self, node: str | None = None) -> tuple[str, str]:
        """(State, Reason) of a node (the first by default) as ``scontrol show node`` gives them."""
        p = daemons.slurm_cmd(["scontrol", "show", "node", node or self.host], self.env(), timeout=20)
        state = re.search(r"\bState=(\S+)", p.stdout if p else "")
        reason = re.search(r"^\s*Reason=(.*)$", p.stdout if p else "", re.M)
        return (state.group(1) if state else "?", reason.group(1).strip() if reason else "")

    def set_health_check(self, command: str | None, node: str | None = None) -> None:
        """The shell command the health check runs from now on, on every node or on ``node`` alone (which
        then runs it instead of the every-node one); None: nothing (exit 0)."""
        path = self._root / (f"healthcheck-{node}.cmd" if node else "healthcheck.cmd")
        if command is None:
            path.unlink(missing_ok=True)
        else:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(command + "\n")
            os.replace(tmp, path)

    def health_check_command(self, *accept_args: str, db: str | Path | None = None) -> str:
        """A health check that runs ``dlscale accept ACCEPT_ARGS --out <folder>/health/<node>`` (the
        node from slurmd's environment) into ``db`` (default: the cluster's health.db), one at a time
        per node (``health_lock``), appending to ``health_log``: what a site's
        /etc/slurm/dlscale-health.sh runs (docs/CLUSTER.md)."""
        r = self._root
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": str(self.conf),
               "DLSCALE_DB": str(db or r / "health.db"), "OMP_NUM_THREADS": "1", "HOME": str(r)}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        node = '"${SLURMD_NODENAME:-$(hostname -s)}"'
        lock, log = ("'" + str(p).replace("'", "'\\''").replace(NODE_SLOT, "'" + node + "'") + "'"
                     for p in (self.health_lock(NODE_SLOT), self.health_log(NODE_SLOT)))
        cmd = [sys.executable, "-m", "dlscale.cli.app", "accept", *accept_args]
        return (f"cd {shlex.quote(str(r))} && exec env -i {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())}"
                f" flock -n {lock} {shlex.join(cmd)} --out {shlex.quote(str(r / 'health'))}/{node} >> {log} 2>&1")

    def health_lock(self, node: str) -> Path:
        """The lock a node's health check holds while it runs."""
        return self._root / "run" / f"health-{node}.lock"

    def health_log(self, node: str) -> Path:
        """Where a node's health check (``health_check_command``) writes."""
        return self._root / "log" / f"health-{node}.log"

    # -- the controller -----------------------------------------------------------------------------------

    def stop_controller(self) -> None:
        """End slurmctld (SIGTERM: it saves its state), as an outage of the controller does; the nodes
        and their running jobs go on."""
        self.daemons.stop_controller()

    def start_controller(self, timeout_s: float = 60.0) -> None:
        """Start slurmctld again from its saved state; return once it answers."""
        self.daemons.start_controller(self.conf)
        self._wait(self._answers, timeout_s, "slurmctld did not answer after its restart")

    def _answers(self) -> bool:
        p = daemons.slurm_cmd(["scontrol", "ping"], self.env(), timeout=30)
        return p is not None and p.returncode == 0 and "UP" in p.stdout

    def _all_idle(self) -> bool:
        p = daemons.slurm_cmd(["sinfo", "-h", "-N", "-o", "%N %t"], self.env(), timeout=20)
        if p is None or p.returncode != 0:
            return False
        states = dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)
        return all(states.get(n, "").rstrip("*") in ("idle", "mix", "alloc") for n in self.names)

    def _wait(self, ok, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ok():
                return
            dead = self.daemons.dead()
            if dead:
                raise RuntimeError(f"{what} ({', '.join(dead)} exited); logs:\n{self.logs()}")
            time.sleep(0.5)
        raise RuntimeError(f"{what} within {timeout_s:g} s; logs:\n{self.logs()}")

    def logs(self, lines: int = 15) -> str:
        """The last lines of every daemon's log (for a failure message)."""
        return daemons.log_tails(self._root, lines)


def cleanup_stale() -> dict[str, list]:
    """Remove what clusters of processes that are gone left: their daemons and folders, the root
    namespace's veths to their bridges, their namespaces and /etc/hosts lines; what was removed."""
    from dlscale.distributed.netns import cleanup_stale as stale_namespaces

    folders = daemons.cleanup_stale_folders()
    links = daemons.cleanup_stale_links(UPLINK_PREFIX)
    return {"folders": folders, "links": links, "namespaces": stale_namespaces(), "hosts_of": hosts.cleanup_stale()}
