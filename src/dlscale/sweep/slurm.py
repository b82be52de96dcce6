"""The Slurm executor of ``dlscale sweep --executor slurm``: one job per point, through submitit.

Each point becomes one Slurm job (``sbatch``, written by submitit) with the resources of the
file's ``slurm:`` block, named ``dlscale-<point hash>``. The job runs one task per node. A
one-node point runs in that task exactly as the local executor runs it (``run.run_point``: its
own ``dlscale`` process, its own timeout, a failure recorded), with srun's step variables hidden
so dlscale launches its own ranks as on a workstation. A multi-node point starts torchrun on
every node (``srun`` gives each node one task) with c10d rendezvous on the job's first node; each
rank then runs ``dlscale`` in place (``distributed.env``), and node 0 records the outcome.

The submitting process keeps a small state file (``<state dir>/<tag>.json``: the job id of each
point) and waits, polling Slurm, until every job has ended. A job that Slurm ended (time limit,
scancel, node failure, out of memory) is recorded failed with Slurm's state and reason, the only
place that knows it. Nothing is lost when the submitter dies: ``--resume`` skips the points the
store holds, re-attaches to the jobs still queued or running (by the state file, else by job
name), records the ones that ended meanwhile, and submits only the rest.

Job states come from ``scontrol show job`` (the controller's memory, ``MinJobAge``) and then
``sacct`` (the accounting database, where there is one). A controller that does not answer (down,
restarting) is not a job Slurm has forgotten: the submitter says so once and waits for it, and
``--resume`` does not submit again a job it cannot ask about. No torch at import time.

``dlscale accept --executor slurm`` (``accept.slurm``) submits its one job through the same
pieces: ``resources``, ``submit``, ``torchrun_on_node``, ``wait_for_jobs`` and the job states.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.errors import UsageError
from dlscale.log import info, warn
from dlscale.procs import die_with_parent
from dlscale.record import RunRecord, utc_now
from dlscale.store import Store
from dlscale.sweep.run import PointResult, finished_points, latest_by_point, newest_record, record_failure, run_point
from dlscale.sweep.spec import Point, SlurmOptions, Sweep

POLL_ENV = "DLSCALE_SLURM_POLL_S"  # seconds between looks at the queue (default 10)
JOB_PREFIX = "dlscale-"
RDZV_PORT_BASE = 29500
STEP_VARS = ("SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEPID")  # what makes dlscale think srun started it
QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
ENDED_BY_SLURM = {"TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                  "REVOKED"}


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
    whatever their count, which the submitting host cannot know."""
    params: dict[str, Any] = {"job_name": name, "nodes": nodes, "ntasks_per_node": 1, "time": time_min,
                              "srun_args": ["--whole"]}
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


# -- the state file --------------------------------------------------------------------------------------

def default_state_dir(store: Store, what: str = "sweeps") -> Path:
    """Beside a file store (``<its dir>/sweeps``); for a server store, the user's data directory
    (``what``: the folder's name, ``acceptances`` for ``dlscale accept --executor slurm``)."""
    from dlscale.paths import beside_db

    return beside_db(store.path, what)


def state_name(tag: str) -> str:
    """The tag as a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", tag) or "sweep"


@dataclass
class SweepState:
    """The job of each point of a sweep (by point hash), kept beside the store; written atomically."""

    path: Path
    name: str = ""
    tag: str = ""
    file: str = ""
    points: dict[str, dict[str, Any]] = field(default_factory=dict)  # hash -> index, label, job_id, submitted_at

    @classmethod
    def load(cls, path: Path) -> "SweepState":
        if not path.exists():
            return cls(path)
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"cannot read the sweep state file {path}: {e}; remove it to start afresh") from None
        return cls(path, doc.get("name", ""), doc.get("tag", ""), doc.get("file", ""), doc.get("points", {}))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        doc = {"name": self.name, "tag": self.tag, "file": self.file, "points": self.points}
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)

    def job_of(self, point: Point) -> str | None:
        return (self.points.get(point.hash) or {}).get("job_id")


def open_state(sweep: Sweep, state_dir: Path) -> SweepState:
    """The sweep's state file, with an entry for every point (job id None until submitted)."""
    st = SweepState.load(state_dir / f"{state_name(sweep.tag)}.json")
    st.name, st.tag, st.file = sweep.name, sweep.tag, str(Path(sweep.source).resolve()) if sweep.source else ""
    for p in sweep.points:
        entry = st.points.setdefault(p.hash, {"job_id": None, "submitted_at": None})
        entry.update(index=p.index, label=p.label)
    return st


# -- Slurm's view of the jobs ----------------------------------------------------------------------------

