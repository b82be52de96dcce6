"""``dlscale predict``: the data-parallel scaling of layouts you do not have, from runs you have.

From one one-device short test (``--from RUN``: measured by ``dlscale train``, or a published
figure brought in by ``dlscale import``) and link parameters (fitted from ``micro collectives``
runs in the store, or datasheet/what-if links), the step model (``predict.model``) predicts each
layout's throughput, scaling efficiency, intra/inter-node efficiency and communication fraction.
What one device cannot show (contention among a host's ranks, the CPU host's own all-reduce
cost, the cost of overlapping the all-reduce with backward on an accelerator, the input pipeline
shared by a host's ranks) comes from the store's runs of the same test on the same system, else
from a stated default (``predict.fitted``); every record's notes say which. Each layout is stored
as a record of kind ``prediction`` (config: the layout, the links and terms as used; raw: the
bucket schedule and the notes), so that ``dlscale compare kind:prediction tag:MEASURED --by
model,layout,link`` reads prediction against measurement from the store, and the report can draw
one over the other.
"""

from __future__ import annotations

from typing import Any

from dlscale.errors import UsageError
from dlscale.log import info
from dlscale.predict.fitted import TEST_KEYS

UNITS = {"throughput": "samples/s", "speedup": "x", "efficiency": "fraction", "intra_node_efficiency": "fraction",
         "inter_node_efficiency": "fraction", "comm_fraction": "fraction", "exposed_comm": "s", "overlap_loss": "s",
         "step_time": "s", "contention": "x", "world_size": "ranks"}


def source_run(store: Any, run: str) -> Any:
    """The one-device run a prediction starts from (an id or an unambiguous prefix)."""
    return store.get(run)  # an unknown or ambiguous id is a UsageError naming it


def resolve_link(store: Any, text: str | None, level: str) -> Any:
    """A link as given: a datasheet name or a rate; ``measured`` / ``measured:RATE`` (the newest
    collectives run of that level, at that emulated rate); ``run:ID`` (that collectives run)."""
    from dlscale.predict.links import find_measured, from_collectives, link

    if not text:
        return None
    if text.startswith("run:"):
        return from_collectives(store.get(text[4:]))
    if text == "measured" or text.startswith("measured:"):
        rate = text.partition(":")[2] or None
        found = find_measured(store, level, rate)
        if found is None:
            raise UsageError(f"{text}: no {level}-node `dlscale micro collectives` run{' at ' + rate if rate else ''} "
                             "with all_reduce in the store")
        return found
    return link(text)


MISSING_LINK = {
    "intra": "layouts with several devices per node need an intra-node link: give --intra LINK (e.g. nvlink4, "
             "pcie-gen4-x16) or record `dlscale micro collectives --nproc-per-node N`",
    "inter": "layouts with several nodes need an inter-node link: give --inter LINK (e.g. ib-ndr, 1gbit) or record "
             "`dlscale micro collectives` across nodes",
}


def links_for(store: Any, layouts: list[tuple[int, int]], intra: str | None, inter: str | None) -> tuple[Any, Any, list[str]]:
    """(intra link, inter link, notes): as given, else fitted from the newest collectives run of the level."""
    notes: list[str] = []
    lo = _level_link(store, intra, "intra", any(g > 1 for _, g in layouts), notes)
    hi = _level_link(store, inter, "inter", any(n > 1 for n, _ in layouts), notes)
    return lo, hi, notes


def _level_link(store: Any, given: str | None, level: str, needed: bool, notes: list[str]) -> Any:
    from dlscale.predict.links import find_measured

    lk = resolve_link(store, given, level)
    if lk is None and needed:
        lk = find_measured(store, level)
        if lk is None:
            raise UsageError(MISSING_LINK[level])
        notes.append(f"{level}-node link fitted from {lk.source}")
    return lk


def emulated_rate(lk: Any) -> str | None:
    """The tc rate of an emulated link ("1gbit"), given as a rate or fitted over emulated nodes; else None."""
    if lk is None:
        return None
    if lk.name.startswith("emulated "):
        return lk.name.removeprefix("emulated ")
    return (lk.fit or {}).get("emulated_link")


