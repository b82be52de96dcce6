"""``dlscale cluster up`` and ``down``: a rehearsal cluster held by one process until it is told to stop.

``hold(options, on_up)`` starts a ``SlurmCluster``, marks its folder as one a user brought up
(``up.json``: the process, slurm.conf, the nodes), calls ``on_up`` (the CLI prints what to
export), and waits; Ctrl-C, SIGTERM (what ``down`` sends) or SIGHUP (the terminal closed) stops it,
which removes everything it made. ``running()`` lists the clusters brought up that way whose
process still runs; ``bring_down(which)`` stops one of them (by its slurm.conf, its folder or its
process id; the only one where none is named) and waits until its process has cleaned up. A
cluster of the tests has no ``up.json``, so ``down`` never stops one.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from dlscale.cluster.daemons import FOLDER_PREFIX
from dlscale.cluster.options import ClusterOptions
from dlscale.errors import UsageError

MARK = "up.json"
DOWN_WAIT_S = 120


class _Stop(Exception):
    """A signal asked the held cluster to stop."""


def hold(options: ClusterOptions, on_up: Callable[[Any], None], until: Callable[[], bool] | None = None) -> None:
    """Start the cluster, call ``on_up(cluster)``, wait for Ctrl-C, SIGTERM or SIGHUP (or ``until()``
    to be true, polled every second), then stop it (also when starting fails half-way)."""
    from dlscale.cluster.rehearsal import SlurmCluster

    def stop(signum: int, frame: Any) -> None:
        raise _Stop(signal.Signals(signum).name)

    # SIGINT too: a cluster started as a script's background job inherits SIGINT ignored, and a
    # Ctrl-C (or `kill -INT`) must still remove it
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    cluster = SlurmCluster(options)
    try:
        cluster.start()
        mark = cluster.root / MARK
        mark.write_text(json.dumps({"pid": os.getpid(), **cluster.describe()}, indent=1))
        on_up(cluster)
        while until is None or not until():
            time.sleep(1.0)
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        for s, h in old.items():
            if s != signal.SIGINT:
                signal.signal(s, h)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        try:
            cluster.stop()
        finally:
            signal.signal(signal.SIGINT, old[signal.SIGINT])


def running() -> list[dict[str, Any]]:
    """The clusters ``dlscale cluster up`` holds now: each one's ``up.json``."""
    found = []
    for mark in sorted(Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*/{MARK}")):
        try:
            doc = json.loads(mark.read_text())
        except (OSError, ValueError):
            continue
        if psutil.pid_exists(int(doc.get("pid", 0))):
            found.append(doc)
    return found


def bring_down(which: str | None = None) -> dict[str, Any]:
    """Stop the held cluster named by ``which`` (its slurm.conf, folder or process id; None: the only
    one, else ``$SLURM_CONF``'s) and wait until its process has removed it; its ``up.json``."""
    up = running()
    if not up:
        raise UsageError("no rehearsal cluster is up (start one with `dlscale cluster up`)")
    if which is None and len(up) > 1:
        which = os.environ.get("SLURM_CONF")
        if not which:
            raise UsageError("several rehearsal clusters are up; name one by its slurm.conf: "
                             + ", ".join(d["slurm_conf"] for d in up))
    doc = up[0] if which is None else next((d for d in up if which in (d["slurm_conf"], d["folder"], str(d["pid"]))),
                                           None)
    if doc is None:
        raise UsageError(f"no rehearsal cluster {which!r} is up; up: "
                         + ", ".join(f"{d['slurm_conf']} (pid {d['pid']})" for d in up))
    os.kill(doc["pid"], signal.SIGTERM)
    deadline = time.monotonic() + DOWN_WAIT_S
    while psutil.pid_exists(doc["pid"]) and Path(doc["folder"]).exists():
        if time.monotonic() > deadline:
            raise UsageError(f"the cluster's process {doc['pid']} did not stop within {DOWN_WAIT_S} s")
        time.sleep(0.2)
    if Path(doc["folder"]).exists():  # its process ended without removing it (killed): what it left goes now
        from dlscale.cluster.rehearsal import cleanup_stale

        cleanup_stale()
    return doc
