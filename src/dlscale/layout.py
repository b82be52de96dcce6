"""How the ranks of a job are laid out and started: the one layout config of every family.

``Layout`` is shared by ``train``, ``tta``, ``micro collectives`` and ``scale`` (and whatever runs
several processes later): ranks per node, nodes (real, with a rendezvous at ``master_addr``, or
emulated on this machine in network namespaces joined by a shaped link), backend, timeouts and
threads. It is validated where it is built: a value that cannot work is a one-line ``UsageError``
naming the option. ``config()`` is the layout part of a run record's config, the same keys for
every family. No torch at import time.
"""

from __future__ import annotations

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

    def __post_init__(self) -> None:
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
                "link_latency": self.link_latency}

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
            "dist_timeout_s": self.timeout_s,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_(self, **changes: Any) -> "Layout":
        return replace(self, **changes)


def _at_least(option: str, value: int, low: int) -> None:
    if value < low:
        raise UsageError(f"{option} must be >= {low}, got {value}")
