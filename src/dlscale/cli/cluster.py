"""``dlscale cluster up|down``: a Slurm cluster of K nodes on this machine, to rehearse a cluster run."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from dlscale.cli.common import Format, FormatOpt, info, print_json

HELP = """A Slurm cluster of K nodes on this machine, to rehearse a cluster run before spending GPU hours.

`up` starts munged and slurmctld here and one slurmd per node, each node in its own network
namespace with its own address and host name (in /etc/hosts), joined by tc-shaped links (one
node may have its own rate), the health check wired (`dlscale accept --level 1 --drain-on-fail
--resume-on-pass` on every node). It prints what to export (SLURM_CONF) on stdout and runs until
Ctrl-C or `dlscale cluster down`, then removes every daemon, namespace, address, /etc/hosts line
and file it made; what a killed one left is removed by the next `up`. Needs root, slurm-wlm,
munge and iproute2 (docs/CLUSTER.md, "A rehearsal cluster on one machine")."""

EPILOG = """Examples:\n\n
  dlscale cluster up                                   # 3 nodes, 1 gbit links\n\n
  dlscale cluster up --nodes 2 --link-bandwidth 10gbit\n\n
  dlscale cluster up --node-link-bandwidth 2=100mbit   # node 2 on a slow link\n\n
  export SLURM_CONF=...   # as `up` printed, in another shell; then\n\n
  dlscale sweep two-nodes.yaml --executor slurm\n\n
  dlscale cluster down"""

app = typer.Typer(help="A Slurm cluster of K nodes on this machine (rehearsal).", no_args_is_help=True)


@app.command("up", help=HELP, epilog=EPILOG)
def up(
    nodes: Annotated[int, typer.Option("--nodes", help="Compute nodes, each in its own network namespace.")] = 3,
    link_bandwidth: Annotated[Optional[str], typer.Option("--link-bandwidth", help="Every node's link rate (tc tbf), e.g. 10gbit, 1gbit; `none`: unshaped.")] = "1gbit",
    node_link_bandwidth: Annotated[Optional[list[str]], typer.Option("--node-link-bandwidth", help="One node's own link rate, NODE=RATE, e.g. 2=100mbit (repeat the option or separate with commas).", show_default=False)] = None,
    cpus_per_node: Annotated[Optional[int], typer.Option("--cpus-per-node", help="CPUs each node declares (default: the CPUs this process may use; the nodes share them).", show_default=False)] = None,
    partition: Annotated[str, typer.Option("--partition", help="The partition of all nodes (the default one).")] = "debug",
    health_check: Annotated[bool, typer.Option("--health-check/--no-health-check", help="Run `dlscale accept --level 1 --drain-on-fail --resume-on-pass` as every node's Slurm health check.")] = True,
    health_check_interval: Annotated[int, typer.Option("--health-check-interval", help="Seconds between health checks (Slurm's HealthCheckInterval).")] = 300,
    debian_hosts: Annotated[bool, typer.Option("--debian-hosts", help="Give each node its own /etc/hosts as Debian writes it (its own name on 127.0.1.1).")] = False,
    fmt: FormatOpt = Format.human,
) -> None:
    from dlscale.cluster.options import ClusterOptions
    from dlscale.cluster.session import hold

    opts = ClusterOptions(nodes=nodes, link_bandwidth=None if (link_bandwidth or "").lower() in ("", "none") else
                          link_bandwidth, node_link_bandwidth=node_link_bandwidth or (), cpus=cpus_per_node,
                          partition=partition, health_check_interval_s=health_check_interval,
                          debian_hosts=debian_hosts)

    def ready(cluster) -> None:
        if health_check:
            cluster.set_health_check(cluster.health_check_command("--level", "1", "--drain-on-fail",
                                                                  "--resume-on-pass", "--format", "json"))
        doc = cluster.describe()
        if fmt == Format.json:
            print_json(doc)
        else:
            print(f"export SLURM_CONF={doc['slurm_conf']}")
        sys.stdout.flush()  # read by a script while this command runs on
        info(f"dlscale cluster: {len(doc['nodes'])} node(s) up in partition {doc['partition']}: "
             + ", ".join(f"{n['name']} {n['address']} ({n['link']})" for n in doc["nodes"]))
        info("dlscale cluster: export SLURM_CONF as above in the shell that submits; Ctrl-C here or "
             "`dlscale cluster down` stops it and removes everything it made")

    hold(opts, ready)
    info("dlscale cluster: stopped; every daemon, namespace, address, /etc/hosts line and file removed")


@app.command("down", help="Stop the rehearsal cluster `dlscale cluster up` holds (the only one, else the one $SLURM_CONF or WHICH names) and wait until it has removed everything it made.")
def down(
    which: Annotated[Optional[str], typer.Argument(help="Its slurm.conf, folder or process id (default: the only one up).", show_default=False)] = None,
) -> None:
    from dlscale.cluster.session import bring_down

    doc = bring_down(which)
    info(f"dlscale cluster: stopped the cluster of {doc['slurm_conf']} (pid {doc['pid']})")
