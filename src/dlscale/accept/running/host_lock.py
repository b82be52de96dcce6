"""One acceptance at a time on a host: an exclusive ``flock`` on a file in a host-local directory.

Two acceptances at once on one machine measure each other's load: both read slow, and each would
become the other's baseline. ``host_lock`` takes the lock before the first check runs; a second
acceptance on the host waits for the first to finish (saying on stderr which acceptance and process
it waits for, and how long it waited), so both finish with figures of an unshared machine, but at
most ``wait_s`` seconds (the acceptance's share of its level's budget, ``acceptance.LOCK_SHARE``: a level-1
health check behind a level 3 gives up inside Slurm's 60 s instead of being killed there): past it
``HostBusy``, one line naming the holder, exit 1, nothing measured. ``wait=False`` refuses at once
(one line, exit 2). The kernel drops a ``flock`` when the process holding it ends, however
it ends (killed outright too), so a lock never outlives its acceptance; the file itself stays and
only names the last holder.

The file is ``dlscale-accept.lock`` in ``$DLSCALE_LOCK_DIR``, else ``/run/lock`` (host-local and
writable by every user on Linux), else the temporary directory; the host's name is in its name, so
a directory shared between hosts (NFS) still gives each host its own lock.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dlscale.errors import DlscaleError, UsageError
from dlscale.log import info

LOCK_DIR_ENV = "DLSCALE_LOCK_DIR"
POLL_S = 0.2  # how often a bounded wait tries the lock again


class HostBusy(DlscaleError):
    """Another acceptance held this host's lock for all the wait this one's budget allows (exit 1)."""


def lock_path() -> Path:
    """This host's acceptance lock file."""
    import socket

    given = os.environ.get(LOCK_DIR_ENV)
    run_lock = Path("/run/lock")
    base = Path(given) if given else run_lock if os.access(run_lock, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())
    return base / f"dlscale-accept-{socket.gethostname()}.lock"


@contextmanager
def host_lock(acceptance: str, wait: bool = True, wait_s: float | None = None) -> Iterator[Path]:
    """Hold this host's acceptance lock while the block runs (the module doc); its path. ``wait_s``: the
    longest wait for another acceptance's lock (None: as long as it takes)."""
    import fcntl

    path = lock_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise UsageError(f"cannot open the acceptance lock {path}: {e.strerror}; set {LOCK_DIR_ENV} to a "
                         "directory every user of this host can write") from None
    try:
        try:
            os.fchmod(fd, 0o666)  # another user's acceptance on this host must open it too
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            if not wait:
                raise UsageError(f"{holder} is running on this host (lock {path}): wait for it to finish "
                                 "or stop it; two acceptances at once measure each other") from None
            _wait(fd, holder, path, wait_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"acceptance": acceptance, "pid": os.getpid()}).encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the last descriptor drops the lock


def _wait(fd: int, holder: str, path: Path, wait_s: float | None) -> None:
    """Wait for the lock ``holder`` holds, at most ``wait_s`` seconds (the module doc), saying whose it is."""
    import fcntl
    import time

    bound = f", at most {wait_s:.3g} s" if wait_s is not None else ""
    info(f"dlscale accept: waiting for {holder} to finish on this host (lock {path}{bound})")
    t0 = time.monotonic()
    if wait_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
    else:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - t0 >= wait_s:
                    raise HostBusy(f"{_holder(fd)} held this host's acceptance lock ({path}) for the {wait_s:.3g} s "
                                   "this acceptance's budget leaves for waiting: nothing was measured; run it "
                                   "again when that one has finished") from None
                time.sleep(POLL_S)
    info(f"dlscale accept: waited {time.monotonic() - t0:.3g} s for {holder}")


def _holder(fd: int) -> str:
    """'acceptance ID (pid N)', as the lock's holder wrote it."""
    try:
        doc = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        doc = {}
    if not doc.get("acceptance"):
        return "another acceptance"
    return f"acceptance {doc['acceptance']} (pid {doc.get('pid', '?')})"
