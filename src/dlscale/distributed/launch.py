"""Start a module on every rank through PyTorch's own launcher (torch.distributed.run, i.e. torchrun).

``run_torchrun`` takes a validated ``Layout`` (``dlscale.layout``), checks the master port (busy)
or the master (unreachable) before anything starts, picks threads per rank on CPUs, runs
``python -m torch.distributed.run ... -m MODULE ARGS`` once per node (inside emulated nodes when
asked), forwards the launcher's output to stderr, and returns the exit code. ``launch`` does the
same and also returns what torchrun reported about a failed rank. ``distributed.job`` is the one
caller inside dlscale; it starts ``dlscale.distributed.rank`` on every rank.

A job that runs past ``timeout_s``, or a Ctrl-C / SIGTERM, ends every process of the job:
SIGTERM to torchrun and its workers, SIGKILL to what is left after a short grace. A launcher that
is killed outright (``kill -9``) takes the job with it: torchrun gets SIGKILL when the launcher
dies, and each rank when torchrun dies (``dlscale.procs``: torchrun itself starts its workers in
sessions of their own and leaves them running when it is killed).
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from dlscale.distributed.env import DEFAULT_PORT, DEVICE_OFFSET_ENV
from dlscale.errors import UsageError
from dlscale.layout import Layout
from dlscale.procs import LAUNCHER_PID_ENV, die_with_parent

GRACE_S = 5.0
RDZV_TIMEOUT_S = 300


@dataclass
class RankFailure:
    """One failed rank as torchrun reported it (its 'Root Cause' / failure summary)."""

    rank: int
    local_rank: int | None
    exitcode: int | None
    detail: str
    root_cause: bool = False  # torchrun's "Root Cause (first observed failure)"


@dataclass
class LaunchResult:
    returncode: int
    timed_out: bool = False
    interrupted: bool = False
    failures: list[RankFailure] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)


def run_torchrun(module: str, module_args: list[str], layout: Layout, *, timeout_s: float | None = None) -> int:
    """Run ``python -m module *module_args`` on every rank of ``layout`` with torchrun; the exit code.

    ``layout.nproc_per_node`` ranks on this node, ``layout.nnodes`` nodes, this one being
    ``layout.node_rank``; the ranks meet at the master (static rendezvous; no port given takes a
    free one on a single node and 29500 across nodes). ``layout.emulate_nodes=K`` runs K nodes on
    this machine, each in its own network namespace with links shaped to the layout's link rate
    (and delay, where the kernel has netem), one node's link at its own rate (``node_link_bandwidth``)
    and one node's ranks under a CPU quota (``node_cpu_quota``, a cgroup); it needs root and
    iproute2. ``timeout_s`` bounds the whole job: past it every process of the job is ended and
    the exit code is 124. A busy port, an unreachable master or missing emulation support is a
    one-line ``UsageError`` before anything starts.
    """
    return launch(module, module_args, layout, timeout_s=timeout_s).returncode


def launch(module: str, module_args: list[str], layout: Layout, *, timeout_s: float | None = None,
           extra_env: dict[str, str] | None = None) -> LaunchResult:
    """``run_torchrun`` with the failure details: see there. The layout's ``threads_per_rank`` sets
    OMP_NUM_THREADS (default: the usable CPUs / ranks here); its ``timeout_s`` bounds the rendezvous and
    the wait for an unreachable master (at most 300 s). torchrun binds no rank to CPUs: each rank binds
    itself within the job's CPUs (placement.py)."""
    env = dict(os.environ)
    env.update(extra_env or {})
    if layout.threads_per_rank is not None or "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(threads_here(layout))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env[LAUNCHER_PID_ENV] = str(os.getpid())  # each rank checks that it still has a launcher
    rdzv_timeout = max(1, int(min(layout.timeout_s, RDZV_TIMEOUT_S)))
    if layout.emulate_nodes:
        return _launch_emulated(module, module_args, layout, env, rdzv_timeout, timeout_s)
    master_port = layout.master_port
    if layout.nnodes > 1 and master_port is None:
        master_port = DEFAULT_PORT  # every node must agree on it; a single node takes a free one
    if layout.node_rank == 0:
        master_port = _check_master_port(layout.master_addr, master_port)
    else:
        _check_master_reachable(layout.master_addr, master_port, float(rdzv_timeout))
    cmd = _torchrun_cmd(module, module_args, layout.nproc_per_node, layout.nnodes, layout.node_rank,
                        layout.master_addr, master_port, rdzv_timeout)
    return _supervise([cmd], env, timeout_s)


