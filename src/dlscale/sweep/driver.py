"""Run a sweep's points, each in its own process with a timeout, and record every outcome.

Each point is the command line a user would type (``dlscale train MODEL ...``, ``dlscale micro
KIND ...``) plus ``--format json --db DB``, run by this Python in a new session (so Ctrl-C
reaches the sweep, which then kills the point), with ``DLSCALE_SWEEP_POINT`` set to
the point's hash: the harness stores it in the record, in the same transaction as the result,
so a finished point is known by the store alone. A point that dies without writing its record
(timeout, crash, bad option) is recorded here as failed with its error. The child is killed if
the sweep itself dies (``procs.die_with_parent``), and a point's torchrun and ranks die with the
point, so a ``kill -9`` of the sweep leaves no orphan that could record a point twice;
``--resume`` then skips every point the store already holds (by its latest record), except a point
whose Slurm job Slurm ended for a cause outside it (``lost_points``: a node lost, preemption, a
node that would not boot), which runs again.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from dlscale.harness.runner import SWEEP_POINT_ENV
from dlscale.procs import die_with_parent
from dlscale.record import RunRecord, utc_now
from dlscale.store import Store
from dlscale.sweep.fields import record_kind
from dlscale.sweep.spec import Point, Sweep

KILL_GRACE_S = 5.0
# Slurm ended the job for a cause outside the point (sweep.squeue's states): its point runs again on --resume
LOST_BY_SLURM = ("NODE_FAIL", "PREEMPTED", "BOOT_FAIL")


@dataclass
class PointResult:
    point: Point
    status: str  # ok | failed | skipped (already in the store)
    run_id: str | None = None
    error: str | None = None
    seconds: float = 0.0
    throughput: float | None = None
    unit: str | None = None
    record: RunRecord | None = None  # the point's record, read back by api.sweep


def sweep_cost(results: Sequence[PointResult]) -> tuple[float | None, int, int]:
    """(the summed ``cost_of_run`` of the points' records, how many had one, how many had none):
    what the sweep's runs cost at the price each point ran with (docs/METRICS.md, "Energy and cost")."""
    costs = [r.record.metrics.get("cost_of_run") if r.record is not None else None for r in results]
    priced = [c for c in costs if isinstance(c, (int, float))]
    return (math.fsum(priced) if priced else None), len(priced), len(costs) - len(priced)


def finished_points(store: Store, sweep: Sweep) -> dict[str, tuple[str, str, str | None]]:
    """Point hash -> (run id, status, error) for every point of the sweep the store holds: its latest
    record, where it has several (``latest_by_point``); not a point whose job Slurm lost (``lost_points``)."""
    latest = latest_by_point(store.query(kind=record_kind(sweep.command)), {p.hash for p in sweep.points})
    return {h: (rec.run_id, rec.status, rec.error) for h, rec in latest.items()
            if rec.raw.get("slurm_state") not in LOST_BY_SLURM}


def lost_points(store: Store, sweep: Sweep) -> dict[str, str]:
    """Point hash -> Slurm job id of the points whose latest record says Slurm ended their job for a
    cause outside the point (``LOST_BY_SLURM``: its node lost, preempted, a node that did not boot):
    ``--resume`` runs them again in a new job."""
    latest = latest_by_point(store.query(kind=record_kind(sweep.command)), {p.hash for p in sweep.points})
    return {h: str(rec.raw.get("slurm_job_id")) for h, rec in latest.items()
            if rec.raw.get("slurm_state") in LOST_BY_SLURM}


def latest_by_point(records: Sequence[RunRecord], wanted: Collection[str]) -> dict[str, RunRecord]:
    """Point hash -> the record of that point written last (``finished_at``, else ``created_at``):
    a point recorded twice (run again after a failure; a job recorded as lost that then recorded
    itself, or ran again after Slurm requeued it) counts as its latest outcome."""
    latest: dict[str, RunRecord] = {}
    for rec in records:
        h = rec.raw.get("sweep_point")
        if h in wanted and (h not in latest or _written(rec) > _written(latest[h])):
            latest[h] = rec
    return latest


def _written(rec: RunRecord) -> tuple[str, str]:
    return rec.finished_at or rec.created_at, rec.created_at


def run_sweep(
    sweep: Sweep,
    store: Store,
    resume: bool,
    on_start: Callable[[Point], None] | None = None,
    on_done: Callable[[PointResult], None] | None = None,
) -> list[PointResult]:
    """Run every point (skipping those already finished when ``resume``), in order."""
    done = finished_points(store, sweep) if resume else {}
    results = []
    for point in sweep.points:
        if point.hash in done:
            run_id, status, error = done[point.hash]
            res = PointResult(point, "skipped", run_id=run_id, error=error)
        else:
            if on_start:
                on_start(point)
            res = run_point(point, store, sweep.name)
        results.append(res)
        if on_done:
            on_done(res)
    return results


def dlscale_command() -> list[str]:
    """The ``dlscale`` program as this Python runs it: a point runs what a user types, in its own
    interpreter (a subprocess of the command's entry module; nothing here imports the CLI)."""
    return [sys.executable, "-m", "dlscale.cli.app"]


def run_point(point: Point, store: Store, sweep_name: str, launcher: Sequence[str] | None = None,
              drop_env: Sequence[str] = ()) -> PointResult:
    """Run one point in its own process; make sure the store holds its outcome.

    ``launcher`` runs the point's ``dlscale`` arguments instead of this Python (the Slurm executor
    passes torchrun for a multi-node point); ``drop_env`` are variables the point must not see.
    A point that kept its record in the local spool (its database stayed away) is noted
    (``stores.spool``), so that the command names the spool at its end.
    """
    cmd = [*(launcher or dlscale_command()), *point.argv, "--format", "json", "--db", str(store.path)]
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    env[SWEEP_POINT_ENV] = point.hash
    t0, since = time.monotonic(), utc_now()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=die_with_parent())
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=point.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        stdout, stderr = _kill(proc)
    except BaseException:  # Ctrl-C or an error in the sweep: the point must not run on alone
        _kill(proc)
        raise
    seconds = time.monotonic() - t0
    rec = _record_from_stdout(stdout) or (None if timed_out else _stored_since(store, point, since))
    _note_spooled(rec, store)
    if rec is not None and rec.get("run_id") and not timed_out:
        m = rec.get("metrics") or {}
        return PointResult(point, rec.get("status", "failed"), run_id=rec["run_id"], error=rec.get("error"),
                           seconds=seconds, throughput=m.get("throughput"), unit=(rec.get("units") or {}).get("throughput"))
    if timed_out:
        error = f"timed out after {point.timeout_s:g} s (timeout_per_run) and was killed"
    elif proc.returncode < 0:
        error = f"crashed: killed by {signal.Signals(-proc.returncode).name}"
    elif proc.returncode == 0:
        error = f"finished without recording a run: {last_line(stderr)}"
    elif proc.returncode == 2:
        error = f"rejected: {last_line(stderr)}"
    else:
        error = f"crashed with exit code {proc.returncode}: {last_line(stderr)}"
    failed = record_failure(point, store, sweep_name, error, stderr)
    return PointResult(point, "failed", run_id=failed.run_id, error=error, seconds=seconds)


