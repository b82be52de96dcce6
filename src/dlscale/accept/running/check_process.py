"""Each check of an acceptance in its own process, within its time limit.

``run`` starts ``python -m dlscale.accept.running.check_process JOB_FILE`` for one planned check (the job file:
the check, its options, the spec, the acceptance id, the store), in a session of its own and tied
to this process (``procs.die_with_parent``), forwards its output to stderr, and waits at most the
check's time limit. The check process makes ordinary recorded runs through ``suite.run_check``, so
its records reach the store as they finish, whatever happens to it later; afterwards they are read
back by the acceptance id. It is a subreaper (``procs.become_subreaper``): whatever it starts
stays below it, and a check past its limit is ended with its whole tree (``procs.end_tree``:
SIGTERM, which a run turns into an ``interrupted`` record and a launcher into the end of its
torchrun and ranks, then SIGKILL after ``GRACE_S`` to everything still there). What ended it, or
why it recorded nothing, is its ``problem``: judging makes that an ERROR naming the runs it had
recorded, whose figures are judged on their own (``acceptance.judge``). A run the check could not store
(its database stayed away past the retry window) is in the local spool: the check hands the spool's
notes over in its job folder, and they are noted here (the command ends naming the spool and the
push that delivers it, exit 1) and read back from the spool to be judged.

A test hook: ``DLSCALE_ACCEPT_HANG=CHECK`` makes that check's process hang at once, as a check
stuck in a driver call or a collective does: it ignores SIGTERM and starts a process in a session
of its own (as torchrun starts its ranks) that ignores SIGTERM too and starts another, all asleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.accept.plan import spec as specs, suite
from dlscale.format import fmt_count
from dlscale.procs import die_with_parent, end_tree
from dlscale.record import RunRecord

MODULE = "dlscale.accept.running.check_process"
# from SIGTERM to SIGKILL: a run records itself as interrupted; a launcher ends torchrun and its ranks (its
# own grace, distributed/launch.py's, is 5 s) and then records the run as interrupted
GRACE_S = 10.0
HANG_ENV = "DLSCALE_ACCEPT_HANG"
TAIL = 40


@dataclass
class CheckResult:
    """One check's process: its records, how long it took, and why it did not finish (None: it did)."""

    check: str
    records: list[RunRecord]
    seconds: float
    limit_s: float
    problem: str | None = None
    tail: list[str] = field(default_factory=list)  # its last lines of output


def run(p: suite.PlannedCheck, sp: specs.Spec, acc_id: str, db: str | None, limit_s: float,
        why_limit: str = "") -> CheckResult:
    """Run one planned check in its own process within ``limit_s`` seconds (``why_limit``: where the
    limit comes from, for the ERROR's reason); its outcome."""
    from dlscale.store import Store

    with Store.open(db) as store:
        path = str(store.path)
        before = {r.run_id for r in store.query(tag=acc_id)}
    with tempfile.TemporaryDirectory(prefix="dlscale-check-") as tmp:
        job = Path(tmp) / "check.json"
        job.write_text(json.dumps({"check": p.check, "options": p.options, "spec": sp.to_dict(), "acceptance": acc_id,
                                   "db": path}, default=str))
        t0 = time.monotonic()
        code, killed, tail = _supervise([sys.executable, "-m", MODULE, str(job)], limit_s)
        seconds = time.monotonic() - t0
        kept = _spooled(tmp)
    with Store.open(db) as store:
        records = [r for r in store.query(tag=acc_id, newest_first=False) if r.run_id not in before]
    records += [r for r in kept if r.run_id not in {x.run_id for x in records}]
    return CheckResult(p.check, records, seconds, limit_s, _problem(code, killed, tail, limit_s, why_limit, records), tail)


def _spooled(job_dir: str) -> list[RunRecord]:
    """The check's runs that went to the local spool (the database stayed away while it recorded them):
    noted in this process, so the command ends naming the spool and how to deliver them, and read back
    from the spool to be judged with the rest."""
    from dlscale.distributed.faults import take_over_spooled
    from dlscale.store import Store

    out = []
    for entry in take_over_spooled(job_dir):
        with Store.open(entry["spool"], create=False) as kept:
            out.append(kept.get(entry["run_id"]))
    return out


