"""Emulated nodes on one machine: Linux network namespaces joined by veth pairs and a bridge.

Node k lives in namespace ``dls-<pid>-<id>-n<k>`` with one interface ``dls0`` at 10.77.0.(k+1)/24;
its veth peer sits in a hub namespace ``dls-<pid>-<id>-hub`` on a bridge, so the root namespace's
network is never touched. Each link is shaped in both directions (the node's egress on ``dls0``
and the hub's egress towards the node) with tbf at ``--link-bandwidth``, or at the node's own rate
where ``--node-link-bandwidth`` gives one (a star: traffic from node i to node j crosses link i and
link j, so it runs at the slower of the two); ``--link-latency`` adds netem delay where the kernel
has netem and is a one-line error where it does not.

``EmulatedNodes`` is a context manager: leaving it (normally, on an exception, on Ctrl-C) kills
the processes still inside its namespaces and deletes them, which removes the veths and the bridge.
Namespaces left by a dlscale process that died (SIGKILL) are removed by ``cleanup_stale()``.

``subnet`` puts the nodes on another /24 than 10.77.0 and ``uplink`` joins the root namespace to the
hub as well: a veth of that name in the root namespace at ``<subnet>.254``, unshaped, so that a
process of this machine (a Slurm controller) reaches every node. The rehearsal Slurm cluster
(``dlscale.cluster``) uses both; the veth goes with the hub's namespace.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass, field

import psutil

from dlscale.errors import UsageError

PREFIX = "dls-"
IFNAME = "dls0"
SUBNET = "10.77.0"
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}
_TIME_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0}


def parse_rate(text: str, option: str = "--link-bandwidth") -> float:
    """A tc-style rate ('10gbit', '100mbit', '1.5gbps') in bit/s; bad syntax is a UsageError naming ``option``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*", text or "")
    if not m or m.group(2).lower() not in _RATE_UNITS or float(m.group(1)) <= 0:
        raise UsageError(f"{option} {text!r}: give a positive rate like 10gbit, 1gbit or 100mbit")
    return float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]


