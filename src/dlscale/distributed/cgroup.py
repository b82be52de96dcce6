"""CPU quotas through Linux control groups: a program and every process it starts share N cores; and
(``cpuset``) the CPUs this process's own group allows it.

A quota is a group ``<mount>/dlscale/<pid>-<id>`` under a parent dlscale owns, in whichever
hierarchy has the cpu controller: cgroup v2 (``cpu.max`` = "QUOTA PERIOD", the cgroup2 mount
whose ``cgroup.controllers`` lists cpu; ``+cpu`` is enabled in the subtree control of the mount
root and of the parent) or, where cpu is still bound to v1, the v1 cpu mount
(``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``). Both give the group ``cores x period`` of CPU
time per period (100 ms), so 0.5 cores runs at most 50 ms in every 100 ms, however many
threads it has.

``CpuQuota`` is a context manager: entering makes the group; ``wrap(cmd)`` is a command that
writes its own pid into the group's ``cgroup.procs`` and then execs ``cmd``, so the program is in
the group before it runs and everything it starts inherits it; leaving (normally, on an
exception, on Ctrl-C) kills what still runs inside and removes the group. Groups left by a
dlscale process that died (SIGKILL) are removed by ``cleanup_stale()``. ``run_in_quota`` runs one
command that way. Where no quota can be made (not root, no cpu controller), ``unavailable_reason``
says why in one line, and entering raises it as a ``UsageError``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psutil

from dlscale.errors import UsageError
from dlscale.log import warn

PARENT = "dlscale"
PERIOD_US = 100_000
MIN_CORES = 0.01  # the kernel's smallest CFS quota is 1 ms per period
MOUNTS = "/proc/self/mounts"


@dataclass(frozen=True)
class Hierarchy:
    """Where quotas are made: a cgroup mount with the cpu controller, and its version (1 or 2)."""

    version: int
    mount: str

    @property
    def parent(self) -> str:
        return os.path.join(self.mount, PARENT)


def find_hierarchy(mounts: str = MOUNTS) -> Hierarchy | None:
    """The cgroup v2 mount whose controllers include cpu, else the v1 mount of the cpu controller."""
    try:
        with open(mounts) as f:
            lines = [line.split() for line in f]
    except OSError:
        return None
    v1 = None
    for parts in lines:
        if len(parts) < 4:
            continue
        _, mount, fstype, options = parts[:4]
        if fstype == "cgroup2" and "cpu" in _read(os.path.join(mount, "cgroup.controllers")).split():
            return Hierarchy(2, mount)
        if fstype == "cgroup" and "cpu" in options.split(",") and v1 is None:
            v1 = Hierarchy(1, mount)
    return v1


def cpuset(proc: str = "/proc/self") -> tuple[str, str] | None:
    """This process's cgroup cpuset: (the CPUs it allows, "FILE") from cgroup v2's
    ``cpuset.cpus.effective`` or v1's ``cpuset.effective_cpus`` (else ``cpuset.cpus``) of the group
    ``PROC/cgroup`` names, found under its mount by ``PROC/mountinfo`` (a container's mount root is
    its own group); None where neither can be read."""
    groups = {}
    for line in _read(os.path.join(proc, "cgroup")).splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        groups["cgroup2" if controllers == "" else "cpuset" if "cpuset" in controllers.split(",") else "-"] = path
    for line in _read(os.path.join(proc, "mountinfo")).splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mount, fstype = fields[3], fields[4], tail[0]
        key = "cgroup2" if fstype == "cgroup2" else "cpuset" if fstype == "cgroup" and "cpuset" in tail[2].split(",") \
            else None
        if key is None or key not in groups:
            continue
        rel = groups[key][len(root):] if groups[key].startswith(root) and root != "/" else groups[key]
        names = ("cpuset.cpus.effective",) if key == "cgroup2" else ("cpuset.effective_cpus", "cpuset.cpus")
        parts = [p for p in rel.split("/") if p]
        for depth in range(len(parts), -1, -1):  # a v2 group without the cpuset controller has its parent's
            for name in names:
                path = os.path.join(mount, *parts[:depth], name)
                text = _read(path).strip()
                if text:
                    return text, path
    return None


def unavailable_reason(hierarchy: Hierarchy | None = None) -> str | None:
    """Why a CPU quota cannot be made here (not root, no cpu controller, not permitted), or None."""
    if os.geteuid() != 0:
        return "CPU quotas (--node-cpu-quota) need root (they make a cgroup); run as root or leave out --node-cpu-quota"
    h = hierarchy or find_hierarchy()
    if h is None:
        return ("no cgroup hierarchy here has the cpu controller (no cgroup v2 mount listing cpu in "
                "cgroup.controllers, no cgroup v1 cpu mount); CPU quotas cannot be set on this machine")
    try:
        _make_parent(h)
    except OSError as e:
        return f"cannot make dlscale's cgroup {h.parent} (cgroup v{h.version}): {e.strerror or e}"
    return None


class CpuQuota:
    """A cgroup limited to ``cores`` CPUs; ``with CpuQuota(0.5) as q: subprocess.run(q.wrap(cmd))``."""

    def __init__(self, cores: float, hierarchy: Hierarchy | None = None):
        if not cores >= MIN_CORES:
            raise UsageError(f"a CPU quota must be at least {MIN_CORES} cores, got {cores}")
        self.cores = float(cores)
        self.hierarchy = hierarchy
        self.path: str | None = None

    @property
    def quota_us(self) -> int:
        return round(self.cores * PERIOD_US)

    def __enter__(self) -> "CpuQuota":
        h = self.hierarchy = self.hierarchy or find_hierarchy()
        reason = unavailable_reason(h)
        if reason:
            raise UsageError(reason)
        cleanup_stale(h)
        path = os.path.join(h.parent, f"{os.getpid()}-{uuid.uuid4().hex[:6]}")
        os.mkdir(path)
        self.path = path
        try:
            if h.version == 2:
                _write(path, "cpu.max", f"{self.quota_us} {PERIOD_US}")
            else:
                _write(path, "cpu.cfs_period_us", str(PERIOD_US))
                _write(path, "cpu.cfs_quota_us", str(self.quota_us))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` started inside the group: a shell joins it, then execs ``cmd`` (nothing runs outside it)."""
        if self.path is None:
            raise RuntimeError("CpuQuota.wrap outside its with block")
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(self.path, "cgroup.procs"), *cmd]

    def pids(self) -> list[int]:
        return pids_in(self.path) if self.path else []

    def stats(self) -> dict[str, int]:
        """The group's cpu.stat (nr_periods, nr_throttled, and throttled_time in ns on v1 or
        throttled_usec on v2): how often the quota held the group back."""
        if not self.path:
            return {}
        out = {}
        for line in _read(os.path.join(self.path, "cpu.stat")).splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
        return out

    def describe(self) -> dict[str, Any]:
        return {"cores": self.cores, "quota_us": self.quota_us, "period_us": PERIOD_US,
                "cgroup_version": self.hierarchy.version if self.hierarchy else None, "path": self.path}

    def close(self) -> None:
        """Kill what still runs in the group, then remove it."""
        if self.path is not None:
            remove_group(self.path)
            self.path = None


