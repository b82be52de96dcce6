"""Where a figure's expectation comes from: every source, in the order they are tried, and the module of each.

A figure (a GPU's training throughput, a node's GEMM rate, ...) is judged against every expectation it
has (``judging/verdict.py``: one verdict each); a figure with none is NO EXPECTATION, its reason naming
what was missing (a baseline of other options: ``sources/baseline.py``'s note). In order:

0. healthy: the figure a healthy system of the device's model gives, matched on model, check, figure and
   topology (``sources/healthy.py``; the data: ``src/dlscale/facts/healthy.yaml``, a lab's own file given
   with ``--refs`` tried first); a row is a typical figure with its tolerance, or a published floor;
1. datasheet: rated figure (``dlscale/gpus.py``, ``facts/gpus.yaml``) x the typical fraction a healthy
   device reaches (``sources/datasheet.py``), GPU figures only, and only where the healthy table has no
   typical row for the figure;
2. baseline: the same figure in this system's earlier accepted runs of the same suite (or a
   ``--baseline`` selection), tested over its spread between runs (``sources/baseline.py``);
3. reference: published or imported figures (``--reference``) of the same model, devices, per-device
   batch and precision, and a reference ladder's scaling efficiency (``sources/reference.py``);
4. spec: a value the acceptance spec gives itself (the serving check's ``expected_goodput``;
   ``spec_expectations``);
5. rule: the data-parallel efficiency against the acceptance's own training alone (one rank keeps at
   least 0.95; N ranks the seed papers' figure at the layout: ``sources/dataparallel.py``);
6. peers: the median of the figure's peers (the same check, figure and device model in the same run;
   ``judging/verdict.py``'s ``peer_expectations``): the one slow GPU shows there.

A device's own history is read beside them: a change point in its series across acceptances WARNs
(``sources/drift.py``, keyed by ``sources/identity.py``). ``of_acceptance`` gathers sources 0-5 for an
acceptance's figures; all of it is pure but the store reads of ``sources/baseline.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.accept.figures.figure import Figure
from dlscale.accept.judging.verdict import Expectation
from dlscale.accept.sources import dataparallel, datasheet
from dlscale.accept.sources.baseline import Baseline, baseline_expectations
from dlscale.accept.sources.reference import reference_expectations
from dlscale.record import RunRecord


def of_acceptance(figs: Sequence[Figure], records: Sequence[RunRecord], sp: Any, base: Baseline,
                  refs: Sequence[RunRecord], table: Sequence[Any] | None) -> dict[int, list[Expectation]]:
    """Figure index -> its expectations from sources 0-5 (``sp``: the acceptance spec, its thresholds and
    its own values; ``table``: ``healthy.Row``s, default the shipped table)."""
    exps = expectations(figs, {r.run_id: r.system or {} for r in records}, base, refs, table,
                        sp.thresholds.run_spread, sp.thresholds.alpha)
    spec_expectations(figs, sp, exps)
    dataparallel.expectations(figs, exps)
    return exps


def expectations(figs: Sequence[Figure], systems: dict[str, dict[str, Any]], base: Baseline | None,
                 refs: Sequence[RunRecord], table: Sequence[Any] | None = None, floor: float = 0.15,
                 alpha: float = 0.01) -> dict[int, list[Expectation]]:
    """Every figure's healthy (``table``: ``healthy.Row``s, default the shipped table), datasheet (where no
    typical healthy row), baseline and reference expectations (peers are the verdicts' own)."""
    from dlscale.accept.sources import healthy

    rows = healthy.load() if table is None else table
    good = healthy.healthy_expectations(figs, systems, rows)
    typical = {i for i, es in good.items() if any(not e.floor for e in es)}
    priors = {i: e.sigma for i, es in good.items() for e in es if e.sigma is not None}
    sheet = {i: e for i, e in datasheet_expectations(figs, systems).items() if i not in typical}
    out: dict[int, list[Expectation]] = {i: list(es) for i, es in good.items()}
    for part in (sheet, baseline_expectations(figs, base or Baseline(), floor, alpha, priors),
                 reference_expectations(figs, refs)):
        for i, e in part.items():
            out.setdefault(i, []).append(e)
    return out


def datasheet_expectations(figs: Sequence[Figure], systems: dict[str, dict[str, Any]]) -> dict[int, Expectation]:
    """Figure index -> its datasheet expectation (``systems``: run id -> the record's inventory)."""
    out = {}
    for i, f in enumerate(figs):
        rated = datasheet.expectation(f, systems.get(f.run_id) or {})
        if rated is not None:
            out[i] = Expectation("datasheet", rated.value, rated.text)
    return out


def spec_expectations(figs: Sequence[Figure], sp: Any, exps: dict[int, list[Expectation]]) -> None:
    """What the spec itself expects: the serving check's ``expected_goodput``."""
    want = (sp.checks.get("serving") or {}).get("expected_goodput")
    for i, f in enumerate(figs):
        if want and f.check == "serving" and f.name == "goodput at SLO":
            exps.setdefault(i, []).append(Expectation("spec", float(want), f"acceptance spec {sp.name}: "
                                                                          f"expected_goodput {want:g} requests/s"))
