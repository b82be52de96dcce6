"""The scaling ladder: the short test at every layout, then one ``scale`` record of its analysis.

``plan`` chooses the layouts (1x1, the given ones, 1xN for device counts no layout covers);
``run_ladder`` validates every rung's config and layout before the first run, runs each through
the one job module (``distributed.job``), records failed rungs as failed and goes on, and ends
with a ``scale`` record (through the harness's ``execute``) holding the efficiencies and the
scale-up vs scale-out table (``analysis.scaling``), every rung's run id in ``raw``.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from dlscale.errors import RunFailure, UsageError
from dlscale.layout import Layout
from dlscale.log import info, warn
from dlscale.system import usable_cpus


def parse_devices(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--devices {text!r}: give device counts like 1,2,4,8") from None
    if not vals or any(v < 1 for v in vals):
        raise UsageError(f"--devices {text!r}: give device counts >= 1 like 1,2,4,8")
    return sorted(set(vals))


def parse_layouts(text: str | None) -> list[tuple[int, int]]:
    out = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", part)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise UsageError(f"--layouts: {part!r} is not NODESxDEVICES_PER_NODE (e.g. 2x4)")
        out.append((int(m.group(1)), int(m.group(2))))
    return out


def plan(devices: list[int], layouts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The layouts to run: 1x1 (the baseline), the given layouts, and 1xN for a count no layout covers."""
    covered = {n * g for n, g in layouts}
    todo = {(1, 1), *layouts, *((1, d) for d in devices if d not in covered)}
    return sorted(todo, key=lambda ng: (ng[0] * ng[1], ng[0]))


