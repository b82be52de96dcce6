"""The rehearsal cluster's daemons and folder: munged, slurmctld and one slurmd per node, each started
in the foreground as a child of the cluster's process (and ended with it: ``procs.die_with_parent``),
each ended by its pid; the folder ``dlscale-cluster-<pid>-*`` in the temporary directory, named by
the process that owns it, so that what a killed owner left (daemons still running on its files,
the folder) is found and removed by the next cluster (``cleanup_stale_folders``). Also the small
facts a cluster is built from: a free port, a free /24 in the root namespace, this host's short
name, its memory. No torch, no root needed to import.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import psutil

from dlscale.procs import die_with_parent

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "srun")
FOLDER_PREFIX = "dlscale-cluster-"
STOP_GRACE_S = 15


def missing(on_host: bool = False) -> str | None:
    """Why no rehearsal cluster can be started here, or None."""
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return f"Slurm/munge binaries not found: {', '.join(absent)} (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the rehearsal Slurm cluster runs its daemons as root (and its nodes in network namespaces): run as root"
    if on_host:
        return None
    for tool in ("nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"the cluster's nodes need util-linux's {tool} (apt-get install util-linux)"
    from dlscale.distributed.netns import unavailable_reason

    return unavailable_reason()


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def free_subnet(base: str) -> int:
    """X of the first ``<base>.X.0/24`` no address or route of the root namespace uses, from one picked
    by this process's id (so that clusters starting at once rarely try the same)."""
    p = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True)
    q = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True)
    used = {int(m) for m in re.findall(rf"\b{re.escape(base)}\.(\d+)\.", p.stdout + q.stdout)}
    start = os.getpid() % 250
    for i in range(250):
        x = (start + i) % 250 + 1
        if x not in used:
            return x
    raise RuntimeError(f"no free /24 left in {base}.0.0/16 for the cluster's nodes")


def memory_mib() -> int:
    """Half of the machine's memory in MiB: what each node declares (slurmd refuses a node larger than it finds)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 // 2
    return 1024


def slurm_cmd(cmd: list[str], env: dict[str, str], timeout: float = 20) -> subprocess.CompletedProcess | None:
    """A Slurm client command against the cluster (None where it could not run or timed out)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


# -- the folder ---------------------------------------------------------------------------------------------

def make_folder(cluster_id: str) -> Path:
    """The cluster's folder (mode 700) and its sub-folders."""
    root = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
    os.chmod(root, 0o700)
    for d in ("state", "spool", "log", "munge", "run", "hosts", "health"):
        (root / d).mkdir(mode=0o700)
    return root


def remove_folder(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def cleanup_stale_folders() -> list[str]:
    """Remove the folders of clusters whose process is gone, after killing any daemon still running
    on their files (named on its command line); the folders removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        m = re.match(rf"{FOLDER_PREFIX}(\d+)-", folder.name)
        if not m or psutil.pid_exists(int(m.group(1))):
            continue
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any(str(folder) in arg for arg in proc.info["cmdline"] or ()):
                    proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    return removed


def cleanup_stale_links(prefix: str) -> list[str]:
    """Delete this namespace's links ``<prefix><pid>-*`` whose process is gone; their names."""
    p = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    removed = []
    for name in re.findall(rf"^\d+: ({re.escape(prefix)}(\d+)-[0-9a-f]+)[@:]", p.stdout, re.M):
        if not psutil.pid_exists(int(name[1])):
            subprocess.run(["ip", "link", "del", name[0]], capture_output=True)
            removed.append(name[0])
    return removed


def log_tails(root: Path, lines: int = 15) -> str:
    out = []
    for f in sorted((root / "log").glob("*")) + sorted((root / "munge").glob("*.log")):
        tail = f.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {f.name}\n" + "\n".join(tail))
    return "\n".join(out)


# -- the daemons --------------------------------------------------------------------------------------------

class Daemons:
    """The cluster's daemon processes, by role: ``munged``, ``slurmctld``, ``slurmd <node>``."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen] = {}
        self.root: Path | None = None

    def _spawn(self, role: str, cmd: list[str], env: dict[str, str]) -> None:
        assert self.root is not None
        log = open(self.root / "log" / f"{role.replace(' ', '-')}.out", "ab")
        try:
            self.procs[role] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                env={**os.environ, **env}, start_new_session=True,
                                                preexec_fn=die_with_parent())
        finally:
            log.close()

    def start_munge(self, root: Path) -> None:
        """munged on the cluster's own key and socket; returns once the socket is there."""
        import time

        self.root = root
        m = root / "munge"
        key = m / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={m / 'munge.socket'}",
                               f"--key-file={key}", f"--log-file={m / 'munged.log'}",
                               f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'seed'}"], {})
        deadline = time.monotonic() + 15
        while not (m / "munge.socket").exists():
            if time.monotonic() > deadline or self.procs["munged"].poll() is not None:
                raise RuntimeError(f"munged did not open its socket; logs:\n{log_tails(root)}")
            time.sleep(0.1)

    def start_controller(self, conf: Path) -> None:
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)], {"SLURM_CONF": str(conf)})

    def start_slurmd(self, node: str, cmd: list[str], env: dict[str, str]) -> None:
        self._spawn(f"slurmd {node}", cmd, env)

    def controller_running(self) -> bool:
        p = self.procs.get("slurmctld")
        return p is not None and p.poll() is None

    def slurmd_pid(self, node: str) -> int | None:
        p = self.procs.get(f"slurmd {node}")
        return p.pid if p is not None and p.poll() is None else None

    def dead(self) -> list[str]:
        """The roles whose process has exited."""
        return [role for role, p in self.procs.items() if p.poll() is not None]

    def kill_slurmd(self, node: str) -> list[int]:
        p = self.procs.pop(f"slurmd {node}", None)
        if p is None or p.poll() is not None:
            return []
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return [p.pid]

    def stop_controller(self) -> None:
        p = self.procs.pop("slurmctld")
        _end(p)

    def stop_all(self) -> None:
        """Every daemon, slurmds first, then slurmctld, then munged (SIGTERM, SIGKILL after a grace)."""
        order = sorted(self.procs, key=lambda r: (r != "munged", r != "slurmctld"), reverse=True)
        for role in order:
            _end(self.procs.pop(role))


def _end(p: subprocess.Popen) -> None:
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    except ProcessLookupError:
        p.wait()
