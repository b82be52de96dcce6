"""What went wrong in a failed job, named by rank and cause.

Each rank writes a small file into the job directory when it fails (its rank, node, the one-line
cause and whether it was a collective timing out or a peer going away); rank 0 writes the run id
it recorded (and where it kept it, when its database stayed away: ``stores.spool``). After the
launcher returns, ``diagnose`` combines those files with what torchrun reported (exit codes,
signals) into one line that names the rank that caused the failure:

- a rank that found the job's results wrong (``Finding``: e.g. devices that disagree bit for bit)
  says which ranks are at fault itself: its line is the job's;
- a rank that failed with its own error is the cause (the earliest one);
- otherwise a rank that left no report (killed by a signal, or hung) while the others timed out
  or lost their peer is the cause;
- otherwise the whole job ran past its time limit.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

SECONDARY = ("timeout", "peer")  # symptoms seen by the ranks that waited for the failed one


class Finding(RuntimeError):
    """A rank found the job's results wrong and its message names the ranks at fault: not a crash
    (the process group is sound, so the ranks leave together), and the message is the job's error."""


def classify(message: str) -> str:
    """'timeout' for a collective that timed out, 'peer' for a lost connection, else 'error'."""
    low = message.lower()
    if "timed out" in low or "timeout" in low or "deadline" in low:
        return "timeout"
    if any(s in low for s in ("connection closed", "connection reset", "broken pipe", "peer", "connection refused",
                              "socket closed", "read error", "writev", "ecconnreset")):
        return "peer"
    return "error"


def kind_of(cause: str, usage: bool = False, finding: bool = False) -> str:
    """A failure's kind: 'usage' (bad input found before the run), 'finding', else ``classify``'s."""
    return "usage" if usage else "finding" if finding else classify(cause)


def cause_of(e: BaseException) -> tuple[str, str]:
    """A failed rank's one-line cause and its kind: the error under a ``RunFailure`` as the harness
    describes it, else the exception's own words (a ``Finding``'s names the ranks at fault)."""
    from dlscale.errors import RunFailure, UsageError
    from dlscale.harness.runner import describe_failure

    inner = e.__cause__ if isinstance(e, RunFailure) and e.__cause__ else e
    finding = isinstance(inner, Finding)
    cause = str(inner) if finding or inner is e else describe_failure(inner)
    cause = " ".join((cause or type(e).__name__).split())
    return cause, kind_of(cause, isinstance(e, UsageError), finding)


def write_failure(job_dir: str | None, rank: int, node: int, cause: str, usage: bool = False,
                  finding: bool = False) -> None:
    """Report this rank's failure; ``usage`` marks bad input found before the run started,
    ``finding`` a ``Finding``."""
    if not job_dir:
        return
    kind = kind_of(cause, usage, finding)
    entry = {"rank": rank, "node": node, "cause": cause, "kind": kind,
             "time": time.time()}
    _write(Path(job_dir) / f"failure-{rank}.json", json.dumps(entry))


def note_elsewhere(job_dir: str | None, entries: list[dict[str, Any]]) -> None:
    """The failures of ranks on other nodes (``peers.failures_elsewhere``: their rank, node, cause, kind
    and time, as they published them), kept beside this node's reports, so that ``diagnose`` here names
    the rank that caused a lost connection and not the one that lost it."""
    for f in entries if job_dir else []:
        path = Path(job_dir) / f"failure-{f['rank']}.json"
        if not path.exists():
            _write(path, json.dumps({k: f[k] for k in ("rank", "node", "cause", "kind", "time")}))


def write_run_id(job_dir: str | None, run_id: str) -> None:
    if job_dir:
        _write(Path(job_dir) / "run_id", run_id)


def hand_over_spooled(job_dir: str | None) -> None:
    """The records this process kept in the local spool (its database stayed away), for the process
    that started it (a rank's for its launcher, a bounded check's for its acceptance)."""
    from dlscale.stores import spool

    entries = [e.to_dict() for e in spool.pending()]
    if job_dir and entries:
        _write(Path(job_dir) / "spooled.json", json.dumps(entries))


def take_over_spooled(job_dir: str) -> list[dict[str, Any]]:
    """What ``hand_over_spooled`` left in ``job_dir``, noted as this process's to report (``spool.note``)."""
    from dlscale.stores import spool

    p = Path(job_dir) / "spooled.json"
    entries = json.loads(p.read_text()) if p.exists() else []
    for entry in entries:
        spool.note(entry)
    return entries


def read_run_id(job_dir: str) -> str | None:
    p = Path(job_dir) / "run_id"
    return p.read_text().strip() if p.exists() else None


def read_failures(job_dir: str) -> list[dict[str, Any]]:
    out = []
    for p in sorted(Path(job_dir).glob("failure-*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda f: f["time"])


def diagnose(failures: list[dict[str, Any]], world_size: int, launcher_failures: list[Any] = (),
             timed_out: bool = False, timeout_s: float | None = None) -> str:
    """One line naming the rank that caused a failed job and why."""
    reported = {f["rank"] for f in failures}
    primary = [f for f in failures if f["kind"] not in SECONDARY]
    if primary:
        f = primary[0]
        return f["cause"] if f["kind"] == "finding" else f"rank {f['rank']} (node {f['node']}) failed: {f['cause']}"
    unreported = [lf for lf in launcher_failures if lf.rank not in reported]
    waited = failures[0] if failures else None
    symptom = ""
    if waited is not None:
        what = "timed out waiting for it" if waited["kind"] == "timeout" else "lost its connection"
        symptom = f"; rank {waited['rank']} {what}: {waited['cause']}"
    # torchrun's root cause, when that rank left no error of its own (killed by a signal, or exited).
    roots = [lf for lf in unreported if lf.root_cause] or ([] if waited else unreported)
    if roots:
        lf = roots[0]
        if lf.exitcode is not None and lf.exitcode < 0:
            return f"rank {lf.rank} was killed ({lf.detail or f'signal {-lf.exitcode}'}){symptom}"
        return f"rank {lf.rank} exited with code {lf.exitcode} and left no error{symptom}"
    silent = sorted(set(range(world_size)) - reported)
    if silent and waited is not None:
        return f"rank {silent[0]} stopped responding (hung or killed) and left no error{symptom}"
    if waited is not None:
        return f"rank {waited['rank']} (node {waited['node']}) failed: {waited['cause']}"
    if timed_out:
        return f"the job ran past its {timeout_s:g} s time limit and was ended (no rank reported an error)"
    return "the job failed before any rank reported (see the launcher output above)"


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