def rung_layouts(todo: list[tuple[int, int]], *, emulate_nodes: int | None, link_bandwidth: str | None,
                 link_latency: str | None, backend: str | None, timeout_s: float,
                 threads_per_rank: int | None, node_link_bandwidth: Any = (), node_cpu_quota: Any = ()) -> list[Layout]:
    """One validated Layout per rung; multi-node rungs on emulated nodes. Same threads on every rung.
    A node set apart (its own link rate or CPU quota) is set apart on every rung that has that node."""
    most_nodes = max(n for n, _ in todo)
    if most_nodes > 1 and not emulate_nodes:
        raise UsageError(f"layout with {most_nodes} nodes: dlscale scale runs multi-node layouts on emulated nodes "
                         f"here (--emulate-nodes {most_nodes}); on a real cluster run `dlscale train --nnodes ...` on "
                         "each node with one --tag and analyse with `dlscale scale --from-store --tag T`")
    if emulate_nodes is not None and emulate_nodes < most_nodes:
        raise UsageError(f"--emulate-nodes {emulate_nodes} is fewer than the {most_nodes} nodes of the largest layout")
    if (link_bandwidth or link_latency) and not emulate_nodes:
        raise UsageError("--link-bandwidth/--link-latency shape emulated links; add --emulate-nodes K")
    apart = Layout(emulate_nodes=emulate_nodes, node_link_bandwidth=node_link_bandwidth,
                   node_cpu_quota=node_cpu_quota) if node_link_bandwidth or node_cpu_quota else Layout()
    beyond = sorted({k for k, _ in (*apart.node_link_bandwidth, *apart.node_cpu_quota) if k >= most_nodes})
    if beyond:
        raise UsageError(f"--node-link-bandwidth/--node-cpu-quota name node {beyond[0]}, but the largest layout "
                         f"has {most_nodes} node(s)")
    threads = threads_per_rank or max(1, usable_cpus() // max(n * g for n, g in todo))
    return [Layout(nproc_per_node=g, backend=backend, emulate_nodes=n if n > 1 else None,
                   link_bandwidth=link_bandwidth if n > 1 else None, link_latency=link_latency if n > 1 else None,
                   timeout_s=timeout_s, threads_per_rank=threads, force=True,
                   node_link_bandwidth=tuple(p for p in apart.node_link_bandwidth if p[0] < n) if n > 1 else (),
                   node_cpu_quota=tuple(p for p in apart.node_cpu_quota if p[0] < n) if n > 1 else ())
            for n, g in todo]


def run_ladder(model: str, devices: list[int], layouts: list[tuple[int, int]], options: dict[str, Any], *,
               emulate_nodes: int | None = None, link_bandwidth: str | None = None, link_latency: str | None = None,
               backend: str | None = None, timeout_s: float = 300.0, threads_per_rank: int | None = None,
               db: str | None = None, price: Any = None, node_link_bandwidth: Any = (),
               node_cpu_quota: Any = ()) -> list[Any]:
    """Every rung's record (failed ones too) and the summary record last (see the module doc)."""
    from dlscale.config import TrainConfig
    from dlscale.distributed.job import run_job
    from dlscale.store import Store

    todo = plan(devices, layouts)
    rungs = rung_layouts(todo, emulate_nodes=emulate_nodes, link_bandwidth=link_bandwidth,
                         link_latency=link_latency, backend=backend, timeout_s=timeout_s,
                         threads_per_rank=threads_per_rank, node_link_bandwidth=node_link_bandwidth,
                         node_cpu_quota=node_cpu_quota)
    tag = options.pop("tag", None) or f"scale-{model}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}"
    cfg = TrainConfig(model=model, tag=tag, **options)
    Store.open(db).close()  # an unwritable database is a usage error before any run
    recs = []
    for (n, g), layout in zip(todo, rungs):
        info(f"dlscale scale {model}: layout {n}x{g} ({n * g} device(s))"
             + (f" on {n} emulated nodes" if layout.emulate_nodes else ""))
        try:
            recs.append(run_job("train", rung_config(cfg, recs, n * g), layout, db, price))
        except RunFailure as e:
            warn(f"layout {n}x{g}: {e}")
            if e.run_id:
                with Store.open(db) as s:
                    recs.append(s.get(e.run_id))
    ok = [r for r in recs if r is not None and r.status == "ok"]
    if ok:
        recs.append(summary_record(model, tag, todo, rungs[-1], ok, db))
    info(f"runs tagged {tag!r}; analyse again with: dlscale scale --from-store --tag {tag}")
    return recs


def rung_config(cfg: Any, done: list[Any], devices: int) -> dict[str, Any]:
    """A rung's config: a rung of several devices holds its data-parallel efficiency to the ladder's 1-device
    rung where that one is recorded ok (and no --dp-reference was given), else the rung's own reference."""
    first = done[0] if done else None
    if devices > 1 and cfg.dp_reference is None and first is not None and first.status == "ok" \
            and (first.metrics or {}).get("world_size") == 1:
        return {**cfg.to_dict(), "dp_reference": first.run_id}
    return cfg.to_dict()


def summary_record(model: str, tag: str, todo: list[tuple[int, int]], layout: Layout, recs: list[Any],
                   db: str | None) -> Any:
    """A ``scale`` record of the ladder: its analysis as metrics (per layout), the rungs' run ids."""
    from dlscale.harness.runner import Outcome, execute
    from dlscale.store import Store

    lc = layout.config()
    links = {k: lc[k] for k in ("link_bandwidth", "link_latency", "node_link_bandwidth", "node_cpu_quota")}
    config = {"layouts": [f"{n}x{g}" for n, g in todo], "emulated_nodes": bool(layout.emulate_nodes), **links,
              "threads_per_rank": layout.threads_per_rank, **{k: recs[0].config.get(k) for k in (
                  "batch_size", "image_size", "seq_len", "tokens_per_batch", "model_config", "max_table_rows",
                  "parallel", "precision", "device", "device_name", "backend", "family", "sample_unit")}}
    with Store.open(db) as store:
        return execute(kind="scale", workload=model, config=config, tag=tag, store=store,
                       body=lambda _rec: Outcome(**ladder_figures(recs)))


def ladder_figures(recs: list[Any]) -> dict[str, Any]:
    """The analysis of a ladder as flat metrics (per layout and link) with units, and the raw tables."""
    from dlscale.analysis.scaling import analyse

    result = analyse(recs)
    rate = f"{recs[0].config.get('sample_unit') or 'samples'}/s" if recs else "samples/s"
    metrics: dict[str, Any] = {}
    units: dict[str, str] = {}
    for lad in result["ladders"]:
        suffix = f"@{lad['link']}" if lad["link"] and len(result["ladders"]) > 1 else ""
        for r in lad["efficiency"]:
            for k in ("throughput", "efficiency", "intra_node_efficiency", "inter_node_efficiency", "comm_fraction"):
                metrics[f"{k}_{r['layout']}{suffix}"] = r[k]
                units[f"{k}_{r['layout']}{suffix}"] = rate if k == "throughput" else "fraction"
    for comp in result["comparisons"]:
        for r in comp["rows"]:
            key = f"pct_difference_{r['scale_up']}_vs_{r['scale_out']}" + (f"@{r['link']}" if r["link"] else "")
            metrics[key], units[key] = r["pct_difference"], "fraction"
    return {"metrics": metrics, "units": units, "raw": {"ladders": result, "run_ids": [r.run_id for r in recs]}}
