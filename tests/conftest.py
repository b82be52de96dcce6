"""Shared fixtures: an isolated results database and a CLI runner (in-process and subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


@pytest.fixture
def db_path(tmp_path, monkeypatch):
    """A fresh results database for the test; DLSCALE_DB points at it (and DLSCALE_LOCK_DIR at the
    test's folder: its acceptances neither wait for nor hold up this host's real ones)."""
    p = tmp_path / "results.db"
    monkeypatch.setenv("DLSCALE_DB", str(p))
    monkeypatch.setenv("DLSCALE_LOCK_DIR", str(tmp_path))
    return p


@pytest.fixture
def cli(capsys):
    """Run ``dlscale ARGS`` in this process; returns exit code, stdout and stderr."""
    from dlscale.cli.app import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        cap = capsys.readouterr()
        return CliResult(code, cap.out, cap.err)

    return run


def run_dlscale(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> CliResult:
    """Run ``dlscale ARGS`` in a subprocess (a fresh interpreter, as a user would)."""
    full_env = {**os.environ, **(env or {})}
    p = subprocess.run(
        [sys.executable, "-m", "dlscale.cli.app", *args],
        capture_output=True, text=True, env=full_env, timeout=timeout,
    )
    return CliResult(p.returncode, p.stdout, p.stderr)


def free_port() -> int:
    """A free port for torchrun's store (``torchrun --master-port 0`` hands its ranks MASTER_PORT=0)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], env: dict[str, str], nproc: int = 2, timeout: float = 300) -> tuple[int, str, str]:
    """``torchrun --nproc-per-node NPROC ARGS`` in its own process group, killed whole if it runs past
    ``timeout`` (then the test fails); (exit code, stdout, stderr)."""
    import signal

    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                          "--master-port", str(free_port()), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"torchrun ran past {timeout} s: {err[-2000:]}")
    return p.returncode, out, err


@pytest.fixture
def cli_subprocess(db_path):
    return run_dlscale


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


requires_cuda = pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU; this machine has none")


def need_system(what: str, missing: str | None, env_var: str) -> None:
    """Call at the start of a test that needs ``what`` from the machine (a browser, iproute2, root).

    ``missing`` is None where it is there, else why not. Then the test skips with that reason, or,
    where the environment requires it (``env_var`` set to 1, as .ci/run does after installing it),
    fails: a CI machine that should have it never turns its absence into a silent skip.
    """
    if missing is None:
        return
    if os.environ.get(env_var) == "1":
        pytest.fail(f"{missing} ({env_var}=1 requires {what} here)", pytrace=False)
    pytest.skip(missing)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real single-node Slurm (munged, slurmctld, slurmd on this machine, the node this host itself;
    tests/slurmcluster.py) for the session, shared by the Slurm executor's tests; every process ended after."""
    import slurmcluster

    cluster = slurmcluster.single_node(cpus=2)
    try:
        yield slurmcluster.start(cluster)
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_nodes():
    """A real Slurm of three nodes on this machine (each in its own network namespace, with its own address
    and host name, 1 gbit links; tests/slurmcluster.py) for the session; everything removed after. Each
    node's /etc/hosts is as Debian writes it (its own name on 127.0.1.1, the other nodes at their
    addresses): the names a multi-node job must not be misled by."""
    import slurmcluster

    cluster = slurmcluster.multi_node(3, link_bandwidth="1gbit", debian_hosts=True)
    try:
        yield slurmcluster.start(cluster)
    finally:
        cluster.stop()


@pytest.fixture
def make_slurm_nodes():
    """Start a Slurm of K nodes of the test's own (``make_slurm_nodes(k, **options)``), for a test that
    takes a node down or sets one apart; every one removed after the test."""
    import slurmcluster

    made = []

    def make(k: int = 3, **options):
        made.append(slurmcluster.multi_node(k, **options))
        return slurmcluster.start(made[-1])

    try:
        yield make
    finally:
        for cluster in made:
            cluster.stop()


class FakeNodes:
    """Stands in for ``netns.EmulatedNodes`` where a test looks only at the launcher's commands."""

    def __init__(self, k, rate=None, delay=None, node_rates=None):
        self.k, self.node_rates = k, node_rates

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def exec_prefix(self, k):
        return ["ip", "netns", "exec", f"node{k}"]

    def address(self, k):
        return f"10.77.0.{k + 1}"


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory):
    """scikit-learn's handwritten digits as a 16 px JPEG tree (train/val), made once per session."""
    from dlscale.domains.classification.digits import make_digits

    root = tmp_path_factory.mktemp("digits")
    make_digits(root, size=16)
    return root