@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # Slurm's state, e.g. PENDING, RUNNING, COMPLETED, TIMEOUT, CANCELLED ("" when unreachable)
    reason: str = ""
    time_limit: str = ""
    unreachable: str = ""  # why Slurm could not be asked (controller down): the job's state is not known

    @property
    def phase(self) -> str:
        """queued | running | ended | unreachable."""
        if self.unreachable:
            return "unreachable"
        return "queued" if self.state in QUEUED else "running" if self.state in RUNNING else "ended"


def _ask(cmd: list[str]) -> tuple[str | None, str]:
    """``cmd``'s output where it succeeded (else None), and the first line of its error."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except OSError as e:
        return None, f"{cmd[0]}: {e.strerror}"
    except subprocess.TimeoutExpired:
        return None, f"{cmd[0]} gave no answer in 60 s"
    error = next((ln.strip() for ln in p.stderr.splitlines() if ln.strip()), f"{cmd[0]} exited with {p.returncode}")
    return (p.stdout if p.returncode == 0 else None), error


def _run(cmd: list[str]) -> str | None:
    return _ask(cmd)[0]


def job_states(job_ids: list[str]) -> dict[str, JobState]:
    """Slurm's state of each job: the controller's (``scontrol``), else the accounting database's (``sacct``).

    A job neither knows is missing from the result, but only where the controller answered that it
    does not know it ("Invalid job id": ended longer than ``MinJobAge`` ago). Where the controller
    could not be reached (down, restarting, a network fault) and accounting has no answer either,
    the job's state is ``unreachable``: it may well run on, and is not to be taken for gone.
    """
    out: dict[str, JobState] = {}
    down = ""
    for jid in job_ids:  # one call per job: `scontrol show job` of all jobs can be huge on a busy cluster
        text, error = _ask(["scontrol", "show", "job", "-o", jid]) if not down else (None, down)
        fields = dict(re.findall(r"(\w+)=(\S*)", text or ""))
        if fields.get("JobState"):
            out[jid] = JobState(jid, fields["JobState"], fields.get("Reason", ""), fields.get("TimeLimit", ""))
        elif text is None and "invalid job id" not in error.lower():
            down = error  # the controller does not answer: the other jobs' calls would wait as long
    rest = [j for j in job_ids if j not in out]
    if rest:
        text = _run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,Reason,Timelimit", "-j", ",".join(rest)]) or ""
        for line in text.splitlines():
            parts = line.split("|")
            if len(parts) >= 4 and parts[0] in rest:
                out[parts[0]] = JobState(parts[0], parts[1].split()[0] if parts[1] else "UNKNOWN", parts[2], parts[3])
    if down:
        out.update({j: JobState(j, "", unreachable=down) for j in rest if j not in out})
    return out


def active_jobs_by_name() -> dict[str, str]:
    """Point hash -> job id of this user's queued or running dlscale jobs (``squeue``)."""
    text = _run(["squeue", "-h", "--me", "-o", "%i %j"]) or ""
    found = {}
    for line in text.splitlines():
        jid, _, name = line.strip().partition(" ")
        if name.startswith(JOB_PREFIX):
            found[name[len(JOB_PREFIX):]] = jid
    return found


def slurm_reason(js: JobState) -> str:
    """One line naming the job and why Slurm ended it."""
    why = {"TIMEOUT": f"ran past its time limit ({js.time_limit or 'slurm.time'}) and was killed by Slurm",
           "CANCELLED": "was cancelled (scancel or an administrator)",
           "NODE_FAIL": "lost a node", "OUT_OF_MEMORY": "ran out of memory (raise slurm.mem)",
           "PREEMPTED": "was preempted", "BOOT_FAIL": "could not boot its node",
           "DEADLINE": "missed its deadline"}.get(js.state, "ended")
    reason = f"; reason {js.reason}" if js.reason and js.reason not in ("None", "(null)") else ""
    return f"Slurm job {js.job_id} {js.state}: {why}{reason}"


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
        return _result(point, rec)
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
    return _result(point, rec)


