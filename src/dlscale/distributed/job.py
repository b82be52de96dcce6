"""The one launcher of every multi-process job: start the ranks, collect the outcome, record failures.

A *family* (``train``, ``tta``, ``collectives``, ...) says what one rank runs: a module with
``run_rank(spec: RankSpec, env: DistEnv) -> RunRecord | None`` (rank 0 returns the record it
stored, the others None). ``run_job`` runs it on every rank of a ``Layout``:

- started by an external launcher (torchrun, Slurm ``srun``, OpenMPI ``mpirun``): in place, this
  process being one rank;
- otherwise through torchrun (``launch.launch``): one node, several nodes with ``--nnodes``
  (static rendezvous at the master), or emulated nodes in network namespaces. Every rank runs
  ``python -m dlscale.distributed.rank --spec JSON``, whose failure handler is the same for
  every family.

Afterwards the record rank 0 stored is read back (from the local spool where rank 0 had to keep it
because its database stayed away: ``stores.spool``). A failed job is written into that record (or a
new one, when rank 0 never got to record) with one line naming the rank and the cause
(``faults.diagnose``); Ctrl-C or SIGTERM leaves an ``interrupted`` record. Either way
``RunFailure`` follows. Bad input found by the ranks before the run is a ``UsageError``.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from dlscale.distributed import faults
from dlscale.errors import RunFailure, UsageError
from dlscale.format import fmt_count
from dlscale.layout import Layout

RANK_MODULE = "dlscale.distributed.rank"

# family -> (module with run_rank, record kind, config key naming the workload)
FAMILIES: dict[str, tuple[str, str, str | None]] = {
    "train": ("dlscale.distributed.worker", "train", "model"),
    "tta": ("dlscale.tta.worker", "tta", "model"),
    "collectives": ("dlscale.micro.coll_worker", "micro", None),
    "links": ("dlscale.micro.link_worker", "micro", None),
    "burnin": ("dlscale.micro.burn_worker", "micro", None),
}


@dataclass
class RankSpec:
    """What every rank runs: the family, its config (a typed config's fields), the layout, where to record."""

    family: str
    config: dict[str, Any]
    layout: dict[str, Any] = field(default_factory=dict)
    db: str | None = None
    job_dir: str | None = None  # where ranks report failures and rank 0 the run id
    price: dict[str, Any] | None = None  # cost.Price's fields: rank 0 records the run's cost at it

    @property
    def run_price(self) -> Any:
        from dlscale.cost import Price

        return Price(**self.price) if self.price else None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise UsageError(f"unknown job family {self.family!r}; known: {', '.join(FAMILIES)}")

    @property
    def layout_config(self) -> Layout:
        return Layout(**self.layout)

    def to_args(self) -> list[str]:
        return ["--spec", json.dumps(asdict(self), default=str)]

    @classmethod
    def from_json(cls, text: str) -> "RankSpec":
        return cls(**json.loads(text))


def rank_function(family: str) -> Any:
    """The family's ``run_rank``."""
    return importlib.import_module(FAMILIES[family][0]).run_rank


def workload_of(family: str, config: dict[str, Any]) -> str:
    key = FAMILIES[family][2]
    return str(config.get(key)) if key else family


def run_job(family: str, config: dict[str, Any], layout: Layout, db: str | None, price: Any = None) -> Any:
    """Run ``family`` on every rank of ``layout``; rank 0's record (None on a node other than 0).

    ``price`` (cost.Price): rank 0 records the run's cost figures at it.

    Raises ``RunFailure`` (recorded as failed or interrupted) when the job failed, ``UsageError``
    when the ranks refused their input before the run started.
    """
    from dlscale.distributed.env import detect

    env = detect(master_addr=layout.master_addr, master_port=layout.master_port)
    if env is not None:
        return run_in_place(family, config, layout, db, env, price)
    from dlscale.distributed import placement
    from dlscale.distributed.env import check_backend
    from dlscale.store import Store

    check_backend(layout.backend, launcher="torchrun")  # e.g. mpi without MPI: refused before any rank starts
    placement.check(layout, config)  # more ranks than GPUs, NCCL over MIG: refused before any rank starts
    with Store.open(db) as store:  # an unwritable database is a usage error before anything starts
        path = str(store.path)
    job_dir = tempfile.mkdtemp(prefix="dlscale-job-")
    spec = RankSpec(family=family, config=config, layout=layout.to_dict(), db=path, job_dir=job_dir,
                    price=asdict(price) if price is not None else None)
    try:
        res = _launch(spec, layout, placement.launch_env(layout, config))
        run_id, failures = faults.read_run_id(job_dir), faults.read_failures(job_dir)
        faults.take_over_spooled(job_dir)  # rank 0's spooled records: this process reports them
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every process of the job is ended already
        if layout.node_rank == 0:
            _record_failure(family, config, layout, db, None, "interrupted (Ctrl-C or SIGTERM) before the run finished")
        raise
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    usage = [f for f in failures if f["kind"] == "usage"]
    if usage and not run_id:  # bad input found by the ranks before the run started: nothing to record
        raise UsageError(usage[0]["cause"])
    if res.returncode == 0:
        if run_id:
            with Store.open_holding(db, run_id) as store:
                return store.get(run_id)
        return None
    msg = faults.diagnose(failures, layout.world_size, res.failures, timed_out=res.timed_out,
                          timeout_s=layout.timeout_s)
    if layout.node_rank != 0:
        raise RunFailure(f"node {layout.node_rank}: {msg}")
    rec = _record_failure(family, config, layout, db, run_id, msg, log_tail=res.log_tail)
    raise RunFailure(f"run {rec.run_id} failed: {msg}", run_id=rec.run_id)


def done_elsewhere(layout: Layout) -> str:
    """What a process whose job's run rank 0 records says at its end: its rank and node as the launcher
    that started it numbered them (torchrun's GROUP_RANK, which c10d assigns, srun's SLURM_NODEID,
    mpirun's node rank), else the node of ``layout`` (``--node-rank``, under dlscale's own launcher)."""
    from dlscale.distributed.env import detect

    env = detect(master_addr=layout.master_addr, master_port=layout.master_port)
    if env is None:
        return f"node {layout.node_rank}: done (node 0 records and prints the run)"
    return f"rank {env.rank} (node {env.node_rank}): done (rank 0 records and prints the run)"


def run_in_place(family: str, config: dict[str, Any], layout: Layout, db: str | None, env: Any,
                 price: Any = None) -> Any:
    """This process is one rank of a job an external launcher started: run it here."""
    if layout.emulate_nodes:
        raise UsageError("--emulate-nodes starts its own ranks; do not combine it with torchrun, srun or mpirun")
    asked = layout.world_size if (layout.force or layout.nnodes > 1 or layout.nproc_per_node > 1) else None
    if asked is not None and asked != env.world_size:
        raise UsageError(f"mismatched world size: {env.launcher} started {fmt_count(env.world_size, 'rank')} but "
                         f"--nproc-per-node x --nnodes is {asked}")
    from dlscale.distributed import placement

    placement.check_mig(layout, config, env.world_size)  # two ranks on one GPU: found as the ranks join
    spec = RankSpec(family=family, config=config, layout=layout.to_dict(), db=db,
                    price=asdict(price) if price is not None else None)
    try:
        return rank_function(family)(spec, env)
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - told to the other ranks, recorded by rank 0
        _in_place_failure(family, config, layout, db, env, e)
        raise


def _in_place_failure(family: str, config: dict[str, Any], layout: Layout, db: str | None, env: Any,
                      e: BaseException) -> None:
    """A rank of a launcher's job failed: the other ranks are told through the job's store (``peers``:
    they end at once where they wait for this one); an error that no record holds yet (the ranks did
    not meet, say) is recorded by rank 0 and raised as a ``RunFailure``, in one line, on every rank."""
    from dlscale.distributed import peers

    cause, kind = faults.cause_of(e)
    peers.publish_failure(env, cause, kind)
    if isinstance(e, (UsageError, KeyboardInterrupt)):
        return
    line = cause
    elsewhere = peers.failures_elsewhere(env.rank) if kind in faults.SECONDARY else []
    if elsewhere:  # a lost peer or a timeout caused by a rank on another node: name that rank and its cause
        mine = {"rank": env.rank, "node": env.node_rank, "cause": cause, "kind": kind, "time": time.time()}
        line = faults.diagnose([*elsewhere, mine], env.world_size)
    if isinstance(e, RunFailure) and not elsewhere:  # recorded already, with its cause
        return
    if env.rank != 0:
        raise RunFailure(f"rank {env.rank} (node {env.node_rank}): {line}") from e
    rec = _record_failure(family, config, layout, db, e.run_id if isinstance(e, RunFailure) else None, line,
                          network=peers.JOINED)
    raise RunFailure(f"run {rec.run_id} failed: {line}", run_id=rec.run_id) from e


def _launch(spec: RankSpec, layout: Layout, placed: dict[str, str]) -> Any:
    """torchrun over the ranks, each told how it is bound to CPUs and the job's CPUs (``placement.launch_env``)."""
    from dlscale.distributed.launch import launch

    return launch(RANK_MODULE, spec.to_args(), layout, timeout_s=None, extra_env=placed)


def _record_failure(family: str, config: dict[str, Any], layout: Layout, db: str | None, run_id: str | None,
                    msg: str, log_tail: list[str] | None = None, network: list[dict[str, Any]] | None = None) -> Any:
    """Write the failure into rank 0's record, or a new one when rank 0 never recorded (with ``network``,
    every rank's interface and address as the ranks met, where they did: ``peers.JOINED``)."""
    from dlscale.harness.runner import SWEEP_POINT_ENV
    from dlscale.record import RunRecord, utc_now
    from dlscale.store import Store
    from dlscale.system import collect_cached

    with Store.open_holding(db, run_id) as store:
        rec = store.get(run_id) if run_id else None
        if rec is None:
            rec = RunRecord(kind=FAMILIES[family][1], workload=workload_of(family, config),
                            config={**config, **layout.config()}, system=collect_cached(), tag=config.get("tag"))
            if network:
                rec.config["rank_network"] = [dict(e) for e in network]
            if os.environ.get(SWEEP_POINT_ENV):  # a sweep's point: found by its hash, as execute's records are
                rec.raw["sweep_point"] = os.environ[SWEEP_POINT_ENV]
        rec.fail(msg)
        if log_tail:
            rec.raw["launcher_log"] = log_tail[-200:]
        rec.finished_at = rec.finished_at or utc_now()
        store.insert(rec)
    return rec

