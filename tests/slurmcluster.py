"""A real single-node Slurm for the tests: munged, slurmctld and slurmd on this machine, in a temp dir.

``SlurmCluster.start()`` generates a munge key, writes a slurm.conf (this host as the controller
and the one compute node, ``proctrack/linuxproc``, ``task/none``, no accounting daemon, short
KillWait so a job past its time limit ends within seconds of it, and a ``HealthCheckProgram`` that
does nothing until a test gives it a command: ``set_health_check``), starts the three daemons in the
foreground as children of the test process and waits until the node takes jobs. ``env()`` is
what a client (sbatch, squeue, scontrol, submitit) needs: ``SLURM_CONF``. ``stop_controller()`` and
``start_controller()`` make a controller outage while jobs run. ``stop()`` cancels every
job, kills every daemon it started (by pid) and removes the directory. ``missing()`` says why a
cluster cannot run here (None where it can).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "srun")
HEALTH_CHECK_INTERVAL_S = 5  # slurmctld asks slurmd to run the health check this often
REQUIRE_ENV = "DLSCALE_REQUIRE_SLURM"


def missing() -> str | None:
    """Why no single-node Slurm can be started here, or None."""
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return (f"Slurm/munge binaries not found: {', '.join(absent)} "
                "(apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        return "a single-node Slurm in the tests runs its daemons as root; run the tests as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 // 2  # half of it: slurmd refuses a node larger than it finds
    return 1024


class SlurmCluster:
    """One controller and one compute node on this host, all state under one temp dir."""

    def __init__(self, cpus: int = 2, partition: str = "debug"):
        self.cpus, self.partition = cpus, partition
        self.root = Path(tempfile.mkdtemp(prefix="dlscale-slurm-"))
        os.chmod(self.root, 0o700)
        self.host = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen] = []
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge" / "munge.socket"
        self.health_cmd = self.root / "healthcheck.cmd"  # what the health check runs, while the file is there

    def env(self) -> dict[str, str]:
        """The variables a Slurm client needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        for d in ("state", "spool", "log", "munge"):
            (self.root / d).mkdir(mode=0o700, exist_ok=True)
        r = self.root
        program = r / "healthcheck.sh"
        program.write_text(f"#!/bin/sh\n[ -f {self.health_cmd} ] || exit 0\nexec /bin/sh {self.health_cmd}\n")
        program.chmod(0o755)
        self.conf.write_text("\n".join([
            "ClusterName=dlscaletest", f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "MpiDefault=none", "ReturnToService=2", "KillWait=2", "OverTimeLimit=0", "MinJobAge=3600",
            "InactiveLimit=0", "SlurmctldTimeout=30", "SlurmdTimeout=30", "MessageTimeout=10",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            f"HealthCheckProgram={program}", f"HealthCheckInterval={HEALTH_CHECK_INTERVAL_S}",
            "HealthCheckNodeState=ANY",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={_memory_mib()} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def _spawn(self, *cmd: str) -> None:
        log = open(self.root / "log" / f"{Path(cmd[0]).name}.out", "ab")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env={**os.environ, **self.env()}, start_new_session=True))
        log.close()

    def start(self, timeout_s: float = 60.0) -> "SlurmCluster":
        """Start munged, slurmctld and slurmd; return once the node is idle (else raise, with the logs)."""
        self._write_conf()
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        m = self.root / "munge"
        self._spawn("munged", "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
                    f"--log-file={m / 'munged.log'}", f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'seed'}")
        self._wait(lambda: self.socket.exists(), 15, "munged did not open its socket")
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-f", str(self.conf))
        self._wait(self._idle, timeout_s, "the node did not become idle")
        return self

    def set_health_check(self, command: str | None) -> None:
        """The shell command slurmd's HealthCheckProgram runs from now on (None: nothing, exit 0)."""
        if command is None:
            self.health_cmd.unlink(missing_ok=True)
        else:
            tmp = self.health_cmd.with_suffix(".tmp")
            tmp.write_text(command + "\n")
            os.replace(tmp, self.health_cmd)

    def node_state(self) -> tuple[str, str]:
        """(State, Reason) of the node as ``scontrol show node`` gives them."""
        p = subprocess.run(["scontrol", "show", "node", self.host], capture_output=True, text=True,
                           env={**os.environ, **self.env()}, timeout=20)
        state = re.search(r"\bState=(\S+)", p.stdout)
        reason = re.search(r"^\s*Reason=(.*)$", p.stdout, re.M)
        return (state.group(1) if state else "?", reason.group(1).strip() if reason else "")

    def client_env(self, message_timeout_s: int) -> dict[str, str]:
        """Like ``env()``, for a client that gives up on an unreachable controller after
        ``message_timeout_s`` (its own copy of slurm.conf; the daemons keep theirs)."""
        conf = self.root / f"client-{message_timeout_s}.conf"
        conf.write_text(re.sub(r"MessageTimeout=\d+", f"MessageTimeout={message_timeout_s}", self.conf.read_text()))
        return {"SLURM_CONF": str(conf)}

    def stop_controller(self) -> None:
        """End slurmctld (SIGTERM: it saves its state), as an outage of the controller does; the
        node and its running jobs go on."""
        ctld = next(p for p in self.procs if p.args[0] == "slurmctld" and p.poll() is None)
        os.killpg(ctld.pid, signal.SIGTERM)
        ctld.wait(timeout=60)
        self.procs.remove(ctld)

    def start_controller(self, timeout_s: float = 60.0) -> None:
        """Start slurmctld again from its saved state; return once it answers."""
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._wait(self._answers, timeout_s, "slurmctld did not answer after its restart")

    def _answers(self) -> bool:
        p = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env={**os.environ, **self.env()},
                           timeout=30)
        return p.returncode == 0 and "UP" in p.stdout

    def _idle(self) -> bool:
        p = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True,
                           env={**os.environ, **self.env()}, timeout=20)
        return p.returncode == 0 and p.stdout.strip().rstrip("*") in ("idle", "mix", "alloc")

    def _wait(self, ok, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ok():
                return
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                break
            time.sleep(0.5)
        raise RuntimeError(f"{what} (exited: {', '.join(dead) if dead else 'none'}); logs:\n{self.logs()}")

    def logs(self) -> str:
        """The last lines of every daemon's log (for a failure message)."""
        out = []
        for f in sorted((self.root / "log").glob("*")) + sorted((self.root / "munge").glob("*.log")):
            lines = f.read_text(errors="replace").splitlines()[-15:]
            out.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel every job, end every daemon this cluster started (SIGTERM, then SIGKILL), remove its files."""
        env = {**os.environ, **self.env()}
        try:
            subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for p in reversed(self.procs):  # slurmd, slurmctld, then munged
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        shutil.rmtree(self.root, ignore_errors=True)
