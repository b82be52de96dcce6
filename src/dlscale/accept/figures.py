"""From an acceptance's records to the figures its checks judge (pure: records in, figures out).

A ``Figure`` is one measured rate (higher is better) of one check, with the raw repeated
measurements of the same quantity it came from (``samples``, e.g. the rate of every measured
step, of every timed GEMM call), its 95% confidence interval, and what it is about: the system,
or one device, rank, node or link (``Subject``). Figures of one check, name and device model in
one run are peers (``peer_group``): the one slow GPU shows against their median. ``key`` names a
figure across acceptances, so a baseline's figure is found by it. docs/METRICS.md ("Acceptance")
says which figure each check reads and why.

An acceptance of several hosts (``dlscale accept --executor slurm --nodes N``) runs every per-node
check on each: those figures' subjects carry their host ("gpu07 GPU 3"; a figure about the whole
node is about "gpu07"), and the ranks of a run across the hosts are named the same way, so a slow
GPU's verdicts in training, GEMM and health meet in one explanation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dlscale import stats
from dlscale.record import RunRecord

END_TO_END = ("train", "scale", "inference")  # checks whose figures are results: energy and cost ride beside
ENERGY_KEYS = ("energy_j", "energy_per_unit_j", "units_per_joule", "avg_power_w", "price_per_hour",
               "cost_per_million_units")
PLATEAU = 0.9  # collectives: the sizes around the best one whose busbw is within 10% of it have levelled off
MODES = ("out-of-place", "in-place")  # a collectives row's cells
ACROSS_NODES = ("collectives_nodes", "links", "train_alone", "train")  # one run spans the nodes; the rest are per node


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

    @property
    def key(self) -> str:
        return f"{self.check}|{self.name}|{self.subject.key if self.subject else ''}"

    @property
    def peer_group(self) -> tuple[str, str, str, str | None] | None:
        return (self.run_id, self.check, self.name, self.model) if self.peers else None

    @property
    def where(self) -> str:
        """'bf16 best rate on GPU 3' / 'throughput'."""
        return f"{self.name} on {self.subject.label}" if self.subject else self.name


def check_of(rec: RunRecord, rungs: set[str]) -> str | None:
    """Which check a record belongs to (None: not a check's record, e.g. the acceptance itself)."""
    if rec.kind in ("health", "inventory"):
        return rec.kind
    if rec.kind == "micro":
        if rec.workload == "collectives":
            cfg = rec.config or {}
            return "collectives_nodes" if (cfg.get("nodes") or 1) > 1 or cfg.get("emulated_nodes") else "collectives"
        return rec.workload if rec.workload in ("memory", "gemm", "p2p", "links", "burnin") else None
    if rec.kind == "train":
        if rec.run_id in rungs:
            return "scale"
        return "train_alone" if (rec.config or {}).get("parallel") == "none" else "train"
    return {"scale": "scale", "inference": "inference", "serving": "serving"}.get(rec.kind)


def scale_rungs(records: Iterable[RunRecord]) -> set[str]:
    """The run ids of every scale ladder's rungs (listed in its summary record)."""
    return {i for r in records if r.kind == "scale" for i in (r.raw or {}).get("run_ids") or []}


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


def figures(records: Sequence[RunRecord]) -> list[Figure]:
    """Every ok record's sound figures, in record order; on several hosts, each per-node figure names its host."""
    return read(records)[0]


def read(records: Sequence[RunRecord]) -> tuple[list[Figure], list[Unreadable]]:
    """Every ok record's figures (``figures``) and what could not be read from them (``Unreadable``):
    judging fails closed on those (docs/METRICS.md, "Acceptance: ERROR"). A sample that is not a
    finite number is dropped from its figure's samples."""
    rungs = scale_rungs(records)
    hosts = node_hosts(records)
    out: list[Figure] = []
    bad: list[Unreadable] = []
    for rec in records:
        check = check_of(rec, rungs)
        if rec.status != "ok" or check not in READERS:
            continue
        try:
            got = READERS[check](rec, check)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as e:
            bad.append(Unreadable(check, rec.run_id, f"its record cannot be read ({type(e).__name__}: {e})"))
            continue
        for f in got:
            f = on_host(f, hosts[rec.run_id]) if rec.run_id in hosts else f
            if not sound(f.value):
                bad.append(Unreadable(check, rec.run_id, f"measured {f.value!r}: not a positive finite rate",
                                      f.subject.label if f.subject else None, f.name))
                continue
            f.samples = [x for x in f.samples if isinstance(x, (int, float)) and math.isfinite(x)]
            out.append(f)
        bad += unmeasured_gpus(rec, check, [f for f in out if f.run_id == rec.run_id])
    return out, bad


def unmeasured_gpus(rec: RunRecord, check: str, figs: Sequence[Figure]) -> list[Unreadable]:
    """The GPUs of the record's node with no figure of a name the other GPUs have, for the checks that run
    on every GPU (GEMM and memory): a GPU that vanished mid-check, or rows a record lost."""
    if check not in ("gemm", "memory"):
        return []
    n = ((rec.system or {}).get("accelerators") or {}).get("count") or 0
    out = []
    for name in dict.fromkeys(f.name for f in figs if f.subject and f.subject.kind == "device"):
        have = {f.subject.key.rsplit(" ", 1)[-1] for f in figs if f.name == name and f.subject}
        if not any(d.startswith("cuda:") for d in have):
            continue
        for i in range(int(n)):
            if f"cuda:{i}" not in have:
                out.append(Unreadable(check, rec.run_id, f"no {name} figure for GPU {i} ({len(have)} of {n} GPUs "
                                      "measured)", f"GPU {i}", name))
    return out


def node_hosts(records: Sequence[RunRecord]) -> dict[str, str]:
    """Run id -> host of every per-node check's run (not one of ``ACROSS_NODES``), where those runs
    come from more than one host (an acceptance of several nodes: every node runs them); else empty."""
    rungs = scale_rungs(records)
    hosts = {r.run_id: str((r.system or {}).get("hostname") or "?") for r in records
             if r.kind != "accept" and check_of(r, rungs) not in ACROSS_NODES}
    return hosts if len(set(hosts.values())) > 1 else {}


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


# -- the readers, one per check -----------------------------------------------------------------------
def rates(work: float, times: Iterable[float]) -> list[float]:
    """``work / t`` for every positive time."""
    return [work / t for t in times if t and t > 0]


def _row_ci(work: float, times: Sequence[float]) -> tuple[float, float] | None:
    ci = stats.throughput_ci95_from_steps(work, times) if len(times) >= 2 else None
    return tuple(ci) if ci else None  # type: ignore[return-value]


def memory_figures(rec: RunRecord, check: str) -> list[Figure]:
    """Host STREAM ops (the system's), each GPU's device copy and pinned host copies (its peers')."""
    out = []
    times = (rec.raw or {}).get("times_s") or []
    for i, row in enumerate((rec.raw or {}).get("rows") or []):
        t = times[i] if i < len(times) else []
        host = row["where"] == "host memory"
        if not host and row["op"] not in ("d2d", "h2d_pinned", "d2h_pinned"):
            continue  # pageable copies depend on the host's allocator more than on the device
        subject = None if host else device_subject(row["where"])
        out.append(Figure(check, f"{row['op']} (host memory)" if host else row["op"], row["gbps"], "GB/s", rec.run_id,
                          subject, [r / 1e9 for r in rates(row["bytes"], t)], ci95=_scaled(_row_ci(row["bytes"], t), 1e-9),
                          model=None if host else _device_model(rec, row["where"]), peers=not host,
                          context={"op": row["op"], "device": row["where"]}))
    return out


def gemm_figures(rec: RunRecord, check: str) -> list[Figure]:
    """Per device and precision the best case's rate (its timed calls are the samples)."""
    times = (rec.raw or {}).get("times_s") or []
    best: dict[tuple[str, str], int] = {}
    rows = (rec.raw or {}).get("rows") or []
    for i, row in enumerate(rows):
        k = (str(row.get("device") or rec.config.get("device") or "cpu"), row["precision"])
        if k not in best or row["tflops"] > rows[best[k]]["tflops"]:
            best[k] = i
    out = []
    for (dev, prec), i in best.items():
        row, t = rows[i], times[i] if i < len(times) else []
        gpu = dev.startswith("cuda")
        where = dev if ":" in dev or not gpu else "cuda:0"
        out.append(Figure(check, f"{prec} best rate", row["tflops"], "TFLOP/s", rec.run_id,
                          device_subject(where) if gpu else None, [r / 1e12 for r in rates(row["flops"], t)],
                          ci95=_scaled(_row_ci(row["flops"], t), 1e-12), model=_device_model(rec, where) if gpu else None,
                          peers=gpu, context={"precision": prec, "device": where,
                                              "shape": f"{row['m']}x{row['n']}x{row['k']}"}))
    return out


def p2p_figures(rec: RunRecord, check: str) -> list[Figure]:
    """Each ordered GPU pair's unidirectional copy with peer access on; pairs on the same path are peers."""
    times = (rec.raw or {}).get("times_s") or []
    out = []
    for i, row in enumerate((rec.raw or {}).get("rows") or []):
        if row["test"] != "unidirectional" or row["peer_access"] != "enabled" or row["src"] == row["dst"]:
            continue
        t = times[i] if i < len(times) else []
        src, dst = f"cuda:{row['src']}", f"cuda:{row['dst']}"
        subject = Subject("pair", f"GPU {row['src']}->{row['dst']}", f"{src}->{dst}", (), (src, dst))
        out.append(Figure(check, "unidirectional", row["gbps"], "GB/s", rec.run_id, subject,
                          [r / 1e9 for r in rates(row["bytes"], t)], ci95=_scaled(_row_ci(row["bytes"], t), 1e-9),
                          model=f"{_device_model(rec, src)} {row.get('path', 'p2p')}", peers=True,
                          context={"path": row.get("path"), "src": row["src"], "dst": row["dst"]}))
    return out


def plateau(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One collective's rows on its bandwidth plateau: the consecutive sizes around the best size (the
    geometric mean busbw of its modes) that stay within ``PLATEAU`` of it; latency-bound small sizes and
    a dip past the plateau fall outside."""
    cells: dict[int, list[float]] = {}
    for r in rows:
        cells.setdefault(r["size"], []).extend(r[m]["busbw"] for m in MODES if r.get(m))
    bw = {s: geometric_mean_ci95(v)[0] for s, v in cells.items() if any(x > 0 for x in v)}
    sizes = sorted(bw)
    if not sizes:
        return []
    lo = hi = best = max(range(len(sizes)), key=lambda k: bw[sizes[k]])
    while lo > 0 and bw[sizes[lo - 1]] >= PLATEAU * bw[sizes[best]]:
        lo -= 1
    while hi + 1 < len(sizes) and bw[sizes[hi + 1]] >= PLATEAU * bw[sizes[best]]:
        hi += 1
    return [r for r in rows if sizes[lo] <= r["size"] <= sizes[hi]]


def collectives_figures(rec: RunRecord, check: str) -> list[Figure]:
    """Per collective the geometric mean busbw of its (size, mode) cells on its ``plateau``, each a sample;
    ``levelled`` is False where the plateau is the largest size alone (larger sizes may go faster)."""
    rows = (rec.raw or {}).get("rows") or []
    out = []
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        flat = plateau(mine)
        vals = [r[m]["busbw"] for r in flat for m in MODES if r.get(m)]
        if not vals:
            continue
        value, ci = geometric_mean_ci95(vals)
        sizes, top = sorted({r["size"] for r in flat}), max(r["size"] for r in mine)
        span = {"from_bytes": sizes[0], "to_bytes": sizes[-1], "levelled": len(sizes) > 1 or sizes[-1] < top}
        out.append(Figure(check, f"{op} busbw", value, "GB/s", rec.run_id, None, vals, ci95=ci,
                          context={"op": op, "world_size": rec.config.get("world_size"), "nodes": rec.config.get("nodes"),
                                   "link_bandwidth": rec.config.get("link_bandwidth"), "max_size": top,
                                   "plateau": span}))
    return out


def links_figures(rec: RunRecord, check: str) -> list[Figure]:
    """Each node's link between nodes, as ``dlscale micro links`` records it: ``raw["links"]`` has one
    entry per node, ``{src_node: the node, dst_node: its fastest partner, busbw_gbps, samples}``
    (micro/links.py: a node's fastest pair runs at its own link's rate); the samples are the pair's
    repeated busbw (GB/s). Every node's link of the run is a peer of the others."""
    out = []
    for link in (rec.raw or {}).get("links") or []:
        k, partner = int(link["src_node"]), int(link["dst_node"])
        samples = [float(x) for x in link.get("samples") or []]
        ci = stats.mean_ci95(samples) if len(samples) >= 2 else None
        out.append(Figure(check, "busbw", float(link["busbw_gbps"]), "GB/s", rec.run_id,
                          Subject("link", f"node {k}'s link", f"link node {k}", (k,)), samples,
                          ci95=tuple(ci) if ci else None, model="link", peers=True,
                          context={"algbw_gbps": link.get("algbw_gbps"), "pair": f"{k}-{partner}",
                                   "shaped_gbps": link.get("shaped_gbps")}))
    return out


def alone_figures(rec: RunRecord, check: str) -> list[Figure]:
    """The short test on every device alone, all at once: each device's throughput, its steps the
    samples. A GPU is one rank's; the ranks on one node's CPU share it, so they are one device
    whose rate is the sum of theirs, step by step (docs/METRICS.md: two ranks on one CPU are not
    two devices, and a scheduler's preference between them is not a slow part). Nodes' CPUs differ
    by their host's scheduling for a whole run, as runs do: their peers' noise is between their
    values (``peer_noise``), not in their steps."""
    m, raw = rec.metrics, rec.raw or {}
    per_rank, idents = m.get("rank_throughputs") or [], raw.get("rank_devices") or []
    times = raw.get("rank_step_times_s") or []
    batch = (m.get("samples_per_step") or 0) / max(1, m.get("world_size") or 1)
    several = len({(i.get("host"), i.get("node")) for i in idents}) > 1
    by_host = len({i.get("host") for i in idents}) > 1
    unit = (rec.units or {}).get("rank_throughputs", "samples/s")
    ranks: dict[tuple[str, int, str], list[int]] = {}
    for k in range(len(per_rank)):
        ranks.setdefault(device_of(_ident(rec, idents, k)), []).append(k)
    out = []
    for mine in ranks.values():
        ident = _ident(rec, idents, mine[0])
        steps = [[t for rep in (times[k] if k < len(times) else []) for t in rep] for k in mine]
        if len(mine) == 1:
            samples, ci = rates(batch, steps[0]), _row_ci(batch, steps[0])
        else:
            n = min(len(s) for s in steps)
            samples = [sum(batch / s[i] for s in steps) for i in range(n) if all(s[i] > 0 for s in steps)]
            got = stats.mean_ci95(samples) if len(samples) >= 2 else None
            ci = tuple(got) if got else None
        cpu = not str(ident.get("device") or "").startswith("cuda")
        out.append(Figure(check, "throughput", sum(per_rank[k] for k in mine), unit, rec.run_id,
                          rank_subject(ident, several, by_host), samples, ci95=ci, model=ident.get("device_name"),
                          peers=True, peer_noise="values" if cpu else "samples",
                          context={**_match(rec, world_size=1), "ranks": len(mine)}))
    return out


def _ident(rec: RunRecord, idents: list[dict[str, Any]], k: int) -> dict[str, Any]:
    return idents[k] if k < len(idents) else {"rank": k, "device": rec.config.get("device")}


def throughput_figures(rec: RunRecord, check: str) -> list[Figure]:
    """The short test's throughput on all its devices (a scale rung: named by its layout)."""
    m, c = rec.metrics, rec.config
    steps = [t for rep in (rec.raw or {}).get("step_times_s") or [] for t in rep]
    per_step = m.get("samples_per_step") or 0
    ci = m.get("throughput_ci95")
    name = "throughput" if check == "train" else f"throughput {c.get('nodes') or 1}x{c.get('devices_per_node') or 1}"
    return [Figure(check, name, m["throughput"], (rec.units or {}).get("throughput", "samples/s"), rec.run_id, None,
                   rates(per_step, steps), ci95=tuple(ci) if isinstance(ci, list) and None not in ci else None,
                   context={**_match(rec, world_size=m.get("world_size") or c.get("world_size") or 1),
                            **energy_context(rec)})]


def scale_figures(rec: RunRecord, check: str) -> list[Figure]:
    """A ladder's summary: scaling efficiency at each layout of several devices (no samples of its own:
    the rungs' throughputs carry the noise)."""
    out = []
    for k, v in (rec.metrics or {}).items():
        if k.startswith("efficiency_") and isinstance(v, (int, float)) and k != "efficiency_1x1":
            layout = k.removeprefix("efficiency_")
            out.append(Figure(check, f"efficiency {layout}", float(v), "fraction", rec.run_id,
                              context={"layout": layout, "model": rec.workload,
                                       "batch_size": rec.config.get("batch_size")}))
    return out


def rung_or_summary(rec: RunRecord, check: str) -> list[Figure]:
    return scale_figures(rec, check) if rec.kind == "scale" else throughput_figures(rec, check)


def inference_figures(rec: RunRecord, check: str) -> list[Figure]:
    """LoadGen offline's samples/s (MLPerf's offline figure) with what is its own: its samples are the
    scenario's repeated LoadGen runs (``scenario_metric_runs``), its energy the scenario's (over
    LoadGen's test, samples loaded) and its cost per 10^6 units at its own rate. A record without a
    LoadGen offline figure gives the batch sweep's throughput, its timed batches and its energy."""
    m, raw = rec.metrics, rec.raw or {}
    if m.get("scenario") == "offline":
        value = m.get("scenario_metric")
        if not isinstance(value, (int, float)):
            return []
        runs = [float(v) for v in m.get("scenario_metric_runs") or [] if isinstance(v, (int, float)) and v > 0]
        ci = stats.mean_ci95(runs) if len(runs) >= 2 else None
        return [Figure(check, "LoadGen offline", float(value), (rec.units or {}).get("scenario_metric", "samples/s"),
                       rec.run_id, None, runs, ci95=tuple(ci) if ci else None,
                       context={**_match(rec, world_size=1), "batch_size": m.get("max_batch"), "scenario": "offline",
                                **scenario_energy_context(rec, float(value))})]
    value = m.get("throughput")
    if not isinstance(value, (int, float)):
        return []
    sizes, units = m.get("batch_sizes") or [], m.get("units_by_batch") or []
    b = max(sizes) if sizes else None
    times = (raw.get("batch_times") or {}).get(str(b)) or []
    work = units[sizes.index(b)] if b in sizes and len(units) == len(sizes) else (b or 0)
    return [Figure(check, "inference throughput", float(value), (rec.units or {}).get("throughput", "samples/s"),
                   rec.run_id, None, rates(work, times), context={**_match(rec, world_size=1), **energy_context(rec)})]


def serving_figures(rec: RunRecord, check: str) -> list[Figure]:
    """Goodput (requests/s meeting every SLO) at the load the run found or was given; its samples are the
    goodput of five equal slices of that point's requests (``serve.figures.goodput_slices``)."""
    m = rec.metrics
    if not isinstance(m.get("goodput"), (int, float)):
        return []
    return [Figure(check, "goodput at SLO", float(m["goodput"]), "requests/s", rec.run_id, None,
                   list((rec.raw or {}).get("goodput_slices") or []),
                   context={"model": rec.workload, "url": (rec.config or {}).get("url"), **energy_context(rec)})]


READERS = {"serving": serving_figures, "memory": memory_figures, "gemm": gemm_figures, "p2p": p2p_figures, "collectives": collectives_figures,
           "collectives_nodes": collectives_figures, "links": links_figures, "train_alone": alone_figures,
           "train": throughput_figures, "scale": rung_or_summary, "inference": inference_figures}


# -- helpers ----------------------------------------------------------------------------------------
def energy_context(rec: RunRecord) -> dict[str, Any]:
    """Energy and cost of a result where the record carries them (docs/METRICS.md's names and units)."""
    m, u = rec.metrics or {}, rec.units or {}
    got = {k: {"value": m[k], "unit": u.get(k, "")} for k in ENERGY_KEYS if isinstance(m.get(k), (int, float))}
    return {"energy": got} if got else {}


def scenario_energy_context(rec: RunRecord, rate: float) -> dict[str, Any]:
    """A LoadGen scenario's own energy (its ``scenario_*`` figures, under the plain names) and its cost
    per 10^6 units at the scenario's ``rate``: the record's cost at the sweep's throughput x
    throughput / rate (the same price and devices, cost per unit inversely as the rate)."""
    m, u = rec.metrics or {}, rec.units or {}
    got = {k: {"value": m[f"scenario_{k}"], "unit": u.get(f"scenario_{k}", "")} for k in ENERGY_KEYS
           if isinstance(m.get(f"scenario_{k}"), (int, float))}
    if isinstance(m.get("price_per_hour"), (int, float)):
        got["price_per_hour"] = {"value": m["price_per_hour"], "unit": u.get("price_per_hour", "")}
    cost, thr = m.get("cost_per_million_units"), m.get("throughput")
    if isinstance(cost, (int, float)) and isinstance(thr, (int, float)) and rate > 0:
        got["cost_per_million_units"] = {"value": cost * thr / rate, "unit": u.get("cost_per_million_units", "")}
    return {"energy": got} if got else {}


def _match(rec: RunRecord, world_size: int) -> dict[str, Any]:
    """What a reference figure must share with this one: model, devices, per-device batch, precision (and,
    for a healthy figure, the memory format and image size)."""
    return {"model": rec.workload, "world_size": world_size, "batch_size": rec.config.get("batch_size"),
            "precision": rec.config.get("precision"), "channels_last": rec.config.get("channels_last"),
            "image_size": rec.config.get("image_size")}


def _device_model(rec: RunRecord, device: str) -> str | None:
    """The model name of ``device`` ("cuda:3") from the record's inventory, else its config's device name."""
    if device.startswith("cuda:"):
        idx = int(device.split(":")[1])
        for d in ((rec.system or {}).get("accelerators") or {}).get("devices") or []:
            if d.get("index") == idx and d.get("name"):
                return d["name"]
    return rec.config.get("device_name")


def geometric_mean_ci95(xs: Sequence[float]) -> tuple[float, tuple[float, float] | None]:
    """The geometric mean of positive values and its 95% interval (the t-interval of the logs, mapped back)."""
    import math

    logs = [math.log(x) for x in xs if x > 0]
    ci = stats.mean_ci95(logs)
    return math.exp(stats.mean(logs)), (math.exp(ci[0]), math.exp(ci[1])) if ci else None


def _scaled(ci: tuple[float, float] | None, factor: float) -> tuple[float, float] | None:
    return (ci[0] * factor, ci[1] * factor) if ci else None
