"""The rehearsal cluster's slurm.conf: one controller, K compute nodes, every file under one folder.

``slurm_conf(c)`` writes the text for a ``ConfSpec``: the controller on this machine (its host name
and the address the nodes reach it at), one ``NodeName`` line per node (name, address, CPUs,
memory), one partition over them, munge authentication through the cluster's own munged socket,
no accounting daemon, ``proctrack/linuxproc`` and ``task/none`` (no cgroup set-up needed), a short
``KillWait`` so that a job past its time limit ends within seconds of it, ``ReturnToService=2`` (a
node that was down takes jobs again once its slurmd registers), and a ``HealthCheckProgram`` run on
every node every ``health_interval_s`` seconds. The slurmd paths carry ``%n`` (slurm.conf(5): the
node's name), so K slurmds on one machine keep their spool, pid and log apart. No root, no
processes here: ``cluster.rehearsal`` starts the daemons.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

@dataclass(frozen=True)
class ConfSpec:
    """What slurm.conf says of one rehearsal cluster."""

    root: Path  # the cluster's folder: state, spool, logs, munge
    name: str  # ClusterName
    controller: str  # this machine's short host name (slurmctld checks it is the SlurmctldHost)
    controller_addr: str  # where the nodes reach slurmctld
    nodes: tuple[tuple[str, str], ...]  # (NodeName, NodeAddr) per node
    cpus: int
    memory_mib: int
    ctld_port: int
    slurmd_port: int
    partition: str = "debug"
    health_program: Path | None = None
    health_interval_s: int = 300
    slurmd_timeout_s: int = 30


def slurm_conf(c: ConfSpec) -> str:
    """The text of slurm.conf for ``c``."""
    r = c.root
    nodelist = ",".join(n for n, _ in c.nodes)
    lines = [
        f"ClusterName={c.name}", f"SlurmctldHost={c.controller}({c.controller_addr})",
        f"SlurmctldPort={c.ctld_port}", f"SlurmdPort={c.slurmd_port}",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={r / 'munge' / 'munge.socket'}",
        f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool' / '%n'}",
        f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "MpiDefault=none", "ReturnToService=2", "KillWait=2", "OverTimeLimit=0", "MinJobAge=3600",
        "InactiveLimit=0", "SlurmctldTimeout=30", f"SlurmdTimeout={c.slurmd_timeout_s}", "MessageTimeout=10",
        "SlurmctldDebug=info", "SlurmdDebug=info",
    ]
    if c.health_program is not None:
        lines += [f"HealthCheckProgram={c.health_program}", f"HealthCheckInterval={c.health_interval_s}",
                  "HealthCheckNodeState=ANY"]
    lines += [f"NodeName={n} NodeAddr={a} CPUs={c.cpus} RealMemory={c.memory_mib} State=UNKNOWN" for n, a in c.nodes]
    lines += [f"PartitionName={c.partition} Nodes={nodelist} Default=YES MaxTime=INFINITE State=UP", ""]
    return "\n".join(lines)
