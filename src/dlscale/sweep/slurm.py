"""The Slurm executor of ``dlscale sweep --executor slurm``: one job per point, through submitit.

Each point becomes one Slurm job (``sbatch``, written by submitit) with the resources of the
file's ``slurm:`` block, named ``dlscale-<point hash>``. The job runs one task per node. A
one-node point runs in that task exactly as the local executor runs it (``run.run_point``: its
own ``dlscale`` process, its own timeout, a failure recorded), with srun's step variables hidden
so dlscale launches its own ranks as on a workstation. A multi-node point starts torchrun on
every node (``srun`` gives each node one task) with c10d rendezvous on the job's first node; each
rank then runs ``dlscale`` in place (``distributed.env``), and node 0 records the outcome.

The submitting process keeps a small state file (``sweep.state``: the job id of each point) and
waits, polling Slurm (``sweep.squeue``), until every job has ended. A job that Slurm ended (time
limit, scancel, node failure, out of memory) is recorded failed with Slurm's state and reason, the
only place that knows it. Nothing is lost when the submitter dies: ``--resume`` skips the points
the store holds, re-attaches to the jobs still queued or running (by the state file, else by job
name), records the ones that ended meanwhile, and submits only the rest. A controller that does
not answer is waited for, and ``--resume`` does not submit again a job it cannot ask about. No
torch at import time.

This module holds the job's resources and command line (``job_parameters``, ``resources``,
``torchrun_on_node``, ``PointJob``), submitting (``submit``), recording an ended job's outcome
(``settle``) and the sweep's driver (``run_slurm_sweep``). ``dlscale accept --executor slurm``
(``accept.slurm``) submits its one job through the same pieces: ``resources``, ``submit``,
``torchrun_on_node``, and ``squeue``'s ``wait_for_jobs`` and job states.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.procs import die_with_parent
from dlscale.record import RunRecord, utc_now
from dlscale.store import Store
from dlscale.sweep import squeue
from dlscale.sweep.driver import PointResult, finished_points, lost_points, newest_record, record_failure, run_point
from dlscale.sweep.slurmspec import SlurmOptions
from dlscale.sweep.spec import Point, Sweep
from dlscale.sweep.squeue import ENDED_BY_SLURM, JOB_PREFIX, JobState, slurm_reason
from dlscale.sweep.state import SweepState, default_state_dir, open_state

RDZV_PORT_BASE = 29500
STEP_VARS = ("SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEPID")  # what makes dlscale think srun started it


# -- the job's resources --------------------------------------------------------------------------------

def nodes_of(point: Point, opts: SlurmOptions) -> int:
    """The point's node count: its ``nnodes``, else ``slurm.nodes``, else 1."""
    return int(point.options.get("nnodes") or opts.nodes or 1)


def job_parameters(point: Point, opts: SlurmOptions) -> dict[str, Any]:
    """submitit ``SlurmExecutor.update_parameters`` for the point: one task per node, the block's resources."""
    ranks = int(point.options.get("nproc_per_node") or 1)
    # the block's time, else the point's own timeout plus a minute: the point's timeout fires first
    return resources(JOB_PREFIX + point.hash, nodes_of(point, opts), opts.time_min or math.ceil(point.timeout_s / 60) + 1,
                     opts, gpus=ranks if opts.gpus_per_node == "auto" else opts.gpus_per_node)


