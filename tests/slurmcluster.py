"""The tests' Slurm clusters, thin over ``dlscale.cluster`` (what ``dlscale cluster up`` runs for users).

``single_node()``: one node, this machine itself (127.0.0.1, its own host name, no namespace), so a
job there sees the host as a local run does (the single-node sweep and acceptance tests compare the
two). ``multi_node(k)``: K nodes, each in its own network namespace with its own address and host
name, joined by shaped links. Both run their health check every ``HEALTH_CHECK_INTERVAL_S`` seconds,
doing nothing until a test gives it a command (``set_health_check``). ``start(cluster)`` starts
one, or skips the test with the reason (fails it under ``DLSCALE_REQUIRE_SLURM=1``). Every
daemon, namespace, /etc/hosts line and file goes with ``stop()``.
"""

from __future__ import annotations

from conftest import need_system

from dlscale.cluster import SlurmCluster
from dlscale.cluster.daemons import missing as why_not

HEALTH_CHECK_INTERVAL_S = 5  # slurmctld asks slurmd to run the health check this often
SLURMD_TIMEOUT_S = 10  # a node killed in a test is DOWN (its job NODE_FAIL) this long after
REQUIRE_ENV = "DLSCALE_REQUIRE_SLURM"


def missing(nodes: int = 1) -> str | None:
    """Why no Slurm of ``nodes`` nodes (1: on the host) can be started here, or None."""
    return why_not(on_host=nodes == 1)


def single_node(cpus: int = 2) -> SlurmCluster:
    return SlurmCluster(nodes=1, on_host=True, cpus=cpus, health_check_interval_s=HEALTH_CHECK_INTERVAL_S)


def multi_node(k: int = 3, **options) -> SlurmCluster:
    return SlurmCluster(nodes=k, health_check_interval_s=HEALTH_CHECK_INTERVAL_S, slurmd_timeout_s=SLURMD_TIMEOUT_S,
                        **options)


def start(cluster: SlurmCluster) -> SlurmCluster:
    """Start ``cluster``, or skip the test saying why (fail it where DLSCALE_REQUIRE_SLURM=1)."""
    k = len(cluster.names)
    what = "a single-node Slurm (slurm-wlm, munge)" if k == 1 else f"a {k}-node Slurm (slurm-wlm, munge, iproute2)"
    need_system(what, missing(1 if cluster.options.on_host else k), REQUIRE_ENV)
    try:
        cluster.start()
    except RuntimeError as e:
        need_system(what, f"Slurm would not start here: {e}", REQUIRE_ENV)
    return cluster
