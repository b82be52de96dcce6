"""Data-parallel efficiency in the acceptance: its figure and its expectations, from the acceptance's own
records (pure; docs/METRICS.md, "Data-parallel efficiency" and "Acceptance").

The figure ``dp efficiency`` of the train check is ``E = X / (N x x1)``: X the data-parallel run's
throughput over its N ranks, x1 what one device gives training alone in the acceptance's own train_alone
run (``dpref.per_device``); each measured step of the data-parallel run is a sample, ``rate_t / (N x1)``.
It is read from the pair of records, so an acceptance recorded before the runs carried the figure is
judged the same way when judged again. The scale check's ``efficiency NxG`` figures (``readers``) are the
ladder's rungs against its 1-device rung.

Expectations (``expectations``):

- one rank on a GPU: DDP over one rank exchanges nothing with anyone, so what it loses against the same
  training alone is DDP's own per-step work (its buffer broadcast, its gradient copies) or a difference
  between the two runs. It must keep at least ``ONE_RANK_FLOOR`` (0.95): a floor, FAIL below it where the
  shortfall is significant over both runs' steps (Welch's t-test on the logs of the data-parallel steps
  against the floor times the alone steps). Not on a CPU (``device: cpu``): there gloo's reducer (every
  gradient scaled and all-reduced through host buffers, the autograd hooks) runs on the very cores that
  compute, and costs a healthy machine 6-25% at one rank (docs/PERFORMANCE.md, "Data-parallel
  efficiency"); a CPU's figure is recorded and judged against its baseline and its peers like any other;
- N ranks: the seed papers' efficiency at the same layout, model and batch per device (seed 001, Figs.
  26 and 28, shipped as the ``seed001-scaling`` reference: 1x4 97.1% on P100-PCIe, 96.8% on V100-SXM2;
  2x4 91.7% and 89.9%): the figure of the same GPU where one is published, else the lowest of them,
  judged with the acceptance's thresholds; where none is published, the node's peers (every node's ladder
  of the same acceptance at the same layout on the same GPU, ``readers.scale_figures``) and its baseline.

``annotate`` adds to a verdict below its expectation what differs between the two runs besides the data
parallelism (``dpref.notes``: threads, CPU binding, rank CPUs, SM clock, utilisation).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from dlscale.accept.figures.figure import Figure
from dlscale.accept.judging.verdict import PASS, Expectation, Verdict
from dlscale.analysis.formulas import scaling_efficiency
from dlscale.distributed import dpref
from dlscale.record import RunRecord

NAME = "dp efficiency"
ONE_RANK_FLOOR = 0.95
SEED_REFERENCE = "seed001-scaling"


def figures(records: Sequence[RunRecord], check_of: dict[str, str | None]) -> list[Figure]:
    """The ``dp efficiency`` of every ok data-parallel run of the train check that has an ok train_alone run
    in the same acceptance (``check_of``: run id -> its check)."""
    alone = [r for r in records if check_of.get(r.run_id) == "train_alone" and r.status == "ok"
             and dpref.per_device(r) is not None]
    out = []
    for rec in records:
        if check_of.get(rec.run_id) != "train" or rec.status != "ok" or (rec.config or {}).get("parallel") == "none":
            continue
        named = (rec.metrics or {}).get("dp_reference_run_id")
        ref = next((a for a in alone if a.run_id == named), alone[0] if alone else None)
        fig = _figure(rec, ref) if ref is not None else None
        if fig is not None:
            out.append(fig)
    return out


def _figure(rec: RunRecord, ref: RunRecord) -> Figure | None:
    m, c = rec.metrics or {}, rec.config or {}
    x1, thr = dpref.per_device(ref), m.get("throughput")
    world = int(m.get("world_size") or c.get("world_size") or 1)
    if not x1 or not isinstance(thr, (int, float)) or thr <= 0:
        return None
    per_step = m.get("samples_per_step") or 0
    steps = [t for rep in (rec.raw or {}).get("step_times_s") or [] for t in rep if t and t > 0]
    batch = (ref.metrics or {}).get("samples_per_step", 0) / max(1, (ref.metrics or {}).get("world_size") or 1)
    alone_steps = [t for rank in (ref.raw or {}).get("rank_step_times_s") or [(ref.raw or {}).get("step_times_s") or []]
                   for rep in rank for t in rep if t and t > 0]
    return Figure("train", NAME, scaling_efficiency(thr, x1, world), "fraction", rec.run_id, None,
                  [per_step / t / (world * x1) for t in steps],
                  context={"world_size": world, "nodes": int(c.get("nodes") or 1),
                           "devices_per_node": int(c.get("devices_per_node") or world), "workload": rec.workload,
                           "batch_size": c.get("batch_size"), "device_name": c.get("device_name"),
                           "device": c.get("device"),
                           "reference_run": ref.run_id, "alone": [batch / t / x1 for t in alone_steps] if batch else [],
                           "notes": dpref.notes(m, c, ref)})


@functools.lru_cache(maxsize=1)
def published() -> tuple[tuple[str, str, int, int, int, float, str], ...]:
    """The seed papers' efficiencies: (system, model, batch per device, nodes, devices per node, efficiency,
    source) for every layout of a system beside its one-device figure (``SEED_REFERENCE``)."""
    from dlscale.importers.records import reference_records

    recs = reference_records(SEED_REFERENCE)
    ones = {(r.config["system"], r.workload, r.config["batch_size"]): r.metrics["throughput"] for r in recs
            if (r.config["nodes"], r.config["devices_per_node"]) == (1, 1)}
    out = []
    for r in recs:
        c = r.config
        one = ones.get((c["system"], r.workload, c["batch_size"]))
        n, g = c["nodes"], c["devices_per_node"]
        if one is None or n * g == 1:
            continue
        thr = r.metrics["throughput"]
        out.append((c["system"], r.workload, c["batch_size"], n, g, scaling_efficiency(thr, one, n * g),
                    f"seed 001, {c['system']}: {thr:g} of the ideal {n * g} x {one:g} = {n * g * one:g} images/s, "
                    f"{r.workload} batch {c['batch_size']} per GPU ({c.get('note') or 'published'}; dlscale reference "
                    f"{SEED_REFERENCE})"))
    return tuple(out)


def seed_expectation(model: str | None, batch: Any, nodes: int, per_node: int, device: str | None
                     ) -> Expectation | None:
    """The seed papers' efficiency at this layout for this model and batch per device: the same GPU's where
    one is published, else the lowest (None: none published)."""
    hits = [p for p in published() if (p[1], p[2], p[3], p[4]) == (model, batch, nodes, per_node)]
    if not hits:
        return None
    same = [p for p in hits if device and _gpu(p[0]) and _gpu(p[0]) in device.upper()]
    pick = min(same or hits, key=lambda p: p[5])
    how = "" if same else f" (no published figure of {device or 'this device'}: the lowest of {len(hits)})"
    return Expectation("reference", pick[5], pick[6] + how)


def _gpu(system: str) -> str | None:
    """The GPU a seed system names ("C4130-P100-16GB-PCIe" -> "P100")."""
    import re

    m = re.search(r"\b([A-Z]\d{2,3})\b", system.replace("-", " "))
    return m.group(1) if m else None


def expectations(figs: Sequence[Figure], exps: dict[int, list[Expectation]]) -> None:
    """Add each data-parallel efficiency's own expectations to ``exps`` (figure index -> list): the one-rank
    floor, or the seed papers' figure at its layout (the module doc)."""
    for i, f in enumerate(figs):
        if f.check == "train" and f.name == NAME:
            c = f.context
            if c["world_size"] == 1:
                if c.get("device") == "cpu":  # the floor is a GPU's (the module doc)
                    continue
                exps.setdefault(i, []).append(Expectation(
                    "rule", ONE_RANK_FLOOR, f"DDP over one rank exchanges nothing: it keeps at least "
                    f"{ONE_RANK_FLOOR:.0%} of the same training alone (run {c['reference_run']}; docs/METRICS.md, "
                    "'Data-parallel efficiency')", samples=tuple(ONE_RANK_FLOOR * x for x in c["alone"]), floor=True,
                    run_id=c["reference_run"]))
                continue
            exp = seed_expectation(c["workload"], c["batch_size"], c["nodes"], c["devices_per_node"],
                                   c["device_name"])
        elif f.check == "scale" and f.name.startswith("efficiency "):
            n, _, g = f.context["layout"].partition("x")
            exp = seed_expectation(f.context.get("model"), f.context.get("batch_size"), int(n), int(g), f.model)
        else:
            continue
        if exp is not None:
            exps.setdefault(i, []).append(exp)


def annotate(verdicts: Sequence[Verdict], figs: Sequence[Figure]) -> None:
    """A data-parallel efficiency below its expectation says what else differs between its two runs."""
    notes = {f.key: f.context.get("notes") for f in figs if f.name == NAME}
    for v in verdicts:
        if v.key in notes and v.status != PASS and v.expectation == "rule":
            found = notes[v.key]
            v.reason += ("; DDP's own per-step work (buffer broadcast, gradient copies) or a difference between the "
                         "runs: " + ("; ".join(found) if found else "none recorded (same threads, binding, CPUs, "
                                     "clocks within their margins)"))