def run_in_quota(cmd: list[str], cores: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, **kwargs)`` with the command and all it starts limited to ``cores`` CPUs."""
    with CpuQuota(cores) as q:
        return subprocess.run(q.wrap(cmd), **kwargs)


def pids_in(path: str) -> list[int]:
    return [int(p) for p in _read(os.path.join(path, "cgroup.procs")).split() if p.isdigit()]


def remove_group(path: str, wait_s: float = 5.0) -> None:
    """SIGKILL the processes in the group (dlscale started them there), wait until it is empty, remove it."""
    deadline = time.monotonic() + wait_s
    while True:
        for pid in pids_in(path):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            _rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:  # EBUSY while a killed process is still exiting
            if time.monotonic() > deadline:
                warn(f"could not remove cgroup {path}: {e.strerror or e}; the next dlscale run removes it")
                return
            time.sleep(0.05)


def list_groups(hierarchy: Hierarchy | None = None) -> list[str]:
    """dlscale's groups that exist now (their paths)."""
    h = hierarchy or find_hierarchy()
    if h is None or not os.path.isdir(h.parent):
        return []
    return sorted(os.path.join(h.parent, n) for n in os.listdir(h.parent)
                  if re.fullmatch(r"\d+-\w+", n) and os.path.isdir(os.path.join(h.parent, n)))


def cleanup_stale(hierarchy: Hierarchy | None = None) -> list[str]:
    """Remove groups whose creating dlscale process is gone (e.g. killed with SIGKILL)."""
    removed = []
    for path in list_groups(hierarchy):
        creator = int(os.path.basename(path).split("-")[0])
        if not psutil.pid_exists(creator):
            remove_group(path)
            removed.append(path)
    return removed


def _make_parent(h: Hierarchy) -> None:
    """dlscale's parent group (kept between runs); on v2 with cpu enabled for its children."""
    if h.version == 2:
        _enable_cpu(h.mount)
    os.makedirs(h.parent, exist_ok=True)
    if h.version == 2:
        _enable_cpu(h.parent)


def _enable_cpu(path: str) -> None:
    if "cpu" not in _read(os.path.join(path, "cgroup.subtree_control")).split():
        _write(path, "cgroup.subtree_control", "+cpu")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _write(directory: str, name: str, value: str) -> None:
    with open(os.path.join(directory, name), "w") as f:
        f.write(value)


def _rmdir(path: str) -> None:
    os.rmdir(path)  # a cgroup directory goes with its control files
