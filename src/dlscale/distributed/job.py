"""A data-parallel short test as one job: launch the ranks, then read or record its outcome.

``run_job`` is what ``dlscale train --nproc-per-node N`` and ``dlscale scale`` call on the
launching machine. It launches ``worker`` on every rank through ``launch.launch`` (torchrun),
and afterwards returns the record rank 0 stored; when the job failed it writes the failure into
that record (or a new one, when rank 0 never got to record) with one line naming the rank and
the cause, and raises ``RunFailure``.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from dlscale.distributed import faults
from dlscale.distributed.launch import launch, validate
from dlscale.distributed.worker import MODULE, WorkerSpec
from dlscale.errors import RunFailure, UsageError

DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DistOptions:
    """How the ranks are laid out and started; validated at construction."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    backend: str | None = None
    emulate_nodes: int | None = None
    link_bandwidth: str | None = None
    link_latency: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    threads_per_rank: int | None = None
    force: bool = False  # run through torchrun even with one rank (e.g. --nproc-per-node 1)

    def __post_init__(self) -> None:
        validate(nproc_per_node=self.nproc_per_node, nnodes=self.nnodes, node_rank=self.node_rank,
                 master_port=self.master_port, emulate_nodes=self.emulate_nodes,
                 link_bandwidth=self.link_bandwidth, link_latency=self.link_latency, timeout_s=self.timeout_s)
        if self.backend not in (None, "gloo", "nccl", "mpi"):
            raise UsageError(f"unknown --backend {self.backend!r}; choose gloo, nccl or mpi")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            raise UsageError(f"--threads-per-rank must be >= 1, got {self.threads_per_rank}")
        if self.link_bandwidth:
            from dlscale.distributed.netns import parse_rate

            parse_rate(self.link_bandwidth)
        if self.link_latency:
            from dlscale.distributed.netns import parse_latency

            parse_latency(self.link_latency)

    @property
    def nodes(self) -> int:
        return self.emulate_nodes or self.nnodes

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def distributed(self) -> bool:
        return self.force or self.world_size > 1 or self.emulate_nodes is not None

    def link(self) -> dict[str, Any]:
        if not self.emulate_nodes:
            return {}
        return {"emulated": True, "nodes": self.emulate_nodes, "link_bandwidth": self.link_bandwidth,
                "link_latency": self.link_latency}


def run_job(cfg: Any, opts: DistOptions, db: str | None) -> Any:
    """Launch the job; return rank 0's record (None on a node other than 0); RunFailure if it failed."""
    from dlscale.store import Store

    job_dir = tempfile.mkdtemp(prefix="dlscale-job-")
    # Emulated nodes share one host: gloo over the shaped link (nccl would take P2P/shared memory).
    backend = opts.backend or ("gloo" if opts.emulate_nodes else None)
    spec = WorkerSpec(config=cfg.to_dict(), db=str(Store.open(db).path), backend=backend,
                      timeout_s=opts.timeout_s, job_dir=job_dir, threads_per_rank=opts.threads_per_rank,
                      expected_world_size=opts.world_size, link=opts.link())
    try:
        res = launch(MODULE, spec.to_args(), nproc_per_node=opts.nproc_per_node, nnodes=opts.nnodes,
                     node_rank=opts.node_rank, master_addr=opts.master_addr, master_port=opts.master_port,
                     emulate_nodes=opts.emulate_nodes, link_bandwidth=opts.link_bandwidth,
                     link_latency=opts.link_latency, timeout_s=None,
                     threads_per_rank=opts.threads_per_rank, rdzv_timeout_s=opts.timeout_s)
        run_id = faults.read_run_id(job_dir)
        failures = faults.read_failures(job_dir)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every process of the job is ended already
        if opts.node_rank == 0 or opts.emulate_nodes:
            with Store.open(db) as store:
                rec = _failed_record(cfg, opts)
                rec.fail("interrupted (Ctrl-C or SIGTERM) before the run finished")
                store.insert(rec)
        raise
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    usage = [f for f in failures if f["kind"] == "usage"]
    if usage and not run_id:  # bad input found by the ranks before the run started: nothing to record
        raise UsageError(usage[0]["cause"])
    with Store.open(db) as store:
        if res.returncode == 0:
            return store.get(run_id) if run_id else None
        msg = faults.diagnose(failures, opts.world_size, res.failures)
        if opts.node_rank != 0 and not opts.emulate_nodes:
            raise RunFailure(f"node {opts.node_rank}: {msg}")
        rec = store.get(run_id) if run_id else _failed_record(cfg, opts)
        rec.fail(msg)
        store.insert(rec)
    raise RunFailure(f"run {rec.run_id} failed: {msg}", run_id=rec.run_id)


def _failed_record(cfg: Any, opts: DistOptions) -> Any:
    from dlscale.record import RunRecord
    from dlscale.system import collect_cached

    config = {**cfg.to_dict(), "world_size": opts.world_size, "nodes": opts.nodes,
              "devices_per_node": opts.nproc_per_node, "backend": opts.backend,
              "launcher": "torchrun", "emulated_nodes": bool(opts.emulate_nodes),
              "link_bandwidth": opts.link_bandwidth, "link_latency": opts.link_latency,
              "threads_per_rank": opts.threads_per_rank, "dist_timeout_s": opts.timeout_s}
    return RunRecord(kind="train", workload=cfg.model, config=config, system=collect_cached(), tag=cfg.tag)
