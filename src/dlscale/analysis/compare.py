"""Compare two (or more) selections of runs, model by model (reads records only; no torch).

- ``pct_table``: seed 001 Tables 5-6, ``% difference = (A - B) / B`` per group
  (``formulas.pct_difference``), positive when A is higher.
- ``score_table``: MLPerf v0.5 (seed 000), each selection's speed-up over a reference selection,
  ``X / X_ref`` for throughputs and ``T_ref / T`` for times (``formulas.relative_score``).

Runs are grouped by a key (``model`` by default; any of ``KEYS``); a group's value is the mean
of its runs' metric (finite numbers only: a NaN or an infinity never enters a mean), and the
number of runs is kept beside it. For metrics counted in sample units (throughput: images/s,
tokens/s, samples/s; ``domains.unit_bearing``) the unit is always part of the key, so runs of
different units never share a mean or a ratio; each row says its ``unit``. ``check_metric``
refuses a metric no run of a side has, and ``pct_table`` two sides with no group in common,
rather than print an empty comparison.

Serving runs (kind ``serving``) are compared load point by load point: a run gives one value per
point of a metric it keeps per point (``<metric>_by_point``; ``throughput`` is the output tokens/s),
and its API, streaming, load mode, load and cap in flight (``SERVING_KEYS``) always join the key,
so unlike load points (rates and concurrencies, chat and completions, streamed or not) are never
averaged together, and two sides with no load point in common are refused, naming theirs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dlscale.analysis import domains
from dlscale.analysis.domains import system_label
from dlscale.analysis.formulas import pct_difference, relative_score
from dlscale.record import RunRecord

SERVING_KEYS = ("api", "stream", "mode", "load", "max_concurrency")  # a serving load point, and how it was asked
KEYS = ("model", "family", "unit", "batch_size", "precision", "image_size", "seq_len", "tokens_per_batch",
        "model_config", "world_size", "nodes", "layout", "link", "system", *SERVING_KEYS, "prompt_len", "output_len")
LOWER_IS_BETTER_UNITS = ("s", "epochs")


def key_value(rec: RunRecord, key: str, point: dict[str, Any] | None = None) -> Any:
    """One grouping field of a record, wherever the record keeps it (``point``: a serving load point's own)."""
    c = rec.config
    if key == "load":
        return (point or {}).get("load")
    if key in SERVING_KEYS:
        return c.get(key) if rec.kind == "serving" else None
    if key == "model":
        return rec.workload
    if key == "world_size":
        return domains.world_size(rec)
    if key == "nodes":
        return c.get("nodes") or c.get("nnodes") or 1
    if key == "system":
        return system_label(rec)
    if key == "family":
        return domains.family(rec)
    if key == "unit":
        return domains.rate_unit(domains.sample_unit(rec))
    if key in ("layout", "link"):
        from dlscale.analysis.scaling import layout_of, link_of

        nodes, per_node = layout_of(rec)
        return f"{nodes}x{per_node}" if key == "layout" else (link_of(rec) if nodes > 1 else "-")
    return c.get(key)


def value_of(rec: RunRecord, metric: str) -> float | None:
    """The run's ``metric`` as a finite number, else None (missing, text, a flag, NaN or infinite)."""
    v = rec.metrics.get(metric)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return None
    return float(v)


def check_metric(sides: dict[str, Sequence[RunRecord]], metric: str) -> None:
    """Refuse ``metric`` when no ok run of a side has a number for it, naming the metrics its runs have."""
    from dlscale.errors import UsageError

    for name, recs in sides.items():
        ok = [r for r in recs if r.status == "ok"]
        if not any(v is not None for _, v, _ in observations(ok, metric)):
            have = sorted({k for r in ok for k in r.metrics if value_of(r, k) is not None}
                          | {k.removesuffix("_by_point") for r in ok if r.kind == "serving" for k in r.metrics
                             if k.endswith("_by_point") and k != "loads_by_point"})
            listed = ", ".join(have[:12]) + (", ..." if len(have) > 12 else "")
            raise UsageError(f"--metric {metric}: no run of {name} has a number for it; its runs have "
                             f"{listed or 'no numeric metrics'} (`dlscale results show RUN` lists a run's)")


def check_keys(by: Sequence[str]) -> None:
    from dlscale.errors import UsageError

    bad = [k for k in by if k not in KEYS]
    if bad:
        raise UsageError(f"unknown --by {', '.join(bad)}; choose from {', '.join(KEYS)}")


def observations(records: Iterable[RunRecord], metric: str) -> list[tuple[RunRecord, float | None, dict | None]]:
    """(run, its value of ``metric``, its load point) for each ok run, one per load point for a serving run
    whose ``metric`` is kept per point (``<metric>_by_point``; throughput: output_throughput_by_point)."""
    out: list[tuple[RunRecord, float | None, dict | None]] = []
    for r in records:
        if r.status != "ok":
            continue
        per_point = r.metrics.get(f"{'output_throughput' if metric == 'throughput' else metric}_by_point")
        loads = r.metrics.get("loads_by_point") or []
        if r.kind == "serving" and isinstance(per_point, list) and len(per_point) == len(loads):
            for load, v in zip(loads, per_point):
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                out.append((r, float(v) if ok else None, {"load": load}))
        else:
            out.append((r, value_of(r, metric), None))
    return out


@dataclass
class Group:
    key: tuple
    value: float
    n: int
    n_imported: int = 0
    unit: str | None = None


def group_keys(by: Sequence[str], metric: str, records: Iterable[RunRecord] = ()) -> list[str]:
    """The fields a group is keyed on: ``by``, plus ``unit`` for metrics counted in sample units."""
    records = list(records)
    keys = list(by)
    if "unit" not in keys and domains.unit_bearing(metric, records):
        keys.append("unit")
    if any(r.kind == "serving" for r in records):  # a serving load point is never averaged with another
        keys.extend(k for k in SERVING_KEYS if k not in keys)
    return keys


def _metric_unit(rec: RunRecord, metric: str, unit_key: bool) -> str | None:
    if unit_key:
        return domains.rate_unit(domains.sample_unit(rec)) if metric == "throughput" else domains.sample_unit(rec)
    return (rec.units or {}).get(metric)


def group(records: Iterable[RunRecord], by: Sequence[str], metric: str = "throughput") -> dict[tuple, Group]:
    """Mean of ``metric`` over the ok runs of each group (runs without the metric are left out).

    The key is ``group_keys(by, metric)``: the unit joins it for throughput-like metrics, so a
    group never averages images/s with tokens/s.
    """
    records = list(records)
    keys = group_keys(by, metric, records)
    unit_key = "unit" in keys
    vals: dict[tuple, list[float]] = {}
    imported: dict[tuple, int] = {}
    units: dict[tuple, str | None] = {}
    for r, v, point in observations(records, metric):
        if v is None:
            continue
        k = tuple(key_value(r, k, point) for k in keys)
        vals.setdefault(k, []).append(v)
        imported[k] = imported.get(k, 0) + int(r.imported)
        units.setdefault(k, _metric_unit(r, metric, unit_key))
    return {k: Group(k, sum(v) / len(v), len(v), imported[k], units[k]) for k, v in vals.items()}


def _order(keys: Iterable[tuple]) -> list[tuple]:
    return sorted(keys, key=lambda k: tuple((x is None, str(type(x)), x if x is not None else 0) for x in k))


def pct_table(a: Iterable[RunRecord], b: Iterable[RunRecord], by: Sequence[str] = ("model",),
              metric: str = "throughput") -> list[dict[str, Any]]:
    """One row per group: A, B, (A - B) / B as a fraction; None where a side has no run.

    Runs in different sample units are in different groups (each row has its ``unit``); a
    comparison whose two sides share no unit is refused (``domains.check_same_unit``). Where the
    runs have them, each row also has each side's per-joule and per-dollar figures
    (``domains.EFFICIENCY``: ``units_per_joule_a``, ``units_per_dollar_b``, ...).
    """
    a, b = list(a), list(b)
    domains.check_same_unit(a, b, metric)
    keys = group_keys(by, metric, [*a, *b])
    ga, gb = group(a, by, metric), group(b, by, metric)
    check_common(ga, gb, by, keys)
    extra = {m: (group(a, keys, m), group(b, keys, m)) for m in efficiency_metrics([*a, *b], metric)}
    priced = (group_prices(a, keys, metric), group_prices(b, keys, metric)) if any(
        m in DOLLARS for m in extra) else None
    rows = []
    for k in _order(set(ga) | set(gb)):
        xa, xb = ga.get(k), gb.get(k)
        pct = pct_difference(xa.value, xb.value) if xa and xb and xb.value else None
        rows.append({**dict(zip(keys, k)), "unit": (xa or xb).unit, "a": xa and xa.value, "b": xb and xb.value,
                     "pct_difference": pct,
                     "n_a": xa.n if xa else 0, "n_b": xb.n if xb else 0,
                     "imported_a": xa.n_imported if xa else 0, "imported_b": xb.n_imported if xb else 0,
                     **{f"{m}_{side}": (g[k].value if k in g else None)
                        for m, pair in extra.items() for side, g in zip("ab", pair)},
                     **({f"prices_{side}": g.get(k, []) for side, g in zip("ab", priced)} if priced else {})})
    return rows


DOLLARS = ("units_per_dollar", "cost_to_target")  # the figures that depend on a price


def group_prices(records: Iterable[RunRecord], by: Sequence[str], metric: str) -> dict[tuple, list[float]]:
    """Each group's distinct prices per device-hour (``domains.prices``: its ok runs that have ``metric``)."""
    records = list(records)
    keys = group_keys(by, metric, records)
    members: dict[tuple, list[RunRecord]] = {}
    for r, v, point in observations(records, metric):
        if v is not None:
            members.setdefault(tuple(key_value(r, k, point) for k in keys), []).append(r)
    return {k: domains.prices(v) for k, v in members.items()}


def efficiency_metrics(records: Sequence[RunRecord], metric: str) -> list[str]:
    """The per-joule and per-dollar figures that go beside ``metric`` and that some of the records have."""
    return [m for m in domains.EFFICIENCY.get(metric, ()) if any(m in r.metrics for r in records)]


def check_common(ga: dict[tuple, Group], gb: dict[tuple, Group], by: Sequence[str],
                 keys: Sequence[str] | None = None) -> None:
    """Refuse A and B whose groups share no key: every row would have one side empty (``keys``: the
    fields the groups are keyed on, ``by`` and what joined it)."""
    from dlscale.errors import UsageError

    if not ga or not gb or set(ga) & set(gb):
        return

    def names(g: dict[tuple, Group]) -> str:
        keys = sorted({"/".join(str(x) for x in k[:len(by)]) for k in g})
        return ", ".join(keys[:6]) + (", ..." if len(keys) > 6 else "")

    _serving(ga, gb, keys or by)
    what = "model" if list(by) == ["model"] else "/".join(by)
    fix = ("select runs of one model on both sides (model:NAME), or compare --by family" if what == "model"
           else "select runs that share them, or group by fewer fields (--by)")
    raise UsageError(f"A and B have no {what} in common (A: {names(ga)}; B: {names(gb)}); {fix}")


def _serving(ga: dict[tuple, Group], gb: dict[tuple, Group], keys: Sequence[str]) -> None:
    """Refuse two sides of serving runs with no load point in common, naming each side's (nothing to say
    where no run is a serving run: ``check_common`` says it)."""
    from dlscale.errors import UsageError

    if not set(SERVING_KEYS) <= set(keys):
        return
    rest = [k for k in keys if k not in SERVING_KEYS]

    def point(k: tuple) -> str:
        f = dict(zip(keys, k))
        if f["mode"] is None:
            return "/".join(str(f[x]) for x in rest) + " (not serving)"
        at = f" at {f['mode']} {f['load']:g}" if f["load"] is not None else f" ({f['mode']})"
        return (f"{f['api']}{'' if f['stream'] else ' not streamed'}{at}"
                + (f" capped at {f['max_concurrency']} in flight" if f["max_concurrency"] else ""))

    def names(g: dict[tuple, Group]) -> str:
        found = sorted({point(k) for k in g})
        return ", ".join(found[:6]) + (", ..." if len(found) > 6 else "")

    raise UsageError(f"A and B share no serving load point (A: {names(ga)}; B: {names(gb)}): unlike load points, "
                     "APIs or streaming are never averaged; select runs measured at the same ones, or compare a "
                     "figure of the whole run such as --metric max_load_meeting_slo")


def score_table(selections: dict[str, Sequence[RunRecord]], reference: Sequence[RunRecord],
                by: Sequence[str] = ("model",), metric: str = "throughput",
                higher_is_better: bool = True) -> list[dict[str, Any]]:
    """One row per group: each selection's relative score over the reference (None if either is missing).

    A reference in another sample unit never scores a group (the unit is part of the key).
    """
    reference = list(reference)
    selections = {name: list(recs) for name, recs in selections.items()}
    names = group_keys(by, metric, [*reference, *(r for recs in selections.values() for r in recs)])
    gref = group(reference, by, metric)
    gsel = {name: group(recs, by, metric) for name, recs in selections.items()}
    keys = set(gref).union(*[set(g) for g in gsel.values()]) if gsel else set(gref)
    rows = []
    for k in _order(keys):
        ref = gref.get(k)
        row: dict[str, Any] = {**dict(zip(names, k)), "reference": ref and ref.value}
        for name, g in gsel.items():
            x = g.get(k)
            row[name] = relative_score(x.value, ref.value, higher_is_better) if x and ref and x.value > 0 and ref.value > 0 else None
        rows.append(row)
    return rows


def higher_is_better(records: Iterable[RunRecord], metric: str) -> bool:
    """Throughput-like metrics are better high; times (unit s) and epochs are better low."""
    for r in records:
        unit = r.units.get(metric)
        if unit:
            return unit not in LOWER_IS_BETTER_UNITS
    return "time" not in metric