def predict(run: str, layouts: list[tuple[int, int]], *, model: str | None = None, intra: str | None = None,
            inter: str | None = None, algorithm: str = "ring", host_cost: bool = True, nics: int = 1,
            overlap_cost: float | None = None, find_unused_parameters: bool | None = None, tag: str | None = None,
            shared_host: bool | None = None, db: str | None = None) -> list[Any]:
    """Predict every layout from ``run``; one stored ``prediction`` record per layout (a layout given
    twice is predicted once). ``shared_host``: every node of the layouts runs on the source run's
    machine and shares its cores (emulated nodes, a rehearsal cluster on one machine); None: so
    when the inter-node link is an emulated one."""
    from dlscale.predict import fitted
    from dlscale.predict import model as step_model
    from dlscale.predict.grads import bucket_plan, profile
    from dlscale.store import Store

    if algorithm not in ("ring", "hierarchical"):
        raise UsageError(f"unknown --algorithm {algorithm!r}; choose ring or hierarchical")
    if not layouts:
        raise UsageError("give --layouts, e.g. 1x8,2x4,4x2")
    if nics < 1:
        raise UsageError(f"--nics-per-node must be >= 1, got {nics}")
    if overlap_cost is not None and not 0.0 <= overlap_cost <= 1.0:
        raise UsageError(f"--overlap-cost is the share of backward lost while an all-reduce is in flight: give 0 "
                         f"(free overlap) to 1 (none), got {overlap_cost}")
    layouts = list(dict.fromkeys(layouts))
    with Store.open(db) as store:
        base = source_run(store, run)
        if model is not None and model != base.workload:
            raise UsageError(f"--from {base.run_id} is a {base.workload} run, not {model}")
        if base.config.get("parallel", "ddp") != "ddp":
            raise UsageError(f"--from {base.run_id} ran {base.config['parallel']}; dlscale predict models DDP "
                             "(a replicated model and one all-reduce of its gradients)")
        shape = {k: base.config[k] for k in ("image_size", "seq_len", "tokens_per_batch", "model_config",
                                             "max_table_rows") if base.config.get(k) is not None}
        prof = profile(base.workload, base.config.get("precision") or "fp32", shape)
        compute = step_model.compute_from_record(base, prof.backward_ratio)
        unused = bool(base.config.get("find_unused_parameters")) if find_unused_parameters is None \
            else find_unused_parameters
        rebuilt = not unused or bool(base.config.get("ddp_static_graph"))
        buckets = bucket_plan(prof.grads, base.config.get("ddp_bucket_mb"), rebuilt)
        lo, hi, notes = links_for(store, layouts, intra, inter)
        if nics > 1 and hi is not None and hi.fit is not None:
            raise UsageError(f"--nics-per-node multiplies a datasheet NIC's rate; the measured inter-node link "
                             f"{hi.name} already ran over the NICs it had: drop --nics-per-node")
        shared = emulated_rate(hi) is not None if shared_host is None else shared_host  # nodes on one machine
        per_host = {n * g if shared else g for n, g in layouts} | {g for _, g in layouts} | {1}
        factors = {k: fitted.contention(store, base, k) for k in per_host}
        sizes = [b.nbytes for b in buckets]
        host_bw, host_note = fitted.host_bandwidth(store, base, sizes, lo) if host_cost else (None, "host cost: off")
        cost, cost_note, fit_run = fitted.overlap(store, base, compute, buckets, lo, overlap_cost, host_bw, factors)
        ld, loader_note = fitted.loader(base)
        per_device = base.config.get("units_per_batch") or base.config["batch_size"]  # sample units per device step
        rows = step_model.predict_layouts(compute, buckets, per_device, layouts, lo, hi,
                                          contention={k: 1.0 if f is None else f for k, (f, _) in factors.items()},
                                          loader=ld, algorithm=algorithm, shared_host=shared, host_bandwidth=host_bw,
                                          overlap_cost=cost, nics=nics)
        info(f"dlscale predict {base.workload}: from {base.run_id} ({_fmt(base.metrics.get('throughput'))} "
             f"{base.config.get('sample_unit', 'samples')}/s on one device), {len(buckets)} gradient buckets, "
             f"{sum(sizes) / 2**20:.1f} MiB per step")
        notes += [*compute.notes, prof.note, "DDP buckets as built at construction (find_unused_parameters: not "
                  "rebuilt in ready order)" if not rebuilt else "DDP buckets rebuilt in the order backward readies "
                  "the gradients", host_note, cost_note, loader_note]
        if fit_run is not None and (1, fit_run.config["devices_per_node"]) in layouts:
            notes.append(f"1x{fit_run.config['devices_per_node']} is the layout the overlap cost was fitted from "
                         f"({fit_run.run_id}): fitted, not predicted")
        model_cfg = {"compute": compute.to_dict(), "nics_per_node": nics, "overlap_cost": cost, "shared_host": shared,
                     "overlap_fitted_from": fit_run.run_id if fit_run is not None else None,
                     "find_unused_parameters": unused, "buckets_rebuilt": rebuilt,
                     "ddp_bucket_mb": base.config.get("ddp_bucket_mb")}
        return [_record(store, base, row, lo, hi, algorithm, factors, notes, tag, host_bw, model_cfg) for row in rows]


def _fmt(x: Any) -> str:
    from dlscale.format import fmt_num

    return fmt_num(x)


def _record(store: Any, base: Any, row: dict[str, Any], lo: Any, hi: Any, algorithm: str,
            factors: dict[int, tuple[float | None, str]], notes: list[str], tag: str | None, host_bw: float | None,
            model_cfg: dict[str, Any]) -> Any:
    from dlscale.harness.runner import Outcome, execute

    nodes, per_node = row["nodes"], row["per_node"]
    emulated = nodes > 1 and emulated_rate(hi) is not None
    config = {
        "model": base.workload, "from_run": base.run_id, **{k: base.config.get(k) for k in TEST_KEYS},
        "nodes": nodes, "devices_per_node": per_node, "world_size": nodes * per_node, "algorithm": algorithm,
        "intra_link": lo.to_dict() if lo is not None and per_node > 1 else None,
        "inter_link": hi.to_dict() if hi is not None and nodes > 1 else None,
        "emulated_nodes": emulated, "link_bandwidth": emulated_rate(hi) if emulated else None,
        "threads_per_rank": base.config.get("threads_per_rank"), "host_bandwidth": host_bw,
        "from_imported": bool(base.imported), "system": base.config.get("system"), **model_cfg,
    }
    f = row.get("contention", 1.0)
    why = factors.get(row["ranks_per_host"], (None, "as predicted"))[1]
    metrics = {k: row.get(k) for k in ("throughput", "speedup", "efficiency", "intra_node_efficiency",
                                       "inter_node_efficiency", "comm_fraction", "exposed_comm", "overlap_loss",
                                       "step_time")}
    metrics.update({"contention": f, "world_size": nodes * per_node})
    raw = {"schedule": row.get("schedule", []), "notes": [*notes, f"contention {f:.3f}: {why}"]}
    return execute(kind="prediction", workload=base.workload, config=config, tag=tag, store=store,
                   system=base.system, body=lambda _rec: Outcome(metrics=metrics, units=dict(UNITS), raw=raw))
