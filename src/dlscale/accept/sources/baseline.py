"""The system's own baseline: the same figure in its earlier accepted runs, read from the store.

A baseline run of a figure is the same figure (by ``Figure.key``) of a run that measured the same thing
(``measured``: the same workload and recorded options; else the figure has no baseline and its NO
EXPECTATION says why) in earlier acceptances of the same system and suite, never one whose time overlapped
this acceptance's or another acceptance's on the same system (it measured under that one's load): by
default, for each figure, the newest ``RUNS`` acceptances in which no verdict of that figure proved a
shortfall (no FAIL, no WARN with a significant shortfall: a proven slowdown never becomes a baseline, so a
drift cannot walk the baseline down in steps it can see, while the WARNs inside the noise stay, or the runs
kept would be the lucky ones and understate the noise; ``find_baseline``); or the runs a ``--baseline``
selector names (``selected_baseline``). ``baseline_expectations`` (pure): the expected value is the
geometric mean of those runs' values; the noise a regression is tested against is the spread between runs
of that figure on that class of device (``judging/noise.py``'s ``between_runs``, ``judging/significance.py``'s
``vs_runs``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlscale.accept.figures.collect import Figure, figures
from dlscale.accept.judging import noise
from dlscale.accept.judging.verdict import ERROR, FAIL, WARN, Expectation
from dlscale.record import RunRecord

MAX_HISTORY = 50  # acceptances searched for a figure's baseline
RUNS = 10  # accepted runs of a figure that make its baseline (their spread is its noise between runs)


@dataclass
class Baseline:
    """Baseline figures by key, newest first (at most ``RUNS``), each with the acceptance (or
    selection) it came from and what its run measured (``measured``)."""

    figures: dict[str, list[Figure]] = field(default_factory=dict)
    origin: dict[str, list[str]] = field(default_factory=dict)  # figure key -> ["acceptance ID (date)", ...]
    what: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # figure key -> each run's ``measured``
    notes: dict[str, str] = field(default_factory=dict)  # figure key -> why runs of it were set aside
    # node (None on one node) -> its inventory run at its last sound acceptance, where from (``inventory.find_last``)
    inventory: dict[str | None, tuple[RunRecord, str]] = field(default_factory=dict)

    def add(self, figs: Iterable[Figure], origin: str, keys: set[str] | None = None,
            runs: dict[str, RunRecord] | None = None) -> None:
        """One more run of each figure (the first of a key in ``figs``), up to ``RUNS`` runs per key
        (``runs``: the figures' records by run id, for what each measured)."""
        seen: set[str] = set()
        for f in figs:
            if f.key in seen or (keys is not None and f.key not in keys) or len(self.figures.get(f.key, ())) >= RUNS:
                continue
            seen.add(f.key)
            self.figures.setdefault(f.key, []).append(f)
            self.origin.setdefault(f.key, []).append(origin)
            rec = (runs or {}).get(f.run_id)
            self.what.setdefault(f.key, []).append(measured(rec) if rec is not None else {})

    def complete(self) -> set[str]:
        """The keys that have their ``RUNS`` runs."""
        return {k for k, v in self.figures.items() if len(v) >= RUNS}

    def fit(self, figs: Sequence[Figure], records: Sequence[RunRecord]) -> "Baseline":
        """The runs of each figure that measured what ``figs``' own runs did (``records``: theirs); a
        figure whose baseline runs all measured something else gets a note saying what differs."""
        mine = {r.run_id: measured(r) for r in records}
        out = Baseline(notes=dict(self.notes), inventory=dict(self.inventory))
        for f in figs:
            if f.key not in self.figures or f.key in out.figures:
                continue
            kept, why = [], ""
            for b, o, w in zip(self.figures[f.key], self.origin[f.key], self.what.get(f.key) or [{}] * RUNS):
                diff = differences(mine.get(f.run_id) or {}, w)
                if diff:
                    why = why or f"{o} measured {diff}"
                else:
                    kept.append((b, o, w))
            if kept:
                out.figures[f.key], out.origin[f.key], out.what[f.key] = (list(x) for x in zip(*kept))
            else:
                out.notes[f.key] = f"no baseline of the same options: {why}"
        return out


UNMEASURED = ("kind", "tag", "monitor_interval", "profile", "profile_steps", "strict")  # options that change no figure
COMMAND_OF = {"train": "train", "scale": "train", "micro": "micro", "inference": "infer"}  # a record's kind -> its command


def measured(rec: RunRecord) -> dict[str, Any]:
    """What a run measured, to hold one run's figure to another's: its kind and workload, the options
    of its command that its config records (``sweep.fields``' tables, less ``UNMEASURED`` and the
    price), and its ranks and nodes."""
    from dlscale.sweep.fields import COMMANDS

    cfg = rec.config or {}
    table = COMMANDS.get(COMMAND_OF.get(rec.kind, ""), {})
    out: dict[str, Any] = {"kind": rec.kind, "workload": rec.workload}
    out.update({k: cfg[o.field] for k, o in table.items()
                if o.config not in ("layout", "cost") and k not in UNMEASURED and o.field in cfg})
    out.update({k: cfg[k] for k in ("world_size", "nodes") if k in cfg})
    return out


def differences(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    """'model resnet18, image_size 32 (this run: tinycnn, 16)': the options both record and that differ
    (empty: none differs)."""
    keys = [k for k in mine if k in theirs and _same(mine[k]) != _same(theirs[k])]
    if not keys:
        return ""
    return (f"{', '.join(f'{k} {_words(theirs[k])}' for k in keys)} "
            f"(this run: {', '.join(_words(mine[k]) for k in keys)})")


def _same(v: Any) -> Any:
    """A value as options compare: lists, tuples and comma strings alike, numbers as floats."""
    if isinstance(v, str) and "," in v:
        v = [x.strip() for x in v.split(",")]
    if isinstance(v, (list, tuple)):
        items = tuple(_same(x) for x in v)
        return items[0] if len(items) == 1 else items
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return v


def _words(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


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
        mates = [k for k, v in base.figures.items() if k != f.key and v and device_class(v[0]) == device_class(f)]
        series = [[b.value for b, _ in runs]] + [[b.value for b in base.figures[k]] for k in mates]
        spread = noise.between_runs(series, [b.samples for b, _ in runs], floor, alpha, (priors or {}).get(i),
                                    f.model or "")
        out[i] = Expectation("baseline", value, src, runs=tuple(b.value for b, _ in runs), run_id=newest.run_id,
                             spread=spread)
    return out


def device_class(f: Figure) -> tuple[str, ...]:
    """A figure's class of device: the same check and figure on every device of one model (the key alone
    for a figure with no device model)."""
    return (f.check, f.name, f.model) if f.model else (f.key,)


# -- the baseline in the store --------------------------------------------------------------------------
def settled_keys(accept_rec: RunRecord) -> set[str]:
    """The figure keys an acceptance can serve as baseline for: judged, and no shortfall proven there
    (no FAIL or ERROR; no WARN whose shortfall was significant; a record from before ``significant`` was
    recorded counts every WARN as proven)."""
    rows = (accept_rec.raw or {}).get("verdicts") or []
    bad = {r["key"] for r in rows if r.get("status") in (FAIL, ERROR) or r.get("status") == WARN
           and r.get("significant", True)}
    return {r["key"] for r in rows if r.get("key")} - bad


def find_baseline(store: Any, system: str, suite_hash: str, keys: set[str], exclude: str | None = None,
                  this: tuple[str, str] | None = None) -> Baseline:
    """For each key, the figures of the newest ``RUNS`` acceptances of ``system`` and ``suite_hash``
    that settled it (among the newest ``MAX_HISTORY``), less those whose time overlapped ``this``
    acceptance's (its start and end) or another acceptance's on ``system``."""
    base = Baseline()
    todo = set(keys)
    seen = 0
    mine = [a for a in store.query(kind="accept", status="ok") if a.tag != exclude
            and (a.config or {}).get("system") == system]
    spans: dict[str, tuple[str, str]] = {}
    for acc in mine:
        if not todo or seen >= MAX_HISTORY:
            break
        if (acc.config or {}).get("suite_hash") != suite_hash:
            continue
        seen += 1
        usable = settled_keys(acc) & todo
        if not usable:
            continue
        busy = _overlapped(store, acc, mine, this, spans)
        if busy:
            for k in usable:
                base.notes.setdefault(k, f"acceptance {acc.tag} ran at the same time as {busy}: measured under its "
                                         "load, it is no baseline")
            continue
        runs = store.query(tag=acc.tag, status="ok")
        base.add(figures(runs), f"acceptance {acc.tag} ({acc.created_at[:10]})", usable, {r.run_id: r for r in runs})
        todo -= base.complete()
    return base


def selected_baseline(store: Any, selector: str, this: tuple[str, str] | None = None) -> Baseline:
    """The baseline a ``--baseline`` selector names: its runs, and every run of each acceptance among
    them, less those whose time overlapped ``this`` acceptance's (its start and end)."""
    from dlscale.analysis.select import select

    recs = select(store, selector)
    base = Baseline()
    taken: set[str] = set()
    for acc in (r for r in recs if r.kind == "accept"):
        runs = store.query(tag=acc.tag, status="ok")
        taken |= {r.run_id for r in runs}
        if this and overlaps(span(store, acc), this):
            base.notes.update({f.key: f"acceptance {acc.tag} ran at the same time as this one: it is no baseline"
                               for f in figures(runs)})
            continue
        base.add(figures(runs), f"acceptance {acc.tag} ({acc.created_at[:10]})", runs={r.run_id: r for r in runs})
    plain = [r for r in recs if r.kind != "accept" and r.run_id not in taken]
    during = {r.run_id for r in plain if this and overlaps((r.created_at, r.finished_at or r.created_at), this)}
    base.notes.update({f.key: f"run {f.run_id} ran at the same time as this acceptance: it is no baseline"
                       for f in figures([r for r in plain if r.run_id in during])})
    ok = [r for r in plain if r.run_id not in during]
    base.add(figures(ok), f"baseline {selector}", runs={r.run_id: r for r in ok})
    return base


# -- when acceptances ran ---------------------------------------------------------------------------
def span(store: Any, acc: RunRecord) -> tuple[str, str]:
    """When an acceptance measured: its first check run's start to its last one's end (``started_at``,
    ``ended_at`` in its config; read from its runs for an acceptance recorded without them)."""
    cfg = acc.config or {}
    if cfg.get("started_at") and cfg.get("ended_at"):
        return cfg["started_at"], cfg["ended_at"]
    return span_of([r for r in store.query(tag=acc.tag) if r.kind != "accept"]) or (acc.created_at, acc.created_at)


def span_of(records: Sequence[RunRecord]) -> tuple[str, str] | None:
    """The time an acceptance's runs took: the first one's start to the last one's end."""
    if not records:
        return None
    return min(r.created_at for r in records), max(r.finished_at or r.created_at for r in records)


def overlaps(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Two spans of time (ISO strings, UTC) share a moment."""
    return a[0] < b[1] and b[0] < a[1]


def _overlapped(store: Any, acc: RunRecord, others: Sequence[RunRecord], this: tuple[str, str] | None,
                spans: dict[str, tuple[str, str]]) -> str:
    """What ``acc`` ran at the same time as ('this acceptance', 'acceptance ID'), or ''."""
    def of(a: RunRecord) -> tuple[str, str]:
        if a.run_id not in spans:
            spans[a.run_id] = span(store, a)
        return spans[a.run_id]

    mine = of(acc)
    if this and overlaps(mine, this):
        return "this acceptance"
    hit = next((b for b in others if b is not acc and overlaps(mine, of(b))), None)
    return f"acceptance {hit.tag}" if hit else ""
