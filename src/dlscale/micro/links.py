"""``dlscale micro links``: the bandwidth of every node's link, measured between pairs of nodes.

What is measured: one rank per node (its local rank 0) exchanges a buffer with one rank of
another node, both directions at once (nccl-tests' send/recv: ``size`` each way, algbw =
size / time, busbw = algbw), one pair of nodes at a time while every other rank waits, over a
size sweep; each iteration is timed on both ends and the two times are averaged.

Which pairs, and why all of them: in a star (nodes on a switch, or emulated nodes on a bridge)
the traffic between node i and node j crosses link i and link j, so a pair runs at the slower of
its two links. A pair alone therefore cannot say which of its two links is slow, and neither can
"node 0 with each other node" (a slow node 0 makes every pair slow, which looks like every other
node being slow) nor a ring (with three nodes and one slow, two of the three ring pairs are slow,
so the slow figure is the median and nothing stands out). Every pair is measured instead
(K(K-1)/2 of them), and node k's link figure is its *fastest* pair: that pair runs at
min(link k, its partner's link), which is link k's own rate as soon as one partner is at least
as fast. With one slow node among K >= 3, every healthy node has a healthy partner and shows its
own rate, and the slow node shows its slow rate whatever its partner: the slow link is the one
entry far below the median, named by its node. With two nodes there is one pair and no way to
tell the two links apart (the record warns).

``raw["links"]`` has one entry per node, ``{"src_node": k, "dst_node": partner, "algbw_gbps",
"busbw_gbps", "samples": [GB/s per iteration], ...}``, at the largest size of the sweep (the
bandwidth-bound end); ``raw["rows"]`` every (pair, size) measured. The arithmetic here is pure
(no torch, no processes); the ranks' part is ``micro/link_worker.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dlscale import stats
from dlscale.errors import UsageError
from dlscale.micro.collectives import parse_sizes

DEFAULT_SIZES = "64K:16M:4"
UNITS = {"link_busbw_min": "GB/s", "link_busbw_median": "GB/s", "link_busbw_max": "GB/s",
         "slowest_link_src_node": "node", "slowest_link_dst_node": "node", "slowest_link_fraction": "fraction",
         "nodes": "nodes", "pairs": "pairs", "wrong": "elements"}


@dataclass(frozen=True)
class LinkOptions:
    """What ``dlscale micro links`` measures (validated at construction); its ranks are a ``Layout``."""

    sizes: str = DEFAULT_SIZES
    warmup: int = 2
    iters: int = 10
    budget: float = 0.5  # seconds per (pair, size)
    device: str = "auto"
    tag: str | None = None

    def __post_init__(self) -> None:
        parse_sizes(self.sizes)
        if any(s < 4 for s in parse_sizes(self.sizes)):
            raise UsageError(f"--sizes {self.sizes!r}: each size must hold one float (>= 4 bytes)")
        if self.iters < 1 or self.warmup < 0 or self.budget <= 0:
            raise UsageError("links need --iters >= 1, --warmup >= 0 and --budget > 0")
        if self.device not in ("auto", "cpu", "cuda"):
            raise UsageError(f"unknown --device {self.device!r}; choose one of auto, cpu, cuda")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_for(choice: str, backend: str | None) -> str:
    """The device the exchanges use: gloo sends and receives CPU tensors only (PyTorch's backend
    table), so over gloo (the emulated nodes' default) ``auto`` is the CPU and ``cuda`` is refused."""
    if backend == "gloo" and choice == "cuda":
        raise UsageError("micro links over gloo sends CPU tensors only; use --device cpu, or --backend nccl on GPUs")
    return "cpu" if backend == "gloo" else choice


def all_pairs(nodes: int) -> list[tuple[int, int]]:
    """Every unordered pair of nodes, (0, 1), (0, 2), ..., (1, 2), ...: the order they are measured in."""
    return [(i, j) for i in range(nodes) for j in range(i + 1, nodes)]


def pair_row(src: int, dst: int, size: int, times_s: list[float], wrong: int = 0) -> dict[str, Any]:
    """One (pair, size): per-iteration times (seconds, averaged over the pair's two ends) to figures."""
    mean_t = stats.mean(times_s)
    algbw = size / mean_t / 1e9
    return {"src_node": src, "dst_node": dst, "size": size, "iters": len(times_s), "time_us": mean_t * 1e6,
            "algbw_gbps": algbw, "busbw_gbps": algbw,  # send/recv moves size over each link: factor 1
            "samples": [size / t / 1e9 for t in times_s], "wrong": wrong}


def node_links(rows: list[dict[str, Any]], nodes: int) -> list[dict[str, Any]]:
    """Each node's link: its fastest pair at the largest size measured (see the module doc), the
    pair written from that node (``src_node`` = the node whose link the entry is)."""
    if not rows:
        return []
    largest = max(r["size"] for r in rows)
    top = [r for r in rows if r["size"] == largest]
    out = []
    for k in range(nodes):
        mine = [r for r in top if k in (r["src_node"], r["dst_node"])]
        if not mine:
            continue
        best = max(mine, key=lambda r: (r["algbw_gbps"], -_partner(r, k)))
        out.append({"src_node": k, "dst_node": _partner(best, k), "algbw_gbps": best["algbw_gbps"],
                    "busbw_gbps": best["busbw_gbps"], "samples": list(best["samples"]), "size": largest,
                    "time_us": best["time_us"], "iters": best["iters"]})
    return out


def _partner(row: dict[str, Any], k: int) -> int:
    return row["dst_node"] if row["src_node"] == k else row["src_node"]


def summarize(links: list[dict[str, Any]], rows: list[dict[str, Any]], nodes: int) -> dict[str, Any]:
    """The run's scalar figures: min / median / max of the nodes' link busbw, the slowest link (its
    node and partner) and how far below the median it is, pairs, #wrong."""
    busbw = [e["busbw_gbps"] for e in links]
    slowest = min(links, key=lambda e: (e["busbw_gbps"], e["src_node"])) if links else None
    median = stats.percentile(busbw, 50) if busbw else None
    return {
        "link_busbw_min": min(busbw) if busbw else None,
        "link_busbw_median": median,
        "link_busbw_max": max(busbw) if busbw else None,
        "slowest_link_src_node": slowest["src_node"] if slowest else None,
        "slowest_link_dst_node": slowest["dst_node"] if slowest else None,
        "slowest_link_fraction": slowest["busbw_gbps"] / median if slowest and median else None,
        "nodes": nodes,
        "pairs": len({(r["src_node"], r["dst_node"]) for r in rows}),
        "wrong": sum(r["wrong"] for r in rows),
    }


def shaped_rates(links: list[dict[str, Any]], node_rate: Any) -> None:
    """On emulated nodes, each entry's ``shaped_gbps``: the slower of its two links' shaped rates
    (``node_rate(k)``: a tc rate or None), the figure the entry can reach; None where unshaped."""
    from dlscale.distributed.netns import parse_rate

    for e in links:
        rates = [node_rate(k) for k in (e["src_node"], e["dst_node"])]
        e["shaped_gbps"] = min(parse_rate(r) for r in rates if r) / 8 / 1e9 if any(rates) else None


def two_node_warning(nodes: int) -> list[str]:
    if nodes != 2:
        return []
    return ["two nodes make one pair: its figure is the slower of the two links, and which one is slow cannot be "
            "told (three or more nodes name the slow node)"]