def _supervise(cmd: list[str], limit_s: float) -> tuple[int | None, list[int] | None, list[str]]:
    """(exit code, None) of the check's process, or (None, the pids ended) when it ran past ``limit_s``;
    and its last lines of output. Ctrl-C (or an error here) ends it and its tree before going on."""
    tail: deque[str] = deque(maxlen=TAIL)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            env=env, start_new_session=True, preexec_fn=die_with_parent())
    quiet = threading.Event()  # set on Ctrl-C here: what the ended check says then is kept, not shown
    pump = threading.Thread(target=_pump, args=(proc.stdout, tail, quiet), daemon=True)
    pump.start()
    killed = None
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        killed = end_tree(proc.pid, GRACE_S)
        proc.wait()
    except BaseException:
        quiet.set()  # the acceptance says the interruption in its one line
        end_tree(proc.pid, GRACE_S)
        proc.wait()
        raise
    pump.join(timeout=2.0)
    return (None if killed is not None else proc.returncode), killed, list(tail)


def _pump(stream: Any, tail: deque, quiet: threading.Event) -> None:
    for line in stream:
        tail.append(line.rstrip("\n"))
        if not quiet.is_set():
            sys.stderr.write(line)
    sys.stderr.flush()


def _problem(code: int | None, killed: list[int] | None, tail: list[str], limit_s: float, why_limit: str,
             records: list[RunRecord]) -> str | None:
    """Why the check did not finish, in one line (None: it did, and recorded its runs)."""
    last = next((ln.strip() for ln in reversed(tail) if ln.strip()), "")
    if killed is not None:
        said = f"; its last line: {last[:200]}" if last else ""
        return (f"ran past its time limit of {limit_s:g} s{why_limit} and was killed with "
                f"{fmt_count(len(killed), 'process', 'processes')}{said}")
    if code is not None and code < 0:
        return f"crashed: killed by {signal.Signals(-code).name}" + (f" ({last[:200]})" if last else "")
    if code == 0 and records:
        return None
    said = f": {last[:200]}" if last else ""
    if code == 0:
        return f"finished without recording a run{said}"
    return f"exited with {code}{' before recording a run' if not records else ''}{said}"


# -- in the check's process ------------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    """``python -m dlscale.accept.running.check_process JOB_FILE``: one check, its records into the store."""
    from dlscale.errors import RunFailure, UsageError
    from dlscale.procs import become_subreaper

    job = json.loads(Path(argv[0]).read_text())
    become_subreaper()
    _hang_if_asked(job["check"])

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)  # a run records itself as interrupted; a launcher ends its ranks
    try:
        sp = specs.Spec.from_dict(job["spec"])
        p = suite.PlannedCheck(job["check"], job["options"], specs.validate(sp, job["check"], job["options"]))
        suite.run_check(p, job["acceptance"], job["db"])
    except UsageError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except RunFailure as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        from dlscale.distributed.faults import hand_over_spooled

        hand_over_spooled(str(Path(argv[0]).parent))  # for the acceptance's process (``_spooled``)
    return 0


def _hang_if_asked(check: str) -> None:
    """The test hook of the module doc."""
    if os.environ.get(HANG_ENV) != check:
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sleeper = [sys.executable, "-c", "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, "
               "signal.SIG_IGN); p = subprocess.Popen(['sleep', '100000']); print(p.pid, flush=True); time.sleep(1e5)"]
    child = subprocess.Popen(sleeper, stdout=subprocess.PIPE, text=True, start_new_session=True)
    child.stdout.readline()  # its own child is started
    print(f"{check}: hanging ({HANG_ENV})", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    from dlscale import importguard

    importguard.install()  # a SIGTERM during torch's first import is delivered after it, not lost
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the records are stored: no interpreter teardown to hang in (threads, process groups)