def threads_here(layout: Layout) -> int:
    """CPU threads per rank: as given, else the CPUs this process may use shared by the ranks here."""
    from dlscale.system import usable_cpus

    return layout.threads_per_rank or max(1, usable_cpus() // layout.ranks_here)


def _launch_emulated(module: str, module_args: list[str], layout: Layout, env: dict[str, str], rdzv_timeout: int,
                     timeout_s: float | None) -> LaunchResult:
    """Every emulated node's torchrun, each in its namespace. The nodes share this host's devices:
    node k's ranks take device indices k x nproc_per_node + local rank (``DEVICE_OFFSET_ENV``).
    A node with a CPU quota (``node_cpu_quota``) has its torchrun started inside its own cgroup,
    so the launcher and all its ranks share that many cores; the groups go with the namespaces."""
    from contextlib import ExitStack

    from dlscale.distributed.cgroup import CpuQuota
    from dlscale.distributed.netns import EmulatedNodes

    k_nodes = layout.emulate_nodes
    port = layout.master_port or DEFAULT_PORT
    with ExitStack() as stack:
        quotas = {k: stack.enter_context(CpuQuota(cores)) for k, cores in layout.node_cpu_quota}
        en = stack.enter_context(EmulatedNodes(k_nodes, layout.link_bandwidth, layout.link_latency,
                                               dict(layout.node_link_bandwidth)))
        cmds = []
        for k in range(k_nodes):
            cmd = (en.exec_prefix(k) + ["env", f"{DEVICE_OFFSET_ENV}={k * layout.nproc_per_node}"]
                   + _torchrun_cmd(module, module_args, layout.nproc_per_node, k_nodes, k, en.address(0), port,
                                   rdzv_timeout))
            cmds.append(quotas[k].wrap(cmd) if k in quotas else cmd)
        return _supervise(cmds, env, timeout_s)


def _torchrun_cmd(module: str, module_args: list[str], nproc: int, nnodes: int, node_rank: int,
                  master_addr: str, master_port: int, rdzv_timeout: int) -> list[str]:
    """torchrun's command line, with only the flags the installed torchrun has (compat): an older
    torchrun without ``--shutdown-timeout`` ends a failed job's ranks after its own 30 s instead of 5 s."""
    from dlscale import compat

    optional = ["--shutdown-timeout=5"] if compat.available("torchrun_shutdown_timeout") else []
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--node-rank={node_rank}",
        f"--master-addr={master_addr}", f"--master-port={master_port}", "--rdzv-backend=static",
        f"--rdzv-conf=timeout={rdzv_timeout}", "--max-restarts=0", "--monitor-interval=0.2",
        *optional, "-m", module, *module_args,
    ]


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(addr)).is_loopback
    except (OSError, ValueError):
        return False


def _check_master_port(addr: str, port: int | None) -> int:
    """This node hosts the rendezvous: the port must be free here (None: take a free one)."""
    try:
        host = socket.gethostbyname(addr)
    except OSError:
        raise UsageError(f"--master-addr {addr!r} does not resolve") from None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host if _is_loopback(addr) else "", port or 0))
        except OSError as e:
            raise UsageError(f"--master-port {port} is busy on {addr} ({e.strerror}); pick another port "
                             "or leave --master-port out to take a free one") from None
        return s.getsockname()[1]


def _check_master_reachable(addr: str, port: int, wait_s: float) -> None:
    """A non-zero node must reach the master's rendezvous port within ``wait_s`` seconds."""
    try:
        host = socket.gethostbyname(addr)
    except OSError:
        raise UsageError(f"--master-addr {addr!r} does not resolve") from None
    deadline, last = time.monotonic() + wait_s, "no answer"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=2.0):
                return
        except OSError as e:
            last = e.strerror or type(e).__name__
            time.sleep(0.5)
    raise UsageError(f"master {addr}:{port} is unreachable ({last} for {wait_s:.0f} s); start node 0 first "
                     "and check --master-addr/--master-port and the firewall")


def _supervise(cmds: list[list[str]], env: dict[str, str], timeout_s: float | None) -> LaunchResult:
    """Run the node launchers, forward their output to stderr, end everything on timeout or signal."""
    tail: deque[str] = deque(maxlen=400)
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    result = LaunchResult(returncode=0)
    teardown: list[float] = []  # when a launcher began ending its workers after a failure
    old_term = _install_sigterm()
    try:
        for cmd in cmds:
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 errors="replace", start_new_session=True, preexec_fn=die_with_parent())
            procs.append(p)
            t = threading.Thread(target=_pump, args=(p.stdout, tail, teardown), daemon=True)
            t.start()
            threads.append(t)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while [p.poll() for p in procs].count(None):  # poll every launcher: any() would stop at the first alive one
            if deadline is not None and time.monotonic() > deadline:
                result.timed_out = True
                break
            # One node's launcher failing ends the job: the others would wait for it.
            if any(p.returncode not in (None, 0) for p in procs):
                time.sleep(GRACE_S)
                break
            # torchrun gives a worker 30 s to honour SIGTERM; a hung (e.g. stopped) one gets GRACE_S.
            if teardown and time.monotonic() - teardown[0] > GRACE_S:
                _kill_workers(procs)
                teardown.clear()
            time.sleep(0.1)
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        _end(procs)
        for t in threads:
            t.join(timeout=2.0)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    codes = [p.returncode for p in procs]
    result.log_tail = list(tail)
    result.failures = parse_failures("\n".join(tail))
    if result.interrupted:
        raise KeyboardInterrupt
    if result.timed_out:
        result.returncode = 124
    else:
        result.returncode = next((c if c > 0 else 128 - c for c in codes if c), 0)
    return result


