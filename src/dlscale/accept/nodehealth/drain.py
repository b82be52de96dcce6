"""An acceptance as Slurm's node health check: drain the node on a failure, return it to service on a pass.

What Slurm expects (slurm.conf(5), Slurm 22.05): a ``HealthCheckProgram`` runs as root on every
node each ``HealthCheckInterval`` seconds (and when slurmd starts, before it registers), is killed
if it has not ended within 60 s, and acts on its own: it drains its node itself with ``scontrol
update NodeName=NODE State=DRAIN Reason=...``. A ``Prolog`` or ``Epilog`` that exits non-zero
drains the node with Slurm's own reason (a prolog's job is requeued held). So ``dlscale accept
--level 1`` exits 0 when nothing FAILed or ERRORed and 1 otherwise (2 for bad input), inside the
level's 45 s budget, and with ``--drain-on-fail`` drains its node with a one-line reason of its own,
``dlscale: OUTCOME CHECK FIGURE on SUBJECT: WHY (+N more; ACCEPTANCE_ID)``, at most 255 bytes
(slurmdbd keeps a node's reason in a MySQL ``tinytext``), plain ASCII, passed to scontrol as one
argument (no shell, no quotes kept in it). ``--resume-on-pass`` returns the node to service after
a pass, only where it is drained with a reason that begins ``dlscale:``: a node an administrator
drained for another reason stays drained. The node is ``$SLURMD_NODENAME`` (set for prologs and
epilogs), else this host's short name.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from typing import Any

from dlscale.accept.judging.verdict import ERROR, FAIL, WARN
from dlscale.errors import UsageError
from dlscale.log import info

PREFIX = "dlscale:"
REASON_BYTES = 255
SCONTROL_TIMEOUT_S = 20


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def ready(drain_on_fail: bool, resume_on_pass: bool) -> str | None:
    """The node to act on, checked before anything runs (scontrol must be there and know the node);
    None when neither option is given."""
    if not (drain_on_fail or resume_on_pass):
        return None
    if shutil.which("scontrol") is None:
        raise UsageError("--drain-on-fail/--resume-on-pass need Slurm's scontrol on PATH: run it on a Slurm node")
    node = node_name()
    state = _show(node)
    if state is None:
        raise UsageError(f"Slurm does not know node {node!r} (scontrol show node {node}); set SLURMD_NODENAME to "
                         "its Slurm NodeName")
    return node


def reason(acc: Any) -> str:
    """The node's one-line reason: the worst verdict first, how many more, the acceptance id."""
    rank = {FAIL: 0, ERROR: 1, WARN: 2}
    bad = sorted((v for v in acc.verdicts if v.status in rank), key=lambda v: rank[v.status])
    if bad:
        v = bad[0]
        head = f"{PREFIX} {v.status} {v.check} {v.figure}{' on ' + v.subject if v.subject else ''}: {v.reason}"
    else:
        head = f"{PREFIX} {acc.outcome}: nothing was judged"
    tail = f" ({'+' + str(len(bad) - 1) + ' more; ' if len(bad) > 1 else ''}{acc.id})"
    head = re.sub(r"\s+", " ", head.encode("ascii", "replace").decode())
    tail = tail.encode("ascii", "replace").decode()
    room = REASON_BYTES - len(tail)
    return (head if len(head) <= room else head[:room - 3].rstrip() + "...") + tail


def apply(acc: Any, node: str, drain_on_fail: bool, resume_on_pass: bool) -> str | None:
    """Drain ``node`` after a failed acceptance or resume it after a passed one (the module doc); what
    was done, in one line (also on stderr), or None."""
    from dlscale.errors import RunFailure

    failed = acc.exit_code != 0
    if not (drain_on_fail if failed else resume_on_pass):
        return None
    try:
        said = drain(node, reason(acc)) if failed else resume(node)
    except (RunFailure, OSError, subprocess.TimeoutExpired) as e:
        said = f"could not {'drain' if failed else 'resume'} node {node}: {e}"
    info(f"dlscale accept: {said}")
    return said


def drain(node: str, why: str) -> str:
    state = _show(node) or ("", "")
    if "DRAIN" in state[0] and not state[1].startswith(PREFIX):
        return f"node {node} is already drained ({state[1] or 'no reason'}): left as it is"
    _scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={why}")
    return f"drained node {node}: {why}"


def resume(node: str) -> str:
    state = _show(node) or ("", "")
    if "DRAIN" not in state[0]:
        return f"node {node} is in service ({state[0].lower() or 'unknown state'}): nothing to resume"
    if not state[1].startswith(PREFIX):
        return f"node {node} is drained for another reason ({state[1] or 'none given'}): left drained"
    _scontrol("update", f"NodeName={node}", "State=RESUME")
    return f"resumed node {node}, which dlscale had drained ({state[1]})"


def _show(node: str) -> tuple[str, str] | None:
    """(state, e.g. ``IDLE+DRAIN``; reason, without Slurm's ``[user@time]``) of a node; None if unknown."""
    p = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True,
                       timeout=SCONTROL_TIMEOUT_S)
    if p.returncode != 0 or "NodeName=" not in p.stdout:
        return None
    state = re.search(r"\bState=(\S+)", p.stdout)
    why = re.search(r"^\s*Reason=(.*?)(?:\s+\[[^\]]*@[^\]]*\])?\s*$", p.stdout, re.M)
    return (state.group(1) if state else "", why.group(1).strip() if why else "")


def _scontrol(*args: str) -> None:
    p = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
    if p.returncode != 0:
        from dlscale.errors import RunFailure

        raise RunFailure(f"scontrol {args[0]} {args[1]} failed: {(p.stderr or p.stdout).strip()[:300]}")