def resources(name: str, nodes: int, time_min: int, opts: SlurmOptions, gpus: int | str | None,
              whole_node: bool = False) -> dict[str, Any]:
    """A dlscale job's submitit parameters: named ``name``, one task per node (which starts that node's
    ranks itself), ``time_min`` minutes, ``gpus`` per node, and the rest of ``opts`` as given. The
    task's job step asks for every resource the job has on its node (``srun --whole``, Slurm >= 20.11):
    the ranks it starts share what the job was given, not the one CPU a step's task gets by default.
    ``whole_node``: the job asks for whole nodes, every CPU and all memory (``--exclusive --mem=0``),
    whatever their count, which the submitting host cannot know. The job is never requeued
    (``--no-requeue``, whatever the cluster's ``JobRequeue``): one that lost a node ends NODE_FAIL and
    is recorded so, instead of running again behind the submitter's back (``--resume`` runs it again)."""
    params: dict[str, Any] = {"job_name": name, "nodes": nodes, "ntasks_per_node": 1, "time": time_min,
                              "srun_args": ["--whole"], "additional_parameters": {"no_requeue": True}}
    for key in ("partition", "cpus_per_task", "account", "constraint", "qos", "mem"):
        if getattr(opts, key) is not None:
            params[key] = getattr(opts, key)
    if whole_node:
        params["exclusive"] = True
        params.setdefault("mem", "0")  # --exclusive gives every CPU and GPU but only the memory asked for
    if gpus:
        params["gpus_per_node"] = gpus
    if opts.setup:
        params["setup"] = list(opts.setup)
    return params


def point_argv(point: Point, nodes: int) -> list[str]:
    """The point's ``dlscale`` arguments in its job: ``--nnodes`` added where ``slurm.nodes`` set it."""
    argv = list(point.argv)
    if nodes > 1 and "nnodes" not in point.options:
        argv += ["--nnodes", str(nodes)]
    return argv


def torchrun_prefix(point: Point, nodes: int, environ: dict[str, str]) -> list[str]:
    """torchrun on this node of a multi-node point's job, running ``dlscale`` on each rank."""
    return [*torchrun_on_node(nodes, int(point.options.get("nproc_per_node") or 1), environ,
                              point.options.get("master_port")), "-m", "dlscale.cli.app"]


def torchrun_on_node(nodes: int, nproc: int, environ: dict[str, str], port: int | None = None) -> list[str]:
    """torchrun on this node of a multi-node job (its module and arguments follow): c10d rendezvous on
    the job's first node, the job id as rendezvous id, a port of its own (``port``, else one from the job id)."""
    from dlscale.distributed.env import expand_hostlist

    job_id = environ.get("SLURM_JOB_ID", "0")
    head = expand_hostlist(environ.get("SLURM_JOB_NODELIST", "localhost"))[0]
    port = int(port or RDZV_PORT_BASE + 1 + int(job_id) % 20000)
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{head}:{port}", "--rdzv-id", f"dlscale-{job_id}"]


@dataclass
class PointJob:
    """What each task of a point's job runs (pickled by submitit): the point, on this node."""

    point: Point
    db: str
    sweep_name: str
    nodes: int

    def __call__(self) -> dict[str, Any]:
        # submitit asks a job to requeue itself on SIGUSR2 before its time limit; a point is not
        # checkpointable, so it runs on until it ends or Slurm ends it (then recorded with the reason)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        from dataclasses import replace

        point = replace(self.point, argv=tuple(point_argv(self.point, self.nodes)))
        launcher = torchrun_prefix(point, self.nodes, dict(os.environ)) if self.nodes > 1 else None
        if int(os.environ.get("SLURM_NODEID", "0")) != 0:  # another node: its ranks; node 0 records
            cmd = [*launcher, *point.argv, "--format", "json", "--db", self.db]
            env = {k: v for k, v in os.environ.items() if k not in STEP_VARS}
            return {"node_returncode": subprocess.run(cmd, env={**env, "DLSCALE_SWEEP_POINT": point.hash},
                                                      preexec_fn=die_with_parent()).returncode}
        with Store.open(self.db) as store:
            res = run_point(point, store, self.sweep_name, launcher=launcher, drop_env=STEP_VARS)
        return {"status": res.status, "run_id": res.run_id, "error": res.error}


# -- submitting, waiting, recording --------------------------------------------------------------------