def _pump(stream, tail: deque, teardown: list[float]) -> None:
    shown = LauncherFilter(debug=bool(os.environ.get("DLSCALE_DEBUG")))
    for line in stream:
        tail.append(line.rstrip("\n"))
        if "closing signal SIGTERM" in line and not teardown:
            teardown.append(time.monotonic())
        for out in shown(line):
            sys.stderr.write(out)
    sys.stderr.flush()


# torchrun's own log lines (glog style: 'E1123 14:02:03.123000 4242 torch/distributed/...] ...').
_GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")


class LauncherFilter:
    """Which launcher output lines reach stderr: the ranks' own output, not torchrun's failure banner.

    A failed job makes torchrun print its log lines, a Python traceback ending in
    ``ChildFailedError`` and a summary framed by '=' rules; a job ended by Ctrl-C or SIGTERM (which
    dlscale passes on to torchrun) makes it print a traceback ending in ``SignalException``. dlscale
    names the failed rank, or the interruption, in one line of its own, and the launcher's output is
    kept in the failed record (``raw.launcher_log``), so the banner is held back unless ``DLSCALE_DEBUG`` is set. Any other traceback is shown whole.
    Calling the filter with a line returns the lines to show now (possibly held-back ones).
    """

    def __init__(self, debug: bool = False) -> None:
        self.debug = debug
        self.held: list[str] | None = None  # a traceback whose end is not seen yet
        self.rules = -1  # '=' rules seen in torchrun's summary; -1: not in it

    def __call__(self, line: str) -> list[str]:
        text = line.rstrip("\n")
        if self.debug:
            return [line]
        if self.rules >= 0:  # inside torchrun's summary: up to its second rule
            self.rules += text.startswith("=" * 20)
            if self.rules >= 2:
                self.rules = -1
            return []
        if _GLOG.match(text):
            return []
        if self.held is not None:
            return self._traceback_line(line, text)
        if text.startswith("Traceback (most recent call last):"):
            self.held = [line]
            return []
        return [line]

    def _traceback_line(self, line: str, text: str) -> list[str]:
        if "ChildFailedError" in text:  # torchrun's own: drop it, and its summary that follows
            self.held, self.rules = None, 0
            return []
        if "SignalException:" in text and not text.startswith((" ", "\t")):
            self.held = None  # torchrun ended by the signal dlscale passed on: the interruption is one line
            return []
        if text.startswith((" ", "\t")) or not text:
            self.held.append(line)
            return []
        shown, self.held = [*self.held, line], None  # the last line of somebody else's traceback
        return shown


def _install_sigterm():
    """SIGTERM ends the job like Ctrl-C (only the main thread can install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


def _kill_workers(procs: list[subprocess.Popen]) -> None:
    """SIGKILL the workers (not the launchers, which then report and exit)."""
    import psutil

    for p in procs:
        try:
            for q in psutil.Process(p.pid).children(recursive=True):
                q.kill()
        except psutil.NoSuchProcess:
            continue


def _end(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every launcher and its descendants, SIGKILL what is left after a grace period."""
    import psutil

    alive = []
    for p in procs:
        if p.poll() is not None:
            continue
        try:
            root = psutil.Process(p.pid)
            alive.extend([root, *root.children(recursive=True)])
        except psutil.NoSuchProcess:
            continue
    for q in alive:
        try:
            q.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, left = psutil.wait_procs(alive, timeout=GRACE_S)
    for q in left:
        try:
            q.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=GRACE_S)
    for p in procs:
        try:
            p.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


_FAILURE = re.compile(
    r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)[^\n]*\n"
    r"(?:\s*error_file\s*:[^\n]*\n)?\s*traceback\s*:\s*([^\n]*)")


def parse_failures(log: str) -> list[RankFailure]:
    """The failed ranks in torchrun's failure summary ('rank : 1 (local_rank: 1) / exitcode : -9 ...')."""
    seen: dict[int, RankFailure] = {}
    roots = {m.start() for m in re.finditer(r"Root Cause", log)}
    for m in _FAILURE.finditer(log):
        rank = int(m.group(1))
        is_root = any(0 < m.start() - r < 200 for r in roots)
        if rank not in seen or is_root:
            seen[rank] = RankFailure(rank, int(m.group(2)), int(m.group(3)), m.group(4).strip(),
                                     is_root or (rank in seen and seen[rank].root_cause))
    return sorted(seen.values(), key=lambda f: not f.root_cause)
