"""Options shared by every distributed command (train, scale, micro collectives), and the glue
that runs a data-parallel short test from ``dlscale train``. No torch at import time."""

from __future__ import annotations

from typing import Annotated, Optional

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
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds a rank may wait in the rendezvous or a collective; a crashed or hung rank ends the job after at most this long.")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads-per-rank", help="CPU threads per rank (default: cores / ranks on this machine).", show_default=False)]


def run_train(cfg, opts, db, fmt) -> bool:
    """Run ``dlscale train`` data-parallel when asked (or when a launcher started us); False otherwise.

    Under an external launcher (torchrun, srun, mpirun) this process is one rank: it runs the
    worker in place and rank 0 prints. Otherwise, with ``--nproc-per-node`` given, several nodes
    or emulated nodes, it launches the ranks with torchrun and prints rank 0's record.
    """
    from dlscale.distributed.env import detect
    from dlscale.errors import UsageError

    env = detect(master_addr=opts.master_addr, master_port=opts.master_port)
    if env is not None:
        if opts.emulate_nodes:
            raise UsageError("--emulate-nodes starts its own ranks; do not combine it with torchrun, srun or mpirun")
        asked = opts.world_size if (opts.force or opts.nnodes > 1) else None
        from dlscale.distributed.worker import WorkerSpec, run

        spec = WorkerSpec(config=cfg.to_dict(), db=db, backend=opts.backend, timeout_s=opts.timeout_s, report=True,
                          fmt=fmt.value, threads_per_rank=opts.threads_per_rank, expected_world_size=asked)
        if asked is not None and asked != env.world_size:
            raise UsageError(f"mismatched world size: {env.launcher} started {env.world_size} ranks but "
                             f"--nproc-per-node x --nnodes is {asked}")
        run(spec, env)
        return True
    if not opts.distributed:
        return False
    from dlscale.cli.common import info
    from dlscale.cli.train import report
    from dlscale.distributed.job import run_job

    where = (f"{opts.emulate_nodes} emulated nodes" + (f" at {opts.link_bandwidth}" if opts.link_bandwidth else "")
             if opts.emulate_nodes else f"{opts.nnodes} node(s)")
    info(f"dlscale train {cfg.model}: {opts.world_size} ranks ({opts.nproc_per_node} per node, {where}), "
         f"batch {cfg.batch_size} per rank")
    rec = run_job(cfg, opts, db)
    if rec is None:
        info(f"node {opts.node_rank}: done (node 0 records and prints the run)")
    else:
        report(rec, fmt)
    return True