def _result(point: Point, rec: RunRecord) -> PointResult:
    return PointResult(point, rec.status, run_id=rec.run_id, error=rec.error, record=rec,
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
    waiting = _reattach(sweep, st, results) if resume else {}
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
    states = job_states(list(jobs.values()))
    return {p.hash: settle(p, states[jobs[p.hash]], store, sweep.name, st) for p in sweep.points
            if p.hash in jobs and jobs[p.hash] in states and states[jobs[p.hash]].state in ENDED_BY_SLURM}


def _reattach(sweep: Sweep, st: SweepState, results: dict[str, PointResult]) -> dict[str, str]:
    """Point hash -> job id of the jobs an earlier submitter left, for the points the store lacks:
    from the state file, else found queued or running by name. Ended ones are settled by ``_wait``."""
    by_name = active_jobs_by_name()
    jobs = {}
    for p in sweep.points:
        if p.hash in results:
            continue
        jid = st.job_of(p)
        if jid is None and p.hash in by_name:  # submitted just before the submitter died, not yet written down
            jid = by_name[p.hash]
            st.points[p.hash].update(job_id=jid, submitted_at=None)
        if jid is not None:
            jobs[p.hash] = jid
    states = job_states(list(jobs.values()))
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

    wait_for_jobs(waiting, ended)


def wait_for_jobs(waiting: dict[str, str], on_end: Callable[[str, JobState], None],
                  on_poll: Callable[[dict[str, JobState]], None] | None = None) -> None:
    """Poll Slurm (every ``DLSCALE_SLURM_POLL_S``) until every job of ``waiting`` (key -> job id) has
    ended, calling ``on_end(key, its last state)`` as each ends and ``on_poll(states)`` after each look.
    A controller that does not answer is waited for, said once when it stops and once when it answers
    again; a job that neither the controller nor accounting knows any more ends as UNKNOWN after three looks."""
    poll = float(os.environ.get(POLL_ENV, "10"))
    waiting = dict(waiting)
    unknown: dict[str, int] = {}
    outage = ""
    while waiting:
        states = job_states(list(waiting.values()))
        outage = _outage(outage, states)
        if on_poll:
            on_poll(states)
        for key, jid in list(waiting.items()):
            js = states.get(jid)
            if js is not None and js.phase == "unreachable":
                continue  # not known to have ended, nor to be gone: wait for Slurm to answer again
            unknown[jid] = 0 if js else unknown.get(jid, 0) + 1
            if js is None and unknown[jid] >= 3:  # neither the controller nor accounting knows it any more
                js = JobState(jid, "UNKNOWN", "Slurm has no record of the job (MinJobAge passed, no sacct)")
            if js is None or js.phase != "ended":
                continue
            del waiting[key]
            on_end(key, js)
        if waiting:
            time.sleep(poll)


def _outage(before: str, states: dict[str, JobState]) -> str:
    """Say when Slurm stops answering and when it answers again; the reason while it does not."""
    now = next((js.unreachable for js in states.values() if js.unreachable), "")
    if now and not before:
        warn(f"Slurm does not answer ({now}); the jobs run on without it: waiting for the controller")
    elif before and not now:
        info("Slurm answers again")
    return now


# -- status ----------------------------------------------------------------------------------------------

def find_state(target: str, state_dir: Path) -> tuple[SweepState, Sweep | None]:
    """The state of ``target``: a sweep file (its tag's state file) or a tag."""
    from dlscale.sweep import spec

    if Path(target).is_file():
        sweep = spec.load(target)
        path = state_dir / f"{state_name(sweep.tag)}.json"
    else:
        sweep, path = None, state_dir / f"{state_name(target)}.json"
    if not path.exists():
        known = sorted(p.stem for p in state_dir.glob("*.json")) if state_dir.is_dir() else []
        raise UsageError(f"no sweep submitted with --executor slurm is named {target!r} in {state_dir} "
                         f"(known tags: {', '.join(known) or 'none'}); give its file or tag, or its --state-dir")
    return SweepState.load(path), sweep


def status_rows(st: SweepState, store: Store) -> list[dict[str, Any]]:
    """One row per point: queued | running | unreachable (Slurm does not answer) | finished | failed |
    ended (not yet recorded) | not submitted."""
    entries = sorted(st.points.items(), key=lambda kv: kv[1].get("index", 0))
    states = job_states([e["job_id"] for _, e in entries if e.get("job_id")])
    recs = latest_by_point(store.query(), st.points)  # any kind and tag: a point may carry a tag of its own
    rows = []
    for h, e in entries:
        jid, rec = e.get("job_id"), recs.get(h)
        js = states.get(jid) if jid else None
        if js is not None and js.phase != "ended":
            status = js.phase
        elif rec is not None:
            status = "finished" if rec.status == "ok" else "failed"
        elif js is not None:
            status = "ended"  # Slurm ended it; the submitter (or --resume) records why
        else:
            status = "not submitted" if jid is None else "unknown"
        rows.append({"index": e.get("index", 0), "label": e.get("label", ""), "hash": h, "job_id": jid,
                     "status": status, "slurm_state": (js.state or None) if js else None,
                     "run_id": rec.run_id if rec else None, "error": rec.error if rec else None})
    return rows
