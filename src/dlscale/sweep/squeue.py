"""Asking Slurm about jobs: their states (``scontrol``, else ``sacct``), this user's queued dlscale
jobs by name (``squeue``), why Slurm ended one, and the loop that waits for jobs to end.

Job states come from ``scontrol show job`` (the controller's memory, ``MinJobAge``) and then
``sacct`` (the accounting database, where there is one), each with how long the job ran (a point's
time in the sweep's table). A controller that does not answer (down,
restarting) is not a job Slurm has forgotten: the state is ``unreachable``, the waiting loop says
so once and waits for it, and ``--resume`` does not submit again a job it cannot ask about.

Used by the sweep's executor (``sweep.slurm``), its state file's status (``sweep.state``) and
``dlscale accept --executor slurm`` (``accept.slurm``). They call ``job_states`` and
``active_jobs_by_name`` through this module, so a test that patches them here patches them for all.
No torch at import time.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from dlscale.log import info, warn

POLL_ENV = "DLSCALE_SLURM_POLL_S"  # seconds between looks at the queue (default 10)
JOB_PREFIX = "dlscale-"
QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
ENDED_BY_SLURM = {"TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                  "REVOKED"}


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # Slurm's state, e.g. PENDING, RUNNING, COMPLETED, TIMEOUT, CANCELLED ("" when unreachable)
    reason: str = ""
    time_limit: str = ""
    unreachable: str = ""  # why Slurm could not be asked (controller down): the job's state is not known
    run_s: float | None = None  # how long the job has run (ran, once ended): scontrol's RunTime, sacct's Elapsed

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
            out[jid] = JobState(jid, fields["JobState"], fields.get("Reason", ""), fields.get("TimeLimit", ""),
                                run_s=run_seconds(fields.get("RunTime", "")))
        elif text is None and "invalid job id" not in error.lower():
            down = error  # the controller does not answer: the other jobs' calls would wait as long
    rest = [j for j in job_ids if j not in out]
    if rest:
        text = _run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,Reason,Timelimit,ElapsedRaw", "-j", ",".join(rest)]) or ""
        for line in text.splitlines():
            parts = line.split("|")
            if len(parts) >= 5 and parts[0] in rest:
                out[parts[0]] = JobState(parts[0], parts[1].split()[0] if parts[1] else "UNKNOWN", parts[2], parts[3],
                                         run_s=float(parts[4]) if parts[4].isdigit() else None)
    if down:
        out.update({j: JobState(j, "", unreachable=down) for j in rest if j not in out})
    return out


def run_seconds(text: str) -> float | None:
    """Slurm's ``[D-]HH:MM:SS`` (or ``MM:SS``) in seconds; None where it is not one (``INVALID``, empty)."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if m is None:
        return None
    days, hours, mins, secs = (int(g or 0) for g in m.groups())
    return float(((days * 24 + hours) * 60 + mins) * 60 + secs)


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
