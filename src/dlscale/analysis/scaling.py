"""Scaling analysis over stored runs: ladders, efficiency, intra/inter-node split, layout % difference.

Reads run records only (never runs anything). Runs of the same short test on the same system
(model, per-device batch, image size, precision, device type, threads per rank; the system name
of imported runs) form a ladder; within it each run
is a point at a layout ``nodes x devices per node``. Single-node points belong to every ladder
of that test; multi-node points are split by their link (emulated bandwidth/latency), so a 1 gbit
and a 10 gbit scale-out are two ladders sharing the same scale-up points.

Per point (formulas in ``analysis.formulas``, derived in docs/METRICS.md):

- speed-up ``X / X_1`` and efficiency ``X / (N * X_1)``, ``X_1`` the 1x1 throughput;
- intra-node efficiency ``X(1xg) / (g * X_1)``: what a node of g devices keeps;
- inter-node efficiency ``X(nxg) / (n * X(1xg))``: what spreading over n such nodes keeps;
  efficiency = intra x inter.

Per device count with several layouts (from any system with the same test): each layout A
against each layout B spread over more nodes, ``(A - B) / B`` as in seed 001 Table 5 (positive:
the scale-up layout is faster).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dlscale.analysis.formulas import pct_difference, scaling_efficiency, speedup
from dlscale.stats import mean

TEST_KEYS = ("system", "batch_size", "image_size", "seq_len", "tokens_per_batch", "model_config", "max_table_rows",
             "parallel", "activation_checkpointing", "precision", "channels_last", "compile", "compile_mode",
             "optimizer", "optimizer_impl", "ddp_bucket_mb", "ddp_grad_as_bucket_view", "ddp_static_graph",
             "ddp_broadcast_buffers", "pin_memory", "prefetch_factor", "device", "threads_per_rank")


@dataclass
class Point:
    """One layout of a ladder: the mean over the runs recorded at it."""

    nodes: int
    devices_per_node: int
    throughput: float
    run_ids: list[str]
    comm_fraction: float | None = None
    link: str | None = None
    system: str | None = None

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def layout(self) -> str:
        return f"{self.nodes}x{self.devices_per_node}"


@dataclass
class Ladder:
    workload: str
    test: dict[str, Any]
    link: str | None
    points: list[Point] = field(default_factory=list)

    @property
    def label(self) -> str:
        return describe(self.workload, self.test) + (f", inter-node link {self.link}" if self.link else "")

    def point(self, nodes: int, per_node: int) -> Point | None:
        return next((p for p in self.points if p.nodes == nodes and p.devices_per_node == per_node), None)
# what a record written before a TrainConfig field existed ran with (so old and new runs still meet)
OLD_DEFAULTS = {"optimizer_impl": "default", "ddp_grad_as_bucket_view": False, "ddp_static_graph": False,
                "ddp_broadcast_buffers": True}


def layout_of(rec: Any) -> tuple[int, int]:
    """(nodes, devices per node) of a run; a run without distributed keys is 1x1."""
    c, m = rec.config, rec.metrics
    nodes = int(c.get("nodes") or m.get("nodes") or 1)
    per_node = int(c.get("devices_per_node") or m.get("devices_per_node") or (m.get("world_size") or 1) // nodes)
    return nodes, per_node


def link_of(rec: Any) -> str | None:
    c = rec.config
    if not c.get("emulated_nodes"):
        return None if layout_of(rec)[0] == 1 else "real network"
    parts = [c.get("link_bandwidth") or "unshaped"]
    if c.get("link_latency"):
        parts.append(f"+{c['link_latency']}")
    apart = [f"node {k} at {v}" for k, v in (c.get("node_link_bandwidth") or {}).items()]
    apart += [f"node {k} on {v:g} cores" for k, v in (c.get("node_cpu_quota") or {}).items()]
    return ", ".join(["emulated " + " ".join(parts), *apart])


def ladders(records: Iterable[Any]) -> list[Ladder]:
    """Group ok train runs into ladders (see the module docstring)."""
    groups: dict[tuple, dict[str | None, dict[tuple[int, int], list[Any]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in records:
        if r.kind != "train" or r.status != "ok" or r.metrics.get("throughput") is None:
            continue
        key = (r.workload, *(_norm(r.config.get(k, OLD_DEFAULTS.get(k))) for k in TEST_KEYS))
        nodes, per_node = layout_of(r)
        groups[key][link_of(r) if nodes > 1 else None][(nodes, per_node)].append(r)
    out = []
    for key, by_link in groups.items():
        single = by_link.pop(None, {})
        for link in sorted(by_link, key=str) or [None]:
            lad = Ladder(workload=key[0], test=dict(zip(TEST_KEYS, key[1:])), link=link)
            for (nodes, per_node), recs in sorted({**single, **by_link.get(link, {})}.items()):
                fr = [x.metrics.get("comm_fraction") for x in recs if x.metrics.get("comm_fraction") is not None]
                lad.points.append(Point(nodes, per_node, mean([x.metrics["throughput"] for x in recs]),
                                        [x.run_id for x in recs], mean(fr) if fr else None, link if nodes > 1 else None,
                                        lad.test.get("system")))
            out.append(lad)
    return sorted(out, key=lambda lad: (lad.workload, str(lad.test), str(lad.link)))


def efficiency_rows(lad: Ladder) -> list[dict[str, Any]]:
    """Per point: throughput, speed-up and efficiency against 1x1, split into intra- and inter-node."""
    base = lad.point(1, 1)
    rows = []
    for p in sorted(lad.points, key=lambda p: (p.devices, p.nodes)):
        row: dict[str, Any] = {"layout": p.layout, "devices": p.devices, "nodes": p.nodes,
                               "devices_per_node": p.devices_per_node, "throughput": p.throughput,
                               "comm_fraction": p.comm_fraction, "runs": len(p.run_ids), "run_ids": p.run_ids,
                               "speedup": None, "efficiency": None, "intra_node_efficiency": None,
                               "inter_node_efficiency": None}
        if base is not None:
            row["speedup"] = speedup(p.throughput, base.throughput)
            row["efficiency"] = scaling_efficiency(p.throughput, base.throughput, p.devices)
            node = lad.point(1, p.devices_per_node)
            if node is not None:
                row["intra_node_efficiency"] = scaling_efficiency(node.throughput, base.throughput, p.devices_per_node)
                row["inter_node_efficiency"] = scaling_efficiency(p.throughput, node.throughput, p.nodes)
        rows.append(row)
    return rows


def layout_rows(points: Iterable[Point]) -> list[dict[str, Any]]:
    """At each device count, every layout A against every layout B spread over more nodes: (A - B) / B.

    The points may come from several systems (seed 001 Table 5 sets one 8-GPU server against a
    cluster of two 4-GPU servers); each row names the systems where known.
    """
    by_devices: dict[int, list[Point]] = defaultdict(list)
    seen = set()
    for p in points:
        if (p.system, p.layout, p.link) not in seen:
            seen.add((p.system, p.layout, p.link))
            by_devices[p.devices].append(p)
    rows = []
    for n, pts in sorted(by_devices.items()):
        for a in sorted(pts, key=lambda p: p.nodes):
            for b in sorted((p for p in pts if p.nodes > a.nodes), key=lambda p: (p.nodes, str(p.link))):
                rows.append({"devices": n, "scale_up": a.layout, "scale_out": b.layout, "scale_up_system": a.system,
                             "scale_out_system": b.system, "scale_up_throughput": a.throughput,
                             "scale_out_throughput": b.throughput, "link": b.link,
                             "pct_difference": pct_difference(a.throughput, b.throughput)})
    return rows


def analyse(records: Iterable[Any]) -> dict[str, list[dict[str, Any]]]:
    """Every ladder with its efficiency rows, and the layout comparisons per test, JSON-ready."""
    lads = ladders(records)
    groups: dict[tuple, list[Ladder]] = defaultdict(list)
    for lad in lads:
        groups[(lad.workload, *(str(v) for k, v in lad.test.items() if k != "system"))].append(lad)
    comparisons = []
    for members in groups.values():
        rows = layout_rows(p for lad in members for p in lad.points)
        if rows:
            test = {k: v for k, v in members[0].test.items() if k != "system"}
            comparisons.append({"label": describe(members[0].workload, test), "workload": members[0].workload,
                                "test": test, "rows": rows})
    return {
        "ladders": [{"label": lad.label, "workload": lad.workload, "test": lad.test, "link": lad.link,
                     "efficiency": efficiency_rows(lad)} for lad in lads],
        "comparisons": comparisons,
    }


def describe(workload: str, test: dict[str, Any]) -> str:
    """'resnet50 on C4140-K, batch 128/device, 224px, fp32, cpu, 1 thread(s)/rank', leaving out unknowns."""
    parts = [workload + (f" on {test['system']}" if test.get("system") else "")]
    if test.get("batch_size"):
        parts.append(f"batch {test['batch_size']}/device")
    if test.get("image_size"):
        parts.append(f"{test['image_size']}px")
    if test.get("seq_len"):
        parts.append(f"seq {test['seq_len']}")
    if test.get("tokens_per_batch"):
        parts.append(f"{test['tokens_per_batch']} tokens/batch")
    if test.get("model_config"):
        parts.append(str(test["model_config"]))
    if test.get("max_table_rows"):
        parts.append(f"tables <= {test['max_table_rows']:,} rows")
    if test.get("parallel") and test["parallel"] != "ddp":
        parts.append(str(test["parallel"]))
    if test.get("target_top1") is not None:
        parts.append(f"to top-1 {test['target_top1']:g}")
    if test.get("target") is not None:
        parts.append(f"to {test['target']:g}")
    parts.extend(str(test[k]) for k in ("precision", "device") if test.get(k))
    if test.get("threads_per_rank"):
        parts.append(f"{test['threads_per_rank']} thread(s)/rank")
    return ", ".join(parts)


def _norm(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v
