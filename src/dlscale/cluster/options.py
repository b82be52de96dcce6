"""The rehearsal cluster's options (``ClusterOptions``), each checked where it is built: a bad value
is one UsageError naming the option and the fix, before anything starts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from dlscale.errors import UsageError

MAX_NODES = 32
DEFAULT_NODES = 3


@dataclass(frozen=True)
class ClusterOptions:
    """What ``SlurmCluster`` builds (``dlscale cluster up``'s options)."""

    nodes: int = DEFAULT_NODES
    link_bandwidth: str | None = "1gbit"  # every node's link (tc tbf), None: unshaped
    node_link_bandwidth: Any = ()  # one node's own rate: "2=100mbit", {2: "100mbit"} or ((2, "100mbit"),)
    cpus: int | None = None  # CPUs each node declares (default: those this process may use)
    partition: str = "debug"
    health_check: str | None = None  # the shell command the health check runs on every node (None: nothing)
    health_check_interval_s: int = 300
    slurmd_timeout_s: int = 30  # a node that does not answer this long is DOWN (its jobs NODE_FAIL)
    debian_hosts: bool = False  # each node its own /etc/hosts as Debian writes it (its name on 127.0.1.1)
    on_host: bool = False  # one node: this machine itself, no namespace (the tests' single-node cluster)
    _node_rates: dict[int, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from dlscale.distributed.netns import parse_rate
        from dlscale.layout import node_values

        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not 1 <= self.nodes <= MAX_NODES:
            raise UsageError(f"--nodes must be between 1 and {MAX_NODES}, got {self.nodes!r}")
        if self.on_host and self.nodes != 1:
            raise UsageError("a cluster on the host itself has one node (this machine); leave out on_host for more")
        if self.link_bandwidth:
            parse_rate(self.link_bandwidth)

        def rate(option: str, text: str) -> str:
            parse_rate(text, option)
            return text.strip()

        rates = dict(node_values("--node-link-bandwidth", self.node_link_bandwidth, rate, "2=100mbit"))
        bad = [k for k in rates if not 0 <= k < self.nodes]
        if bad:
            raise UsageError(f"--node-link-bandwidth names node {bad[0]}, but the cluster has nodes 0..{self.nodes - 1}")
        if self.on_host and (rates or self.debian_hosts):
            raise UsageError("a cluster on the host itself has no emulated link or hosts file of its own")
        object.__setattr__(self, "_node_rates", rates)
        if self.cpus is not None and (isinstance(self.cpus, bool) or not isinstance(self.cpus, int) or self.cpus < 1):
            raise UsageError(f"--cpus-per-node must be 1 or more, got {self.cpus!r}")
        if not str(self.partition).replace("_", "").replace("-", "").isalnum():
            raise UsageError(f"--partition {self.partition!r}: give a name of letters, digits, - and _")
        for option, value, low in (("--health-check-interval", self.health_check_interval_s, 1),
                                   ("--slurmd-timeout", self.slurmd_timeout_s, 5)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UsageError(f"{option} must be a whole number of seconds >= {low}, got {value!r}")

    @property
    def node_rates(self) -> dict[int, str]:
        """Node -> its own link rate."""
        return dict(self._node_rates)

    def rate_of(self, k: int) -> str | None:
        """Node k's link rate (None: unshaped)."""
        return self._node_rates.get(k, None if self.on_host else self.link_bandwidth)

    @property
    def cpus_per_node(self) -> int:
        return self.cpus or len(os.sched_getaffinity(0))
