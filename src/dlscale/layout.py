"""How the ranks of a job are laid out and started: the one layout config of every family.

``Layout`` is shared by ``train``, ``tta``, ``micro collectives``, ``micro links`` and ``scale``
(and whatever runs several processes later): ranks per node, nodes (real, with a rendezvous at
``master_addr``, or emulated on this machine in network namespaces joined by a shaped link, where
one node's link rate and one node's CPU quota may differ from the others'), backend, timeouts and
threads. It is validated where it is built: a value that cannot work is a one-line ``UsageError``
naming the option. ``config()`` is the layout part of a run record's config, the same keys for
every family. No torch at import time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from dlscale.errors import UsageError

BACKENDS = ("gloo", "nccl", "mpi")
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Layout:
    """Ranks per node x nodes, where node 0 is, how the ranks talk, how long they may wait."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port on one node, 29500 across nodes
    backend: str | None = None  # None: nccl on CUDA, gloo on CPU (and on emulated nodes)
    emulate_nodes: int | None = None  # run this many nodes here, each in its own network namespace
    link_bandwidth: str | None = None  # emulated link rate (tc tbf), e.g. 1gbit
    link_latency: str | None = None  # emulated link delay (netem, where the kernel has it)
    timeout_s: float = DEFAULT_TIMEOUT_S  # rendezvous and collective timeout
    threads_per_rank: int | None = None  # CPU threads per rank; None: cores / ranks on this machine
    force: bool = False  # run through the launcher even with one rank (the ladder's 1x1 DDP baseline)
    cpu_binding: bool = True  # each rank on a GPU bound to the CPUs of its GPU's NUMA node (distributed/placement.py)
    # Emulated nodes only, ((node, value), ...) sorted by node; also given as "2=100mbit,0=1gbit",
    # a list of such strings or {node: value}:
    node_link_bandwidth: tuple[tuple[int, str], ...] = ()  # this node's link rate instead of link_bandwidth
    node_cpu_quota: tuple[tuple[int, float], ...] = ()  # this node's ranks share this many cores (a cgroup)

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_link_bandwidth",
                           node_values("--node-link-bandwidth", self.node_link_bandwidth, _rate_text, "2=100mbit"))
        object.__setattr__(self, "node_cpu_quota",
                           node_values("--node-cpu-quota", self.node_cpu_quota, _quota, "1=0.5"))
        _at_least("--nproc-per-node", self.nproc_per_node, 1)
        _at_least("--nnodes", self.nnodes, 1)
        if not 0 <= self.node_rank < self.nnodes:
            raise UsageError(f"--node-rank must be in 0..{self.nnodes - 1} for --nnodes {self.nnodes}, "
                             f"got {self.node_rank}")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise UsageError(f"--master-port must be in 1..65535, got {self.master_port}")
        if not self.timeout_s > 0:
            raise UsageError(f"--timeout must be > 0 seconds, got {self.timeout_s}")
        if self.backend not in (None, *BACKENDS):
            raise UsageError(f"unknown --backend {self.backend!r}; choose gloo, nccl or mpi")
        if self.threads_per_rank is not None:
            _at_least("--threads-per-rank", self.threads_per_rank, 1)
        self._check_emulation()

    def _check_emulation(self) -> None:
        if self.emulate_nodes is None:
            if self.link_bandwidth or self.link_latency:
                raise UsageError("--link-bandwidth/--link-latency shape emulated links; add --emulate-nodes K")
            if self.node_link_bandwidth or self.node_cpu_quota:
                raise UsageError("--node-link-bandwidth/--node-cpu-quota give emulated nodes their own link rate or "
                                 "CPU quota; add --emulate-nodes K")
            return
        _at_least("--emulate-nodes", self.emulate_nodes, 1)
        if self.nnodes not in (1, self.emulate_nodes) or self.node_rank != 0:
            raise UsageError(f"--emulate-nodes {self.emulate_nodes} runs every node here; leave out "
                             f"--nnodes/--node-rank (or give --nnodes {self.emulate_nodes})")
        from dlscale.distributed.netns import parse_latency, parse_rate

        if self.link_bandwidth:
            parse_rate(self.link_bandwidth)
        if self.link_latency:
            parse_latency(self.link_latency)
        for option, pairs in (("--node-link-bandwidth", self.node_link_bandwidth),
                              ("--node-cpu-quota", self.node_cpu_quota)):
            for node, _ in pairs:
                if not 0 <= node < self.emulate_nodes:
                    raise UsageError(f"{option} names node {node}, but --emulate-nodes {self.emulate_nodes} has "
                                     f"nodes 0..{self.emulate_nodes - 1}")

    def node_rate(self, node: int) -> str | None:
        """The link rate of emulated node ``node``: its own, else ``link_bandwidth`` (None: unshaped)."""
        return dict(self.node_link_bandwidth).get(node, self.link_bandwidth)

    def slowest_link(self) -> str | None:
        """The lowest shaped link rate among the emulated nodes (None where no link is shaped)."""
        from dlscale.distributed.netns import parse_rate

        rates = [r for r in (self.node_rate(k) for k in range(self.emulate_nodes or 0)) if r]
        return min(rates, key=parse_rate) if rates else None

    @property
    def nodes(self) -> int:
        return self.emulate_nodes or self.nnodes

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def ranks_here(self) -> int:
        """Ranks this machine runs: every emulated node's, or this node's."""
        return self.nproc_per_node * (self.emulate_nodes or 1)

    @property
    def distributed(self) -> bool:
        """Whether the job runs as ranks under the launcher (else one plain process)."""
        return self.force or self.world_size > 1 or self.emulate_nodes is not None

    @property
    def launch_backend(self) -> str | None:
        """Emulated nodes share one host: gloo over the shaped link (nccl would bypass it)."""
        return self.backend or ("gloo" if self.emulate_nodes else None)

    def link(self) -> dict[str, Any]:
        """The emulated link as recorded (empty for real nodes)."""
        if not self.emulate_nodes:
            return {}
        return {"emulated": True, "nodes": self.emulate_nodes, "link_bandwidth": self.link_bandwidth,
                "link_latency": self.link_latency, "node_link_bandwidth": _by_node(self.node_link_bandwidth),
                "node_cpu_quota": _by_node(self.node_cpu_quota)}

    def config(self, *, backend: str | None = None, launcher: str = "torchrun", threads: int | None = None,
               world_size: int | None = None, nodes: int | None = None,
               devices_per_node: int | None = None) -> dict[str, Any]:
        """The layout part of a record's config (the same keys in every family's records)."""
        return {
            "world_size": world_size or self.world_size, "nodes": nodes or self.nodes,
            "devices_per_node": devices_per_node or self.nproc_per_node,
            "backend": backend or self.launch_backend, "launcher": launcher,
            "emulated_nodes": bool(self.emulate_nodes), "link_bandwidth": self.link_bandwidth,
            "link_latency": self.link_latency, "threads_per_rank": threads or self.threads_per_rank,
            "dist_timeout_s": self.timeout_s, "node_link_bandwidth": _by_node(self.node_link_bandwidth),
            "node_cpu_quota": _by_node(self.node_cpu_quota),
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_(self, **changes: Any) -> "Layout":
        return replace(self, **changes)


def node_values(option: str, given: Any, convert: Callable[[str, str], Any],
                example: str) -> tuple[tuple[int, Any], ...]:
    """Per-node values as ((node, value), ...) sorted by node, from "N=V,N=V", a list of such
    strings, {N: V} or (N, V) pairs; ``convert(option, text)`` checks one value. A node named
    twice or a bad item is a ``UsageError`` naming the option."""
    out: dict[int, Any] = {}
    for node, value in _items(option, given or (), example):
        if isinstance(node, bool) or not str(node).strip().isdigit():
            raise UsageError(f"{option}: node {node!r} is not a node index; give NODE=VALUE, e.g. {example}")
        k = int(node)
        if k in out:
            raise UsageError(f"{option} names node {k} twice; give each node once")
        out[k] = convert(option, str(value))
    return tuple(sorted(out.items()))


def _items(option: str, given: Any, example: str) -> list[tuple[Any, Any]]:
    if isinstance(given, dict):
        return list(given.items())
    items = []
    for item in [given] if isinstance(given, str) else given:
        if isinstance(item, (list, tuple)) and len(item) == 2:
            items.append((item[0], item[1]))
            continue
        for part in str(item).split(",") if isinstance(item, str) else [repr(item)]:
            m = re.fullmatch(r"\s*(\d+)\s*=\s*(\S+)\s*", part)
            if not m and part.strip():
                raise UsageError(f"{option} {part.strip()!r}: give NODE=VALUE, e.g. {option} {example} "
                                 "(repeat the option or separate with commas)")
            if m:
                items.append((m.group(1), m.group(2)))
    return items


def _rate_text(option: str, text: str) -> str:
    from dlscale.distributed.netns import parse_rate

    parse_rate(text, option)
    return text.strip()


def _quota(option: str, text: str) -> float:
    from dlscale.distributed.cgroup import MIN_CORES

    try:
        cores = float(text)
    except ValueError:
        cores = float("nan")
    if not (cores >= MIN_CORES and math.isfinite(cores)):
        raise UsageError(f"{option}: {text!r} is not a number of cores >= {MIN_CORES}; give e.g. 1=0.5 "
                         "(node 1's ranks share half a core)")
    return cores


def _by_node(pairs: tuple[tuple[int, Any], ...]) -> dict[str, Any] | None:
    """Per-node values as recorded: {"2": "100mbit"} (JSON keys are strings), None where none."""
    return {str(k): v for k, v in pairs} or None


def _at_least(option: str, value: int, low: int) -> None:
    if value < low:
        raise UsageError(f"{option} must be >= {low}, got {value}")
