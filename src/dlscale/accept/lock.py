"""One acceptance at a time on a host: an exclusive ``flock`` on a file in a host-local directory.

Two acceptances at once on one machine measure each other's load: both read slow, and each would
become the other's baseline. ``host_lock`` takes the lock before the first check runs; a second
acceptance on the host waits for the first to finish (saying once, on stderr, which acceptance and
process it waits for), so both finish with figures of an unshared machine; ``wait=False`` refuses
instead (one line, exit 2). The kernel drops a ``flock`` when the process holding it ends, however
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

from dlscale.errors import UsageError
from dlscale.log import info

LOCK_DIR_ENV = "DLSCALE_LOCK_DIR"


def lock_path() -> Path:
    """This host's acceptance lock file."""
    import socket

    given = os.environ.get(LOCK_DIR_ENV)
    run_lock = Path("/run/lock")
    base = Path(given) if given else run_lock if os.access(run_lock, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())
    return base / f"dlscale-accept-{socket.gethostname()}.lock"


@contextmanager
def host_lock(acceptance: str, wait: bool = True) -> Iterator[Path]:
    """Hold this host's acceptance lock while the block runs (the module doc); its path."""
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
            info(f"dlscale accept: waiting for {holder} to finish on this host (lock {path})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"acceptance": acceptance, "pid": os.getpid()}).encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the last descriptor drops the lock


def _holder(fd: int) -> str:
    """'acceptance ID (pid N)', as the lock's holder wrote it."""
    try:
        doc = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        doc = {}
    if not doc.get("acceptance"):
        return "another acceptance"
    return f"acceptance {doc['acceptance']} (pid {doc.get('pid', '?')})"
