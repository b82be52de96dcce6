"""One reader per acceptance check: a check's record in, its figures out (pure). docs/METRICS.md
("Acceptance") says which figure each check reads and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale import stats
from dlscale.accept.figures.figure import (Figure, Subject, device_of, device_subject, geometric_mean_ci95,
                                           rank_subject, rates, row_ci, scaled)
from dlscale.record import RunRecord

ENERGY_KEYS = ("energy_j", "energy_per_unit_j", "units_per_joule", "avg_power_w", "price_per_hour",
               "cost_per_million_units")
PLATEAU = 0.9  # collectives: the sizes around the best one whose busbw is within 10% of it have levelled off
MODES = ("out-of-place", "in-place")  # a collectives row's cells


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
                          subject, [r / 1e9 for r in rates(row["bytes"], t)], ci95=scaled(row_ci(row["bytes"], t), 1e-9),
                          model=None if host else _device_model(rec, row["where"]), peers=not host,
                          context={"op": row["op"], "device": row["where"], **node_context(rec, row)}))
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
                          ci95=scaled(row_ci(row["flops"], t), 1e-12), model=_device_model(rec, where) if gpu else None,
                          peers=gpu, context={"precision": prec, "device": where,
                                              "shape": f"{row['m']}x{row['n']}x{row['k']}", **node_context(rec, row)}))
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
                          [r / 1e9 for r in rates(row["bytes"], t)], ci95=scaled(row_ci(row["bytes"], t), 1e-9),
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
        cells = {r["size"]: [r[m]["busbw"] for m in MODES if r.get(m)] for r in mine}  # every size: a row's sizes
        out.append(Figure(check, f"{op} busbw", value, "GB/s", rec.run_id, None, vals, ci95=ci,
                          context={"op": op, "world_size": rec.config.get("world_size"), "nodes": rec.config.get("nodes"),
                                   "link_bandwidth": rec.config.get("link_bandwidth"), "max_size": top,
                                   "plateau": span, "cells": cells}))
    return out


def links_figures(rec: RunRecord, check: str) -> list[Figure]:
    """Each node's link between nodes, as ``dlscale micro links`` records it: ``raw["links"]`` has one
    entry per node, ``{src_node: the node, dst_node: its fastest partner, busbw_gbps, samples}``
    (micro/links.py: a node's fastest pair runs at its own link's rate); the samples are the pair's
    repeated busbw (GB/s). Every node's link of the run is a peer of the others. Real nodes are named
    by their host (``config.node_hosts``: "gpu07's link", the same link in every acceptance whatever
    the node's rank in the job), emulated ones by their index ("node 2's link")."""
    out = []
    hosts = rec.config.get("node_hosts") or {}
    for link in (rec.raw or {}).get("links") or []:
        k, partner = int(link["src_node"]), int(link["dst_node"])
        name = hosts.get(str(k)) or f"node {k}"
        samples = [float(x) for x in link.get("samples") or []]
        ci = stats.mean_ci95(samples) if len(samples) >= 2 else None
        out.append(Figure(check, "busbw", float(link["busbw_gbps"]), "GB/s", rec.run_id,
                          Subject("link", f"{name}'s link", f"link {name}", (k,)), samples,
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
            samples, ci = rates(batch, steps[0]), row_ci(batch, steps[0])
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
    the rungs' throughputs carry the noise). Every node's ladder of one acceptance (several hosts) is a
    peer of the others at the same layout on the same device model: their spread is between their values."""
    out = []
    device = str(rec.config.get("device") or "")
    for k, v in (rec.metrics or {}).items():
        if k.startswith("efficiency_") and isinstance(v, (int, float)) and k != "efficiency_1x1":
            layout = k.removeprefix("efficiency_")
            out.append(Figure(check, f"efficiency {layout}", float(v), "fraction", rec.run_id,
                              model=_device_model(rec, "cuda:0" if device.startswith("cuda") else device),
                              peers=True, peer_noise="values", peer_scope="acceptance",
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


# -- what rides beside a figure -----------------------------------------------------------------------
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


def node_context(rec: RunRecord, row: dict[str, Any]) -> dict[str, Any]:
    """A case run on every GPU at once: how many, and the node's power over all such windows (micro/node.py)."""
    if not row.get("at_once"):
        return {}
    power = (rec.metrics or {}).get("node_avg_power_w")
    return {"at_once": row["at_once"], **({"node_avg_power_w": power} if isinstance(power, (int, float)) else {})}


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
