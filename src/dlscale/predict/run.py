"""``dlscale predict``: the data-parallel scaling of layouts you do not have, from runs you have.

From one measured one-device short test (``--from RUN``) and link parameters (fitted from
``micro collectives`` runs in the store, or datasheet/what-if links), the step model
(``predict.model``) predicts each layout's throughput, scaling efficiency, intra/inter-node
efficiency and communication fraction. Each layout is stored as a record of kind
``prediction`` (config: the layout and the links as used; raw: the bucket schedule), so that
``dlscale compare kind:prediction tag:MEASURED --by model,layout,link`` reads prediction against
measurement from the store, and the report can draw one over the other.

Host cost: on CPU hosts an all-reduce's copies and reductions run on the cores that run backward.
Where the store holds a measured one-node multi-rank run of the same test on the same host, the
part of its in-training all-reduce time that its link does not explain gives the host's own
per-byte rate (``model.fit_host_bandwidth``), added to every bucket's all-reduce; that run's own
layout is then fitted rather than predicted.

Compute contention: ranks that share one host's cores and memory run their compute slower than
one rank alone. Where the store holds a measured multi-rank run of the same test on this host
with its phase breakdown, the slowdown of its forward and optimizer phases (which carry no
communication) over the one-device run's is the contention factor for that many ranks per host;
elsewhere it is 1 and the record says it was not measured.
"""

from __future__ import annotations

from typing import Any

from dlscale.errors import UsageError
from dlscale.log import info

UNITS = {"throughput": "samples/s", "speedup": "x", "efficiency": "fraction", "intra_node_efficiency": "fraction",
         "inter_node_efficiency": "fraction", "comm_fraction": "fraction", "exposed_comm": "s", "step_time": "s",
         "contention": "x", "world_size": "ranks"}
TEST_KEYS = ("batch_size", "image_size", "seq_len", "tokens_per_batch", "model_config", "max_table_rows", "precision",
             "channels_last", "compile_mode", "optimizer", "optimizer_impl", "device")


def source_run(store: Any, run: str) -> Any:
    """The measured one-device run a prediction starts from (an id or an unambiguous prefix)."""
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


def contention(store: Any, base: Any, per_host: int) -> tuple[float, str]:
    """Compute slowdown of ``per_host`` ranks sharing this host, from a measured run (else 1.0)."""
    if per_host <= 1:
        return 1.0, "one rank per host"
    f0 = _free_phases(base)
    for rec in store.query(kind="train", workload=base.workload, status="ok"):
        c = rec.config
        same = all(c.get(k) == base.config.get(k) for k in TEST_KEYS) and rec.hostname == base.hostname
        if same and c.get("devices_per_node") == per_host and (c.get("nodes") or 1) == 1 and _free_phases(rec):
            if f0:
                return _free_phases(rec) / f0, f"forward+optimizer of {rec.run_id} over {base.run_id}"
    return 1.0, f"not measured for {per_host} ranks per host (no {per_host}-rank run of this test with a breakdown)"


def host_bandwidth(store: Any, base: Any, buckets: list[int], intra: Any) -> tuple[float | None, str]:
    """The loaded CPU host's own all-reduce rate (``model.fit_host_bandwidth``) from a measured one-node
    multi-rank run of the same test on the same host; (None, why) where there is none or not a CPU."""
    from dlscale.predict.links import find_measured
    from dlscale.predict.model import fit_host_bandwidth

    if base.config.get("device") != "cpu":
        return None, "host cost: not a CPU run (device-side collectives do not share the compute cores)"
    intra = intra or find_measured(store, "intra")
    for rec in store.query(kind="train", workload=base.workload, status="ok"):
        c, m = rec.config, rec.metrics
        g = c.get("devices_per_node") or 1
        if (g > 1 and (c.get("nodes") or 1) == 1 and rec.hostname == base.hostname and intra is not None
                and all(c.get(k) == base.config.get(k) for k in TEST_KEYS) and m.get("allreduce_seconds_per_step")):
            bw = fit_host_bandwidth(m["allreduce_seconds_per_step"], buckets, g, intra)
            if bw is None:
                return None, f"host cost: none visible in {rec.run_id} (its link explains its all-reduce time)"
            return bw, (f"host cost: {bw / 1e9:.3f} GB/s fitted from {rec.run_id}'s in-training all-reduce time "
                        f"({m['allreduce_seconds_per_step'] * 1e3:.1f} ms per step) over {intra.name}")
    return None, "host cost: not measured (no one-node multi-rank run of this test on this host)"


