"""The figure an acceptance judges and what it is about (``Subject``), with the helpers every
check's reader shares: subjects of devices, ranks and hosts, rates from timed work, intervals.
``accept/figures/readers.py`` turns each check's record into figures; ``accept/figures/collect.py`` reads an
acceptance's records with them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dlscale import stats


@dataclass(frozen=True)
class Subject:
    """What a figure is about below the system: a device, a rank, a link between nodes, a GPU pair."""

    kind: str  # "device" | "rank" | "link" | "pair" | "host" (a per-node figure of one node among several)
    label: str  # "GPU 3", "node 1" (its CPU), "cpu", "node 2's link", "GPU 0->1", "gpu07"
    key: str  # stable across acceptances: "cuda:3", "node 1 cpu", "link node 2", "gpu07 cuda:3"
    nodes: tuple[int, ...] = ()  # the nodes it sits on
    devices: tuple[str, ...] = ()  # the devices it is ("cuda:3"; a GPU pair: both)


@dataclass
class Figure:
    check: str
    name: str  # what was measured: "throughput", "bf16 best rate", "d2d", "all_reduce busbw", "efficiency 1x2"
    value: float
    unit: str
    run_id: str
    subject: Subject | None = None
    samples: list[float] = field(default_factory=list)  # repeated measurements of the same rate
    ci95: tuple[float, float] | None = None
    model: str | None = None  # the device model: peers share it
    peers: bool = False  # judged against the median of its peers in the same run
    peer_noise: str = "samples"  # "values": the peers' spread is between them, not in their samples (a node's CPU)
    context: dict[str, Any] = field(default_factory=dict)  # match keys, energy/cost, datasheet hints
    peer_scope: str | None = None  # peers beyond one run ("acceptance": every node's run of the same check)

    @property
    def key(self) -> str:
        return f"{self.check}|{self.name}|{self.subject.key if self.subject else ''}"

    @property
    def peer_group(self) -> tuple[str, str, str, str | None] | None:
        return (self.peer_scope or self.run_id, self.check, self.name, self.model) if self.peers else None

    @property
    def where(self) -> str:
        """'bf16 best rate on GPU 3' / 'throughput'."""
        return f"{self.name} on {self.subject.label}" if self.subject else self.name


@dataclass(frozen=True)
class Unreadable:
    """What a check's ok record should have given and did not: a record its reader cannot read (a field
    missing or of the wrong type), a figure that is not a positive finite number, a GPU with no figure."""

    check: str
    run_id: str
    reason: str
    subject: str | None = None
    figure: str = "figure"


def sound(x: Any) -> bool:
    """Is ``x`` a rate a verdict can rest on: a positive finite real number (not a bool, NaN, inf, 0, text)?"""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def on_host(fig: Figure, host: str) -> Figure:
    """The figure of one node among several: its subject (the host itself where it had none) named by host."""
    return replace(fig, subject=host_subject(fig.subject, host))


def host_subject(s: Subject | None, host: str) -> Subject:
    """A subject on ``host`` ("gpu07 GPU 3", key "gpu07 cuda:3"); None: the host ("gpu07")."""
    if s is None:
        return Subject("host", host, host, (), (host,))
    return Subject(s.kind, f"{host} {s.label}", f"{host} {s.key}", s.nodes, tuple(f"{host} {d}" for d in s.devices))


# -- subjects ---------------------------------------------------------------------------------------
def device_subject(device: str, node: int | None = None, several_nodes: bool = False) -> Subject:
    """A device as the record names it ("cuda:3", "cpu") on a node."""
    label = f"GPU {device.split(':')[1]}" if device.startswith("cuda:") else device
    key = device if not several_nodes else f"node {node} {device}"
    return Subject("device", f"node {node} {label}" if several_nodes else label, key,
                   (node,) if several_nodes and node is not None else (), (key,))


def rank_subject(ident: dict[str, Any], several_nodes: bool, by_host: bool = False) -> Subject:
    """The device a rank of a multi-process run ran on, from its identity: the GPU it owns, else its
    node's CPU, which every rank on that node shares ("cpu", or "node 1" among several nodes).
    ``by_host``: the nodes are hosts of their own (not emulated on one), and the subject is named by
    its host as the per-node figures of that host are (``host_subject``), so their verdicts explain
    each other."""
    dev, node = str(ident.get("device") or ""), int(ident.get("node") or 0)
    host = str(ident.get("host") or "?") if by_host else ""
    if dev.startswith("cuda:"):
        if host:
            return replace(host_subject(device_subject(dev), host), nodes=(node,))
        return device_subject(dev, node, several_nodes)
    if not dev:  # an identity without its device: the rank itself
        rank = int(ident.get("rank") or 0)
        label = f"{host} rank {rank}" if host else f"node {node} rank {rank}" if several_nodes else f"rank {rank}"
        return Subject("rank", label, f"rank {rank}", (node,) if several_nodes else (),
                       (f"rank {rank}",) + ((host,) if host else ()))
    if host:  # a host's CPU, one host among several
        return replace(host_subject(Subject("device", dev, dev, (), (dev,)), host), nodes=(node,))
    key = f"node {node} {dev}" if several_nodes else dev
    return Subject("device", f"node {node}" if several_nodes else dev, key, (node,) if several_nodes else (), (key,))


def device_of(ident: dict[str, Any]) -> tuple[str, int, str]:
    """(host, node, device) of a rank: ranks with the same are on the same device (a node's CPU, or a
    GPU two ranks were given)."""
    device = str(ident.get("device") or f"rank {ident.get('rank')}")
    return str(ident.get("host") or ""), int(ident.get("node") or 0), device


# -- rates and intervals -----------------------------------------------------------------------------
def rates(work: float, times: Iterable[float]) -> list[float]:
    """``work / t`` for every positive time."""
    return [work / t for t in times if t and t > 0]


def row_ci(work: float, times: Sequence[float]) -> tuple[float, float] | None:
    ci = stats.throughput_ci95_from_steps(work, times) if len(times) >= 2 else None
    return tuple(ci) if ci else None  # type: ignore[return-value]


def geometric_mean_ci95(xs: Sequence[float]) -> tuple[float, tuple[float, float] | None]:
    """The geometric mean of positive values and its 95% interval (the t-interval of the logs, mapped back)."""
    logs = [math.log(x) for x in xs if x > 0]
    ci = stats.mean_ci95(logs)
    return math.exp(stats.mean(logs)), (math.exp(ci[0]), math.exp(ci[1])) if ci else None


def scaled(ci: tuple[float, float] | None, factor: float) -> tuple[float, float] | None:
    return (ci[0] * factor, ci[1] * factor) if ci else None