def make_executor(folder: Path, params: dict[str, Any]) -> Any:
    """A submitit ``SlurmExecutor`` writing its scripts and logs under ``folder`` (on a shared filesystem)."""
    import submitit

    ex = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=0)
    ex.update_parameters(**params)
    return ex


def submit(folder: Path, params: dict[str, Any], fn: Callable[[], Any], what: str) -> str:
    """Submit ``fn`` as one job (scripts and logs under ``folder``); its job id. sbatch refusing it
    (a bad partition, account, ...) is one UsageError naming ``what``."""
    ex = make_executor(folder, params)
    try:
        return str(ex.submit(fn).job_id)
    except Exception as e:  # noqa: BLE001 - sbatch refused (bad partition, account, ...): one line
        msg = " ".join(str(e).split())[-400:]
        raise UsageError(f"sbatch refused {what}: {msg}") from None


def submit_point(point: Point, sweep: Sweep, db: str, st: SweepState) -> str:
    """Submit the point's job; its id goes into the state file at once."""
    opts = sweep.slurm or SlurmOptions()
    folder = st.path.parent / st.path.stem / "%j"
    job_id = submit(folder, job_parameters(point, opts), PointJob(point, db, sweep.name, nodes_of(point, opts)),
                    f"point {point.index + 1} ({point.label})")
    st.points[point.hash].update(job_id=job_id, submitted_at=utc_now(), folder=str(folder))
    st.save()
    return job_id


def settle(point: Point, js: JobState, store: Store, sweep_name: str, st: SweepState) -> PointResult:
    """The outcome of a point whose job has ended: its own record, or one written here from Slurm's
    state (a job Slurm ended is recorded failed with Slurm's reason, over any record it left)."""
    entry = st.points.get(point.hash) or {}
    rec = newest_record(store, point, entry.get("submitted_at"))
    if rec is not None and (rec.status == "ok" or js.state not in ENDED_BY_SLURM):
        return _result(point, rec, js)
    error = slurm_reason(js) if js.state in ENDED_BY_SLURM else f"Slurm job {js.job_id} {js.state} without recording a run"
    if rec is not None:  # the point's own record of the same end (e.g. killed by SIGTERM): Slurm says why
        rec.fail(f"{error} ({rec.error})" if rec.error else error)
        rec.raw["slurm_job_id"], rec.raw["slurm_state"] = js.job_id, js.state
        rec.finished_at = rec.finished_at or utc_now()
        store.insert(rec)
    else:
        rec = record_failure(point, store, sweep_name, error, _log_tail(entry, js.job_id))
        rec.raw.update(slurm_job_id=js.job_id, slurm_state=js.state)
        store.insert(rec)
    return _result(point, rec, js)


def _result(point: Point, rec: RunRecord, js: JobState) -> PointResult:
    """The point's result: its record's outcome, and its time as Slurm counted the job's (start to end,
    every node's task; the queue's wait not counted), else the record's own (created to finished)."""
    return PointResult(point, rec.status, run_id=rec.run_id, error=rec.error, record=rec,
                       seconds=js.run_s if js.run_s is not None else max(0.0, rec.seconds or 0.0),
                       throughput=rec.metrics.get("throughput"), unit=rec.units.get("throughput"))


def _log_tail(entry: dict[str, Any], job_id: str) -> str:
    return log_tail(str(entry.get("folder") or ""), job_id)


def log_tail(folder: str, job_id: str, task: int = 0) -> str:
    """The end of a task's stderr log (submitit's ``<job id>_<task>_log.err`` in ``folder``), for a failure's record."""
    try:
        path = Path(folder.replace("%j", job_id)) / f"{job_id}_{task}_log.err"
        return "\n".join(path.read_text(errors="replace").splitlines()[-20:])
    except OSError:
        return ""