def emulated_rate(lk: Any) -> str | None:
    """The tc rate of an emulated link ("1gbit"), given as a rate or fitted over emulated nodes; else None."""
    if lk is None:
        return None
    if lk.name.startswith("emulated "):
        return lk.name.removeprefix("emulated ")
    return (lk.fit or {}).get("emulated_link")


def _free_phases(rec: Any) -> float | None:
    m = rec.metrics
    if m.get("phase_forward") is None or m.get("phase_optimizer") is None:
        return None
    return m["phase_forward"] + m["phase_optimizer"]


def predict(run: str, layouts: list[tuple[int, int]], *, model: str | None = None, intra: str | None = None,
            inter: str | None = None, algorithm: str = "ring", host_cost: bool = True, tag: str | None = None,
            db: str | None = None) -> list[Any]:
    """Predict every layout from ``run``; one stored ``prediction`` record per layout."""
    from dlscale.predict import model as step_model
    from dlscale.store import Store

    if algorithm not in ("ring", "hierarchical"):
        raise UsageError(f"unknown --algorithm {algorithm!r}; choose ring or hierarchical")
    if not layouts:
        raise UsageError("give --layouts, e.g. 1x8,2x4,4x2")
    with Store.open(db) as store:
        base = source_run(store, run)
        if model is not None and model != base.workload:
            raise UsageError(f"--from {base.run_id} is a {base.workload} run, not {model}")
        if base.config.get("parallel", "ddp") != "ddp":
            raise UsageError(f"--from {base.run_id} ran {base.config['parallel']}; dlscale predict models DDP "
                             "(a replicated model and one all-reduce of its gradients)")
        compute = step_model.compute_from_record(base)
        shape = {k: base.config[k] for k in ("model_config", "max_table_rows") if base.config.get(k) is not None}
        buckets = step_model.ddp_buckets(step_model.gradient_bytes(base.workload, base.config.get("precision", "fp32"),
                                                                   shape))
        lo, hi, notes = links_for(store, layouts, intra, inter)
        shared = emulated_rate(hi) is not None  # emulated nodes share this host's cores
        per_host = {n * g if shared else g for n, g in layouts} | {g for _, g in layouts} | {1}
        factors = {k: contention(store, base, k) for k in per_host}
        host_bw, host_note = host_bandwidth(store, base, buckets, lo) if host_cost else (None, "host cost: off")
        per_device = base.config.get("units_per_batch") or base.config["batch_size"]  # sample units per device step
        rows = step_model.predict_layouts(compute, buckets, per_device, layouts, lo, hi,
                                          contention={k: f for k, (f, _) in factors.items()},
                                          loader_rate=base.metrics.get("loader_rate"), algorithm=algorithm,
                                          shared_host=shared, host_bandwidth=host_bw)
        info(f"dlscale predict {base.workload}: from {base.run_id} ({_fmt(base.metrics.get('throughput'))} {base.config.get('sample_unit', 'samples')}/s "
             f"on one device), {len(buckets)} gradient buckets, {sum(buckets) / 2**20:.1f} MiB per step")
        notes += [*getattr(compute, "notes", []), host_note]
        return [_record(store, base, row, lo, hi, algorithm, factors, notes, tag, host_bw)
                for row in rows if (row["nodes"], row["per_node"]) in set(layouts)]


def _fmt(x: Any) -> str:
    from dlscale.format import fmt_num

    return fmt_num(x)


def _record(store: Any, base: Any, row: dict[str, Any], lo: Any, hi: Any, algorithm: str,
            factors: dict[int, tuple[float, str]], notes: list[str], tag: str | None, host_bw: float | None) -> Any:
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
    }
    f, why = factors.get(row.get("ranks_per_host", per_node), (row.get("contention", 1.0), "as predicted"))
    metrics = {k: row.get(k) for k in ("throughput", "speedup", "efficiency", "intra_node_efficiency",
                                       "inter_node_efficiency", "comm_fraction", "exposed_comm", "step_time")}
    metrics.update({"contention": f, "world_size": nodes * per_node})
    raw = {"schedule": row.get("schedule", []), "notes": [*notes, f"contention {f:.3f}: {why}"]}
    return execute(kind="prediction", workload=base.workload, config=config, tag=tag, store=store,
                   system=base.system, body=lambda _rec: Outcome(metrics=metrics, units=dict(UNITS), raw=raw))
