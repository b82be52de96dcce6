"""The processes dlscale starts: they end with whoever started them, and their tree can be found and weighed.

A command killed outright (``kill -9``, the kernel's OOM killer) runs no cleanup, so whatever it
started must end by itself. Linux sends a process a signal of its choice when its parent dies,
if it asked for one (``prctl(PR_SET_PDEATHSIG)``); the setting survives ``exec`` but not ``fork``,
so every generation asks for itself:

- ``die_with_parent()`` is the ``preexec_fn`` of a child dlscale starts (torchrun, a sweep's or a
  tune's point): set between fork and exec, and if the parent died before that, the child ends at once;
- ``tie_to_launcher()`` runs first thing in a process somebody else started (a rank, started by
  torchrun, which puts its workers in sessions of their own and asks for no such signal): it asks
  for the signal and then checks that the dlscale launcher (``LAUNCHER_PID_ENV``) is still among
  its ancestors, so a parent that died before the call is caught too.

The signal follows the *thread* that started the child, so a child must be started by a thread
that outlives it (dlscale starts and waits for its children in the same thread). Off Linux these
do nothing. ``tree``, ``resident_bytes`` and ``proportional_bytes`` find and weigh a process tree
(the monitor, tune's ``--max-memory``). No torch here.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable, Iterable
from pathlib import Path

PR_SET_PDEATHSIG = 1
LAUNCHER_PID_ENV = "DLSCALE_LAUNCHER_PID"  # set by dlscale's launcher for the ranks it starts


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, or None off Linux. Resolved in the parent: a child between fork and exec
    must not load libraries (another thread of the parent may have held the loader's lock)."""
    if os.uname().sysname != "Linux":
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when this process's starting
    thread ends, and ends at once if this process died before the child could ask."""
    prctl, parent = _prctl(), os.getpid()

    def preexec() -> None:
        if prctl is None:
            return
        prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:  # the parent died between fork and prctl: nobody would signal
            os.kill(os.getpid(), sig)

    return preexec


def tie_to_launcher(sig: int = signal.SIGKILL) -> bool:
    """Ask for ``sig`` when this process's parent dies; False if dlscale's launcher
    (``$DLSCALE_LAUNCHER_PID``) is no longer among this process's ancestors (it died before the
    call: the caller should leave). True where no launcher is named or the platform has no prctl."""
    prctl = _prctl()
    if prctl is None:
        return True
    prctl(PR_SET_PDEATHSIG, int(sig))
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    return not launcher.isdigit() or int(launcher) in ancestors(os.getpid())


def ancestors(pid: int) -> list[int]:
    """The parent of ``pid``, its parent, ... up to (not including) pid 0."""
    out: list[int] = []
    while pid > 1:
        pid = _ppid(pid)
        if pid <= 0 or pid in out:
            break
        out.append(pid)
    return out


def _ppid(pid: int) -> int:
    return _ppid_of(Path(f"/proc/{pid}/stat"))


def _ppid_of(stat: Path) -> int:
    """The parent pid in a /proc/PID/stat file (after the command name, which may hold spaces); -1 if gone."""
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def descendants(pid: int) -> list[int] | None:
    """All descendants of ``pid`` from /proc/*/task/*/children; None where the kernel has no such
    file (CONFIG_PROC_CHILDREN off) or ``pid`` is gone. ~0.1 ms, against ~3 ms for a scan of every process."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        tasks = Path(f"/proc/{p}/task")
        try:
            files = [t / "children" for t in tasks.iterdir()]
        except OSError:
            if p == pid:
                return None
            continue
        for f in files:
            try:
                kids = [int(k) for k in f.read_text().split()]
            except OSError:
                if f.parent.exists() and not f.exists():
                    return None  # the thread is there but not the file: CONFIG_PROC_CHILDREN is off
                continue  # the thread or process ended meanwhile
            out.extend(kids)
            todo.extend(kids)
    return out


def children(pid: int) -> list[int]:
    """The direct children of ``pid``: /proc/PID/task/*/children, else one pass over /proc."""
    try:
        return [int(k) for t in Path(f"/proc/{pid}/task").iterdir() for k in (t / "children").read_text().split()]
    except OSError:
        pass  # no such file (CONFIG_PROC_CHILDREN off), or a thread ended meanwhile
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        if _ppid_of(stat) == pid:
            out.append(int(stat.parent.name))
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it (``descendants``, else a scan of /proc generation by generation)."""
    below = descendants(pid)
    if below is None:
        below, todo = [], [pid]
        while todo:
            kids = children(todo.pop())
            below.extend(kids)
            todo.extend(kids)
    return [pid, *below]


def resident_bytes(pids: Iterable[int]) -> int:
    """The resident sets of ``pids`` summed (/proc/PID/statm: cheap). A page shared by k of them
    counts k times, so this is an upper bound of what they hold together; 0 for a process gone."""
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


def proportional_bytes(pids: Iterable[int]) -> int:
    """What ``pids`` hold together: their proportional set sizes summed (PSS: each page divided
    among the processes sharing it, so a shared page counts once), where the kernel has
    /proc/PID/smaps_rollup (Linux >= 4.14), else their resident sets. Several ms a process: ask
    ``resident_bytes`` first, which is never below it."""
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            total += resident_bytes([pid])
            continue
        total += next((int(ln.split()[1]) * 1024 for ln in text.splitlines() if ln.startswith("Pss:")), 0)
    return total


def kill(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to each of ``pids`` that is still there."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            continue


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the parent of every orphan among its descendants (``prctl(PR_SET_CHILD_SUBREAPER)``,
    Linux >= 3.4): a process that one of them started and left behind (a launcher killed before its
    workers, a daemon that forked away) stays in this process's tree, where ``end_tree`` finds it.
    False off Linux or where the kernel refuses."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1) == 0


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a process; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, started: int | None) -> bool:
    """Is the process that had this start time still running (not gone, not a zombie, pid not reused)?"""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X") and (started is None or st[1] == started)


def end_tree(pid: int, grace_s: float = 5.0) -> list[int]:
    """End ``pid`` and every process below it; the pids that had to be ended.

    SIGTERM goes to ``pid``'s process group first, so that its own handlers end what it started (a
    dlscale launcher ends torchrun and the ranks and records the run as interrupted); what is left
    after ``grace_s``, or once ``pid`` is gone, gets SIGKILL: every process seen below ``pid`` at any
    point, whatever session it moved to (torchrun puts its ranks in sessions of their own), stopped
    first so none forks past the kill, told apart from a reused pid by its start time. ``pid``
    itself is left for its parent to reap."""
    import time

    seen: dict[int, int | None] = {}

    def look(roots: Iterable[int]) -> None:
        for root in roots:
            if _alive(root, seen.get(root)):
                for p in tree(root):
                    st = _stat(p)
                    if st is not None:
                        seen.setdefault(p, st[1])

    look([pid])
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        kill([pid], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(pid, seen.get(pid)):
        look([pid])
        time.sleep(0.05)
    for _ in range(10):
        look([p for p in list(seen) if _alive(p, seen[p])])
        live = [p for p, started in seen.items() if _alive(p, started)]
        if not live:
            break
        kill(live, signal.SIGSTOP)
        look(live)
        kill([p for p, started in seen.items() if _alive(p, started)], signal.SIGKILL)
        time.sleep(0.05)
    return sorted(seen)