def parse_latency(text: str) -> float:
    """A tc-style time ('50us', '1ms') in seconds; bad syntax is a UsageError."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*", text or "")
    if not m or m.group(2).lower() not in _TIME_UNITS:
        raise UsageError(f"--link-latency {text!r}: give a time like 50us or 1ms")
    return float(m.group(1)) * _TIME_UNITS[m.group(2).lower()]


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (not root, no iproute2, not permitted), or None."""
    if os.geteuid() != 0:
        return "emulated nodes need root (network namespaces, veth, tc); run as root or leave out --emulate-nodes"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"emulated nodes need iproute2 ('{tool}' is not on PATH); install iproute2 (apt-get install iproute2)"
    probe = f"{PREFIX}{os.getpid()}-probe{uuid.uuid4().hex[:4]}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"network namespaces are not permitted here: {_first_line(r.stderr)}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class EmulatedNodes:
    """K emulated nodes with shaped links; use as ``with EmulatedNodes(2, '1gbit') as en: ...``.
    ``node_bandwidth`` {node: rate} gives a node a link rate of its own."""

    nodes: int
    bandwidth: str | None = None
    latency: str | None = None
    node_bandwidth: dict[int, str] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    hub: str | None = None
    subnet: str = SUBNET  # the nodes' /24: node k at <subnet>.(k+1)
    uplink: str | None = None  # a veth of this name joining the root namespace to the hub at <subnet>.254

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.nodes > 200:
            raise UsageError(f"--emulate-nodes must be between 1 and 200, got {self.nodes}")
        self.rate_bps = parse_rate(self.bandwidth) if self.bandwidth else None
        self.delay_s = parse_latency(self.latency) if self.latency else None
        self.node_rate_bps = {k: parse_rate(r, "--node-link-bandwidth") for k, r in self.node_bandwidth.items()}
        if any(not 0 <= k < self.nodes for k in self.node_rate_bps):
            raise UsageError(f"--node-link-bandwidth names a node outside 0..{self.nodes - 1}")

    def rate_of(self, k: int) -> float | None:
        """Node k's link rate in bit/s (None: unshaped)."""
        return self.node_rate_bps.get(k, self.rate_bps)

    def address(self, k: int) -> str:
        return f"{self.subnet}.{k + 1}"

    @property
    def root_address(self) -> str:
        """The root namespace's address on the nodes' subnet (with ``uplink``)."""
        return f"{self.subnet}.254"

    def exec_prefix(self, k: int) -> list[str]:
        """The command prefix that runs a program inside node k's namespace."""
        return ["ip", "netns", "exec", self.names[k]]

    def describe(self) -> dict:
        shaped = self.delay_s or any(self.rate_of(k) for k in range(self.nodes))
        return {"emulated": True, "nodes": self.nodes, "link_bandwidth": self.bandwidth,
                "link_bandwidth_bps": self.rate_bps, "link_latency": self.latency,
                "node_link_bandwidth_bps": {str(k): self.rate_of(k) for k in range(self.nodes)},
                "shaping": "tbf" + ("+netem" if self.delay_s else "") if shaped else "none",
                "interface": IFNAME}

    def __enter__(self) -> "EmulatedNodes":
        reason = unavailable_reason()
        if reason:
            raise UsageError(reason)
        cleanup_stale()
        tag = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.hub = f"{tag}-hub"
        try:
            _ip("netns", "add", self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            if self.delay_s is not None:
                self._check_netem()
            for k in range(self.nodes):
                ns = f"{tag}-n{k}"
                _ip("netns", "add", ns)
                self.names.append(ns)
                peer = f"h{k}"
                _ip("-n", self.hub, "link", "add", peer, "type", "veth", "peer", "name", IFNAME, "netns", ns)
                _ip("-n", self.hub, "link", "set", peer, "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", IFNAME)
                _ip("-n", ns, "link", "set", IFNAME, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self._shape(ns, IFNAME, self.rate_of(k))
                self._shape(self.hub, peer, self.rate_of(k))
            if self.uplink:
                self._join_root(self.uplink)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill what still runs inside the namespaces, then delete them (veths and bridge go too; the
        uplink's end in the root namespace is deleted first: a namespace goes once nothing holds it)."""
        if self.uplink and self.hub:
            subprocess.run(["ip", "link", "del", self.uplink], capture_output=True)
        for ns in [*self.names, *([self.hub] if self.hub else [])]:
            remove_namespace(ns)
        self.names, self.hub = [], None

    def _join_root(self, name: str) -> None:
        """A veth from the root namespace (``name``, at ``root_address``) to the hub's bridge, unshaped."""
        _ip("link", "add", name, "type", "veth", "peer", "name", "up0", "netns", self.hub)
        _ip("-n", self.hub, "link", "set", "up0", "master", "br0", "up")
        _ip("addr", "add", f"{self.root_address}/24", "dev", name)
        _ip("link", "set", name, "up")

    def _shape(self, ns: str, dev: str, rate_bps: float | None) -> None:
        parent = ["root"]
        if self.delay_s is not None:
            _tc(ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", f"{self.delay_s * 1e6:.0f}us")
            parent = ["parent", "1:1"]
        if rate_bps is not None:
            # burst >= rate x 10 ms and >= 256 KiB: veth hands tbf 64 KiB GSO frames, a smaller
            # bucket would drop them; latency bounds the queue.
            burst = int(max(rate_bps / 8 / 100, 256 * 1024))
            _tc(ns, "qdisc", "add", "dev", dev, *parent, "handle", "10:", "tbf", "rate", f"{int(rate_bps)}bit",
                "burst", str(burst), "latency", "100ms")

    def _check_netem(self) -> None:
        r = subprocess.run(["tc", "-n", self.hub, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise UsageError("--link-latency needs the kernel's netem qdisc, which this kernel does not have "
                             f"({_first_line(r.stderr)}); leave --link-latency out (bandwidth is shaped with tbf)")
        subprocess.run(["tc", "-n", self.hub, "qdisc", "del", "dev", "lo", "root"], capture_output=True)


def remove_namespace(ns: str) -> None:
    """Kill the processes inside ``ns`` (dlscale started them there) and delete it."""
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def list_namespaces() -> list[str]:
    """dlscale's namespaces that exist now."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.startswith(PREFIX)]


def cleanup_stale() -> list[str]:
    """Delete namespaces whose creating dlscale process is gone (e.g. killed with SIGKILL)."""
    removed = []
    for ns in list_namespaces():
        m = re.match(rf"{PREFIX}(\d+)-", ns)
        if m and not psutil.pid_exists(int(m.group(1))):
            remove_namespace(ns)
            removed.append(ns)
    return removed


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {_first_line(r.stderr)}")


def _tc(ns: str, *args: str) -> None:
    r = subprocess.run(["tc", "-n", ns, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)} in {ns}: {_first_line(r.stderr)}")


def _first_line(text: str) -> str:
    lines = [x for x in (text or "").strip().splitlines() if x.strip()]
    return lines[0].strip() if lines else "no message"