def _note_spooled(rec: dict | None, store: Store) -> None:
    """A point whose record went to the local spool (its database stayed away): this process says so at its end."""
    kept = ((rec or {}).get("raw") or {}).get("spooled")
    if kept:
        from dlscale.stores import spool

        spool.note(spool.Spooled(rec["run_id"], str(spool.spool_path(str(store.path))), str(store.path),
                                 store.location, kept.get("reason", "")))


def _stored_since(store: Store, point: Point, since: str) -> dict | None:
    """The point's record written since ``since`` (when its output was not one JSON document, as
    under torchrun, whose ranks share its stdout), as the fields ``run_point`` reads."""
    rec = newest_record(store, point, since)
    if rec is None:
        return None
    return {"run_id": rec.run_id, "status": rec.status, "error": rec.error, "metrics": rec.metrics, "units": rec.units}


def newest_record(store: Store, point: Point, since: str | None = None) -> RunRecord | None:
    """The newest record of this point (by its hash) created at or after ``since``, or None."""
    for rec in store.query(kind=record_kind(point.command)):
        if rec.raw.get("sweep_point") == point.hash and (since is None or rec.created_at >= since):
            return rec
    return None


def _kill(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGTERM the point's process group (torchrun and its workers too), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return "", ""


def _record_from_stdout(stdout: str | None) -> dict | None:
    try:
        doc = json.loads(stdout or "")
    except json.JSONDecodeError:
        return None
    if isinstance(doc, list):  # a command that records several runs (e.g. `micro all`): one outcome
        recs = [d for d in doc if isinstance(d, dict) and d.get("run_id")]
        if not recs:
            return None
        bad = [d for d in recs if d.get("status") != "ok"]
        return {"run_id": ",".join(d["run_id"] for d in recs), "status": "failed" if bad else "ok",
                "error": "; ".join(str(d.get("error")) for d in bad) or None}
    return doc if isinstance(doc, dict) else None


def last_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return "(no output)"
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors[-1] if errors else lines[-1])[:400]


def record_failure(point: Point, store: Store, sweep_name: str, error: str, stderr: str | None) -> RunRecord:
    """A failed record for a point that died without writing its own."""
    from dlscale.system import collect

    workload = str(point.options.get("model") or point.options.get("kind") or point.command)
    rec = RunRecord(
        kind=record_kind(point.command), workload=workload, config={**point.options, "sweep": sweep_name},
        system=collect(with_torch=False), tag=point.options.get("tag"),
        raw={"sweep_point": point.hash, "stderr_tail": (stderr or "").splitlines()[-20:]},
    )
    if rec.system.get("slurm"):  # written inside a Slurm job (the Slurm executor): which one
        rec.raw["slurm_job_id"] = rec.system["slurm"]["job_id"]
    rec.fail(error)
    rec.finished_at = utc_now()
    store.insert(rec)
    return rec
