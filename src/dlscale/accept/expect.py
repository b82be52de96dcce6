"""Where each figure's expectation comes from: healthy figures, the datasheet, the system's own baseline, a reference.

- healthy: the figure a healthy system of the device's model gives, from the table of healthy
  figures (``refs.py``: shipped, or a lab's own file first), matched on model and topology;
- datasheet: rated figure x typical fraction (``datasheet.expectation``), GPU figures only, and only
  where the healthy table has no typical row for the figure;
- baseline: the same figure (by ``Figure.key``) in earlier acceptances of the same system and
  suite: by default, for each figure, the newest ``RUNS`` acceptances in which no verdict of that
  figure proved a shortfall (no FAIL, no WARN with a significant shortfall: a proven slowdown
  never becomes a baseline, so a drift cannot walk the baseline down in steps it can see, while
  the WARNs inside the noise stay, or the runs kept would be the lucky ones and understate the
  noise); or the runs a ``--baseline`` selector names. The expected value is the geometric mean
  of those runs' values; the noise a regression is tested against is the spread between runs of
  that figure on that class of device (``noise.between_runs``, ``signif.vs_runs``);
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

from dlscale.accept import datasheet, noise
from dlscale.accept.figures import Figure, figures
from dlscale.accept.verdict import ERROR, FAIL, WARN, Expectation
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


def baseline_expectations(figs: Sequence[Figure], base: Baseline, floor: float = 0.15, alpha: float = 0.01,
                          priors: dict[int, float] | None = None) -> dict[int, Expectation]:
    """Each figure's baseline: the geometric mean of its accepted runs' values, those values, and the
    spread between runs of the figure on its class of device (``noise.between_runs``; ``priors``:
    figure index -> its healthy row's sigma; ``floor``: run_spread)."""
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
        mates = [k for k, v in base.figures.items() if k != f.key and v and klass(v[0]) == klass(f)]
        series = [[b.value for b, _ in runs]] + [[b.value for b in base.figures[k]] for k in mates]
        spread = noise.between_runs(series, [b.samples for b, _ in runs], floor, alpha, (priors or {}).get(i),
                                    f.model or "")
        out[i] = Expectation("baseline", value, src, runs=tuple(b.value for b, _ in runs), run_id=newest.run_id,
                             spread=spread)
    return out


def klass(f: Figure) -> tuple[str, ...]:
    """A figure's class of device: the same check and figure on every device of one model (the key alone
    for a figure with no device model)."""
    return (f.check, f.name, f.model) if f.model else (f.key,)


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
    from dlscale.analysis.compare import key_value, system_label

    want = f.context
    if not want.get("model") or f.check not in ("train", "train_alone", "scale", "inference"):
        return None
    kind = "inference" if f.check == "inference" else "train"
    hits = [r for r in refs if r.kind == kind and r.workload == want["model"]
            and key_value(r, "world_size") == want["world_size"]
            and all(r.config.get(k) in (None, want.get(k)) or want.get(k) is None for k in ("batch_size", "precision"))
            and isinstance(r.metrics.get("throughput"), (int, float))]
    if not hits:
        return None
    value = sum(r.metrics["throughput"] for r in hits) / len(hits)
    src = hits[0].config.get("source") or "imported"
    return Expectation("reference", value, f"{system_label(hits[0])}: {want['model']} on {want['world_size']} device(s)"
                                          f"{f' (mean of {len(hits)})' if len(hits) > 1 else ''}; {src}",
                       run_id=None)


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
                 refs: Sequence[RunRecord], table: Sequence[Any] | None = None, floor: float = 0.15,
                 alpha: float = 0.01) -> dict[int, list[Expectation]]:
    """Every figure's healthy (``table``: ``refs.Row``s, default the shipped table), datasheet (where no
    typical healthy row), baseline and reference expectations (peers are the verdicts' own)."""
    from dlscale.accept import refs as healthy

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


# -- the baseline in the store --------------------------------------------------------------------------
def settled_keys(accept_rec: RunRecord) -> set[str]:
    """The figure keys an acceptance can serve as baseline for: judged, and no shortfall proven there
    (no FAIL or ERROR; no WARN whose shortfall was significant; a record from before ``significant`` was
    recorded counts every WARN as proven)."""
    rows = (accept_rec.raw or {}).get("verdicts") or []
    bad = {r["key"] for r in rows if r.get("status") in (FAIL, ERROR) or r.get("status") == WARN
           and r.get("significant", True)}
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
