"""Where each figure's expectation comes from: the datasheet, the system's own baseline, a reference.

- datasheet: rated figure x typical fraction (``datasheet.expectation``), GPU figures only;
- baseline: the same figure (by ``Figure.key``) in earlier acceptances of the same system and
  suite: by default, for each figure, the newest ``RUNS`` acceptances in which no verdict of that
  figure proved a shortfall (no FAIL, no WARN with a significant shortfall: a proven slowdown
  never becomes a baseline, so a drift cannot walk the baseline down in steps it can see, while
  the WARNs inside the noise stay, or the runs kept would be the lucky ones and understate the
  noise); or the runs a ``--baseline`` selector names. The expected value is the geometric mean
  of those runs' values, and their spread is the noise a regression is tested against
  (``signif.vs_runs``);
- reference: published or imported figures (``--reference ref:seed001-table5,system:...``) of the
  same model, device count, per-device batch and precision, and the scaling efficiency a reference
  ladder reached at the same layout.

``find_baseline`` reads the store (acceptance records, then the runs of the chosen ones); the rest
is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlscale.accept import datasheet
from dlscale.accept.figures import Figure, figures
from dlscale.accept.verdict import FAIL, WARN, Expectation
from dlscale.record import RunRecord

MAX_HISTORY = 50  # acceptances searched for a figure's baseline
RUNS = 10  # accepted runs of a figure that make its baseline (their spread is its noise between runs)


@dataclass
class Baseline:
    """Baseline figures by key, newest first (at most ``RUNS``), each with the acceptance (or
    selection) it came from."""

    figures: dict[str, list[Figure]] = field(default_factory=dict)
    origin: dict[str, list[str]] = field(default_factory=dict)  # figure key -> ["acceptance ID (date)", ...]

    def add(self, figs: Iterable[Figure], origin: str, keys: set[str] | None = None) -> None:
        """One more run of each figure (the first of a key in ``figs``), up to ``RUNS`` runs per key."""
        seen: set[str] = set()
        for f in figs:
            if f.key in seen or (keys is not None and f.key not in keys) or len(self.figures.get(f.key, ())) >= RUNS:
                continue
            seen.add(f.key)
            self.figures.setdefault(f.key, []).append(f)
            self.origin.setdefault(f.key, []).append(origin)

    def complete(self) -> set[str]:
        """The keys that have their ``RUNS`` runs."""
        return {k for k, v in self.figures.items() if len(v) >= RUNS}


def datasheet_expectations(figs: Sequence[Figure], systems: dict[str, dict[str, Any]]) -> dict[int, Expectation]:
    """Figure index -> its datasheet expectation (``systems``: run id -> the record's inventory)."""
    out = {}
    for i, f in enumerate(figs):
        rated = datasheet.expectation(f, systems.get(f.run_id) or {})
        if rated is not None:
            out[i] = Expectation("datasheet", rated.value, rated.text)
    return out


def baseline_expectations(figs: Sequence[Figure], base: Baseline) -> dict[int, Expectation]:
    """Each figure's baseline: the geometric mean of its accepted runs' values, and those values."""
    import math

    out = {}
    for i, f in enumerate(figs):
        runs = [(b, o) for b, o in zip(base.figures.get(f.key, ()), base.origin.get(f.key, ())) if b.value > 0]
        if not runs:
            continue
        (newest, origin), n = runs[0], len(runs)
        value = math.exp(sum(math.log(b.value) for b, _ in runs) / n)
        src = (f"{origin}, run {newest.run_id}" if n == 1 else
               f"geometric mean of {n} accepted runs: {origin}, run {newest.run_id} (newest) to {runs[-1][1]}")
        out[i] = Expectation("baseline", value, src, runs=tuple(b.value for b, _ in runs), run_id=newest.run_id)
    return out


def reference_expectations(figs: Sequence[Figure], refs: Sequence[RunRecord]) -> dict[int, Expectation]:
    """Throughput figures against reference runs that match them; scaling efficiencies against a
    reference ladder's at the same layout."""
    out = {}
    for i, f in enumerate(figs):
        exp = _efficiency_ref(f, refs) if f.name.startswith("efficiency") else _throughput_ref(f, refs)
        if exp is not None:
            out[i] = exp
    return out


def _throughput_ref(f: Figure, refs: Sequence[RunRecord]) -> Expectation | None:
    """A throughput against the mean of the reference runs of the same model, devices, per-device batch
    and precision; a LoadGen figure against the references' figure of the same LoadGen scenario (never
    their raw throughput, which LoadGen's harness does not reach)."""
    from dlscale.analysis.compare import key_value, system_label

    want = f.context
    if not want.get("model") or f.check not in ("train", "train_alone", "scale", "inference"):
        return None
    kind = "inference" if f.check == "inference" else "train"
    hits = [(r, v) for r in refs if r.kind == kind and r.workload == want["model"]
            and key_value(r, "world_size") == want["world_size"]
            and all(_given(r, k) in (None, want.get(k)) or want.get(k) is None for k in ("batch_size", "precision"))
            for v in [_ref_value(r, want.get("scenario"))] if v is not None]
    if not hits:
        return None
    value = sum(v for _, v in hits) / len(hits)
    first = hits[0][0]
    what = f"LoadGen {want['scenario']} " if want.get("scenario") else ""
    return Expectation("reference", value, f"{system_label(first)}: {what}{want['model']} on {want['world_size']} "
                                           f"device(s){f' (mean of {len(hits)})' if len(hits) > 1 else ''}; "
                                           f"{first.config.get('source') or 'imported'}", run_id=None)


def _ref_value(r: RunRecord, scenario: str | None) -> float | None:
    """A reference run's counterpart of a figure: its LoadGen ``scenario`` figure (that scenario only),
    else its throughput."""
    v = r.metrics.get("scenario_metric") if scenario else r.metrics.get("throughput")
    if scenario and r.metrics.get("scenario") != scenario:
        return None
    return float(v) if isinstance(v, (int, float)) else None


def _given(r: RunRecord, key: str) -> Any:
    """A reference run's batch size or precision: an inference run's batch is its LoadGen batch."""
    if key == "batch_size" and r.kind == "inference":
        return r.metrics.get("max_batch")
    return r.config.get(key)


def _efficiency_ref(f: Figure, refs: Sequence[RunRecord]) -> Expectation | None:
    from dlscale.analysis.compare import system_label
    from dlscale.analysis.scaling import layout_of

    mine = [r for r in refs if r.kind == "train" and r.workload == f.context.get("model")
            and isinstance(r.metrics.get("throughput"), (int, float))]
    at = {f"{n}x{g}": r for r in mine for n, g in [layout_of(r)]}
    one, there = at.get("1x1"), at.get(f.context["layout"])
    if one is None or there is None:
        return None
    n, g = layout_of(there)
    eff = there.metrics["throughput"] / (n * g * one.metrics["throughput"])
    return Expectation("reference", eff, f"{system_label(there)}: {there.metrics['throughput']:g} / ({n * g} x "
                                         f"{one.metrics['throughput']:g}); {there.config.get('source') or 'imported'}")


def expectations(figs: Sequence[Figure], systems: dict[str, dict[str, Any]], base: Baseline | None,
                 refs: Sequence[RunRecord]) -> dict[int, list[Expectation]]:
    """Every figure's datasheet, baseline and reference expectations (peers are the verdicts' own)."""
    out: dict[int, list[Expectation]] = {}
    for part in (datasheet_expectations(figs, systems), baseline_expectations(figs, base or Baseline()),
                 reference_expectations(figs, refs)):
        for i, e in part.items():
            out.setdefault(i, []).append(e)
    return out


# -- the baseline in the store --------------------------------------------------------------------------
def settled_keys(accept_rec: RunRecord) -> set[str]:
    """The figure keys an acceptance can serve as baseline for: judged, and no shortfall proven there
    (no FAIL; no WARN whose shortfall was significant; a record from before ``significant`` was
    recorded counts every WARN as proven)."""
    rows = (accept_rec.raw or {}).get("verdicts") or []
    bad = {r["key"] for r in rows if r.get("status") == FAIL or r.get("status") == WARN and r.get("significant", True)}
    return {r["key"] for r in rows if r.get("key")} - bad


def find_baseline(store: Any, system: str, suite_hash: str, keys: set[str], exclude: str | None = None) -> Baseline:
    """For each key, the figures of the newest ``RUNS`` acceptances of ``system`` and ``suite_hash``
    that settled it (among the newest ``MAX_HISTORY``)."""
    base = Baseline()
    todo = set(keys)
    seen = 0
    for acc in store.query(kind="accept", status="ok"):
        if not todo or seen >= MAX_HISTORY:
            break
        cfg = acc.config or {}
        if acc.tag == exclude or cfg.get("suite_hash") != suite_hash or cfg.get("system") != system:
            continue
        seen += 1
        usable = settled_keys(acc) & todo
        if not usable:
            continue
        base.add(figures(store.query(tag=acc.tag, status="ok")), f"acceptance {acc.tag} ({acc.created_at[:10]})", usable)
        todo -= base.complete()
    return base


def selected_baseline(store: Any, selector: str) -> Baseline:
    """The baseline a ``--baseline`` selector names: its runs, and every run of each acceptance among them."""
    from dlscale.analysis.select import select

    recs = select(store, selector)
    base = Baseline()
    for acc in (r for r in recs if r.kind == "accept"):
        base.add(figures(store.query(tag=acc.tag, status="ok")), f"acceptance {acc.tag} ({acc.created_at[:10]})")
    base.add(figures([r for r in recs if r.kind != "accept"]), f"baseline {selector}")
    return base