def sigint_default() -> None:
    """``preexec_fn`` of a child a test sends Ctrl-C: SIGINT at its default whatever this process
    inherited. A shell starts a background job (`cmd &`, nohup) with SIGINT ignored, the ignoring is
    inherited across exec, and a Python started so installs no KeyboardInterrupt handler at all."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def marked_processes(marker: str) -> list[int]:
    """Pids of the live processes whose environment holds ``marker`` ("NAME=value"): a test sets a
    variable of its own on a command, and every process that command starts inherits it."""
    from pathlib import Path

    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def cmdline(pid: int) -> bytes:
    """The command line of ``pid`` (arguments NUL-separated); empty if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def marked_ranks(marker: str) -> list[int]:
    """The dlscale ranks among ``marked_processes`` (torchrun's command line names the rank module too)."""
    return [pid for pid in marked_processes(marker)
            if b"dlscale.distributed.rank" in cmdline(pid) and b"torch.distributed.run" not in cmdline(pid)]


def end_marked(marker: str) -> list[int]:
    """SIGKILL every process ``marked_processes`` finds (what a failed test left running); their pids."""
    import signal

    left = marked_processes(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def namespaces_left(before: set[str]) -> list[str]:
    """dlscale's network namespaces made since ``before`` (a set of ``netns.list_namespaces()``) by this
    process, one of its children, or a process that has ended: what a run of the test left behind.
    Names carry their creator's pid (``dls-PID-...``), so the namespaces that other live processes
    on the machine make meanwhile (another test session's) are not counted, nor those they remove."""
    import re

    import psutil

    from dlscale.distributed import netns

    me = psutil.Process()
    ours = {me.pid, *(c.pid for c in me.children(recursive=True))}
    left = []
    for ns in set(netns.list_namespaces()) - before:
        m = re.match(rf"{re.escape(netns.PREFIX)}(\d+)-", ns)
        if m and (int(m.group(1)) in ours or not psutil.pid_exists(int(m.group(1)))):
            left.append(ns)
    return sorted(left)


def wait_until(ok, timeout_s: float, every_s: float = 0.2) -> bool:
    """Poll ``ok()`` until it is true or ``timeout_s`` passes; its last value."""
    import time

    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


def survivors_of_kill_9(cmd: list[str], started, env: dict[str, str] | None = None, start_s: float = 120,
                        grace_s: float = 15, cleanup=None) -> list[int]:
    """Run ``cmd`` with a variable of its own (inherited by every process it starts), wait until
    ``started(marker)`` is true, SIGKILL it, and return the pids of its processes still running
    ``grace_s`` later (empty: the command took everything with it). Whatever is left is killed
    before this returns, also when the test fails on the way; then ``cleanup(pid)`` removes what
    else the killed command (of that pid) left."""
    import signal
    import time

    marker = f"DLSCALE_TEST_MARK=kill9-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {}), "DLSCALE_TEST_MARK": marker.split("=", 1)[1]},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: started(marker) or proc.poll() is not None, start_s), "never started"
        assert proc.poll() is None, f"{cmd[3:5]} ended before it could be killed (exit code {proc.returncode})"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        wait_until(lambda: not marked_processes(marker), grace_s)
        return marked_processes(marker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        end_marked(marker)
        if cleanup is not None:
            cleanup(proc.pid)


CPU_PROBE = """
import json, time
wall, cpu = time.perf_counter(), time.process_time()
while time.process_time() - cpu < {work}:
    pass
print(json.dumps({{"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}}))
"""


def cpu_share(procs: int = 1, work: float = 0.3) -> float:
    """The CPU the machine gives ``procs`` CPU-bound processes started together now, in cores: the sum
    of each one's CPU time over its wall time (a shared machine gives less than its core count)."""
    import json

    ps = [subprocess.Popen([sys.executable, "-c", CPU_PROBE.format(work=work)], stdout=subprocess.PIPE, text=True)
          for _ in range(procs)]
    runs = [json.loads(p.communicate(timeout=120)[0]) for p in ps]
    return sum(r["cpu"] / r["wall"] for r in runs)
