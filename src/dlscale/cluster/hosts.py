"""The rehearsal cluster's node names in /etc/hosts, as a real cluster's DNS gives them.

Every line dlscale adds ends with a marker naming the cluster that owns it, by its process first
(``# dlscale-cluster PID-ID``), so that ``remove(owner)`` takes exactly that cluster's lines (a
process may run several) and ``cleanup_stale()`` those of a process that is gone (killed outright),
and no other line of the file is touched. Edits hold an
exclusive ``flock`` (several clusters, of several users or test sessions, may start and stop at
once) and rewrite the file in place: in a container /etc/hosts is often a bind mount, which cannot
be replaced by a rename.

``debian_hosts`` is the other way a node may see names: its own file, as Debian's installer
writes one (the node's own name on 127.0.1.1, the other nodes at their addresses), which a node in
a mount namespace of its own is given instead of the shared file. No root needed to import.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psutil

HOSTS = Path("/etc/hosts")
MARK = "# dlscale-cluster"


def _lock_file() -> Path:
    run_lock = Path("/run/lock")
    base = run_lock if os.access(run_lock, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())
    return base / "dlscale-cluster-hosts.lock"


@contextmanager
def locked() -> Iterator[None]:
    """Hold the clusters' lock (an exclusive ``flock``): one cluster edits /etc/hosts or takes a subnet at a time."""
    fd = os.open(_lock_file(), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _owner(line: str) -> str | None:
    m = re.search(rf"{MARK} (\d+(?:-\w+)?)\s*$", line)
    return m.group(1) if m else None


def _pid(owner: str) -> int:
    return int(owner.split("-")[0])


def _rewrite(path: Path, keep) -> list[str]:
    """Keep the lines for which ``keep(line)`` is true; the lines dropped."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    kept = [ln for ln in lines if keep(ln)]
    if len(kept) != len(lines):
        with open(path, "r+") as f:
            f.write("".join(kept))
            f.truncate()
    return [ln for ln in lines if not keep(ln)]


def add(entries: Sequence[tuple[str, str]], owner: str | None = None, path: Path = HOSTS) -> None:
    """Append ``address name`` lines for (name, address) ``entries``, owned by ``owner`` ("PID-ID";
    default: this process)."""
    owner = str(os.getpid()) if owner is None else owner
    with locked():
        text = path.read_text()
        sep = "" if not text or text.endswith("\n") else "\n"
        with open(path, "a") as f:
            f.write(sep + "".join(f"{addr}\t{name}\t{MARK} {owner}\n" for name, addr in entries))


def remove(owner: str | None = None, path: Path = HOSTS) -> int:
    """Remove the lines ``owner`` (default: this process) added; how many."""
    owner = str(os.getpid()) if owner is None else owner
    with locked():
        return len(_rewrite(path, lambda ln: _owner(ln) != owner))


def cleanup_stale(path: Path = HOSTS) -> list[int]:
    """Remove the lines of owners whose process is no longer running; those processes."""
    gone: set[int] = set()

    def keep(line: str) -> bool:
        who = _owner(line)
        if who is None or psutil.pid_exists(_pid(who)):
            return True
        gone.add(_pid(who))
        return False

    if not path.exists():
        return []
    with locked():
        _rewrite(path, keep)
    return sorted(gone)


def owned(owner: str | int | None = None, path: Path = HOSTS) -> list[tuple[str, str]]:
    """(name, address) of the lines ``owner`` added ("PID-ID"; a pid: every cluster of that process;
    default: this process's)."""
    owner = str(os.getpid() if owner is None else owner)
    return [(ln.split()[1], ln.split()[0]) for ln in path.read_text().splitlines()
            if (who := _owner(ln)) is not None and (who == owner or who.split("-")[0] == owner)]


def debian_hosts(node: str, nodes: Sequence[tuple[str, str]]) -> str:
    """A node's own /etc/hosts as Debian writes it: its name on 127.0.1.1, the others at their addresses."""
    others = "".join(f"{addr}\t{name}\n" for name, addr in nodes if name != node)
    return f"127.0.0.1\tlocalhost\n127.0.1.1\t{node}\n{others}"