def run_slurm_sweep(sweep: Sweep, store: Store, resume: bool, state_dir: str | Path | None = None,
                    wait: bool = True, on_start: Callable[[Point], None] | None = None,
                    on_done: Callable[[PointResult], None] | None = None) -> list[PointResult]:
    """Submit the sweep's points as Slurm jobs and (``wait``) record every outcome; one result per point
    in order (``skipped``: in the store before; ``submitted``: not waited for)."""
    st = open_state(sweep, Path(state_dir) if state_dir else default_state_dir(store))
    st.save()
    db = str(store.path)
    done = finished_points(store, sweep) if resume else {}
    results: dict[str, PointResult] = _given_reasons(sweep, done, store, st) if resume else {}
    for p in sweep.points:
        if p.hash in done and p.hash not in results:
            run_id, status, error = done[p.hash]
            results[p.hash] = PointResult(p, "skipped", run_id=run_id, error=error)
    waiting = _reattach(sweep, st, results, lost_points(store, sweep)) if resume else {}
    for p in sweep.points:
        if p.hash not in results and p.hash not in waiting:
            if on_start:
                on_start(p)
            waiting[p.hash] = submit_point(p, sweep, db, st)
    for p in sweep.points:
        if p.hash in results and on_done:
            on_done(results[p.hash])
    if not wait:
        for p in sweep.points:
            results.setdefault(p.hash, PointResult(p, "submitted", error=f"Slurm job {waiting.get(p.hash)}"))
        return [results[p.hash] for p in sweep.points]
    _wait(sweep, waiting, store, st, results, on_done)
    return [results[p.hash] for p in sweep.points]


def _given_reasons(sweep: Sweep, done: dict[str, tuple[str, str, str | None]], store: Store,
                   st: SweepState) -> dict[str, PointResult]:
    """Failed records a job left before an earlier submitter could add why Slurm ended it (it died,
    or ran with --no-wait): settled now with Slurm's reason, once."""
    jobs = {}
    for p in sweep.points:
        if p.hash in done and done[p.hash][1] != "ok" and st.job_of(p):
            rec = store.get(done[p.hash][0]) if "," not in done[p.hash][0] else None
            if rec is not None and "slurm_state" not in rec.raw:
                jobs[p.hash] = st.job_of(p)
    states = squeue.job_states(list(jobs.values()))
    return {p.hash: settle(p, states[jobs[p.hash]], store, sweep.name, st) for p in sweep.points
            if p.hash in jobs and jobs[p.hash] in states and states[jobs[p.hash]].state in ENDED_BY_SLURM}


def _reattach(sweep: Sweep, st: SweepState, results: dict[str, PointResult], lost: dict[str, str]) -> dict[str, str]:
    """Point hash -> job id of the jobs an earlier submitter left, for the points the store lacks:
    from the state file, else found queued or running by name. Ended ones are settled by ``_wait``.
    A job already recorded as lost by Slurm (``lost``) is not waited for again: its point is submitted anew."""
    by_name = squeue.active_jobs_by_name()
    jobs = {}
    for p in sweep.points:
        if p.hash in results:
            continue
        jid = st.job_of(p)
        if jid is not None and lost.get(p.hash) == jid:
            jid = None
        if jid is None and p.hash in by_name:  # submitted just before the submitter died, not yet written down
            jid = by_name[p.hash]
            st.points[p.hash].update(job_id=jid, submitted_at=None)
        if jid is not None:
            jobs[p.hash] = jid
    states = squeue.job_states(list(jobs.values()))
    st.save()
    return {h: j for h, j in jobs.items() if j in states}  # a job Slurm has forgotten is submitted again


def _wait(sweep: Sweep, waiting: dict[str, str], store: Store, st: SweepState, results: dict[str, PointResult],
          on_done: Callable[[PointResult], None] | None) -> None:
    """Poll Slurm until every job has ended; record each outcome as it ends."""
    points = {p.hash: p for p in sweep.points}

    def ended(h: str, js: JobState) -> None:
        results[h] = settle(points[h], js, store, sweep.name, st)
        if on_done:
            on_done(results[h])

    squeue.wait_for_jobs(waiting, ended)
