"""Options shared by every command that runs several processes (train, tta, scale, micro
collectives, micro links), declared once, and the one function that turns them into a ``Layout``.
No torch at import time."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

NprocOpt = Annotated[Optional[int], typer.Option("--nproc-per-node", help="Ranks (devices) on this node, run data-parallel (DDP) through torchrun; 1 runs one DDP rank (the ladder's baseline). Default: one plain process.", show_default=False)]
NnodesOpt = Annotated[int, typer.Option("--nnodes", help="Nodes in the job (start dlscale on each with its --node-rank).")]
NodeRankOpt = Annotated[int, typer.Option("--node-rank", help="This node's rank, 0..nnodes-1; node 0 hosts the rendezvous.")]
MasterAddrOpt = Annotated[str, typer.Option("--master-addr", help="Address of node 0 (the rendezvous).")]
MasterPortOpt = Annotated[Optional[int], typer.Option("--master-port", help="Rendezvous port (default: a free one on a single node, 29500 otherwise).", show_default=False)]
BackendOpt = Annotated[Optional[str], typer.Option("--backend", help="gloo | nccl | mpi (default: nccl on GPUs, gloo on CPU).", show_default=False)]
EmulateOpt = Annotated[Optional[int], typer.Option("--emulate-nodes", help="Run K nodes on this machine, each in its own network namespace (needs root and iproute2).", show_default=False)]
BandwidthOpt = Annotated[Optional[str], typer.Option("--link-bandwidth", help="Emulated link rate, e.g. 10gbit, 1gbit (tc tbf).", show_default=False)]
LatencyOpt = Annotated[Optional[str], typer.Option("--link-latency", help="Emulated link delay, e.g. 50us (tc netem; only where the kernel has netem).", show_default=False)]
NodeBandwidthOpt = Annotated[Optional[list[str]], typer.Option("--node-link-bandwidth", help="One emulated node's link rate instead of --link-bandwidth, NODE=RATE, e.g. 2=100mbit (repeat the option or separate with commas).", show_default=False)]
NodeQuotaOpt = Annotated[Optional[list[str]], typer.Option("--node-cpu-quota", help="Run one emulated node's torchrun and ranks under a CPU quota (a cgroup; needs root), NODE=CORES, e.g. 1=0.5 (repeat the option or separate with commas).", show_default=False)]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds a rank may wait in the rendezvous or a collective; a crashed or hung rank ends the job after at most this long.")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads-per-rank", help="CPU threads per rank (default: the CPUs this process may use / ranks on this machine).", show_default=False)]
CpuBindingOpt = Annotated[bool, typer.Option("--cpu-binding/--no-cpu-binding", help="Bind each rank on a GPU to the CPUs of its GPU's NUMA node (NVML's CPU affinity, within the CPUs the job owns); the record says how and each rank's CPUs.")]


def layout(nproc_per_node: int | None = None, nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1",
           master_port: int | None = None, backend: str | None = None, emulate_nodes: int | None = None,
           link_bandwidth: str | None = None, link_latency: str | None = None, timeout: float = 300.0,
           threads_per_rank: int | None = None, default_nproc: int = 1, node_link_bandwidth: list[str] | None = None,
           node_cpu_quota: list[str] | None = None, cpu_binding: bool = True) -> Any:
    """The options above as the one Layout (validated there). ``--nproc-per-node`` given at all,
    even 1, runs the job through the launcher (the ladder's one-rank DDP baseline)."""
    from dlscale.layout import Layout

    return Layout(nproc_per_node=default_nproc if nproc_per_node is None else nproc_per_node,
                  force=nproc_per_node is not None, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
                  master_port=master_port, backend=backend, emulate_nodes=emulate_nodes,
                  link_bandwidth=link_bandwidth, link_latency=link_latency, timeout_s=timeout,
                  threads_per_rank=threads_per_rank, node_link_bandwidth=node_link_bandwidth or (),
                  node_cpu_quota=node_cpu_quota or (), cpu_binding=cpu_binding)
